/* The front door of a communicator's host collectives, in C (hpccl/host/hotcalls.py installs one per
   collective as an attribute of the communicator, where it shadows the Python method).

   A small host call on the compiled hot path takes a few microseconds of C; the Python method that hands
   it over (Communicator.broadcast and _front_door: attribute reads, type checks, the op's code, _seq)
   cost about as much again, enough to lose to an MPI library whose binding is compiled. A FrontDoor does
   exactly what those two Python functions do, in one C call: it takes a call on numpy arrays that the
   planner's front dict routes to the hot path, hands it over with the communicator's next sequence
   number, and returns what the method returns. Anything else (other buffers, a group open, a GPU door,
   arguments it does not read, a call the hot path declines) goes to the Python method with the same
   arguments, unchanged; so do all the errors the method would raise. A failure of the hot path is named
   and aborts through hotcalls.failed, a pending call waits in hotcalls.wait, as on the Python path. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <limits.h>
#include <stddef.h>

enum { FD_AR, FD_RED, FD_BC, FD_AG, FD_RS, FD_A2A, FD_KINDS };
enum { A_SEND, A_RECV, A_OP, A_ROOT, A_STREAM, A_SLOTS };
#define FD_MAXPOS 4
#define FD_MAXARGS 8

static const char *const FD_NAMES[FD_KINDS] = {"all_reduce", "reduce", "broadcast", "all_gather",
                                               "reduce_scatter", "all_to_all"};
/* each collective's positional parameters as the Python method declares them, in order (-1 ends the list);
   every parameter, keyword-only ones too, may be given by its name (FD_SLOT_NAMES, NULL: it has none) */
static const int FD_POS[FD_KINDS][FD_MAXPOS + 1] = {
    {A_SEND, A_RECV, A_OP, -1}, {A_SEND, A_RECV, A_ROOT, A_OP, -1}, {A_SEND, A_ROOT, -1},
    {A_SEND, A_RECV, -1}, {A_SEND, A_RECV, A_OP, -1}, {A_SEND, A_RECV, -1}};
static const char *const FD_SLOT_NAMES[FD_KINDS][A_SLOTS] = {
    {"sendbuf", "recvbuf", "op", NULL, "stream"}, {"sendbuf", "recvbuf", "op", "root", "stream"},
    {"buf", "recvbuf", NULL, "root", "stream"}, {"sendbuf", "recvbuf", NULL, NULL, "stream"},
    {"sendbuf", "recvbuf", "op", NULL, "stream"}, {"sendbuf", "recvbuf", NULL, NULL, "stream"}};

static PyObject *s_door, *s_group, *s_seq;

typedef struct {
  PyObject_HEAD
  vectorcallfunc vectorcall;
  int kind;
  long long rank;           /* the communicator's rank (reduce's result depends on it) */
  PyObject *comm;           /* the Communicator */
  PyObject *front;          /* its planner's front dict: collective -> hot path object (filled and emptied in place) */
  PyObject *name;           /* the collective's name: the front's key and the hot path's method */
  PyObject *method;         /* the Python method's function (called as method(comm, ...) for what the door leaves) */
  PyObject *ndarray;        /* numpy.ndarray: the only buffer type the door takes */
  PyObject *ops;            /* the ReduceOp members, in the hot path's op code order */
  PyObject *opcode;         /* op (a ReduceOp or its name) -> the hot path's code */
  PyObject *optype;         /* ReduceOp */
  PyObject *caught;         /* the exceptions that are the hot path's failures: (HpcclError, OSError) */
  PyObject *failed;         /* failed(comm, exc, collective): names the failure, aborts, raises */
  PyObject *wait;           /* wait(comm, hot, collective): a call the hot path left pending */
  PyObject *slot_names[A_SLOTS];
} FrontDoor;

/* the Python method with the caller's arguments, as though the door were not there */
static PyObject *fd_pass(FrontDoor *d, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
  Py_ssize_t n = PyVectorcall_NARGS(nargsf), nk = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
  PyObject *stack[FD_MAXARGS + 1];
  if (n + nk + 1 > FD_MAXARGS + 1) {  /* more arguments than any collective takes: Python says what is wrong */
    PyObject *pos = PyTuple_New(n + 1);
    if (!pos) return NULL;
    Py_INCREF(d->comm);
    PyTuple_SET_ITEM(pos, 0, d->comm);
    for (Py_ssize_t i = 0; i < n; i++) {
      Py_INCREF(args[i]);
      PyTuple_SET_ITEM(pos, i + 1, args[i]);
    }
    PyObject *kw = NULL;
    if (nk) {
      if (!(kw = PyDict_New())) { Py_DECREF(pos); return NULL; }
      for (Py_ssize_t i = 0; i < nk; i++)
        if (PyDict_SetItem(kw, PyTuple_GET_ITEM(kwnames, i), args[n + i]) < 0) {
          Py_DECREF(pos); Py_DECREF(kw);
          return NULL;
        }
    }
    PyObject *r = PyObject_Call(d->method, pos, kw);
    Py_DECREF(pos);
    Py_XDECREF(kw);
    return r;
  }
  stack[0] = d->comm;
  for (Py_ssize_t i = 0; i < n + nk; i++) stack[i + 1] = args[i];
  return PyObject_Vectorcall(d->method, stack, (size_t)(n + 1), kwnames);
}

