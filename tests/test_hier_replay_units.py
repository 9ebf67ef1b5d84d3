"""hier's chains (hpccl/gpu/hierreplay.py) without a GPU: which calls a chain carries, and how a replay goes
when each of its sub-calls can or cannot be replayed (stand-ins for the node engine, the network door and
the sub-communicators; the GPU run is tests/scripts/hier_replay.py, logs under docs/perf/issue33/)."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from hpccl.gpu import hierreplay
from hpccl.ops import AVG, MAX, SUM


class Engine:
    def __init__(self) -> None:
        self.snap = {"rs": True, "ag": True}
        self.fired: list = []
        self.dropped = 0

    def fire(self, key: tuple) -> bool:
        if not self.snap[key[0]]:
            return False
        self.fired.append(key[0])
        return True

    def drop(self) -> None:
        self.dropped += 1


class Door:
    def __init__(self) -> None:
        self.ok, self.fired = True, 0

    def fire(self, code, send, recv, op, root, stream) -> bool:
        assert (code, recv, root) == (0, None, -1)
        self.fired += self.ok
        return self.ok


class Sub:
    """A sub-communicator: its Python calls are logged (what runs when a replay cannot)."""

    def __init__(self, log: list, eng=None, door=None) -> None:
        self.log, self._group, self._door = log, None, door
        self._dev = SimpleNamespace(engine=eng)

    def reduce_scatter(self, send, recv, op, stream):
        self.log.append("rs")

    def all_reduce(self, send, recv, op, stream):
        self.log.append("ar")

    def all_gather(self, send, recv, stream):
        self.log.append("ag")


def _setup(capturing: bool = False):
    log: list = []
    eng, door = Engine(), Door()
    comm = SimpleNamespace(local_size=2, _sub={"intra": Sub(log, eng), "inter": Sub(log, door=door)},
                           _dev=SimpleNamespace(capturing=lambda st: capturing))
    chains = hierreplay.HierChains(comm)
    ch = object.__new__(hierreplay.Chain)
    ch.part = ch.send = ch.recv = object()
    ch.op, ch.stream, ch.k_rs, ch.k_ag = SUM, 7, ("rs",), ("ag",)
    chains.chains[("key",)] = ch
    counted: list = []
    return chains, eng, door, log, counted, counted.append


def test_a_chain_carries_even_all_reduces_with_a_key_and_no_avg_nor_bfloat16():
    """bfloat16 stays out: the GPU matrix at split:2 x 4 (docs/perf/issue33/hier_chain/) found its uint16 view
    refused by the sub-communicators' calls."""
    chains = hierreplay.HierChains(SimpleNamespace(local_size=4))
    x = np.zeros(16, np.float32)

    def call(coll="all_reduce", key=("k",), finish=None, op=SUM, size=16, dtype=np.float32):
        return SimpleNamespace(coll=coll, key=key, finish=finish, op=op, args=(np.zeros(size, dtype), x, op))
    assert chains.takes(call()) and chains.takes(call(op=MAX)) and chains.takes(call(dtype=np.float16))
    for why, c in {"all_gather": call(coll="all_gather"), "no key": call(key=None), "avg": call(op=AVG),
                   "a finish step": call(finish=x), "uneven": call(size=18),
                   "bfloat16 (a uint16 view)": call(dtype=np.uint16)}.items():
        assert not chains.takes(c), why


