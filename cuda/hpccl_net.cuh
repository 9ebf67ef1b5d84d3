// Included by hpccl_kernels.cu after its copies and reductions (hpccl/kernels.py inlines it for NVRTC).
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
