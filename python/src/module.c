/* The `_kiln` extension module: kiln.Error, kiln.Blob, the module's settings, and its init. */
#define KILNPY_MODULE_FILE
#include "kilnpy.h"

#include <string.h>
#if defined(__SSE__)
#include <xmmintrin.h>
#endif

#include "kiln/data.h"
#include "kiln/memory.h"
#include "kiln/threads.h"

PyObject *kilnpy_error;
char kilnpy_device[64];
uint64_t kilnpy_seed = 1701; /* the kiln command's nets' seed, so Dropout draws the same */
bool kilnpy_embedded;

/* Whether kiln flushes subnormals (the configuration's keep_denormals unset) */
static bool flush_denormals;

unsigned kilnpy_fp_enter(void) {
#if defined(__SSE__)
  const unsigned saved = _mm_getcsr();
  if (flush_denormals) _mm_setcsr(saved | 0x8040u); /* FTZ and DAZ */
  return saved;
#else
  return 0;
#endif
}

void kilnpy_fp_leave(unsigned saved) {
#if defined(__SSE__)
  _mm_setcsr(saved);
#else
  (void)saved;
#endif
}

/* The library's log lines (a solver's settings, warnings such as a GPU asked for and absent)
 * through Python's logging, logger "kiln": warnings and errors show as Python shows them, the
 * rest where the program's logging configuration sends them. */
static void log_to_python(kiln_log_level level, const char *msg, void *user) {
  (void)user;
  static const int py_level[] = {10, 20, 30, 40}; /* DEBUG, INFO, WARNING, ERROR */
  PyGILState_STATE g = PyGILState_Ensure();
  PyObject *t, *v, *tb;
  PyErr_Fetch(&t, &v, &tb); /* an exception being raised stays as it was */
  PyObject *logging = PyImport_ImportModule("logging");
  PyObject *logger = logging ? PyObject_CallMethod(logging, "getLogger", "s", "kiln") : NULL;
  PyObject *r = logger ? PyObject_CallMethod(logger, "log", "is", py_level[level & 3], msg) : NULL;
  Py_XDECREF(r);
  Py_XDECREF(logger);
  Py_XDECREF(logging);
  PyErr_Clear();
  PyErr_Restore(t, v, tb);
  PyGILState_Release(g);
}

PyObject *kilnpy_raise(void) {
  PyErr_SetString(kilnpy_error, kiln_last_error());
  return NULL;
}

int kilnpy_config(kiln_config *c) {
  int rc = kiln_config_from_env(c);
  if (rc) return rc;
  if (kilnpy_device[0]) {
    rc = kiln_config_set_device(c, kilnpy_device, "kiln.set_device");
    if (rc) return rc;
  }
  c->plain_layouts = true; /* a NumPy view reads Caffe's layout */
  c->no_share_data = true;
  c->no_recompute = true;
  return KILN_OK;
}

/* ---- outgrown storage ------------------------------------------------------------------- */

static void retire(void *user, void *p) {
  kilnpy_retired *r = user;
  if (r->n == r->cap) {
    size_t cap = r->cap ? 2 * r->cap : 8;
    void **q = realloc(r->p, cap * sizeof *q);
    if (!q) { /* cannot keep it: an array into it would read freed memory, so leak it instead */
      return;
    }
    r->p = q;
    r->cap = cap;
  }
  r->p[r->n++] = p;
}

static void retired_free(kilnpy_retired *r) {
  for (size_t i = 0; i < r->n; i++) kiln_free(r->p[i]);
  free(r->p);
  memset(r, 0, sizeof *r);
}

/* ---- the keeper --------------------------------------------------------------------------- */

kilnpy_keeper *kilnpy_keeper_new(void) {
  kilnpy_keeper *k = PyObject_GC_New(kilnpy_keeper, &kilnpy_keeper_type);
  if (!k) return NULL;
  k->net = NULL;
  k->msg = NULL;
  k->solver = NULL;
  kiln_config_init(&k->config);
  memset(&k->retired, 0, sizeof k->retired);
  k->on_event = NULL;
  k->pending = NULL;
  PyObject_GC_Track(k);
  return k;
}

static int keeper_traverse(kilnpy_keeper *k, visitproc visit, void *arg) {
  Py_VISIT(k->on_event);
  Py_VISIT(k->pending);
  return 0;
}

