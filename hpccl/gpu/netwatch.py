"""The host's backstop for GPU network steps: a stream that waits for an engine's done word with no limit of its
own (the eager path's cuStreamWaitValue32) hangs for good if the engine's thread stops. A process-wide C thread
(hpccl/csrc/_netwatch.c: no GIL, so a caller blocked in a sync cannot stop it) watches each open communicator's
engines; when one makes no round of its loop (``Engine.beats``) for 2 x HPCCL_TIMEOUT + 10 s, it writes every
done word the stream may wait for and sets the communicator's stuck word to STUCK_WATCH, so the stream goes on
and the rank's next call or synchronize() raises. The network kernels give up on their own after
2 x HPCCL_TIMEOUT + 5 s (STUCK_KERNEL), so they do first."""
from __future__ import annotations

import ctypes
from typing import Any, Optional

STUCK_KERNEL = 1  # a network kernel's wait gave up (hp_net_wait)
STUCK_WATCH = 2   # the watchdog released the stream's waits


def limit_s(timeout: float) -> float:
    """How long an engine may make no round before its communicator's waits are released (0: never)."""
    return 2 * timeout + 10 if timeout > 0 else 0.0


def watch(net: Any) -> Optional[Any]:
    """Start watching StagedNet ``net``'s engines (None when HPCCL_TIMEOUT is 0: no limit anywhere); the
    caller closes it before the words' memory is freed."""
    limit = limit_s(net.timeout)
    if not limit:
        return None
    from .. import _netengine
    vals = ctypes.addressof(net.st) + type(net.st).val.offset
    return _netengine.NetWatch(tuple(net.engs), net.stuck_h, tuple(h for h, _d in net.dones), vals, limit, net.st)
