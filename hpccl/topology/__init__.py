"""Topology: which ranks share a node (nodes.py) and how their GPUs are linked (nvml.py)."""
from .nodes import NodeMap, detect_nodes

__all__ = ["NodeMap", "detect_nodes"]