static int keeper_clear(kilnpy_keeper *k) {
  Py_CLEAR(k->on_event);
  Py_CLEAR(k->pending);
  return 0;
}

static void keeper_dealloc(kilnpy_keeper *k) {
  PyObject_GC_UnTrack(k);
  keeper_clear(k);
  kiln_solver_free(k->solver); /* its nets with it */
  kiln_net_free(k->net);
  if (k->msg) protobuf_c_message_free_unpacked(k->msg, NULL);
  retired_free(&k->retired);
  PyObject_GC_Del(k);
}

PyTypeObject kilnpy_keeper_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "_kiln._Keeper",
    .tp_basicsize = sizeof(kilnpy_keeper),
    .tp_dealloc = (destructor)keeper_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "the memory of a net or solver",
    .tp_traverse = (traverseproc)keeper_traverse,
    .tp_clear = (inquiry)keeper_clear,
};

/* ---- kiln.Blob ---------------------------------------------------------------------------- */

PyObject *kilnpy_blob_new(kiln_blob *b, kilnpy_keeper *keeper) {
  kilnpy_blob *o = PyObject_New(kilnpy_blob, &kilnpy_blob_type);
  if (!o) return NULL;
  o->blob = b;
  o->keeper = keeper;
  Py_XINCREF(keeper);
  return (PyObject *)o;
}

/* Storage the blob outgrows goes to its keeper while arrays may point into it */
static void keep_outgrown(kilnpy_blob *o) {
  if (o->keeper && !o->blob->retire) {
    o->blob->retire = retire;
    o->blob->retire_user = &o->keeper->retired;
  }
}

static void blob_dealloc(kilnpy_blob *o) {
  Py_XDECREF(o->keeper);
  PyObject_Free(o);
}

/* A NumPy array over the blob's data or diff: no copy; it keeps the blob's keeper alive, and
 * with it the memory, also after a reshape moves the blob elsewhere. */
static PyObject *view(kilnpy_blob *o, bool diff) {
  kiln_blob *b = o->blob;
  if (b->csr) {
    PyErr_Format(kilnpy_error, "blob '%s' is sparse (CSR rows): it has no dense %s", b->name,
                 diff ? "diff" : "data");
    return NULL;
  }
  float *p = diff ? b->diff : b->data;
  npy_intp dims[KILN_MAX_AXES];
  for (int i = 0; i < b->naxes; i++) dims[i] = (npy_intp)b->shape[i];
  if (!p && b->defer_alloc) /* a Python layer's setup or first reshape, before the net plans its
                               memory: zeros of the shape, which is all that is known yet */
    return PyArray_ZEROS(b->naxes, dims, NPY_FLOAT32, 0);
  if (!p) {
    PyErr_Format(kilnpy_error, "blob '%s' has no %s (a layer's buffer keeps data only)", b->name,
                 diff ? "diff" : "data");
    return NULL;
  }
  if (!kiln_device_is_host(b->device)) {
    /* a GPU's memory: a read-only copy (writes go through blob.data = x) */
    PyObject *a = PyArray_SimpleNew(b->naxes, dims, NPY_FLOAT32);
    if (!a) return NULL;
    if (b->device->ops->to_host(b->device, PyArray_DATA((PyArrayObject *)a), p,
                                (size_t)b->count * sizeof(float))) {
      Py_DECREF(a);
      return kilnpy_raise();
    }
    PyArray_CLEARFLAGS((PyArrayObject *)a, NPY_ARRAY_WRITEABLE);
    return a;
  }
  keep_outgrown(o);
  PyObject *a = PyArray_SimpleNewFromData(b->naxes, dims, NPY_FLOAT32, p);
  if (!a) return NULL;
  Py_INCREF(o);
  if (PyArray_SetBaseObject((PyArrayObject *)a, (PyObject *)o) < 0) {
    Py_DECREF(a);
    return NULL;
  }
  return a;
}

static PyObject *blob_get_data(kilnpy_blob *o, void *c) {
  (void)c;
  return view(o, false);
}
static PyObject *blob_get_diff(kilnpy_blob *o, void *c) {
  (void)c;
  return view(o, true);
}

