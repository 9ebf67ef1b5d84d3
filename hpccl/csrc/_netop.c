/* What a caller holds for engine work in flight (_netpy.h): Op, one batch Python owns (a send, a receive
   or a control message), the sends dropped in flight that are parked until UCX lets go of their buffers,
   and Template, a network step captured in a CUDA graph. Engine (_netengine.c) makes them. */
#include "_netpy.h"

#include <stdlib.h>

/* ----- Op (one batch owned by Python) ---------------------------------------------------------------- */
static PyObject *raise_batch(batch_t *b) {
  PyObject *args = Py_BuildValue("(iis)", b->ecode, b->epeer, b->err);
  if (args) { PyErr_SetObject(HpErr, args); Py_DECREF(args); }
  return NULL;
}

static int op_wait_release(Op *o, double seconds) { return batch_wait(o->eng, o->b, seconds); }

static PyObject *Op_test(Op *self, PyObject *noargs) {
  (void)noargs;
  int st = atomic_load_explicit(&self->b->state, memory_order_acquire);
  if (st == B_DONE) Py_RETURN_TRUE;
  if (st == B_FAILED) return raise_batch(self->b);
  Py_RETURN_FALSE;
}

static PyObject *Op_wait(Op *self, PyObject *args) {
  double seconds;
  if (!PyArg_ParseTuple(args, "d", &seconds)) return NULL;
  if (!op_wait_release(self, seconds)) Py_RETURN_FALSE;
  return Op_test(self, NULL);
}

static PyObject *Op_done(Op *self, PyObject *noargs) {
  (void)noargs;
  return PyBool_FromLong(atomic_load(&self->b->state) >= B_DONE);
}

/* Sends dropped while UCX still reads their buffers. UCX cannot cancel a send, and a rendezvous send whose
   receiver gave up ends only when its endpoint closes; waiting for it made every such Op's unwinding cost a
   second (an error past HPCCL_TIMEOUT). Their views are parked here instead and let go by the first sweep
   (each Op's dealloc, each engine's close, parked()) after their batches end or their engines close.
   Guarded by the GIL. */
typedef struct parked {
  struct parked *next;
  Engine *eng;
  batch_t *b;
  Py_buffer view;
} parked_t;

static parked_t *parked_sends;
static long n_parked;

void park_sweep(void) {
  parked_t *ended = NULL;
  for (parked_t **pp = &parked_sends; *pp;) {  /* unlinked first: releasing runs Python, which may sweep */
    parked_t *p = *pp;
    if (atomic_load(&p->b->state) >= B_DONE || p->eng->core.closed) {
      *pp = p->next;
      p->next = ended;
      ended = p;
      n_parked--;
    } else {
      pp = &p->next;
    }
  }
  while (ended) {
    parked_t *p = ended;
    ended = p->next;
    PyBuffer_Release(&p->view);
    batch_unref(p->b);
    Py_DECREF(p->eng);
    free(p);
  }
}

/* park o's send (its view, batch and engine move to the list); 0 when out of memory (the caller waits) */
static int park(Op *o) {
  parked_t *p = malloc(sizeof *p);
  if (!p) return 0;
  p->eng = o->eng;
  p->b = o->b;
  p->view = o->view;
  p->next = parked_sends;
  parked_sends = p;
  n_parked++;
  o->eng = NULL;
  o->b = NULL;
  o->have_view = 0;
  return 1;
}

