/* Output and loss layers: Softmax, SoftmaxWithLoss, Accuracy, F1, ArgMax, EuclideanLoss,
 * SigmoidCrossEntropyLoss. Forward passes (losses, probabilities, accuracies, F1's counts,
 * indices) against values worked out by hand, backward passes against hand values and finite
 * differences (tests/support/gradcheck.c), ignored labels and normalisation modes, and the
 * errors that bad parameters, labels and shapes give (a status and a message naming the
 * layer). In a net: a loss layer that names no top gets one, as in Caffe. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layer_test.h"

/* ---- Softmax ----------------------------------------------------------------------------- */

/* softmax(1, 2, 3) = (e, e^2, e^3) / (e + e^2 + e^3) = 0.09003057 0.24472847 0.66524096 */
static const float sm123[3] = {0.09003057f, 0.24472847f, 0.66524096f};

static void test_softmax_forward_hand(void **state) {
  (void)state;
  kiln_blob *x = blob_of("x", 2, SHAPE(1, 3), (const float[]){1, 2, 3});
  built s = build("name: 'sm' type: 'Softmax'", TRAIN, &x, 1, 1);
  forward(&s);
  expect_close("softmax(1,2,3)", s.top[0]->data, sm123, 3, 1e-6);
  unbuild(&s);
  kiln_blob_free(x);

  /* Axis 1 of a 2x3x2x2 input: every (n, h, w) column holds (1, 2, 3) + shift, with shifts up to
   * 1000 (softmax does not change under a shift, and must not overflow). */
  kiln_blob *y = blob_of("y", 4, SHAPE(2, 3, 2, 2), NULL);
  const float shift[8] = {0, -5, 10, 1000, -1000, 0.5f, 7, -3};
  float want[24];
  for (int n = 0; n < 2; n++)
    for (int c = 0; c < 3; c++)
      for (int j = 0; j < 4; j++) {
        y->data[(n * 3 + c) * 4 + j] = (float)(c + 1) + shift[n * 4 + j];
        want[(n * 3 + c) * 4 + j] = sm123[c];
      }
  built s4 = build("name: 'sm4' type: 'Softmax' softmax_param { axis: 1 }", TRAIN, &y, 1, 1);
  forward(&s4);
  expect_shape(s4.top[0], 4, SHAPE(2, 3, 2, 2));
  expect_close("softmax axis 1", s4.top[0]->data, want, 24, 1e-5);
  unbuild(&s4);
  kiln_blob_free(y);
}

static void test_softmax_gradients(void **state) {
  (void)state;
  kiln_rng rng;
  kiln_rng_seed(&rng, 18, 1);
  kiln_blob *x = gc_blob("x", 4, SHAPE(2, 4, 2, 3), -2, 2, &rng);
  check_grad("name: 'sm' type: 'Softmax' softmax_param { axis: 1 }", &x, 1, 1, NULL);
  check_grad("name: 'sm' type: 'Softmax' softmax_param { axis: -1 }", &x, 1, 1, NULL);
  kiln_blob_free(x);
}

/* ---- SoftmaxWithLoss --------------------------------------------------------------------- */

/* A 2x3x1x2 input whose every column is (1, 2, 3), so every column's probabilities are sm123
 * and -log p = 2.40760596, 1.40760596, 0.40760596 for labels 0, 1, 2. Labels (n, w):
 * (0,0) = 2, (0,1) = 0, (1,0) = 1, (1,1) = 5 (ignored where ignore_label is 5).
 * Sum over the three counted: 0.40760596 + 2.40760596 + 1.40760596 = 4.22281789. */
static kiln_blob *loss_input(void) {
  kiln_blob *x = blob_of("x", 4, SHAPE(2, 3, 1, 2), NULL);
  for (int n = 0; n < 2; n++)
    for (int c = 0; c < 3; c++)
      for (int j = 0; j < 2; j++) x->data[(n * 3 + c) * 2 + j] = (float)(c + 1);
  return x;
}

static float loss_of(const char *loss_param, kiln_blob **bottoms) {
  char text[256];
  snprintf(text, sizeof text, "name: 'loss' type: 'SoftmaxWithLoss' %s", loss_param);
  built b = build(text, TRAIN, bottoms, 2, 1);
  expect_shape(b.top[0], 0, NULL);
  assert_int_equal(b.top[0]->count, 1);
  forward(&b);
  float v = b.top[0]->data[0];
  unbuild(&b);
  return v;
}

