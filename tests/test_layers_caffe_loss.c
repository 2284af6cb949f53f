/* Caffe's losses beyond SoftmaxWithLoss, EuclideanLoss and SigmoidCrossEntropyLoss:
 * MultinomialLogisticLoss, InfogainLoss (H from a BlobProto file or a third bottom), HingeLoss
 * (L1 and L2) and ContrastiveLoss (and its legacy version). Losses and gradients against values
 * worked out by hand, finite-difference gradient checks, the gradients Caffe refuses (labels,
 * H, the similarity) and the errors bad parameters, shapes and labels give. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "files.h"
#include "kiln/proto.h"
#include "layer_test.h"

/* Runs a loss layer forward and backward with loss weight `w` (the top's diff) on bottom 0 only
 * and checks the loss and the first bottom's gradient. */
static void loss_case(const char *text, kiln_blob **b, int nbottom, int ntop, float want_loss,
                      const float *want_dx, float w, double tol) {
  built l = build(text, TRAIN, b, nbottom, ntop);
  forward(&l);
  expect_shape(l.top[0], 0, NULL);
  expect_close(text, l.top[0]->data, &want_loss, 1, tol);
  l.top[0]->diff[0] = w;
  for (int i = 1; i < nbottom; i++) l.l->propagate_down[i] = false;
  fill(b[0]->diff, b[0]->count, 99);
  backward(&l);
  expect_close(text, b[0]->diff, want_dx, b[0]->count, tol);
  unbuild(&l);
}

/* Backward with propagate_down on bottom `i` is refused, naming the layer and `what`. */
static void expect_no_gradient_to(const char *text, kiln_blob **b, int nbottom, int i,
                                  const char *who, const char *what) {
  built l = build(text, TRAIN, b, nbottom, 1);
  forward(&l);
  l.top[0]->diff[0] = 1;
  for (int k = 0; k < nbottom; k++) l.l->propagate_down[k] = k == i;
  kiln_clear_error();
  assert_int_equal(layer_backward(l.l), KILN_ERR_UNSUPPORTED);
  expect_message(who, what, NULL);
  assert_false(kiln_layer_allows_gradient(l.l, i));
  unbuild(&l);
}

/* The forward pass fails with KILN_ERR_DATA and a message with `what`. */
static void expect_forward_fails(const char *text, kiln_blob **b, int nbottom, const char *who,
                                 const char *what) {
  built l = build(text, TRAIN, b, nbottom, 1);
  kiln_clear_error();
  assert_int_equal(layer_forward(l.l), KILN_ERR_DATA);
  expect_message(who, what, NULL);
  unbuild(&l);
}

/* ---- MultinomialLogisticLoss ------------------------------------------------------------- */

/* Probabilities (2, 3) = 0.2 0.5 0.3 | 0.1 0.1 0.8, labels (1, 2):
 *   L = -(ln 0.5 + ln 0.8) / 2 = (0.69314718 + 0.22314355) / 2 = 0.45814537;
 *   dx = -w / (N p) at each label: -1 / (2 0.5) = -1 and -1 / (2 0.8) = -0.625 for w = 1.
 * A probability of 0 is clamped at 1e-20 (Caffe's kLOG_THRESHOLD): L = -ln 1e-20 = 46.0517019,
 * dx = -1 / 1e-20. */
