// Included by hpccl_kernels.cu after its copies and reductions (hpccl/kernels.py inlines it for NVRTC).
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
