"""Separate "hosts" on one machine for the network tests: one network namespace per host, each with its own
IP address on a veth whose other end sits on a bridge in a namespace of its own; ranks are started inside
them by tests/scripts/netns_exec.sh under mpiexec. Nothing here touches the root namespace's network: the
test addresses are reachable only from inside the namespaces, and every namespace is deleted at the end."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import pytest

ROOT = Path(__file__).resolve().parents[2]
WRAP = ROOT / "tests" / "scripts" / "netns_exec.sh"
SUBNET = "10.77.0"
DEV = "net0"  # the interface name inside every host namespace (so UCX_NET_DEVICES=net0 fits all)
UCX_PIP = ["libucx-cu13==1.20.1"]  # the UCX hpccl's native engine loads (pinned to the MPI wheels' UCX)


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def ensure_iproute2() -> None:
    """`ip` present (installed with apt-get as root when missing) and `ip netns add` permitted; else skip."""
    if shutil.which("ip") is None:
        if os.geteuid() == 0 and shutil.which("apt-get"):
            subprocess.run(["apt-get", "install", "-y", "--no-install-recommends", "iproute2"],
                           capture_output=True, text=True)
        if shutil.which("ip") is None:
            pytest.skip("iproute2 ('ip') is not installed and cannot be installed here (needs root + apt-get)")
    probe = f"hpcclprobe{os.getpid()}"
    r = _ip("netns", "add", probe, check=False)
    if r.returncode != 0:
        pytest.skip(f"'ip netns add' is not permitted here: {r.stderr.strip()}")
    _ip("netns", "del", probe, check=False)
    if shutil.which("unshare") is None:
        pytest.skip("unshare (util-linux) is missing")


def ensure_libucx() -> None:
    """The libucx wheel's UCX loadable by this interpreter (after importing MPI, the order hpccl uses), as the
    native engine loads it; pip-installs the pinned wheel if missing; skip only when that is impossible."""
    check = [sys.executable, "-c", "from mpi4py import MPI; import libucx; libucx.load_library()"]
    if subprocess.run(check, capture_output=True, cwd="/").returncode == 0:
        return
    inst = subprocess.run([sys.executable, "-m", "pip", "install", "-q", *UCX_PIP], capture_output=True, text=True)
    r = subprocess.run(check, capture_output=True, text=True, cwd="/")
    if r.returncode != 0:
        pytest.skip(f"libucx cannot be installed/loaded here (pip install {' '.join(UCX_PIP)}: "
                    f"{(inst.stderr or r.stderr).strip()[-400:]})")


class Hosts:
    """n hosts named <prefix>h0.. on a bridge in <prefix>br; host i has SUBNET.(i+1) on its DEV."""

    def __init__(self, n: int, prefix: Optional[str] = None) -> None:
        self.n = n
        self.prefix = prefix or f"hn{os.getpid() % 100000}"
        self.names = [f"{self.prefix}h{i}" for i in range(n)]
        self.bridge = f"{self.prefix}br"
        self.made: List[str] = []

    def addr(self, i: int) -> str:
        return f"{SUBNET}.{i + 1}"

    def create(self) -> "Hosts":
        p = self.prefix
        try:
            _ip("netns", "add", self.bridge)
            self.made.append(self.bridge)
            _ip("-n", self.bridge, "link", "set", "lo", "up")
            _ip("-n", self.bridge, "link", "add", "br0", "type", "bridge")
            _ip("-n", self.bridge, "link", "set", "br0", "up")
            for i, h in enumerate(self.names):
                _ip("netns", "add", h)
                self.made.append(h)
                # both ends are born in the root namespace: unique names, moved out at once
                _ip("link", "add", f"{p}v{i}", "type", "veth", "peer", "name", f"{p}b{i}")
                _ip("link", "set", f"{p}v{i}", "netns", h)
                _ip("link", "set", f"{p}b{i}", "netns", self.bridge)
                _ip("-n", h, "link", "set", f"{p}v{i}", "name", DEV)
                _ip("-n", h, "addr", "add", f"{self.addr(i)}/24", "dev", DEV)
                _ip("-n", h, "link", "set", "lo", "up")
                _ip("-n", h, "link", "set", DEV, "up")
                _ip("-n", self.bridge, "link", "set", f"{p}b{i}", "master", "br0")
                _ip("-n", self.bridge, "link", "set", f"{p}b{i}", "up")
        except subprocess.CalledProcessError as exc:
            self.destroy()
            raise RuntimeError(f"setting up namespaces failed: {' '.join(exc.cmd)}: {exc.stderr}") from None
        return self

    def destroy(self) -> None:
        """Delete every namespace made (their veths go with them); safe to call twice."""
        for ns in reversed(self.made):
            _ip("netns", "del", ns, check=False)
        self.made = []

    def bytes(self) -> Dict[str, Dict[str, int]]:
        """tx/rx byte counters of each host's DEV."""
        out = {}
        for h in self.names:
            link = json.loads(_ip("-n", h, "-s", "-j", "link", "show", "dev", DEV).stdout)[0]
            s = link["stats64"]
            out[h] = {"tx": s["tx"]["bytes"], "rx": s["rx"]["bytes"]}
        return out

    def pids(self, i: int) -> List[int]:
        """Processes running in host i's namespace."""
        out = _ip("netns", "pids", self.names[i], check=False).stdout
        return [int(x) for x in out.split()]

    def link(self, i: int, up: bool) -> None:
        """Set host i's DEV up or down (down: its link to the bridge, so to every other host, is gone)."""
        _ip("-n", self.names[i], "link", "set", DEV, "up" if up else "down")

    def ping(self, src: int, dst: int) -> bool:
        r = subprocess.run(["ip", "netns", "exec", self.names[src], "ping", "-c", "1", "-W", "2",
                            self.addr(dst)], capture_output=True)
        return r.returncode == 0


