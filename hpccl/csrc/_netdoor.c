/* The C front door of repeated GPU calls across nodes (hpccl/gpu/netreplay.py keeps what it opens onto).

   A replayed network call used to spend a few microseconds of Python before its C replay: building the key
   (the arrays' addresses, counts, dtypes, the stream) as nested tuples, hashing it (Enum and dtype hashes
   run Python code), formatting the label, the sequence number, announcing it to each transport and counting
   it in the statistics. NetDoor.fire() does all of it in one C call: it reads the key straight off a CuPy
   array or a CUDA torch tensor, finds the recording in its own table, replays it (nr_run, _netreplay.c) and
   does the bookkeeping the Python path does (the communicator's _seq, the waiter's collective and seq, each
   transport's announce(seq), calls/bytes/seconds per collective).

   A hit needs everything the Python key holds to be equal, dtype and op by identity (the objects are held
   while their entry lives): anything else is a miss, and a miss changes nothing, so the caller goes on the
   Python way, which finds the same recording by equality or records the call. fire() declines as well
   while the communicator is in a group, destroyed or aborted, and when the replay cannot run now
   (capturing, a failed engine: rc 1 or 2 of nr_run), so that the Python path reports or captures. */
#include "_netdoor.h"

#include <string.h>
#include <time.h>
#include <structmember.h>

static PyObject *s_group, *s_destroyed, *s_aborted, *s_seq, *s_wseq, *s_waiter, *s_transports, *s_announce,
    *s_collective;

static int nd_intern(void) {
  if (s_group) return 0;
  if (nd_key_intern() < 0) return -1;
#define IN(v, t) if (!(v = PyUnicode_InternFromString(t))) return -1
  IN(s_group, "_group"); IN(s_destroyed, "_destroyed"); IN(s_aborted, "_aborted"); IN(s_seq, "_seq"); IN(s_wseq, "seq");
  IN(s_waiter, "_waiter"); IN(s_transports, "_transports"); IN(s_announce, "announce");
  IN(s_collective, "collective");
#undef IN
  return 0;
}

static int nd_truthy_attr(PyObject *o, PyObject *name) {
  PyObject *v = PyObject_GetAttr(o, name);
  if (!v) return -1;
  int t = PyObject_IsTrue(v);
  Py_DECREF(v);
  return t;
}

static double nd_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* the Python path's bookkeeping after an enqueued replay (core/comm.py _net_fire and _fired): comm's _seq,
   its waiter's collective (``name``) and seq, each transport's announce(seq) */
static int nd_account_comm(PyObject *comm, PyObject *name, long long seq) {
  PyObject *so = PyLong_FromLongLong(seq);
  if (!so) return -1;
  int rc = -1;
  PyObject *waiter = NULL, *ts = NULL;
  if (PyObject_SetAttr(comm, s_seq, so) < 0) goto out;
  if (!(waiter = PyObject_GetAttr(comm, s_waiter))) goto out;
  if (PyObject_SetAttr(waiter, s_collective, name) < 0 || PyObject_SetAttr(waiter, s_wseq, so) < 0) goto out;
  if (!(ts = PyObject_GetAttr(comm, s_transports))) goto out;
  PyObject *seqf = PySequence_Fast(ts, "_transports is not a sequence");
  if (!seqf) goto out;
  for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seqf); i++) {
    PyObject *r = PyObject_CallMethodOneArg(PySequence_Fast_GET_ITEM(seqf, i), s_announce, so);
    if (!r) {
      Py_DECREF(seqf);
      goto out;
    }
    Py_DECREF(r);
  }
  Py_DECREF(seqf);
  rc = 0;
out:
  Py_XDECREF(ts);
  Py_XDECREF(waiter);
  Py_DECREF(so);
  return rc;
}

static int nd_account(NetDoor *d, int code, long long seq) {
  return nd_account_comm(d->comm, PyTuple_GET_ITEM(d->names, code), seq);
}

/* 1 when comm takes a replayed call now (no group open, not destroyed or aborted), 0 when it declines,
   -1 an error is set */
static int nd_open(PyObject *comm) {
  PyObject *g = PyObject_GetAttr(comm, s_group);
  if (!g) return -1;
  int grouped = g != Py_None;
  Py_DECREF(g);
  int gone = nd_truthy_attr(comm, s_destroyed), aborted = nd_truthy_attr(comm, s_aborted);
  if (gone < 0 || aborted < 0) return -1;
  return !(grouped || gone || aborted);
}

/* The compiled torch backend's bookkeeping of a call it replays as other communicators' replays (a hier
   all_reduce, hpccl/torch/_native.cpp), with the GIL held: commit 0 asks whether the communicator (a
   Communicator, held by the caller) takes it (nd_open); commit 1 counts it as _run does (its next _seq,
   the waiter's collective ``name`` and seq, each transport's announce): 1, or -1 with an error set. */
