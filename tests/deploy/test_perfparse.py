"""The nccl-tests output parser used by the Slurm test, on hpccl-perf's real output (2 ranks, a short sweep)."""
import pytest

from mpirun import run_mpi
from perfparse import parse, wrong_rows

SIZES = [8, 32, 128, 512, 2048, 8192, 32768]  # -b 8 -e 64K -f 4


@pytest.fixture(scope="module")
def perf_output():
    proc = run_mpi(2, ["-m", "hpccl.cli.perf", "all_reduce", "-b", "8", "-e", "64K", "-f", "4", "--check"],
                   timeout=120)
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert "# Out of bounds values : 0 OK" in proc.stdout, proc.stdout[-4000:]
    return proc.stdout


def test_parse_real_perf_output(perf_output):
    rows = parse(perf_output)
    assert rows, perf_output
    assert list(rows[0]) == ["size", "count", "type", "redop", "root", "time(us)", "algbw", "busbw", "wrong"]
    assert [int(r["size"]) for r in rows] == SIZES, perf_output  # every size, in order, once
    for r in rows:
        size, t, algbw, busbw = int(r["size"]), float(r["time(us)"]), float(r["algbw"]), float(r["busbw"])
        assert int(r["count"]) * 4 == size and r["type"] == "float32" and r["redop"] == "sum", r
        assert r["wrong"] == "0", r
        assert t > 0, r
        # algbw is bytes / time (GB/s, printed to 3 decimals, time to 0.1 us); all_reduce's busbw factor
        # 2(n-1)/n is 1 at 2 ranks
        expect = size / (t * 1e3)
        assert abs(algbw - expect) <= 0.0006 + expect * 0.06 / t, (r, expect)
        assert busbw == algbw, r
    big = [r for r in rows if int(r["size"]) >= 8192]
    assert big and all(float(r["busbw"]) > 0 for r in big), rows
    assert wrong_rows(rows) == []


def test_wrong_rows_finds_a_nonzero_wrong_column(perf_output):
    lines = perf_output.splitlines()
    i = next(k for k, line in enumerate(lines) if line.split()[:1] == ["512"])
    assert lines[i].endswith(" 0"), lines[i]
    lines[i] = lines[i][:-1] + "3"  # the row of 512 B now reports 3 wrong elements
    rows = parse("\n".join(lines))
    assert [r["size"] for r in wrong_rows(rows)] == ["512"] and wrong_rows(rows)[0]["wrong"] == "3"
    assert len(rows) == len(SIZES)


def test_rank_prefix_is_dropped(perf_output):
    # srun --label output ("0: ..."): the same rows
    text = "\n".join("0: " + line for line in perf_output.splitlines())
    assert parse(text) == parse(perf_output)
