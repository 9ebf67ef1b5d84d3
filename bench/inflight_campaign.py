"""Kill (SIGKILL) or stop (SIGSTOP) one rank with calls IN FLIGHT and check everything a survivor, a bystander
and a new process can count on (docs/RELIABILITY.md, "A peer dies with GPU calls in flight").

Each case starts SIZE ranks of tests/scripts/inflight_kill.py as plain processes over a directory store, in
one layout (one node; HPCCL_NODE_ID=split:1, every rank its own node; split:2, nodes of 2 ranks), running a
loop of one collective that synchronises its stream every SYNC_EVERY calls, and kills or stops the victim at
call KILL_AT. A bystander job (2 ranks of its own, one node, its own store) runs a checked all_reduce loop on
the same GPU through the whole campaign. A case passes when every survivor raised an HpcclError naming the
victim within its bound (3 s after a kill; HPCCL_TIMEOUT + 3 s after a stop), no survivor lost its CUDA
context (its error was hpccl's, a kernel of its own ran after, its buffers freed), shrink to the survivors and
every collective on the new communicator (checked) worked, a canary process started on the GPU and ran a
kernel right after, and no process of the case is left. At the end: the bystander saw no error and
/dev/shm holds nothing of hpccl's.

  python3 bench/inflight_campaign.py --table            the victim at every position of split:1 x 2, 3,
                                                        split:2 x 4, 6 and one node x 4, 8 (all_reduce 256 KiB,
                                                        sync every 50, kill at call 300)
  python3 bench/inflight_campaign.py --cases N --seed S random layout, collective (or, one case in ten, DDP
                                                        training steps on torch: tests/scripts/torch_survive.py),
                                                        size (8 B - 64 MiB), dtype,
                                                        depth (sync every 1-100), kill or stop, and path:
                                                        replay (repeated calls replayed from C, the default),
                                                        eager (HPCCL_NET_REPLAY=0 HPCCL_HIER_REPLAY=0: every
                                                        call through Python) or graph (captured, replayed)
  --buf numpy runs the same on host buffers (no GPU: CI); --parallel P runs P cases at once (each one a
  bystander of the others too); --log FILE appends every case's line.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RANK_SCRIPT = os.path.join(ROOT, "tests", "scripts", "inflight_kill.py")
DDP_SCRIPT = os.path.join(ROOT, "tests", "scripts", "torch_survive.py")  # coll "ddp": DDP steps on torch
COLLS = ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all"]
DTYPES = ["float32", "float16", "int32", "float64", "int64"]


def _env(extra: Dict[str, str]) -> Dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([ROOT, os.path.join(ROOT, "tests", "scripts"), env.get("PYTHONPATH", "")])
    env.update(extra)
    return env


def shm_files() -> set:
    return {f for f in glob.glob("/dev/shm/*") if "hpccl" in os.path.basename(f)}


class Job:
    """SIZE rank processes of inflight_kill.py over one directory store."""

    def __init__(self, size: int, env: Dict[str, str], logdir: str, name: str, script: str = RANK_SCRIPT) -> None:
        self.store = tempfile.mkdtemp(prefix=f"hpccl-{name}-")
        self.size, self.name = size, name
        self.logs = [os.path.join(logdir, f"{name}.r{r}.log") for r in range(size)]
        self.procs = []
        for r in range(size):
            e = _env({**env, "RANK": str(r), "SIZE": str(size), "STORE_DIR": self.store})
            with open(self.logs[r], "w") as out:
                self.procs.append(subprocess.Popen([sys.executable, script], env=e, stdout=out,
                                                   stderr=subprocess.STDOUT, cwd=ROOT))

    def wait(self, timeout: float, need: List[int]) -> Dict[int, dict]:
        """Results of the ranks in ``need`` (each printed its RESULT line) within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        got: Dict[int, dict] = {}
        while time.monotonic() < deadline:
            for r in need:
                if r not in got:
                    res = self.result(r)
                    if res is not None:
                        got[r] = res
            if len(got) == len(need):
                break
            time.sleep(0.05)
        return got

    def result(self, r: int) -> Optional[dict]:
        try:
            with open(self.logs[r], errors="replace") as f:
                for line in f:
                    if line.startswith("RESULT "):
                        return json.loads(line[7:])
        except OSError:
            pass
        return None

    def victim_at(self) -> Optional[float]:
        try:
            with open(os.path.join(self.store, "victim_at")) as f:
                return float(f.read())
        except (OSError, ValueError):
            return None

    def finish(self, grace: float) -> int:
        """Wait for every process to exit (``grace`` seconds), kill what is left; the number left."""
        deadline = time.monotonic() + grace
        left = 0
        for p in self.procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                left += 1
                p.kill()
                p.wait()
        shutil.rmtree(self.store, ignore_errors=True)
        return left


