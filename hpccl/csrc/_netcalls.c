/* What the callers' threads ask of a network engine (_netcore.h): UCX set up, endpoints and the progress
   thread started, a batch waited for (driving progress meanwhile), templates held and retired, control
   messages, failures and counters read, the engine closed. Plain C: the binding (_netengine.c) turns the
   ne_err a call fills in into a Python exception, and releases the GIL around the calls that may block. */
#include "_netcore.h"

#include <ucm/api/ucm.h>

#include <errno.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

static int fail(ne_err *err, int kind, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(ne_err *err, int kind, const char *fmt, ...) {
  err->kind = kind;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err->msg, sizeof err->msg, fmt, ap);
  va_end(ap);
  return -1;
}

/* ----- set-up ----------------------------------------------------------------------------------------- */
/* the loaded libucp is at least the headers' version (same major) */
int engine_version_check(ne_err *err) {
  unsigned maj, min, rel;
  ucp_get_version(&maj, &min, &rel);
  if (maj != UCP_API_MAJOR || min < UCP_API_MINOR)
    return fail(err, NE_VERSION, "the loaded libucp is %u.%u.%u, older than the UCX %d.%d headers hpccl's "
                "network engine was built with (load a newer UCX, or rebuild hpccl against this one)",
                maj, min, rel, UCP_API_MAJOR, UCP_API_MINOR);
  return 0;
}

/* e zeroed: its rank and size, locks, per-peer state; what was made on failure stays for engine_free */
int engine_alloc(engine_t *e, int rank, int size, ne_err *err) {
  e->rank = rank; e->size = size; e->efd = -1; e->wake = -1;
  atomic_init(&e->dead_rank, -1);
  atomic_init(&e->aborted_by, -1);
  pthread_mutex_init(&e->qlock, NULL);
  pthread_mutex_init(&e->wlock, NULL);
  pthread_mutex_init(&e->dlock, NULL);
  pthread_mutex_init(&e->elock, NULL);
  pthread_cond_init(&e->dcond, NULL);
  e->eps = calloc((size_t)size, sizeof(ucp_ep_h));
  e->remote = calloc((size_t)size, sizeof(int));
  e->dead = calloc((size_t)size, sizeof(atomic_int));
  e->talked = calloc((size_t)size, sizeof(atomic_int));
  e->closing = calloc((size_t)size, sizeof(atomic_int));
  e->confirmed = calloc((size_t)size, sizeof(atomic_int));
  e->send_seq = calloc((size_t)size, sizeof(uint64_t));
  e->recv_seq = calloc((size_t)size, sizeof(uint64_t));
  e->tpl_send = calloc((size_t)size, sizeof(uint32_t));
  e->tpl_recv = calloc((size_t)size, sizeof(uint32_t));
  if (!e->eps || !e->remote || !e->dead || !e->talked || !e->closing || !e->confirmed || !e->send_seq
      || !e->recv_seq || !e->tpl_send || !e->tpl_recv) {
    err->kind = NE_NOMEM;
    return -1;
  }
  return 0;
}

/* whether UCX runs without its registration cache (memory events or RCACHE_ENABLE off, from the environment,
   a ucx.conf or the engine's settings alike): then force-closing an endpoint under a rendezvous send UCX still
   holds crashes inside UCX (its purge invalidates the send's memory handle through the missing cache), so
   engine_close leaves such sends, their endpoints and the worker alone. Read from UCX's own parsed settings:
   the memory-events switch (ucm_global_opts) and the context configuration as ucp_config_print shows it. */
static int no_rcache(const ucp_config_t *config) {
  if (!ucm_global_opts.enable_events) return 1;
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  if (!f) return 0;
  ucp_config_print(config, f, NULL, UCS_CONFIG_PRINT_CONFIG);
  fclose(f);
  const char *want = "UCX_RCACHE_ENABLE=n\n";  /* one NAME=value line per setting */
  int off = 0;
  for (const char *at = buf; !off && at && (at = strstr(at, want)); at++) off = at == buf || at[-1] == '\n';
  free(buf);
  return off;
}

/* after engine_alloc: a UCP context (UCX's configuration plus the ``nset`` settings keys[i]=vals[i]), its
   worker, the wake-up eventfd; what was made on failure stays for engine_free */
