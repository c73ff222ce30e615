"""kvxfer as the data transport of vLLM's P2P KV-offload tier, without
editing vLLM.

vLLM's P2P manager builds its transport as

    NixlTransport(name, view, config_fields=..., backends=..., num_threads=...)

KvxferTransport has that constructor and is a kvxfer.Transport, so it
implements vLLM's DataTransport (errors, add_remote_peer_async, PollResult)
exactly. install() puts it in place of NixlTransport:

  * in the module that defines NixlTransport (default
    "vllm.v1.kv_offload.tiering.p2p.data.nixl:NixlTransport"; another one
    through KVXFER_VLLM_TARGET="module:Class"), now if the module is imported
    already, else right after it is (an import hook), so that
    `from ...nixl import NixlTransport` anywhere in vLLM gets KvxferTransport;
  * in every vllm.* module imported already that bound the original class;
  * if that module cannot be imported because NIXL itself is not installed
    (ImportError), a module holding only NixlTransport = KvxferTransport
    stands in for it: kvxfer needs no NIXL.

Two ways to call install() without touching vLLM's files:

  1. The vLLM plugin (recommended). The kvxfer wheel declares the entry point
     `kvxfer = kvxfer.vllm:register` in the group `vllm.general_plugins`,
     which vLLM loads in every process it starts (API server, engine,
     workers). register() installs kvxfer when KVXFER_VLLM=1 is set, so
     installing kvxfer alone changes nothing:

         KVXFER_VLLM=1 vllm serve ...

  2. By hand, before vLLM builds its P2P manager (in the launcher script, or
     in each process that builds one):

         import kvxfer.vllm
         kvxfer.vllm.install()

Options: KVXFER_OPTIONS is a JSON object of kvxfer options applied to every
transport the adapter makes, e.g.
KVXFER_OPTIONS='{"tcp.listen": "0.0.0.0:0", "connect_timeout_ms": 3000}'
(keys as kvx_options_set(3) names them).
"""

import importlib
import importlib.abc
import importlib.util
import json
import logging
import os
import sys
import threading
import types
from typing import Optional, Sequence, Union

from ._errors import ArgumentError
from . import _native
from ._transport import _FAILURE_CAUSES, Transport, backends

__all__ = ["KvxferTransport", "install", "installed", "register", "backend_for", "DEFAULT_TARGET"]

logger = logging.getLogger("kvxfer.vllm")

#: Where vLLM defines the transport its P2P manager builds.
DEFAULT_TARGET = "vllm.v1.kv_offload.tiering.p2p.data.nixl:NixlTransport"

# NIXL backend names -> kvxfer backend. NIXL's network backends become "auto"
# (every kvxfer backend usable here; each peer gets shm on the same host, else
# verbs when both have a usable RDMA device, else tcp); its storage
# backends (GDS, POSIX, OBJ, ...) have no kvxfer counterpart and are skipped.
# The name of a backend built into the library (kvxfer.backends()) is its own.
_BACKENDS = {
    "UCX": "auto", "UCX_MO": "auto", "LIBFABRIC": "auto", "UCCL": "auto", "MOONCAKE": "auto", "AUTO": "auto",
}
_BACKENDS.update({name.upper(): name for name in backends()})
if "verbs" in backends():
    _BACKENDS["RDMA"] = "verbs"
_STORAGE = {"GDS", "GDS_MT", "POSIX", "OBJ", "HF3FS", "GPUNETIO", "AZURE_BLOB", "GUSLI"}


