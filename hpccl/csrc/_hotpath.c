/* hpccl._hotpath, the CPython face of the node's compiled hot path: the Hot type (argument parsing, the
   callers' buffers held for a call, the GIL let go around long moves, exceptions) over the plain C core
   (_hotcore.h says what it does and how; _hotcore.c), the GPU driver calls gpu_launch and gpu_program, and
   the FrontDoor type (_frontdoor.c) that hands a communicator's host calls to either hot path. */
#define _GNU_SOURCE
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <errno.h>
#include <stdint.h>
#include <string.h>

#include "_dtype.h"
#include "_hotcore.h"

extern PyTypeObject FrontDoorType;  /* _frontdoor.c */

typedef struct {
  PyObject_HEAD
  hot_t core;
  Py_buffer send, recv;      /* the call in progress's buffers, held until it ends */
  int have_send, have_recv;
  int validated;             /* set by the validated path before it hands a call over; the next start clears it */
} Hot;

static void release(Hot *h) {
  if (h->have_send) PyBuffer_Release(&h->send);
  if (h->have_recv) PyBuffer_Release(&h->recv);
  h->have_send = h->have_recv = 0;
}

static void *gil_release(void) { return PyEval_SaveThread(); }
static void gil_take(void *state) { PyEval_RestoreThread((PyThreadState *)state); }

/* A step of the core's call for Python: 0 done (buffers released), 1 pending, -2 an exception set (a failed
   direct read: OSError naming the rank read; the call is over). */
static int settle(Hot *h, int rc) {
  if (rc == HOT_DONE) release(h);
  if (rc != HOT_FAILED) return rc;
  int e = h->core.err, r = h->core.err_rank;
  release(h);
  errno = e;
  PyErr_Format(PyExc_OSError, "hpccl hot path: reading rank %d's memory (process_vm_readv) failed: %s", r,
               strerror(e));
  return -2;
}

