/* The module hpccl._netengine: its types made ready and added (Engine, _netengine.c; Op and Template,
   _netop.c; NetProgram, _netreplay.c; NetDoor, _netdoor.c; NetHot, _nethot.c; NetWatch, _netwatch.c), its
   exception, constants and functions. The top of the extension: nothing calls into it. */
#include "_netpy.h"

static PyObject *mod_version(PyObject *m, PyObject *noargs) {
  (void)m; (void)noargs;
  unsigned maj, min, rel;
  ucp_get_version(&maj, &min, &rel);
  return Py_BuildValue("((III)(ii))", maj, min, rel, UCP_API_MAJOR, UCP_API_MINOR);
}

static PyObject *mod_parked(PyObject *m, PyObject *noargs) {
  (void)m; (void)noargs;
  return PyLong_FromLong(parked_count());
}

static PyMethodDef mod_methods[] = {
  {"version", mod_version, METH_NOARGS, "((loaded libucp version), (headers built against))"},
  {"parked", mod_parked, METH_NOARGS,
   "sends dropped in flight whose buffers are still held for UCX (after letting go of those that ended)"},
  {NULL, NULL, 0, NULL}};

static struct PyModuleDef moddef = {PyModuleDef_HEAD_INIT, "hpccl._netengine",
                                    "hpccl's native UCX network engine (a GIL-free progress thread).", -1,
                                    mod_methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__netengine(void) {
  if (PyType_Ready(&EngineType) < 0 || PyType_Ready(&OpType) < 0 || PyType_Ready(&TemplateType) < 0 ||
      PyType_Ready(&NetHotType) < 0 ||
      PyType_Ready(&NetProgramType) < 0 || PyType_Ready(&NetWatchType) < 0 || PyType_Ready(&NetDoorType) < 0)
    return NULL;
  PyObject *m = PyModule_Create(&moddef);
  if (!m) return NULL;
  HpErr = PyErr_NewException("hpccl._netengine.EngineError", PyExc_RuntimeError, NULL);
  Py_INCREF(&EngineType);
  PyModule_AddObject(m, "Engine", (PyObject *)&EngineType);
  PyModule_AddObject(m, "EngineError", HpErr);
  Py_INCREF(&NetHotType);
  PyModule_AddObject(m, "NetHot", (PyObject *)&NetHotType);
  Py_INCREF(&NetProgramType);
  PyModule_AddObject(m, "NetProgram", (PyObject *)&NetProgramType);
  Py_INCREF(&NetDoorType);
  PyModule_AddObject(m, "NetDoor", (PyObject *)&NetDoorType);
  Py_INCREF(&NetWatchType);
  PyModule_AddObject(m, "NetWatch", (PyObject *)&NetWatchType);
  PyModule_AddIntConstant(m, "SEND", K_SEND);
  PyModule_AddIntConstant(m, "RECV", K_RECV);
  PyModule_AddIntConstant(m, "E_PEER", E_PEER);
  PyModule_AddIntConstant(m, "E_TIMEOUT", E_TIMEOUT);
  PyModule_AddIntConstant(m, "E_ABORT", E_ABORT);
  PyModule_AddIntConstant(m, "E_SIZE", E_SIZE);
  PyModule_AddIntConstant(m, "E_CLOSED", E_CLOSED);
  return m;
}
