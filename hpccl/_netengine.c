/* hpccl's network engine: one UCP worker per communicator, driven by a progress thread that never takes
   the GIL and never calls CUDA.

   Work arrives as batches of tagged sends and receives of host memory:
     * from Python on the caller's thread (host collectives, and GPU network steps staged through pinned
       host memory): tags come from per-peer sequence numbers assigned at submission, in call order;
     * from a captured CUDA graph's replays of a network step ("templates"): the graph writes the
       template's arm word (cuStreamWriteValue32) once the staged data is in place and this engine, which
       polls the arm words of the templates it holds, posts the step again; tags come from the template's
       id and its replay count, a tag space of its own, so replays and eager calls never match each
       other's messages whatever the interleaving. No host function runs in the graph.
   A batch may wait for a word in host memory to reach a token before any of its messages is posted (the
   GPU writes it with cuStreamWriteValue32 once the staged data is in place and the previous step's
   received data has been consumed), and writes a word when it completes (the
   GPU waits on it with cuStreamWaitValue32). Eager batches with a done word complete in submission order,
   so that word is a monotonic counter.

   Failures: endpoints to other nodes use UCX's peer-failure mode; a peer whose connection breaks fails
   every batch that waits for it (receives from it are cancelled), and is reported by dead(). A batch
   older than its timeout is cancelled and named with the ranks it still waits for. abort() fails
   everything in flight. A failed batch still writes its done word, so no stream stays blocked.

   tag = sender rank << 40 | 40 bits: eager (bit 39 clear) bit 38 set for the user's point-to-point messages
   (what probe() and a receive from any source match) | a per-pair sequence number (38 bits); graph (bit 39
   set) template number of the pair (16 bits: the templates with a message from sender to receiver, counted
   alike at both ends in capture order) | replay (16 bits) | index among the template's messages to that
   peer (7 bits);
   all 40 bits set is the control tag (abort, survey). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>
#include <ucp/api/ucp.h>

#define RANK_SHIFT 40
#define SEQ_MASK ((1ULL << RANK_SHIFT) - 1)
#define GRAPH_BIT (1ULL << 39)
#define P2P_BIT (1ULL << 38)   /* eager point-to-point messages: what a receive from any source may match */
#define EAGER_MASK (P2P_BIT - 1)
#define CTRL_TAG SEQ_MASK
#define MAX_TEMPLATES 0xFFFF
#define MAX_PER_PEER 128
#define CTRL_WORDS 3
#define ERR_NET_WORD 5u /* cuda/hpccl_device.cuh HPCCL_ERR_NET: the node error word of a failed gated step */
#define CTRL_RING 256

enum { K_SEND = 0, K_RECV = 1 };
enum { B_NEW = 0, B_ACTIVE = 1, B_DONE = 2, B_FAILED = 3 };
enum { BK_OP = 0, BK_STAGED = 1, BK_TEMPLATE = 2 };
enum { E_NONE = 0, E_PEER = 1, E_TIMEOUT = 2, E_ABORT = 3, E_SIZE = 4, E_OTHER = 5, E_CLOSED = 6 };

static inline double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct batch batch_t;

typedef struct {
  int kind, peer;
  char *buf;
  size_t len, got;
  uint64_t tag;
  void *req;
  int posted, done;
  ucs_status_t st;
  batch_t *b;
} op_t;

struct batch {
  batch_t *qnext;            /* submission queue */
  atomic_int refs;           /* the engine's (while queued or active) and the owner's */
  atomic_int state;
  int bkind, nops, left, unsent;
  op_t *ops;
  volatile uint32_t *ready; uint32_t ready_tok;  /* sends wait for *ready >= ready_tok (wrap-safe) */
  volatile uint32_t *gate;   /* nonzero when the token comes: the staged data is not whole, send nothing;
                                set (ERR_NET_WORD) when this batch fails, before its done word */
  volatile uint32_t *done; uint32_t done_val;    /* written when the batch ends, ok or not */
  int ordered;               /* an eager batch with a done word: done words written in FIFO order */
  double t0, timeout;        /* timeout 0: none (the caller's waiter has one) */
  int ecode, epeer;
  char err[256];
  char label[96];
  int64_t ctrl[CTRL_WORDS];  /* a control message's payload (the batch owns it) */
  /* templates */
  struct engine *eng;
  _Atomic uint32_t replays;
  volatile uint32_t *arm;    /* set to 1 by the graph at each replay; the engine clears it and reposts */
  batch_t *anext;            /* the queue of templates to hold (qlock) */
  int finished;              /* engine thread: every op ended */
  int isctrl;                /* a control message: an abort does not cancel it (it may carry the abort) */
};

typedef struct engine {
  PyObject_HEAD
  int rank, size;
  ucp_context_h ctx;
  ucp_worker_h worker;
  ucp_ep_h *eps;
  int *remote;
  int efd;                   /* the worker's event fd (wakeup feature), -1 without */
  int wake;                  /* eventfd: submissions wake a sleeping engine */
  pthread_t thread;
  int started;
  atomic_int stop, sleeping, aborting;
  pthread_mutex_t qlock;
  pthread_mutex_t wlock;      /* the worker and the engine-thread state: held by whoever progresses */
  atomic_int driving;        /* callers spinning on progress themselves */
  atomic_int nactive_pub;
  batch_t *qhead, *qtail;
  batch_t *aqhead;           /* templates to hold (arm words to poll), taken by the engine thread (qlock) */
  /* engine thread only (wlock): the templates whose arm words are polled */
  batch_t **armed; int narmed, caparmed;
  /* engine thread only */
  batch_t **active; int nactive, capactive;
  batch_t **fifo; int fhead, ftail, capfifo;
  double next_check;
  /* caller thread only */
  uint64_t *send_seq, *recv_seq;
  uint32_t *tpl_send, *tpl_recv;  /* per peer: templates with a message to / from it so far */
  /* completion signalling */
  pthread_mutex_t dlock;
  pthread_cond_t dcond;
  atomic_int waiters;
  /* peers */
  atomic_int *dead;          /* per peer: 0, or the UCS status that failed its endpoint (negated) */
  atomic_int dead_rank;      /* first dead peer, -1 */
  char dead_why[160];
  atomic_int new_dead;
  /* the first failure of an engine-owned batch (GPU steps): raised by the communicator's next call */
  pthread_mutex_t elock;
  int first_ecode, first_epeer;
  char first_err[400];
  /* control messages */
  int64_t ctrl_in[CTRL_WORDS];
  void *ctrl_req;
  int ctrl_ready;            /* a message arrived and waits to be copied out */
  int64_t ctrl_ring[CTRL_RING][CTRL_WORDS];
  atomic_int ctrl_head, ctrl_tail;
  atomic_int aborted_by;
  atomic_int closed;
  uint64_t batches_done, bytes_sent, bytes_recv;
  long long seq;             /* the communicator's current call (control answers carry it); GIL-guarded */
} Engine;

static PyObject *HpErr;  /* _netengine.EngineError: (code, peer, message) */


/* ----- batches ---------------------------------------------------------------------------------------- */
static batch_t *batch_new(int nops, int bkind) {
  batch_t *b = calloc(1, sizeof(batch_t));
  if (!b) return NULL;
  b->ops = calloc(nops > 0 ? (size_t)nops : 1, sizeof(op_t));
  if (!b->ops) { free(b); return NULL; }
  b->nops = nops;
  b->bkind = bkind;
  b->epeer = -1;
  atomic_init(&b->refs, 1);
  atomic_init(&b->state, B_NEW);
  for (int i = 0; i < nops; i++) b->ops[i].b = b;
  return b;
}

static void batch_unref(batch_t *b) {
  if (atomic_fetch_sub(&b->refs, 1) == 1) {
    free(b->ops);
    free(b);
  }
}