/* Acquire the buffers and start call ``kind``; -1 (nothing changed) when this path does not take it. */
static int start(Hot *h, int kind, PyObject *send, PyObject *recv, int op, int root, int64_t seq) {
  int via = h->validated;
  h->validated = 0;
  if (h->core.state != S_IDLE) {
    PyErr_SetString(PyExc_RuntimeError, "hpccl hot path: a call is still in progress");
    return -2;
  }
  int dt = T_U8;
  if (kind != K_BAR) {
    int send_flags = PyBUF_FORMAT | PyBUF_C_CONTIGUOUS;
    int root_only = (kind == K_BC || kind == K_RED) && h->core.rank == root;
    int writes_in_place = kind == K_AR || kind == K_A2A || (kind == K_BC && !root_only) || (kind == K_RED && root_only);
    if (recv == Py_None && writes_in_place) send_flags |= PyBUF_WRITABLE;
    if (PyObject_GetBuffer(send, &h->send, send_flags) < 0) goto decline;
    h->have_send = 1;
    if (recv != Py_None) {
      if (PyObject_GetBuffer(recv, &h->recv, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0)
        goto decline;
      h->have_recv = 1;
    }
    dt = dtype_of(&h->send);
    if (dt < 0) goto decline;
    if (h->have_recv && dtype_of(&h->recv) != dt) goto decline;
  }
  h->core.via = via;
  int rc = kind == K_BAR ? hot_start(&h->core, kind, op, root, dt, 1, NULL, 0, NULL, -1, seq)
                         : hot_start(&h->core, kind, op, root, dt, (int)h->send.itemsize, h->send.buf, h->send.len,
                                     h->have_recv ? h->recv.buf : NULL, h->have_recv ? h->recv.len : -1, seq);
  if (rc == HOT_DECLINED) goto decline;
  if (rc == HOT_NOMEM) {
    release(h);
    PyErr_NoMemory(); /* not a decline: the other ranks take the direct path */
    return -2;
  }
  return settle(h, rc);
decline:
  PyErr_Clear();
  release(h);
  return -1;
}

static PyObject *ret(int rc) { return rc == -2 ? NULL : PyLong_FromLong(rc); }

static PyObject *Hot_all_reduce(Hot *h, PyObject *args) {
  PyObject *s, *r; int op; long long seq;
  if (!PyArg_ParseTuple(args, "OOiL", &s, &r, &op, &seq)) return NULL;
  return ret(start(h, K_AR, s, r, op, -1, seq));
}
static PyObject *Hot_reduce_scatter(Hot *h, PyObject *args) {
  PyObject *s, *r; int op; long long seq;
  if (!PyArg_ParseTuple(args, "OOiL", &s, &r, &op, &seq)) return NULL;
  return ret(start(h, K_RS, s, r, op, -1, seq));
}
static PyObject *Hot_reduce(Hot *h, PyObject *args) {
  PyObject *s, *r; int root, op; long long seq;
  if (!PyArg_ParseTuple(args, "OOiiL", &s, &r, &root, &op, &seq)) return NULL;
  if (root < 0 || root >= h->core.n) return PyLong_FromLong(-1);
  return ret(start(h, K_RED, s, r, op, root, seq));
}
static PyObject *Hot_all_to_all(Hot *h, PyObject *args) {
  PyObject *s, *r; long long seq;
  if (!PyArg_ParseTuple(args, "OOL", &s, &r, &seq)) return NULL;
  return ret(start(h, K_A2A, s, r, 0, -1, seq));
}
static PyObject *Hot_all_gather(Hot *h, PyObject *args) {
  PyObject *s, *r; long long seq;
  if (!PyArg_ParseTuple(args, "OOL", &s, &r, &seq)) return NULL;
  return ret(start(h, K_AG, s, r, 0, -1, seq));
}
static PyObject *Hot_broadcast(Hot *h, PyObject *args) {
  PyObject *s, *r; int root; long long seq;
  if (!PyArg_ParseTuple(args, "OOiL", &s, &r, &root, &seq)) return NULL;
  if (root < 0 || root >= h->core.n) return PyLong_FromLong(-1);
  return ret(start(h, K_BC, s, r, 0, root, seq));
}
static PyObject *Hot_barrier(Hot *h, PyObject *args) {
  long long seq;
  if (!PyArg_ParseTuple(args, "L", &seq)) return NULL;
  return ret(start(h, K_BAR, Py_None, Py_None, 0, -1, seq));
}

static PyObject *Hot_resume(Hot *h, PyObject *unused) {
  (void)unused;
  if (h->core.state == S_IDLE) Py_RETURN_TRUE;
  int rc = settle(h, hot_advance(&h->core));
  if (rc == -2) return NULL;
  return PyBool_FromLong(rc == 0);
}

static PyObject *Hot_waiting(Hot *h, PyObject *unused) {
  /* the ranks the call in progress still waits for */
  (void)unused;
  PyObject *out = PyList_New(0);
  if (out == NULL || h->core.state == S_IDLE) return out;
  for (int r = 0; r < h->core.n; r++) {
    if (r == h->core.rank || !hot_late(&h->core, r)) continue;
    PyObject *v = PyLong_FromLong(r);
    if (v == NULL || PyList_Append(out, v) < 0) { Py_XDECREF(v); Py_DECREF(out); return NULL; }
    Py_DECREF(v);
  }
  return out;
}

static PyObject *Hot_cancel(Hot *h, PyObject *unused) {
  (void)unused;
  hot_cancel(&h->core);
  release(h);
  Py_RETURN_NONE;
}

/* map(rank, remote, nbytes, fd): rank's alloc_host segment at ``remote`` (its address there), ``nbytes``
   long, is the file fd (mapped here; this rank's own: fd -1, recorded only). Between calls only. */
static PyObject *Hot_map(Hot *h, PyObject *args) {
  int r, fd;
  long long remote;
  Py_ssize_t len;
  if (!PyArg_ParseTuple(args, "iLni", &r, &remote, &len, &fd)) return NULL;
  int rc = hot_map(&h->core, r, (int64_t)remote, len, fd);
  if (rc == -1) {
    PyErr_SetString(PyExc_ValueError, "hpccl hot path: map() needs a rank, a length and (a peer's) fd, between calls");
    return NULL;
  }
  if (rc == -2) return PyErr_NoMemory();
  if (rc != 0) {
    errno = rc;
    return PyErr_SetFromErrno(PyExc_OSError);
  }
  Py_RETURN_NONE;
}

/* unmap(rank, remote) -> whether rank's segment at ``remote`` was mapped (and is no longer) */
static PyObject *Hot_unmap(Hot *h, PyObject *args) {
  int r;
  long long remote;
  if (!PyArg_ParseTuple(args, "iL", &r, &remote)) return NULL;
  int rc = hot_unmap(&h->core, r, (int64_t)remote);
  if (rc < 0) {
    PyErr_SetString(PyExc_ValueError, "hpccl hot path: unmap() between calls only");
    return NULL;
  }
  return PyBool_FromLong(rc);
}

static PyObject *Hot_mapped_bytes(Hot *h, void *unused) {
  (void)unused;
  return PyLong_FromLongLong(h->core.mapped_bytes);
}

static int Hot_init(Hot *h, PyObject *args, PyObject *kw) {
  (void)kw; /* positional only, as PyArg_ParseTuple reads them */
  PyObject *bases, *pids;
  Py_ssize_t arrived_off, ctr_off, slot_off, addr_off, done_off, cap, reduce_cap, cma_min;
  int rank;
  long spin;
  if (!PyArg_ParseTuple(args, "OOnnnnnnnnil", &bases, &pids, &arrived_off, &ctr_off, &slot_off, &addr_off,
                        &done_off, &cap, &reduce_cap, &cma_min, &rank, &spin))
    return -1;
  PyObject *seq = PySequence_Fast(bases, "bases must be a sequence of addresses");
  if (seq == NULL) return -1;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  if (n < 1 || n > MAXR || rank < 0 || rank >= n || cap < 0) {
    Py_DECREF(seq);
    PyErr_SetString(PyExc_ValueError, "hpccl hot path: bad rank, size or slot bytes");
    return -1;
  }
  char *base[MAXR];
  pid_t pid[MAXR];
  for (Py_ssize_t r = 0; r < n; r++) {
    base[r] = (char *)PyLong_AsVoidPtr(PySequence_Fast_GET_ITEM(seq, r));
    if (base[r] == NULL && PyErr_Occurred()) { Py_DECREF(seq); return -1; }
  }
  Py_DECREF(seq);
  PyObject *pseq = PySequence_Fast(pids, "pids must be a sequence of process ids");
  if (pseq == NULL) return -1;
  if (PySequence_Fast_GET_SIZE(pseq) != n) {
    Py_DECREF(pseq);
    PyErr_SetString(PyExc_ValueError, "hpccl hot path: one pid per rank");
    return -1;
  }
  for (Py_ssize_t r = 0; r < n; r++) {
    long p = PyLong_AsLong(PySequence_Fast_GET_ITEM(pseq, r));
    if (p == -1 && PyErr_Occurred()) { Py_DECREF(pseq); return -1; }
    pid[r] = (pid_t)p;
  }
  Py_DECREF(pseq);
  hot_layout at = {arrived_off, ctr_off, slot_off, addr_off, done_off};
  hot_init(&h->core, (int)n, rank, base, pid, &at, cap, reduce_cap, cma_min, spin);
  h->core.unlock = gil_release, h->core.relock = gil_take;
  h->have_send = h->have_recv = 0;
  return 0;
}

static void Hot_dealloc(Hot *h) {
  release(h);
  hot_free(&h->core);
  Py_TYPE(h)->tp_free((PyObject *)h);
}

static PyObject *Hot_calls(Hot *h, void *unused) {
  (void)unused;
  return PyLong_FromLongLong(h->core.f);
}

static PyObject *Hot_counts(Hot *h, PyObject *unused) {
  /* [(calls, bytes, seconds)] per collective, in the order all_reduce, all_gather, broadcast,
     reduce_scatter, barrier, reduce, all_to_all; bytes are this rank's input */
  (void)unused;
  PyObject *out = PyList_New(NKINDS);
  if (out == NULL) return NULL;
  hot_t *c = &h->core;
  for (int k = 0; k < NKINDS; k++) {
    PyObject *t = Py_BuildValue("(LLd)", c->n_calls[0][k] + c->n_calls[1][k], c->n_bytes[0][k] + c->n_bytes[1][k],
                                c->n_secs[0][k] + c->n_secs[1][k]);
    if (t == NULL) { Py_DECREF(out); return NULL; }
    PyList_SET_ITEM(out, k, t);
  }
  return out;
}

static PyObject *Hot_detail(Hot *h, PyObject *unused) {
  /* [(kind index, validated, calls, bytes, seconds, latency buckets)] for each entry and collective with calls */
  (void)unused;
  hot_t *c = &h->core;
  PyObject *out = PyList_New(0);
  if (out == NULL) return NULL;
  for (int v = 0; v < 2; v++)
    for (int k = 0; k < NKINDS; k++) {
      if (!c->n_calls[v][k]) continue;
      PyObject *hist = lat_tuple(c->hist[v][k]);
      PyObject *t = hist ? Py_BuildValue("(iiLLdN)", k, v, c->n_calls[v][k], c->n_bytes[v][k], c->n_secs[v][k], hist)
                         : NULL;
      if (t == NULL || PyList_Append(out, t) < 0) { Py_XDECREF(t); Py_DECREF(out); return NULL; }
      Py_DECREF(t);
    }
  return out;
}

static PyObject *Hot_busy(Hot *h, void *unused) {
  (void)unused;
  return PyBool_FromLong(h->core.state != S_IDLE);
}

static PyMethodDef Hot_methods[] = {
    {"all_reduce", (PyCFunction)Hot_all_reduce, METH_VARARGS, "(send, recv|None, op, seq) -> 0 done, 1 pending, -1 declined"},
    {"reduce_scatter", (PyCFunction)Hot_reduce_scatter, METH_VARARGS, "(send, recv, op, seq) -> as all_reduce"},
    {"reduce", (PyCFunction)Hot_reduce, METH_VARARGS, "(send, recv|None, root, op, seq) -> as all_reduce"},
    {"all_to_all", (PyCFunction)Hot_all_to_all, METH_VARARGS, "(send, recv|None, seq) -> as all_reduce"},
    {"all_gather", (PyCFunction)Hot_all_gather, METH_VARARGS, "(send, recv, seq) -> as all_reduce"},
    {"broadcast", (PyCFunction)Hot_broadcast, METH_VARARGS, "(buf, recv|None, root, seq) -> as all_reduce"},
    {"barrier", (PyCFunction)Hot_barrier, METH_VARARGS, "(seq) -> 0 done, 1 pending"},
    {"resume", (PyCFunction)Hot_resume, METH_NOARGS, "Drive the pending call; True once it is done"},
    {"waiting", (PyCFunction)Hot_waiting, METH_NOARGS, "Ranks the pending call still waits for"},
    {"cancel", (PyCFunction)Hot_cancel, METH_NOARGS, "Drop the pending call (after a failure)"},
    {"counts", (PyCFunction)Hot_counts, METH_NOARGS, "[(calls, bytes, seconds)] per collective (KINDS order)"},
    {"detail", (PyCFunction)Hot_detail, METH_NOARGS,
     "[(KINDS index, validated, calls, bytes, seconds, latency buckets)]: counts by entry, for metrics"},
    {"map", (PyCFunction)Hot_map, METH_VARARGS, "(rank, remote, nbytes, fd): map rank's alloc_host segment"},
    {"unmap", (PyCFunction)Hot_unmap, METH_VARARGS, "(rank, remote) -> whether that segment was mapped"},
    {NULL, NULL, 0, NULL}};

static PyMemberDef Hot_members[] = {
    {"validated", T_INT, offsetof(Hot, validated), 0,
     "1: the next call comes from the validated path (counted apart from the front door's); cleared by it"},
    {"latency", T_INT, offsetof(Hot, core) + offsetof(hot_t, latency), 0,
     "1: count each call's time in log2 buckets (HPCCL_METRICS)"},
    {NULL, 0, 0, 0, NULL}};

static PyGetSetDef Hot_getset[] = {{"calls", (getter)Hot_calls, NULL, "calls made on this path", NULL},
                                   {"busy", (getter)Hot_busy, NULL, "a call is in progress (pending)", NULL},
                                   {"mapped_bytes", (getter)Hot_mapped_bytes, NULL,
                                    "bytes direct calls moved through alloc_host mappings", NULL},
                                   {NULL, NULL, NULL, NULL, NULL}};

static PyTypeObject HotType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "hpccl._hotpath.Hot",
    .tp_basicsize = sizeof(Hot),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The compiled small-message path of one communicator's shared-memory segments",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Hot_init,
    .tp_dealloc = (destructor)Hot_dealloc,
    .tp_methods = Hot_methods,
    .tp_getset = Hot_getset,
    .tp_members = Hot_members,
};

