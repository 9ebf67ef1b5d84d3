/* A repeated GPU network call replayed from C (hpccl/gpu/netreplay.py records it).

   The first call of a key (collective, buffers, dtype, op, root, stream) runs in Python and is recorded as
   the stream work it enqueued: copies to and from pinned staging memory, kernel launches, and its network
   steps (write the ready token, hand the step's messages to the engine, wait for the done word). A later
   call of the same key enqueues that list here in one C call: no Python per step, per message or per
   driver call. The steps go to the engine exactly as Python hands them (same messages, same order, tags
   from the same per-peer sequence numbers at submission), so a rank that replays and a peer that runs the
   Python path for the same call always match; tokens and done values come from the state Python's
   StagedNet shares (netstage.NetState), so replays and Python steps interleave on one counter. A step may
   span lanes (engines of their own, each with a done word and counter): one token, a batch per lane.

   run(stream, label) returns 0 (enqueued), 1 (the stream is capturing: nothing enqueued, Python captures
   it) or 2 (the engine is closed, aborting or a step failed, or a network kernel gave up waiting for the
   engine (the stuck word): nothing enqueued, Python raises the error);
   a driver call that fails raises RuntimeError naming it.

   The Python type NetProgram (made by Engine.program(), _netengine.c); the engines are _netcore.h's. */
#include "_netpy.h"

#include <stdlib.h>

typedef int (*cu_dtoh_t)(void *, uint64_t, size_t, void *);
typedef int (*cu_htod_t)(uint64_t, const void *, size_t, void *);
typedef int (*cu_dtod_t)(uint64_t, uint64_t, size_t, void *);
typedef int (*cu_value_t)(void *, uint64_t, uint32_t, unsigned);
typedef int (*cu_launch_t)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *,
                           void **, void **);
typedef int (*cu_capturing_t)(void *, int *);
typedef int (*cu_record_t)(void *, void *);
typedef int (*cu_wait_event_t)(void *, void *, unsigned);

/* A_KTOKEN: the next token, written by a kernel (not the stream); A_KLAUNCH: a fused or piped step's kernel,
   whose last argument is this replay's token | the done value of one post << 32; A_VSYNC: lanes [0, n) take
   the done value furthest ahead among them (a piped step numbers its pieces from one value on every lane);
   A_PIPE: a piped step's pieces, one token each (the kernel writes them), handed to each lane's engine as one
   BK_PIPE batch it makes the pieces' batches of (the caller's cost does not grow with the pieces); it counts
   as a post whose done value is lane 0's first piece's */
enum { A_DTOH = 0, A_HTOD = 1, A_DTOD = 2, A_POST = 3, A_WAIT = 4, A_LAUNCH = 5, A_TOKEN = 6, A_KTOKEN = 7,
       A_KLAUNCH = 8, A_VSYNC = 9, A_PIPE = 10 };
enum { F_DTOH, F_HTOD, F_DTOD, F_WRITE, F_WAIT, F_LAUNCH, F_CAPTURING, F_RECORD, F_WAIT_EVENT, F_COUNT };
#define NR_ARGS 10
#define NR_NO_STREAM UINT64_MAX
#define NR_LANES 8

/* shared with Python (netstage.NetState, a ctypes Structure): keep the layouts equal */
typedef struct {
  uint32_t tok, pad0;       /* ready tokens written (eager steps) */
  uint64_t last_stream;     /* the stream of the latest call, NR_NO_STREAM before the first */
  int32_t joinable;         /* the join event was recorded after the latest call */
  int32_t pad1;
  uint32_t val[NR_LANES];   /* per lane: done values handed out */
} net_state;

typedef struct {
  int kind;
  uint64_t dst, src, n;      /* copies */
  int first, nops, lane;     /* A_POST: messages [first, first + nops) of the program's list, to one lane */
  int post;                  /* A_WAIT: which post (in order) the stream waits for */
  int nargs;                 /* A_LAUNCH, A_KLAUNCH: arguments of the kernel */
  int pk, ks, kr, speer, rpeer;  /* A_PIPE: pieces, sends and receives among them, peers (-1: none) */
  uint64_t sbase, rbase, ps, pr, ns, nr;
  void *func;                /* A_LAUNCH */
  unsigned grid, block;
  uint64_t args[NR_ARGS];
  void *params[NR_ARGS];
} nr_act;

