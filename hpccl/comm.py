"""The Communicator, hpccl's one front end for every memory kind and node layout.

Every public call validates its arguments once, with the same rules and messages for host and device
buffers (through the memory component of the buffer's kind: memory.host or memory.cuda.DeviceMemory),
before anything moves. It becomes a Call (collective, memory kind, stream, bytes, flat arguments), which
runs at once or, inside group(), at the group's end. Running a Call asks the one Tuner for an algorithm
from the one table (hpccl.algorithms) that serves this memory kind on this layout, and runs it: host
schedules over primitives; GPU kernels over peer memory (one node); host schedules over device primitives
on the network proxy (several nodes); or hier, composed of the sub-communicators' calls."""
from __future__ import annotations

import contextlib
import contextvars
import os
import time
from typing import Any, Callable, Dict, Iterator, List, NoReturn, Optional, Sequence, Tuple, Union

import numpy as np

from . import check, config, log
from .algorithms import ALGORITHMS, Layout, eligible
from .algorithms import hier
from .bootstrap import MpiBootstrap, StoreBootstrap
from .errors import (HpcclError, HpcclInvalidArgument, HpcclInvalidUsage, HpcclRemoteError, HpcclTimeoutError,
                     HpcclUnsupported)
from .interop import CUDA, HOST, memory_kind
from .memory import host
from .ops import AVG, SUM, ReduceOp, as_op, check_op_dtype
from . import hotpath
from .hotpath import OPCODE
from .primitives import Primitives
from .progress import Waiter
from .recorder import Recorder, StepRecorder
from .topology import NodeMap, detect_nodes
from .topology.nodes import node_name
from .transport.base import Transport
from .transport.mpi import MpiTransport
from .transport.shm import ShmTransport, ordering_problem

OpLike = Union[ReduceOp, str]
FIRED = object()  # the device fast path replayed the call
_perf = time.perf_counter
_FAST_NAMES = {"ar": "all_reduce", "red": "reduce", "bc": "broadcast", "ag": "all_gather", "rs": "reduce_scatter",
               "a2a": "all_to_all"}
_P2P = ("send", "recv", "group(send/recv)", "recv(any source)")  # ranks legitimately call different ones: not checked
SURVEY_S = 0.5  # how long a timed-out rank waits for its peers' answers to "which collective are you in?"
# (parent's recorder, 'intra'/'inter') while _subcomm builds a sub-communicator whose calls are steps of the
# parent's calls: it records them there (recorder.StepRecorder), never as calls of its own
_STEPS_OF: contextvars.ContextVar = contextvars.ContextVar("hpccl_steps_of", default=None)