static void test_softmax_loss_forward_hand(void **state) {
  (void)state;
  /* One sample: loss = -log softmax(1,2,3)[2] = 0.40760596; for label 0, 2.40760596. */
  kiln_blob *x1 = blob_of("x1", 2, SHAPE(1, 3), (const float[]){1, 2, 3});
  kiln_blob *l1 = blob_of("l1", 1, SHAPE(1), (const float[]){2});
  kiln_blob *b1[2] = {x1, l1};
  assert_float_equal(loss_of("", b1), 0.40760596f, 1e-6);
  l1->data[0] = 0;
  assert_float_equal(loss_of("", b1), 2.40760596f, 1e-6);
  kiln_blob_free(x1);
  kiln_blob_free(l1);
  /* Caffe clamps the probability at FLT_MIN, so no prediction costs more than -log(FLT_MIN) =
   * 87.3365 (docs/sequence.md): p = e^-200 is 0 in float, e^-100 a denormal below FLT_MIN, and
   * both cost 87.3365 (PyTorch's cross_entropy: 200 and 100). */
  kiln_blob *xc = blob_of("xc", 2, SHAPE(2, 3), (const float[]){0, 200, 0, 0, 100, 0});
  kiln_blob *lc = blob_of("lc", 1, SHAPE(2), (const float[]){0, 2});
  kiln_blob *bc[2] = {xc, lc};
  assert_float_equal(loss_of("", bc), 87.3365448f, 1e-4);
  kiln_blob_free(xc);
  kiln_blob_free(lc);

  kiln_blob *x = loss_input();
  kiln_blob *lab = blob_of("label", 3, SHAPE(2, 1, 2), (const float[]){2, 0, 1, 5});
  kiln_blob *b[2] = {x, lab};
  /* 3 counted of 4 positions, batch 2:
   *   VALID 4.22281789 / 3 = 1.40760596;  FULL / 4 = 1.05570447;  BATCH_SIZE / 2 = 2.11140895;
   *   NONE 4.22281789; legacy normalize: false is BATCH_SIZE, normalize: true is VALID. */
  const double tol = 2e-6;
  assert_float_equal(loss_of("loss_param { ignore_label: 5 }", b), 1.40760596f, tol);
  assert_float_equal(loss_of("loss_param { ignore_label: 5 normalization: VALID }", b),
                     1.40760596f, tol);
  assert_float_equal(loss_of("loss_param { ignore_label: 5 normalization: FULL }", b),
                     1.05570447f, tol);
  assert_float_equal(loss_of("loss_param { ignore_label: 5 normalization: BATCH_SIZE }", b),
                     2.11140895f, tol);
  assert_float_equal(loss_of("loss_param { ignore_label: 5 normalization: NONE }", b),
                     4.22281789f, 4e-6);
  assert_float_equal(loss_of("loss_param { ignore_label: 5 normalize: false }", b), 2.11140895f,
                     tol);
  assert_float_equal(loss_of("loss_param { ignore_label: 5 normalize: true }", b), 1.40760596f,
                     tol);
  /* An explicit normalization wins over the legacy flag. */
  assert_float_equal(loss_of("loss_param { ignore_label: 5 normalize: false normalization: FULL }",
                             b),
                     1.05570447f, tol);
  /* ignore_label 0 instead: counted labels 2, 1 (5 is now out of range, so make it 2):
   * (0.40760596 + 1.40760596 + 0.40760596) / 3 = 0.74093929. */
  lab->data[3] = 2;
  assert_float_equal(loss_of("loss_param { ignore_label: 0 }", b), 0.74093929f, tol);
  /* Every label ignored: the VALID normalizer is clamped to 1 and the loss is 0. */
  fill(lab->data, 4, 1);
  assert_float_equal(loss_of("loss_param { ignore_label: 1 }", b), 0.0f, 0);
  kiln_blob_free(lab);
  kiln_blob_free(x);
}

/* loss_weight 2 (the net seeds the loss top's diff with it), VALID over the 3 counted positions:
 * dx = 2/3 * (p - onehot(label)) in counted columns, 0 in the ignored one; the optional second
 * top is the probabilities. */
static void test_softmax_loss_backward_hand(void **state) {
  (void)state;
  kiln_blob *x = loss_input();
  kiln_blob *lab = blob_of("label", 3, SHAPE(2, 1, 2), (const float[]){2, 0, 1, 5});
  kiln_blob *b[2] = {x, lab};
  built s = build("name: 'loss' type: 'SoftmaxWithLoss' loss_weight: 2 "
                  "loss_param { ignore_label: 5 }",
                  TRAIN, b, 2, 2);
  assert_true(s.l->ops->is_loss);
  assert_float_equal(s.l->loss_weight[0], 2.0f, 0);
  expect_shape(s.top[1], 4, SHAPE(2, 3, 1, 2));
  forward(&s);
  assert_float_equal(s.top[0]->data[0], 1.40760596f, 2e-6);
  float prob[12];
  for (int i = 0; i < 12; i++) prob[i] = sm123[(i / 2) % 3];
  expect_close("prob top", s.top[1]->data, prob, 12, 1e-6);

  s.top[0]->diff[0] = s.l->loss_weight[0];
  s.l->propagate_down[1] = false;
  fill(x->diff, 12, 7);
  backward(&s);
  const int labels[4] = {2, 0, 1, -1}; /* by (n, w); -1: ignored */
  float want[12];
  for (int n = 0; n < 2; n++)
    for (int c = 0; c < 3; c++)
      for (int j = 0; j < 2; j++) {
        int lb = labels[n * 2 + j];
        want[(n * 3 + c) * 2 + j] = lb < 0 ? 0.0f : 2.0f / 3.0f * (sm123[c] - (c == lb ? 1 : 0));
      }
  expect_close("loss dx", x->diff, want, 12, 1e-6);

  /* The label input takes no gradient: asking for one is an error naming the layer. */
  s.l->propagate_down[1] = true;
  kiln_clear_error();
  assert_int_equal(layer_backward(s.l), KILN_ERR_INVALID);
  expect_message("layer 'loss' (SoftmaxWithLoss)", "label", NULL);
  unbuild(&s);
  kiln_blob_free(lab);
  kiln_blob_free(x);
}

static void test_softmax_loss_gradients(void **state) {
  (void)state;
  kiln_rng rng;
  kiln_rng_seed(&rng, 19, 1);
  kiln_blob *x = gc_blob("x", 4, SHAPE(2, 4, 2, 3), -2, 2, &rng);
  kiln_blob *lab = label_blob("label", 3, SHAPE(2, 2, 3), 4, &rng);
  lab->data[1] = 3; /* ignore_label 3 below: make sure some labels are 3 and some are not */
  lab->data[7] = 3;
  lab->data[4] = 0;
  kiln_blob *b[2] = {x, lab};
  gradcheck_opts o = {.bottom_mask = 1, .kink_range = -1};
  const char *params[] = {
      "",
      "loss_param { normalization: VALID ignore_label: 3 }",
      "loss_param { normalization: FULL ignore_label: 3 }",
      "loss_param { normalization: BATCH_SIZE ignore_label: 3 }",
      "loss_param { normalization: NONE }",
      "loss_param { normalize: false }",
      "loss_weight: 2 loss_param { normalization: FULL }",
  };
  char text[256];
  for (size_t i = 0; i < sizeof params / sizeof params[0]; i++) {
    snprintf(text, sizeof text, "name: 'loss' type: 'SoftmaxWithLoss' %s", params[i]);
    check_grad(text, b, 2, 1, &o);
  }
  /* The class axis last: a 2x3x4 input with softmax over axis 2, labels 2x3. */
  kiln_blob *y = gc_blob("y", 3, SHAPE(2, 3, 4), -2, 2, &rng);
  kiln_blob *ly = label_blob("ly", 2, SHAPE(2, 3), 4, &rng);
  kiln_blob *by[2] = {y, ly};
  check_grad("name: 'loss' type: 'SoftmaxWithLoss' softmax_param { axis: 2 }", by, 2, 1, &o);
  kiln_blob_free(y);
  kiln_blob_free(ly);
  kiln_blob_free(lab);
  kiln_blob_free(x);
}

