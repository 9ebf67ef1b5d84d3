"""A validated collective Call run by its plan (hpccl/core/planner.py): the compiled hot path, a host schedule,
zero-copy kernels on registered buffers, GPU kernels (one node), a host schedule on the network proxy
(device memory across nodes), or hier over the sub-communicators' steps. No choice is made here.
Functions of the communicator (the fields they read); Communicator._run calls them."""
from __future__ import annotations

from typing import Any

import numpy as np

from .. import log
from ..host import hotcalls
from ..algorithms import hier
from .call import Call
from ..gpu.cuda_context import check_capture
from ..errors import HpcclError
from ..runtime.failures import to_user
from ..memory.interop import CUDA, HOST
from ..memory import host
from .planner import HIER, HOT, KERNEL, ZERO_COPY, Plan


def planned(comm: Any, coll: str, nbytes: int, kind: str) -> Plan:
    """The planner's plan for this call, its algorithm recorded (and traced)."""
    p = comm._planner.plan(coll, nbytes, kind)
    if p.fallback is not None:  # a route that may decline: recorded by the route, or by declined()
        return p
    comm._rec.algo(p.algo)
    if comm._trace:
        log.trace("COLL", "%s %d B %s algo %s", comm._rec.name(coll, comm._seq), nbytes, kind, p.algo)
    return p


def declined(comm: Any, call: Call, p: Plan) -> Plan:
    """The plan to run when ``p``'s route declined the call, recorded (and traced) as planned() does."""
    p = p.fallback
    comm._rec.algo(p.algo)
    if comm._trace:
        log.trace("COLL", "%s %d B algo %s", comm._rec.name(call.coll, comm._seq), call.nbytes, p.algo)
    return p


def hier_steps(comm: Any, stream: Any = None, temp: Any = None) -> hier.Steps:
    """What hier runs on: this communicator's layout and its 'intra' and 'inter' sub-communicators' steps
    (made at the first hier call, intra first, on every rank together); ``temp`` makes its temporaries
    (default: new arrays, freed after the call)."""
    intra, inter = comm._subcomm("intra"), comm._subcomm("inter")
    return hier.Steps(comm.rank, comm.size, comm.local_rank, comm.local_size, comm.num_nodes, comm.nodes,
                      intra._flat, inter._flat, stream, temp)


def host_collective(comm: Any, call: Call) -> None:
    """Run a validated collective Call on host memory: the chosen algorithm, then the op's last step."""
    coll, args = call.coll, call.args
    p = planned(comm, coll, call.nbytes, HOST)
    if p.route == HOT:
        if hotcalls.run(comm, call):
            return
        p = declined(comm, call, p)
    if p.route == HIER:
        hier.run(hier_steps(comm), coll, *args)
    else:
        p.spec.fn(comm._prim, *args)
    if call.finish is not None:
        host.finish(call.finish, call.op, comm.size)


def device_collective(comm: Any, call: Call) -> None:
    """Device Calls: kernels (one node), hier, or a host schedule on the network proxy."""
    dev = comm._dev
    coll, args, st = call.coll, call.args, call.stream
    eng = dev.engine
    p = planned(comm, coll, call.nbytes, CUDA)
    if p.route == ZERO_COPY:  # declines buffers the registry does not hold
        from ..gpu.zero_copy import run as zero_copy
        algo = zero_copy(eng, coll, args, st)
        if algo is not None:
            comm._rec.algo(algo)
            return
        p = declined(comm, call, p)
    spec = p.spec
    if p.route == KERNEL:
        spec.cuda(eng, *args, st)
        eng.remember(call.key)
        comm._planner.snapshot(call.key, p.algo)
        return
    finish = call.finish
    if p.route == HIER:
        check_capture(comm, st, coll, hier=True)
        from ..gpu.cuda_context import stream_context
        capturing = dev.capturing(st)
        with stream_context(dev.device, st):
            if dev.hier is not None and not capturing and dev.hier.takes(call):
                dev.hier.record(call)  # through a chain: repeated calls then replay its sub-calls
                return
            hier.run(hier_steps(comm, st, dev.graph_temp if capturing else None), coll, *args)
            if finish is not None:
                dev.mem.finish(finish, call.op, comm.size)
        return
    prim, seq, size, op = dev.prim, comm._seq, comm.size, call.op
    prim.mem.prepare(prim.mem.dtype(args[0]), op)
    dev.proxy.ops.reserve(4 * call.nbytes + (1 << 20))  # temporaries of any schedule in the table
    user = comm._rec.at()  # a hier step's: the user's call and the step, for an error raised later

    def step() -> None:
        dev.waiter.collective, dev.waiter.seq = coll, seq
        try:
            spec.cuda(prim, *args)
        except HpcclError as exc:
            exc = to_user(comm, exc)  # on the proxy thread; raised later, it passes to_user as it is
            if user is not None:
                exc.in_call = user
            raise exc from None
        if finish is not None:
            prim.mem.finish(finish, op, size)
    replays = dev.replays
    rec = replays.start(call.key, st) if replays is not None else None
    ok = False
    try:
        dev.proxy.enqueue(st, step, comm._rec.name(coll, seq))
        ok = True
    finally:
        if rec is not None:
            replays.finish(call.key, rec, ok)


def host_barrier(comm: Any, call: Call) -> None:
    """A host barrier: the hot path's, else the shared-memory window's, else a dissemination barrier."""
    if "barrier" in comm._planner.hot_colls and hotcalls.run(comm, call):
        return
    if comm._prim.window is not None:
        comm._prim.barrier_window()
    else:
        dissemination(comm, comm._prim, np.zeros(0, dtype=np.uint8))


def net_barrier(comm: Any, call: Call, z: Any) -> None:
    """A stream-ordered barrier across nodes without the engine: a dissemination barrier on the proxy."""
    prim, seq = comm._dev.prim, comm._seq
    check_capture(comm, call.stream, "barrier")
    comm._dev.proxy.enqueue(call.stream, lambda: dissemination(comm, prim, z), f"barrier #{seq}")


def dissemination(comm: Any, prim: Any, z: Any) -> None:
    """log2(n) rounds of empty messages to rank + 2^k, from rank - 2^k: every rank has heard from all."""
    n, r, k = comm.size, comm.rank, 1
    while k < n:
        prim.exchange([((r + k) % n, z)], [((r - k) % n, z, None)])
        k <<= 1
