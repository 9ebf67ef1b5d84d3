"""hpccl: collective communication for Python on HPC systems (the job NCCL does), bootstrapped by MPI."""
from .bootstrap.join import close_port, open_port
from .core.comm import Communicator, init, join
from .errors import (HpcclEnvironmentError, HpcclError, HpcclInvalidArgument, HpcclInvalidUsage,
                     HpcclRemoteError, HpcclSystemError, HpcclTimeoutError, HpcclUnsupported)
from .ops import AVG, DTYPES, MAX, MIN, PROD, SUM, ReduceOp

__version__ = "0.1.0"

__all__ = [
    "Communicator", "init", "join", "open_port", "close_port",
    "ReduceOp", "SUM", "PROD", "MIN", "MAX", "AVG", "DTYPES", "bfloat16",
    "float8_e4m3fn", "float8_e5m2",
    "HpcclError", "HpcclInvalidArgument", "HpcclInvalidUsage", "HpcclTimeoutError", "HpcclSystemError",
    "HpcclEnvironmentError", "HpcclUnsupported", "HpcclRemoteError", "__version__",
]


def __getattr__(name: str) -> object:
    """hpccl.bfloat16, hpccl.float8_e4m3fn and hpccl.float8_e5m2 (numpy's, from ml_dtypes) are made when
    first read: see ops.ml_dtype."""
    from . import ops
    if name in ops.ML_NAMES:
        return ops.ml_dtype(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
