"""UCX settings of hpccl's native network engine (transport/engine.py, hpccl/csrc/_netcore.c), kept apart from the
engine so they are testable without it: the transports to use, the TCP settings for bulk steps, what a
wrong UCX_NET_DEVICES means on this host, and the collective set-up check and wire-up deadline."""
from __future__ import annotations

import os
import re
from typing import Any, Callable, Dict, List, Optional

from .. import config, log

_RESOURCE = re.compile(r"resource\s+\d+\s*:.*?--\s*(\S+)/(\S+)")
#: UCX transports that are not networks (UCX_NET_DEVICES does not apply to them)
_NOT_NET = re.compile(r"^(self|posix|sysv|cma|knem|xpmem|cuda_copy|cuda_ipc|gdr_copy|rocm_\w+|ze_\w+)$")


#: The UCX TCP options hpccl sets on its own context where the user set none (HPCCL_UCX_TCP_TUNE)
WIRE_TCP_NAMES = ("TCP_TX_SEG_SIZE", "TCP_RX_SEG_SIZE", "TCP_SNDBUF", "TCP_RCVBUF")


def wire_tcp() -> Dict[str, str]:
    """hpccl's TCP settings: HPCCL_UCX_TCP_SEG segments and 8 MiB socket buffers. UCX's defaults (8 KiB
    segments, the kernel's socket buffers) are sized for latency, not for bulk collective steps."""
    seg = str(config.get("HPCCL_UCX_TCP_SEG"))
    return dict(zip(WIRE_TCP_NAMES, (seg, seg, "8m", "8m")))


def wire_config() -> Dict[str, str]:
    """The UCX settings (names without the UCX_ prefix) hpccl adds to its own context: wire_tcp(), less any
    the user set as UCX_<name> in the environment (the user's always win)."""
    if not config.get("HPCCL_UCX_TCP_TUNE"):
        return {}
    return {k: v for k, v in wire_tcp().items() if f"UCX_{k}" not in os.environ}


def _tls() -> str:
    """The UCX_TLS hpccl's worker will use ('' = UCX's default, all transports)."""
    env = os.environ.get("UCX_TLS")
    if env:
        return env
    return config.get("HPCCL_UCX_TLS")


def _os_devices() -> List[str]:
    """Network interfaces and InfiniBand ports this host has (for error messages)."""
    out: List[str] = []
    try:
        out += sorted(os.listdir("/sys/class/net"))
    except OSError:
        pass
    try:
        for hca in sorted(os.listdir("/sys/class/infiniband")):
            for port in sorted(os.listdir(f"/sys/class/infiniband/{hca}/ports")):
                out.append(f"{hca}:{port}")
    except OSError:
        pass
    return out


def _device_problem(info: str) -> Optional[str]:
    """Why UCX_NET_DEVICES cannot work on this rank (None if it can), from the context's resource list."""
    want = os.environ.get("UCX_NET_DEVICES", "").strip()
    if not want or want.lower() == "all":
        return None
    resources = _RESOURCE.findall(info)
    have = {dev for _tl, dev in resources}
    net = sorted({f"{tl}/{dev}" for tl, dev in resources if not _NOT_NET.match(tl)})
    missing = [d for d in (x.strip() for x in want.split(",")) if d and d not in have]
    if not missing:
        return None
    present = ", ".join(_os_devices()) or "none found"
    if not net:
        return (f"UCX_NET_DEVICES={want}: no usable network device ({', '.join(missing)} not found or not "
                f"usable with UCX_TLS={_tls() or '<unset>'}); this host has: {present}")
    log.warn("TRANSPORT", "UCX_NET_DEVICES names %s, which UCX cannot use here (host has: %s); using %s",
             ", ".join(missing), present, ", ".join(net))
    return None


def wire_text(wire: Dict[str, str]) -> str:
    """The TCP settings a UCX context got, for the transport's INFO line."""
    return " ".join(f"{k}={v}" for k, v in wire.items()) or "UCX's/the user's"


WIREUP_FLOOR = 10.0


def wireup_limit() -> float:
    """The wire-up's deadline: HPCCL_TIMEOUT capped at 60 s, never under 10 s, since every peer has
    already arrived (the bootstrap saw it) and first contact on a loaded node can take seconds."""
    return min(60.0, max(WIREUP_FLOOR, float(config.get("HPCCL_TIMEOUT"))))


def collective_check(boot: Any, problem: Optional[str], kind: type, what: str, close: Callable[[], None]) -> None:
    """Every rank raises if any rank found a problem (after ``close``), so nobody waits for a peer that
    gave up; collective over ``boot``."""
    problems = boot.allgather(problem)
    bad = [(r, p) for r, p in enumerate(problems) if p]
    if bad:
        close()
        raise kind(f"{what} on rank(s) {[r for r, _ in bad]}: {bad[0][1]}")