static void test_multinomial_logistic_loss_hand(void **state) {
  (void)state;
  kiln_blob *b[2] = {blob_of("p", 2, SHAPE(2, 3), (const float[]){0.2f, 0.5f, 0.3f, 0.1f, 0.1f, 0.8f}),
                     blob_of("lab", 4, SHAPE(2, 1, 1, 1), (const float[]){1, 2})};
  const char *text = "name: 'm' type: 'MultinomialLogisticLoss'";
  loss_case(text, b, 2, 1, 0.45814537f, (const float[]){0, -1, 0, 0, 0, -0.625f}, 1, 1e-6);
  loss_case(text, b, 2, 1, 0.45814537f, (const float[]){0, -2, 0, 0, 0, -1.25f}, 2, 1e-6);
  kiln_blob *z[2] = {blob_of("p", 2, SHAPE(1, 2), (const float[]){0, 1}),
                     blob_of("lab", 1, SHAPE(1), (const float[]){0})};
  loss_case(text, z, 2, 1, 46.0517019f, (const float[]){-1e20f, 0}, 1, 1e-6);
  expect_no_gradient_to(text, b, 2, 1, "layer 'm' (MultinomialLogisticLoss)", "labels");
  b[1]->data[1] = 3;
  expect_forward_fails(text, b, 2, "layer 'm' (MultinomialLogisticLoss)", "label 3 at position 1");
  b[1]->data[1] = 0.5f;
  expect_forward_fails(text, b, 2, "layer 'm' (MultinomialLogisticLoss)", "label 0.5");
  kiln_blob *wrong = blob_of("lab3", 1, SHAPE(3), NULL);
  kiln_blob *bw[2] = {b[0], wrong};
  expect_create_fails(text, TRAIN, bw, 2, 1, KILN_ERR_SHAPE, "layer 'm' (MultinomialLogisticLoss)",
                      "one label per item");
  kiln_blob_free(wrong);
  for (int i = 0; i < 2; i++) kiln_blob_free(b[i]), kiln_blob_free(z[i]);
}

static void test_multinomial_logistic_loss_gradients(void **state) {
  (void)state;
  kiln_rng rng;
  kiln_rng_seed(&rng, 91, 1);
  kiln_blob *b[2] = {gc_blob("p", 4, SHAPE(4, 5, 1, 1), 0.2f, 1, &rng),
                     label_blob("lab", 1, SHAPE(4), 5, &rng)};
  gradcheck_opts o = {.bottom_mask = 1};
  check_grad("name: 'm' type: 'MultinomialLogisticLoss'", b, 2, 1, &o);
  check_grad("name: 'm' type: 'MultinomialLogisticLoss' loss_weight: 3", b, 2, 1, &o);
  kiln_blob_free(b[0]);
  kiln_blob_free(b[1]);
}

/* ---- InfogainLoss ------------------------------------------------------------------------ */

/* Scores (2, 3) = 1 2 3 | 0 0 0, labels (2, 0), H = 1 0.5 0 | 0 1 0 | 0.2 0 0.8.
 * p = softmax: 0.09003057 0.24472847 0.66524096 | 1/3 1/3 1/3.
 *   item 0 (label 2): -(0.2 ln 0.09003057 + 0.8 ln 0.66524096) = 0.48152119 + 0.32608477;
 *   item 1 (label 0): -(1 + 0.5) ln(1/3) = 1.64791843;
 *   L = 2.45552439 / 2 (VALID: two labels) = 1.22776220.
 * dx = (p sum_k H[l, k] - H[l, :]) / 2: item 0 (row sum 1): (0.09003057 - 0.2, 0.24472847,
 * 0.66524096 - 0.8) / 2; item 1 (row sum 1.5): (0.5 - 1, 0.5 - 0.5, 0.5) / 2.
 * ignore_label 0: item 0 alone, L = 0.80760596, item 1's gradient 0, item 0's not halved. */
static const float ig_x[6] = {1, 2, 3, 0, 0, 0};
static const float ig_H[9] = {1, 0.5f, 0, 0, 1, 0, 0.2f, 0, 0.8f};
static const float ig_dx[6] = {-0.05498472f, 0.12236424f, -0.06737952f, -0.25f, 0, 0.25f};

