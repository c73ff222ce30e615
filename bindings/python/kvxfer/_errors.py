"""kvxfer exceptions and error codes."""

import enum
from typing import NamedTuple, Optional

from . import _native

__all__ = [
    "ErrorCode", "Scope", "Error", "RequestError", "ArgumentError", "PeerError", "TransportError",
    "ClosedError", "ErrorInfo", "strerror", "error_scope",
]


class ErrorCode(enum.IntEnum):
    """The C library's KVX_E* codes (negative; equal to -errno where one fits)."""

    OK = _native.KVX_OK
    EPERM = _native.KVX_EPERM
    ENOENT = _native.KVX_ENOENT
    ENOMEM = _native.KVX_ENOMEM
    EBUSY = _native.KVX_EBUSY
    EEXIST = _native.KVX_EEXIST
    EINVAL = _native.KVX_EINVAL
    ERANGE = _native.KVX_ERANGE
    ENOBUFS = _native.KVX_ENOBUFS
    ENOTSUP = _native.KVX_ENOTSUP
    EOVERFLOW = _native.KVX_EOVERFLOW
    ECONNREFUSED = _native.KVX_ECONNREFUSED
    ETIMEDOUT = _native.KVX_ETIMEDOUT
    ECONNRESET = _native.KVX_ECONNRESET
    EHOSTUNREACH = _native.KVX_EHOSTUNREACH
    ECANCELED = _native.KVX_ECANCELED
    ECLOSED = _native.KVX_ECLOSED
    EBADMETA = _native.KVX_EBADMETA
    EVERSION = _native.KVX_EVERSION
    EFINGERPRINT = _native.KVX_EFINGERPRINT
    EGEOMETRY = _native.KVX_EGEOMETRY
    EPEERBROKEN = _native.KVX_EPEERBROKEN
    EAUTH = _native.KVX_EAUTH
    ECONFIG = _native.KVX_ECONFIG
    EBACKEND = _native.KVX_EBACKEND
    EINTERNAL = _native.KVX_EINTERNAL


class Scope(enum.IntEnum):
    """What recovery fits an error (kvx_error_scope_of)."""

    NONE = _native.KVX_SCOPE_NONE
    REQUEST = _native.KVX_SCOPE_REQUEST      # fix the arguments and retry
    PEER = _native.KVX_SCOPE_PEER            # remove and re-add the peer
    TRANSPORT = _native.KVX_SCOPE_TRANSPORT  # close the transport, create a new one


def strerror(code: int) -> str:
    """Short English description of a code (kvx_strerror)."""
    return _native.kvx_strerror(int(code))


def error_scope(code: int) -> Scope:
    """Scope of a code (kvx_error_scope_of); TRANSPORT for unknown codes."""
    return Scope(_native.kvx_error_scope_of(int(code)))


class Error(Exception):
    """A kvxfer failure: .code (negative KVX_E* int) and .message (the C
    library's context message, e.g. "peer 'p1': remote index 70000 >= 65536
    blocks"). Subclasses by scope: RequestError, PeerError, TransportError.

    RequestError and PeerError are also ValueErrors: vLLM rejects a peer (ack,
    disconnect, clean up) exactly when add_remote_peer raises a ValueError, and
    every failure caused by the peer or its metadata is one of these.
    TransportError (ClosedError included) is not: it is an internal error."""

    def __init__(self, code: int, message: Optional[str] = None):
        code = int(code)
        if not message:
            message = strerror(code)
        super().__init__(code, message)
        self.code = code
        self.message = message

    @property
    def name(self) -> str:
        """Symbolic name of the code ("KVX_ENOENT"), or the number."""
        try:
            return "KVX_" + ErrorCode(self.code).name
        except ValueError:
            return str(self.code)

    @property
    def scope(self) -> Scope:
        return error_scope(self.code)

    def __str__(self) -> str:
        return "%s [%s]" % (self.message, self.name)


class RequestError(Error, ValueError):
    """This call was wrong (bad metadata, fingerprint or version mismatch, no
    backend in common, a registration cancelled by a later one...); nothing
    else is affected. Also a ValueError."""


class ArgumentError(RequestError):
    """An argument value is invalid (index out of range, duplicate remote
    index, bad option, invalid config, geometry mismatch...). Also a
    ValueError."""


class PeerError(Error, ValueError):
    """One peer is unusable (refused, timed out, unreachable, connection lost,
    authentication failed): remove and re-add it. Also a ValueError."""


class TransportError(Error):
    """The whole transport is unusable: close it and create a new one."""


class ClosedError(TransportError):
    """The transport was closed."""


# REQUEST-scope codes that mean "an argument value is wrong" -> also ValueError.
_ARGUMENT_CODES = frozenset({
    _native.KVX_EINVAL, _native.KVX_ERANGE, _native.KVX_EOVERFLOW, _native.KVX_ECONFIG,
    _native.KVX_EGEOMETRY, _native.KVX_EBADMETA, _native.KVX_ENOBUFS,
})


def error_class(code: int) -> type:
    """The exception class kvxfer raises for a code."""
    if code == _native.KVX_ECLOSED:
        return ClosedError
    if code in _ARGUMENT_CODES:
        return ArgumentError
    scope = _native.kvx_error_scope_of(int(code))
    if scope == _native.KVX_SCOPE_REQUEST:
        return RequestError
    if scope == _native.KVX_SCOPE_PEER:
        return PeerError
    return TransportError


def make_error(code: int, message: Optional[str] = None) -> Error:
    return error_class(code)(code, message)


def last_error(code: int) -> Error:
    """The exception for a code a C call just returned: reads the calling
    thread's kvx_last_error_message(). Call it right after the failing call."""
    return make_error(code, _native.kvx_last_error_message())


class ErrorInfo(NamedTuple):
    """Transport.last_error: why the calling thread's last failed call on a
    transport failed (e.g. write_blocks returning None); also why a transfer
    failed (Result.error of poll_results(), PollResult.errors of poll())."""

    code: int
    message: str

    @property
    def name(self) -> str:
        return Error(self.code, self.message).name

    @property
    def scope(self) -> Scope:
        return error_scope(self.code)

    def exception(self) -> Error:
        """The exception kvxfer would raise for this failure."""
        return make_error(self.code, self.message)
