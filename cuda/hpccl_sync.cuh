// Included by hpccl_kernels.cu after its copies and reductions (hpccl/kernels.py inlines it for NVRTC).
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
