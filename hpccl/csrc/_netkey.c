/* The key of a replayed GPU call across nodes, read as netreplay's CallKeys reads it (each buffer's address,
   count, dtype and contiguity, straight off a CuPy array or a CUDA torch tensor; the stream; the
   collective, op and root), and NetDoor's open-addressed table of keys (_netdoor.h). */
#include "_netdoor.h"

#include <string.h>

static PyObject *s_data, *s_ptr, *s_size, *s_dtype, *s_c_contig, *s_flags, *s_c_contiguous, *s_is_cuda, *s_data_ptr,
    *s_numel, *s_is_contiguous, *s_cuda_stream;

int nd_key_intern(void) {
  if (s_data) return 0;
#define IN(v, t) if (!(v = PyUnicode_InternFromString(t))) return -1
  IN(s_data, "data"); IN(s_ptr, "ptr"); IN(s_size, "size");
  IN(s_dtype, "dtype"); IN(s_c_contig, "_c_contiguous"); IN(s_flags, "flags"); IN(s_c_contiguous, "c_contiguous");
  IN(s_is_cuda, "is_cuda"); IN(s_data_ptr, "data_ptr"); IN(s_numel, "numel");
  IN(s_is_contiguous, "is_contiguous"); IN(s_cuda_stream, "cuda_stream");
#undef IN
  return 0;
}

static uint64_t mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
  return h;
}

uint64_t nd_hash(const nd_entry *e) {
  uint64_t h = (uint64_t)e->code;
  h = mix(h, e->sptr); h = mix(h, e->scount); h = mix(h, (uint64_t)(uintptr_t)e->sdt);
  h = mix(h, e->rptr); h = mix(h, e->rcount); h = mix(h, e->stream); h = mix(h, (uint64_t)e->root);
  h = mix(h, (uint64_t)(uintptr_t)e->op);
  h ^= h >> 33; h *= 0xff51afd7ed558ccdULL; h ^= h >> 33;
  return h;
}

static int nd_same(const nd_entry *a, const nd_entry *b) {
  return a->code == b->code && a->sptr == b->sptr && a->scount == b->scount && a->sdt == b->sdt &&
         a->scontig == b->scontig && a->has_recv == b->has_recv && a->rptr == b->rptr &&
         a->rcount == b->rcount && a->rdt == b->rdt && a->rcontig == b->rcontig && a->stream == b->stream &&
         a->root == b->root && a->op == b->op;
}

nd_entry *nd_find(NetDoor *d, const nd_entry *k) {
  for (uint64_t i = nd_hash(k), n = 0; n < ND_SLOTS; i++, n++) {
    nd_entry *e = &d->tab[i % ND_SLOTS];
    if (!e->used) return NULL;
    if (nd_same(e, k)) return e;
  }
  return NULL;
}

static void nd_clear_entry(nd_entry *e) {
  Py_CLEAR(e->sdt);
  Py_CLEAR(e->rdt);
  Py_CLEAR(e->op);
  Py_CLEAR(e->prog);
  e->used = 0;
}

void nd_drop(NetDoor *d) {
  for (int i = 0; i < ND_SLOTS; i++)
    if (d->tab[i].used) nd_clear_entry(&d->tab[i]);
  d->n = 0;
  d->gen++;
}

/* a Python int as uint64 (addresses, counts): 0 when it is not one (error cleared) */
static int u64_of(PyObject *o, uint64_t *out) {
  if (!o || !PyLong_Check(o)) return 0;
  unsigned long long v = PyLong_AsUnsignedLongLong(o);
  if (v == (unsigned long long)-1 && PyErr_Occurred()) {
    PyErr_Clear();
    return 0;
  }
  *out = v;
  return 1;
}

/* u64_of on a new reference (an attribute read or a call's result, NULL when it raised), released */
static int take_u64(PyObject *v, uint64_t *out) {
  int ok = u64_of(v, out);
  Py_XDECREF(v);
  return ok;
}

/* 1 and a truth value, or 0 (error cleared) */
static int truth(PyObject *v, int *out) {
  if (!v) return 0;
  int t = PyObject_IsTrue(v);
  Py_DECREF(v);
  if (t < 0) return 0;
  *out = t;
  return 1;
}

/* the key of one buffer as netreplay's CallKeys reads it: (address, count, dtype (borrowed: the array holds
   it), C-contiguous); *kind 1 CuPy, 2 torch; 0 when the object is neither (or reading it failed) */
