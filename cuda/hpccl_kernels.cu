// hpccl's collective kernels over peer-mapped memory (CUDA IPC or host-mapped shared memory).
//
// Every kernel is "push": a rank writes what a peer needs into that peer's staging slots (NVLink/PCIe
// stores, fire and forget), signals the peer with a system-scope release store into the peer's flag
// area, waits for its own flags, then combines what arrived in its own (local) memory. Block b of every
// rank talks only to block b of the other ranks, through slots [parity][src][b] and flags [src][b], so a
// block waits only for the data it reads. Step generations live in device memory (flag area counters),
// so launches need no host state and CUDA graphs replay correctly; two slot parities make waiting for a
// peer's step k+1 imply it has finished reading step k-1's slots, so no second barrier is needed.
#include "hpccl_device.cuh"

#define HP_UNROLL 4

// ---- copies -------------------------------------------------------------------------------------------
// dst[0..len) = src[0..len) by the block's threads; 16-byte vectors when aligned.
__device__ __forceinline__ void hp_copy(char* dst, const char* src, u64 len, int aligned) {
  const int t = threadIdx.x, nt = blockDim.x;
  u64 nvec = aligned ? len / 16 : 0;
  const uint4* s = (const uint4*)src;
  uint4* d = (uint4*)dst;
  u64 i = t;
  for (; i + (HP_UNROLL - 1) * nt < nvec; i += HP_UNROLL * nt) {
    uint4 v[HP_UNROLL];
#pragma unroll
    for (int k = 0; k < HP_UNROLL; ++k) v[k] = s[i + k * nt];
#pragma unroll
    for (int k = 0; k < HP_UNROLL; ++k) d[i + k * nt] = v[k];
  }
  for (; i < nvec; i += nt) d[i] = s[i];
  for (u64 j = nvec * 16 + t; j < len; j += nt) dst[j] = src[j];
}

// The same source to every peer's slot [par][rank][b] (all-reduce, all-gather, broadcast): read once.
__device__ __forceinline__ void hp_push_all(const CommArgs& a, const Ctx& c, int par, const char* src, u64 len) {
  const int t = threadIdx.x, nt = blockDim.x, b = blockIdx.x;
  if (a.nranks == 2) {
    hp_copy(hp_slot(a, c, a.rank ^ 1, par, a.rank, b), src, len, a.aligned);
    return;
  }
  u64 nvec = a.aligned ? len / 16 : 0;
  const uint4* s = (const uint4*)src;
  u64 i = t;
  for (; i + (HP_UNROLL - 1) * nt < nvec; i += HP_UNROLL * nt) {
    uint4 v[HP_UNROLL];
#pragma unroll
    for (int k = 0; k < HP_UNROLL; ++k) v[k] = s[i + k * nt];
    for (int p = 0; p < a.nranks; ++p) {
      if (p == a.rank) continue;
      uint4* d = (uint4*)hp_slot(a, c, p, par, a.rank, b);
#pragma unroll
      for (int k = 0; k < HP_UNROLL; ++k) d[i + k * nt] = v[k];
    }
  }
  for (; i < nvec; i += nt) {
    uint4 v = s[i];
    for (int p = 0; p < a.nranks; ++p)
      if (p != a.rank) ((uint4*)hp_slot(a, c, p, par, a.rank, b))[i] = v;
  }
  for (u64 j = nvec * 16 + t; j < len; j += nt) {
    const char ch = src[j];
    for (int p = 0; p < a.nranks; ++p)
      if (p != a.rank) hp_slot(a, c, p, par, a.rank, b)[j] = ch;
  }
}

