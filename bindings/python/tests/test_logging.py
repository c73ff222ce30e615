"""The library's log records on Python's logging (kvxfer/_log.py,
kvx_set_log_handler): the logger "kvxfer", set_log_level, log_to_stderr, the
import's silence, and the exit.

The real message used: a peer whose config fingerprint differs is refused,
and the core logs at warn "peer 'X': refused: its config fingerprint ..."
with component "core" and peer_id X."""
import logging
import subprocess
import sys
import textwrap
import threading
import time

import pytest

import kvxfer

from conftest import TCP, region


class Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records = []
        self.threads = set()

    def emit(self, record):
        self.records.append(record)
        self.threads.add(threading.get_ident())

    def refusals(self, peer_id):
        return [r for r in self.records if getattr(r, "peer_id", None) == peer_id and "refused" in r.getMessage()]


@pytest.fixture
def records():
    logger = logging.getLogger("kvxfer")
    h = Records()
    logger.addHandler(h)
    try:
        yield h
    finally:
        logger.removeHandler(h)
        kvxfer.route_logs()
        kvxfer.set_log_level(logging.WARNING)
        logger.setLevel(logging.NOTSET)  # as the import left it


def refuse(peer_id):
    """Add a peer of another config: the library refuses it and logs a warning."""
    amem, aview = region(4, 256)
    bmem, bview = region(4, 256)
    with kvxfer.Transport(aview, {"model": "a"}, **TCP) as a, kvxfer.Transport(bview, {"model": "b"}, **TCP) as b:
        with pytest.raises(kvxfer.RequestError) as ei:
            a.add_remote_peer(peer_id, b.get_agent_metadata(), b.base_addr, b.num_blocks, b.block_len)
        assert ei.value.code == kvxfer.ErrorCode.EFINGERPRINT
    assert kvxfer.log_flush(10)


def test_a_refused_peer_is_a_warning_on_the_logger(records):
    t0 = time.time()
    refuse("X")
    got = records.refusals("X")
    assert len(got) == 1, [r.getMessage() for r in records.records]
    r = got[0]
    assert r.name == "kvxfer" and r.levelno == logging.WARNING and r.levelname == "WARNING"
    assert r.getMessage().startswith("peer 'X': refused: its config fingerprint ")
    assert (r.component, r.peer_id, r.suppressed, r.dropped) == ("core", "X", 0, 0)
    assert r.thread_id > 0 and r.pathname == "libkvxfer"
    assert t0 - 1 <= r.created <= time.time() + 1 and abs(r.created - r.time_ns / 1e9) < 1e-6
    assert threading.get_ident() not in records.threads  # the library's own thread called it


def test_set_log_level_error_stops_warnings(records):
    kvxfer.set_log_level(logging.ERROR)
    assert logging.getLogger("kvxfer").level == logging.ERROR
    assert kvxfer.get_log_level() == logging.ERROR
    assert kvxfer._native.kvx_get_log_level() == kvxfer._native.KVX_LOG_ERROR
    refuse("Y")
    assert records.refusals("Y") == []
    kvxfer.set_log_level("warn")
    assert kvxfer._native.kvx_get_log_level() == kvxfer._native.KVX_LOG_WARN
    refuse("Y")
    assert len(records.refusals("Y")) == 1


def test_set_log_level_names_and_errors(records):
    for level, c in (("debug", "KVX_LOG_DEBUG"), ("INFO", "KVX_LOG_INFO"), ("warning", "KVX_LOG_WARN"),
                     ("Error", "KVX_LOG_ERROR"), ("critical", "KVX_LOG_OFF"), ("off", "KVX_LOG_OFF"),
                     (logging.DEBUG + 5, "KVX_LOG_INFO"), (0, "KVX_LOG_DEBUG")):
        kvxfer.set_log_level(level)
        assert kvxfer._native.kvx_get_log_level() == getattr(kvxfer._native, c), level
    with pytest.raises(ValueError):
        kvxfer.set_log_level("loud")
    with pytest.raises(ValueError):
        kvxfer.set_log_level(-1)
    with pytest.raises(TypeError):
        kvxfer.set_log_level(None)


