/* kiln onnx: a deploy net written as an ONNX model (docs/onnx.md): its Input layers' tops as the
 * graph's inputs, its outputs (the blobs no layer reads) as the graph's outputs under their Caffe
 * names, every parameter blob as an initializer (float32, raw little-endian bytes), each layer as
 * the ONNX nodes that compute what it computes at inference. */
#ifndef KILN_ONNX_H
#define KILN_ONNX_H

#include <stdbool.h>
#include <stdint.h>

#include "kiln/net.h"

/* The operator set the model imports (ai.onnx), and the IR version that goes with it. */
#define KILN_ONNX_OPSET 13
#define KILN_ONNX_IR_VERSION 7

typedef struct kiln_onnx_options {
  /* The inputs' and outputs' first axis as the symbol "N" instead of the net's batch size; a
   * layer that would have to bake the batch size into the graph (a Reshape or Slice across the
   * batch axis) is then refused, naming it. */
  bool dynamic_batch;
  /* For the model's doc_string and messages: the deploy prototxt and the weights (may be NULL). */
  const char *model, *weights;
  /* The blobs written as the model's outputs, in this order (noutputs of them; 0: the net's own
   * outputs, the blobs no layer reads). Only the layers they depend on are written and checked,
   * so a detection net exports up to its DetectionOutput's inputs (mbox_loc, mbox_conf_flatten,
   * mbox_priorbox). */
  const char *const *outputs;
  int noutputs;
} kiln_onnx_options;

/* What was written, for the tool to report. */
typedef struct kiln_onnx_summary {
  int nodes, initializers, inputs, outputs;
  int64_t parameters;   /* floats in the initializers */
  int dropped;          /* layers that are the identity at inference (Dropout), left out */
  uint64_t bytes;       /* the file's size */
} kiln_onnx_summary;

/* Writes `net` (built in the TEST phase, weights loaded) as an ONNX model to `path`, through a
 * temporary file renamed into place, so that nothing is left under `path` when it fails. A layer
 * type with no ONNX form here (a data or loss layer, LSTMUnit, ...) is refused with
 * KILN_ERR_UNSUPPORTED naming the layer and its type, before anything is written. `summary` may
 * be NULL. */
int kiln_onnx_export(const kiln_net *net, const kiln_onnx_options *opt, const char *path,
                     kiln_onnx_summary *summary);

/* What kiln_onnx_export checks first, before anything is built, for a caller to ask before it
 * loads the weights: the net is built in the TEST phase, opt's outputs (opt may be NULL) are its
 * blobs, and each layer they depend on has an ONNX form (the first that has none refused,
 * KILN_ERR_UNSUPPORTED naming it and its type). */
int kiln_onnx_check(const kiln_net *net, const kiln_onnx_options *opt);

/* Whether the exporter has an ONNX form for layer type `type` (docs/onnx.md's table), and when
 * it has none, why (a sentence, for messages), in *why. */
bool kiln_onnx_exports_type(const char *type, const char **why);

/* ---- import (src/onnx/import.c) -------------------------------------------------------------
 * An ONNX model as a Caffe deploy net and its weights: the graph's constant parts folded
 * (Constant, Shape of a known shape, Gather, Unsqueeze, Concat, ... on constants), each remaining
 * node mapped onto the kiln layer (or layers) that compute exactly what it computes, or refused
 * naming the node and its op type. docs/onnx.md has the op table. */

/* The opsets of the default domain (ai.onnx) the importer reads. */
#define KILN_ONNX_IMPORT_OPSET_MIN 7
#define KILN_ONNX_IMPORT_OPSET_MAX 17

typedef struct kiln_onnx_import_options {
  /* The size given to an input's first axis when the model leaves it symbolic ("N",
   * "batch_size"); 0: 1. Any other symbolic axis is refused. */
  int64_t batch;
} kiln_onnx_import_options;

typedef struct kiln_onnx_imported {
  /* The deploy net as prototxt text (Input layers for the graph's inputs, the graph's outputs
   * under their ONNX names), and the same net with every layer's parameter blobs, for the
   * .caffemodel. Owned; kiln_onnx_imported_free. */
  char *prototxt;
  Caffe__NetParameter *net;
  int opset;
  int nodes, folded, dropped, layers, inputs, outputs;
  int chained; /* nodes computed by a layer written for another node: the chains that are one
                * layer (LayerNorm, GELU written out), Slices of one tensor in one Slice layer */
  int64_t parameters;
} kiln_onnx_imported;

/* Imports the model in data[0 .. len), `name` standing for it in messages. Malformed models (a
 * truncated file, a cycle, a tensor no node writes, an initializer whose bytes disagree with its
 * dims, an opset outside KILN_ONNX_IMPORT_OPSET_MIN .. MAX) are KILN_ERR_PARSE or
 * KILN_ERR_INVALID naming the node or field; an op or attribute kiln cannot express exactly is
 * KILN_ERR_UNSUPPORTED naming the node and its op type. */
int kiln_onnx_import(const void *data, size_t len, const char *name,
                     const kiln_onnx_import_options *opt, kiln_onnx_imported *out);
void kiln_onnx_imported_free(kiln_onnx_imported *m);
/* Writes the net (text) and its weights (.caffemodel, binary NetParameter): both whole under
 * temporary names beside them, then renamed into place, so a failed import replaces neither
 * name's file and leaves no new one. */
int kiln_onnx_imported_write(const kiln_onnx_imported *m, const char *net_path,
                             const char *weights_path);

#endif
