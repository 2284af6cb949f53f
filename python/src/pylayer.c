/* Caffe's Python layer: `type: "Python"` with python_param { module layer param_str } runs an
 * instance of class `layer` of module `module` through pycaffe's interface: setup(bottom, top),
 * reshape(bottom, top) (before each forward too, as Caffe's Layer::Forward does),
 * forward(bottom, top), backward(top, propagate_down, bottom), with self.param_str and
 * self.phase set, bottoms and tops as kiln.Blob objects whose data and diff are NumPy views.
 *
 * The kiln Python module registers the type on import; the kiln command registers it at start
 * (kilnpy_register_embedded) and starts an interpreter only when a net has such a layer. Calls
 * into Python take the GIL (PyGILState_Ensure): the module releases it around the library's
 * passes, and the kiln command holds it only inside these calls. */
#include "kilnpy.h"

#include <stdlib.h>
#include <string.h>

/* self.blobs, the layer's learnable parameters (pycaffe's BlobVec): add_blob(*shape) in setup,
 * then indexing, len and iteration. In setup each is a staging blob of the layer's own, which
 * its setup may fill; init_param copies it into the storage the net gives the parameter and
 * points its kiln.Blob there. */
typedef struct {
  PyObject_HEAD
  kiln_layer *l;  /* NULL once the layer is gone */
  PyObject *list; /* a kiln.Blob per parameter */
  kiln_blob *staging[KILN_MAX_LAYER_PARAMS];
  bool in_setup;
} layer_blobs;

typedef struct {
  PyObject *self;         /* the layer's instance */
  PyObject *bottom, *top; /* lists of kiln.Blob */
  layer_blobs *blobs;
  char what[256];         /* "module.Class", for messages */
} pylayer;

static void blobs_dealloc(layer_blobs *b) {
  for (int i = 0; i < KILN_MAX_LAYER_PARAMS; i++) kiln_blob_free(b->staging[i]);
  Py_XDECREF(b->list);
  PyObject_Free(b);
}

static PyObject *blobs_add(layer_blobs *b, PyObject *args) {
  if (!b->l || !b->in_setup) {
    PyErr_SetString(kilnpy_error, "add_blob: a Python layer adds its parameters in setup");
    return NULL;
  }
  Py_ssize_t n = PyTuple_GET_SIZE(args);
  if (n > KILN_MAX_AXES) {
    PyErr_Format(kilnpy_error, "add_blob: %zd axes (at most %d)", n, KILN_MAX_AXES);
    return NULL;
  }
  int64_t shape[KILN_MAX_AXES];
  for (Py_ssize_t i = 0; i < n; i++) {
    long long d = PyLong_AsLongLong(PyTuple_GET_ITEM(args, i));
    if (d == -1 && PyErr_Occurred()) return NULL;
    if (d < 0) {
      PyErr_Format(kilnpy_error, "add_blob: negative dimension %lld", d);
      return NULL;
    }
    shape[i] = d;
  }
  kiln_layer *l = b->l;
  const int k = l->nparam;
  if (k >= KILN_MAX_LAYER_PARAMS) {
    PyErr_Format(kilnpy_error, "layer '%s': add_blob: at most %d parameters", l->name,
                 KILN_MAX_LAYER_PARAMS);
    return NULL;
  }
  kiln_blob *st = kiln_blob_new("staging");
  if (!st || kiln_blob_reshape(st, (int)n, shape) || !kiln_layer_add_param(l, (int)n, shape, NULL, 0)) {
    kiln_blob_free(st);
    return PyErr_Occurred() ? NULL : kilnpy_raise();
  }
  b->staging[k] = st;
  PyObject *w = kilnpy_blob_new(st, NULL);
  if (!w || PyList_Append(b->list, w) < 0) {
    Py_XDECREF(w);
    return NULL;
  }
  Py_DECREF(w);
  Py_RETURN_NONE;
}

static Py_ssize_t blobs_len(layer_blobs *b) { return PyList_GET_SIZE(b->list); }

static PyObject *blobs_item(layer_blobs *b, Py_ssize_t i) {
  if (i < 0 || i >= PyList_GET_SIZE(b->list)) {
    PyErr_SetString(PyExc_IndexError, "the layer has no such parameter");
    return NULL;
  }
  return Py_NewRef(PyList_GET_ITEM(b->list, i));
}

