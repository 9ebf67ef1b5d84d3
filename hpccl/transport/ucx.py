"""UCX between nodes, over ucxx's low-level (non-asyncio) API.

One UCX context and worker per communicator. Workers' addresses are exchanged through the MPI bootstrap,
endpoints are created from them, and messages are tagged sends/receives:

    tag = sender rank << 40 | per-pair sequence number

so each (sender, receiver) pair is its own in-order stream no matter how UCX schedules lanes, and two
communicators never see each other's messages (each has its own worker). Progress is driven by hpccl:
``Request.test()`` calls ``worker.progress()``; there is no progress thread.

Host buffers go to UCX as uint8 views; CUDA buffers (``__cuda_array_interface__``) are handed to UCX as
they are, so UCX moves them itself (cuda_copy, cuda_ipc, GPU-Direct RDMA) with no staging in hpccl.

UCX_TLS and UCX_NET_DEVICES are UCX's own and are respected; HPCCL_UCX_TLS fills in UCX_TLS when that is
unset (or empty). Set-up is collective and fails on every rank at once (never a hang): a UCX_NET_DEVICES
that names no usable device, or ring neighbours that cannot exchange a byte within HPCCL_TIMEOUT (kept
between 10 and 60 s), raise an error naming the device or ranks and the variables to check. Other endpoints are made on first
use; one that cannot be made raises HpcclSystemError naming the peer.
"""
from __future__ import annotations

import os
import time
from typing import Any, Dict, Iterator, List, Optional

import numpy as np

from .. import log
from ..errors import HpcclEnvironmentError, HpcclError, HpcclRemoteError, HpcclSystemError
from .. import memory
from ..ops import ReduceOp
from .base import Request, Transport
from .control import ControlChannel
from .ucx_config import (WIRE_TCP, _device_problem, _error_handling, _os_devices, _tls,  # noqa: F401
                         collective_check, wire_config, wire_text, wireup_limit)


def _import_ucxx():
    """Import ucxx without letting it rewrite this process's environment for everyone else.

    ucxx's __init__ sets UCX_MEMTYPE_CACHE (unknown to UCX 1.20: a warning on every rank),
    UCX_RNDV_THRESH and UCX_RNDV_FRAG_MEM_TYPE in os.environ; hpccl takes them back out, so MPI or
    other UCX users started later see the environment the user set."""
    before = dict(os.environ)
    try:
        import ucxx._lib.libucxx as api
        from ucxx._lib.arr import Array
    except ImportError:
        raise
    except Exception as exc:  # noqa: BLE001 - a broken install (missing libucx, symbol clash) is "not available"
        raise ImportError(f"ucxx failed to import: {type(exc).__name__}: {exc}") from exc
    finally:
        for k in [k for k in os.environ if k not in before]:
            del os.environ[k]
        for k, v in before.items():
            if os.environ.get(k) != v:
                os.environ[k] = v
    return api, Array


_api, _Array = _import_ucxx()

_RANK_SHIFT = 40
_SEQ_MASK = (1 << _RANK_SHIFT) - 1
_P2P_BIT = 1 << 38  # point-to-point messages: what a receive from any source may match
_EAGER_MASK = _P2P_BIT - 1
_MAX_RANKS = 1 << (64 - _RANK_SHIFT)
_FULL = _api.UCXXTagMaskFull
# control messages (abort, "which call are you in?"): the sender's rank with every sequence bit set, matched
# from any sender by one standing worker-level receive; data sequence numbers never reach that value
_CTRL_TAG = _SEQ_MASK
class _UcxRequest(Request):
    """A send, or a receive that copies: done when UCX says so."""

    __slots__ = ("peer", "req", "t", "done")

    def __init__(self, t: "UcxTransport", peer: int, req: Any) -> None:
        self.t, self.peer, self.req, self.done = t, peer, req, False

    def test(self) -> bool:
        if self.done:
            return True
        req = self.req
        if not req.completed:
            self.t._worker.progress()
            if not req.completed:
                return False
        self._finish()
        return True

    def _finish(self) -> None:
        try:
            self.req.check_error()
        except Exception as exc:  # noqa: BLE001 - UCXError subclasses
            raise self.t._failed(self.peer, exc) from None
        self.done = True
        self.req = None