typedef struct {
  PyObject_HEAD
  Engine *eng[NR_LANES];     /* lane j's engine (lane 0: the communicator's) */
  uint64_t done_h[NR_LANES], done_d[NR_LANES];
  int nlanes;
  PyObject *keep;            /* what the recorded addresses point into (staging, scratch): alive with us */
  net_state *st;
  void *fn[F_COUNT];
  uint64_t ready_h, ready_d, gate;
  uint64_t stuck_h;          /* the eager steps' stuck word (hp_net_wait gave up), 0: none */
  void *join_ev;
  double timeout;
  int nacts, nposts, nmsgs;
  nr_act *acts;
  op_t *msgs;                /* kind, peer, buf, len of every message, in post order */
  uint32_t *vals;            /* this replay's done value of each post */
  int *post_lane;            /* each post's lane */
  long long runs;
} NetProgram;

static void NetProgram_dealloc(NetProgram *p) {
  free(p->acts);
  free(p->msgs);
  free(p->vals);
  free(p->post_lane);
  Py_XDECREF(p->keep);
  for (int j = 0; j < p->nlanes; j++) Py_XDECREF((PyObject *)p->eng[j]);
  Py_TYPE(p)->tp_free((PyObject *)p);
}

static int nr_parse_act(NetProgram *p, PyObject *t, nr_act *a, int *msg_at, int *posts, int *tokens) {
  if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) < 2) goto bad;
  a->kind = (int)PyLong_AsLong(PyTuple_GET_ITEM(t, 0));
  switch (a->kind) {
    case A_DTOH: case A_HTOD: case A_DTOD:
      if (!PyArg_ParseTuple(t, "iKKK", &a->kind, &a->dst, &a->src, &a->n)) return -1;
      return 0;
    case A_TOKEN: case A_KTOKEN:
      (*tokens)++;
      return 0;
    case A_VSYNC:
      if (!PyArg_ParseTuple(t, "ii", &a->kind, &a->nops)) return -1;
      if (a->nops < 1 || a->nops > p->nlanes) goto bad;
      return 0;
    case A_PIPE:  /* (A_PIPE, pieces, lanes, send peer, send base, sends, send piece, send bytes, receive ...) */
      if (!PyArg_ParseTuple(t, "iiiiKiKKiKiKK", &a->kind, &a->pk, &a->nops, &a->speer, &a->sbase, &a->ks, &a->ps,
                            &a->ns, &a->rpeer, &a->rbase, &a->kr, &a->pr, &a->nr))
        return -1;
      if (a->pk < 1 || a->nops < 1 || a->nops > p->nlanes || a->ks < 0 || a->kr < 0 || a->ks > a->pk ||
          a->kr > a->pk || (a->ks != a->pk && a->kr != a->pk) || (a->ks && (a->ps < 1 || a->speer < 0)) ||
          (a->kr && (a->pr < 1 || a->rpeer < 0)))
        goto bad;
      if ((a->ks && check_peer(p->eng[0], a->speer) < 0) || (a->kr && check_peer(p->eng[0], a->rpeer) < 0)) return -1;
      p->post_lane[(*posts)++] = 0;
      (*tokens)++;
      return 0;
    case A_POST:
      if (!PyArg_ParseTuple(t, "iii", &a->kind, &a->nops, &a->lane)) return -1;
      if (a->nops < 0 || *msg_at + a->nops > p->nmsgs || a->lane < 0 || a->lane >= p->nlanes || !*tokens) goto bad;
      a->first = *msg_at;
      *msg_at += a->nops;
      p->post_lane[(*posts)++] = a->lane;
      return 0;
    case A_WAIT:
      if (!PyArg_ParseTuple(t, "ii", &a->kind, &a->post)) return -1;
      if (a->post < 0 || a->post >= *posts) goto bad;  /* a wait follows the post it waits for */
      return 0;
    case A_LAUNCH: case A_KLAUNCH: {
      unsigned long long func;
      PyObject *args;
      if (a->kind == A_LAUNCH) {
        if (!PyArg_ParseTuple(t, "iKIIO!", &a->kind, &func, &a->grid, &a->block, &PyTuple_Type, &args)) return -1;
      } else {
        if (!PyArg_ParseTuple(t, "iKIIO!i", &a->kind, &func, &a->grid, &a->block, &PyTuple_Type, &args, &a->post))
          return -1;
        if (a->post < 0 || a->post >= *posts || PyTuple_GET_SIZE(args) < 1) goto bad;
      }
      Py_ssize_t na = PyTuple_GET_SIZE(args);
      if (na > NR_ARGS) goto bad;
      a->nargs = (int)na;
      a->func = (void *)(uintptr_t)func;
      for (Py_ssize_t i = 0; i < na; i++) {
        a->args[i] = PyLong_AsUnsignedLongLongMask(PyTuple_GET_ITEM(args, i));
        if (PyErr_Occurred()) return -1;
        a->params[i] = &a->args[i];  /* little-endian: a 4-byte argument reads the slot's low half */
      }
      return 0;
    }
    default:
      goto bad;
  }