def canary(gpu: bool) -> dict:
    """A new process starts on the GPU and runs a kernel, at once."""
    if not gpu:
        return {"ok": True, "s": 0.0}
    code = ("import cupy as cp; a = cp.arange(1000, dtype=cp.float32); s = float((a * 2).sum()); "
            "cp.cuda.Device().synchronize(); assert s == 999000.0; print('CANARY_OK')")
    t0 = time.monotonic()
    c = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    ok = "CANARY_OK" in c.stdout
    out = {"ok": ok, "s": round(time.monotonic() - t0, 2)}
    if not ok:
        out["error"] = (c.stdout + c.stderr).strip().splitlines()[-1:]
    return out


def layout_env(layout: str) -> Dict[str, str]:
    return {} if layout == "one" else {"HPCCL_NODE_ID": layout}


def run_case(idx: int, case: dict, gpu: bool, logdir: str) -> dict:
    """Run one case; its verdict and measurements."""
    n, victim, mode = case["n"], case["victim"], case["mode"]
    timeout_s = case.get("timeout", 30 if mode == "kill" else 4)
    env = {**layout_env(case["layout"]), "VICTIM": str(victim), "MODE": mode, "KILL_AT": str(case["kill_at"]),
           "SYNC_EVERY": str(case["every"]), "COLL": case["coll"], "BYTES": str(case["bytes"]),
           "DTYPE": case["dtype"], "BUF": "cupy" if gpu else "numpy", "PATH_KIND": case["path"],
           "HPCCL_TIMEOUT": str(timeout_s), **case.get("env", {})}
    if case["path"] == "eager":  # every call through Python: no replay of recorded calls from C
        env.update(HPCCL_NET_REPLAY="0", HPCCL_HIER_REPLAY="0")
    ddp = case["coll"] == "ddp"
    if ddp:  # torch_survive.py: KILL_AT counts training steps, BUF is torch's device
        env.update(BUF="cuda" if gpu else "cpu", KILL_AT=str(max(2, case["kill_at"] % 8)))
    job = Job(n, env, logdir, f"case{idx:04d}", DDP_SCRIPT if ddp else RANK_SCRIPT)
    survivors = [r for r in range(n) if r != victim]
    res = job.wait(90 + timeout_s, survivors)
    vat = job.victim_at()
    left = job.finish(30)
    bound = 3.0 if mode == "kill" else timeout_s + 3.0
    v = {"case": idx, **{k: case[k] for k in ("layout", "n", "victim", "mode", "coll", "bytes", "dtype", "every",
                                             "kill_at", "path")}}
    if case.get("env"):
        v["env"] = case["env"]
    v["reported"] = len(res)
    v["latency_s"] = {r: round(res[r]["at"] - vat, 3) if vat and "at" in res[r] else None for r in res}
    problems = []
    if len(res) < len(survivors):
        problems.append(f"hang: {len(survivors) - len(res)} survivor(s) never reported")
    for r, x in sorted(res.items()):
        err, msg = x.get("error"), x.get("message") or ""
        if err is None:
            problems.append(f"rank {r}: no error")
            continue
        if not err.startswith("Hpccl"):
            problems.append(f"rank {r}: {err}")
        if "cudaError" in msg or "CUDA_ERROR" in msg or x.get("gpu_ok") is False:
            problems.append(f"rank {r}: lost context")
        if not x.get("named"):
            problems.append(f"rank {r}: did not name {victim} ({err}: {msg[:160]})")
        lat = v["latency_s"].get(r)
        if lat is not None and lat > bound:
            problems.append(f"rank {r}: named after {lat} s > {bound}")
        if not x.get("after_shrink"):
            problems.append(f"rank {r}: shrink failed ({(x.get('shrink_error') or '')[-200:]})")
    v["lost_context"] = sum(1 for p in problems if "lost context" in p)
    v["wrong"] = sum(1 for x in res.values() if "AssertionError" in (x.get("error") or ""))
    v["canary"] = canary(gpu)
    if not v["canary"]["ok"]:
        problems.append("canary could not start")
    if left:
        problems.append(f"{left} process(es) left")
    v["problems"] = problems
    v["ok"] = not problems
    return v


def table_cases() -> List[dict]:
    cases = []
    for layout, n in (("split:1", 2), ("split:1", 3), ("split:2", 4), ("split:2", 6), ("one", 4), ("one", 8)):
        for victim in range(n):
            cases.append(dict(layout=layout, n=n, victim=victim, mode="kill", coll="all_reduce", bytes=256 << 10,
                              dtype="float32", every=50, kill_at=300, path="replay"))
    return cases