int engine_start_ucx(engine_t *e, int nset, const char *const *keys, const char *const *vals, ne_err *err) {
  ucp_config_t *config;
  ucs_status_t st = ucp_config_read(NULL, NULL, &config);
  if (st != UCS_OK) return fail(err, NE_RUNTIME, "UCX configuration could not be read: %s", ucs_status_string(st));
  for (int i = 0; i < nset; i++) {
    st = ucp_config_modify(config, keys[i], vals[i]);
    if (st != UCS_OK) {
      ucp_config_release(config);
      err->at = i;  /* the binding names the setting (it may be longer than msg) */
      return fail(err, NE_SETTING, "%s", ucs_status_string(st));
    }
  }
  ucp_params_t p;
  memset(&p, 0, sizeof p);
  p.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME;
  p.features = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP;
  p.name = "hpccl";
  e->no_rcache = no_rcache(config);
  st = ucp_init(&p, config, &e->ctx);
  ucp_config_release(config);
  if (st != UCS_OK) {
    e->ctx = NULL;
    return fail(err, NE_RUNTIME, "UCX could not start (ucp_init): %s", ucs_status_string(st));
  }
  ucp_worker_params_t wp;
  memset(&wp, 0, sizeof wp);
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;
  st = ucp_worker_create(e->ctx, &wp, &e->worker);
  if (st != UCS_OK) {
    e->worker = NULL;
    return fail(err, NE_RUNTIME, "UCX worker could not be created: %s", ucs_status_string(st));
  }
  if (ucp_worker_get_efd(e->worker, &e->efd) != UCS_OK) e->efd = -1;
  e->wake = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (e->wake < 0) { err->kind = NE_ERRNO; err->err_no = errno; return -1; }
  return 0;
}

/* an endpoint to every other rank (addrs[p]: its worker address; remote[p]: on another node), then the
   control receive and the progress thread */
int engine_connect(engine_t *e, const char *const *addrs, const int *remote, ne_err *err) {
  for (int p = 0; p < e->size; p++) {
    if (p == e->rank) continue;
    e->remote[p] = remote[p];
    ucp_ep_params_t ep;
    memset(&ep, 0, sizeof ep);
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                    UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep.address = (const ucp_address_t *)addrs[p];
    /* peers on other nodes: UCX's peer-failure mode (only transports that detect a lost peer); on this
       node, every transport (shared memory has no failure detection; hpccl's own shm path covers it) */
    ep.err_mode = e->remote[p] ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
    ep.err_handler.cb = ep_err_cb;
    ep.err_handler.arg = e;
    ucs_status_t st = ucp_ep_create(e->worker, &ep, &e->eps[p]);
    if (st != UCS_OK) {
      e->eps[p] = NULL;
      err->peer = p;
      return fail(err, NE_PEER, "%s", ucs_status_string(st));
    }
  }
  post_ctrl_recv(e);
  if (pthread_create(&e->thread, NULL, engine_loop, e) != 0)
    return fail(err, NE_RUNTIME, "could not start the network engine's progress thread");
  e->started = 1;
  return 0;
}

int engine_address(engine_t *e, ucp_address_t **addr, size_t *len, ne_err *err) {
  if (!e->worker) return fail(err, NE_RUNTIME, "no worker");
  ucs_status_t st = ucp_worker_get_address(e->worker, addr, len);
  if (st != UCS_OK) return fail(err, NE_RUNTIME, "ucp_worker_get_address: %s", ucs_status_string(st));
  return 0;
}

void engine_address_free(engine_t *e, ucp_address_t *addr) { ucp_worker_release_address(e->worker, addr); }

/* UCX's description of the context and worker (malloc'd, *len bytes), or NULL with errno set */
char *engine_info(engine_t *e, size_t *len) {
  char *buf = NULL;
  *len = 0;
  FILE *f = open_memstream(&buf, len);
  if (!f) return NULL;
  if (e->ctx) ucp_context_print_info(e->ctx, f);
  if (e->worker) ucp_worker_print_info(e->worker, f);
  fclose(f);
  return buf;
}

/* ----- callers' calls ------------------------------------------------------------------------------- */
/* whether the next eager message expected from ``peer`` is a point-to-point one waiting in UCX's
   unexpected queue (receive from any source picks its sender this way); progresses the worker once first */
int engine_probe(engine_t *e, int peer) {
  int found = 0;
  uint64_t tag = ((uint64_t)peer << RANK_SHIFT) | P2P_BIT | (e->recv_seq[peer] & EAGER_MASK);
  pthread_mutex_lock(&e->wlock);
  if (!e->closed && e->started) {
    ucp_tag_recv_info_t info;
    engine_step(e);
    found = ucp_tag_probe_nb(e->worker, tag, ~0ULL, 0, &info) != NULL;
  }
  pthread_mutex_unlock(&e->wlock);
  return found;
}

