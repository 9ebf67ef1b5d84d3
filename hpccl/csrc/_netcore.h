/* hpccl's network engine core, in plain C (no Python): one UCP worker per communicator, driven by a
   progress thread that never takes the GIL and never calls CUDA. _netbatch.c makes and queues batches,
   _netctrl.c keeps the control channel, _netcore.c is the engine thread's side (batches posted and ended,
   failures, timeouts, abort, templates' arm words), _netcalls.c the callers' side (set-up, connect,
   waiting, templates, queries, close). The Python types over it are declared in _netpy.h.

   Work arrives as batches of tagged sends and receives of host memory:
     * from the caller's thread (host collectives, and GPU network steps staged through pinned host
       memory): tags come from per-peer sequence numbers assigned at submission, in call order;
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
   every batch that waits for it (receives from it are cancelled), and is reported by engine_dead(). A
   batch older than its timeout is cancelled and named with the ranks it still waits for. engine_abort()
   fails everything in flight. A failed batch still writes its done word, so no stream stays blocked.

   tag = sender rank << 40 | 40 bits: eager (bit 39 clear) bit 38 set for the user's point-to-point messages
   (what probe() and a receive from any source match) | a per-pair sequence number (38 bits); graph (bit 39
   set) template number of the pair (16 bits: the templates with a message from sender to receiver, counted
   alike at both ends in capture order) | replay (16 bits) | index among the template's messages to that
   peer (7 bits);
   all 40 bits set is the control tag (abort, survey). */
#ifndef HPCCL_NETCORE_H
#define HPCCL_NETCORE_H
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>
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
/* control kinds the engine answers itself (hpccl/transport/control.py owns 1-3): a peer closing its engine
   (engine_farewell) and the confirmation that every message it sent before that has been read */
#define CTRL_CLOSING 4
#define CTRL_CLOSED 5

enum { K_SEND = 0, K_RECV = 1 };
enum { B_NEW = 0, B_ACTIVE = 1, B_DONE = 2, B_FAILED = 3 };
enum { BK_OP = 0, BK_STAGED = 1, BK_TEMPLATE = 2, BK_PIPE = 3 };
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
  struct engine *home;       /* a spare-capable batch (batch_staged): back to this engine's spares when done */
  batch_t *snext;            /* the spares' list */
  atomic_int refs;           /* the engine's (while queued or active) and the owner's */
  atomic_int state;
  int bkind, nops, left, unsent;
  op_t *ops;                 /* nops of them, allocated with the batch (batch_new) */
  volatile uint32_t *ready; uint32_t ready_tok;  /* sends wait for *ready >= ready_tok (wrap-safe) */
  volatile uint32_t *gate;   /* nonzero when the token comes: the staged data is not whole, send nothing;
                                set (ERR_NET_WORD) when this batch fails, before its done word */
  volatile uint32_t *done; uint32_t done_val;    /* written when the batch ends, ok or not */
  int ordered;               /* an eager batch with a done word: done words written in FIFO order */
  double t0, timeout;        /* timeout 0: none (the caller's waiter has one) */
  int ecode, epeer;
  /* templates */
  struct engine *eng;
  _Atomic uint32_t replays;
  volatile uint32_t *arm;    /* set to 1 by the graph at each replay; the engine clears it and reposts */
  batch_t *anext;            /* the queue of templates to hold (qlock) */
  int finished;              /* engine thread: every op ended */
  int released;              /* engine thread: failed, its done word given back while UCX still holds sends
                                it cannot cancel (the batch stays active, and referenced, until they end) */
  int fdone;                 /* engine thread: an ordered batch whose done word may be written in its turn */
  int isctrl;                /* a control message: an abort does not cancel it (it may carry the abort) */
  /* last, so a reused batch clears only what comes before err (batch_staged) */
  char err[256];
  char label[96];
  int64_t ctrl[CTRL_WORDS];  /* a control message's payload (the batch owns it) */
  /* BK_PIPE: a piped step's pieces on one lane (a replay hands one per lane), which the engine thread makes
     into staged batches (expand_pipe): piece g = lane + i * lanes for i < k, its send (g < ks) of bytes
     [g * ps, min((g + 1) * ps, ns)) of sbase to speer, its receive (g < kr) likewise into rbase from rpeer,
     ready token t0 + g, done value v0 + i; tags from this lane's sequence numbers sseq and rseq on (the
     caller reserved them), as Engine.staged would have taken them piece by piece */
  struct {
    int k, lane, lanes, ks, kr, speer, rpeer;
    char *sbase, *rbase;
    uint64_t ps, pr, ns, nr, sseq, rseq;
    uint32_t t0, v0;
  } pipe;
};

