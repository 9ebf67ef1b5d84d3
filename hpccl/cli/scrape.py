"""hpccl-info --metrics: read hpccl's Prometheus metrics (a .prom file, a folder of them as
HPCCL_METRICS_FILE makes, or an http:// URL of an endpoint HPCCL_METRICS_PORT serves), parsed with
prometheus_client's own parser, and print them per communicator and rank as tables."""
from __future__ import annotations

import glob
import os
import urllib.request
from typing import Dict, Iterable, List, Tuple

from hpccl import config

Key = Tuple[str, str]  # (communicator, rank)


def sources(where: str) -> List[str]:
    """The files or URL that ``where`` names; empty: this process's HPCCL_METRICS_FILE folder, else its
    HPCCL_METRICS_PORT on this host."""
    if not where:
        folder, port = config.get("HPCCL_METRICS_FILE"), config.get("HPCCL_METRICS_PORT")
        if folder:
            where = folder
        elif port:
            where = f"http://127.0.0.1:{port}/metrics"
        else:
            raise SystemExit("hpccl-info --metrics: name a file, folder or URL (or set HPCCL_METRICS_FILE or "
                             "HPCCL_METRICS_PORT)")
    if where.startswith(("http://", "https://")):
        return [where]
    if os.path.isdir(where):
        found = sorted(glob.glob(os.path.join(where, "*.prom")))
        if not found:
            raise SystemExit(f"hpccl-info --metrics: no .prom file in {where}")
        return found
    if not os.path.exists(where):
        raise SystemExit(f"hpccl-info --metrics: {where} does not exist")
    return [where]


def read(src: str) -> str:
    if src.startswith(("http://", "https://")):
        with urllib.request.urlopen(src, timeout=10) as r:  # noqa: S310 - the URL the user named
            return r.read().decode()
    with open(src) as f:
        return f.read()


def quantile(buckets: List[Tuple[float, float]], q: float) -> float:
    """The upper bound of the bucket holding quantile q of a cumulative histogram [(le, count)]."""
    total = buckets[-1][1] if buckets else 0
    for le, n in buckets:
        if total and n >= q * total:
            return le
    return float("inf")


def _us(s: float) -> str:
    return "+Inf" if s == float("inf") else f"{s * 1e6:.1f}"


def lines(text: str) -> List[str]:
    """The metrics in ``text`` as tables: per communicator and rank, one row per collective, memory,
    path and algorithm (calls, bytes, seconds, microseconds per call; the latency histogram's median
    and 99th percentile bucket bounds per collective, memory and path), then errors, peers lost, calls in
    flight."""
    from prometheus_client.parser import text_string_to_metric_families
    rows: Dict[Key, Dict[tuple, Dict[str, float]]] = {}
    hist: Dict[Key, Dict[tuple, List[Tuple[float, float]]]] = {}
    gauges: Dict[Key, Dict[str, float]] = {}
    errors: Dict[Key, Dict[str, float]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            lab = s.labels
            if "comm" not in lab:
                continue
            key = (lab["comm"], lab["rank"])
            if fam.name in ("hpccl_calls", "hpccl_bytes", "hpccl_seconds"):
                row = (lab["collective"], lab["memory"], lab["path"], lab["algorithm"])
                rows.setdefault(key, {}).setdefault(row, {})[fam.name[6:]] = s.value
            elif fam.name == "hpccl_call_latency_seconds" and s.name.endswith("_bucket"):
                row = (lab["collective"], lab["memory"], lab["path"])
                hist.setdefault(key, {}).setdefault(row, []).append((float(lab["le"]), s.value))
            elif fam.name == "hpccl_errors":
                errors.setdefault(key, {})[lab["kind"]] = s.value
            elif fam.name in ("hpccl_peers_lost", "hpccl_calls_in_flight", "hpccl_communicator_size"):
                gauges.setdefault(key, {})[fam.name[6:]] = s.value
                if "world_rank" in lab:
                    gauges[key]["world_rank"] = float(lab["world_rank"])
    out: List[str] = []
    for key in sorted(set(rows) | set(gauges), key=lambda k: (k[0], int(k[1]))):
        g = gauges.get(key, {})
        out.append(f"communicator {key[0]} rank {key[1]} of {int(g.get('communicator_size', 0))} (world rank "
                   f"{int(g.get('world_rank', -1))}): calls in flight {int(g.get('calls_in_flight', 0))}, "
                   f"peers lost {int(g.get('peers_lost', 0))}")
        out.append(f"  {'collective':<16}{'memory':<7}{'path':<9}{'algorithm':<16}{'calls':>9}{'bytes':>14}"
                   f"{'seconds':>11}{'us/call':>10}")
        for (coll, mem, path, algo), r in sorted(rows.get(key, {}).items()):
            n = r.get("calls", 0)
            out.append(f"  {coll:<16}{mem:<7}{path:<9}{algo:<16}{n:>9.0f}{r.get('bytes', 0):>14.0f}"
                       f"{r.get('seconds', 0):>11.4f}{r.get('seconds', 0) / max(n, 1) * 1e6:>10.2f}")
        for (coll, mem, path), b in sorted(hist.get(key, {}).items()):
            b.sort()
            out.append(f"  latency {coll} ({mem}, {path}): {b[-1][1]:.0f} calls, median <= "
                       f"{_us(quantile(b, 0.5))} us, p99 <= {_us(quantile(b, 0.99))} us")
        errs = errors.get(key, {})
        out.append("  errors: " + (", ".join(f"{k} {v:.0f}" for k, v in sorted(errs.items())) or "none"))
    return out or ["no hpccl metrics found"]


def show(where: str) -> Iterable[str]:
    """Every source's lines, each under its name."""
    for src in sources(where):
        yield f"hpccl metrics from {src}"
        yield from lines(read(src))
