"""One process of a DDP training job on the "hpccl" torch backend with elastic membership (docs/TORCH.md,
"Growing the group back"): a rank SIGKILLs itself at step KILL_AT, the survivors re-make the group over
themselves (as tests/scripts/torch_survive.py) and train on; a fresh process (ROLE new, started by the test
once the victim is gone) asks to join through the store; at the next step boundary (by step GROW_AT at the
latest, waiting for it there) the members admit it: every member and the newcomer re-make the group over the
grown membership, the newcomer gets rank 0's parameters (DDP's broadcast), optimizer state and step, and all
train to the end. Checked: the state is identical on every rank after the grow, the final parameters are
identical everywhere and equal a one-process reference trained on the same data for the same steps.

Plain processes over a FileStore in STORE_DIR. ROLE old: RANK, SIZE; ROLE new: no rank (the store hands out
tickets). Environment: VICTIM, KILL_AT, GROW_AT, STEPS (total), HPCCL_TIMEOUT. Prints "RESULT {json}"."""
import copy
import gc
import hashlib
import json
import os
import signal
import sys
import time
import traceback

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import hpccl
import hpccl.torch  # noqa: F401 - registers the "hpccl" backend

store_dir = os.environ["STORE_DIR"]
role = os.environ.get("ROLE", "old")
size = int(os.environ["SIZE"])  # the job's full size, which it grows back to
victim = int(os.environ.get("VICTIM", "1"))
kill_at, grow_at = int(os.environ.get("KILL_AT", "3")), int(os.environ.get("GROW_AT", "6"))
total = int(os.environ.get("STEPS", "10"))
torch.set_num_threads(1)
store = dist.FileStore(os.path.join(store_dir, "torchstore"), -1)
result = {"role": role, "t_ready": time.time()}
checks = {}


def batch(step: int):
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(32, 16, generator=g)
    return x, x.sum(1, keepdim=True).sin()


def fresh_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))


def make_opt(model):
    return torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


def flat(model, opt) -> torch.Tensor:
    """Parameters, then momentum buffers (zeros where a parameter has none yet)."""
    ps = list(model.parameters())
    mom = [opt.state[p]["momentum_buffer"] if "momentum_buffer" in opt.state.get(p, {}) else torch.zeros_like(p)
           for p in ps]
    return torch.cat([t.detach().reshape(-1) for t in ps + mom])


def same_everywhere(t: torch.Tensor) -> bool:
    parts = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, t)
    return all(torch.equal(p, t) for p in parts)


def regroup(gen: int, rank: int, world: int) -> None:
    """A new default group (a fresh prefix of the same store) over the current membership."""
    dist.init_process_group("hpccl", store=dist.PrefixStore(f"gen{gen}", store), rank=rank, world_size=world)


def share_state(model, opt, step: int) -> int:
    """After a grow: every rank takes rank 0's step and optimizer state (DDP's wrap broadcasts its parameters)."""
    s = torch.tensor([step], dtype=torch.int64)
    dist.broadcast(s, 0)
    for p in model.parameters():
        opt.state.setdefault(p, {}).setdefault("momentum_buffer", torch.zeros_like(p))
    mom = torch.cat([opt.state[p]["momentum_buffer"].reshape(-1) for p in model.parameters()])
    dist.broadcast(mom, 0)
    at = 0
    for p in model.parameters():
        opt.state[p]["momentum_buffer"].copy_(mom[at:at + p.numel()].view_as(p))
        at += p.numel()
    return int(s[0])


def admit(members: list, gen: int, admitted: int, step: int) -> tuple:
    """At a step boundary: rank 0 counts the processes waiting to join (waiting for them at GROW_AT while the
    group is below SIZE); the count reaches every member by an all_reduce; if any wait, rank 0 hands each a
    ticket (the new group's prefix, its rank, the new size) and every member re-makes the group with them.
    Returns (members, gen, admitted, grew)."""
    k = 0
    if dist.get_rank() == 0:
        deadline = time.monotonic() + 60
        while True:
            k = store.add("join/requests", 0) - admitted
            if k > 0 or step != grow_at or len(members) >= size or time.monotonic() > deadline:
                break
            time.sleep(0.05)
    kt = torch.tensor([k], dtype=torch.int64)
    dist.all_reduce(kt)
    k = int(kt[0])
    if k == 0:
        return members, gen, admitted, False
    world = len(members) + k
    if dist.get_rank() == 0:
        for i in range(k):
            store.set(f"join/ticket{admitted + i}", f"{gen + 1},{len(members) + i},{world}")
    me = members.index(my_id)
    dist.destroy_process_group()
    regroup(gen + 1, me, world)
    return members + [f"new{admitted + i}" for i in range(k)], gen + 1, admitted + k, True


