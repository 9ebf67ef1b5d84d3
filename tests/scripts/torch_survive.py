"""One rank of a DDP training job on the "hpccl" torch backend whose victim dies (SIGKILL) or stops (SIGSTOP)
mid-training, and the survivors carry on (docs/TORCH.md, "Carrying on after a rank fails"): each survivor
catches the error the training step raised, finds the failed rank in it, destroys the process group, builds a
new default group over the survivors (a fresh prefix of the same store), re-wraps the model in DDP from the
state after the last completed step and trains on. Checked: the survivors' restored state is identical before
the re-wrap, their parameters after it and after the last step, and those equal a single-process reference
trained on the same data for the same steps (every rank trains on the same data, so the averaged gradient is
the local one).

Plain processes (no launcher, which would tear the survivors down), as inflight_kill.py: RANK, SIZE, STORE_DIR
(a directory: a torch.distributed.FileStore on a file in it outlives every rank, where a TCPStore dies with the
rank that serves it). Environment (all optional): VICTIM (rank; -1: none), MODE kill|stop, KILL_AT (step
index), STEPS_AFTER (steps after KILL_AT), BUF cpu|cuda (cuda: every rank on GPU 0), HPCCL_TIMEOUT,
HPCCL_TORCH_NATIVE. Prints one line "RESULT {json}" with inflight_kill.py's keys and the checks."""
import copy
import gc
import hashlib
import json
import os
import re
import signal
import sys
import time
import traceback

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import hpccl.torch  # noqa: F401 - registers the "hpccl" backend
from dirstore import report_and_end_stopped  # tests/scripts/dirstore.py

r, n = int(os.environ["RANK"]), int(os.environ["SIZE"])
store_dir = os.environ["STORE_DIR"]
victim = int(os.environ.get("VICTIM", n - 1))
mode = os.environ.get("MODE", "kill")
kill_at = int(os.environ.get("KILL_AT", "5"))
total = kill_at + int(os.environ.get("STEPS_AFTER", "5"))
dev = torch.device("cuda", 0) if os.environ.get("BUF", "cpu") == "cuda" else torch.device("cpu")
torch.set_num_threads(1)

# the store: files in STORE_DIR, no server to lose; numWorkers -1: no rank removes the file on its way out
store = dist.FileStore(os.path.join(store_dir, "torchstore"), -1)


def batch(step: int):
    """The step's data, the same on every rank."""
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(32, 16, generator=g)
    return x.to(dev), x.sum(1, keepdim=True).sin().to(dev)


def fresh_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64), torch.nn.Tanh(),
                               torch.nn.Linear(64, 1)).to(dev)


def make_opt(model: torch.nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


phase = ""  # where in the step an error came from


def train_step(ddp: torch.nn.Module, opt: torch.optim.Optimizer, step: int) -> None:
    global phase
    x, y = batch(step)
    opt.zero_grad(set_to_none=True)
    phase = "forward"
    loss = torch.nn.functional.mse_loss(ddp(x), y)
    phase = "backward"  # DDP's bucket all_reduces
    loss.backward()
    phase = "optimizer"
    opt.step()
    phase = "confirm"
    confirm()
    phase = ""


def confirm() -> None:
    """Raise now if a collective of the steps so far failed. CUDA collectives run on the GPU after the call
    returns, and a failure there is raised by the next call, after the optimizer used what the failed one left
    in the gradients; the communicator's synchronize() waits for its GPU work and raises that failure now.
    Host collectives raise inside the call: nothing to do."""
    if dev.type == "cuda":
        dist.group.WORLD.comm.synchronize()


def snapshot(model: torch.nn.Module, opt: torch.optim.Optimizer) -> tuple:
    return copy.deepcopy(model.state_dict()), copy.deepcopy(opt.state_dict())


def flat_params(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def same_everywhere(t: torch.Tensor) -> bool:
    """Every rank of the default group holds the same t, bit for bit (all_gather, compared here)."""
    parts = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, t)
    return all(torch.equal(p, t) for p in parts)


def failed_ranks(exc: BaseException):
    """(failed, missing, the HpcclError or None) of what a step raised, in the group's numbering: the
    HpcclError itself where it is in the chain (torch passes it through unchanged; __cause__/__context__ in
    case it is wrapped), else read from the message ("[hpccl E8] ... rank 2 ...", "... rank(s) [2] ...")."""
    seen, e = set(), exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, hpccl.HpcclError):
            return getattr(e, "rank", None), getattr(e, "missing", None), e
        e = e.__cause__ or e.__context__
    text = str(exc)
    m = re.search(r"rank\(s\) \[([\d, ]*)\]", text)
    missing = [int(v) for v in m.group(1).split(",") if v.strip()] if m else None
    m = re.search(r"\[hpccl E8\].*?\brank (\d+)\b", text, re.S)
    return (int(m.group(1)) if m else None), missing, None


