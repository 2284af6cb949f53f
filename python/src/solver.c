/* kiln.Solver's C side: a solver over its file (the rule the file names), stepped from Python.
 * Its nets keep every blob readable between calls (kilnpy_config, keep_diffs), which gives the
 * same bits as the kiln command's training. */
#include "kilnpy.h"

#include <string.h>

/* The solver and its memory are its keeper's (the solver's nets' blobs hold the keeper too) */
typedef struct {
  PyObject_HEAD
  kiln_solver *solver;
  kilnpy_keeper *keeper;
} kilnpy_solver;

static void solver_dealloc(kilnpy_solver *o) {
  Py_XDECREF(o->keeper);
  Py_TYPE(o)->tp_free((PyObject *)o);
}

static int set_item(PyObject *d, const char *k, PyObject *v) {
  if (!v) return -1;
  int rc = PyDict_SetItemString(d, k, v);
  Py_DECREF(v);
  return rc;
}

/* The library's events, as dicts, to the callable (with the GIL; steps run without it) */
static void on_event(const kiln_event *e, void *user) {
  kilnpy_keeper *o = user;
  if (!o->on_event) return;
  PyGILState_STATE g = PyGILState_Ensure();
  PyObject *d = PyDict_New();
  int bad = !d || set_item(d, "event", PyUnicode_FromString(e->event)) ||
            set_item(d, "iter", PyLong_FromLong(e->iter)) ||
            set_item(d, "loss", PyFloat_FromDouble(e->loss)) ||
            set_item(d, "lr", PyFloat_FromDouble(e->lr)) ||
            set_item(d, "time_ms", PyFloat_FromDouble(e->time_ms)) ||
            set_item(d, "test_net", PyLong_FromLong(e->test_net));
  if (!bad) {
    PyObject *out = PyDict_New();
    bad = !out;
    for (int i = 0; !bad && i < e->noutputs; i++)
      bad = set_item(out, e->output_names[i], PyFloat_FromDouble(e->output_values[i]));
    if (out && !bad) bad = PyDict_SetItemString(d, "outputs", out);
    Py_XDECREF(out);
  }
  if (!bad && e->path) bad = set_item(d, "path", PyUnicode_FromString(e->path));
  PyObject *r = bad ? NULL : PyObject_CallOneArg(o->on_event, d);
  Py_XDECREF(d);
  if (!r && !o->pending) {
    PyObject *t, *v, *tb;
    PyErr_Fetch(&t, &v, &tb);
    PyErr_NormalizeException(&t, &v, &tb);
    if (v && tb) PyException_SetTraceback(v, tb);
    o->pending = v;
    Py_XDECREF(t);
    Py_XDECREF(tb);
  }
  PyErr_Clear();
  Py_XDECREF(r);
  PyGILState_Release(g);
}

static int check(kilnpy_solver *o) {
  if (o->solver) return 0;
  PyErr_SetString(kilnpy_error, "the solver was not built");
  return -1;
}

/* After a library call: its error, else what the event callable raised */
static PyObject *finish(kilnpy_solver *s, int rc) {
  kilnpy_keeper *o = s->keeper;
  if (rc) {
    Py_CLEAR(o->pending);
    return kilnpy_raise();
  }
  if (o->pending) {
    PyObject *v = o->pending;
    o->pending = NULL;
    PyErr_SetObject((PyObject *)Py_TYPE(v), v);
    Py_DECREF(v);
    return NULL;
  }
  Py_RETURN_NONE;
}

