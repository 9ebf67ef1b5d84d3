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

// ---- zero-copy collectives on registered buffers -----------------------------------------------------
// Pull: a rank reads its peers' registered buffers (mapped through CUDA IPC) and writes only its own
// output, so no rank ever writes into another rank's user memory. An entry step (every rank's input is
// ready, and every rank passed the same registrations at the same offsets: RegArgs.desc) comes before the
// first read and an exit step after the last, so no rank's later stream work changes memory a peer still
// reads. Steps use their own flags and counters (FL_REG, CTR_REG).
struct RCtx {
  const char* src[HPCCL_MAX_RANKS];
  char* dst[HPCCL_MAX_RANKS];
  u32* flags[HPCCL_MAX_RANKS];
};

__device__ __forceinline__ bool hp_reg_sync(const RegArgs& r, const RCtx& c, u32 gen, bool check, int* s_fail) {
  const CommArgs& a = r.c;
  const int b = blockIdx.x, t = threadIdx.x;
  __syncthreads();
  if (t < a.nranks && t != a.rank) {
    if (check) *(volatile u32*)(c.flags[t] + HPCCL_FL_DESC + a.rank * HPCCL_MAX_BLOCKS + b) = r.desc;
    __threadfence_system();
    hp_st_release(c.flags[t] + HPCCL_FL_REG + a.rank * HPCCL_MAX_BLOCKS + b, gen);
    if (!hp_wait_geq(c.flags[a.rank] + HPCCL_FL_REG + t * HPCCL_MAX_BLOCKS + b, gen, a.err, a.timeout_ns)) {
      *s_fail = 1;
    } else if (check && *(volatile u32*)(c.flags[a.rank] + HPCCL_FL_DESC + t * HPCCL_MAX_BLOCKS + b) != r.desc) {
      atomicExch_system(a.err, HPCCL_ERR_MISMATCH);
      *s_fail = 1;
    }
  }
  __syncthreads();
  return *s_fail == 0;
}

#define HP_REG_PROLOGUE                                                  \
  const CommArgs& a = r.c;                                               \
  __shared__ int s_fail;                                                 \
  __shared__ u32 s_base;                                                 \
  __shared__ RCtx c;                                                     \
  if (threadIdx.x == 0) {                                                \
    _Pragma("unroll") for (int i = 0; i < HPCCL_MAX_RANKS; ++i) {        \
      c.src[i] = r.src[i];                                               \
      c.dst[i] = r.dst[i];                                               \
      c.flags[i] = r.c.flags[i];                                         \
    }                                                                    \
    s_fail = *(volatile u32*)a.err != 0u;                                \
    s_base = c.flags[a.rank][HPCCL_CTR_REG + blockIdx.x];                \
  }                                                                      \
  __syncthreads();                                                       \
  if (s_fail) return;                                                    \
  u32* ctr = c.flags[a.rank] + HPCCL_CTR_REG + blockIdx.x;               \
  u32 gen = s_base;

