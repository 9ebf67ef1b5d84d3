/* The compiled path of small host collectives across nodes (one rank per node, every peer behind the
   network engine): the same job as _hotcore.c on a node, over the engine's tagged messages.

   Python costs tens of microseconds per call in validation, scheduling, one Op per message and the
   waiter's polling, more than a small message's trip over the wire. Here one C call checks the buffers,
   lays out the call's whole schedule as rounds of sends and receives, and runs it: each round is one
   engine batch whose tags come from the same per-peer sequence numbers as Python's messages (so calls on
   either path interleave), progressed from the caller's thread; a round that ends may reduce what it
   received. The schedules mirror hpccl/algorithms/tree.py (recursive doubling, binomial broadcast and
   reduce, with the same operand order), so results are bitwise those of the Python path.

   A round that outlasts a short wait returns 1 ("pending"): Python's Waiter then keeps calling
   resume(), with its timeout, abort and dead-peer checks. A failed round raises the exception that
   on_error(code, peer, message) builds. Anything this path does not take returns -1 before any state
   changes, decided from the collective, dtype, count, op and root alone, which agree across ranks.

   The Python type NetHot; it hands its rounds to the engine (_netcore.h) as batches of its own. */
#include "_netpy.h"
#include "_dtype.h"
#include "_lathist.h"

#include <stdlib.h>
#include <string.h>
#include <structmember.h>

enum { NK_AR, NK_AG, NK_BC, NK_RS, NK_BAR, NK_RED, NK_A2A, NK_KINDS };  /* hotpath.KINDS order */
enum { P_NONE = 0, P_REDUCE = 1 };  /* what a round does once its messages are done */
#define NH_ROUNDS 80

typedef struct { int kind, peer; char *buf; size_t len; } nh_msg;
typedef struct { int first, nmsgs, post; } nh_round;

typedef struct {
  PyObject_HEAD
  Engine *eng;
  PyObject *on_error;        /* (code, peer, message) -> the exception to raise */
  int rank, n;
  Py_ssize_t cap, reduce_cap;
  long spin;                 /* resumes that wait briefly (the waiter's spin), as the engine's Ops do */
  long blocks;
  char *tmp, *accbuf;        /* incoming data to reduce; a non-root's partial reduction */
  int leaked;                /* a round UCX never ended still owns tmp/accbuf: never free them */
  int failed;                /* the round failed with messages still in flight: only cancel() goes on */
  /* the call in progress */
  int busy, kind, op, dt, esize, root;
  Py_ssize_t nbytes;
  Py_buffer send, recv;
  int have_send, have_recv;
  char *out, *acc;
  nh_round rounds[NH_ROUNDS];
  nh_msg *msgs;
  int nrounds, nmsgs, cur;
  batch_t *b;
  double t0;
  /* per entry (0: a front door, 1: the validated path; ``validated`` is set for the next call by the latter)
     and collective: completed calls, bytes, seconds, and with ``latency`` (metrics) each call's time */
  int via, validated, latency;
  long long n_calls[2][NK_KINDS], n_bytes[2][NK_KINDS];
  double n_secs[2][NK_KINDS];
  long long hist[2][NK_KINDS][LAT_BUCKETS];
} NetHot;

#define NH_SHORT_S 2e-5   /* a resume within the waiter's spin */
#define NH_LONG_S 4e-3    /* afterwards (primitives.BLOCK_S): the waiter's checks run between */

static void nh_release(NetHot *h) {
  if (h->have_send) PyBuffer_Release(&h->send);
  if (h->have_recv) PyBuffer_Release(&h->recv);
  h->have_send = h->have_recv = 0;
  h->busy = 0;
}