static void test_infogain_loss_hand(void **state) {
  (void)state;
  kiln_blob *b[3] = {blob_of("x", 2, SHAPE(2, 3), ig_x), blob_of("lab", 1, SHAPE(2), (const float[]){2, 0}),
                     blob_of("H", 4, SHAPE(1, 1, 3, 3), ig_H)};
  const char *text = "name: 'ig' type: 'InfogainLoss'";
  loss_case(text, b, 3, 1, 1.22776220f, ig_dx, 1, 1e-6);
  float dx_ignored[6] = {-0.10996943f, 0.24472847f, -0.13475904f, 0, 0, 0};
  loss_case("name: 'ig' type: 'InfogainLoss' loss_param { ignore_label: 0 }", b, 3, 1,
            0.80760596f, dx_ignored, 1, 1e-6);
  /* NONE: the sum; BATCH_SIZE: over N = 2, as VALID here */
  float dx_sum[6];
  for (int i = 0; i < 6; i++) dx_sum[i] = 2 * ig_dx[i];
  loss_case("name: 'ig' type: 'InfogainLoss' loss_param { normalization: NONE }", b, 3, 1,
            2.45552439f, dx_sum, 1, 1e-6);
  /* the second top: the probabilities */
  built two = build(text, TRAIN, b, 3, 2);
  forward(&two);
  expect_shape(two.top[1], 2, SHAPE(2, 3));
  expect_close("infogain prob", two.top[1]->data,
               (const float[]){0.09003057f, 0.24472847f, 0.66524096f, 1.0f / 3, 1.0f / 3, 1.0f / 3},
               6, 1e-6);
  unbuild(&two);
  /* H = I: SoftmaxWithLoss */
  kiln_blob *eye = blob_of("I", 2, SHAPE(3, 3), (const float[]){1, 0, 0, 0, 1, 0, 0, 0, 1});
  kiln_blob *bi[3] = {b[0], b[1], eye};
  built ig = build(text, TRAIN, bi, 3, 1);
  built sm = build("name: 'sm' type: 'SoftmaxWithLoss'", TRAIN, bi, 2, 1);
  forward(&ig);
  forward(&sm);
  expect_close("infogain with H = I", ig.top[0]->data, sm.top[0]->data, 1, 1e-6);
  unbuild(&sm);
  unbuild(&ig);
  kiln_blob_free(eye);
  expect_no_gradient_to(text, b, 3, 1, "layer 'ig' (InfogainLoss)", "labels");
  expect_no_gradient_to(text, b, 3, 2, "layer 'ig' (InfogainLoss)", "infogain matrix");
  b[1]->data[0] = 3;
  expect_forward_fails(text, b, 3, "layer 'ig' (InfogainLoss)", "label 3 at position 0");
  for (int i = 0; i < 3; i++) kiln_blob_free(b[i]);
}

/* H from infogain_loss_param.source, a BlobProto file (float data, then double data) as
 * Caffe's tools write it; the same loss as with H as a bottom. Then the errors: no source, a
 * missing file, H of the wrong size, the deprecated normalize. */