dist.init_process_group("hpccl", store=dist.PrefixStore("gen0", store), rank=r, world_size=n)
pids = [None] * n
dist.all_gather_object(pids, os.getpid())
result = {"rank": r, "victim": victim, "mode": mode, "error": None, "after_shrink": None}
checks = {}


def train() -> torch.nn.Module:
    """The training loop, carrying on over the survivors after a failure; returns the trained model."""
    members, gen = list(range(n)), 0  # the current group's members (their first ranks), in its rank order
    model = fresh_model()
    ddp, opt = DDP(model), make_opt(model)
    step = 0  # steps completed
    good = {0: snapshot(model, opt)}  # the state after the last two completed steps, by step
    while step < total:
        try:
            if r == victim and step == kill_at:
                with open(os.path.join(store_dir, "victim_at"), "w") as f:
                    f.write(repr(time.time()))
                os.kill(os.getpid(), signal.SIGKILL if mode == "kill" else signal.SIGSTOP)
                result["resumed"] = True
            train_step(ddp, opt, step)
            step += 1
            good = {step - 1: good.get(step - 1), step: snapshot(model, opt)}
        except Exception as exc:  # noqa: BLE001 - whatever the step raised: an HpcclError, or not
            at = time.time()
            failed, missing, hexc = failed_ranks(exc)
            gone = {members[q] for q in ([failed] if failed is not None else missing or [])}
            if gen == 0:  # the first failure is the one reported
                result.update(error=type(exc).__name__, message=str(exc)[:600], failed=failed, missing=missing,
                              hpccl_error=type(hexc).__name__ if hexc is not None else None, phase=phase,
                              at=at, steps=step, named=victim in gone)
            if not gone:
                raise
            t0 = time.monotonic()
            del ddp, hexc
            dist.destroy_process_group()  # the old group: its communicator is aborted; freed, no wait
            members, gen = [q for q in members if q not in gone], gen + 1
            dist.init_process_group("hpccl", store=dist.PrefixStore(f"gen{gen}", store), rank=members.index(r),
                                    world_size=len(members))
            # the survivors resume from the same step: one may have completed a step whose last collective
            # another saw fail (it is then one step ahead, never more)
            both = torch.tensor([step, -step], dtype=torch.int64, device=dev)
            dist.all_reduce(both, op=dist.ReduceOp.MIN)
            step, ahead = int(both[0]), -int(both[1])
            assert ahead - step <= 1 and good.get(step) is not None, (step, ahead, sorted(good))
            model = fresh_model()
            model.load_state_dict(good[step][0])
            opt = make_opt(model)
            opt.load_state_dict(good[step][1])
            gc.collect()  # the old DDP's reducer, and its hooks, go now
            momentum = [opt.state[p]["momentum_buffer"].reshape(-1) for p in model.parameters() if p in opt.state]
            checks["restored_same"] = same_everywhere(torch.cat([flat_params(model), *momentum]))
            ddp = DDP(model)  # broadcasts the new rank 0's parameters, checks every rank's shapes
            checks["rewrap_same"] = same_everywhere(flat_params(model))
            result.update(shrink_s=round(time.monotonic() - t0, 3), new_rank=dist.get_rank(),
                          new_size=dist.get_world_size(), resumed_from=step)
    result["steps_run"] = step
    return model


try:
    final = flat_params(train())
    result["params_sha1"] = hashlib.sha1(final.double().cpu().numpy().tobytes()).hexdigest()
    checks["final_same"] = same_everywhere(final)
    ref = fresh_model()  # the reference: one process, no DDP, the same data for the same steps
    ref_opt = make_opt(ref)
    for s in range(total):
        x, y = batch(s)
        ref_opt.zero_grad(set_to_none=True)
        torch.nn.functional.mse_loss(ref(x), y).backward()
        ref_opt.step()
    want = flat_params(ref)
    result["max_rel_err"] = float(((final - want).abs() / want.abs().clamp_min(1e-3)).max())
    checks["matches_reference"] = bool(torch.allclose(final, want, rtol=1e-5, atol=1e-6))
    if "rewrap_same" in checks and all(checks.values()):
        result["after_shrink"] = ["ddp_steps"]
except Exception:  # noqa: BLE001 - reported, not raised: the survivors' RESULT lines say what failed
    result["shrink_error"] = traceback.format_exc()[-1500:]
result["checks"] = checks
try:  # this rank's own device still works
    k = torch.arange(1 << 16, dtype=torch.float64, device=dev)
    result["gpu_ok"] = float((k * 2).sum()) == float((1 << 16) * ((1 << 16) - 1))
except Exception:  # noqa: BLE001
    result.update(gpu_ok=False, gpu_error=traceback.format_exc()[-800:])
print("RESULT " + json.dumps(result), flush=True)
report_and_end_stopped(store_dir, r, n, victim, mode, pids[victim] if victim >= 0 else 0)
try:
    dist.destroy_process_group()
except Exception:  # noqa: BLE001 - a group left broken by a failure above (already reported)
    pass
sys.exit(0)
