/* kiln.Net's C side: a net built from a prototxt (or a solver's), its blobs, layers and passes.
 * The Python class kiln.Net (python/kiln/__init__.py) wraps these in pycaffe's interface. */
#include "kilnpy.h"

#include <string.h>

#include "kiln/proto.h"

static void net_dealloc(kilnpy_net *o) {
  Py_XDECREF(o->keeper);
  Py_TYPE(o)->tp_free((PyObject *)o);
}

PyObject *kilnpy_net_wrap(PyTypeObject *type, kiln_net *net, kilnpy_keeper *keeper) {
  if (!PyType_IsSubtype(type, &kilnpy_net_type)) {
    PyErr_SetString(PyExc_TypeError, "a subclass of _kiln.Net");
    return NULL;
  }
  kilnpy_net *o = (kilnpy_net *)type->tp_alloc(type, 0);
  if (!o) return NULL;
  o->net = net;
  o->keeper = keeper;
  Py_INCREF(keeper);
  return (PyObject *)o;
}

static int check(kilnpy_net *o) {
  if (o->net) return 0;
  PyErr_SetString(kilnpy_error, "the net was not built (its __init__ failed or was not called)");
  return -1;
}

/* _kiln.Net(model, weights, phase, stages, level) */
static int net_init(kilnpy_net *o, PyObject *args, PyObject *kw) {
  static char *names[] = {"model", "weights", "phase", "stages", "level", NULL};
  PyObject *model_o, *weights_o = Py_None, *stages_o = NULL;
  int phase = CAFFE__PHASE__TEST, level = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O&|OiOi", names, PyUnicode_FSConverter, &model_o,
                                   &weights_o, &phase, &stages_o, &level))
    return -1;
  int ret = -1;
  PyObject *weights_b = NULL, *stages = NULL;
  const char *stage_v[64];
  int nstages = 0;
  if (o->net) {
    PyErr_SetString(kilnpy_error, "a Net is built once");
    goto out;
  }
  if (phase != CAFFE__PHASE__TRAIN && phase != CAFFE__PHASE__TEST) {
    PyErr_Format(kilnpy_error, "phase %d: kiln.TRAIN (0) or kiln.TEST (1)", phase);
    goto out;
  }
  if (weights_o != Py_None && !PyUnicode_FSConverter(weights_o, &weights_b)) goto out;
  if (stages_o && stages_o != Py_None) {
    stages = PySequence_Fast(stages_o, "stages: a sequence of strings");
    if (!stages) goto out;
    nstages = (int)PySequence_Fast_GET_SIZE(stages);
    if (nstages > 64) {
      PyErr_SetString(kilnpy_error, "stages: at most 64");
      goto out;
    }
    for (int i = 0; i < nstages; i++)
      if (!(stage_v[i] = PyUnicode_AsUTF8(PySequence_Fast_GET_ITEM(stages, i)))) goto out;
  }
  const char *model = PyBytes_AS_STRING(model_o);
  kilnpy_keeper *k = kilnpy_keeper_new();
  if (!k) goto out;
  int rc = kilnpy_config(&k->config);
  if (!rc) rc = kiln_text_parse_file(model, &caffe__net_parameter__descriptor, &k->msg);
  if (!rc) rc = kiln_net_param_upgrade((Caffe__NetParameter *)k->msg, model, NULL);
  if (!rc) {
    kiln_net_options opt = {.phase = phase, .level = level, .stages = stage_v,
                            .nstages = nstages, .seed = kilnpy_seed, .source = model,
                            .config = &k->config};
    KILNPY_BEGIN
    rc = kiln_net_create((Caffe__NetParameter *)k->msg, &opt, &k->net);
    KILNPY_END
  }
  if (!rc && weights_b) {
    KILNPY_BEGIN
    rc = kiln_net_load_weights(k->net, PyBytes_AS_STRING(weights_b));
    KILNPY_END
  }
  if (rc) {
    kilnpy_raise();
    Py_DECREF(k);
    goto out;
  }
  o->keeper = k;
  o->net = k->net;
  ret = 0;
out:
  Py_DECREF(model_o);
  Py_XDECREF(weights_b);
  Py_XDECREF(stages);
  return ret;
}

static PyObject *str_list(int n, const char *(*name)(const void *, int), const void *ctx) {
  PyObject *l = PyList_New(n);
  for (int i = 0; l && i < n; i++) {
    PyObject *s = PyUnicode_FromString(name(ctx, i));
    if (!s) {
      Py_DECREF(l);
      return NULL;
    }
    PyList_SET_ITEM(l, i, s);
  }
  return l;
}

