"""The one registry of HPCCL_* parameters: name, default, type and doc; the environment is read only here."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Tuple

from .errors import HpcclInvalidArgument


def _size(text: str) -> int:
    """Parse '4M', '64KiB', '1G' or a plain byte count."""
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(t[-1:] if t else "", 1)
    if scale != 1:
        t = t[:-1]
    return int(float(t) * scale)


def _bool(text: str) -> bool:
    v = text.strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"not a boolean: {text!r}")


@dataclass(frozen=True)
class Param:
    """One HPCCL_* variable."""

    name: str
    default: Any
    parse: Callable[[str], Any]
    doc: str
    choices: Tuple[str, ...] = ()


PARAMS: Dict[str, Param] = {}


def _param(name: str, default: Any, parse: Callable[[str], Any], doc: str,
           choices: Tuple[str, ...] = ()) -> None:
    PARAMS[name] = Param(name, default, parse, doc, choices)


_param("HPCCL_DEBUG", "WARN", str.upper, "Log level: WARN, INFO or TRACE; when set, hpccl also prints its records (rank-prefixed) to stderr, "
       "else they go to the Python logger 'hpccl' only.",
       ("WARN", "INFO", "TRACE"))
_param("HPCCL_DEBUG_SUBSYS", "ALL", str.upper,
       "Comma list of subsystems to log: INIT, COLL, TUNING, TRANSPORT, ENV, or ALL.")
_param("HPCCL_TIMEOUT", 300.0, float,
       "Seconds a collective waits for its peers before raising HpcclTimeoutError and aborting.")
_param("HPCCL_ALGO", "", str.lower,
       "Force an algorithm for every collective (ring, tree, rd, dbtree, direct, oneshot, twoshot, "
       "hier, linear; GPU all_reduce: oneshot, twoshot), or per collective: 'all_reduce:ring,broadcast:tree' "
       "(gather, scatter: direct, tree; all_gather_v, reduce_scatter_v: direct, ring; a pinned one is never "
       "padded onto the hot path). Empty: the cost model chooses.")
_param("HPCCL_TRANSPORT", "", str.lower,
       "Force the host transport between ranks of a node: shm or mpi. Empty: shm within a node; between "
       "nodes HPCCL_NET decides.")
_param("HPCCL_NET", "", str.lower,
       "Transport between nodes: engine or ucx (hpccl's native UCX engine, or an error naming why it cannot "
       "load) or mpi. Empty: the engine, else MPI with one warning naming why. 'ucxx' (a transport "
       "removed in issue 34) is refused.")
_param("HPCCL_SHM_SLOT_SIZE", 1 << 20, _size,
       "Bytes per shared-memory slot of a point-to-point channel (the pipelining chunk).")
_param("HPCCL_SHM_SLOTS", 4, int, "Slots per point-to-point channel (how far a sender runs ahead).")
_param("HPCCL_SHM_DIRECT_SIZE", 8 << 20, _size,
       "Bytes per rank of the directly mapped shared-memory window used by one-shot/direct algorithms.")
_param("HPCCL_SINGLE_COPY", True, _bool,
       "Allow single-copy algorithms ('cma': peers read each other's buffers with process_vm_readv) "
       "when every rank of a one-node communicator can; 0 keeps to shared-memory copies.")
_param("HPCCL_HOT_SIZE", 1 << 20, _size,
       "Bytes per rank up to which host collectives on one node take the compiled hot path "
       "(hpccl._hotpath: one C call, one copy in, the result read from every rank's slot; past it, calls "
       "that go direct, HPCCL_HOT_DIRECT_SIZE); 0 turns it off. "
       "Each rank's shared-memory segment holds two slots of this size.")
_param("HPCCL_HOT_REDUCE_SIZE", 256 << 10, _size,
       "The hot path's slot limit for all_reduce (every rank reads and reduces every rank's data from the slots); "
       "at most HPCCL_HOT_SIZE. From 16 x HPCCL_HOT_DIRECT_SIZE all_reduce goes direct instead.")
_param("HPCCL_HOT_DIRECT_SIZE", 16 << 10, _size,
       "Bytes per rank from which broadcast, all_gather, reduce_scatter, all_to_all and all_reduce on the compiled hot path move directly between the processes "
       "(process_vm_readv/writev: each rank reads its blocks out of its peers' inputs; a broadcast's root writes part of the peers' outputs) instead of "
       "through the shared-memory slots, at any size (reduce_scatter from 4 times this, all_to_all from 8, all_reduce from 16); needs single-copy reads "
       "(HPCCL_SINGLE_COPY); 0: never.")
_param("HPCCL_NET_HOT_SIZE", 256 << 10, _size,
       "Bytes per rank up to which all_reduce, reduce, broadcast, all_gather (and barrier) on host buffers "
       "take the compiled path across nodes (hpccl/csrc/_nethot.c: the whole schedule in one C call over the "
       "network engine) when every rank is its own node; 0 turns it off.")
_param("HPCCL_HOST_DOOR", 1, int,
       "1 (the default): a communicator with a compiled hot path (HPCCL_HOT_SIZE on a node, HPCCL_NET_HOT_SIZE "
       "across nodes) takes its host collectives on numpy arrays in one C call (hpccl/csrc/_frontdoor.c: the "
       "Python method's front door, without its Python); 0: the Python method's front door. Same calls, same "
       "results, less host time per call (docs/PERFORMANCE.md).")
_param("HPCCL_NET_SLICE", 1 << 20, _size,
       "Bytes per slice of a GPU network step's messages (the staged engine path): each message is cut into "
       "slices whose device-to-host copy, wire and copy-out or reduction overlap along the stream; "
       "0 moves each message whole. Must be the same on every rank.")
_param("HPCCL_NET_FUSED_SIZE", 16 << 10, _size,
       "Where HPCCL_CUDA_SYNC takes spinning kernels: GPU network steps across nodes of one message each way (each at most this many bytes) run as one "
       "kernel: the send staged, the engine's token written, its done word awaited and the received data "
       "combined, where larger steps take four stream operations; 0 turns it off. Ranks may differ.")
_param("HPCCL_NET_PIPE", 1, _bool,
       "Where HPCCL_CUDA_SYNC takes spinning kernels: GPU network steps across nodes of one message each way above HPCCL_NET_FUSED_SIZE run as one kernel "
       "walking the message's pieces (stage a piece, hand it to the engine, combine the received piece as it "
       "lands, several pieces in flight), where otherwise each piece takes its own copies, stream operations "
       "and kernel; 0 turns it off. Ranks may differ.")
_param("HPCCL_NET_LANES", 0, int,
       "Lanes of GPU network steps across nodes: engines of their own (a UCP worker and a progress thread "
       "each), slice i of every message going over lane i mod L, so one peer's data moves over L connections "
       "at once. 0 (auto): 1 where UCX has an RDMA transport (its NIC does the copying), else min(4, the cores "
       "this rank may run on / (2 x the ranks on its node)); every rank takes the fewest any rank chose.")
_param("HPCCL_NET_REPLAY", 1, int,
       "1: a repeated GPU call across nodes (same collective, buffers, dtype, op, root and stream, one rank "
       "per node) is enqueued from its recording by one C call (hpccl/csrc/_netreplay.c) instead of running its "
       "schedule in Python; 0: every call runs in Python. Either way the messages are the same, so ranks may "
       "differ.")
_param("HPCCL_NET_DOOR", 1, int,
       "1: a replayed GPU call across nodes (HPCCL_NET_REPLAY) is keyed, looked up, replayed and counted in one C "
       "call at the collective's entry (hpccl/csrc/_netdoor.c) instead of Python building its key and doing its "
       "bookkeeping (the default); 0: the Python way. The same recording is replayed either way.")
_param("HPCCL_HIER_REPLAY", 1, int,
       "1 (the default): a repeated all_reduce on GPU buffers that hier runs (several ranks per node, splitting "
       "evenly over them; not avg, not bfloat16) keeps its temporary (the chains keep at most 1 GiB; one torch's "
       "compiled backend armed is held until it is re-armed), so its "
       "node reduce_scatter, network all_reduce and node all_gather replay their own recordings "
       "(hpccl/gpu/hierreplay.py; torch's compiled backend arms them too); 0: hier runs in Python every call. The "
       "messages are the same either way, so ranks may differ.")
_param("HPCCL_COMPILED_LAUNCH", 1, int,
       "1: repeated GPU calls make their driver calls (capture check, launch, event record) in one C call "
       "of the hot-path extension (when it is built) instead of three ctypes calls; 0: through ctypes.")
_param("HPCCL_SPIN", 2000, int,
       "Polls of a flag before a waiting rank starts yielding its core (then sleeping briefly); "
       "capped at 50 when a node has more ranks than cores.")
_param("HPCCL_NODE_ID", "", str,
       "Override node detection: ranks with the same value share a node (for tests and odd systems).")
_param("HPCCL_TUNING_FILE", "", str,
       "JSON file of measured alpha/beta per transport that replaces the cost model's built-in table.")
_param("HPCCL_DUMP_DIR", "", str,
       "Flight recorder: a directory for one JSON per rank of each communicator's last calls, written on "
       "a timeout, an abort or SIGUSR1 (read them with hpccl-info --analyze DIR). Empty: no dumps.")
_param("HPCCL_RECORD_CALLS", 128, int, "How many recent calls each communicator's flight recorder keeps.")
_param("HPCCL_CHECK", False, _bool,
       "Before every collective the ranks agree on (collective, bytes, dtype, op, root, memory kind); a "
       "mismatch raises on every rank naming the ranks that differ (one small exchange per call).")
_param("HPCCL_TRACE", "", str,
       "A folder: each rank writes a Chrome-trace / Perfetto JSON per communicator there "
       "(hpccl-trace-<communicator>-rank<R>.json; every call, GPU calls also with their event-timed "
       "duration); 'hpccl-trace merge' joins the ranks' files. Turns the compiled host hot path's front door "
       "and GPU launch replay off, so every call is recorded.")
_param("HPCCL_NVTX", "auto", str.lower,
       "NVTX ranges around every GPU collective (Nsight Systems): 'auto' when the nvtx package is "
       "importable and an NVTX tool is set to load (NVTX_INJECTION64_PATH, set by Nsight Systems; without "
       "one a range records nothing), '1' on, '0' off. While on, GPU calls are not replayed from launch "
       "snapshots or recordings.",
       ("auto", "1", "0"))


def _port(text: str) -> int:
    """A TCP port, 1..65535 (0 or empty: none)."""
    n = int(text.strip() or 0)
    if not 0 <= n <= 65535:
        raise ValueError(f"{n} is not a port (1..65535)")
    return n


def _interval(text: str) -> float:
    n = float(text)
    if not n > 0:
        raise ValueError(f"{n} is not a positive number of seconds")
    return n


_param("HPCCL_METRICS_FILE", "", str,
       "Prometheus metrics (hpccl/observe/metrics.py; needs the prometheus_client package): a folder where each "
       "process writes hpccl-rank<R>.prom (R: its world rank) every HPCCL_METRICS_INTERVAL seconds and at exit, "
       "atomically, for node-exporter's textfile collector; read it with hpccl-info --metrics FILE. Empty: no "
       "file. With it or HPCCL_METRICS_PORT set, each call's latency is also counted in log2 buckets.")
_param("HPCCL_METRICS_PORT", 0, _port,
       "Prometheus metrics over HTTP: each process serves /metrics on this port plus its local rank (the "
       "launcher's MPI_LOCALRANKID, OMPI_COMM_WORLD_LOCAL_RANK, SLURM_LOCALID or LOCAL_RANK; 0 without one). "
       "0: no endpoint.")
_param("HPCCL_METRICS_INTERVAL", 15.0, _interval,
       "Seconds between two writes of the HPCCL_METRICS_FILE file.")
_param("HPCCL_CHECK_ENV", True, _bool,
       "Check /dev/shm size, memlock and GPU peer access at init and say what to fix.")
_param("HPCCL_CUDA_BUFFER_SIZE", 64 << 20, _size,
       "Bytes of peer-mapped GPU buffer per rank for the CUDA IPC path.")
_param("HPCCL_CUDA_TRANSPORT", "", str.lower,
       "GPU peer memory: 'ipc' (CUDA IPC, needs P2P or a shared GPU), 'host' (pinned shared host memory), "
       "or empty: ipc when every GPU pair has P2P, else host.", ("", "ipc", "host"))
_param("HPCCL_CUDA_BLOCKS", 64, int, "Most thread blocks per GPU collective kernel (1..64); 32 overlaps "
       "better with compute. Never more than the GPU's multiprocessors divided by the ranks sharing it, so "
       "that every rank's blocks can be resident at once (docs/GPU.md, 'Blocks per kernel').")
_param("HPCCL_CUDA_SYNC", "auto", str.lower,
       "How GPU collectives wait for peers and for the network engine: 'spin' (kernels wait inside: the "
       "fastest, safe only on a GPU the job has alone), 'stream' (stream memory operations between kernels "
       "that never wait: no deadlock whatever else shares the GPU, and a rank that dies leaves no kernel "
       "running), 'auto': stream when several ranks share a GPU, CUDA MPS is running or another "
       "communicator is live on the GPU, else spin. Under 'stream' HPCCL_NET_FUSED_SIZE and HPCCL_NET_PIPE "
       "are off (docs/GPU.md, docs/RELIABILITY.md).",
       ("auto", "spin", "stream"))
_param("HPCCL_CUDA_SYNC_SPIN", 0, int,
       "Microseconds a one-block kernel of the stream-synchronised protocol watches the peers' words before "
       "the stream's own wait takes over (bounded, so it never holds a multiprocessor for long); 0: none.")
_param("HPCCL_CUDA_THREADS", 512, int, "Threads per block of the GPU collective kernels (64..512).")
_param("HPCCL_CUDA_BLOCK_BYTES", 8 << 10, _size,
       "Bytes per block below which a GPU collective uses fewer blocks (small-message latency).")
_param("HPCCL_CUDA_ZERO_COPY", 1 << 20, _size,
       "Bytes per rank from which collectives on registered GPU buffers (comm.register) run the zero-copy "
       "kernels, which read peers' buffers directly; -1: never (registered buffers are staged like others).")
_param("HPCCL_CUDA_CE_SIZE", 16 << 20, _size,
       "Bytes per rank from which broadcast and all_gather on registered GPU buffers move data with the copy "
       "engines (peer cudaMemcpyAsync, no SMs) instead of a zero-copy kernel; 0: never.")
_param("HPCCL_CUDA_DEVICE", -1, int, "GPU of this rank for the CUDA path; -1: local_rank % GPUs.")
_param("HPCCL_CUDA_SOURCES", "", str, "Folder of hpccl's .cu/.cuh kernel sources when not installed with "
       "the package (hpccl/_cuda) or in a source checkout (cuda/).")
_param("HPCCL_BOOTSTRAP", "auto", str.lower,
       "How the torch backend bootstraps: 'mpi' (mpiexec/srun), 'store' (the c10d Store torch hands it, e.g. "
       "under torchrun), 'auto': MPI when an MPI launcher started the process (PMI/PMIx/Open MPI variables), "
       "else the store.")
_param("HPCCL_GPU_NET_ASYNC", False, _bool,
       "Only for GPU calls across nodes over MPI (the network proxy thread, hpccl/gpu/proxy.py, used when the "
       "native engine is absent or HPCCL_NET=mpi; with the engine GPU network steps always "
       "enqueue and return without a host sync). GPU calls with a network step return at once and hold the caller's stream on the GPU until the "
       "proxy thread has moved the data (needs a non-default stream; the caller's thread must not load "
       "CUDA kernels or allocate device memory while a step is pending, see docs/GPU.md). Off: the call "
       "returns once the step is done.")
_param("HPCCL_UCX_TCP_TUNE", True, _bool,
       "Give hpccl's UCX context TCP settings for bulk transfers (HPCCL_UCX_TCP_SEG segments, 8 MiB socket "
       "buffers) where the user set no UCX_TCP_TX_SEG_SIZE / UCX_TCP_RX_SEG_SIZE / UCX_TCP_SNDBUF / "
       "UCX_TCP_RCVBUF; 0 leaves UCX's defaults. Never touches the environment (MPI's own UCX is unaffected).")


def _tcp_seg(text: str) -> int:
    """A TCP segment size UCX takes: 8 KiB (UCX's own default) to 16 MiB."""
    n = _size(text)
    if not 8 << 10 <= n <= 16 << 20:
        raise ValueError(f"{n} bytes is outside 8 KiB..16 MiB")
    return n


_param("HPCCL_UCX_TCP_SEG", 512 << 10, _tcp_seg,
       "The TCP send and receive segment size HPCCL_UCX_TCP_TUNE gives hpccl's UCX context (8 KiB to 16 MiB). "
       "Between two hosts 128K moves one 512 KiB-1 MiB message in about half the time 512K takes, while "
       "512K serves 16 MiB all_reduce a little better (docs/PERFORMANCE.md \"TCP segment size\").")


def _ucx_settings(text: str) -> Dict[str, str]:
    """'NAME=value;NAME=value' (UCX names without the UCX_ prefix) as a dict, names upper-cased; only ';'
    separates, since UCX values hold commas (TLS=tcp,self)."""
    out: Dict[str, str] = {}
    for item in (x.strip() for x in text.split(";")):
        if not item:
            continue
        name, eq, value = item.partition("=")
        name = name.strip().upper().removeprefix("UCX_")
        if not eq or not name or not value.strip():
            raise ValueError(f"{item!r} is not NAME=value")
        out[name] = value.strip()
    return out


_param("HPCCL_UCX_CONFIG", {}, _ucx_settings,
       "More UCX settings for hpccl's own UCX context alone, 'NAME=value;NAME=value' (UCX names without the "
       "UCX_ prefix, e.g. 'PROTO_INFO=y;TCP_TX_SEG_SIZE=128k'): applied after hpccl's TCP settings and over "
       "them; MPI's UCX context and the environment are unaffected. A setting UCX refuses is an error naming it.")
_param("HPCCL_UCX_TLS", "", str,
       "UCX_TLS for hpccl's UCX worker when UCX_TLS itself is unset or empty (e.g. 'tcp,self').")
_param("HPCCL_TORCH_NATIVE", True, _bool,
       "The torch backend's compiled path (hpccl/torch/_native.cpp: repeated CUDA all_reduce, "
       "all_gather_into_tensor and reduce_scatter_tensor replayed with no Python, as DDP's buckets and "
       "FSDP2's parameter groups are): built with the C++ compiler on first use and cached; 0 keeps the "
       "Python backend alone.")
_param("HPCCL_CACHE_DIR", "", str,
       "Where hpccl caches what it builds on first use (the torch backend's compiled part); default "
       "$XDG_CACHE_HOME/hpccl or ~/.cache/hpccl.")


def get(name: str) -> Any:
    """Value of an HPCCL_* parameter: the environment's if set, else the default."""
    p = PARAMS[name]
    raw = os.environ.get(name)
    if raw is None:
        return p.default
    try:
        value = p.parse(raw)
    except (ValueError, TypeError) as exc:
        raise HpcclInvalidArgument(name, f"cannot parse {raw!r}: {exc}") from None
    if p.choices and value not in p.choices:
        raise HpcclInvalidArgument(name, f"{raw!r} is not one of {', '.join(p.choices)}")
    return value


def describe() -> List[Tuple[str, Any, str, str]]:
    """Every parameter as (name, value, source, doc); source is 'env' or 'default'."""
    return [(p.name, get(p.name), "env" if p.name in os.environ else "default", p.doc)
            for p in PARAMS.values()]
