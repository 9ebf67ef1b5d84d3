"""A communicator's one transport table: every way it moves bytes (shared-memory messages, single-copy
reads between processes, the native network engine or MPI, CUDA IPC peer memory, registered buffers), and
which peers each reaches. It is filled at set-up (transport/select.py) and when the GPU side starts
(device.py). The message transports the algorithms' primitives send through are read from it, peer by
peer, and so are the ones that carry announcements, aborts and closing."""
from __future__ import annotations

from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple

from .base import Transport


class Row(NamedTuple):
    """One way of moving bytes: its name, what it moves, the peers it reaches (communicator ranks), and its
    message transport (None for those that only read or map peers' memory)."""

    name: str
    moves: str
    peers: Tuple[int, ...]
    transport: Optional[Transport]


class TransportTable:
    """The rows of one communicator; ``messaging`` lists the message transports (set-up order), ``of``
    the one each peer's messages take (the first row that reaches it)."""

    def __init__(self, rank: int, size: int) -> None:
        self.rank, self.size = rank, size
        self.rows: List[Row] = []
        self.messaging: List[Transport] = []
        self.of: Dict[int, Transport] = {}

    def add(self, name: str, moves: str, peers: Sequence[int], transport: Optional[Transport] = None) -> None:
        """A way to ``peers`` (this rank left out); a message transport also becomes the route of each
        peer that has none yet."""
        self.rows.append(Row(name, moves, tuple(p for p in peers if p != self.rank), transport))
        if transport is not None:
            if all(t is not transport for t in self.messaging):
                self.messaging.append(transport)
            for p in peers:
                self.of.setdefault(p, transport)

    def find(self, name: str) -> Any:
        """The message transport of the row called ``name`` (None when there is none)."""
        return next((r.transport for r in self.rows if r.name == name), None)

    def reaches(self, name: str) -> Tuple[int, ...]:
        """The peers the row called ``name`` reaches (none when there is no such row)."""
        return next((r.peers for r in self.rows if r.name == name), ())

    def unreached(self) -> List[int]:
        """Peers no message transport reaches (an incomplete set-up: empty on every working one)."""
        return [p for p in range(self.size) if p not in self.of]

    def clear(self) -> None:
        """After close: no row and no message transport is left."""
        self.rows, self.of = [], {}
        self.messaging.clear()

    def describe(self) -> str:
        """One line per row, for the INIT log and hpccl-info's view of a communicator."""
        return "; ".join(f"{r.name} ({r.moves}) -> {_ranks(r.peers)}" for r in self.rows) or "none"


def _ranks(peers: Tuple[int, ...]) -> str:
    """Peers as ranges: 1-3,7."""
    if not peers:
        return "no peer"
    out, start, prev = [], peers[0], peers[0]
    for p in peers[1:] + (None,):  # type: ignore[operator]
        if p is not None and p == prev + 1:
            prev = p
            continue
        out.append(str(start) if start == prev else f"{start}-{prev}")
        if p is not None:
            start = prev = p
    return "ranks " + ",".join(out)
