/* Text-format parser: real Caffe nets and solvers, the corners of the syntax, the exact wording and
 * location of error messages, and a fuzz loop that must never crash (it also runs under ASan). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kiln/proto.h"

#define NET_DESC (&caffe__net_parameter__descriptor)
#define SOLVER_DESC (&caffe__solver_parameter__descriptor)

static const char LENET[] =
    "name: \"LeNet\"\n"
    "layer {\n"
    "  name: \"mnist\"\n"
    "  type: \"Data\"\n"
    "  top: \"data\"\n"
    "  top: \"label\"\n"
    "  include {\n"
    "    phase: TRAIN\n"
    "  }\n"
    "  transform_param {\n"
    "    scale: 0.00390625\n"
    "  }\n"
    "  data_param {\n"
    "    source: \"examples/mnist/mnist_train_lmdb\"\n"
    "    batch_size: 64\n"
    "    backend: LMDB\n"
    "  }\n"
    "}\n"
    "layer {\n"
    "  name: \"mnist\"\n"
    "  type: \"Data\"\n"
    "  top: \"data\"\n"
    "  top: \"label\"\n"
    "  include {\n"
    "    phase: TEST\n"
    "  }\n"
    "  transform_param {\n"
    "    scale: 0.00390625\n"
    "  }\n"
    "  data_param {\n"
    "    source: \"examples/mnist/mnist_test_lmdb\"\n"
    "    batch_size: 100\n"
    "    backend: LMDB\n"
    "  }\n"
    "}\n"
    "layer {\n"
    "  name: \"conv1\"\n"
    "  type: \"Convolution\"\n"
    "  bottom: \"data\"\n"
    "  top: \"conv1\"\n"
    "  param {\n"
    "    lr_mult: 1\n"
    "  }\n"
    "  param {\n"
    "    lr_mult: 2\n"
    "  }\n"
    "  convolution_param {\n"
    "    num_output: 20\n"
    "    kernel_size: 5\n"
    "    stride: 1\n"
    "    weight_filler {\n"
    "      type: \"xavier\"\n"
    "    }\n"
    "    bias_filler {\n"
    "      type: \"constant\"\n"
    "    }\n"
    "  }\n"
    "}\n"
    "layer {\n"
    "  name: \"pool1\"\n"
    "  type: \"Pooling\"\n"
    "  bottom: \"conv1\"\n"
    "  top: \"pool1\"\n"
    "  pooling_param {\n"
    "    pool: MAX\n"
    "    kernel_size: 2\n"
    "    stride: 2\n"
    "  }\n"
    "}\n"
    "layer {\n"
    "  name: \"conv2\"\n"
    "  type: \"Convolution\"\n"
    "  bottom: \"pool1\"\n"
    "  top: \"conv2\"\n"
    "  param {\n"
    "    lr_mult: 1\n"
    "  }\n"
    "  param {\n"
    "    lr_mult: 2\n"
    "  }\n"
    "  convolution_param {\n"
    "    num_output: 50\n"
    "    kernel_size: 5\n"
    "    stride: 1\n"
    "    weight_filler {\n"
    "      type: \"xavier\"\n"
    "    }\n"
    "    bias_filler {\n"
    "      type: \"constant\"\n"
    "    }\n"
    "  }\n"
    "}\n"
    "layer {\n"
    "  name: \"pool2\"\n"
    "  type: \"Pooling\"\n"
    "  bottom: \"conv2\"\n"
    "  top: \"pool2\"\n"
    "  pooling_param {\n"
    "    pool: MAX\n"
    "    kernel_size: 2\n"
    "    stride: 2\n"
    "  }\n"
    "}\n"
    "layer {\n"
    "  name: \"ip1\"\n"
    "  type: \"InnerProduct\"\n"
    "  bottom: \"pool2\"\n"
    "  top: \"ip1\"\n"
    "  param {\n"
    "    lr_mult: 1\n"
    "  }\n"
    "  param {\n"
    "    lr_mult: 2\n"
    "  }\n"
    "  inner_product_param {\n"
    "    num_output: 500\n"
    "    weight_filler {\n"
    "      type: \"xavier\"\n"
    "    }\n"
    "    bias_filler {\n"
    "      type: \"constant\"\n"
    "    }\n"
    "  }\n"
    "}\n"
    "layer {\n"
    "  name: \"relu1\"\n"
    "  type: \"ReLU\"\n"
    "  bottom: \"ip1\"\n"
    "  top: \"ip1\"\n"
    "}\n"
    "layer {\n"
    "  name: \"ip2\"\n"
    "  type: \"InnerProduct\"\n"
    "  bottom: \"ip1\"\n"
    "  top: \"ip2\"\n"
    "  param {\n"
    "    lr_mult: 1\n"
    "  }\n"
    "  param {\n"
    "    lr_mult: 2\n"
    "  }\n"
    "  inner_product_param {\n"
    "    num_output: 10\n"
    "    weight_filler {\n"
    "      type: \"xavier\"\n"
    "    }\n"
    "    bias_filler {\n"
    "      type: \"constant\"\n"
    "    }\n"
    "  }\n"
    "}\n"
    "layer {\n"
    "  name: \"accuracy\"\n"
    "  type: \"Accuracy\"\n"
    "  bottom: \"ip2\"\n"
    "  bottom: \"label\"\n"
    "  top: \"accuracy\"\n"
    "  include {\n"
    "    phase: TEST\n"
    "  }\n"
    "}\n"
    "layer {\n"
    "  name: \"loss\"\n"
    "  type: \"SoftmaxWithLoss\"\n"
    "  bottom: \"ip2\"\n"
    "  bottom: \"label\"\n"
    "  top: \"loss\"\n"
    "}\n";

static const char LENET_SOLVER[] =
    "# The train/test net protocol buffer definition\n"
    "net: \"examples/mnist/lenet_train_test.prototxt\"\n"
    "test_iter: 100\n"
    "test_interval: 500\n"
    "# The base learning rate, momentum and the weight decay of the network.\n"
    "base_lr: 0.01\n"
    "momentum: 0.9\n"
    "weight_decay: 0.0005\n"
    "# The learning rate policy\n"
    "lr_policy: \"inv\"\n"
    "gamma: 0.0001\n"
    "power: 0.75\n"
    "display: 100\n"
    "max_iter: 10000\n"
    "stepvalue: 5000\n"
    "stepvalue: 7000\n"
    "stepvalue: 9000\n"
    "snapshot: 5000\n"
    "snapshot_prefix: \"examples/mnist/lenet\"\n"
    "solver_mode: CPU\n"
    "random_seed: 7\n";

static ProtobufCMessage *parse_ok(const char *text, const ProtobufCMessageDescriptor *d) {
  ProtobufCMessage *m = NULL;
  int rc = kiln_text_parse(text, strlen(text), "t.prototxt", d, &m);
  if (rc != KILN_OK) fail_msg("unexpected parse error: %s", kiln_last_error());
  assert_non_null(m);
  return m;
}

static void expect_error_len(const char *text, size_t len, const ProtobufCMessageDescriptor *d,
                             const char *want) {
  ProtobufCMessage *m = (ProtobufCMessage *)&m; /* must be reset to NULL */
  int rc = kiln_text_parse(text, len, "t.prototxt", d, &m);
  assert_int_equal(rc, KILN_ERR_PARSE);
  assert_null(m);
  assert_string_equal(kiln_last_error(), want);
}

