"""NVTX ranges around GPU collectives for Nsight Systems timelines, through the ``nvtx`` package:
HPCCL_NVTX=auto (on when the package is importable and a tool is there to receive the ranges: Nsight
Systems and other NVTX tools are found through NVTX_INJECTION64_PATH; with none a range records nothing and
would only cost the calls their replays), 1 (on; a warning when the package is missing) or 0. The
communicator pushes "hpccl <collective> #<seq> <bytes> B" around each GPU call and marks the algorithm
chosen inside it (domain "hpccl")."""
from __future__ import annotations

import os
from typing import Any, Optional

from .. import config, log


def ranges() -> Optional[Any]:
    """The nvtx module when ranges are on, else None."""
    mode = config.get("HPCCL_NVTX")
    if mode == "0" or (mode == "auto" and not tool_attached()):
        return None
    try:
        import nvtx
    except ImportError:
        if mode == "1":
            log.warn("INIT", "HPCCL_NVTX=1 but the nvtx package is not installed (pip install nvtx); "
                     "no NVTX ranges")
        return None
    return nvtx


def tool_attached() -> bool:
    """An NVTX tool is set to load in this process (how nvtx finds Nsight Systems, Nsight Compute or CUPTI)."""
    return bool(os.environ.get("NVTX_INJECTION64_PATH") or os.environ.get("NVTX_INJECTION32_PATH"))