/* one engine; zeroed before engine_alloc (the Python Engine object embeds it) */
typedef struct engine {
  int rank, size;
  ucp_context_h ctx;
  ucp_worker_h worker;
  ucp_ep_h *eps;
  int *remote;
  int efd;                   /* the worker's event fd (wakeup feature), -1 without */
  int wake;                  /* eventfd: submissions wake a sleeping engine */
  pthread_t thread;
  int started;
  int no_rcache;             /* UCX runs without its registration cache (engine_start_ucx reads its settings) */
  atomic_int stop, sleeping, aborting;
  pthread_mutex_t qlock;
  pthread_mutex_t wlock;      /* the worker and the engine-thread state: held by whoever progresses */
  atomic_int driving;        /* callers spinning on progress themselves */
  atomic_int nactive_pub;
  batch_t *qhead, *qtail;
  batch_t *aqhead;           /* templates to hold (arm words to poll), taken by the engine thread (qlock) */
  _Atomic(batch_t *) spare; /* staged batches done (pushed by whoever drops the last reference), taken whole
                                by the caller's thread into spare_own: a replay's pieces cost no malloc */
  batch_t *spare_own;        /* caller's thread (under the GIL) */
  batch_t *spare_eng;        /* the engine thread's (wlock): pieces it makes of a piped step (BK_PIPE) */
  uint64_t staged_made;      /* staged batches allocated, not reused (caller's thread) */
  atomic_int queued;         /* set (under qlock) when either queue gets work: the engine's loop reads it
                                before taking qlock, so a spinning engine does not contend with submitters */
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
  atomic_int *talked;        /* per peer: a message was posted to or from it (engine_farewell says goodbye) */
  atomic_int *closing;       /* per peer: it said it is closing, so its connection's end is no failure */
  atomic_int *confirmed;     /* per peer: it confirmed this engine's goodbye (read all it was sent) */
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
  _Atomic double hold_until; /* fault injection (Engine.hold): the thread does nothing until then */
  atomic_ullong beats;       /* rounds of the engine thread's loop: a watchdog tells a stopped thread by them */
  uint64_t batches_done, bytes_sent, bytes_recv;
  atomic_int lingering;      /* released batches whose sends UCX still holds (may still read their memory) */
  _Atomic uint64_t wakes;    /* write(2)s that roused this engine's thread (Engine.wakes) */
  uint64_t ctrl_drained;     /* control messages engine_close took after its standing receive was gone */
} engine_t;

/* why a call of _netcalls.c failed; the binding raises the matching exception */
enum { NE_NOMEM = 1, NE_VERSION, NE_VALUE, NE_RUNTIME, NE_ERRNO, NE_PEER, NE_SETTING };
typedef struct {
  int kind;                  /* NE_*: MemoryError, ImportError, ValueError, RuntimeError, OSError (errno),
                                EngineError (E_PEER, peer, msg), ValueError naming setting ``at`` */
  int peer, err_no, at;
  char msg[256];
} ne_err;

/* The engine's C, one way down: _netcalls.c (callers' threads) -> _netcore.c (the engine thread) ->
   _netctrl.c (control messages) -> _netbatch.c (batches); nothing below calls a file above it
   (tests/test_imports.py checks it). */

