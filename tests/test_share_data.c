/* Activation data shared by lifetime (kiln_net_options.share_data): a blob whose data no
 * backward reads gives its memory to later blobs once its last reader in forward has run.
 *
 * The nets here run every layer that describes what its backward reads
 * (kiln_layer_ops.backward_reads), fused and unfused, blocked and plain. With shared data they
 * must give the losses, parameter gradients and BatchNorm statistics of the same nets with
 * every blob's own data, bit for bit, over three SGD steps, even when every shared buffer is
 * overwritten with NaN between forward and backward (so a layer that reads in backward what it
 * says it does not fails here). A TEST net built so runs forward only, with its layers' buffers
 * shared too, and gives the same outputs. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gradcheck.h"
#include "kiln/net.h"

/* A bottleneck block with a projection shortcut and an identity block, as ResNet-50 has them,
 * then max pooling; Normalize (SSD's), Permute to channels last and back, LRN, Scale out of
 * place, Sigmoid and TanH joined by Eltwise MAX and PROD (both gradients), Concat, average
 * pooling, Flatten, Dropout, InnerProduct, Reshape, ReLU and Softmax out of place, and a loss
 * with Accuracy and F1 on labels passed through a Reshape. */
static const char *net_text =
    "name: 'shared'\n"
    "layer { name: 'in' type: 'Input' top: 'data' top: 'label'\n"
    "  input_param { shape { dim: 4 dim: 3 dim: 8 dim: 8 } shape { dim: 4 } } }\n"
#define CONV(name, bottom, top, n, k, pad)                                                     \
  "layer { name: '" name "' type: 'Convolution' bottom: '" bottom "' top: '" top "'\n"         \
  "  convolution_param { num_output: " #n " kernel_size: " #k " pad: " #pad                    \
  " bias_term: false weight_filler { type: 'msra' } } }\n"
#define BN_SCALE(name, blob)                                                                   \
  "layer { name: 'bn_" name "' type: 'BatchNorm' bottom: '" blob "' top: '" blob "' }\n"       \
  "layer { name: 'sc_" name "' type: 'Scale' bottom: '" blob "' top: '" blob "'\n"             \
  "  scale_param { bias_term: true filler { type: 'uniform' min: 0.5 max: 1.5 }\n"             \
  "    bias_filler { type: 'uniform' min: -0.3 max: 0.3 } } }\n"
