"""Prometheus metrics of this process's communicators (HPCCL_METRICS_FILE, HPCCL_METRICS_PORT; off by
default; needs the prometheus_client package): calls, bytes and seconds per collective, memory kind, path
and algorithm, a latency histogram, errors by kind, peers lost and calls in flight.

Everything is read at scrape time from each communicator's Stats (hpccl/observe/stats.py), which counts
every call anyway; the one thing metrics add to a call is its latency bucket (one increment, in C on the
compiled paths). A communicator is exported while its object lives (weakly held)."""
from __future__ import annotations

import atexit
import os
import threading
import weakref
from typing import Any, Dict, Iterator, List, Optional, Tuple

from .. import config, log
from .stats import LAT_BUCKETS, LAT_LOW

#: the finite upper bounds of the latency buckets, in seconds (the last bucket is +Inf)
BOUNDS = tuple(2.0 ** (LAT_LOW + i) * 1e-9 for i in range(LAT_BUCKETS - 1))
#: where launchers put a process's rank on its node (the HTTP port's offset)
LOCAL_RANK_ENV = ("MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "LOCAL_RANK")
_ROW = ("comm", "rank", "collective", "memory", "path", "algorithm")
_STATE = 7  # a flight-recorder record's state field ("running" while its call runs)

_lock = threading.Lock()
_live: "weakref.WeakSet[Any]" = weakref.WeakSet()  # the Recorders of the communicators exported
_exporter: Optional["Exporter"] = None
_usable: Optional[bool] = None


def active() -> bool:
    """True when metrics are asked for (HPCCL_METRICS_FILE or HPCCL_METRICS_PORT) and prometheus_client
    imports; asked for without it, each process warns once and counts nothing more."""
    global _usable
    if not (config.get("HPCCL_METRICS_FILE") or config.get("HPCCL_METRICS_PORT")):
        return False
    if _usable is None:
        try:
            import prometheus_client  # noqa: F401
            _usable = True
        except ImportError:
            _usable = False
            log.warn("INIT", "HPCCL_METRICS_FILE/HPCCL_METRICS_PORT set but prometheus_client is not installed "
                             "(pip install 'hpccl[metrics]'): no metrics")
    return _usable


def watch(rec: Any) -> None:
    """Export the communicator of flight recorder ``rec`` (its tag, rank, size, world_rank, stats and the
    call it is running) from now on; the first one starts this process's exporter."""
    global _exporter
    with _lock:
        _live.add(rec)
        if _exporter is None:
            _exporter = Exporter(rec.world_rank)


def flush() -> Optional[str]:
    """Write the metrics file now (also done every HPCCL_METRICS_INTERVAL seconds and at exit); its path,
    or None when no file is configured or nothing is exported yet."""
    ex = _exporter
    return ex.write() if ex is not None else None


def endpoint() -> Optional[int]:
    """The port this process serves /metrics on, or None."""
    ex = _exporter
    return ex.port if ex is not None else None


def text() -> str:
    """The metrics of every exported communicator now, in Prometheus's text format ("" when none is)."""
    ex = _exporter
    if ex is None:
        return ""
    from prometheus_client import generate_latest
    return generate_latest(ex.registry).decode()


def shutdown() -> None:
    """Stop exporting: the file is written a last time, the thread and the endpoint stop, and no
    communicator is watched any longer (a communicator made afterwards with metrics asked for starts
    anew)."""
    global _exporter
    with _lock:
        ex, _exporter = _exporter, None
        _live.clear()
    if ex is not None:
        ex.close()


class Collector:
    """A prometheus_client collector over every live communicator (or the recorders given), read when
    scraped."""

    def __init__(self, recs: Optional[List[Any]] = None) -> None:
        self.recs = recs

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
        calls = CounterMetricFamily("hpccl_calls", "Calls completed per collective, memory kind ('host', "
                                    "'cuda'), path ('door', 'python', 'replayed') and algorithm.", labels=_ROW)
        nbytes = CounterMetricFamily("hpccl_bytes", "Bytes of the calls counted in hpccl_calls (this rank's "
                                     "input; all_gather: its output).", labels=_ROW)
        secs = CounterMetricFamily("hpccl_seconds", "Host seconds inside the calls counted in hpccl_calls "
                                   "(GPU calls: the time to enqueue).", labels=_ROW)
        lat = HistogramMetricFamily("hpccl_call_latency_seconds", "Host seconds per call, in log2 buckets.",
                                    labels=_ROW[:5])
        errors = CounterMetricFamily("hpccl_errors", "Errors the communicator's calls raised, by kind (the "
                                     "hpccl exception's class).", labels=["comm", "rank", "kind"])
        lost = GaugeMetricFamily("hpccl_peers_lost", "Ranks this rank's calls found failed (died or aborted).",
                                 labels=["comm", "rank"])
        flight = GaugeMetricFamily("hpccl_calls_in_flight", "Calls this rank has started on the communicator "
                                   "and not finished on the host (0 or 1; GPU calls finish once enqueued).",
                                   labels=["comm", "rank"])
        size = GaugeMetricFamily("hpccl_communicator_size", "Ranks in the communicator; world_rank is this "
                                 "process's rank in MPI_COMM_WORLD.", labels=["comm", "rank", "world_rank"])
        for rec in list(_live) if self.recs is None else self.recs:
            st, base = rec.stats, [rec.tag, str(rec.rank)]
            hists: Dict[Tuple[str, str, str], List[Any]] = {}
            for path, coll, kind, algo, n, b, t, h in st.rows():
                labels = base + [coll, kind, path, algo or "-"]
                calls.add_metric(labels, n)
                nbytes.add_metric(labels, b)
                secs.add_metric(labels, t)
                if h is not None:
                    acc = hists.setdefault((coll, kind, path), [[0] * LAT_BUCKETS, 0.0])
                    acc[0] = [x + y for x, y in zip(acc[0], h)]
                    acc[1] += t
            for (coll, kind, path), (h, total) in sorted(hists.items()):
                cum, buckets = 0, []
                for i, x in enumerate(h):
                    cum += x
                    buckets.append((repr(BOUNDS[i]) if i < len(BOUNDS) else "+Inf", cum))
                lat.add_metric(base + [coll, kind, path], buckets, total)
            for name, n in sorted(dict(st.errors).items()):
                errors.add_metric(base + [name], n)
            lost.add_metric(base, len(st.lost))
            cur = rec.current
            running = cur is not None and cur[_STATE] == "running"
            flight.add_metric(base, 1 if running or any(b() for b in list(st.busy)) else 0)
            size.add_metric(base + [str(rec.world_rank)], rec.size)
        yield from (calls, nbytes, secs, lat, errors, lost, flight, size)


class Exporter:
    """This process's metrics: the file (rewritten atomically by a daemon thread every
    HPCCL_METRICS_INTERVAL seconds and at exit) and/or the HTTP endpoint."""

    def __init__(self, world_rank: int) -> None:
        from prometheus_client import CollectorRegistry
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(Collector())
        folder = config.get("HPCCL_METRICS_FILE")
        self.path = os.path.join(folder, f"hpccl-rank{world_rank}.prom") if folder else None
        self.port: Optional[int] = None
        self._server: Any = None
        self._stop = threading.Event()
        if self.path is not None:
            try:
                os.makedirs(folder, exist_ok=True)
            except OSError as exc:
                log.warn("INIT", "metrics: cannot make %s (%s): no metrics file", folder, exc)
                self.path = None
        if self.path is not None:
            interval = config.get("HPCCL_METRICS_INTERVAL")
            threading.Thread(target=self._loop, args=(interval,), name="hpccl-metrics", daemon=True).start()
            atexit.register(self.write)
        base = config.get("HPCCL_METRICS_PORT")
        if base:
            self._serve(base + _local_rank())

    def _serve(self, port: int) -> None:
        from prometheus_client import start_http_server
        try:
            started = start_http_server(port, registry=self.registry)
        except OSError as exc:
            log.warn("INIT", "metrics: cannot serve on port %d (%s): no endpoint", port, exc)
            return
        self._server = started[0] if isinstance(started, tuple) else None  # (server, thread) since 0.20
        self.port = port

    def close(self) -> None:
        self._stop.set()
        self.write()
        atexit.unregister(self.write)
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def _loop(self, interval: float) -> None:
        while not self._stop.wait(interval):
            self.write()

    def write(self) -> Optional[str]:
        """Write the file (a temporary file renamed over it: readers never see half of it)."""
        if self.path is None:
            return None
        from prometheus_client import write_to_textfile
        try:
            write_to_textfile(self.path, self.registry)
        except OSError as exc:
            log.warn("INIT", "metrics: cannot write %s (%s)", self.path, exc)
            return None
        return self.path


def _local_rank() -> int:
    for name in LOCAL_RANK_ENV:
        v = os.environ.get(name, "")
        if v.isdigit():
            return int(v)
    return 0
