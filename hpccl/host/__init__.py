"""The compiled host hot path and host buffers every local rank maps: which compiled path serves a
communicator (hotpath: hpccl._hotpath on a node, _nethot across nodes), the calls it takes before and after
Python validation (hotcalls), and alloc_host's shared segments (host_alloc). Its C sources are in
hpccl/csrc/. May import observe, algorithms, runtime, transport, memory, topology, bootstrap and the top
modules; never core or gpu."""