def test_chains_keep_at_most_max_held_bytes_of_temporaries(monkeypatch):
    """A chain keeps its temporary (1/local of the call) between calls: a call whose temporary alone passes
    MAX_HELD is left to the Python path, and a new chain that would take the total past it first lets the others
    go (as MAX_CHAINS does), so chains never hold more GPU memory than that."""
    made: list = []

    class Chain:  # what record() makes, without CuPy
        def __init__(self, send, recv, op, stream, local) -> None:
            made.append(send.nbytes // local)
            self.k_rs = None

        def run(self, intra, inter, start=0) -> None:
            pass
    monkeypatch.setattr(hierreplay, "Chain", Chain)
    monkeypatch.setattr(hierreplay, "MAX_HELD", 1000)
    comm = SimpleNamespace(local_size=2, _subcomm=lambda name: SimpleNamespace(_dev=None), _sub={})
    chains = hierreplay.HierChains(comm)

    def call(key, n):  # n float32 elements: a temporary of 2n bytes at 2 ranks per node
        x = np.zeros(n, np.float32)
        return SimpleNamespace(coll="all_reduce", key=key, finish=None, op=SUM, args=(x, x, SUM), stream=0)
    assert chains.takes(call("a", 500)) and not chains.takes(call("big", 502))
    for key, n in (("a", 200), ("b", 200), ("a", 200)):  # 400 + 400 bytes, "a" again reuses its chain
        chains.record(call(key, n))
    assert made == [400, 400] and chains.held == 800 and set(chains.chains) == {"a", "b"}
    chains.record(call("c", 150))  # 800 + 300 > 1000: a and b go first
    assert set(chains.chains) == {"c"} and chains.held == 300
    chains.drop()
    assert chains.chains == {} and chains.held == 0


def test_a_replay_is_the_three_sub_calls_replays_and_counted_once():
    chains, eng, door, log, counted, count = _setup()
    assert chains.fire(("key",), count) and chains.fire(("key",), count)
    assert eng.fired == ["rs", "ag", "rs", "ag"] and door.fired == 2 and log == [] and counted == ["all_reduce"] * 2
    assert chains.fired == 2


@pytest.mark.parametrize("why", ["no chain", "capturing", "no first snapshot", "a node group open"])
def test_a_declined_replay_enqueues_and_counts_nothing(why):
    chains, eng, door, log, counted, count = _setup(capturing=why == "capturing")
    key = ("other",) if why == "no chain" else ("key",)
    if why == "no first snapshot":
        eng.snap["rs"] = False
    if why == "a node group open":
        chains.comm._sub["intra"]._group = []
    assert not chains.fire(key, count)
    assert eng.fired == [] and door.fired == 0 and log == [] and counted == [] and chains.fired == 0


def test_after_the_first_sub_call_the_rest_runs_in_python_from_where_the_replay_stopped():
    chains, eng, door, log, counted, count = _setup()
    door.ok = False  # the door declines (its recording dropped): the network call and the gather run
    assert chains.fire(("key",), count)
    assert eng.fired == ["rs"] and log == ["ar", "ag"] and len(counted) == 1
    log.clear()
    eng.fired.clear()
    door.ok, eng.snap["ag"] = True, False  # the gather's snapshot is gone: only it runs in Python
    assert chains.fire(("key",), count)
    assert eng.fired == ["rs"] and door.fired == 1 and log == ["ag"] and len(counted) == 2


def test_drop_forgets_every_chain_and_the_node_engines_snapshots():
    chains, eng, door, log, counted, count = _setup()
    chains.drop()
    assert chains.chains == {} and eng.dropped == 1 and not chains.fire(("key",), count)


class _Native:
    def __init__(self) -> None:
        self.armed: list = []

    def arm_hier(self, *args) -> None:
        self.armed.append(args)


def _torch_group(chain, slot: int = 3, inter_door: bool = True):
    """A stand-in for torch's ReplayGroup around a communicator whose hier chains hold ``chain`` under the key
    of the tensor it is called with; the node engine has snapshots (NOTHING) for both node sub-calls."""
    from hpccl.gpu.cuda_comm import NOTHING

    class Door:
        generation = 5
        count_call = 77

        def slot(self, code, send, recv, op, root, stream):
            assert (code, recv, root) == (0, None, -1) and send is chain.part
            return slot

    eng = SimpleNamespace(_fast={("rs",): NOTHING, ("ag",): NOTHING}, fs=SimpleNamespace(gen=9))
    hier = hierreplay.HierChains(SimpleNamespace(local_size=2))
    keys = SimpleNamespace(key=lambda coll, send, recv, op, root, st: ("ar", send.data_ptr(), recv, op, root, st))
    comm = SimpleNamespace(_dev=SimpleNamespace(keys=keys),
                           _sub={"intra": SimpleNamespace(_dev=SimpleNamespace(engine=eng)),
                                 "inter": SimpleNamespace(_door=Door() if inter_door else None)})
    native, kept = _Native(), {}
    g = SimpleNamespace(comm=comm, native=native, _engine=eng, _door=comm._sub["inter"]._door,
                        _keep=lambda key, what, gen: kept.update({key: (what, gen)}))
    from hpccl.torch.replay import ReplayGroup
    g._replayable = ReplayGroup._replayable
    return g, hier, native, kept


@pytest.mark.parametrize("why", ["armed", "no chain", "no first snapshot", "no door recording", "no door"])
def test_torch_arms_a_chain_only_when_its_three_sub_calls_can_be_replayed(why):
    """ReplayGroup._arm_hier (hpccl/torch/replay.py) hands the compiled side a chain's two node snapshots and
    the door's slot, counted on the user's communicator, under the user's tensor; with any of the three
    missing it arms nothing (the call stays on hpccl's Python side, which replays what it can)."""
    torch = pytest.importorskip("torch")
    from hpccl.torch.replay import ReplayGroup
    t = torch.zeros(16)
    ch = object.__new__(hierreplay.Chain)
    ch.part, ch.op, ch.stream = object(), SUM, 7
    ch.k_rs, ch.k_ag = (("rs",), ("ag",)) if why != "no first snapshot" else (None, ("ag",))
    g, hier, native, kept = _torch_group(ch, slot=-1 if why == "no door recording" else 3,
                                         inter_door=why != "no door")
    if why != "no chain":
        hier.chains[("ar", t.data_ptr(), None, SUM, -1, 7)] = ch
    ReplayGroup._arm_hier(g, hier, t, SUM, 0, 7)
    if why != "armed":
        assert native.armed == [] and kept == {}, why
        return
    (args,) = native.armed
    assert args[:4] == (t, 0, 7, 9)  # tensor, torch's op, stream, the node engine's generation
    assert args[4:9] == (0, 0, 0, 0, 0) and args[9:11] == (3, 5) and args[11:16] == (0, 0, 0, 0, 0)
    assert args[16] == 77 and args[17] == id(g.comm)
    (what, gen), = kept.values()
    assert what[2] is ch and gen == 9  # the chain (its temporary) is held while the compiled side may replay it
