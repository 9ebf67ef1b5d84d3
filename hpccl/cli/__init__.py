"""Command-line tools: hpccl-perf (nccl-tests style benchmark) and hpccl-info."""
