"""Prometheus metrics (HPCCL_METRICS_FILE, HPCCL_METRICS_PORT) in every rank: the file the exporter's
thread writes and the HTTP endpoint's scrape, both parsed by prometheus_client's own parser, hold what
the ranks ran (calls, bytes, paths, the latency histogram, the failing call's error); a peer's abort
shows as a peer lost and the call waiting on it as a call in flight; hpccl-info --metrics reads it."""
from __future__ import annotations

import os
import shutil
import socket
import tempfile
import threading
import time
import urllib.request
from typing import Dict, List

import numpy as np
import pytest
from mpi4py import MPI

import hpccl
from hpccl.cli import info
from hpccl.observe import metrics

parser = pytest.importorskip("prometheus_client.parser", reason="prometheus_client is not installed")
WORLD = MPI.COMM_WORLD
K = 7  # small all_reduce calls, each through a front door where the layout has one


@pytest.fixture
def folder(monkeypatch):
    d = WORLD.bcast(tempfile.mkdtemp(prefix="hpccl-metrics-test-") if WORLD.rank == 0 else None)
    monkeypatch.setenv("HPCCL_METRICS_FILE", d)
    monkeypatch.setenv("HPCCL_METRICS_INTERVAL", "0.1")
    yield d
    metrics.shutdown()
    WORLD.barrier()
    if WORLD.rank == 0:
        shutil.rmtree(d, ignore_errors=True)


def samples(text: str) -> Dict[str, List]:
    """{sample name: [(labels, value)]}, parsed by Prometheus's own parser."""
    out: Dict[str, List] = {}
    for fam in parser.text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def total(found: Dict[str, List], name: str, **match: str) -> float:
    return sum(v for lab, v in found.get(name, []) if all(lab.get(k) == m for k, m in match.items()))


def run_calls(comm) -> int:
    """The calls every test below checks: K small all_reduces (front door), one large one, an all_gather
    allocating its output (validated), a broadcast, and an all_reduce with bad input (refused). Returns
    the bytes of the all_reduces."""
    n = comm.size
    for _ in range(K):
        comm.all_reduce(np.ones(4, np.float32))
    comm.all_reduce(np.ones(1 << 19, np.float64))  # 4 MiB
    comm.all_gather(np.ones(3, np.int32))
    comm.broadcast(np.ones(10, np.uint8), 0)
    with pytest.raises(hpccl.HpcclInvalidArgument):
        comm.all_reduce(np.ones(3, np.float32), np.ones(4, np.float32))
    assert n >= 2
    return K * 16 + (1 << 22)


def check(found: Dict[str, List], comm, ar_bytes: int) -> None:
    """What run_calls ran, as this rank's metrics say, against comm.stats() and the calls themselves."""
    me = dict(comm=comm._rec.tag, rank=str(comm.rank))
    assert total(found, "hpccl_calls_total", collective="all_reduce", **me) == K + 1
    assert total(found, "hpccl_bytes_total", collective="all_reduce", **me) == ar_bytes
    assert total(found, "hpccl_calls_total", collective="all_gather", **me) == 1
    assert total(found, "hpccl_bytes_total", collective="all_gather", **me) == 3 * 4 * comm.size
    assert total(found, "hpccl_calls_total", collective="broadcast", **me) == 1
    for coll, rows in comm.stats().items():  # the same totals as comm.stats(), collective by collective
        assert total(found, "hpccl_calls_total", collective=coll, **me) == sum(r["calls"] for r in rows.values())
        assert total(found, "hpccl_bytes_total", collective=coll, **me) == sum(r["bytes"] for r in rows.values())
    door = total(found, "hpccl_calls_total", collective="all_reduce", path="door", **me)
    if "all_reduce" in comm._front:  # the small calls took the front door (the large one may too)
        assert K <= door <= K + 1
    else:
        assert door == 0
    assert total(found, "hpccl_calls_total", collective="all_gather", path="python", **me) == 1  # no recvbuf
    # the histogram counts every call once, per collective, memory kind and path; buckets are cumulative
    for labels, n in found["hpccl_calls_total"]:
        if labels["comm"] != me["comm"] or labels["rank"] != me["rank"]:
            continue
        key = {k: labels[k] for k in ("comm", "rank", "collective", "memory", "path")}
        count = total(found, "hpccl_call_latency_seconds_count", **key)
        calls = total(found, "hpccl_calls_total", **key)
        assert count == calls, (key, count, calls)
        buckets = sorted((float(lab["le"]), v) for lab, v in found["hpccl_call_latency_seconds_bucket"]
                         if all(lab.get(k) == x for k, x in key.items()))
        assert [v for _, v in buckets] == sorted(v for _, v in buckets)
        assert buckets[-1] == (float("inf"), count)
    assert total(found, "hpccl_errors_total", kind="HpcclInvalidArgument", **me) == 1
    assert total(found, "hpccl_peers_lost", **me) == 0
    assert total(found, "hpccl_calls_in_flight", **me) == 0
    assert total(found, "hpccl_communicator_size", **me) == comm.size