/* the call's arguments into slots (absent: NULL); 0 when the door does not read them (Python then does) */
static int fd_slots(FrontDoor *d, PyObject *const *args, size_t nargsf, PyObject *kwnames, PyObject **a) {
  Py_ssize_t n = PyVectorcall_NARGS(nargsf);
  for (int i = 0; i < A_SLOTS; i++) a[i] = NULL;
  const int *pos = FD_POS[d->kind];
  for (Py_ssize_t i = 0; i < n; i++) {
    if (i >= FD_MAXPOS || pos[i] < 0) return 0;
    a[pos[i]] = args[i];
  }
  Py_ssize_t nk = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
  for (Py_ssize_t i = 0; i < nk; i++) {
    PyObject *k = PyTuple_GET_ITEM(kwnames, i);
    int slot = -1;
    for (int s = 0; s < A_SLOTS && slot < 0; s++)
      if (d->slot_names[s] && (k == d->slot_names[s] || PyUnicode_Compare(k, d->slot_names[s]) == 0)) slot = s;
    if (PyErr_Occurred()) PyErr_Clear();
    if (slot < 0 || a[slot]) return 0;  /* unknown or given twice: Python's TypeError */
    a[slot] = args[n + i];
  }
  return a[A_SEND] != NULL;
}

/* the hot path's code of op (the method's default when absent), or -1 (the hot path declines it) */
static long fd_opcode(FrontDoor *d, PyObject *op) {
  if (!op) return 0;
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(d->ops); i++)
    if (op == PyTuple_GET_ITEM(d->ops, i)) return (long)i;
  if (!PyUnicode_CheckExact(op) && (PyObject *)Py_TYPE(op) != d->optype) return -1;
  PyObject *c = PyDict_GetItemWithError(d->opcode, op);
  if (!c) {
    PyErr_Clear();
    return -1;
  }
  long v = PyLong_AsLong(c);
  if (v == -1 && PyErr_Occurred()) PyErr_Clear();
  return v;
}

static int fd_is_none_attr(PyObject *o, PyObject *name) {
  PyObject *v = PyObject_GetAttr(o, name);
  if (!v) return -1;
  int none = v == Py_None;
  Py_DECREF(v);
  return none;
}