static void expect_error(const char *text, const ProtobufCMessageDescriptor *d, const char *want) {
  expect_error_len(text, strlen(text), d, want);
}

static void assert_strings(char **got, size_t n, const char *a, const char *b) {
  assert_int_equal(n, b ? 2 : 1);
  assert_string_equal(got[0], a);
  if (b) assert_string_equal(got[1], b);
}

/* ---- real files ------------------------------------------------------------------------- */

static void test_lenet_train_val(void **state) {
  (void)state;
  Caffe__NetParameter *net = (Caffe__NetParameter *)parse_ok(LENET, NET_DESC);
  assert_string_equal(net->name, "LeNet");
  assert_int_equal(net->n_layer, 11);

  Caffe__LayerParameter *data = net->layer[0];
  assert_string_equal(data->name, "mnist");
  assert_string_equal(data->type, "Data");
  assert_strings(data->top, data->n_top, "data", "label");
  assert_int_equal(data->n_bottom, 0);
  assert_int_equal(data->n_include, 1);
  assert_true(data->include[0]->has_phase);
  assert_int_equal(data->include[0]->phase, CAFFE__PHASE__TRAIN);
  assert_true(data->transform_param->has_scale);
  assert_true(data->transform_param->scale == 0.00390625f);
  assert_false(data->transform_param->has_mirror);
  assert_int_equal(data->data_param->n_source, 1);
  assert_string_equal(data->data_param->source[0], "examples/mnist/mnist_train_lmdb");
  assert_int_equal(data->data_param->batch_size, 64);
  assert_int_equal(data->data_param->backend, CAFFE__DATA_PARAMETER__DB__LMDB);
  assert_int_equal(data->data_param->prefetch, 4); /* schema default kept */

  Caffe__LayerParameter *test_data = net->layer[1];
  assert_int_equal(test_data->include[0]->phase, CAFFE__PHASE__TEST);
  assert_int_equal(test_data->data_param->batch_size, 100);

  Caffe__LayerParameter *conv1 = net->layer[2];
  assert_string_equal(conv1->type, "Convolution");
  assert_strings(conv1->bottom, conv1->n_bottom, "data", NULL);
  assert_int_equal(conv1->n_param, 2);
  assert_true(conv1->param[0]->lr_mult == 1.0f);
  assert_true(conv1->param[1]->lr_mult == 2.0f);
  assert_false(conv1->param[1]->has_decay_mult);
  assert_true(conv1->param[1]->decay_mult == 1.0f);
  Caffe__ConvolutionParameter *cp = conv1->convolution_param;
  assert_int_equal(cp->num_output, 20);
  assert_int_equal(cp->n_kernel_size, 1);
  assert_int_equal(cp->kernel_size[0], 5);
  assert_int_equal(cp->n_stride, 1);
  assert_int_equal(cp->stride[0], 1);
  assert_int_equal(cp->n_pad, 0);
  assert_true(cp->bias_term); /* default true */
  assert_string_equal(cp->weight_filler->type, "xavier");
  assert_string_equal(cp->bias_filler->type, "constant");
  assert_true(cp->weight_filler->std == 1.0f);
  assert_null(conv1->pooling_param);

  Caffe__PoolingParameter *pp = net->layer[3]->pooling_param;
  assert_int_equal(pp->pool, CAFFE__POOLING_PARAMETER__POOL_METHOD__MAX);
  assert_int_equal(pp->kernel_size, 2);
  assert_int_equal(pp->stride, 2);
  assert_int_equal(net->layer[4]->convolution_param->num_output, 50);
  assert_int_equal(net->layer[6]->inner_product_param->num_output, 500);

  Caffe__LayerParameter *relu = net->layer[7];
  assert_string_equal(relu->type, "ReLU");
  assert_strings(relu->bottom, relu->n_bottom, "ip1", NULL);
  assert_strings(relu->top, relu->n_top, "ip1", NULL);

  assert_int_equal(net->layer[8]->inner_product_param->num_output, 10);
  assert_int_equal(net->layer[9]->include[0]->phase, CAFFE__PHASE__TEST);
  Caffe__LayerParameter *loss = net->layer[10];
  assert_string_equal(loss->type, "SoftmaxWithLoss");
  assert_strings(loss->bottom, loss->n_bottom, "ip2", "label");
  assert_int_equal(loss->n_include, 0);
  protobuf_c_message_free_unpacked(&net->base, NULL);
}