static void batch_fail(batch_t *b, int code, int peer, const char *fmt, ...) {
  if (b->ecode) return;
  b->ecode = code;
  b->epeer = peer;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(b->err, sizeof b->err, fmt, ap);
  va_end(ap);
}

/* queue a batch for the engine; ``wake``: rouse a sleeping engine thread (not needed when the caller is
   about to drive progress itself, as batch_wait does, which hands back to the thread before it sleeps) */
static void submit_to(Engine *e, batch_t *b, int take_ref, int wake) {
  if (take_ref) atomic_fetch_add(&b->refs, 1);
  b->qnext = NULL;
  pthread_mutex_lock(&e->qlock);
  if (e->qtail) e->qtail->qnext = b; else e->qhead = b;
  e->qtail = b;
  pthread_mutex_unlock(&e->qlock);
  if (wake && atomic_load(&e->sleeping)) {
    uint64_t one = 1;
    ssize_t w = write(e->wake, &one, sizeof one);
    (void)w;
  }
}

static void submit(Engine *e, batch_t *b, int take_ref) { submit_to(e, b, take_ref, 1); }

/* the tag of the next eager message of ``kind`` to or from ``peer``: per-pair sequence numbers taken in
   submission order, so both ends of a pair number their messages alike (caller's thread only) */
static uint64_t eager_tag(Engine *e, int kind, int peer) {
  return kind == K_SEND ? ((uint64_t)e->rank << RANK_SHIFT) | (e->send_seq[peer]++ & EAGER_MASK)
                        : ((uint64_t)peer << RANK_SHIFT) | (e->recv_seq[peer]++ & EAGER_MASK);
}

/* hand b (its ops filled in) to the engine as an eager GPU network step: tags now, in call order; posted
   once *ready reaches tok (gate: nonzero then, nothing is sent); *done = val when it ends, in FIFO order */
static void submit_staged(Engine *e, batch_t *b, uint64_t ready, uint32_t tok, uint64_t gate, uint64_t done,
                          uint32_t val, double timeout, const char *label) {
  for (int i = 0; i < b->nops; i++) b->ops[i].tag = eager_tag(e, b->ops[i].kind, b->ops[i].peer);
  b->ready = ready ? (volatile uint32_t *)(uintptr_t)ready : NULL;
  b->ready_tok = tok;
  b->gate = gate ? (volatile uint32_t *)(uintptr_t)gate : NULL;
  b->done = done ? (volatile uint32_t *)(uintptr_t)done : NULL;
  b->done_val = val;
  b->ordered = b->done != NULL;
  b->timeout = timeout;
  snprintf(b->label, sizeof b->label, "%s", label);
  submit(e, b, 1);
  batch_unref(b);  /* the engine's reference is the only one */
}

/* ----- UCX callbacks (engine thread, inside ucp_worker_progress) ------------------------------------- */
static void op_end(op_t *o, ucs_status_t st, size_t got) {
  if (o->done) return;
  o->done = 1;
  o->st = st;
  o->got = got;
  batch_t *b = o->b;
  if (st != UCS_OK && !b->ecode) {
    Engine *e = b->eng;
    if (st == UCS_ERR_CANCELED && b->ecode == 0 && e && atomic_load(&e->aborting))
      batch_fail(b, E_ABORT, -1, "the communicator was aborted");
    else if (st == UCS_ERR_MESSAGE_TRUNCATED)
      batch_fail(b, E_SIZE, o->peer, "rank %d sent more bytes than this rank's receive of %zu bytes (sizes "
                 "or dtypes differ across ranks)", o->peer, o->len);
    else
      batch_fail(b, E_PEER, o->peer, "UCX %s with rank %d failed: %s", o->kind == K_SEND ? "send" : "receive",
                 o->peer, ucs_status_string(st));
  } else if (st == UCS_OK && o->kind == K_RECV && got != o->len && !b->ecode) {
    batch_fail(b, E_SIZE, o->peer, "rank %d sent %zu bytes where this rank receives %zu (sizes or dtypes "
               "differ across ranks)", o->peer, got, o->len);
  }
  if (--b->left == 0) b->finished = 1;
}

static void send_cb(void *req, ucs_status_t st, void *ud) {
  (void)req;
  op_end((op_t *)ud, st, ((op_t *)ud)->len);
}

static void recv_cb(void *req, ucs_status_t st, const ucp_tag_recv_info_t *info, void *ud) {
  (void)req;
  op_end((op_t *)ud, st, st == UCS_OK ? info->length : 0);
}

static void ctrl_cb(void *req, ucs_status_t st, const ucp_tag_recv_info_t *info, void *ud) {
  (void)req; (void)info;
  Engine *e = ud;
  e->ctrl_ready = st == UCS_OK ? 1 : -1;
}

static void ep_err_cb(void *arg, ucp_ep_h ep, ucs_status_t st) {
  Engine *e = arg;
  for (int p = 0; p < e->size; p++) {
    if (e->eps[p] == ep) {
      int expected = 0;
      if (atomic_compare_exchange_strong(&e->dead[p], &expected, st < 0 ? -(int)st : 1)) {
        pthread_mutex_lock(&e->elock);
        if (atomic_load(&e->dead_rank) < 0) {
          snprintf(e->dead_why, sizeof e->dead_why, "UCX: connection to rank %d failed (%s)", p,
                   ucs_status_string(st));
          atomic_store(&e->dead_rank, p);
        }
        pthread_mutex_unlock(&e->elock);
        atomic_store(&e->new_dead, 1);
      }
      return;
    }
  }
}

/* ----- engine thread --------------------------------------------------------------------------------- */
static void post_op(Engine *e, op_t *o) {
  ucp_request_param_t prm;
  ucp_tag_recv_info_t info = {0, 0};
  memset(&prm, 0, sizeof prm);
  prm.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_MEMORY_TYPE;
  prm.user_data = o;
  prm.memory_type = UCS_MEMORY_TYPE_HOST;
  o->posted = 1;
  if (atomic_load(&e->dead[o->peer])) {
    op_end(o, UCS_ERR_CONNECTION_RESET, 0);
    return;
  }
  ucs_status_ptr_t r;
  if (o->kind == K_SEND) {
    prm.cb.send = send_cb;
    r = ucp_tag_send_nbx(e->eps[o->peer], o->buf, o->len, o->tag, &prm);
    e->bytes_sent += o->len;
  } else {
    prm.cb.recv = recv_cb;
    prm.op_attr_mask |= UCP_OP_ATTR_FIELD_RECV_INFO;
    prm.recv_info.tag_info = &info;  /* a message already here completes at once: its length is read here */
    r = ucp_tag_recv_nbx(e->worker, o->buf, o->len, o->tag, ~0ULL, &prm);
  }
  if (r == NULL) {
    op_end(o, UCS_OK, o->kind == K_RECV ? info.length : o->len);
  } else if (UCS_PTR_IS_ERR(r)) {
    op_end(o, UCS_PTR_STATUS(r), 0);
  } else {
    o->req = r;
  }
}

static void post_all(Engine *e, batch_t *b) {
  if (b->gate && __atomic_load_n(b->gate, __ATOMIC_ACQUIRE) != 0) {
    /* the node's step before this one failed (a local rank died, aborted or timed out): its output, now
       staged, is not the reduction the peers expect, so none of it goes out */
    batch_fail(b, E_ABORT, -1, "a rank of this node failed before this step's data was complete; nothing was sent");
    for (int k = 0; k < b->nops; k++)
      if (!b->ops[k].posted) { b->ops[k].posted = 1; op_end(&b->ops[k], UCS_ERR_CANCELED, 0); }
    b->unsent = 0;
    return;
  }
  for (int k = 0; k < b->nops; k++)  /* receives first: posted before any data can arrive */
    if (b->ops[k].kind == K_RECV && !b->ops[k].posted) post_op(e, &b->ops[k]);
  for (int k = 0; k < b->nops; k++)
    if (b->ops[k].kind == K_SEND && !b->ops[k].posted) post_op(e, &b->ops[k]);
  b->unsent = 0;
}

