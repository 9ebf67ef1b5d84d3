"""hpccl across real separate hosts: network namespaces on one machine, each with its own IP address and
hostname, MPI bootstrap, hpccl's native engine over UCX's TCP between them (UCX_TLS=tcp,self). The veth
byte counters prove the data crossed the links. Needs root (ip netns) and the libucx wheel the engine loads
(installed here if missing)."""
from __future__ import annotations

import json
import subprocess

import pytest

from nethosts import ROOT, Hosts, ensure_iproute2, ensure_libucx, run_on_hosts
from mpirun import PYTEST_MPI_ARGS, check_sub_suite

LAYOUTS = [(2, 2), (3, 1)]  # (hosts, ranks per host)


def _results(stdout: str):
    dec, out, i = json.JSONDecoder(), [], stdout.find("RESULT ")
    while i >= 0:
        obj, end = dec.raw_decode(stdout, i + 7)
        out.append(obj)
        i = stdout.find("RESULT ", end)
    return sorted(out, key=lambda r: r["rank"])


@pytest.fixture(scope="module")
def hosts():
    ensure_iproute2()
    ensure_libucx()
    h = Hosts(3)
    try:
        yield h.create()
    finally:
        h.destroy()


def _delta(before, after, names):
    return {h: {k: after[h][k] - before[h][k] for k in ("tx", "rx")} for h in names}


@pytest.mark.parametrize("nhosts,per", LAYOUTS, ids=[f"{h}hosts-x{p}" for h, p in LAYOUTS])
def test_ranks_see_separate_nodes_and_talk_over_ucx(hosts, nhosts, per):
    before = hosts.bytes()
    proc = run_on_hosts(hosts, nhosts * per, per, ["tests/scripts/net_ranks.py", "info"], timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:]
    rows = _results(proc.stdout)
    assert len(rows) == nhosts * per, proc.stdout[-4000:]
    for row in rows:
        assert row["host"] == hosts.names[row["rank"] // per], row
        assert row["num_nodes"] == nhosts and row["node"] == row["rank"] // per, row
        assert "ucx" in row["transports"] and row["ok"], row
        assert row["tls"] == "tcp,self" and row["error_handling"] is True, row
        assert ("shm" in row["transports"]) == (per > 1), row
    moved = _delta(before, hosts.bytes(), hosts.names[:nhosts])
    # a 4 MiB all_reduce: every host sends and receives at least its share of it over its veth
    for h, d in moved.items():
        assert d["tx"] > 1 << 20 and d["rx"] > 1 << 20, (h, moved)
    print("veth bytes", moved)


@pytest.mark.parametrize("nhosts,per", LAYOUTS, ids=[f"{h}hosts-x{p}" for h, p in LAYOUTS])
def test_every_collective_and_dtype_against_numpy(hosts, nhosts, per):
    """The shared multi-rank suite (every collective x dtype x op x algorithm, 'hier' included) across hosts."""
    before = hosts.bytes()
    proc = run_on_hosts(hosts, nhosts * per, per, PYTEST_MPI_ARGS + ["tests/mpi/mpi_collectives.py"],
                        env={"PYTHONPATH": f"{ROOT}:{ROOT / 'tests' / 'net'}"}, timeout=900)
    check_sub_suite(proc, f"tests/mpi/mpi_collectives.py, {nhosts} hosts x {per}", ranks=nhosts * per)
    moved = _delta(before, hosts.bytes(), hosts.names[:nhosts])
    for h, d in moved.items():
        assert d["tx"] > 100_000 and d["rx"] > 100_000, (h, moved)
    print("veth bytes", moved)


def test_missing_network_device_is_a_clear_error_not_a_hang(hosts):
    proc = run_on_hosts(hosts, 2, 1, ["tests/scripts/net_ranks.py", "devices", "nonexistent"],
                        env={"UCX_LOG_LEVEL": "error"}, timeout=120)
    assert proc.returncode == 0, proc.stdout[-4000:]
    rows = _results(proc.stdout)
    assert len(rows) == 2, proc.stdout[-4000:]
    for row in rows:
        assert row["error"] == "HpcclEnvironmentError" and row["code"] == 6, row
        assert "UCX_NET_DEVICES=nonexistent" in row["message"], row
        assert "net0" in row["message"], row  # says what the host does have
        assert row["seconds"] < 30, row


def test_named_device_is_used(hosts):
    proc = run_on_hosts(hosts, 2, 1, ["tests/scripts/net_ranks.py", "devices", "net0"], timeout=120)
    assert proc.returncode == 0, proc.stdout[-4000:]
    rows = _results(proc.stdout)
    assert [r["error"] for r in rows] == [None, None] and all(r["ok"] for r in rows), rows


def test_namespaces_are_deleted():
    ensure_iproute2()
    h = Hosts(2, prefix=f"hd{__import__('os').getpid() % 100000}").create()
    h.destroy()
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not any(n in listed for n in h.names + [h.bridge]), listed