def mpiexec() -> List[str]:
    exe = shutil.which("mpiexec", path=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    if exe is None:
        pytest.fail("mpiexec not found: install an MPI (pip install mpich) before running the tests")
    cmd = [exe]
    version = subprocess.run([exe, "--version"], capture_output=True, text=True).stdout
    if "Open MPI" in version or "OpenRTE" in version or "open-mpi" in version:  # 4.x says "(OpenRTE)"
        cmd += ["--oversubscribe"]
        if os.geteuid() == 0:
            cmd += ["--allow-run-as-root"]
    return cmd


def host_env(hosts: Hosts, per_host: int, env: Optional[Dict[str, str]] = None,
             unset: Sequence[str] = ()) -> Dict[str, str]:
    """The environment ranks on the hosts get: this one, hpccl importable, HPCCL_TIMEOUT 60 unless set,
    UCX_TLS=tcp,self, HPCCL_NODE_ID removed (nodes come from the hosts' own hostnames), then ``env`` on top;
    last, every variable named in ``unset`` removed (e.g. unset=["UCX_TLS"] for UCX's default transports)."""
    e = dict(os.environ)
    e["PYTHONPATH"] = str(ROOT) + os.pathsep + e.get("PYTHONPATH", "")
    e.setdefault("HPCCL_TIMEOUT", "60")
    e.update({"NETNS_PREFIX": hosts.prefix, "NETNS_RANKS_PER_HOST": str(per_host),
              "UCX_TLS": "tcp,self", "UCX_WARN_UNUSED_ENV_VARS": "n"})
    e.pop("HPCCL_NODE_ID", None)  # nodes come from the hosts' own hostnames
    e.update(env or {})
    for name in unset:
        e.pop(name, None)
    return e


def run_on_hosts(hosts: Hosts, nranks: int, per_host: int, args: List[str],
                 env: Optional[Dict[str, str]] = None, timeout: float = 600,
                 unset: Sequence[str] = (), launch: Sequence[str] = ()) -> subprocess.CompletedProcess:
    """``python args...`` on nranks ranks, per_host consecutive ranks in each host namespace (environment:
    host_env); ``launch``: more mpiexec options (e.g. --bind-to core)."""
    e = host_env(hosts, per_host, env, unset)
    cmd = mpiexec() + list(launch) + ["-n", str(nranks), str(WRAP), sys.executable] + args
    return subprocess.run(cmd, cwd=ROOT, env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=timeout)


def bench_on_hosts(script: str, nhosts: int, args: List[str], env: Optional[Dict[str, str]] = None,
                   timeout: float = 1200, launch: Sequence[str] = ()) -> int:
    """A benchmark script run again as one rank per host on ``nhosts`` fresh hosts (with ``--ranks`` and
    ``args``, ``launch`` given to mpiexec), MPICH kept off shared memory (MPIR_CVAR_NOLOCAL=1); its output
    printed, its exit code back."""
    ensure_iproute2()
    h = Hosts(nhosts).create()
    try:
        p = run_on_hosts(h, nhosts, 1, [str(Path(script).resolve()), "--ranks"] + args,
                         env={"MPIR_CVAR_NOLOCAL": "1", **(env or {})}, timeout=timeout, launch=launch)
        print(p.stdout, flush=True)
        return p.returncode
    finally:
        h.destroy()


def start_on_hosts(hosts: Hosts, nranks: int, per_host: int, args: List[str], store_dir,
                   env: Optional[Dict[str, str]] = None, unset: Sequence[str] = ()) -> List[subprocess.Popen]:
    """``python args...`` as nranks plain processes (no MPI launcher, so none tears the survivors down when
    a rank dies), per_host consecutive ranks in each host namespace with that host's hostname, bootstrapped
    over a directory store: RANK, SIZE and STORE_DIR set, MPI launcher variables removed (environment
    otherwise host_env). The process started is the rank itself (ip netns exec, unshare and sh all exec),
    so Popen.pid is the rank's pid; stdout and stderr merged."""
    e = {k: v for k, v in host_env(hosts, per_host, env, unset).items()
         if not k.startswith(("PMI", "OMPI_", "PMIX", "MPI_"))}
    e.update(SIZE=str(nranks), STORE_DIR=str(store_dir))
    procs = []
    for r in range(nranks):
        host = hosts.names[r // per_host]
        cmd = ["ip", "netns", "exec", host, "unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', host,
               sys.executable] + args
        procs.append(subprocess.Popen(cmd, cwd=ROOT, env=dict(e, RANK=str(r)), stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    return procs