static int ready_reached(batch_t *b) {
  if (!b->ready) return 1;
  uint32_t v = __atomic_load_n(b->ready, __ATOMIC_ACQUIRE);
  return (int32_t)(v - b->ready_tok) >= 0;
}

static void grow(void ***arr, int *cap, int need) {
  if (need <= *cap) return;
  int c = *cap ? *cap * 2 : 64;
  while (c < need) c *= 2;
  void **n = realloc(*arr, (size_t)c * sizeof(void *));
  if (!n) abort();  /* out of memory for a pointer list: nothing sensible to do */
  *arr = n;
  *cap = c;
}

static void activate(Engine *e, batch_t *b) {
  b->eng = e;
  b->left = b->nops;
  b->finished = b->nops == 0;
  b->unsent = 0;
  if (!b->t0) b->t0 = now_s();
  atomic_store(&b->state, B_ACTIVE);
  grow((void ***)&e->active, &e->capactive, e->nactive + 1);
  e->active[e->nactive++] = b;
  if (b->ordered) {
    grow((void ***)&e->fifo, &e->capfifo, e->ftail - e->fhead + 1);
    if (e->ftail == e->capfifo) {  /* compact */
      memmove(e->fifo, e->fifo + e->fhead, (size_t)(e->ftail - e->fhead) * sizeof(void *));
      e->ftail -= e->fhead;
      e->fhead = 0;
      grow((void ***)&e->fifo, &e->capfifo, e->ftail + 1);
    }
    e->fifo[e->ftail++] = b;
  }
  if (atomic_load(&e->aborting) && !b->isctrl) {
    batch_fail(b, E_ABORT, atomic_load(&e->aborted_by), "the communicator was aborted");
    for (int i = 0; i < b->nops; i++) { b->ops[i].posted = 1; op_end(&b->ops[i], UCS_ERR_CANCELED, 0); }
    return;
  }
  /* a gated batch waits whole: its receive buffers are staging memory the GPU may still be reading
     for the step before (the GPU writes the token after that) */
  if (!ready_reached(b)) { b->unsent = b->nops; return; }
  post_all(e, b);
}

static void end_batch(Engine *e, batch_t *b) {
  int failed = b->ecode != 0;
  if (failed && b->bkind != BK_OP) {
    pthread_mutex_lock(&e->elock);
    if (!e->first_ecode) {
      e->first_ecode = b->ecode;
      e->first_epeer = b->epeer;
      snprintf(e->first_err, sizeof e->first_err, "%s: %s", b->label[0] ? b->label : "network step", b->err);
    }
    pthread_mutex_unlock(&e->elock);
  }
  for (int i = 0; i < b->nops; i++) b->ops[i].req = NULL;
  e->batches_done++;
}

/* failed: b->ecode read before the batch's state was published (a template's repost may reset it after) */
static void write_done(batch_t *b, int failed) {
  if (failed && b->gate) {
    /* the gate is this rank's node error word: set before the stream goes on, so the node's kernels after
       this step write nothing and its local peers never read what this step left as data */
    uint32_t zero = 0;
    __atomic_compare_exchange_n((uint32_t *)b->gate, &zero, (uint32_t)ERR_NET_WORD, 0, __ATOMIC_RELEASE,
                                __ATOMIC_RELAXED);
  }
  if (b->done) __atomic_store_n(b->done, b->done_val, __ATOMIC_RELEASE);
}

static int finalize(Engine *e) {
  int n = 0;
  for (int i = 0; i < e->nactive;) {
    batch_t *b = e->active[i];
    if (!b->finished) { i++; continue; }
    for (int k = 0; k < b->nops; k++)
      if (b->ops[k].req) { ucp_request_free(b->ops[k].req); b->ops[k].req = NULL; }
    for (int k = 0; k < b->nops; k++)
      if (b->ops[k].kind == K_RECV && b->ops[k].st == UCS_OK) e->bytes_recv += b->ops[k].got;
    e->active[i] = e->active[--e->nactive];
    end_batch(e, b);
    n++;
    if (!b->ordered) {
      int failed = b->ecode != 0;
      atomic_store(&b->state, failed ? B_FAILED : B_DONE);
      write_done(b, failed);
      if (b->bkind != BK_TEMPLATE) batch_unref(b);
    } else {
      b->finished = 2;  /* waits for its turn in the FIFO */
    }
  }
  while (e->fhead < e->ftail && e->fifo[e->fhead]->finished == 2) {
    batch_t *b = e->fifo[e->fhead++];
    int failed = b->ecode != 0;
    atomic_store(&b->state, failed ? B_FAILED : B_DONE);
    write_done(b, failed);
    batch_unref(b);
  }
  if (n && atomic_load(&e->waiters)) {
    pthread_mutex_lock(&e->dlock);
    pthread_cond_broadcast(&e->dcond);
    pthread_mutex_unlock(&e->dlock);
  }
  return n;
}

static void cancel_batch(Engine *e, batch_t *b, int only_peer) {
  for (int k = 0; k < b->nops; k++) {
    op_t *o = &b->ops[k];
    if (o->done || (only_peer >= 0 && o->peer != only_peer)) continue;
    if (!o->posted) { o->posted = 1; op_end(o, UCS_ERR_CANCELED, 0); b->unsent--; }
    else if (o->req) ucp_request_cancel(e->worker, o->req);
  }
}

static void peer_failures(Engine *e) {
  if (!atomic_exchange(&e->new_dead, 0)) return;
  for (int i = 0; i < e->nactive; i++) {
    batch_t *b = e->active[i];
    for (int k = 0; k < b->nops; k++) {
      op_t *o = &b->ops[k];
      int d = atomic_load(&e->dead[o->peer]);
      if (!d || o->done) continue;
      pthread_mutex_lock(&e->elock);
      batch_fail(b, E_PEER, o->peer, "rank %d is gone: %s", o->peer, e->dead_why);
      pthread_mutex_unlock(&e->elock);
      cancel_batch(e, b, o->peer);
    }
  }
}

static void timeouts(Engine *e, double t) {
  for (int i = 0; i < e->nactive; i++) {
    batch_t *b = e->active[i];
    if (b->finished || b->timeout <= 0 || t - b->t0 < b->timeout || b->ecode) continue;
    char who[128]; int len = 0; int last = -1;
    who[0] = 0;
    for (int k = 0; k < b->nops && len < (int)sizeof who - 12; k++) {
      op_t *o = &b->ops[k];
      if (o->done || o->peer == last) continue;
      len += snprintf(who + len, sizeof who - (size_t)len, "%s%d", len ? ", " : "", o->peer);
      last = o->peer;
    }
    batch_fail(b, E_TIMEOUT, -1, "timed out after %.1fs waiting for rank(s) [%s] (HPCCL_TIMEOUT)", b->timeout, who);
    cancel_batch(e, b, -1);
  }
}

static void abort_all(Engine *e) {
  for (int i = 0; i < e->nactive; i++) {
    batch_t *b = e->active[i];
    if (b->finished || b->isctrl) continue;  /* control messages (the abort itself) still go out */
    int by = atomic_load(&e->aborted_by);
    if (by >= 0 && by != e->rank)
      batch_fail(b, E_ABORT, by, "rank %d failed and aborted the communicator", by);
    else
      batch_fail(b, E_ABORT, -1, "the communicator was aborted");
    cancel_batch(e, b, -1);
  }
}