def backend_for(backends: Union[None, str, Sequence[str]]) -> str:
    """kvxfer's backend for NixlTransport's backends argument: the first name
    with a kvxfer counterpart (case-insensitive). None or empty: "auto".
    Raises ValueError when no name has one."""
    if backends is None:
        return "auto"
    if isinstance(backends, str):
        backends = [backends]
    names = list(backends)
    if not names:
        return "auto"
    for name in names:
        if not isinstance(name, str):
            raise TypeError("backends must hold str, not %s" % type(name).__name__)
        mapped = _BACKENDS.get(name.upper())
        if mapped:
            return mapped
        if name.upper() not in _STORAGE:
            logger.warning("kvxfer: backend %r has no kvxfer counterpart; skipped", name)
    raise ArgumentError(_native.KVX_ENOTSUP, "none of the backends %r has a kvxfer counterpart (%s)"
                        % (names, ", ".join(sorted(_BACKENDS))))


def _env_options() -> dict:
    text = os.environ.get("KVXFER_OPTIONS", "")
    if not text.strip():
        return {}
    try:
        opts = json.loads(text)
    except ValueError as e:
        raise ArgumentError(_native.KVX_EINVAL, "KVXFER_OPTIONS is not JSON: %s" % e) from None
    if not isinstance(opts, dict):
        raise ArgumentError(_native.KVX_EINVAL, "KVXFER_OPTIONS must be a JSON object, not %s"
                            % type(opts).__name__)
    return opts


class KvxferTransport(Transport):
    """A kvxfer.Transport with vLLM NixlTransport's constructor:

        KvxferTransport(name, view, config_fields=None, backends=None, num_threads=None, **options)

    name: the agent's name (kept as .name, for logs; kvxfer's identity is in
        its metadata). view, config_fields: as vLLM's DataTransport.
    backends: NIXL backend names, mapped by backend_for() ("UCX" -> "auto":
        every kvxfer backend usable here, each peer on the best path both
        sides offer).
    num_threads: accepted for compatibility and kept as .num_threads; kvxfer
        sizes its own threads (one event loop serves every connection).
    options: kvxfer options, over those of KVXFER_OPTIONS; "backend" wins over
        backends."""

    def __init__(self, name: str, view, config_fields: Optional[dict] = None,
                 backends: Union[None, str, Sequence[str]] = None, num_threads: Optional[int] = None,
                 **options):
        if not isinstance(name, str):
            raise TypeError("name must be a str, not %s" % type(name).__name__)
        opts = _env_options()
        opts.update(options)
        backend = opts.pop("backend", None) or backend_for(backends)
        super().__init__(view, config_fields, backend=backend, **opts)
        self.name = name
        self.num_threads = num_threads
        logger.info("kvxfer: transport %r serves on %s (%d blocks of %d bytes)", name, ",".join(self.backends),
                    self.num_blocks, self.block_len_bytes)

    def __repr__(self) -> str:
        return "<kvxfer.vllm.KvxferTransport %r %s>" % (getattr(self, "name", "?"), super().__repr__()[1:-1])

    def poll(self, peer_id: Optional[str] = None, *, owner: Optional[str] = None):
        """Transport.poll, with the peer also as owner= (its name in one
        upstream NixlTransport version), besides by position and peer_id=.
        Both peer_id and owner: TypeError.

        vLLM only sees the failed ids, so each poll that reports failures
        logs them at warning on the logger "kvxfer.vllm": one line per
        reason, e.g. "kvxfer: 3 transfers failed: KVX_ETIMEDOUT (the peer
        made no progress for transfer_timeout_ms, the stall timeout); ids
        7, 8, 9"."""
        if owner is not None:
            if peer_id is not None:
                raise TypeError("poll() takes the peer as peer_id or owner, not both")
            peer_id = owner
        r = super().poll(peer_id)
        errors = getattr(r, "errors", None)
        if errors:
            _log_failures(errors, peer_id)
        return r


_LOGGED_IDS = 8  # ids named per log line, at most


def _log_failures(errors, peer_id):
    """One warning per reason for the failed transfers of one poll."""
    by_code = {}
    for tid, info in errors.items():
        by_code.setdefault(info.code, (info, []))[1].append(tid)
    for code, (info, ids) in by_code.items():
        shown = ", ".join(str(i) for i in ids[:_LOGGED_IDS]) + (", ..." if len(ids) > _LOGGED_IDS else "")
        logger.warning("kvxfer: %d transfer%s%s failed: %s (%s); %s %s", len(ids), "s" if len(ids) > 1 else "",
                       "" if peer_id is None else " to peer %r" % peer_id, info.name,
                       _FAILURE_CAUSES.get(code, info.message), "ids" if len(ids) > 1 else "id", shown)


