"""The one front end's pieces that need no MPI or GPU: which algorithms the table offers for each memory
kind and node layout, what the one tuner picks among them, and the network proxy's ordering and failure
handling (with a stand-in for its CUDA side)."""
from __future__ import annotations

import threading
import time

import pytest

from hpccl.algorithms import ALGORITHMS, CUDA, HOST, VCOLLS, Layout, eligible
from hpccl.errors import HpcclTimeoutError, HpcclUnsupported
from hpccl.gpu.proxy import DEFAULT_STREAMS, Proxy
from hpccl.core.tuning import KERNEL_MODELS, Tuner

ONE_NODE = Layout(nodes=1, local=2, equal=True, window=True, single_copy=True)
TWO_BY_TWO = Layout(nodes=2, local=2, equal=True)
TWO_BY_ONE = Layout(nodes=2, local=1, equal=True)
UNEVEN = Layout(nodes=2, local=2, equal=False)


def test_host_table_unchanged_by_device_entries():
    assert set(eligible("all_reduce", HOST, ONE_NODE)) == {"cma", "ring", "tree", "rd", "dbtree", "oneshot", "twoshot"}
    assert set(eligible("all_reduce", HOST, TWO_BY_TWO)) == {"ring", "tree", "rd", "dbtree", "hier"}
    assert "hier" not in eligible("all_reduce", HOST, UNEVEN)


def test_device_one_node_gets_only_kernels():
    assert set(eligible("all_reduce", CUDA, ONE_NODE)) == {"oneshot", "twoshot"}
    for coll in ("all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all"):
        assert eligible(coll, CUDA, ONE_NODE) == ["direct"], coll
        assert ALGORITHMS[coll]["direct"].cuda_scope == "node"


def test_device_across_nodes_gets_network_schedules_and_hier():
    names = eligible("all_reduce", CUDA, TWO_BY_TWO)
    assert set(names) == {"ring", "tree", "rd", "dbtree", "hier"}
    assert "hier" not in eligible("all_reduce", CUDA, TWO_BY_ONE)   # one GPU per node: flat is hier
    assert "hier" not in eligible("all_reduce", CUDA, UNEVEN)       # unequal nodes: flat ring over UCX
    assert eligible("all_to_all", CUDA, TWO_BY_TWO) == ["linear"]
    for coll in set(ALGORITHMS) - set(VCOLLS):  # every collective has a device algorithm on every layout
        for lay in (ONE_NODE, TWO_BY_TWO, TWO_BY_ONE, UNEVEN):
            assert eligible(coll, CUDA, lay), (coll, lay)


def test_tuner_prices_kernels_on_one_node():
    t = Tuner("shm", 8, 8)
    assert t.choose("all_reduce", 8, eligible("all_reduce", CUDA, ONE_NODE), CUDA) == "oneshot"
    assert t.choose("all_reduce", 256 << 20, eligible("all_reduce", CUDA, ONE_NODE), CUDA) == "twoshot"
    # the same tuner keeps host and device decisions apart
    assert t.choose("all_reduce", 256 << 20, ["ring", "tree", "rd"], HOST) == "ring"
    assert t.predict("all_gather", "direct", 1 << 20, CUDA) == pytest.approx(KERNEL_MODELS["all_gather"]["direct"](1 << 20, 8))


def test_tuner_prefers_hier_for_large_device_calls_across_nodes():
    t = Tuner("ucx", 16, 8, nodes=2)
    names = eligible("all_reduce", CUDA, Layout(2, 8, True))
    assert t.choose("all_reduce", 256 << 20, names, CUDA) == "hier"
    assert t.predict("all_reduce", "hier", 256 << 20, CUDA) < t.predict("all_reduce", "ring", 256 << 20, CUDA)


class FakeOps:
    """The proxy's CUDA side, recorded: events are ready at once, holds and releases are logged."""

    def __init__(self, capturing=False):
        self.log = []
        self.capturing_ = capturing
        self.lock = threading.Lock()

    def capturing(self, stream):
        return self.capturing_

    def record(self, stream):
        self.log.append(("record", stream))
        return object()

    def ready(self, ev):
        return True

    def hold(self, stream, gen):
        self.log.append(("hold", stream, gen))

    def release(self, gen):
        with self.lock:
            self.log.append(("release", gen))

    def thread_setup(self):
        return None

    def thread_sync(self, s):
        pass

    def close(self):
        self.log.append(("close",))


def test_proxy_runs_steps_in_order_and_releases_each(monkeypatch):
    monkeypatch.setenv("HPCCL_GPU_NET_ASYNC", "1")
    ops = FakeOps()
    p = Proxy(ops, on_fail=lambda: None)
    order = []
    for i in range(20):
        p.enqueue(1234, lambda i=i: (time.sleep(0.001), order.append(i)), f"step {i}")
    assert p.drain(5)
    assert order == list(range(20))
    assert [e for e in ops.log if e[0] == "hold"] == [("hold", 1234, g) for g in range(1, 21)]
    assert [e[1] for e in ops.log if e[0] == "release"] == list(range(1, 21))
    p.close()
    assert ops.log[-1] == ("close",)


