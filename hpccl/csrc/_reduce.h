/* Reductions on host memory shared by hpccl's compiled paths (_hotcore.c on a node, _nethot.c across
   nodes): d = d op s[1] op s[2] ... in rank order, and avg's final division. Integers wrap like numpy's,
   min/max let NaN win like numpy's, so the compiled and the Python paths agree bitwise. Plain C, no Python:
   a buffer's dtype code is read by _dtype.h, on the bindings' side. */
#ifndef HPCCL_REDUCE_H
#define HPCCL_REDUCE_H
#include <stddef.h>
#include <stdint.h>

enum { OP_SUM, OP_PROD, OP_MIN, OP_MAX, OP_AVG };
enum { T_I8, T_U8, T_I32, T_U32, T_I64, T_U64, T_F32, T_F64 };

/* ---- reductions: d = s[0] op s[1] op ... in rank order; integers wrap like numpy's ---- */
#define RED_T(T, EXPR)                                                              \
  {                                                                                 \
    T *d = (T *)dst;                                                                \
    for (int r = 1; r < n; r++) {                                                   \
      const T *s = (const T *)src[r];                                               \
      for (ptrdiff_t i = 0; i < cnt; i++) { T a = d[i], b = s[i]; d[i] = (EXPR); }  \
    }                                                                               \
  }
#define RED_OPS(T, TU)                                                           \
  switch (op) {                                                                  \
    case OP_SUM: case OP_AVG: RED_T(TU, (TU)(a + b)) break;                      \
    case OP_PROD: RED_T(TU, (TU)(a * b)) break;                                  \
    case OP_MIN: RED_T(T, a < b ? a : b) break;                                  \
    case OP_MAX: RED_T(T, a > b ? a : b) break;                                  \
  }
#define RED_FLOAT(T)                                                                   \
  switch (op) {                                                                        \
    case OP_SUM: case OP_AVG: RED_T(T, a + b) break;                                   \
    case OP_PROD: RED_T(T, a * b) break;                                               \
    case OP_MIN: RED_T(T, (a < b || a != a) ? a : b) break; /* NaN wins, as numpy */   \
    case OP_MAX: RED_T(T, (a > b || a != a) ? a : b) break;                            \
  }

static inline void reduce_block(char *dst, char *const *src, int n, ptrdiff_t cnt, int dt, int op) {
  switch (dt) {
    case T_I8: RED_OPS(int8_t, uint8_t) break;
    case T_U8: RED_OPS(uint8_t, uint8_t) break;
    case T_I32: RED_OPS(int32_t, uint32_t) break;
    case T_U32: RED_OPS(uint32_t, uint32_t) break;
    case T_I64: RED_OPS(int64_t, uint64_t) break;
    case T_U64: RED_OPS(uint64_t, uint64_t) break;
    case T_F32: RED_FLOAT(float) break;
    case T_F64: RED_FLOAT(double) break;
  }
}

static inline void avg_scale(char *buf, ptrdiff_t cnt, int dt, int n) {
  if (dt == T_F32) {
    float *d = (float *)buf, k = (float)n;
    for (ptrdiff_t i = 0; i < cnt; i++) d[i] = d[i] / k;
  } else if (dt == T_F64) {
    double *d = (double *)buf, k = (double)n;
    for (ptrdiff_t i = 0; i < cnt; i++) d[i] = d[i] / k;
  }
}

#endif