/* ---- GPU kernel launch: the device fast path's per-call driver work in one call ----
   cuStreamIsCapturing, cuLaunchKernel and (outside a capture) cuEventRecord of the engine's tail event,
   through the driver's own entry points (addresses handed over from Python's ctypes handles), instead of
   three ctypes calls. Returns the CUresult of the launch, or -1 when capturing (no record was made). */
typedef int (*launch_t)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *,
                        void **, void **);
typedef int (*capturing_t)(void *, int *);
typedef int (*record_t)(void *, void *);

static PyObject *gpu_launch(PyObject *self, PyObject *args) {
  (void)self;
  unsigned long long fl, fc, fr, func, stream, params, event;
  unsigned grid, block;
  if (!PyArg_ParseTuple(args, "KKKKIIKKK", &fl, &fc, &fr, &func, &grid, &block, &stream, &params, &event))
    return NULL;
  int cap = 0;
  if (((capturing_t)(uintptr_t)fc)((void *)(uintptr_t)stream, &cap) != 0) cap = 0;
  int rc = ((launch_t)(uintptr_t)fl)((void *)(uintptr_t)func, grid, 1, 1, block, 1, 1, 0, (void *)(uintptr_t)stream,
                                     (void **)(uintptr_t)params, NULL);
  if (rc != 0) return PyLong_FromLong(rc);
  if (cap) return PyLong_FromLong(-1);
  ((record_t)(uintptr_t)fr)((void *)(uintptr_t)event, (void *)(uintptr_t)stream);
  return PyLong_FromLong(0);
}

