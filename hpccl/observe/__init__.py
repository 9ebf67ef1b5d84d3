"""What hpccl reports about its calls: the flight recorder (recorder), the Chrome/Perfetto trace (trace),
per-communicator counters (stats) and their Prometheus export (metrics), NVTX ranges (nvtx) and
HPCCL_CHECK's cross-rank agreement on each call (check). May import algorithms, runtime, transport, memory, topology, bootstrap and the top modules; never
core, gpu or host."""
