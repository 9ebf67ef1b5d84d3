"""Bootstrap over an mpi4py communicator: small object exchange at set-up, never on the data path.

Every exchange first reaches rank 0 point to point (so a rank that never calls init or split is named
instead of hanging an MPI collective); results go back through MPI's nonblocking broadcast; every step
is polled against HPCCL_TIMEOUT."""
from __future__ import annotations

import time
from typing import Any, Dict, List, Optional

from .. import config
from ..errors import HpcclInvalidArgument, HpcclSystemError, HpcclTimeoutError

_TAG_UP, _TAG_DOWN = 101, 102
_TAG_SHRINK_UP, _TAG_SHRINK_DOWN = 103, 104
_TAG_HELLO, _TAG_WELCOME = 31001, 31002  # on the user's communicator, once, inside init (a collective call)


def _mpi():
    try:
        from mpi4py import MPI
    except ImportError as exc:  # pragma: no cover - mpi4py is a hard dependency
        raise HpcclSystemError(f"mpi4py is needed to bootstrap hpccl: {exc}") from None
    return MPI


class MpiBootstrap:
    """Owns a private duplicate of the user's MPI communicator so hpccl traffic never mixes with theirs."""

    def __init__(self, mpi_comm: Optional[Any] = None, what: str = "init") -> None:
        MPI = _mpi()
        if mpi_comm is None:
            mpi_comm = MPI.COMM_WORLD
        if not isinstance(mpi_comm, MPI.Comm) or mpi_comm == MPI.COMM_NULL:
            raise HpcclInvalidArgument("mpi_comm", f"expected an mpi4py communicator, got {mpi_comm!r}")
        if mpi_comm.Is_inter():
            raise HpcclInvalidArgument("mpi_comm", "an intercommunicator cannot bootstrap hpccl")
        self.timeout = config.get("HPCCL_TIMEOUT")
        self.rank = mpi_comm.Get_rank()
        self.size = mpi_comm.Get_size()
        self.world_rank = MPI.COMM_WORLD.Get_rank()
        self._seq = 0
        self._census(mpi_comm, what)
        self.comm, req = mpi_comm.Idup()
        self._poll(lambda: req.Test(), what, None,
                   "not every rank of the MPI communicator entered it (MPI_Comm_idup did not complete)")

    def _census(self, c: Any, what: str) -> None:
        """Before the first collective MPI call: every rank reports to rank 0, which answers once all have
        (or, at HPCCL_TIMEOUT, tells the ranks that came which ones did not), so every waiting rank names
        the ranks that never called init (MPI_Comm_idup cannot say who)."""
        if self.size == 1:
            return
        if self.rank == 0:
            seen: Dict[int, Any] = {0: None}
            try:
                self._collect(c, range(self.size), _TAG_HELLO, seen, what, "these ranks never called it")
            except HpcclTimeoutError:
                absent = [r for r in range(self.size) if r not in seen]
                for r in sorted(seen.keys() - {0}):  # the ranks that came learn who did not; rank 0 raises
                    c.isend(absent, dest=r, tag=_TAG_WELCOME)
                raise
            self._answer(c, range(1, self.size), [], _TAG_WELCOME, what)
        else:
            req = c.isend(None, dest=0, tag=_TAG_HELLO)
            absent = self._await(c, 0, _TAG_WELCOME, what, "rank 0 counts every rank in and did not answer",
                                 grace=1.0)  # time to hear rank 0's verdict
            if absent:
                req.Cancel()
                raise HpcclTimeoutError(f"bootstrap {what}", self._seq, absent, self.timeout,
                                        "these ranks never called it; rank 0 counted")
            req.Wait()

    def _collect(self, c: Any, sources: Any, tag: int, got: Dict[int, Any], what: str,
                 detail: str = "") -> None:
        """Receive one object on ``tag`` from each of ``sources`` not yet in ``got`` (in any order: any
        source first), polled against HPCCL_TIMEOUT, naming the sources that never sent."""
        MPI = _mpi()
        st = MPI.Status()
        want = len(set(sources) | got.keys())

        def all_in() -> bool:
            while len(got) < want and c.iprobe(source=MPI.ANY_SOURCE, tag=tag, status=st):
                src = st.Get_source()
                got[src] = c.recv(source=src, tag=tag)
            return len(got) == want
        self._poll(all_in, what, lambda: [r for r in sources if r not in got], detail)

    def _answer(self, c: Any, dests: Any, obj: Any, tag: int, what: str) -> None:
        """Send ``obj`` to each of ``dests`` and see the sends complete, timed."""
        reqs = [c.isend(obj, dest=r, tag=tag) for r in dests]
        self._poll(lambda: all(q.Test() for q in reqs), what, None, "a rank stopped receiving")

    def _await(self, c: Any, src: int, tag: int, what: str, detail: str, grace: float = 0.0) -> Any:
        """The object ``src`` sends on ``tag``, polled against HPCCL_TIMEOUT (+ ``grace``), naming ``src``."""
        timeout, self.timeout = self.timeout, self.timeout + grace
        try:
            self._poll(lambda: c.iprobe(source=src, tag=tag), what, lambda: [src], detail)
        finally:
            self.timeout = timeout
        return c.recv(source=src, tag=tag)

    def _poll(self, done, what: str, missing, detail: str = "") -> None:
        start = time.monotonic()
        polls = 0
        while not done():
            polls += 1
            if polls < 200:
                continue
            if time.monotonic() - start > self.timeout:
                raise HpcclTimeoutError(f"bootstrap {what}", self._seq,
                                        missing() if missing else [], self.timeout, detail)
            time.sleep(5e-5 if polls < 2000 else 5e-4)

    def allgather(self, obj: Any, what: str = "allgather") -> List[Any]:
        """Every rank's obj, in rank order. Gathered at rank 0 point to point (any source first, so a
        rank that never comes is named), then pickled once and broadcast by MPI's own nonblocking
        broadcast (a tree: O(n log n) bytes in all, where sending the table to each rank was O(n^2)
        at rank 0), every step polled against HPCCL_TIMEOUT."""
        import pickle

        import numpy as np
        self._seq += 1
        c = self.comm
        req = None
        if self.rank == 0:
            got: Dict[int, Any] = {0: obj}
            self._collect(c, range(self.size), _TAG_UP, got, what)
            table = pickle.dumps([got[r] for r in range(self.size)], protocol=pickle.HIGHEST_PROTOCOL)
            length = np.array([len(table)], dtype=np.int64)
        else:
            req = c.isend(obj, dest=0, tag=_TAG_UP)
            length = np.zeros(1, dtype=np.int64)
        wait = None if self.rank == 0 else (lambda: [0])
        detail = "rank 0 broadcasts every rank's part once all have sent theirs; it or another rank has " \
                 "not arrived"
        r1 = c.Ibcast(length, root=0)
        self._poll(r1.Test, what, wait, detail)
        buf = np.frombuffer(bytearray(table), dtype=np.uint8) if self.rank == 0 else np.empty(int(length[0]), np.uint8)
        r2 = c.Ibcast(buf, root=0)
        self._poll(r2.Test, what, wait, detail)
        if req is not None:
            req.Wait()
        return [got[r] for r in range(self.size)] if self.rank == 0 else pickle.loads(buf.tobytes())

    def bcast(self, obj: Any, root: int = 0) -> Any:
        return self.allgather(obj if self.rank == root else None, "bcast")[root]

    def barrier(self) -> None:
        self.allgather(None, "barrier")

    def split(self, color: Optional[int], key: int) -> Any:
        """A raw MPI communicator for the ranks of the same color, ordered by (key, rank); COMM_NULL for
        color None or < 0. Membership is agreed through the timed allgather first."""
        MPI = _mpi()
        c = None if color is None or color < 0 else int(color)
        table = self.allgather((c, key), "split")
        if c is None:
            return MPI.COMM_NULL
        members = sorted((k, r) for r, (col, k) in enumerate(table) if col == c)
        group = self.comm.Get_group().Incl([r for _, r in members])
        try:
            return self.comm.Create_group(group, tag=c % 32000)
        finally:
            group.Free()

    def shrink(self, exclude: List[int]) -> Any:
        """A raw MPI communicator of every rank not in ``exclude``, built without any MPI call that
        includes the excluded ones: the survivors first agree on the list through the lowest of them
        (point to point, timed, naming survivors that never come), then MPI_Comm_create_group over them."""
        survivors = [r for r in range(self.size) if r not in exclude]
        leader, c = survivors[0], self.comm
        self._seq += 1
        if self.rank == leader:
            got: Dict[int, Any] = {leader: list(exclude)}
            self._collect(c, survivors, _TAG_SHRINK_UP, got, "shrink", "a surviving rank did not call shrink")
            differ = sorted(r for r, ex in got.items() if ex != list(exclude))
            verdict = None if not differ else (f"ranks {differ} excluded {[got[r] for r in differ]}, rank {leader} "
                                               f"excluded {list(exclude)}")
            self._answer(c, [r for r in survivors if r != leader], verdict, _TAG_SHRINK_DOWN, "shrink")
        else:
            req = c.isend(list(exclude), dest=leader, tag=_TAG_SHRINK_UP)
            verdict = self._await(c, leader, _TAG_SHRINK_DOWN, "shrink",
                                  f"rank {leader} gathers the survivors' lists; it or another survivor has not "
                                  "arrived")
            req.Wait()
        if verdict is not None:
            raise HpcclInvalidArgument("exclude", f"the surviving ranks disagree on whom to exclude: {verdict}")
        group = c.Get_group().Incl(survivors)
        try:
            return c.Create_group(group, tag=(1000 + self._seq) % 32000)
        finally:
            group.Free()

    @staticmethod
    def release(sub: Any) -> None:
        """Free the raw MPI communicator split() returned, once a Communicator has duplicated it."""
        sub.Free()

    def close(self) -> None:
        if self.comm is not None:
            try:
                self.comm.Free()
            except Exception:  # noqa: BLE001 - MPI may already be finalized at exit
                pass
            self.comm = None
