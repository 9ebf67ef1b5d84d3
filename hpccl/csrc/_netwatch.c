/* The host's backstop for a stream waiting on a network engine that stopped (hpccl/gpu/netwatch.py).

   A GPU network step on the eager path makes the stream wait (cuStreamWaitValue32) for the engine's done word,
   with no limit of its own: if the engine's thread stops (stuck in a library call, say), the stream never
   moves again. One process-wide thread, plain C and without the GIL (a caller blocked in a GIL-holding sync
   cannot stop it), looks at each watched communicator's engines every 100 ms; when one made no round of its
   loop (engine_t.beats) for the watch's limit (2 x HPCCL_TIMEOUT + 10 s), it writes every lane's done word to
   the last value handed out, so every wait ends, and sets the stuck word to 2, which the communicator's next
   call and synchronize() raise. A live engine loops at least every 50 ms. After a pass this thread itself
   missed for 2 s (the whole process was stopped), every engine's silence counts from then. */
#include "_netpy.h"

#define WATCH_LANES 8
#define WATCH_POLL_NS 100000000L
#define WATCH_GAP_S 2.0
#define STUCK_WATCH 2u

typedef struct NetWatch {
  PyObject_HEAD
  struct NetWatch *next;        /* in the watched list (wl_lock) */
  int listed;
  PyObject *keep;               /* the engines and the owner of the words, alive while this lives */
  engine_t *eng[WATCH_LANES];
  int n;
  volatile uint32_t *stuck, *done[WATCH_LANES];
  const volatile uint32_t *val; /* per lane: the last done value handed out (netstage.NetState.val) */
  double limit;
  unsigned long long seen[WATCH_LANES];
  double since[WATCH_LANES];
  atomic_int released;          /* 1 + the lane whose engine stopped, 0 while none did */
} NetWatch;

static pthread_mutex_t wl_lock = PTHREAD_MUTEX_INITIALIZER;
static NetWatch *wl_head;
static int wl_started;

static void watch_release(NetWatch *w) {
  if (*w->stuck == 0) *w->stuck = STUCK_WATCH;
  for (int j = 0; j < w->n; j++) *w->done[j] = w->val[j];
}

static void watch_check(NetWatch *w, double now, int gap) {
  if (atomic_load(&w->released)) return;
  for (int j = 0; j < w->n; j++) {
    engine_t *e = w->eng[j];
    unsigned long long b = atomic_load_explicit(&e->beats, memory_order_relaxed);
    if (gap || b != w->seen[j] || b == 0 || !e->started || atomic_load(&e->closed)) {
      w->seen[j] = b;
      w->since[j] = now;
    } else if (now - w->since[j] > w->limit) {
      watch_release(w);
      atomic_store(&w->released, j + 1);
      return;
    }
  }
}

static void *watch_loop(void *arg) {
  (void)arg;
  double last = now_s();
  for (;;) {
    struct timespec ts = {0, WATCH_POLL_NS};
    nanosleep(&ts, NULL);
    double now = now_s();
    int gap = now - last > WATCH_GAP_S;
    last = now;
    pthread_mutex_lock(&wl_lock);
    for (NetWatch *w = wl_head; w; w = w->next) watch_check(w, now, gap);
    pthread_mutex_unlock(&wl_lock);
  }
  return NULL;
}

static void watch_unlist(NetWatch *w) {
  pthread_mutex_lock(&wl_lock);
  if (w->listed) {
    for (NetWatch **p = &wl_head; *p; p = &(*p)->next)
      if (*p == w) { *p = w->next; break; }
    w->listed = 0;
  }
  pthread_mutex_unlock(&wl_lock);
}