static const char *blob_name_at(const void *net, int i) {
  return ((const kiln_net *)net)->blobs[i]->name;
}
static const char *output_name_at(const void *net, int i) {
  return ((const kiln_net *)net)->outputs[i]->name;
}
static const char *bottom_name_at(const void *l, int i) {
  return ((const kiln_layer *)l)->bottom[i]->name;
}
static const char *top_name_at(const void *l, int i) { return ((const kiln_layer *)l)->top[i]->name; }

static PyObject *net_blob_names(kilnpy_net *o, PyObject *unused) {
  (void)unused;
  if (check(o)) return NULL;
  return str_list(o->net->nblobs, blob_name_at, o->net);
}

static PyObject *net_output_names(kilnpy_net *o, PyObject *unused) {
  (void)unused;
  if (check(o)) return NULL;
  return str_list(o->net->noutputs, output_name_at, o->net);
}

/* the tops of the layers the caller fills (Input): pycaffe's net.inputs */
static PyObject *net_input_names(kilnpy_net *o, PyObject *unused) {
  (void)unused;
  if (check(o)) return NULL;
  PyObject *l = PyList_New(0);
  for (int i = 0; l && i < o->net->nlayers; i++) {
    const kiln_layer *ly = o->net->layers[i];
    if (!ly->ops->fed_by_caller) continue;
    for (int t = 0; t < ly->ntop; t++) {
      PyObject *s = PyUnicode_FromString(ly->top[t]->name);
      if (!s || PyList_Append(l, s) < 0) {
        Py_XDECREF(s);
        Py_DECREF(l);
        return NULL;
      }
      Py_DECREF(s);
    }
  }
  return l;
}

static PyObject *net_blob(kilnpy_net *o, PyObject *arg) {
  if (check(o)) return NULL;
  const char *name = PyUnicode_AsUTF8(arg);
  if (!name) return NULL;
  kiln_blob *b = kiln_net_blob(o->net, name);
  if (!b) {
    PyErr_Format(PyExc_KeyError, "%s", name);
    return NULL;
  }
  return kilnpy_blob_new(b, o->keeper);
}

/* _layers(): a tuple (name, type, [parameter blobs], [bottom names], [top names]) per layer */
static PyObject *net_layers(kilnpy_net *o, PyObject *unused) {
  (void)unused;
  if (check(o)) return NULL;
  PyObject *l = PyList_New(o->net->nlayers);
  for (int i = 0; l && i < o->net->nlayers; i++) {
    kiln_layer *ly = o->net->layers[i];
    PyObject *params = PyList_New(ly->nparam);
    for (int k = 0; params && k < ly->nparam; k++) {
      PyObject *b = kilnpy_blob_new(ly->param[k], o->keeper);
      if (!b) {
        Py_CLEAR(params);
        break;
      }
      PyList_SET_ITEM(params, k, b);
    }
    PyObject *bottoms = params ? str_list(ly->nbottom, bottom_name_at, ly) : NULL;
    PyObject *tops = bottoms ? str_list(ly->ntop, top_name_at, ly) : NULL;
    PyObject *t = tops ? Py_BuildValue("(ssNNN)", ly->name, ly->ops->type, params, bottoms, tops)
                       : NULL;
    if (!t) {
      if (!tops) {
        Py_XDECREF(params);
        Py_XDECREF(bottoms);
      }
      Py_DECREF(l);
      return NULL;
    }
    PyList_SET_ITEM(l, i, t);
  }
  return l;
}

static int layer_range(kilnpy_net *o, PyObject *args, int *a, int *b, bool down) {
  int n = o->net->nlayers;
  *a = down ? n - 1 : 0;
  *b = down ? 0 : n - 1;
  if (!PyArg_ParseTuple(args, "|ii", a, b)) return -1;
  if (*a < 0 || *a >= n || *b < 0 || *b >= n) {
    PyErr_Format(kilnpy_error, "layers %d to %d: the net has %d layers", *a, *b, n);
    return -1;
  }
  return 0;
}

/* _forward(start, end): layers start..end (indices, both included); returns the loss (the sum
 * of loss_weight x top over the loss tops run) */
static PyObject *net_forward(kilnpy_net *o, PyObject *args) {
  if (check(o)) return NULL;
  int a, b;
  if (layer_range(o, args, &a, &b, false)) return NULL;
  kiln_net *net = o->net;
  int rc = KILN_OK;
  double loss = 0;
  KILNPY_BEGIN
  for (int i = a; !rc && i <= b; i++) {
    kiln_layer *l = net->layers[i];
    rc = kiln_net_layer_forward(net, i);
    for (int t = 0; !rc && t < l->ntop; t++)
      if (l->loss_weight[t] != 0) {
        double s = 0;
        rc = kiln_net_blob_sum(net, l->top[t], &s);
        loss += l->loss_weight[t] * s;
      }
  }
  KILNPY_END
  if (rc) return kilnpy_raise();
  return PyFloat_FromDouble((float)loss);
}

