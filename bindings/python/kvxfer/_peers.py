"""A peer's state (kvx_get_peer_state) and the list of a transport's peers
(kvx_list_peers)."""

import enum
from typing import NamedTuple

from . import _native
from ._args import _enum_or_int
from ._errors import ErrorCode

__all__ = ["PeerLink", "PeerState", "PeerInfo"]


class PeerLink(enum.IntEnum):
    """Where a peer's connection stands (kvx_peer_link). PeerInfo.state is
    its lower-case name: "up", "reconnecting", "broken", "connecting"."""

    UP = _native.KVX_PEER_UP                      # connected: writes go out on peer_backend()'s path
    RECONNECTING = _native.KVX_PEER_RECONNECTING  # failed; reconnects in the background (peer_redial_ms)
    BROKEN = _native.KVX_PEER_BROKEN              # failed, no reconnection (peer_redial_ms=0): remove and re-add
    CONNECTING = _native.KVX_PEER_CONNECTING      # being added: only in Transport.peers() (since 0.10)


def _link_name(link) -> str:
    return link.name.lower() if isinstance(link, PeerLink) else "link%d" % link


class PeerState(NamedTuple):
    """A registered peer's state (Transport.peer_state, kvx_get_peer_state(3)).

    link: a PeerLink (UP, RECONNECTING, BROKEN; CONNECTING only in
        Transport.peers()).
    error: the ErrorCode of what took the connection down (ETIMEDOUT: the
        stall timeout; ECONNRESET: the connection failed), then of the last
        failed reconnection attempt; ErrorCode.OK (0) while it never failed.
    backend, path: its path, as peer_backend() says ("tcp", "").
    in_flight: its transfers submitted and not yet reported by poll().
    since_ns: when it entered this state (ns since the epoch).
    next_attempt_ns: RECONNECTING: when the next attempt starts (ns since
        the epoch); 0 while one runs, and in the other states.
    reconnects: times it reconnected since it was added.
    attempts: failed attempts since it went down (0 when up).
    reason: why it is not up ("" when up): the message of error.
    last_progress_ns: when it last made progress (a transfer of it ended,
        or it got work while it had none in flight), ns since the epoch; 0
        before its first transfer. The stall timeout counts from here
        (since 0.10).
    """

    link: PeerLink
    error: int
    backend: str
    path: str
    in_flight: int
    since_ns: int
    next_attempt_ns: int
    reconnects: int
    attempts: int
    reason: str
    last_progress_ns: int = 0


def _peer_state(d: dict) -> PeerState:
    """PeerState of kvxpy_peer_state_dict's dict (changed in place)."""
    d["link"] = _enum_or_int(PeerLink, d["link"])
    d["error"] = _enum_or_int(ErrorCode, d["error"])
    return PeerState(**d)


class PeerInfo(NamedTuple):
    """One peer of Transport.peers() (kvx_list_peers(3)): its id and the
    fields of its PeerState, flat (p.backend, p.in_flight, ...).

    A peer being added has link CONNECTING, since_ns the moment its add
    began, and every other field 0 or "". The property state is the link's
    name ("up", "reconnecting", "broken", "connecting"); peer_state is the
    fields as a PeerState.
    """

    peer_id: str
    link: PeerLink
    error: int
    backend: str
    path: str
    in_flight: int
    since_ns: int
    next_attempt_ns: int
    reconnects: int
    attempts: int
    reason: str
    last_progress_ns: int

    @property
    def state(self) -> str:
        """"up", "reconnecting", "broken" or "connecting"."""
        return _link_name(self.link)

    @property
    def peer_state(self) -> PeerState:
        return PeerState(*self[1:])


def _peer_infos(items) -> list:
    """PeerInfos of kvxpy_list_peers's [(peer_id, state dict), ...]."""
    return [PeerInfo(peer_id, *_peer_state(d)) for peer_id, d in items]