static void post_ctrl_recv(Engine *e) {
  ucp_request_param_t prm;
  memset(&prm, 0, sizeof prm);
  prm.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_MEMORY_TYPE;
  prm.cb.recv = ctrl_cb;
  prm.user_data = e;
  prm.memory_type = UCS_MEMORY_TYPE_HOST;
  e->ctrl_ready = 0;
  ucs_status_ptr_t r = ucp_tag_recv_nbx(e->worker, e->ctrl_in, sizeof e->ctrl_in, CTRL_TAG, SEQ_MASK, &prm);
  if (r == NULL) e->ctrl_ready = 1;
  else if (UCS_PTR_IS_ERR(r)) { e->ctrl_req = NULL; e->ctrl_ready = -2; }
  else e->ctrl_req = r;
}

static int ctrl_progress(Engine *e) {
  int n = 0;
  while (e->ctrl_ready) {
    if (e->ctrl_ready == -2) return n;  /* could not post: control messages are off */
    if (e->ctrl_ready == 1) {
      int t = atomic_load(&e->ctrl_tail);
      if (t - atomic_load(&e->ctrl_head) < CTRL_RING) {
        memcpy(e->ctrl_ring[t % CTRL_RING], e->ctrl_in, sizeof e->ctrl_in);
        atomic_store(&e->ctrl_tail, t + 1);
      }
      if (e->ctrl_in[0] == 1) {  /* ABORT: fail what waits, at once */
        int none = -1;
        atomic_compare_exchange_strong(&e->aborted_by, &none, (int)e->ctrl_in[1]);
        atomic_store(&e->aborting, 1);
      }
    }
    if (e->ctrl_req) { ucp_request_free(e->ctrl_req); e->ctrl_req = NULL; }
    post_ctrl_recv(e);
    n++;
  }
  return n;
}

static void grow(void ***arr, int *cap, int need);
static void activate(Engine *e, batch_t *b);

static int drain(Engine *e) {
  pthread_mutex_lock(&e->qlock);
  batch_t *b = e->qhead;
  e->qhead = e->qtail = NULL;
  batch_t *t = e->aqhead;
  e->aqhead = NULL;
  pthread_mutex_unlock(&e->qlock);
  for (; t; t = t->anext) {
    grow((void ***)&e->armed, &e->caparmed, e->narmed + 1);
    e->armed[e->narmed++] = t;
  }
  int n = 0;
  while (b) {
    batch_t *next = b->qnext;
    activate(e, b);
    b = next;
    n++;
  }
  return n;
}

static int gated_sends(Engine *e) {
  int n = 0;
  for (int i = 0; i < e->nactive; i++) {
    batch_t *b = e->active[i];
    if (!b->unsent || !ready_reached(b)) continue;
    post_all(e, b);
    n++;
  }
  return n;
}

/* the next replay of template b: tags of this replay's tag space, ops and error reset, then active */
static void replay(Engine *e, batch_t *b) {
  uint32_t r = atomic_fetch_add(&b->replays, 1);
  for (int i = 0; i < b->nops; i++) {
    op_t *o = &b->ops[i];
    /* sender, template number and index were fixed at capture; the replay count goes in its 16 bits */
    o->tag = (o->tag & ~(0xFFFFULL << 7)) | ((uint64_t)(r & 0xFFFF) << 7);
    o->req = NULL; o->posted = 0; o->done = 0; o->got = 0; o->st = UCS_OK;
  }
  b->ecode = 0; b->epeer = -1; b->err[0] = 0; b->finished = 0; b->t0 = now_s();
  atomic_store(&b->state, B_NEW);
  activate(e, b);
}

/* templates whose arm word a graph replay set (its staged data in place, its done word cleared before):
   clear it and post the step again; an arm word is set only after the previous replay's done word, so a
   template seen armed is never still active */
static int poll_armed(Engine *e) {
  int n = 0;
  for (int i = 0; i < e->narmed; i++) {
    batch_t *b = e->armed[i];
    if (__atomic_load_n(b->arm, __ATOMIC_ACQUIRE) == 0 || atomic_load(&b->state) < B_DONE) continue;
    __atomic_store_n(b->arm, 0, __ATOMIC_RELAXED);
    replay(e, b);
    n++;
  }
  return n;
}

static int has_gated(Engine *e) {
  for (int i = 0; i < e->nactive; i++) if (e->active[i]->unsent) return 1;
  return 0;
}

/* sleep until a socket event (with ``events``), a submission or ``timeout_ms``; called with wlock held,
   returns with it held */
static void sleep_for(Engine *e, int timeout_ms, int events) {
  int efd = events ? e->efd : -1;
  struct pollfd fds[2] = {{e->wake, POLLIN, 0}, {efd, POLLIN, 0}};
  atomic_store(&e->sleeping, 1);
  pthread_mutex_lock(&e->qlock);
  int queued = e->qhead != NULL || e->aqhead != NULL;
  pthread_mutex_unlock(&e->qlock);
  if (!queued && !atomic_load(&e->stop) && (efd < 0 || ucp_worker_arm(e->worker) == UCS_OK)) {
    pthread_mutex_unlock(&e->wlock);
    int r = poll(fds, efd >= 0 ? 2 : 1, timeout_ms);
    if (r > 0 && (fds[0].revents & POLLIN)) {
      uint64_t v;
      ssize_t rd = read(e->wake, &v, sizeof v);
      (void)rd;
    }
    pthread_mutex_lock(&e->wlock);
  }
  atomic_store(&e->sleeping, 0);
}

static void sleep_on(Engine *e, int timeout_ms) { sleep_for(e, timeout_ms, 1); }

/* one round of the engine's work; the caller holds wlock (the engine thread, or a waiting caller) */
static int engine_step(Engine *e) {
  int work = drain(e);
  if (atomic_load(&e->aborting)) abort_all(e);
  peer_failures(e);
  work += gated_sends(e);
  if (e->narmed) work += poll_armed(e);
  work += (int)ucp_worker_progress(e->worker);
  work += ctrl_progress(e);
  work += finalize(e);
  atomic_store(&e->nactive_pub, e->nactive);
  return work;
}

static void *engine_loop(void *arg) {
  Engine *e = arg;
  long idle = 0;
  pthread_mutex_lock(&e->wlock);
  while (!atomic_load(&e->stop)) {
    int work = engine_step(e);
    double t = 0;
    if ((idle & 255) == 0 && (t = now_s()) >= e->next_check) {
      e->next_check = t + 0.005;
      timeouts(e, t);
    }
    if (work) {
      idle = 0;
    } else if (++idle && atomic_load(&e->driving)) {
      /* a waiting caller drives progress itself: stay out of its way, even when data arrives (it wakes
         this thread when it stops driving with work left) */
      sleep_for(e, 1, 0);
      idle = 0;
    } else if (e->nactive == 0) {
      /* idle: sleep until a message or a submission; briefly while graphs may set arm words */
      if (idle > 4000) { sleep_on(e, e->narmed ? 1 : 50); idle = 0; }
    } else if (idle > 20000) {
      /* waiting long for a peer: sleep on the sockets, briefly when a send waits for the GPU's word */
      int gated = has_gated(e);
      sleep_on(e, gated ? 0 : 1);
      idle = 10000;
    }
    /* let a waiting caller take the worker between rounds (it then needs no hand-off) */
    pthread_mutex_unlock(&e->wlock);
    if ((idle & 63) == 63) sched_yield();
    pthread_mutex_lock(&e->wlock);
  }
  pthread_mutex_unlock(&e->wlock);
  return NULL;
}

/* ----- Python: Op (one batch owned by Python) -------------------------------------------------------- */
typedef struct {
  PyObject_HEAD
  Engine *eng;
  batch_t *b;
  Py_buffer view;
  int have_view;
} Op;

static PyTypeObject OpType;

static PyObject *raise_batch(batch_t *b) {
  PyObject *args = Py_BuildValue("(iis)", b->ecode, b->epeer, b->err);
  if (args) { PyErr_SetObject(HpErr, args); Py_DECREF(args); }
  return NULL;
}

