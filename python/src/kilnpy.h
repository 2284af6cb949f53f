/* kiln's Python module (`_kiln`, wrapped by the pure-Python package `kiln`) and the Python layer
 * runtime, which the module and the kiln command share. Like the library, nothing here prints
 * or exits: errors become Python exceptions (kiln.Error) or kiln status codes. */
#ifndef KILNPY_H
#define KILNPY_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#ifndef KILNPY_MODULE_FILE
#define NO_IMPORT_ARRAY
#endif
#define PY_ARRAY_UNIQUE_SYMBOL kilnpy_ARRAY_API
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>

#include "kiln/net.h"
#include "kiln/solver.h"

/* kiln.Error, a RuntimeError carrying kiln's message. */
extern PyObject *kilnpy_error;
/* Raises kiln.Error with kiln_last_error(); returns NULL. */
PyObject *kilnpy_raise(void);

/* Memory outgrown by reshapes while NumPy arrays may point into it (kiln_blob.retire): freed
 * when its keeper goes. */
typedef struct kilnpy_retired {
  void **p;
  size_t n, cap;
} kilnpy_retired;

/* What owns a net's memory: a net built from Python (with its NetParameter) or a solver (with
 * its nets), the configuration they point to, and what their blobs outgrew. kiln.Net and
 * kiln.Solver objects and every kiln.Blob (so every NumPy view) hold it; it holds none of them,
 * so dropping a net frees it at once, and an array made from it keeps just the memory. */
typedef struct {
  PyObject_HEAD
  kiln_net *net;       /* a net built from Python (NULL for a solver's) */
  ProtobufCMessage *msg;
  kiln_solver *solver;
  kiln_config config;
  kilnpy_retired retired;
  PyObject *on_event;  /* the solver's event callable, or NULL */
  PyObject *pending;   /* the first exception it raised during a call, re-raised after */
} kilnpy_keeper;
extern PyTypeObject kilnpy_keeper_type;
kilnpy_keeper *kilnpy_keeper_new(void);

/* kiln.Blob: a kiln blob seen from Python. `keeper` keeps the memory alive (NULL for a Python
 * layer's bottoms and tops in the kiln command, whose net outlives the calls). */
typedef struct {
  PyObject_HEAD
  kiln_blob *blob;
  kilnpy_keeper *keeper;
} kilnpy_blob;
extern PyTypeObject kilnpy_blob_type;
PyObject *kilnpy_blob_new(kiln_blob *b, kilnpy_keeper *keeper);

/* kiln.Net's C side (the Python class kiln.Net adds the mappings): a net and its keeper. */
typedef struct {
  PyObject_HEAD
  kiln_net *net;
  kilnpy_keeper *keeper;
} kilnpy_net;
extern PyTypeObject kilnpy_net_type;
/* A `type` (kiln.Net) over a solver's net, without building one. */
PyObject *kilnpy_net_wrap(PyTypeObject *type, kiln_net *net, kilnpy_keeper *keeper);

extern PyTypeObject kilnpy_solver_type;

/* Subnormal floats are flushed inside kiln's calls as the kiln command flushes them (unless
 * KILN_DENORMALS=keep), so that Python gets the command's bits, and left to IEEE in the rest of
 * the interpreter's thread: a call into the library runs between KILNPY_BEGIN and KILNPY_END,
 * which also release the GIL. */
unsigned kilnpy_fp_enter(void);
void kilnpy_fp_leave(unsigned saved);
#define KILNPY_BEGIN                                                                            \
  Py_BEGIN_ALLOW_THREADS unsigned kilnpy_saved_fp_ = kilnpy_fp_enter();
#define KILNPY_END                                                                              \
  kilnpy_fp_leave(kilnpy_saved_fp_);                                                            \
  Py_END_ALLOW_THREADS

/* The runtime configuration of nets made from Python: the environment's (kiln_config_from_env),
 * with every blob readable between calls (plain layouts, own storage, nothing recomputed). */
int kilnpy_config(kiln_config *c);
/* The module's settings: the device nets are made on ("" for the configuration's) and the seed
 * of nets' generators. */
extern char kilnpy_device[64];
extern uint64_t kilnpy_seed;
/* Set when the kiln command started the interpreter (its log and settings stay its own). */
extern bool kilnpy_embedded;

/* The Python layer ("Python", python_param): registered with the library by the module's
 * import, and by the kiln command (kilnpy_register_embedded), which starts the interpreter the
 * first time a net has such a layer. */
int kilnpy_register_layer(void);
int kilnpy_register_embedded(void);
/* Ends the interpreter the kiln command started, if it did. */
void kilnpy_finalize_embedded(void);

PyMODINIT_FUNC PyInit__kiln(void);

#endif