static PyObject *fd_call(FrontDoor *d, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
  PyObject *a[A_SLOTS];
  if (!fd_slots(d, args, nargsf, kwnames, a)) return fd_pass(d, args, nargsf, kwnames);
  PyObject *send = a[A_SEND], *recv = a[A_RECV] ? a[A_RECV] : Py_None;
  int out_required = d->kind >= FD_AG;
  if ((PyObject *)Py_TYPE(send) != d->ndarray || (out_required && (PyObject *)Py_TYPE(recv) != d->ndarray))
    return fd_pass(d, args, nargsf, kwnames);
  if ((d->kind == FD_BC || d->kind == FD_RED) && a[A_ROOT]) {  /* an int that fits C's (the hot path's) */
    if (!PyLong_CheckExact(a[A_ROOT])) return fd_pass(d, args, nargsf, kwnames);
    int over = 0;
    long long r = PyLong_AsLongLongAndOverflow(a[A_ROOT], &over);
    if (over || r < INT_MIN || r > INT_MAX) return fd_pass(d, args, nargsf, kwnames);
  }
  PyObject *hot = PyDict_GetItemWithError(d->front, d->name);  /* borrowed */
  if (!hot) {
    if (PyErr_Occurred()) return NULL;
    return fd_pass(d, args, nargsf, kwnames);
  }
  int no_door = fd_is_none_attr(d->comm, s_door), no_group = no_door > 0 ? fd_is_none_attr(d->comm, s_group) : 0;
  if (no_door < 0 || no_group < 0) return NULL;
  if (!no_door || !no_group) return fd_pass(d, args, nargsf, kwnames);
  Py_INCREF(hot);  /* the front may be emptied by what the call runs (an abort) */
  PyObject *seq0 = PyObject_GetAttr(d->comm, s_seq), *seq1 = NULL, *res = NULL, *code = NULL;
  if (!seq0) goto out;
  long long s = PyLong_AsLongLong(seq0);
  if (s == -1 && PyErr_Occurred()) goto out;
  if (!(seq1 = PyLong_FromLongLong(s + 1))) goto out;
  PyObject *root = a[A_ROOT] ? a[A_ROOT] : NULL;
  PyObject *zero = NULL;
  if ((d->kind == FD_BC || d->kind == FD_RED) && !root) root = zero = PyLong_FromLong(0);
  if ((d->kind == FD_BC || d->kind == FD_RED) && !root) goto out;
  PyObject *stack[6];
  size_t n = 0;
  stack[n++] = hot, stack[n++] = send, stack[n++] = recv;
  if (d->kind == FD_RED || d->kind == FD_BC) stack[n++] = root;
  if (d->kind == FD_AR || d->kind == FD_RED || d->kind == FD_RS) {
    if (!(code = PyLong_FromLong(fd_opcode(d, a[A_OP])))) { Py_XDECREF(zero); goto out; }
    stack[n++] = code;
  }
  stack[n++] = seq1;
  PyObject *rc = PyObject_VectorcallMethod(d->name, stack, n, NULL);
  Py_XDECREF(zero);
  if (!rc) {
    if (PyErr_ExceptionMatches(PyExc_OverflowError)) {  /* a root past C's int: nothing ran; the method names it */
      PyErr_Clear();
      res = fd_pass(d, args, nargsf, kwnames);
    } else if (PyErr_ExceptionMatches(d->caught)) {  /* a round failed across nodes: counted, named, aborting */
#if PY_VERSION_HEX >= 0x030C0000
      PyObject *exc = PyErr_GetRaisedException();
#else
      PyObject *et, *exc, *tb;
      PyErr_Fetch(&et, &exc, &tb);
      PyErr_NormalizeException(&et, &exc, &tb);
      if (tb && exc) PyException_SetTraceback(exc, tb);
      Py_XDECREF(et);
      Py_XDECREF(tb);
#endif
      if (PyObject_SetAttr(d->comm, s_seq, seq1) == 0) {
        PyObject *r = PyObject_CallFunctionObjArgs(d->failed, d->comm, exc, d->name, NULL);
        Py_XDECREF(r);  /* it raises */
      }
      Py_XDECREF(exc);
    }
    goto out;
  }
  long v = PyLong_AsLong(rc);
  Py_DECREF(rc);
  if (v == -1 && PyErr_Occurred()) goto out;
  if (v < 0) {  /* declined, nothing changed: the validating way */
    res = fd_pass(d, args, nargsf, kwnames);
    goto out;
  }
  if (PyObject_SetAttr(d->comm, s_seq, seq1) < 0) goto out;
  if (v) {  /* pending: the waiter's timeout, abort and dead-peer checks */
    PyObject *r = PyObject_CallFunctionObjArgs(d->wait, d->comm, hot, d->name, NULL);
    if (!r) goto out;
    Py_DECREF(r);
  }
  switch (d->kind) {
    case FD_AR: case FD_BC:
      res = recv == Py_None ? send : recv;
      break;
    case FD_RED: {
      long long r = a[A_ROOT] ? PyLong_AsLongLong(a[A_ROOT]) : 0;
      res = r == d->rank ? (recv == Py_None ? send : recv) : recv;
      break;
    }
    default:
      res = recv;
  }
  Py_INCREF(res);
out:
  Py_DECREF(hot);
  Py_XDECREF(code);
  Py_XDECREF(seq0);
  Py_XDECREF(seq1);
  return res;
}

static PyObject *fd_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
  return fd_call((FrontDoor *)self, args, nargsf, kwnames);
}

static int fd_traverse(FrontDoor *d, visitproc visit, void *arg) {
  Py_VISIT(d->comm); Py_VISIT(d->front); Py_VISIT(d->method); Py_VISIT(d->ndarray); Py_VISIT(d->ops);
  Py_VISIT(d->opcode); Py_VISIT(d->optype); Py_VISIT(d->caught); Py_VISIT(d->failed); Py_VISIT(d->wait);
  return 0;
}

static int fd_clear(FrontDoor *d) {
  Py_CLEAR(d->comm); Py_CLEAR(d->front); Py_CLEAR(d->method); Py_CLEAR(d->ndarray); Py_CLEAR(d->ops);
  Py_CLEAR(d->opcode); Py_CLEAR(d->optype); Py_CLEAR(d->caught); Py_CLEAR(d->failed); Py_CLEAR(d->wait);
  return 0;
}

static void fd_dealloc(FrontDoor *d) {
  PyObject_GC_UnTrack(d);
  fd_clear(d);
  Py_XDECREF(d->name);
  for (int i = 0; i < A_SLOTS; i++) Py_XDECREF(d->slot_names[i]);
  Py_TYPE(d)->tp_free((PyObject *)d);
}