/* one round of the engine's work from this thread if the worker is free now (else nothing): what was just
   submitted is posted at once, and a batch whose messages completed as they were posted has ended when
   this returns, so its caller need not wait (nor let go of the GIL) */
void engine_try_step(engine_t *e) {
  if (pthread_mutex_trylock(&e->wlock) != 0) return;
  if (!e->closed && e->started) engine_step(e);
  pthread_mutex_unlock(&e->wlock);
}

/* wait until the batch has ended or ``seconds`` pass; 1 if ended (the binding calls it without the GIL) */
int engine_wait(engine_t *e, batch_t *b, double seconds) {
  int ended = 0;
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
  if (atomic_fetch_sub(&e->driving, 1) == 1 && !ended && end - now_s() > 0 && atomic_load(&e->sleeping))
    wake_engine(e);  /* this caller goes to sleep: hand progress back to the engine thread at once */
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
  return ended;
}

/* the error of a batch that has failed while some of its messages are still in flight: its code (0: none,
   or the batch is being progressed right now), peer and message */
int engine_batch_error(engine_t *e, batch_t *b, int *ecode, int *epeer, char err[256]) {
  *ecode = 0;
  if (pthread_mutex_trylock(&e->wlock) != 0) return 0;
  if (b->ecode) {
    *ecode = b->ecode, *epeer = b->epeer;
    memcpy(err, b->err, 256);
  }
  pthread_mutex_unlock(&e->wlock);
  return *ecode;
}

/* fail and cancel batch b (its owner gives up on it); a batch still queued is made active first */
void engine_cancel(engine_t *e, batch_t *b) {
  pthread_mutex_lock(&e->wlock);
  if (e->started && !e->closed) {
    drain(e);
    if (atomic_load(&b->state) == B_ACTIVE) {
      batch_fail(b, E_ABORT, -1, "the call was cancelled");
      cancel_batch(e, b, -1);
    }
  }
  pthread_mutex_unlock(&e->wlock);
}

/* ----- templates (network steps captured in a CUDA graph) ----------------------------------------------- */
/* b (ops filled in) made a template: each message's tag (its sender, the template's number among those of
   its pair, its index among this step's messages to/from that peer), its words; -1 when a peer has more than
   MAX_PER_PEER messages, -3 when a pair has MAX_TEMPLATES templates */
int engine_template_prepare(engine_t *e, batch_t *b, uint64_t done, uint64_t arm, double timeout,
                            const char *label) {
  int *cs = calloc((size_t)e->size * 2, sizeof(int));
  if (!cs) return -2;
  for (int i = 0; i < b->nops; i++) {  /* the k-th message to/from a peer in this step: index k */
    op_t *o = &b->ops[i];
    uint32_t n = o->kind == K_SEND ? e->tpl_send[o->peer] : e->tpl_recv[o->peer];
    int k = cs[o->peer * 2 + o->kind]++;
    if (k >= MAX_PER_PEER) { free(cs); return -1; }
    if (n >= MAX_TEMPLATES) { free(cs); return -3; }
    uint64_t who = o->kind == K_SEND ? (uint64_t)e->rank : (uint64_t)o->peer;
    o->tag = (who << RANK_SHIFT) | GRAPH_BIT | ((uint64_t)n << 23) | (uint64_t)k;
  }
  for (int p = 0; p < e->size; p++) {  /* the pairs this template has messages with count it */
    if (cs[p * 2 + K_SEND]) e->tpl_send[p]++;
    if (cs[p * 2 + K_RECV]) e->tpl_recv[p]++;
  }
  free(cs);
  b->eng = e;
  b->done = done ? (volatile uint32_t *)(uintptr_t)done : NULL;
  b->done_val = 1;  /* each replay sets the word to 0 before arming; the stream waits for >= 1 */
  b->arm = (volatile uint32_t *)(uintptr_t)arm;
  b->timeout = timeout;
  atomic_store(&b->state, B_DONE);  /* idle until the first replay */
  snprintf(b->label, sizeof b->label, "%s", label);
  return 0;
}

/* the engine starts polling b's arm word (and holds a reference until retired) */
void engine_template_hold(engine_t *e, batch_t *b) {
  atomic_fetch_add(&b->refs, 1);
  pthread_mutex_lock(&e->qlock);
  b->anext = e->aqhead;
  e->aqhead = b;
  atomic_store(&e->queued, 1);
  pthread_mutex_unlock(&e->qlock);
  if (atomic_load(&e->sleeping)) wake_engine(e);
}

