"""The Communicator, hpccl's one front end for every memory kind and node layout.

Every public call validates its arguments once, with the same rules and messages for host and device buffers,
before anything moves, and becomes a Call that runs at once or, inside group(), at the group's end. Running a
Call asks the communicator's planner (core/planner.py) for its plan and runs it: the compiled hot path, host
schedules over primitives, GPU kernels over peer memory, staged network steps, or hier over sub-communicators.
The jobs around the front end have modules of their own that import no Communicator: entry (the front door
and replays, before validation), planner, dispatch, hotcalls, p2p, vcolls, fp8, failures, lifecycle, grow,
cuda_context and transport.select."""
from __future__ import annotations

import os
import time
from typing import Any, ContextManager, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from .. import config, log
from ..host import hotcalls
from ..observe import check
from ..runtime import failures
from . import fp8, grow, lifecycle, p2p, vcolls
from ..algorithms import Layout, ring
from ..bootstrap import MpiBootstrap, StoreBootstrap
from .call import Call
from .entry import FIRED, Entry
from ..gpu.cuda_context import check_capture, gpu_begin, net_capturable, on_device
from .dispatch import device_collective, host_barrier, host_collective, net_barrier
from ..errors import HpcclError, HpcclInvalidArgument, HpcclInvalidUsage, HpcclRemoteError, HpcclTimeoutError
from ..runtime.failures import arrived, dead_peer, in_call, named, new_numbering, peer_aborted, survey, to_user
from .frontend import validate
from ..host.host_alloc import HostArena
from ..host.hotpath import OPCODE
from ..memory.interop import HOST, memory_kind
from ..memory import host
from ..ops import SUM, ReduceOp
from .planner import Planner
from ..runtime.primitives import Primitives
from ..runtime.progress import Waiter
from ..observe.recorder import Recorder, StepRecorder
from ..topology import NodeMap, detect_nodes
from ..topology.nodes import node_name
from ..transport import select
from ..transport.base import Transport
from ..transport.shm import ShmTransport
from ..transport.table import TransportTable

OpLike = Union[ReduceOp, str]
_perf = time.perf_counter
_OP_TYPES = frozenset((str, ReduceOp))  # ops the front door looks up (others: the Spec names them)