// ---- reduction of n sources (rank order, so every rank gets bitwise the same result) ------------------
// src s is `own` for s == rank, else this rank's slot [par][s][b] at byte offset soff. The result goes
// to dst, and, when fwd_par >= 0, also to every peer's slot [fwd_par][rank][b] (two-shot's gather).
template <int DT, int OP>
__device__ __forceinline__ void hp_reduce_n(const CommArgs& a, const Ctx& c, int par, u64 soff, const char* own, char* dst,
                                            u64 len, int fwd_par) {
  typedef Dt<DT> D;
  typedef typename D::T T;
  typedef typename D::Acc A;
  const int EV = 16 / sizeof(T);
  const int RU = (EV >= 16) ? 1 : ((EV == 2) ? 2 : HP_UNROLL);  // vectors in flight per thread
  const int t = threadIdx.x, nt = blockDim.x, b = blockIdx.x;
  const int n = a.nranks;
  u64 nvec = a.aligned ? len / 16 : 0;
  u64 i = t;
  for (; i + (RU - 1) * nt < nvec; i += RU * nt) {
    A acc[RU][EV];
    for (int s = 0; s < n; ++s) {
      const uint4* sp = (const uint4*)((s == a.rank) ? own : hp_slot(a, c, a.rank, par, s, b) + soff);
      Vec16<DT> x[RU];
#pragma unroll
      for (int k = 0; k < RU; ++k) x[k].v = sp[i + k * nt];
      if (s == 0) {
#pragma unroll
        for (int k = 0; k < RU; ++k)
#pragma unroll
          for (int e = 0; e < EV; ++e) acc[k][e] = hp_load<DT>(x[k].e[e]);
      } else {
#pragma unroll
        for (int k = 0; k < RU; ++k)
#pragma unroll
          for (int e = 0; e < EV; ++e) acc[k][e] = hp_op<DT, OP>(acc[k][e], hp_load<DT>(x[k].e[e]));
      }
    }
    Vec16<DT> y[RU];
#pragma unroll
    for (int k = 0; k < RU; ++k)
#pragma unroll
      for (int e = 0; e < EV; ++e) y[k].e[e] = hp_store<DT>(hp_finish<DT, OP>(acc[k][e], n));
#pragma unroll
    for (int k = 0; k < RU; ++k) ((uint4*)dst)[i + k * nt] = y[k].v;
    if (fwd_par >= 0) {
      for (int p = 0; p < n; ++p) {
        if (p == a.rank) continue;
        uint4* fp = (uint4*)(hp_slot(a, c, p, fwd_par, a.rank, b) + soff);
#pragma unroll
        for (int k = 0; k < RU; ++k) fp[i + k * nt] = y[k].v;
      }
    }
  }
  for (; i < nvec; i += nt) {
    A acc[EV];
    for (int s = 0; s < n; ++s) {
      const uint4* sp = (const uint4*)((s == a.rank) ? own : hp_slot(a, c, a.rank, par, s, b) + soff);
      Vec16<DT> x;
      x.v = sp[i];
#pragma unroll
      for (int e = 0; e < EV; ++e) acc[e] = (s == 0) ? hp_load<DT>(x.e[e]) : hp_op<DT, OP>(acc[e], hp_load<DT>(x.e[e]));
    }
    Vec16<DT> y;
#pragma unroll
    for (int e = 0; e < EV; ++e) y.e[e] = hp_store<DT>(hp_finish<DT, OP>(acc[e], n));
    ((uint4*)dst)[i] = y.v;
    if (fwd_par >= 0)
      for (int p = 0; p < n; ++p)
        if (p != a.rank) ((uint4*)(hp_slot(a, c, p, fwd_par, a.rank, b) + soff))[i] = y.v;
  }
  const u64 ne = len / sizeof(T);
  for (u64 j = nvec * EV + t; j < ne; j += nt) {
    A acc = (A)0;
    for (int s = 0; s < n; ++s) {
      const T* sp = (const T*)((s == a.rank) ? own : hp_slot(a, c, a.rank, par, s, b) + soff);
      A v = hp_load<DT>(sp[j]);
      acc = (s == 0) ? v : hp_op<DT, OP>(acc, v);
    }
    T y = hp_store<DT>(hp_finish<DT, OP>(acc, n));
    ((T*)dst)[j] = y;
    if (fwd_par >= 0)
      for (int p = 0; p < n; ++p)
        if (p != a.rank) ((T*)(hp_slot(a, c, p, fwd_par, a.rank, b) + soff))[j] = y;
  }
}