static int NetWatch_init(NetWatch *self, PyObject *args, PyObject *kw) {
  static char *names[] = {"engines", "stuck", "dones", "vals", "limit", "keep", NULL};
  PyObject *engs, *dones, *keep;
  unsigned long long stuck, vals;
  double limit;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O!KO!KdO", names, &PyTuple_Type, &engs, &stuck, &PyTuple_Type,
                                   &dones, &vals, &limit, &keep))
    return -1;
  Py_ssize_t n = PyTuple_GET_SIZE(engs);
  if (self->listed) {
    PyErr_SetString(PyExc_RuntimeError, "this NetWatch is already watching");
    return -1;
  }
  if (n < 1 || n > WATCH_LANES || PyTuple_GET_SIZE(dones) != n) {
    PyErr_Format(PyExc_ValueError, "engines: 1 to %d, and as many dones (got %zd and %zd)", WATCH_LANES, n,
                 PyTuple_GET_SIZE(dones));
    return -1;
  }
  if (!stuck || !vals || !(limit > 0)) {
    PyErr_SetString(PyExc_ValueError, "stuck and vals: addresses; limit: seconds above 0");
    return -1;
  }
  for (Py_ssize_t j = 0; j < n; j++) {
    PyObject *e = PyTuple_GET_ITEM(engs, j);
    if (!PyObject_TypeCheck(e, &EngineType)) {
      PyErr_Format(PyExc_TypeError, "engines[%zd]: an Engine, not %s", j, Py_TYPE(e)->tp_name);
      return -1;
    }
    unsigned long long d = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(dones, j));
    if (PyErr_Occurred()) return -1;
    self->eng[j] = &((Engine *)e)->core;
    self->done[j] = (volatile uint32_t *)(uintptr_t)d;
  }
  Py_XSETREF(self->keep, Py_BuildValue("(OO)", engs, keep));
  if (!self->keep) return -1;
  self->n = (int)n;
  self->stuck = (volatile uint32_t *)(uintptr_t)stuck;
  self->val = (const volatile uint32_t *)(uintptr_t)vals;
  self->limit = limit;
  atomic_store(&self->released, 0);
  double now = now_s();
  for (int j = 0; j < self->n; j++) {
    self->seen[j] = atomic_load(&self->eng[j]->beats);
    self->since[j] = now;
  }
  pthread_mutex_lock(&wl_lock);
  int start = !wl_started;
  if (start) {
    pthread_t t;
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    wl_started = pthread_create(&t, &at, watch_loop, NULL) == 0;
    pthread_attr_destroy(&at);
  }
  if (wl_started) {
    self->next = wl_head;
    wl_head = self;
    self->listed = 1;
  }
  pthread_mutex_unlock(&wl_lock);
  if (!self->listed) {
    PyErr_SetString(PyExc_RuntimeError, "could not start the network watchdog's thread");
    return -1;
  }
  return 0;
}

static PyObject *NetWatch_close(NetWatch *self, PyObject *noargs) {
  (void)noargs;
  watch_unlist(self);
  Py_RETURN_NONE;
}

static PyObject *NetWatch_released(NetWatch *self, void *c) {
  (void)c;
  return PyLong_FromLong(atomic_load(&self->released));
}

static PyObject *NetWatch_watching(NetWatch *self, void *c) {
  (void)c;
  pthread_mutex_lock(&wl_lock);
  int on = self->listed;
  pthread_mutex_unlock(&wl_lock);
  return PyBool_FromLong(on);
}

static void NetWatch_dealloc(NetWatch *self) {
  watch_unlist(self);
  Py_CLEAR(self->keep);
  Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef NetWatch_methods[] = {
  {"close", (PyCFunction)NetWatch_close, METH_NOARGS, "Stop watching (before the words' memory is freed)."},
  {NULL, NULL, 0, NULL}};

static PyGetSetDef NetWatch_getset[] = {
  {"released", (getter)NetWatch_released, NULL, "0, or 1 + the lane whose engine stopped (its waits released)",
   NULL},
  {"watching", (getter)NetWatch_watching, NULL, "whether the watchdog's thread still looks at it", NULL},
  {NULL, NULL, NULL, NULL, NULL}};

PyTypeObject NetWatchType = {
  PyVarObject_HEAD_INIT(NULL, 0)
  .tp_name = "hpccl._netengine.NetWatch",
  .tp_basicsize = sizeof(NetWatch),
  .tp_flags = Py_TPFLAGS_DEFAULT,
  .tp_doc = "NetWatch(engines, stuck, dones, vals, limit, keep): release a communicator's stream waits (done "
            "words to vals) and set its stuck word to 2 once one of its engines made no round for limit seconds.",
  .tp_methods = NetWatch_methods,
  .tp_getset = NetWatch_getset,
  .tp_init = (initproc)NetWatch_init,
  .tp_new = PyType_GenericNew,
  .tp_dealloc = (destructor)NetWatch_dealloc,
};