// dst[0..len) = the reduction of every rank's input at byte offset soff, in rank order.
template <int DT, int OP>
__device__ __forceinline__ void hp_reduce_from(const CommArgs& a, const RCtx& c, u64 soff, char* dst, u64 len) {
  typedef Dt<DT> D;
  typedef typename D::T T;
  typedef typename D::Acc A;
  const int EV = 16 / sizeof(T);
  const int RU = (EV >= 16) ? 1 : ((EV == 2) ? 2 : HP_UNROLL);
  const int t = threadIdx.x, nt = blockDim.x, n = a.nranks;
  u64 nvec = a.aligned ? len / 16 : 0;
  u64 i = t;
  for (; i + (RU - 1) * nt < nvec; i += RU * nt) {
    A acc[RU][EV];
    for (int s = 0; s < n; ++s) {
      const uint4* sp = (const uint4*)(c.src[s] + soff);
      Vec16<DT> x[RU];
#pragma unroll
      for (int k = 0; k < RU; ++k) x[k].v = sp[i + k * nt];
#pragma unroll
      for (int k = 0; k < RU; ++k)
#pragma unroll
        for (int e = 0; e < EV; ++e)
          acc[k][e] = (s == 0) ? hp_load<DT>(x[k].e[e]) : hp_op<DT, OP>(acc[k][e], hp_load<DT>(x[k].e[e]));
    }
#pragma unroll
    for (int k = 0; k < RU; ++k) {
      Vec16<DT> y;
#pragma unroll
      for (int e = 0; e < EV; ++e) y.e[e] = hp_store<DT>(hp_finish<DT, OP>(acc[k][e], n));
      ((uint4*)dst)[i + k * nt] = y.v;
    }
  }
  for (; i < nvec; i += nt) {
    A acc[EV];
    for (int s = 0; s < n; ++s) {
      Vec16<DT> x;
      x.v = ((const uint4*)(c.src[s] + soff))[i];
#pragma unroll
      for (int e = 0; e < EV; ++e) acc[e] = (s == 0) ? hp_load<DT>(x.e[e]) : hp_op<DT, OP>(acc[e], hp_load<DT>(x.e[e]));
    }
    Vec16<DT> y;
#pragma unroll
    for (int e = 0; e < EV; ++e) y.e[e] = hp_store<DT>(hp_finish<DT, OP>(acc[e], n));
    ((uint4*)dst)[i] = y.v;
  }
  const u64 ne = len / sizeof(T);
  for (u64 j = nvec * EV + t; j < ne; j += nt) {
    A acc = (A)0;
    for (int s = 0; s < n; ++s) {
      A v = hp_load<DT>(((const T*)(c.src[s] + soff))[j]);
      acc = (s == 0) ? v : hp_op<DT, OP>(acc, v);
    }
    ((T*)dst)[j] = hp_store<DT>(hp_finish<DT, OP>(acc, n));
  }
}

// all_reduce (root < 0, stride 0): two-shot, rank s reduces stripe s of every unit of nranks * chunk
// bytes into its output, then every rank copies the other stripes from their reducers' outputs (so the
// result is bitwise equal everywhere; in place works, as no rank writes a stripe a peer reads).
// reduce_scatter (root < 0, stride = segment bytes) and reduce (root >= 0): one reducing pass.
template <int DT, int OP>
__global__ void __launch_bounds__(512) hp_reg_reduce(RegArgs r) {
  HP_REG_PROLOGUE
  const int b = blockIdx.x, n = a.nranks;
  if (!hp_reg_sync(r, c, ++gen, true, &s_fail)) return;
  if (a.root >= 0 || a.stride != 0) {
    if (a.root < 0 || a.rank == a.root) {
      const u64 base = (a.root >= 0) ? 0 : a.rank * a.stride;
      for (u64 off = b * a.chunk; off < a.nbytes; off += (u64)gridDim.x * a.chunk) {
        const u64 len = (a.nbytes - off < a.chunk) ? a.nbytes - off : a.chunk;
        hp_reduce_from<DT, OP>(a, c, base + off, a.recv + off, len);
      }
    }
  } else {
    const u64 unit = a.chunk * n;
    for (u64 ub = b * unit; ub < a.nbytes; ub += (u64)gridDim.x * unit) {
      const u64 off = ub + a.rank * a.chunk;
      if (off < a.nbytes)
        hp_reduce_from<DT, OP>(a, c, off, a.recv + off, (a.nbytes - off < a.chunk) ? a.nbytes - off : a.chunk);
    }
    if (!hp_reg_sync(r, c, ++gen, false, &s_fail)) return;
    for (u64 ub = b * unit; ub < a.nbytes; ub += (u64)gridDim.x * unit) {
      for (int k = 1; k < n; ++k) {
        const int s = (a.rank + k) % n;
        const u64 off = ub + s * a.chunk;
        if (off < a.nbytes)
          hp_copy(a.recv + off, c.dst[s] + off, (a.nbytes - off < a.chunk) ? a.nbytes - off : a.chunk, a.aligned);
      }
    }
  }
  if (!hp_reg_sync(r, c, ++gen, false, &s_fail)) return;
  HP_EPILOGUE
}

