"""The library's log messages on Python's logging (kvx_set_log_handler).

On import, kvxfer routes libkvxfer's records to the logger "kvxfer" (see
route_logs()). Nothing is printed by the import and no logging configuration
is changed: with an application that configured no logging, Python's last
resort handler prints WARNING and above on stderr, the library's own default.
"""

import atexit
import logging
import os
import threading

from . import _native

__all__ = ["LOGGER_NAME", "set_log_level", "get_log_level", "log_to_stderr", "route_logs", "log_flush"]

#: The logger the library's records go to.
LOGGER_NAME = "kvxfer"
_logger = logging.getLogger(LOGGER_NAME)

# kvx_log_level -> logging level, and back by name.
_TO_PY = {
    _native.KVX_LOG_ERROR: logging.ERROR,
    _native.KVX_LOG_WARN: logging.WARNING,
    _native.KVX_LOG_INFO: logging.INFO,
    _native.KVX_LOG_DEBUG: logging.DEBUG,
}
_OFF = logging.CRITICAL + 10  # the "kvxfer" logger's level for set_log_level("off")

_lock = threading.Lock()  # serializes the changes of handler and level
_on_handler = threading.local()  # .active on the library's thread during _deliver
_routed = False  # records go to _logger (else to the library's stderr lines)
_exiting = False


def _c_level(py_level: int) -> int:
    """The most verbose kvx_log_level whose records a logger of py_level
    lets through (KVX_LOG_OFF when none: above ERROR)."""
    if py_level <= logging.DEBUG:
        return _native.KVX_LOG_DEBUG
    if py_level <= logging.INFO:
        return _native.KVX_LOG_INFO
    if py_level <= logging.WARNING:
        return _native.KVX_LOG_WARN
    if py_level <= logging.ERROR:
        return _native.KVX_LOG_ERROR
    return _native.KVX_LOG_OFF


def _py_level(level) -> int:
    """A logging level of an int or a name ("debug", "WARNING", "warn", "off")."""
    if isinstance(level, bool):
        raise TypeError("log level must be an int or a str, not bool")
    if isinstance(level, int):
        if level < 0:
            raise ValueError("log level %d is negative" % level)
        return level
    if isinstance(level, str):
        name = level.strip().upper()
        if name in ("OFF", "NONE"):
            return _OFF
        if name == "WARN":
            name = "WARNING"
        value = logging.getLevelName(name)  # the number for a registered name
        if isinstance(value, int):
            return value
        raise ValueError("log level %r is not a logging level name (debug, info, warning, error, critical, off)"
                         % level)
    raise TypeError("log level must be an int or a str, not %s" % type(level).__name__)


def _suffix(suppressed: int, dropped: int) -> str:
    """What the library's stderr line adds for these counts."""
    s = ""
    if suppressed:
        s += " (%d more like this suppressed)" % suppressed
    if dropped:
        s += " (%d earlier messages dropped: the log handler fell behind)" % dropped
    return s


def _deliver(level, message, component, peer_id, time_ns, suppressed, dropped, thread_id):
    """The handler (kvxpy_log_trampoline calls it on the library's log thread
    with the GIL): one record to the logger "kvxfer"."""
    py_level = _TO_PY.get(level, logging.WARNING)
    if not _logger.isEnabledFor(py_level):
        return
    _on_handler.active = True
    try:
        _handle(py_level, message, component, peer_id, time_ns, suppressed, dropped, thread_id)
    finally:
        _on_handler.active = False


