"""The GPU correctness campaign (bench/gpu_campaign.py) checks itself on host buffers here, where there is
no GPU: its case drawing, references and checks must hold on a library that is right (0 wrong), and must
catch one that is not (a corrupted result is reported, and the exit code says so). It runs on the GPU
machine through bench/gpu_suite.sh."""
from __future__ import annotations

from mpirun import run_mpi, shm_leftovers


def test_campaign_dry_run_on_host_is_clean():
    p = run_mpi(2, ["bench/gpu_campaign.py", "--mem", "host", "--cases", "300", "--max-bytes", "256K"],
                timeout=120)
    assert p.returncode == 0, p.stdout[-3000:]
    assert "300 cases per rank run, 0 wrong or failed" in p.stdout, p.stdout[-2000:]
    assert not shm_leftovers()


def test_campaign_catches_a_wrong_result():
    # every 7th all_reduce result on rank 1 gets one element changed after the call: the campaign must say so
    p = run_mpi(2, ["bench/gpu_campaign.py", "--mem", "host", "--cases", "120", "--max-bytes", "64K",
                    "--corrupt-every", "7"], timeout=120)
    assert p.returncode == 1, p.stdout[-3000:]
    assert "WRONG case" in p.stdout and "0 wrong or failed" not in p.stdout, p.stdout[-2000:]