// all_gather (root < 0, stride 0), all_to_all (root < 0, stride = segment bytes: rank s's segment for this
// rank), broadcast (root >= 0): pull every segment this rank needs into its output (segment s at
// recv + s * rstride).
extern "C" __global__ void __launch_bounds__(512) hp_reg_copy(RegArgs r, u64 rstride) {
  HP_REG_PROLOGUE
  const int b = blockIdx.x, n = a.nranks;
  if (!hp_reg_sync(r, c, ++gen, true, &s_fail)) return;
  for (u64 off = b * a.chunk; off < a.nbytes; off += (u64)gridDim.x * a.chunk) {
    const u64 len = (a.nbytes - off < a.chunk) ? a.nbytes - off : a.chunk;
    if (a.root >= 0) {
      const char* src = c.src[a.root] + off;
      if (a.recv + off != src) hp_copy(a.recv + off, src, len, a.aligned);
    } else {
      for (int k = 0; k < n; ++k) {
        const int s = (a.rank + k) % n;  // staggered, so the ranks do not all read rank 0 first
        const char* src = c.src[s] + a.rank * a.stride + off;
        char* dst = a.recv + s * rstride + off;
        if (dst != src) hp_copy(dst, src, len, a.aligned);
      }
    }
  }
  if (!hp_reg_sync(r, c, ++gen, false, &s_fail)) return;
  HP_EPILOGUE
}

// One zero-copy step of block 0, no data: before and after the copy engines' peer copies of a registered
// broadcast or all_gather (the entry step also checks the call descriptors).
extern "C" __global__ void hp_reg_barrier(RegArgs r) {
  HP_REG_PROLOGUE
  if (!hp_reg_sync(r, c, ++gen, true, &s_fail)) return;
  HP_EPILOGUE
}

// ---- stream-synchronised kernels (the safe protocol on a GPU that may be shared) -----------------------
// hpccl/gpu/gpu_sync.py enqueues, per round: stream waits until every peer freed the regions this rank writes,
// hp_s_push, stream writes "ready" into the peers' words and waits for theirs, hp_s_reduce or hp_s_copyout,
// stream writes "free". None of these kernels waits for anything: whatever else holds the GPU (other jobs,
// other communicators, foreign kernels), each of them finishes once it gets a multiprocessor.
struct SCtx {
  char* stage[HPCCL_MAX_RANKS];
  const char* src[HPCCL_MAX_RANKS];
  char* fwd[HPCCL_MAX_RANKS];
  int nfwd;
  u32 bad;  // bit k: local rank k's error word is set (this rank's own included); bit 16 + k: set for a
            // cause of its own, not because a peer of its failed (ERR_PEER), so the cause is named
};

__device__ __forceinline__ char* hp_region(const CommArgs& a, const SCtx& c, int dst, int par, int src) {
  return c.stage[dst] + (u64)(par * a.nranks + src) * a.slot;
}

// Bytes of piece p in this round: pieces end at s.limit (two-shot's last unit is ragged).
__device__ __forceinline__ u64 hp_piece(const SafeArgs& s, int p) {
  const u64 start = s.off + (u64)p * s.c.stride;
  if (s.limit <= start) return 0;
  return (s.limit - start < s.c.nbytes) ? s.limit - start : s.c.nbytes;
}

// This block's share [lo, hi) of len bytes (16-byte multiples, so vector alignment is kept).
__device__ __forceinline__ void hp_share(u64 len, u64* lo, u64* hi) {
  u64 per = (len + gridDim.x - 1) / gridDim.x;
  per = (per + 15) & ~(u64)15;
  *lo = blockIdx.x * per;
  if (*lo > len) *lo = len;
  *hi = (*lo + per < len) ? *lo + per : len;
}

// Prologue of every stream-synchronised kernel: peers' areas into shared memory, a sign of life for the
// watchdog, and nothing at all once this rank's or a local peer's error word is set (an abort, a timeout,
// a failed network step before it: no half-written output, and a peer's "ready" that carries no data is
// never read as data; the first such peer, preferring one that failed for a cause of its own, goes into
// this rank's word, so its host raises).
#define HP_S_PROLOGUE                                                                 \
  const CommArgs& a = s.c;                                                            \
  __shared__ SCtx c;                                                                  \
  if (threadIdx.x == 0) {                                                             \
    _Pragma("unroll") for (int i = 0; i < HPCCL_MAX_RANKS; ++i) c.stage[i] = a.stage[i]; \
    c.nfwd = 0;                                                                       \
    c.bad = 0u;                                                                       \
    if (blockIdx.x == 0) *(volatile u32*)s.prog = *(volatile u32*)s.prog + 1u;        \
  }                                                                                   \
  __syncthreads();                                                                    \
  if (threadIdx.x < a.nranks) {                                                       \
    const u32 e = *(volatile u32*)s.perr[threadIdx.x];                                \
    if (e != 0u) atomicOr(&c.bad, (e < HPCCL_ERR_PEER ? 0x10001u : 1u) << threadIdx.x); \
  }                                                                                   \
  __syncthreads();                                                                    \
  if (c.bad) {                                                                        \
    const u32 why = (c.bad >> 16) ? (c.bad >> 16) : (c.bad & 0xFFFFu);                \
    if (threadIdx.x == 0 && !(c.bad & (1u << a.rank)))                                \
      atomicCAS_system(a.err, 0u, HPCCL_ERR_PEER + (u32)(__ffs(why) - 1));            \
    return;                                                                           \
  }                                                                                   \
  asm volatile("fence.acq_rel.sys;" ::: "memory");