/* _kiln.Solver(path, type=None, on_event=None): type, when given, must be the file's rule */
static int solver_init(kilnpy_solver *o, PyObject *args, PyObject *kw) {
  static char *names[] = {"path", "type", "on_event", NULL};
  PyObject *path_b = NULL, *ev = Py_None;
  const char *type = NULL;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O&|zO", names, PyUnicode_FSConverter, &path_b,
                                   &type, &ev))
    return -1;
  int ret = -1;
  if (o->solver) {
    PyErr_SetString(kilnpy_error, "a Solver is built once");
    goto out;
  }
  if (ev != Py_None && !PyCallable_Check(ev)) {
    PyErr_SetString(PyExc_TypeError, "on_event: a callable taking a dict");
    goto out;
  }
  kilnpy_keeper *k = kilnpy_keeper_new();
  if (!k) goto out;
  if (ev != Py_None) {
    Py_INCREF(ev);
    k->on_event = ev;
  }
  if (kilnpy_config(&k->config)) {
    kilnpy_raise();
    Py_DECREF(k);
    goto out;
  }
  kiln_solver_options opt = {.on_event = on_event, .user = k, .config = &k->config,
                             .keep_diffs = true};
  int rc;
  KILNPY_BEGIN
  rc = kiln_solver_create(PyBytes_AS_STRING(path_b), &opt, &k->solver);
  KILNPY_END
  if (rc) {
    kilnpy_raise();
    Py_DECREF(k);
    goto out;
  }
  o->keeper = k;
  o->solver = k->solver;
  const char *have = kiln_solver_type_name(kiln_solver_type_of(o->solver));
  if (type && strcmp(type, have)) {
    PyErr_Format(kilnpy_error, "%s: the file's solver type is %s, not %s (use kiln.get_solver, "
                 "or set type: \"%s\" in the file)", PyBytes_AS_STRING(path_b), have, type, type);
    o->solver = NULL;
    Py_CLEAR(o->keeper);
    goto out;
  }
  ret = 0;
out:
  Py_XDECREF(path_b);
  return ret;
}

static PyObject *solver_step(kilnpy_solver *o, PyObject *arg) {
  if (check(o)) return NULL;
  long n = PyLong_AsLong(arg);
  if (n == -1 && PyErr_Occurred()) return NULL;
  if (n < 0 || n > INT32_MAX) {
    PyErr_Format(kilnpy_error, "step(%ld): a count of iterations, 0 or more", n);
    return NULL;
  }
  int rc;
  KILNPY_BEGIN
  rc = kiln_solver_step(o->solver, (int)n);
  KILNPY_END
  return finish(o, rc);
}

static PyObject *solver_solve(kilnpy_solver *o, PyObject *args) {
  if (check(o)) return NULL;
  PyObject *resume = Py_None, *path_b = NULL;
  if (!PyArg_ParseTuple(args, "|O", &resume)) return NULL;
  if (resume != Py_None && !PyUnicode_FSConverter(resume, &path_b)) return NULL;
  int rc = KILN_OK;
  KILNPY_BEGIN
  if (path_b) rc = kiln_solver_restore(o->solver, PyBytes_AS_STRING(path_b));
  if (!rc) rc = kiln_solver_solve(o->solver);
  KILNPY_END
  Py_XDECREF(path_b);
  return finish(o, rc);
}

static PyObject *solver_restore(kilnpy_solver *o, PyObject *arg) {
  if (check(o)) return NULL;
  PyObject *path_b = NULL;
  if (!PyUnicode_FSConverter(arg, &path_b)) return NULL;
  int rc;
  KILNPY_BEGIN
  rc = kiln_solver_restore(o->solver, PyBytes_AS_STRING(path_b));
  KILNPY_END
  Py_DECREF(path_b);
  return finish(o, rc);
}

static PyObject *solver_snapshot(kilnpy_solver *o, PyObject *unused) {
  (void)unused;
  if (check(o)) return NULL;
  char *path = NULL;
  int rc;
  KILNPY_BEGIN
  rc = kiln_solver_snapshot(o->solver, &path);
  KILNPY_END
  PyObject *r = finish(o, rc);
  if (!r) {
    free(path);
    return NULL;
  }
  Py_DECREF(r);
  r = path ? PyUnicode_DecodeFSDefault(path) : Py_NewRef(Py_None);
  free(path);
  return r;
}

