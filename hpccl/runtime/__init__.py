"""What every engine's schedules run on: waiting without hanging (progress: spin, yield, sleep,
HPCCL_TIMEOUT), the failures a wait runs into and how they are named and passed on (failures), and the
exchange, copy and reduce operations algorithms are written against (primitives), routing each peer to its
transport and each buffer to its memory kind. May import transport, memory, topology, bootstrap and the top
modules; never algorithms or anything above."""
