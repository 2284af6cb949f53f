/* Test support for the layer tests (tests/test_layers_*.c): blobs with chosen contents, a layer
 * built outside a net from prototxt text, forward and backward passes, checks of values, shapes,
 * creation errors and gradients, in-place runs against out-of-place ones, and a small net run
 * once. A failed check prints what differs (cmocka's print_error) and fails the running test. */
#ifndef KILN_TEST_LAYER_TEST_H
#define KILN_TEST_LAYER_TEST_H

#include <stdbool.h>
#include <stdint.h>

#include "device_mirror.h"
#include "gradcheck.h"
#include "kiln/layers.h"
#include "kiln/net.h"

#define TRAIN CAFFE__PHASE__TRAIN
#define TEST CAFFE__PHASE__TEST
/* A shape as an array literal: blob_of("x", 4, SHAPE(1, 1, 3, 3), NULL). */
#define SHAPE(...) ((const int64_t[]){__VA_ARGS__})

/* ---- blobs ------------------------------------------------------------------------------- */

/* A blob of `shape` holding `values` (NULL: zeros). */
kiln_blob *blob_of(const char *name, int naxes, const int64_t *shape, const float *values);
/* A copy of `src` (shape and data). */
kiln_blob *blob_copy(const char *name, const kiln_blob *src);
/* Values start, start + 1, ... in order. */
kiln_blob *iota_blob(const char *name, int naxes, const int64_t *shape, float start);
/* Values k * 0.05 - 2.5 in a random order: distinct and at least 0.05 apart, so max pooling has
 * no ties and no input sits within a finite-difference step of another. */
kiln_blob *distinct_blob(const char *name, int naxes, const int64_t *shape, kiln_rng *rng);
/* Integer labels in [0, C). */
kiln_blob *label_blob(const char *name, int naxes, const int64_t *shape, int C, kiln_rng *rng);

/* ---- a layer built outside a net ------------------------------------------------------- */

/* Its parameter message, the layer and its tops. */
typedef struct built {
  Caffe__LayerParameter *lp;
  kiln_layer *l;
  kiln_blob *top[8];
  int ntop;
  bool own_tops;
} built;

/* Builds `text` on `bottoms`; with tops == NULL the layer gets `ntop` fresh tops, else it writes
 * into the given ones (in-place layers pass their bottom). Fails the test if creation fails. */
built build_on(const char *text, int phase, kiln_blob **bottoms, int nbottom, kiln_blob **tops,
               int ntop);
/* build_on() with fresh tops. */
built build(const char *text, int phase, kiln_blob **bottoms, int nbottom, int ntop);
/* Frees the layer, its message and the tops it owns. */
void unbuild(built *b);
/* One pass; fails the test if the pass fails. */
void forward(built *b);
void backward(built *b);
/* Copies `v` into parameter blob `p`. */
void set_params(built *b, int p, const float *v);

/* ---- checks ------------------------------------------------------------------------------ */

void fill(float *x, int64_t n, float v);
/* |got - want| <= tol * max(1, |want|) element by element. */
void expect_close(const char *what, const float *got, const float *want, int64_t n, double tol);
void expect_shape(const kiln_blob *b, int naxes, const int64_t *shape);
/* The current error message contains every non-NULL fragment. */
void expect_message(const char *a, const char *b, const char *c);
/* kiln_layer_create() fails with `code` and a message naming the layer (`who`, e.g.
 * "layer 'c' (Convolution)") and containing the fragments `what` and `what2` (may be NULL).
 * At most 8 tops; with in_place every top is bottom 0. */
void expect_fails_ex(const char *text, int phase, kiln_blob **bottoms, int nbottom, int ntop,
                     bool in_place, int code, const char *who, const char *what,
                     const char *what2);
/* expect_fails_ex() with fresh tops and one fragment. */
void expect_create_fails(const char *text, int phase, kiln_blob **bottoms, int nbottom, int ntop,
                         int code, const char *who, const char *what);
/* gradcheck_layer() finds no mismatch. */
void check_grad(const char *text, kiln_blob **bottoms, int nbottom, int ntop,
                const gradcheck_opts *opts);

/* Like expect_close against double references: |got - want| <= rel * max(1e-3, |want|). */
void expect_rel(const char *what, const float *got, const double *want, int64_t n, double rel);
/* Runs `text` once out of place and once in place (top = bottom 0) on copies of `bottoms` with
 * the same parameters and top gradient: outputs, bottom gradients and parameter gradients must
 * agree exactly. */
void expect_in_place_same(const char *text, int phase, kiln_blob **bottoms, int nbottom);
/* Runs `text` (TRAIN) on a copy of `x` out of place and on another copy in place, with the same
 * top gradient, twice each (the second pass, on new input values, checks that a saved input is
 * refreshed, and that parameter gradients accumulate alike); outputs, input gradients and
 * parameter gradients must agree exactly. */
void expect_in_place_matches(const char *text, const kiln_blob *x, kiln_rng *rng);

/* ---- in a net ---------------------------------------------------------------------------- */

/* Builds a TRAIN net from `text` (parsed into *np, which the caller frees with the net) with
 * random 'x' in [-1, 1) and zero labels, runs forward and backward and checks the loss is finite
 * and positive. */
kiln_net *net_run(const char *text, Caffe__NetParameter **np);

#endif