static void test_softmax_loss_bad_labels(void **state) {
  (void)state;
  kiln_blob *x = loss_input();
  kiln_blob *lab = blob_of("label", 3, SHAPE(2, 1, 2), (const float[]){2, 0, 1, 5});
  kiln_blob *b[2] = {x, lab};
  const float bad[] = {5, 3, -1, 1.5f};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    built s = build("name: 'sloss' type: 'SoftmaxWithLoss'", TRAIN, b, 2, 1);
    lab->data[3] = bad[i];
    kiln_clear_error();
    assert_int_equal(layer_forward(s.l), KILN_ERR_DATA);
    expect_message("layer 'sloss' (SoftmaxWithLoss)", "out of range", "position 3");
    unbuild(&s);
  }
  /* A label count that does not match the predictions is caught on reshape. */
  kiln_blob *short_lab = blob_of("short", 1, SHAPE(3), (const float[]){0, 1, 2});
  kiln_blob *bs[2] = {x, short_lab};
  expect_create_fails("name: 'sloss2' type: 'SoftmaxWithLoss'", TRAIN, bs, 2, 1, KILN_ERR_SHAPE,
                      "layer 'sloss2' (SoftmaxWithLoss)", "label count 3");
  kiln_blob_free(short_lab);
  kiln_blob_free(lab);
  kiln_blob_free(x);
}

/* ---- Accuracy ---------------------------------------------------------------------------- */

/* Five samples over four classes:
 *   s0  0.1 0.7 0.2 0.0  label 1: nothing higher           top1 yes  top2 yes
 *   s1  0.5 0.3 0.2 0.0  label 1: one higher (0.5)          top1 no   top2 yes
 *   s2  0.5 0.3 0.2 0.0  label 2: two higher (0.5, 0.3)     top1 no   top2 no
 *   s3  0.6 0.3 0.1 0.0  label 0: nothing higher           top1 yes  top2 yes
 *   s4  0.1 0.2 0.7 0.0  label 2: nothing higher           top1 yes  top2 yes
 * top1 = 3/5, top2 = 4/5. Per class (top1): class 0 {s3} 1/1, class 1 {s0, s1} 1/2,
 * class 2 {s2, s4} 1/2, class 3 no samples: 0. With ignore_label 0 (s3 dropped): top1 2/4,
 * top2 3/4, per class 0 0.5 0.5 0. */
static const float acc_x[20] = {0.1f, 0.7f, 0.2f, 0, 0.5f, 0.3f, 0.2f, 0, 0.5f, 0.3f,
                                0.2f, 0,    0.6f, 0.3f, 0.1f, 0, 0.1f, 0.2f, 0.7f, 0};
static const float acc_label[5] = {1, 1, 2, 0, 2};

static void accuracy_expect(const char *param, float want, const float *want_per_class) {
  kiln_blob *x = blob_of("x", 2, SHAPE(5, 4), acc_x);
  kiln_blob *lab = blob_of("label", 1, SHAPE(5), acc_label);
  kiln_blob *b[2] = {x, lab};
  char text[256];
  snprintf(text, sizeof text, "name: 'acc' type: 'Accuracy' %s", param);
  built a = build(text, TEST, b, 2, want_per_class ? 2 : 1);
  assert_null(a.l->ops->backward);
  forward(&a);
  expect_shape(a.top[0], 0, NULL);
  expect_close(text, a.top[0]->data, &want, 1, 1e-6);
  if (want_per_class) {
    expect_shape(a.top[1], 1, SHAPE(4));
    expect_close(text, a.top[1]->data, want_per_class, 4, 1e-6);
  }
  unbuild(&a);
  kiln_blob_free(lab);
  kiln_blob_free(x);
}

static void test_accuracy_hand(void **state) {
  (void)state;
  accuracy_expect("", 0.6f, NULL);
  accuracy_expect("accuracy_param { top_k: 1 }", 0.6f, (const float[]){1, 0.5f, 0.5f, 0});
  accuracy_expect("accuracy_param { top_k: 2 }", 0.8f, (const float[]){1, 1, 0.5f, 0});
  accuracy_expect("accuracy_param { top_k: 4 }", 1.0f, (const float[]){1, 1, 1, 0});
  accuracy_expect("accuracy_param { ignore_label: 0 }", 0.5f, (const float[]){0, 0.5f, 0.5f, 0});
  accuracy_expect("accuracy_param { ignore_label: 0 top_k: 2 }", 0.75f,
                  (const float[]){0, 1, 0.5f, 0});
}

/* Caffe counts a class that scores the same as the true one as better than it (>=), so a net
 * whose scores are all equal (dead, or not trained yet) is right only when top_k reaches every
 * class: 0 for top 1 of 4, 1 for top 4 of 4. */
