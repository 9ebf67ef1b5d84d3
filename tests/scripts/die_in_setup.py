"""The last rank is killed right after creating its shared-memory segment, before its peers mapped it (so
before anything unlinks it): the survivors' set-up times out naming it, and they unlink its segment, so
nothing is left in /dev/shm. Plain processes over a directory store (RANK, SIZE, STORE_DIR)."""
import json
import os
import signal
import sys
import time

import hpccl
from hpccl.bootstrap import StoreBootstrap
from hpccl.transport import shm
from dirstore import DirStore  # tests/scripts/dirstore.py

r, n = int(os.environ["RANK"]), int(os.environ["SIZE"])
if r == n - 1:
    made = shm._Segment.__init__

    def made_then_die(self, path, size, create):
        made(self, path, size, create)
        if create:
            os.kill(os.getpid(), signal.SIGKILL)
    shm._Segment.__init__ = made_then_die
t0 = time.monotonic()
result = {"rank": r}
try:
    hpccl.Communicator(StoreBootstrap(DirStore(os.environ["STORE_DIR"]), r, n)).destroy()
    result["error"] = None
except hpccl.HpcclError as exc:
    result.update(error=type(exc).__name__, missing=getattr(exc, "missing", None), message=str(exc))
result["seconds"] = time.monotonic() - t0
print("RESULT " + json.dumps(result), flush=True)
sys.exit(0)