/* blob.data = x: copies x (broadcast as NumPy does) into the blob, as pycaffe's setter does */
static int blob_set(kilnpy_blob *o, PyObject *value, bool diff) {
  if (!value) {
    PyErr_SetString(PyExc_AttributeError, "a blob's data and diff cannot be deleted");
    return -1;
  }
  kiln_blob *b = o->blob;
  if (!b->csr && !kiln_device_is_host(b->device) && (diff ? b->diff : b->data)) {
    npy_intp dims[KILN_MAX_AXES];
    for (int i = 0; i < b->naxes; i++) dims[i] = (npy_intp)b->shape[i];
    PyObject *a = PyArray_SimpleNew(b->naxes, dims, NPY_FLOAT32);
    if (!a) return -1;
    int rc = PyArray_CopyObject((PyArrayObject *)a, value);
    if (!rc && b->device->ops->to_device(b->device, diff ? b->diff : b->data,
                                         PyArray_DATA((PyArrayObject *)a),
                                         (size_t)b->count * sizeof(float))) {
      kilnpy_raise();
      rc = -1;
    }
    Py_DECREF(a);
    return rc;
  }
  PyObject *a = view(o, diff);
  if (!a) return -1;
  int rc = PyArray_CopyObject((PyArrayObject *)a, value);
  Py_DECREF(a);
  return rc;
}
static int blob_set_data(kilnpy_blob *o, PyObject *v, void *c) {
  (void)c;
  return blob_set(o, v, false);
}
static int blob_set_diff(kilnpy_blob *o, PyObject *v, void *c) {
  (void)c;
  return blob_set(o, v, true);
}

static PyObject *blob_get_shape(kilnpy_blob *o, void *c) {
  (void)c;
  PyObject *t = PyTuple_New(o->blob->naxes);
  for (int i = 0; t && i < o->blob->naxes; i++)
    PyTuple_SET_ITEM(t, i, PyLong_FromLongLong(o->blob->shape[i]));
  return t;
}
static PyObject *blob_get_count(kilnpy_blob *o, void *c) {
  (void)c;
  return PyLong_FromLongLong(o->blob->count);
}
static PyObject *blob_get_name(kilnpy_blob *o, void *c) {
  (void)c;
  return PyUnicode_FromString(o->blob->name ? o->blob->name : "");
}
/* Caffe's legacy 4-d accessors: axis k, or 1 where the blob has fewer axes */
static PyObject *legacy_axis(kilnpy_blob *o, int k) {
  return PyLong_FromLongLong(k < o->blob->naxes ? o->blob->shape[k] : 1);
}
static PyObject *blob_num(kilnpy_blob *o, void *c) { (void)c; return legacy_axis(o, 0); }
static PyObject *blob_channels(kilnpy_blob *o, void *c) { (void)c; return legacy_axis(o, 1); }
static PyObject *blob_height(kilnpy_blob *o, void *c) { (void)c; return legacy_axis(o, 2); }
static PyObject *blob_width(kilnpy_blob *o, void *c) { (void)c; return legacy_axis(o, 3); }

/* blob.reshape(*shape) or blob.reshape(shape): the blob's new shape (arrays made before keep
 * their memory: where the new shape fits, the same memory; otherwise the old, now detached) */
static PyObject *blob_reshape(kilnpy_blob *o, PyObject *args) {
  PyObject *seq = args;
  if (PyTuple_GET_SIZE(args) == 1 && PySequence_Check(PyTuple_GET_ITEM(args, 0)))
    seq = PyTuple_GET_ITEM(args, 0);
  Py_ssize_t n = PySequence_Size(seq);
  if (n < 0) return NULL;
  if (n > KILN_MAX_AXES) {
    PyErr_Format(kilnpy_error, "blob '%s': %zd axes (at most %d)", o->blob->name, n,
                 KILN_MAX_AXES);
    return NULL;
  }
  int64_t shape[KILN_MAX_AXES];
  for (Py_ssize_t i = 0; i < n; i++) {
    PyObject *v = PySequence_GetItem(seq, i);
    if (!v) return NULL;
    long long d = PyLong_AsLongLong(v);
    Py_DECREF(v);
    if (d == -1 && PyErr_Occurred()) return NULL;
    shape[i] = d;
  }
  keep_outgrown(o);
  if (kiln_blob_reshape(o->blob, (int)n, shape)) return kilnpy_raise();
  Py_RETURN_NONE;
}

