/* The node's hot path in plain C (no Python): slots and counters, copies and reductions, direct reads and
   writes between processes, mapped alloc_host segments, and the waits of the protocol that _hotcore.h
   describes. hpccl._hotpath's type (_hotpath.c) holds the buffers and drives these calls. */
#define _GNU_SOURCE
#include "_hotcore.h"

#include <errno.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <time.h>

#include "_copy.h"
#include "_reduce.h"

#define BLOCK 8192 /* bytes reduced per pass over the sources (stays in L1) */
#define BIG 65536  /* copies of at least this many bytes run with the caller's lock let go (the GIL; the buffers
                      are held) */
/* a done word's value once its rank left a direct call it failed in (hot_cancel): the input it published may
   be freed and reused from then on, so a peer that read it must not return that data as the result */
#define LEFT INT64_MAX
#define RCHUNK 65536 /* direct reduce_scatter reads each peer's part in chunks of this many bytes */
#define BOUNCE 65536 /* a read at the slow placement goes through a bounce buffer in pieces of this size */

/* Per collective: it goes direct from this many times cma_min bytes per rank (0: never). Measured at 2
   ranks against the slots: all_to_all's reads are one block per peer; with the copies placement-proof
   (_copy.h) direct took 15.7-17.8 us at 128 KiB against the slots' 20.3-37.0 (hpccl-perf, 2 runs), at 64
   KiB 10.6-15.5 against 9.5-22.8; reduce_scatter's at 16 KiB (8.5 us against 14); all_reduce's at 64 KiB
   (24 against 17; even at 128 KiB, 118 against 282 at 256 KiB); reduce always uses the slots.
   A direct all_reduce reduces its own stripe from every rank's input (published done 2f), then copies
   every peer's reduced stripe out of that peer's output once it is published (done2 = f). */
static const int DIRECT_FROM[NKINDS] = {[K_AR] = 16, [K_AG] = 1, [K_BC] = 1, [K_RS] = 4, [K_A2A] = 8};

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

/* a call's end, slot path or direct: counted for comm.stats(); the caller then releases its buffers */
static void complete(hot_t *h) {
  double dt = now() - h->t0;
  int v = h->via, k = h->kind;
  h->n_calls[v][k] += 1;
  h->n_bytes[v][k] += h->nbytes;
  h->n_secs[v][k] += dt;
  if (h->latency) h->hist[v][k][lat_bucket(dt)] += 1;
  h->state = S_IDLE;
}

static inline char *slot_of(hot_t *h, int r, int64_t f) { return h->slot[r] + (f & 1) * h->cap; }

/* out[0:nbytes] = reduction over every rank of bytes [off, off + nbytes) of its slot */
static void reduce_slots(hot_t *h, char *out, ptrdiff_t off, ptrdiff_t nbytes) {
  char *src[MAXR];
  for (ptrdiff_t b = 0; b < nbytes; b += BLOCK) {
    ptrdiff_t len = nbytes - b < BLOCK ? nbytes - b : BLOCK;
    for (int r = 0; r < h->n; r++) src[r] = slot_of(h, r, h->f) + off + b;
    hp_copy(out + b, src[0], len);
    reduce_block(out + b, src, h->n, len / h->esize, h->dt, h->op);
  }
  if (h->op == OP_AVG) avg_scale(out, nbytes / h->esize, h->dt, h->n);
}

