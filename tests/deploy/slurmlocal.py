"""A throwaway one-node Slurm cluster on localhost (munged + slurmctld + slurmd) for tests.

    with LocalSlurm() as s:
        s.run(["sbatch", "--wait", "job.sbatch"])

Everything lives in one temp folder; daemons are stopped by PID on exit, also after errors.
Run directly (python tests/deploy/slurmlocal.py) to start one, print its SLURM_CONF and wait for Enter.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

PACKAGES = ["slurm-wlm", "slurmctld", "slurmd", "slurm-client", "munge", "libpmix-dev"]
BINARIES = ["munged", "slurmctld", "slurmd", "sbatch", "srun", "sinfo", "scontrol"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie child still "exists": reap it if it is ours
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
        return done == 0
    except ChildProcessError:
        stat = Path(f"/proc/{pid}/stat")
        return stat.exists() and stat.read_text().split(")")[-1].split()[0] != "Z"


class LocalSlurm:
    """One-node cluster: node = this host, partition 'debug', CPUs = os.cpu_count()."""

    def __init__(self, keep: bool = False) -> None:
        self.keep = keep
        self.dir = Path(tempfile.mkdtemp(prefix="hpccl-slurm-"))
        self.host = socket.gethostname().split(".")[0]
        self.conf = self.dir / "slurm.conf"
        self.munge_socket = self.dir / "munge" / "munge.socket.2"
        self.pidfiles = {"slurmd": self.dir / "slurmd.pid", "slurmctld": self.dir / "slurmctld.pid",
                         "munged": self.dir / "munge" / "munged.pid"}

    # -- environment -------------------------------------------------------------------------
    def env(self, **extra: str) -> dict:
        env = dict(os.environ, SLURM_CONF=str(self.conf))
        for k in list(env):  # do not inherit an outer job's settings
            if k.startswith(("SLURM_JOB", "SLURM_STEP", "SBATCH_", "SRUN_")) and k != "SLURM_CONF":
                env.pop(k)
        env.update(extra)
        return env

    def run(self, cmd, timeout: float = 30, check: bool = True, **kw) -> subprocess.CompletedProcess:
        kw.setdefault("env", self.env())
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
        if check and r.returncode != 0:
            raise RuntimeError(f"{' '.join(map(str, cmd))} -> {r.returncode}\n{r.stdout}\n{r.stderr}\n"
                               + self.logs())
        return r

    def logs(self) -> str:
        out = []
        for name in ("slurmctld.log", "slurmd.log", "munge/munged.log"):
            p = self.dir / name
            if p.exists():
                out.append(f"--- {name} (tail)\n" + "\n".join(p.read_text(errors="replace").splitlines()[-30:]))
        return "\n".join(out)

    # -- start / stop ------------------------------------------------------------------------
    def _write_conf(self) -> None:
        d = self.dir
        cpus = os.cpu_count() or 1
        lines = [
            "ClusterName=hpccltest",
            f"SlurmctldHost={self.host}(127.0.0.1)",
            "SlurmUser=root", "SlurmdUser=root",
            f"SlurmctldPort={_free_port()}", f"SlurmdPort={_free_port()}",
            "AuthType=auth/munge", f"AuthInfo=socket={self.munge_socket}", "CredType=cred/munge",
            f"StateSaveLocation={d}/state", f"SlurmdSpoolDir={d}/spool",
            f"SlurmctldPidFile={self.pidfiles['slurmctld']}", f"SlurmdPidFile={self.pidfiles['slurmd']}",
            f"SlurmctldLogFile={d}/slurmctld.log", f"SlurmdLogFile={d}/slurmd.log",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/affinity",
            "JobAcctGatherType=jobacct_gather/none", "AccountingStorageType=accounting_storage/none",
            "SelectType=select/linear", "MpiDefault=none", "ReturnToService=2", "MailProg=/bin/true",
            "SlurmctldTimeout=30", "SlurmdTimeout=30", "InactiveLimit=0", "KillWait=5",
            f"NodeName={self.host} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory=1000 State=UNKNOWN",
            "PartitionName=debug Nodes=ALL Default=YES MaxTime=10 State=UP",
        ]
        (d / "state").mkdir()
        (d / "spool").mkdir()
        self.conf.write_text("\n".join(lines) + "\n")

    def _start_munge(self) -> None:
        m = self.dir / "munge"
        m.mkdir()
        os.chmod(self.dir, 0o711)  # munged refuses a socket folder it cannot traverse
        os.chmod(m, 0o711)
        key = m / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o400)
        subprocess.run(["munged", f"--key-file={key}", f"--socket={self.munge_socket}",
                        f"--pid-file={self.pidfiles['munged']}", f"--seed-file={m}/munged.seed",
                        f"--log-file={m}/munged.log"], check=True, capture_output=True, timeout=30)

    def start(self) -> "LocalSlurm":
        try:
            self._write_conf()
            self._start_munge()
            for daemon in ("slurmctld", "slurmd"):
                r = subprocess.run([daemon, "-f", str(self.conf)], capture_output=True, text=True,
                                   timeout=30, env=self.env())
                if r.returncode != 0:
                    raise RuntimeError(f"{daemon} failed: {r.stderr}\n{self.logs()}")
            self.wait_idle()
        except BaseException:
            self.stop()
            raise
        return self

    def wait_idle(self, timeout: float = 30) -> None:
        end = time.monotonic() + timeout
        state = ""
        while time.monotonic() < end:
            r = self.run(["sinfo", "-h", "-N", "-o", "%T"], check=False, timeout=10)
            state = r.stdout.strip()
            if state.startswith("idle"):
                return
            time.sleep(0.3)
        raise RuntimeError(f"node not idle after {timeout}s (state {state!r})\n{self.logs()}")

    def _pid(self, name: str):
        try:
            return int(self.pidfiles[name].read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def _kill(self, name: str, timeout: float = 15) -> None:
        pid = self._pid(name)
        if pid is None or not _pid_alive(pid):
            return
        os.kill(pid, signal.SIGTERM)
        end = time.monotonic() + timeout
        while time.monotonic() < end and _pid_alive(pid):
            time.sleep(0.1)
        if _pid_alive(pid):
            os.kill(pid, signal.SIGKILL)

    def stop(self) -> None:
        """Cancel jobs, stop slurmd, slurmctld, munged by PID; remove the folder unless keep."""
        if self._pid("slurmctld"):
            try:
                self.run(["scancel", "--full", "--partition=debug"], check=False, timeout=10)
            except (subprocess.TimeoutExpired, OSError):
                pass
        self._kill("slurmd")
        self._kill("slurmctld")
        pid = self._pid("munged")
        if pid is not None and _pid_alive(pid):
            subprocess.run(["munged", f"--socket={self.munge_socket}", "--stop"],
                           capture_output=True, timeout=30)
            self._kill("munged", timeout=5)
        if not self.keep:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> "LocalSlurm":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


if __name__ == "__main__":
    with LocalSlurm() as cluster:
        print(f"export SLURM_CONF={cluster.conf}")
        input("one-node Slurm is up; press Enter to stop it ")