bad:
  if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "malformed recorded action");
  return -1;
}

/* program(acts, msgs, fns, (ready_h, ready_d, stuck_h), lanes, state_addr, join_event, timeout, gate, keep)
   -> NetProgram
   fns: the driver entry points in F_* order; lanes: ((engine, done_h, done_d), ...), lane 0 first */
PyObject *Engine_program(Engine *self, PyObject *args) {
  PyObject *acts, *msgs, *fns, *lanes, *keep;
  unsigned long long rh, rd, sh = 0, state, join, gate;
  double timeout;
  if (!PyArg_ParseTuple(args, "O!O!O!(KKK)O!KKdKO", &PyList_Type, &acts, &PyList_Type, &msgs, &PyTuple_Type, &fns,
                        &rh, &rd, &sh, &PyTuple_Type, &lanes, &state, &join, &timeout, &gate, &keep))
    return NULL;
  if (check_open(self) < 0) return NULL;
  Py_ssize_t nl = PyTuple_GET_SIZE(lanes);
  if (PyTuple_GET_SIZE(fns) != F_COUNT || !state || nl < 1 || nl > NR_LANES) {
    PyErr_SetString(PyExc_ValueError, "program() needs 9 driver entry points, the shared state and 1-8 lanes");
    return NULL;
  }
  NetProgram *p = PyObject_New(NetProgram, &NetProgramType);
  if (!p) return NULL;
  p->acts = NULL; p->msgs = NULL; p->vals = NULL; p->post_lane = NULL; p->keep = NULL; p->runs = 0;
  p->nlanes = 0;
  for (Py_ssize_t j = 0; j < nl; j++) {
    PyObject *e;
    unsigned long long dh, dd;
    /* a lane is an engine like self (Engine is not subclassable) */
    if (!PyArg_ParseTuple(PyTuple_GET_ITEM(lanes, j), "O!KK", Py_TYPE(self), &e, &dh, &dd)) {
      Py_DECREF(p);
      return NULL;
    }
    Py_INCREF(e);
    p->eng[p->nlanes] = (Engine *)e;
    p->done_h[p->nlanes] = dh;
    p->done_d[p->nlanes] = dd;
    p->nlanes++;
  }
  Py_INCREF(keep);
  p->keep = keep;
  p->st = (net_state *)(uintptr_t)state;
  p->ready_h = rh; p->ready_d = rd; p->gate = gate; p->stuck_h = sh;
  p->join_ev = (void *)(uintptr_t)join;
  p->timeout = timeout;
  for (int i = 0; i < F_COUNT; i++) {
    p->fn[i] = (void *)(uintptr_t)PyLong_AsUnsignedLongLongMask(PyTuple_GET_ITEM(fns, i));
    if (PyErr_Occurred() || !p->fn[i]) {
      if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "a driver entry point is missing");
      Py_DECREF(p);
      return NULL;
    }
  }
  p->nacts = (int)PyList_GET_SIZE(acts);
  p->nmsgs = (int)PyList_GET_SIZE(msgs);
  p->acts = calloc(p->nacts > 0 ? (size_t)p->nacts : 1, sizeof(nr_act));
  p->msgs = calloc(p->nmsgs > 0 ? (size_t)p->nmsgs : 1, sizeof(op_t));
  p->vals = calloc(p->nacts > 0 ? (size_t)p->nacts : 1, sizeof(uint32_t));
  p->post_lane = calloc(p->nacts > 0 ? (size_t)p->nacts : 1, sizeof(int));
  if (!p->acts || !p->msgs || !p->vals || !p->post_lane) { Py_DECREF(p); return PyErr_NoMemory(); }
  for (int i = 0; i < p->nmsgs; i++) {
    PyObject *t = PyList_GET_ITEM(msgs, i);
    int kind, peer;
    unsigned long long ptr, len;
    if (!PyArg_ParseTuple(t, "iiKK", &kind, &peer, &ptr, &len) || check_peer(self, peer) < 0 ||
        (kind != K_SEND && kind != K_RECV)) {
      if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "message kind must be 0 (send) or 1 (recv)");
      Py_DECREF(p);
      return NULL;
    }
    p->msgs[i].kind = kind; p->msgs[i].peer = peer;
    p->msgs[i].buf = (char *)(uintptr_t)ptr; p->msgs[i].len = (size_t)len;
  }
  int at = 0, posts = 0, tokens = 0;
  for (int i = 0; i < p->nacts; i++) {
    if (nr_parse_act(p, PyList_GET_ITEM(acts, i), &p->acts[i], &at, &posts, &tokens) < 0) { Py_DECREF(p); return NULL; }
  }
  if (at != p->nmsgs) {
    PyErr_SetString(PyExc_ValueError, "the posts do not cover the recorded messages");
    Py_DECREF(p);
    return NULL;
  }
  p->nposts = posts;
  return (PyObject *)p;
}

