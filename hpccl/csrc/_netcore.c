/* The network engine's own thread (and a waiting caller that drives progress in its place): batches
   queued, posted once their ready token comes, ended in order with their done words written; UCX's
   callbacks, peer failures, timeouts, abort, and templates reposted when a graph replay sets their arm
   word. Plain C: _netcore.h says what the engine is and how tags are made; the batches themselves are
   _netbatch.c's, the control messages _netctrl.c's. */
#include "_netcore.h"

#include <poll.h>
#include <sched.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ----- UCX callbacks (engine thread, inside ucp_worker_progress) ------------------------------------- */
void op_end(op_t *o, ucs_status_t st, size_t got) {
  if (o->done) return;
  o->done = 1;
  o->st = st;
  o->got = got;
  batch_t *b = o->b;
  if (st != UCS_OK && !b->ecode) {
    engine_t *e = b->eng;
    if (st == UCS_ERR_CANCELED && b->ecode == 0 && e && atomic_load(&e->aborting))
      batch_fail(b, E_ABORT, -1, "the communicator was aborted");
    else if (st == UCS_ERR_MESSAGE_TRUNCATED)
      batch_fail(b, E_SIZE, o->peer, "rank %d sent more bytes than this rank's receive of %zu bytes (sizes "
                 "or dtypes differ across ranks)", o->peer, o->len);
    else if (e && o->peer >= 0 && atomic_load(&e->closing[o->peer]))
      batch_fail(b, E_PEER, o->peer, "rank %d closed its communicator (UCX %s failed: %s)", o->peer,
                 o->kind == K_SEND ? "send" : "receive", ucs_status_string(st));
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

void ep_err_cb(void *arg, ucp_ep_h ep, ucs_status_t st) {
  engine_t *e = arg;
  for (int p = 0; p < e->size; p++) {
    if (e->eps[p] == ep) {
      int expected = 0;
      if (atomic_compare_exchange_strong(&e->dead[p], &expected, st < 0 ? -(int)st : 1)) {
        pthread_mutex_lock(&e->elock);
        if (atomic_load(&e->dead_rank) < 0 && !atomic_load(&e->closing[p])) {  /* a goodbye is no failure */
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
static void post_op(engine_t *e, op_t *o) {
  ucp_request_param_t prm;
  ucp_tag_recv_info_t info = {0, 0};
  memset(&prm, 0, sizeof prm);
  prm.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_MEMORY_TYPE;
  prm.user_data = o;
  prm.memory_type = UCS_MEMORY_TYPE_HOST;
  o->posted = 1;
  atomic_store_explicit(&e->talked[o->peer], 1, memory_order_relaxed);
  int gone = atomic_load(&e->dead[o->peer]);
  if (gone && !(o->kind == K_RECV && atomic_load(&e->closing[o->peer]))) {
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
  if (gone && r != NULL && !UCS_PTR_IS_ERR(r)) {
    /* a peer that said goodbye had every message it sent read first: one not here now never comes */
    o->req = r;
    ucp_request_cancel(e->worker, r);
  } else if (r == NULL) {
    op_end(o, UCS_OK, o->kind == K_RECV ? info.length : o->len);
  } else if (UCS_PTR_IS_ERR(r)) {
    op_end(o, UCS_PTR_STATUS(r), 0);
  } else {
    o->req = r;
  }
}

static void post_all(engine_t *e, batch_t *b) {
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

static void activate(engine_t *e, batch_t *b) {
  b->eng = e;
  b->left = b->nops;
  b->finished = b->nops == 0;
  b->released = b->fdone = 0;
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

/* a failed engine-owned batch's error becomes the engine's first, raised by the communicator's next call */
static void publish_error(engine_t *e, batch_t *b) {
  if (!b->ecode || b->bkind == BK_OP) return;
  pthread_mutex_lock(&e->elock);
  if (!e->first_ecode) {
    e->first_ecode = b->ecode;
    e->first_epeer = b->epeer;
    snprintf(e->first_err, sizeof e->first_err, "%s: %s", b->label[0] ? b->label : "network step", b->err);
  }
  pthread_mutex_unlock(&e->elock);
}

static void end_batch(engine_t *e, batch_t *b) {
  publish_error(e, b);
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

/* whether every op of a failed batch that has not ended is a posted send: UCX cannot cancel a send, and a
   rendezvous send whose receiver gave up (or never comes) stays in flight until the endpoint closes */
static int only_sends_left(const batch_t *b) {
  for (int k = 0; k < b->nops; k++) {
    const op_t *o = &b->ops[k];
    if (!o->done && !(o->kind == K_SEND && o->posted && o->req)) return 0;
  }
  return 1;
}

/* a batch's waiters answered: its state published, its done word written, the engine's reference dropped (a
   template's reference is its owner's, kept for the next replay) */
static void answer(batch_t *b) {
  int failed = b->ecode != 0;
  atomic_store(&b->state, failed ? B_FAILED : B_DONE);
  write_done(b, failed);
  if (b->bkind != BK_TEMPLATE) batch_unref(b);
}

/* a failed batch left with sends UCX cannot cancel ends for its waiters now: its done word is written (in
   its FIFO turn when ordered) and its error published, while it stays active, holding an extra reference,
   until UCX ends those sends (the peer takes them, or engine_close closes the endpoints). Only sends are
   left, so nothing writes its memory; they may still read it: only steps over memory hpccl owns (staged and
   template batches: StagedNet.close keeps it while an engine is lingering) are released, never an Op over a
   caller's buffer. A template's state stays active, so no replay reuses its ops before they end. */
static void release(engine_t *e, batch_t *b) {
  b->released = 1;
  atomic_fetch_add(&b->refs, 1);
  atomic_fetch_add(&e->lingering, 1);
  publish_error(e, b);
  if (b->bkind == BK_TEMPLATE) {
    write_done(b, 1);
  } else if (!b->ordered) {
    answer(b);
  } else {
    b->fdone = 1;
  }
}

int finalize(engine_t *e) {
  int n = 0;
  for (int i = 0; i < e->nactive;) {
    batch_t *b = e->active[i];
    if (!b->finished) {
      if (b->ecode && !b->released && b->bkind != BK_OP && only_sends_left(b)) { release(e, b); n++; }
      i++;
      continue;
    }
    for (int k = 0; k < b->nops; k++)
      if (b->ops[k].req) { ucp_request_free(b->ops[k].req); b->ops[k].req = NULL; }
    for (int k = 0; k < b->nops; k++)
      if (b->ops[k].kind == K_RECV && b->ops[k].st == UCS_OK) e->bytes_recv += b->ops[k].got;
    e->active[i] = e->active[--e->nactive];
    end_batch(e, b);
    n++;
    if (b->released) {  /* its waiters were answered when it was released */
      atomic_fetch_sub(&e->lingering, 1);
      if (b->bkind == BK_TEMPLATE) atomic_store(&b->state, B_FAILED);
      batch_unref(b);
    } else if (!b->ordered) {
      answer(b);
    } else {
      b->fdone = 1;  /* waits for its turn in the FIFO */
    }
  }
  while (e->fhead < e->ftail && e->fifo[e->fhead]->fdone)
    answer(e->fifo[e->fhead++]);  /* ordered: staged batches, never templates */
  if (n && atomic_load(&e->waiters)) {
    pthread_mutex_lock(&e->dlock);
    pthread_cond_broadcast(&e->dcond);
    pthread_mutex_unlock(&e->dlock);
  }
  return n;
}

void cancel_batch(engine_t *e, batch_t *b, int only_peer) {
  for (int k = 0; k < b->nops; k++) {
    op_t *o = &b->ops[k];
    if (o->done || (only_peer >= 0 && o->peer != only_peer)) continue;
    if (!o->posted) { o->posted = 1; op_end(o, UCS_ERR_CANCELED, 0); b->unsent--; }
    else if (o->req) ucp_request_cancel(e->worker, o->req);
  }
}

static void peer_failures(engine_t *e) {
  if (!atomic_exchange(&e->new_dead, 0)) return;
  for (int i = 0; i < e->nactive; i++) {
    batch_t *b = e->active[i];
    for (int k = 0; k < b->nops; k++) {
      op_t *o = &b->ops[k];
      int d = atomic_load(&e->dead[o->peer]);
      if (!d || o->done) continue;
      pthread_mutex_lock(&e->elock);
      if (atomic_load(&e->closing[o->peer]))
        batch_fail(b, E_PEER, o->peer, "rank %d closed its communicator", o->peer);
      else
        batch_fail(b, E_PEER, o->peer, "rank %d is gone: %s", o->peer, e->dead_why);
      pthread_mutex_unlock(&e->elock);
      cancel_batch(e, b, o->peer);
    }
  }
}

static void timeouts(engine_t *e, double t) {
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

static void abort_all(engine_t *e) {
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

/* a piped step's pieces on this lane (BK_PIPE, see batch_t) made into staged batches and activated in piece
   order (their done words are written in that order); d itself goes. Out of memory: d becomes an empty
   failed batch whose done value is the lane's last, after the pieces made so far, so no wait is left behind */
static void expand_pipe(engine_t *e, batch_t *d) {
  uint64_t sseq = d->pipe.sseq, rseq = d->pipe.rseq;
  for (int i = 0; i < d->pipe.k; i++) {
    uint64_t g = (uint64_t)d->pipe.lane + (uint64_t)i * (uint64_t)d->pipe.lanes;
    int snd = g < (uint64_t)d->pipe.ks, rcv = g < (uint64_t)d->pipe.kr;
    batch_t *b = batch_staged_engine(e, snd + rcv);
    if (!b) {
      d->bkind = BK_STAGED;
      d->done_val = d->pipe.v0 + (uint32_t)(d->pipe.k - 1);
      batch_fail(d, E_OTHER, -1, "out of memory making a piped step's pieces");
      activate(e, d);
      return;
    }
    op_t *o = b->ops;
    if (snd) {
      uint64_t off = g * d->pipe.ps;
      o->kind = K_SEND; o->peer = d->pipe.speer; o->buf = d->pipe.sbase + off;
      o->len = d->pipe.ns - off < d->pipe.ps ? d->pipe.ns - off : d->pipe.ps;
      o->tag = ((uint64_t)e->rank << RANK_SHIFT) | (sseq++ & EAGER_MASK);
      o++;
    }
    if (rcv) {
      uint64_t off = g * d->pipe.pr;
      o->kind = K_RECV; o->peer = d->pipe.rpeer; o->buf = d->pipe.rbase + off;
      o->len = d->pipe.nr - off < d->pipe.pr ? d->pipe.nr - off : d->pipe.pr;
      o->tag = ((uint64_t)d->pipe.rpeer << RANK_SHIFT) | (rseq++ & EAGER_MASK);
    }
    b->ready = d->ready; b->ready_tok = d->pipe.t0 + (uint32_t)g;
    b->gate = d->gate;
    b->done = d->done; b->done_val = d->pipe.v0 + (uint32_t)i;
    b->ordered = b->done != NULL;
    b->timeout = d->timeout;
    memcpy(b->label, d->label, sizeof b->label);
    activate(e, b);
  }
  batch_unref(d);
}

int drain(engine_t *e) {
  if (!atomic_load_explicit(&e->queued, memory_order_relaxed)) return 0;
  pthread_mutex_lock(&e->qlock);
  atomic_store(&e->queued, 0);
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
    if (b->bkind == BK_PIPE) expand_pipe(e, b);
    else activate(e, b);
    b = next;
    n++;
  }
  return n;
}

static int gated_sends(engine_t *e) {
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
static void replay(engine_t *e, batch_t *b) {
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
static int poll_armed(engine_t *e) {
  int n = 0;
  for (int i = 0; i < e->narmed; i++) {
    batch_t *b = e->armed[i];
    if (__atomic_load_n(b->arm, __ATOMIC_ACQUIRE) == 0) continue;
    if (b->released && atomic_load(&b->state) < B_DONE) {
      /* its last replay failed and UCX still holds its sends (they end when the endpoint closes): this
         replay moves nothing and ends at once, failed, so the graph's stream goes on */
      __atomic_store_n(b->arm, 0, __ATOMIC_RELAXED);
      write_done(b, 1);
      n++;
      continue;
    }
    if (atomic_load(&b->state) < B_DONE) continue;
    __atomic_store_n(b->arm, 0, __ATOMIC_RELAXED);
    replay(e, b);
    n++;
  }
  return n;
}

static int has_gated(engine_t *e) {
  for (int i = 0; i < e->nactive; i++) if (e->active[i]->unsent) return 1;
  return 0;
}

/* sleep until a socket event (with ``events``), a submission or ``timeout_ms``; called with wlock held,
   returns with it held */
static void sleep_for(engine_t *e, int timeout_ms, int events) {
  int efd = events ? e->efd : -1;
  struct pollfd fds[2] = {{e->wake, POLLIN, 0}, {efd, POLLIN, 0}};
  /* a look at the sockets that does not block (timeout 0) needs no wake-up: a submitter seeing the flag
     would pay a write(2) for nothing */
  /* 2: a short nap while batches are in flight (socket events and a timeout of a millisecond end it);
     1: asleep with nothing in flight, for as long as 50 ms */
  atomic_store(&e->sleeping, timeout_ms > 0 ? (e->nactive ? 2 : 1) : 0);
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

static void sleep_on(engine_t *e, int timeout_ms) { sleep_for(e, timeout_ms, 1); }

/* every active batch has ended (its messages completed as they were posted, as a small eager send or a
   receive of what had already arrived does) */
static int all_finished(engine_t *e) {
  for (int i = 0; i < e->nactive; i++)
    if (!e->active[i]->finished) return 0;
  return 1;
}

/* one round of the engine's work; the caller holds wlock (the engine thread, or a waiting caller) */
int engine_step(engine_t *e) {
  int work = drain(e);
  if (atomic_load(&e->aborting)) abort_all(e);
  peer_failures(e);
  work += gated_sends(e);
  if (e->narmed) work += poll_armed(e);
  /* a round that posted only what completed at once ends without polling the network (a system call
     on TCP): the batches are answered now, and the next round polls */
  if (!work || !all_finished(e)) work += (int)ucp_worker_progress(e->worker);
  work += ctrl_progress(e);
  work += finalize(e);
  atomic_store(&e->nactive_pub, e->nactive);
  return work;
}

void *engine_loop(void *arg) {
  engine_t *e = arg;
  long idle = 0;
  pthread_mutex_lock(&e->wlock);
  while (!atomic_load(&e->stop)) {
    double hold = atomic_load(&e->hold_until);
    if (hold > 0 && now_s() < hold) {  /* a test's stopped engine: no progress, no timeouts, no done words */
      pthread_mutex_unlock(&e->wlock);
      usleep(1000);
      pthread_mutex_lock(&e->wlock);
      continue;
    }
    atomic_fetch_add_explicit(&e->beats, 1, memory_order_relaxed);
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