static void nh_round_open(NetHot *h, int post) {
  nh_round *r = &h->rounds[h->nrounds];
  r->first = h->nmsgs, r->nmsgs = 0, r->post = post;
}
static void nh_msg_add(NetHot *h, int kind, int peer, char *buf, size_t len) {
  nh_msg *m = &h->msgs[h->nmsgs++];
  m->kind = kind, m->peer = peer, m->buf = buf, m->len = len;
  h->rounds[h->nrounds].nmsgs++;
}
static void nh_round_close(NetHot *h) { h->nrounds++; }

/* tree.rd_all_reduce: ranks past the largest power of two fold into a partner first and back last */
static void plan_all_reduce(NetHot *h) {
  int n = h->n, r = h->rank;
  size_t len = (size_t)h->nbytes;
  int pof2 = 1;
  while (pof2 * 2 <= n) pof2 *= 2;
  int rem = n - pof2;
  if (r >= pof2) {
    nh_round_open(h, P_NONE);
    nh_msg_add(h, K_SEND, r - pof2, h->out, len);
    nh_msg_add(h, K_RECV, r - pof2, h->out, len);  /* posted first by the engine; the result comes last */
    nh_round_close(h);
    return;
  }
  if (r < rem) {
    nh_round_open(h, P_REDUCE);
    nh_msg_add(h, K_RECV, r + pof2, h->tmp, len);
    nh_round_close(h);
  }
  for (int mask = 1; mask < pof2; mask <<= 1) {
    nh_round_open(h, P_REDUCE);
    nh_msg_add(h, K_SEND, r ^ mask, h->out, len);
    nh_msg_add(h, K_RECV, r ^ mask, h->tmp, len);
    nh_round_close(h);
  }
  if (r < rem) {
    nh_round_open(h, P_NONE);
    nh_msg_add(h, K_SEND, r + pof2, h->out, len);
    nh_round_close(h);
  }
}

/* tree.broadcast: receive once from the parent, then send to every child (largest subtree first) */
static void plan_broadcast(NetHot *h) {
  int n = h->n, v = (h->rank - h->root + n) % n, mask = 1;
  size_t len = (size_t)h->nbytes;
  for (; mask < n; mask <<= 1) {
    if (v & mask) {
      nh_round_open(h, P_NONE);
      nh_msg_add(h, K_RECV, (v - mask + h->root) % n, h->out, len);
      nh_round_close(h);
      break;
    }
  }
  nh_round_open(h, P_NONE);
  for (mask >>= 1; mask > 0; mask >>= 1)
    if (v + mask < n) nh_msg_add(h, K_SEND, (v + mask + h->root) % n, h->out, len);
  if (h->rounds[h->nrounds].nmsgs) nh_round_close(h);
}

/* tree.reduce: in round k, ranks with bit k set (relative to root) send their partial and stop */
static void plan_reduce(NetHot *h) {
  int n = h->n, v = (h->rank - h->root + n) % n;
  size_t len = (size_t)h->nbytes;
  for (int mask = 1; mask < n; mask <<= 1) {
    if (v & mask) {
      nh_round_open(h, P_NONE);
      nh_msg_add(h, K_SEND, (v - mask + h->root) % n, h->acc, len);
      nh_round_close(h);
      return;
    }
    if (v + mask < n) {
      nh_round_open(h, P_REDUCE);
      nh_msg_add(h, K_RECV, (v + mask + h->root) % n, h->tmp, len);
      nh_round_close(h);
    }
  }
}

/* every block straight to every peer: one round (small messages: latency is the cost) */
static void plan_all_gather(NetHot *h) {
  size_t len = (size_t)h->nbytes;
  nh_round_open(h, P_NONE);
  for (int p = 0; p < h->n; p++) {
    if (p == h->rank) continue;
    nh_msg_add(h, K_RECV, p, h->out + (size_t)p * len, len);
    nh_msg_add(h, K_SEND, p, h->out + (size_t)h->rank * len, len);
  }
  nh_round_close(h);
}