static void test_infogain_loss_source(void **state) {
  tmpdir_fixture *f = *state;
  char path[256], dpath[256], text[512];
  Caffe__BlobProto bp = CAFFE__BLOB_PROTO__INIT;
  bp.n_data = 9;
  bp.data = (float *)ig_H;
  assert_int_equal(kiln_proto_write_binary(path_in(f, "H.binaryproto", path, sizeof path), &bp.base),
                   KILN_OK);
  double hd[9];
  for (int i = 0; i < 9; i++) hd[i] = ig_H[i];
  Caffe__BlobProto bd = CAFFE__BLOB_PROTO__INIT;
  bd.n_double_data = 9;
  bd.double_data = hd;
  assert_int_equal(kiln_proto_write_binary(path_in(f, "Hd.binaryproto", dpath, sizeof dpath), &bd.base),
                   KILN_OK);
  kiln_blob *b[2] = {blob_of("x", 2, SHAPE(2, 3), ig_x), blob_of("lab", 1, SHAPE(2), (const float[]){2, 0})};
  snprintf(text, sizeof text, "name: 'ig' type: 'InfogainLoss' infogain_loss_param { source: '%s' }",
           path);
  loss_case(text, b, 2, 1, 1.22776220f, ig_dx, 1, 1e-6);
  snprintf(text, sizeof text, "name: 'ig' type: 'InfogainLoss' infogain_loss_param { source: '%s' }",
           dpath);
  loss_case(text, b, 2, 1, 1.22776220f, ig_dx, 1, 1e-6);
  expect_create_fails("name: 'ns' type: 'InfogainLoss'", TRAIN, b, 2, 1, KILN_ERR_INVALID,
                      "layer 'ns' (InfogainLoss)", "infogain_loss_param.source");
  snprintf(text, sizeof text,
           "name: 'nf' type: 'InfogainLoss' infogain_loss_param { source: '%s/none' }", f->dir);
  expect_fails_ex(text, TRAIN, b, 2, 1, false, KILN_ERR_IO, "layer 'nf' (InfogainLoss)",
                  "infogain_loss_param.source", "none");
  kiln_blob *x4 = blob_of("x4", 2, SHAPE(2, 4), NULL);
  kiln_blob *b4[2] = {x4, b[1]};
  snprintf(text, sizeof text,
           "name: 'sz' type: 'InfogainLoss' infogain_loss_param { source: '%s' }", path);
  expect_create_fails(text, TRAIN, b4, 2, 1, KILN_ERR_SHAPE, "layer 'sz' (InfogainLoss)",
                      "the infogain matrix has 9 values, not 4 x 4");
  snprintf(text, sizeof text,
           "name: 'dn' type: 'InfogainLoss' infogain_loss_param { source: '%s' } loss_param { "
           "normalize: true }",
           path);
  expect_create_fails(text, TRAIN, b, 2, 1, KILN_ERR_INVALID, "layer 'dn' (InfogainLoss)",
                      "loss_param.normalize is deprecated");
  kiln_blob_free(x4);
  kiln_blob_free(b[0]);
  kiln_blob_free(b[1]);
}

static int infogain_setup_dir(void **state) { return tmpdir_setup(state, "infogain"); }

/* Scores over (N, C, H, W) with the classes on axis 1, and on the last axis; random positive H. */
static void test_infogain_loss_gradients(void **state) {
  (void)state;
  kiln_rng rng;
  kiln_rng_seed(&rng, 92, 1);
  kiln_blob *b[3] = {gc_blob("x", 4, SHAPE(2, 4, 2, 3), -2, 2, &rng),
                     label_blob("lab", 3, SHAPE(2, 2, 3), 4, &rng),
                     gc_blob("H", 2, SHAPE(4, 4), 0, 1, &rng)};
  gradcheck_opts o = {.bottom_mask = 1};
  check_grad("name: 'ig' type: 'InfogainLoss'", b, 3, 1, &o);
  check_grad("name: 'ig' type: 'InfogainLoss' loss_param { ignore_label: 1 normalization: FULL }",
             b, 3, 1, &o);
  kiln_blob *c[3] = {gc_blob("x", 3, SHAPE(2, 3, 4), -2, 2, &rng),
                     label_blob("lab", 2, SHAPE(2, 3), 4, &rng), b[2]};
  check_grad("name: 'ig' type: 'InfogainLoss' infogain_loss_param { axis: -1 }", c, 3, 1, &o);
  kiln_blob_free(c[0]);
  kiln_blob_free(c[1]);
  for (int i = 0; i < 3; i++) kiln_blob_free(b[i]);
}

/* ---- HingeLoss --------------------------------------------------------------------------- */

/* Scores (2, 3) = 0.5 -0.2 1.5 | -1 0.3 0.8, labels (2, 0); margins max(0, 1 + s x), s = -1 at
 * the label:
 *   item 0: 1.5, 0.8, max(0, 1 - 1.5) = 0; item 1: 1 + 1 = 2, 1.3, 1.8.
 * L1: (2.3 + 5.1) / 2 = 3.7, dx = s [m > 0] / 2: 0.5 0.5 0 | -0.5 0.5 0.5.
 * L2: (2.25 + 0.64 + 4 + 1.69 + 3.24) / 2 = 5.91, dx = 2 s m / 2: 1.5 0.8 0 | -2 1.3 1.8. */
