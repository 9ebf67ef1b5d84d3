/* Per-call latency in fixed log2 buckets, counted where a compiled path already times its calls (the node's
   hot path, the one across nodes, the GPU replay door) while HPCCL_METRICS is on: one bucket increment per
   call. Bucket 0 holds calls under 2^LAT_LOW ns; bucket i, those under 2^(LAT_LOW + i) ns and at least half
   that; the last, everything longer (Prometheus's +Inf). hpccl/observe/metrics.py reads the same bounds. */
#ifndef HPCCL_LATHIST_H
#define HPCCL_LATHIST_H

#define LAT_BUCKETS 30
#define LAT_LOW 8

static inline int lat_bucket(double secs) {
  double ns = secs * 1e9;
  if (!(ns >= 1.0)) return 0;  /* also NaN */
  if (ns >= 9.0e18) return LAT_BUCKETS - 1;
  int b = 64 - __builtin_clzll((unsigned long long)ns) - LAT_LOW;  /* bit length of ns, less LAT_LOW */
  return b < 0 ? 0 : (b >= LAT_BUCKETS ? LAT_BUCKETS - 1 : b);
}

#ifdef Py_PYTHON_H
/* a bucket array as a tuple of LAT_BUCKETS ints (new reference, or NULL with an error set) */
static inline PyObject *lat_tuple(const long long *hist) {
  PyObject *t = PyTuple_New(LAT_BUCKETS);
  if (!t) return NULL;
  for (int i = 0; i < LAT_BUCKETS; i++) {
    PyObject *v = PyLong_FromLongLong(hist[i]);
    if (!v) { Py_DECREF(t); return NULL; }
    PyTuple_SET_ITEM(t, i, v);
  }
  return t;
}
#endif
#endif