/* dissemination: round k, a byte to rank + 2^k and from rank - 2^k */
static void plan_barrier(NetHot *h) {
  for (int d = 1; d < h->n; d <<= 1) {
    nh_round_open(h, P_NONE);
    nh_msg_add(h, K_RECV, (h->rank - d + h->n) % h->n, h->tmp, 1);
    nh_msg_add(h, K_SEND, (h->rank + d) % h->n, h->accbuf, 1);
    nh_round_close(h);
  }
}

/* submit round ``cur`` as one batch; tags from the per-peer sequence numbers, in call order */
static int nh_post(NetHot *h) {
  nh_round *rd = &h->rounds[h->cur];
  batch_t *b = batch_new(rd->nmsgs, BK_OP);
  if (!b) { PyErr_NoMemory(); return -1; }
  engine_t *e = &h->eng->core;
  for (int i = 0; i < rd->nmsgs; i++) {
    nh_msg *m = &h->msgs[rd->first + i];
    op_t *o = &b->ops[i];
    o->kind = m->kind, o->peer = m->peer, o->buf = m->buf, o->len = m->len;
    o->tag = eager_tag(e, m->kind, m->peer);
  }
  submit_to(e, b, 1, 0);
  engine_try_step(e);  /* posted now; a round that completes at once (a small send) has ended */
  h->b = b;
  return 0;
}

static const char *const NH_NAMES[NK_KINDS] = {"all_reduce", "all_gather", "broadcast", "reduce_scatter",
                                                "barrier", "reduce", "all_to_all"};

static int nh_fail(NetHot *h, int ecode, int epeer, const char *err) {
  /* a lost or aborting peer is named with the call by the communicator; other failures name it here */
  char msg[400];
  if (ecode == E_PEER || ecode == E_ABORT)
    snprintf(msg, sizeof msg, "%s", err);
  else
    snprintf(msg, sizeof msg, "%s #%lld: %s", NH_NAMES[h->kind], h->eng->seq, err);
  PyObject *exc = PyObject_CallFunction(h->on_error, "iis", ecode, epeer, msg);
  if (exc) {
    PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
    Py_DECREF(exc);
  }
  return -2;
}

/* A round that has failed while some of its messages are still in flight (a send to a peer that stopped
   receiving cannot be cancelled): raise now, keep the round and the buffers until cancel(). */
static int nh_failed_early(NetHot *h, batch_t *b) {
  int ecode, epeer = -1;
  char err[256];
  /* 0 too while the batch is being progressed: look at the next resume */
  if (!engine_batch_error(&h->eng->core, b, &ecode, &epeer, err)) return 0;
  h->failed = 1;
  return nh_fail(h, ecode, epeer, err);
}

/* Drive the call in progress: 0 done, 1 still waiting on a peer, -2 an exception is set. */
static int nh_advance(NetHot *h, double seconds) {
  if (h->failed) {
    PyErr_SetString(PyExc_RuntimeError, "hpccl network hot path: the call failed; cancel() it");
    return -2;
  }
  for (;;) {
    if (h->b) {
      batch_t *b = h->b;
      if (!batch_wait(h->eng, b, seconds)) return nh_failed_early(h, b) ? -2 : 1;
      int st = atomic_load_explicit(&b->state, memory_order_acquire);
      h->b = NULL;
      if (st == B_FAILED) {
        int rc = nh_fail(h, b->ecode, b->epeer, b->err);
        batch_unref(b);
        nh_release(h);
        return rc;
      }
      batch_unref(b);
      if (h->rounds[h->cur].post == P_REDUCE) {
        char *src[2] = {NULL, h->tmp};
        reduce_block(h->acc, src, 2, h->nbytes / h->esize, h->dt, h->op);
      }
      h->cur++;
    }
    if (h->cur == h->nrounds) {
      if (h->op == OP_AVG && (h->kind == NK_AR || (h->kind == NK_RED && h->rank == h->root)))
        avg_scale(h->out, h->nbytes / h->esize, h->dt, h->n);
      double dt = now_s() - h->t0;
      h->n_calls[h->via][h->kind] += 1;
      h->n_bytes[h->via][h->kind] += h->nbytes;
      h->n_secs[h->via][h->kind] += dt;
      if (h->latency) h->hist[h->via][h->kind][lat_bucket(dt)] += 1;
      nh_release(h);
      return 0;
    }
    if (nh_post(h) < 0) { nh_release(h); return -2; }
  }
}