/* comm's next sequence number (its _seq + 1) in *seq: 0, or -1 with an error set */
static int nd_next_seq(PyObject *comm, long long *seq) {
  PyObject *so = PyObject_GetAttr(comm, s_seq);
  if (!so) return -1;
  *seq = PyLong_AsLongLong(so) + 1;
  Py_DECREF(so);
  return *seq == 0 && PyErr_Occurred() ? -1 : 0;
}

static int nd_count(void *comm, void *name, int commit) {
  PyObject *c = (PyObject *)comm;
  if (!commit) return nd_open(c);
  long long seq;
  if (nd_next_seq(c, &seq) < 0) return -1;
  return nd_account_comm(c, (PyObject *)name, seq) < 0 ? -1 : 1;
}

/* replay entry e on stream and do the bookkeeping: 1 fired, 0 declined (nothing changed: the Python path
   runs), -1 an error is set (a driver call failed, raised as the Python path raises it) */
static int nd_fire_entry(NetDoor *d, nd_entry *e, unsigned long long stream) {
  int open = nd_open(d->comm);
  if (open <= 0) return open;
  long long seq;
  if (nd_next_seq(d->comm, &seq) < 0) return -1;
  double t0 = nd_now();
  char label[96];
  snprintf(label, sizeof label, "%s #%lld", PyUnicode_AsUTF8(PyTuple_GET_ITEM(d->names, e->code)), seq);
  int rc = nr_run(e->prog, stream, label);  /* runs no Python: e stays */
  if (rc < 0) {
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb);
    PyObject *msg = ev ? PyObject_Str(ev) : NULL;
    Py_XDECREF(et); Py_XDECREF(ev); Py_XDECREF(tb);
    if (msg) {
      PyErr_SetObject(d->errcls, msg);
      Py_DECREF(msg);
    }
    return -1;
  }
  if (rc) return 0;
  int code = e->code;
  unsigned long long nb = e->nbytes;  /* read first: the announce calls run Python, which may drop the table */
  if (nd_account(d, code, seq) < 0) return -1;
  d->calls[code]++;
  d->bytes[code] += nb;
  double dt = nd_now() - t0;
  d->secs[code] += dt;
  if (d->latency) d->hist[code][lat_bucket(dt)] += 1;
  d->fired++;
  return 1;
}

static PyObject *NetDoor_fire(NetDoor *d, PyObject *const *a, Py_ssize_t na) {
  if (na != 6) {
    PyErr_SetString(PyExc_TypeError, "fire(code, sendbuf, recvbuf, op, root, stream)");
    return NULL;
  }
  if (d->n == 0) Py_RETURN_FALSE;
  nd_entry k;
  if (!nd_key(d, a, &k)) Py_RETURN_FALSE;
  nd_entry *e = nd_find(d, &k);
  if (!e) Py_RETURN_FALSE;
  int rc = nd_fire_entry(d, e, (unsigned long long)k.stream);
  if (rc < 0) return NULL;
  return PyBool_FromLong(rc);
}

/* The compiled torch backend's way in (hpccl/torch/_native.cpp), with the GIL held: the call slot() found
   at generation gen, replayed on stream as fire() replays it. 0 when the table was emptied since (the
   recording may be gone), the slot holds another stream's call, or fire() would decline. */
static int nd_fire_slot(void *door, int slot, unsigned long long gen, unsigned long long stream) {
  NetDoor *d = (NetDoor *)door;
  if (gen != d->gen || slot < 0 || slot >= ND_SLOTS || !d->tab[slot].used || d->tab[slot].stream != stream) return 0;
  return nd_fire_entry(d, &d->tab[slot], stream);
}

/* slot(code, sendbuf, recvbuf, op, root, stream): where fire() would find this call, -1 when it would not */
static PyObject *NetDoor_slot(NetDoor *d, PyObject *const *a, Py_ssize_t na) {
  if (na != 6) {
    PyErr_SetString(PyExc_TypeError, "slot(code, sendbuf, recvbuf, op, root, stream)");
    return NULL;
  }
  nd_entry k;
  nd_entry *e = d->n && nd_key(d, a, &k) ? nd_find(d, &k) : NULL;
  return PyLong_FromLong(e ? (long)(e - d->tab) : -1L);
}