// A bounded look at the words the stream is about to wait on (thread s watches peer s's word, words two
// apart): while they arrive within spin_ns, the stream's own wait after this passes at once, which is
// faster than a stream wait that has to poll; past spin_ns it leaves, so it can never hold a
// multiprocessor that some peer's progress needs.
extern "C" __global__ void hp_s_peek(const u32* words, u32 mask, u64 spin_ns) {
  const int t = threadIdx.x;
  if (t >= HPCCL_MAX_RANKS || !((mask >> t) & 1u)) return;
  const volatile u32* w = words + 2 * t;
  if (*w == 1u) return;
  const u64 t0 = hp_globaltimer();
  while (*w != 1u && hp_globaltimer() - t0 < spin_ns) {
  }
}

// mode 0: this rank's input piece (stride 0) to every peer (one-shot all_reduce, all_gather); with root >= 0
// only the root pushes (broadcast). mode 1: piece p to peer p (reduce_scatter, all_to_all, two-shot's
// scatter). mode 2: to the root only (reduce).
extern "C" __global__ void __launch_bounds__(512) hp_s_push(SafeArgs s) {
  HP_S_PROLOGUE
  if ((s.mode == 0 && a.root >= 0 && a.rank != a.root) || (s.mode == 2 && a.rank == a.root)) return;
  for (int p = 0; p < a.nranks; ++p) {
    if (p == a.rank || (s.mode == 2 && p != a.root)) continue;
    const int piece = (s.mode == 1) ? p : 0;
    const u64 len = hp_piece(s, piece);
    u64 lo, hi;
    hp_share(len, &lo, &hi);
    if (hi > lo)
      hp_copy(hp_region(a, c, p, s.par, a.rank) + lo, a.send + s.off + (u64)piece * a.stride + lo, hi - lo, a.aligned);
  }
}

