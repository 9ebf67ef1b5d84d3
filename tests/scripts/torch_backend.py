"""torch.distributed on the "hpccl" backend under mpiexec or torchrun (CPU tensors): every collective torch exposes,
checked against values computed locally, then DDP trained on hpccl and on gloo (a gloo group over the
same ranks, in the same run) with the parameters compared. Prints 'RESULT {json}' per rank."""
import json
import os
import sys

import torch
import torch.distributed as dist

import hpccl.torch as ht

if os.environ.get("TORCHELASTIC_RUN_ID"):  # torchrun: no MPI, hpccl bootstraps from torch's store
    dist.init_process_group("hpccl")
else:
    ht.init_process_group()
rank, n = dist.get_rank(), dist.get_world_size()
checks, bad = 0, []


def check(name, ok):
    global checks
    checks += 1
    if not ok:
        bad.append(name)


def data(r, k=5, dtype=torch.float32):
    return (torch.arange(k, dtype=torch.float64) * (r + 1) + r).to(dtype)


allsum = sum(data(r) for r in range(n))
for dtype in (torch.float32, torch.float64, torch.int32, torch.bfloat16):
    t = data(rank, dtype=dtype)
    dist.all_reduce(t)
    check(f"all_reduce {dtype}", torch.equal(t, sum(data(r, dtype=dtype).double() for r in range(n)).to(dtype)))
t = data(rank)
dist.all_reduce(t, op=dist.ReduceOp.MAX)
check("all_reduce max", torch.equal(t, data(n - 1)))
t = data(rank)
dist.all_reduce(t, op=dist.ReduceOp.AVG)
check("all_reduce avg", torch.allclose(t, allsum / n))
t = data(rank)
dist.all_reduce(t, op=dist._make_nccl_premul_sum(2.0))
check("all_reduce premul_sum", torch.allclose(t, 2 * allsum))
t = data(rank)
work = dist.all_reduce(t, async_op=True)
work.wait()
check("all_reduce async", torch.equal(t, allsum))
try:
    dist.all_reduce(data(rank).int(), op=dist.ReduceOp.BAND)
    check("unsupported op raises", False)
except (RuntimeError, ValueError) as exc:
    check("unsupported op raises, naming op", "op" in str(exc))

outs = [torch.zeros(5) for _ in range(n)]
dist.all_gather(outs, data(rank))
check("all_gather", all(torch.equal(outs[r], data(r)) for r in range(n)))
big = torch.zeros(n * 5)
dist.all_gather_into_tensor(big, data(rank))
check("all_gather_into_tensor", torch.equal(big, torch.cat([data(r) for r in range(n)])))
out = torch.zeros(5)
dist.reduce_scatter(out, [data(rank) * (p + 1) for p in range(n)])
check("reduce_scatter", torch.allclose(out, allsum * (rank + 1)))
full = torch.cat([data(rank) * (p + 1) for p in range(n)])
out = torch.zeros(5)
dist.reduce_scatter_tensor(out, full)
check("reduce_scatter_tensor", torch.allclose(out, allsum * (rank + 1)))
out = torch.zeros(5)
dist.reduce_scatter_tensor(out, full, op=dist._make_nccl_premul_sum(0.5))
check("reduce_scatter_tensor premul_sum", torch.allclose(out, allsum * (rank + 1) * 0.5)
      and torch.equal(full, torch.cat([data(rank) * (p + 1) for p in range(n)])))
for root in range(n):
    t = data(rank)
    dist.broadcast(t, src=root)
    check(f"broadcast {root}", torch.equal(t, data(root)))
    t = data(rank)
    dist.reduce(t, dst=root)
    if rank == root:
        check(f"reduce {root}", torch.equal(t, allsum))
    g = [torch.zeros(5) for _ in range(n)] if rank == root else None
    dist.gather(data(rank), g, dst=root)
    if rank == root:
        check(f"gather {root}", all(torch.equal(g[r], data(r)) for r in range(n)))
    o = torch.zeros(5)
    dist.scatter(o, [data(p) + 100 for p in range(n)] if rank == root else None, src=root)
    check(f"scatter {root}", torch.equal(o, data(rank) + 100))
# all_to_all_single: even, then uneven splits (rank r sends p+1 rows to rank p, each row [r, p])
src = torch.arange(n * 2, dtype=torch.float32) + 10 * rank
dst = torch.zeros(n * 2)
dist.all_to_all_single(dst, src)
check("all_to_all_single even", torch.equal(dst, torch.cat([torch.arange(2 * rank, 2 * rank + 2) + 10 * q
                                                           for q in range(n)]).float()))
ins = [p + 1 for p in range(n)]
outs_split = [rank + 1] * n
src = torch.cat([torch.tensor([[rank, p]] * (p + 1), dtype=torch.float32) for p in range(n)])
dst = torch.zeros(sum(outs_split), 2)
dist.all_to_all_single(dst, src, output_split_sizes=outs_split, input_split_sizes=ins)
check("all_to_all_single uneven", torch.equal(dst, torch.cat([torch.tensor([[q, rank]] * (rank + 1),
                                                                           dtype=torch.float32)
                                                              for q in range(n)])))
