"""Zero-copy collectives on registered GPU buffers (comm.register; transport/cuda_register.py): every
rank's kernel reads its peers' registered buffers directly (no staging), or the copy engines move a large
broadcast or all_gather between two zero-copy barriers. Functions of a single-node kernel engine
(cuda_comm.CudaComm), tried before the table's algorithms (dispatch.device_collective)."""
from __future__ import annotations

import ctypes
from typing import Any, Optional

from .cuda_comm import _dtid, _logical
from ..errors import HpcclSystemError
from ..kernels import OP_IDS
from ..transport.cuda_register import Registry



def run(eng: Any, coll: str, args: tuple, stream: int) -> Optional[str]:
    """Run a call whose buffers are registered with the zero-copy kernels (or, for a large broadcast
    or all_gather, the copy engines); its algorithm's name, or None when a buffer it needs is not
    registered or it is below HPCCL_CUDA_ZERO_COPY (the same on every rank for a symmetric call). The
    planner routes here only collectives of planner.ZERO_COPY_COLLS."""
    if eng.safe:
        return None  # the zero-copy kernels wait for their peers inside: not on a GPU that may be shared
    send, recv = args[0], args[1]
    nbytes = recv.nbytes if coll == "reduce_scatter" else send.nbytes
    if nbytes < eng.zero_copy_min or eng.zero_copy_min < 0:
        return None
    reg = eng.registry
    if coll == "all_gather" and send.data.ptr == recv.data.ptr + eng.rank * nbytes:
        # in place: every rank's input is its block of its output, at a different offset on each rank
        hit = reg.find(recv.data.ptr, recv.nbytes, "recvbuf")
        step = nbytes
    else:
        hit = reg.find(send.data.ptr, send.nbytes, "sendbuf")
        step = 0
    if hit is None:
        return None
    if coll == "all_to_all" and send.data.ptr < recv.data.ptr + recv.nbytes and \
            recv.data.ptr < send.data.ptr + send.nbytes:
        return None  # in place, a rank would overwrite segments its peers still read
    parts = [hit]
    if coll == "all_reduce":  # two-shot reads peers' outputs too
        rhit = hit if recv.data.ptr == send.data.ptr else reg.find(recv.data.ptr, recv.nbytes, "recvbuf")
        if rhit is None:
            return None
        parts.append(rhit)
    root = args[2] if coll in ("reduce", "broadcast") else -1
    r = eng.reg_args
    a = r.c
    for p in range(eng.size):
        r.src[p] = hit[0].peers[p] + hit[1] + p * step
        r.dst[p] = parts[-1][0].peers[p] + parts[-1][1] if coll == "all_reduce" else 0
    r.desc = Registry.descriptor(f"{coll}:{root}:{nbytes}:{step}", *parts)
    stride = rstride = 0
    if coll == "reduce_scatter":
        stride = nbytes
    elif coll == "all_to_all":
        nbytes = send.nbytes // eng.size
        stride = rstride = nbytes
    elif coll == "all_gather":
        rstride = nbytes
    ptrs = [r.src[p] for p in range(eng.size)] + [send.data.ptr, recv.data.ptr, stride, rstride, nbytes]
    if coll == "all_reduce":
        ptrs += [r.dst[p] for p in range(eng.size)]
    aligned = 1 if all((x & 15) == 0 for x in ptrs) else 0
    a.send, a.recv, a.nbytes, a.stride, a.root, a.aligned = (send.data.ptr, recv.data.ptr, nbytes, stride, root,
                                                             aligned)
    eng.rstride.value = rstride
    if coll in ("broadcast", "all_gather") and 0 < eng.ce_min <= nbytes:
        _ce_copy(eng, coll, send, recv, nbytes, root, stream)
        return "ce"
    if coll in ("all_reduce", "reduce", "reduce_scatter"):
        dt, opid = _dtid(_logical(send)), OP_IDS[args[-1].value]
        blocks, a.chunk = eng._geometry(nbytes, eng.size if coll == "all_reduce" else 1)
        ln = eng._launch(f"hp_reg_reduce<{dt}, {opid}>", dt, blocks, "reg")
    else:
        blocks, a.chunk = eng._geometry(nbytes, 1)
        ln = eng._launch("hp_reg_copy", None, blocks, "regcopy")
    eng._go(ln, stream, coll, None)
    return "zerocopy"

def _ce_copy(eng: Any, coll: str, send: Any, recv: Any, nbytes: int, root: int, stream: int) -> None:
    """Peer copies by the copy engines (no SMs) between two zero-copy steps: every rank's input is
    ready before the first copy reads it, and no rank goes on before the last copy of it is done."""
    bar = eng._launch("hp_reg_barrier", None, 1, "reg")
    eng._go(bar, stream, coll, None)
    r, me, n = eng.reg_args, eng.rank, eng.size
    copies = ([(recv.data.ptr, r.src[root])] if root >= 0 else
              [(recv.data.ptr + s * nbytes, r.src[s]) for s in ((me + k) % n for k in range(n))])
    for dst, src in copies:
        if dst != src:
            rc = eng.driver.memcpy_async(dst, src, nbytes, ctypes.c_void_p(stream))
            if rc:
                raise HpcclSystemError(f"{coll}: cuMemcpyDtoDAsync failed: {eng.driver.error_name(rc)}")
    eng._go(bar, stream, coll, None)