static void test_lenet_solver(void **state) {
  (void)state;
  Caffe__SolverParameter *s = (Caffe__SolverParameter *)parse_ok(LENET_SOLVER, SOLVER_DESC);
  assert_string_equal(s->net, "examples/mnist/lenet_train_test.prototxt");
  assert_int_equal(s->n_test_iter, 1);
  assert_int_equal(s->test_iter[0], 100);
  assert_int_equal(s->test_interval, 500);
  assert_true(s->has_base_lr);
  assert_true(s->base_lr == 0.01f);
  assert_true(s->momentum == 0.9f);
  assert_true(s->weight_decay == 0.0005f);
  assert_string_equal(s->lr_policy, "inv");
  assert_true(s->gamma == 0.0001f);
  assert_true(s->power == 0.75f);
  assert_int_equal(s->display, 100);
  assert_int_equal(s->max_iter, 10000);
  assert_int_equal(s->n_stepvalue, 3);
  assert_int_equal(s->stepvalue[0], 5000);
  assert_int_equal(s->stepvalue[1], 7000);
  assert_int_equal(s->stepvalue[2], 9000);
  assert_int_equal(s->snapshot, 5000);
  assert_string_equal(s->snapshot_prefix, "examples/mnist/lenet");
  assert_true(s->has_solver_mode);
  assert_int_equal(s->solver_mode, CAFFE__SOLVER_PARAMETER__SOLVER_MODE__CPU);
  assert_true(s->has_random_seed);
  assert_int_equal(s->random_seed, 7);
  /* Untouched fields keep the schema's defaults. */
  assert_string_equal(s->type, "SGD");
  assert_string_equal(s->regularization_type, "L2");
  assert_true(s->momentum2 == 0.999f);
  assert_false(s->has_momentum2);
  protobuf_c_message_free_unpacked(&s->base, NULL);
}

static void test_input_layer_and_deploy_header(void **state) {
  (void)state;
  Caffe__NetParameter *net = (Caffe__NetParameter *)parse_ok(
      "layer { name: \"data\" type: \"Input\" top: \"data\" input_param { shape: { dim: 10 dim: 3 "
      "dim: 32 dim: 32 } } }",
      NET_DESC);
  assert_int_equal(net->n_layer, 1);
  Caffe__InputParameter *ip = net->layer[0]->input_param;
  assert_int_equal(ip->n_shape, 1);
  assert_int_equal(ip->shape[0]->n_dim, 4);
  assert_int_equal(ip->shape[0]->dim[0], 10);
  assert_int_equal(ip->shape[0]->dim[1], 3);
  assert_int_equal(ip->shape[0]->dim[3], 32);
  protobuf_c_message_free_unpacked(&net->base, NULL);

  net = (Caffe__NetParameter *)parse_ok("name: \"LeNet\"\ninput: \"data\"\ninput_dim: 1\n"
                                        "input_dim: 3\ninput_dim: 28\ninput_dim: 28\n",
                                        NET_DESC);
  assert_strings(net->input, net->n_input, "data", NULL);
  assert_int_equal(net->n_input_dim, 4);
  assert_int_equal(net->input_dim[0], 1);
  assert_int_equal(net->input_dim[1], 3);
  assert_int_equal(net->input_dim[2], 28);
  protobuf_c_message_free_unpacked(&net->base, NULL);
}

/* ---- syntax ----------------------------------------------------------------------------- */

static void test_whitespace_comments_quotes(void **state) {
  (void)state;
  const char *text = "\xEF\xBB\xBF# leading comment\r\n"
                     "name:\t'tab\\tbed'   # trailing comment\r\n"
                     "layer {\tname: 'say \"hi\"' type: \"Re\" 'LU' 'x'\"y\"\r\n"
                     "\t\tbottom: \"a\", top: \"b\"; }\r\n"
                     "layer < name: \"\\101\\x41\\u00e9\\U0001F600\\uD83D\\uDE00\\'\\\"\\\\\\n\" >\r\n"
                     "#";
  Caffe__NetParameter *net = (Caffe__NetParameter *)parse_ok(text, NET_DESC);
  assert_string_equal(net->name, "tab\tbed");
  assert_int_equal(net->n_layer, 2);
  assert_string_equal(net->layer[0]->name, "say \"hi\"");
  assert_string_equal(net->layer[0]->type, "ReLUxy");
  assert_strings(net->layer[0]->bottom, net->layer[0]->n_bottom, "a", NULL);
  assert_strings(net->layer[0]->top, net->layer[0]->n_top, "b", NULL);
  assert_string_equal(net->layer[1]->name,
                      "AA\xC3\xA9\xF0\x9F\x98\x80\xF0\x9F\x98\x80'\"\\\n");
  protobuf_c_message_free_unpacked(&net->base, NULL);
}

