"""The pool of threads that settles add_remote_peer_async()'s futures."""

import collections
import os
import threading

from . import _native
from ._errors import last_error

__all__ = ["WAITER"]

_WAITERS_MAX = 4  # threads at most: each blocks in C on one registration; the rest are looked at between waits
_WAITER_IDLE_S = 0.5  # a waiter with nothing to wait for this long exits (but the last idle one)
_WAITER_SLICE_MS = 20  # how long the pool's last free waiter blocks on one registration between looks at the rest


class _RegistrationWaiter:
    """Settles the futures of add_remote_peer_async() in this process: a
    pool of at most _WAITERS_MAX threads waiting in kvx_registration_status()
    without the GIL, shared by every transport.

    A waiter takes the oldest registration nobody waits on and waits for its
    outcome; after each wait it also looks at every other queued one without
    waiting (timeout 0: a lock and a table look-up in C each) and settles
    those that ended, so an outcome is picked up whichever registration it
    belongs to. A waiter waits without a limit (nothing polls) when another
    waiter is idle to take what comes next; the one that takes a registration
    and leaves none idle, with the pool full, waits in slices of
    _WAITER_SLICE_MS instead, looking at the queue between slices. Thus no
    registration waits for a waiter to get free (a wait on one registration
    can last a connect timeout, and longer for one queued in C behind slow
    connects): with more pending than waiters, an outcome is settled within
    about a slice of being known, and the oldest registrations, which the
    waiters hold, are mostly the first to end (the library connects them in
    the order of the calls); with fewer pending than waiters, at once.

    The caller of add_remote_peer_async only queues (a thread start can take
    milliseconds on a busy host): the first transport starts the first
    waiter, and a waiter that takes a registration and leaves none idle
    starts another while fewer than _WAITERS_MAX run. A waiter that finds
    nothing to wait for within _WAITER_IDLE_S exits, unless it is the only
    idle one (which the others may rely on): the pool shrinks back to one
    thread."""

    def __init__(self):
        self._cv = threading.Condition()
        self._queue = collections.deque()  # (handle, reg, future) no waiter holds, oldest first
        self._idle = 0  # waiters holding none (one being started counts)
        self._threads = 0

    def start(self):
        with self._cv:
            spawn = self._threads == 0
            if spawn:
                self._reserve_locked()
        if spawn:
            self._spawn()

    def add(self, handle, reg, future):
        with self._cv:
            self._queue.append((handle, reg, future))
            self._cv.notify()

    def after_fork_in_child(self):
        self.__init__()

    def _reserve_locked(self):
        self._threads += 1
        self._idle += 1

    def _spawn(self):
        # Never with self._cv held: Thread.start() waits for the thread to
        # run, which can take milliseconds, and add() must not wait for that.
        try:
            threading.Thread(target=self._work, name="kvxfer-registrations", daemon=True).start()
        except RuntimeError:  # cannot start a thread: the others serve
            with self._cv:
                self._threads -= 1
                self._idle -= 1

    def _work(self):
        while True:
            took = self._take()
            if took is None:
                return
            item, timeout_ms = took
            settled = self._settle(*item, timeout_ms)
            self._sweep()
            with self._cv:
                if not settled:  # a slice ended: first in line again
                    self._queue.appendleft(item)
                    self._cv.notify()  # an idle waiter may take it
                self._idle += 1

    def _take(self):
        """(the oldest queued registration, how long to wait for it in ms),
        or None when this waiter is to exit (idle too long)."""
        with self._cv:
            while not self._queue:
                if not self._cv.wait(_WAITER_IDLE_S) and not self._queue and self._idle > 1:
                    self._threads -= 1
                    self._idle -= 1
                    return None
            item = self._queue.popleft()
            self._idle -= 1
            spawn = self._idle == 0 and self._threads < _WAITERS_MAX
            if spawn:
                self._reserve_locked()
        if spawn:
            self._spawn()
        with self._cv:  # (after the spawn: it may have failed)
            return item, (-1 if self._idle > 0 else _WAITER_SLICE_MS)

    def _sweep(self):
        """Settles every queued registration whose outcome is known, without waiting."""
        with self._cv:
            items = list(self._queue)
            self._queue.clear()
        if not items:
            return
        pending = [it for it in items if not self._settle(*it, 0)]
        if pending:
            with self._cv:
                self._queue.extendleft(reversed(pending))  # ahead of what came meanwhile
                self._cv.notify(len(pending))  # idle waiters that slept while they were out

    @staticmethod
    def _settle(handle, reg, future, timeout_ms):
        """Waits up to timeout_ms (-1: no limit) for reg's outcome and settles
        future with it; False if reg is still pending."""
        try:
            rc, state, err = _native.kvx_registration_status(handle, reg, timeout_ms)
            if rc == 0 and state == _native.KVX_REGISTRATION_PENDING:
                return False
            exc = None if rc == 0 and state == _native.KVX_REGISTRATION_DONE else last_error(rc or err)
        except Exception as e:  # noqa: BLE001 - a handle gone bad: the future carries it
            exc = e
        if exc is None:
            future.set_result(None)
        else:
            future.set_exception(exc)
        return True


WAITER = _RegistrationWaiter()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=WAITER.after_fork_in_child)
