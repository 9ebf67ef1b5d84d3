"""float8_e4m3fn and float8_e5m2 inside every rank: random cases of every collective (numpy arrays, 1-byte words
with dtype=, torch CPU tensors) against a float64 reference rounded once, every algorithm of this layout, the
one-rounding rule, and the errors for bad combinations."""
import functools

import numpy as np
import pytest

import hpccl
from hpccl import HpcclInvalidArgument
from hpccl.ops import AVG, MAX, MIN, PROD, SUM, ml_dtype

NAMES = ("float8_e4m3fn", "float8_e5m2")
REDUCING = ("all_reduce", "reduce", "reduce_scatter", "reduce_scatter_v")
MOVING = ("all_gather", "broadcast", "all_to_all", "all_to_all_v", "gather", "scatter", "all_gather_v", "send_recv")
OPS = (SUM, PROD, MIN, MAX, AVG)

# NaN and infinity inputs make numpy warn inside the float32 reductions: expected here
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning",
                                        "ignore:overflow encountered:RuntimeWarning")

try:
    import torch
except ImportError:  # the torch input kind is left out; the other kinds still run
    torch = None


@pytest.fixture(scope="module")
def comm():
    c = hpccl.init()
    yield c
    c.destroy()


def codes(rng, name, op, count):
    """Random float8 bit patterns: any code for data movement, min, max, prod (float32 holds every product of
    4 float8 values exactly); for e5m2 sums and means a span of exponents whose float32 sums are exact, as
    every e4m3fn sum of a few ranks is, plus zeros, infinities and NaN now and then."""
    b = rng.integers(0, 256, count, dtype=np.uint8)
    if name == "float8_e5m2" and op in (SUM, AVG):
        exp = rng.integers(10, 25, count, dtype=np.uint8)
        b = (b & 0x83) | (exp << 2)
        special = rng.random(count) < 0.02
        b[special] = rng.choice(np.array([0x00, 0x80, 0x7C, 0xFC, 0x7E], np.uint8), int(special.sum()))
    return b


def reference(inputs, op, dt):
    """The float64 reduction of the ranks' inputs, rounded once to dt (ml_dtypes: nearest even)."""
    x = [a.view(dt).astype(np.float64) for a in inputs]
    fold = {SUM: np.add, AVG: np.add, PROD: np.multiply, MIN: np.minimum, MAX: np.maximum}[op]
    with np.errstate(all="ignore"):
        r = functools.reduce(fold, x)  # not numpy's sum: it starts from +0, so -0 + -0 would be +0
        if op is AVG:
            r = r / len(inputs)
    return r.astype(dt).view(np.uint8)


def same(got, want, dt, op=None):
    """Equal bits, or NaN in both (a NaN's sign follows the operand order), or for min and max zeros of
    either sign (which of 0 and -0 wins follows the operand order, which each algorithm picks)."""
    got, want = np.asarray(got).view(np.uint8).ravel(), np.asarray(want).view(np.uint8).ravel()
    if got.shape != want.shape:
        return False
    g, w = got.view(dt).astype(np.float32), want.view(dt).astype(np.float32)
    ok = (got == want) | (np.isnan(g) & np.isnan(w))
    if op in (MIN, MAX):
        ok |= (g == 0) & (w == 0)
    return bool(np.all(ok))


class Kind:
    """One way a caller passes float8: a numpy ml_dtypes array, 1-byte words with dtype=, a torch tensor."""

    def __init__(self, kind, name):
        self.kind, self.name, self.dt = kind, name, ml_dtype(name)

    def make(self, words):
        w = np.ascontiguousarray(words)
        if self.kind == "numpy":
            return w.view(self.dt)
        if self.kind == "words":
            return w
        return torch.from_numpy(w).view(getattr(torch, self.name))

    def bits(self, buf):
        if self.kind == "torch":
            return buf.view(torch.uint8).numpy()
        return np.asarray(buf).view(np.uint8)

    def kw(self):
        return {"dtype": self.name} if self.kind == "words" else {}


def kinds():
    return ("numpy", "words") + (("torch",) if torch is not None else ())


