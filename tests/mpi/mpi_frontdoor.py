"""The compiled hot path's front doors (plain numpy arrays straight to hpccl/csrc/_hotpath.c, before any
Python validation) implement the collectives' Spec (hpccl/core/frontend.py). There are two: the C front door
(hpccl/csrc/_frontdoor.c, an attribute of the communicator per collective that shadows the method: what
comm.all_reduce(...) calls) and the Python method's own (Communicator._front_door: what it calls with
HPCCL_HOST_DOOR=0, or called through the class). A generated grid of arguments for each of the six
collectives (dtypes, sizes around the hot path's limits, in place / out of place / allocated outputs,
outputs of the wrong size, dtype, layout or writability, overlapping buffers, ops, roots, arguments by
position and by keyword) runs every combination three times on every rank: through the C door, through the
Python method, and with both bypassed (the communicator's front-door table emptied: every call is validated
by the Spec first, and still runs on the hot path where that takes it). The outcomes must be the same: the
same exception class and message, or the same kind of returned object (the recvbuf itself, sendbuf, None, a
new array), bitwise the same outputs and inputs afterwards, the same call sequence number and comm.stats()
counts; a refused call writes nothing.

Every rank builds the same grid and passes the same arguments (only its own block differs where a call is in
place), so an argument error is raised on every rank before anything moves; each group's disagreements are
gathered from every rank, so all ranks pass or fail together. The two disagreements this test found when it
was written (an unhashable op raised TypeError before the front door; a root past C's int raised
OverflowError in it) are fixed, and their cases are kept as tests of their own (FORMER_DISAGREEMENTS)."""
from __future__ import annotations

import array
import ctypes
import zlib
from contextlib import contextmanager
from typing import Any, Dict, List, NamedTuple, Optional, Tuple

import numpy as np
import pytest
from mpi4py import MPI

import hpccl
from hpccl import config
from hpccl.host import hotpath
from hpccl.ops import AVG, MAX, MIN, PROD, SUM

COLLS = ["all_reduce", "reduce", "broadcast", "all_gather", "reduce_scatter", "all_to_all"]
REDUCING = {"all_reduce", "reduce", "reduce_scatter"}
ROOTED = {"reduce", "broadcast"}
DIVISIBLE = {"reduce_scatter", "all_to_all"}  # the input splits into one block per rank

DTYPES: Dict[str, np.dtype] = {name: np.dtype(dt) for name, dt in [
    # the C path's dtypes
    ("float32", np.float32), ("float64", np.float64), ("int32", np.int32), ("int64", np.int64),
    ("uint8", np.uint8), ("int8", np.int8), ("uint32", np.uint32), ("uint64", np.uint64),
    ("longlong", np.longlong),  # int64 under another buffer format ('q', not 'l')
    # supported by hpccl, declined by C (reduced in Python)
    ("float16", np.float16), ("bfloat16", hpccl.bfloat16),
    # refused
    ("bool", np.bool_), ("complex64", np.complex64), ("object", object), ("float32be", ">f4"),
    ("longdouble", np.longdouble), ("int16", np.int16)]}
C_DTYPES = ["float32", "float64", "int32", "int64", "uint8", "int8", "uint32", "uint64", "longlong"]

# an output of another dtype with the same element size
OTHER_DTYPE = {"float32": "int32", "int32": "float32", "uint32": "int32", "float64": "int64", "int64": "float64",
               "longlong": "uint64", "uint64": "int64", "uint8": "int8", "int8": "uint8", "float16": "int16",
               "bfloat16": "float16"}
CTYPE = {"float32": ctypes.c_float, "float64": ctypes.c_double, "int32": ctypes.c_int32,
         "int64": ctypes.c_int64, "uint8": ctypes.c_uint8, "int8": ctypes.c_int8, "uint32": ctypes.c_uint32,
         "uint64": ctypes.c_uint64, "longlong": ctypes.c_longlong}
ARRAY_CODE = {"float32": "f", "float64": "d", "int32": "i", "int64": "l", "uint8": "B", "int8": "b",
              "uint32": "I", "uint64": "L", "longlong": "q"}

