"""NVTX ranges around GPU collectives for Nsight Systems timelines, through the ``nvtx`` package:
HPCCL_NVTX=auto (on when the package is importable), 1 (on; a warning when it is missing) or 0. The
communicator pushes "hpccl <collective> #<seq> <bytes> B" around each GPU call and marks the algorithm
chosen inside it (domain "hpccl")."""
from __future__ import annotations

from typing import Any, Optional

from .. import config, log


def ranges() -> Optional[Any]:
    """The nvtx module when ranges are on, else None."""
    mode = config.get("HPCCL_NVTX")
    if mode == "0":
        return None
    try:
        import nvtx
    except ImportError:
        if mode == "1":
            log.warn("INIT", "HPCCL_NVTX=1 but the nvtx package is not installed (pip install nvtx); "
                     "no NVTX ranges")
        return None
    return nvtx