/* stop polling b's arm word (its memory is about to be freed): out of the queue or the engine's list, under
   the locks the engine thread takes them with; the engine's reference dropped */
void engine_template_retire(engine_t *e, batch_t *b) {
  if (!b->arm) return;
  int held = 0;
  pthread_mutex_lock(&e->wlock);
  pthread_mutex_lock(&e->qlock);
  for (batch_t **p = &e->aqhead; *p; p = &(*p)->anext)
    if (*p == b) { *p = b->anext; held = 1; break; }
  pthread_mutex_unlock(&e->qlock);
  for (int i = 0; !held && i < e->narmed; i++)
    if (e->armed[i] == b) { e->armed[i] = e->armed[--e->narmed]; held = 1; }
  pthread_mutex_unlock(&e->wlock);
  b->arm = NULL;
  if (held) batch_unref(b);
}

/* ----- failures, counters ------------------------------------------------------------------------------ */
/* the first peer whose connection failed (why copied out), or -1 */
int engine_dead(engine_t *e, char *why, size_t n) {
  if (atomic_load(&e->dead_rank) < 0) return -1;
  pthread_mutex_lock(&e->elock);
  int r = atomic_load(&e->dead_rank);
  snprintf(why, n, "%s", e->dead_why);
  pthread_mutex_unlock(&e->elock);
  return r;
}

/* the code of the first failed engine-owned batch (its peer and message copied out), or 0 */
int engine_error(engine_t *e, int *epeer, char *msg, size_t n) {
  pthread_mutex_lock(&e->elock);
  int code = e->first_ecode;
  if (code) { *epeer = e->first_epeer; snprintf(msg, n, "%s", e->first_err); }
  pthread_mutex_unlock(&e->elock);
  return code;
}

/* fail everything in flight; ``origin`` >= 0: the rank that aborted the communicator */
void engine_abort(engine_t *e, int origin) {
  int none = -1;
  if (origin >= 0) atomic_compare_exchange_strong(&e->aborted_by, &none, origin);
  atomic_store(&e->aborting, 1);
  if (e->started && atomic_load(&e->sleeping)) wake_engine(e);
}

void engine_counters(engine_t *e, uint64_t *batches, uint64_t *sent, uint64_t *got) {
  pthread_mutex_lock(&e->wlock);  /* the engine thread's counters */
  *batches = e->batches_done; *sent = e->bytes_sent; *got = e->bytes_recv;
  pthread_mutex_unlock(&e->wlock);
}

/* ----- close -------------------------------------------------------------------------------------------- */
/* wait (up to ``seconds``, progressing) until every send this worker started has left it: a send that
   completed locally may still sit in UCX's transport queue, and closing the endpoints would drop it (a peer
   still receiving a communicator's last message then sees its connection reset) */
static void worker_flush(engine_t *e, double seconds) {
  ucp_request_param_t prm;
  memset(&prm, 0, sizeof prm);
  ucs_status_ptr_t r = ucp_worker_flush_nbx(e->worker, &prm);
  if (r == NULL || UCS_PTR_IS_ERR(r)) return;
  double end = now_s() + seconds;
  while (ucp_request_check_status(r) == UCS_INPROGRESS && now_s() < end) ucp_worker_progress(e->worker);
  ucp_request_free(r);  /* still in progress (a peer that does not read): UCX releases it when it ends */
}

/* close every endpoint (forced: whatever UCX still holds on it ends, with an error, through its callback) */
static void close_eps(engine_t *self) {
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
}

/* say goodbye to every live peer on another node this engine exchanged messages with, and wait (up to
   ``seconds``) until each confirms. A peer's engine thread confirms once it has read our goodbye, and so
   everything sent before it on the same connection: closing the endpoints after that cannot reset a
   connection that still carries our data (a peer's kernel drops what it has not read when a closed socket
   sends a reset). The peer also learns that the connection's end is a goodbye, not a failure. Peers that end
   (their connection fails) or whose goodbye cannot be sent are not waited for; peers on this node are not
   asked, since their endpoints (no peer-failure mode) would not report one that closed first. Skipped for an
   aborted or failed engine. Returns how many peers did not confirm in time, their ranks in ``late`` (room for
   size). */