// dst[0..len) = reduction of srcs[0..n) in rank order; also stored to c.fwd[0..nfwd) (two-shot's gather).
template <int DT, int OP>
__device__ __forceinline__ void hp_reduce_ptrs(const SCtx& c, int n, char* dst, u64 len, int aligned) {
  typedef Dt<DT> D;
  typedef typename D::T T;
  typedef typename D::Acc A;
  const int EV = 16 / sizeof(T);
  const int RU = (EV >= 16) ? 1 : ((EV == 2) ? 2 : HP_UNROLL);
  const int t = threadIdx.x, nt = blockDim.x;
  u64 nvec = aligned ? len / 16 : 0;
  u64 i = t;
  for (; i + (RU - 1) * nt < nvec; i += RU * nt) {
    A acc[RU][EV];
    for (int k = 0; k < n; ++k) {
      const uint4* sp = (const uint4*)c.src[k];
      Vec16<DT> x[RU];
#pragma unroll
      for (int u = 0; u < RU; ++u) x[u].v = sp[i + u * nt];
#pragma unroll
      for (int u = 0; u < RU; ++u)
#pragma unroll
        for (int e = 0; e < EV; ++e)
          acc[u][e] = (k == 0) ? hp_load<DT>(x[u].e[e]) : hp_op<DT, OP>(acc[u][e], hp_load<DT>(x[u].e[e]));
    }
#pragma unroll
    for (int u = 0; u < RU; ++u) {
      Vec16<DT> y;
#pragma unroll
      for (int e = 0; e < EV; ++e) y.e[e] = hp_store<DT>(hp_finish<DT, OP>(acc[u][e], n));
      ((uint4*)dst)[i + u * nt] = y.v;
      for (int f = 0; f < c.nfwd; ++f) ((uint4*)c.fwd[f])[i + u * nt] = y.v;
    }
  }
  for (; i < nvec; i += nt) {
    A acc[EV];
    for (int k = 0; k < n; ++k) {
      Vec16<DT> x;
      x.v = ((const uint4*)c.src[k])[i];
#pragma unroll
      for (int e = 0; e < EV; ++e) acc[e] = (k == 0) ? hp_load<DT>(x.e[e]) : hp_op<DT, OP>(acc[e], hp_load<DT>(x.e[e]));
    }
    Vec16<DT> y;
#pragma unroll
    for (int e = 0; e < EV; ++e) y.e[e] = hp_store<DT>(hp_finish<DT, OP>(acc[e], n));
    ((uint4*)dst)[i] = y.v;
    for (int f = 0; f < c.nfwd; ++f) ((uint4*)c.fwd[f])[i] = y.v;
  }
  const u64 ne = len / sizeof(T);
  for (u64 j = nvec * EV + t; j < ne; j += nt) {
    A acc = (A)0;
    for (int k = 0; k < n; ++k) {
      A v = hp_load<DT>(((const T*)c.src[k])[j]);
      acc = (k == 0) ? v : hp_op<DT, OP>(acc, v);
    }
    const T y = hp_store<DT>(hp_finish<DT, OP>(acc, n));
    ((T*)dst)[j] = y;
    for (int f = 0; f < c.nfwd; ++f) ((T*)c.fwd[f])[j] = y;
  }
}

// Reduces this rank's piece: its own input at send + off + rank*stride and every peer's region [par][s];
// the result goes to recv + off + rank*rstride, and to every peer's region [par2][rank] when par2 >= 0
// (two-shot). With root >= 0 only the root reduces (reduce).
template <int DT, int OP>
__global__ void __launch_bounds__(512) hp_s_reduce(SafeArgs s) {
  HP_S_PROLOGUE
  if (a.root >= 0 && a.rank != a.root) return;
  const u64 len = hp_piece(s, a.rank);
  u64 lo, hi;
  hp_share(len, &lo, &hi);
  if (hi <= lo) return;
  if (threadIdx.x == 0) {
    for (int k = 0; k < a.nranks; ++k)
      c.src[k] = (k == a.rank) ? a.send + s.off + (u64)a.rank * a.stride + lo : hp_region(a, c, a.rank, s.par, k) + lo;
    if (s.par2 >= 0)
      for (int p = 0; p < a.nranks; ++p)
        if (p != a.rank) c.fwd[c.nfwd++] = hp_region(a, c, p, s.par2, a.rank) + lo;
  }
  __syncthreads();
  hp_reduce_ptrs<DT, OP>(c, a.nranks, a.recv + s.off + (u64)a.rank * s.rstride + lo, hi - lo, a.aligned);
}

// Copies what arrived into the output: with root >= 0 the root's piece (broadcast; the root copies its own
// input unless in place); else piece s to recv + off + s*rstride for every s (all_gather, all_to_all),
// this rank's own from its input unless mode 1 (two-shot: its own piece is already reduced in place).
extern "C" __global__ void __launch_bounds__(512) hp_s_copyout(SafeArgs s) {
  HP_S_PROLOGUE
  for (int k = 0; k < a.nranks; ++k) {
    if (a.root >= 0 && k != a.root) continue;
    if (k == a.rank && s.mode == 1) continue;
    const int piece = (a.root >= 0) ? 0 : k;
    const u64 len = hp_piece(s, piece);
    u64 lo, hi;
    hp_share(len, &lo, &hi);
    if (hi <= lo) continue;
    const char* src = (k == a.rank) ? a.send + s.off + (u64)k * a.stride + lo : hp_region(a, c, a.rank, s.par, k) + lo;
    char* dst = a.recv + s.off + (a.root >= 0 ? 0 : (u64)k * s.rstride) + lo;
    if (dst != src) hp_copy(dst, src, hi - lo, a.aligned);
  }
}

