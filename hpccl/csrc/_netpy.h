/* What the Python types of hpccl._netengine share (_netengine.c: Engine, Op, Template and the module;
   _netreplay.c: NetProgram; _netdoor.c: NetDoor; _nethot.c: NetHot). The engine itself is plain C (_netcore.h). */
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

extern PyTypeObject EngineType, NetProgramType, NetHotType, NetWatchType, NetDoorType;
extern PyObject *HpErr;      /* _netengine.EngineError: (code, peer, message) */

int check_open(Engine *e);            /* RuntimeError unless connected and not closed */
int check_peer(Engine *e, int peer);  /* ValueError unless another rank */
int batch_wait(Engine *e, batch_t *b, double seconds);  /* engine_wait without the GIL; 1 if ended */
PyObject *Engine_program(Engine *self, PyObject *args);  /* _netreplay.c */
/* replay a NetProgram on ``stream``: 0 enqueued, 1 capturing, 2 engine failed or closed (nothing enqueued in
   either), -1 a driver call failed (RuntimeError set); _netreplay.c */
int nr_run(PyObject *prog, unsigned long long stream, const char *label);
#endif
