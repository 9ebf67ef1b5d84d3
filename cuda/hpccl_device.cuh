// hpccl device-side building blocks: argument structs shared with hpccl/gpu/cuda_comm.py (keep the two in
// sync), memory layout of a rank's peer-mapped buffer, system-scope flag operations, and the dtype x op
// reduction traits. Compiled by NVRTC at run time (hpccl/kernels.py) and by nvcc in CI
// (scripts/check_cuda.sh); it includes no system header so that both work without a CUDA include path.
#pragma once

#define HPCCL_MAX_RANKS 8
#define HPCCL_MAX_BLOCKS 64
#define HPCCL_MAX_P2P_OPS 16

typedef unsigned long long u64;
typedef unsigned int u32;

// ---- layout of the u32 flag area at the end of every rank's buffer (word offsets) --------------------
// Written by peers (system-scope release stores), read locally (acquire loads):
#define HPCCL_FL_COLL 0                                              // [src][block] collective steps
#define HPCCL_FL_READY (HPCCL_MAX_RANKS * HPCCL_MAX_BLOCKS)           // [src][block] p2p data ready
#define HPCCL_FL_ACK (2 * HPCCL_MAX_RANKS * HPCCL_MAX_BLOCKS)         // [dst][block] p2p slot consumed
// Private to the owning rank (step counters that persist between launches, so graphs replay correctly):
#define HPCCL_CTR_COLL (3 * HPCCL_MAX_RANKS * HPCCL_MAX_BLOCKS)       // [block]
#define HPCCL_CTR_SEND (HPCCL_CTR_COLL + HPCCL_MAX_BLOCKS)            // [peer][block]
#define HPCCL_CTR_RECV (HPCCL_CTR_SEND + HPCCL_MAX_RANKS * HPCCL_MAX_BLOCKS)  // [peer][block]
// Zero-copy kernels on registered buffers (own flag space, so a rank in a staged kernel and one in a
// zero-copy kernel never take each other's flags for data: a mismatch times out, naming the call):
#define HPCCL_FL_REG (HPCCL_CTR_RECV + HPCCL_MAX_RANKS * HPCCL_MAX_BLOCKS)     // [src][block] steps
#define HPCCL_FL_DESC (HPCCL_FL_REG + HPCCL_MAX_RANKS * HPCCL_MAX_BLOCKS)      // [src][block] call descriptor
#define HPCCL_CTR_REG (HPCCL_FL_DESC + HPCCL_MAX_RANKS * HPCCL_MAX_BLOCKS)     // [block], private
#define HPCCL_FLAG_WORDS (HPCCL_CTR_REG + HPCCL_MAX_BLOCKS)

#define HPCCL_ERR_TIMEOUT 1u  // this rank's wait timed out
#define HPCCL_ERR_ABORT 2u    // a rank of the node aborted (set by its host, hpccl/transport/shm.py)
#define HPCCL_ERR_MISMATCH 3u // ranks passed registered buffers at different registrations/offsets
#define HPCCL_ERR_DEAD 4u     // a local peer's process is gone (set by the host's watchdog, hpccl/gpu/gpu_sync.py)
#define HPCCL_ERR_NET 5u      // this rank's network step before this kernel failed (set by hpccl/csrc/_netcore.c)
// 16 + k: local rank k's error word was set when this rank's stream-synchronised kernel began, so what k
// signalled as ready is not data (k's kernels write nothing once its word is set; its stream still signals)
#define HPCCL_ERR_PEER 16u

struct CommArgs {
  const char* send;      // this rank's input
  char* recv;            // this rank's output
  u64 nbytes;            // bytes of one segment (see each kernel)
  u64 stride;            // bytes between segments of send/recv (0: every segment is the same data)
  u64 chunk;             // bytes one block moves per step (multiple of 16, <= slot)
  u64 slot;              // bytes between collective slots
  u64 p2p_off;           // offset of the point-to-point slots in every rank's buffer
  u64 p2p_slot;          // bytes per point-to-point slot
  u64 timeout_ns;        // a wait longer than this sets *err and ends the kernel
  char* stage[HPCCL_MAX_RANKS];  // every rank's buffer, mapped into this process
  u32* flags[HPCCL_MAX_RANKS];   // every rank's flag area, mapped into this process
  u32* err;              // host-mapped error word (0: fine), in this rank's shared-memory header
  int rank;
  int nranks;
  int root;              // broadcast/reduce root, -1 otherwise
  int aligned;           // 1 when send, recv and nbytes/stride allow 16-byte vector access
};

