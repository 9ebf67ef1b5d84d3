"""Device buffers: the GPU half of a communicator (device), the single-node kernel engine over peer memory
(cuda_comm, zero_copy on registered buffers, gpu_sync: the stream-synchronised protocol and its watchdog),
GPU steps across nodes in stream order (netstep, netreplay, proxy) and the CUDA context around a call
(cuda_context). The CUDA kernels and driver calls themselves are hpccl/kernels.py (a top module: memory,
transport and observe use them too). May import host, observe, algorithms, runtime, transport, memory,
topology, bootstrap and the top modules; never core."""