static int batch_wait(Engine *e, batch_t *b, double seconds) {
  /* wait (without the GIL) until the batch has ended or ``seconds`` pass; 1 if ended */
  int st = atomic_load_explicit(&b->state, memory_order_acquire);
  if (st >= B_DONE) return 1;
  if (seconds <= 0) return 0;
  int ended = 0;
  Py_BEGIN_ALLOW_THREADS
  double end = now_s() + seconds;
  /* spin, driving the engine's progress from this thread whenever the engine thread is not (a message
     then needs no thread hand-off), for up to about a millisecond */
  atomic_fetch_add(&e->driving, 1);
  double spin_end = now_s() + (seconds < 1e-3 ? seconds : 1e-3);
  for (int i = 0;; i++) {
    if (atomic_load_explicit(&b->state, memory_order_acquire) >= B_DONE) { ended = 1; break; }
    if (pthread_mutex_trylock(&e->wlock) == 0) {
      if (!e->closed && e->started) engine_step(e);
      pthread_mutex_unlock(&e->wlock);
    }
    if ((i & 15) == 15) {
      if (now_s() > spin_end) break;
      sched_yield();
    }
  }
  if (atomic_fetch_sub(&e->driving, 1) == 1 && !ended && end - now_s() > 0 && atomic_load(&e->sleeping)) {
    uint64_t one = 1;  /* this caller goes to sleep: hand progress back to the engine thread at once */
    ssize_t w = write(e->wake, &one, sizeof one);
    (void)w;
  }
  if (!ended) {
    atomic_fetch_add(&e->waiters, 1);
    pthread_mutex_lock(&e->dlock);
    while (atomic_load_explicit(&b->state, memory_order_acquire) < B_DONE) {
      double left = end - now_s();
      if (left <= 0) break;
      if (left > 0.002) left = 0.002;  /* a lost wake-up costs 2 ms at most */
      struct timespec ts;
      clock_gettime(CLOCK_REALTIME, &ts);
      long ns = ts.tv_nsec + (long)(left * 1e9);
      ts.tv_sec += ns / 1000000000L;
      ts.tv_nsec = ns % 1000000000L;
      pthread_cond_timedwait(&e->dcond, &e->dlock, &ts);
    }
    pthread_mutex_unlock(&e->dlock);
    atomic_fetch_sub(&e->waiters, 1);
    ended = atomic_load_explicit(&b->state, memory_order_acquire) >= B_DONE;
  }
  Py_END_ALLOW_THREADS
  return ended;
}

static int op_wait_release(Op *o, double seconds) { return batch_wait(o->eng, o->b, seconds); }

static PyObject *Op_test(Op *self, PyObject *noargs) {
  (void)noargs;
  int st = atomic_load_explicit(&self->b->state, memory_order_acquire);
  if (st == B_DONE) Py_RETURN_TRUE;
  if (st == B_FAILED) return raise_batch(self->b);
  Py_RETURN_FALSE;
}

static PyObject *Op_wait(Op *self, PyObject *args) {
  double seconds;
  if (!PyArg_ParseTuple(args, "d", &seconds)) return NULL;
  if (!op_wait_release(self, seconds)) Py_RETURN_FALSE;
  return Op_test(self, NULL);
}

static PyObject *Op_done(Op *self, PyObject *noargs) {
  (void)noargs;
  return PyBool_FromLong(atomic_load(&self->b->state) >= B_DONE);
}

static void Op_dealloc(Op *self) {
  if (self->b) {
    int st = atomic_load(&self->b->state);
    if (st < B_DONE && self->eng && !self->eng->closed) {
      /* dropped in flight (an exception unwound past it): the buffer must outlive UCX's use of it */
      op_wait_release(self, 1.0);
    }
    if (atomic_load(&self->b->state) >= B_DONE || (self->eng && self->eng->closed)) {
      if (self->have_view) PyBuffer_Release(&self->view);
    }  /* else: leak the view rather than free memory UCX may still write */
    batch_unref(self->b);
  }
  Py_XDECREF(self->eng);
  Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef Op_methods[] = {
  {"test", (PyCFunction)Op_test, METH_NOARGS, "True when done; raises EngineError if it failed."},
  {"wait", (PyCFunction)Op_wait, METH_VARARGS, "wait(seconds): block without the GIL; then as test()."},
  {"ended", (PyCFunction)Op_done, METH_NOARGS, "True when done or failed (never raises)."},
  {NULL, NULL, 0, NULL}};

static PyTypeObject OpType = {
  PyVarObject_HEAD_INIT(NULL, 0)
  .tp_name = "hpccl._netengine.Op",
  .tp_basicsize = sizeof(Op),
  .tp_flags = Py_TPFLAGS_DEFAULT,
  .tp_doc = "One send or receive (or control message) in flight.",
  .tp_methods = Op_methods,
  .tp_dealloc = (destructor)Op_dealloc,
};

/* ----- Python: Template (a captured network step, reposted by each graph replay) --------------------- */
typedef struct {
  PyObject_HEAD
  Engine *eng;
  batch_t *b;
} Template;

static PyTypeObject TemplateType;

/* stop polling t's arm word (its memory is about to be freed): out of the queue or the engine's list, under
   the locks the engine thread takes them with; the engine's reference dropped */
static void template_retire(Template *t) {
  Engine *e = t->eng;
  batch_t *b = t->b;
  if (!e || !b || !b->arm) return;
  int held = 0;
  Py_BEGIN_ALLOW_THREADS
  pthread_mutex_lock(&e->wlock);
  pthread_mutex_lock(&e->qlock);
  for (batch_t **p = &e->aqhead; *p; p = &(*p)->anext)
    if (*p == b) { *p = b->anext; held = 1; break; }
  pthread_mutex_unlock(&e->qlock);
  for (int i = 0; !held && i < e->narmed; i++)
    if (e->armed[i] == b) { e->armed[i] = e->armed[--e->narmed]; held = 1; }
  pthread_mutex_unlock(&e->wlock);
  Py_END_ALLOW_THREADS
  b->arm = NULL;
  if (held) batch_unref(b);
}

static void Template_dealloc(Template *self) {
  template_retire(self);
  if (self->b) {
    int st = atomic_load(&self->b->state);
    if (st == B_NEW || st == B_ACTIVE) {
      /* still in flight: leak it (its memory is referenced by the engine) */
    } else {
      batch_unref(self->b);
    }
  }
  Py_XDECREF(self->eng);
  Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Template_state(Template *self, PyObject *noargs) {
  (void)noargs;
  return Py_BuildValue("(iI)", atomic_load(&self->b->state), (unsigned)atomic_load(&self->b->replays));
}

static PyObject *Template_retire(Template *self, PyObject *noargs) {
  (void)noargs;
  template_retire(self);
  Py_RETURN_NONE;
}

static PyMethodDef Template_methods[] = {
  {"state", (PyCFunction)Template_state, METH_NOARGS, "(state, replays so far)."},
  {"retire", (PyCFunction)Template_retire, METH_NOARGS, "Stop polling the arm word (before its memory is freed)."},
  {NULL, NULL, 0, NULL}};

static PyTypeObject TemplateType = {
  PyVarObject_HEAD_INIT(NULL, 0)
  .tp_name = "hpccl._netengine.Template",
  .tp_basicsize = sizeof(Template),
  .tp_flags = Py_TPFLAGS_DEFAULT,
  .tp_doc = "A network step captured in a CUDA graph: the engine posts it whenever a replay sets its arm word.",
  .tp_methods = Template_methods,
  .tp_dealloc = (destructor)Template_dealloc,
};

/* ----- Python: Engine --------------------------------------------------------------------------------- */
static PyTypeObject EngineType;

static int check_open(Engine *e) {
  if (e->closed || !e->started) {
    PyErr_SetString(PyExc_RuntimeError, e->closed ? "the network engine is closed" : "the network engine is not connected");
    return -1;
  }
  return 0;
}

static int check_peer(Engine *e, int peer) {
  if (peer < 0 || peer >= e->size || peer == e->rank) {
    PyErr_Format(PyExc_ValueError, "peer %d is not another rank of 0..%d", peer, e->size - 1);
    return -1;
  }
  return 0;
}

static int Engine_init(Engine *self, PyObject *args, PyObject *kw) {
  static char *kws[] = {"rank", "size", "config", NULL};
  int rank, size;
  PyObject *cfg = NULL;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "ii|O!", kws, &rank, &size, &PyDict_Type, &cfg)) return -1;
  if (size < 1 || size > (1 << 23) || rank < 0 || rank >= size) {
    PyErr_SetString(PyExc_ValueError, "rank/size out of range");
    return -1;
  }
  unsigned maj, min, rel;
  ucp_get_version(&maj, &min, &rel);
  if (maj != UCP_API_MAJOR || min < UCP_API_MINOR) {
    PyErr_Format(PyExc_ImportError, "the loaded libucp is %u.%u.%u, older than the UCX %d.%d headers hpccl's "
                 "network engine was built with (load a newer UCX, or rebuild hpccl against this one)",
                 maj, min, rel, UCP_API_MAJOR, UCP_API_MINOR);
    return -1;
  }
  self->rank = rank; self->size = size; self->efd = -1; self->wake = -1;
  atomic_init(&self->dead_rank, -1);
  atomic_init(&self->aborted_by, -1);
  pthread_mutex_init(&self->qlock, NULL);
  pthread_mutex_init(&self->wlock, NULL);
  pthread_mutex_init(&self->dlock, NULL);
  pthread_mutex_init(&self->elock, NULL);
  pthread_cond_init(&self->dcond, NULL);
  self->eps = calloc((size_t)size, sizeof(ucp_ep_h));
  self->remote = calloc((size_t)size, sizeof(int));
  self->dead = calloc((size_t)size, sizeof(atomic_int));
  self->send_seq = calloc((size_t)size, sizeof(uint64_t));
  self->recv_seq = calloc((size_t)size, sizeof(uint64_t));
  self->tpl_send = calloc((size_t)size, sizeof(uint32_t));
  self->tpl_recv = calloc((size_t)size, sizeof(uint32_t));
  if (!self->eps || !self->remote || !self->dead || !self->send_seq || !self->recv_seq || !self->tpl_send ||
      !self->tpl_recv) { PyErr_NoMemory(); return -1; }

  ucp_config_t *config;
  ucs_status_t st = ucp_config_read(NULL, NULL, &config);
  if (st != UCS_OK) {
    PyErr_Format(PyExc_RuntimeError, "UCX configuration could not be read: %s", ucs_status_string(st));
    return -1;
  }
  if (cfg) {
    PyObject *k, *v;
    Py_ssize_t pos = 0;
    while (PyDict_Next(cfg, &pos, &k, &v)) {
      const char *ks = PyUnicode_AsUTF8(k), *vs = PyUnicode_AsUTF8(v);
      if (!ks || !vs) { ucp_config_release(config); return -1; }
      st = ucp_config_modify(config, ks, vs);
      if (st != UCS_OK) {
        ucp_config_release(config);
        PyErr_Format(PyExc_ValueError, "UCX refused the setting %s=%s: %s", ks, vs, ucs_status_string(st));
        return -1;
      }
    }
  }
  ucp_params_t p;
  memset(&p, 0, sizeof p);
  p.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME;
  p.features = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP;
  p.name = "hpccl";
  st = ucp_init(&p, config, &self->ctx);
  ucp_config_release(config);
  if (st != UCS_OK) {
    self->ctx = NULL;
    PyErr_Format(PyExc_RuntimeError, "UCX could not start (ucp_init): %s", ucs_status_string(st));
    return -1;
  }
  ucp_worker_params_t wp;
  memset(&wp, 0, sizeof wp);
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;
  st = ucp_worker_create(self->ctx, &wp, &self->worker);
  if (st != UCS_OK) {
    self->worker = NULL;
    PyErr_Format(PyExc_RuntimeError, "UCX worker could not be created: %s", ucs_status_string(st));
    return -1;
  }
  if (ucp_worker_get_efd(self->worker, &self->efd) != UCS_OK) self->efd = -1;
  self->wake = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (self->wake < 0) { PyErr_SetFromErrno(PyExc_OSError); return -1; }
  return 0;
}