static PyObject *blob_repr(kilnpy_blob *o) {
  char buf[256];
  return PyUnicode_FromFormat("<kiln.Blob '%s' %s>", o->blob->name ? o->blob->name : "",
                              kiln_blob_shape_string(o->blob, buf, sizeof buf));
}

static PyGetSetDef blob_getset[] = {
    {"data", (getter)blob_get_data, (setter)blob_set_data, "the values, a NumPy view", NULL},
    {"diff", (getter)blob_get_diff, (setter)blob_set_diff, "the gradient, a NumPy view", NULL},
    {"shape", (getter)blob_get_shape, NULL, "the shape, a tuple", NULL},
    {"count", (getter)blob_get_count, NULL, "the number of elements", NULL},
    {"name", (getter)blob_get_name, NULL, "kiln's name of the blob", NULL},
    {"num", (getter)blob_num, NULL, "axis 0", NULL},
    {"channels", (getter)blob_channels, NULL, "axis 1", NULL},
    {"height", (getter)blob_height, NULL, "axis 2", NULL},
    {"width", (getter)blob_width, NULL, "axis 3", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef blob_methods[] = {
    {"reshape", (PyCFunction)blob_reshape, METH_VARARGS, "reshape(*shape): a new shape"},
    {NULL, NULL, 0, NULL},
};

PyTypeObject kilnpy_blob_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kiln.Blob",
    .tp_basicsize = sizeof(kilnpy_blob),
    .tp_dealloc = (destructor)blob_dealloc,
    .tp_repr = (reprfunc)blob_repr,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A kiln blob: data and diff as NumPy views of kiln's memory (valid while its net "
              "lives; on a GPU, read-only copies, written with blob.data = x), its shape, "
              "reshape().",
    .tp_getset = blob_getset,
    .tp_methods = blob_methods,
};

/* ---- module functions --------------------------------------------------------------------- */

static PyObject *set_threads(PyObject *m, PyObject *arg) {
  (void)m;
  long n = PyLong_AsLong(arg);
  if (n == -1 && PyErr_Occurred()) return NULL;
  if (n < 1) {
    PyErr_Format(kilnpy_error, "set_threads(%ld): a count of 1 or more", n);
    return NULL;
  }
  kiln_set_num_threads((int)n);
  Py_RETURN_NONE;
}

static PyObject *get_threads(PyObject *m, PyObject *unused) {
  (void)m;
  (void)unused;
  return PyLong_FromLong(kiln_get_num_threads());
}

/* set_device('cpu' | 'host' | 'cuda' | 'cuda:N'): where nets made from now on live */
static PyObject *set_device(PyObject *m, PyObject *arg) {
  (void)m;
  const char *name = PyUnicode_AsUTF8(arg);
  if (!name) return NULL;
  if (!strcmp(name, "cpu")) name = "host";
  kiln_config c;
  kiln_config_init(&c);
  if (kiln_config_set_device(&c, name, "kiln.set_device")) return kilnpy_raise();
  if (strlen(name) >= sizeof kilnpy_device) {
    PyErr_Format(kilnpy_error, "kiln.set_device: '%s' is too long", name);
    return NULL;
  }
  strcpy(kilnpy_device, name);
  Py_RETURN_NONE;
}

static PyObject *set_random_seed(PyObject *m, PyObject *arg) {
  (void)m;
  unsigned long long s = PyLong_AsUnsignedLongLong(arg);
  if (s == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
  kilnpy_seed = s;
  Py_RETURN_NONE;
}

/* _load_image(path, color): the library's PNG/JPEG reader, as pycaffe's caffe.io.load_image
 * returns it: height x width x channels float32 in [0, 1], RGB (or one gray channel) */
static PyObject *load_image(PyObject *m, PyObject *args) {
  (void)m;
  PyObject *path_b = NULL;
  int color = 1;
  if (!PyArg_ParseTuple(args, "O&|p", PyUnicode_FSConverter, &path_b, &color)) return NULL;
  kiln_image img = {0};
  int rc;
  KILNPY_BEGIN
  rc = kiln_image_read(PyBytes_AS_STRING(path_b), color ? KILN_IMAGE_COLOR : KILN_IMAGE_GRAY, 0,
                       0, &img);
  KILNPY_END
  Py_DECREF(path_b);
  if (rc) {
    kiln_image_free(&img);
    return kilnpy_raise();
  }
  npy_intp dims[3] = {img.height, img.width, img.channels};
  PyObject *a = PyArray_SimpleNew(3, dims, NPY_FLOAT32);
  if (a) {
    float *out = PyArray_DATA((PyArrayObject *)a);
    const size_t plane = (size_t)img.height * img.width;
    for (int c = 0; c < img.channels; c++) { /* kiln's planes are B, G, R: RGB out */
      const uint8_t *src = img.data + (size_t)(img.channels == 3 ? 2 - c : c) * plane;
      for (size_t i = 0; i < plane; i++) out[i * img.channels + c] = src[i] / 255.0f;
    }
  }
  kiln_image_free(&img);
  return a;
}

static PyMethodDef module_methods[] = {
    {"_load_image", load_image, METH_VARARGS, NULL},
    {"set_threads", set_threads, METH_O, "set_threads(n): threads for kiln's kernels"},
    {"get_threads", get_threads, METH_NOARGS, "the threads kiln's kernels use"},
    {"set_device", set_device, METH_O,
     "set_device(name): 'cpu' or 'cuda:N' for the nets and solvers made from now on"},
    {"set_random_seed", set_random_seed, METH_O,
     "set_random_seed(seed): the seed of nets made from now on (1701 as kiln test's)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_kiln", "kiln's C library seen from Python (use the package kiln)", -1,
    module_methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__kiln(void) {
  import_array();
  if (PyType_Ready(&kilnpy_keeper_type) < 0 || PyType_Ready(&kilnpy_blob_type) < 0 || PyType_Ready(&kilnpy_net_type) < 0 ||
      PyType_Ready(&kilnpy_solver_type) < 0)
    return NULL;
  PyObject *m = PyModule_Create(&module_def);
  if (!m) return NULL;
  if (!kilnpy_error) {
    kilnpy_error = PyErr_NewExceptionWithDoc("kiln.Error", "An error kiln reported, with its message",
                                             PyExc_RuntimeError, NULL);
    if (!kilnpy_error) goto fail;
  }
  Py_INCREF(kilnpy_error);
  if (PyModule_AddObject(m, "Error", kilnpy_error) < 0) goto fail;
  Py_INCREF(&kilnpy_blob_type);
  if (PyModule_AddObject(m, "Blob", (PyObject *)&kilnpy_blob_type) < 0) goto fail;
  Py_INCREF(&kilnpy_net_type);
  if (PyModule_AddObject(m, "Net", (PyObject *)&kilnpy_net_type) < 0) goto fail;
  Py_INCREF(&kilnpy_solver_type);
  if (PyModule_AddObject(m, "Solver", (PyObject *)&kilnpy_solver_type) < 0) goto fail;
  if (PyModule_AddIntConstant(m, "TRAIN", CAFFE__PHASE__TRAIN) < 0 ||
      PyModule_AddIntConstant(m, "TEST", CAFFE__PHASE__TEST) < 0)
    goto fail;
  if (kilnpy_register_layer()) {
    kilnpy_raise();
    goto fail;
  }
  /* kiln's kernel threads flush subnormals for good, as in the kiln command (they run nothing
   * else); this thread only inside kiln's calls (kilnpy_fp_enter) */
  kiln_config cfg;
  if (kiln_config_from_env(&cfg)) {
    kilnpy_raise();
    goto fail;
  }
  flush_denormals = !cfg.keep_denormals;
  if (!kilnpy_embedded) kiln_log_set_handler(log_to_python, NULL); /* the kiln command keeps its own */
  if (flush_denormals) {
    const unsigned saved = kilnpy_fp_enter();
    kiln_set_flush_denormals(true);
    kilnpy_fp_leave(saved);
  }
  /* NumPy warns, once, that float32's smallest subnormal is zero when asked inside a call
   * (a Python layer's np.finfo): that is kiln flushing them on purpose */
  PyObject *w = PyImport_ImportModule("warnings");
  PyObject *r = w ? PyObject_CallMethod(w, "filterwarnings", "ss", "ignore",
                                        "The value of the smallest subnormal")
                  : NULL;
  Py_XDECREF(w);
  if (!r) goto fail;
  Py_DECREF(r);
  return m;
fail:
  Py_DECREF(m);
  return NULL;
}
