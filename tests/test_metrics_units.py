"""Prometheus metrics without MPI: the latency buckets (Python's and the compiled paths' bounds agree), the
collector over a communicator's Stats parsed by Prometheus's own parser, and metrics asked for without
prometheus_client (a warning, nothing counted)."""
from __future__ import annotations

import logging
import sys

import pytest

from hpccl.observe import metrics
from hpccl.observe.stats import LAT_BUCKETS, LAT_LOW, Stats, lat_bucket

parser = pytest.importorskip("prometheus_client.parser", reason="prometheus_client is not installed")


def test_buckets_match_the_compiled_paths():
    hot = pytest.importorskip("hpccl._hotpath", reason="the compiled hot path is not built here")
    assert (hot.LAT_BUCKETS, hot.LAT_LOW) == (LAT_BUCKETS, LAT_LOW)
    assert len(metrics.BOUNDS) == LAT_BUCKETS - 1
    for i, le in enumerate(metrics.BOUNDS):  # a call just under a bound falls in its bucket, just over it in the next
        assert lat_bucket(le * 0.99) == i
        assert lat_bucket(le * 1.01) == i + 1
    assert lat_bucket(0.0) == 0 and lat_bucket(-1.0) == 0 and lat_bucket(1e6) == LAT_BUCKETS - 1


class _Rec:
    """What the collector reads of a flight recorder."""

    def __init__(self, stats: Stats) -> None:
        self.tag, self.rank, self.size, self.world_rank, self.stats = "abc123", 1, 4, 5, stats
        self.current = [3, "all_reduce", 8, "host", "", 0.0, 0.0, "running", None]


def _parse(stats: Stats) -> dict:
    from prometheus_client import CollectorRegistry, generate_latest
    reg = CollectorRegistry(auto_describe=False)
    reg.register(metrics.Collector([_Rec(stats)]))
    out: dict = {}
    for fam in parser.text_string_to_metric_families(generate_latest(reg).decode()):
        for s in fam.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def test_collector_reads_every_path():
    st = Stats(latency=True)
    for secs in (3e-6, 3e-6, 5e-3):
        st.add("all_reduce", "host", "ring", 100, secs)
    st.add_replayed("all_gather", "cuda", "replayed", 64, 2e-6)
    st.attach(lambda: [], lambda: [("door", "broadcast", "host", "hot", 7, 70, 1e-5, tuple([7] + [0] * 29))],
              lambda: False)
    st.error(ValueError("x"))
    from hpccl.errors import HpcclRemoteError
    st.error(HpcclRemoteError("gone", 2), 2)
    st.error(HpcclRemoteError("gone again", 2), 2)
    got = _parse(st)
    calls = {(lab["collective"], lab["path"], lab["algorithm"]): v for lab, v in got["hpccl_calls_total"]}
    assert calls == {("all_reduce", "python", "ring"): 3, ("all_gather", "replayed", "replayed"): 1,
                     ("broadcast", "door", "hot"): 7}
    assert {lab["comm"] for lab, _ in got["hpccl_calls_total"]} == {"abc123"}
    ar = sorted((float(lab["le"]), v) for lab, v in got["hpccl_call_latency_seconds_bucket"]
                if lab["collective"] == "all_reduce")
    assert ar[-1] == (float("inf"), 3)
    under_4us = [v for le, v in ar if le == 4.096e-06]
    assert under_4us == [2]  # the two 3 us calls; the 5 ms one lies further up
    assert dict((lab["kind"], v) for lab, v in got["hpccl_errors_total"]) == {"ValueError": 1, "HpcclRemoteError": 2}
    assert got["hpccl_peers_lost"][0][1] == 1  # one rank, seen twice
    assert got["hpccl_calls_in_flight"][0][1] == 1  # the recorder's call is running
    assert got["hpccl_communicator_size"][0] == ({"comm": "abc123", "rank": "1", "world_rank": "5"}, 4)


def test_no_histogram_while_off():
    st = Stats()
    st.add("broadcast", "host", "tree", 8, 1e-5)
    got = _parse(st)
    assert got["hpccl_calls_total"][0][1] == 1
    assert "hpccl_call_latency_seconds_bucket" not in got


def test_without_prometheus_client_warns_and_counts_nothing(monkeypatch, caplog):
    monkeypatch.setenv("HPCCL_METRICS_FILE", "/nonexistent-folder-never-made")
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # import fails
    monkeypatch.setattr(metrics, "_usable", None)
    with caplog.at_level(logging.WARNING, logger="hpccl"):
        assert metrics.active() is False
    assert "prometheus_client is not installed" in caplog.text
    monkeypatch.delenv("HPCCL_METRICS_FILE")
    assert metrics.active() is False


@pytest.mark.parametrize("name,value", [("HPCCL_METRICS_PORT", "70000"), ("HPCCL_METRICS_PORT", "http"),
                                        ("HPCCL_METRICS_INTERVAL", "0"), ("HPCCL_METRICS_INTERVAL", "-2")])
def test_bad_settings_name_the_variable(monkeypatch, name, value):
    from hpccl import config
    from hpccl.errors import HpcclInvalidArgument
    monkeypatch.setenv(name, value)
    with pytest.raises(HpcclInvalidArgument, match=name):
        config.get(name)