struct P2POp {
  char* buf;
  u64 nbytes;
  int peer;
  int is_send;
  int nblocks;
  int first_block;
};

struct P2PArgs {
  CommArgs c;
  int nops;
  int pad_;
  P2POp ops[HPCCL_MAX_P2P_OPS];
};

// Zero-copy collectives: every rank's registered input and output, mapped into this process (CUDA IPC).
struct RegArgs {
  CommArgs c;
  const char* src[HPCCL_MAX_RANKS];  // rank r's input (its own: c.send)
  char* dst[HPCCL_MAX_RANKS];        // rank r's output (its own: c.recv)
  u32 desc;                          // registration ids and offsets of this call; equal on every rank
  int pad_;
};

// Stream-synchronised kernels (the safe protocol, hpccl/gpu/gpu_sync.py): every wait on a peer is a stream
// memory operation between launches, so these kernels never spin and can never hold a multiprocessor that
// a peer's work needs. One launch moves one round: `c.nbytes` bytes per piece at byte `off` of the call.
// Regions: rank dst's slots [par][src] are one block of `c.slot` bytes (the region size) each.
struct SafeArgs {
  CommArgs c;     // send, recv, nbytes (bytes per piece), stride (input piece stride), slot (region bytes),
                  // stage, err, rank, nranks, root, aligned
  u64 off;        // byte offset of this round in each piece
  u64 rstride;    // output piece stride
  u64 limit;      // piece p holds bytes [off + p*stride, limit) at most (~0: every piece is whole)
  u32* prog;      // host-mapped progress word of this rank, +1 per launch (the watchdog's sign of life)
  int par;        // parity of the regions read (or written by the push)
  int par2;       // parity of the regions a reduction forwards its result into (-1: none)
  int mode;       // per kernel, see there
  int pad_;
  u32* perr[HPCCL_MAX_RANKS];  // every local rank's error word (host-mapped; perr[rank] == c.err)
};