static PyObject *NetDoor_put(NetDoor *d, PyObject *const *a, Py_ssize_t na) {
  if (na != 8) {
    PyErr_SetString(PyExc_TypeError, "put(code, send_key, recv_key, op, root, stream, program, nbytes)");
    return NULL;
  }
  if (!PyObject_TypeCheck(a[6], &NetProgramType)) {
    PyErr_SetString(PyExc_TypeError, "put: program must be a NetProgram");
    return NULL;
  }
  unsigned long long nb = PyLong_AsUnsignedLongLong(a[7]);
  if (nb == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
  nd_entry k;
  if (!nd_key_parts(a, &k) || d->n >= ND_MAX || nd_find(d, &k)) Py_RETURN_FALSE;
  uint64_t i = nd_hash(&k);
  while (d->tab[i % ND_SLOTS].used) i++;
  nd_entry *e = &d->tab[i % ND_SLOTS];
  *e = k;
  e->used = 1;
  e->nbytes = nb;
  Py_INCREF(e->sdt);
  Py_XINCREF(e->rdt);
  Py_INCREF(e->op);
  Py_INCREF(a[6]);
  e->prog = a[6];
  d->n++;
  Py_RETURN_TRUE;
}

static PyObject *NetDoor_drop(NetDoor *d, PyObject *unused) {
  (void)unused;
  nd_drop(d);
  Py_RETURN_NONE;
}

static PyObject *NetDoor_histograms(NetDoor *d, PyObject *unused) {
  (void)unused;
  PyObject *out = PyDict_New();
  if (!out) return NULL;
  for (int c = 0; c < ND_COLLS; c++) {
    if (!d->calls[c]) continue;
    PyObject *t = lat_tuple(d->hist[c]);
    if (!t || PyDict_SetItem(out, PyTuple_GET_ITEM(d->names, c), t) < 0) {
      Py_XDECREF(t);
      Py_DECREF(out);
      return NULL;
    }
    Py_DECREF(t);
  }
  return out;
}

static PyObject *NetDoor_rows(NetDoor *d, PyObject *kind) {
  PyObject *out = PyList_New(0);
  if (!out) return NULL;
  for (int c = 0; c < ND_COLLS; c++) {
    if (!d->calls[c]) continue;
    PyObject *row = Py_BuildValue("(OOsKKd)", PyTuple_GET_ITEM(d->names, c), kind, "replayed", d->calls[c],
                                  d->bytes[c], d->secs[c]);
    if (!row || PyList_Append(out, row) < 0) {
      Py_XDECREF(row);
      Py_DECREF(out);
      return NULL;
    }
    Py_DECREF(row);
  }
  return out;
}

static Py_ssize_t NetDoor_len(NetDoor *d) { return d->n; }

static PyObject *NetDoor_get_fired(NetDoor *d, void *unused) {
  (void)unused;
  return PyLong_FromLongLong(d->fired);
}

static PyObject *NetDoor_get_gen(NetDoor *d, void *unused) {
  (void)unused;
  return PyLong_FromUnsignedLongLong(d->gen);
}

static PyObject *NetDoor_get_fire_slot(NetDoor *d, void *unused) {
  (void)d; (void)unused;
  return PyLong_FromUnsignedLongLong((unsigned long long)(uintptr_t)&nd_fire_slot);
}

static PyObject *NetDoor_get_count_call(NetDoor *d, void *unused) {
  (void)d; (void)unused;
  if (nd_intern() < 0) return NULL;
  return PyLong_FromUnsignedLongLong((unsigned long long)(uintptr_t)&nd_count);
}

static int NetDoor_init(NetDoor *d, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"comm", "cupy_type", "cupy_contig", "current_stream", "torch_types", "names", "error",
                           "torch_stream", NULL};
  PyObject *comm, *cp, *cur, *tt, *names, *err, *tst = Py_None;
  int contig_attr;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "OOpOO!O!O|$O", kwlist, &comm, &cp, &contig_attr, &cur,
                                   &PyTuple_Type, &tt, &PyTuple_Type, &names, &err, &tst))
    return -1;
  if (nd_intern() < 0) return -1;
  if (PyTuple_GET_SIZE(names) != ND_COLLS) {
    PyErr_SetString(PyExc_ValueError, "names: one str per collective (6)");
    return -1;
  }
  for (int i = 0; i < ND_COLLS; i++)
    if (!PyUnicode_Check(PyTuple_GET_ITEM(names, i))) {
      PyErr_SetString(PyExc_TypeError, "names: str");
      return -1;
    }
  nd_drop(d);
  Py_INCREF(comm); Py_XSETREF(d->comm, comm);
  Py_INCREF(cp); Py_XSETREF(d->cp_type, cp);
  Py_INCREF(cur); Py_XSETREF(d->cur_stream, cur);
  Py_INCREF(tst); Py_XSETREF(d->torch_stream, tst);
  Py_INCREF(tt); Py_XSETREF(d->torch_types, tt);
  Py_INCREF(names); Py_XSETREF(d->names, names);
  Py_INCREF(err); Py_XSETREF(d->errcls, err);
  d->cp_contig_attr = contig_attr;
  return 0;
}

