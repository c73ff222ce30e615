"""Stand-in of vLLM's P2P KV-offload manager: how it builds its transport,
and how its control plane drives it (a handshake is accepted, or rejected on
ValueError; the reaper removes the peer of every dead session, whether it was
ever added or not; a fetch turns into write_blocks with the peer's indexes)."""
from concurrent.futures import Future

from vllm.v1.kv_offload.tiering.p2p.data.nixl import NixlTransport


class P2PManager:
    def __init__(self, name, view, config_fields=None, backends=("UCX",), num_threads=4):
        self.transport = NixlTransport(name, view, config_fields=config_fields, backends=list(backends),
                                       num_threads=num_threads)
        self.rejected = []

    def handshake(self, peer_id, metadata, base_addr, num_blocks, block_len) -> Future:
        fut = self.transport.add_remote_peer_async(peer_id, metadata, base_addr, num_blocks, block_len)

        def check(f):
            exc = f.exception()
            if isinstance(exc, ValueError):
                self.rejected.append(peer_id)  # ack, disconnect, clean up
            elif exc is not None:
                raise exc  # an internal error: vLLM leaves the session alive

        fut.add_done_callback(check)
        return fut

    def reap(self, peer_id):
        self.transport.remove_remote_peer(peer_id)

    def fetch(self, peer_id, local_idxs, remote_idxs):
        return self.transport.write_blocks(peer_id, local_idxs, remote_idxs)