static void test_hinge_loss_hand(void **state) {
  (void)state;
  kiln_blob *b[2] = {blob_of("x", 2, SHAPE(2, 3), (const float[]){0.5f, -0.2f, 1.5f, -1, 0.3f, 0.8f}),
                     blob_of("lab", 1, SHAPE(2), (const float[]){2, 0})};
  loss_case("name: 'h' type: 'HingeLoss'", b, 2, 1, 3.7f,
            (const float[]){0.5f, 0.5f, 0, -0.5f, 0.5f, 0.5f}, 1, 1e-6);
  loss_case("name: 'h' type: 'HingeLoss' hinge_loss_param { norm: L1 }", b, 2, 1, 3.7f,
            (const float[]){1, 1, 0, -1, 1, 1}, 2, 1e-6);
  loss_case("name: 'h' type: 'HingeLoss' hinge_loss_param { norm: L2 }", b, 2, 1, 5.91f,
            (const float[]){1.5f, 0.8f, 0, -2, 1.3f, 1.8f}, 1, 1e-6);
  expect_no_gradient_to("name: 'h' type: 'HingeLoss'", b, 2, 1, "layer 'h' (HingeLoss)", "labels");
  b[1]->data[1] = -1;
  expect_forward_fails("name: 'h' type: 'HingeLoss'", b, 2, "layer 'h' (HingeLoss)",
                       "label -1 at position 1");
  kiln_blob_free(b[0]);
  kiln_blob_free(b[1]);
}

static void test_hinge_loss_gradients(void **state) {
  (void)state;
  kiln_rng rng;
  kiln_rng_seed(&rng, 93, 1);
  kiln_blob *b[2] = {gc_blob("x", 2, SHAPE(5, 4), -3, 3, &rng), label_blob("lab", 1, SHAPE(5), 4, &rng)};
  /* the margins' kinks sit at x = +-1: keep every score a step away from them */
  for (int64_t i = 0; i < b[0]->count; i++)
    if (fabsf(fabsf(b[0]->data[i]) - 1) < 0.05f) b[0]->data[i] *= 1.2f;
  gradcheck_opts o = {.bottom_mask = 1};
  check_grad("name: 'h' type: 'HingeLoss'", b, 2, 1, &o);
  check_grad("name: 'h' type: 'HingeLoss' hinge_loss_param { norm: L2 }", b, 2, 1, &o);
  kiln_blob_free(b[0]);
  kiln_blob_free(b[1]);
}

/* ---- ContrastiveLoss --------------------------------------------------------------------- */

/* a = (1, 2), (0, 0), (1, 1); b = (1, 1), (0.3, 0.4), (2, 3); y = 1, 0, 0; margin 1.
 * a - b = (0, 1), (-0.3, -0.4), (-1, -2); d^2 = 1, 0.25, 5.
 *   pair 0 (similar): 1; pair 1: d = 0.5, max(1 - 0.5, 0)^2 = 0.25; pair 2: d > 1, 0.
 *   L = 1.25 / (2 3) = 0.20833333.
 *   da (dL = 1, g = 1/3): pair 0: (a - b) / 3 = (0, 1/3); pair 1: -(1/3) 0.5 / (0.5 + 1e-4)
 *   (a - b) = 0.33326668 (0.3, 0.4); pair 2: 0. db = -da.
 * legacy_version: pair 1 adds max(1 - 0.25, 0) = 0.75, L = 1.75 / 6 = 0.29166667, and its
 * gradient is -(1/3) (a - b) = (0.1, 0.13333333). */