def run_reducing(comm, coll, k, op, count, inplace, root, seed):
    """One reducing call; its result checked against the float64 reference on every rank that has one."""
    n, r = comm.size, comm.rank
    counts = [int(c) for c in np.random.default_rng([seed, 7]).integers(0, count + 1, n)]
    total = {"reduce_scatter": count * n, "reduce_scatter_v": sum(counts)}.get(coll, count)
    ins = [codes(np.random.default_rng([seed, q]), k.name, op, total) for q in range(n)]
    want = reference(ins, op, k.dt)
    x = k.make(ins[r].copy())
    if coll == "all_reduce":
        out = None if inplace else k.make(np.zeros(count, np.uint8))
        got = comm.all_reduce(x, out, op=op, **k.kw())
    elif coll == "reduce":
        out = None if inplace else k.make(np.zeros(count, np.uint8))
        got = comm.reduce(x, out, root=root, op=op, **k.kw())
        if r != root:
            return
    elif coll == "reduce_scatter":
        got = comm.reduce_scatter(x, k.make(np.zeros(count, np.uint8)), op=op, **k.kw())
        want = want[r * count:(r + 1) * count]
    else:
        off = sum(counts[:r])
        got = comm.reduce_scatter_v(x, k.make(np.zeros(counts[r], np.uint8)), counts, op=op, **k.kw())
        want = want[off:off + counts[r]]
    assert same(k.bits(got), want, k.dt, op), (coll, k.kind, k.name, op, count, inplace, root, seed)


def run_moving(comm, coll, k, count, root, seed):
    """One data-movement call on float8 (every code, NaN included): the bytes arrive unchanged."""
    n, r = comm.size, comm.rank
    ins = [codes(np.random.default_rng([seed, q]), k.name, None, count * n) for q in range(n)]
    x = k.make(ins[r].copy())
    bits = k.bits
    if coll == "all_gather":
        got = comm.all_gather(k.make(ins[r][:count].copy()), k.make(np.zeros(count * n, np.uint8)))
        want = np.concatenate([a[:count] for a in ins])
    elif coll == "broadcast":
        got = comm.broadcast(k.make(ins[r][:count].copy()), root=root)
        want = ins[root][:count]
    elif coll == "all_to_all":
        got = comm.all_to_all(x, k.make(np.zeros(count * n, np.uint8)))
        want = np.concatenate([a[r * count:(r + 1) * count] for a in ins])
    elif coll == "all_to_all_v":
        c = [(q + r) % (count + 1) for q in range(n)]  # rank r sends (q + r) % (count + 1) to q
        rc = [(r + q) % (count + 1) for q in range(n)]
        sd = [q * count for q in range(n)]
        got = comm.all_to_all_v(x, k.make(np.zeros(sum(rc), np.uint8)), c, rc, sd)
        want = np.concatenate([ins[q][r * count:r * count + rc[q]] for q in range(n)])
    elif coll == "gather":
        got = comm.gather(k.make(ins[r][:count].copy()), k.make(np.zeros(count * n, np.uint8)) if r == root else None,
                          root=root)
        if r != root:
            return
        want = np.concatenate([a[:count] for a in ins])
    elif coll == "scatter":
        got = comm.scatter(x if r == root else None, k.make(np.zeros(count, np.uint8)), root=root)
        want = ins[root][r * count:(r + 1) * count]
    elif coll == "all_gather_v":
        rc = [(q * 3 + seed) % (count + 1) for q in range(n)]
        got = comm.all_gather_v(k.make(ins[r][:rc[r]].copy()), k.make(np.zeros(sum(rc), np.uint8)), rc)
        want = np.concatenate([ins[q][:rc[q]] for q in range(n)])
    else:  # send_recv: a ring of sends and receives in a group
        got = k.make(np.zeros(count, np.uint8))
        with comm.group():
            comm.send(k.make(ins[r][:count].copy()), (r + 1) % n)
            comm.recv(got, (r - 1) % n)
        want = ins[(r - 1) % n][:count]
    assert np.array_equal(bits(got), want), (coll, k.kind, k.name, count, root, seed)


def run_case(comm, seed):
    """Random case ``seed``: collective, type, input kind, op, size (across the shared-memory slots and the
    compiled path's limits), in place or not, root; the same draw on every rank. Returns the collective."""
    rng = np.random.default_rng([seed, comm.size, 61])
    k = Kind(kinds()[int(rng.integers(len(kinds())))], NAMES[int(rng.integers(2))])
    count = int(rng.choice([1, 7, 130, 1001, 9000, 70001]))
    root = int(rng.integers(comm.size))
    if rng.random() < 0.6:
        coll = REDUCING[int(rng.integers(len(REDUCING)))]
        run_reducing(comm, coll, k, OPS[int(rng.integers(len(OPS)))], count, bool(rng.integers(2)), root,
                     1000 + seed)
    else:
        if k.kind == "words":
            k = Kind("numpy", k.name)  # 1-byte words need no dtype= to move
        coll = MOVING[int(rng.integers(len(MOVING)))]
        run_moving(comm, coll, k, count, root, 1000 + seed)
    return coll


def test_random_cases(comm):
    """48 random cases (bench/fp8_campaign.py runs more of the same draw)."""
    for seed in range(48):
        run_case(comm, seed)