// Block prologue/epilogue: this block's step generation lives in the rank's own flag area.
#define HP_PROLOGUE                                            \
  __shared__ int s_fail;                                       \
  __shared__ u32 s_base;                                       \
  __shared__ Ctx c;                                            \
  hp_load_ctx(c, a);                                           \
  __syncthreads();                                             \
  u32* ctr = c.flags[a.rank] + HPCCL_CTR_COLL + blockIdx.x;    \
  if (threadIdx.x == 0) {                                      \
    s_fail = *(volatile u32*)a.err != 0u;                      \
    s_base = *ctr;                                             \
  }                                                            \
  __syncthreads();                                             \
  if (s_fail) return;                                          \
  u32 gen = s_base;

#define HP_EPILOGUE                       \
  __syncthreads();                        \
  if (threadIdx.x == 0) *ctr = gen;

// all_reduce one-shot (root < 0, stride 0), reduce_scatter (root < 0, stride = segment bytes),
// reduce (root >= 0: everyone pushes to root, root reduces). nbytes: bytes of the output.
template <int DT, int OP>
__global__ void __launch_bounds__(512) hp_reduce_push(CommArgs a) {
  HP_PROLOGUE
  const int b = blockIdx.x;
  const u64 nunits = (a.nbytes + a.chunk - 1) / a.chunk;
  for (u64 u = b; u < nunits; u += gridDim.x) {
    ++gen;
    const int par = gen & 1;
    const u64 off = u * a.chunk;
    const u64 len = (a.nbytes - off < a.chunk) ? a.nbytes - off : a.chunk;
    if (a.root >= 0) {
      if (a.rank != a.root) hp_copy(hp_slot(a, c, a.root, par, a.rank, b), a.send + off, len, a.aligned);
    } else if (a.stride == 0) {
      hp_push_all(a, c, par, a.send + off, len);
    } else {
      for (int p = 0; p < a.nranks; ++p)
        if (p != a.rank) hp_copy(hp_slot(a, c, p, par, a.rank, b), a.send + p * a.stride + off, len, a.aligned);
    }
    if (!hp_step_sync(a, c, gen, &s_fail)) return;
    if (a.root < 0 || a.rank == a.root)
      hp_reduce_n<DT, OP>(a, c, par, 0, a.send + a.rank * a.stride + off, a.recv + off, len, -1);
  }
  HP_EPILOGUE
}

// all_reduce two-shot: per unit of nranks*chunk bytes, segment s is reduced by rank s (reduce-scatter
// through slots of parity A), which forwards the result into every peer's slot of parity B (all-gather).
template <int DT, int OP>
__global__ void __launch_bounds__(512) hp_allreduce_twoshot(CommArgs a) {
  HP_PROLOGUE
  const int b = blockIdx.x;
  const int n = a.nranks;
  const u64 unit = a.chunk * n;
  const u64 nunits = (a.nbytes + unit - 1) / unit;
  for (u64 u = b; u < nunits; u += gridDim.x) {
    const u64 base = u * unit;
    const u32 genA = ++gen, genB = ++gen;
    const int parA = genA & 1, parB = genB & 1;
    for (int p = 0; p < n; ++p) {
      if (p == a.rank) continue;
      const u64 off = base + p * a.chunk;
      if (off >= a.nbytes) continue;
      const u64 len = (a.nbytes - off < a.chunk) ? a.nbytes - off : a.chunk;
      hp_copy(hp_slot(a, c, p, parA, a.rank, b), a.send + off, len, a.aligned);
    }
    if (!hp_step_sync(a, c, genA, &s_fail)) return;
    const u64 moff = base + a.rank * a.chunk;
    if (moff < a.nbytes) {
      const u64 len = (a.nbytes - moff < a.chunk) ? a.nbytes - moff : a.chunk;
      hp_reduce_n<DT, OP>(a, c, parA, 0, a.send + moff, a.recv + moff, len, parB);
    }
    if (!hp_step_sync(a, c, genB, &s_fail)) return;
    for (int s = 0; s < n; ++s) {
      if (s == a.rank) continue;
      const u64 off = base + s * a.chunk;
      if (off >= a.nbytes) continue;
      const u64 len = (a.nbytes - off < a.chunk) ? a.nbytes - off : a.chunk;
      hp_copy(a.recv + off, hp_slot(a, c, a.rank, parB, s, b), len, a.aligned);
    }
  }
  HP_EPILOGUE
}