OUTS = ["none", "fresh", "inplace", "alias", "other_block", "overlap", "wrong_size", "wrong_dtype",
        "same_bytes_other_dtype", "strided", "readonly", "2d", "fortran", "memoryview", "subclass", "list",
        "bytes", "ctypes", "array"]
SENDS = ["plain", "2d", "fortran", "strided", "readonly", "0d", "subclass", "memoryview", "list", "array"]
OPS: List[Any] = [SUM, PROD, MIN, MAX, AVG, "sum", "avg", "MAX", "Min", "xor", "", None, 0, 4, 3.0, np.str_("prod"),
                  hpccl.ReduceOp, ("sum",), ["sum"], {"op": "sum"}]


class Sub(np.ndarray):
    """An ndarray subclass: not a plain numpy array to the front door."""


class Case(NamedTuple):
    coll: str
    dtype: str
    count: int  # sendbuf's elements
    send: str = "plain"
    out: str = "fresh"
    op: Any = SUM
    root: Any = 0

    @property
    def id(self) -> str:
        s = f"{self.coll}-{self.dtype}-n{self.count}-send:{self.send}-out:{self.out}"
        if self.coll in REDUCING:
            s += f"-op:{self.op!r}"
        if self.coll in ROOTED:
            s += f"-root:{type(self.root).__name__}({self.root!r})"
        return s


# ----- the grid -----------------------------------------------------------------------------------------
def _applies(coll: str, out: str) -> bool:
    return not (out == "other_block" and coll not in ("all_gather", "reduce_scatter"))


def _send_ok(coll: str, send: str, out: str, count: int) -> bool:
    if send == "0d" and count != 1:
        return False
    # a read-only input written in place fails only where it is written (the root of reduce, the others of
    # broadcast): the other ranks would go on into the collective, so no such case
    if send == "readonly" and coll in ROOTED and out == "none":
        return False
    # the input as a block of the output needs the input to be that view
    return send == "plain" or out not in ("inplace", "other_block", "overlap", "alias")