static void test_numbers(void **state) {
  (void)state;
  Caffe__SolverParameter *s = (Caffe__SolverParameter *)parse_ok(
      "base_lr: 1e-6 momentum: .999 weight_decay: 5e-05 gamma: -2.5 power: 1.0f\n"
      "delta: inf clip_gradients: -Infinity momentum2: nan rms_decay: 2E+2\n"
      "max_iter: 0x10 display: 010 device_id: -2147483648 test_interval: 2147483647\n"
      "random_seed: -9223372036854775808 iter_size: -0\n"
      "stepvalue: [1, 2, 0x3] stepvalue: 4 stepvalue: [] test_iter: [-7]",
      SOLVER_DESC);
  assert_true(s->base_lr == (float)1e-6);
  assert_true(s->momentum == (float).999);
  assert_true(s->weight_decay == (float)5e-05);
  assert_true(s->gamma == -2.5f);
  assert_true(s->power == 1.0f);
  assert_true(isinf(s->delta) && s->delta > 0);
  assert_true(isinf(s->clip_gradients) && s->clip_gradients < 0);
  assert_true(isnan(s->momentum2) && s->has_momentum2);
  assert_true(s->rms_decay == 200.0f);
  assert_int_equal(s->max_iter, 16);
  assert_int_equal(s->display, 8); /* leading zero: octal, as protobuf reads it */
  assert_int_equal(s->device_id, INT32_MIN);
  assert_int_equal(s->test_interval, INT32_MAX);
  assert_true(s->random_seed == INT64_MIN);
  assert_int_equal(s->iter_size, 0);
  assert_int_equal(s->n_stepvalue, 4);
  for (int i = 0; i < 4; i++) assert_int_equal(s->stepvalue[i], i + 1);
  assert_int_equal(s->n_test_iter, 1);
  assert_int_equal(s->test_iter[0], -7);
  protobuf_c_message_free_unpacked(&s->base, NULL);

  /* Integers into float fields, huge values into float (infinity, as protobuf does). */
  s = (Caffe__SolverParameter *)parse_ok(
      "base_lr: 3 clip_gradients: 1. momentum: 0x20 gamma: 1e39 power: -1e39 delta: 123456789012345678901234567890 "
      "weight_decay: 0.000000000000000000000000000000000000000000000000001",
      SOLVER_DESC);
  assert_true(s->base_lr == 3.0f);
  assert_true(s->clip_gradients == 1.0f);
  assert_true(s->momentum == 32.0f);
  assert_true(isinf(s->gamma) && s->gamma > 0);
  assert_true(isinf(s->power) && s->power < 0);
  assert_true(s->delta == (float)1.2345678901234568e29);
  assert_true(s->weight_decay == 0.0f);
  protobuf_c_message_free_unpacked(&s->base, NULL);

  /* 64-bit unsigned limits and bytes with escapes. */
  Caffe__SolverState *st = (Caffe__SolverState *)parse_ok(
      "kiln_data_cursor: 18446744073709551615 kiln_data_cursor: [0, 0xFFFFFFFFFFFFFFFF]\n"
      "kiln_rng_state: \"\\x00\\001\\xff\" 'ab' kiln_loss_history: [1.5, -2]",
      &caffe__solver_state__descriptor);
  assert_int_equal(st->n_kiln_data_cursor, 3);
  assert_true(st->kiln_data_cursor[0] == UINT64_MAX);
  assert_true(st->kiln_data_cursor[1] == 0);
  assert_true(st->kiln_data_cursor[2] == UINT64_MAX);
  assert_true(st->has_kiln_rng_state);
  assert_int_equal(st->kiln_rng_state.len, 5);
  assert_memory_equal(st->kiln_rng_state.data, "\x00\x01\xff" "ab", 5);
  assert_int_equal(st->n_kiln_loss_history, 2);
  assert_true(st->kiln_loss_history[1] == -2.0f);
  protobuf_c_message_free_unpacked(&st->base, NULL);
}

static void test_bools_enums_and_repeats(void **state) {
  (void)state;
  Caffe__SolverParameter *s = (Caffe__SolverParameter *)parse_ok(
      "test_compute_loss: True snapshot_diff: t debug_info: 1 test_initialization: False\n"
      "snapshot_after_train: f layer_wise_reduce: 0 solver_mode: 1 snapshot_format: HDF5\n"
      "base_lr: 0.1 base_lr: 0.2 type: \"Adam\" type: \"Nesterov\" lr_policy: 'a' lr_policy: 'b'\n"
      "train_state < phase: TRAIN level: 2 stage: 'x' stage: 'y' >\n"
      "test_state { phase: TEST } test_state: { level: 3 }\n"
      "net_param { layer { name: 'a' } } net_param { layer { name: 'b' } name: 'n' }",
      SOLVER_DESC);
  assert_true(s->test_compute_loss && s->has_test_compute_loss);
  assert_true(s->snapshot_diff);
  assert_true(s->debug_info);
  assert_false(s->test_initialization);
  assert_true(s->has_test_initialization);
  assert_false(s->snapshot_after_train);
  assert_false(s->layer_wise_reduce);
  assert_int_equal(s->solver_mode, CAFFE__SOLVER_PARAMETER__SOLVER_MODE__GPU);
  assert_int_equal(s->snapshot_format, CAFFE__SOLVER_PARAMETER__SNAPSHOT_FORMAT__HDF5);
  assert_true(s->has_snapshot_format);
  assert_true(s->base_lr == 0.2f); /* the last value wins */
  assert_string_equal(s->type, "Nesterov");
  assert_string_equal(s->lr_policy, "b");
  assert_int_equal(s->train_state->phase, CAFFE__PHASE__TRAIN);
  assert_int_equal(s->train_state->level, 2);
  assert_strings(s->train_state->stage, s->train_state->n_stage, "x", "y");
  assert_int_equal(s->n_test_state, 2);
  assert_int_equal(s->test_state[0]->phase, CAFFE__PHASE__TEST);
  assert_int_equal(s->test_state[1]->level, 3);
  /* A singular message given twice merges; its repeated fields append. */
  assert_string_equal(s->net_param->name, "n");
  assert_int_equal(s->net_param->n_layer, 2);
  assert_string_equal(s->net_param->layer[1]->name, "b");
  protobuf_c_message_free_unpacked(&s->base, NULL);

  Caffe__NetParameter *net = (Caffe__NetParameter *)parse_ok(
      "layer { transform_param { scale: 0.5 } transform_param { mirror: true }\n"
      "  convolution_param { weight_filler { type: 'xavier' type: 'gaussian' std: 0.01 }\n"
      "                      bias_filler { type: 'constant', value: 0.2 } }\n"
      "  input_param { shape: [ { dim: 1 }, < dim: 2 dim: 3 > ] } }",
      NET_DESC);
  Caffe__LayerParameter *l = net->layer[0];
  assert_true(l->transform_param->scale == 0.5f);
  assert_true(l->transform_param->mirror);
  assert_string_equal(l->convolution_param->weight_filler->type, "gaussian");
  assert_true(l->convolution_param->weight_filler->std == 0.01f);
  assert_true(l->convolution_param->bias_filler->value == 0.2f);
  assert_int_equal(l->input_param->n_shape, 2);
  assert_int_equal(l->input_param->shape[1]->n_dim, 2);
  assert_int_equal(l->input_param->shape[1]->dim[1], 3);
  protobuf_c_message_free_unpacked(&net->base, NULL);
}

