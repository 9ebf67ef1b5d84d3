"""One rank of a network failure test (tests/net/test_netns_failures.py): a plain process (RANK, SIZE,
STORE_DIR; bootstrapped over a directory store, so no launcher tears the survivors down when a rank dies)
inside its own host namespace, talking to the others over UCX (the native engine, UCX's default transports).

    net_fail.py BYTES    all_reduce of BYTES bytes (8: one float64; else float32s) in a loop, checked,
                         until one raises (the test kills, stops or cuts off a rank meanwhile)

After init and one all_reduce it writes STORE_DIR/ready<rank> ({"pid", "host", ...}: the test needs the pid).
When a call raises it prints 'RESULT {json}': the exception's type, message, code, rank / missing attributes,
time.monotonic() when it was raised ("at"; CLOCK_MONOTONIC is system-wide, so the test compares it with the
moment it killed the victim) and how many calls completed; then it destroys the communicator and prints
'DESTROYED {json}' with how long that took, and exits 0."""
import json
import os
import socket
import sys
import time

import numpy as np

import hpccl
from hpccl.bootstrap import StoreBootstrap
from dirstore import DirStore  # tests/scripts/dirstore.py

r, n = int(os.environ["RANK"]), int(os.environ["SIZE"])
store = os.environ["STORE_DIR"]
nbytes = int(sys.argv[1])
comm = hpccl.Communicator(StoreBootstrap(DirStore(store), r, n))
x = np.empty(1, np.float64) if nbytes == 8 else np.empty(nbytes // 4, np.float32)
want = n * (n + 1) / 2
x[:] = r + 1
comm.all_reduce(x)
assert x[0] == want and x[-1] == want, (x[0], x[-1])
net = [t for t in comm._transports if t.name == "ucx"]
info = {"rank": r, "pid": os.getpid(), "host": socket.gethostname(), "node": comm.node,
        "num_nodes": comm.num_nodes, "transports": [f"{t.name}/{getattr(t, 'impl', '')}" for t in comm._transports],
        "tls": net[0].tls if net else None, "error_handling": net[0].error_handling if net else None,
        "UCX_TLS": os.environ.get("UCX_TLS")}
with open(os.path.join(store, f"ready{r}.tmp"), "w") as f:
    json.dump(info, f)
os.replace(os.path.join(store, f"ready{r}.tmp"), os.path.join(store, f"ready{r}"))
done, result = 1, dict(info)
try:
    while True:
        x[:] = r + 1
        comm.all_reduce(x)
        if not (x[0] == want and x[-1] == want):
            raise AssertionError(f"wrong all_reduce result {x[0]}, {x[-1]} (want {want}) after {done} calls")
        done += 1
except Exception as exc:  # noqa: BLE001 - every kind is recorded; the test says which are right
    result.update(error=type(exc).__name__, message=str(exc)[:600], code=getattr(exc, "code", None),
                  failed=getattr(exc, "rank", None), missing=getattr(exc, "missing", None))
result.update(at=time.monotonic(), done=done)
print("RESULT " + json.dumps(result), flush=True)
t0 = time.monotonic()
comm.destroy()
print("DESTROYED " + json.dumps({"rank": r, "seconds": time.monotonic() - t0}), flush=True)
sys.exit(0)
