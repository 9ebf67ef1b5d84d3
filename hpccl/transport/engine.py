"""The network between nodes through hpccl's native engine (hpccl._netengine, hpccl/csrc/_netcore.c): one UCP worker per
communicator driven by a C progress thread that never takes the GIL and never calls CUDA.

Host collectives post their sends and receives here (the same ring serves every transport); GPU network
steps reach the same engine staged through pinned host memory (hpccl/gpu/netstep.py), ordered on the caller's
stream. Because the thread always progresses, a peer whose connection breaks (a process killed, a node
lost) is noticed at once: endpoints to other nodes use UCX's peer-failure mode, and every survivor names
the rank. Control messages (abort, "which call are you in?") ride a reserved tag (control.ControlChannel).

Set-up is collective and fails on every rank at once, never a hang: a UCX that cannot start, a
UCX_NET_DEVICES that names no usable device, or ring neighbours that cannot exchange a byte raise an
error naming the ranks and the variables to check."""
from __future__ import annotations

import os
import re
import time
from typing import Any, Dict, Iterator, List, Optional, Tuple

import numpy as np

from .. import config, log
from ..errors import (HpcclEnvironmentError, HpcclError, HpcclInvalidUsage, HpcclRemoteError,
                      HpcclSystemError)
from ..ops import ReduceOp
from .. import memory
from .base import Request, Transport
from .control import ControlChannel
from .ucx_config import _device_problem, _tls, collective_check, wire_config, wire_text, wireup_limit


def load() -> Any:
    """The compiled engine module, with UCX's libraries loaded first (from the libucx wheel, or the
    system's when RAPIDS_LIBUCX_PREFER_SYSTEM_LIBRARY is set). Raises ImportError naming the fix."""
    try:
        import libucx
        libucx.load_library()
    except ImportError:
        pass  # a system UCX found through the engine's rpath or the loader's path
    except Exception as exc:  # noqa: BLE001 - a broken wheel
        raise ImportError(f"the libucx wheel could not load UCX: {exc}") from None
    try:
        from .. import _netengine
    except ImportError as exc:
        raise ImportError(f"hpccl's network engine is not available ({exc}); reinstall hpccl where UCX headers "
                          "are found (the libucx-cu13 wheel, UCX_HOME or pkg-config ucx) and a C compiler "
                          "exists") from None
    return _netengine


_ne = load()
_CODES = {_ne.E_PEER: "peer", _ne.E_TIMEOUT: "timeout", _ne.E_ABORT: "abort", _ne.E_SIZE: "size",
          _ne.E_CLOSED: "closed"}


def engine_error(args: Tuple[int, int, str], what: str = "") -> HpcclError:
    """The HpcclError for an engine failure (code, peer, message)."""
    code, peer, msg = args
    text = f"{what}: {msg}" if what else msg
    kind = _CODES.get(code, "other")
    if kind == "size":
        return HpcclInvalidUsage(text)
    if kind == "peer" or (kind == "abort" and peer >= 0):
        return HpcclRemoteError(text, rank=peer if peer >= 0 else None)
    exc = HpcclSystemError(text)
    exc.aborted = kind == "abort"  # by an abort whose origin this engine was not told (failures.in_call)
    return exc


# A waiter's first HPCCL_SPIN polls come before its first look at the clock (progress.Waiter.wait); each
# poll blocks here once, so while a request is that young it blocks this briefly at most (still driving
# progress from the caller's thread): the spin costs HPCCL_SPIN x this, not HPCCL_SPIN x the waiter's nap,
# which would push every timeout, abort and survey seconds past HPCCL_TIMEOUT.
SPIN_BLOCK_S = 2e-5


class _Req(Request):
    """A send, or a receive straight into its buffer."""

    __slots__ = ("peer", "op", "t", "done", "blocks")

    def __init__(self, t: "EngineTransport", peer: int, op: Any) -> None:
        self.t, self.peer, self.op, self.done = t, peer, op, False
        self.blocks = 0

    def test(self) -> bool:
        if self.done:
            return True
        try:
            if not self.op.test():
                return False
        except _ne.EngineError as exc:
            raise self.t._failed(self.peer, exc.args) from None
        self._finish()
        self.done = True
        return True

    def block(self, seconds: float) -> None:
        """Sleep (without the GIL) until this request ends or ``seconds`` pass (SPIN_BLOCK_S at most
        for the first HPCCL_SPIN calls: the waiter's spin)."""
        if not self.done:
            if self.blocks < self.t.spin:
                self.blocks += 1
                seconds = min(seconds, SPIN_BLOCK_S)
            try:
                self.op.wait(seconds)
            except _ne.EngineError:
                pass  # test() raises it

    def _finish(self) -> None:
        self.op = None