static void test_long_repeated_field(void **state) {
  (void)state;
  size_t n = 5000, cap = n * 12 + 1, len = 0;
  char *text = malloc(cap);
  for (size_t i = 0; i < n; i++) len += (size_t)snprintf(text + len, cap - len, "dim: %zu\n", i);
  Caffe__BlobShape *b =
      (Caffe__BlobShape *)parse_ok(text, &caffe__blob_shape__descriptor);
  assert_int_equal(b->n_dim, n);
  for (size_t i = 0; i < n; i++) assert_int_equal(b->dim[i], (int64_t)i);
  protobuf_c_message_free_unpacked(&b->base, NULL);
  free(text);
}

static void test_empty_input(void **state) {
  (void)state;
  const char *empties[] = {"", "   \n\t\r\n", "# only a comment", "\xEF\xBB\xBF"};
  for (size_t i = 0; i < sizeof empties / sizeof empties[0]; i++) {
    Caffe__NetParameter *net = (Caffe__NetParameter *)parse_ok(empties[i], NET_DESC);
    assert_null(net->name);
    assert_int_equal(net->n_layer, 0);
    protobuf_c_message_free_unpacked(&net->base, NULL);
  }
  ProtobufCMessage *m = NULL;
  assert_int_equal(kiln_text_parse(NULL, 0, NULL, NET_DESC, &m), KILN_OK);
  assert_non_null(m);
  protobuf_c_message_free_unpacked(m, NULL);
}

/* ---- errors ----------------------------------------------------------------------------- */

static void test_error_unknown_field(void **state) {
  (void)state;
  expect_error("name: \"LeNet\"\n"
               "layer {\n"
               "  name: \"mnist\"\n"
               "  type: \"Data\"\n"
               "  top: \"data\"\n"
               "  top: \"label\"\n"
               "  data_param { source: \"x\" batch_size: 64 }\n"
               "}\n"
               "layer {\n"
               "  name: \"conv1\"\n"
               "  type: \"Convolution\"\n"
               "  bottom: \"data\"\n"
               "  convolution_param {\n"
               "    num_ouput: 20\n"
               "  }\n"
               "}\n",
               NET_DESC,
               "t.prototxt:14:5: unknown field 'num_ouput' in ConvolutionParameter (did you mean "
               "'num_output'?)");
  expect_error("lr_polcy: \"inv\"", SOLVER_DESC,
               "t.prototxt:1:1: unknown field 'lr_polcy' in SolverParameter (did you mean "
               "'lr_policy'?)");
  expect_error("layer { zzzzzzzzzz: 1 }", NET_DESC,
               "t.prototxt:1:9: unknown field 'zzzzzzzzzz' in LayerParameter");
  /* Caffe's V1 layers parse (and are upgraded on load, src/proto/upgrade.c), with their own
   * field names in the messages. */
  expect_error("name: \"x\"\nlayers { blob_lr: 1 }", NET_DESC,
               "t.prototxt:2:10: unknown field 'blob_lr' in V1LayerParameter (did you mean "
               "'blobs_lr'?)");
  /* Nested in a solver, the net is still a NetParameter. */
  expect_error("net_param {\n  layers { type: RELU blobs_lr: x }\n}", SOLVER_DESC,
               "t.prototxt:2:33: field 'blobs_lr' in V1LayerParameter expects a number (float), "
               "got 'x'");
}

static void test_error_wrong_type(void **state) {
  (void)state;
  expect_error("layer { convolution_param { num_output: \"20\" } }", NET_DESC,
               "t.prototxt:1:41: field 'num_output' in ConvolutionParameter expects a "
               "non-negative integer (uint32), got string \"20\"");
  expect_error("layer { convolution_param { num_output: 2.5 } }", NET_DESC,
               "t.prototxt:1:41: field 'num_output' in ConvolutionParameter expects a "
               "non-negative integer (uint32), got number 2.5");
  expect_error("layer { name { } }", NET_DESC,
               "t.prototxt:1:14: field 'name' in LayerParameter is a string, not a message: "
               "write 'name: VALUE'");
  expect_error("layer { convolution_param { weight_filler: 3 } }", NET_DESC,
               "t.prototxt:1:44: field 'weight_filler' in ConvolutionParameter is a message "
               "(FillerParameter): expected '{', got number 3");
  expect_error("layer { type: CONVOLUTION }", NET_DESC,
               "t.prototxt:1:15: field 'type' in LayerParameter expects a quoted string, got "
               "'CONVOLUTION'");
  expect_error("base_lr: {", SOLVER_DESC,
               "t.prototxt:1:10: field 'base_lr' in SolverParameter expects a number (float), "
               "got '{'");
  expect_error("debug_info: 2", SOLVER_DESC,
               "t.prototxt:1:13: field 'debug_info' in SolverParameter expects true or false, "
               "got number 2");
  expect_error("base_lr 0.1", SOLVER_DESC,
               "t.prototxt:1:9: expected ':' after field name 'base_lr' in SolverParameter, got "
               "number 0.1");
  expect_error("base_lr: [1]", SOLVER_DESC,
               "t.prototxt:1:10: field 'base_lr' in SolverParameter is not repeated: the list "
               "syntax [...] needs a repeated field");
  expect_error("stepvalue: [1 2]", SOLVER_DESC,
               "t.prototxt:1:15: expected ',' or ']' in the list for field 'stepvalue' in "
               "SolverParameter, got number 2");
  expect_error("max_iter:", SOLVER_DESC,
               "t.prototxt:1:10: field 'max_iter' in SolverParameter expects an integer (int32), "
               "got end of file");
  expect_error(": 3", NET_DESC, "t.prototxt:1:1: expected a field name of NetParameter, got ':'");
  expect_error("name: \"a\" 12", NET_DESC,
               "t.prototxt:1:11: expected a field name of NetParameter, got number 12");
}