class Communicator:
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
        self._p2p: List[Tuple[str, int, Any, Any, Any]] = []  # (send|recv, peer, flat, memory, stream)
        self._sub: Dict[str, "Communicator"] = {}
        self._node_override = node_id
        self._dev: Any = None  # device.DeviceSide, built at the first device call
        self.parent_ranks: Optional[List[int]] = None  # a hier sub-communicator's ranks in its parent
        self._parent: Optional["Communicator"] = None  # the communicator whose hier steps this one runs
        self.cuda_device: Optional[int] = None  # a sub-communicator's GPU: its parent's, not its own guess
        self._eligible: Dict[Tuple[str, str], List[str]] = {}
        self._trace = log.tracing()
        self._check_calls = config.get("HPCCL_CHECK")
        self._replay_algo: Dict[tuple, str] = {}  # the algorithm of each GPU launch snapshot (comm.stats())
        self._gpu_timer: Any = None  # CUDA events timing traced GPU calls (hpccl/trace.py)

        names = self._boot.allgather(node_name(self._boot.world_rank, node_id))
        self.nodes: NodeMap = detect_nodes(names)
        self.node = self.nodes.node_of[self.rank]
        self.num_nodes = self.nodes.num_nodes
        local = self.nodes.ranks_on(self.node)
        self.local_rank, self.local_size = local.index(self.rank), len(local)

        force = config.get("HPCCL_TRANSPORT")
        if force not in ("", "shm", "mpi"):
            raise HpcclInvalidArgument("HPCCL_TRANSPORT", f"{force!r} is not shm or mpi")
        self._transports: List[Transport] = []
        tag = self._boot.bcast(ShmTransport.new_tag() if self.rank == 0 else None)
        steps_of = _STEPS_OF.get()
        self._rec = (Recorder(tag, self.rank, self.size, self._boot.world_rank) if steps_of is None else
                     StepRecorder(steps_of[0], steps_of[1], tag, self.rank, self.size, self._boot.world_rank))
        from . import nvtx
        self._nvtx = nvtx.ranges()
        self._rec.nvtx = self._nvtx
        self._observed = self._rec.trace is not None or self._nvtx is not None  # every GPU call through _run
        shm = None
        problem = ordering_problem() if self.local_size > 1 and force != "mpi" else None
        if problem is not None:
            if force == "shm":
                raise HpcclUnsupported(f"HPCCL_TRANSPORT=shm: {problem}")
            if self.local_rank == 0:
                log.warn("TRANSPORT", "%s", problem)
            force = "mpi"
            self._boot.barrier()  # keep ShmTransport's two set-up barriers matched across nodes
            self._boot.barrier()
        self._force_mpi = force == "mpi"
        if force != "mpi" and self.local_size > 1:
            shm = ShmTransport(self._boot, self.rank, local, f"{tag}-n{self.node}")
            self._transports.append(shm)
        elif force != "mpi":
            self._boot.barrier()  # keep ShmTransport's two set-up barriers matched across nodes
            self._boot.barrier()
        net = self._net_transport()
        transport_of: Dict[int, Transport] = {}
        for r in range(self.size):
            transport_of[r] = shm if (shm is not None and r in local) else net
        self._path = "shm" if net is None else net.name  # the slowest link prices the flat algorithms
        window = shm.window() if (shm is not None and self.num_nodes == 1) else None
        spin = config.get("HPCCL_SPIN")
        if self.local_size > (os.cpu_count() or 1):
            spin = min(spin, 50)  # oversubscribed: a spinning rank would burn the core its peer needs
        self._waiter = Waiter(config.get("HPCCL_TIMEOUT"), spin,
                              [q for q in range(self.size) if q != self.rank], self._arrived, self._peer_aborted,
                              self._on_fail, self._survey, self._dead_peer)
        self._prim = Primitives(self.rank, self.size, transport_of, window, self._waiter, host)
        if window is not None:  # single-copy algorithms only if every rank can read its peers
            want = config.get("HPCCL_SINGLE_COPY") and shm.cma_ok
            self._prim.single_copy = all(self._boot.allgather(want))
        from .tuning import Tuner
        sizes = {len(self.nodes.ranks_on(nd)) for nd in range(self.num_nodes)}
        self.layout = Layout(self.num_nodes, self.local_size, len(sizes) == 1, window is not None,
                             self._prim.single_copy)
        self._tuner = Tuner(self._path, self.size, self.local_size, self.num_nodes)
        self._hot: Any = None  # the compiled hot path (hpccl/hotpath.py): the node's segments, or the network
        self._hot_serves: tuple = ()  # collectives it can serve
        self._hot_colls: frozenset = frozenset()  # collectives it serves (not those HPCCL_ALGO forces elsewhere)
        self._front: Dict[str, Any] = {}  # the same, taken before Python validation (plain numpy arrays)
        if shm is not None and self.num_nodes == 1:
            self._hot = hotpath.attach(shm, self.rank, spin)
        elif net is not None and self.local_size == 1 and self.num_nodes == self.size:
            self._hot = hotpath.attach_net(net, spin)
        if self._hot is not None:
            self._hot_serves = hotpath.collectives(self._hot)
            hot = self._hot  # its calls are counted in C, front door and validated path alike
            self._rec.stats.external.append(
                lambda: [(c, HOST, "hot", n, b, t) for c, n, b, t in hotpath.counts(hot, self.size)])
            self._hot_refresh()
        self._tuner.on_force = self._on_force
        if config.get("HPCCL_CHECK_ENV"):
            self._check_env(shm)
        self.setup_seconds = time.perf_counter() - t0
        log.info("INIT", "communicator rank %d/%d node %d/%d local %d/%d path %s in %.3fs", self.rank,
                 self.size, self.node, self.num_nodes, self.local_rank, self.local_size, self._path,
                 self.setup_seconds)

    # ----- set-up helpers -------------------------------------------------------------------------
    def _net_transport(self) -> Optional[Transport]:
        """The transport to ranks that shared memory does not reach: None on one node (unless
        HPCCL_TRANSPORT=mpi), else UCX when it loads (HPCCL_NET=ucx insists), else MPI."""
        if self.num_nodes == 1 and not self._force_mpi:
            return None
        t = self._new_net_transport()
        self._transports.append(t)
        return t

    def _new_net_transport(self) -> Transport:
        """A network transport of its own to every rank (collective): hpccl's native engine when it loads
        (HPCCL_NET=engine insists), else ucxx (HPCCL_NET=ucxx insists; ucx: either), else MPI. Every rank takes the same
        path (an agreement over the bootstrap), warning once when the engine is missing."""
        want = config.get("HPCCL_NET")
        if want not in ("", "ucx", "engine", "ucxx", "mpi"):
            raise HpcclInvalidArgument("HPCCL_NET", f"{want!r} is not ucx, engine, ucxx or mpi")
        t: Optional[Transport] = None
        why = ""
        if self.num_nodes > 1 and want in ("", "ucx", "engine"):
            try:
                from .transport.engine import EngineTransport
            except ImportError as exc:
                why = str(exc)
            everyone = self._boot.allgather(why)
            missing = [r for r, w in enumerate(everyone) if w]
            if missing:
                if want == "engine":
                    raise HpcclUnsupported(f"HPCCL_NET=engine but the network engine cannot load on rank(s) "
                                           f"{missing}: {everyone[missing[0]]}")
                if self.rank == 0 and self.parent_ranks is None:
                    log.warn("TRANSPORT", "the native network engine is not in use (rank(s) %s: %s); calls "
                             "across nodes take the slower ucxx/MPI path", missing, everyone[missing[0]])
            else:
                t = EngineTransport(self._boot, self.rank, list(self.nodes.node_of))
        if t is None and self.num_nodes > 1 and want in ("", "ucx", "ucxx"):
            try:
                from .transport.ucx import UcxTransport
            except ImportError as exc:
                if want in ("ucx", "ucxx"):
                    raise HpcclUnsupported(f"HPCCL_NET={want} but neither the network engine nor the ucxx "
                                           f"transport can load: {exc}") from None
            else:
                t = UcxTransport(self._boot, self.rank)
        if t is None:
            if self._boot.comm is None:
                raise HpcclUnsupported("ranks on different nodes need the UCX transport (pip install "
                                       "hpccl[ucx]) when the communicator was not built over MPI")
            t = MpiTransport(self._boot.comm.Dup())
        return t

    def _check_env(self, shm: Optional[ShmTransport]) -> None:
        try:
            from .envcheck import check_environment
        except ImportError:
            return
        need = shm.segment_bytes if shm is not None else 0  # per rank: check_shm multiplies by local_size
        use_ucx = any(t.name == "ucx" for t in self._transports)
        if self.local_rank != 0 or self.parent_ranks is not None:
            return  # once per node, not again for hier's sub-communicators
        for msg in check_environment(need, self.local_size, False, use_ucx=use_ucx):
            log.warn("ENV", "%s", msg)

    def _arrived(self, peer: int) -> Optional[int]:
        for t in self._transports:
            s = t.arrived(peer)
            if s is not None:
                return s
        return None

    def _dead_peer(self) -> Optional[Tuple[int, str]]:
        for t in self._transports:
            d = t.dead_peer()
            if d is not None:
                return d
        return None

    def _survey(self) -> bool:
        """At a timeout: transports that cannot see their peers' arrival ask them (MPI's control channel).
        A hier step's sub-communicator does not: its parent asks at the level of the user's call, at the
        same moment as the other ranks (which answer only while they are still waiting or asking)."""
        if self._parent is not None:
            return False
        asked = False
        for t in self._transports:
            if type(t).survey is not Transport.survey:
                t.survey(self._waiter.ranks, SURVEY_S)
                asked = True
        return asked

    def _peer_aborted(self) -> Optional[int]:
        for t in self._transports:
            r = t.peer_aborted()
            if r is not None:
                return r
        parent = self._parent
        if parent is not None:  # a hier step: keep the user's communicator's control channel answered
            r = parent._peer_aborted()
            if r is not None:
                pr = self.parent_ranks or []
                return pr.index(r) if r in pr else -(r + 2)  # -(r+2): a rank in the parent's numbering
        return None

    def _on_fail(self, origin: Optional[int] = None) -> None:
        self.abort(origin)

    # ----- properties and life cycle ---------------------------------------------------------------
    @property
    def mpi_comm(self) -> Any:
        """hpccl's private duplicate of the MPI communicator it was built on (None over a store)."""
        return self._boot.comm

    def split(self, color: int, key: int = 0) -> Optional["Communicator"]:
        """A new communicator per color, ranks ordered by key (like MPI_Comm_split); None for color < 0."""
        self._alive("split")
        return self._split(color, key, self._node_override)

    def _split(self, color: int, key: int, node_id: Optional[str]) -> Optional["Communicator"]:
        sub = self._boot.split(color, key)
        if sub is None or (self._boot.comm is not None and sub == _mpi_null()):
            return None
        try:
            return Communicator(sub, node_id=node_id)
        finally:
            self._boot.release(sub)

    def shrink(self, exclude: Sequence[int]) -> "Communicator":
        """A new communicator of every rank not in ``exclude`` (renumbered in order), like ncclCommShrink:
        built with no collective over the excluded ranks, so it works while they are stopped, hung or
        gone. Every surviving rank calls it with the same list; allowed on an aborted communicator (the
        usual way on after a failure). This communicator stays aborted or usable as it was: destroy it."""
        if self._destroyed:
            raise HpcclInvalidUsage("shrink called on a destroyed communicator")
        try:
            ex = sorted({int(r) for r in exclude})
        except (TypeError, ValueError):
            raise HpcclInvalidArgument("exclude", f"{exclude!r} is not a list of ranks") from None
        for r in ex:
            self._rank_arg(r, "exclude")
        if self.rank in ex:
            raise HpcclInvalidArgument("exclude", f"names this rank ({self.rank}); an excluded rank does not call shrink")
        sub = self._boot.shrink(ex)
        try:
            return Communicator(sub, node_id=self._node_override)
        finally:
            self._boot.release(sub)

    def revoke(self) -> None:
        """Stop this communicator's work everywhere: mark it failed and tell every peer (their waits raise
        HpcclRemoteError naming this rank), so that shrink or destroy can follow safely."""
        self.abort()

    def synchronize(self) -> None:
        """Wait for this rank's GPU work on this communicator (kernels and network steps), then raise the
        first failure an earlier call met there, like ncclCommGetAsyncError; host calls need nothing."""
        if self._dev is not None:
            self._dev.synchronize()
            if self._gpu_timer is not None:
                self._gpu_timer.harvest(self._rec.trace)
        for kind in ("inter", "intra"):  # a network step's failure names who never came: report it first
            if kind in self._sub:
                try:
                    self._sub[kind].synchronize()
                except HpcclError as exc:
                    raise _in_call(exc) from None

    def abort(self, origin: Optional[int] = None) -> None:
        """Mark this communicator failed and tell every peer (shared memory flag, MPI control message), so
        they stop waiting; ``origin`` is the rank whose failure this passes on (default: this rank)."""
        if not self._aborted:
            self._aborted = True
            self._front = {}
            self._rec.dump(f"abort in {self._waiter.collective} #{self._seq}"
                           + ("" if origin is None or origin == self.rank else f", passed on from rank {origin}"))
            if self._dev is not None and self._dev.engine is not None:
                self._dev.engine.fs.live = 0  # no more replays of launch snapshots
            for t in self._transports:
                t.abort(self.rank if origin is None else origin)
            for sub in self._sub.values():  # hier's steps wait on the sub-communicators' transports
                pr = sub.parent_ranks or []
                # an origin outside the sub-communicator travels in this communicator's numbering, as -(r+2)
                sub.abort(None if origin is None else pr.index(origin) if origin in pr else -(origin + 2))

    def destroy(self) -> None:
        """Release shared memory, endpoints and the private MPI communicator; safe to call twice."""
        if self._destroyed:
            return
        self._front = {}
        if self._hot is not None:
            self._hot.cancel()
            self._hot = None
        if self._gpu_timer is not None:
            try:
                self._gpu_timer.harvest(self._rec.trace, wait=True)
                self._gpu_timer.close()
            except Exception:  # noqa: BLE001 - a failed GPU leaves its calls untimed
                pass
            self._gpu_timer = None
        if self._rec.trace is not None:
            self._rec.trace.close()
        if self._dev is not None:
            self._dev.close()
            self._dev = None
        for sub in self._sub.values():
            sub.destroy()
        self._sub = {}
        self._prim.window_views.clear()  # numpy views pin the mappings; drop them first
        self._prim._scratch.clear()
        for t in self._transports:
            t.close()
        self._transports = []
        self._boot.close()
        self._destroyed = True

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
                self._dev.check(what)  # the GPU-side failure that aborted it, with its names
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
        dev.check(what)
        return dev.mem

    def _device(self) -> Any:
        if self._dev is None:
            from .device import DeviceSide
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
        """The algorithms this communicator can run for ``coll`` on ``kind`` memory ('host' or 'cuda')."""
        names = self._modelled(coll, kind)
        if self._hot is not None and kind == HOST and coll in self._hot_serves:
            return names + ["hot"]  # the compiled path (up to HPCCL_HOT_SIZE bytes per rank)
        return names

    def _modelled(self, coll: str, kind: str) -> List[str]:
        """The table's algorithms for ``coll`` on this layout: the ones the cost model chooses among."""
        names = self._eligible.get((coll, kind))
        if names is None:
            names = self._eligible[(coll, kind)] = eligible(coll, kind, self.layout)
        return names

    def _run(self, call: "Call") -> None:
        if call.mem is not host and self.num_nodes > 1:  # refused before it counts or aborts anything
            self._check_capture(call.stream, call.coll)
        self._seq += 1
        self._waiter.collective, self._waiter.seq = call.coll, self._seq
        for t in self._transports:
            t.announce(self._seq)
        rec = self._rec.start(self._seq, call.coll, call.nbytes, call.mem.kind)
        if self._check_calls and call.coll not in _P2P:
            self._agree(call, rec)
        back = None if call.mem is host else _on_device(call.mem.device)
        timed = None
        if self._observed and call.mem is not host:
            if self._nvtx is not None:  # a hier step's range: in its own domain, inside the user's call's
                self._nvtx.push_range(self._rec.label(rec), domain=self._rec.domain)
            if self._rec.trace is not None and call.stream is not None:
                timed = self._gpu_begin(call.mem.device, call.stream)
        try:
            if call.fn is not Communicator._collective:
                call.fn(self, call)
            elif call.mem is host:
                self._collective(call)
            else:
                self._run_device(call)
        except HpcclError as exc:
            exc = self._named(exc, call.coll)
            self._rec.end(rec, f"failed: {type(exc).__name__}")
            self.abort(exc.rank if isinstance(exc, HpcclRemoteError) else None)
            raise exc from None
        finally:
            if self._nvtx is not None and call.mem is not host:
                self._nvtx.pop_range(domain=self._rec.domain)
            if back is not None:
                _on_device(back)
        self._rec.end(rec, "done" if call.mem is host else "enqueued")
        if timed is not None:
            self._gpu_timer.end(timed, call.stream, (call.coll, self._seq, call.nbytes, rec[4]))
            self._gpu_timer.harvest(self._rec.trace)

    def _gpu_begin(self, device: int, stream: int) -> Optional[int]:
        """A CUDA event before a traced GPU call on its stream (None inside a capture)."""
        if self._gpu_timer is None:
            from .trace import GpuTimer
            self._gpu_timer = GpuTimer(device)
        return self._gpu_timer.begin(stream)

    def stats(self) -> Dict[str, Dict[str, dict]]:
        """Calls, bytes and seconds (host time inside the call; for GPU calls the time to enqueue) per
        collective and algorithm (memory kind in brackets), since this communicator was made."""
        return self._rec.stats.snapshot()

    def _agree(self, call: "Call", rec: list) -> None:
        """HPCCL_CHECK: the ranks compare what they are about to call. A mismatch is a usage error found by
        every rank before any data of the call moved, so the communicator stays usable (no abort: an abort
        would reach ranks still comparing and hide the mismatch from them); a failed exchange aborts."""
        self._waiter.collective = f"HPCCL_CHECK before {call.coll}"
        try:
            check.agree(self, call)
        except HpcclInvalidUsage:
            self._rec.end(rec, "failed: HpcclInvalidUsage")
            raise
        except HpcclError as exc:
            self._rec.end(rec, f"failed: {type(exc).__name__}")
            self.abort(exc.rank if isinstance(exc, HpcclRemoteError) else None)
            raise
        finally:
            self._waiter.collective = call.coll

    def _named(self, exc: HpcclError, coll: str) -> HpcclError:
        """The error a call raises: a transport's report of a lost peer gets the call's name; a hier
        step's (sub-communicator's) error goes up in its parent's rank numbering; the user's communicator
        names its own call, and the step it failed in."""
        if isinstance(exc, HpcclRemoteError) and exc.rank is not None and not exc.collective:
            exc = HpcclRemoteError(f"{coll} #{self._seq}: {exc.message}", exc.rank, coll, self._seq, exc.awaited)
        if self.parent_ranks is not None:
            return self._in_parent(exc)
        if type(exc) is HpcclInvalidUsage and not exc.message.startswith(f"{coll} #"):
            # met while the call ran (a peer's message of another size): the call is named, as the compiled
            # path names it
            exc = HpcclInvalidUsage(f"{coll} #{self._seq}: {exc.message}")
        return self._as_call(exc, coll)

    def _as_call(self, exc: HpcclError, coll: str) -> HpcclError:
        """An error met in a step of hier (a sub-communicator's call) names the user's call and its sequence
        number, and the step by its place in the call (the sub-communicators' own counts stay internal)."""
        step = getattr(exc, "collective", "")
        if not step or ((step, exc.seq) == (coll, self._seq) and not getattr(exc, "from_step", False)):
            return exc
        where = f"in its hierarchical {self._rec.step() or 'step ' + step}"
        if isinstance(exc, HpcclTimeoutError):
            # who never arrived at the user's call, not at the step: ask at this communicator's level
            missing = exc.missing
            if self._survey():
                missing = self._waiter.missing(exc.missing, surveyed=True)
            return HpcclTimeoutError(coll, self._seq, missing, config.get("HPCCL_TIMEOUT"), where)
        if isinstance(exc, HpcclRemoteError) and exc.rank is not None:
            return HpcclRemoteError.aborted(coll, self._seq, exc.rank, exc.awaited, f"; {where}")
        return exc

    def _in_parent(self, exc: HpcclError) -> HpcclError:
        """A sub-communicator's timeout or remote failure names its parent's ranks, the ones the user knows
        (once: a network step's error, mapped on the proxy thread, passes here again on the caller's)."""
        if getattr(exc, "from_step", False):
            return exc
        pr = self.parent_ranks
        if pr is not None and isinstance(exc, HpcclRemoteError) and exc.rank is not None and exc.collective:
            out = HpcclRemoteError.aborted(exc.collective, exc.seq, -exc.rank - 2 if exc.rank < 0 else pr[exc.rank],
                                           [pr[m] for m in exc.awaited if 0 <= m < len(pr)])
            out.from_step = True
            return out
        if pr is None or not isinstance(exc, HpcclTimeoutError):
            return exc
        out = HpcclTimeoutError(exc.collective, exc.seq, [pr[m] for m in exc.missing if 0 <= m < len(pr)],
                                config.get("HPCCL_TIMEOUT"), "ranks of the whole communicator; a step of its "
                                "hierarchical algorithm")
        out.from_step = True  # the parent names its own call and asks who never arrived at it
        return out

    def _submit(self, call: "Call") -> None:
        if self._group is not None:
            self._group.append(call)
        else:
            self._run(call)

    def _choose(self, coll: str, nbytes: int, kind: str) -> str:
        algo = self._tuner.choose(coll, nbytes, self._modelled(coll, kind), kind)
        self._rec.algo(algo)
        if self._trace:
            log.trace("COLL", "%s %d B %s algo %s", self._rec.name(coll, self._seq), nbytes, kind, algo)
        return algo

    def _on_force(self) -> None:
        """A collective was pinned to another algorithm (Tuner.force): the hot path steps aside or comes
        back, and the GPU launch snapshots go, since a replay would run the algorithm of the call that
        made it. (A snapshot is keyed by buffers, not algorithm; two ranks whose allocators reuse a pointer
        differently would otherwise run different kernels in one call.)"""
        self._hot_refresh()
        if self._dev is not None and self._dev.engine is not None:
            self._dev.engine.drop()
        self._replay_algo.clear()

    def _hot_refresh(self) -> None:
        """Which collectives the hot path serves: all it can, but not one HPCCL_ALGO (or a benchmark's
        force) pins to another algorithm; the front door also steps aside for HPCCL_CHECK and the flight
        recorder's dumps, which need every call to pass through Python."""
        if self._hot is None or self._aborted or self._destroyed:
            return
        ov = self._tuner.override
        self._hot_colls = frozenset(c for c in self._hot_serves if (ov.get(c) or ov.get("*")) in (None, "hot"))
        self._front = ({} if self._check_calls or self._rec.dump_dir or self._rec.trace is not None
                       else {c: self._hot for c in self._hot_colls})

    def _front_door(self, coll: str, sendbuf: Any, recvbuf: Any, out_required: bool, *args: Any) -> bool:
        """Hand a call on plain numpy arrays to the hot path before any Python validation; True when it
        took the call (anything it declines goes the validating way). ``out_required``: the collective
        allocates its output when recvbuf is None, which only Python does."""
        hot = self._front.get(coll)
        if (hot is None or type(sendbuf) is not np.ndarray or self._group is not None
                or (out_required and type(recvbuf) is not np.ndarray)):
            return False
        try:
            rc = getattr(hot, coll)(sendbuf, recvbuf, *args, self._seq + 1)
        except HpcclError as exc:  # the path across nodes: a round failed before it returned
            self._seq += 1
            self._hot_failed(exc, coll)
        if rc < 0:
            return False
        self._hot_done(rc, coll)
        return True

    def _hot_done(self, rc: int, coll: str) -> None:
        """A call the hot path took from the front door: count it, and finish its wait if it is pending
        (the Waiter's timeout, abort and dead-peer checks; a failure is named and aborts as in _run)."""
        self._seq += 1
        if rc == 0:
            return
        self._waiter.collective, self._waiter.seq = coll, self._seq
        try:
            self._waiter.wait(self._hot.resume, self._hot.waiting)
        except HpcclError as exc:
            self._hot_failed(exc, coll)

    def _hot_failed(self, exc: HpcclError, coll: str) -> NoReturn:
        """A front-door call failed: drop it, name it and abort, as _run does for the validated path."""
        self._hot.cancel()
        exc = self._named(exc, coll)
        self.abort(exc.rank if isinstance(exc, HpcclRemoteError) else None)
        raise exc from None

    def _hot_run(self, call: "Call") -> bool:
        """Run a validated host call on the hot path; False when it declines (a dtype or size it does not
        take: the same on every rank, so every rank runs the Python algorithm instead)."""
        hot, coll, a = self._hot, call.coll, call.args
        try:  # the path across nodes can fail in its first round, before it returns
            if coll == "all_reduce" or coll == "reduce_scatter":
                recv = None if a[1] is a[0] else a[1]
                rc = getattr(hot, coll)(a[0], recv, OPCODE[a[2]], self._seq)
            elif coll == "all_gather":
                rc = hot.all_gather(a[0], a[1], self._seq)
            elif coll == "broadcast":
                rc = hot.broadcast(a[0], None if a[1] is a[0] else a[1], a[2], self._seq)
            elif coll == "reduce":
                rc = hot.reduce(a[0], None if a[1] is a[0] else a[1], a[2], OPCODE[a[3]], self._seq)
            elif coll == "all_to_all":
                rc = hot.all_to_all(a[0], None if a[1] is a[0] else a[1], self._seq)
            else:
                rc = hot.barrier(self._seq)
            if rc < 0:
                return False
            self._rec.algo("hot")
            if rc:
                self._waiter.wait(hot.resume, hot.waiting)
        except BaseException:
            hot.cancel()
            raise
        return True

    def _collective(self, call: "Call") -> None:
        """Run a validated collective Call on host memory: the chosen algorithm, then the op's last step."""
        coll, args = call.coll, call.args
        if coll in self._hot_colls and self._hot_run(call):
            return
        algo = self._choose(coll, call.nbytes, HOST)
        if algo == "hier":
            hier.run(self, coll, *args)
        else:
            ALGORITHMS[coll][algo].fn(self._prim, *args)
        if call.finish is not None:
            host.finish(call.finish, call.op, self.size)

    def _run_device(self, call: "Call") -> None:
        """Device Calls: kernels (one node), hier, or a host schedule on the network proxy."""
        dev = self._dev
        coll, args, st = call.coll, call.args, call.stream
        eng = dev.engine
        if eng is not None and eng.registry:
            algo = eng.registered(coll, args, st)
            if algo is not None:
                self._rec.algo(algo)
                return
        algo = self._choose(coll, call.nbytes, CUDA)
        spec = ALGORITHMS[coll].get(algo)
        if spec is not None and spec.cuda_scope == "node":
            eng = dev.engine
            spec.cuda(eng, *args, st)
            eng.remember(call.key)
            if call.key is not None:
                if len(self._replay_algo) > 2048:
                    self._replay_algo.clear()
                self._replay_algo[call.key] = algo
            return
        finish = call.finish
        if algo == "hier":
            self._check_capture(st, coll)
            from .device import stream_context
            with stream_context(dev.device, st):
                hier.run(self, coll, *args, stream=st)
                if finish is not None:
                    dev.mem.finish(finish, call.op, self.size)
            return
        prim, seq, size, op = dev.prim, self._seq, self.size, call.op
        prim.mem.prepare(prim.mem.dtype(args[0]), op)
        dev.proxy.ops.reserve(4 * call.nbytes + (1 << 20))  # temporaries of any schedule in the table
        user = self._rec.at()  # a hier step's: the user's call and the step, for an error raised later

        def step() -> None:
            dev.waiter.collective, dev.waiter.seq = coll, seq
            try:
                spec.cuda(prim, *args)
            except HpcclError as exc:
                exc = self._in_parent(exc)
                if user is not None:
                    exc.in_call = user
                raise exc from None
            if finish is not None:
                prim.mem.finish(finish, op, size)
        dev.proxy.enqueue(st, step, self._rec.name(coll, seq))

    def _net_capturable(self) -> bool:
        """True when this communicator's GPU network steps (and those of hier's sub-communicators) are
        staged on the network engine, which a CUDA graph can hold."""
        dev = self._dev
        if dev is None or not getattr(dev.proxy, "capturable", False):
            return False
        return all(sub._net_capturable() for sub in self._sub.values() if sub.num_nodes > 1)

    def _check_capture(self, stream: int, what: str) -> None:
        """Calls whose algorithm has a network step refuse a capturing stream before enqueuing anything,
        unless that step is staged on the network engine (capturable)."""
        if self.num_nodes > 1 and not self._net_capturable():
            import cupy
            try:
                capturing = cupy.cuda.runtime.streamIsCapturing(stream)
            except Exception:  # noqa: BLE001
                capturing = False
            if capturing:
                raise HpcclUnsupported(f"{what}: on a communicator spanning nodes this call needs a network "
                                       "step driven by the host (UCX), which a CUDA graph cannot hold; "
                                       "capture only single-node calls")

    def _flat(self, coll: str, *args: Any, stream: Any = None) -> None:
        """Run a collective on flat, already validated arrays (hier's sub-steps): no second validation."""
        m = host if isinstance(args[0], np.ndarray) else self._device().mem
        self._run(Call(coll, m, stream, args[1].nbytes if coll == "all_gather" else args[0].nbytes, args))

    def _fast(self, coll: str, sendbuf: Any, recvbuf: Any, op: Any, root: int, stream: Any) -> Any:
        """A repeated single-node device call replays its launch snapshot (returns FIRED when it did) or
        returns the key to snapshot this call under; host buffers and groups never take this path."""
        eng = self._dev.engine
        if eng is None or self._group is not None or self._check_calls or self._observed:
            return None
        key = eng.fast_key(coll, sendbuf, recvbuf, op, root, stream)
        if key is not None:
            t0 = _perf()
            if eng.fire(key):
                ks, name = key[1], _FAST_NAMES[coll]
                self._rec.stats.add(name, CUDA, self._replay_algo.get(key, ""),
                                    ks[1] * ks[2].itemsize * (self.size if name == "all_gather" else 1),
                                    _perf() - t0)
                return FIRED
        return key

    def _unalias(self, m: Any, send: Any, recv: Any, stream: Any, key: Any,
                 block: Optional[int] = None) -> Tuple[Any, Any]:
        """(input, fast-path key): an input that overlaps the output other than as the output itself (or,
        for all_gather and reduce_scatter, as this rank's own block) is copied first, on both memory kinds;
        a call that needed the copy is never replayed from a snapshot (the copy is new each time)."""
        out = self._overlap(m, send, recv, stream, block)
        return out, (key if out is send or m.same(out, send) else None)

    def _overlap(self, m: Any, send: Any, recv: Any, stream: Any, block: Optional[int]) -> Any:
        if send is recv or not m.shares(send, recv):
            return send
        if block is None:
            return recv if m.same(send, recv) else m.clone(send, stream)
        big, small = (recv, send) if recv.size > send.size else (send, recv)
        c = small.size
        return send if m.same(big[block * c:(block + 1) * c], small) else m.clone(send, stream)

    # ----- collectives -----------------------------------------------------------------------------
    def all_reduce(self, sendbuf: Any, recvbuf: Any = None, op: OpLike = SUM, *, stream: Any = None) -> Any:
        """recvbuf = sendbuf reduced over all ranks; in place (into sendbuf) when recvbuf is None."""
        if self._front and self._front_door("all_reduce", sendbuf, recvbuf, False, OPCODE.get(op, -1)):
            return sendbuf if recvbuf is None else recvbuf
        key = None
        if self._dev is not None and type(sendbuf) is not np.ndarray:
            key = self._fast("ar", sendbuf, recvbuf, op, -1, stream)
            if key is FIRED:
                return sendbuf if recvbuf is None else recvbuf
        self._alive("all_reduce")
        op = as_op(op)
        m = self._memory(sendbuf, "all_reduce")
        send, _ = m.view(sendbuf, "sendbuf")
        check_op_dtype(op, m.dtype(send))
        if recvbuf is None:
            m.writable(send, "sendbuf")
            recv, result = send, sendbuf
        else:
            recv, result = self._out(m, recvbuf, send, send.size, "recvbuf")
        st = m.stream(stream, sendbuf)
        if send.size == 0:
            return result
        send, key = self._unalias(m, send, recv, st, key)
        self._submit(Call("all_reduce", m, st, send.nbytes, (send, recv, op), op=op,
                          finish=recv if op is AVG else None, key=key))
        return result

    def reduce(self, sendbuf: Any, recvbuf: Any = None, root: int = 0, op: OpLike = SUM, *,
               stream: Any = None) -> Any:
        """The reduction over all ranks lands in recvbuf (or sendbuf, if None) on root only."""
        if (self._front and type(root) is int
                and self._front_door("reduce", sendbuf, recvbuf, False, root, OPCODE.get(op, -1))):
            return (sendbuf if recvbuf is None else recvbuf) if self.rank == root else recvbuf
        key = None
        if self._dev is not None and type(sendbuf) is not np.ndarray:
            key = self._fast("red", sendbuf, recvbuf, op, root, stream)
            if key is FIRED:
                return (sendbuf if recvbuf is None else recvbuf) if self.rank == root else recvbuf
        self._alive("reduce")
        root = self._rank_arg(root, "root")
        op = as_op(op)
        m = self._memory(sendbuf, "reduce")
        send, _ = m.view(sendbuf, "sendbuf")
        check_op_dtype(op, m.dtype(send))
        if self.rank == root:
            if recvbuf is None:
                m.writable(send, "sendbuf")
                recv, result = send, sendbuf
            else:
                recv, result = self._out(m, recvbuf, send, send.size, "recvbuf")
        else:
            recv = self._out(m, recvbuf, send, send.size, "recvbuf")[0] if recvbuf is not None else send
            result = recvbuf
        st = m.stream(stream, sendbuf)
        if send.size == 0:
            return result
        if self.rank == root:
            send, key = self._unalias(m, send, recv, st, key)
        else:
            recv = send  # algorithms never write a non-root's output
        self._submit(Call("reduce", m, st, send.nbytes, (send, recv, root, op), op=op,
                          finish=recv if op is AVG and self.rank == root else None, key=key))
        return result

    def broadcast(self, buf: Any, root: int = 0, *, recvbuf: Any = None, stream: Any = None) -> Any:
        """Root's buf reaches every rank: in place in buf, or into recvbuf when given."""
        if self._front and type(root) is int and self._front_door("broadcast", buf, recvbuf, False, root):
            return buf if recvbuf is None else recvbuf
        key = None
        if self._dev is not None and type(buf) is not np.ndarray:
            key = self._fast("bc", buf, recvbuf, None, root, stream)
            if key is FIRED:
                return buf if recvbuf is None else recvbuf
        self._alive("broadcast")
        root = self._rank_arg(root, "root")
        m = self._memory(buf, "broadcast")
        send, _ = m.view(buf, "buf")
        if recvbuf is None:
            if self.rank != root:
                m.writable(send, "buf")
            recv, result = send, buf
        else:
            recv, result = self._out(m, recvbuf, send, send.size, "recvbuf")
        st = m.stream(stream, buf)
        if send.size == 0:
            return result
        send, key = self._unalias(m, send, recv, st, key)
        self._submit(Call("broadcast", m, st, send.nbytes, (send, recv, root), key=key))
        return result

    def all_gather(self, sendbuf: Any, recvbuf: Any = None, *, stream: Any = None) -> Any:
        """recvbuf holds every rank's sendbuf in rank order (size x count); allocated when None.
        In place when sendbuf is recvbuf's own block (recvbuf[rank*count:(rank+1)*count])."""
        if self._front and self._front_door("all_gather", sendbuf, recvbuf, True):
            return recvbuf
        key = None
        if self._dev is not None and recvbuf is not None and type(sendbuf) is not np.ndarray:
            key = self._fast("ag", sendbuf, recvbuf, None, -1, stream)
            if key is FIRED:
                return recvbuf
        self._alive("all_gather")
        m = self._memory(sendbuf, "all_gather")
        send, shaped = m.view(sendbuf, "sendbuf")
        if recvbuf is None:
            recv, result = m.empty_out((self.size,) + tuple(shaped.shape), sendbuf, send)
        else:
            recv, result = self._out(m, recvbuf, send, send.size * self.size, "recvbuf")
        st = m.stream(stream, sendbuf)
        if send.size == 0:
            return result
        send, key = self._unalias(m, send, recv, st, key, block=self.rank)
        self._submit(Call("all_gather", m, st, recv.nbytes, (send, recv), key=key))
        return result

    def reduce_scatter(self, sendbuf: Any, recvbuf: Any = None, op: OpLike = SUM, *,
                       stream: Any = None) -> Any:
        """recvbuf (count) = block ``rank`` of sendbuf (size x count) reduced over all ranks."""
        if self._front and self._front_door("reduce_scatter", sendbuf, recvbuf, True, OPCODE.get(op, -1)):
            return recvbuf
        key = None
        if self._dev is not None and recvbuf is not None and type(sendbuf) is not np.ndarray:
            key = self._fast("rs", sendbuf, recvbuf, op, -1, stream)
            if key is FIRED:
                return recvbuf
        self._alive("reduce_scatter")
        op = as_op(op)
        m = self._memory(sendbuf, "reduce_scatter")
        send, _ = m.view(sendbuf, "sendbuf")
        check_op_dtype(op, m.dtype(send))
        if send.size % self.size:
            raise HpcclInvalidArgument("sendbuf", f"has {send.size} elements, not a multiple of the "
                                                  f"communicator size {self.size}")
        c = send.size // self.size
        if recvbuf is None:
            recv, result = m.empty_out((c,), sendbuf, send)
        else:
            recv, result = self._out(m, recvbuf, send, c, "recvbuf")
        st = m.stream(stream, sendbuf)
        if c == 0:
            return result
        send, key = self._unalias(m, send, recv, st, key, block=self.rank)
        self._submit(Call("reduce_scatter", m, st, send.nbytes, (send, recv, op), op=op,
                          finish=recv if op is AVG else None, key=key))
        return result

    def all_to_all(self, sendbuf: Any, recvbuf: Any = None, *, stream: Any = None) -> Any:
        """Block j of rank i's sendbuf becomes block i of rank j's recvbuf."""
        if self._front and self._front_door("all_to_all", sendbuf, recvbuf, True):
            return recvbuf
        key = None
        if self._dev is not None and recvbuf is not None and type(sendbuf) is not np.ndarray:
            key = self._fast("a2a", sendbuf, recvbuf, None, -1, stream)
            if key is FIRED:
                return recvbuf
        self._alive("all_to_all")
        m = self._memory(sendbuf, "all_to_all")
        send, shaped = m.view(sendbuf, "sendbuf")
        if send.size % self.size:
            raise HpcclInvalidArgument("sendbuf", f"has {send.size} elements, not a multiple of the "
                                                  f"communicator size {self.size}")
        if recvbuf is None:
            recv, result = m.empty_out(tuple(shaped.shape), sendbuf, send)
        else:
            recv, result = self._out(m, recvbuf, send, send.size, "recvbuf")
        st = m.stream(stream, sendbuf)
        if send.size == 0:
            return result
        if send is recv or m.shares(send, recv):  # in place too: blocks are read after writes start
            send, key = m.clone(send, st), None
        self._submit(Call("all_to_all", m, st, send.nbytes, (send, recv), key=key))
        return result

    def all_to_all_v(self, sendbuf: Any, recvbuf: Any, sendcounts: Sequence[int], recvcounts: Sequence[int],
                     sdispls: Optional[Sequence[int]] = None, rdispls: Optional[Sequence[int]] = None, *,
                     stream: Any = None) -> Any:
        """MPI_Alltoallv: rank i sends sendcounts[j] elements from sendbuf, starting at element sdispls[j],
        to rank j, which receives them at element rdispls[i] of recvbuf (recvcounts[i] elements there).
        Displacements default to the packed prefix sums of the counts. It runs as a group of sends and
        receives (host and GPU alike); recvcounts[j] must equal rank j's sendcounts[i], as in MPI."""
        self._alive("all_to_all_v")
        m = self._memory(sendbuf, "all_to_all_v")
        send, _ = m.view(sendbuf, "sendbuf")
        if recvbuf is None:
            raise HpcclInvalidArgument("recvbuf", "is required (its size follows from recvcounts and rdispls)")
        if self._memory(recvbuf, "recvbuf") is not m:
            raise HpcclInvalidArgument("recvbuf", f"is {memory_kind(recvbuf)} memory but sendbuf is {m.kind} memory")
        recv, _ = m.view(recvbuf, "recvbuf")
        m.writable(recv, "recvbuf")
        if m.dtype(recv) != m.dtype(send):
            raise HpcclInvalidArgument("recvbuf", f"dtype {m.dtype(recv)} differs from sendbuf's {m.dtype(send)}")
        sblocks = self._vblocks(sendcounts, sdispls, send.size, "sendcounts", "sdispls", "sendbuf", False)
        rblocks = self._vblocks(recvcounts, rdispls, recv.size, "recvcounts", "rdispls", "recvbuf", True)
        r = self.rank
        if sblocks[r][1] != rblocks[r][1]:
            raise HpcclInvalidArgument("recvcounts", f"recvcounts[{r}] = {rblocks[r][1]} but this rank sends "
                                                     f"itself sendcounts[{r}] = {sblocks[r][1]}")
        st = m.stream(stream, sendbuf)
        if m.shares(send, recv):  # blocks may be read after others are written
            send = m.clone(send, st)
        items = [("send", j, send[o:o + c], m, st) for j, (o, c) in enumerate(sblocks) if c]
        items += [("recv", j, recv[o:o + c], m, st) for j, (o, c) in enumerate(rblocks) if c]
        if self._group is not None:
            self._p2p.extend(items)
        elif items:
            self._run_p2p(items, "all_to_all_v")
        return recvbuf

    def _vblocks(self, counts: Sequence[int], displs: Optional[Sequence[int]], total: int, cname: str,
                 dname: str, bname: str, disjoint: bool) -> List[Tuple[int, int]]:
        """[(offset, count)] per rank, checked: one per rank, non-negative, inside the buffer, and (for the
        receive side) not overlapping one another."""
        def ints(seq: Any, name: str) -> List[int]:
            try:
                vals = [int(v) for v in seq]
            except (TypeError, ValueError):
                raise HpcclInvalidArgument(name, f"{seq!r} is not a sequence of integers") from None
            if len(vals) != self.size:
                raise HpcclInvalidArgument(name, f"has {len(vals)} entries, needs one per rank ({self.size})")
            bad = [i for i, v in enumerate(vals) if v < 0]
            if bad:
                raise HpcclInvalidArgument(name, f"entry {bad[0]} is negative ({vals[bad[0]]})")
            return vals
        cs = ints(counts, cname)
        ds = ints(displs, dname) if displs is not None else [sum(cs[:j]) for j in range(self.size)]
        for j, (o, c) in enumerate(zip(ds, cs)):
            if o + c > total:
                raise HpcclInvalidArgument(cname if displs is None else dname,
                                           f"block {j} ({c} elements at {o}) ends past {bname}'s {total} elements")
        if disjoint:
            spans = sorted((o, o + c, j) for j, (o, c) in enumerate(zip(ds, cs)) if c)
            for (_, e0, j0), (s1, _, j1) in zip(spans, spans[1:]):
                if s1 < e0:
                    raise HpcclInvalidArgument(dname, f"blocks {j0} and {j1} of {bname} overlap")
        return list(zip(ds, cs))

    # ----- registered GPU buffers --------------------------------------------------------------------------
    def register(self, buf: Any) -> None:
        """Map a CUDA buffer into every peer of the node once (collective, like ncclCommRegister): calls
        whose buffers lie in it, at the same offset on every rank, then read peers' memory directly (zero-copy
        kernels) instead of staging. hpccl keeps a reference to buf until deregister(buf) or destroy()."""
        eng, flat = self._registrable(buf, "register")
        eng.register(flat.data.ptr, flat.nbytes, buf, "buf")

    def deregister(self, buf: Any) -> None:
        """Undo register(buf) on every rank together, once every rank's GPU work so far is done."""
        eng, flat = self._registrable(buf, "deregister")
        eng.deregister(flat.data.ptr, flat.nbytes, "buf")

    def _registrable(self, buf: Any, what: str) -> Tuple[Any, Any]:
        self._alive(what)
        if self._group is not None:
            raise HpcclInvalidUsage(f"{what} inside comm.group(); call it outside the group")
        if type(buf) is np.ndarray or memory_kind(buf) == HOST:
            raise HpcclInvalidArgument("buf", f"is host memory; {what} takes CUDA buffers (host calls need no "
                                              "registration)")
        m = self._memory(buf, what)
        flat, _ = m.view(buf, "buf")
        if flat.nbytes == 0:
            raise HpcclInvalidArgument("buf", f"is empty; nothing to {what}")
        eng = self._dev.engine
        if eng is None:
            raise HpcclUnsupported(f"{what}: zero-copy kernels serve communicators of one node; this one spans "
                                   f"{self.num_nodes} nodes (its GPU calls go through the network proxy)")
        return eng, flat

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
        self._submit(Call("barrier", host, None, 0, (), fn=Communicator._host_barrier))

    def _host_barrier(self, call: "Call") -> None:
        if "barrier" in self._hot_colls and self._hot_run(call):
            return
        if self._prim.window is not None:
            self._prim.barrier_window()
        else:
            self._dissemination(self._prim, np.zeros(0, dtype=np.uint8))

    def _net_barrier(self, call: "Call", z: Any) -> None:
        prim, seq = self._dev.prim, self._seq
        self._check_capture(call.stream, "barrier")
        self._dev.proxy.enqueue(call.stream, lambda: self._dissemination(prim, z), f"barrier #{seq}")

    def _dissemination(self, prim: Primitives, z: Any) -> None:
        n, r, k = self.size, self.rank, 1
        while k < n:
            prim.exchange([((r + k) % n, z)], [((r - k) % n, z, None)])
            k <<= 1

    # ----- point to point and groups ---------------------------------------------------------------
    def send(self, buf: Any, peer: int, *, stream: Any = None) -> None:
        """Send buf to peer (matched in order with the peer's recv from this rank)."""
        self._p2p_call("send", buf, peer, stream)

    def recv(self, buf: Any, peer: int, *, stream: Any = None) -> Any:
        """Receive from peer into buf (same byte size as the peer's send)."""
        self._p2p_call("recv", buf, peer, stream)
        return buf

    def recv_any(self, buf: Any) -> int:
        """Receive the next message any peer sends this rank (MPI_ANY_SOURCE) into host buf; returns the
        sender. Peers are probed in turn from the one after the last sender, so none is starved."""
        self._alive("recv")
        m = self._memory(buf, "recv")
        if m is not host:
            raise HpcclUnsupported("recv from any source takes host buffers; on GPU buffers name the source "
                                   "rank (NCCL has no receive from any source either)")
        if self._group is not None:
            raise HpcclInvalidUsage("recv from any source inside group(): its sender is known only when it runs")
        flat, _ = m.view(buf, "buf")
        m.writable(flat, "buf")
        peers = [p for p in range(self.size) if p != self.rank]
        if not peers:
            raise HpcclInvalidUsage("recv from any source on a communicator of one rank: no peer can send")
        start = self._any_next % len(peers)
        order = peers[start:] + peers[:start]
        tr = self._prim._transport_of
        got: List[int] = []

        def ready() -> bool:
            for p in order:
                if tr[p].probe(p):
                    got.append(p)
                    return True
            return False

        def run(c: "Communicator", call: "Call") -> None:
            if not ready():
                c._waiter.wait(ready, lambda: [] if got else list(peers))
            c._prim.exchange(recvs=[(got[0], flat, None)], p2p=True)
        self._run(Call("recv(any source)", host, None, 0, (), fn=run))
        self._any_next = peers.index(got[0]) + 1
        return got[0]

    def _p2p_call(self, kind: str, buf: Any, peer: int, stream: Any) -> None:
        self._alive(kind)
        peer = self._rank_arg(peer, "peer")
        m = self._memory(buf, kind)
        flat, _ = m.view(buf, "buf")
        if kind == "recv":
            m.writable(flat, "buf")
        st = m.stream(stream, buf)
        item = (kind, peer, flat, m, st)
        if self._group is not None:
            self._p2p.append(item)
        else:
            self._run_p2p([item])

    def _run_p2p(self, items: List[Tuple[str, int, Any, Any, Any]], what: Optional[str] = None) -> None:
        """Sends and receives run together, host and device each as one Call (no ordering deadlock).
        Messages to self are matched in order with receives from self and must have the same size."""
        self_sends = [x[2] for x in items if x[0] == "send" and x[1] == self.rank]
        self_recvs = [x[2] for x in items if x[0] == "recv" and x[1] == self.rank]
        if len(self_sends) != len(self_recvs) or any(a.nbytes != b.nbytes for a, b in zip(self_sends, self_recvs)):
            raise HpcclInvalidArgument("buf", "sends to this rank itself must pair, in order, with receives from "
                                              "itself of the same size")
        hosts = [x for x in items if x[3] is host]
        devs = [x for x in items if x[3] is not host]
        if hosts:
            sends = [(peer, b) for k, peer, b, _, _ in hosts if k == "send"]
            recvs = [(peer, b, None) for k, peer, b, _, _ in hosts if k == "recv"]
            name = what or (hosts[0][0] if len(hosts) == 1 else "group(send/recv)")
            self._run(Call(name, host, None, 0, (),
                           fn=lambda c, call: c._prim.exchange(sends, recvs, p2p=True)))
        if devs:
            self._run(Call(what or "group(send/recv)", devs[0][3], devs[0][4], 0, tuple(devs),
                           fn=Communicator._device_p2p))

    def _device_p2p(self, call: "Call") -> None:
        """Device sends/receives of one group on the first op's stream; other streams are joined to it
        before (their earlier work) and after (the results), as NCCL ties a group's streams."""
        dev, items, st = self._dev, call.args, call.stream
        others = sorted({x[4] for x in items} - {st})
        import cupy
        rt = cupy.cuda.runtime

        def join(src: int, dst: int) -> None:
            ev = cupy.cuda.Event(block=False, disable_timing=True)
            rt.eventRecord(ev.ptr, src)
            rt.streamWaitEvent(dst, ev.ptr, 0)
        for o in others:
            join(o, st)
        me = self.rank
        sends = [(peer, b) for k, peer, b, _, _ in items if k == "send" and peer != me]
        recvs = [(peer, b) for k, peer, b, _, _ in items if k == "recv" and peer != me]
        mine = zip([b for k, p, b, _, _ in items if k == "send" and p == me],
                   [b for k, p, b, _, _ in items if k == "recv" and p == me])
        for src, dst in mine:  # to self: a copy on the group's stream
            if dst.nbytes:
                rt.memcpyAsync(dst.data.ptr, src.data.ptr, dst.nbytes, 3, st)
        if dev.engine is not None:
            dev.engine.group_p2p(sends, recvs, st)
        elif sends or recvs:
            prim, seq = dev.prim, self._seq
            dev.proxy.enqueue(st, lambda: prim.exchange(sends, [(p, b, None) for p, b in recvs]),
                              f"{call.coll} #{seq}")
        for o in others:
            join(st, o)

    @contextlib.contextmanager
    def group(self) -> Iterator[None]:
        """Like ncclGroupStart/End, for host and device buffers alike: sends and receives inside run
        together at the end (no deadlock from ordering); collectives inside run after them, in call
        order. Nothing inside runs before the group ends."""
        self._alive("group")
        outer = self._group_depth == 0
        eng = self._dev.engine if outer and self._dev is not None else None
        if outer:
            self._group, self._p2p = [], []
            if eng is not None:
                eng.fs.held += 1  # compiled replays (the torch backend's) queue nothing: they step aside
        self._group_depth += 1
        try:
            yield
        except BaseException:
            if outer:
                self._group, self._p2p = None, []
            raise
        finally:
            self._group_depth -= 1
            if eng is not None:
                eng.fs.held -= 1
        if outer:
            calls, p2p = self._group, self._p2p
            self._group, self._p2p = None, []
            for call in calls:  # a graph-capture refusal comes before anything of the group is enqueued
                if call.mem is not host and call.stream is not None:
                    self._check_capture(call.stream, call.coll)
            if p2p:
                self._run_p2p(p2p)
            for call in calls:
                self._run(call)

    # ----- sub-communicators for hierarchical algorithms ----------------------------------------------
    def _subcomm(self, kind: str) -> Optional["Communicator"]:
        """'intra': the ranks of this node; 'inter': one rank per node with the same local rank."""
        if kind not in self._sub:
            color = self.node if kind == "intra" else self.local_rank
            token = _STEPS_OF.set((self._rec, kind))  # its calls are steps of this communicator's calls
            try:
                c = self._split(color, self.rank, f"{kind}{self.node}" if kind == "intra" else None)
            finally:
                _STEPS_OF.reset(token)
            c.parent_ranks = (self.nodes.ranks_on(self.node) if kind == "intra" else
                              [r for r in range(self.size) if self.nodes.local_rank(r) == self.local_rank])
            c._parent = self
            self._sub[kind] = c
        sub = self._sub[kind]
        if self._dev is not None and sub.cuda_device is None:
            sub.cuda_device = self._dev.device  # 'inter' has local rank 0 everywhere: never guess from it
            # every rank of this communicator on one GPU, not just the sub-communicator's, shares it:
            # the node kernels are sized from that (hpccl/cuda_comm.py, block_cap); collective here
            sub.gpu_share = self._dev.gpu_share(self._boot)
        return sub