static PyMethodDef blobs_methods[] = {
    {"add_blob", (PyCFunction)blobs_add, METH_VARARGS,
     "add_blob(*shape): a learnable parameter of this shape (in setup)"},
    {NULL, NULL, 0, NULL},
};

static PySequenceMethods blobs_seq = {
    .sq_length = (lenfunc)blobs_len,
    .sq_item = (ssizeargfunc)blobs_item,
};

static PyTypeObject layer_blobs_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kiln.LayerBlobs",
    .tp_basicsize = sizeof(layer_blobs),
    .tp_dealloc = (destructor)blobs_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A Python layer's learnable parameters: add_blob(*shape) in setup, then [i]",
    .tp_methods = blobs_methods,
    .tp_as_sequence = &blobs_seq,
};

/* Set by the kiln command: starts the interpreter on the first Python layer */
static int (*start_runtime)(void);

/* The exception pending in Python as kiln's error: the layer, what raised, and the traceback. */
static int fail(const kiln_layer *l, const pylayer *p, const char *call) {
  PyObject *t = NULL, *v = NULL, *tb = NULL;
  PyErr_Fetch(&t, &v, &tb);
  PyErr_NormalizeException(&t, &v, &tb);
  PyObject *text = NULL, *mod = PyImport_ImportModule("traceback");
  if (mod && t) {
    PyObject *lines = PyObject_CallMethod(mod, "format_exception", "OOO", t, v ? v : Py_None,
                                          tb ? tb : Py_None);
    if (lines) {
      PyObject *empty = PyUnicode_FromString("");
      if (empty) text = PyUnicode_Join(empty, lines);
      Py_XDECREF(empty);
      Py_DECREF(lines);
    }
  }
  const char *s = text ? PyUnicode_AsUTF8(text) : NULL;
  if (!s) {
    PyErr_Clear();
    s = "(the exception could not be formatted)";
  }
  size_t n = strlen(s);
  while (n > 0 && s[n - 1] == '\n') n--;
  int rc = kiln_errorf(KILN_ERR_INVALID, "layer '%s' (Python %s): %s raised:\n%.*s", l->name,
                       p && p->what[0] ? p->what : "layer", call, (int)n, s);
  Py_XDECREF(text);
  Py_XDECREF(mod);
  Py_XDECREF(t);
  Py_XDECREF(v);
  Py_XDECREF(tb);
  return rc;
}

static PyObject *blob_list(kiln_blob **b, int n) {
  PyObject *l = PyList_New(n);
  for (int i = 0; l && i < n; i++) {
    PyObject *o = kilnpy_blob_new(b[i], NULL);
    if (!o) {
      Py_DECREF(l);
      return NULL;
    }
    PyList_SET_ITEM(l, i, o);
  }
  return l;
}

static int call(kiln_layer *l, pylayer *p, const char *method, PyObject *a, PyObject *b,
                PyObject *c) {
  PyObject *r = c ? PyObject_CallMethod(p->self, method, "OOO", a, b, c)
                  : PyObject_CallMethod(p->self, method, "OO", a, b);
  if (!r) return fail(l, p, method);
  Py_DECREF(r);
  return KILN_OK;
}