def grid(coll: str, group: str, n: int) -> List[Case]:
    """The generated combinations of one group of arguments for one collective (the same on every rank)."""
    default_op = SUM if coll in REDUCING else None
    cases: List[Case] = []
    if group == "dtypes":
        for dt in DTYPES:
            for count in (0, 1, 4 * n, 4 * n + 1):
                for out in ("none", "fresh", "inplace"):
                    cases.append(Case(coll, dt, count, "plain", out, default_op))
    elif group == "recvbufs":
        for dt in ("float32", "longlong", "uint8", "float16"):
            for count in ((1, 4 * n, 4 * n + 1) if dt in ("float32", "longlong") else (1, 4 * n + 1)):
                for out in OUTS:
                    if _applies(coll, out):
                        cases.append(Case(coll, dt, count, "plain", out, default_op))
    elif group == "sendbufs":
        for dt in ("float32", "uint8"):
            for count in (1, 4 * n, 4 * n + 1, 6 * n):
                for send in SENDS:
                    for out in ("none", "fresh", "inplace", "readonly"):
                        if _send_ok(coll, send, out, count):
                            cases.append(Case(coll, dt, count, send, out, default_op))
    elif group == "sizes":  # around the hot path's limits: direct from, reduce limit, slot size
        direct = config.get("HPCCL_HOT_DIRECT_SIZE")
        cap, rcap = config.get("HPCCL_HOT_SIZE"), config.get("HPCCL_HOT_REDUCE_SIZE")
        nbytes = sorted({b for b in (direct - 8, direct + 8, 4 * direct + 8, rcap - 8, rcap + 8, 16 * direct + 8,
                                     cap + 8) if b > 0})
        kinds = [("float32", SUM), ("uint8", MAX)] + ([("float64", AVG)] if coll in REDUCING else [])
        for dt, op in kinds:
            op = op if coll in REDUCING else None
            e = DTYPES[dt].itemsize
            for b in nbytes:
                count = max(1, b // e)
                if coll in DIVISIBLE:
                    count += -count % n
                    cases.append(Case(coll, dt, count + 1, "plain", "fresh", op))
                outs = ("none", "fresh", "inplace", "other_block", "overlap") if b <= cap else ("fresh", "inplace")
                for out in outs:
                    if _applies(coll, out):
                        cases.append(Case(coll, dt, count, "plain", out, op))
    elif group == "ops":
        for dt in ("float32", "int32", "float16", "bool"):
            for op in OPS:
                for out in ("none", "fresh"):
                    cases.append(Case(coll, dt, 4 * n, "plain", out, op))
    elif group == "roots":
        roots = [0, n - 1, 1, -1, n, -n, 1.0, np.int64(n - 1), np.int32(0), True, False, "0", None,
                 2 ** 31 - 1, 2 ** 31, -2 ** 31 - 1, 2 ** 63, 2 ** 64 + 1]
        for root in roots:
            for dt, count in (("float32", 4 * n), ("float16", 3)):
                for out in ("none", "fresh", "inplace"):
                    for op in ([SUM, ["sum"]] if coll in REDUCING else [None]):
                        cases.append(Case(coll, dt, count, "plain", out, op, root))
    return list({c.id: c for c in cases}.values())  # sizes that round to the same count once


GROUPS = [(coll, g) for coll in COLLS for g in ("dtypes", "recvbufs", "sendbufs", "sizes", "ops", "roots")
          if (g != "ops" or coll in REDUCING) and (g != "roots" or coll in ROOTED)]


# ----- building one case's buffers ----------------------------------------------------------------------
def _values(rng: np.random.Generator, dt: np.dtype, count: int) -> np.ndarray:
    if dt.kind == "f":
        return rng.standard_normal(count).astype(dt)  # not integers: a reduction's order shows bitwise
    if dt.kind == "V":  # bfloat16
        return rng.standard_normal(count).astype(np.float32).astype(dt)
    if dt.kind == "c":
        return (rng.standard_normal(count) + 1j * rng.standard_normal(count)).astype(dt)
    if dt.kind == "b":
        return rng.integers(0, 2, count).astype(dt)
    if dt.kind == "O":
        return np.array([int(v) for v in rng.integers(0, 20, count)] + [None], dtype=object)[:count]
    return rng.integers(0, 20, count).astype(dt)


def _filled(dt: np.dtype, count: int) -> np.ndarray:
    return np.full(count, 7 if dt.kind != "b" else True, dtype=dt)


def _shape2(count: int) -> Tuple[int, int]:
    """A 2-D shape of count elements, both sides above 1 where count allows."""
    for a in (2, 3, 5, 7):
        if count % a == 0 and count // a > 1:
            return a, count // a
    return 1, count


class Built(NamedTuple):
    sendbuf: Any
    recvbuf: Any
    keep: Dict[str, Any]  # every buffer (base arrays) to compare afterwards


def inputs(case: Case, rank: int) -> np.ndarray:
    """This rank's input values for the case (the same every time)."""
    rng = np.random.default_rng(zlib.crc32(case.id.encode()) + 7919 * rank)
    return _values(rng, DTYPES[case.dtype], case.count)


def build(case: Case, rank: int, n: int, values: Optional[np.ndarray] = None) -> Optional[Built]:
    """Fresh buffers for one case on this rank (from a copy of ``values``, default inputs()); None where the
    variant does not exist for this dtype (a ctypes or array.array output of a dtype they have no code for)."""
    coll, dt, c = case.coll, DTYPES[case.dtype], case.count
    data = (inputs(case, rank) if values is None else values).copy()
    out_n = {"all_gather": c * n, "reduce_scatter": c // n}.get(coll, c)
    keep: Dict[str, Any] = {}
    sendbuf: Any = data
    recvbuf: Any = None
    out = case.out
    if out == "none":
        pass
    elif out == "fresh":
        recvbuf = _filled(dt, out_n)
    elif out == "inplace":
        if coll == "all_gather":  # the input is this rank's block of the output
            recvbuf = _filled(dt, out_n)
            recvbuf[rank * c:(rank + 1) * c] = data
            sendbuf = recvbuf[rank * c:(rank + 1) * c]
        elif coll == "reduce_scatter":  # the output is this rank's block of the input
            recvbuf = data[rank * out_n:(rank + 1) * out_n]
        else:
            recvbuf = data
    elif out == "alias":  # another view object of the very same memory
        recvbuf = data[:out_n] if coll == "reduce_scatter" else data[:]
        if coll == "all_gather":
            recvbuf = _filled(dt, out_n)
            recvbuf[:c] = data
            sendbuf = recvbuf[:c]  # rank 0's block, whatever this rank is
    elif out == "other_block":  # the next rank's block
        q = (rank + 1) % n
        if coll == "all_gather":
            recvbuf = _filled(dt, out_n)
            recvbuf[q * c:(q + 1) * c] = data
            sendbuf = recvbuf[q * c:(q + 1) * c]
        else:
            recvbuf = data[q * out_n:(q + 1) * out_n]
    elif out == "overlap":  # part of the output and part of the input share memory
        if coll == "all_gather":
            base = _filled(dt, out_n + c + 1)
            at = rank * c + 1
            base[at:at + c] = data
            sendbuf, recvbuf = base[at:at + c], base[:out_n]
        elif coll == "reduce_scatter":
            base = _filled(dt, c + 1)
            base[:c] = data
            at = rank * out_n + 1
            sendbuf, recvbuf = base[:c], base[at:at + out_n]
        else:
            shift = max(1, c // 3)
            base = _filled(dt, c + shift)
            base[:c] = data
            sendbuf, recvbuf = base[:c], base[shift:shift + out_n]
        keep["base"] = base
    elif out == "wrong_size":
        recvbuf = _filled(dt, out_n + 1)
    elif out == "wrong_dtype":
        recvbuf = _filled(DTYPES[OTHER_DTYPE.get(case.dtype, "float32")], out_n)
    elif out == "same_bytes_other_dtype":
        recvbuf = np.zeros(out_n * dt.itemsize, np.uint8) if dt.itemsize > 1 else np.zeros(out_n, np.int8)
    elif out == "strided":
        recvbuf = _filled(dt, 2 * out_n)[::2]
    elif out == "readonly":
        recvbuf = _filled(dt, out_n)
        recvbuf.flags.writeable = False
    elif out == "2d":
        recvbuf = _filled(dt, out_n).reshape(_shape2(out_n))
    elif out == "fortran":
        recvbuf = np.asfortranarray(_filled(dt, out_n).reshape(_shape2(out_n)))
    elif out == "memoryview":
        keep["recv_array"] = arr = _filled(dt, out_n)
        recvbuf = memoryview(arr) if dt.kind != "V" else arr  # numpy exports no buffer of bfloat16
    elif out == "subclass":
        recvbuf = _filled(dt, out_n).view(Sub)
    elif out == "list":
        recvbuf = [0] * out_n
    elif out == "bytes":
        recvbuf = bytes(out_n * dt.itemsize)
    elif out == "ctypes":
        if case.dtype not in CTYPE:
            return None
        recvbuf = (CTYPE[case.dtype] * out_n)()
    elif out == "array":
        if case.dtype not in ARRAY_CODE:
            return None
        recvbuf = array.array(ARRAY_CODE[case.dtype], [7] * out_n)
    else:
        raise AssertionError(out)

    send = case.send
    if send == "plain":
        pass
    elif send == "2d":
        sendbuf = data.reshape(_shape2(c))
    elif send == "fortran":
        sendbuf = np.asfortranarray(data.reshape(_shape2(c)))
    elif send == "strided":
        base = _filled(dt, 2 * c)
        base[::2] = data
        sendbuf = base[::2]
        keep["send_base"] = base
    elif send == "readonly":
        data.flags.writeable = False
    elif send == "0d":
        sendbuf = data.reshape(())
    elif send == "subclass":
        sendbuf = data.view(Sub)
    elif send == "memoryview":
        sendbuf = memoryview(data) if dt.kind != "V" else data
    elif send == "list":
        sendbuf = data.tolist()
    elif send == "array":
        if case.dtype not in ARRAY_CODE:
            return None
        sendbuf = array.array(ARRAY_CODE[case.dtype], data.tolist())
    else:
        raise AssertionError(send)
    keep["send"], keep["recv"] = sendbuf, recvbuf
    keep.setdefault("data", data)
    return Built(sendbuf, recvbuf, keep)


#: how a case calls: through the communicator's attribute (the C front door where it is installed) or
#: through the class (the Python method and its own front door)
WAYS = ("door", "method")


def call(comm: hpccl.Communicator, case: Case, b: Built, way: str = "door") -> Any:
    s, r = b.sendbuf, b.recvbuf
    f = getattr(comm, case.coll) if way == "door" else getattr(type(comm), case.coll).__get__(comm)
    kw = zlib.crc32(case.id.encode()) & 1  # half the cases name their arguments, the same on every rank
    if case.coll == "all_reduce":
        return f(s, r, op=case.op) if kw else f(s, r, case.op)
    if case.coll == "reduce":
        return f(s, r, root=case.root, op=case.op) if kw else f(s, r, case.root, case.op)
    if case.coll == "broadcast":
        return f(s, case.root, recvbuf=r) if r is not None or kw else f(s, root=case.root)
    if case.coll == "all_gather":
        return f(s, r)
    if case.coll == "reduce_scatter":
        return f(s, recvbuf=r, op=case.op) if kw else f(s, r, case.op)
    return f(s, r) if kw else f(sendbuf=s, recvbuf=r)


# ----- outcomes -----------------------------------------------------------------------------------------
def snap(obj: Any) -> Any:
    """Everything observable of a buffer: type, shape, dtype, flags and bytes (values for object arrays)."""
    if obj is None:
        return None
    if isinstance(obj, np.ndarray):
        # object arrays by value, long double too (its padding bytes are whatever memory held)
        body = repr(obj.tolist()) if obj.dtype.hasobject or obj.dtype == np.longdouble else obj.tobytes()
        return (type(obj).__name__, obj.shape, obj.dtype.str, obj.flags.writeable, obj.flags.c_contiguous, body)
    if isinstance(obj, memoryview):
        return ("memoryview", obj.format, obj.shape, obj.readonly, obj.tobytes())
    if isinstance(obj, (bytes, bytearray, array.array)) or isinstance(obj, ctypes.Array):
        return (type(obj).__name__, bytes(obj))
    return (type(obj).__name__, repr(obj))


def state(b: Built) -> Dict[str, Any]:
    return {k: snap(v) for k, v in b.keep.items()}


def counted(comm: hpccl.Communicator) -> Dict[Tuple[str, str], Tuple[int, int]]:
    """comm.stats()' calls and bytes per collective and algorithm (the seconds differ from call to call)."""
    return {(c, a): (v["calls"], v["bytes"]) for c, algos in comm.stats().items() for a, v in algos.items()}


def accounting(comm: hpccl.Communicator, seq: int, stats: dict) -> Tuple[int, Dict[Any, Tuple[int, int]]]:
    """What a call added to the communicator's sequence number and to comm.stats()."""
    now = counted(comm)
    return comm._seq - seq, {k: (v[0] - stats.get(k, (0, 0))[0], v[1] - stats.get(k, (0, 0))[1])
                             for k, v in now.items() if v != stats.get(k)}


def outcome(comm: hpccl.Communicator, case: Case, b: Built, way: str = "door") -> Tuple[Any, Dict[str, Any], Any]:
    """(what the call gave: ('raised', class, message) or ('returned', which object), buffers after, what
    it added to the call sequence and comm.stats())."""
    seq, stats = comm._seq, counted(comm)
    try:
        ret = call(comm, case, b, way)
    except Exception as exc:  # noqa: BLE001 - compared, class and message, between the two ways
        return ("raised", type(exc).__qualname__, str(exc)), state(b), accounting(comm, seq, stats)
    if ret is None:
        what: Any = "None"
    elif ret is b.sendbuf:
        what = "sendbuf"
    elif ret is b.recvbuf:
        what = "recvbuf"
    elif isinstance(ret, np.ndarray):
        shares = [k for k, v in b.keep.items() if isinstance(v, np.ndarray) and np.shares_memory(ret, v)]
        what = ("new array", snap(ret), shares)
    else:
        what = ("other", type(ret).__name__, repr(ret)[:200])
    return ("returned", what), state(b), accounting(comm, seq, stats)


class Spy:
    """Stands in for the hot path in the front-door table: records what the front door handed to C
    (collective, return code or exception) and forwards everything."""

    def __init__(self, hot: Any) -> None:
        self.hot = hot
        self.log: List[Tuple[str, Any]] = []

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.hot, name)
        if name not in COLLS:
            return attr

        def forward(*args: Any) -> Any:
            try:
                rc = attr(*args)
            except BaseException as exc:
                self.log.append((name, type(exc).__name__))
                raise
            self.log.append((name, rc))
            return rc
        return forward


@pytest.fixture(scope="module")
def comm():
    c = hpccl.init()
    if c.size < 2:
        c.destroy()
        pytest.skip("the hot path and its front door serve 2 or more ranks of a node (this run has 1)")
    yield c
    c.destroy()


@pytest.fixture(scope="module")
def spy(comm):
    assert hotpath.available(), "hpccl/csrc/_hotpath.c was not built: pip install needs a C compiler"
    front = comm._front
    assert set(COLLS) <= set(front), f"the front door serves only {sorted(front)}"
    hot = front["all_reduce"]
    s = Spy(hot)
    for coll in COLLS:
        front[coll] = s
    yield s
    for coll in COLLS:
        front[coll] = hot


@contextmanager
def bypassed(comm: hpccl.Communicator):
    """The front door steps aside: its table emptied in place (the collectives read it on every call), so
    every call is validated by the Spec first; the validated call still runs on the hot path."""
    saved = dict(comm._front)
    comm._front.clear()
    try:
        yield
    finally:
        comm._front.update(saved)


def compare(comm: hpccl.Communicator, spy: Spy, case: Case) -> Tuple[Optional[str], bool]:
    """(None, or what differs between each front door and the Spec for this case on this rank; whether both
    front doors took the call)."""
    n, r = comm.size, comm.rank
    values = inputs(case, r)
    if build(case, r, n, values) is None:
        return None, False
    before = state(build(case, r, n, values))
    assert comm._front.get(case.coll) is spy, "the front-door table changed under the test"
    fronts, took = {}, []
    for way in WAYS:
        b = build(case, r, n, values)
        assert state(b) == before, "the case's inputs are not rebuilt identically"
        spy.log.clear()
        fronts[way] = outcome(comm, case, b, way), list(spy.log)
        took.append(any(isinstance(rc, int) and rc >= 0 for _, rc in spy.log))
    second = build(case, r, n, values)
    spy.log.clear()
    with bypassed(comm):
        checked = outcome(comm, case, second)
    assert spy.log == [], f"the bypassed call still reached the front door: {spy.log}"
    problems = []
    for way, (front, front_log) in fronts.items():
        if front[0] != checked[0]:
            problems.append(f"{way}: front door {front[0]!r} (C said {front_log}) vs Spec {checked[0]!r}")
        for k in before:
            if front[1][k] != checked[1][k]:
                problems.append(f"{way}: {k} differs afterwards (front door {str(front[1][k])[:160]} vs Spec "
                                f"{str(checked[1][k])[:160]})")
        if front[2] != checked[2]:
            problems.append(f"{way}: sequence and stats: front door added {front[2]} vs Spec {checked[2]}")
        if front[0][0] == "raised" and front[1] != before:
            problems.append(f"{way} raised {front[0][1]} but changed "
                            f"{[k for k in before if front[1][k] != before[k]]}")
    # what reached C: the same both ways, except that a call the hot path declines at the C door reaches it
    # once more through the method it goes on to (and is declined again)
    # (done at once or pending, 0 or 1, is timing: both are "took")
    door_log, method_log = ([(c, "took" if isinstance(rc, int) and rc >= 0 else rc) for c, rc in fronts[w][1]]
                            for w in WAYS)
    if door_log != method_log and door_log != [(case.coll, -1)] + method_log:
        problems.append(f"the C door handed C {door_log}, the method {method_log}")
    if checked[0][0] == "raised" and checked[1] != before:
        problems.append(f"Spec raised {checked[0][1]} but changed {[k for k in before if checked[1][k] != before[k]]}")
    return ("; ".join(problems) or None), all(took)


def gather_problems(problems: List[str]) -> List[str]:
    """Every rank's problems (so every rank passes or fails the test together, none left hanging)."""
    return [p for rank_list in MPI.COMM_WORLD.allgather(problems) for p in rank_list]


@pytest.mark.parametrize("coll,group", GROUPS, ids=[f"{c}-{g}" for c, g in GROUPS])
def test_front_door_agrees_with_spec(comm, spy, coll, group):
    n, r = comm.size, comm.rank
    cases = list(grid(coll, group, n))
    assert len({c.id for c in cases}) == len(cases), "the grid repeats a case"
    problems, taken = [], 0
    for case in cases:
        bad, took = compare(comm, spy, case)
        taken += took
        if bad:
            problems.append(f"rank {r}: {case.id}: {bad}")
    print(f"{coll}/{group}: {len(cases)} cases, {taken} taken by the front door")
    everyone = gather_problems(problems)
    assert not everyone, f"{len(everyone)} disagreement(s):\n" + "\n".join(everyone[:40])
    # the comparison is not empty: the front door took calls of this group (in the C path's dtypes)
    assert taken > 0, f"{coll}/{group}: the front door took none of {len(cases)} calls"


@pytest.mark.parametrize("coll", COLLS)
def test_front_door_takes_plain_calls(comm, spy, coll):
    """The grid compares something: a plain float32 call out of place of every collective is the front
    door's (C's), and its result is the Spec's."""
    n = comm.size
    case = Case(coll, "float32", 4 * n, "plain", "fresh", SUM if coll in REDUCING else None, n - 1)
    bad, took = compare(comm, spy, case)
    everyone = gather_problems([f"rank {comm.rank}: {bad}"] if bad else [])
    assert not everyone, everyone
    assert took, f"the front door declined {case.id}"


FORMER_DISAGREEMENTS = [
    pytest.param(Case("all_reduce", "float32", 8, op=["sum"]), id="all_reduce-op-list"),
    pytest.param(Case("reduce_scatter", "float32", 12, op={"op": "sum"}), id="reduce_scatter-op-dict"),
    pytest.param(Case("reduce", "int32", 8, out="none", op=["max"], root=0), id="reduce-op-list"),
    pytest.param(Case("broadcast", "float32", 8, out="none", root=2 ** 31), id="broadcast-root-2**31"),
    pytest.param(Case("reduce", "float64", 8, root=-2 ** 31 - 1), id="reduce-root--2**31-1"),
    pytest.param(Case("broadcast", "uint8", 5, root=2 ** 63), id="broadcast-root-2**63"),
]


@pytest.mark.parametrize("case", FORMER_DISAGREEMENTS)
def test_former_disagreements_agree(comm, spy, case):
    """An unhashable op and a root past C's int: the Spec's HpcclInvalidArgument with the front door too."""
    bad, _ = compare(comm, spy, case)
    everyone = gather_problems([f"rank {comm.rank}: {bad}"] if bad else [])
    assert not everyone, "\n".join(everyone)


def test_destroyed_communicator_refuses_both_ways(comm):
    """A destroyed communicator's front door is closed (its table emptied), so the call is the Spec's
    refusal, the same with and without the front door, and nothing reaches C."""
    sub = comm.split(0, comm.rank)
    assert set(COLLS) <= set(sub._front), f"the front door serves only {sorted(sub._front)}"
    s = Spy(sub._front["all_reduce"])
    for coll in COLLS:
        sub._front[coll] = s
    sub.destroy()
    n = comm.size
    for coll in COLLS:
        case = Case(coll, "float32", 4 * n, "plain", "fresh", SUM if coll in REDUCING else None, 0)
        front = outcome(sub, case, build(case, comm.rank, n))
        with bypassed(sub):
            checked = outcome(sub, case, build(case, comm.rank, n))
        assert front[0] == checked[0] and front[0][:2] == ("raised", "HpcclInvalidUsage"), (front[0], checked[0])
        assert front[1] == checked[1] == state(build(case, comm.rank, n)), coll
    assert s.log == [], f"a destroyed communicator's call reached C: {s.log}"