/* one lane's batches made by a replay and not yet handed to its engine: handed over together (one lock, one
   store the engine sees) before the replay's next driver call and at its end, not one hand-over per piece */
typedef struct {
  batch_t *head[NR_LANES], *tail[NR_LANES];
  unsigned handed;  /* the lanes handed anything during this replay: only their engines are woken */
} nr_pending;

/* make one lane's batch of a recorded step as Engine_staged does, with this replay's token and done value */
static int nr_post(NetProgram *p, nr_pending *q, nr_act *a, const char *label, uint32_t tok, uint32_t val) {
  batch_t *b = batch_staged(&p->eng[a->lane]->core, a->nops);
  if (!b) return -1;
  for (int i = 0; i < a->nops; i++) {
    op_t *o = &b->ops[i], *m = &p->msgs[a->first + i];
    o->kind = m->kind; o->peer = m->peer; o->buf = m->buf; o->len = m->len;
  }
  stage_batch(&p->eng[a->lane]->core, b, p->ready_h, tok, p->gate, p->done_h[a->lane], val, p->timeout, label);
  b->qnext = NULL;
  if (q->tail[a->lane]) q->tail[a->lane]->qnext = b; else q->head[a->lane] = b;
  q->tail[a->lane] = b;
  return 0;
}

/* a piped step's pieces (A_PIPE): pk tokens from st->tok + 1 on, and to each lane j a BK_PIPE batch of its
   pieces j, j + L, ..., numbered on from the lane's done value, with the lane's tag sequence numbers for
   its sends and receives reserved; lane 0's first done value back in *v0 */
