"""Transports move bytes between two ranks: shm (same node), mpi (fallback between nodes), ucx, cuda_ipc."""
from .base import Request, Transport, Window

__all__ = ["Request", "Transport", "Window"]