def _handle(py_level, message, component, peer_id, time_ns, suppressed, dropped, thread_id):
    record = _logger.makeRecord(
        _logger.name, py_level, "libkvxfer", 0, message + _suffix(suppressed, dropped), None, None,
        extra={"component": component, "peer_id": peer_id, "thread_id": thread_id, "suppressed": suppressed,
               "dropped": dropped, "time_ns": time_ns})
    if time_ns > 0:  # when the library logged it, not when it got here
        record.created = time_ns / 1e9
        record.msecs = float((time_ns % 1_000_000_000) // 1_000_000)
        start = getattr(logging, "_startTime", None)
        if isinstance(start, float):
            record.relativeCreated = (record.created - start) * 1000
    _logger.handle(record)


class _Locked:
    """_lock, but not on the library's log thread inside _deliver (a logging
    handler calling set_log_level): another thread may hold _lock while it
    waits in C for that very call to return."""

    def __enter__(self):
        self.held = not getattr(_on_handler, "active", False)
        if self.held:
            _lock.acquire()

    def __exit__(self, *exc):
        if self.held:
            _lock.release()


def _install(routed: bool, c_level: int) -> None:
    """kvx_set_log_handler, with _lock held (_Locked)."""
    global _routed
    rc = _native.kvxpy_set_log_handler(_deliver if routed else None, c_level)
    if rc:
        from ._errors import last_error
        raise last_error(rc)
    _routed = routed


def get_log_level() -> int:
    """The library's level as a logging level: logging.DEBUG, INFO, WARNING,
    ERROR, or logging.CRITICAL + 10 when it logs nothing (kvx_get_log_level)."""
    return _TO_PY.get(_native.kvx_get_log_level(), _OFF)


def set_log_level(level) -> None:
    """Set the level of the library's messages: a logging level (an int, e.g.
    logging.INFO) or its name ("debug", "info", "warning"/"warn", "error",
    "critical", or "off": nothing). Sets both the level of the logger
    "kvxfer" (which the logger "kvxfer.vllm" inherits) and the library's
    (kvx_set_log_handler): messages below it cost the library one compare.
    Change the level this way rather than on the logger alone: the library
    does not see the logger's level (it takes it once, at import)."""
    py = _py_level(level)
    with _Locked():
        _install(_routed, _c_level(py))
        _logger.setLevel(py)


def log_to_stderr() -> None:
    """Stop routing the library's messages to the logger "kvxfer": they go to
    stderr as the library writes them ("kvxfer[PID] warn: ..."), at the
    current level. Messages waiting for Python go there too."""
    with _Locked():
        _install(False, _native.kvx_get_log_level())


def route_logs() -> None:
    """Route the library's messages to the logger "kvxfer" (what the import
    does; undoes log_to_stderr()), at the current level. Each becomes a
    LogRecord of levelno ERROR, WARNING, INFO or DEBUG, message as the
    library wrote it (plus "(N more like this suppressed)" after a rate
    limit), created when the library logged it, pathname "libkvxfer", and
    the attributes component ("core", "handshake", "shm", "tcp", "verbs"),
    peer_id (the peer it is about, or None), thread_id (the kernel tid of
    the thread that logged it), suppressed and dropped (counts; see
    kvx_set_log_handler(3)) and time_ns. The handler runs on a library
    thread of its own, never with a library lock held."""
    with _Locked():
        if not _exiting:
            _install(True, _native.kvx_get_log_level())


def log_flush(timeout: float = 5.0) -> bool:
    """Wait until every message the library logged before this call has
    reached the logger (kvx_log_flush); False if some still wait after
    timeout seconds (None: no limit). The GIL is released meanwhile."""
    ms = -1 if timeout is None else max(0, int(timeout * 1000))
    rc = _native.kvx_log_flush(ms)
    if rc == _native.KVX_ETIMEDOUT:
        return False
    if rc == _native.KVX_EBUSY:  # on the handler's own thread: all before it was delivered
        return True
    if rc:
        from ._errors import last_error
        raise last_error(rc)
    return True


def _at_exit() -> None:
    """Deliver what waits, then back to stderr: the library must not call
    into an interpreter that is finalizing (kvx_set_log_handler waits for a
    call in progress)."""
    global _exiting
    with _Locked():
        _exiting = True
        if _routed:
            _native.kvx_log_flush(500)
            _install(False, _native.kvx_get_log_level())


def _after_fork_in_child() -> None:
    global _lock
    _lock = threading.Lock()  # a thread of the parent may have held it


def _init() -> None:
    """At import: the level from KVX_LOG when set (the library read it),
    else from the logger's effective level; then route to the logger."""
    env = os.environ.get("KVX_LOG", "")
    if env:
        c = _native.kvx_get_log_level()
        if c > _c_level(_logger.getEffectiveLevel()) and _logger.level == logging.NOTSET:
            _logger.setLevel(_TO_PY[c])  # KVX_LOG=info/debug asks for more than the logger passes
    else:
        c = _c_level(_logger.getEffectiveLevel())
    with _Locked():
        _install(True, c)
    atexit.register(_at_exit)
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_after_fork_in_child)


_init()