static void test_contrastive_loss_hand(void **state) {
  (void)state;
  kiln_blob *b[3] = {blob_of("a", 4, SHAPE(3, 2, 1, 1), (const float[]){1, 2, 0, 0, 1, 1}),
                     blob_of("b", 4, SHAPE(3, 2, 1, 1), (const float[]){1, 1, 0.3f, 0.4f, 2, 3}),
                     blob_of("y", 4, SHAPE(3, 1, 1, 1), (const float[]){1, 0, 0})};
  const float k = 0.5f / 3 / 0.5001f;
  const struct {
    const char *text;
    float loss, da[6];
  } cases[] = {
      {"name: 'c' type: 'ContrastiveLoss'", 0.20833333f, {0, 1.0f / 3, 0.3f * k, 0.4f * k, 0, 0}},
      {"name: 'c' type: 'ContrastiveLoss' contrastive_loss_param { legacy_version: true }",
       0.29166667f, {0, 1.0f / 3, 0.1f, 0.13333333f, 0, 0}},
  };
  for (int c = 0; c < 2; c++) {
    built l = build(cases[c].text, TRAIN, b, 3, 1);
    forward(&l);
    expect_close(cases[c].text, l.top[0]->data, &cases[c].loss, 1, 1e-6);
    l.top[0]->diff[0] = 1;
    l.l->propagate_down[2] = false;
    fill(b[0]->diff, 6, 99);
    fill(b[1]->diff, 6, 99);
    backward(&l);
    float db[6];
    for (int i = 0; i < 6; i++) db[i] = -cases[c].da[i];
    expect_close(cases[c].text, b[0]->diff, cases[c].da, 6, 1e-6);
    expect_close(cases[c].text, b[1]->diff, db, 6, 1e-6);
    unbuild(&l);
  }
  /* margin 3: pair 2 (d = 2.236) now adds (3 - 2.23606798)^2 = 0.58359214 */
  built m = build("name: 'c' type: 'ContrastiveLoss' contrastive_loss_param { margin: 3 }", TRAIN,
                  b, 3, 1);
  forward(&m);
  expect_close("margin 3", m.top[0]->data, (const float[]){(1 + 6.25f + 0.58359214f) / 6}, 1, 1e-6);
  unbuild(&m);
  expect_no_gradient_to("name: 'c' type: 'ContrastiveLoss'", b, 3, 2,
                        "layer 'c' (ContrastiveLoss)", "similarity");
  kiln_blob *wide = blob_of("w", 4, SHAPE(3, 2, 2, 1), NULL);
  kiln_blob *bw[3] = {wide, wide, b[2]};
  expect_create_fails("name: 'w' type: 'ContrastiveLoss'", TRAIN, bw, 3, 1, KILN_ERR_SHAPE,
                      "layer 'w' (ContrastiveLoss)", "N x C");
  kiln_blob *b3 = blob_of("b3", 2, SHAPE(3, 3), NULL);
  kiln_blob *bm[3] = {b[0], b3, b[2]};
  expect_create_fails("name: 'm' type: 'ContrastiveLoss'", TRAIN, bm, 3, 1, KILN_ERR_SHAPE,
                      "layer 'm' (ContrastiveLoss)", "do not match");
  kiln_blob *y2 = blob_of("y2", 1, SHAPE(2), NULL);
  kiln_blob *by[3] = {b[0], b[1], y2};
  expect_create_fails("name: 'y' type: 'ContrastiveLoss'", TRAIN, by, 3, 1, KILN_ERR_SHAPE,
                      "layer 'y' (ContrastiveLoss)", "one value per pair");
  kiln_blob_free(y2);
  kiln_blob_free(b3);
  kiln_blob_free(wide);
  for (int i = 0; i < 3; i++) kiln_blob_free(b[i]);
}

