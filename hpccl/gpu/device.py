"""The GPU half of a Communicator, built at its first device call (on every rank together): the rank's
device and memory component, and what runs device algorithms on this layout:

  * one node: the kernel engine (cuda_comm.CudaComm) over GPU peer memory; its launches are stream-ordered
    and capturable, and a repeated call replays a launch snapshot (fast path);
  * several nodes: staged steps on the communicator's native network engine (netstep.py), in stream order;
    where the engine is absent (not built, or HPCCL_NET=mpi) MPI carries the traffic instead: the network
    proxy thread (proxy.Proxy) runs the table's host schedules (ring, trees, linear) for device memory over
    device primitives on an MPI transport of their own (host staging); hier's node steps go to the 'intra'
    sub-communicator's kernel engine.
"""
from __future__ import annotations

import ctypes

from collections import Counter
from typing import Any, Optional, Tuple

import numpy as np

from .. import config, log
from ..runtime import failures
from ..errors import HpcclInvalidArgument, HpcclInvalidUsage, HpcclSystemError, HpcclUnsupported
from ..memory.interop import HOST, memory_kind
from ..memory.cuda import DeviceMemory, blocking_for_device
from ..ops import SUM
from ..runtime.primitives import Primitives
from ..runtime.progress import Waiter


class DeviceSide:
    """Device state of one communicator; ``engine`` (one node) or ``proxy``/``prim`` (several nodes)."""

    def __init__(self, comm: Any) -> None:
        try:
            import cupy
        except ImportError as exc:
            raise HpcclUnsupported(f"GPU buffers need CuPy (pip install hpccl[cuda]): {exc}") from None
        try:
            ndev = cupy.cuda.runtime.getDeviceCount()
        except Exception as exc:  # noqa: BLE001 - CUDARuntimeError when there is no driver
            raise HpcclUnsupported(f"no CUDA device is visible to this process ({exc})") from None
        if ndev < 1:
            raise HpcclUnsupported("no CUDA device is visible to this process")
        device = comm.cuda_device if comm.cuda_device is not None else rank_device(comm.local_rank, ndev)
        self.device = device
        self.mem = DeviceMemory(device)
        self.engine: Any = None
        self.proxy: Any = None
        self.prim: Optional[Primitives] = None
        self.replays: Any = None  # netreplay.NetReplays: repeated calls across nodes enqueued from C
        self.keys: Any = None     # memory.cuda.CallKeys: what a replay is looked up by
        self.hier: Any = None     # hierreplay.HierChains: repeated hier all_reduce as its sub-calls' replays
        self.graph_keep: list = []  # temporaries of captured hier calls (graph_temp)
        self._transport: Any = None
        self.path = "kernels over peer memory"
        if comm.num_nodes == 1:
            from .cuda_comm import CudaComm
            if config.get("HPCCL_CHECK_ENV") and comm.local_rank == 0 and comm.parent_ranks is None:
                from ..envcheck import check_gpu_peer_access, check_memlock
                for msg in check_gpu_peer_access(comm.local_size, cupy) + check_memlock():
                    log.warn("ENV", "%s", msg)  # once per node, before the peer mappings are made
            self.engine = CudaComm(comm, device)
            comm._planner.on_drop.append(self.drop_snapshots)  # a forced choice: no replay of the old one
            comm._table.add("cuda_ipc", "GPU kernels' loads and stores in peers' device memory",
                            comm.nodes.ranks_on(comm.node))
        else:
            self._setup_network(comm, cupy)
        log.info("INIT", "GPU %d for rank %d: %s", device, comm.rank,
                 "kernels over peer memory" if self.engine is not None else self.path)

    def capturing(self, stream: int) -> bool:
        """Whether ``stream`` is capturing a CUDA graph."""
        from ..kernels import Driver
        return Driver.get().capturing(stream)

    def graph_temp(self, like: Any, count: int) -> Any:
        """A temporary of a captured hier call: allocated with the capture mode relaxed (the pool may need
        cudaMalloc) and kept until the communicator is destroyed, since every replay of the graph writes
        into it (freed, the pool would hand it to other work while the graph still uses it)."""
        from ..kernels import Driver
        with Driver.get().relaxed():
            a = np.empty_like(like, shape=(count,))
        self.graph_keep.append(a)
        return a

    def drop_snapshots(self) -> None:
        """Forget the kernel engine's launch snapshots (the planner's plans were dropped)."""
        if self.engine is not None:
            self.engine.drop()

    def gpu_share(self, boot: Any) -> int:
        """Most ranks of ``boot``'s communicator on one physical GPU (host name and PCI bus id);
        collective over it."""
        import socket
        import cupy
        mine = (socket.gethostname(), cupy.cuda.Device(self.device).pci_bus_id)
        return max(Counter(boot.allgather(mine)).values())

    def _setup_network(self, comm: Any, cupy: Any) -> None:
        with cupy.cuda.Device(self.device):
            cupy.zeros(1)  # a current context before the transport touches device memory
        timeout = config.get("HPCCL_TIMEOUT")
        # the proxy thread's waits: a local peer's death or abort (of this communicator, or of the user's
        # for a hier step), seen through shared memory alone (no control channel is polled off the caller's
        # thread); ranks in comm's wire numbering, as its abort takes them
        self.waiter = Waiter(timeout, 0, [q for q in range(comm.size) if q != comm.rank],
                             lambda p: None, lambda: failures.local_peer_aborted(comm), comm.abort,
                             dead_peer=lambda: failures.local_dead_peer(comm))
        # a failed step aborts naming the rank its error names (in comm's wire numbering), not this rank
        fail = lambda: comm.abort(failures.origin(comm, self.proxy.error))  # noqa: E731
        engine = comm._table.find("engine")
        if engine is not None:
            # the communicator's own engine: staged steps on the caller's stream (hpccl/gpu/netstep.py)
            from .netprims import StagedPrimitives, StagedRunner
            from .netstep import StagedNet
            # lanes: the fewest any rank wants (every rank must cut pieces to the same lanes); collective
            parent = getattr(comm, "_parent", None)  # hier's sub-communicator: its node holds the parent's ranks
            here = parent.local_size if parent is not None else comm.local_size
            lanes = min(comm._boot.allgather(engine.auto_lanes(here)))
            extra = engine.lanes[1:lanes] if len(engine.lanes) >= lanes else \
                engine.lanes[1:] + engine.add_lanes(lanes - len(engine.lanes))
            # ranks on this rank's GPU: a hier step's, counted over its parent when it was made, else this
            # communicator's (collective; every rank takes the same branch)
            share = getattr(comm, "gpu_share", 0) or self.gpu_share(comm._boot)
            net = StagedNet(engine.eng, self.device, engine, extra, share)
            net.gate = lambda: node_error_word(comm)
            self.prim = StagedPrimitives(comm.rank, comm.size, net, self.waiter, DeviceMemory(self.device))
            self.proxy = StagedRunner(net, self.prim, self.device, fail)
            self.path = "staged steps on the network engine" + (f" over {lanes} lanes" if lanes > 1 else "") + \
                (f", waits as stream operations ({net.wait_why})" if net.stream_waits else
                 ", small and piped steps as one kernel each")
            from . import netreplay
            if comm.local_size == 1 and netreplay.enabled():  # several ranks per node run hier instead
                from ..memory.cuda import CallKeys
                self.replays, self.keys = netreplay.NetReplays(net, self.prim.mem), CallKeys()
                comm._planner.on_drop.append(self.replays.drop)
                comm._door = netreplay.door(comm, self.replays, self.keys)
                door = " through its front door" if comm._door is not None else ""
                self.path += ", repeated calls replayed from C" + door
            from . import hierreplay
            if comm.local_size > 1 and comm.layout.equal and hierreplay.enabled():
                from ..memory.cuda import CallKeys
                self.hier, self.keys = hierreplay.HierChains(comm), CallKeys()
                comm._planner.on_drop.append(self.hier.drop)
                self.path += ", repeated hier all_reduce replayed as its sub-calls' replays"
            return
        # no engine (not built, or HPCCL_NET=mpi): MPI carries device buffers through host memory, driven by
        # the proxy thread so the caller's stream keeps its order
        from .proxy import Proxy, StreamOps
        self._transport = comm._new_net_transport()
        self.prim = Primitives(comm.rank, comm.size, {r: self._transport for r in range(comm.size)}, None,
                               self.waiter, blocking_for_device(self.device))
        ops = StreamOps(self.device, timeout)
        self.proxy = Proxy(ops, fail, name=f"hpccl-proxy-r{comm.rank}")
        self.path = f"network proxy over {self._transport.name}"
        self._warm_up(comm, ops, cupy)

    def _warm_up(self, comm: Any, ops: Any, cupy: Any) -> None:
        """Exchange device memory with both ring neighbours once, copy and reduce, before any stream is
        held: the transport then has its staging buffers and CUDA resources, and the reduce kernel is
        loaded (each could otherwise synchronize implicitly inside a step). Collective."""
        n, r = comm.size, comm.rank
        nb = 4 << 20
        ops.reserve(4 * nb + (1 << 20))
        with cupy.cuda.Device(self.device), ops.stream:
            send = cupy.ones(nb // 4, dtype=cupy.float32)
            got = cupy.zeros(nb // 4, dtype=cupy.float32)
            self.prim.mem.prepare(np.dtype(np.float32), SUM)
            right, left = (r + 1) % n, (r - 1) % n
            self.waiter.collective, self.waiter.seq = "set-up (GPU network warm-up)", 0
            self.prim.exchange([(right, send)], [(left, got, None)])
            self.prim.exchange([(right, send)], [(left, got, SUM)])
            ops.stream.synchronize()
            if float(got[0]) != 2.0:
                raise HpcclSystemError(f"GPU network warm-up with rank {left} moved wrong data "
                                       f"({float(got[0])} instead of 2.0)")

    # ----- failures and completion -------------------------------------------------------------------------
    def check(self, what: str) -> None:
        """Raise the first failure an earlier GPU call met (a kernel's wait or a network step)."""
        if self.engine is not None:
            self.engine._check(what)
        elif self.proxy.error is not None:
            self.proxy.raise_error()

    def synchronize(self) -> None:
        """Wait for this rank's GPU work and network steps; raise the first failure among them."""
        import cupy
        if self.proxy is not None:
            self.proxy.drain()
        if self.engine is not None:  # a stream stuck behind a GPU that never runs it raises at the timeout
            self.engine.wait_idle()
            if self.engine._err.value:
                self.engine._fail("synchronize")
        with cupy.cuda.Device(self.device):
            cupy.cuda.runtime.deviceSynchronize()
        if self.engine is not None:
            if self.engine._err.value:
                self.engine._fail("synchronize")
        else:
            self.proxy.raise_error()

    def close(self) -> None:
        if self.graph_keep:  # a captured graph may be replayed after this: its temporaries stay (netstage.ORPHANS)
            from .netstage import ORPHANS
            ORPHANS.keep(self.graph_keep)
        self.graph_keep = []
        if self.hier is not None:
            self.hier.drop()
        if self.replays is not None:
            self.replays.drop()
            self.replays = None
        if self.engine is not None:
            self.engine.close()
            self.engine = None
        if self.proxy is not None:
            self.proxy.close()
            self.proxy = None
        if self._transport is not None:
            self._transport.close()
            self._transport = None


def registrable(comm: Any, buf: Any, what: str) -> Tuple[Any, Any]:
    """(kernel engine, flat view) for comm.register/deregister of buf, checked: a non-empty CUDA buffer,
    outside a group, on a communicator of one node (whose kernels read registered buffers directly)."""
    comm._alive(what)
    if comm._group is not None:
        raise HpcclInvalidUsage(f"{what} inside comm.group(); call it outside the group")
    if type(buf) is np.ndarray or memory_kind(buf) == HOST:
        raise HpcclInvalidArgument("buf", f"is host memory; {what} takes CUDA buffers (host calls need no "
                                          "registration)")
    m = comm._memory(buf, what)
    flat, _ = m.view(buf, "buf")
    if flat.nbytes == 0:
        raise HpcclInvalidArgument("buf", f"is empty; nothing to {what}")
    eng = comm._dev.engine
    if eng is None:
        raise HpcclUnsupported(f"{what}: zero-copy kernels serve communicators of one node; this one spans "
                               f"{comm.num_nodes} nodes (its GPU calls go through the network proxy)")
    return eng, flat


def node_error_word(comm: Any) -> int:
    """Host address of the GPU error word of this rank's node step when ``comm`` is hier's network
    sub-communicator (0 otherwise): set by a local death, abort or timeout, it stops the network step
    after it from sending a node result that is not whole."""
    parent = getattr(comm, "_parent", None)
    intra = parent._sub.get("intra") if parent is not None else None
    dev = getattr(intra, "_dev", None) if intra is not None else None
    eng = dev.engine if dev is not None else None
    return ctypes.addressof(eng._err) if eng is not None else 0


def rank_device(local_rank: int, ndev: int) -> int:
    """This rank's GPU: HPCCL_CUDA_DEVICE when set (>= 0), else local_rank % visible GPUs."""
    device = config.get("HPCCL_CUDA_DEVICE")
    return device if device >= 0 else local_rank % ndev