static int nr_pipe(NetProgram *p, nr_pending *q, nr_act *a, const char *label, uint32_t *v0) {
  net_state *st = p->st;
  uint32_t t0 = st->tok + 1;
  st->tok += (uint32_t)a->pk;
  int L = a->nops;
  for (int j = 0; j < L && j < a->pk; j++) {
    engine_t *e = &p->eng[j]->core;
    batch_t *d = batch_new(0, BK_PIPE);
    if (!d) return -1;
    int cnt = (a->pk - j + L - 1) / L;
    int sends = a->ks > j ? (a->ks - j + L - 1) / L : 0, recvs = a->kr > j ? (a->kr - j + L - 1) / L : 0;
    d->pipe.k = cnt; d->pipe.lane = j; d->pipe.lanes = L;
    d->pipe.ks = a->ks; d->pipe.kr = a->kr; d->pipe.speer = a->speer; d->pipe.rpeer = a->rpeer;
    d->pipe.sbase = (char *)(uintptr_t)a->sbase; d->pipe.rbase = (char *)(uintptr_t)a->rbase;
    d->pipe.ps = a->ps; d->pipe.pr = a->pr; d->pipe.ns = a->ns; d->pipe.nr = a->nr;
    d->pipe.t0 = t0;
    d->pipe.v0 = st->val[j] + 1;
    st->val[j] += (uint32_t)cnt;
    if (j == 0) *v0 = d->pipe.v0;
    if (sends) { d->pipe.sseq = e->send_seq[a->speer]; e->send_seq[a->speer] += (uint64_t)sends; }
    if (recvs) { d->pipe.rseq = e->recv_seq[a->rpeer]; e->recv_seq[a->rpeer] += (uint64_t)recvs; }
    d->ready = (volatile uint32_t *)(uintptr_t)p->ready_h;
    d->gate = p->gate ? (volatile uint32_t *)(uintptr_t)p->gate : NULL;
    d->done = (volatile uint32_t *)(uintptr_t)p->done_h[j];
    d->timeout = p->timeout;
    snprintf(d->label, sizeof d->label, "%s", label);
    d->qnext = NULL;
    if (q->tail[j]) q->tail[j]->qnext = d; else q->head[j] = d;
    q->tail[j] = d;
  }
  return 0;
}

/* hand each lane's pending batches to its engine; ``wake``: then rouse, once, each engine this replay handed
   anything that sleeps (not a write(2) per batch, and none for a lane that got nothing: a small call on one
   lane left the idle lanes' engines asleep, and woke each at every call) */
static void nr_flush(NetProgram *p, nr_pending *q, int wake) {
  for (int j = 0; j < p->nlanes; j++) {
    if (q->head[j]) {
      submit_chain(&p->eng[j]->core, q->head[j], q->tail[j], 0);
      q->handed |= 1u << j;
    }
    q->head[j] = q->tail[j] = NULL;
  }
  if (wake)
    for (int j = 0; j < p->nlanes; j++)
      if (q->handed & (1u << j)) wake_if_sleeping(&p->eng[j]->core);
}

static int nr_fail(const char *what, int rc) {
  PyErr_Format(PyExc_RuntimeError, "%s failed (CUresult %d) while replaying a network call", what, rc);
  return -1;
}