static void test_contrastive_loss_gradients(void **state) {
  (void)state;
  kiln_rng rng;
  kiln_rng_seed(&rng, 94, 1);
  kiln_blob *b[3] = {gc_blob("a", 4, SHAPE(6, 3, 1, 1), -1, 1, &rng),
                     gc_blob("b", 4, SHAPE(6, 3, 1, 1), -1, 1, &rng),
                     blob_of("y", 1, SHAPE(6), (const float[]){1, 0, 0, 1, 0, 0})};
  gradcheck_opts o = {.bottom_mask = 3, .threshold = 2e-3};
  check_grad("name: 'c' type: 'ContrastiveLoss' contrastive_loss_param { margin: 2 }", b, 3, 1, &o);
  check_grad("name: 'c' type: 'ContrastiveLoss' contrastive_loss_param { margin: 3 "
             "legacy_version: true }",
             b, 3, 1, &o);
  kiln_blob_free(b[0]);
  kiln_blob_free(b[1]);
  kiln_blob_free(b[2]);
}

/* In a net with force_backward: ContrastiveLoss's two feature inputs get gradients (Caffe's
 * AllowForceBackward), its similarity input none, and the backward pass runs. */
static void test_contrastive_loss_in_a_net(void **state) {
  (void)state;
  const char *text =
      "name: 'n' force_backward: true "
      "layer { name: 'in' type: 'Input' top: 'a' top: 'b' top: 'y' input_param { "
      "shape { dim: 3 dim: 2 } shape { dim: 3 dim: 2 } shape { dim: 3 } } } "
      "layer { name: 'c' type: 'ContrastiveLoss' bottom: 'a' bottom: 'b' bottom: 'y' "
      "top: 'loss' } ";
  Caffe__NetParameter *np;
  if (kiln_net_param_from_text(text, "<net>", &np)) fail_msg("%s", kiln_last_error());
  kiln_net_options opt = {.phase = TRAIN, .seed = 5, .config = kiln_test_net_config()};
  kiln_net *net = NULL;
  if (kiln_net_create(np, &opt, &net)) fail_msg("%s", kiln_last_error());
  kiln_layer *c = kiln_net_layer(net, "c");
  assert_non_null(c);
  assert_true(c->propagate_down[0]);
  assert_true(c->propagate_down[1]);
  assert_false(c->propagate_down[2]);
  memcpy(kiln_net_blob(net, "a")->data, (const float[]){1, 2, 0, 0, 1, 1}, 6 * sizeof(float));
  memcpy(kiln_net_blob(net, "b")->data, (const float[]){1, 1, 0.3f, 0.4f, 2, 3}, 6 * sizeof(float));
  memcpy(kiln_net_blob(net, "y")->data, (const float[]){1, 0, 0}, 3 * sizeof(float));
  float loss;
  assert_int_equal(kiln_net_forward(net, &loss), KILN_OK);
  assert_float_equal(loss, 0.20833333f, 1e-6);
  assert_int_equal(kiln_net_backward(net), KILN_OK);
  expect_close("da", kiln_net_blob(net, "a")->diff, (const float[]){0, 1.0f / 3}, 2, 1e-6);
  expect_close("db", kiln_net_blob(net, "b")->diff, (const float[]){0, -1.0f / 3}, 2, 1e-6);
  kiln_net_free(net);
  protobuf_c_message_free_unpacked(&np->base, NULL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_multinomial_logistic_loss_hand),
      cmocka_unit_test(test_multinomial_logistic_loss_gradients),
      cmocka_unit_test(test_infogain_loss_hand),
      cmocka_unit_test_setup_teardown(test_infogain_loss_source, infogain_setup_dir,
                                      tmpdir_teardown),
      cmocka_unit_test(test_infogain_loss_gradients),
      cmocka_unit_test(test_hinge_loss_hand),
      cmocka_unit_test(test_hinge_loss_gradients),
      cmocka_unit_test(test_contrastive_loss_hand),
      cmocka_unit_test(test_contrastive_loss_gradients),
      cmocka_unit_test(test_contrastive_loss_in_a_net),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