static PyObject *Engine_address(Engine *self, PyObject *noargs) {
  (void)noargs;
  ucp_address_t *a;
  size_t n;
  if (!self->worker) { PyErr_SetString(PyExc_RuntimeError, "no worker"); return NULL; }
  ucs_status_t st = ucp_worker_get_address(self->worker, &a, &n);
  if (st != UCS_OK) { PyErr_Format(PyExc_RuntimeError, "ucp_worker_get_address: %s", ucs_status_string(st)); return NULL; }
  PyObject *r = PyBytes_FromStringAndSize((const char *)a, (Py_ssize_t)n);
  ucp_worker_release_address(self->worker, a);
  return r;
}

static PyObject *Engine_info(Engine *self, PyObject *noargs) {
  (void)noargs;
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  if (!f) return PyErr_SetFromErrno(PyExc_OSError);
  if (self->ctx) ucp_context_print_info(self->ctx, f);
  if (self->worker) ucp_worker_print_info(self->worker, f);
  fclose(f);
  PyObject *r = PyUnicode_DecodeUTF8(buf, (Py_ssize_t)len, "replace");
  free(buf);
  return r;
}

static PyObject *Engine_connect(Engine *self, PyObject *args) {
  PyObject *addrs, *remote;
  if (!PyArg_ParseTuple(args, "O!O!", &PyList_Type, &addrs, &PyList_Type, &remote)) return NULL;
  if (PyList_GET_SIZE(addrs) != self->size || PyList_GET_SIZE(remote) != self->size) {
    PyErr_SetString(PyExc_ValueError, "connect() needs an address and a remote flag per rank");
    return NULL;
  }
  if (self->started) { PyErr_SetString(PyExc_RuntimeError, "already connected"); return NULL; }
  for (int p = 0; p < self->size; p++) {
    if (p == self->rank) continue;
    char *a; Py_ssize_t n;
    if (PyBytes_AsStringAndSize(PyList_GET_ITEM(addrs, p), &a, &n) < 0) return NULL;
    self->remote[p] = PyObject_IsTrue(PyList_GET_ITEM(remote, p));
    ucp_ep_params_t ep;
    memset(&ep, 0, sizeof ep);
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                    UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep.address = (const ucp_address_t *)a;
    /* peers on other nodes: UCX's peer-failure mode (only transports that detect a lost peer); on this
       node, every transport (shared memory has no failure detection; hpccl's own shm path covers it) */
    ep.err_mode = self->remote[p] ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
    ep.err_handler.cb = ep_err_cb;
    ep.err_handler.arg = self;
    ucs_status_t st = ucp_ep_create(self->worker, &ep, &self->eps[p]);
    if (st != UCS_OK) {
      self->eps[p] = NULL;
      PyObject *a2 = Py_BuildValue("(iis)", E_PEER, p, ucs_status_string(st));
      if (a2) { PyErr_SetObject(HpErr, a2); Py_DECREF(a2); }
      return NULL;
    }
  }
  post_ctrl_recv(self);
  if (pthread_create(&self->thread, NULL, engine_loop, self) != 0) {
    PyErr_SetString(PyExc_RuntimeError, "could not start the network engine's progress thread");
    return NULL;
  }
  self->started = 1;
  Py_RETURN_NONE;
}