class _ReduceReq(_Req):
    """A receive into scratch memory that then reduces: buf = src op incoming."""

    __slots__ = ("buf", "tmp", "rop", "src")

    def __init__(self, t: "EngineTransport", peer: int, op: Any, buf: np.ndarray, tmp: np.ndarray,
                 rop: ReduceOp, src: Optional[np.ndarray]) -> None:
        super().__init__(t, peer, op)
        self.buf, self.tmp, self.rop = buf, tmp, rop
        self.src = buf if src is None else src

    def _finish(self) -> None:
        memory.reduce(self.buf, self.src, self.tmp, self.rop)
        self.t._give_back(self.tmp)
        self.op = self.tmp = self.src = self.buf = None


def _bytes(buf: np.ndarray) -> np.ndarray:
    """A host buffer as bytes (any dtype, bfloat16 included, exports as uint8)."""
    return buf.view(np.uint8) if buf.dtype.itemsize != 1 or buf.dtype.kind not in "ui" else buf


def net_hot(t: "EngineTransport", cap: int, spin: int) -> Any:
    """hpccl/csrc/_nethot.c over this transport's engine: small host collectives across nodes in one C call."""
    return _ne.NetHot(t.eng, cap, cap, spin, lambda code, peer, msg: t._failed(peer, (code, peer, msg)))


