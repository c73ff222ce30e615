"""Stand-in of vllm.v1.kv_offload.tiering.p2p.data.base: vLLM's DataTransport
and PollResult, as tests/seed_reference.py has them."""
import ctypes
import hashlib
import json
from abc import ABC, abstractmethod
from concurrent.futures import Future
from typing import Iterable, Literal, NamedTuple, Sequence

CancelMode = Literal["immediate", "wait"]


class PollResult(NamedTuple):
    done: Sequence[int]
    failed: Sequence[int]


class DataTransport(ABC):
    def __init__(self, view: memoryview, config_fields: dict | None = None) -> None:
        assert view.shape is not None
        self._view = view
        self._base_addr = ctypes.addressof(ctypes.c_char.from_buffer(view))
        self._num_blocks = view.shape[0]
        self._block_len = view.shape[1]
        self._config_fingerprint = self._compute_fingerprint(config_fields)

    @property
    def base_addr(self) -> int:
        return self._base_addr

    @property
    def num_blocks(self) -> int:
        return self._num_blocks

    @property
    def block_len(self) -> int:
        return self._block_len

    @property
    def config_fingerprint(self) -> str:
        return self._config_fingerprint

    @staticmethod
    def _compute_fingerprint(config_fields: dict | None) -> str:
        if not config_fields:
            return ""
        canonical = json.dumps(config_fields, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]

    @abstractmethod
    def get_agent_metadata(self) -> bytes: ...

    @abstractmethod
    def add_remote_peer(self, peer_id: str, agent_metadata: bytes, base_addr: int, num_blocks: int,
                        block_len: int) -> None: ...

    def add_remote_peer_async(self, peer_id: str, agent_metadata: bytes, base_addr: int, num_blocks: int,
                              block_len: int) -> "Future[None]":
        """Newest vLLM: registration without blocking the scheduler; a failed
        future means: reject the peer. This default (which a virtual subclass
        does not inherit) runs add_remote_peer and returns a done future."""
        fut: Future = Future()
        try:
            self.add_remote_peer(peer_id, agent_metadata, base_addr, num_blocks, block_len)
            fut.set_result(None)
        except Exception as e:  # noqa: BLE001
            fut.set_exception(e)
        return fut

    @abstractmethod
    def remove_remote_peer(self, peer_id: str) -> None: ...

    @abstractmethod
    def write_blocks(self, peer_id: str, local_idxs: list[int], remote_idxs: list[int]) -> int | None: ...

    @abstractmethod
    def poll(self) -> PollResult: ...

    @abstractmethod
    def cancel(self, transfer_ids: Iterable[int], mode: CancelMode = "immediate") -> list[int]: ...

    @abstractmethod
    def close(self) -> None: ...