static Op *new_op(Engine *e, batch_t *b) {
  Op *o = PyObject_New(Op, &OpType);
  if (!o) return NULL;
  Py_INCREF(e);
  o->eng = e;
  o->b = b;
  o->have_view = 0;
  return o;
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
  x->tag = eager_tag(self, kind, peer) | (p2p ? P2P_BIT : 0);
  b->timeout = timeout;
  submit(self, b, 1);
  return (PyObject *)o;
}

/* probe(peer): whether the next eager message expected from ``peer`` is a point-to-point one waiting in UCX's
   unexpected queue (receive from any source picks its sender this way); progresses the worker once first */
static PyObject *Engine_probe(Engine *self, PyObject *args) {
  int peer, found = 0;
  if (!PyArg_ParseTuple(args, "i", &peer)) return NULL;
  if (peer < 0 || peer >= self->size || peer == self->rank) {
    PyErr_Format(PyExc_ValueError, "probe: peer %d is not another rank of %d", peer, self->size);
    return NULL;
  }
  uint64_t tag = ((uint64_t)peer << RANK_SHIFT) | P2P_BIT | (self->recv_seq[peer] & EAGER_MASK);
  Py_BEGIN_ALLOW_THREADS
  pthread_mutex_lock(&self->wlock);
  if (!self->closed && self->started) {
    ucp_tag_recv_info_t info;
    engine_step(self);
    found = ucp_tag_probe_nb(self->worker, tag, ~0ULL, 0, &info) != NULL;
  }
  pthread_mutex_unlock(&self->wlock);
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
  batch_t *b = batch_new((int)PyList_GET_SIZE(ops), BK_STAGED);
  if (!b) return PyErr_NoMemory();
  if (parse_ops(self, ops, b) < 0) { batch_unref(b); return NULL; }
  submit_staged(self, b, ready, rtok, gate, done, dval, timeout, label);
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
  int *cs = calloc((size_t)self->size * 2, sizeof(int));
  if (!cs) { batch_unref(b); return PyErr_NoMemory(); }
  for (int i = 0; i < b->nops; i++) {  /* the k-th message to/from a peer in this step: index k */
    op_t *o = &b->ops[i];
    uint32_t *n = o->kind == K_SEND ? &self->tpl_send[o->peer] : &self->tpl_recv[o->peer];
    int k = cs[o->peer * 2 + o->kind]++;
    if (k >= MAX_PER_PEER || *n >= MAX_TEMPLATES) {
      free(cs); batch_unref(b);
      PyErr_SetString(k >= MAX_PER_PEER ? PyExc_ValueError : PyExc_RuntimeError,
                      k >= MAX_PER_PEER ? "a captured network step has more than 128 messages to one peer"
                                        : "this communicator has captured 65535 network steps with one peer, the most it can hold");
      return NULL;
    }
    uint64_t who = o->kind == K_SEND ? (uint64_t)self->rank : (uint64_t)o->peer;
    o->tag = (who << RANK_SHIFT) | GRAPH_BIT | ((uint64_t)*n << 23) | (uint64_t)k;
  }
  for (int p = 0; p < self->size; p++) {  /* the pairs this template has messages with count it */
    if (cs[p * 2 + K_SEND]) self->tpl_send[p]++;
    if (cs[p * 2 + K_RECV]) self->tpl_recv[p]++;
  }
  free(cs);
  b->eng = self;
  b->done = done ? (volatile uint32_t *)(uintptr_t)done : NULL;
  b->done_val = 1;  /* each replay sets the word to 0 before arming; the stream waits for >= 1 */
  b->arm = (volatile uint32_t *)(uintptr_t)arm;
  b->timeout = timeout;
  atomic_store(&b->state, B_DONE);  /* idle until the first replay */
  snprintf(b->label, sizeof b->label, "%s", label);
  Template *t = PyObject_New(Template, &TemplateType);
  if (!t) { batch_unref(b); return NULL; }
  Py_INCREF(self);
  t->eng = self;
  t->b = b;
  atomic_fetch_add(&b->refs, 1);  /* the engine's, while it polls the arm word */
  pthread_mutex_lock(&self->qlock);
  b->anext = self->aqhead;
  self->aqhead = b;
  pthread_mutex_unlock(&self->qlock);
  if (atomic_load(&self->sleeping)) {
    uint64_t one = 1;
    ssize_t w = write(self->wake, &one, sizeof one);
    (void)w;
  }
  return (PyObject *)t;
}

static PyObject *Engine_ctrl_send(Engine *self, PyObject *args) {
  int peer;
  long long k, who, seq;
  if (!PyArg_ParseTuple(args, "iLLL", &peer, &k, &who, &seq)) return NULL;
  if (check_open(self) < 0 || check_peer(self, peer) < 0) return NULL;
  batch_t *b = batch_new(1, BK_OP);
  if (!b) return PyErr_NoMemory();
  b->ctrl[0] = k; b->ctrl[1] = who; b->ctrl[2] = seq;
  b->isctrl = 1;
  op_t *o = &b->ops[0];
  o->kind = K_SEND; o->peer = peer; o->buf = (char *)b->ctrl; o->len = sizeof b->ctrl;
  o->tag = ((uint64_t)self->rank << RANK_SHIFT) | CTRL_TAG;
  b->timeout = 5.0;
  Op *op = new_op(self, b);
  if (!op) { batch_unref(b); return NULL; }
  submit(self, b, 1);
  return (PyObject *)op;
}

static PyObject *Engine_ctrl_poll(Engine *self, PyObject *noargs) {
  (void)noargs;
  PyObject *out = PyList_New(0);
  if (!out) return NULL;
  int h = atomic_load(&self->ctrl_head), t = atomic_load(&self->ctrl_tail);
  for (; h < t; h++) {
    int64_t *m = self->ctrl_ring[h % CTRL_RING];
    PyObject *tup = Py_BuildValue("(LLL)", (long long)m[0], (long long)m[1], (long long)m[2]);
    if (!tup || PyList_Append(out, tup) < 0) { Py_XDECREF(tup); Py_DECREF(out); return NULL; }
    Py_DECREF(tup);
  }
  atomic_store(&self->ctrl_head, h);
  return out;
}

static PyObject *Engine_dead(Engine *self, PyObject *noargs) {
  (void)noargs;
  if (atomic_load(&self->dead_rank) < 0) Py_RETURN_NONE;
  pthread_mutex_lock(&self->elock);
  PyObject *r = Py_BuildValue("(is)", atomic_load(&self->dead_rank), self->dead_why);
  pthread_mutex_unlock(&self->elock);
  return r;
}

static PyObject *Engine_error(Engine *self, PyObject *noargs) {
  (void)noargs;
  pthread_mutex_lock(&self->elock);
  PyObject *r = self->first_ecode ? Py_BuildValue("(iis)", self->first_ecode, self->first_epeer, self->first_err)
                                  : (Py_INCREF(Py_None), Py_None);
  pthread_mutex_unlock(&self->elock);
  return r;
}

static PyObject *Engine_abort(Engine *self, PyObject *args) {
  int origin = -1;
  if (!PyArg_ParseTuple(args, "|i", &origin)) return NULL;
  int none = -1;
  if (origin >= 0) atomic_compare_exchange_strong(&self->aborted_by, &none, origin);
  atomic_store(&self->aborting, 1);
  if (self->started && atomic_load(&self->sleeping)) {
    uint64_t one = 1;
    ssize_t w = write(self->wake, &one, sizeof one);
    (void)w;
  }
  Py_RETURN_NONE;
}

static PyObject *Engine_pending(Engine *self, PyObject *noargs) {
  (void)noargs;
  unsigned long long n, sent, got;
  Py_BEGIN_ALLOW_THREADS
  pthread_mutex_lock(&self->wlock);  /* the engine thread's counters */
  n = self->batches_done; sent = self->bytes_sent; got = self->bytes_recv;
  pthread_mutex_unlock(&self->wlock);
  Py_END_ALLOW_THREADS
  return Py_BuildValue("(KKK)", n, sent, got);
}

