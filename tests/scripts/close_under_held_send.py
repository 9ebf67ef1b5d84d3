"""An engine closed while a failed step's rendezvous send is still held by UCX (its peer never receives),
for tests/net/test_engine_units.py: run with UCX's registration cache off through a ucx.conf (UCX_CONFIG_DIR),
not the environment. Prints the engine's no_rcache and "CLOSED" once both engines closed."""
import ctypes
import sys
import time
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "net"))
from engine_pair import engine_pair, held_send  # noqa: E402

from hpccl.transport.engine import _ne as ne  # noqa: E402

c, d = engine_pair(ne)
print("no_rcache", c.no_rcache, flush=True)
words = (ctypes.c_uint32 * 16)()
held = held_send(ne, c, words, 1)
end = time.monotonic() + 10
while not (words[1] == 1 and c.lingering == 1) and time.monotonic() < end:
    time.sleep(1e-3)
print("lingering", c.lingering, flush=True)
c.close()
d.close()
print("CLOSED", flush=True)