def random_cases(count: int, seed: int, gpu: bool, ddp: bool = True) -> List[dict]:
    rng = random.Random(seed)
    cases = []
    for _ in range(count):
        layout = rng.choice(["one", "split:1", "split:2"])
        n = {"one": rng.randint(2, 8), "split:1": rng.randint(2, 4), "split:2": rng.choice([4, 6])}[layout]
        size = int(2 ** rng.uniform(3, 26))  # 8 B - 64 MiB per rank
        dtype = rng.choice(DTYPES if gpu else ["float32", "float64", "int32", "float16"])
        every = rng.randint(1, 100)
        per_call = max(1, size >> 20)
        kill_at = rng.randint(2, max(3, min(300, 600 // per_call)))
        coll = "ddp" if ddp and rng.random() < 0.1 else rng.choice(COLLS)
        cases.append(dict(layout=layout, n=n, victim=rng.randrange(n), mode=rng.choice(["kill", "kill", "stop"]),
                          coll=coll, bytes=size, dtype=dtype, every=every, kill_at=kill_at,
                          path=rng.choice(["replay", "eager", "graph"]) if gpu else rng.choice(["replay", "eager"])))
    return cases


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--table", action="store_true")
    ap.add_argument("--cases", type=int, default=0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--buf", choices=["cupy", "numpy"], default="cupy")
    ap.add_argument("--parallel", type=int, default=1)
    ap.add_argument("--log", default=None)
    ap.add_argument("--logdir", default=None, help="the ranks' own logs (default: a temp folder)")
    ap.add_argument("--budget", type=float, default=0, help="stop starting cases after this many seconds")
    ap.add_argument("--env", action="append", default=[], help="NAME=value for every case's ranks")
    ap.add_argument("--pick", default="", help="run only these cases (indexes, comma-separated)")
    ap.add_argument("--no-ddp", action="store_true", help="no torch DDP cases (one in ten otherwise)")
    a = ap.parse_args()
    gpu = a.buf == "cupy"
    cases = table_cases() if a.table else random_cases(a.cases, a.seed, gpu, not a.no_ddp)
    if a.pick:
        cases = [cases[int(i)] for i in a.pick.split(",")]
    extra = dict(e.split("=", 1) for e in a.env)
    for c in cases:
        c.setdefault("env", {}).update(extra)
    logdir = a.logdir or tempfile.mkdtemp(prefix="hpccl-campaign-")
    os.makedirs(logdir, exist_ok=True)
    shm_before = shm_files()
    stop = os.path.join(logdir, "bystander.stop")
    by = Job(2, {"VICTIM": "-1", "COLL": "all_reduce", "BYTES": str(64 << 10), "SYNC_EVERY": "20",
                 "BUF": a.buf, "STOP_FILE": stop, "KILL_AT": "1000000000", **extra,
                 # on host buffers its waits sleep rather than spin: on a machine of few cores two spinning
                 # ranks would starve the case's ranks of the CPU their failure detection runs on
                 **({} if gpu else {"HPCCL_SPIN": "0"})}, logdir, "bystander")
    t0 = time.monotonic()
    verdicts: List[dict] = []
    from concurrent.futures import ThreadPoolExecutor
    logf = open(a.log, "a") if a.log else None

    def one(i: int) -> dict:
        if a.budget and time.monotonic() - t0 > a.budget:
            return {"case": i, "skipped": "budget"}
        v = run_case(i, cases[i], gpu, logdir)
        line = ("PASS " if v["ok"] else "FAIL ") + json.dumps(v)
        print(line, flush=True)
        if logf:
            logf.write(line + "\n")
            logf.flush()
        return v

    with ThreadPoolExecutor(max(1, a.parallel)) as ex:
        verdicts = list(ex.map(one, range(len(cases))))
    open(stop, "w").close()
    bres = by.wait(120, [0, 1])
    by_left = by.finish(30)
    time.sleep(0.5)
    leaked = sorted(shm_files() - shm_before)
    ran = [v for v in verdicts if "skipped" not in v]
    summary = {
        "cases": len(ran), "passed": sum(v["ok"] for v in ran),
        "lost_contexts": sum(v["lost_context"] for v in ran), "wrong_results": sum(v["wrong"] for v in ran),
        "hangs": sum(any(p.startswith("hang") for p in v["problems"]) for v in ran),
        "canary_failures": sum(not v["canary"]["ok"] for v in ran),
        "bystander": {r: (x.get("error") or "ok", x.get("calls")) for r, x in bres.items()},
        "bystander_errors": sum(1 for x in bres.values() if x.get("error")) + (2 - len(bres)) + by_left,
        "shm_left": leaked, "max_latency_s": max([t for v in ran for t in v["latency_s"].values() if t is not None],
                                                 default=None),
        "seconds": round(time.monotonic() - t0, 1), "logdir": logdir}
    line = "SUMMARY " + json.dumps(summary)
    print(line, flush=True)
    if logf:
        logf.write(line + "\n")
        logf.close()
    ok = (summary["passed"] == summary["cases"] and not summary["bystander_errors"] and not leaked)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
