"""Per-run ratios (hpccl / MPI) of bench/net_host.py logs made with a setting alternated between runs, grouped
by collective, size and setting: each run's "=== round R NAME=VALUE" header names the setting.

    python3 bench/hot_size_ratios.py docs/perf/host/hot_size/batch1.txt [more logs]"""
import collections
import re
import sys

HEAD = re.compile(r"=== round (\d+) (\w+)=(\S+)")
ROW = re.compile(r"\s*(\w+)\s+(\d+)\s+engine\s+(\d+)us\s+MPI\s+(\d+)us\s+engine/MPI\s+([\d.]+)")


def main(paths: list) -> int:
    cells = collections.defaultdict(list)
    for path in paths:
        setting = None
        for line in open(path):
            m = HEAD.match(line)
            if m:
                setting = f"{m.group(2)}={m.group(3)}"
                continue
            m = ROW.match(line)
            if m and setting:
                cells[(m.group(1), int(m.group(2)), setting)].append(float(m.group(5)))
    for (coll, size, setting), ratios in sorted(cells.items()):
        above = sum(r > 1.0 for r in ratios)
        print(f"{coll:>11} {size:>8} {setting:<26} {' '.join(f'{r:.2f}' for r in ratios)}  ({above} of {len(ratios)} above 1.0)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