/* The stream operations of one call of the GPU's stream-synchronised protocol (hpccl/gpu/gpu_sync.py), in one
 * C call: each step is a kernel launch or a cuStreamBatchMemOp, in order; then the tail event, unless the
 * stream is capturing. */
typedef int (*batch_t)(void *, unsigned, void *, unsigned);
typedef struct {
  unsigned long long kind; /* 0: kernel, 1: batch of stream memory operations */
  unsigned long long func; /* CUfunction, or the number of operations */
  unsigned grid, block;
  unsigned long long params; /* kernel parameter array, or the operations' array */
} gpu_step;

/* The runner itself, for C callers too (hpccl/torch/_native.cpp replays armed programs through its address,
 * program_entry()): the CUresult of the failing step (its index in *done), -1 when the stream is capturing,
 * else 0; *done is the number of steps enqueued. */
static int hp_gpu_program(unsigned long long fl, unsigned long long fc, unsigned long long fr, unsigned long long fb,
                          unsigned long long steps, unsigned long long nsteps, unsigned long long stream,
                          unsigned long long event, unsigned long long *done) {
  int cap = 0;
  if (((capturing_t)(uintptr_t)fc)((void *)(uintptr_t)stream, &cap) != 0) cap = 0;
  const gpu_step *s = (const gpu_step *)(uintptr_t)steps;
  for (unsigned long long i = 0; i < nsteps; ++i) {
    int rc = s[i].kind == 0
                 ? ((launch_t)(uintptr_t)fl)((void *)(uintptr_t)s[i].func, s[i].grid, 1, 1, s[i].block, 1, 1, 0,
                                             (void *)(uintptr_t)stream, (void **)(uintptr_t)s[i].params, NULL)
                 : ((batch_t)(uintptr_t)fb)((void *)(uintptr_t)stream, (unsigned)s[i].func,
                                            (void *)(uintptr_t)s[i].params, 0);
    if (rc != 0) {
      *done = i;
      return rc;
    }
  }
  *done = nsteps;
  if (cap) return -1;
  ((record_t)(uintptr_t)fr)((void *)(uintptr_t)event, (void *)(uintptr_t)stream);
  return 0;
}

