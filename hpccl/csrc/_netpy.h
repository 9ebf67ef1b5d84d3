/* What the Python types of hpccl._netengine share. The engine itself is plain C (_netcore.h). One way down:
   _netmodule.c (the module) -> _netengine.c (Engine) -> _netop.c (Op, Template), _netreplay.c (NetProgram,
   Engine.program) -> _netpy.c (what every type uses); _netdoor.c (NetDoor) -> _netreplay.c; _nethot.c
   (NetHot) and _netwatch.c (NetWatch) -> _netengine.c's type; nothing calls a file above it
   (tests/test_imports.py checks it). */
#ifndef HPCCL_NETPY_H
#define HPCCL_NETPY_H
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include "_netcore.h"

/* _netengine.Engine: one engine, and the communicator's current call */
typedef struct {
  PyObject_HEAD
  engine_t core;
  long long seq;             /* the communicator's current call (control answers carry it); GIL-guarded */
} Engine;

/* _netengine.Op: one batch Python owns (its buffer held through ``view``) */
typedef struct {
  PyObject_HEAD
  Engine *eng;
  batch_t *b;
  Py_buffer view;
  int have_view;
} Op;

extern PyTypeObject EngineType, OpType, TemplateType, NetProgramType, NetHotType, NetWatchType, NetDoorType;

/* _netpy.c */
extern PyObject *HpErr;      /* _netengine.EngineError: (code, peer, message); made by the module */
int check_open(Engine *e);            /* RuntimeError unless connected and not closed */
int check_peer(Engine *e, int peer);  /* ValueError unless another rank */
int batch_wait(Engine *e, batch_t *b, double seconds);  /* engine_wait without the GIL; 1 if ended */

/* _netop.c */
Op *new_op(Engine *e, batch_t *b);              /* an Op over b (the caller's reference), holding e */
PyObject *template_new(Engine *e, batch_t *b);  /* a Template over b (prepared), holding e */
void park_sweep(void);     /* let go of parked sends whose batches ended or whose engines closed */
long parked_count(void);   /* park_sweep(), then how many are still parked */

/* _netreplay.c */
PyObject *Engine_program(Engine *self, PyObject *args);
/* replay a NetProgram on ``stream``: 0 enqueued, 1 capturing, 2 engine failed or closed (nothing enqueued in
   either), -1 a driver call failed (RuntimeError set) */
int nr_run(PyObject *prog, unsigned long long stream, const char *label);
#endif