int engine_farewell(engine_t *e, double seconds, int *late) {
  if (!e->started || atomic_load(&e->closed) || atomic_load(&e->aborting) || atomic_load(&e->dead_rank) >= 0)
    return 0;
  batch_t **sent = calloc((size_t)e->size, sizeof(batch_t *));
  if (!sent) return 0;
  for (int p = 0; p < e->size; p++) {
    if (p == e->rank || !e->remote[p] || !atomic_load(&e->talked[p]) || atomic_load(&e->dead[p])) continue;
    sent[p] = engine_ctrl_batch(e, p, CTRL_CLOSING, e->rank, 0);
    if (!sent[p]) continue;
    sent[p]->timeout = seconds;
    submit_to(e, sent[p], 1, 1);
  }
  double end = now_s() + seconds;
  int nlate;
  for (;;) {
    nlate = 0;
    for (int p = 0; p < e->size; p++)
      if (sent[p] && !atomic_load(&e->confirmed[p]) && !atomic_load(&e->dead[p])
          && atomic_load(&sent[p]->state) != B_FAILED)
        late[nlate++] = p;
    if (!nlate || atomic_load(&e->aborting) || now_s() >= end) break;
    usleep(200);
  }
  for (int p = 0; p < e->size; p++) if (sent[p]) batch_unref(sent[p]);
  free(sent);
  return nlate;
}

/* take the control messages that arrived after the standing receive was cancelled (a peer's goodbye that
   crossed ours), so the worker is destroyed with none unread (UCX warns of each on stderr) */
static void drain_ctrl(engine_t *e) {
  for (int i = 0; i < 8; i++) ucp_worker_progress(e->worker);
  for (int i = 0; i < 4 * e->size + 64; i++) {
    ucp_tag_recv_info_t info;
    ucp_tag_message_h m = ucp_tag_probe_nb(e->worker, CTRL_TAG, SEQ_MASK, 1, &info);
    if (!m) break;
    int64_t sink[CTRL_WORDS];
    ucp_request_param_t prm;
    memset(&prm, 0, sizeof prm);
    ucs_status_ptr_t r = ucp_tag_msg_recv_nbx(e->worker, sink, sizeof sink, m, &prm);
    e->ctrl_drained++;
    if (r == NULL || UCS_PTR_IS_ERR(r)) continue;
    double end = now_s() + 0.1;
    while (ucp_request_check_status(r) == UCS_INPROGRESS && now_s() < end) ucp_worker_progress(e->worker);
    ucp_request_free(r);
  }
}

/* stop the thread, end what is left (failed, done words written), close endpoints, worker and context;
   once (later calls return at once) */
void engine_close(engine_t *self) {
  if (atomic_exchange(&self->closed, 1)) return;
  int leak = 0;
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
    wake_engine(self);
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
    if (self->nactive && !self->no_rcache) {
      /* sends UCX cannot cancel: closing their endpoints ends them, while their batches live */
      close_eps(self);
      for (int i = 0; i < 100 && self->nactive; i++) { ucp_worker_progress(self->worker); finalize(self); }
    }
    leak = self->nactive > 0;
    for (int i = 0; i < self->nactive; i++) {  /* UCX never ended these: mark them, leak their requests */
      batch_t *b = self->active[i];
      atomic_fetch_add(&b->refs, 1);  /* and the batch: a late callback must not find it reused or freed */
      for (int k = 0; k < b->nops; k++)
        if (!b->ops[k].done) { b->ops[k].req = NULL; op_end(&b->ops[k], UCS_ERR_CANCELED, 0); }
    }
    finalize(self);
    if (self->ctrl_req) { ucp_request_cancel(self->worker, self->ctrl_req); ucp_worker_progress(self->worker);
                          ucp_request_free(self->ctrl_req); self->ctrl_req = NULL; }
    pthread_mutex_unlock(&self->wlock);
  }
  if (leak) {
    /* requests UCX still holds (see no_rcache): the worker and context are left to the process's end */
    self->worker = NULL;
    self->ctx = NULL;
  }
  if (self->worker) {
    close_eps(self);
    drain_ctrl(self);
    ucp_worker_destroy(self->worker);
    self->worker = NULL;
  }
  if (self->ctx) { ucp_cleanup(self->ctx); self->ctx = NULL; }
  if (self->wake >= 0) { close(self->wake); self->wake = -1; }
}

/* close, then free what engine_alloc allocated (the struct itself is the owner's) */
void engine_free(engine_t *e) {
  engine_close(e);
  free(e->eps); free(e->remote); free((void *)e->dead); free((void *)e->talked);
  free((void *)e->closing); free((void *)e->confirmed); free(e->send_seq); free(e->recv_seq);
  free(e->tpl_send); free(e->tpl_recv);
  free(e->active); free(e->fifo); free(e->armed);
  batch_spares_free(e);
}