static int nd_buf(NetDoor *d, PyObject *o, uint64_t *ptr, uint64_t *count, PyObject **dt, int *contig, int *kind) {
  PyTypeObject *t = Py_TYPE(o);
  if ((PyObject *)t == d->cp_type) {
    PyObject *data = PyObject_GetAttr(o, s_data);
    if (!data) goto fail;
    int ok = take_u64(PyObject_GetAttr(data, s_ptr), ptr);
    Py_DECREF(data);
    if (!ok || !take_u64(PyObject_GetAttr(o, s_size), count)) goto fail;
    if (d->cp_contig_attr) {
      if (!truth(PyObject_GetAttr(o, s_c_contig), contig)) goto fail;
    } else {
      PyObject *f = PyObject_GetAttr(o, s_flags);
      if (!f) goto fail;
      ok = truth(PyObject_GetAttr(f, s_c_contiguous), contig);
      Py_DECREF(f);
      if (!ok) goto fail;
    }
    *kind = 1;
  } else {
    int torch = 0;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(d->torch_types); i++)
      if ((PyObject *)t == PyTuple_GET_ITEM(d->torch_types, i)) torch = 1;
    if (!torch) return 0;
    int cuda = 0;
    if (!truth(PyObject_GetAttr(o, s_is_cuda), &cuda) || !cuda) goto fail;
    if (!take_u64(PyObject_CallMethodNoArgs(o, s_data_ptr), ptr) ||
        !take_u64(PyObject_CallMethodNoArgs(o, s_numel), count))
      goto fail;
    if (!truth(PyObject_CallMethodNoArgs(o, s_is_contiguous), contig)) goto fail;
    *kind = 2;
  }
  PyObject *v = PyObject_GetAttr(o, s_dtype);
  if (!v) goto fail;
  *dt = v;
  Py_DECREF(v);  /* the array holds its dtype for the whole call */
  return 1;
fail:
  PyErr_Clear();
  return 0;
}

/* the stream as CallKeys reads it: an int as given, else .ptr or .cuda_stream; None: the current stream of
   the buffer's library, CuPy's for a CuPy array, torch's on the tensor's device for a tensor (``buf``) */
static int nd_stream(NetDoor *d, PyObject *stream, int kind, PyObject *buf, uint64_t *out) {
  if (stream == Py_None) {
    if (kind == 2) {
      if (d->torch_stream == Py_None) return 0;
      if (!take_u64(PyObject_CallOneArg(d->torch_stream, buf), out)) goto fail;
      return 1;
    }
    if (d->cur_stream == Py_None) return 0;
    PyObject *s = PyObject_CallNoArgs(d->cur_stream);
    if (!s) goto fail;
    int ok = take_u64(PyObject_GetAttr(s, s_ptr), out);
    Py_DECREF(s);
    if (!ok) goto fail;
    return 1;
  }
  if (PyLong_CheckExact(stream)) {
    if (!u64_of(stream, out)) goto fail;
    return 1;
  }
  if (take_u64(PyObject_GetAttr(stream, s_ptr), out)) return 1;
  PyErr_Clear();
  if (take_u64(PyObject_GetAttr(stream, s_cuda_stream), out)) return 1;
fail:
  PyErr_Clear();
  return 0;
}

/* code, op and root of a call's key (fire()'s and put()'s first, fourth and fifth arguments); 0: not taken */
static int nd_head(PyObject *const *a, nd_entry *k) {
  memset(k, 0, sizeof *k);
  long code = PyLong_AsLong(a[0]);
  if (code < 0 || code >= ND_COLLS || !PyLong_CheckExact(a[4])) {
    PyErr_Clear();
    return 0;
  }
  k->code = (int)code;
  k->op = a[3];
  k->root = PyLong_AsLongLong(a[4]);
  if (k->root == -1 && PyErr_Occurred()) {
    PyErr_Clear();
    return 0;
  }
  return 1;
}

/* the key of the call fire() is given; 0: not a call the door takes */
int nd_key(NetDoor *d, PyObject *const *a, nd_entry *k) {
  if (!nd_head(a, k)) return 0;
  int kind = 0, rkind = 0;
  if (!nd_buf(d, a[1], &k->sptr, &k->scount, &k->sdt, &k->scontig, &kind)) return 0;
  if (a[2] != Py_None) {
    if (!nd_buf(d, a[2], &k->rptr, &k->rcount, &k->rdt, &k->rcontig, &rkind)) return 0;
    k->has_recv = 1;
  } else if (k->code >= 3) {
    return 0;  /* all_gather, reduce_scatter and all_to_all allocate their output: Python does */
  }
  return nd_stream(d, a[5], kind, a[1], &k->stream);
}

/* one buffer's part of a Python key, (address, count, dtype, contiguous), as netreplay's CallKeys made it */
static int nd_part(PyObject *t, uint64_t *ptr, uint64_t *count, PyObject **dt, int *contig) {
  if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 4) return 0;
  if (!u64_of(PyTuple_GET_ITEM(t, 0), ptr) || !u64_of(PyTuple_GET_ITEM(t, 1), count)) return 0;
  *dt = PyTuple_GET_ITEM(t, 2);
  int c = PyObject_IsTrue(PyTuple_GET_ITEM(t, 3));
  if (c < 0) {
    PyErr_Clear();
    return 0;
  }
  *contig = c;
  return 1;
}

/* the key put() is given: code, the send and receive parts (None: no receive buffer), op, root, stream */
int nd_key_parts(PyObject *const *a, nd_entry *k) {
  if (!nd_head(a, k) || !nd_part(a[1], &k->sptr, &k->scount, &k->sdt, &k->scontig)) return 0;
  if (a[2] != Py_None) {
    if (!nd_part(a[2], &k->rptr, &k->rcount, &k->rdt, &k->rcontig)) return 0;
    k->has_recv = 1;
  } else if (k->code >= 3) {
    return 0;
  }
  return u64_of(a[5], &k->stream);
}