static PyObject *solver_test(kilnpy_solver *o, PyObject *args) {
  if (check(o)) return NULL;
  int k = 0;
  if (!PyArg_ParseTuple(args, "|i", &k)) return NULL;
  if (k < 0 || k >= kiln_solver_test_net_count(o->solver)) {
    PyErr_Format(kilnpy_error, "test(%d): the solver has %d test nets", k,
                 kiln_solver_test_net_count(o->solver));
    return NULL;
  }
  int rc;
  KILNPY_BEGIN
  rc = kiln_solver_test(o->solver, k);
  KILNPY_END
  return finish(o, rc);
}

/* _net(cls) and _test_net(cls, k): the solver's nets as instances of cls (kiln.Net) */
static PyObject *solver_net(kilnpy_solver *o, PyObject *cls) {
  if (check(o)) return NULL;
  if (!PyType_Check(cls)) {
    PyErr_SetString(PyExc_TypeError, "_net(cls)");
    return NULL;
  }
  return kilnpy_net_wrap((PyTypeObject *)cls, kiln_solver_net(o->solver), o->keeper);
}

static PyObject *solver_test_net(kilnpy_solver *o, PyObject *args) {
  if (check(o)) return NULL;
  PyObject *cls;
  int k;
  if (!PyArg_ParseTuple(args, "O!i", &PyType_Type, &cls, &k)) return NULL;
  if (k < 0 || k >= kiln_solver_test_net_count(o->solver)) {
    PyErr_Format(PyExc_IndexError, "test net %d of %d", k, kiln_solver_test_net_count(o->solver));
    return NULL;
  }
  return kilnpy_net_wrap((PyTypeObject *)cls, kiln_solver_test_net(o->solver, k), o->keeper);
}

static PyObject *solver_get_iter(kilnpy_solver *o, void *c) {
  (void)c;
  if (check(o)) return NULL;
  return PyLong_FromLong(kiln_solver_iter(o->solver));
}
static PyObject *solver_get_type(kilnpy_solver *o, void *c) {
  (void)c;
  if (check(o)) return NULL;
  return PyUnicode_FromString(kiln_solver_type_name(kiln_solver_type_of(o->solver)));
}
static PyObject *solver_get_test_count(kilnpy_solver *o, void *c) {
  (void)c;
  if (check(o)) return NULL;
  return PyLong_FromLong(kiln_solver_test_net_count(o->solver));
}
static PyObject *solver_get_lr(kilnpy_solver *o, void *c) {
  (void)c;
  if (check(o)) return NULL;
  return PyFloat_FromDouble(kiln_solver_learning_rate(o->solver));
}

static PyMethodDef solver_methods[] = {
    {"step", (PyCFunction)solver_step, METH_O, "step(n): n iterations"},
    {"solve", (PyCFunction)solver_solve, METH_VARARGS,
     "solve(resume_file=None): train to max_iter (resuming from a .solverstate if given)"},
    {"restore", (PyCFunction)solver_restore, METH_O, "restore(path): resume from a .solverstate"},
    {"snapshot", (PyCFunction)solver_snapshot, METH_NOARGS,
     "snapshot(): writes the .caffemodel and .solverstate of now; returns the .solverstate's path"},
    {"test", (PyCFunction)solver_test, METH_VARARGS, "test(k=0): one test pass of test net k"},
    {"_net", (PyCFunction)solver_net, METH_O, NULL},
    {"_test_net", (PyCFunction)solver_test_net, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef solver_getset[] = {
    {"iter", (getter)solver_get_iter, NULL, "iterations done", NULL},
    {"type", (getter)solver_get_type, NULL, "the update rule (SGD, Adam, ...)", NULL},
    {"_test_count", (getter)solver_get_test_count, NULL, NULL, NULL},
    {"lr", (getter)solver_get_lr, NULL, "the learning rate of the next iteration", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject kilnpy_solver_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "_kiln.Solver",
    .tp_basicsize = sizeof(kilnpy_solver),
    .tp_dealloc = (destructor)solver_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "A kiln solver (use kiln.get_solver or kiln.SGDSolver and the others)",
    .tp_methods = solver_methods,
    .tp_getset = solver_getset,
    .tp_init = (initproc)solver_init,
    .tp_new = PyType_GenericNew,
};