#define RELU(name, blob) \
  "layer { name: '" name "' type: 'ReLU' bottom: '" blob "' top: '" blob "' }\n"
    CONV("c0", "data", "c0", 32, 3, 1) BN_SCALE("c0", "c0") RELU("r0", "c0")
    "layer { name: 'p0' type: 'Pooling' bottom: 'c0' top: 'p0'\n"
    "  pooling_param { pool: MAX kernel_size: 3 stride: 2 pad: 1 } }\n"
    CONV("b1", "p0", "b1", 32, 1, 0) BN_SCALE("b1", "b1")
    CONV("b2a", "p0", "b2a", 16, 1, 0) BN_SCALE("b2a", "b2a") RELU("r2a", "b2a")
    CONV("b2b", "b2a", "b2b", 16, 3, 1) BN_SCALE("b2b", "b2b") RELU("r2b", "b2b")
    CONV("b2c", "b2b", "b2c", 32, 1, 0) BN_SCALE("b2c", "b2c")
    "layer { name: 's1' type: 'Eltwise' bottom: 'b1' bottom: 'b2c' top: 's1' }\n"
    RELU("rs1", "s1")
    CONV("c3", "s1", "c3", 32, 3, 1) BN_SCALE("c3", "c3")
    "layer { name: 's2' type: 'Eltwise' bottom: 's1' bottom: 'c3' top: 's2' }\n"
    RELU("rs2", "s2")
    "layer { name: 'ps' type: 'Pooling' bottom: 's2' top: 'ps'\n"
    "  pooling_param { pool: MAX kernel_size: 2 stride: 2 } }\n"
    "layer { name: 'nz' type: 'Normalize' bottom: 'ps' top: 'nz'\n"
    "  norm_param { across_spatial: false channel_shared: false\n"
    "    scale_filler { type: 'uniform' min: 1 max: 3 } } }\n"
    "layer { name: 'pm' type: 'Permute' bottom: 'nz' top: 'pm'\n"
    "  permute_param { order: 0 order: 2 order: 3 order: 1 } }\n"
    "layer { name: 'pb' type: 'Permute' bottom: 'pm' top: 'pb' permute_param { order: 0 order: 3 } }\n"
    "layer { name: 'lrn' type: 'LRN' bottom: 'pb' top: 'n' lrn_param { local_size: 3 } }\n"
    "layer { name: 'sc' type: 'Scale' bottom: 'n' top: 'ns' scale_param { bias_term: true\n"
    "  filler { type: 'uniform' min: 0.5 max: 1.5 } } }\n"
    "layer { name: 'sg' type: 'Sigmoid' bottom: 'ns' top: 'sg' }\n"
    "layer { name: 'th' type: 'TanH' bottom: 'n' top: 'th' }\n"
    "layer { name: 'pr' type: 'Eltwise' bottom: 'sg' bottom: 'th' top: 'pr'\n"
    "  eltwise_param { operation: PROD } }\n"
    "layer { name: 'mx' type: 'Eltwise' bottom: 'sg' bottom: 'th' top: 'mx'\n"
    "  eltwise_param { operation: MAX } }\n"
    "layer { name: 'pr2' type: 'Eltwise' bottom: 'sg' bottom: 'mx' top: 'pr2'\n"
    "  eltwise_param { operation: PROD stable_prod_grad: false } }\n"
    "layer { name: 'cat' type: 'Concat' bottom: 'pr' bottom: 'mx' bottom: 'pr2' top: 'cat' }\n"
    "layer { name: 'pa' type: 'Pooling' bottom: 'cat' top: 'pa'\n"
    "  pooling_param { pool: AVE kernel_size: 2 stride: 2 } }\n"
    "layer { name: 'fl' type: 'Flatten' bottom: 'pa' top: 'fl' }\n"
    "layer { name: 'dr' type: 'Dropout' bottom: 'fl' top: 'fl'\n"
    "  dropout_param { dropout_ratio: 0.25 } }\n"
    "layer { name: 'ip1' type: 'InnerProduct' bottom: 'fl' top: 'ip1'\n"
    "  inner_product_param { num_output: 10 weight_filler { type: 'xavier' } } }\n"
    "layer { name: 'rs' type: 'Reshape' bottom: 'ip1' top: 'rs'\n"
    "  reshape_param { shape { dim: 0 dim: 2 dim: 5 } } }\n"
    "layer { name: 'rr' type: 'ReLU' bottom: 'rs' top: 'rr' relu_param { negative_slope: 0.1 } }\n"
    "layer { name: 'sm' type: 'Softmax' bottom: 'rr' top: 'sm' softmax_param { axis: 2 } }\n"
    "layer { name: 'sf' type: 'Flatten' bottom: 'sm' top: 'sf' }\n"
    "layer { name: 'ip2' type: 'InnerProduct' bottom: 'sf' top: 'ip2'\n"
    "  inner_product_param { num_output: 5 weight_filler { type: 'xavier' } } }\n"
    "layer { name: 'lab' type: 'Reshape' bottom: 'label' top: 'lab'\n"
    "  reshape_param { shape { dim: -1 } } }\n"
    "layer { name: 'acc' type: 'Accuracy' bottom: 'ip2' bottom: 'lab' top: 'acc' }\n"
    "layer { name: 'f1' type: 'F1' bottom: 'ip2' bottom: 'lab' top: 'tp' top: 'fp' top: 'fn' }\n"
    "layer { name: 'loss' type: 'SoftmaxWithLoss' bottom: 'ip2' bottom: 'lab' top: 'loss' }\n";
#undef CONV
#undef BN_SCALE
#undef RELU

typedef struct {
  Caffe__NetParameter *np;
  kiln_net *net;
} built;

static void build(built *b, const char *text, int phase, bool share_data, const kiln_config *cfg) {
  memset(b, 0, sizeof *b);
  assert_int_equal(kiln_net_param_from_text(text, "<test>", &b->np), KILN_OK);
  kiln_net_options o = {0};
  o.phase = phase;
  o.seed = 11;
  o.nthreads = 2;
  o.config = cfg;
  o.share_diffs = phase == CAFFE__PHASE__TRAIN;
  o.share_data = share_data;
  int rc = kiln_net_create(b->np, &o, &b->net);
  if (rc) fprintf(stderr, "build: %s\n", kiln_last_error());
  assert_int_equal(rc, KILN_OK);
}