// ---- system-scope synchronisation -------------------------------------------------------------------
__device__ __forceinline__ void hp_st_release(u32* p, u32 v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ u32 hp_ld_acquire(const u32* p) {
  u32 v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ u64 hp_globaltimer() {
  u64 t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Peer pointers, copied from the kernel parameters into shared memory once per block (indexing the
// parameter arrays with a run-time rank would make the compiler copy the whole struct to local memory).
struct Ctx {
  char* stage[HPCCL_MAX_RANKS];
  u32* flags[HPCCL_MAX_RANKS];
};

__device__ __forceinline__ void hp_load_ctx(Ctx& c, const CommArgs& a) {
  if (threadIdx.x == 0) {
#pragma unroll
    for (int i = 0; i < HPCCL_MAX_RANKS; ++i) {
      c.stage[i] = a.stage[i];
      c.flags[i] = a.flags[i];
    }
  }
}

// Wait until *p has reached v (wrapping compare); false on timeout or when another wait already failed.
__device__ __forceinline__ bool hp_wait_geq_inl(const u32* p, u32 v, u32* err, u64 timeout_ns) {
  if ((int)(hp_ld_acquire(p) - v) >= 0) return true;
  u64 t0 = hp_globaltimer();
  u32 it = 0;
  while ((int)(hp_ld_acquire(p) - v) < 0) {
    if ((++it & 1023u) == 0) {
      if (*(volatile u32*)err != 0u) return false;
      if (hp_globaltimer() - t0 > timeout_ns) {
        atomicExch_system(err, HPCCL_ERR_TIMEOUT);
        return false;
      }
    }
  }
  return true;
}

// Out of line where register pressure is high (the collective kernels' data loops); the p2p kernel
// inlines it instead (a call there costs spills).
__device__ __noinline__ bool hp_wait_geq(const u32* p, u32 v, u32* err, u64 timeout_ns) {
  return hp_wait_geq_inl(p, v, err, timeout_ns);
}

// One synchronisation step of block b among all ranks: after this block's writes into peers' slots,
// tell every peer (flag [rank][b] in its area := gen), then wait for every peer's flag [p][b] in ours.
// Returns false (for every thread of the block) when a wait failed.
template <bool INLINE_WAIT = false>
__device__ __forceinline__ bool hp_step_sync(const CommArgs& a, const Ctx& c, u32 gen, int* s_fail) {
  const int b = blockIdx.x;
  const int t = threadIdx.x;
  __syncthreads();  // every thread's stores of this step are issued
  if (t < a.nranks && t != a.rank) {
    __threadfence_system();
    hp_st_release(c.flags[t] + HPCCL_FL_COLL + a.rank * HPCCL_MAX_BLOCKS + b, gen);
    const u32* f = c.flags[a.rank] + HPCCL_FL_COLL + t * HPCCL_MAX_BLOCKS + b;
    if (!(INLINE_WAIT ? hp_wait_geq_inl(f, gen, a.err, a.timeout_ns) : hp_wait_geq(f, gen, a.err, a.timeout_ns)))
      *s_fail = 1;
  }
  __syncthreads();
  return *s_fail == 0;
}

__device__ __forceinline__ char* hp_slot(const CommArgs& a, const Ctx& c, int dst, int par, int src, int b) {
  return c.stage[dst] + ((u64)((par * a.nranks + src) * HPCCL_MAX_BLOCKS + b)) * a.slot;
}

// ---- datatypes and reductions --------------------------------------------------------------------------
// dtype ids (hpccl/kernels.py DTYPE_IDS): 0 int8, 1 uint8, 2 int32, 3 uint32, 4 int64, 5 uint64,
// 6 float16, 7 bfloat16, 8 float32, 9 float64.  op ids: 0 sum, 1 prod, 2 min, 3 max, 4 avg.
__device__ __forceinline__ float hp_h2f(unsigned short h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
}
__device__ __forceinline__ unsigned short hp_f2h(float f) {
  unsigned short h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
}
__device__ __forceinline__ float hp_bf2f(unsigned short h) { return __uint_as_float(((u32)h) << 16); }
__device__ __forceinline__ unsigned short hp_f2bf(float f) {
  unsigned short h;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
}

#define HP_HD __host__ __device__ __forceinline__
// ---- float8 <-> float32 (begin) ----
// Plain C on purpose: tests/test_fp8_units.py compiles this block on the host (HP_HD empty) and checks it
// against ml_dtypes. e5m2 == 0: float8_e4m3fn (bias 7, 3 mantissa bits, no infinity, NaN S.1111.111);
// e5m2 == 1: float8_e5m2 (bias 15, 2 mantissa bits, IEEE-like). Widening is exact (NaN becomes the quiet
// NaN of its sign); narrowing rounds to nearest even, and a result past the largest finite value is NaN
// (e4m3fn) or infinity (e5m2), NaN is S.1111.111 or S.11111.10: ml_dtypes' conversions, bit for bit.
HP_HD unsigned int hp_fp8_to_f32(unsigned int b, int e5m2) {
  unsigned int s = (b & 0x80u) << 24, m = e5m2 ? 2u : 3u, bias = e5m2 ? 15u : 7u;
  unsigned int e = (b & 0x7fu) >> m, f = b & ((1u << m) - 1u);
  if (e5m2 ? (e == 31u && f != 0u) : (b & 0x7fu) == 0x7fu) return s | 0x7fc00000u;
  if (e5m2 && e == 31u) return s | 0x7f800000u;
  if (e == 0u) {
    if (f == 0u) return s;
    e = 1u;
    while (!(f & (1u << m))) {  // a subnormal: normalised (every one is a normal float32)
      f <<= 1;
      e--;
    }
    f &= (1u << m) - 1u;
  }
  return s | ((e + 127u - bias) << 23) | (f << (23u - m));
}

HP_HD unsigned int hp_f32_to_fp8(unsigned int x, int e5m2) {
  unsigned int s = (x >> 24) & 0x80u, a = x & 0x7fffffffu, m = e5m2 ? 2u : 3u;
  int bias = e5m2 ? 15 : 7;
  unsigned int top = e5m2 ? 0x7cu : 0x7fu;  // the first code past the largest finite value
  unsigned int r, sh, f;
  if (a > 0x7f800000u) return s | (e5m2 ? 0x7eu : 0x7fu);
  int e = (int)(a >> 23) - 127;  // float32 subnormals (-127) lie far below float8's smallest step
  if (e >= 1 - bias) {  // a normal float8, or past the largest: round the float32 bits
    sh = 23u - m;
    r = ((a + (1u << (sh - 1u)) - 1u + ((a >> sh) & 1u)) >> sh) - ((unsigned int)(127 - bias) << m);
  } else {  // a subnormal float8: the significand in units of the smallest step
    sh = 23u - m + (unsigned int)(1 - bias - e);
    if (sh > 24u) return s;  // below half a step
    f = (a & 0x7fffffu) | 0x800000u;
    r = (f + (1u << (sh - 1u)) - 1u + ((f >> sh) & 1u)) >> sh;
  }
  return s | (r >= top ? top : r);
}
// ---- float8 <-> float32 (end) ----

template <typename S, typename A, typename U, int KIND>
struct DtBase {
  typedef S T;    // storage
  typedef A Acc;  // accumulation
  typedef U UT;   // unsigned twin for wrapping integer arithmetic
  static const int kind = KIND;  // 0 integer, 1 float/double, 2 half, 3 bfloat16
};

template <int DT> struct Dt;
template <> struct Dt<0> : DtBase<signed char, signed char, unsigned char, 0> {};
template <> struct Dt<1> : DtBase<unsigned char, unsigned char, unsigned char, 0> {};
template <> struct Dt<2> : DtBase<int, int, u32, 0> {};
template <> struct Dt<3> : DtBase<u32, u32, u32, 0> {};
template <> struct Dt<4> : DtBase<long long, long long, u64, 0> {};
template <> struct Dt<5> : DtBase<u64, u64, u64, 0> {};
template <> struct Dt<6> : DtBase<unsigned short, float, unsigned short, 2> {};
template <> struct Dt<7> : DtBase<unsigned short, float, unsigned short, 3> {};
template <> struct Dt<8> : DtBase<float, float, u32, 1> {};
template <> struct Dt<9> : DtBase<double, double, u64, 1> {};

template <int DT>
__device__ __forceinline__ typename Dt<DT>::Acc hp_load(typename Dt<DT>::T x) {
  if (Dt<DT>::kind == 2) return (typename Dt<DT>::Acc)hp_h2f((unsigned short)x);
  if (Dt<DT>::kind == 3) return (typename Dt<DT>::Acc)hp_bf2f((unsigned short)x);
  return (typename Dt<DT>::Acc)x;
}

template <int DT>
__device__ __forceinline__ typename Dt<DT>::T hp_store(typename Dt<DT>::Acc x) {
  if (Dt<DT>::kind == 2) return (typename Dt<DT>::T)hp_f2h((float)x);
  if (Dt<DT>::kind == 3) return (typename Dt<DT>::T)hp_f2bf((float)x);
  return (typename Dt<DT>::T)x;
}

template <int DT, int OP>
__device__ __forceinline__ typename Dt<DT>::Acc hp_op(typename Dt<DT>::Acc a, typename Dt<DT>::Acc b) {
  typedef typename Dt<DT>::Acc A;
  typedef typename Dt<DT>::UT U;
  if (OP == 0 || OP == 4) {
    if (Dt<DT>::kind == 0) return (A)(U)((U)a + (U)b);  // wraps like numpy
    return a + b;
  }
  if (OP == 1) {
    if (Dt<DT>::kind == 0) return (A)(U)((U)a * (U)b);
    return a * b;
  }
  if (OP == 2) return (a != a || a < b) ? a : b;  // NaN propagates like numpy.minimum
  return (a != a || a > b) ? a : b;
}

template <int DT, int OP>
__device__ __forceinline__ typename Dt<DT>::Acc hp_finish(typename Dt<DT>::Acc a, int nranks) {
  if (OP == 4) return a / (typename Dt<DT>::Acc)nranks;
  return a;
}

// 16 bytes as elements
template <int DT>
union Vec16 {
  uint4 v;
  typename Dt<DT>::T e[16 / sizeof(typename Dt<DT>::T)];
};

// hpccl/kernels.py mirrors these structs with ctypes; sizes must agree.
static_assert(sizeof(CommArgs) == 224, "CommArgs layout changed: update hpccl/kernels.py");
static_assert(sizeof(P2POp) == 32, "P2POp layout changed: update hpccl/kernels.py");
static_assert(sizeof(P2PArgs) == 744, "P2PArgs layout changed: update hpccl/kernels.py");
static_assert(sizeof(RegArgs) == 360, "RegArgs layout changed: update hpccl/kernels.py");
static_assert(sizeof(SafeArgs) == 336, "SafeArgs layout changed: update hpccl/kernels.py");
