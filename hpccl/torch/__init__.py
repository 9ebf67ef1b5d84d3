"""torch.distributed backend "hpccl": ``import hpccl.torch`` registers it, then
``torch.distributed.init_process_group("hpccl")`` runs torch's collectives,
DDP and FSDP included, on hpccl communicators, for CPU and CUDA tensors.

Bootstrap (HPCCL_BOOTSTRAP): under mpiexec or srun, MPI (mpi4py), with torch's rank equal to the MPI rank
(``hpccl.torch.init_process_group()`` sets that up), and subgroups over the matching MPI group; under
torchrun (no MPI launcher), the c10d Store torch hands the backend for each group.

Streams, as ProcessGroupNCCL's: a synchronous CUDA call (dist.* with async_op=False) is enqueued on the
caller's current stream with no Work; an asynchronous one (async_op=True, DDP's reducer) runs on an hpccl
stream per group and device that first waits on the caller's stream, its tensors recorded there with the
caching allocator, and its Work's wait() makes the caller's stream wait on it: no host synchronisation.
CPU collectives complete inside the call. Bad input and hpccl's timeouts (naming the collective and the
ranks) raise from the call.

Modules: options (torch's arguments read into hpccl's), work (Work and the per-device stream),
process_group (the ProcessGroup: one core and an adapter per op), launch (creation and registration).
"""
from __future__ import annotations

from .launch import init_process_group, register
from .process_group import BACKEND, HpcclProcessGroup

__all__ = ["BACKEND", "HpcclProcessGroup", "init_process_group", "register"]

register()