static void built_free(built *b) {
  kiln_net_free(b->net);
  protobuf_c_message_free_unpacked(&b->np->base, NULL);
}

static kiln_blob *blob(kiln_net *net, const char *name) {
  kiln_blob *b = kiln_net_blob(net, name);
  if (!b) fail_msg("no blob '%s'", name);
  return b;
}

static void set_inputs(kiln_net *a, kiln_net *b, uint32_t seed) {
  kiln_blob *da = blob(a, "data"), *db = blob(b, "data");
  kiln_blob *la = blob(a, "label"), *lb = blob(b, "label");
  for (int64_t k = 0; k < da->count; k++) {
    seed = seed * 1664525u + 1013904223u;
    da->data[k] = db->data[k] = (float)(seed >> 8) / 16777216.0f * 2.0f - 1.0f;
  }
  for (int64_t k = 0; k < la->count; k++) la->data[k] = lb->data[k] = (float)((k * 3 + seed) % 5);
}

/* Three SGD steps on `own` (every blob its own data) and `sh` (shared data, spoiled after each
 * forward): the same loss, accuracy, gradients and parameters, bit for bit. */
static void check_steps(kiln_net *own, kiln_net *sh) {
  const size_t bytes = sizeof(float) * (size_t)own->nparam_floats;
  assert_int_equal(own->nparam_floats, sh->nparam_floats);
  assert_memory_equal(own->param_data, sh->param_data, bytes);
  for (int step = 0; step < 3; step++) {
    set_inputs(own, sh, 1000u + (uint32_t)step);
    float lo, ls;
    kiln_net_zero_param_diff(own);
    kiln_net_zero_param_diff(sh);
    assert_int_equal(kiln_net_forward(own, &lo), KILN_OK);
    assert_int_equal(kiln_net_forward(sh, &ls), KILN_OK);
    assert_true(isfinite(lo));
    assert_memory_equal(&lo, &ls, sizeof lo);
    assert_memory_equal(blob(own, "acc")->data, blob(sh, "acc")->data, sizeof(float));
    assert_true(kiln_test_spoil_shared_data(sh) >= 8);
    assert_int_equal(kiln_net_backward(own), KILN_OK);
    assert_int_equal(kiln_net_backward(sh), KILN_OK);
    double norm = 0;
    for (int64_t i = 0; i < own->nparam_floats; i++) norm += fabs(own->param_diff[i]);
    assert_true(norm > 0);
    if (memcmp(own->param_diff, sh->param_diff, bytes) != 0)
      fail_msg("step %d: parameter gradients differ with shared data", step);
    if (memcmp(own->param_data, sh->param_data, bytes) != 0) /* BatchNorm's statistics */
      fail_msg("step %d: BatchNorm statistics differ with shared data", step);
    for (int64_t i = 0; i < own->nparam_floats; i++) {
      own->param_data[i] -= 0.05f * own->param_diff[i];
      sh->param_data[i] -= 0.05f * sh->param_diff[i];
    }
  }
}

/* The TEST nets, forward only with shared data and buffers or with their own, on the trained
 * parameters: the same outputs, bit for bit, pass after pass. */
static void check_test_nets(kiln_net *trained, const kiln_config *cfg) {
  built own, sh;
  build(&own, net_text, CAFFE__PHASE__TEST, false, cfg);
  build(&sh, net_text, CAFFE__PHASE__TEST, true, cfg);
  assert_false(own.net->forward_only);
  assert_true(sh.net->forward_only);
  assert_int_equal(kiln_net_share_params(own.net, trained), KILN_OK);
  assert_int_equal(kiln_net_share_params(sh.net, trained), KILN_OK);
  /* forward only: no gradients, every layer buffer (BatchNorm's copies, the loss's
   * probabilities, LRN's scale) in the shared buffers */
  assert_int_equal(sh.net->memory.buffers, 0);
  assert_true(own.net->memory.buffers > 0);
  assert_true(sh.net->memory.activations < own.net->memory.activations);
  for (int pass = 0; pass < 2; pass++) {
    set_inputs(own.net, sh.net, 77u + (uint32_t)pass);
    float lo, ls;
    assert_int_equal(kiln_net_forward(own.net, &lo), KILN_OK);
    assert_int_equal(kiln_net_forward(sh.net, &ls), KILN_OK);
    assert_true(isfinite(lo));
    assert_memory_equal(&lo, &ls, sizeof lo);
    for (int k = 0; k < 4; k++) {
      const char *out = (const char *[]){"acc", "tp", "fp", "fn"}[k];
      assert_memory_equal(blob(own.net, out)->data, blob(sh.net, out)->data, sizeof(float));
    }
  }
  assert_int_equal(kiln_net_backward(sh.net), KILN_ERR_INVALID);
  assert_non_null(strstr(kiln_last_error(), "forward only"));
  built_free(&own);
  built_free(&sh);
}