static int py_setup(kiln_layer *l) {
  const Caffe__PythonParameter *pp = l->lp->python_param;
  if (!pp || !pp->module || !pp->module[0] || !pp->layer || !pp->layer[0])
    return kiln_errorf(KILN_ERR_INVALID, "layer '%s': a Python layer needs python_param's module "
                       "and layer (the class)", l->name);
  if (start_runtime) KILN_TRY(start_runtime());
  pylayer *p = calloc(1, sizeof *p);
  if (!p) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  l->priv = p;
  snprintf(p->what, sizeof p->what, "%s.%s", pp->module, pp->layer);
  PyGILState_STATE g = PyGILState_Ensure();
  int rc = KILN_OK;
  PyObject *mod = PyImport_ImportModule(pp->module), *cls = NULL;
  if (!mod) {
    rc = fail(l, p, "importing its module");
    goto out;
  }
  cls = PyObject_GetAttrString(mod, pp->layer);
  if (!cls) {
    rc = fail(l, p, "finding its class");
    goto out;
  }
  p->self = PyObject_CallNoArgs(cls);
  if (!p->self) {
    rc = fail(l, p, "making an instance");
    goto out;
  }
  PyObject *ps = PyUnicode_FromString(pp->param_str ? pp->param_str : "");
  PyObject *ph = PyLong_FromLong(l->phase);
  if (!ps || !ph || PyObject_SetAttrString(p->self, "param_str", ps) < 0 ||
      PyObject_SetAttrString(p->self, "phase", ph) < 0) {
    Py_XDECREF(ps);
    Py_XDECREF(ph);
    rc = fail(l, p, "setting param_str");
    goto out;
  }
  Py_DECREF(ps);
  Py_DECREF(ph);
  if (PyType_Ready(&layer_blobs_type) < 0 ||
      !(p->blobs = PyObject_New(layer_blobs, &layer_blobs_type))) {
    rc = fail(l, p, "setup");
    goto out;
  }
  p->blobs->l = l;
  p->blobs->in_setup = false;
  memset(p->blobs->staging, 0, sizeof p->blobs->staging);
  if (!(p->blobs->list = PyList_New(0)) ||
      PyObject_SetAttrString(p->self, "blobs", (PyObject *)p->blobs) < 0) {
    rc = fail(l, p, "setup");
    goto out;
  }
  p->bottom = blob_list(l->bottom, l->nbottom);
  p->top = p->bottom ? blob_list(l->top, l->ntop) : NULL;
  if (!p->top) {
    rc = fail(l, p, "setup");
    goto out;
  }
  p->blobs->in_setup = true;
  rc = call(l, p, "setup", p->bottom, p->top, NULL);
  p->blobs->in_setup = false;
out:
  Py_XDECREF(cls);
  Py_XDECREF(mod);
  PyGILState_Release(g);
  return rc;
}

static int py_reshape(kiln_layer *l) {
  pylayer *p = l->priv;
  PyGILState_STATE g = PyGILState_Ensure();
  int rc = call(l, p, "reshape", p->bottom, p->top, NULL);
  PyGILState_Release(g);
  return rc;
}

static int py_forward(kiln_layer *l) {
  pylayer *p = l->priv;
  /* Caffe reshapes a layer before each forward: a Python layer may change its tops' shapes
   * there (a data layer's last batch), and the net then reshapes the layers after it */
  int64_t before[8][KILN_MAX_AXES + 1];
  for (int t = 0; t < l->ntop && t < 8; t++) {
    before[t][0] = l->top[t]->naxes;
    memcpy(before[t] + 1, l->top[t]->shape, sizeof l->top[t]->shape);
  }
  PyGILState_STATE g = PyGILState_Ensure();
  int rc = call(l, p, "reshape", p->bottom, p->top, NULL);
  if (!rc) {
    for (int t = 0; t < l->ntop; t++)
      if (t >= 8 || before[t][0] != l->top[t]->naxes ||
          memcmp(before[t] + 1, l->top[t]->shape, sizeof l->top[t]->shape))
        l->reshaped = true;
    rc = call(l, p, "forward", p->bottom, p->top, NULL);
  }
  PyGILState_Release(g);
  return rc;
}

static int py_backward(kiln_layer *l) {
  pylayer *p = l->priv;
  PyGILState_STATE g = PyGILState_Ensure();
  int rc = KILN_OK;
  PyObject *down = PyList_New(l->nbottom);
  for (int i = 0; down && i < l->nbottom; i++)
    PyList_SET_ITEM(down, i, PyBool_FromLong(l->propagate_down[i]));
  if (!down) rc = fail(l, p, "backward");
  else rc = call(l, p, "backward", p->top, down, p->bottom);
  Py_XDECREF(down);
  PyGILState_Release(g);
  return rc;
}

/* The values setup gave parameter k, into the net's storage for it */
static int py_init_param(kiln_layer *l, int k) {
  pylayer *p = l->priv;
  kiln_blob *st = p->blobs ? p->blobs->staging[k] : NULL, *dst = l->param[k];
  if (!st) return KILN_OK;
  const size_t bytes = (size_t)dst->count * sizeof(float);
  int rc = KILN_OK;
  if (kiln_device_is_host(dst->device)) memcpy(dst->data, st->data, bytes);
  else rc = dst->device->ops->to_device(dst->device, dst->data, st->data, bytes);
  PyGILState_STATE g = PyGILState_Ensure();
  ((kilnpy_blob *)PyList_GET_ITEM(p->blobs->list, k))->blob = dst;
  PyGILState_Release(g);
  kiln_blob_free(st);
  p->blobs->staging[k] = NULL;
  return rc;
}

