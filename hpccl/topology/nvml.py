"""GPU topology from NVML (pynvml / nvidia-ml-py): NVLink links per GPU pair, P2P capability, PCIe
distance and NUMA node per GPU; `describe()` is the matrix hpccl-info prints (like `nvidia-smi topo -m`).

Indices are NVML's (all GPUs of the host, PCI order), which can differ from CUDA's when
CUDA_VISIBLE_DEVICES is set; rows carry the PCI bus id to match them."""
from __future__ import annotations

from typing import Dict, List, Optional

_LEVEL = {0: "X", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}  # nvmlGpuTopologyLevel_t


def _nvml():
    import pynvml
    pynvml.nvmlInit()
    return pynvml


def _str(x) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)


def gpus() -> List[Dict[str, object]]:
    """Per GPU: index, name, PCI bus id, NUMA node (or None), memory bytes."""
    nv = _nvml()
    out = []
    for i in range(nv.nvmlDeviceGetCount()):
        h = nv.nvmlDeviceGetHandleByIndex(i)
        numa: Optional[int] = None
        try:
            numa = int(nv.nvmlDeviceGetNumaNodeId(h))
        except Exception:  # noqa: BLE001 - older drivers/bindings
            numa = None
        out.append(dict(index=i, name=_str(nv.nvmlDeviceGetName(h)),
                        pci=_str(nv.nvmlDeviceGetPciInfo(h).busId), numa=numa,
                        memory=int(nv.nvmlDeviceGetMemoryInfo(h).total)))
    return out


def nvlink_matrix() -> List[List[int]]:
    """m[i][j] = active NVLink links from GPU i to GPU j (0 when none; NVSwitch systems count the links
    to the switch for every pair, as nvidia-smi does)."""
    nv = _nvml()
    n = nv.nvmlDeviceGetCount()
    handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(n)]
    bus = {_str(nv.nvmlDeviceGetPciInfo(h).busId).lower(): i for i, h in enumerate(handles)}
    m = [[0] * n for _ in range(n)]
    maxl = getattr(nv, "NVML_NVLINK_MAX_LINKS", 18)
    for i, h in enumerate(handles):
        switch_links = 0
        for link in range(maxl):
            try:
                if nv.nvmlDeviceGetNvLinkState(h, link) != nv.NVML_FEATURE_ENABLED:
                    continue
                remote = _str(nv.nvmlDeviceGetNvLinkRemotePciInfo(h, link).busId).lower()
            except Exception:  # noqa: BLE001 - link absent / not supported
                continue
            j = bus.get(remote)
            if j is None:
                switch_links += 1  # the far end is an NVSwitch, not a GPU
            elif j != i:
                m[i][j] += 1
        if switch_links:
            for j in range(n):
                if j != i:
                    m[i][j] = max(m[i][j], switch_links)
    return m


def p2p_matrix() -> List[List[Optional[bool]]]:
    """m[i][j]: NVML says GPU i can read from GPU j peer-to-peer (None when NVML cannot tell)."""
    nv = _nvml()
    n = nv.nvmlDeviceGetCount()
    handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(n)]
    idx = getattr(nv, "NVML_P2P_CAPS_INDEX_READ", 0)
    ok = getattr(nv, "NVML_P2P_STATUS_OK", 0)
    m: List[List[Optional[bool]]] = [[None] * n for _ in range(n)]
    for i in range(n):
        for j in range(n):
            if i == j:
                m[i][j] = True
                continue
            try:
                m[i][j] = nv.nvmlDeviceGetP2PStatus(handles[i], handles[j], idx) == ok
            except Exception:  # noqa: BLE001
                m[i][j] = None
    return m


def _cuda_p2p(m: List[List[Optional[bool]]], g: List[Dict[str, object]]) -> None:
    """Fill the cells NVML could not answer from CUDA (cudaDeviceCanAccessPeer), matched by PCI bus id."""
    try:
        import cupy
        rt = cupy.cuda.runtime
        cuda_of = {}
        for d in range(rt.getDeviceCount()):
            cuda_of[cupy.cuda.Device(d).pci_bus_id.lower()[-12:]] = d
    except Exception:  # noqa: BLE001 - no CuPy or no device: leave '?'
        return
    idx = [cuda_of.get(str(d["pci"]).lower()[-12:]) for d in g]
    for i in range(len(g)):
        for j in range(len(g)):
            if m[i][j] is None and idx[i] is not None and idx[j] is not None:
                try:
                    m[i][j] = bool(rt.deviceCanAccessPeer(idx[i], idx[j]))
                except Exception:  # noqa: BLE001
                    pass


def pcie_matrix() -> List[List[str]]:
    """m[i][j]: the closest common PCIe ancestor (X, PIX, PXB, PHB, NODE, SYS)."""
    nv = _nvml()
    n = nv.nvmlDeviceGetCount()
    handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(n)]
    m = [["X"] * n for _ in range(n)]
    for i in range(n):
        for j in range(n):
            if i != j:
                try:
                    m[i][j] = _LEVEL.get(int(nv.nvmlDeviceGetTopologyCommonAncestor(handles[i], handles[j])), "?")
                except Exception:  # noqa: BLE001
                    m[i][j] = "?"
    return m


def describe() -> str:
    """The matrix hpccl-info prints: NV<k> for k NVLinks, else the PCIe level; P2P read status; NUMA."""
    g = gpus()
    if not g:
        return "  GPUs: none (NVML sees no device)"
    nvl, p2p, pcie = nvlink_matrix(), p2p_matrix(), pcie_matrix()
    n = len(g)
    if any(c is None for row in p2p for c in row):
        _cuda_p2p(p2p, g)
    lines = [f"  GPUs: {n} (NVML)"]
    for d in g:
        lines.append(f"    GPU{d['index']}: {d['name']}, {d['memory'] / 2**30:.0f} GiB, PCI {d['pci']}, "
                     f"NUMA {d['numa'] if d['numa'] is not None else '?'}")
    lines.append("  link matrix (NV<k>: k NVLinks; else PCIe path), P2P read: + yes, - no, ? unknown "
                 "(NVML, else CUDA)")
    lines.append("    " + " " * 8 + "".join(f"{'GPU' + str(j):>9}" for j in range(n)))
    for i in range(n):
        cells = []
        for j in range(n):
            if i == j:
                cells.append(f"{'X':>9}")
                continue
            link = f"NV{nvl[i][j]}" if nvl[i][j] else pcie[i][j]
            mark = {True: "+", False: "-", None: "?"}[p2p[i][j]]
            cells.append(f"{link + mark:>9}")
        lines.append(f"    GPU{i:<5}" + "".join(cells))
    return "\n".join(lines)


if __name__ == "__main__":  # python -m hpccl.topology.nvml
    print(describe())
