"""The front end's one set of rules: a Spec per collective (which buffers, counts, root, op) drives one
validate-to-Call function for every memory kind, so each rule and its message is written once. Checks run
in one order, before any data moves: root, op, memory kind, input view, op against dtype, divisibility,
output (given: kind, writable, dtype, size; absent: in place or allocated)."""
from __future__ import annotations

from typing import Any, Callable, Dict, NamedTuple, Optional, Tuple

from . import fp8
from .call import Call
from ..errors import HpcclInvalidArgument
from ..memory import unalias
from ..ops import AVG, as_op, check_op_dtype


class Spec(NamedTuple):
    """What one collective takes. ``out``: the output's element count from the input's and the size;
    ``alloc``: the output's shape when recvbuf is None (None: in place, into the input); ``writes``: whose
    input an in-place call writes ('all', 'root' or 'others'); ``block``: the input may be this rank's own
    block of the output; ``args``: the Call's arguments from (send, recv, root, op)."""

    reduces: bool
    rooted: bool
    in_name: str
    out: Callable[[int, int], int]
    divisible: bool
    alloc: Optional[Callable[[int, tuple, int], tuple]]
    writes: str
    block: bool
    args: Callable[[Any, Any, int, Any], tuple]


def _same(count: int, n: int) -> int:
    return count


SPECS: Dict[str, Spec] = {
    "all_reduce": Spec(True, False, "sendbuf", _same, False, None, "all", False, lambda s, r, root, op: (s, r, op)),
    "reduce": Spec(True, True, "sendbuf", _same, False, None, "root", False,
                   lambda s, r, root, op: (s, r, root, op)),
    "broadcast": Spec(False, True, "buf", _same, False, None, "others", False, lambda s, r, root, op: (s, r, root)),
    "all_gather": Spec(False, False, "sendbuf", lambda c, n: c * n, False, lambda n, shape, c: (n,) + shape, "",
                       True, lambda s, r, root, op: (s, r)),
    "reduce_scatter": Spec(True, False, "sendbuf", lambda c, n: c // n, True, lambda n, shape, c: (c,), "", True,
                           lambda s, r, root, op: (s, r, op)),
    "all_to_all": Spec(False, False, "sendbuf", _same, True, lambda n, shape, c: shape, "", False,
                       lambda s, r, root, op: (s, r)),
}


def validate(comm: Any, coll: str, sendbuf: Any, recvbuf: Any, op: Any, root: int, stream: Any,
             key: Any, dtype: Any = None) -> Tuple[Optional[Call], Any]:
    """(the Call to run, or None when there is nothing to move; what the user's call returns). ``dtype``: a
    reduction's float8 type for buffers of 1-byte words (CuPy has no float8)."""
    spec = SPECS[coll]
    n = comm.size
    if spec.rooted:
        root = comm._rank_arg(root, "root")
    if spec.reduces:
        op = as_op(op)
    m = comm._memory(sendbuf, coll)
    send, shaped = m.view(sendbuf, spec.in_name)
    f8 = None
    if spec.reduces:
        f8 = fp8.of(m, sendbuf, send, dtype)
        check_op_dtype(op, f8 if f8 is not None else m.dtype(send))
    if spec.divisible and send.size % n:
        raise HpcclInvalidArgument(spec.in_name, f"has {send.size} elements, not a multiple of the "
                                                 f"communicator size {n}")
    count = spec.out(send.size, n)
    is_root = spec.rooted and comm.rank == root
    silent = spec.writes == "root" and not is_root  # reduce on a non-root: no output is written
    if recvbuf is not None:
        recv, result = comm._out(m, recvbuf, send, count, "recvbuf")
    elif spec.alloc is not None:
        recv, result = m.empty_out(spec.alloc(n, tuple(shaped.shape), count), sendbuf, send)
    else:
        if {"all": True, "root": is_root, "others": not is_root}[spec.writes]:
            m.writable(send, spec.in_name)
        recv, result = send, sendbuf
    if silent:
        recv, result = send, recvbuf
    st = m.stream(stream, sendbuf)
    if send.size == 0:
        return None, result
    if coll == "all_to_all":
        if send is recv or m.shares(send, recv):  # in place too: blocks are read after writes start
            send, key = m.clone(send, st), None
    elif not silent:
        send, key = unalias(m, send, recv, st, key, block=comm.rank if spec.block else None)
    finish = recv if spec.reduces and op is AVG and not silent else None
    nbytes = recv.nbytes if coll == "all_gather" else send.nbytes
    call = Call(coll, m, st, nbytes, spec.args(send, recv, root, op), op=op if spec.reduces else None,
                finish=finish, key=key)
    return (call if f8 is None else fp8.wrap(call, f8)), result