static void test_accuracy_ties_count_against(void **state) {
  (void)state;
  kiln_blob *x = blob_of("x", 2, SHAPE(3, 4), NULL);
  kiln_blob *lab = blob_of("label", 1, SHAPE(3), (const float[]){0, 2, 3});
  kiln_blob *b[2] = {x, lab};
  const struct {
    int k;
    float want;
  } cases[] = {{1, 0.0f}, {3, 0.0f}, {4, 1.0f}};
  for (int i = 0; i < 3; i++) {
    char text[128];
    snprintf(text, sizeof text, "name: 'acc' type: 'Accuracy' accuracy_param { top_k: %d }",
             cases[i].k);
    built a = build(text, TEST, b, 2, 1);
    forward(&a);
    if (a.top[0]->data[0] != cases[i].want) {
      print_error("all-equal scores, top_k %d: accuracy %g, want %g\n", cases[i].k,
                  a.top[0]->data[0], cases[i].want);
      fail();
    }
    unbuild(&a);
  }
  /* One tie with the true class, top 2: s = 0.5 0.5 0.1 0.0, label 1 (class 0 ties it): one
   * class at or above it, so right for top 2, wrong for top 1. */
  kiln_blob *t = blob_of("t", 2, SHAPE(1, 4), (const float[]){0.5f, 0.5f, 0.1f, 0});
  kiln_blob *tl = blob_of("tl", 1, SHAPE(1), (const float[]){1});
  kiln_blob *bt[2] = {t, tl};
  built a1 = build("name: 'acc' type: 'Accuracy'", TEST, bt, 2, 1);
  forward(&a1);
  assert_float_equal(a1.top[0]->data[0], 0.0f, 0);
  unbuild(&a1);
  built a2 = build("name: 'acc' type: 'Accuracy' accuracy_param { top_k: 2 }", TEST, bt, 2, 1);
  forward(&a2);
  assert_float_equal(a2.top[0]->data[0], 1.0f, 0);
  unbuild(&a2);
  kiln_blob_free(t);
  kiln_blob_free(tl);
  kiln_blob_free(lab);
  kiln_blob_free(x);
}

/* Per-class accuracy for more classes than a small fixed table would hold (ImageNet has 1000):
 * 3 samples over 1000 classes, labels 999 (right), 300 (right), 300 (wrong). */
static void test_accuracy_per_class_many_classes(void **state) {
  (void)state;
  const int C = 1000;
  kiln_blob *x = blob_of("x", 2, SHAPE(3, C), NULL);
  x->data[0 * C + 999] = 1;
  x->data[1 * C + 300] = 1;
  x->data[2 * C + 5] = 1;
  kiln_blob *lab = blob_of("label", 1, SHAPE(3), (const float[]){999, 300, 300});
  kiln_blob *b[2] = {x, lab};
  built a = build("name: 'acc' type: 'Accuracy'", TEST, b, 2, 2);
  forward(&a);
  assert_float_equal(a.top[0]->data[0], 2.0f / 3.0f, 1e-6);
  expect_shape(a.top[1], 1, SHAPE(C));
  for (int c = 0; c < C; c++) {
    float want = c == 999 ? 1.0f : c == 300 ? 0.5f : 0.0f;
    if (fabsf(a.top[1]->data[c] - want) > 1e-6f) {
      print_error("per-class accuracy[%d] = %g, want %g\n", c, a.top[1]->data[c], want);
      fail();
    }
  }
  unbuild(&a);
  kiln_blob_free(lab);
  kiln_blob_free(x);
}

static void test_accuracy_bad_parameters(void **state) {
  (void)state;
  kiln_blob *x = blob_of("x", 2, SHAPE(5, 4), acc_x);
  kiln_blob *lab = blob_of("label", 1, SHAPE(5), acc_label);
  kiln_blob *b[2] = {x, lab};
  expect_create_fails("name: 'acc5' type: 'Accuracy' accuracy_param { top_k: 5 }", TEST, b, 2, 1,
                      KILN_ERR_INVALID, "layer 'acc5' (Accuracy)", "top_k 5");
  built a = build("name: 'accr' type: 'Accuracy'", TEST, b, 2, 1);
  lab->data[2] = 4;
  kiln_clear_error();
  assert_int_equal(layer_forward(a.l), KILN_ERR_DATA);
  expect_message("layer 'accr' (Accuracy)", "out of range", NULL);
  unbuild(&a);
  kiln_blob_free(lab);
  kiln_blob_free(x);
}

/* ---- ArgMax ------------------------------------------------------------------------------ */

/* Runs ArgMax with `param` (inside argmax_param) on x and compares the top with want, which has
 * the shape the top must have. */
static void argmax_expect(const char *what, const char *param, kiln_blob *x, int naxes,
                          const int64_t *shape, const float *want) {
  char text[256];
  snprintf(text, sizeof text, "name: 'am' type: 'ArgMax' argmax_param { %s }", param);
  built a = build(text, TRAIN, &x, 1, 1);
  forward(&a);
  expect_shape(a.top[0], naxes, shape);
  expect_close(what, a.top[0]->data, want, a.top[0]->count, 0);
  unbuild(&a);
}

/* Items (1, 3, 2, 3, 0) and (5, 4, 6, 0, 1). Ties put the larger index first (Caffe sorts
 * (value, index) pairs in descending order): item 0's maximum 3 is at index 3. */
static void test_argmax_hand(void **state) {
  (void)state;
  kiln_blob *x = blob_of("x", 2, SHAPE(2, 5), (const float[]){1, 3, 2, 3, 0, 5, 4, 6, 0, 1});
  built a = build("name: 'am' type: 'ArgMax'", TRAIN, &x, 1, 1);
  assert_null(a.l->ops->backward);
  forward(&a);
  expect_shape(a.top[0], 3, SHAPE(2, 1, 1));
  expect_close("argmax", a.top[0]->data, (const float[]){3, 2}, 2, 0);
  unbuild(&a);

  /* top_k 2 with values: per item the k indices, then the k values */
  argmax_expect("argmax top2 values", "top_k: 2 out_max_val: true", x, 3, SHAPE(2, 2, 2),
                (const float[]){3, 1, 3, 3, 2, 0, 6, 5});
  /* top_k 5: the whole order */
  argmax_expect("argmax top5", "top_k: 5", x, 3, SHAPE(2, 1, 5),
                (const float[]){3, 1, 2, 0, 4, 2, 0, 1, 4, 3});
  kiln_blob_free(x);

  /* Four axes without axis: each item's count(1) values; the top keeps 4 axes. */
  kiln_blob *x4 = blob_of("x4", 4, SHAPE(2, 1, 2, 2), (const float[]){0, 7, 1, 2, 9, 8, -1, 9});
  argmax_expect("argmax 4-d", "top_k: 3", x4, 4, SHAPE(2, 1, 3, 1),
                (const float[]){1, 3, 2, 3, 0, 1});
  kiln_blob_free(x4);
}