/* wait (up to ``seconds``, progressing) until every send this worker started has left it: a send that
   completed locally may still sit in UCX's transport queue, and closing the endpoints would drop it (a peer
   still receiving a communicator's last message then sees its connection reset) */
static void worker_flush(Engine *e, double seconds) {
  ucp_request_param_t prm;
  memset(&prm, 0, sizeof prm);
  ucs_status_ptr_t r = ucp_worker_flush_nbx(e->worker, &prm);
  if (r == NULL || UCS_PTR_IS_ERR(r)) return;
  double end = now_s() + seconds;
  while (ucp_request_check_status(r) == UCS_INPROGRESS && now_s() < end) ucp_worker_progress(e->worker);
  ucp_request_free(r);  /* still in progress (a peer that does not read): UCX releases it when it ends */
}

static void engine_close(Engine *self) {
  if (atomic_exchange(&self->closed, 1)) return;
  int healthy = !atomic_load(&self->aborting) && atomic_load(&self->dead_rank) < 0;
  if (self->started) {
    atomic_store(&self->aborting, 1);
    /* let cancelled work end and control messages leave, briefly */
    double end = now_s() + 0.2;
    while (now_s() < end) {
      pthread_mutex_lock(&self->qlock);
      int q = self->qhead != NULL;
      pthread_mutex_unlock(&self->qlock);
      if (!q && atomic_load(&self->nactive_pub) == 0) break;
      usleep(1000);
    }
    atomic_store(&self->stop, 1);
    uint64_t one = 1;
    ssize_t w = write(self->wake, &one, sizeof one);
    (void)w;
    pthread_join(self->thread, NULL);
    pthread_mutex_lock(&self->wlock);  /* a waiting caller may still try to drive progress */
    self->started = 0;
    if (healthy) worker_flush(self, 0.5);  /* a closed communicator's last messages still reach its peers */
    /* whatever is left: failed, done words written, so no stream and no waiter stays blocked */
    drain(self);
    for (int i = 0; i < self->nactive; i++) {
      batch_t *b = self->active[i];
      batch_fail(b, E_CLOSED, -1, "the communicator was closed");
      for (int k = 0; k < b->nops; k++) if (b->ops[k].req) ucp_request_cancel(self->worker, b->ops[k].req);
    }
    for (int i = 0; i < 100 && self->nactive; i++) { ucp_worker_progress(self->worker); finalize(self); }
    for (int i = 0; i < self->nactive; i++) {  /* UCX never ended these: mark them, leak their requests */
      batch_t *b = self->active[i];
      for (int k = 0; k < b->nops; k++) if (!b->ops[k].done) { b->ops[k].req = NULL; op_end(&b->ops[k], UCS_ERR_CANCELED, 0); }
    }
    finalize(self);
    if (self->ctrl_req) { ucp_request_cancel(self->worker, self->ctrl_req); ucp_worker_progress(self->worker);
                          ucp_request_free(self->ctrl_req); self->ctrl_req = NULL; }
    pthread_mutex_unlock(&self->wlock);
  }
  if (self->worker) {
    for (int p = 0; p < self->size; p++) {
      if (!self->eps || !self->eps[p]) continue;
      ucp_request_param_t prm;
      memset(&prm, 0, sizeof prm);
      prm.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
      prm.flags = UCP_EP_CLOSE_FLAG_FORCE;
      ucs_status_ptr_t r = ucp_ep_close_nbx(self->eps[p], &prm);
      if (r && !UCS_PTR_IS_ERR(r)) {
        double end = now_s() + 0.5;
        while (ucp_request_check_status(r) == UCS_INPROGRESS && now_s() < end) ucp_worker_progress(self->worker);
        ucp_request_free(r);
      }
      self->eps[p] = NULL;
    }
    ucp_worker_destroy(self->worker);
    self->worker = NULL;
  }
  if (self->ctx) { ucp_cleanup(self->ctx); self->ctx = NULL; }
  if (self->wake >= 0) { close(self->wake); self->wake = -1; }
}

static PyObject *Engine_close(Engine *self, PyObject *noargs) {
  (void)noargs;
  Py_BEGIN_ALLOW_THREADS
  engine_close(self);
  Py_END_ALLOW_THREADS
  Py_RETURN_NONE;
}

static void Engine_dealloc(Engine *self) {
  engine_close(self);
  free(self->eps); free(self->remote); free((void *)self->dead); free(self->send_seq); free(self->recv_seq);
  free(self->active); free(self->fifo); free(self->armed); free(self->tpl_send); free(self->tpl_recv);
  Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Engine_rank(Engine *self, void *c) { (void)c; return PyLong_FromLong(self->rank); }

/* ----- recorded GPU network calls replayed from C -------------------------------------------------- */
static PyTypeObject NetProgramType;
#include "_netreplay.c"

static PyMethodDef Engine_methods[] = {
  {"program", (PyCFunction)Engine_program, METH_VARARGS, "A recorded GPU network call to replay (hpccl/netreplay.py)."},
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
  {"close", (PyCFunction)Engine_close, METH_NOARGS, "Stop the thread, close endpoints and the worker."},
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

static PyGetSetDef Engine_getset[] = {
  {"rank", (getter)Engine_rank, NULL, "rank", NULL},
  {"seq", (getter)Engine_get_seq, (setter)Engine_set_seq, "the communicator's current call number (set by "
   "Python's calls and by NetHot's)", NULL},
  {NULL, NULL, NULL, NULL, NULL}};

static PyTypeObject EngineType = {
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

/* ----- Python: NetHot (small host collectives across nodes, in C) ------------------------------------ */
#include "_nethot.c"

static PyObject *mod_version(PyObject *m, PyObject *noargs) {
  (void)m; (void)noargs;
  unsigned maj, min, rel;
  ucp_get_version(&maj, &min, &rel);
  return Py_BuildValue("((III)(ii))", maj, min, rel, UCP_API_MAJOR, UCP_API_MINOR);
}

static PyMethodDef mod_methods[] = {
  {"version", mod_version, METH_NOARGS, "((loaded libucp version), (headers built against))"},
  {NULL, NULL, 0, NULL}};

static struct PyModuleDef moddef = {PyModuleDef_HEAD_INIT, "hpccl._netengine",
                                    "hpccl's native UCX network engine (a GIL-free progress thread).", -1,
                                    mod_methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__netengine(void) {
  if (PyType_Ready(&EngineType) < 0 || PyType_Ready(&OpType) < 0 || PyType_Ready(&TemplateType) < 0 ||
      PyType_Ready(&NetHotType) < 0 ||
      PyType_Ready(&NetProgramType) < 0)
    return NULL;
  PyObject *m = PyModule_Create(&moddef);
  if (!m) return NULL;
  HpErr = PyErr_NewException("hpccl._netengine.EngineError", PyExc_RuntimeError, NULL);
  Py_INCREF(&EngineType);
  PyModule_AddObject(m, "Engine", (PyObject *)&EngineType);
  PyModule_AddObject(m, "EngineError", HpErr);
  Py_INCREF(&NetHotType);
  PyModule_AddObject(m, "NetHot", (PyObject *)&NetHotType);
  Py_INCREF(&NetProgramType);
  PyModule_AddObject(m, "NetProgram", (PyObject *)&NetProgramType);
  PyModule_AddIntConstant(m, "SEND", K_SEND);
  PyModule_AddIntConstant(m, "RECV", K_RECV);
  PyModule_AddIntConstant(m, "E_PEER", E_PEER);
  PyModule_AddIntConstant(m, "E_TIMEOUT", E_TIMEOUT);
  PyModule_AddIntConstant(m, "E_ABORT", E_ABORT);
  PyModule_AddIntConstant(m, "E_SIZE", E_SIZE);
  PyModule_AddIntConstant(m, "E_CLOSED", E_CLOSED);
  return m;
}
