"""kvxfer: one-sided KV-cache block transfer between hosts.

Python binding of libkvxfer (include/kvxfer.h). The main class,
kvxfer.Transport, implements vLLM's DataTransport contract
(vllm.v1.kv_offload.tiering.p2p.data.base) and is registered as a virtual
subclass of it when vLLM is importable (set KVXFER_NO_VLLM=1 to skip that
import).

    import kvxfer
    region = memoryview(bytearray(16 * 4096)).cast("B", (16, 4096))
    with kvxfer.Transport(region, {"model": "m"}, backend="tcp",
                          tcp_listen="127.0.0.1:0") as t:
        meta = t.get_agent_metadata()   # give to the peer
        ...

kvxfer.vllm holds the adapter that makes vLLM's P2P KV-offload tier use
kvxfer instead of NIXL (a vLLM plugin; see its docstring).

The library's log messages go to the logging logger "kvxfer" (level from
KVX_LOG, else the logger's at import; kvxfer.set_log_level() changes both;
kvxfer.log_to_stderr() returns them to the library's stderr lines). Importing
kvxfer prints nothing and configures no logging. Transport.metrics_text() is
Prometheus text; kvxfer.prometheus.Collector feeds prometheus_client.
"""

import os as _os

from . import _native
from ._errors import (ArgumentError, ClosedError, Error, ErrorCode, ErrorInfo, PeerError, RequestError, Scope,
                      TransportError, error_scope, strerror)
from . import _transport
from ._transport import (CANCEL_MODES, PeerInfo, PeerLink, PeerState, PollResult, Result, Transport, backends,
                         config_fingerprint, latency_bucket_bounds)
from ._region import alloc_region

__all__ = [
    "Transport", "PollResult", "config_fingerprint", "CANCEL_MODES", "latency_bucket_bounds", "backends", "alloc_region",
    "Result", "PeerLink", "PeerState", "PeerInfo",
    "set_log_level", "get_log_level", "log_to_stderr", "route_logs", "log_flush", "LOGGER_NAME",
    "Error", "RequestError", "ArgumentError", "PeerError", "TransportError", "ClosedError",
    "ErrorCode", "ErrorInfo", "Scope", "strerror", "error_scope",
    "library_version", "library_version_number", "HEADER_VERSION_NUMBER", "DataTransport",
]

#: Version of libkvxfer loaded at run time ("0.14.0") and as a number.
library_version = _native.kvx_version_string()
library_version_number = _native.kvx_version_number()
#: KVX_VERSION_NUMBER of the kvxfer.h this binding was built against.
HEADER_VERSION_NUMBER = _native.KVX_VERSION_NUMBER
__version__ = "%d.%d.%d" % (_native.KVX_VERSION_MAJOR, _native.KVX_VERSION_MINOR, _native.KVX_VERSION_PATCH)

if library_version_number // 10000 != HEADER_VERSION_NUMBER // 10000 or library_version_number < HEADER_VERSION_NUMBER:
    raise ImportError("kvxfer: the binding was built for libkvxfer %s but %s is loaded"
                      % (__version__, library_version))

# (after the version check: routes the library's log records to logging)
from ._log import LOGGER_NAME, get_log_level, log_flush, log_to_stderr, route_logs, set_log_level  # noqa: E402


def _register_with_vllm():
    """Register Transport as a virtual subclass of vLLM's DataTransport (and
    use vLLM's PollResult) when vLLM is importable. Never fails."""
    if _os.environ.get("KVXFER_NO_VLLM", "") not in ("", "0"):
        return None
    try:
        import importlib.util
        if importlib.util.find_spec("vllm") is None:
            return None
        from vllm.v1.kv_offload.tiering.p2p.data import base as vllm_base
    except Exception:  # not installed, or broken: kvxfer works without it
        return None
    try:
        vllm_base.DataTransport.register(Transport)
    except Exception:
        return None
    poll_result = getattr(vllm_base, "PollResult", None)
    if poll_result is not None and getattr(poll_result, "_fields", None) == ("done", "failed"):
        _transport.PollResult = poll_result
    return vllm_base.DataTransport


#: vLLM's DataTransport ABC when vLLM is importable (Transport is registered
#: as its virtual subclass), else None.
DataTransport = _register_with_vllm()
PollResult = _transport.PollResult
