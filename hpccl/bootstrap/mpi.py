"""Bootstrap over an mpi4py communicator: small object exchange at set-up, never on the data path."""
from __future__ import annotations

from typing import Any, List, Optional

from ..errors import HpcclInvalidArgument, HpcclSystemError


def _mpi():
    try:
        from mpi4py import MPI
    except ImportError as exc:  # pragma: no cover - mpi4py is a hard dependency
        raise HpcclSystemError(f"mpi4py is needed to bootstrap hpccl: {exc}") from None
    return MPI


class MpiBootstrap:
    """Owns a private duplicate of the user's MPI communicator so hpccl traffic never mixes with theirs."""

    def __init__(self, mpi_comm: Optional[Any] = None) -> None:
        MPI = _mpi()
        if mpi_comm is None:
            mpi_comm = MPI.COMM_WORLD
        if not isinstance(mpi_comm, MPI.Comm) or mpi_comm == MPI.COMM_NULL:
            raise HpcclInvalidArgument("mpi_comm", f"expected an mpi4py communicator, got {mpi_comm!r}")
        if mpi_comm.Is_inter():
            raise HpcclInvalidArgument("mpi_comm", "an intercommunicator cannot bootstrap hpccl")
        self.comm = mpi_comm.Dup()
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()
        self.world_rank = MPI.COMM_WORLD.Get_rank()

    def allgather(self, obj: Any) -> List[Any]:
        return self.comm.allgather(obj)

    def bcast(self, obj: Any, root: int = 0) -> Any:
        return self.comm.bcast(obj, root=root)

    def barrier(self) -> None:
        self.comm.Barrier()

    def split(self, color: int, key: int) -> Any:
        """A raw MPI communicator for the ranks of the same color, ordered by key."""
        MPI = _mpi()
        return self.comm.Split(MPI.UNDEFINED if color is None or color < 0 else color, key)

    def close(self) -> None:
        if self.comm is not None:
            try:
                self.comm.Free()
            except Exception:  # noqa: BLE001 - MPI may already be finalized at exit
                pass
            self.comm = None
