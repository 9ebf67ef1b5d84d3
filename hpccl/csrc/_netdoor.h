/* The C front door of repeated GPU calls across nodes (_netdoor.c: the NetDoor type, its replays and
   bookkeeping; _netkey.c: a call's key read off its arrays, and the table of keys). */
#ifndef HPCCL_NETDOOR_H
#define HPCCL_NETDOOR_H
#include "_netpy.h"
#include "_lathist.h"

#include <stdint.h>

#define ND_COLLS 6     /* all_reduce, reduce, broadcast, all_gather, reduce_scatter, all_to_all */
#define ND_SLOTS 512   /* the table: twice netreplay.MAX_PROGRAMS, so that probes stay short */
#define ND_MAX (ND_SLOTS / 2)

typedef struct {
  int used, code, has_recv;
  int scontig, rcontig;
  uint64_t sptr, scount, rptr, rcount, stream;
  long long root;
  PyObject *sdt, *rdt, *op;  /* compared by identity; held so that no other object can take their address */
  PyObject *prog;            /* the NetProgram */
  unsigned long long nbytes; /* what the statistics count per call */
} nd_entry;

typedef struct {
  PyObject_HEAD
  PyObject *comm;            /* the Communicator: _group, _destroyed, _aborted, _seq, _waiter, _transports */
  PyObject *cp_type;         /* cupy.ndarray, or None */
  PyObject *cur_stream;      /* cupy.cuda.get_current_stream, or None */
  PyObject *torch_stream;    /* tensor -> torch's current stream on its device (an int), or None */
  PyObject *torch_types;     /* a tuple of torch's tensor types (exact), maybe empty */
  PyObject *names;           /* a tuple of ND_COLLS str: the collectives' names (labels, waiter) */
  PyObject *errcls;          /* what a failed driver call raises (HpcclSystemError) */
  int cp_contig_attr;        /* CuPy's arrays have the _c_contiguous attribute (else flags.c_contiguous) */
  int n;
  unsigned long long gen;    /* bumped whenever the table is emptied: a slot handed out before is stale */
  nd_entry tab[ND_SLOTS];
  unsigned long long calls[ND_COLLS], bytes[ND_COLLS];
  double secs[ND_COLLS];
  long long fired;
  int latency;               /* count each replay's time in hist (HPCCL_METRICS) */
  long long hist[ND_COLLS][LAT_BUCKETS];
} NetDoor;

/* _netkey.c */
int nd_key_intern(void);   /* the attribute names the key reads, interned once: 0, or -1 with an error set */
uint64_t nd_hash(const nd_entry *e);
nd_entry *nd_find(NetDoor *d, const nd_entry *k);  /* k's entry in d's table, or NULL */
void nd_drop(NetDoor *d);                          /* every entry forgotten, the generation bumped */
int nd_key(NetDoor *d, PyObject *const *a, nd_entry *k);  /* fire()'s arguments' key; 0: not a call it takes */
int nd_key_parts(PyObject *const *a, nd_entry *k);        /* put()'s arguments' key; 0: not taken */
#endif
