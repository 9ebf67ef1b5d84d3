/* hpccl._netengine's Engine type (_netpy.h): one network engine (_netcore.h) as Python sees it. Argument
   parsing, object lifetimes, the GIL released around what may block, exceptions; the engine's work is in
   _netcalls.c and below, the objects it hands out (Op, Template) in _netop.c, its program() in _netreplay.c,
   the module in _netmodule.c. */
#include "_netpy.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* the exception for a failed call of _netcalls.c */
static void raise_ne(const ne_err *err) {
  switch (err->kind) {
    case NE_NOMEM: PyErr_NoMemory(); break;
    case NE_VERSION: PyErr_SetString(PyExc_ImportError, err->msg); break;
    case NE_VALUE: PyErr_SetString(PyExc_ValueError, err->msg); break;
    case NE_ERRNO: errno = err->err_no; PyErr_SetFromErrno(PyExc_OSError); break;
    case NE_PEER: {
      PyObject *a = Py_BuildValue("(iis)", E_PEER, err->peer, err->msg);
      if (a) { PyErr_SetObject(HpErr, a); Py_DECREF(a); }
      break;
    }
    default: PyErr_SetString(PyExc_RuntimeError, err->msg);
  }
}

/* ----- Engine ----------------------------------------------------------------------------------------- */
static int Engine_init(Engine *self, PyObject *args, PyObject *kw) {
  static char *kws[] = {"rank", "size", "config", NULL};
  int rank, size;
  PyObject *cfg = NULL;
  self->core.wake = self->core.efd = -1;  /* an engine refused below must not close fd 0 when it is freed */
  if (!PyArg_ParseTupleAndKeywords(args, kw, "ii|O!", kws, &rank, &size, &PyDict_Type, &cfg)) return -1;
  if (size < 1 || size > (1 << 23) || rank < 0 || rank >= size) {
    PyErr_SetString(PyExc_ValueError, "rank/size out of range");
    return -1;
  }
  ne_err err = {0};
  if (engine_version_check(&err) < 0 || engine_alloc(&self->core, rank, size, &err) < 0) { raise_ne(&err); return -1; }
  /* the UCX settings as C strings (owned by cfg's str objects while engine_start_ucx runs) */
  Py_ssize_t n = cfg ? PyDict_Size(cfg) : 0;
  size_t slots = n > 0 ? (size_t)n : 1;
  const char **keys = calloc(slots, sizeof(char *)), **vals = calloc(slots, sizeof(char *));
  if (!keys || !vals) { free(keys); free(vals); PyErr_NoMemory(); return -1; }
  PyObject *k, *v;
  Py_ssize_t pos = 0;
  for (int i = 0; cfg && PyDict_Next(cfg, &pos, &k, &v); i++) {
    keys[i] = PyUnicode_AsUTF8(k);
    vals[i] = PyUnicode_AsUTF8(v);
    if (!keys[i] || !vals[i]) { free(keys); free(vals); return -1; }
  }
  int rc = engine_start_ucx(&self->core, (int)n, keys, vals, &err);
  if (rc < 0) {
    if (err.kind == NE_SETTING)
      PyErr_Format(PyExc_ValueError, "UCX refused the setting %s=%s: %s", keys[err.at], vals[err.at], err.msg);
    else
      raise_ne(&err);
  }
  free(keys); free(vals);
  return rc;
}

static PyObject *Engine_address(Engine *self, PyObject *noargs) {
  (void)noargs;
  ucp_address_t *a;
  size_t n;
  ne_err err = {0};
  if (engine_address(&self->core, &a, &n, &err) < 0) { raise_ne(&err); return NULL; }
  PyObject *r = PyBytes_FromStringAndSize((const char *)a, (Py_ssize_t)n);
  engine_address_free(&self->core, a);
  return r;
}

static PyObject *Engine_info(Engine *self, PyObject *noargs) {
  (void)noargs;
  size_t len;
  char *buf = engine_info(&self->core, &len);
  if (!buf) return PyErr_SetFromErrno(PyExc_OSError);
  PyObject *r = PyUnicode_DecodeUTF8(buf, (Py_ssize_t)len, "replace");
  free(buf);
  return r;
}