class _UcxReduceRequest(_UcxRequest):
    """A receive into scratch memory that then reduces: buf = src op incoming."""

    __slots__ = ("buf", "tmp", "op", "src")

    def __init__(self, t: "UcxTransport", peer: int, req: Any, buf: Any, tmp: Any, op: ReduceOp,
                 src: Any) -> None:
        super().__init__(t, peer, req)
        self.buf, self.tmp, self.op = buf, tmp, op
        self.src = buf if src is None else src

    def _finish(self) -> None:
        super()._finish()
        memory.reduce(self.buf, self.src, self.tmp, self.op)  # on the GPU for device buffers
        self.t._give_back(self.tmp)
        self.tmp = self.src = self.buf = None


class UcxTransport(ControlChannel, Transport):
    """Tagged UCX messages to every other rank of the communicator (built collectively)."""

    name = "ucx"
    impl = "ucxx"

    def __init__(self, bootstrap: Any, rank: int) -> None:
        self.rank, self.size = rank, bootstrap.size
        if self.size > _MAX_RANKS:
            raise HpcclEnvironmentError(f"the UCX transport supports up to {_MAX_RANKS} ranks")
        self._boot = bootstrap
        self._ctx = self._worker = None
        self._eps: Dict[int, Any] = {}
        self._send_seq = [0] * self.size
        self._recv_seq = [0] * self.size
        self._pool: Dict[tuple, List[np.ndarray]] = {}
        self._closed = False
        self._tag_base = rank << _RANK_SHIFT
        t0 = time.perf_counter()
        tls = _tls()
        self.tls = tls or "all"
        self.wire: Dict[str, str] = {}
        self.error_handling = _error_handling(tls)

        problem: Optional[str] = None
        address = b""
        try:
            if tls:
                cfg = {"TLS": tls} if os.environ.get("UCX_TLS") != tls else {}
            else:  # an empty UCX_TLS in the environment is not "unset" to UCX: it selects nothing
                cfg = {"TLS": "all"} if "UCX_TLS" in os.environ else {}
            self.wire = wire_config()
            try:
                self._ctx = _api.UCXContext({**cfg, **self.wire}, feature_flags=(_api.Feature.TAG,))
            except Exception as exc:  # noqa: BLE001 - a UCX that rejects the TCP settings: its defaults
                log.warn("TRANSPORT", "UCX refused hpccl's TCP settings %s (%s); using UCX's defaults "
                         "(HPCCL_UCX_TCP_TUNE=0 silences this)", self.wire, exc)
                self.wire = {}
                self._ctx = _api.UCXContext(cfg, feature_flags=(_api.Feature.TAG,))
            problem = _device_problem(self._ctx.info)
            if problem is None:
                self._worker = _api.UCXWorker(self._ctx, enable_delayed_submission=False,
                                              enable_python_future=False)
                address = bytes(self._worker.address)
        except Exception as exc:  # noqa: BLE001 - UCXError, UCXConfigError...
            problem = f"UCX set-up failed: {type(exc).__name__}: {exc} (UCX_TLS={self.tls}, " \
                      f"UCX_NET_DEVICES={os.environ.get('UCX_NET_DEVICES', '<unset>')})"
        self._collective_check(problem, HpcclEnvironmentError)

        self._addresses = bootstrap.allgather(address)
        self._wireup()
        self._control_init()
        self._post_ctrl_recv()
        log.info("TRANSPORT", "ucx: rank %d/%d, UCX_TLS=%s, error handling %s, TCP settings %s, ready in %.3fs",
                 rank, self.size, self.tls, "on" if self.error_handling else "off",
                 wire_text(self.wire),
                 time.perf_counter() - t0)

    # ----- set-up ------------------------------------------------------------------------------------
    def _collective_check(self, problem: Optional[str], kind: type) -> None:
        collective_check(self._boot, problem, kind, "UCX transport", self.close)

    def _ep(self, peer: int) -> Any:
        """The endpoint to ``peer``, created on first use (a rank talks to few peers in rings and trees)."""
        ep = self._eps.get(peer)
        if ep is None:
            try:
                addr = _api.UCXAddress.create_from_buffer(self._addresses[peer])
                ep = _api.UCXEndpoint.create_from_worker_address(self._worker, addr, self.error_handling)
            except Exception as exc:  # noqa: BLE001 - UCXError kinds
                raise HpcclSystemError(
                    f"cannot reach rank {peer} over UCX: {type(exc).__name__}: {exc} (UCX_TLS={self.tls}, "
                    f"UCX_NET_DEVICES={os.environ.get('UCX_NET_DEVICES', '<unset>')}; both sides need a "
                    "transport in common)") from None
            self._eps[peer] = ep
        return ep

    def _wireup(self) -> None:
        """One byte each way with both ring neighbours, under a deadline: a path that connects but cannot
        carry data (firewall, wrong interface) fails at init, on every rank, not in the first collective.
        Other endpoints are created on first use."""
        peers = sorted({(self.rank + 1) % self.size, (self.rank - 1) % self.size} - {self.rank})
        if not peers:
            return
        one = np.zeros(len(peers), dtype=np.uint8)
        got = np.ones(len(peers), dtype=np.uint8)
        reqs: List[Request] = []
        problem = None
        try:
            for i, peer in enumerate(peers):
                reqs.append(self.irecv(peer, got[i:i + 1], None))
                reqs.append(self.isend(peer, one[i:i + 1]))
        except HpcclSystemError as exc:
            problem = exc.message
            reqs = []
        limit = wireup_limit()
        deadline = time.monotonic() + limit
        pending = reqs
        try:
            while pending:
                pending = [r for r in pending if not r.test()]
                if pending and time.monotonic() > deadline:
                    problem = (f"no UCX traffic from/to rank(s) {sorted({r.peer for r in pending})} within "
                               f"{limit:g}s "
                               f"(UCX_TLS={self.tls}, UCX_NET_DEVICES="
                               f"{os.environ.get('UCX_NET_DEVICES', '<unset>')})")
                    break
                if pending:
                    time.sleep(0)
        except HpcclError as exc:
            problem = exc.message
        self._collective_check(problem, HpcclSystemError)

    # ----- data path ---------------------------------------------------------------------------------
    @staticmethod
    def _wire(buf: Any) -> Any:
        """ucxx's view of a buffer: numpy arrays directly (as bytes when ucxx does not know the dtype, e.g.
        bfloat16); CUDA arrays as they are, so UCX moves device memory itself."""
        try:
            return _Array(buf)
        except ValueError:
            return _Array(buf.view(np.uint8))

    def isend(self, peer: int, buf: Any, p2p: bool = False) -> Request:
        seq = self._send_seq[peer]
        self._send_seq[peer] = seq + 1
        ep = self._eps.get(peer) or self._ep(peer)
        tag = self._tag_base | (seq & _EAGER_MASK) | (_P2P_BIT if p2p else 0)
        return _UcxRequest(self, peer, ep.tag_send(self._wire(buf), _api.UCXXTag(tag)))

    def irecv(self, peer: int, buf: Any, op: Optional[ReduceOp], src: Any = None, p2p: bool = False) -> Request:
        """Receive into ``buf``; with ``op``, into a scratch buffer, then buf = (src or buf) op incoming."""
        seq = self._recv_seq[peer]
        self._recv_seq[peer] = seq + 1
        ep = self._eps.get(peer) or self._ep(peer)
        tag = _api.UCXXTag((peer << _RANK_SHIFT) | (seq & _EAGER_MASK) | (_P2P_BIT if p2p else 0))
        if op is None:
            return _UcxRequest(self, peer, ep.tag_recv(self._wire(buf), tag, _FULL))
        tmp = self._take(buf)
        return _UcxReduceRequest(self, peer, ep.tag_recv(self._wire(tmp), tag, _FULL), buf, tmp, op, src)

    def probe(self, peer: int) -> bool:
        self._worker.progress()
        tag = (peer << _RANK_SHIFT) | _P2P_BIT | (self._recv_seq[peer] & _EAGER_MASK)
        return bool(self._worker.tag_probe(_api.UCXXTag(tag)).matched)

    def _take(self, like: Any) -> Any:
        """A receive buffer shaped like ``like`` (host: reused from a small pool; CUDA: its own library's)."""
        if not isinstance(like, np.ndarray):
            return np.empty_like(like)  # __array_function__: CuPy allocates on the device
        free = self._pool.get((like.dtype.str, like.size))
        return free.pop() if free else np.empty_like(like)

    def _give_back(self, tmp: Any) -> None:
        if isinstance(tmp, np.ndarray):
            free = self._pool.setdefault((tmp.dtype.str, tmp.size), [])
            if len(free) < 4:
                free.append(tmp)

    def _failed(self, peer: int, exc: Exception) -> Exception:
        text = f"UCX transfer with rank {peer} failed: {type(exc).__name__}: {exc}"
        lost = ("reset", "unreachable", "canceled", "cancelled", "timed out", "connection")
        if any(w in str(exc).lower() for w in lost) or "Endpoint" in type(exc).__name__ \
                or "Cancel" in type(exc).__name__:
            # UCX's peer-failure handling closed the endpoint (its requests end canceled): the peer is gone.
            # A peer that aborted before it left sent who failed first: read that before blaming the peer.
            end = time.monotonic() + 0.05
            while self._aborted_by is None and time.monotonic() < end:
                self._poll()
            if self._aborted_by is not None and self._aborted_by != peer:
                return HpcclRemoteError(f"rank {self._aborted_by} failed and the communicator was aborted "
                                        f"(rank {peer} then left: {type(exc).__name__})", rank=self._aborted_by)
            return HpcclRemoteError(text + f" (rank {peer} may have died)", rank=peer)
        return HpcclSystemError(text)

    # ----- life cycle --------------------------------------------------------------------------------
    # ----- control channel (control.ControlChannel): a reserved tag, one standing worker receive -------
    def _post_ctrl_recv(self) -> None:
        self._ctrl_buf = np.zeros(3, dtype=np.int64)
        self._ctrl_req = self._worker.tag_recv(_Array(self._ctrl_buf), _api.UCXXTag(_CTRL_TAG),
                                               _api.UCXXTagMask(_SEQ_MASK))

    def _ctrl_live(self) -> bool:
        return not self._closed and self._worker is not None

    def _ctrl_send(self, peer: int, msg: np.ndarray) -> Any:
        try:
            ep = self._eps.get(peer) or self._ep(peer)
        except HpcclError:
            return None  # an unreachable peer cannot be told; it times out on its own
        return ep.tag_send(_Array(msg), _api.UCXXTag(self._tag_base | _CTRL_TAG))

    @staticmethod
    def _ctrl_done(req: Any) -> bool:
        return req.completed

    def _ctrl_arrived(self) -> Iterator[Optional[np.ndarray]]:
        self._worker.progress()
        while self._ctrl_req is not None and self._ctrl_req.completed:
            try:
                self._ctrl_req.check_error()
                msg: Optional[np.ndarray] = self._ctrl_buf
            except Exception:  # noqa: BLE001 - a cancelled or failed control receive carries nothing
                msg = None
            self._post_ctrl_recv()  # a new buffer: the one yielded stays as it arrived
            yield msg

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        worker, eps = self._worker, list(self._eps.values())
        self._eps = {}
        self._pool = {}
        if worker is not None:
            try:
                worker.cancel_inflight_requests()
            except Exception:  # noqa: BLE001
                pass
        # Endpoints are not closed one by one: ucxx's ep.close() followed by progress can crash (SIGSEGV)
        # when the peer's close arrives at the same time; dropping the references lets ucxx tear them
        # down with the worker.
        del eps
        self._worker = None
        self._ctx = None