/* ---- direct calls: broadcast, all_gather, all_to_all ---- */
/* Move len bytes between this process's ``local`` and process pid's ``remote``; 0 or an errno. */
static int cma_move(pid_t pid, char *local, int64_t remote, ptrdiff_t len, int write) {
  ptrdiff_t off = 0;
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
static int cma_read(hot_t *h, pid_t pid, char *dst, int64_t remote, ptrdiff_t len) {
  if (!hp_bad_gap(dst, (const void *)(uintptr_t)remote)) return cma_move(pid, dst, remote, len, 0);
  if (h->bounce == NULL && (h->bounce = aligned_alloc(4096, BOUNCE + 4096)) == NULL) return ENOMEM;
  for (ptrdiff_t off = 0; off < len; off += BOUNCE) {
    ptrdiff_t l = len - off < BOUNCE ? len - off : BOUNCE;
    char *b = h->bounce + ((remote + off) & 4095);
    int e = cma_move(pid, b, remote + off, l, 0);
    if (e) return e;
    hp_copy(dst + off, b, (size_t)l);
  }
  return 0;
}

/* Where rank r's [remote, remote + len) is mapped in this process, or NULL. */
static char *mapped(hot_t *h, int r, int64_t remote, ptrdiff_t len) {
  for (int i = 0; i < h->nmaps; i++) {
    Mapped *m = &h->maps[i];
    if (m->rank == r && remote >= m->remote && remote + len <= m->remote + m->len) return m->local + (remote - m->remote);
  }
  return NULL;
}

/* Move len bytes between this process's ``local`` and rank r's ``remote``: through the mapping of an
   alloc_host segment when it lies in one, else by cross-memory attach; 0 or an errno. */
static int peer_move(hot_t *h, int r, char *local, int64_t remote, ptrdiff_t len, int write) {
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
static ptrdiff_t direct_head(hot_t *h) {
  int out_of_place = h->have_recv && h->recv != h->send;
  ptrdiff_t head;
  if (mapped(h, h->rank, (int64_t)(uintptr_t)h->send, h->nbytes))
    head = out_of_place ? 0 : h->nbytes / h->n;
  else
    head = h->nbytes / (out_of_place ? 2 * h->n : h->n);
  return head < 4096 ? 0 : head & ~(ptrdiff_t)4095;
}

static void read_from(hot_t *h, int r, char *dst, ptrdiff_t off, ptrdiff_t len) {
  if (h->err || len == 0) return;
  h->err = peer_move(h, r, dst, ld_acq(h->addr[r]) + off, len, 0);
  if (h->err) h->err_rank = r;
}

/* out[0:len] = the reduction over every rank of bytes [off, off + len) of its published input, in rank
   order (as the slots' path reduces), reading the peers' parts chunk by chunk into rtmp. */
static void reduce_from_peers(hot_t *h, char *out, ptrdiff_t off, ptrdiff_t len) {
  char *src[MAXR], *part[MAXR];
  for (ptrdiff_t b = 0; b < len; b += RCHUNK) {
    ptrdiff_t l = len - b < RCHUNK ? len - b : RCHUNK;
    for (int r = 0; r < h->n; r++) {
      src[r] = h->rtmp + (ptrdiff_t)r * (RCHUNK + 4096);
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
    for (ptrdiff_t c = 0; c < l; c += BLOCK) {
      ptrdiff_t cl = l - c < BLOCK ? l - c : BLOCK;
      for (int r = 0; r < h->n; r++) part[r] = src[r] + c;
      hp_copy(out + b + c, part[0], cl);
      reduce_block(out + b + c, part, h->n, cl / h->esize, h->dt, h->op);
    }
    if (h->op == OP_AVG) avg_scale(out + b, l / h->esize, h->dt, h->n);
  }
}

/* Rank q's stripe of an all_reduce: [*off, *off + *len) bytes, whole elements. */
static void stripe(hot_t *h, int q, ptrdiff_t *off, ptrdiff_t *len) {
  ptrdiff_t cnt = h->nbytes / h->esize, lo = cnt * q / h->n, hi = cnt * (q + 1) / h->n;
  *off = lo * h->esize, *len = (hi - lo) * h->esize;
}

/* Direct all_reduce, second half: copy the reduced stripe of every peer that has published its own
   (done 2f) out of that peer's output; once all are copied, publish done2 = f. */
static void gather_stripes(hot_t *h) {
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
    ptrdiff_t off, len;
    stripe(h, r, &off, &len);
    if (len && (h->err = peer_move(h, r, h->recv + off, ld_acq(h->addr2[r]) + off, len, 0)))
      h->err_rank = r;
  }
  if (h->fetched == h->n - 1) st_rel(h->done2[h->rank], f);
}

/* This rank's part of a direct call; done word published after it. */
static void direct_part(hot_t *h) {
  int64_t f = h->f, mark = 2 * f;
  char *out = h->recv;
  if (h->kind == K_RS) {
    ptrdiff_t blk = h->nbytes / h->n;
    reduce_from_peers(h, out, (ptrdiff_t)h->rank * blk, blk);
  } else if (h->kind == K_AR) {
    ptrdiff_t off, len;
    stripe(h, h->rank, &off, &len);
    if (len) reduce_from_peers(h, out + off, off, len);
    if (h->err) mark = 2 * f + 1;
  } else if (h->kind == K_AG || h->kind == K_A2A) {
    ptrdiff_t blk = h->kind == K_AG ? h->nbytes : h->nbytes / h->n;
    ptrdiff_t off = h->kind == K_AG ? 0 : (ptrdiff_t)h->rank * blk;
    for (int k = 1; k < h->n; k++) { /* from the next rank on, so the ranks spread over their peers */
      int r = (h->rank + k) % h->n;
      read_from(h, r, out + (ptrdiff_t)r * blk, off, blk);
    }
  } else if (h->rank == h->root) {
    for (int r = 0; r < h->n && h->head; r++) { /* a write at the slow placement: the peers read it instead */
      int64_t at = ld_acq(h->addr[r]);
      if (r != h->rank && !mapped(h, r, at, h->head) && hp_bad_gap((void *)(uintptr_t)at, h->send))
        mark = 2 * f + 1;
    }
    for (int r = 0; r < h->n && h->head && mark == 2 * f; r++) {
      if (r == h->rank) continue;
      if (peer_move(h, r, h->send, ld_acq(h->addr[r]), h->head, 1) != 0) {
        mark = 2 * f + 1; /* the peers read the head themselves */
        break;
      }
    }
    if (h->recv != h->send) hp_move(h->recv, h->send, h->nbytes); /* peers read src */
  } else { /* a broadcast peer publishes its done word once it has the root's mark (advance) */
    h->head = (ptrdiff_t)ld_acq(h->addr2[h->root]);
    read_from(h, h->root, out + h->head, h->head, h->nbytes - h->head);
    return;
  }
  st_rel(h->done[h->rank], mark);
}

/* Whether the ranks this one depends on (the root: every peer; a peer: the root) are done. */
static int direct_ready(hot_t *h) {
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
static int peer_left(hot_t *h) {
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
  for (int r = 0; r < h->n; r++)
    if (r != h->rank && ld_acq(h->done[r]) == LEFT) return 1;
  return 0;
}

/* ---- the protocol ---- */
static int peers_at(hot_t *h, int64_t v) {
  for (int r = 0; r < h->n; r++)
    if (r != h->rank && ld_acq(h->ctr[r]) < v) return 0;
  return 1;
}

static int needed_ready(hot_t *h) {
  if (h->direct && (h->kind != K_BC || h->rank == h->root)) return peers_at(h, h->f);
  if (h->kind == K_BC) return h->rank == h->root || ld_acq(h->ctr[h->root]) >= h->f;
  if (h->kind == K_RED) return h->rank != h->root || peers_at(h, h->f);
  return peers_at(h, h->f);
}

static void publish(hot_t *h) {
  if (h->direct) {
    st_rel(h->addr[h->rank], (int64_t)(uintptr_t)(h->kind == K_BC && h->rank != h->root ? h->recv : h->src));
    if (h->kind == K_AR) st_rel(h->addr2[h->rank], (int64_t)(uintptr_t)h->recv);
    if (h->kind == K_BC && h->rank == h->root) st_rel(h->addr2[h->rank], (int64_t)h->head);
    st_rel(h->ctr[h->rank], h->f);
    if (h->kind == K_AG || h->kind == K_A2A) { /* this rank's own block, while the peers arrive (they read the
                                                  published input, never this output) */
      ptrdiff_t blk = h->kind == K_AG ? h->nbytes : h->nbytes / h->n, off = h->kind == K_AG ? 0 : (ptrdiff_t)h->rank * blk;
      char *mine = h->recv + (ptrdiff_t)h->rank * blk;
      if (mine != h->src + off) hp_move(mine, h->src + off, blk);
    }
    return;
  }
  if (h->kind != K_BAR && (h->kind != K_BC || h->rank == h->root))
    hp_copy(slot_of(h, h->rank, h->f), h->send, h->nbytes);
  st_rel(h->ctr[h->rank], h->f);
}

static void finish(hot_t *h) {
  char *out = h->recv;
  switch (h->kind) {
    case K_AR: reduce_slots(h, out, 0, h->nbytes); break;
    case K_RS: reduce_slots(h, out, (ptrdiff_t)h->rank * (h->nbytes / h->n), h->nbytes / h->n); break;
    case K_RED:
      if (h->rank == h->root) reduce_slots(h, out, 0, h->nbytes);
      break;
    case K_A2A: {
      ptrdiff_t blk = h->nbytes / h->n;
      for (int r = 0; r < h->n; r++) hp_copy(out + (ptrdiff_t)r * blk, slot_of(h, r, h->f) + (ptrdiff_t)h->rank * blk, blk);
      break;
    }
    case K_AG:
      for (int r = 0; r < h->n; r++) hp_copy(out + (ptrdiff_t)r * h->nbytes, slot_of(h, r, h->f), h->nbytes);
      break;
    case K_BC:
      if (h->rank != h->root)
        hp_copy(out, slot_of(h, h->root, h->f), h->nbytes);
      else if (h->have_recv)
        hp_move(out, h->send, h->nbytes);
      break;
  }
}

/* Run STMT with the caller's lock let go (hot_t.unlock: the binding's GIL) when COND holds, else held. */
#define UNLOCKED(h, COND, STMT)                                  \
  do {                                                           \
    int let_go_ = (COND) && (h)->unlock != NULL;                 \
    void *saved_ = let_go_ ? (h)->unlock() : NULL;               \
    STMT;                                                        \
    if (let_go_) (h)->relock(saved_);                            \
  } while (0)

int hot_advance(hot_t *h) {
  long budget = h->spin;
  int yields = 0;
  for (;;) {
    if (h->state == S_PRE && peers_at(h, h->f - 1)) {
      UNLOCKED(h, h->nbytes >= BIG, publish(h));
      h->state = S_WAIT;
    }
    if (h->state == S_WAIT && h->direct && needed_ready(h)) {
      UNLOCKED(h, 1, direct_part(h));
      h->state = h->kind == K_AR ? S_GATHER : S_DONE;
    }
    if (h->state == S_GATHER) {
      UNLOCKED(h, h->nbytes >= BIG, gather_stripes(h));
      if (h->fetched == h->n - 1) h->state = S_DONE;
    }
    if (h->state == S_DONE && direct_ready(h)) {
      if (peer_left(h)) return HOT_PENDING; /* the Waiter's abort check (the peer aborted as it left) raises */
      if (h->kind == K_BC && h->rank != h->root) { /* the head too, if the root did not write it; then the
                                                      root may return: this rank reads its buffer no more */
        if (ld_acq(h->done[h->root]) == 2 * h->f + 1) UNLOCKED(h, 1, read_from(h, h->root, h->recv, 0, h->head));
        st_rel(h->done[h->rank], 2 * h->f);
      }
      if (h->err == ESRCH) return HOT_PENDING; /* that rank's process is gone: the Waiter's dead-peer check
                                                  names it */
      if (h->err != 0) {
        h->state = S_IDLE;
        return HOT_FAILED;
      }
      complete(h);
      return HOT_DONE;
    }
    if (h->state == S_WAIT && !h->direct && needed_ready(h)) {
      UNLOCKED(h, h->nbytes >= BIG, finish(h));
      complete(h);
      return HOT_DONE;
    }
    if (budget-- > 0) {
      relax();
    } else if (yields++ < 16) {
      sched_yield();
    } else {
      return HOT_PENDING;
    }
  }
}

/* What a direct call publishes for its peers to read: its input, or a private copy of it when the input
   overlaps this rank's output other than as all_gather's own block or an in-place broadcast; -1 when that
   copy cannot be allocated. */
static int direct_source(hot_t *h) {
  const char *s = (const char *)h->send, *o = (const char *)h->recv;
  ptrdiff_t olen = h->kind == K_AG ? h->nbytes * h->n : h->kind == K_RS ? h->nbytes / h->n : h->nbytes;
  int overlap = s < o + olen && o < s + h->nbytes;
  if (h->kind == K_BC) overlap = overlap && s != o;
  if (h->kind == K_AG) overlap = overlap && s != o + (ptrdiff_t)h->rank * h->nbytes;
  if (h->kind == K_RS) overlap = overlap && o != s + (ptrdiff_t)h->rank * olen;
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


int hot_start(hot_t *h, int kind, int op, int root, int dt, int esize, char *send, ptrdiff_t nbytes, char *recv,
              ptrdiff_t recv_len, int64_t seq) {
  h->kind = kind, h->op = op, h->root = root, h->dt = T_U8, h->esize = 1, h->nbytes = 0, h->have_recv = 0;
  h->direct = 0, h->err = 0, h->err_rank = -1, h->head = 0, h->fetched = 0;
  memset(h->got, 0, sizeof h->got);
  if (kind != K_BAR) {
    h->send = send, h->have_recv = recv_len >= 0, h->recv = h->have_recv ? recv : send; /* else in place */
    h->dt = dt, h->esize = esize, h->nbytes = nbytes;
    h->direct = DIRECT_FROM[kind] && h->cma_min > 0 && h->n > 1 && h->nbytes >= DIRECT_FROM[kind] * h->cma_min;
    if (h->nbytes == 0 || (h->nbytes > h->cap && !h->direct)) return HOT_DECLINED;
    if (kind == K_AR && h->nbytes > h->reduce_cap && !h->direct) return HOT_DECLINED;
    int reduces = kind == K_AR || kind == K_RS || kind == K_RED;
    if (reduces && op == OP_AVG && dt != T_F32 && dt != T_F64) return HOT_DECLINED;
    if (reduces && (op < 0 || op > OP_AVG)) return HOT_DECLINED;
    if (kind == K_A2A && (h->nbytes % ((ptrdiff_t)h->n * h->esize)) != 0) return HOT_DECLINED;
    ptrdiff_t want = kind == K_AG ? h->nbytes * h->n : kind == K_RS ? h->nbytes / h->n : h->nbytes;
    if (kind == K_RS && (h->nbytes % ((ptrdiff_t)h->n * h->esize)) != 0) return HOT_DECLINED;
    if (kind == K_AG || kind == K_RS) {
      if (!h->have_recv || recv_len != want) return HOT_DECLINED;
    } else if (h->have_recv && recv_len != want) {
      return HOT_DECLINED;
    }
  }
  if (h->direct && direct_source(h) < 0) return HOT_NOMEM;
  h->t0 = now();
  h->f += 1;
  st_rel(h->arrived[h->rank], seq);
  h->state = S_PRE;
  return hot_advance(h);
}

void hot_cancel(hot_t *h) {
  if (h->state != S_IDLE && h->direct) st_rel(h->done[h->rank], LEFT); /* before the input can be freed */
  h->state = S_IDLE;
}

int hot_late(const hot_t *h, int r) {
  if (h->err && r == h->err_rank) return 1;
  if (h->state == S_PRE) return ld_acq(h->ctr[r]) < h->f - 1;
  if (h->state == S_GATHER) return !h->got[r] && ld_acq(h->done[r]) < 2 * h->f;
  if (h->state == S_DONE && h->kind == K_AR) return ld_acq(h->done2[r]) < h->f;
  if (h->state == S_DONE)
    return (h->kind != K_BC || h->rank == h->root || r == h->root) && ld_acq(h->done[r]) < 2 * h->f;
  if (h->direct && (h->kind != K_BC || h->rank == h->root)) return ld_acq(h->ctr[r]) < h->f;
  if (h->kind == K_BC) return r == h->root && ld_acq(h->ctr[r]) < h->f;
  if (h->kind == K_RED) return h->rank == h->root && ld_acq(h->ctr[r]) < h->f;
  return ld_acq(h->ctr[r]) < h->f;
}

/* ---- set-up, alloc_host mappings, teardown ---- */
void hot_init(hot_t *h, int n, int rank, char *const *bases, const pid_t *pids, const hot_layout *at,
              ptrdiff_t cap, ptrdiff_t reduce_cap, ptrdiff_t cma_min, long spin) {
  for (int r = 0; r < n; r++) {
    char *b = bases[r];
    h->arrived[r] = (int64_t *)(b + at->arrived);
    h->ctr[r] = (int64_t *)(b + at->ctr);
    h->slot[r] = b + at->slot;
    h->addr[r] = (int64_t *)(b + at->addr);
    h->done[r] = (int64_t *)(b + at->done);
    h->addr2[r] = (int64_t *)(b + at->addr + 8);
    h->done2[r] = (int64_t *)(b + at->done + 64);
    h->pid[r] = pids[r];
  }
  h->cma_min = cma_min;
  h->scratch = NULL, h->scratch_cap = 0, h->rtmp = NULL, h->bounce = NULL;
  h->maps = NULL, h->nmaps = h->maps_cap = 0, h->mapped_bytes = 0;
  h->n = n, h->rank = rank, h->cap = cap, h->reduce_cap = reduce_cap, h->spin = spin, h->f = 0;
  h->state = S_IDLE;
  memset(h->n_calls, 0, sizeof h->n_calls);
  memset(h->n_bytes, 0, sizeof h->n_bytes);
  memset(h->n_secs, 0, sizeof h->n_secs);
  memset(h->hist, 0, sizeof h->hist);
  h->via = h->latency = 0;
}

int hot_map(hot_t *h, int r, int64_t remote, ptrdiff_t len, int fd) {
  if (h->state != S_IDLE || r < 0 || r >= h->n || len <= 0 || (r != h->rank && fd < 0)) return -1;
  if (h->nmaps == h->maps_cap) {
    int cap = h->maps_cap ? 2 * h->maps_cap : 16;
    Mapped *m = realloc(h->maps, (size_t)cap * sizeof(Mapped));
    if (m == NULL) return -2;
    h->maps = m, h->maps_cap = cap;
  }
  char *local = (char *)(uintptr_t)remote;
  if (r != h->rank) {
    void *p = mmap(NULL, (size_t)len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) return errno;
    local = p;
  }
  h->maps[h->nmaps++] = (Mapped){r, remote, len, local};
  return 0;
}

static void unmap_at(hot_t *h, int i) {
  if (h->maps[i].rank != h->rank) munmap(h->maps[i].local, (size_t)h->maps[i].len);
  h->maps[i] = h->maps[--h->nmaps];
}

int hot_unmap(hot_t *h, int r, int64_t remote) {
  if (h->state != S_IDLE) return -1;
  for (int i = 0; i < h->nmaps; i++)
    if (h->maps[i].rank == r && h->maps[i].remote == remote) {
      unmap_at(h, i);
      return 1;
    }
  return 0;
}

void hot_free(hot_t *h) {
  free(h->scratch);
  free(h->rtmp);
  free(h->bounce);
  while (h->nmaps) unmap_at(h, h->nmaps - 1);
  free(h->maps);
}
