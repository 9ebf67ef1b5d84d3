"""Flight recorder: the last rank skips all_reduce #3 and, while stuck, is asked for its dump with SIGUSR1
(as an operator would with kill -USR1); the others time out and dump on their abort."""
import os
import signal
import time

import numpy as np

import hpccl
from hpccl import config

comm = hpccl.init()
n, r = comm.size, comm.rank
comm.all_reduce(np.ones(1000))       # call #1
comm.broadcast(np.ones(10), root=0)  # call #2
if r == n - 1:
    time.sleep(0.5)
    os.kill(os.getpid(), signal.SIGUSR1)
    time.sleep(config.get("HPCCL_TIMEOUT") + 1)
else:
    try:
        comm.all_reduce(np.ones(1 << 14))  # call #3: the last rank never comes
    except hpccl.HpcclError:
        pass
comm.destroy()