# ------------------------------------------------------------------ install

_lock = threading.RLock()
_state = {"target": None, "original": None, "hook": None}


def _split_target(target: str):
    module, sep, attr = target.partition(":")
    if not sep or not module or not attr:
        raise ArgumentError(_native.KVX_EINVAL, "target %r is not 'module:Class'" % target)
    return module, attr


def _patch_module(module: types.ModuleType, attr: str) -> None:
    original = getattr(module, attr, None)
    if original is KvxferTransport:
        return
    if original is not None:
        _state["original"] = original
        module.__dict__.setdefault("_kvxfer_original_" + attr, original)
    setattr(module, attr, KvxferTransport)
    # vllm.* modules that did `from <module> import <attr>` before install()
    if original is not None:
        for name, mod in list(sys.modules.items()):
            if name.startswith("vllm.") and mod is not None and getattr(mod, attr, None) is original:
                setattr(mod, attr, KvxferTransport)
    logger.info("kvxfer: %s.%s is now kvxfer.vllm.KvxferTransport", module.__name__, attr)


class _Loader(importlib.abc.Loader):
    """Runs the real loader of the target module, then patches it; stands in
    for it when it cannot be imported (no NIXL)."""

    def __init__(self, real, attr):
        self._real, self._attr = real, attr

    def create_module(self, spec):
        return self._real.create_module(spec) if self._real is not None else None

    def exec_module(self, module):
        try:
            if self._real is None:
                raise ImportError("no module named %r" % module.__name__)
            self._real.exec_module(module)
        except ImportError as e:
            logger.warning("kvxfer: %s cannot be imported (%s); kvxfer stands in for it", module.__name__, e)
            module.__dict__.setdefault("__doc__", "kvxfer's stand-in: %s could not be imported" % module.__name__)
        _patch_module(module, self._attr)


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self, module, attr):
        self.module, self.attr = module, attr

    def find_spec(self, fullname, path, target=None):
        if fullname != self.module:
            return None
        spec = None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        if spec is None:  # this vLLM has no such module: stand in for it
            return importlib.util.spec_from_loader(fullname, _Loader(None, self.attr))
        spec.loader = _Loader(spec.loader, self.attr)
        return spec


def install(target: Optional[str] = None) -> type:
    """Make vLLM build KvxferTransport where it builds NixlTransport (see the
    module docstring). target: "module:Class", default KVXFER_VLLM_TARGET or
    DEFAULT_TARGET. Idempotent; returns KvxferTransport."""
    target = target or os.environ.get("KVXFER_VLLM_TARGET") or DEFAULT_TARGET
    module, attr = _split_target(target)
    with _lock:
        if _state["target"] not in (None, target):
            raise ArgumentError(_native.KVX_EINVAL, "kvxfer.vllm is installed for %s already, not %s"
                                % (_state["target"], target))
        _state["target"] = target
        if module in sys.modules and sys.modules[module] is not None:
            _patch_module(sys.modules[module], attr)
        elif _state["hook"] is None:
            _state["hook"] = _Finder(module, attr)
            sys.meta_path.insert(0, _state["hook"])
    return KvxferTransport


def installed() -> bool:
    """True once install() ran in this process."""
    return _state["target"] is not None


def register() -> None:
    """vLLM's general-plugin entry point (group vllm.general_plugins): installs
    kvxfer when KVXFER_VLLM=1. vLLM calls it in every process it starts."""
    if os.environ.get("KVXFER_VLLM", "") in ("", "0"):
        logger.debug("kvxfer: plugin loaded; KVXFER_VLLM is not set, NIXL stays")
        return
    install()
