/* hpccl's compiled hot path for small host-memory collectives among the ranks of one node: its core, in
   plain C (no Python). _hotcore.c holds the protocol; hpccl._hotpath's Python type over it is _hotpath.c.

   Python costs several microseconds per call in validation, dispatch and flag polling, more than the
   data movement of a small collective. Here one C call validates the buffers, copies this rank's data
   into its shared-memory "hot" slot, publishes a counter, waits for the peers' counters and builds the
   result from every rank's slot in rank order (so every rank gets bitwise the same reduction).

   Protocol (per communicator; calls numbered f = 1, 2, ... by this path alone):
     1. wait until every peer has entered call f-1 (it has then finished reading call f-2's data, which
        used the same of the two slot parities);
     2. copy this rank's contribution into slot[f & 1] and publish counter = f (release store);
     3. wait for the counters of the ranks whose data this rank needs (acquire loads);
     4. build the output from their slots.
   A wait that outlasts a short spin returns 1 ("pending"): Python's Waiter then keeps calling resume(),
   with its timeout, abort and dead-peer checks, so no failure path lives here. Anything this code does
   not handle (a dtype, a layout, a size) returns -1 before any state changes; that decision depends only
   on the collective, dtype, count and op, which agree across ranks, so all ranks take the same path.

   Broadcast, all_gather, reduce_scatter and all_to_all from ``cma_min`` bytes per rank or a multiple
   (DIRECT_FROM; when every rank may read its peers' memory) move no data through the slots: the inputs
   are read (and, for broadcast, the outputs written) directly between processes
   (process_vm_readv/writev).
   Data a core has just written to a slot reaches another core slowly (a cache-to-cache transfer of every
   line), while a single copy out of the root's own buffer does not pay that, and the root shares the work:
   it writes the first part of every peer's output while the peers read the rest; in all_gather and
   all_to_all every rank reads its blocks out of every peer's input, and in reduce_scatter reduces its
   block from them chunk by chunk, in rank order. Every rank publishes the address of its
   input (broadcast: a peer its output; an input that overlaps its own output is first copied to private
   scratch, whose address goes out instead) in its header with the counter; each rank then publishes a
   "done" word (2f, or 2f+1 when the root did not write the head: a failed write, or the slow placement),
   a broadcast peer only once it has read all it needs of the root, and
   returns once the ranks whose memory it touched or who touch its memory are done: its input is free
   again on return. A read from a process that is gone leaves the call pending, naming that rank in
   waiting(), so the Waiter's dead-peer check reports it; any other failed read fails the call (HOT_FAILED,
   err and err_rank: the binding raises OSError naming the rank, hotcalls turns it into HpcclSystemError).
   Placement: a copy whose destination lies 1-63 bytes (mod 4096) after its source is 10-20x slower on CPUs
   with fast rep movsb (_copy.h). Local copies take hp_copy; a read at that placement bounces through a
   buffer at the source's offset (cma_read); the reduce chunks land at their sources' offsets; a root whose
   head write would meet it leaves the head to the peers' reads.
   Mapped memory: host buffers from comm.alloc_host are shared segments that every rank of the node maps
   (map()). A direct call whose peer buffer lies in one reads or writes it with hp_copy through that
   mapping, and reduces straight out of it, instead of process_vm_readv/writev, which costs about 2.6x a
   memcpy per byte on the CI machine; which path a move takes never changes whether a call goes direct. */
#ifndef HPCCL_HOTCORE_H
#define HPCCL_HOTCORE_H
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "_lathist.h"

#define MAXR 256

enum { K_AR, K_AG, K_BC, K_RS, K_BAR, K_RED, K_A2A, NKINDS }; /* hotpath.KINDS order */
enum { S_IDLE, S_PRE, S_WAIT, S_GATHER, S_DONE };
/* what hot_start and hot_advance return */
enum { HOT_DONE = 0, HOT_PENDING = 1, HOT_DECLINED = -1, HOT_FAILED = -2, HOT_NOMEM = -3 };

/* a shared segment of rank ``rank`` at ``remote`` in its address space, mapped here at ``local`` (this rank's
   own segments: local == remote, not mapped again) */
typedef struct {
  int rank;
  int64_t remote;
  ptrdiff_t len;
  char *local;
} Mapped;

/* where the words of a rank's shared-memory segment lie, in bytes from its base */
typedef struct {
  ptrdiff_t arrived, ctr, slot, addr, done;
} hot_layout;