/* _backward(start, end): layers start down to end; a loss top among them gets its loss weight
 * as its gradient first, as the whole backward pass gives it */
static PyObject *net_backward(kilnpy_net *o, PyObject *args) {
  if (check(o)) return NULL;
  int a, b;
  if (layer_range(o, args, &a, &b, true)) return NULL;
  kiln_net *net = o->net;
  if (net->forward_only) {
    PyErr_SetString(kilnpy_error, "the net runs forward only");
    return NULL;
  }
  int rc = KILN_OK;
  KILNPY_BEGIN
  if (a == net->nlayers - 1 && b == 0) {
    rc = kiln_net_backward(net);
  } else {
    for (int i = b; !rc && i <= a; i++) {
      kiln_layer *l = net->layers[i];
      for (int t = 0; !rc && t < l->ntop; t++)
        if (l->loss_weight[t] != 0)
          rc = KILN_OP(l, fill, l->top[t]->diff, l->loss_weight[t], l->top[t]->count);
    }
    for (int i = a; !rc && i >= b; i--) rc = kiln_net_layer_backward(net, i);
  }
  KILNPY_END
  if (rc) return kilnpy_raise();
  Py_RETURN_NONE;
}

/* _reshape(): every layer follows the shapes given to the input blobs */
static PyObject *net_reshape(kilnpy_net *o, PyObject *unused) {
  (void)unused;
  if (check(o)) return NULL;
  int rc;
  KILNPY_BEGIN
  rc = kiln_net_reshape_inputs(o->net);
  KILNPY_END
  if (rc) return kilnpy_raise();
  Py_RETURN_NONE;
}

static PyObject *path_call(kilnpy_net *o, PyObject *arg, bool save) {
  if (check(o)) return NULL;
  PyObject *p = NULL;
  if (!PyUnicode_FSConverter(arg, &p)) return NULL;
  int rc;
  KILNPY_BEGIN
  rc = save ? kiln_net_save_weights(o->net, PyBytes_AS_STRING(p))
            : kiln_net_load_weights(o->net, PyBytes_AS_STRING(p));
  KILNPY_END
  Py_DECREF(p);
  if (rc) return kilnpy_raise();
  Py_RETURN_NONE;
}
static PyObject *net_save(kilnpy_net *o, PyObject *arg) { return path_call(o, arg, true); }
static PyObject *net_copy_from(kilnpy_net *o, PyObject *arg) { return path_call(o, arg, false); }

static PyObject *net_get_name(kilnpy_net *o, void *c) {
  (void)c;
  if (check(o)) return NULL;
  return PyUnicode_FromString(o->net->name ? o->net->name : "");
}
static PyObject *net_get_phase(kilnpy_net *o, void *c) {
  (void)c;
  if (check(o)) return NULL;
  return PyLong_FromLong(o->net->phase);
}

static PyMethodDef net_methods[] = {
    {"_blob_names", (PyCFunction)net_blob_names, METH_NOARGS, NULL},
    {"_output_names", (PyCFunction)net_output_names, METH_NOARGS, NULL},
    {"_input_names", (PyCFunction)net_input_names, METH_NOARGS, NULL},
    {"_blob", (PyCFunction)net_blob, METH_O, NULL},
    {"_layers", (PyCFunction)net_layers, METH_NOARGS, NULL},
    {"_forward", (PyCFunction)net_forward, METH_VARARGS, NULL},
    {"_backward", (PyCFunction)net_backward, METH_VARARGS, NULL},
    {"_reshape", (PyCFunction)net_reshape, METH_NOARGS, NULL},
    {"save", (PyCFunction)net_save, METH_O,
     "save(path): the weights as a .caffemodel (or Caffe's HDF5 form for a .h5 name)"},
    {"copy_from", (PyCFunction)net_copy_from, METH_O,
     "copy_from(path): weights from a .caffemodel or .caffemodel.h5, matched by layer name"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef net_getset[] = {
    {"name", (getter)net_get_name, NULL, "the net's name", NULL},
    {"phase", (getter)net_get_phase, NULL, "kiln.TRAIN or kiln.TEST", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject kilnpy_net_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "_kiln.Net",
    .tp_basicsize = sizeof(kilnpy_net),
    .tp_dealloc = (destructor)net_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "A kiln net (use kiln.Net)",
    .tp_methods = net_methods,
    .tp_getset = net_getset,
    .tp_init = (initproc)net_init,
    .tp_new = PyType_GenericNew,
};