static PyObject *Engine_connect(Engine *self, PyObject *args) {
  PyObject *addrs, *remote;
  if (!PyArg_ParseTuple(args, "O!O!", &PyList_Type, &addrs, &PyList_Type, &remote)) return NULL;
  int size = self->core.size;
  if (PyList_GET_SIZE(addrs) != size || PyList_GET_SIZE(remote) != size) {
    PyErr_SetString(PyExc_ValueError, "connect() needs an address and a remote flag per rank");
    return NULL;
  }
  if (self->core.started) { PyErr_SetString(PyExc_RuntimeError, "already connected"); return NULL; }
  const char **as = calloc((size_t)size, sizeof(char *));
  int *rs = calloc((size_t)size, sizeof(int));
  if (!as || !rs) { free(as); free(rs); return PyErr_NoMemory(); }
  for (int p = 0; p < size; p++) {  /* the addresses stay owned by the list's bytes objects */
    if (p == self->core.rank) continue;
    char *a; Py_ssize_t n;
    if (PyBytes_AsStringAndSize(PyList_GET_ITEM(addrs, p), &a, &n) < 0) { free(as); free(rs); return NULL; }
    as[p] = a;
    rs[p] = PyObject_IsTrue(PyList_GET_ITEM(remote, p));
  }
  ne_err err = {0};
  int rc = engine_connect(&self->core, as, rs, &err);
  free(as); free(rs);
  if (rc < 0) { raise_ne(&err); return NULL; }
  Py_RETURN_NONE;
}

/* send(peer, buffer[, timeout, p2p]) / recv(...): one message (p2p: a point-to-point one, tagged so a receive
   from any source can tell it from a collective's); the Op keeps the buffer alive */
static PyObject *one_op(Engine *self, PyObject *args, int kind) {
  int peer, p2p = 0;
  PyObject *obj;
  double timeout = 0;
  if (!PyArg_ParseTuple(args, "iO|dp", &peer, &obj, &timeout, &p2p)) return NULL;
  if (check_open(self) < 0 || check_peer(self, peer) < 0) return NULL;
  batch_t *b = batch_new(1, BK_OP);
  if (!b) return PyErr_NoMemory();
  Op *o = new_op(self, b);
  if (!o) { batch_unref(b); return NULL; }
  if (PyObject_GetBuffer(obj, &o->view, kind == K_RECV ? PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS : PyBUF_C_CONTIGUOUS) < 0) {
    Py_DECREF(o);
    return NULL;
  }
  o->have_view = 1;
  op_t *x = &b->ops[0];
  x->kind = kind; x->peer = peer; x->buf = o->view.buf; x->len = (size_t)o->view.len;
  x->tag = eager_tag(&self->core, kind, peer) | (p2p ? P2P_BIT : 0);
  b->timeout = timeout;
  submit(&self->core, b, 1);
  return (PyObject *)o;
}

/* probe(peer): whether the next eager message expected from ``peer`` is a point-to-point one already here
   (engine_probe) */
static PyObject *Engine_probe(Engine *self, PyObject *args) {
  int peer, found;
  if (!PyArg_ParseTuple(args, "i", &peer)) return NULL;
  if (peer < 0 || peer >= self->core.size || peer == self->core.rank) {
    PyErr_Format(PyExc_ValueError, "probe: peer %d is not another rank of %d", peer, self->core.size);
    return NULL;
  }
  Py_BEGIN_ALLOW_THREADS
  found = engine_probe(&self->core, peer);
  Py_END_ALLOW_THREADS
  return PyBool_FromLong(found);
}

static PyObject *Engine_send(Engine *self, PyObject *args) { return one_op(self, args, K_SEND); }
static PyObject *Engine_recv(Engine *self, PyObject *args) { return one_op(self, args, K_RECV); }

/* parse [(kind, peer, ptr, nbytes), ...] into b's ops */
static int parse_ops(Engine *self, PyObject *ops, batch_t *b) {
  for (int i = 0; i < b->nops; i++) {
    PyObject *t = PyList_GET_ITEM(ops, i);
    int kind, peer;
    unsigned long long ptr, len;
    if (!PyArg_ParseTuple(t, "iiKK", &kind, &peer, &ptr, &len)) return -1;
    if ((kind != K_SEND && kind != K_RECV) || check_peer(self, peer) < 0) {
      if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "op kind must be 0 (send) or 1 (recv)");
      return -1;
    }
    op_t *o = &b->ops[i];
    o->kind = kind; o->peer = peer; o->buf = (char *)(uintptr_t)ptr; o->len = (size_t)len;
  }
  return 0;
}

