"""hpccl-perf and hpccl-info end to end under mpiexec."""
from __future__ import annotations

import json
import re

from mpirun import run_mpi


def test_perf_sweep_checks_every_collective(tmp_path):
    js, png = tmp_path / "r.json", tmp_path / "r.png"
    proc = run_mpi(3, ["-m", "hpccl.cli.perf", "all", "-b", "8", "-e", "256K", "-f", "8", "--check",
                       "--compare", "mpi", "--json", str(js), "--plot", str(png), "-n", "3"], timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:]
    out = proc.stdout
    assert "# Out of bounds values : 0 OK" in out
    assert "mem host (alloc_host)" in out  # the default host buffers
    colls = {"all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all", "gather", "scatter",
             "all_gather_v", "reduce_scatter_v"}
    for coll in colls:
        assert f"# {coll}" in out
    data = json.loads(js.read_text())
    assert data["ranks"] == 3
    rows = data["results"]
    assert {r["coll"] for r in rows} == colls
    assert all(r["wrong"] == 0 and r["time_us"] > 0 for r in rows)
    assert any("mpi" in r["baselines"] for r in rows)
    assert png.stat().st_size > 10_000


def test_perf_algo_sweep_and_bfloat16():
    proc = run_mpi(2, ["-m", "hpccl.cli.perf", "all_reduce", "-b", "1K", "-e", "64K", "-f", "16", "-d",
                       "bfloat16", "-o", "avg", "--check", "--algo", "ring,tree,rd,oneshot,twoshot"], timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:]
    for algo in ("ring", "tree", "rd", "oneshot", "twoshot"):
        assert f"all_reduce algo {algo}" in proc.stdout
    assert "Out of bounds values : 0 OK" in proc.stdout