def test_every_algorithm(comm):
    """Each algorithm this layout has for all_reduce, reduce, reduce_scatter (their float32 runs) and for
    all_gather, broadcast, all_to_all (the bytes), forced in turn."""
    n = comm.size
    for coll in ("all_reduce", "reduce", "reduce_scatter", "all_gather", "broadcast", "all_to_all"):
        for i, algo in enumerate(comm.algorithms(coll)):
            comm._planner.force(coll, algo)
            try:
                for name in NAMES:
                    k = Kind("numpy", name)
                    for count in (5, 3001):
                        seed = 5000 + 97 * i + count
                        if coll in REDUCING:
                            for op in OPS:
                                run_reducing(comm, coll, k, op, count, count == 5, (i + 1) % n, seed)
                        else:
                            run_moving(comm, coll, k, count, (i + 1) % n, seed)
            finally:
                comm._planner.force(coll, None)


def test_one_rounding_not_per_hop(comm):
    """e4m3fn 1 + 1/16 + 1/16 (+ 1/16): a sum rounded at every hop stays 1.0 (1.0625 rounds to even 1.0);
    rounded once it is 1.125 at 3 ranks, 1.25 at 4 (1.1875 rounds to even 1.25)."""
    n, r = comm.size, comm.rank
    dt = ml_dtype("float8_e4m3fn")
    for algo in comm.algorithms("all_reduce"):
        comm._planner.force("all_reduce", algo)
        try:
            x = np.full(4000, 1.0 if r == 0 else 0.0625, dtype=np.float32).astype(dt)
            comm.all_reduce(x)
            assert np.all(x.astype(np.float64) == {1: 1.0, 2: 1.0, 3: 1.125, 4: 1.25}[n]), (algo, x[:4])
        finally:
            comm._planner.force("all_reduce", None)
    x = np.full(3, 0.0625 if r else 1.0, np.float32).astype(dt)
    y = comm.all_reduce(x.copy(), op=AVG)  # (1 + (n - 1)/16) / n in float32, then one rounding
    assert same(y, np.array([(1 + (n - 1) / 16) / n] * 3).astype(dt), dt)


def test_overflow_and_nan_as_ml_dtypes(comm):
    """A sum past e4m3fn's 448 is NaN (no infinity), past e5m2's 57344 infinity; NaN wins min and max."""
    n = comm.size
    if n < 2:
        pytest.skip("needs two ranks: one rank's sum is its input")
    for name, big in (("float8_e4m3fn", 448.0), ("float8_e5m2", 57344.0)):
        dt = ml_dtype(name)
        x = np.array([big, big, np.nan if comm.rank == 0 else 1.0, -big], np.float32).astype(dt)
        s = comm.all_reduce(x.copy())
        want = np.array([big * n, big * n, np.nan, -big * n]).astype(dt)
        assert same(s, want, dt) and np.isnan(float(s[0])) == (name == "float8_e4m3fn"), (name, s)
        m = comm.all_reduce(x.copy(), op=MIN)
        assert np.isnan(float(m[2])) and float(m[0]) == big, (name, m)


def test_errors_name_the_argument(comm):
    """Bad combinations raise before any data moves, naming the argument."""
    u = np.zeros(4, np.uint8)
    with pytest.raises(HpcclInvalidArgument, match="'dtype'"):
        comm.all_reduce(u, dtype="float16")
    with pytest.raises(HpcclInvalidArgument, match="'dtype'"):
        comm.all_reduce(np.zeros(4, np.float32), dtype="float8_e4m3fn")
    with pytest.raises(HpcclInvalidArgument, match="'dtype'"):
        comm.reduce_scatter(np.zeros(4 * comm.size, ml_dtype("float8_e5m2")), dtype="float8_e4m3fn")
    with pytest.raises(HpcclInvalidArgument, match="'recvbuf'"):
        comm.all_reduce(np.zeros(4, ml_dtype("float8_e4m3fn")), np.zeros(4, ml_dtype("float8_e5m2")))
    with pytest.raises(HpcclInvalidArgument, match="'op'"):
        comm.all_reduce(np.zeros(4, ml_dtype("float8_e5m2")), op="xor")
    with pytest.raises(HpcclInvalidArgument, match="'dtype'"):
        comm.reduce_scatter_v(u, np.zeros(4, np.uint8), [4] + [0] * (comm.size - 1), dtype="bfloat16")


def test_check_compares_the_float8_type(comm):
    """HPCCL_CHECK sees the float8 type a call reduces (words told dtype= included): ranks that differ in it
    fail together, named."""
    if comm.size < 2:
        pytest.skip("needs two ranks to differ")
    c = hpccl.init()
    c._check_calls = True  # as HPCCL_CHECK=1 would set at creation
    try:
        with pytest.raises(hpccl.HpcclInvalidUsage, match="float8_e5m2.*float8_e4m3fn|float8_e4m3fn.*float8_e5m2"):
            c.all_reduce(np.ones(8, np.uint8), dtype="float8_e5m2" if c.rank == 0 else "float8_e4m3fn")
    finally:
        c.destroy()