/* staged(ops, ready_addr, ready_tok, done_addr, done_val, timeout, label[, gate_addr]): an eager GPU network
   step over pinned host memory; the engine owns it (failures go to error()). Tags are assigned now, in call
   order. gate_addr: a word that, nonzero when the token comes, fails the step without sending anything. */
static PyObject *Engine_staged(Engine *self, PyObject *args) {
  PyObject *ops;
  unsigned long long ready, done, gate = 0;
  unsigned int rtok, dval;
  double timeout;
  const char *label;
  if (!PyArg_ParseTuple(args, "O!KIKIds|K", &PyList_Type, &ops, &ready, &rtok, &done, &dval, &timeout, &label,
                        &gate))
    return NULL;
  if (check_open(self) < 0) return NULL;
  batch_t *b = batch_staged(&self->core, (int)PyList_GET_SIZE(ops));
  if (!b) return PyErr_NoMemory();
  if (parse_ops(self, ops, b) < 0) { batch_unref(b); return NULL; }
  submit_staged(&self->core, b, ready, rtok, gate, done, dval, timeout, label, 1);
  Py_RETURN_NONE;
}

/* template(ops, done_addr, arm_addr, timeout, label) -> Template: a network step a CUDA graph captured. Each
   replay clears the done word, then sets the arm word once the staged data is in place, then waits for the
   done word to reach 1; the engine, polling the arm word from now until the Template is retired, posts the
   step at each replay and writes 1 to the done word when it ends, ok or not. */
static PyObject *Engine_template(Engine *self, PyObject *args) {
  PyObject *ops;
  unsigned long long done, arm;
  double timeout;
  const char *label;
  if (!PyArg_ParseTuple(args, "O!KKds", &PyList_Type, &ops, &done, &arm, &timeout, &label)) return NULL;
  if (check_open(self) < 0) return NULL;
  if (!arm) {
    PyErr_SetString(PyExc_ValueError, "a template needs an arm word (the graph sets it at each replay)");
    return NULL;
  }
  batch_t *b = batch_new((int)PyList_GET_SIZE(ops), BK_TEMPLATE);
  if (!b) return PyErr_NoMemory();
  if (parse_ops(self, ops, b) < 0) { batch_unref(b); return NULL; }
  int rc = engine_template_prepare(&self->core, b, done, arm, timeout, label);
  if (rc < 0) {
    batch_unref(b);
    if (rc == -2) return PyErr_NoMemory();
    if (rc == -3)
      PyErr_SetString(PyExc_RuntimeError, "this communicator has captured 65535 network steps with one peer, "
                      "the most it can hold");
    else
      PyErr_SetString(PyExc_ValueError, "a captured network step has more than 128 messages to one peer");
    return NULL;
  }
  PyObject *t = template_new(self, b);
  if (!t) { batch_unref(b); return NULL; }
  engine_template_hold(&self->core, b);
  return t;
}

static PyObject *Engine_ctrl_send(Engine *self, PyObject *args) {
  int peer;
  long long k, who, seq;
  if (!PyArg_ParseTuple(args, "iLLL", &peer, &k, &who, &seq)) return NULL;
  if (check_open(self) < 0 || check_peer(self, peer) < 0) return NULL;
  batch_t *b = engine_ctrl_batch(&self->core, peer, k, who, seq);
  if (!b) return PyErr_NoMemory();
  Op *op = new_op(self, b);
  if (!op) { batch_unref(b); return NULL; }
  submit(&self->core, b, 1);
  return (PyObject *)op;
}

static PyObject *Engine_ctrl_poll(Engine *self, PyObject *noargs) {
  (void)noargs;
  PyObject *out = PyList_New(0);
  if (!out) return NULL;
  int h, t = engine_ctrl_pending(&self->core, &h);
  for (; h < t; h++) {
    const int64_t *m = engine_ctrl_at(&self->core, h);
    PyObject *tup = Py_BuildValue("(LLL)", (long long)m[0], (long long)m[1], (long long)m[2]);
    if (!tup || PyList_Append(out, tup) < 0) { Py_XDECREF(tup); Py_DECREF(out); return NULL; }
    Py_DECREF(tup);
  }
  engine_ctrl_taken(&self->core, h);
  return out;
}

static PyObject *Engine_dead(Engine *self, PyObject *noargs) {
  (void)noargs;
  char why[sizeof self->core.dead_why];
  int r = engine_dead(&self->core, why, sizeof why);
  if (r < 0) Py_RETURN_NONE;
  return Py_BuildValue("(is)", r, why);
}