static void py_destroy(kiln_layer *l) {
  pylayer *p = l->priv;
  if (!p) return;
  if (Py_IsInitialized()) { /* the kiln command may have ended the interpreter at exit */
    PyGILState_STATE g = PyGILState_Ensure();
    if (p->blobs) {
      p->blobs->l = NULL;
      Py_DECREF(p->blobs);
    }
    Py_XDECREF(p->self);
    Py_XDECREF(p->bottom);
    Py_XDECREF(p->top);
    PyGILState_Release(g);
  }
  free(p);
  l->priv = NULL;
}

static const kiln_layer_ops python_layer = {
    .type = "Python",
    .min_bottoms = 0,
    .max_bottoms = -1,
    .min_tops = 0,
    .max_tops = -1,
    .setup = py_setup,
    .reshape = py_reshape,
    .forward = py_forward,
    .backward = py_backward,
    .destroy = py_destroy,
    .init_param = py_init_param,
};

int kilnpy_register_layer(void) { return kiln_layer_register(&python_layer); }

/* ---- the kiln command's interpreter ------------------------------------------------------- */

static PyThreadState *main_state; /* the kiln command's thread, while it does not hold the GIL */

static int start_embedded(void) {
  if (Py_IsInitialized()) return KILN_OK;
  kilnpy_embedded = true;
  if (PyImport_AppendInittab("_kiln", PyInit__kiln) < 0)
    return kiln_errorf(KILN_ERR_INTERNAL, "Python: cannot add the _kiln module");
  PyConfig cfg;
  PyConfig_InitPythonConfig(&cfg);
  cfg.install_signal_handlers = 0; /* Ctrl-C stays the kiln command's */
  cfg.parse_argv = 0;
  PyStatus st = PyConfig_SetString(&cfg, &cfg.program_name, L"kiln");
  if (!PyStatus_Exception(st)) st = Py_InitializeFromConfig(&cfg);
  PyConfig_Clear(&cfg);
  if (PyStatus_Exception(st))
    return kiln_errorf(KILN_ERR_INTERNAL, "Python: the interpreter did not start: %s",
                       st.err_msg ? st.err_msg : "unknown error");
  /* the package's pure-Python part: after PYTHONPATH, the build tree's and the installed one */
  int rc = KILN_OK;
  PyObject *path = PySys_GetObject("path"); /* borrowed */
  const char *dirs[] = {KILNPY_BUILD_DIR, KILNPY_INSTALL_DIR};
  for (size_t i = 0; path && i < sizeof dirs / sizeof dirs[0]; i++) {
    PyObject *d = PyUnicode_DecodeFSDefault(dirs[i]);
    if (!d || PyList_Append(path, d) < 0) rc = KILN_ERR_INTERNAL;
    Py_XDECREF(d);
  }
  PyObject *m = rc ? NULL : PyImport_ImportModule("_kiln"); /* numpy and the types */
  if (!m) {
    rc = fail(&(kiln_layer){.name = "(start)"}, NULL, "starting Python");
  }
  Py_XDECREF(m);
  /* pycaffe's layer modules `import caffe` and subclass caffe.Layer: where no caffe module is
   * installed, that name is kiln, so they run unchanged */
  if (!rc && PyRun_SimpleString("import importlib.util, sys\n"
                                "if importlib.util.find_spec('caffe') is None:\n"
                                "    try:\n"
                                "        import kiln\n"
                                "        sys.modules['caffe'] = kiln\n"
                                "    except ImportError:\n"
                                "        pass\n") != 0)
    rc = kiln_errorf(KILN_ERR_INTERNAL, "Python: cannot set up the caffe name");
  main_state = PyEval_SaveThread();
  return rc;
}

int kilnpy_register_embedded(void) {
  start_runtime = start_embedded;
  return kilnpy_register_layer();
}

void kilnpy_finalize_embedded(void) {
  if (!main_state || !Py_IsInitialized()) return;
  PyEval_RestoreThread(main_state);
  main_state = NULL;
  Py_FinalizeEx(); /* flushes what the layers printed */
}
