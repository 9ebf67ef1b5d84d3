"""hpccl: collective communication for Python on HPC systems (the job NCCL does), bootstrapped by MPI."""
from .core.comm import Communicator, init
from .errors import (HpcclEnvironmentError, HpcclError, HpcclInvalidArgument, HpcclInvalidUsage,
                     HpcclRemoteError, HpcclSystemError, HpcclTimeoutError, HpcclUnsupported)
from .ops import AVG, DTYPES, MAX, MIN, PROD, SUM, ReduceOp, bfloat16

__version__ = "0.1.0"

__all__ = [
    "Communicator", "init", "ReduceOp", "SUM", "PROD", "MIN", "MAX", "AVG", "DTYPES", "bfloat16",
    "HpcclError", "HpcclInvalidArgument", "HpcclInvalidUsage", "HpcclTimeoutError", "HpcclSystemError",
    "HpcclEnvironmentError", "HpcclUnsupported", "HpcclRemoteError", "__version__",
]