static PyObject *Engine_error(Engine *self, PyObject *noargs) {
  (void)noargs;
  int peer;
  char msg[sizeof self->core.first_err];
  int code = engine_error(&self->core, &peer, msg, sizeof msg);
  if (!code) Py_RETURN_NONE;
  return Py_BuildValue("(iis)", code, peer, msg);
}

static PyObject *Engine_abort(Engine *self, PyObject *args) {
  int origin = -1;
  if (!PyArg_ParseTuple(args, "|i", &origin)) return NULL;
  engine_abort(&self->core, origin);
  Py_RETURN_NONE;
}

static PyObject *Engine_pending(Engine *self, PyObject *noargs) {
  (void)noargs;
  uint64_t n, sent, got;
  Py_BEGIN_ALLOW_THREADS
  engine_counters(&self->core, &n, &sent, &got);
  Py_END_ALLOW_THREADS
  return Py_BuildValue("(KKK)", (unsigned long long)n, (unsigned long long)sent, (unsigned long long)got);
}

static PyObject *Engine_close(Engine *self, PyObject *args) {
  double wait = 0;
  if (!PyArg_ParseTuple(args, "|d", &wait)) return NULL;
  int *late = calloc((size_t)self->core.size + 1, sizeof(int));
  if (!late) return PyErr_NoMemory();
  int nlate = 0;
  Py_BEGIN_ALLOW_THREADS
  if (wait > 0) nlate = engine_farewell(&self->core, wait, late);
  engine_close(&self->core);
  Py_END_ALLOW_THREADS
  park_sweep();
  PyObject *out = PyList_New(nlate);
  for (int i = 0; out && i < nlate; i++) {
    PyObject *r = PyLong_FromLong(late[i]);
    if (!r) { Py_CLEAR(out); break; }
    PyList_SET_ITEM(out, i, r);
  }
  free(late);
  return out;
}