def test_proxy_failure_is_kept_named_and_still_releases(monkeypatch):
    monkeypatch.setenv("HPCCL_GPU_NET_ASYNC", "1")
    ops = FakeOps()
    failed = []
    p = Proxy(ops, on_fail=lambda: failed.append(True))
    ran = []

    def bad():
        raise HpcclTimeoutError("all_reduce", 7, [3], 1.0)
    p.enqueue(99, bad, "all_reduce #7")
    p.enqueue(99, lambda: ran.append(1), "all_gather #8")  # after a failure: skipped, still released
    assert p.drain(5)
    assert ran == [] and failed == [True]
    assert [e[1] for e in ops.log if e[0] == "release"] == [1, 2]
    with pytest.raises(HpcclTimeoutError) as info:
        p.raise_error()
    assert info.value.missing == [3] and info.value.collective == "all_reduce"
    p.close()


def test_proxy_default_mode_completes_inside_the_call(monkeypatch):
    monkeypatch.delenv("HPCCL_GPU_NET_ASYNC", raising=False)
    ops = FakeOps()
    p = Proxy(ops, on_fail=lambda: None)
    done = []
    p.enqueue(5555, lambda: (time.sleep(0.05), done.append(1)), "broadcast #1")
    assert done == [1]                            # returned only after the step ran
    assert not [e for e in ops.log if e[0] == "hold"]
    monkeypatch.setenv("HPCCL_GPU_NET_ASYNC", "1")
    q = Proxy(ops, on_fail=lambda: None)
    q.enqueue(DEFAULT_STREAMS[0], lambda: done.append(2), "broadcast #2")  # legacy stream: never held
    assert done == [1, 2] and not [e for e in ops.log if e[0] == "hold"]
    p.close()
    q.close()


def test_proxy_refuses_a_capturing_stream_before_anything():
    ops = FakeOps(capturing=True)
    p = Proxy(ops, on_fail=lambda: None)
    with pytest.raises(HpcclUnsupported, match="CUDA graph"):
        p.enqueue(42, lambda: None, "all_reduce #1")
    assert ops.log == []
    p.close()


def test_vcolls_schedules_are_chosen_where_their_cost_is_lowest():
    """Binomial gather/scatter for small blocks on many ranks, direct for large ones or few ranks; the ring for
    large all_gather_v / reduce_scatter_v past two ranks, direct for small ones; each choice the model's minimum."""
    many, four = Tuner("shm", 8, 8), Tuner("mpi", 4, 1, nodes=4)
    for coll in ("gather", "scatter"):
        names = eligible(coll, HOST, ONE_NODE)
        assert set(names) == {"direct", "tree"}
        assert many.choose(coll, 64, names) == "tree"
        assert many.choose(coll, 16 << 20, names) == "direct"
        assert Tuner("shm", 2, 2).choose(coll, 64, names) == "direct"
    for coll in ("all_gather_v", "reduce_scatter_v"):
        names = eligible(coll, HOST, TWO_BY_TWO)
        assert set(names) == {"direct", "ring"}  # no hier: flat schedules over every rank
        assert four.choose(coll, 64, names) == "direct"
        assert four.choose(coll, 16 << 20, names) == "ring"
        for t, nb in ((many, 1 << 10), (many, 1 << 24), (four, 1 << 16)):
            pick = t.choose(coll, nb, names)
            probe = 3 << (nb.bit_length() - 2)
            assert t.predict(coll, pick, probe) == min(t.predict(coll, a, probe) for a in names)
    for coll in VCOLLS:  # device memory runs them as one group of sends and receives: no table entry serves it
        assert eligible(coll, CUDA, ONE_NODE) == [] and eligible(coll, CUDA, TWO_BY_TWO) == []


def test_vcolls_planned_onto_the_hot_path_unless_a_schedule_is_pinned(monkeypatch):
    from hpccl.core.planner import HOT, SCHEDULE, Planner
    monkeypatch.setenv("HPCCL_ALGO", "reduce_scatter_v:ring")
    pl = Planner(Tuner("shm", 4, 4), ONE_NODE)
    assert pl.plan("gather", 256, HOST).route == SCHEDULE  # no hot path attached
    pl.attach_hot(object(), ("all_gather", "broadcast", "reduce_scatter"), front_open=False)
    for coll in ("gather", "scatter", "all_gather_v"):
        p = pl.plan(coll, 256, HOST)
        assert (p.route, p.algo) == (HOT, "padded") and p.fallback.algo == "direct", coll
    p = pl.plan("reduce_scatter_v", 256, HOST)  # pinned by HPCCL_ALGO: the schedule runs
    assert (p.route, p.algo) == (SCHEDULE, "ring")
    pl.force("gather", "tree")
    assert pl.plan("gather", 256, HOST).algo == "tree"
    pl.force("gather", None)
    assert pl.plan("gather", 256, HOST).route == HOT
    wide = Planner(Tuner("ucx", 4, 1, nodes=4), Layout(nodes=4, local=1, equal=True))
    wide.attach_hot(object(), ("all_gather", "broadcast", "all_reduce"), front_open=False)
    assert wide.plan("gather", 256, HOST).route == SCHEDULE  # across nodes from 3 ranks: gather's schedule
    assert wide.plan("scatter", 256, HOST).route == HOT
    pl.force("reduce_scatter_v", None)
    pl.attach_hot(object(), ("broadcast", "all_reduce"), front_open=False)  # the network engine's compiled path
    assert pl.plan("all_gather_v", 256, HOST).route == SCHEDULE  # no all_gather there: nothing to pad onto
    assert pl.plan("reduce_scatter_v", 256, HOST).route == HOT  # an all_reduce of the whole input