static void Op_dealloc(Op *self) {
  park_sweep();
  if (self->b) {
    int st = atomic_load(&self->b->state);
    int send = self->b->nops == 1 && self->b->ops[0].kind == K_SEND && self->have_view;
    if (st < B_DONE && self->eng && !self->eng->core.closed && send && park(self)) {
      Py_TYPE(self)->tp_free((PyObject *)self);
      return;
    }
    if (st < B_DONE && self->eng && !self->eng->core.closed) {
      /* a receive dropped in flight (an exception unwound past it): the buffer must outlive UCX's writes */
      op_wait_release(self, 1.0);
    }
    if (atomic_load(&self->b->state) >= B_DONE || (self->eng && self->eng->core.closed)) {
      if (self->have_view) PyBuffer_Release(&self->view);
    }  /* else: leak the view rather than free memory UCX may still write */
    batch_unref(self->b);
  }
  Py_XDECREF(self->eng);
  Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef Op_methods[] = {
  {"test", (PyCFunction)Op_test, METH_NOARGS, "True when done; raises EngineError if it failed."},
  {"wait", (PyCFunction)Op_wait, METH_VARARGS, "wait(seconds): block without the GIL; then as test()."},
  {"ended", (PyCFunction)Op_done, METH_NOARGS, "True when done or failed (never raises)."},
  {NULL, NULL, 0, NULL}};

PyTypeObject OpType = {
  PyVarObject_HEAD_INIT(NULL, 0)
  .tp_name = "hpccl._netengine.Op",
  .tp_basicsize = sizeof(Op),
  .tp_flags = Py_TPFLAGS_DEFAULT,
  .tp_doc = "One send or receive (or control message) in flight.",
  .tp_methods = Op_methods,
  .tp_dealloc = (destructor)Op_dealloc,
};

Op *new_op(Engine *e, batch_t *b) {
  Op *o = PyObject_New(Op, &OpType);
  if (!o) return NULL;
  Py_INCREF(e);
  o->eng = e;
  o->b = b;
  o->have_view = 0;
  return o;
}

/* ----- Template (a captured network step, reposted by each graph replay) ---------------------------- */
typedef struct {
  PyObject_HEAD
  Engine *eng;
  batch_t *b;
} Template;

/* stop polling t's arm word (its memory is about to be freed; engine_template_retire) */
static void template_retire(Template *t) {
  Engine *e = t->eng;
  batch_t *b = t->b;
  if (!e || !b || !b->arm) return;
  Py_BEGIN_ALLOW_THREADS
  engine_template_retire(&e->core, b);
  Py_END_ALLOW_THREADS
}

static void Template_dealloc(Template *self) {
  template_retire(self);
  if (self->b) {
    int st = atomic_load(&self->b->state);
    if (st == B_NEW || st == B_ACTIVE) {
      /* still in flight: leak it (its memory is referenced by the engine) */
    } else {
      batch_unref(self->b);
    }
  }
  Py_XDECREF(self->eng);
  Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Template_state(Template *self, PyObject *noargs) {
  (void)noargs;
  return Py_BuildValue("(iI)", atomic_load(&self->b->state), (unsigned)atomic_load(&self->b->replays));
}

static PyObject *Template_retire(Template *self, PyObject *noargs) {
  (void)noargs;
  template_retire(self);
  Py_RETURN_NONE;
}

static PyMethodDef Template_methods[] = {
  {"state", (PyCFunction)Template_state, METH_NOARGS, "(state, replays so far)."},
  {"retire", (PyCFunction)Template_retire, METH_NOARGS, "Stop polling the arm word (before its memory is freed)."},
  {NULL, NULL, 0, NULL}};

PyTypeObject TemplateType = {
  PyVarObject_HEAD_INIT(NULL, 0)
  .tp_name = "hpccl._netengine.Template",
  .tp_basicsize = sizeof(Template),
  .tp_flags = Py_TPFLAGS_DEFAULT,
  .tp_doc = "A network step captured in a CUDA graph: the engine posts it whenever a replay sets its arm word.",
  .tp_methods = Template_methods,
  .tp_dealloc = (destructor)Template_dealloc,
};

/* a Template over b (prepared), holding the engine; NULL with an error set */
PyObject *template_new(Engine *e, batch_t *b) {
  Template *t = PyObject_New(Template, &TemplateType);
  if (!t) return NULL;
  Py_INCREF(e);
  t->eng = e;
  t->b = b;
  return (PyObject *)t;
}

/* the parked sends still held, after letting go of those that ended (the module's parked()) */
long parked_count(void) {
  park_sweep();
  return n_parked;
}