static int NetDoor_traverse(NetDoor *d, visitproc visit, void *arg) {
  Py_VISIT(d->comm);
  Py_VISIT(d->cp_type);
  Py_VISIT(d->cur_stream);
  Py_VISIT(d->torch_stream);
  Py_VISIT(d->torch_types);
  Py_VISIT(d->errcls);
  for (int i = 0; i < ND_SLOTS; i++)
    if (d->tab[i].used) {
      Py_VISIT(d->tab[i].op);
      Py_VISIT(d->tab[i].prog);
    }
  return 0;
}

static int NetDoor_clear(NetDoor *d) {
  nd_drop(d);
  Py_CLEAR(d->comm);
  Py_CLEAR(d->cp_type);
  Py_CLEAR(d->cur_stream);
  Py_CLEAR(d->torch_stream);
  Py_CLEAR(d->torch_types);
  Py_CLEAR(d->names);
  Py_CLEAR(d->errcls);
  return 0;
}

static void NetDoor_dealloc(NetDoor *d) {
  PyObject_GC_UnTrack(d);
  NetDoor_clear(d);
  Py_TYPE(d)->tp_free((PyObject *)d);
}

static PyMethodDef NetDoor_methods[] = {
  {"fire", (PyCFunction)(void (*)(void))NetDoor_fire, METH_FASTCALL,
   "fire(code, sendbuf, recvbuf, op, root, stream) -> True: replayed and counted; False: not taken, nothing "
   "changed (the Python path runs)"},
  {"put", (PyCFunction)(void (*)(void))NetDoor_put, METH_FASTCALL,
   "put(code, send_key, recv_key, op, root, stream, program, nbytes) -> True when kept: a fire() whose "
   "buffers read as send_key and recv_key ((address, count, dtype, contiguous) or None) replays program"},
  {"slot", (PyCFunction)(void (*)(void))NetDoor_slot, METH_FASTCALL,
   "slot(code, sendbuf, recvbuf, op, root, stream) -> the entry fire() would replay for this call, -1: none "
   "(for the compiled torch backend, with generation)"},
  {"drop", (PyCFunction)NetDoor_drop, METH_NOARGS, "forget every entry"},
  {"rows", (PyCFunction)NetDoor_rows, METH_O,
   "rows(kind) -> [(collective, kind, 'replayed', calls, bytes, seconds)] for the statistics"},
  {"histograms", (PyCFunction)NetDoor_histograms, METH_NOARGS,
   "{collective: latency buckets} of the collectives replayed (counted while latency is 1)"},
  {NULL, NULL, 0, NULL}};

static PyMemberDef NetDoor_members[] = {
  {"latency", T_INT, offsetof(NetDoor, latency), 0, "1: count each replay's time in log2 buckets (HPCCL_METRICS)"},
  {NULL, 0, 0, 0, NULL}};

static PyGetSetDef NetDoor_getset[] = {
  {"fired", (getter)NetDoor_get_fired, NULL, "calls replayed through the door", NULL},
  {"generation", (getter)NetDoor_get_gen, NULL, "bumped each time the entries are dropped (slots go stale)", NULL},
  {"fire_slot", (getter)NetDoor_get_fire_slot, NULL,
   "address of int nd_fire_slot(door, slot, generation, stream): 1 replayed, 0 declined, -1 error set; "
   "the GIL held", NULL},
  {"count_call", (getter)NetDoor_get_count_call, NULL,
   "address of int nd_count(comm, name, commit): commit 0, 1 when comm takes a replayed call now (else 0); "
   "commit 1, count it as Communicator._run does (1); -1 error set; the GIL held", NULL},
  {NULL, NULL, NULL, NULL, NULL}};

static PySequenceMethods NetDoor_seq = {.sq_length = (lenfunc)NetDoor_len};

PyTypeObject NetDoorType = {
  PyVarObject_HEAD_INIT(NULL, 0)
  .tp_name = "hpccl._netengine.NetDoor",
  .tp_basicsize = sizeof(NetDoor),
  .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
  .tp_doc = "NetDoor(comm, cupy_type, cupy_contig, current_stream, torch_types, names, error, *, "
            "torch_stream=None): repeated GPU calls across nodes keyed, replayed and counted in one C call.",
  .tp_methods = NetDoor_methods,
  .tp_getset = NetDoor_getset,
  .tp_members = NetDoor_members,
  .tp_as_sequence = &NetDoor_seq,
  .tp_init = (initproc)NetDoor_init,
  .tp_new = PyType_GenericNew,
  .tp_traverse = (traverseproc)NetDoor_traverse,
  .tp_clear = (inquiry)NetDoor_clear,
  .tp_dealloc = (destructor)NetDoor_dealloc,
};