// all_gather (root < 0, stride 0: my input to everyone), all_to_all (root < 0, stride = segment bytes:
// segment p to rank p), broadcast (root >= 0). Output segment s is at recv + s * rstride.
extern "C" __global__ void __launch_bounds__(512) hp_copy_push(CommArgs a, u64 rstride) {
  HP_PROLOGUE
  const int b = blockIdx.x;
  const u64 nunits = (a.nbytes + a.chunk - 1) / a.chunk;
  for (u64 u = b; u < nunits; u += gridDim.x) {
    ++gen;
    const int par = gen & 1;
    const u64 off = u * a.chunk;
    const u64 len = (a.nbytes - off < a.chunk) ? a.nbytes - off : a.chunk;
    if (a.root >= 0) {
      if (a.rank == a.root) hp_push_all(a, c, par, a.send + off, len);
    } else if (a.stride == 0) {
      hp_push_all(a, c, par, a.send + off, len);
    } else {
      for (int p = 0; p < a.nranks; ++p)
        if (p != a.rank) hp_copy(hp_slot(a, c, p, par, a.rank, b), a.send + p * a.stride + off, len, a.aligned);
    }
    if (!hp_step_sync<true>(a, c, gen, &s_fail)) return;
    if (a.root >= 0) {
      const char* src = (a.rank == a.root) ? a.send + off : hp_slot(a, c, a.rank, par, a.root, b);
      if (a.recv + off != src) hp_copy(a.recv + off, src, len, a.aligned);
    } else {
      for (int s = 0; s < a.nranks; ++s) {
        const char* src = (s == a.rank) ? a.send + s * a.stride + off : hp_slot(a, c, a.rank, par, s, b);
        char* dst = a.recv + s * rstride + off;
        if (dst != src) hp_copy(dst, src, len, a.aligned);
      }
    }
  }
  HP_EPILOGUE
}

// Barrier: one step of block 0 with no data.
extern "C" __global__ void hp_barrier(CommArgs a) {
  HP_PROLOGUE
  ++gen;
  if (!hp_step_sync(a, c, gen, &s_fail)) return;
  HP_EPILOGUE
}