typedef struct {
  int rank, n;
  ptrdiff_t cap;             /* bytes per slot */
  ptrdiff_t reduce_cap;      /* all_reduce's limit: every rank reads and reduces every rank's data */
  long spin;
  int64_t *arrived[MAXR];    /* each rank's arrival counter (the communicator's call sequence) */
  int64_t *ctr[MAXR];        /* each rank's hot-path counter */
  char *slot[MAXR];          /* each rank's two slots */
  int64_t *addr[MAXR];       /* each rank's buffer address of a direct call (header word) */
  int64_t *done[MAXR];       /* each rank's done word of a direct call: 2f, or 2f + 1 (root's writes failed;
                                all_reduce: its stripe could not be reduced) */
  int64_t *addr2[MAXR];      /* the word after addr: a direct all_reduce's output address; a direct
                                broadcast root's head */
  int64_t *done2[MAXR];      /* direct all_reduce: f once the rank has copied every peer's stripe */
  pid_t pid[MAXR];
  ptrdiff_t cma_min;         /* direct calls from DIRECT_FROM times this many bytes per rank; 0: never */
  char *scratch;             /* a direct call's private copy of an input that overlaps its output */
  ptrdiff_t scratch_cap;
  char *rtmp;                /* direct reduce_scatter: one chunk read from each rank (n pages-aligned parts of
                                RCHUNK + 4096 bytes, each read placed at its source's offset in the page) */
  char *bounce;              /* a read that would meet the slow placement lands here first (_copy.h) */
  Mapped *maps;              /* the node's alloc_host segments this rank maps (map()) */
  int nmaps, maps_cap;
  long long mapped_bytes;    /* bytes direct calls moved through those mappings (not process_vm_*) */
  int64_t f;                 /* this rank's hot-path calls */
  /* the caller's lock (the binding: the GIL) let go around long copies and direct moves; NULL: none */
  void *(*unlock)(void);
  void (*relock)(void *);
  /* the call in progress */
  int state, kind, op, dt, root, esize;
  ptrdiff_t nbytes;          /* this rank's contribution (all_gather: one block) */
  int direct;                /* the call in progress moves data between processes, not through slots */
  int err, err_rank;         /* errno of a failed direct read and the rank read (the call then fails) */
  const char *src;           /* what this rank publishes for peers to read: its input, or scratch */
  unsigned char got[MAXR];   /* direct all_reduce: the peers whose reduced stripe this rank has copied */
  int fetched;
  ptrdiff_t head;            /* direct broadcast: the bytes of each peer's output the root writes */
  char *send, *recv;         /* the call's input and output (recv == send in place) */
  int have_recv;             /* an output apart from the input was given */
  /* counters per entry (0: a front door, 1: the validated path) and collective (comm.stats(), metrics):
     completed calls, this rank's bytes, seconds inside them; with ``latency``, each call's time in hist */
  double t0;
  int via, latency;
  long long n_calls[2][NKINDS], n_bytes[2][NKINDS];
  double n_secs[2][NKINDS];
  long long hist[2][NKINDS][LAT_BUCKETS];
} hot_t;

/* Set up over n ranks' segments (bases[r]: rank r's base here; the caller has checked 1 <= n <= MAXR,
   0 <= rank < n and cap >= 0). */
void hot_init(hot_t *h, int n, int rank, char *const *bases, const pid_t *pids, const hot_layout *at,
              ptrdiff_t cap, ptrdiff_t reduce_cap, ptrdiff_t cma_min, long spin);
/* Free the private buffers and unmap every mapped segment. */
void hot_free(hot_t *h);
/* Start call ``kind`` (idle only) on send[0:nbytes] of dtype dt (esize bytes an element) into
   recv[0:recv_len], or in place when recv_len < 0 (barrier: no buffers); seq is the communicator's call
   number. HOT_DECLINED (nothing changed) when this path does not take it, HOT_NOMEM when a direct call's
   scratch cannot be allocated (not a decline: the other ranks go direct), else as hot_advance. */
int hot_start(hot_t *h, int kind, int op, int root, int dt, int esize, char *send, ptrdiff_t nbytes, char *recv,
              ptrdiff_t recv_len, int64_t seq);
/* Drive the call in progress: HOT_DONE, HOT_PENDING (a peer is late: call again), or HOT_FAILED (a direct
   read failed: err, err_rank); done or failed, the call is over (S_IDLE) and its buffers free. */
int hot_advance(hot_t *h);
/* Drop the call in progress (after a failure); a direct one marks this rank LEFT first, so no peer
   returns data read from an input that may be freed from then on. */
void hot_cancel(hot_t *h);
/* Whether the call in progress still waits for rank r. */
int hot_late(const hot_t *h, int r);
/* Rank r's alloc_host segment at ``remote`` (its address there), len bytes, is the file fd: mapped here
   (this rank's own: fd -1, recorded only). 0; -1 bad arguments or during a call; -2 no memory for the
   table; else mmap's errno. */
int hot_map(hot_t *h, int r, int64_t remote, ptrdiff_t len, int fd);
/* Unmap rank r's segment at ``remote``: 1 done, 0 not mapped, -1 during a call. */
int hot_unmap(hot_t *h, int r, int64_t remote);

#endif
