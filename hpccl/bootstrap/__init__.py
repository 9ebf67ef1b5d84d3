"""Bootstrap: the out-of-band channel used at set-up to exchange addresses and handles."""
from .mpi import MpiBootstrap

__all__ = ["MpiBootstrap"]
