"""Ratios hpccl / MPICH per run and setting from the output of bench/tcp_seg_ab.sh, or of net_host.py runs
headed "## NAME=<value> run <n>" or "=== round <n> NAME=<value>": one line per case and size, the runs' ratios
under each setting (files given together are read as one).

    python3 bench/seg_ratios.py docs/perf/issue33/host_oneway/tcp_seg_ab.txt
    python3 bench/seg_ratios.py docs/perf/host/hot_size/batch1.txt docs/perf/host/hot_size/batch2.txt
"""
import collections
import re
import sys

PROBE = re.compile(r"(\d+) B\s+eng: send\s+(\d+) us.*mpi: send\s+(\d+) us")
PAIR = re.compile(r"(one way|each way|all_gather):[^()]*\(([\d.]+)\)")

ratios = collections.defaultdict(list)
setting = None
for line in (line for path in sys.argv[1:] for line in open(path)):
    if line.startswith("## "):
        setting = line.split()[1].split("=")[1]
    elif line.startswith("=== round "):
        setting = line.split()[3].split("=")[1]
    elif line.startswith("#"):
        continue
    elif "eng:" in line:
        m = PROBE.search(line)
        ratios[("probe send", int(m[1]), setting)].append(round(int(m[2]) / int(m[3]), 2))
    elif "one way:" in line:
        for case, ratio in PAIR.findall(line):
            ratios[("pair " + case, int(line.split()[0]), setting)].append(float(ratio))
    elif "engine/MPI" in line:
        f = line.split()
        ratios[(f[0], int(f[1]), setting)].append(float(f[-1]))
settings = sorted({s for _, _, s in ratios})
for case, size in sorted({(c, n) for c, n, _ in ratios}):
    print(f"{case:15s}{size:>10d}  " + "  ".join(f"{s} {ratios[(case, size, s)]}" for s in settings))