static void Engine_dealloc(Engine *self) {
  engine_free(&self->core);
  Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Engine_rank(Engine *self, void *c) { (void)c; return PyLong_FromLong(self->core.rank); }
static PyObject *Engine_staged_made(Engine *self, void *c) {
  (void)c;
  return PyLong_FromUnsignedLongLong(self->core.staged_made);
}

static PyObject *Engine_wakes(Engine *self, void *c) {
  (void)c;
  return PyLong_FromUnsignedLongLong(atomic_load_explicit(&self->core.wakes, memory_order_relaxed));
}

static PyObject *Engine_lingering(Engine *self, void *c) {
  (void)c;
  return PyLong_FromLong(atomic_load(&self->core.lingering));
}

static PyObject *Engine_no_rcache(Engine *self, void *c) {
  (void)c;
  return PyBool_FromLong(self->core.no_rcache);
}

static PyObject *Engine_beats(Engine *self, void *c) {
  (void)c;
  return PyLong_FromUnsignedLongLong(atomic_load_explicit(&self->core.beats, memory_order_relaxed));
}

static PyObject *Engine_hold(Engine *self, PyObject *args) {
  double secs;
  if (!PyArg_ParseTuple(args, "d", &secs)) return NULL;
  atomic_store(&self->core.hold_until, secs > 0 ? now_s() + secs : 0.0);
  Py_RETURN_NONE;
}

static PyMethodDef Engine_methods[] = {
  {"hold", (PyCFunction)Engine_hold, METH_VARARGS, "hold(seconds): fault injection for tests: the progress thread "
   "does nothing (no progress, no timeouts, no done words) for that long; 0 lets it go at once."},
  {"program", (PyCFunction)Engine_program, METH_VARARGS, "A recorded GPU network call to replay (hpccl/gpu/netreplay.py)."},
  {"address", (PyCFunction)Engine_address, METH_NOARGS, "This worker's UCX address (bytes)."},
  {"info", (PyCFunction)Engine_info, METH_NOARGS, "UCX's description of the context and worker."},
  {"connect", (PyCFunction)Engine_connect, METH_VARARGS, "connect(addresses, remote): endpoints, then the thread."},
  {"send", (PyCFunction)Engine_send, METH_VARARGS, "send(peer, buffer[, timeout, p2p]) -> Op"},
  {"recv", (PyCFunction)Engine_recv, METH_VARARGS, "recv(peer, buffer[, timeout, p2p]) -> Op"},
  {"probe", (PyCFunction)Engine_probe, METH_VARARGS, "probe(peer) -> whether peer's next message has arrived"},
  {"staged", (PyCFunction)Engine_staged, METH_VARARGS, "An eager GPU network step over pinned host memory."},
  {"template", (PyCFunction)Engine_template, METH_VARARGS, "A network step for a CUDA graph (Template)."},
  {"ctrl_send", (PyCFunction)Engine_ctrl_send, METH_VARARGS, "ctrl_send(peer, kind, who, seq) -> Op"},
  {"ctrl_poll", (PyCFunction)Engine_ctrl_poll, METH_NOARGS, "Control messages that arrived [(kind, who, seq)]."},
  {"dead", (PyCFunction)Engine_dead, METH_NOARGS, "(rank, why) of the first peer whose connection failed, or None."},
  {"error", (PyCFunction)Engine_error, METH_NOARGS, "(code, peer, message) of the first failed GPU step, or None."},
  {"abort", (PyCFunction)Engine_abort, METH_VARARGS, "abort([origin]): fail everything in flight."},
  {"counters", (PyCFunction)Engine_pending, METH_NOARGS, "(batches done, bytes sent, bytes received)."},
  {"close", (PyCFunction)Engine_close, METH_VARARGS,
   "close(wait=0) -> [ranks]: with wait > 0, first say goodbye to the peers on other nodes messages went to or "
   "came from and "
   "wait up to wait seconds for each to confirm it read all it was sent (those that did not are returned); "
   "then stop the thread, close endpoints and the worker."},
  {NULL, NULL, 0, NULL}};

static PyObject *Engine_get_seq(Engine *self, void *c) { (void)c; return PyLong_FromLongLong(self->seq); }
static int Engine_set_seq(Engine *self, PyObject *v, void *c) {
  (void)c;
  long long s = v ? PyLong_AsLongLong(v) : -1;
  if (s == -1 && (!v || PyErr_Occurred())) {
    if (!v) PyErr_SetString(PyExc_TypeError, "seq cannot be deleted");
    return -1;
  }
  self->seq = s;
  return 0;
}

static PyObject *Engine_ctrl_drained(Engine *self, void *c) {
  (void)c;
  return PyLong_FromUnsignedLongLong(self->core.ctrl_drained);
}

static PyGetSetDef Engine_getset[] = {
  {"ctrl_drained", (getter)Engine_ctrl_drained, NULL, "control messages close took after the standing receive "
   "was gone (a peer's goodbye crossing this engine's own), so none is left unread", NULL},
  {"rank", (getter)Engine_rank, NULL, "rank", NULL},
  {"staged_made", (getter)Engine_staged_made, NULL, "staged batches of up to 4 messages allocated so far (the "
   "rest were reused from this engine's spares)", NULL},
  {"wakes", (getter)Engine_wakes, NULL, "times a caller woke this engine's sleeping thread (a write(2) each)", NULL},
  {"lingering", (getter)Engine_lingering, NULL, "failed steps already answered whose sends UCX still holds (it "
   "cannot cancel a send): their memory may still be read until the peer takes them or the engine closes", NULL},
  {"no_rcache", (getter)Engine_no_rcache, NULL, "UCX runs without its registration cache (memory events or "
   "RCACHE_ENABLE off in the environment, a ucx.conf or the settings): sends UCX still holds at close are left "
   "to the process's end, not force-closed", NULL},
  {"beats", (getter)Engine_beats, NULL, "rounds of the progress thread's loop so far (a held or blocked thread "
   "makes none; hpccl/gpu/netwatch.py watches them)", NULL},
  {"seq", (getter)Engine_get_seq, (setter)Engine_set_seq, "the communicator's current call number (set by "
   "Python's calls and by NetHot's)", NULL},
  {NULL, NULL, NULL, NULL, NULL}};

PyTypeObject EngineType = {
  PyVarObject_HEAD_INIT(NULL, 0)
  .tp_name = "hpccl._netengine.Engine",
  .tp_basicsize = sizeof(Engine),
  .tp_flags = Py_TPFLAGS_DEFAULT,
  .tp_doc = "Engine(rank, size, config): a UCP worker and its progress thread.",
  .tp_methods = Engine_methods,
  .tp_getset = Engine_getset,
  .tp_init = (initproc)Engine_init,
  .tp_new = PyType_GenericNew,
  .tp_dealloc = (destructor)Engine_dealloc,
};