static void check_config(const kiln_config *cfg) {
  built own, sh;
  build(&own, net_text, CAFFE__PHASE__TRAIN, false, cfg);
  build(&sh, net_text, CAFFE__PHASE__TRAIN, true, cfg);
  for (int i = 0; i < own.net->nblobs; i++) assert_false(kiln_test_data_shared(own.net->blobs[i]));
  /* Shared: what no backward reads. The projection and the last convolution of each block
   * (Scale in place reads BatchNorm's copy, the sum reads nothing), Scale's output (Sigmoid
   * reads its own), the stable PROD's output (Concat reads nothing), Concat's
   * (average pooling), the pooling's (Flatten), the classifier's (Reshape), the out-of-place
   * ReLU's output (Softmax reads its own) and the scores (the loss reads the labels). */
  const char *yes[] = {"b1", "b2c", "c3", "ns", "pr", "cat", "pa", "ip1", "rr", "ip2"};
  /* Kept: what a backward reads (a convolution's or classifier's input, an in-place ReLU's
   * output, the second sum for its ReLU's mask, fused or not, LRN's input, the out-of-place
   * Scale's input, PROD's inputs (MAX's output among them) and the other PROD's output (its
   * gradient divides it, sigmoid's and MAX's being positive), an out-of-place ReLU's input,
   * Softmax's output, the loss's labels), what a data layer fills, and the outputs. */
  const char *no[] = {"data", "label", "p0", "b2a", "b2b", "s1",  "s2",  "ps",   "n",  "sg",
                      "th",   "mx",    "pr2", "fl", "rs",  "sm",  "sf",  "lab", "acc", "loss"};
  for (size_t i = 0; i < sizeof yes / sizeof *yes; i++)
    if (!kiln_test_data_shared(blob(sh.net, yes[i])))
      fail_msg("blob '%s' keeps its own data", yes[i]);
  for (size_t i = 0; i < sizeof no / sizeof *no; i++)
    if (kiln_test_data_shared(blob(sh.net, no[i]))) fail_msg("blob '%s' shares its data", no[i]);
  /* The first convolution's output, read by max pooling (which keeps its winners): fused,
   * BatchNorm's backward takes ReLU's mask from its own copy, so nothing reads it in backward;
   * unfused, the ReLU in place reads its output. */
  assert_true(kiln_test_data_shared(blob(sh.net, "c0")) == !cfg->unfused);
  assert_true(sh.net->memory.activations < own.net->memory.activations);
  check_steps(own.net, sh.net);
  check_test_nets(own.net, cfg);
  built_free(&own);
  built_free(&sh);
}

static void test_shared_data_matches_own(void **state) {
  (void)state;
  check_config(kiln_test_config());
}

static void test_shared_data_matches_own_unfused_plain(void **state) {
  (void)state;
  kiln_config c = *kiln_test_config();
  c.unfused = true;
  c.plain_layouts = true;
  check_config(&c);
}

/* KILN_SHARE_DATA=0 (kiln_config.no_share_data) keeps every blob's own data, and the TEST net
 * may then run backward. */
static void test_switch_off(void **state) {
  (void)state;
  kiln_config c = *kiln_test_config();
  c.no_share_data = true;
  built t, x;
  build(&t, net_text, CAFFE__PHASE__TRAIN, true, &c);
  build(&x, net_text, CAFFE__PHASE__TEST, true, &c);
  for (int i = 0; i < t.net->nblobs; i++) assert_false(kiln_test_data_shared(t.net->blobs[i]));
  for (int i = 0; i < x.net->nblobs; i++) assert_false(kiln_test_data_shared(x.net->blobs[i]));
  assert_false(x.net->forward_only);
  built_free(&t);
  built_free(&x);
}