/* With axis: x is 2x3x2 (n, c, w), ranked along c for each (n, w):
 *   n0: c0 = (1, 9), c1 = (5, 2), c2 = (3, 7):  w0 ranks 1, 2 (5, 3); w1 ranks 0, 2 (9, 7)
 *   n1: c0 = (0, 0), c1 = (4, -1), c2 = (4, 8): w0 ranks 2, 1 (4, 4: tie, larger index first);
 *                                                 w1 ranks 2, 0 (8, 0)
 * The top is 2x2x2 (n, rank, w). */
static void test_argmax_axis_hand(void **state) {
  (void)state;
  kiln_blob *x = blob_of("x", 3, SHAPE(2, 3, 2),
                         (const float[]){1, 9, 5, 2, 3, 7, 0, 0, 4, -1, 4, 8});
  argmax_expect("argmax axis", "axis: 1 top_k: 2", x, 3, SHAPE(2, 2, 2),
                (const float[]){1, 0, 2, 2, 2, 2, 1, 0});
  argmax_expect("argmax axis values", "axis: 1 top_k: 2 out_max_val: true", x, 3, SHAPE(2, 2, 2),
                (const float[]){5, 9, 3, 7, 4, 8, 4, 0});
  /* axis -1 (w, 2 values) with top_k 1: n0: c0 -> 1, c1 -> 0, c2 -> 1; n1: 1 (tie), 0, 1 */
  argmax_expect("argmax axis -1", "axis: -1", x, 3, SHAPE(2, 3, 1),
                (const float[]){1, 0, 1, 1, 0, 1});
  kiln_blob_free(x);
}

static void test_argmax_bad_parameters(void **state) {
  (void)state;
  kiln_blob *x = blob_of("x", 3, SHAPE(2, 3, 2), NULL);
  expect_create_fails("name: 'big' type: 'ArgMax' argmax_param { axis: 1 top_k: 4 }", TRAIN, &x,
                      1, 1, KILN_ERR_INVALID, "layer 'big' (ArgMax)", "top_k 4");
  expect_create_fails("name: 'big2' type: 'ArgMax' argmax_param { top_k: 7 }", TRAIN, &x, 1, 1,
                      KILN_ERR_INVALID, "layer 'big2' (ArgMax)", "top_k 7");
  expect_create_fails("name: 'k0' type: 'ArgMax' argmax_param { top_k: 0 }", TRAIN, &x, 1, 1,
                      KILN_ERR_INVALID, "layer 'k0' (ArgMax)", "top_k");
  expect_create_fails("name: 'ax' type: 'ArgMax' argmax_param { axis: 3 }", TRAIN, &x, 1, 1,
                      KILN_ERR_SHAPE, "layer 'ax' (ArgMax)", "axis 3");
  /* top_k 6 = count(1) is allowed */
  built ok = build("name: 'all' type: 'ArgMax' argmax_param { top_k: 6 }", TRAIN, &x, 1, 1);
  unbuild(&ok);
  kiln_blob_free(x);
}

/* ---- EuclideanLoss ----------------------------------------------------------------------- */

/* a = (1, 2, 3, 4), b = (0, 2, 5, 1) as 2x2: a - b = (1, 0, -2, 3), sum of squares 14,
 * L = 14 / (2 * 2) = 3.5. With loss weight 2 in the top's diff: da = 2 / 2 (a - b), db = -da. */
static void test_euclidean_hand(void **state) {
  (void)state;
  kiln_blob *a = blob_of("a", 2, SHAPE(2, 2), (const float[]){1, 2, 3, 4});
  kiln_blob *b = blob_of("b", 2, SHAPE(2, 2), (const float[]){0, 2, 5, 1});
  kiln_blob *ab[2] = {a, b};
  built e = build("name: 'eu' type: 'EuclideanLoss' loss_weight: 2", TRAIN, ab, 2, 1);
  assert_float_equal(e.l->loss_weight[0], 2.0f, 0);
  forward(&e);
  expect_shape(e.top[0], 0, NULL);
  expect_close("euclidean loss", e.top[0]->data, (const float[]){3.5f}, 1, 1e-6);
  e.top[0]->diff[0] = e.l->loss_weight[0];
  fill(a->diff, 4, 1e3f);
  fill(b->diff, 4, 1e3f);
  backward(&e);
  expect_close("euclidean da", a->diff, (const float[]){1, 0, -2, 3}, 4, 1e-6);
  expect_close("euclidean db", b->diff, (const float[]){-1, 0, 2, -3}, 4, 1e-6);
  /* only the second input */
  e.l->propagate_down[0] = false;
  fill(a->diff, 4, 7);
  backward(&e);
  expect_close("euclidean da untouched", a->diff, (const float[]){7, 7, 7, 7}, 4, 0);
  expect_close("euclidean db again", b->diff, (const float[]){-1, 0, 2, -3}, 4, 1e-6);
  unbuild(&e);
  /* the same count per item in another shape is accepted (Caffe compares count(1)) */
  kiln_blob *c = blob_of("c", 3, SHAPE(2, 2, 1), (const float[]){0, 2, 5, 1});
  kiln_blob *ac[2] = {a, c};
  built f = build("name: 'eu' type: 'EuclideanLoss'", TRAIN, ac, 2, 1);
  forward(&f);
  expect_close("euclidean reshaped", f.top[0]->data, (const float[]){3.5f}, 1, 1e-6);
  unbuild(&f);
  kiln_blob_free(c);
  kiln_blob_free(b);
  kiln_blob_free(a);
}

