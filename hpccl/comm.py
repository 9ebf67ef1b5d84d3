"""The Communicator: validates calls, picks an algorithm, runs it over primitives, reports failures."""
from __future__ import annotations

import contextlib
import os
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple, Union

import numpy as np

from . import config, log
from .algorithms import ALGORITHMS
from .algorithms import hier
from .bootstrap import MpiBootstrap
from .errors import HpcclError, HpcclInvalidArgument, HpcclInvalidUsage, HpcclUnsupported
from .interop import CUDA, HOST, host_view, memory_kind, writable
from .memory import host
from .ops import AVG, SUM, SUPPORTED, ReduceOp, as_op, check_op_dtype
from .primitives import Primitives
from .progress import Waiter
from .topology import NodeMap, detect_nodes
from .topology.nodes import node_name
from .transport.base import Transport
from .transport.mpi import MpiTransport
from .transport.shm import ShmTransport

OpLike = Union[ReduceOp, str]


class Communicator:
    """A group of ranks that run collectives together, like an ncclComm_t, built over an MPI communicator."""

    def __init__(self, mpi_comm: Any = None, *, node_id: Optional[str] = None) -> None:
        t0 = time.perf_counter()
        self._boot = MpiBootstrap(mpi_comm)
        self.rank, self.size = self._boot.rank, self._boot.size
        log.set_rank(self._boot.world_rank)
        self._destroyed = False
        self._aborted = False
        self._seq = 0
        self._group: Optional[List[Tuple[str, Callable[[], None]]]] = None
        self._group_depth = 0
        self._p2p: List[Tuple[str, int, np.ndarray]] = []
        self._sub: Dict[str, "Communicator"] = {}
        self._node_override = node_id
        self._cuda: Any = None
        self._eligible: Dict[str, List[str]] = {}
        self._trace = log.tracing()

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
        shm = None
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
                              [q for q in range(self.size) if q != self.rank], self._arrived, self._peer_aborted, self._on_fail)
        self._prim = Primitives(self.rank, self.size, transport_of, window, self._waiter, host)
        if window is not None:  # single-copy algorithms only if every rank can read its peers
            want = config.get("HPCCL_SINGLE_COPY") and shm.cma_ok
            self._prim.single_copy = all(self._boot.allgather(want))
        from .tuning import Tuner
        self._tuner = Tuner(self._path, self.size, self.local_size, self.num_nodes)
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
        if self.num_nodes == 1 and config.get("HPCCL_TRANSPORT") != "mpi":
            return None
        want = config.get("HPCCL_NET")
        if want not in ("", "ucx", "mpi"):
            raise HpcclInvalidArgument("HPCCL_NET", f"{want!r} is not ucx or mpi")
        t: Optional[Transport] = None
        if self.num_nodes > 1 and want in ("", "ucx"):
            try:
                from .transport.ucx import UcxTransport
            except ImportError as exc:
                if want == "ucx":
                    raise HpcclUnsupported(f"HPCCL_NET=ucx but the UCX transport cannot load: {exc}") from None
            else:
                t = UcxTransport(self._boot, self.rank)
        if t is None:
            t = MpiTransport(self._boot.comm.Dup())
        self._transports.append(t)
        return t

    def _check_env(self, shm: Optional[ShmTransport]) -> None:
        try:
            from .envcheck import check_environment
        except ImportError:
            return
        need = shm.segment_bytes * self.local_size if shm is not None else 0
        for msg in check_environment(need, self.local_size, False):
            log.warn("ENV", "%s", msg)

    def _arrived(self, peer: int) -> Optional[int]:
        for t in self._transports:
            s = t.arrived(peer)
            if s is not None:
                return s
        return None

    def _peer_aborted(self) -> Optional[int]:
        for t in self._transports:
            r = t.peer_aborted()
            if r is not None:
                return r
        return None

    def _on_fail(self) -> None:
        self.abort()

    # ----- properties and life cycle ---------------------------------------------------------------
    @property
    def mpi_comm(self) -> Any:
        """hpccl's private duplicate of the MPI communicator it was built on."""
        return self._boot.comm

    def split(self, color: int, key: int = 0) -> Optional["Communicator"]:
        """A new communicator per color, ranks ordered by key (like MPI_Comm_split); None for color < 0."""
        self._alive("split")
        sub = self._boot.split(color, key)
        from mpi4py import MPI
        if sub == MPI.COMM_NULL:
            return None
        try:
            return Communicator(sub, node_id=self._node_override)
        finally:
            sub.Free()

    def abort(self) -> None:
        """Mark this communicator failed and tell local peers, so they stop waiting."""
        if not self._aborted:
            self._aborted = True
            for t in self._transports:
                t.abort()

    def destroy(self) -> None:
        """Release shared memory, endpoints and the private MPI communicator; safe to call twice."""
        if self._destroyed:
            return
        if self._cuda is not None:
            self._cuda.close()
            self._cuda = None
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
            raise HpcclInvalidUsage(f"{what} called on an aborted communicator (an earlier call failed)")

    def _rank_arg(self, value: int, name: str) -> int:
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or not 0 <= value < self.size:
            raise HpcclInvalidArgument(name, f"{value!r} is not a rank of this communicator (0..{self.size - 1})")
        return int(value)

    @staticmethod
    def _view(obj: Any, name: str) -> Tuple[np.ndarray, np.ndarray]:
        if type(obj) is np.ndarray and obj.flags.c_contiguous and obj.dtype in SUPPORTED:
            return (obj if obj.ndim == 1 else obj.reshape(-1)), obj  # the common case, checked cheaply
        if memory_kind(obj) != HOST:
            raise HpcclUnsupported(f"argument '{name}': GPU buffers need hpccl's CUDA path "
                                   "(pip install hpccl[cuda]) and a GPU")
        return host_view(obj, name)

    def _out(self, obj: Any, like: np.ndarray, count: int, name: str) -> Tuple[np.ndarray, Any]:
        """Validate (or allocate) an output buffer of ``count`` elements of ``like``'s dtype."""
        if obj is None:
            arr = np.empty(count, dtype=like.dtype)
            return arr, arr
        flat, _ = self._view(obj, name)
        writable(flat, name)
        if flat.dtype != like.dtype:
            raise HpcclInvalidArgument(name, f"dtype {flat.dtype} differs from sendbuf's {like.dtype}")
        if flat.size != count:
            raise HpcclInvalidArgument(name, f"has {flat.size} elements, needs {count}")
        return flat, obj

    # ----- running ---------------------------------------------------------------------------------
    def algorithms(self, coll: str) -> List[str]:
        """The algorithms this communicator can run for ``coll`` (window ones need one shm node)."""
        names = self._eligible.get(coll)
        if names is None:
            names = [a for a, spec in ALGORITHMS[coll].items()
                     if (not spec.needs_window or self._prim.window is not None)
                     and (not spec.needs_single_copy or self._prim.single_copy)]
            if self.num_nodes > 1 and hier.supports(self, coll):
                names.append("hier")
            self._eligible[coll] = names
        return names

    def _run(self, coll: str, fn: Callable[[], None]) -> None:
        self._seq += 1
        self._waiter.collective, self._waiter.seq = coll, self._seq
        for t in self._transports:
            t.announce(self._seq)
        try:
            fn()
        except HpcclError:
            self.abort()
            raise

    def _submit(self, coll: str, fn: Callable[[], None]) -> None:
        if self._group is not None:
            self._group.append((coll, fn))
        else:
            self._run(coll, fn)

    def _dispatch(self, coll: str, nbytes: int, *args: Any) -> None:
        algo = self._tuner.choose(coll, nbytes, self.algorithms(coll))
        if self._trace:
            log.trace("COLL", "%s #%d %d B algo %s", coll, self._seq, nbytes, algo)
        if algo == "hier":
            hier.run(self, coll, *args)
        else:
            ALGORITHMS[coll][algo].fn(self._prim, *args)

    # ----- collectives -----------------------------------------------------------------------------
    def all_reduce(self, sendbuf: Any, recvbuf: Any = None, op: OpLike = SUM, *, stream: Any = None) -> Any:
        """recvbuf = sendbuf reduced over all ranks; in place (into sendbuf) when recvbuf is None."""
        self._alive("all_reduce")
        op = as_op(op)
        if memory_kind(sendbuf) == CUDA:
            return self._cuda_comm().all_reduce(sendbuf, recvbuf, op, stream)
        send, _ = self._view(sendbuf, "sendbuf")
        check_op_dtype(op, send.dtype)
        if recvbuf is None:
            writable(send, "sendbuf")
            recv, result = send, sendbuf
        else:
            recv, result = self._out(recvbuf, send, send.size, "recvbuf")
        if send.size == 0:
            return result
        if send is not recv and _may_overlap(send, recv) and np.shares_memory(send, recv):
            send = recv if _same(send, recv) else send.copy()
        op_ = op

        def go() -> None:
            self._dispatch("all_reduce", send.nbytes, send, recv, op_)
            if op_ is AVG:
                host.scale_avg(recv, self.size)
        self._submit("all_reduce", go)
        return result

    def reduce(self, sendbuf: Any, recvbuf: Any = None, root: int = 0, op: OpLike = SUM, *,
               stream: Any = None) -> Any:
        """The reduction over all ranks lands in recvbuf (or sendbuf, if None) on root only."""
        self._alive("reduce")
        root = self._rank_arg(root, "root")
        op = as_op(op)
        if memory_kind(sendbuf) == CUDA:
            return self._cuda_comm().reduce(sendbuf, recvbuf, root, op, stream)
        send, _ = self._view(sendbuf, "sendbuf")
        check_op_dtype(op, send.dtype)
        if self.rank == root:
            if recvbuf is None:
                writable(send, "sendbuf")
                recv, result = send, sendbuf
            else:
                recv, result = self._out(recvbuf, send, send.size, "recvbuf")
        else:
            recv = self._out(recvbuf, send, send.size, "recvbuf")[0] if recvbuf is not None else send
            result = recvbuf
        if send.size == 0:
            return result
        if self.rank == root and np.shares_memory(send, recv) and not _same(send, recv):
            send = send.copy()
        if self.rank != root:
            recv = send  # algorithms never write a non-root's output

        def go() -> None:
            self._dispatch("reduce", send.nbytes, send, recv, root, op)
            if self.rank == root:
                host.finish(recv, op, self.size)
        self._submit("reduce", go)
        return result

    def broadcast(self, buf: Any, root: int = 0, *, recvbuf: Any = None, stream: Any = None) -> Any:
        """Root's buf reaches every rank: in place in buf, or into recvbuf when given."""
        self._alive("broadcast")
        root = self._rank_arg(root, "root")
        if memory_kind(buf) == CUDA:
            return self._cuda_comm().broadcast(buf, root, recvbuf, stream)
        send, _ = self._view(buf, "buf")
        if recvbuf is None:
            if self.rank != root:
                writable(send, "buf")
            recv, result = send, buf
        else:
            recv, result = self._out(recvbuf, send, send.size, "recvbuf")
        if send.size == 0:
            return result
        if np.shares_memory(send, recv) and not _same(send, recv):
            send = send.copy()
        self._submit("broadcast", lambda: self._dispatch("broadcast", send.nbytes, send, recv, root))
        return result

    def all_gather(self, sendbuf: Any, recvbuf: Any = None, *, stream: Any = None) -> Any:
        """recvbuf holds every rank's sendbuf in rank order (size x count); allocated when None.
        In place when sendbuf is recvbuf's own block (recvbuf[rank*count:(rank+1)*count])."""
        self._alive("all_gather")
        if memory_kind(sendbuf) == CUDA:
            return self._cuda_comm().all_gather(sendbuf, recvbuf, stream)
        send, shaped = self._view(sendbuf, "sendbuf")
        if recvbuf is None:
            out = np.empty((self.size,) + shaped.shape, dtype=send.dtype)
            recv, result = out.reshape(-1), out
        else:
            recv, result = self._out(recvbuf, send, send.size * self.size, "recvbuf")
        if send.size == 0:
            return result
        c = send.size
        if np.shares_memory(send, recv):
            mine = recv[self.rank * c:(self.rank + 1) * c]
            if not _same(send, mine):
                send = send.copy()
            else:
                send = mine
        self._submit("all_gather", lambda: self._dispatch("all_gather", recv.nbytes, send, recv))
        return result

    def reduce_scatter(self, sendbuf: Any, recvbuf: Any = None, op: OpLike = SUM, *,
                       stream: Any = None) -> Any:
        """recvbuf (count) = block ``rank`` of sendbuf (size x count) reduced over all ranks."""
        self._alive("reduce_scatter")
        op = as_op(op)
        if memory_kind(sendbuf) == CUDA:
            return self._cuda_comm().reduce_scatter(sendbuf, recvbuf, op, stream)
        send, _ = self._view(sendbuf, "sendbuf")
        check_op_dtype(op, send.dtype)
        if send.size % self.size:
            raise HpcclInvalidArgument("sendbuf", f"has {send.size} elements, not a multiple of the "
                                                  f"communicator size {self.size}")
        c = send.size // self.size
        recv, result = self._out(recvbuf, send, c, "recvbuf")
        if c == 0:
            return result
        if np.shares_memory(send, recv) and not _same(recv, send[self.rank * c:(self.rank + 1) * c]):
            send = send.copy()

        def go() -> None:
            self._dispatch("reduce_scatter", send.nbytes, send, recv, op)
            host.finish(recv, op, self.size)
        self._submit("reduce_scatter", go)
        return result

    def all_to_all(self, sendbuf: Any, recvbuf: Any = None, *, stream: Any = None) -> Any:
        """Block j of rank i's sendbuf becomes block i of rank j's recvbuf."""
        self._alive("all_to_all")
        if memory_kind(sendbuf) == CUDA:
            return self._cuda_comm().all_to_all(sendbuf, recvbuf, stream)
        send, _ = self._view(sendbuf, "sendbuf")
        if send.size % self.size:
            raise HpcclInvalidArgument("sendbuf", f"has {send.size} elements, not a multiple of the "
                                                  f"communicator size {self.size}")
        recv, result = self._out(recvbuf, send, send.size, "recvbuf")
        if send.size == 0:
            return result
        if np.shares_memory(send, recv):
            send = send.copy()
        self._submit("all_to_all", lambda: self._dispatch("all_to_all", send.nbytes, send, recv))
        return result

    def barrier(self, *, stream: Any = None) -> None:
        """Return once every rank has called barrier."""
        self._alive("barrier")
        if stream is not None:
            self._cuda_comm().barrier(stream)
            return

        def go() -> None:
            if self._prim.window is not None:
                self._prim.barrier_window()
            else:
                z = np.zeros(0, dtype=np.uint8)
                n, r, k = self.size, self.rank, 1
                while k < n:  # dissemination
                    self._prim.exchange([((r + k) % n, z)], [((r - k) % n, z, None)])
                    k <<= 1
        self._submit("barrier", go)

    # ----- point to point and groups ---------------------------------------------------------------
    def send(self, buf: Any, peer: int, *, stream: Any = None) -> None:
        """Send buf to peer (matched in order with the peer's recv from this rank)."""
        self._alive("send")
        peer = self._rank_arg(peer, "peer")
        if memory_kind(buf) == CUDA:
            if self._group is not None:
                self._p2p.append(("send", peer, buf))
                return
            return self._cuda_comm().send(buf, peer, stream)
        flat, _ = self._view(buf, "buf")
        if self._group is not None:
            self._p2p.append(("send", peer, flat))
        else:
            self._run("send", lambda: self._prim.send(peer, flat))

    def recv(self, buf: Any, peer: int, *, stream: Any = None) -> Any:
        """Receive from peer into buf (same byte size as the peer's send)."""
        self._alive("recv")
        peer = self._rank_arg(peer, "peer")
        if memory_kind(buf) == CUDA:
            if self._group is not None:
                self._p2p.append(("recv", peer, buf))
                return buf
            return self._cuda_comm().recv(buf, peer, stream)
        flat, _ = self._view(buf, "buf")
        writable(flat, "buf")
        if self._group is not None:
            self._p2p.append(("recv", peer, flat))
        else:
            self._run("recv", lambda: self._prim.recv(peer, flat))
        return buf

    @contextlib.contextmanager
    def group(self) -> Iterator[None]:
        """Like ncclGroupStart/End: sends and receives inside run together at the end (no deadlock
        from ordering); collectives inside run after them, in call order."""
        self._alive("group")
        outer = self._group_depth == 0
        if outer:
            self._group, self._p2p = [], []
        self._group_depth += 1
        try:
            yield
        except BaseException:
            if outer:
                self._group, self._p2p = None, []
            raise
        finally:
            self._group_depth -= 1
        if outer:
            ops, p2p = self._group, self._p2p
            self._group, self._p2p = None, []
            dev = [x for x in p2p if not isinstance(x[2], np.ndarray)]
            p2p = [x for x in p2p if isinstance(x[2], np.ndarray)]
            if dev:
                self._cuda_comm().group_p2p([(peer, b) for kind, peer, b in dev if kind == "send"],
                                            [(peer, b) for kind, peer, b in dev if kind == "recv"], None)
            if p2p:
                sends = [(peer, b) for kind, peer, b in p2p if kind == "send"]
                recvs = [(peer, b, None) for kind, peer, b in p2p if kind == "recv"]
                self._run("group(send/recv)", lambda: self._prim.exchange(sends, recvs))
            for coll, fn in ops:
                self._run(coll, fn)

    def _cuda_comm(self):
        """The GPU side of this communicator (peer memory, kernels), built on first use."""
        if self._cuda is None:
            from .cuda_comm import CudaComm
            self._cuda = CudaComm(self)
        return self._cuda

    # ----- sub-communicators for hierarchical algorithms ----------------------------------------------
    def _subcomm(self, kind: str) -> Optional["Communicator"]:
        """'intra': the ranks of this node; 'inter': one rank per node with the same local rank."""
        if kind not in self._sub:
            color = self.node if kind == "intra" else self.local_rank
            sub = self._boot.split(color, self.rank)
            self._sub[kind] = Communicator(sub, node_id=f"{kind}{self.node}" if kind == "intra" else None)
            sub.Free()
        return self._sub[kind]


def _may_overlap(a: np.ndarray, b: np.ndarray) -> bool:
    """Cheap first test: two arrays that each own their memory cannot overlap."""
    return not (a.base is None and b.base is None) and np.may_share_memory(a, b)


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    """The two views cover exactly the same memory."""
    return (a.size == b.size and a.dtype == b.dtype
            and a.__array_interface__["data"][0] == b.__array_interface__["data"][0])


def init(mpi_comm: Any = None, **kwargs: Any) -> Communicator:
    """A communicator over MPI.COMM_WORLD (or the given mpi4py communicator)."""
    return Communicator(mpi_comm, **kwargs)