/* A layer that does not describe its backward's reads (Slice) keeps every blob it touches; and a
 * net built with shared data refuses the extra backward passes of kiln time. */
static void test_undescribed_layer_keeps_its_blobs(void **state) {
  (void)state;
  const char *text =
      "name: 'slice'\n"
      "layer { name: 'in' type: 'Input' top: 'data' top: 'label'\n"
      "  input_param { shape { dim: 4 dim: 6 } shape { dim: 4 } } }\n"
      "layer { name: 'ip0' type: 'InnerProduct' bottom: 'data' top: 'ip0'\n"
      "  inner_product_param { num_output: 8 weight_filler { type: 'xavier' } } }\n"
      "layer { name: 'sig' type: 'Sigmoid' bottom: 'ip0' top: 'sig' }\n"
      "layer { name: 'sl' type: 'Slice' bottom: 'sig' top: 'a' top: 'b'\n"
      "  slice_param { axis: 1 slice_point: 4 } }\n"
      "layer { name: 'sum' type: 'Eltwise' bottom: 'a' bottom: 'b' top: 'sum' }\n"
      "layer { name: 'ip1' type: 'InnerProduct' bottom: 'sum' top: 'ip1'\n"
      "  inner_product_param { num_output: 3 weight_filler { type: 'xavier' } } }\n"
      "layer { name: 'loss' type: 'SoftmaxWithLoss' bottom: 'ip1' bottom: 'label' top: 'loss' }\n";
  built b;
  build(&b, text, CAFFE__PHASE__TRAIN, true, kiln_test_config());
  /* ip0 dies after Sigmoid in forward (Sigmoid reads its output), so it shares; Slice's bottom
   * and tops keep theirs; the sum (read by nothing in backward) shares again */
  assert_true(kiln_test_data_shared(blob(b.net, "ip0")));
  assert_false(kiln_test_data_shared(blob(b.net, "sig")));
  assert_false(kiln_test_data_shared(blob(b.net, "a")));
  assert_false(kiln_test_data_shared(blob(b.net, "b")));
  assert_false(kiln_test_data_shared(blob(b.net, "sum"))); /* read by ip1's backward */
  assert_true(kiln_test_data_shared(blob(b.net, "ip1")));
  assert_int_equal(kiln_net_need_backward_everywhere(b.net), KILN_ERR_INVALID);
  built_free(&b);
}

/* The SSD fork's MultiBoxLoss computes its gradient in forward and reads no activation in
 * backward: in a small SSD head its loc and conf inputs (Flatten's outputs) share their data,
 * and training with those spoiled between forward and backward gives the losses and gradients of
 * the same net with every blob's own data, bit for bit. */