// Sends and receives of one group, each over its own blocks: a pair (src, dst) has HPCCL_MAX_BLOCKS
// channels, each with two slots in the receiver's p2p area; the receiver acknowledges consumed steps.
extern "C" __global__ void __launch_bounds__(512) hp_p2p(P2PArgs pa) {
  const CommArgs& a = pa.c;
  __shared__ P2POp s_opv;
  __shared__ int s_found;
  __shared__ u32 s_base;
  __shared__ int s_fail;
  __shared__ Ctx c;
  const int t = threadIdx.x;
  hp_load_ctx(c, a);
  if (t == 0) {
    s_found = 0;
    const int bid = blockIdx.x;
#pragma unroll
    for (int i = 0; i < HPCCL_MAX_P2P_OPS; ++i) {
      if (i < pa.nops && bid >= pa.ops[i].first_block && bid < pa.ops[i].first_block + pa.ops[i].nblocks) {
        s_opv = pa.ops[i];
        s_found = 1;
      }
    }
  }
  __syncthreads();
  if (!s_found) return;
  const P2POp op = s_opv;
  const int lb = blockIdx.x - op.first_block;
  const int peer = op.peer;
  u32* ctr = c.flags[a.rank] + (op.is_send ? HPCCL_CTR_SEND : HPCCL_CTR_RECV) + peer * HPCCL_MAX_BLOCKS + lb;
  if (t == 0) {
    s_base = *ctr;
    s_fail = 0;
  }
  __syncthreads();
  u32 k = s_base;
  const u64 nunits = (op.nbytes + a.p2p_slot - 1) / a.p2p_slot;
  const int src = op.is_send ? a.rank : peer;
  const int dst = op.is_send ? peer : a.rank;
  const int aligned = (((u64)op.buf) & 15) == 0;
  for (u64 u = lb; u < nunits; u += op.nblocks) {
    ++k;
    const int par = k & 1;
    const u64 off = u * a.p2p_slot;
    const u64 len = (op.nbytes - off < a.p2p_slot) ? op.nbytes - off : a.p2p_slot;
    char* slot = c.stage[dst] + a.p2p_off + ((u64)((src * HPCCL_MAX_BLOCKS + lb) * 2 + par)) * a.p2p_slot;
    if (op.is_send) {
      if (t == 0 && !hp_wait_geq_inl(c.flags[a.rank] + HPCCL_FL_ACK + peer * HPCCL_MAX_BLOCKS + lb, k - 2u, a.err,
                                 a.timeout_ns))
        s_fail = 1;
      __syncthreads();
      if (s_fail) return;
      hp_copy(slot, op.buf + off, len, aligned);
      __syncthreads();
      if (t == 0) {
        __threadfence_system();
        hp_st_release(c.flags[peer] + HPCCL_FL_READY + a.rank * HPCCL_MAX_BLOCKS + lb, k);
      }
    } else {
      if (t == 0 && !hp_wait_geq_inl(c.flags[a.rank] + HPCCL_FL_READY + peer * HPCCL_MAX_BLOCKS + lb, k, a.err,
                                 a.timeout_ns))
        s_fail = 1;
      __syncthreads();
      if (s_fail) return;
      hp_copy(op.buf + off, slot, len, aligned);
      __syncthreads();
      if (t == 0) {
        __threadfence_system();
        hp_st_release(c.flags[peer] + HPCCL_FL_ACK + a.rank * HPCCL_MAX_BLOCKS + lb, k);
      }
    }
  }
  __syncthreads();
  if (t == 0) *ctr = k;
}

#include "hpccl_registered.cuh"
#include "hpccl_sync.cuh"
#include "hpccl_net.cuh"

#ifdef HPCCL_INSTANTIATE_ALL
// For nvcc in CI (scripts/check_cuda.sh): instantiate every dtype x op, as NVRTC does on demand.
#define HP_INST_OP(DT, OP)                                              \
  template __global__ void hp_reduce_push<DT, OP>(CommArgs);            \
  template __global__ void hp_allreduce_twoshot<DT, OP>(CommArgs);    \
  template __global__ void hp_reg_reduce<DT, OP>(RegArgs);             \
  template __global__ void hp_s_reduce<DT, OP>(SafeArgs);              \
  template __global__ void hp_reduce_local<DT, OP>(char*, const char*, const char*, u64);              \
  template __global__ void hp_net_step<DT, OP>(const char*, char*, u64, const char*, const char*, char*, u32*, u64); \
  template __global__ void hp_net_pipe<DT, OP>(const char*, char*, u64, const char*, const char*, char*, u32*, u64, \
                                               u64, u64);
#define HP_INST_INT(DT) HP_INST_OP(DT, 0) HP_INST_OP(DT, 1) HP_INST_OP(DT, 2) HP_INST_OP(DT, 3) \
  template __global__ void hp_net_step<DT, 5>(const char*, char*, u64, const char*, const char*, char*, u32*, u64); \
  template __global__ void hp_net_pipe<DT, 5>(const char*, char*, u64, const char*, const char*, char*, u32*, u64, \
                                              u64, u64);
#define HP_INST_FLT(DT) HP_INST_INT(DT) HP_INST_OP(DT, 4) template __global__ void hp_scale_local<DT>(char*, u64, int);
HP_INST_INT(0)
HP_INST_INT(1)
HP_INST_INT(2)
HP_INST_INT(3)
HP_INST_INT(4)
HP_INST_INT(5)
HP_INST_FLT(6)
HP_INST_FLT(7)
HP_INST_FLT(8)
HP_INST_FLT(9)
#endif