/* Acquire the buffers, plan and start call ``kind``; -1 (nothing changed) when this path does not take it. */
static int nh_start(NetHot *h, int kind, PyObject *send, PyObject *recv, int op, int root, long long seq) {
  int via = h->validated;
  h->validated = 0;
  if (h->busy) {
    PyErr_SetString(PyExc_RuntimeError, "hpccl network hot path: a call is still in progress");
    return -2;
  }
  if (atomic_load(&h->eng->core.closed) || !h->eng->core.started) return -1;
  h->eng->seq = seq;  /* answers to "which call are you in?" carry it */
  h->kind = kind, h->op = op, h->root = root, h->dt = T_U8, h->esize = 1, h->nbytes = 0;
  h->nrounds = h->nmsgs = h->cur = 0;
  if (kind != NK_BAR) {
    int root_only = (kind == NK_BC || kind == NK_RED) && h->rank == root;
    int writes_in_place = kind == NK_AR || (kind == NK_BC && !root_only) || (kind == NK_RED && root_only);
    int send_flags = PyBUF_FORMAT | PyBUF_C_CONTIGUOUS;
    if (recv == Py_None && writes_in_place) send_flags |= PyBUF_WRITABLE;
    if (PyObject_GetBuffer(send, &h->send, send_flags) < 0) goto decline;
    h->have_send = 1;
    if (recv != Py_None) {
      if (PyObject_GetBuffer(recv, &h->recv, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) goto decline;
      h->have_recv = 1;
    }
    int dt = dtype_of(&h->send);
    if (dt < 0) goto decline;
    h->dt = dt, h->esize = (int)h->send.itemsize, h->nbytes = h->send.len;
    if (h->nbytes == 0 || h->nbytes > h->cap) goto decline;
    int reduces = kind == NK_AR || kind == NK_RED;
    if (reduces && h->nbytes > h->reduce_cap) goto decline;
    if (h->have_recv && dtype_of(&h->recv) != dt) goto decline;
    if (reduces && (op < 0 || op > OP_AVG)) goto decline;
    if (reduces && op == OP_AVG && dt != T_F32 && dt != T_F64) goto decline;
    Py_ssize_t want = kind == NK_AG ? h->nbytes * h->n : h->nbytes;
    if (kind == NK_AG && !h->have_recv) goto decline;
    if (h->have_recv && h->recv.len != want) goto decline;
    h->out = h->have_recv ? (char *)h->recv.buf : (char *)h->send.buf;
    /* a receive buffer that overlaps the send buffer (other than exactly in place) goes through Python */
    if (h->have_recv && h->out != (char *)h->send.buf) {
      char *s0 = (char *)h->send.buf, *s1 = s0 + h->send.len, *r0 = h->out, *r1 = r0 + h->recv.len;
      int inplace_ag = kind == NK_AG && s0 == r0 + (size_t)h->rank * (size_t)h->nbytes;
      if (s0 < r1 && r0 < s1 && !inplace_ag) goto decline;
    }
  }
  size_t len = (size_t)h->nbytes;
  switch (kind) {
    case NK_AR:
      h->acc = h->out;
      if (h->out != (char *)h->send.buf) memcpy(h->out, h->send.buf, len);
      plan_all_reduce(h);
      break;
    case NK_RED:
      h->acc = h->rank == root ? h->out : h->accbuf;
      if (h->acc != (char *)h->send.buf) memcpy(h->acc, h->send.buf, len);
      plan_reduce(h);
      break;
    case NK_BC:
      if (h->rank == root && h->out != (char *)h->send.buf) memcpy(h->out, h->send.buf, len);
      plan_broadcast(h);
      break;
    case NK_AG:
      if (h->out + (size_t)h->rank * len != (char *)h->send.buf) memcpy(h->out + (size_t)h->rank * len, h->send.buf, len);
      plan_all_gather(h);
      break;
    default:
      plan_barrier(h);
  }
  h->busy = 1;
  h->blocks = 0;
  h->via = via;
  h->t0 = now_s();
  return nh_advance(h, NH_LONG_S);  /* no waiter yet: its checks begin when this returns pending */
decline:
  PyErr_Clear();
  nh_release(h);
  return -1;
}

static PyObject *nh_ret(int rc) { return rc == -2 ? NULL : PyLong_FromLong(rc); }

static PyObject *NetHot_all_reduce(NetHot *h, PyObject *args) {
  PyObject *s, *r; int op; long long seq;
  if (!PyArg_ParseTuple(args, "OOiL", &s, &r, &op, &seq)) return NULL;
  return nh_ret(nh_start(h, NK_AR, s, r, op, -1, seq));
}
static PyObject *NetHot_reduce(NetHot *h, PyObject *args) {
  PyObject *s, *r; int root, op; long long seq;
  if (!PyArg_ParseTuple(args, "OOiiL", &s, &r, &root, &op, &seq)) return NULL;
  if (root < 0 || root >= h->n) return PyLong_FromLong(-1);
  return nh_ret(nh_start(h, NK_RED, s, r, op, root, seq));
}
static PyObject *NetHot_all_gather(NetHot *h, PyObject *args) {
  PyObject *s, *r; long long seq;
  if (!PyArg_ParseTuple(args, "OOL", &s, &r, &seq)) return NULL;
  return nh_ret(nh_start(h, NK_AG, s, r, 0, -1, seq));
}
static PyObject *NetHot_broadcast(NetHot *h, PyObject *args) {
  PyObject *s, *r; int root; long long seq;
  if (!PyArg_ParseTuple(args, "OOiL", &s, &r, &root, &seq)) return NULL;
  if (root < 0 || root >= h->n) return PyLong_FromLong(-1);
  return nh_ret(nh_start(h, NK_BC, s, r, 0, root, seq));
}
static PyObject *NetHot_barrier(NetHot *h, PyObject *args) {
  long long seq;
  if (!PyArg_ParseTuple(args, "L", &seq)) return NULL;
  return nh_ret(nh_start(h, NK_BAR, Py_None, Py_None, 0, -1, seq));
}

static PyObject *NetHot_resume(NetHot *h, PyObject *unused) {
  (void)unused;
  if (!h->busy) Py_RETURN_TRUE;
  int rc = nh_advance(h, h->blocks++ < h->spin ? NH_SHORT_S : NH_LONG_S);
  if (rc == -2) return NULL;
  return PyBool_FromLong(rc == 0);
}

static PyObject *NetHot_waiting(NetHot *h, PyObject *unused) {
  /* the peers of the round in progress */
  (void)unused;
  PyObject *out = PyList_New(0);
  if (out == NULL || !h->busy || h->cur >= h->nrounds) return out;
  nh_round *rd = &h->rounds[h->cur];
  for (int i = 0; i < rd->nmsgs; i++) {
    PyObject *v = PyLong_FromLong(h->msgs[rd->first + i].peer);
    int dup = v ? PySequence_Contains(out, v) : -1;
    if (v == NULL || dup < 0 || (!dup && PyList_Append(out, v) < 0)) { Py_XDECREF(v); Py_DECREF(out); return NULL; }
    Py_DECREF(v);
  }
  return out;
}

/* Drop the call in progress (after a failure): cancel its round and give UCX a moment to let go of the
   buffers; if it does not (a send to a peer that stopped reading cannot be cancelled), leave them to it:
   the buffers stay exported and the scratch is never freed, and the error is raised without waiting. */
static void nh_cancel(NetHot *h) {
  batch_t *b = h->b;
  if (b) {
    Engine *e = h->eng;
    Py_BEGIN_ALLOW_THREADS
    engine_cancel(&e->core, b);  /* a round still queued is made active, so it can be cancelled */
    Py_END_ALLOW_THREADS
    if (!batch_wait(e, b, 0.02)) {
      h->leaked = 1;
      h->have_send = h->have_recv = 0;  /* UCX may still write there: keep the exports */
    }
    batch_unref(b);
    h->b = NULL;
  }
  h->failed = 0;
  nh_release(h);
}

static PyObject *NetHot_cancel(NetHot *h, PyObject *unused) {
  (void)unused;
  nh_cancel(h);
  Py_RETURN_NONE;
}

static PyObject *NetHot_declined(NetHot *h, PyObject *args) {
  (void)h; (void)args;
  return PyLong_FromLong(-1);  /* reduce_scatter and all_to_all run in Python across nodes */
}

static PyObject *NetHot_counts(NetHot *h, PyObject *unused) {
  (void)unused;
  PyObject *out = PyList_New(NK_KINDS);
  if (out == NULL) return NULL;
  for (int k = 0; k < NK_KINDS; k++) {
    PyObject *t = Py_BuildValue("(LLd)", h->n_calls[0][k] + h->n_calls[1][k], h->n_bytes[0][k] + h->n_bytes[1][k],
                                h->n_secs[0][k] + h->n_secs[1][k]);
    if (t == NULL) { Py_DECREF(out); return NULL; }
    PyList_SET_ITEM(out, k, t);
  }
  return out;
}

static PyObject *NetHot_detail(NetHot *h, PyObject *unused) {
  (void)unused;
  PyObject *out = PyList_New(0);
  if (out == NULL) return NULL;
  for (int v = 0; v < 2; v++)
    for (int k = 0; k < NK_KINDS; k++) {
      if (!h->n_calls[v][k]) continue;
      PyObject *hist = lat_tuple(h->hist[v][k]);
      PyObject *t = hist ? Py_BuildValue("(iiLLdN)", k, v, h->n_calls[v][k], h->n_bytes[v][k], h->n_secs[v][k], hist)
                         : NULL;
      if (t == NULL || PyList_Append(out, t) < 0) { Py_XDECREF(t); Py_DECREF(out); return NULL; }
      Py_DECREF(t);
    }
  return out;
}

static PyObject *NetHot_busy(NetHot *h, void *unused) {
  (void)unused;
  return PyBool_FromLong(h->busy);
}

static int NetHot_init(NetHot *h, PyObject *args, PyObject *kw) {
  (void)kw;
  PyObject *eng, *on_error;
  Py_ssize_t cap, reduce_cap;
  long spin;
  if (!PyArg_ParseTuple(args, "O!nnlO", &EngineType, &eng, &cap, &reduce_cap, &spin, &on_error)) return -1;
  if (cap < 1 || !PyCallable_Check(on_error) || h->eng) {
    PyErr_SetString(PyExc_ValueError, "NetHot(engine, cap >= 1, reduce_cap, spin, on_error callable), once");
    return -1;
  }
  Engine *e = (Engine *)eng;
  h->tmp = malloc((size_t)cap);
  h->accbuf = malloc((size_t)cap);
  h->msgs = malloc(sizeof(nh_msg) * (size_t)(2 * e->core.size + 2 * NH_ROUNDS));
  if (!h->tmp || !h->accbuf || !h->msgs) { PyErr_NoMemory(); return -1; }
  memset(h->accbuf, 0, (size_t)cap);
  Py_INCREF(eng);
  Py_INCREF(on_error);
  h->eng = e, h->on_error = on_error;
  h->rank = e->core.rank, h->n = e->core.size, h->cap = cap, h->reduce_cap = reduce_cap < cap ? reduce_cap : cap;
  h->spin = spin;
  return 0;
}

static void NetHot_dealloc(NetHot *h) {
  if (h->eng) nh_cancel(h);
  if (!h->leaked) { free(h->tmp); free(h->accbuf); }
  free(h->msgs);
  Py_XDECREF(h->on_error);
  Py_XDECREF(h->eng);
  Py_TYPE(h)->tp_free((PyObject *)h);
}

static PyObject *NetHot_calls(NetHot *h, void *unused) {
  (void)unused;
  long long c = 0;
  for (int k = 0; k < NK_KINDS; k++) c += h->n_calls[0][k] + h->n_calls[1][k];
  return PyLong_FromLongLong(c);
}

static PyMethodDef NetHot_methods[] = {
  {"all_reduce", (PyCFunction)NetHot_all_reduce, METH_VARARGS, "(send, recv|None, op, seq) -> 0 done, 1 pending, -1 declined"},
  {"reduce", (PyCFunction)NetHot_reduce, METH_VARARGS, "(send, recv|None, root, op, seq) -> as all_reduce"},
  {"all_gather", (PyCFunction)NetHot_all_gather, METH_VARARGS, "(send, recv, seq) -> as all_reduce"},
  {"broadcast", (PyCFunction)NetHot_broadcast, METH_VARARGS, "(buf, recv|None, root, seq) -> as all_reduce"},
  {"barrier", (PyCFunction)NetHot_barrier, METH_VARARGS, "(seq) -> 0 done, 1 pending"},
  {"reduce_scatter", (PyCFunction)NetHot_declined, METH_VARARGS, "-1: not on this path"},
  {"all_to_all", (PyCFunction)NetHot_declined, METH_VARARGS, "-1: not on this path"},
  {"resume", (PyCFunction)NetHot_resume, METH_NOARGS, "Drive the pending call; True once it is done"},
  {"waiting", (PyCFunction)NetHot_waiting, METH_NOARGS, "Ranks the pending round exchanges with"},
  {"cancel", (PyCFunction)NetHot_cancel, METH_NOARGS, "Drop the pending call (after a failure)"},
  {"counts", (PyCFunction)NetHot_counts, METH_NOARGS, "[(calls, bytes, seconds)] per collective (hotpath.KINDS order)"},
  {"detail", (PyCFunction)NetHot_detail, METH_NOARGS,
   "[(KINDS index, validated, calls, bytes, seconds, latency buckets)]: counts by entry, for metrics"},
  {NULL, NULL, 0, NULL}};

static PyGetSetDef NetHot_getset[] = {{"calls", (getter)NetHot_calls, NULL, "calls made on this path", NULL},
                                      {"busy", (getter)NetHot_busy, NULL, "a call is in progress (pending)", NULL},
                                      {NULL, NULL, NULL, NULL, NULL}};

static PyMemberDef NetHot_members[] = {
  {"validated", T_INT, offsetof(NetHot, validated), 0,
   "1: the next call comes from the validated path (counted apart from the front door's); cleared by it"},
  {"latency", T_INT, offsetof(NetHot, latency), 0, "1: count each call's time in log2 buckets (HPCCL_METRICS)"},
  {NULL, 0, 0, 0, NULL}};

PyTypeObject NetHotType = {
  PyVarObject_HEAD_INIT(NULL, 0)
  .tp_name = "hpccl._netengine.NetHot",
  .tp_basicsize = sizeof(NetHot),
  .tp_flags = Py_TPFLAGS_DEFAULT,
  .tp_doc = "NetHot(engine, cap, reduce_cap, spin, on_error): small host collectives across nodes in C.",
  .tp_new = PyType_GenericNew,
  .tp_init = (initproc)NetHot_init,
  .tp_dealloc = (destructor)NetHot_dealloc,
  .tp_methods = NetHot_methods,
  .tp_getset = NetHot_getset,
  .tp_members = NetHot_members,
};