def test_file_holds_what_ran(folder, capsys):
    """The exporter's thread rewrites hpccl-rank<R>.prom; once it has after the calls, the file says what ran."""
    comm = hpccl.init()
    try:
        ar_bytes = run_calls(comm)
        path = os.path.join(folder, f"hpccl-rank{WORLD.rank}.prom")
        done = time.time()
        deadline = done + 60
        while not (os.path.exists(path) and os.stat(path).st_mtime > done + 0.05):  # a write after the calls
            assert time.time() < deadline, "the metrics file was not rewritten within 60 s"
            time.sleep(0.05)
        with open(path) as f:
            check(samples(f.read()), comm, ar_bytes)
        WORLD.barrier()
        assert info.main(["--metrics", folder]) == 0  # hpccl-info reads every rank's file
        out = capsys.readouterr().out
        for r in range(WORLD.size):
            assert f"communicator {comm._rec.tag} rank {r} of {comm.size}" in out
        assert "errors: HpcclInvalidArgument 1" in out
    finally:
        comm.destroy()


def _free_port() -> int:
    """A base port whose next WORLD.size ports were free a moment ago (bound, then closed)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + WORLD.size > 65535:
            continue
        ok = True
        for p in range(base, base + WORLD.size):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", p))
                except OSError:
                    ok = False
                    break
        if ok:
            return base
    raise AssertionError("no free ports")


def test_http_endpoint(monkeypatch):
    """HPCCL_METRICS_PORT: each process serves /metrics on the port plus its local rank."""
    base = WORLD.bcast(_free_port() if WORLD.rank == 0 else None)
    monkeypatch.setenv("HPCCL_METRICS_PORT", str(base))
    monkeypatch.delenv("HPCCL_METRICS_FILE", raising=False)
    comm = hpccl.init()
    try:
        ar_bytes = run_calls(comm)
        port = metrics.endpoint()
        assert port is not None and base <= port < base + WORLD.size
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as r:
            check(samples(r.read().decode()), comm, ar_bytes)
        assert info.main(["--metrics", f"http://127.0.0.1:{port}/metrics"]) == 0
    finally:
        metrics.shutdown()
        comm.destroy()
    WORLD.barrier()


def test_port_in_use_warns(monkeypatch, caplog):
    """A port that cannot be bound: a warning naming it, no endpoint, the calls run and are counted."""
    base = WORLD.bcast(_free_port() if WORLD.rank == 0 else None)
    local = metrics._local_rank()
    with socket.socket() as held:
        held.bind(("", base + local))
        held.listen(1)
        monkeypatch.setenv("HPCCL_METRICS_PORT", str(base))
        monkeypatch.delenv("HPCCL_METRICS_FILE", raising=False)
        comm = hpccl.init()
        try:
            assert metrics.endpoint() is None
            assert f"cannot serve on port {base + local}" in caplog.text
            comm.all_reduce(np.ones(4))
            me = dict(comm=comm._rec.tag, rank=str(comm.rank))
            assert total(samples(metrics.text()), "hpccl_calls_total", collective="all_reduce", **me) == 1
        finally:
            metrics.shutdown()
            comm.destroy()
    WORLD.barrier()


def test_peer_lost_and_call_in_flight(folder, monkeypatch):
    """The last rank aborts while the others wait in an all_reduce: while they wait the gauge says a call
    is in flight; then their error is counted (HpcclRemoteError) with the aborting rank as a peer lost."""
    monkeypatch.setenv("HPCCL_TIMEOUT", "60")
    comm = hpccl.init()
    failing = comm.size - 1
    seen: List[str] = []
    try:
        comm.all_reduce(np.ones(8))
        if comm.rank == failing:
            time.sleep(2.5)  # the others are inside the next call by now, and have been sampled there
            comm.abort()
        else:
            t = threading.Timer(0.5, lambda: seen.append(metrics.text()))
            t.start()
            with pytest.raises(hpccl.HpcclRemoteError):
                comm.all_reduce(np.ones(1 << 16))
            t.join()
            me = dict(comm=comm._rec.tag, rank=str(comm.rank))
            assert total(samples(seen[0]), "hpccl_calls_in_flight", **me) == 1
            found = samples(metrics.text())
            assert total(found, "hpccl_calls_in_flight", **me) == 0
            assert total(found, "hpccl_peers_lost", **me) == 1
            assert total(found, "hpccl_errors_total", kind="HpcclRemoteError", **me) == 1
    finally:
        WORLD.barrier()
        comm.destroy()