try:
    dist.all_to_all_single(torch.zeros(n), torch.zeros(n), input_split_sizes=[n + 1] + [0] * (n - 1),
                           output_split_sizes=[1] * n)
    check("bad split raises", False)
except (RuntimeError, ValueError) as exc:
    check("bad split raises, naming it", "split" in str(exc))
lo = [torch.zeros(3) for _ in range(n)]
dist.all_to_all(lo, [torch.full((3,), float(rank * 10 + p)) for p in range(n)])
check("all_to_all list", all(torch.equal(lo[q], torch.full((3,), float(q * 10 + rank))) for q in range(n)))
dist.barrier()
if n > 1:  # ring with send/recv, then batch_isend_irecv
    right, left = (rank + 1) % n, (rank - 1) % n
    got = torch.zeros(5)
    if rank % 2 == 0:
        dist.send(data(rank), right)
        dist.recv(got, left)
    else:
        dist.recv(got, left)
        dist.send(data(rank), right)
    check("send/recv", torch.equal(got, data(left)))
    got = torch.zeros(5)
    reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, data(rank) * 2, right),
                                   dist.P2POp(dist.irecv, got, left)])
    for q in reqs:
        q.wait()
    check("batch_isend_irecv", torch.equal(got, data(left) * 2))
# a subgroup of the even ranks
evens = list(range(0, n, 2))
sub = dist.new_group(evens)
if rank in evens:
    t = data(rank)
    dist.all_reduce(t, group=sub)
    check("new_group all_reduce", torch.equal(t, sum(data(r) for r in evens)))
try:
    dist.all_reduce(torch.zeros(4, 4).t())
    check("non-contiguous raises", False)
except (RuntimeError, ValueError) as exc:
    check("non-contiguous raises, naming it", "contiguous" in str(exc))

# the coalesced tensor forms (what FSDP and DDP's bucketing call), premul_sum included
pg = dist.group.WORLD
ins = [torch.full((2 * n,), float(rank + 1)), torch.arange(3 * n, dtype=torch.float32)]
outs = [torch.zeros(2), torch.zeros(3)]
o = dist.ReduceScatterOptions()
o.reduceOp = dist._make_nccl_premul_sum(2.0)
pg.reduce_scatter_tensor_coalesced(outs, ins, o).wait()
check("reduce_scatter_tensor_coalesced", torch.allclose(outs[0], torch.full((2,), float(n * (n + 1))))
      and torch.allclose(outs[1], 2 * n * torch.arange(3 * rank, 3 * rank + 3, dtype=torch.float32)))
g2 = [torch.zeros(n), torch.zeros(2 * n)]
pg.allgather_into_tensor_coalesced(g2, [torch.full((1,), float(rank)), torch.full((2,), float(rank))]).wait()
check("allgather_into_tensor_coalesced", torch.equal(g2[0], torch.arange(n, dtype=torch.float32))
      and torch.equal(g2[1], torch.arange(n, dtype=torch.float32).repeat_interleave(2)))

# DDP on hpccl and on gloo (a gloo group over the same ranks): same data, same seeds, 30 steps
gloo = dist.new_group(backend="gloo")


def train(group):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
    ddp = torch.nn.parallel.DistributedDataParallel(model, process_group=group)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(100 + rank)
    losses = []
    for _ in range(30):
        x = torch.randn(8, 16, generator=g)
        y = torch.randn(8, 4, generator=g)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, [p.detach().clone() for p in model.parameters()]


l_h, p_h = train(None)      # the default group: hpccl
l_g, p_g = train(gloo)
check("ddp losses equal gloo's", l_h == l_g if n <= 2 else all(abs(a - b) <= 1e-5 * abs(b) for a, b in zip(l_h, l_g)))
check("ddp parameters equal gloo's", all(torch.equal(a, b) if n <= 2 else torch.allclose(a, b, rtol=1e-5)
                                         for a, b in zip(p_h, p_g)))


def train_fsdp(group):
    """FSDP2 (fully_shard) on a DeviceMesh over the group: 10 steps."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
    mesh = DeviceMesh.from_group(group or dist.group.WORLD, "cpu")
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(200 + rank)
    losses = []
    for _ in range(10):
        x, y = torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


f_h, f_g = train_fsdp(None), train_fsdp(gloo)
check("fsdp2 losses equal gloo's", f_h == f_g if n <= 2 else all(abs(a - b) <= 1e-5 * abs(b) for a, b in zip(f_h, f_g)))
print("RESULT " + json.dumps({"rank": rank, "checks": checks, "bad": bad,
                              "backend": dist.get_backend()}), flush=True)
dist.destroy_process_group()
sys.exit(0)