static void test_error_enum(void **state) {
  (void)state;
  expect_error("layer { data_param { backend: LMBD } }", NET_DESC,
               "t.prototxt:1:31: unknown value 'LMBD' for field 'backend' in DataParameter "
               "(valid values: LEVELDB, LMDB)");
  expect_error("layer { data_param { backend: 7 } }", NET_DESC,
               "t.prototxt:1:31: unknown value '7' for field 'backend' in DataParameter (valid "
               "values: LEVELDB, LMDB)");
  expect_error("layer { data_param { backend: \"LMDB\" } }", NET_DESC,
               "t.prototxt:1:31: field 'backend' in DataParameter expects one of LEVELDB, LMDB, "
               "got string \"LMDB\"");
}

static void test_error_ranges(void **state) {
  (void)state;
  expect_error("layer { convolution_param { num_output: 4294967296 } }", NET_DESC,
               "t.prototxt:1:41: value 4294967296 is out of range for field 'num_output' "
               "(uint32) in ConvolutionParameter");
  expect_error("layer { convolution_param { num_output: -1 } }", NET_DESC,
               "t.prototxt:1:41: value -1 is out of range for field 'num_output' (uint32) in "
               "ConvolutionParameter: it cannot be negative");
  expect_error("max_iter: 2147483648", SOLVER_DESC,
               "t.prototxt:1:11: value 2147483648 is out of range for field 'max_iter' (int32) "
               "in SolverParameter");
  expect_error("max_iter: -2147483649", SOLVER_DESC,
               "t.prototxt:1:11: value -2147483649 is out of range for field 'max_iter' (int32) "
               "in SolverParameter");
  expect_error("random_seed: 9223372036854775808", SOLVER_DESC,
               "t.prototxt:1:14: value 9223372036854775808 is out of range for field "
               "'random_seed' (int64) in SolverParameter");
  expect_error("kiln_data_cursor: 18446744073709551616", &caffe__solver_state__descriptor,
               "t.prototxt:1:19: value 18446744073709551616 is out of range for field "
               "'kiln_data_cursor' (uint64) in SolverState");
  expect_error("base_lr: 0x10000000000000000", SOLVER_DESC,
               "t.prototxt:1:10: value 0x10000000000000000 is out of range for field 'base_lr' "
               "(float) in SolverParameter");
}

static void test_error_lexical(void **state) {
  (void)state;
  expect_error("name: \"LeNet\nlayer {}", NET_DESC,
               "t.prototxt:1:7: unterminated string (no closing \" on this line)");
  expect_error("layer {\n  name: 'abc\\'\n}", NET_DESC,
               "t.prototxt:2:9: unterminated string (no closing ' on this line)");
  expect_error("name: \"abc\\", NET_DESC,
               "t.prototxt:1:7: unterminated string (no closing \" on this line)");
  expect_error("layer {\n  name: \"a\"\n", NET_DESC,
               "t.prototxt:3:1: unexpected end of file: missing '}' to close LayerParameter "
               "opened at 1:7");
  expect_error("layer { convolution_param { weight_filler <", NET_DESC,
               "t.prototxt:1:44: unexpected end of file: missing '>' to close FillerParameter "
               "opened at 1:43");
  expect_error("name: \"x\" }", NET_DESC,
               "t.prototxt:1:11: unexpected '}' with no open message to close");
  expect_error("layer < name: \"a\" }", NET_DESC,
               "t.prototxt:1:19: expected '>' to close LayerParameter opened at 1:7, got '}'");
  expect_error("net: \"a\\qb\"", SOLVER_DESC, "t.prototxt:1:8: invalid escape '\\q' in string");
  expect_error("net: \"\\xZ\"", SOLVER_DESC,
               "t.prototxt:1:7: escape '\\x' without hex digits in string");
  expect_error("net: \"\\400\"", SOLVER_DESC,
               "t.prototxt:1:7: octal escape above \\377 in string");
  expect_error("net: \"\\uD800\"", SOLVER_DESC,
               "t.prototxt:1:7: escape '\\u' is not a valid Unicode code point");
  expect_error("net: \"\\u12\"", SOLVER_DESC, "t.prototxt:1:7: escape '\\u' needs 4 hex digits");
  expect_error("net: \"a\\0b\"", SOLVER_DESC,
               "t.prototxt:1:6: string for field 'net' in SolverParameter contains a NUL "
               "character");
  expect_error_len("name: \"x\"\0 layer {}", 19, NET_DESC,
                   "t.prototxt:1:10: unexpected byte 0x00");
  expect_error("name: \"x\" @", NET_DESC, "t.prototxt:1:11: unexpected character '@'");
  expect_error("base_lr: 1e", SOLVER_DESC,
               "t.prototxt:1:10: invalid number: exponent without digits");
  expect_error("max_iter: 09", SOLVER_DESC,
               "t.prototxt:1:11: invalid octal number '09' (a leading 0 means octal)");
  expect_error("max_iter: 12abc", SOLVER_DESC,
               "t.prototxt:1:13: unexpected character 'a' after a number");
  expect_error("max_iter: 0x", SOLVER_DESC,
               "t.prototxt:1:11: invalid number: '0x' without hex digits");
  expect_error("\r\n\tbase_lr: 'x'", SOLVER_DESC,
               "t.prototxt:2:11: field 'base_lr' in SolverParameter expects a number (float), "
               "got string 'x'");
  /* The byte-order mark is not a column. */
  expect_error("\xEF\xBB\xBF}", NET_DESC,
               "t.prototxt:1:1: unexpected '}' with no open message to close");
}

