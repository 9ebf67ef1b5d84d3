/* hpccl's compiled hot path for small host-memory collectives among the ranks of one node.

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
   waiting(), so the Waiter's dead-peer check reports it; any other failed read raises OSError naming the
   rank (hotcalls turns it into HpcclSystemError).
   Placement: a copy whose destination lies 1-63 bytes (mod 4096) after its source is 10-20x slower on CPUs
   with fast rep movsb (_copy.h). Local copies take hp_copy; a read at that placement bounces through a
   buffer at the source's offset (cma_read); the reduce chunks land at their sources' offsets; a root whose
   head write would meet it leaves the head to the peers' reads.
   Mapped memory: host buffers from comm.alloc_host are shared segments that every rank of the node maps
   (map()). A direct call whose peer buffer lies in one reads or writes it with hp_copy through that
   mapping, and reduces straight out of it, instead of process_vm_readv/writev, which costs about 2.6x a
   memcpy per byte on the CI machine; which path a move takes never changes whether a call goes direct. */
#define _GNU_SOURCE
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <time.h>

#include "_copy.h"
#include "_reduce.h"

#define MAXR 256
#define BLOCK 8192 /* bytes reduced per pass over the sources (stays in L1) */
#define BIG 65536  /* copies of at least this many bytes run without the GIL (the buffers are held) */
/* a done word's value once its rank left a direct call it failed in (cancel()): the input it published may
   be freed and reused from then on, so a peer that read it must not return that data as the result */
#define LEFT INT64_MAX
#define RCHUNK 65536 /* direct reduce_scatter reads each peer's part in chunks of this many bytes */
#define BOUNCE 65536 /* a read at the slow placement goes through a bounce buffer in pieces of this size */


enum { K_AR, K_AG, K_BC, K_RS, K_BAR, K_RED, K_A2A, NKINDS };
enum { S_IDLE, S_PRE, S_WAIT, S_GATHER, S_DONE };
/* Per collective: it goes direct from this many times cma_min bytes per rank (0: never). Measured at 2
   ranks against the slots: all_to_all's reads are one block per peer; with the copies placement-proof
   (_copy.h) direct took 15.7-17.8 us at 128 KiB against the slots' 20.3-37.0 (hpccl-perf, 2 runs), at 64
   KiB 10.6-15.5 against 9.5-22.8; reduce_scatter's at 16 KiB (8.5 us against 14); all_reduce's at 64 KiB
   (24 against 17; even at 128 KiB, 118 against 282 at 256 KiB); reduce always uses the slots.
   A direct all_reduce reduces its own stripe from every rank's input (published done 2f), then copies
   every peer's reduced stripe out of that peer's output once it is published (done2 = f). */
static const int DIRECT_FROM[NKINDS] = {[K_AR] = 16, [K_AG] = 1, [K_BC] = 1, [K_RS] = 4, [K_A2A] = 8};

/* a shared segment of rank ``rank`` at ``remote`` in its address space, mapped here at ``local`` (this rank's
   own segments: local == remote, not mapped again) */
typedef struct {
  int rank;
  int64_t remote;
  Py_ssize_t len;
  char *local;
} Mapped;

typedef struct {
  PyObject_HEAD
  int rank, n;
  Py_ssize_t cap;            /* bytes per slot */
  Py_ssize_t reduce_cap;     /* all_reduce's limit: every rank reads and reduces every rank's data */
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
  Py_ssize_t cma_min;        /* direct calls from DIRECT_FROM times this many bytes per rank; 0: never */
  char *scratch;             /* a direct call's private copy of an input that overlaps its output */
  Py_ssize_t scratch_cap;
  char *rtmp;                /* direct reduce_scatter: one chunk read from each rank (n pages-aligned parts of
                                RCHUNK + 4096 bytes, each read placed at its source's offset in the page) */
  char *bounce;              /* a read that would meet the slow placement lands here first (_copy.h) */
  Mapped *maps;              /* the node's alloc_host segments this rank maps (map()) */
  int nmaps, maps_cap;
  long long mapped_bytes;    /* bytes direct calls moved through those mappings (not process_vm_*) */
  int64_t f;                 /* this rank's hot-path calls */
  /* the call in progress */
  int state, kind, op, dt, root, esize;
  Py_ssize_t nbytes;         /* this rank's contribution (all_gather: one block) */
  int direct;                /* the call in progress moves data between processes, not through slots */
  int err, err_rank;         /* errno of a failed direct read and the rank read (the call then fails) */
  const char *src;           /* what this rank publishes for peers to read: its input, or scratch */
  unsigned char got[MAXR];   /* direct all_reduce: the peers whose reduced stripe this rank has copied */
  int fetched;
  Py_ssize_t head;           /* direct broadcast: the bytes of each peer's output the root writes */
  Py_buffer send, recv;
  int have_send, have_recv;
  /* counters per collective (comm.stats()): completed calls, this rank's bytes, seconds inside them */
  double t0;
  long long n_calls[NKINDS], n_bytes[NKINDS];
  double n_secs[NKINDS];
} Hot;