class Call:
    """One validated collective (or group of sends/receives): what the front end hands to an algorithm.
    ``finish`` is the output avg divides at the end; ``key`` the device fast path's snapshot key."""

    __slots__ = ("coll", "mem", "stream", "nbytes", "args", "op", "finish", "key", "fn")

    def __init__(self, coll: str, mem: Any, stream: Any, nbytes: int, args: tuple, op: Any = None,
                 finish: Any = None, key: Any = None, fn: Optional[Callable] = None) -> None:
        self.coll, self.mem, self.stream, self.nbytes, self.args = coll, mem, stream, nbytes, args
        self.op, self.finish, self.key = op, finish, key
        self.fn = fn or Communicator._collective


def _in_call(exc: HpcclError) -> HpcclError:
    """A hier network step's error raised after its call returned (by synchronize, from a held stream's
    step): named after the user's call and the step, as recorded when the step was enqueued, like the
    error of a step that fails inside its call (Communicator._as_call, which also surveys the peers)."""
    at = getattr(exc, "in_call", None)
    if at is None:
        return exc
    coll, seq, step = at
    where = f"in its hierarchical {step}"
    if isinstance(exc, HpcclTimeoutError):
        return HpcclTimeoutError(coll, seq, exc.missing, config.get("HPCCL_TIMEOUT"), where)
    if isinstance(exc, HpcclRemoteError) and exc.rank is not None:
        return HpcclRemoteError.aborted(coll, seq, exc.rank, exc.awaited, f"; {where}")
    return exc


def _on_device(device: int) -> Optional[int]:
    """Make ``device`` the calling thread's current GPU (its context is the one hpccl's kernels were loaded
    in: launching them from another GPU's context fails with CUDA_ERROR_INVALID_HANDLE); returns the GPU
    to go back to afterwards, or None when it already was current."""
    import cupy
    rt = cupy.cuda.runtime
    cur = rt.getDevice()
    if cur == device:
        return None
    rt.setDevice(device)
    return cur


def _mpi_null() -> Any:
    from mpi4py import MPI
    return MPI.COMM_NULL


def init(mpi_comm: Any = None, **kwargs: Any) -> Communicator:
    """A communicator over MPI.COMM_WORLD (or the given mpi4py communicator)."""
    return Communicator(mpi_comm, **kwargs)