/* ---- files ------------------------------------------------------------------------------ */

static void test_parse_file(void **state) {
  (void)state;
  char path[] = "/tmp/kiln_textformat_XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  assert_int_equal(write(fd, LENET_SOLVER, strlen(LENET_SOLVER)), (ssize_t)strlen(LENET_SOLVER));
  close(fd);
  ProtobufCMessage *m = NULL;
  assert_int_equal(kiln_text_parse_file(path, SOLVER_DESC, &m), KILN_OK);
  assert_int_equal(((Caffe__SolverParameter *)m)->random_seed, 7);
  protobuf_c_message_free_unpacked(m, NULL);

  /* The same file read as a net: the error names the file, line and column. */
  m = (ProtobufCMessage *)&m;
  assert_int_equal(kiln_text_parse_file(path, NET_DESC, &m), KILN_ERR_PARSE);
  assert_null(m);
  char want[256];
  snprintf(want, sizeof want, "%s:2:1: unknown field 'net' in NetParameter", path);
  assert_string_equal(kiln_last_error(), want);
  unlink(path);

  m = (ProtobufCMessage *)&m;
  assert_int_equal(kiln_text_parse_file("/nonexistent/kiln/lenet.prototxt", NET_DESC, &m),
                   KILN_ERR_IO);
  assert_null(m);
  assert_non_null(strstr(kiln_last_error(), "/nonexistent/kiln/lenet.prototxt"));
}

/* ---- a hand-written descriptor: recursion, oneof, required ------------------------------ */

/* message Node { optional Node child = 1; optional int32 v = 2; required string tag = 3;
 *                oneof pick { string word = 4; int32 num = 5; Node sub = 6; } } */
typedef struct Node {
  ProtobufCMessage base;
  struct Node *child;
  protobuf_c_boolean has_v;
  int32_t v;
  char *tag;
  uint32_t pick_case;
  union {
    char *word;
    int32_t num;
    struct Node *sub;
  };
} Node;

static const ProtobufCMessageDescriptor node_descriptor;

static void node_init(ProtobufCMessage *m) {
  memset(m, 0, sizeof(Node));
  m->descriptor = &node_descriptor;
}

static const ProtobufCFieldDescriptor node_fields[6] = {
    {"child", 1, PROTOBUF_C_LABEL_OPTIONAL, PROTOBUF_C_TYPE_MESSAGE, 0, offsetof(Node, child),
     &node_descriptor, NULL, 0, 0, NULL, NULL},
    {"v", 2, PROTOBUF_C_LABEL_OPTIONAL, PROTOBUF_C_TYPE_INT32, offsetof(Node, has_v),
     offsetof(Node, v), NULL, NULL, 0, 0, NULL, NULL},
    {"tag", 3, PROTOBUF_C_LABEL_REQUIRED, PROTOBUF_C_TYPE_STRING, 0, offsetof(Node, tag), NULL,
     NULL, 0, 0, NULL, NULL},
    {"word", 4, PROTOBUF_C_LABEL_OPTIONAL, PROTOBUF_C_TYPE_STRING, offsetof(Node, pick_case),
     offsetof(Node, word), NULL, NULL, PROTOBUF_C_FIELD_FLAG_ONEOF, 0, NULL, NULL},
    {"num", 5, PROTOBUF_C_LABEL_OPTIONAL, PROTOBUF_C_TYPE_INT32, offsetof(Node, pick_case),
     offsetof(Node, num), NULL, NULL, PROTOBUF_C_FIELD_FLAG_ONEOF, 0, NULL, NULL},
    {"sub", 6, PROTOBUF_C_LABEL_OPTIONAL, PROTOBUF_C_TYPE_MESSAGE, offsetof(Node, pick_case),
     offsetof(Node, sub), &node_descriptor, NULL, PROTOBUF_C_FIELD_FLAG_ONEOF, 0, NULL, NULL},
};
static const unsigned node_by_name[6] = {0, 4, 5, 2, 1, 3}; /* child num sub tag v word */
static const ProtobufCIntRange node_ranges[2] = {{1, 0}, {0, 6}};
static const ProtobufCMessageDescriptor node_descriptor = {
    PROTOBUF_C__MESSAGE_DESCRIPTOR_MAGIC, "test.Node", "Node", "Test__Node", "test", sizeof(Node),
    6, node_fields, node_by_name, 1, node_ranges, node_init, NULL, NULL, NULL};

static char *nested(int depth) {
  size_t cap = (size_t)depth * 24 + 64, len = 0;
  char *t = malloc(cap);
  len += (size_t)snprintf(t + len, cap - len, "tag: 'r'");
  for (int i = 0; i < depth; i++) len += (size_t)snprintf(t + len, cap - len, " child { tag: 'c'");
  for (int i = 0; i < depth; i++) len += (size_t)snprintf(t + len, cap - len, " }");
  return t;
}