static PyObject *gpu_program(PyObject *self, PyObject *args) {
  (void)self;
  unsigned long long fl, fc, fr, fb, steps, nsteps, stream, event, done = 0;
  if (!PyArg_ParseTuple(args, "KKKKKKKK", &fl, &fc, &fr, &fb, &steps, &nsteps, &stream, &event)) return NULL;
  int rc = hp_gpu_program(fl, fc, fr, fb, steps, nsteps, stream, event, &done);
  return Py_BuildValue("(iK)", rc, done);
}

static PyObject *program_entry(PyObject *self, PyObject *unused) {
  (void)self;
  (void)unused;
  return PyLong_FromVoidPtr((void *)(uintptr_t)&hp_gpu_program);
}

static PyMethodDef module_methods[] = {
    {"gpu_program", gpu_program, METH_VARARGS,
     "(cuLaunchKernel, cuStreamIsCapturing, cuEventRecord, cuStreamBatchMemOp, steps, count, stream, tail event) "
     "-> (result, steps done): result 0, -1 when the stream is capturing (no event recorded), else the failing "
     "step's CUresult"},
    {"program_entry", program_entry, METH_NOARGS,
     "Address of gpu_program's runner as a C function (cuLaunchKernel, cuStreamIsCapturing, cuEventRecord, "
     "cuStreamBatchMemOp, steps, count, stream, tail event, unsigned long long *done) -> result"},
    {"gpu_launch", gpu_launch, METH_VARARGS,
     "(cuLaunchKernel, cuStreamIsCapturing, cuEventRecord, func, grid, block, stream, params, tail event) -> "
     "launch result, or -1 when the stream is capturing (then no event was recorded)"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_hotpath",
                                    "hpccl's compiled hot path for small host collectives", -1, module_methods,
                                    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__hotpath(void) {
  if (PyType_Ready(&HotType) < 0 || PyType_Ready(&FrontDoorType) < 0) return NULL;
  PyObject *m = PyModule_Create(&module);
  if (m == NULL) return NULL;
  Py_INCREF(&HotType);
  if (PyModule_AddObject(m, "Hot", (PyObject *)&HotType) < 0) {
    Py_DECREF(&HotType);
    Py_DECREF(m);
    return NULL;
  }
  Py_INCREF(&FrontDoorType);
  if (PyModule_AddObject(m, "FrontDoor", (PyObject *)&FrontDoorType) < 0) {
    Py_DECREF(&FrontDoorType);
    Py_DECREF(m);
    return NULL;
  }
  PyModule_AddIntConstant(m, "SUM", OP_SUM);
  PyModule_AddIntConstant(m, "PROD", OP_PROD);
  PyModule_AddIntConstant(m, "MIN", OP_MIN);
  PyModule_AddIntConstant(m, "MAX", OP_MAX);
  PyModule_AddIntConstant(m, "AVG", OP_AVG);
  PyModule_AddIntConstant(m, "LAT_BUCKETS", LAT_BUCKETS);
  PyModule_AddIntConstant(m, "LAT_LOW", LAT_LOW);
  return m;
}