// ---- local steps of host-driven (network) algorithms on device memory ---------------------------------
// hpccl's ring/tree schedules across nodes run on device buffers (staged on the engine, or over MPI on the
// proxy thread); what arrives is combined here, on the GPU: dst = a op b elementwise (avg combines as sum;
// hp_scale_local divides once at the end).
template <int DT, int OP>
__global__ void __launch_bounds__(512) hp_reduce_local(char* dst, const char* a, const char* b, u64 n) {
  typedef typename Dt<DT>::T T;
  const T* x = (const T*)a;
  const T* y = (const T*)b;
  T* d = (T*)dst;
  for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x)
    d[i] = hp_store<DT>(hp_op<DT, OP>(hp_load<DT>(x[i]), hp_load<DT>(y[i])));
}

template <int DT>
__global__ void __launch_bounds__(512) hp_scale_local(char* buf, u64 n, int nranks) {
  typedef typename Dt<DT>::T T;
  T* d = (T*)buf;
  for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x)
    d[i] = hp_store<DT>(hp_finish<DT, 4>(hp_load<DT>(d[i]), nranks));
}

// float8 reductions run in float32 (hpccl/core/fp8.py): the input widened, the float32 result rounded once
// (e5m2: 0 float8_e4m3fn, 1 float8_e5m2).
extern "C" __global__ void __launch_bounds__(512) hp_fp8_widen(float* dst, const unsigned char* src, u64 n,
                                                              int e5m2) {
  for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x)
    dst[i] = __uint_as_float(hp_fp8_to_f32(src[i], e5m2));
}

extern "C" __global__ void __launch_bounds__(512) hp_fp8_narrow(unsigned char* dst, const float* src, u64 n,
                                                               int e5m2) {
  for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x)
    dst[i] = (unsigned char)hp_f32_to_fp8(__float_as_uint(src[i]), e5m2);
}

// What a network step received (n bytes at got) combined into out by one block: out = src OP got, or
// (OP == 5) a copy. The block has seen the step's done word (after a system fence).
template <int DT, int OP>
__device__ __forceinline__ void hp_net_combine(char* out, const char* src, const char* got, u64 n) {
  typedef typename Dt<DT>::T T;
  if (OP == 5) {
    hp_copy(out, got, n, ((u64)out | (u64)got) % 16 == 0);
    return;
  }
  const T* g = (const T*)got;
  const T* x = (const T*)src;
  T* d = (T*)out;
  const u64 m = n / sizeof(T);
  for (u64 e = threadIdx.x; e < m; e += blockDim.x)
    d[e] = hp_store<DT>(hp_op<DT, OP>(hp_load<DT>(x[e]), hp_load<DT>(g[e])));
}

// A network kernel's wait for a word the engine (or a sibling block) writes: true once *w reaches val
// (wrap-safe); false, after setting *stuck, once the wait outlived the limit in lim[0..1] (nanoseconds, low
// word first; 0: none; read when the wait first looks long). The engine writes every done word within
// HPCCL_TIMEOUT, ok or not, so this fires only when the engine itself stopped: the stream must not be held
// forever, and the host raises the error (StagedNet.error).
__device__ __forceinline__ bool hp_net_wait(const u32* w, u32 val, const u32* lim, u32* stuck) {
  u64 t0 = 0, limit = 0;
  for (u32 n = 1; (int)(hp_ld_acquire(w) - val) < 0; n++) {
    if (n & 4095u) continue;
    const u64 now = hp_globaltimer();
    if (!t0) {
      t0 = now;
      limit = (u64)*(volatile const u32*)lim | ((u64)*(volatile const u32*)(lim + 1) << 32);
    } else if (limit && now - t0 > limit) {
      *(volatile u32*)stuck = 1u;
      __threadfence_system();
      return false;
    }
  }
  return true;
}