static void test_nesting_limit(void **state) {
  (void)state;
  char *t = nested(100);
  Node *n = (Node *)parse_ok(t, &node_descriptor);
  int depth = 0;
  for (Node *c = n->child; c; c = c->child) depth++;
  assert_int_equal(depth, 100);
  protobuf_c_message_free_unpacked(&n->base, NULL);
  free(t);

  t = nested(101);
  ProtobufCMessage *m = NULL;
  assert_int_equal(kiln_text_parse(t, strlen(t), "deep", &node_descriptor, &m), KILN_ERR_PARSE);
  assert_non_null(strstr(kiln_last_error(), "messages nested more than 100 levels deep"));
  free(t);

  /* A million open braces must fail fast, not overflow the stack. */
  size_t len = 7000000;
  t = malloc(len);
  for (size_t i = 0; i < len; i += 7) memcpy(t + i, "child {", 7);
  assert_int_equal(kiln_text_parse(t, len, "deep", &node_descriptor, &m), KILN_ERR_PARSE);
  assert_string_equal(kiln_last_error(), "deep:1:707: messages nested more than 100 levels deep");
  free(t);
}

static void test_oneof_and_required(void **state) {
  (void)state;
  Node *n = (Node *)parse_ok("tag: 'a' word: 'w' num: 3", &node_descriptor);
  assert_int_equal(n->pick_case, 5);
  assert_int_equal(n->num, 3);
  protobuf_c_message_free_unpacked(&n->base, NULL);

  n = (Node *)parse_ok("tag: 'a' sub { tag: 'b' word: 'x' } word: 'y' word: 'z'", &node_descriptor);
  assert_int_equal(n->pick_case, 4);
  assert_string_equal(n->word, "z");
  protobuf_c_message_free_unpacked(&n->base, NULL);

  n = (Node *)parse_ok("tag: 'a' sub { tag: 'b' } sub { v: 2 }", &node_descriptor);
  assert_int_equal(n->pick_case, 6);
  assert_string_equal(n->sub->tag, "b");
  assert_int_equal(n->sub->v, 2);
  protobuf_c_message_free_unpacked(&n->base, NULL);

  ProtobufCMessage *m = NULL;
  assert_int_equal(kiln_text_parse("v: 1", 4, "n.txt", &node_descriptor, &m), KILN_ERR_PARSE);
  assert_null(m);
  assert_string_equal(kiln_last_error(), "n.txt: missing required field 'tag' in Node");
  const char *t = "tag: 'a' child { v: 1 }";
  assert_int_equal(kiln_text_parse(t, strlen(t), "n.txt", &node_descriptor, &m), KILN_ERR_PARSE);
  assert_string_equal(kiln_last_error(), "n.txt: missing required field 'tag' in Node");
}

/* ---- fuzz ------------------------------------------------------------------------------- */

static uint32_t fuzz_next(uint64_t *s) {
  *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
  return (uint32_t)(*s >> 33);
}

static void test_fuzz_mutations(void **state) {
  (void)state;
  static const char *const inserts[] = {"{", "}", "\"", "'", "<", ">", "[", "]", ":", ",",
                                        "#", "\\", "-", "0x", "\n", "\0", "layer {", "1e",
                                        "\\u", "inf", "99999999999999999999"};
  const size_t n_inserts = sizeof inserts / sizeof inserts[0];
  size_t base_len = strlen(LENET), cap = base_len + 4096;
  char *buf = malloc(cap);
  uint64_t seed = 12345;
  int ok = 0, failed = 0;
  for (int iter = 0; iter < 20000; iter++) {
    memcpy(buf, LENET, base_len);
    size_t len = base_len;
    int edits = 1 + (int)(fuzz_next(&seed) % 6);
    for (int e = 0; e < edits && len > 0; e++) {
      size_t at = fuzz_next(&seed) % len;
      switch (fuzz_next(&seed) % 4) {
      case 0: buf[at] = (char)fuzz_next(&seed); break; /* any byte, NUL included */
      case 1: buf[at] ^= (char)(1u << (fuzz_next(&seed) % 8)); break;
      case 2: len = at; break;
      default: {
        const char *ins = inserts[fuzz_next(&seed) % n_inserts];
        size_t il = ins[0] ? strlen(ins) : 1;
        if (len + il > cap) break;
        memmove(buf + at + il, buf + at, len - at);
        memcpy(buf + at, ins, il);
        len += il;
      }
      }
    }
    /* An exact-size copy, so ASan sees any read past the end of the text. */
    char *text = malloc(len ? len : 1);
    memcpy(text, buf, len);
    ProtobufCMessage *m = NULL;
    const ProtobufCMessageDescriptor *d = iter % 5 == 4 ? SOLVER_DESC : NET_DESC;
    int rc = kiln_text_parse(text, len, "fuzz.prototxt", d, &m);
    if (rc == KILN_OK) {
      assert_non_null(m);
      protobuf_c_message_free_unpacked(m, NULL);
      ok++;
    } else {
      assert_int_equal(rc, KILN_ERR_PARSE);
      assert_null(m);
      assert_true(strncmp(kiln_last_error(), "fuzz.prototxt:", 14) == 0);
      failed++;
    }
    free(text);
  }
  free(buf);
  /* Both outcomes must occur, or the mutations are not exercising anything. */
  assert_true(ok > 100);
  assert_true(failed > 100);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_lenet_train_val),
      cmocka_unit_test(test_lenet_solver),
      cmocka_unit_test(test_input_layer_and_deploy_header),
      cmocka_unit_test(test_whitespace_comments_quotes),
      cmocka_unit_test(test_numbers),
      cmocka_unit_test(test_bools_enums_and_repeats),
      cmocka_unit_test(test_long_repeated_field),
      cmocka_unit_test(test_empty_input),
      cmocka_unit_test(test_error_unknown_field),
      cmocka_unit_test(test_error_wrong_type),
      cmocka_unit_test(test_error_enum),
      cmocka_unit_test(test_error_ranges),
      cmocka_unit_test(test_error_lexical),
      cmocka_unit_test(test_parse_file),
      cmocka_unit_test(test_nesting_limit),
      cmocka_unit_test(test_oneof_and_required),
      cmocka_unit_test(test_fuzz_mutations),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