/* FrontDoor(comm, collective, method, front, rank, ndarray, ops, opcode, optype, caught, failed, wait) */
static PyObject *fd_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
  PyObject *comm, *method, *front, *ndarray, *ops, *opcode, *optype, *caught, *failed, *wait;
  const char *coll;
  long long rank;
  if (kw && PyDict_GET_SIZE(kw)) {
    PyErr_SetString(PyExc_TypeError, "FrontDoor() takes positional arguments only");
    return NULL;
  }
  if (!PyArg_ParseTuple(args, "OsOO!LO!O!O!OOOO", &comm, &coll, &method, &PyDict_Type, &front, &rank,
                        &PyType_Type, &ndarray, &PyTuple_Type, &ops, &PyDict_Type, &opcode, &optype, &caught,
                        &failed, &wait))
    return NULL;
  int kind = -1;
  for (int i = 0; i < FD_KINDS; i++)
    if (strcmp(coll, FD_NAMES[i]) == 0) kind = i;
  if (kind < 0) {
    PyErr_Format(PyExc_ValueError, "FrontDoor: no front door for collective %R", PyTuple_GET_ITEM(args, 1));
    return NULL;
  }
  if (!PyCallable_Check(method) || !PyCallable_Check(failed) || !PyCallable_Check(wait)) {
    PyErr_SetString(PyExc_TypeError, "FrontDoor: method, failed and wait must be callable");
    return NULL;
  }
  if (!s_seq && (!(s_door = PyUnicode_InternFromString("_door")) || !(s_group = PyUnicode_InternFromString("_group"))
                 || !(s_seq = PyUnicode_InternFromString("_seq"))))
    return NULL;
  FrontDoor *d = (FrontDoor *)type->tp_alloc(type, 0);
  if (!d) return NULL;
  d->vectorcall = fd_vectorcall;
  d->kind = kind;
  d->rank = rank;
  if (!(d->name = PyUnicode_InternFromString(coll))) goto fail;
  for (int s = 0; s < A_SLOTS; s++)
    if (FD_SLOT_NAMES[kind][s] && !(d->slot_names[s] = PyUnicode_InternFromString(FD_SLOT_NAMES[kind][s]))) goto fail;
#define HOLD(f) Py_INCREF(f); d->f = f
  HOLD(comm); HOLD(front); HOLD(method); HOLD(ndarray); HOLD(ops); HOLD(opcode); HOLD(optype); HOLD(caught);
  HOLD(failed); HOLD(wait);
#undef HOLD
  return (PyObject *)d;
fail:
  Py_DECREF(d);
  return NULL;
}

static PyObject *fd_get_collective(FrontDoor *d, void *unused) {
  (void)unused;
  Py_INCREF(d->name);
  return d->name;
}

/* Python's tools (inspect.signature, help, IDEs) see the method the door stands for: __wrapped__ is the bound
   method, and the door's name and docs are the method's. */
static PyObject *fd_get_wrapped(FrontDoor *d, void *unused) {
  (void)unused;
  return PyMethod_New(d->method, d->comm);
}

static PyObject *fd_get_attr_of_method(FrontDoor *d, void *name) {
  return PyObject_GetAttrString(d->method, (const char *)name);
}

/* a routine to inspect.isroutine and pydoc: read from a class, the door is itself */
static PyObject *fd_descr_get(PyObject *self, PyObject *obj, PyObject *type) {
  (void)obj;
  (void)type;
  Py_INCREF(self);
  return self;
}

static PyGetSetDef fd_getset[] = {
    {"collective", (getter)fd_get_collective, NULL, "the collective this door takes", NULL},
    {"__wrapped__", (getter)fd_get_wrapped, NULL, "the Python method, bound to its communicator", NULL},
    {"__doc__", (getter)fd_get_attr_of_method, NULL, NULL, "__doc__"},
    {"__name__", (getter)fd_get_attr_of_method, NULL, NULL, "__name__"},
    {"__qualname__", (getter)fd_get_attr_of_method, NULL, NULL, "__qualname__"},
    {"__module__", (getter)fd_get_attr_of_method, NULL, NULL, "__module__"},
    {"__annotations__", (getter)fd_get_attr_of_method, NULL, NULL, "__annotations__"},
    {NULL, NULL, NULL, NULL, NULL}};

PyTypeObject FrontDoorType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "hpccl._hotpath.FrontDoor",
    .tp_basicsize = sizeof(FrontDoor),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "A communicator's collective, taken on its compiled hot path in one C call where the Python "
              "method's front door would take it; everything else goes to the method.",
    .tp_vectorcall_offset = offsetof(FrontDoor, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_new = fd_new,
    .tp_traverse = (traverseproc)fd_traverse,
    .tp_clear = (inquiry)fd_clear,
    .tp_dealloc = (destructor)fd_dealloc,
    .tp_getset = fd_getset,
    .tp_descr_get = fd_descr_get,
};