// ---- one small GPU network step in one kernel (hpccl/gpu/netstep.py, HPCCL_NET_FUSED_SIZE) --------------
// The send copied into pinned staging memory, then the ready token written (system scope, after a fence:
// the engine polling the word reads whole data), then the engine's done word awaited, then what arrived
// combined into the output: out = src OP got, or (OP == 5) a copy. Where a step otherwise enqueues a copy,
// a token write, a wait and a kernel. words: [0] the ready word, [1] lane 0's done word, [10..11] the wait's
// limit, [12] the stuck word (mapped host memory); sizes: send bytes | received elements << 32, bit 63 set for
// a step captured in a graph (words: the template's arm, done, limit (2) and stuck words; each replay clears
// the done word before arming); tokval: token | done value << 32. The engine writes the done word whether
// the step ended well or not; hp_net_wait's limit covers an engine that stopped.
template <int DT, int OP>
__global__ void __launch_bounds__(256) hp_net_step(const char* send, char* stage, u64 sizes, const char* got,
                                                   const char* src, char* out, u32* words, u64 tokval) {
  typedef typename Dt<DT>::T T;
  const u64 nsend = sizes & 0xffffffffull, nrecv = (sizes >> 32) & 0x7fffffffull;
  if (nsend) hp_copy(stage, send, nsend, ((u64)stage | (u64)send) % 16 == 0);
  __syncthreads();
  __shared__ int s_gone;
  if (threadIdx.x == 0) {
    const bool captured = sizes >> 63;
    if (captured) *(volatile u32*)(words + 1) = 0u;
    __threadfence_system();
    hp_st_release(words, (u32)tokval);
    s_gone = !hp_net_wait(words + 1, (u32)(tokval >> 32), words + (captured ? 2 : 10), words + (captured ? 4 : 12));
    __threadfence_system();
  }
  __syncthreads();
  if (s_gone) return;
  hp_net_combine<DT, OP>(out, src, got, nrecv * sizeof(T));
}

// One GPU network step of one message each way in pieces, as one kernel (StagedNet.step_piped): piece i of
// k (geom: send pieces of ps bytes, receive pieces of pr, the last shorter; lanes: L | k << 32) goes on lane
// i mod L with ready token t0 + i and done value v0 + i / L (tokval: the last token t0 + k - 1 | v0 << 32,
// as the replay patches it). Block b walks pieces b, b + G,
// ...: stages send piece i, writes token t0 + i once piece i - 1's token is written (the engine posts a
// piece's batch when the ready word reaches its token, so tokens go up in piece order), waits for lane
// i mod L's done word, then combines receive piece i. G pieces are in flight; copies, wire and combining
// overlap by piece. The engine writes every done word even when a step fails; hp_net_wait's limit (words
// [10..11], stuck word [12]) covers an engine that stopped.
template <int DT, int OP>
__global__ void __launch_bounds__(512) hp_net_pipe(const char* send, char* stage, u64 sizes, const char* got,
                                                   const char* src, char* out, u32* words, u64 geom, u64 lanes,
                                                   u64 tokval) {
  const u64 nsend = sizes & 0xffffffffull, nrecv = sizes >> 32;  // bytes
  const u64 ps = geom & 0xffffffffull, pr = geom >> 32, nl = lanes & 0xffffffffull, k = lanes >> 32;
  const u32 t0 = (u32)tokval - (u32)(k - 1), v0 = (u32)(tokval >> 32);
  __shared__ int s_gone;
  for (u64 i = blockIdx.x; i < k; i += gridDim.x) {
    if (i * ps < nsend) {
      const u64 o = i * ps, n = nsend - o < ps ? nsend - o : ps;
      hp_copy(stage + o, send + o, n, ((u64)(stage + o) | (u64)(send + o)) % 16 == 0);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      __threadfence_system();
      const u32 tok = t0 + (u32)i;
      bool ok = !i || hp_net_wait(words, tok - 1u, words + 10, words + 12);
      if (ok) {
        hp_st_release(words, tok);
        ok = hp_net_wait(words + 1 + i % nl, v0 + (u32)(i / nl), words + 10, words + 12);
      }
      s_gone = !ok;
      __threadfence_system();
    }
    __syncthreads();
    if (s_gone) return;
    if (i * pr >= nrecv) continue;
    const u64 o = i * pr;
    hp_net_combine<DT, OP>(out + o, src + o, got + o, nrecv - o < pr ? nrecv - o : pr);
  }
}

// Holds a stream until the host writes gen (or more) into a mapped host word: the fallback when the
// driver refuses cuStreamWaitValue32 on that memory. Times out like every other wait (error word set).
extern "C" __global__ void hp_wait_host(const u32* word, u32 gen, u32* err, u64 timeout_ns) {
  if (threadIdx.x == 0) hp_wait_geq(word, gen, err, timeout_ns);
}

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
