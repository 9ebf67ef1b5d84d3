/* The network engine's batches (_netcore.h): made (a staged one from the engine's spares), failed, released
   to the spares or freed, and handed to the engine's queue with their tags taken in submission order.
   Callers' threads and the engine thread alike use these; they call nothing else of the engine. */
#include "_netcore.h"

#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ----- batches ---------------------------------------------------------------------------------------- */
/* one allocation for the batch and its ops (a replay makes one per piece and lane) */
batch_t *batch_new(int nops, int bkind) {
  batch_t *b = calloc(1, sizeof(batch_t) + (nops > 0 ? (size_t)nops : 1) * sizeof(op_t));
  if (!b) return NULL;
  b->ops = (op_t *)(b + 1);
  b->nops = nops;
  b->bkind = bkind;
  b->epeer = -1;
  atomic_init(&b->refs, 1);
  atomic_init(&b->state, B_NEW);
  for (int i = 0; i < nops; i++) b->ops[i].b = b;
  return b;
}

/* a staged batch of up to SPARE_OPS messages (a piece on a lane sends and receives one each), reused from
   e's spares when one is free; the caller's thread only (replays and Engine.staged, under the GIL) */
#define SPARE_OPS 4
static batch_t *staged_from(engine_t *e, batch_t **own, int nops, uint64_t *made) {
  if (nops > SPARE_OPS) return batch_new(nops, BK_STAGED);
  if (!*own) *own = atomic_exchange(&e->spare, NULL);
  batch_t *b = *own;
  if (b) {  /* clear what a staged batch reads (not the error text, label and control words that follow) */
    *own = b->snext;
    memset(b, 0, offsetof(batch_t, err));
    b->err[0] = b->label[0] = 0;
    memset(b + 1, 0, (size_t)nops * sizeof(op_t));
  } else if (!(b = calloc(1, sizeof(batch_t) + SPARE_OPS * sizeof(op_t)))) {
    return NULL;
  } else if (made) {
    (*made)++;
  }
  b->ops = (op_t *)(b + 1);
  b->nops = nops;
  b->bkind = BK_STAGED;
  b->epeer = -1;
  b->home = e;
  atomic_init(&b->refs, 1);
  atomic_init(&b->state, B_NEW);
  for (int i = 0; i < nops; i++) b->ops[i].b = b;
  return b;
}

batch_t *batch_staged(engine_t *e, int nops) { return staged_from(e, &e->spare_own, nops, &e->staged_made); }

/* the same for the engine thread (wlock held): the pieces it makes of a piped step, from its own spares */
batch_t *batch_staged_engine(engine_t *e, int nops) { return staged_from(e, &e->spare_eng, nops, NULL); }

void batch_unref(batch_t *b) {
  if (atomic_fetch_sub(&b->refs, 1) != 1) return;
  engine_t *e = b->home;
  if (!e) { free(b); return; }
  b->snext = atomic_load(&e->spare);
  while (!atomic_compare_exchange_weak(&e->spare, &b->snext, b)) {}
}

/* the spares an engine holds, freed with it (every staged batch has ended by then: engine_close) */
void batch_spares_free(engine_t *e) {
  batch_t *lists[3] = {atomic_exchange(&e->spare, NULL), e->spare_own, e->spare_eng};
  e->spare_own = e->spare_eng = NULL;
  for (int i = 0; i < 3; i++)
    for (batch_t *b = lists[i], *n; b; b = n) { n = b->snext; free(b); }
}

void batch_fail(batch_t *b, int code, int peer, const char *fmt, ...) {
  if (b->ecode) return;
  b->ecode = code;
  b->epeer = peer;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(b->err, sizeof b->err, fmt, ap);
  va_end(ap);
}

/* queue a batch for the engine; ``wake``: rouse a sleeping engine thread (not needed when the caller is
   about to drive progress itself, as engine_wait does, which hands back to the thread before it sleeps) */
void submit_to(engine_t *e, batch_t *b, int take_ref, int wake) {
  if (take_ref) atomic_fetch_add(&b->refs, 1);
  b->qnext = NULL;
  submit_chain(e, b, b, wake);
}

/* queue batches head..tail (linked by qnext, tail's NULL, each holding one reference for the engine) in one
   hand-over: one lock and one store the engine's loop sees, however many pieces a replay made */
void submit_chain(engine_t *e, batch_t *head, batch_t *tail, int wake) {
  pthread_mutex_lock(&e->qlock);
  if (e->qtail) e->qtail->qnext = head; else e->qhead = head;
  e->qtail = tail;
  atomic_store(&e->queued, 1);
  pthread_mutex_unlock(&e->qlock);
  if (wake && atomic_load(&e->sleeping)) wake_engine(e);
}

/* rouse the engine thread from its poll() (callers check ``sleeping`` first where it may be awake) */
void wake_engine(engine_t *e) {
  uint64_t one = 1;
  atomic_fetch_add_explicit(&e->wakes, 1, memory_order_relaxed);
  ssize_t w = write(e->wake, &one, sizeof one);
  (void)w;
}

void submit(engine_t *e, batch_t *b, int take_ref) { submit_to(e, b, take_ref, 1); }

/* the tag of the next eager message of ``kind`` to or from ``peer``: per-pair sequence numbers taken in
   submission order, so both ends of a pair number their messages alike (caller's thread only) */
uint64_t eager_tag(engine_t *e, int kind, int peer) {
  return kind == K_SEND ? ((uint64_t)e->rank << RANK_SHIFT) | (e->send_seq[peer]++ & EAGER_MASK)
                        : ((uint64_t)peer << RANK_SHIFT) | (e->recv_seq[peer]++ & EAGER_MASK);
}

/* hand b (its ops filled in) to the engine as an eager GPU network step: tags now, in call order; posted
   once *ready reaches tok (gate: nonzero then, nothing is sent); *done = val when it ends, in FIFO order.
   ``wake`` 0: the caller wakes the engine once after its last submission (wake_if_sleeping) */
void submit_staged(engine_t *e, batch_t *b, uint64_t ready, uint32_t tok, uint64_t gate, uint64_t done,
                   uint32_t val, double timeout, const char *label, int wake) {
  stage_batch(e, b, ready, tok, gate, done, val, timeout, label);
  submit_to(e, b, 0, wake);  /* the engine's reference is the only one */
}

/* what submit_staged does short of queueing: tags taken now (in call order), words and label set */
void stage_batch(engine_t *e, batch_t *b, uint64_t ready, uint32_t tok, uint64_t gate, uint64_t done,
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
}

void wake_if_sleeping(engine_t *e) {
  if (atomic_load(&e->sleeping)) wake_engine(e);
}
