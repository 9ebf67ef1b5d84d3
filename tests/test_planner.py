"""The planner (hpccl/core/planner.py): one plan per (collective, kind, size bucket), routes that may decline
carry the plan to run instead, and a forced choice drops the plans and everything that replays them."""
from hpccl.algorithms import CUDA, HOST, Layout
from hpccl.core.planner import HIER, HOT, KERNEL, PROXY, SCHEDULE, ZERO_COPY, Planner
from hpccl.core.tuning import Tuner

ONE_NODE = Layout(1, 4, True, True, True)
TWO_NODES = Layout(2, 2, True, False, False)


def planner(layout=ONE_NODE, ranks=4, local=4, nodes=1, path="shm"):
    return Planner(Tuner(path, ranks, local, nodes), layout)


def test_plans_are_made_once_per_size_bucket(monkeypatch):
    p = planner()
    asked = []
    choose = p.tuner.choose
    monkeypatch.setattr(p.tuner, "choose", lambda *a: asked.append(a) or choose(*a))
    first = p.plan("all_reduce", 1000, HOST)
    assert p.plan("all_reduce", 1023, HOST) is first  # same power-of-two bucket: the cached plan
    assert len(asked) == 1
    p.plan("all_reduce", 1024, HOST)
    p.plan("all_reduce", 1000, CUDA)
    assert len(asked) == 3
    assert first.route == SCHEDULE and first.spec.name == first.algo and first.fallback is None


def test_routes_follow_the_table():
    p = planner()
    k = p.plan("all_reduce", 8, CUDA)
    assert k.route == KERNEL and k.spec.cuda_scope == "node"
    net = planner(TWO_NODES, 4, 2, 2, "ucx")
    for nbytes in (8, 1 << 20, 256 << 20):
        q = net.plan("all_reduce", nbytes, CUDA)
        assert q.route in (PROXY, HIER)
        assert (q.spec is None) == (q.route == HIER)


class FakeHot:
    pass


def test_hot_path_plans_fall_back_and_the_front_door_follows_force():
    p = planner()
    front = p.front
    hot = FakeHot()
    p.attach_hot(hot, ("all_reduce", "broadcast"), True)
    assert p.front is front and front == {"all_reduce": hot, "broadcast": hot}
    h = p.plan("all_reduce", 64, HOST)
    assert h.route == HOT and h.fallback is not None and h.fallback.route == SCHEDULE
    assert p.plan("all_gather", 64, HOST).route != HOT  # not served by this hot path
    assert "hot" in p.algorithms("all_reduce", HOST) and "hot" not in p.algorithms("all_gather", HOST)

    p.force("all_reduce", "ring")
    assert front == {"broadcast": hot}  # the same dict, emptied and refilled in place
    assert p.plan("all_reduce", 64, HOST).algo == "ring"
    p.force("all_reduce", None)
    assert "all_reduce" in front and p.plan("all_reduce", 64, HOST).route == HOT
    p.force("*", "tree")
    assert front == {}
    assert p.plan("broadcast", 64, HOST).algo == "tree"


def test_front_door_stays_shut_when_every_call_must_pass_through_python():
    p = planner()
    p.attach_hot(FakeHot(), ("all_reduce",), False)
    assert p.front == {} and p.plan("all_reduce", 8, HOST).route == HOT  # validated calls still take it


def test_force_drops_snapshots_and_close_stops_replays():
    p = planner()
    dropped = []
    p.on_drop.append(lambda: dropped.append(1))
    p.snapshot(("ar", 1), "oneshot")
    p.snapshot(None, "oneshot")
    assert p.replays == {("ar", 1): "oneshot"}
    p.force("all_reduce", "twoshot")
    assert p.replays == {} and dropped == [1]
    p.attach_hot(FakeHot(), ("all_reduce",), True)
    p.force("all_reduce", None)
    assert p.front
    p.close()
    assert p.front == {} and p.plan("all_reduce", 8, HOST).route != HOT


def test_registered_buffers_put_zero_copy_first():
    p = planner()
    assert p.plan("all_gather", 1 << 20, CUDA).route == KERNEL
    p.register()
    z = p.plan("all_gather", 1 << 20, CUDA)
    assert z.route == ZERO_COPY and z.fallback.route == KERNEL
    assert p.plan("all_gather", 1 << 20, HOST).route != ZERO_COPY


def test_transport_table_routes_each_peer_once():
    from hpccl.transport.table import TransportTable

    class T:
        def __init__(self, name):
            self.name = name

    shm, net = T("shm"), T("mpi")
    t = TransportTable(1, 6)
    t.add("shm", "messages", [0, 1, 2], shm)
    t.add("cma", "reads", [0, 1, 2])
    t.add("mpi", "messages", [r for r in range(6) if r not in t.of], net)
    assert t.of == {0: shm, 1: shm, 2: shm, 3: net, 4: net, 5: net}
    assert t.messaging == [shm, net]  # rows without a message transport carry none
    assert t.reaches("cma") == (0, 2) and t.reaches("cuda_ipc") == ()
    assert t.find("mpi") is net and t.find("cma") is None
    assert t.unreached() == []
    assert t.describe() == ("shm (messages) -> ranks 0,2; cma (reads) -> ranks 0,2; "
                            "mpi (messages) -> ranks 3-5")
    msgs = t.messaging
    t.clear()
    assert msgs == [] and t.rows == [] and t.unreached() == list(range(6))