class Communicator(Entry):
    """A group of ranks that run collectives together, like an ncclComm_t, built over an MPI communicator
    (mpi4py; COMM_WORLD by default) or over a bootstrap object (bootstrap.StoreBootstrap: no MPI)."""

    def __init__(self, mpi_comm: Any = None, *, node_id: Optional[str] = None) -> None:
        t0 = time.perf_counter()
        self._boot = mpi_comm if isinstance(mpi_comm, StoreBootstrap) else MpiBootstrap(mpi_comm)
        self.rank, self.size = self._boot.rank, self._boot.size
        log.set_rank(self._boot.world_rank)
        self._destroyed = False
        self._aborted = False
        self._seq = 0
        self._group: Optional[List["Call"]] = None
        self._group_depth = 0
        self._any_next = 0  # receive from any source probes from the peer after its last sender
        self._p2p: List[p2p.Item] = []  # sends and receives held in a group (hpccl/core/p2p.py)
        self._sub: Dict[str, "Communicator"] = {}
        self._node_override = node_id
        self._dev: Any = None  # device.DeviceSide, built at the first device call
        self._door: Any = None  # the C front door of replayed GPU calls across nodes (gpu/netreplay.py door())
        self.parent_ranks: Optional[List[int]] = None  # a hier sub-communicator's ranks in its parent
        self._parent: Optional["Communicator"] = None  # the communicator whose hier steps this one runs
        self._numbering = new_numbering()  # the token of this communicator's rank numbering (failures.py)
        self.cuda_device: Optional[int] = None  # a sub-communicator's GPU: its parent's, not its own guess
        self._trace = log.tracing()
        self._check_calls = config.get("HPCCL_CHECK")
        self._gpu_timer: Any = None  # CUDA events timing traced GPU calls (hpccl/observe/trace.py)

        names = self._boot.allgather(node_name(self._boot.world_rank, node_id))
        self.nodes: NodeMap = detect_nodes(names)
        self.node = self.nodes.node_of[self.rank]
        self.num_nodes = self.nodes.num_nodes
        local = self.nodes.ranks_on(self.node)
        self.local_rank, self.local_size = local.index(self.rank), len(local)

        force = select.forced()
        self._table = TransportTable(self.rank, self.size)  # every way to the peers (transport/table.py)
        self._transports: List[Transport] = self._table.messaging  # the message transports, in set-up order
        tag = self._boot.bcast(ShmTransport.new_tag() if self.rank == 0 else None)
        steps_of = lifecycle.STEPS_OF.get()
        self._rec = (Recorder(tag, self.rank, self.size, self._boot.world_rank) if steps_of is None else
                     StepRecorder(steps_of[0], steps_of[1], tag, self.rank, self.size, self._boot.world_rank))
        from ..observe import nvtx
        self._nvtx = nvtx.ranges()
        self._rec.nvtx = self._nvtx
        self._observed = self._rec.trace is not None or self._nvtx is not None  # every GPU call through _run
        shm, self._force_mpi = select.node_transport(self, force, local, tag)
        if shm is not None:
            self._table.add("shm", "messages through shared-memory slots", local, shm)
        self._net_note = ""  # which network path calls across nodes take, and why (select.net_path, hpccl-info)
        self._net_warned = False  # the missing engine was warned about (once per communicator)
        net = select.net_transport(self)
        self._path = "shm" if net is None else net.name  # the slowest link prices the flat algorithms
        window = shm.window() if (shm is not None and self.num_nodes == 1) else None
        spin = config.get("HPCCL_SPIN")
        if self.local_size > (os.cpu_count() or 1):
            spin = min(spin, 50)  # oversubscribed: a spinning rank would burn the core its peer needs
        self._waiter = Waiter(config.get("HPCCL_TIMEOUT"), spin, [q for q in range(self.size) if q != self.rank],
                              lambda p: arrived(self, p), self._peer_aborted, self.abort,
                              lambda: survey(self), lambda: dead_peer(self))
        self._prim = Primitives(self.rank, self.size, self._table.of, window, self._waiter, host)
        if window is not None:  # single-copy algorithms only if every rank can read its peers
            want = config.get("HPCCL_SINGLE_COPY") and shm.cma_ok
            self._prim.single_copy = all(self._boot.allgather(want))
            self._table.add("window", "loads and stores in the node's shared window", local)
            if self._prim.single_copy:
                self._table.add("cma", "single-copy reads of peers' buffers (process_vm_readv)", local)
        from .tuning import Tuner
        sizes = {len(self.nodes.ranks_on(nd)) for nd in range(self.num_nodes)}
        self.layout = Layout(self.num_nodes, self.local_size, len(sizes) == 1, window is not None,
                             self._prim.single_copy)
        self._planner = Planner(Tuner(self._path, self.size, self.local_size, self.num_nodes), self.layout)
        self._front = self._planner.front  # collective -> hot path: calls it takes before Python validation
        self._hot: Any = None  # the compiled hot path (hpccl/host/hotpath.py): the node's segments, or the network
        hotcalls.attach(self, shm, net, spin)
        self._arena = HostArena(self)  # alloc_host's segments, mapped by the hot path
        if config.get("HPCCL_CHECK_ENV"):
            select.check_env(self, shm)
        self.setup_seconds = time.perf_counter() - t0
        log.info("INIT", "communicator rank %d/%d node %d/%d local %d/%d path %s in %.3fs", self.rank,
                 self.size, self.node, self.num_nodes, self.local_rank, self.local_size, self._path,
                 self.setup_seconds)
        log.info("INIT", "transports: %s; network path: %s", self._table.describe(), select.net_path(self))

    # ----- set-up and failures (hpccl/transport/select.py, hpccl/runtime/failures.py) -------------------------
    def _new_net_transport(self) -> Transport:
        """A network transport of its own to every rank (collective; device.py's for GPU network steps)."""
        return select.new_net_transport(self)

    def _check_env(self, shm: Any) -> None:
        select.check_env(self, shm)

    def _peer_aborted(self) -> Optional[int]:
        return peer_aborted(self)

    def _seen_failure(self, wait: float) -> Optional[int]:
        """A hier step's: the rank whose failure its parent's watch sees (a peer's abort, a dead peer on the
        node or across the network, in the parent or any of its steps), in this communicator's wire
        numbering; None for a communicator the user made, or when none is seen within ``wait`` seconds."""
        parent = self._parent
        if parent is None:
            return None
        exc = failures.first_within(wait, lambda: failures.watch(parent))
        r = None if exc is None else failures.culprit(exc)  # the user's numbering (watch's errors are)
        return None if r is None else failures.wire_rank(self.parent_ranks, r)

    def _check_device(self, what: str) -> None:
        """The GPU-side failure an earlier call met, raised in the user's numbering: the engine reports in
        this communicator's wire numbering, and a hier step's sub-call can meet it here, before its _run
        (which renumbers what it raises)."""
        try:
            self._dev.check(what)
        except HpcclError as exc:
            raise to_user(self, exc) from None

    # ----- properties and life cycle ---------------------------------------------------------------
    @property
    def mpi_comm(self) -> Any:
        """hpccl's private duplicate of the MPI communicator it was built on (None over a store)."""
        return self._boot.comm

    def split(self, color: int, key: int = 0) -> Optional["Communicator"]:
        """A new communicator per color, ranks ordered by key (like MPI_Comm_split); None for color < 0."""
        self._alive("split")
        return lifecycle.split(self, color, key, self._node_override)

    def shrink(self, exclude: Sequence[int]) -> "Communicator":
        """A new communicator of every rank not in ``exclude`` (renumbered in order), like ncclCommShrink:
        built with no collective over the excluded ranks, so it works while they are stopped, hung or
        gone. Every surviving rank calls it with the same list; allowed on an aborted communicator (the
        usual way on after a failure). This communicator stays aborted or usable as it was: destroy it."""
        return lifecycle.shrink(self, exclude)

    def grow(self, n_new: int, *, port: Optional[str] = None, store: Any = None,
             key: str = "hpccl-grow") -> "Communicator":
        """A new communicator of this one's ranks (in order) then ``n_new`` new processes that call
        hpccl.join, like ncclCommGrow; collective over this communicator, which stays usable. Through an
        MPI port (``port``: hpccl.open_port()'s name, rank 0's is used) or a store under ``key`` (default:
        this communicator's store, when it was built over one). hpccl/core/grow.py."""
        return grow.grow(self, n_new, port, store, key)

    def revoke(self) -> None:
        """Stop this communicator's work everywhere: mark it failed and tell every peer (their waits raise
        HpcclRemoteError naming this rank), so that shrink or destroy can follow safely."""
        self.abort()

    def synchronize(self) -> None:
        """Wait for this rank's GPU work on this communicator (kernels and network steps), then raise the
        first failure an earlier call met there, like ncclCommGetAsyncError; host calls need nothing.

        With hier's GPU network steps still pending, this rank watches for failures while it waits (a peer's
        abort, a local peer's process or a network peer's connection gone: failures.watch), and aborts at
        once, so that its own steps, which only its sub-communicators' engines know of, end now rather than
        at HPCCL_TIMEOUT; it then raises naming the rank that failed, in the user's numbering."""
        nets = [s._dev.proxy.net for s in self._sub.values()
                if s._dev is not None and getattr(s._dev.proxy, "net", None) is not None]
        if nets:
            exc = failures.await_steps(self, lambda: any(n.pending() for n in nets))
            if exc is not None:
                self.abort(failures.origin(self, exc))
                try:  # the steps end now (the abort failed them); what they raise follows from exc
                    self._synchronize()
                except HpcclError:
                    pass
                raise exc from None
        self._synchronize()
        if nets:  # a peer failed meanwhile: this rank's calls may have run on what it never sent
            r = peer_aborted(self)
            if r is not None:
                exc = to_user(self, HpcclRemoteError.aborted(self._waiter.collective, self._seq, r, [],
                                                             "; seen at synchronize"))
                self.abort(r)
                raise exc

    def _synchronize(self) -> None:
        if self._dev is not None:
            try:
                self._dev.synchronize()
            except HpcclError as exc:  # in this communicator's wire numbering: the user's from here on
                raise to_user(self, exc) from None
            if self._gpu_timer is not None:
                self._gpu_timer.harvest(self._rec.trace)
        for kind in ("inter", "intra"):  # a network step's failure names who never came: report it first
            if kind in self._sub:
                try:
                    self._sub[kind].synchronize()
                except HpcclError as exc:  # the user's numbering already (the step's synchronize)
                    exc = in_call(exc, self)
                    self.abort(failures.origin(self, exc))  # a failed step fails the user's communicator
                    raise exc from None

    def abort(self, origin: Optional[int] = None) -> None:
        """Mark this communicator failed and tell every peer (shared memory flag, MPI control message), so
        they stop waiting; ``origin`` is the rank whose failure this passes on (default: this rank)."""
        failures.abort(self, origin)

    def destroy(self) -> None:
        """Release shared memory, endpoints and the private MPI communicator; safe to call twice."""
        lifecycle.destroy(self)

    def __enter__(self) -> "Communicator":
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()

    def __del__(self) -> None:
        try:
            if not self._destroyed:
                for t in self._transports:
                    t.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    def __repr__(self) -> str:
        return (f"<hpccl.Communicator rank {self.rank}/{self.size} node {self.node}/{self.num_nodes} "
                f"local {self.local_rank}/{self.local_size}>")

    # ----- checks ----------------------------------------------------------------------------------
    def _alive(self, what: str) -> None:
        if self._destroyed:
            raise HpcclInvalidUsage(f"{what} called on a destroyed communicator")
        if self._aborted:
            if self._dev is not None:
                self._check_device(what)  # the GPU-side failure that aborted it, with its names
            raise HpcclInvalidUsage(f"{what} called on an aborted communicator (an earlier call failed)")

    def _rank_arg(self, value: int, name: str) -> int:
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or not 0 <= value < self.size:
            raise HpcclInvalidArgument(name, f"{value!r} is not a rank of this communicator (0..{self.size - 1})")
        return int(value)

    def _memory(self, obj: Any, what: str) -> Any:
        """The memory component for obj's kind (host module, or this rank's DeviceMemory)."""
        if type(obj) is np.ndarray or memory_kind(obj) == HOST:
            return host
        dev = self._device()
        self._check_device(what)
        return dev.mem

    def _device(self) -> Any:
        if self._dev is None:
            from ..gpu.device import DeviceSide
            self._dev = DeviceSide(self)
        return self._dev

    def _out(self, m: Any, obj: Any, like: Any, count: int, name: str) -> Tuple[Any, Any]:
        """Validate (or allocate) an output buffer of ``count`` elements of ``like``'s dtype, same memory."""
        if obj is None:
            return m.empty_out((count,), None, like)
        if self._memory(obj, name) is not m:
            raise HpcclInvalidArgument(name, f"is {memory_kind(obj)} memory but the input is {m.kind} memory")
        flat, _ = m.view(obj, name)
        m.writable(flat, name)
        if m.dtype(flat) != m.dtype(like):
            raise HpcclInvalidArgument(name, f"dtype {m.dtype(flat)} differs from sendbuf's {m.dtype(like)}")
        if flat.size != count:
            raise HpcclInvalidArgument(name, f"has {flat.size} elements, needs {count}")
        return flat, obj

    # ----- running ---------------------------------------------------------------------------------
    def algorithms(self, coll: str, kind: str = HOST) -> List[str]:
        """The algorithms this communicator can run for ``coll`` on ``kind`` memory ('host' or 'cuda'):
        the table's on this layout, and 'hot' where the compiled path serves it."""
        return self._planner.algorithms(coll, kind)

    def _run(self, call: Call) -> None:
        if call.mem is not host and self.num_nodes > 1:  # refused before it counts or aborts anything
            check_capture(self, call.stream, call.coll)
        self._seq += 1
        self._waiter.collective, self._waiter.seq = call.coll, self._seq
        for t in self._transports:
            t.announce(self._seq)
        rec = self._rec.start(self._seq, call.coll, call.nbytes, call.mem.kind)
        if self._check_calls and call.coll not in p2p.NAMES:
            check.before(self, call, rec, lambda mine, table: ring.all_gather(self._prim, mine, table))
        back = None if call.mem is host else on_device(call.mem.device)
        timed = None
        if self._observed and call.mem is not host:
            if self._nvtx is not None:  # a hier step's range: in its own domain, inside the user's call's
                self._nvtx.push_range(self._rec.label(rec), domain=self._rec.domain)
            if self._rec.trace is not None and call.stream is not None:
                timed = gpu_begin(self, call.mem.device, call.stream)
        try:
            if call.fn is not None:
                call.fn(self, call)
            elif call.mem is host:
                host_collective(self, call)
            else:
                device_collective(self, call)
        except HpcclError as exc:
            exc = named(self, exc, call.coll)
            failures.count(self, exc)
            self._rec.end(rec, f"failed: {type(exc).__name__}")
            if self._parent is None or not isinstance(exc, HpcclTimeoutError):
                # a hier step's timeout is not passed on: only the user's communicator, once it has asked its
                # peers, knows which rank never came to the user's call (as_call), and its abort names it
                self.abort(failures.origin(self, exc))
            raise exc from None
        finally:
            if self._nvtx is not None and call.mem is not host:
                self._nvtx.pop_range(domain=self._rec.domain)
            if back is not None:
                on_device(back)
        self._rec.end(rec, "done" if call.mem is host else "enqueued")
        if timed is not None:
            self._gpu_timer.end(timed, call.stream, (call.coll, self._seq, call.nbytes, rec[4]))
            self._gpu_timer.harvest(self._rec.trace)

    def stats(self) -> Dict[str, Dict[str, dict]]:
        """Calls, bytes and seconds (host time inside the call; for GPU calls the time to enqueue) per
        collective and algorithm (memory kind in brackets), since this communicator was made."""
        return self._rec.stats.snapshot()

    def _net_capturable(self) -> bool:
        """True when this communicator's GPU network steps can be captured (hpccl/gpu/cuda_context.py)."""
        return net_capturable(self)

    def _flat(self, coll: str, *args: Any, stream: Any = None) -> None:
        """Run a collective on flat, already validated arrays (hier's sub-steps): no second validation."""
        m = host if isinstance(args[0], np.ndarray) else self._device().mem
        self._run(Call(coll, m, stream, args[1].nbytes if coll == "all_gather" else args[0].nbytes, args))

    # ----- collectives -----------------------------------------------------------------------------
    def all_reduce(self, sendbuf: Any, recvbuf: Any = None, op: OpLike = SUM, *, stream: Any = None,
                   dtype: Any = None) -> Any:
        """recvbuf = sendbuf reduced over all ranks; in place (into sendbuf) when recvbuf is None. ``dtype``
        ('float8_e4m3fn' or 'float8_e5m2'): the float8 type 1-byte words (CuPy's uint8) hold."""
        if dtype is not None:
            return self._typed("all_reduce", sendbuf, recvbuf, op, -1, stream, dtype)
        if self._door is not None and self._door.fire(0, sendbuf, recvbuf, op, -1, stream):
            return sendbuf if recvbuf is None else recvbuf
        if self._front and self._front_door("all_reduce", sendbuf, recvbuf, False,
                                            OPCODE.get(op, -1) if type(op) in _OP_TYPES else -1):
            return sendbuf if recvbuf is None else recvbuf
        key = self._enter("all_reduce", sendbuf, recvbuf, op, -1, stream)
        if key is FIRED:
            return sendbuf if recvbuf is None else recvbuf
        return self._call("all_reduce", sendbuf, recvbuf, op, -1, stream, key)

    def reduce(self, sendbuf: Any, recvbuf: Any = None, root: int = 0, op: OpLike = SUM, *,
               stream: Any = None, dtype: Any = None) -> Any:
        """The reduction over all ranks lands in recvbuf (or sendbuf, if None) on root only (``dtype``: as
        all_reduce's)."""
        if dtype is not None:
            return self._typed("reduce", sendbuf, recvbuf, op, root, stream, dtype)
        if self._door is not None and self._door.fire(1, sendbuf, recvbuf, op, root, stream):
            return (sendbuf if recvbuf is None else recvbuf) if self.rank == root else recvbuf
        if (self._front and type(root) is int
                and self._front_door("reduce", sendbuf, recvbuf, False, root,
                                     OPCODE.get(op, -1) if type(op) in _OP_TYPES else -1)):
            return (sendbuf if recvbuf is None else recvbuf) if self.rank == root else recvbuf
        key = self._enter("reduce", sendbuf, recvbuf, op, root, stream)
        if key is FIRED:
            return (sendbuf if recvbuf is None else recvbuf) if self.rank == root else recvbuf
        return self._call("reduce", sendbuf, recvbuf, op, root, stream, key)

    def broadcast(self, buf: Any, root: int = 0, *, recvbuf: Any = None, stream: Any = None) -> Any:
        """Root's buf reaches every rank: in place in buf, or into recvbuf when given."""
        if self._door is not None and self._door.fire(2, buf, recvbuf, None, root, stream):
            return buf if recvbuf is None else recvbuf
        if self._front and type(root) is int and self._front_door("broadcast", buf, recvbuf, False, root):
            return buf if recvbuf is None else recvbuf
        key = self._enter("broadcast", buf, recvbuf, None, root, stream)
        if key is FIRED:
            return buf if recvbuf is None else recvbuf
        return self._call("broadcast", buf, recvbuf, None, root, stream, key)

    def all_gather(self, sendbuf: Any, recvbuf: Any = None, *, stream: Any = None) -> Any:
        """recvbuf holds every rank's sendbuf in rank order (size x count); allocated when None.
        In place when sendbuf is recvbuf's own block (recvbuf[rank*count:(rank+1)*count])."""
        if self._door is not None and self._door.fire(3, sendbuf, recvbuf, None, -1, stream):
            return recvbuf
        if self._front and self._front_door("all_gather", sendbuf, recvbuf, True):
            return recvbuf
        key = self._enter("all_gather", sendbuf, recvbuf, None, -1, stream, True)
        if key is FIRED:
            return recvbuf
        return self._call("all_gather", sendbuf, recvbuf, None, -1, stream, key)

    def reduce_scatter(self, sendbuf: Any, recvbuf: Any = None, op: OpLike = SUM, *,
                       stream: Any = None, dtype: Any = None) -> Any:
        """recvbuf (count) = block ``rank`` of sendbuf (size x count) reduced over all ranks (``dtype``: as
        all_reduce's)."""
        if dtype is not None:
            return self._typed("reduce_scatter", sendbuf, recvbuf, op, -1, stream, dtype)
        if self._door is not None and self._door.fire(4, sendbuf, recvbuf, op, -1, stream):
            return recvbuf
        if self._front and self._front_door("reduce_scatter", sendbuf, recvbuf, True,
                                            OPCODE.get(op, -1) if type(op) in _OP_TYPES else -1):
            return recvbuf
        key = self._enter("reduce_scatter", sendbuf, recvbuf, op, -1, stream, True)
        if key is FIRED:
            return recvbuf
        return self._call("reduce_scatter", sendbuf, recvbuf, op, -1, stream, key)

    def all_to_all(self, sendbuf: Any, recvbuf: Any = None, *, stream: Any = None) -> Any:
        """Block j of rank i's sendbuf becomes block i of rank j's recvbuf."""
        if self._door is not None and self._door.fire(5, sendbuf, recvbuf, None, -1, stream):
            return recvbuf
        if self._front and self._front_door("all_to_all", sendbuf, recvbuf, True):
            return recvbuf
        key = self._enter("all_to_all", sendbuf, recvbuf, None, -1, stream, True)
        if key is FIRED:
            return recvbuf
        return self._call("all_to_all", sendbuf, recvbuf, None, -1, stream, key)

    def _typed(self, coll: str, sendbuf: Any, recvbuf: Any, op: Any, root: int, stream: Any, dtype: Any) -> Any:
        """A reduction given its float8 ``dtype``: no front door, no snapshot (hpccl/core/fp8.py)."""
        self._alive(coll)
        return self._call(coll, sendbuf, recvbuf, op, root, stream, None, dtype)

    def _call(self, coll: str, sendbuf: Any, recvbuf: Any, op: Any, root: int, stream: Any, key: Any,
              dtype: Any = None) -> Any:
        """Validate by the collective's Spec (frontend.py), submit the Call, return the user's result."""
        try:
            call, result = validate(self, coll, sendbuf, recvbuf, op, root, stream, key, dtype)
        except HpcclError as exc:  # bad input or usage, counted for metrics (hpccl/observe/stats.py)
            self._rec.stats.error(exc)
            raise
        if call is not None:
            self._submit(call)
        return result

    def all_to_all_v(self, sendbuf: Any, recvbuf: Any, sendcounts: Sequence[int], recvcounts: Sequence[int],
                     sdispls: Optional[Sequence[int]] = None, rdispls: Optional[Sequence[int]] = None, *,
                     stream: Any = None) -> Any:
        """MPI_Alltoallv: rank i sends sendcounts[j] elements from sendbuf, starting at element sdispls[j],
        to rank j, which receives them at element rdispls[i] of recvbuf (recvcounts[i] elements there).
        Displacements default to the packed prefix sums of the counts. It runs as a group of sends and
        receives (host and GPU alike); recvcounts[j] must equal rank j's sendcounts[i], as in MPI."""
        return p2p.all_to_all_v(self, sendbuf, recvbuf, sendcounts, recvcounts, sdispls, rdispls, stream)

    def gather(self, sendbuf: Any, recvbuf: Any = None, root: int = 0, *, stream: Any = None) -> Any:
        """MPI_Gather: every rank's sendbuf (one count everywhere) into block r of the root's recvbuf (size x
        count elements); returns recvbuf on the root, None elsewhere (recvbuf is ignored there)."""
        return vcolls.gather(self, sendbuf, recvbuf, root, stream)

    def scatter(self, sendbuf: Any, recvbuf: Any, root: int = 0, *, stream: Any = None) -> Any:
        """MPI_Scatter: block r of the root's sendbuf (size x count elements, count = recvbuf's size) into
        rank r's recvbuf; sendbuf is ignored on the other ranks."""
        return vcolls.scatter(self, sendbuf, recvbuf, root, stream)

    def all_gather_v(self, sendbuf: Any, recvbuf: Any, recvcounts: Sequence[int],
                     displs: Optional[Sequence[int]] = None, *, stream: Any = None) -> Any:
        """MPI_Allgatherv: rank r's sendbuf (recvcounts[r] elements) into every rank's recvbuf at element
        displs[r] (default: the packed prefix sums of recvcounts)."""
        return vcolls.all_gather_v(self, sendbuf, recvbuf, recvcounts, displs, stream)

    def reduce_scatter_v(self, sendbuf: Any, recvbuf: Any, recvcounts: Sequence[int], op: OpLike = SUM, *,
                         stream: Any = None, dtype: Any = None) -> Any:
        """MPI_Reduce_scatter: block j of every rank's sendbuf (recvcounts[j] elements, packed in rank order)
        reduced with op into rank j's recvbuf (recvcounts[j] elements); ``dtype``: as all_reduce's."""
        if fp8.takes(sendbuf, dtype):
            return fp8.reduce_scatter_v(self, sendbuf, recvbuf, recvcounts, op, stream, dtype)
        return vcolls.reduce_scatter_v(self, sendbuf, recvbuf, recvcounts, op, stream)

    # ----- host buffers every local peer maps (hpccl/host/host_alloc.py) ----------------------------------
    def alloc_host(self, shape: Union[int, Sequence[int]], dtype: Any = np.float32) -> np.ndarray:
        """A numpy array in host memory that every rank of the node maps (collective, like ncclMemAlloc plus
        ncclCommRegister): large host collectives on such buffers move data with memcpy, not cross-process
        reads. Each rank may ask for its own shape. Give it back with free_host (or it lives until destroy)."""
        self._alive("alloc_host")
        return self._arena.alloc(shape, dtype)

    def free_host(self, buf: Any) -> None:
        """Give back an alloc_host array on every rank together (collective); the memory goes once no array
        refers to it."""
        self._alive("free_host")
        self._arena.free(buf)

    # ----- registered GPU buffers --------------------------------------------------------------------------
    def register(self, buf: Any) -> None:
        """Map a CUDA buffer into every peer of the node once (collective, like ncclCommRegister): calls
        whose buffers lie in it, at the same offset on every rank, then read peers' memory directly (zero-copy
        kernels) instead of staging. hpccl keeps a reference to buf until deregister(buf) or destroy()."""
        from ..gpu.device import registrable
        eng, flat = registrable(self, buf, "register")
        eng.register(flat.data.ptr, flat.nbytes, buf, "buf")
        if not self._planner.registered:
            self._table.add("cuda_register", "registered buffers read in place by peers' kernels",
                            self.nodes.ranks_on(self.node))
        self._planner.register()

    def deregister(self, buf: Any) -> None:
        """Undo register(buf) on every rank together, once every rank's GPU work so far is done."""
        from ..gpu.device import registrable
        eng, flat = registrable(self, buf, "deregister")
        eng.deregister(flat.data.ptr, flat.nbytes, "buf")

    def barrier(self, *, stream: Any = None) -> None:
        """Return once every rank has called barrier; with a stream, a stream-ordered barrier instead:
        work after it on ``stream`` starts once every rank's stream got there (no host wait)."""
        self._alive("barrier")
        if stream is not None:
            dev = self._device()
            dev.check("barrier")
            st = dev.mem.stream(stream, None)
            if dev.engine is not None:
                return self._submit(Call("barrier", dev.mem, st, 0, (), fn=lambda c, call: dev.engine.barrier(st)))
            z = dev.mem.empty(1, np.dtype(np.uint8))  # a byte: UCX is not handed a null device pointer
            return self._submit(Call("barrier", dev.mem, st, 0, (), fn=lambda c, call: c._net_barrier(call, z)))
        self._submit(Call("barrier", host, None, 0, (), fn=host_barrier))

    def _net_barrier(self, call: Call, z: Any) -> None:
        net_barrier(self, call, z)

    # ----- point to point and groups (hpccl/core/p2p.py) -------------------------------------------
    def send(self, buf: Any, peer: int, *, stream: Any = None) -> None:
        """Send buf to peer (matched in order with the peer's recv from this rank)."""
        p2p.p2p_call(self, "send", buf, peer, stream)

    def recv(self, buf: Any, peer: int, *, stream: Any = None) -> Any:
        """Receive from peer into buf (same byte size as the peer's send)."""
        p2p.p2p_call(self, "recv", buf, peer, stream)
        return buf

    def recv_any(self, buf: Any) -> int:
        """Receive the next message any peer sends this rank (MPI_ANY_SOURCE) into host buf; returns the
        sender. Peers are probed in turn from the one after the last sender, so none is starved."""
        return p2p.recv_any(self, buf)

    def group(self) -> ContextManager[None]:
        """Like ncclGroupStart/End, for host and device buffers alike: sends and receives inside run
        together at the end (no deadlock from ordering); collectives inside run after them, in call
        order. Nothing inside runs before the group ends."""
        return p2p.group(self)

    def _subcomm(self, kind: str) -> "Communicator":
        """hier's 'intra' (this node's ranks) or 'inter' (this local rank's on every node) sub-communicator."""
        return lifecycle.subcomm(self, kind)


def init(mpi_comm: Any = None, **kwargs: Any) -> Communicator:
    """A communicator over MPI.COMM_WORLD (or the given mpi4py communicator)."""
    return Communicator(mpi_comm, **kwargs)


def join(*, port: Optional[str] = None, mpi_comm: Any = None, store: Any = None, rank: Optional[int] = None,
         key: str = "hpccl-grow", node_id: Optional[str] = None) -> Communicator:
    """New processes join a communicator whose ranks call grow: through ``port`` (collective over
    ``mpi_comm``, default MPI.COMM_WORLD) or ``store`` (``rank``: this process's place among the new
    ones, 0..n_new-1; ``key``: the grow's). Returns the grown communicator; hpccl/core/grow.py."""
    return grow.join(Communicator, port, mpi_comm, store, rank, key, node_id)