static void test_euclidean_gradients(void **state) {
  (void)state;
  kiln_rng rng;
  kiln_rng_seed(&rng, 38, 1);
  kiln_blob *a = gc_blob("a", 4, SHAPE(3, 2, 2, 3), -2, 2, &rng);
  kiln_blob *b = gc_blob("b", 4, SHAPE(3, 2, 2, 3), -2, 2, &rng);
  kiln_blob *ab[2] = {a, b};
  check_grad("name: 'eu' type: 'EuclideanLoss'", ab, 2, 1, NULL);
  check_grad("name: 'eu' type: 'EuclideanLoss' loss_weight: 3", ab, 2, 1, NULL);
  gradcheck_opts second = {.bottom_mask = 2};
  check_grad("name: 'eu' type: 'EuclideanLoss'", ab, 2, 1, &second);
  kiln_blob_free(b);
  kiln_blob_free(a);
}

static void test_euclidean_bad_shapes(void **state) {
  (void)state;
  kiln_blob *a = blob_of("a", 2, SHAPE(2, 3), NULL);
  kiln_blob *b = blob_of("b", 2, SHAPE(2, 2), NULL);
  kiln_blob *c = blob_of("c", 2, SHAPE(3, 2), NULL); /* same count as a, other first axis */
  kiln_blob *ab[2] = {a, b}, *ac[2] = {a, c};
  expect_create_fails("name: 'eu1' type: 'EuclideanLoss'", TRAIN, ab, 2, 1, KILN_ERR_SHAPE,
                      "layer 'eu1' (EuclideanLoss)", "count 6");
  expect_create_fails("name: 'eu2' type: 'EuclideanLoss'", TRAIN, ac, 2, 1, KILN_ERR_SHAPE,
                      "layer 'eu2' (EuclideanLoss)", "do not match");
  expect_create_fails("name: 'eu3' type: 'EuclideanLoss'", TRAIN, ab, 1, 1, KILN_ERR_INVALID,
                      "layer 'eu3' (EuclideanLoss)", "bottom");
  kiln_blob_free(c);
  kiln_blob_free(b);
  kiln_blob_free(a);
}

/* ---- SigmoidCrossEntropyLoss ------------------------------------------------------------- */

/* x = (0, 2, -1, 3), t = (1, 0, 0.5, 1) as 2x2; l = max(x, 0) - x t + log(1 + exp(-|x|)):
 *   log 2 = 0.693147181;  2 + log(1 + e^-2) = 2.126928011;
 *   0.5 + log(1 + e^-1) = 0.813261687;  log(1 + e^-3) = 0.048587352;  sum 3.681924231.
 * sigmoid(x) - t = -0.5, 0.880797078, -0.231058579, -0.047425873. */
static const float sce_x[4] = {0, 2, -1, 3}, sce_t[4] = {1, 0, 0.5f, 1};
static const double sce_l[4] = {0.693147181, 2.126928011, 0.813261687, 0.048587352};
static const double sce_g[4] = {-0.5, 0.880797078, -0.231058579, -0.047425873};

static void sce_case(const char *param, const bool *counted, double normalizer) {
  kiln_blob *x = blob_of("x", 2, SHAPE(2, 2), sce_x);
  kiln_blob *t = blob_of("t", 2, SHAPE(2, 2), sce_t);
  kiln_blob *xt[2] = {x, t};
  char text[256];
  snprintf(text, sizeof text, "name: 'sce' type: 'SigmoidCrossEntropyLoss' loss_weight: 2 %s",
           param);
  built s = build(text, TRAIN, xt, 2, 1);
  forward(&s);
  expect_shape(s.top[0], 0, NULL);
  double loss = 0;
  float dx[4];
  for (int i = 0; i < 4; i++) {
    loss += counted[i] ? sce_l[i] : 0;
    dx[i] = counted[i] ? (float)(sce_g[i] * 2 / normalizer) : 0;
  }
  expect_close(text, s.top[0]->data, (const float[]){(float)(loss / normalizer)}, 1, 1e-6);
  s.top[0]->diff[0] = s.l->loss_weight[0];
  s.l->propagate_down[1] = false;
  fill(x->diff, 4, 1e3f);
  backward(&s);
  expect_close(text, x->diff, dx, 4, 1e-6);
  unbuild(&s);
  kiln_blob_free(t);
  kiln_blob_free(x);
}

static void test_sigmoid_ce_hand(void **state) {
  (void)state;
  const bool all[4] = {true, true, true, true};
  /* Caffe's default for this layer is BATCH_SIZE (N = 2), not VALID */
  sce_case("", all, 2);
  sce_case("loss_param { normalization: FULL }", all, 4);
  sce_case("loss_param { normalization: NONE }", all, 1);
  sce_case("loss_param { normalization: VALID }", all, 4);
  sce_case("loss_param { normalize: true }", all, 4);
  sce_case("loss_param { normalize: false }", all, 2);
  /* ignore_label 1: targets 1 are skipped, VALID counts the other two */
  const bool not_ones[4] = {false, true, true, false};
  sce_case("loss_param { ignore_label: 1 normalization: VALID }", not_ones, 2);
  sce_case("loss_param { ignore_label: 1 normalization: FULL }", not_ones, 4);
  /* ignore_label 0 compares the truncated target: 0 and 0.5 are both skipped (as in Caffe) */
  const bool ones[4] = {true, false, false, true};
  sce_case("loss_param { ignore_label: 0 normalize: true }", ones, 2);
  /* everything ignored: the normaliser stays at least 1, loss 0 */
  const bool none[4] = {false, false, false, false};
  kiln_blob *x = blob_of("x", 2, SHAPE(2, 2), sce_x);
  kiln_blob *t = blob_of("t", 2, SHAPE(2, 2), (const float[]){1, 1, 1, 1});
  kiln_blob *xt[2] = {x, t};
  built s = build("name: 's' type: 'SigmoidCrossEntropyLoss' loss_param { ignore_label: 1 "
                  "normalization: VALID }",
                  TRAIN, xt, 2, 1);
  forward(&s);
  expect_close("all ignored", s.top[0]->data, (const float[]){0}, 1, 0);
  (void)none;
  unbuild(&s);
  kiln_blob_free(t);
  kiln_blob_free(x);
}