def train(model, opt, step: int, members: list, gen: int, admitted: int, ddp=None):
    ddp = DDP(model) if ddp is None else ddp
    good = {step: (copy.deepcopy(model.state_dict()), copy.deepcopy(opt.state_dict()))}
    while step < total:
        try:
            members, gen, admitted, grew = admit(members, gen, admitted, step)
            if grew:
                del ddp
                gc.collect()
                step = share_state(model, opt, step)
                ddp = DDP(model)  # rank 0's parameters reach the newcomers
                checks["grown_same"] = same_everywhere(flat(model, opt))
                result.update(grown_size=dist.get_world_size(), grown_rank=dist.get_rank(), grown_at=step,
                              t_grown=time.time())
                continue  # the loop's top again, in step with the newcomers (their first admit)
            if my_id == victim and step == kill_at:
                with open(os.path.join(store_dir, "victim_at"), "w") as f:
                    f.write(repr(time.time()))
                os.kill(os.getpid(), signal.SIGKILL)
            x, y = batch(step)
            opt.zero_grad(set_to_none=True)
            torch.nn.functional.mse_loss(ddp(x), y).backward()
            opt.step()
            step += 1
            good = {step - 1: good.get(step - 1), step: (copy.deepcopy(model.state_dict()),
                                                          copy.deepcopy(opt.state_dict()))}
        except hpccl.HpcclError as exc:  # a member died: the survivors re-make the group (torch_survive.py)
            bad = [exc.rank] if getattr(exc, "rank", None) is not None else (getattr(exc, "missing", None) or [])
            gone = {members[q] for q in bad}
            if not gone:
                raise
            result.update(error=type(exc).__name__, failed=[str(g) for g in gone], at=time.time())
            del ddp
            dist.destroy_process_group()
            members, gen = [q for q in members if q not in gone], gen + 1
            regroup(gen, members.index(my_id), len(members))
            both = torch.tensor([step, -step], dtype=torch.int64)
            dist.all_reduce(both, op=dist.ReduceOp.MIN)
            step = int(both[0])
            model = fresh_model()
            model.load_state_dict(good[step][0])
            opt = make_opt(model)
            opt.load_state_dict(good[step][1])
            gc.collect()
            ddp = DDP(model)
            result.update(shrunk_size=dist.get_world_size(), shrunk_rank=dist.get_rank(), resumed_from=step)
    return model, opt, step


try:
    model = fresh_model()
    opt = make_opt(model)
    if role == "old":
        my_id = int(os.environ["RANK"])
        regroup(0, my_id, size)
        model, opt, step = train(model, opt, 0, list(range(size)), 0, 0)
    else:
        t0 = time.monotonic()
        ticket = store.add("join/requests", 1) - 1  # this process's place in the queue of joiners
        my_id = f"new{ticket}"
        gen, rank, world = (int(v) for v in store.get(f"join/ticket{ticket}").decode().split(","))
        regroup(gen, rank, world)
        step = share_state(model, opt, 0)
        result.update(grown_size=world, grown_rank=rank, grown_at=step, join_s=round(time.monotonic() - t0, 3),
                      t_grown=time.time())
        members = list(range(world - 1)) + [my_id]  # the old members' ids matter only to them
        ddp = DDP(model)  # as the members' re-wrap: rank 0's parameters arrive
        checks["grown_same"] = same_everywhere(flat(model, opt))
        model, opt, step = train(model, opt, step, members, gen, ticket + 1, ddp)
    final = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    result["params_sha1"] = hashlib.sha1(final.double().numpy().tobytes()).hexdigest()
    checks["final_same"] = same_everywhere(final)
    ref = fresh_model()
    ref_opt = make_opt(ref)
    for s in range(total):
        x, y = batch(s)
        ref_opt.zero_grad(set_to_none=True)
        torch.nn.functional.mse_loss(ref(x), y).backward()
        ref_opt.step()
    want = torch.cat([p.detach().reshape(-1) for p in ref.parameters()])
    checks["matches_reference"] = bool(torch.allclose(final, want, rtol=1e-5, atol=1e-6))
    result.update(steps_run=step, t_end=time.time())
except Exception:  # noqa: BLE001 - reported: the test reads RESULT
    result["train_error"] = traceback.format_exc()[-1500:]
result["checks"] = checks
print("RESULT " + json.dumps(result), flush=True)
try:
    dist.destroy_process_group()
except Exception:  # noqa: BLE001 - a group left broken by a failure above (already reported)
    pass
sys.exit(0)
