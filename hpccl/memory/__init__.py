"""Memory kinds: how to copy, reduce and allocate on each (host now, CUDA in memory.cuda)."""