/* Large |x| neither overflows nor loses the loss: l(100, 0) = l(-100, 1) = 100. */
static void test_sigmoid_ce_stable(void **state) {
  (void)state;
  kiln_blob *x = blob_of("x", 2, SHAPE(1, 4), (const float[]){100, -100, 100, -100});
  kiln_blob *t = blob_of("t", 2, SHAPE(1, 4), (const float[]){0, 1, 1, 0});
  kiln_blob *xt[2] = {x, t};
  built s = build("name: 's' type: 'SigmoidCrossEntropyLoss'", TRAIN, xt, 2, 1);
  forward(&s);
  expect_close("stable loss", s.top[0]->data, (const float[]){200}, 1, 1e-6);
  s.top[0]->diff[0] = 1;
  s.l->propagate_down[1] = false;
  backward(&s);
  expect_close("stable dx", x->diff, (const float[]){1, -1, 0, 0}, 4, 1e-6);
  unbuild(&s);
  kiln_blob_free(t);
  kiln_blob_free(x);
}

static void test_sigmoid_ce_gradients(void **state) {
  (void)state;
  kiln_rng rng;
  kiln_rng_seed(&rng, 39, 1);
  kiln_blob *x = gc_blob("x", 4, SHAPE(3, 2, 2, 3), -3, 3, &rng);
  kiln_blob *t = gc_blob("t", 4, SHAPE(3, 2, 2, 3), 0, 1, &rng);
  t->data[2] = t->data[9] = t->data[20] = 1; /* for ignore_label 1 */
  t->data[5] = 0;
  kiln_blob *xt[2] = {x, t};
  gradcheck_opts o = {.bottom_mask = 1};
  const char *params[] = {
      "",
      "loss_param { normalization: VALID }",
      "loss_param { normalization: FULL ignore_label: 1 }",
      "loss_param { normalization: VALID ignore_label: 1 }",
      "loss_param { normalization: NONE }",
      "loss_param { normalize: true }",
      "loss_weight: 0.5 loss_param { normalization: BATCH_SIZE ignore_label: 1 }",
  };
  char text[256];
  for (size_t i = 0; i < sizeof params / sizeof params[0]; i++) {
    snprintf(text, sizeof text, "name: 'sce' type: 'SigmoidCrossEntropyLoss' %s", params[i]);
    check_grad(text, xt, 2, 1, &o);
  }
  kiln_blob_free(t);
  kiln_blob_free(x);
}

static void test_sigmoid_ce_errors(void **state) {
  (void)state;
  kiln_blob *x = blob_of("x", 2, SHAPE(2, 3), NULL);
  kiln_blob *t = blob_of("t", 2, SHAPE(2, 2), NULL);
  kiln_blob *xt[2] = {x, t};
  expect_create_fails("name: 'sce1' type: 'SigmoidCrossEntropyLoss'", TRAIN, xt, 2, 1,
                      KILN_ERR_SHAPE, "layer 'sce1' (SigmoidCrossEntropyLoss)",
                      "target count 4");
  kiln_blob *t6 = blob_of("t6", 1, SHAPE(6), NULL);
  kiln_blob *xt6[2] = {x, t6};
  built s = build("name: 'sce2' type: 'SigmoidCrossEntropyLoss'", TRAIN, xt6, 2, 1);
  forward(&s);
  s.top[0]->diff[0] = 1;
  assert_true(s.l->propagate_down[1]); /* kiln_layer_create asks for every bottom */
  kiln_clear_error();
  assert_int_equal(layer_backward(s.l), KILN_ERR_INVALID);
  expect_message("layer 'sce2' (SigmoidCrossEntropyLoss)", "target", NULL);
  unbuild(&s);
  kiln_blob_free(t6);
  kiln_blob_free(t);
  kiln_blob_free(x);
}

/* ---- F1 ---------------------------------------------------------------------------------- */

/* A tagger's scores, T x N x C = 3 x 2 x 3 (classes on axis 2), and its T x N tags, with -1 on
 * a padding step:
 *   (t, n)  scores           top-1  tag   for class 1   class 2   class 0
 *   (0, 0)  0.1 0.8 0.1      1      1     tp
 *   (0, 1)  0.6 0.3 0.1      0      1     fn                      fp
 *   (1, 0)  0.2 0.5 0.3      1      0     fp                      fn
 *   (1, 1)  0.2 0.3 0.5      2      2                   tp
 *   (2, 0)  0.0 0.9 0.1      1     -1     (ignored: it would be an fp)
 *   (2, 1)  0.1 0.7 0.2      1      1     tp
 * positive class 1: tp 2, fp 1, fn 1; class 2: 1, 0, 0; class 0: 0, 1, 1. */
static const float f1_x[18] = {0.1f, 0.8f, 0.1f, 0.6f, 0.3f, 0.1f, 0.2f, 0.5f, 0.3f,
                               0.2f, 0.3f, 0.5f, 0.0f, 0.9f, 0.1f, 0.1f, 0.7f, 0.2f};
static const float f1_tags[6] = {1, 1, 0, 2, -1, 1};

static void f1_expect(const char *param, float tp, float fp, float fn) {
  kiln_blob *b[2] = {blob_of("x", 3, SHAPE(3, 2, 3), f1_x),
                     blob_of("label", 2, SHAPE(3, 2), f1_tags)};
  char text[256];
  snprintf(text, sizeof text, "name: 'f1' type: 'F1' f1_param { axis: 2 ignore_label: -1 %s }",
           param);
  built f = build(text, TEST, b, 2, 3);
  assert_null(f.l->ops->backward); /* counts have no gradient, as Accuracy has none */
  forward(&f);
  const float want[3] = {tp, fp, fn};
  for (int t = 0; t < 3; t++) {
    expect_shape(f.top[t], 0, NULL);
    expect_close(text, f.top[t]->data, &want[t], 1, 0);
  }
  unbuild(&f);
  kiln_blob_free(b[1]);
  kiln_blob_free(b[0]);
}