class EngineTransport(ControlChannel, Transport):
    """Tagged messages to every other rank of the communicator through the native engine (collective)."""

    name = "ucx"  # the same wire, priced as such by the tuner
    impl = "engine"

    def __init__(self, bootstrap: Any, rank: int, nodes: List[int]) -> None:
        self.rank, self.size = rank, bootstrap.size
        self._boot = bootstrap
        self.eng: Any = None
        self.lanes: List[Any] = []  # self.eng, then the engines add_lanes() made
        self._nodes = list(nodes)
        self._pool: Dict[tuple, List[np.ndarray]] = {}
        self._closed = False
        self._in_service = False  # set up on every rank: only then does close say goodbye to the peers
        self._origin: Optional[int] = None  # the rank this rank's own abort named (abort(origin))
        self.spin = max(0, config.get("HPCCL_SPIN"))  # the waiter's polls before it reads the clock
        self.error_handling = True  # endpoints to other nodes always detect a lost peer
        t0 = time.perf_counter()
        tls = _tls()
        self.tls = tls or "all"
        self.wire = wire_config()
        cfg: Dict[str, str] = dict(self.wire)
        if "UCX_KEEPALIVE_INTERVAL" not in os.environ:
            # UCX's TCP transport may notice a peer's closed connection only at its next keepalive round
            # (20 s by default) when this rank only receives from it: 1 s names a killed peer in time
            cfg["KEEPALIVE_INTERVAL"] = "1s"
        if tls and os.environ.get("UCX_TLS") != tls:
            cfg["TLS"] = tls
        elif not tls and "UCX_TLS" in os.environ:  # an empty UCX_TLS selects nothing, to UCX
            cfg["TLS"] = "all"
        extra = dict(config.get("HPCCL_UCX_CONFIG"))
        cfg.update(extra)
        problem: Optional[str] = None
        address = b""
        self._cfg = cfg
        try:
            try:
                self.eng = _ne.Engine(rank, self.size, cfg)
            except ValueError as exc:
                if any(f"setting {k}=" in str(exc) for k in extra):
                    raise RuntimeError(f"HPCCL_UCX_CONFIG: {exc}") from None
                # a UCX that rejects the TCP settings: its defaults
                log.warn("TRANSPORT", "UCX refused hpccl's TCP settings %s (%s); using UCX's defaults "
                         "(HPCCL_UCX_TCP_TUNE=0 silences this)", self.wire, exc)
                self.wire = {}
                self._cfg = {k: v for k, v in cfg.items() if k in ("TLS", "KEEPALIVE_INTERVAL") or k in extra}
                self.eng = _ne.Engine(rank, self.size, self._cfg)
            problem = _device_problem(self.eng.info())
            if problem is None:
                address = self.eng.address()
        except Exception as exc:  # noqa: BLE001 - RuntimeError/ImportError from the engine
            problem = f"UCX set-up failed: {type(exc).__name__}: {exc} (UCX_TLS={self.tls}, " \
                      f"UCX_NET_DEVICES={os.environ.get('UCX_NET_DEVICES', '<unset>')})"
        self._collective_check(problem, HpcclEnvironmentError)
        addresses = bootstrap.allgather(address)
        problem = None
        try:
            self.eng.connect(list(addresses), [nodes[p] != nodes[rank] for p in range(self.size)])
        except Exception as exc:  # noqa: BLE001
            problem = f"UCX endpoints could not be made: {exc}"
        self._collective_check(problem, HpcclSystemError)
        self.lanes = [self.eng]
        self._control_init()
        self._wireup()
        self._in_service = True
        log.info("TRANSPORT", "ucx engine: rank %d/%d, UCX_TLS=%s, UCX %s, TCP settings %s, ready in %.3fs",
                 rank, self.size, self.tls, ".".join(map(str, _ne.version()[0])),
                 wire_text(self.wire),
                 time.perf_counter() - t0)

    # ----- set-up ------------------------------------------------------------------------------------
    def _collective_check(self, problem: Optional[str], kind: type) -> None:
        collective_check(self._boot, problem, kind, "UCX engine", self.close)

    def _wireup(self) -> None:
        """One byte each way with both ring neighbours, under a deadline: a path that connects but cannot
        carry data (firewall, wrong interface) fails at init, on every rank."""
        peers = sorted({(self.rank + 1) % self.size, (self.rank - 1) % self.size} - {self.rank})
        if not peers:
            return
        one = np.zeros(len(peers), dtype=np.uint8)
        got = np.ones(len(peers), dtype=np.uint8)
        reqs = [self.irecv(p, got[i:i + 1], None) for i, p in enumerate(peers)]
        reqs += [self.isend(p, one[i:i + 1]) for i, p in enumerate(peers)]
        limit = wireup_limit()
        deadline = time.monotonic() + limit
        problem = None
        try:
            while reqs:
                reqs = [r for r in reqs if not r.test()]
                if reqs and time.monotonic() > deadline:
                    problem = (f"no UCX traffic from/to rank(s) {sorted({r.peer for r in reqs})} within {limit:g}s "
                               f"(UCX_TLS={self.tls}, UCX_NET_DEVICES={os.environ.get('UCX_NET_DEVICES', '<unset>')})")
                    break
                if reqs:
                    reqs[0].block(0.01)
        except HpcclError as exc:
            problem = exc.message
        self._collective_check(problem, HpcclSystemError)

    # ----- data path ---------------------------------------------------------------------------------
    def isend(self, peer: int, buf: np.ndarray, p2p: bool = False) -> Request:
        return _Req(self, peer, self.eng.send(peer, _bytes(buf), 0.0, p2p))

    def irecv(self, peer: int, buf: np.ndarray, op: Optional[ReduceOp], src: Any = None,
              p2p: bool = False) -> Request:
        """Receive into ``buf``; with ``op``, into a scratch buffer, then buf = (src or buf) op incoming."""
        if not isinstance(buf, np.ndarray):
            raise HpcclSystemError("the network engine moves host memory; device buffers go through staged "
                                   "network steps (hpccl.gpu.netstep)")
        if op is None:
            return _Req(self, peer, self.eng.recv(peer, _bytes(buf), 0.0, p2p))
        tmp = self._take(buf)
        return _ReduceReq(self, peer, self.eng.recv(peer, _bytes(tmp), 0.0, p2p), buf, tmp, op, src)

    def probe(self, peer: int) -> bool:
        return self.eng.probe(peer)

    def _take(self, like: np.ndarray) -> np.ndarray:
        free = self._pool.get((like.dtype.str, like.size))
        return free.pop() if free else np.empty_like(like)

    def _give_back(self, tmp: np.ndarray) -> None:
        free = self._pool.setdefault((tmp.dtype.str, tmp.size), [])
        if len(free) < 4:
            free.append(tmp)

    def _failed(self, peer: int, args: Tuple[int, int, str]) -> HpcclError:
        code = args[0]
        if code in (_ne.E_PEER, _ne.E_ABORT):
            # a peer that aborted before it left said who failed first: read that before blaming the peer
            end = time.monotonic() + 0.05
            while self._aborted_by is None and time.monotonic() < end:
                self._poll()
                time.sleep(1e-3)
            if self._aborted_by is not None and self._aborted_by != peer and self._aborted_by != self.rank:
                return HpcclRemoteError(f"rank {self._aborted_by} failed and the communicator was aborted "
                                        f"(then: {args[2]})", rank=self._aborted_by)
            if code == _ne.E_PEER:
                return HpcclRemoteError(f"UCX transfer with rank {peer} failed: {args[2]} (rank {peer} may "
                                        "have died)", rank=args[1] if args[1] >= 0 else peer)
            if args[1] < 0 and self._origin is not None and self._origin != self.rank:
                # this rank's own abort passed another rank's failure on (the engine keeps only origins
                # that are ranks of its own): name that rank, not "aborted"
                return HpcclRemoteError(f"rank {self._origin} failed and the communicator was aborted "
                                        f"(then: {args[2]})", rank=self._origin)
        return engine_error(args)

    @property
    def _seq(self) -> int:  # kept in the engine, where the compiled path across nodes sets it too
        return self.eng.seq if self.eng is not None else 0

    @_seq.setter
    def _seq(self, seq: int) -> None:
        if self.eng is not None:
            self.eng.seq = seq

    def dead_peer(self) -> Optional[Tuple[int, str]]:
        return None if self.eng is None or self._closed else self.eng.dead()

    # ----- control channel -----------------------------------------------------------------------------
    def _ctrl_live(self) -> bool:
        return not self._closed and self.eng is not None

    def _ctrl_send(self, peer: int, msg: np.ndarray) -> Any:
        try:
            return self.eng.ctrl_send(peer, int(msg[0]), int(msg[1]), int(msg[2]))
        except Exception:  # noqa: BLE001 - closed, or a peer out of range: it cannot be told
            return None

    @staticmethod
    def _ctrl_done(req: Any) -> bool:
        return req.ended()

    def _ctrl_arrived(self) -> Iterator[Optional[np.ndarray]]:
        for m in self.eng.ctrl_poll():
            yield np.array(m, dtype=np.int64)

    def add_lanes(self, n: int) -> List[Any]:
        """n more engines connected to every peer (lanes for GPU network steps, hpccl/gpu/netstep.py), made
        with this engine's UCX settings; collective. Closed and aborted with this transport."""
        engs: List[Any] = []
        problem: Optional[str] = None
        try:
            for _ in range(n):
                engs.append(_ne.Engine(self.rank, self.size, dict(self._cfg)))
        except Exception as exc:  # noqa: BLE001
            problem = f"a lane's UCX worker could not be made: {exc}"
        self._collective_check(problem, HpcclSystemError)
        for e in engs:
            addresses = self._boot.allgather(e.address())
            problem = None
            try:
                e.connect(list(addresses), [self._nodes[p] != self._nodes[self.rank] for p in range(self.size)])
            except Exception as exc:  # noqa: BLE001
                problem = f"a lane's UCX endpoints could not be made: {exc}"
            self._collective_check(problem, HpcclSystemError)
            self.lanes.append(e)
        return engs

    def auto_lanes(self, ranks_here: int = 0) -> int:
        """HPCCL_NET_LANES, or when 0: 1 where UCX has an RDMA transport, else min(4, half this rank's
        cores per rank of its node; ``ranks_here``: the ranks sharing the node when this communicator holds
        only some of them, as hier's sub-communicators do)."""
        n = config.get("HPCCL_NET_LANES")
        if n > 0:
            return min(n, 8)
        info = self.eng.info() if self.eng is not None else ""
        if re.search(r"\b(rc|rc_mlx5|rc_verbs|dc|dc_mlx5|ud|ud_mlx5|ud_verbs|ib)\b", info):
            return 1
        local = max(1, ranks_here, self._nodes.count(self._nodes[self.rank]))
        return max(1, min(4, len(os.sched_getaffinity(0)) // (2 * local)))

    def abort(self, origin: int) -> None:
        if self._origin is None:
            self._origin = origin
        ControlChannel.abort(self, origin)
        if self.eng is not None and not self._closed:
            for e in self.lanes:
                e.abort(origin)

    # ----- life cycle --------------------------------------------------------------------------------
    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._pool = {}
        # a goodbye each peer confirms before the endpoints close: nothing sent is lost to a reset connection,
        # and the peers take the connection's end for a goodbye, not a failure (engine_farewell); not when
        # set-up failed, where a peer may have no engine to answer
        wait = config.get("HPCCL_TIMEOUT") if self._in_service else 0.0
        late: set = set()
        for e in self.lanes[1:]:
            late.update(e.close(wait))
        if self.eng is not None:
            late.update(self.eng.close(wait))
        if late:
            log.warn("TRANSPORT", "rank %d closed its UCX engine without rank(s) %s confirming its goodbye within "
                     "HPCCL_TIMEOUT=%gs (stopped or busy outside hpccl)", self.rank, sorted(late), wait)