/* ----- _netbatch.c: batches made, failed, released, queued ----- */
batch_t *batch_new(int nops, int bkind);
batch_t *batch_staged(engine_t *e, int nops);
batch_t *batch_staged_engine(engine_t *e, int nops);
void batch_unref(batch_t *b);
void batch_spares_free(engine_t *e);
void batch_fail(batch_t *b, int code, int peer, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
void submit_to(engine_t *e, batch_t *b, int take_ref, int wake);
void submit_chain(engine_t *e, batch_t *head, batch_t *tail, int wake);
void submit(engine_t *e, batch_t *b, int take_ref);
uint64_t eager_tag(engine_t *e, int kind, int peer);
void submit_staged(engine_t *e, batch_t *b, uint64_t ready, uint32_t tok, uint64_t gate, uint64_t done,
                   uint32_t val, double timeout, const char *label,
                   int wake);
void stage_batch(engine_t *e, batch_t *b, uint64_t ready, uint32_t tok, uint64_t gate, uint64_t done,
                 uint32_t val, double timeout, const char *label);
void wake_if_sleeping(engine_t *e);
void wake_engine(engine_t *e);

/* ----- _netctrl.c: the control channel ----- */
void post_ctrl_recv(engine_t *e);
int ctrl_progress(engine_t *e);
batch_t *engine_ctrl_batch(engine_t *e, int peer, int64_t kind, int64_t who, int64_t seq);

/* ----- _netcore.c: the engine thread (and a caller driving progress in its place, wlock held) ----- */
void op_end(op_t *o, ucs_status_t st, size_t got);
void ep_err_cb(void *arg, ucp_ep_h ep, ucs_status_t st);
int drain(engine_t *e);
int finalize(engine_t *e);
void cancel_batch(engine_t *e, batch_t *b, int only_peer);
int engine_step(engine_t *e);
void *engine_loop(void *arg);

/* ----- _netcalls.c: what callers' threads ask of an engine (GIL released by the binding where it may
   block) ----- */
int engine_version_check(ne_err *err);
int engine_alloc(engine_t *e, int rank, int size, ne_err *err);
int engine_start_ucx(engine_t *e, int nset, const char *const *keys, const char *const *vals, ne_err *err);
int engine_connect(engine_t *e, const char *const *addrs, const int *remote, ne_err *err);
int engine_address(engine_t *e, ucp_address_t **addr, size_t *len, ne_err *err);
void engine_address_free(engine_t *e, ucp_address_t *addr);
char *engine_info(engine_t *e, size_t *len);
int engine_probe(engine_t *e, int peer);
int engine_wait(engine_t *e, batch_t *b, double seconds);
void engine_try_step(engine_t *e);
int engine_batch_error(engine_t *e, batch_t *b, int *ecode, int *epeer, char err[256]);
void engine_cancel(engine_t *e, batch_t *b);
int engine_template_prepare(engine_t *e, batch_t *b, uint64_t done, uint64_t arm, double timeout,
                            const char *label);
void engine_template_hold(engine_t *e, batch_t *b);
void engine_template_retire(engine_t *e, batch_t *b);
int engine_dead(engine_t *e, char *why, size_t n);
int engine_error(engine_t *e, int *epeer, char *msg, size_t n);
void engine_abort(engine_t *e, int origin);
void engine_counters(engine_t *e, uint64_t *batches, uint64_t *sent, uint64_t *got);
int engine_farewell(engine_t *e, double seconds, int *late);
void engine_close(engine_t *e);
void engine_free(engine_t *e);

/* control messages that arrived: ring slots [*head, returned tail); engine_ctrl_taken() frees them */
static inline int engine_ctrl_pending(engine_t *e, int *head) {
  *head = atomic_load(&e->ctrl_head);
  return atomic_load(&e->ctrl_tail);
}
static inline const int64_t *engine_ctrl_at(engine_t *e, int i) { return e->ctrl_ring[i % CTRL_RING]; }
static inline void engine_ctrl_taken(engine_t *e, int head) { atomic_store(&e->ctrl_head, head); }

/* whether the engine can take work now (open, connected, not aborting, no GPU step failed) */
static inline int engine_usable(engine_t *e) {
  return !atomic_load(&e->closed) && e->started && !atomic_load(&e->aborting) &&
         !__atomic_load_n(&e->first_ecode, __ATOMIC_ACQUIRE);
}
#endif
