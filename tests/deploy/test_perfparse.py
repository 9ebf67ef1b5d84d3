"""The nccl-tests output parser used by the Slurm test."""
from perfparse import parse, wrong_rows

SAMPLE = """\
# hpccl-perf all_reduce
#
#                                                              out-of-place                       in-place
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
           8             2     float     sum      -1    10.21    0.00    0.00      0    10.11    0.00    0.00      0
          32             8     float     sum      -1    10.50    0.00    0.00      3    10.40    0.00    0.00    N/A
# Out of bounds values : 0 OK
"""


def test_parse_and_wrong():
    rows = parse(SAMPLE)
    assert [r["size"] for r in rows] == ["8", "32"]
    assert rows[0]["wrong"] == "0" and rows[0]["wrong_1"] == "0"
    assert wrong_rows(rows) == [rows[1]]


def test_rank_prefix_is_dropped():
    text = "\n".join("0: " + line for line in SAMPLE.splitlines())
    assert len(parse(text)) == 2
