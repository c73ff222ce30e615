"""vLLM's DataTransport (vllm.v1.kv_offload.tiering.p2p.data.base), copied
from the project's seed document as the reference the tests compare kvxfer
with: the abstract interface, PollResult, and the fingerprint computation."""
import ctypes
import hashlib
import json
from abc import ABC, abstractmethod
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


class SeedGeometry(DataTransport):
    """Concrete only to run the seed's constructor (properties, fingerprint)."""

    get_agent_metadata = add_remote_peer = remove_remote_peer = None
    write_blocks = poll = cancel = close = None


SeedGeometry.__abstractmethods__ = frozenset()
compute_fingerprint = DataTransport._compute_fingerprint