def test_a_logger_level_above_warning_drops_in_python(records):
    """The logger's own level filters too (the library's level unchanged)."""
    logging.getLogger("kvxfer").setLevel(logging.ERROR)
    refuse("Z")
    assert records.refusals("Z") == []


def test_log_to_stderr_and_back(records, capfd):
    kvxfer.log_to_stderr()
    refuse("S")
    assert records.refusals("S") == []
    err = capfd.readouterr().err
    assert "warn: peer 'S': refused: its config fingerprint" in err and err.startswith("kvxfer[")
    kvxfer.route_logs()
    refuse("S")
    assert len(records.refusals("S")) == 1
    assert "refused" not in capfd.readouterr().err


def test_a_handler_may_call_kvxfer(records):
    """The handler runs with no library lock held: a logging handler may call
    back into kvxfer, set_log_level included, without a deadlock."""
    seen = []

    class Calls(logging.Handler):
        def emit(self, record):
            seen.append(kvxfer.get_log_level())
            kvxfer.set_log_level(logging.WARNING)
            seen.append(kvxfer.log_flush(1))  # on the handler's thread: nothing to wait for

    h = Calls()
    logging.getLogger("kvxfer").addHandler(h)
    try:
        refuse("C")
    finally:
        logging.getLogger("kvxfer").removeHandler(h)
    assert seen == [logging.WARNING, True]


def run_python(code, env, timeout=60):
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_import_alone_logs_nothing_and_configures_nothing(sub_env):
    p = run_python("""
        import logging
        import kvxfer
        root = logging.getLogger()
        lg = logging.getLogger("kvxfer")
        assert root.handlers == [] and root.level == logging.WARNING, (root.handlers, root.level)
        assert lg.handlers == [] and lg.level == logging.NOTSET and lg.propagate
        assert kvxfer._native.kvx_get_log_level() == kvxfer._native.KVX_LOG_WARN
        assert kvxfer.log_flush(5)
        """, sub_env)
    assert (p.returncode, p.stdout, p.stderr) == (0, "", "")


def test_warnings_reach_stderr_through_the_last_resort(sub_env):
    """An application that configured no logging sees the library's warnings
    (Python's last resort handler), once, also when it exits right after
    (the exit hands over what waits, then unsets the handler)."""
    p = run_python("""
        import kvxfer
        from conftest import TCP, region
        a = kvxfer.Transport(region(4, 256)[1], {"model": "a"}, **TCP)
        b = kvxfer.Transport(region(4, 256)[1], {"model": "b"}, **TCP)
        try:
            a.add_remote_peer("X", b.get_agent_metadata(), b.base_addr, b.num_blocks, b.block_len)
        except kvxfer.RequestError:
            pass
        """, sub_env)
    assert p.returncode == 0, p.stderr
    assert p.stderr.count("peer 'X': refused: its config fingerprint") == 1, p.stderr
    assert "kvxfer[" not in p.stderr  # Python's line, not the library's


@pytest.mark.parametrize("env, level", [("off", "KVX_LOG_OFF"), ("debug", "KVX_LOG_DEBUG"), ("error", "KVX_LOG_ERROR")])
def test_kvx_log_sets_the_level(sub_env, env, level):
    p = run_python("""
        import logging, sys
        import kvxfer
        assert kvxfer._native.kvx_get_log_level() == kvxfer._native.%s
        print(logging.getLogger("kvxfer").level)
        """ % level, dict(sub_env, KVX_LOG=env))
    assert p.returncode == 0 and p.stderr == "", p.stderr
    # debug asks for more than the logger's WARNING passes: the logger follows
    assert int(p.stdout) == (logging.DEBUG if env == "debug" else logging.NOTSET)


def test_the_logger_level_at_import_sets_the_library_level(sub_env):
    p = run_python("""
        import logging
        logging.getLogger("kvxfer").setLevel(logging.INFO)
        import kvxfer
        assert kvxfer._native.kvx_get_log_level() == kvxfer._native.KVX_LOG_INFO
        """, sub_env)
    assert (p.returncode, p.stderr) == (0, "")
