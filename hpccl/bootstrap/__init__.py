"""Bootstrap: the out-of-band channel used at set-up to exchange addresses and handles. Two
implementations of one interface (rank, size, world_rank, comm, allgather, bcast, barrier, split, release,
close): over MPI (mpiexec, srun) and over a key-value store (torchrun's c10d Store)."""
from .mpi import MpiBootstrap
from .store import StoreBootstrap

__all__ = ["MpiBootstrap", "StoreBootstrap"]