def test_perf_float8_checked():
    """-d float8_e4m3fn: the reductions (float32 inside, one rounding) and the data movement, each result
    against numpy's float64 reference rounded once; the rows name the type."""
    proc = run_mpi(3, ["-m", "hpccl.cli.perf", "all_reduce", "reduce_scatter_v", "all_gather", "-b", "64", "-e", "64K",
                       "-f", "32", "-d", "float8_e4m3fn", "--check"], timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert "dtype float8_e4m3fn" in proc.stdout and "Out of bounds values : 0 OK" in proc.stdout
    rows = [ln.split() for ln in proc.stdout.splitlines() if ln.strip() and not ln.startswith("#")]
    assert len(rows) == 9 and all(r[2] == "float8_e4m3fn" and r[8] == "0" for r in rows), rows


def test_perf_private_host_buffers_past_the_direct_threshold():
    """--host-alloc numpy: each rank's own heap, moved by cross-process reads; sizes where calls go direct."""
    proc = run_mpi(2, ["-m", "hpccl.cli.perf", "all_gather", "broadcast", "all_to_all", "reduce_scatter", "-b", "64K",
                       "-e", "1M", "-f", "4", "--check", "--host-alloc", "numpy", "-n", "3"], timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert "mem host, check on" in proc.stdout and "Out of bounds values : 0 OK" in proc.stdout


def test_perf_uneven_collectives_every_schedule_against_mpi():
    """all_gather_v and reduce_scatter_v (rank r's block (r + 1) units) on each schedule, checked, with
    MPI_Allgatherv / MPI_Reduce_scatter timed beside them; one node, then every rank its own emulated node."""
    for env in ({}, {"HPCCL_NODE_ID": "split:1"}):
        proc = run_mpi(3, ["-m", "hpccl.cli.perf", "all_gather_v", "reduce_scatter_v", "gather", "scatter", "-b", "8",
                           "-e", "8K", "-f", "32", "--check", "--compare", "mpi", "--algo", "direct,ring,tree",
                           "-n", "3", "-w", "1"], env=env, timeout=300)
        assert proc.returncode == 0, proc.stdout[-4000:]
        out = proc.stdout
        assert "Out of bounds values : 0 OK" in out
        for head in ("all_gather_v algo direct", "all_gather_v algo ring", "reduce_scatter_v algo ring",
                     "gather algo tree", "scatter algo direct"):
            assert f"# {head}" in out, head
        rows = [ln for ln in out.splitlines() if ln.strip() and not ln.startswith("#") and "|" in ln]
        assert rows and all(re.search(r"\|\s+[0-9.]+\s+[0-9.]+\s+[0-9.]+$", ln) for ln in rows), rows
        # 8K bytes over units of 6 (3 ranks: 1 + 2 + 3) elements of 4 bytes: 341 units, 2046 elements
        assert re.search(r"^\s+8184\s+2046\s+float32\s+sum\s+-1", out, re.M), out[-2000:]


def test_perf_rejects_bad_root():
    proc = run_mpi(2, ["-m", "hpccl.cli.perf", "broadcast", "-r", "5"], timeout=120)
    assert proc.returncode == 2 and "--root 5" in proc.stdout


def test_info_prints_config_and_topology():
    proc = run_mpi(2, ["-m", "hpccl.cli.info"], env={"HPCCL_TIMEOUT": "17", "HPCCL_NODE_ID": "split:1"},
                   timeout=120)
    assert proc.returncode == 0, proc.stdout
    assert "HPCCL_TIMEOUT" in proc.stdout and "17.0" in proc.stdout and "[env]" in proc.stdout
    assert "ranks 2, nodes 2" in proc.stdout
    assert "network path: hpccl's native engine" in proc.stdout, proc.stdout[-3000:]  # the one network stack
    lanes = re.search(r"network lanes for GPU steps: (\d+) \(HPCCL_NET_LANES=0, auto", proc.stdout)
    assert lanes and 1 <= int(lanes.group(1)) <= 4, proc.stdout[-3000:]


def test_perf_times_at_least_20_calls_per_size_unless_told():
    """A large row timed over 3 calls read 3x slow from one stalled call; like nccl-tests, 20 at least."""
    from hpccl.cli.perf import _iters
    assert _iters(64 << 20, 0) == 20 and _iters(1 << 20, 0) == 61 and _iters(8, 0) == 200
    assert _iters(64 << 20, 3) == 3


_METRICS_JOB = """
import numpy as np, hpccl
c = hpccl.init()
for _ in range(5):
    c.all_reduce(np.ones(8, np.float64))
c.broadcast(np.ones(100, np.uint8), 0)
try:
    c.broadcast(np.ones(4), root=7)
except hpccl.HpcclInvalidArgument:
    pass
print("tag", c._rec.tag)
"""


def test_info_reads_metrics(tmp_path):
    """hpccl-info --metrics reads the .prom files of a job run with HPCCL_METRICS_FILE (no MPI needed)."""
    import subprocess
    import sys
    proc = run_mpi(2, ["-c", _METRICS_JOB], env={"HPCCL_METRICS_FILE": str(tmp_path)}, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:]
    tag = re.search(r"tag (\w+)", proc.stdout).group(1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hpccl-rank0.prom", "hpccl-rank1.prom"]  # at exit
    out = subprocess.run([sys.executable, "-m", "hpccl.cli.info", "--metrics", str(tmp_path)], text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120).stdout
    for r in (0, 1):
        assert f"communicator {tag} rank {r} of 2 (world rank {r}): calls in flight 0, peers lost 0" in out, out
    ar = [ln.split() for ln in out.splitlines() if ln.split()[:1] == ["all_reduce"]]
    assert len(ar) == 2 and all(int(f[4]) == 5 and int(f[5]) == 5 * 64 for f in ar), out  # calls, bytes
    bc = [ln.split() for ln in out.splitlines() if ln.split()[:1] == ["broadcast"]]
    assert len(bc) == 2 and all(int(f[4]) == 1 and int(f[5]) == 100 for f in bc), out
    assert out.count("latency all_reduce (host, ") == 2 and out.count("errors: HpcclInvalidArgument 1") == 2, out
    bad = subprocess.run([sys.executable, "-m", "hpccl.cli.info", "--metrics", str(tmp_path / "nothing")],
                         text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120)
    assert bad.returncode != 0 and "does not exist" in bad.stdout
