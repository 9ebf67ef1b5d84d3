/* What hpccl._netengine's Python types share (_netpy.h): the EngineError exception, the checks of an engine
   and a peer every type makes, and a wait for a batch with the GIL released. */
#include "_netpy.h"

PyObject *HpErr;  /* made by the module (_netmodule.c) */

int check_open(Engine *e) {
  if (e->core.closed || !e->core.started) {
    PyErr_SetString(PyExc_RuntimeError, e->core.closed ? "the network engine is closed" : "the network engine is not connected");
    return -1;
  }
  return 0;
}

int check_peer(Engine *e, int peer) {
  if (peer < 0 || peer >= e->core.size || peer == e->core.rank) {
    PyErr_Format(PyExc_ValueError, "peer %d is not another rank of 0..%d", peer, e->core.size - 1);
    return -1;
  }
  return 0;
}

/* wait (without the GIL) until the batch has ended or ``seconds`` pass; 1 if ended */
int batch_wait(Engine *e, batch_t *b, double seconds) {
  int st = atomic_load_explicit(&b->state, memory_order_acquire);
  if (st >= B_DONE) return 1;
  if (seconds <= 0) return 0;
  int ended;
  Py_BEGIN_ALLOW_THREADS
  ended = engine_wait(&e->core, b, seconds);
  Py_END_ALLOW_THREADS
  return ended;
}
