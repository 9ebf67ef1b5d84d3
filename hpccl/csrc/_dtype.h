/* The dtype code (_reduce.h's T_*) of a Python buffer, for the bindings of the compiled paths (_hotpath.c,
   _nethot.c): kept apart from _reduce.h so that the reductions stay plain C. */
#ifndef HPCCL_DTYPE_H
#define HPCCL_DTYPE_H
#include <Python.h>
#include "_reduce.h"

/* dtype code of a buffer's format, or -1 (bfloat16, float16, bool, ... go through Python) */
static inline int dtype_of(const Py_buffer *b) {
  const char *f = b->format ? b->format : "B";
  if (*f == '@' || *f == '=' || *f == '<') f++;
  if (f[0] == 0 || f[1] != 0) return -1;
  switch (f[0]) {
    case 'b': return b->itemsize == 1 ? T_I8 : -1;
    case 'B': return b->itemsize == 1 ? T_U8 : -1;
    case 'i': case 'l': case 'q':
      return b->itemsize == 4 ? T_I32 : b->itemsize == 8 ? T_I64 : -1;
    case 'I': case 'L': case 'Q':
      return b->itemsize == 4 ? T_U32 : b->itemsize == 8 ? T_U64 : -1;
    case 'f': return b->itemsize == 4 ? T_F32 : -1;
    case 'd': return b->itemsize == 8 ? T_F64 : -1;
    default: return -1;
  }
}

#endif