static void test_multibox_loss_shares_its_inputs(void **state) {
  (void)state;
  const char *text =
      "name: 'ssd'\n"
      "layer { name: 'in' type: 'Input' top: 'data' top: 'label'\n"
      "  input_param { shape { dim: 2 dim: 3 dim: 8 dim: 8 } shape { dim: 1 dim: 1 dim: 2 dim: 8 } } }\n"
      "layer { name: 'c1' type: 'Convolution' bottom: 'data' top: 'c1'\n"
      "  convolution_param { num_output: 8 kernel_size: 3 pad: 1 stride: 2\n"
      "    weight_filler { type: 'msra' } } }\n"
      "layer { name: 'r1' type: 'ReLU' bottom: 'c1' top: 'c1' }\n"
      "layer { name: 'loc' type: 'Convolution' bottom: 'c1' top: 'loc'\n"
      "  convolution_param { num_output: 8 kernel_size: 3 pad: 1\n"
      "    weight_filler { type: 'gaussian' std: 0.1 } } }\n"
      "layer { name: 'loc_perm' type: 'Permute' bottom: 'loc' top: 'loc_perm'\n"
      "  permute_param { order: 0 order: 2 order: 3 order: 1 } }\n"
      "layer { name: 'loc_flat' type: 'Flatten' bottom: 'loc_perm' top: 'loc_flat' }\n"
      "layer { name: 'conf' type: 'Convolution' bottom: 'c1' top: 'conf'\n"
      "  convolution_param { num_output: 6 kernel_size: 3 pad: 1\n"
      "    weight_filler { type: 'gaussian' std: 0.1 } } }\n"
      "layer { name: 'conf_perm' type: 'Permute' bottom: 'conf' top: 'conf_perm'\n"
      "  permute_param { order: 0 order: 2 order: 3 order: 1 } }\n"
      "layer { name: 'conf_flat' type: 'Flatten' bottom: 'conf_perm' top: 'conf_flat' }\n"
      "layer { name: 'pb' type: 'PriorBox' bottom: 'c1' bottom: 'data' top: 'pb'\n"
      "  prior_box_param { min_size: 3 max_size: 6 variance: 0.1 variance: 0.1 variance: 0.2\n"
      "    variance: 0.2 } }\n"
      "layer { name: 'loss' type: 'MultiBoxLoss' bottom: 'loc_flat' bottom: 'conf_flat'\n"
      "  bottom: 'pb' bottom: 'label' top: 'loss' propagate_down: true propagate_down: true\n"
      "  propagate_down: false propagate_down: false\n"
      "  multibox_loss_param { num_classes: 3 code_type: CENTER_SIZE } }\n";
  static const float gt[16] = {0, 1, 0, .1f, .1f, .6f, .5f, 0, 1, 2, 0, .4f, .3f, .9f, .9f, 0};
  built own, sh;
  build(&own, text, CAFFE__PHASE__TRAIN, false, kiln_test_config());
  build(&sh, text, CAFFE__PHASE__TRAIN, true, kiln_test_config());
  assert_true(kiln_test_data_shared(blob(sh.net, "loc_flat")));
  assert_true(kiln_test_data_shared(blob(sh.net, "conf_flat")));
  const size_t bytes = sizeof(float) * (size_t)own.net->nparam_floats;
  assert_memory_equal(own.net->param_data, sh.net->param_data, bytes);
  for (int step = 0; step < 3; step++) {
    kiln_blob *da = blob(own.net, "data"), *db = blob(sh.net, "data");
    uint32_t seed = 500u + (uint32_t)step;
    for (int64_t k = 0; k < da->count; k++) {
      seed = seed * 1664525u + 1013904223u;
      da->data[k] = db->data[k] = (float)(seed >> 8) / 16777216.0f * 2.0f - 1.0f;
    }
    memcpy(blob(own.net, "label")->data, gt, sizeof gt);
    memcpy(blob(sh.net, "label")->data, gt, sizeof gt);
    float lo, ls;
    kiln_net_zero_param_diff(own.net);
    kiln_net_zero_param_diff(sh.net);
    assert_int_equal(kiln_net_forward(own.net, &lo), KILN_OK);
    assert_int_equal(kiln_net_forward(sh.net, &ls), KILN_OK);
    assert_true(isfinite(lo) && lo > 0);
    assert_memory_equal(&lo, &ls, sizeof lo);
    assert_true(kiln_test_spoil_shared_data(sh.net) >= 2);
    assert_int_equal(kiln_net_backward(own.net), KILN_OK);
    assert_int_equal(kiln_net_backward(sh.net), KILN_OK);
    double norm = 0;
    for (int64_t i = 0; i < own.net->nparam_floats; i++) norm += fabs(own.net->param_diff[i]);
    assert_true(norm > 0);
    if (memcmp(own.net->param_diff, sh.net->param_diff, bytes) != 0)
      fail_msg("step %d: parameter gradients differ with shared data", step);
    for (int64_t i = 0; i < own.net->nparam_floats; i++) {
      own.net->param_data[i] -= 0.05f * own.net->param_diff[i];
      sh.net->param_data[i] -= 0.05f * sh.net->param_diff[i];
    }
  }
  built_free(&own);
  built_free(&sh);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_shared_data_matches_own),
      cmocka_unit_test(test_shared_data_matches_own_unfused_plain),
      cmocka_unit_test(test_switch_off),
      cmocka_unit_test(test_undescribed_layer_keeps_its_blobs),
      cmocka_unit_test(test_multibox_loss_shares_its_inputs),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