static inline double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline int64_t ld_acq(const int64_t *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
static inline void st_rel(int64_t *p, int64_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
static inline void relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

static void release(Hot *h) {
  if (h->have_send) PyBuffer_Release(&h->send);
  if (h->have_recv) PyBuffer_Release(&h->recv);
  h->have_send = h->have_recv = 0;
  h->state = S_IDLE;
}

/* a call's end, slot path or direct: counted for comm.stats(), its buffers released */
static void complete(Hot *h) {
  h->n_calls[h->kind] += 1;
  h->n_bytes[h->kind] += h->nbytes;
  h->n_secs[h->kind] += now() - h->t0;
  release(h);
}

static inline char *slot_of(Hot *h, int r, int64_t f) { return h->slot[r] + (f & 1) * h->cap; }

/* out[0:nbytes] = reduction over every rank of bytes [off, off + nbytes) of its slot */
static void reduce_slots(Hot *h, char *out, Py_ssize_t off, Py_ssize_t nbytes) {
  char *src[MAXR];
  for (Py_ssize_t b = 0; b < nbytes; b += BLOCK) {
    Py_ssize_t len = nbytes - b < BLOCK ? nbytes - b : BLOCK;
    for (int r = 0; r < h->n; r++) src[r] = slot_of(h, r, h->f) + off + b;
    hp_copy(out + b, src[0], len);
    reduce_block(out + b, src, h->n, len / h->esize, h->dt, h->op);
  }
  if (h->op == OP_AVG) avg_scale(out, nbytes / h->esize, h->dt, h->n);
}

/* ---- direct calls: broadcast, all_gather, all_to_all ---- */
/* Move len bytes between this process's ``local`` and process pid's ``remote``; 0 or an errno. */
static int cma_move(pid_t pid, char *local, int64_t remote, Py_ssize_t len, int write) {
  Py_ssize_t off = 0;
  while (off < len) {
    struct iovec l = {local + off, (size_t)(len - off)}, r = {(void *)(uintptr_t)(remote + off), (size_t)(len - off)};
    ssize_t got = write ? process_vm_writev(pid, &l, 1, &r, 1, 0) : process_vm_readv(pid, &l, 1, &r, 1, 0);
    if (got < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (got == 0) return EIO;
    off += got;
  }
  return 0;
}

/* Read len bytes at process pid's ``remote`` into dst: straight in, or, where dst lies at the slow placement
   from remote (_copy.h), through the bounce buffer placed at remote's offset in its page, then hp_copy. */
static int cma_read(Hot *h, pid_t pid, char *dst, int64_t remote, Py_ssize_t len) {
  if (!hp_bad_gap(dst, (const void *)(uintptr_t)remote)) return cma_move(pid, dst, remote, len, 0);
  if (h->bounce == NULL && (h->bounce = aligned_alloc(4096, BOUNCE + 4096)) == NULL) return ENOMEM;
  for (Py_ssize_t off = 0; off < len; off += BOUNCE) {
    Py_ssize_t l = len - off < BOUNCE ? len - off : BOUNCE;
    char *b = h->bounce + ((remote + off) & 4095);
    int e = cma_move(pid, b, remote + off, l, 0);
    if (e) return e;
    hp_copy(dst + off, b, (size_t)l);
  }
  return 0;
}

/* Where rank r's [remote, remote + len) is mapped in this process, or NULL. */
static char *mapped(Hot *h, int r, int64_t remote, Py_ssize_t len) {
  for (int i = 0; i < h->nmaps; i++) {
    Mapped *m = &h->maps[i];
    if (m->rank == r && remote >= m->remote && remote + len <= m->remote + m->len) return m->local + (remote - m->remote);
  }
  return NULL;
}

/* Move len bytes between this process's ``local`` and rank r's ``remote``: through the mapping of an
   alloc_host segment when it lies in one, else by cross-memory attach; 0 or an errno. */
static int peer_move(Hot *h, int r, char *local, int64_t remote, Py_ssize_t len, int write) {
  char *p = mapped(h, r, remote, len);
  if (p != NULL) {
    if (write)
      hp_copy(p, local, (size_t)len);
    else
      hp_copy(local, p, (size_t)len);
    h->mapped_bytes += len;
    return 0;
  }
  return write ? cma_move(h->pid[r], local, remote, len, 1) : cma_read(h, h->pid[r], local, remote, len);
}

/* The root writes the first ``head`` bytes of every peer's output, the peers read the rest: (n-1) * head
   for the root, nbytes - head for each peer; a root out of place also copies nbytes to its own output, so
   it takes half as much. Only the root knows whether it is in place: it publishes head (in its second
   address word) with its counter, and the peers read it there (direct_part). A root whose input is mapped
   by its peers (alloc_host) shares by bytes, as every move then costs a memcpy: out of place it writes
   nothing to them (its local copy already equals a peer's read), in place nbytes/n to each. */
static Py_ssize_t direct_head(Hot *h) {
  int out_of_place = h->have_recv && h->recv.buf != h->send.buf;
  Py_ssize_t head;
  if (mapped(h, h->rank, (int64_t)(uintptr_t)h->send.buf, h->nbytes))
    head = out_of_place ? 0 : h->nbytes / h->n;
  else
    head = h->nbytes / (out_of_place ? 2 * h->n : h->n);
  return head < 4096 ? 0 : head & ~(Py_ssize_t)4095;
}

static void read_from(Hot *h, int r, char *dst, Py_ssize_t off, Py_ssize_t len) {
  if (h->err || len == 0) return;
  h->err = peer_move(h, r, dst, ld_acq(h->addr[r]) + off, len, 0);
  if (h->err) h->err_rank = r;
}

/* out[0:len] = the reduction over every rank of bytes [off, off + len) of its published input, in rank
   order (as the slots' path reduces), reading the peers' parts chunk by chunk into rtmp. */
static void reduce_from_peers(Hot *h, char *out, Py_ssize_t off, Py_ssize_t len) {
  char *src[MAXR], *part[MAXR];
  for (Py_ssize_t b = 0; b < len; b += RCHUNK) {
    Py_ssize_t l = len - b < RCHUNK ? len - b : RCHUNK;
    for (int r = 0; r < h->n; r++) {
      src[r] = h->rtmp + (Py_ssize_t)r * (RCHUNK + 4096);
      if (r != h->rank) {
        int64_t at = ld_acq(h->addr[r]) + off + b;
        char *p = mapped(h, r, at, l);
        if (p != NULL) { /* reduced where it lies */
          src[r] = p, h->mapped_bytes += l;
          continue;
        }
        src[r] += at & 4095; /* at its source's offset: never the slow placement */
        read_from(h, r, src[r], off + b, l);
      } else if (h->src + off + b == out + b) { /* in place: the output chunk is written before it is read */
        hp_copy(src[r], h->src + off + b, l);
      } else {
        src[r] = (char *)h->src + off + b;
      }
    }
    if (h->err) return;
    for (Py_ssize_t c = 0; c < l; c += BLOCK) {
      Py_ssize_t cl = l - c < BLOCK ? l - c : BLOCK;
      for (int r = 0; r < h->n; r++) part[r] = src[r] + c;
      hp_copy(out + b + c, part[0], cl);
      reduce_block(out + b + c, part, h->n, cl / h->esize, h->dt, h->op);
    }
    if (h->op == OP_AVG) avg_scale(out + b, l / h->esize, h->dt, h->n);
  }
}

/* Rank q's stripe of an all_reduce: [*off, *off + *len) bytes, whole elements. */
static void stripe(Hot *h, int q, Py_ssize_t *off, Py_ssize_t *len) {
  Py_ssize_t cnt = h->nbytes / h->esize, lo = cnt * q / h->n, hi = cnt * (q + 1) / h->n;
  *off = lo * h->esize, *len = (hi - lo) * h->esize;
}

/* Direct all_reduce, second half: copy the reduced stripe of every peer that has published its own
   (done 2f) out of that peer's output; once all are copied, publish done2 = f. */
static void gather_stripes(Hot *h) {
  int64_t f = h->f;
  for (int k = 1; k < h->n; k++) {
    int r = (h->rank + k) % h->n;
    if (h->got[r]) continue;
    int64_t d = ld_acq(h->done[r]);
    if (d < 2 * f) continue;
    h->got[r] = 1, h->fetched++;
    if (h->err) continue;
    if (d == 2 * f + 1) { /* its stripe was never reduced: fail too, naming it */
      h->err = EIO, h->err_rank = r;
      continue;
    }
    Py_ssize_t off, len;
    stripe(h, r, &off, &len);
    if (len && (h->err = peer_move(h, r, (char *)h->recv.buf + off, ld_acq(h->addr2[r]) + off, len, 0)))
      h->err_rank = r;
  }
  if (h->fetched == h->n - 1) st_rel(h->done2[h->rank], f);
}

/* This rank's part of a direct call; done word published after it. */
static void direct_part(Hot *h) {
  int64_t f = h->f, mark = 2 * f;
  char *out = (char *)h->recv.buf;
  if (h->kind == K_RS) {
    Py_ssize_t blk = h->nbytes / h->n;
    reduce_from_peers(h, out, (Py_ssize_t)h->rank * blk, blk);
  } else if (h->kind == K_AR) {
    Py_ssize_t off, len;
    stripe(h, h->rank, &off, &len);
    if (len) reduce_from_peers(h, out + off, off, len);
    if (h->err) mark = 2 * f + 1;
  } else if (h->kind == K_AG || h->kind == K_A2A) {
    Py_ssize_t blk = h->kind == K_AG ? h->nbytes : h->nbytes / h->n;
    Py_ssize_t off = h->kind == K_AG ? 0 : (Py_ssize_t)h->rank * blk;
    for (int k = 1; k < h->n; k++) { /* from the next rank on, so the ranks spread over their peers */
      int r = (h->rank + k) % h->n;
      read_from(h, r, out + (Py_ssize_t)r * blk, off, blk);
    }
  } else if (h->rank == h->root) {
    for (int r = 0; r < h->n && h->head; r++) { /* a write at the slow placement: the peers read it instead */
      int64_t at = ld_acq(h->addr[r]);
      if (r != h->rank && !mapped(h, r, at, h->head) && hp_bad_gap((void *)(uintptr_t)at, h->send.buf))
        mark = 2 * f + 1;
    }
    for (int r = 0; r < h->n && h->head && mark == 2 * f; r++) {
      if (r == h->rank) continue;
      if (peer_move(h, r, (char *)h->send.buf, ld_acq(h->addr[r]), h->head, 1) != 0) {
        mark = 2 * f + 1; /* the peers read the head themselves */
        break;
      }
    }
    if (h->recv.buf != h->send.buf) hp_move(h->recv.buf, h->send.buf, h->nbytes); /* peers read src */
  } else { /* a broadcast peer publishes its done word once it has the root's mark (advance) */
    h->head = (Py_ssize_t)ld_acq(h->addr2[h->root]);
    read_from(h, h->root, out + h->head, h->head, h->nbytes - h->head);
    return;
  }
  st_rel(h->done[h->rank], mark);
}

/* Whether the ranks this one depends on (the root: every peer; a peer: the root) are done. */
static int direct_ready(Hot *h) {
  if (h->kind == K_AR) {
    for (int r = 0; r < h->n; r++)
      if (r != h->rank && ld_acq(h->done2[r]) < h->f) return 0;
    return 1;
  }
  if (h->kind == K_BC && h->rank != h->root) return ld_acq(h->done[h->root]) >= 2 * h->f;
  for (int r = 0; r < h->n; r++)
    if (r != h->rank && ld_acq(h->done[r]) < 2 * h->f) return 0;
  return 1;
}

/* Whether a peer left the direct call in progress (it failed: LEFT in its done word); checked after this
   rank's reads, which it orders before the check: a read that met a buffer the peer freed after leaving
   comes after its LEFT, so the check sees it. */
static int peer_left(Hot *h) {
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
  for (int r = 0; r < h->n; r++)
    if (r != h->rank && ld_acq(h->done[r]) == LEFT) return 1;
  return 0;
}

/* ---- the protocol ---- */
static int peers_at(Hot *h, int64_t v) {
  for (int r = 0; r < h->n; r++)
    if (r != h->rank && ld_acq(h->ctr[r]) < v) return 0;
  return 1;
}

static int needed_ready(Hot *h) {
  if (h->direct && (h->kind != K_BC || h->rank == h->root)) return peers_at(h, h->f);
  if (h->kind == K_BC) return h->rank == h->root || ld_acq(h->ctr[h->root]) >= h->f;
  if (h->kind == K_RED) return h->rank != h->root || peers_at(h, h->f);
  return peers_at(h, h->f);
}

static void publish(Hot *h) {
  if (h->direct) {
    st_rel(h->addr[h->rank], (int64_t)(uintptr_t)(h->kind == K_BC && h->rank != h->root ? h->recv.buf : h->src));
    if (h->kind == K_AR) st_rel(h->addr2[h->rank], (int64_t)(uintptr_t)h->recv.buf);
    if (h->kind == K_BC && h->rank == h->root) st_rel(h->addr2[h->rank], (int64_t)h->head);
    st_rel(h->ctr[h->rank], h->f);
    if (h->kind == K_AG || h->kind == K_A2A) { /* this rank's own block, while the peers arrive (they read the
                                                  published input, never this output) */
      Py_ssize_t blk = h->kind == K_AG ? h->nbytes : h->nbytes / h->n, off = h->kind == K_AG ? 0 : (Py_ssize_t)h->rank * blk;
      char *mine = (char *)h->recv.buf + (Py_ssize_t)h->rank * blk;
      if (mine != h->src + off) hp_move(mine, h->src + off, blk);
    }
    return;
  }
  if (h->kind != K_BAR && (h->kind != K_BC || h->rank == h->root))
    hp_copy(slot_of(h, h->rank, h->f), h->send.buf, h->nbytes);
  st_rel(h->ctr[h->rank], h->f);
}

static void finish(Hot *h) {
  char *out = (char *)h->recv.buf;
  switch (h->kind) {
    case K_AR: reduce_slots(h, out, 0, h->nbytes); break;
    case K_RS: reduce_slots(h, out, (Py_ssize_t)h->rank * (h->nbytes / h->n), h->nbytes / h->n); break;
    case K_RED:
      if (h->rank == h->root) reduce_slots(h, out, 0, h->nbytes);
      break;
    case K_A2A: {
      Py_ssize_t blk = h->nbytes / h->n;
      for (int r = 0; r < h->n; r++) hp_copy(out + (Py_ssize_t)r * blk, slot_of(h, r, h->f) + (Py_ssize_t)h->rank * blk, blk);
      break;
    }
    case K_AG:
      for (int r = 0; r < h->n; r++) hp_copy(out + (Py_ssize_t)r * h->nbytes, slot_of(h, r, h->f), h->nbytes);
      break;
    case K_BC:
      if (h->rank != h->root)
        hp_copy(out, slot_of(h, h->root, h->f), h->nbytes);
      else if (h->have_recv)
        hp_move(out, h->send.buf, h->nbytes);
      break;
  }
}

/* Drive the call in progress: 0 done, 1 still waiting on a peer. */
static int advance(Hot *h) {
  long budget = h->spin;
  int yields = 0;
  for (;;) {
    if (h->state == S_PRE && peers_at(h, h->f - 1)) {
      if (h->nbytes >= BIG) {
        Py_BEGIN_ALLOW_THREADS publish(h);
        Py_END_ALLOW_THREADS
      } else {
        publish(h);
      }
      h->state = S_WAIT;
    }
    if (h->state == S_WAIT && h->direct && needed_ready(h)) {
      Py_BEGIN_ALLOW_THREADS direct_part(h);
      Py_END_ALLOW_THREADS
      h->state = h->kind == K_AR ? S_GATHER : S_DONE;
    }
    if (h->state == S_GATHER) {
      if (h->nbytes >= BIG) {
        Py_BEGIN_ALLOW_THREADS gather_stripes(h);
        Py_END_ALLOW_THREADS
      } else {
        gather_stripes(h);
      }
      if (h->fetched == h->n - 1) h->state = S_DONE;
    }
    if (h->state == S_DONE && direct_ready(h)) {
      if (peer_left(h)) return 1; /* the Waiter's abort check (the peer aborted as it left) raises */
      if (h->kind == K_BC && h->rank != h->root) { /* the head too, if the root did not write it; then the
                                                      root may return: this rank reads its buffer no more */
        if (ld_acq(h->done[h->root]) == 2 * h->f + 1) {
          Py_BEGIN_ALLOW_THREADS read_from(h, h->root, (char *)h->recv.buf, 0, h->head);
          Py_END_ALLOW_THREADS
        }
        st_rel(h->done[h->rank], 2 * h->f);
      }
      if (h->err == ESRCH) return 1; /* that rank's process is gone: the Waiter's dead-peer check names it */
      if (h->err != 0) {
        int e = h->err, r = h->err_rank;
        release(h);
        errno = e;
        PyErr_Format(PyExc_OSError, "hpccl hot path: reading rank %d's memory (process_vm_readv) failed: %s", r,
                     strerror(e));
        return -2;
      }
      complete(h);
      return 0;
    }
    if (h->state == S_WAIT && !h->direct && needed_ready(h)) {
      if (h->nbytes >= BIG) {
        Py_BEGIN_ALLOW_THREADS finish(h);
        Py_END_ALLOW_THREADS
      } else {
        finish(h);
      }
      complete(h);
      return 0;
    }
    if (budget-- > 0) {
      relax();
    } else if (yields++ < 16) {
      sched_yield();
    } else {
      return 1;
    }
  }
}

/* What a direct call publishes for its peers to read: its input, or a private copy of it when the input
   overlaps this rank's output other than as all_gather's own block or an in-place broadcast; -1 when that
   copy cannot be allocated. */
static int direct_source(Hot *h) {
  const char *s = (const char *)h->send.buf, *o = (const char *)h->recv.buf;
  Py_ssize_t olen = h->kind == K_AG ? h->nbytes * h->n : h->kind == K_RS ? h->nbytes / h->n : h->nbytes;
  int overlap = s < o + olen && o < s + h->nbytes;
  if (h->kind == K_BC) overlap = overlap && s != o;
  if (h->kind == K_AG) overlap = overlap && s != o + (Py_ssize_t)h->rank * h->nbytes;
  if (h->kind == K_RS) overlap = overlap && o != s + (Py_ssize_t)h->rank * olen;
  if (h->kind == K_AR) overlap = overlap && o != s;
  if ((h->kind == K_RS || h->kind == K_AR) && h->rtmp == NULL && (h->rtmp = aligned_alloc(4096, (size_t)h->n * (RCHUNK + 4096))) == NULL)
    return -1;
  h->src = s;
  h->head = h->kind == K_BC && h->rank == h->root ? direct_head(h) : 0; /* peers: the root's, published */
  if (!overlap || (h->kind == K_BC && h->rank != h->root)) return 0;
  if (h->scratch_cap < h->nbytes) {
    char *p = realloc(h->scratch, (size_t)h->nbytes);
    if (p == NULL) return -1;
    h->scratch = p, h->scratch_cap = h->nbytes;
  }
  hp_copy(h->scratch, s, h->nbytes);
  h->src = h->scratch;
  return 0;
}

/* Acquire the buffers and start call ``kind``; -1 (nothing changed) when this path does not take it. */
static int start(Hot *h, int kind, PyObject *send, PyObject *recv, int op, int root, int64_t seq) {
  if (h->state != S_IDLE) {
    PyErr_SetString(PyExc_RuntimeError, "hpccl hot path: a call is still in progress");
    return -2;
  }
  h->kind = kind, h->op = op, h->root = root, h->dt = T_U8, h->esize = 1, h->nbytes = 0;
  h->direct = 0, h->err = 0, h->err_rank = -1, h->head = 0, h->fetched = 0;
  memset(h->got, 0, sizeof h->got);
  if (kind != K_BAR) {
    int send_flags = PyBUF_FORMAT | PyBUF_C_CONTIGUOUS;
    int root_only = (kind == K_BC || kind == K_RED) && h->rank == root;
    int writes_in_place = kind == K_AR || kind == K_A2A || (kind == K_BC && !root_only) || (kind == K_RED && root_only);
    if (recv == Py_None && writes_in_place) send_flags |= PyBUF_WRITABLE;
    if (PyObject_GetBuffer(send, &h->send, send_flags) < 0) goto decline;
    h->have_send = 1;
    if (recv != Py_None) {
      if (PyObject_GetBuffer(recv, &h->recv, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0)
        goto decline;
      h->have_recv = 1;
    }
    int dt = dtype_of(&h->send);
    if (dt < 0) goto decline;
    h->dt = dt, h->esize = (int)h->send.itemsize, h->nbytes = h->send.len;
    h->direct = DIRECT_FROM[kind] && h->cma_min > 0 && h->n > 1 && h->nbytes >= DIRECT_FROM[kind] * h->cma_min;
    if (h->nbytes == 0 || (h->nbytes > h->cap && !h->direct)) goto decline;
    if (kind == K_AR && h->nbytes > h->reduce_cap && !h->direct) goto decline;
    if (h->have_recv && dtype_of(&h->recv) != dt) goto decline;
    int reduces = kind == K_AR || kind == K_RS || kind == K_RED;
    if (reduces && op == OP_AVG && dt != T_F32 && dt != T_F64) goto decline;
    if (reduces && (op < 0 || op > OP_AVG)) goto decline;
    if (kind == K_A2A && (h->nbytes % ((Py_ssize_t)h->n * h->esize)) != 0) goto decline;
    Py_ssize_t want = kind == K_AG ? h->nbytes * h->n : kind == K_RS ? h->nbytes / h->n : h->nbytes;
    if (kind == K_RS && (h->nbytes % ((Py_ssize_t)h->n * h->esize)) != 0) goto decline;
    if (kind == K_AG || kind == K_RS) {
      if (!h->have_recv || h->recv.len != want) goto decline;
    } else if (h->have_recv) {
      if (h->recv.len != want) goto decline;
    } else {
      h->recv.buf = h->send.buf; /* in place */
    }
  }
  if (h->direct && direct_source(h) < 0) {
    release(h);
    PyErr_NoMemory(); /* not a decline: the other ranks take the direct path */
    return -2;
  }
  h->t0 = now();
  h->f += 1;
  st_rel(h->arrived[h->rank], seq);
  h->state = S_PRE;
  return advance(h);
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
  if (root < 0 || root >= h->n) return PyLong_FromLong(-1);
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
  if (root < 0 || root >= h->n) return PyLong_FromLong(-1);
  return ret(start(h, K_BC, s, r, 0, root, seq));
}
static PyObject *Hot_barrier(Hot *h, PyObject *args) {
  long long seq;
  if (!PyArg_ParseTuple(args, "L", &seq)) return NULL;
  return ret(start(h, K_BAR, Py_None, Py_None, 0, -1, seq));
}

static PyObject *Hot_resume(Hot *h, PyObject *unused) {
  if (h->state == S_IDLE) Py_RETURN_TRUE;
  int rc = advance(h);
  if (rc == -2) return NULL;
  return PyBool_FromLong(rc == 0);
}

static PyObject *Hot_waiting(Hot *h, PyObject *unused) {
  /* the ranks the call in progress still waits for */
  PyObject *out = PyList_New(0);
  if (out == NULL || h->state == S_IDLE) return out;
  for (int r = 0; r < h->n; r++) {
    if (r == h->rank) continue;
    int late = h->err && r == h->err_rank ? 1
               : h->state == S_PRE ? ld_acq(h->ctr[r]) < h->f - 1
               : h->state == S_GATHER ? (!h->got[r] && ld_acq(h->done[r]) < 2 * h->f)
               : h->state == S_DONE && h->kind == K_AR ? ld_acq(h->done2[r]) < h->f
               : h->state == S_DONE ? ((h->kind != K_BC || h->rank == h->root || r == h->root) &&
                                       ld_acq(h->done[r]) < 2 * h->f)
               : h->direct && (h->kind != K_BC || h->rank == h->root) ? ld_acq(h->ctr[r]) < h->f
               : h->kind == K_BC ? (r == h->root && ld_acq(h->ctr[r]) < h->f)
               : h->kind == K_RED ? (h->rank == h->root && ld_acq(h->ctr[r]) < h->f)
                                  : ld_acq(h->ctr[r]) < h->f;
    if (late) {
      PyObject *v = PyLong_FromLong(r);
      if (v == NULL || PyList_Append(out, v) < 0) { Py_XDECREF(v); Py_DECREF(out); return NULL; }
      Py_DECREF(v);
    }
  }
  return out;
}

static PyObject *Hot_cancel(Hot *h, PyObject *unused) {
  if (h->state != S_IDLE && h->direct) st_rel(h->done[h->rank], LEFT); /* before the input can be freed */
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
  if (h->state != S_IDLE || r < 0 || r >= h->n || len <= 0 || (r != h->rank && fd < 0)) {
    PyErr_SetString(PyExc_ValueError, "hpccl hot path: map() needs a rank, a length and (a peer's) fd, between calls");
    return NULL;
  }
  if (h->nmaps == h->maps_cap) {
    int cap = h->maps_cap ? 2 * h->maps_cap : 16;
    Mapped *m = realloc(h->maps, (size_t)cap * sizeof(Mapped));
    if (m == NULL) return PyErr_NoMemory();
    h->maps = m, h->maps_cap = cap;
  }
  char *local = (char *)(uintptr_t)remote;
  if (r != h->rank) {
    void *p = mmap(NULL, (size_t)len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) return PyErr_SetFromErrno(PyExc_OSError);
    local = p;
  }
  h->maps[h->nmaps++] = (Mapped){r, (int64_t)remote, len, local};
  Py_RETURN_NONE;
}

static void unmap_at(Hot *h, int i) {
  if (h->maps[i].rank != h->rank) munmap(h->maps[i].local, (size_t)h->maps[i].len);
  h->maps[i] = h->maps[--h->nmaps];
}

/* unmap(rank, remote) -> whether rank's segment at ``remote`` was mapped (and is no longer) */
static PyObject *Hot_unmap(Hot *h, PyObject *args) {
  int r;
  long long remote;
  if (!PyArg_ParseTuple(args, "iL", &r, &remote)) return NULL;
  if (h->state != S_IDLE) {
    PyErr_SetString(PyExc_ValueError, "hpccl hot path: unmap() between calls only");
    return NULL;
  }
  for (int i = 0; i < h->nmaps; i++)
    if (h->maps[i].rank == r && h->maps[i].remote == remote) {
      unmap_at(h, i);
      Py_RETURN_TRUE;
    }
  Py_RETURN_FALSE;
}

static PyObject *Hot_mapped_bytes(Hot *h, void *unused) { return PyLong_FromLongLong(h->mapped_bytes); }

static int Hot_init(Hot *h, PyObject *args, PyObject *kw) {
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
  for (Py_ssize_t r = 0; r < n; r++) {
    char *b = (char *)PyLong_AsVoidPtr(PySequence_Fast_GET_ITEM(seq, r));
    if (b == NULL && PyErr_Occurred()) { Py_DECREF(seq); return -1; }
    h->arrived[r] = (int64_t *)(b + arrived_off);
    h->ctr[r] = (int64_t *)(b + ctr_off);
    h->slot[r] = b + slot_off;
    h->addr[r] = (int64_t *)(b + addr_off);
    h->done[r] = (int64_t *)(b + done_off);
    h->addr2[r] = (int64_t *)(b + addr_off + 8);
    h->done2[r] = (int64_t *)(b + done_off + 64);
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
    h->pid[r] = (pid_t)p;
  }
  Py_DECREF(pseq);
  h->cma_min = cma_min;
  h->scratch = NULL, h->scratch_cap = 0, h->rtmp = NULL, h->bounce = NULL;
  h->maps = NULL, h->nmaps = h->maps_cap = 0, h->mapped_bytes = 0;
  h->n = (int)n, h->rank = rank, h->cap = cap, h->reduce_cap = reduce_cap, h->spin = spin, h->f = 0;
  h->state = S_IDLE;
  h->have_send = h->have_recv = 0;
  memset(h->n_calls, 0, sizeof h->n_calls);
  memset(h->n_bytes, 0, sizeof h->n_bytes);
  memset(h->n_secs, 0, sizeof h->n_secs);
  return 0;
}

static void Hot_dealloc(Hot *h) {
  release(h);
  free(h->scratch);
  free(h->rtmp);
  free(h->bounce);
  while (h->nmaps) unmap_at(h, h->nmaps - 1);
  free(h->maps);
  Py_TYPE(h)->tp_free((PyObject *)h);
}

static PyObject *Hot_calls(Hot *h, void *unused) { return PyLong_FromLongLong(h->f); }

static PyObject *Hot_counts(Hot *h, PyObject *unused) {
  /* [(calls, bytes, seconds)] per collective, in the order all_reduce, all_gather, broadcast,
     reduce_scatter, barrier, reduce, all_to_all; bytes are this rank's input */
  PyObject *out = PyList_New(NKINDS);
  if (out == NULL) return NULL;
  for (int k = 0; k < NKINDS; k++) {
    PyObject *t = Py_BuildValue("(LLd)", h->n_calls[k], h->n_bytes[k], h->n_secs[k]);
    if (t == NULL) { Py_DECREF(out); return NULL; }
    PyList_SET_ITEM(out, k, t);
  }
  return out;
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
    {"map", (PyCFunction)Hot_map, METH_VARARGS, "(rank, remote, nbytes, fd): map rank's alloc_host segment"},
    {"unmap", (PyCFunction)Hot_unmap, METH_VARARGS, "(rank, remote) -> whether that segment was mapped"},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef Hot_getset[] = {{"calls", (getter)Hot_calls, NULL, "calls made on this path", NULL},
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

/* The stream operations of one call of the GPU's stream-synchronised protocol (hpccl/gpu_sync.py), in one
 * C call: each step is a kernel launch or a cuStreamBatchMemOp, in order; then the tail event, unless the
 * stream is capturing. */
typedef int (*batch_t)(void *, unsigned, void *, unsigned);
typedef struct {
  unsigned long long kind; /* 0: kernel, 1: batch of stream memory operations */
  unsigned long long func; /* CUfunction, or the number of operations */
  unsigned grid, block;
  unsigned long long params; /* kernel parameter array, or the operations' array */
} gpu_step;

static PyObject *gpu_program(PyObject *self, PyObject *args) {
  unsigned long long fl, fc, fr, fb, steps, nsteps, stream, event;
  if (!PyArg_ParseTuple(args, "KKKKKKKK", &fl, &fc, &fr, &fb, &steps, &nsteps, &stream, &event)) return NULL;
  int cap = 0;
  if (((capturing_t)(uintptr_t)fc)((void *)(uintptr_t)stream, &cap) != 0) cap = 0;
  const gpu_step *s = (const gpu_step *)(uintptr_t)steps;
  for (unsigned long long i = 0; i < nsteps; ++i) {
    int rc = s[i].kind == 0
                 ? ((launch_t)(uintptr_t)fl)((void *)(uintptr_t)s[i].func, s[i].grid, 1, 1, s[i].block, 1, 1, 0,
                                             (void *)(uintptr_t)stream, (void **)(uintptr_t)s[i].params, NULL)
                 : ((batch_t)(uintptr_t)fb)((void *)(uintptr_t)stream, (unsigned)s[i].func,
                                            (void *)(uintptr_t)s[i].params, 0);
    if (rc != 0) return Py_BuildValue("(iK)", rc, i);
  }
  if (cap) return Py_BuildValue("(iK)", -1, nsteps);
  ((record_t)(uintptr_t)fr)((void *)(uintptr_t)event, (void *)(uintptr_t)stream);
  return Py_BuildValue("(iK)", 0, nsteps);
}

static PyMethodDef module_methods[] = {
    {"gpu_program", gpu_program, METH_VARARGS,
     "(cuLaunchKernel, cuStreamIsCapturing, cuEventRecord, cuStreamBatchMemOp, steps, count, stream, tail event) "
     "-> (result, steps done): result 0, -1 when the stream is capturing (no event recorded), else the failing "
     "step's CUresult"},
    {"gpu_launch", gpu_launch, METH_VARARGS,
     "(cuLaunchKernel, cuStreamIsCapturing, cuEventRecord, func, grid, block, stream, params, tail event) -> "
     "launch result, or -1 when the stream is capturing (then no event was recorded)"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_hotpath",
                                    "hpccl's compiled hot path for small host collectives", -1, module_methods};

PyMODINIT_FUNC PyInit__hotpath(void) {
  if (PyType_Ready(&HotType) < 0) return NULL;
  PyObject *m = PyModule_Create(&module);
  if (m == NULL) return NULL;
  Py_INCREF(&HotType);
  if (PyModule_AddObject(m, "Hot", (PyObject *)&HotType) < 0) {
    Py_DECREF(&HotType);
    Py_DECREF(m);
    return NULL;
  }
  PyModule_AddIntConstant(m, "SUM", OP_SUM);
  PyModule_AddIntConstant(m, "PROD", OP_PROD);
  PyModule_AddIntConstant(m, "MIN", OP_MIN);
  PyModule_AddIntConstant(m, "MAX", OP_MAX);
  PyModule_AddIntConstant(m, "AVG", OP_AVG);
  return m;
}