static void test_f1_counts_hand(void **state) {
  (void)state;
  f1_expect("", 2, 1, 1);
  f1_expect("positive_label: 1", 2, 1, 1);
  f1_expect("positive_label: 2", 1, 0, 0);
  f1_expect("positive_label: 0", 0, 1, 1);
  /* classes on axis 1 (the default), N x C, and equal top scores: the first class is the
   * prediction. s0 0.5 0.5 tag 1: fn; s1 0.2 0.9 tag 1: tp; s2 0.7 0.1 tag 0: nothing */
  kiln_blob *x = blob_of("x", 2, SHAPE(3, 2), (const float[]){0.5f, 0.5f, 0.2f, 0.9f, 0.7f, 0.1f});
  kiln_blob *lab = blob_of("label", 1, SHAPE(3), (const float[]){1, 1, 0});
  kiln_blob *b[2] = {x, lab};
  built f = build("name: 'f1' type: 'F1'", TEST, b, 2, 3);
  forward(&f);
  const float want[3] = {1, 0, 1};
  for (int t = 0; t < 3; t++) expect_close("N x C", f.top[t]->data, &want[t], 1, 0);
  unbuild(&f);
  kiln_blob_free(lab);
  kiln_blob_free(x);
}

static void test_f1_bad_parameters(void **state) {
  (void)state;
  kiln_blob *x = blob_of("x", 3, SHAPE(3, 2, 3), f1_x);
  kiln_blob *lab = blob_of("label", 2, SHAPE(3, 2), f1_tags);
  kiln_blob *b[2] = {x, lab};
  const char *who = "layer 'f' (F1)";
  expect_create_fails("name: 'f' type: 'F1' f1_param { axis: 2 positive_label: 3 }", TEST, b, 2,
                      3, KILN_ERR_INVALID, who, "positive_label 3");
  /* classes on axis 1 of T x N x C: 3 x 3 predictions for 6 labels */
  expect_create_fails("name: 'f' type: 'F1'", TEST, b, 2, 3, KILN_ERR_SHAPE, who,
                      "label count 6 does not match prediction count 9");
  /* a padding tag without ignore_label is no class */
  built f = build("name: 'f' type: 'F1' f1_param { axis: 2 }", TEST, b, 2, 3);
  kiln_clear_error();
  assert_int_equal(layer_forward(f.l), KILN_ERR_DATA);
  expect_message(who, "label -1 at position 4 is out of range", NULL);
  unbuild(&f);
  kiln_blob_free(lab);
  kiln_blob_free(x);
}

/* ---- a loss without a top ---------------------------------------------------------------- */

/* Caffe gives a loss layer that names no top one of its own (AutoTopBlobs, "(automatic)"):
 * the same net with and without named tops has the same outputs, with the same loss weights
 * (1, or the loss_weight given), and two such tops stay apart. */
static void test_loss_without_top_gets_one(void **state) {
  (void)state;
  const char *head = "layer { name: 'in' type: 'Input' top: 'x' top: 'y' top: 'z' input_param {\n"
                     "  shape { dim: 4 dim: 3 } shape { dim: 4 } shape { dim: 4 dim: 3 } } }\n";
  char named[1024], unnamed[1024];
  snprintf(named, sizeof named,
           "%slayer { name: 'sm' type: 'SoftmaxWithLoss' bottom: 'x' bottom: 'y' top: 'a' }\n"
           "layer { name: 'l2' type: 'EuclideanLoss' bottom: 'x' bottom: 'z' top: 'b'\n"
           "  loss_weight: 0.5 }\n",
           head);
  snprintf(unnamed, sizeof unnamed,
           "%slayer { name: 'sm' type: 'SoftmaxWithLoss' bottom: 'x' bottom: 'y' }\n"
           "layer { name: 'l2' type: 'EuclideanLoss' bottom: 'x' bottom: 'z' loss_weight: 0.5 }\n",
           head);
  Caffe__NetParameter *npa, *npb;
  kiln_net *a = net_run(named, &npa), *b = net_run(unnamed, &npb);
  assert_int_equal(b->noutputs, 2);
  const char *want[2] = {"sm (automatic)", "l2 (automatic)"}, *had[2] = {"a", "b"};
  for (int o = 0; o < 2; o++) {
    kiln_blob *got = kiln_net_blob(b, want[o]), *ref = kiln_net_blob(a, had[o]);
    assert_non_null(got);
    assert_non_null(ref);
    assert_string_equal(b->outputs[o]->name, want[o]);
    assert_true(b->output_loss_weight[o] == (o == 0 ? 1.0f : 0.5f));
    assert_true(got->data[0] > 0 && got->data[0] == ref->data[0]);
  }
  kiln_net_free(a);
  kiln_net_free(b);
  protobuf_c_message_free_unpacked(&npa->base, NULL);
  protobuf_c_message_free_unpacked(&npb->base, NULL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_softmax_forward_hand),
      cmocka_unit_test(test_softmax_gradients),
      cmocka_unit_test(test_softmax_loss_forward_hand),
      cmocka_unit_test(test_softmax_loss_backward_hand),
      cmocka_unit_test(test_softmax_loss_gradients),
      cmocka_unit_test(test_softmax_loss_bad_labels),
      cmocka_unit_test(test_accuracy_hand),
      cmocka_unit_test(test_accuracy_ties_count_against),
      cmocka_unit_test(test_accuracy_per_class_many_classes),
      cmocka_unit_test(test_accuracy_bad_parameters),
      cmocka_unit_test(test_f1_counts_hand),
      cmocka_unit_test(test_f1_bad_parameters),
      cmocka_unit_test(test_argmax_hand),
      cmocka_unit_test(test_argmax_axis_hand),
      cmocka_unit_test(test_argmax_bad_parameters),
      cmocka_unit_test(test_euclidean_hand),
      cmocka_unit_test(test_euclidean_gradients),
      cmocka_unit_test(test_euclidean_bad_shapes),
      cmocka_unit_test(test_sigmoid_ce_hand),
      cmocka_unit_test(test_sigmoid_ce_stable),
      cmocka_unit_test(test_sigmoid_ce_gradients),
      cmocka_unit_test(test_sigmoid_ce_errors),
      cmocka_unit_test(test_loss_without_top_gets_one),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