int nr_run(PyObject *prog, unsigned long long stream, const char *label) {
  NetProgram *p = (NetProgram *)prog;
  void *s = (void *)(uintptr_t)stream;
  int cap = 0;
  if (((cu_capturing_t)p->fn[F_CAPTURING])(s, &cap) != 0 || cap) return 1;
  for (int j = 0; j < p->nlanes; j++) {
    if (!engine_usable(&p->eng[j]->core)) return 2;
  }
  if (p->stuck_h && *(volatile uint32_t *)(uintptr_t)p->stuck_h) return 2;
  net_state *st = p->st;
  nr_pending q = {{NULL}, {NULL}, 0};
  const char *what = NULL;  /* the driver call that failed, NULL: out of memory */
  int rc = 0;
  if (st->last_stream != NR_NO_STREAM && st->last_stream != stream && st->joinable) {
    if ((rc = ((cu_wait_event_t)p->fn[F_WAIT_EVENT])(s, p->join_ev, 0))) return nr_fail("cuStreamWaitEvent", rc);
  }
  st->last_stream = stream;
  int k = 0;
  uint32_t tok = st->tok;
  for (int i = 0; i < p->nacts; i++) {
    nr_act *a = &p->acts[i];
    if (a->kind != A_POST && a->kind != A_KTOKEN && a->kind != A_VSYNC && a->kind != A_PIPE) nr_flush(p, &q, 0);
    switch (a->kind) {
      case A_DTOH:
        if ((rc = ((cu_dtoh_t)p->fn[F_DTOH])((void *)(uintptr_t)a->dst, a->src, a->n, s))) what = "cuMemcpyDtoHAsync";
        break;
      case A_HTOD:
        if ((rc = ((cu_htod_t)p->fn[F_HTOD])(a->dst, (const void *)(uintptr_t)a->src, a->n, s)))
          what = "cuMemcpyHtoDAsync";
        break;
      case A_DTOD:
        if ((rc = ((cu_dtod_t)p->fn[F_DTOD])(a->dst, a->src, a->n, s))) what = "cuMemcpyDtoDAsync";
        break;
      case A_TOKEN:
        tok = ++st->tok;
        if ((rc = ((cu_value_t)p->fn[F_WRITE])(s, p->ready_d, tok, 0))) what = "cuStreamWriteValue32";
        break;
      case A_POST: {
        uint32_t val = ++st->val[a->lane];
        if (nr_post(p, &q, a, label, tok, val) < 0) goto fail;
        p->vals[k++] = val;
        break;
      }
      case A_WAIT:
        if ((rc = ((cu_value_t)p->fn[F_WAIT])(s, p->done_d[p->post_lane[a->post]], p->vals[a->post], 0)))  /* GEQ */
          what = "cuStreamWaitValue32";
        break;
      case A_KTOKEN:
        tok = ++st->tok;
        break;
      case A_PIPE: {
        uint32_t v0 = 0;
        if (nr_pipe(p, &q, a, label, &v0) < 0) goto fail;
        tok = st->tok;
        p->vals[k++] = v0;
        break;
      }
      case A_VSYNC: {
        uint32_t m = st->val[0];
        for (int j = 1; j < a->nops; j++)
          if ((int32_t)(st->val[j] - m) > 0) m = st->val[j];
        for (int j = 0; j < a->nops; j++) st->val[j] = m;
        break;
      }
      case A_KLAUNCH:
        a->args[a->nargs - 1] = (uint64_t)tok | ((uint64_t)p->vals[a->post] << 32);
        /* fall through */
      case A_LAUNCH:
        if ((rc = ((cu_launch_t)p->fn[F_LAUNCH])(a->func, a->grid, 1, 1, a->block, 1, 1, 0, s, a->params, NULL)))
          what = "cuLaunchKernel";
        break;
    }
    if (rc) goto fail;
  }
  nr_flush(p, &q, 1);
  if ((rc = ((cu_record_t)p->fn[F_RECORD])(p->join_ev, s))) return nr_fail("cuEventRecord", rc);
  st->joinable = 1;
  p->runs++;
  return 0;
fail:
  nr_flush(p, &q, 1);  /* what was made is the engine's, as it would be had the call not failed */
  if (!what) {
    PyErr_NoMemory();
    return -1;
  }
  return nr_fail(what, rc);
}

static PyObject *NetProgram_run(NetProgram *p, PyObject *args) {
  unsigned long long stream;
  const char *label;
  if (!PyArg_ParseTuple(args, "Ks", &stream, &label)) return NULL;
  int rc = nr_run((PyObject *)p, stream, label);
  return rc < 0 ? NULL : PyLong_FromLong(rc);
}

static PyObject *NetProgram_runs(NetProgram *p, void *unused) {
  (void)unused;
  return PyLong_FromLongLong(p->runs);
}

static PyObject *NetProgram_shape(NetProgram *p, void *unused) {
  (void)unused;
  return Py_BuildValue("(iiii)", p->nacts, p->nposts, p->nmsgs, p->nlanes);
}

static PyMethodDef NetProgram_methods[] = {
  {"run", (PyCFunction)NetProgram_run, METH_VARARGS,
   "run(stream, label) -> 0 enqueued, 1 capturing (nothing done), 2 engine failed or closed (nothing done)"},
  {NULL, NULL, 0, NULL}};

static PyGetSetDef NetProgram_getset[] = {
  {"runs", (getter)NetProgram_runs, NULL, "replays enqueued", NULL},
  {"shape", (getter)NetProgram_shape, NULL, "(actions, lane batches, messages, lanes)", NULL},
  {NULL, NULL, NULL, NULL, NULL}};

PyTypeObject NetProgramType = {
  PyVarObject_HEAD_INIT(NULL, 0)
  .tp_name = "hpccl._netengine.NetProgram",
  .tp_basicsize = sizeof(NetProgram),
  .tp_flags = Py_TPFLAGS_DEFAULT,
  .tp_doc = "A recorded GPU network call, replayed by run() (made by Engine.program()).",
  .tp_methods = NetProgram_methods,
  .tp_getset = NetProgram_getset,
  .tp_dealloc = (destructor)NetProgram_dealloc,
};
