/* Net construction semantics (Caffe's Net::Init): phase / level / stage rules, in-place layers,
 * blob wiring errors, Split insertion for fan-out (checked against finite differences of the net
 * loss), loss weights, ParamSpec multipliers and sharing, which layers run backward, deploy
 * headers, the memory plan, .caffemodel round trips, and the figures derived from a test pass.
 * Every check looks at the built kiln_net, not at log output. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "files.h"
#include "kiln/net.h"
#include "kiln/ops.h"
#include "gradcheck.h"

/* ---- helpers ------------------------------------------------------------------------------ */

typedef struct built {
  Caffe__NetParameter *np;
  kiln_net *net;
  int rc;
  char err[2048];
} built;

static kiln_net_options train_opts(void) {
  kiln_net_options o = {0};
  o.phase = CAFFE__PHASE__TRAIN;
  o.seed = 1;
  o.nthreads = 1;
  o.config = kiln_test_config();
  return o;
}

/* Parses and builds; the parse must succeed, the build may fail (rc and err say how). */
static void try_build(built *b, const char *text, const kiln_net_options *opt) {
  memset(b, 0, sizeof *b);
  int prc = kiln_net_param_from_text(text, "<test>", &b->np);
  if (prc) fprintf(stderr, "parse: %s\n", kiln_last_error());
  assert_int_equal(prc, KILN_OK);
  kiln_net_options d = train_opts();
  b->rc = kiln_net_create(b->np, opt ? opt : &d, &b->net);
  snprintf(b->err, sizeof b->err, "%s", b->rc ? kiln_last_error() : "");
  if (b->rc) assert_null(b->net);
}

static void build_ok(built *b, const char *text, const kiln_net_options *opt) {
  try_build(b, text, opt);
  if (b->rc) fprintf(stderr, "build failed: %s\n", b->err);
  assert_int_equal(b->rc, KILN_OK);
  assert_non_null(b->net);
}

static void build_fails(built *b, const char *text, const kiln_net_options *opt, int code) {
  try_build(b, text, opt);
  if (b->rc != code)
    fprintf(stderr, "expected %s, got %s: %s\n", kiln_status_name(code), kiln_status_name(b->rc),
            b->err);
  assert_int_equal(b->rc, code);
  assert_true(strlen(b->err) > 0);
}

static void built_free(built *b) {
  kiln_net_free(b->net);
  if (b->np) protobuf_c_message_free_unpacked(&b->np->base, NULL);
  memset(b, 0, sizeof *b);
}

static void assert_contains(const char *hay, const char *needle) {
  if (!strstr(hay, needle)) fprintf(stderr, "'%s' does not contain '%s'\n", hay, needle);
  assert_non_null(strstr(hay, needle));
}

/* The build fails with `code` and an error message holding every one of the NULL-terminated
 * fragments. */
static void expect_build_error(const char *text, const kiln_net_options *opt, int code, ...) {
  built b;
  build_fails(&b, text, opt, code);
  va_list ap;
  va_start(ap, code);
  for (const char *s; (s = va_arg(ap, const char *));) assert_contains(b.err, s);
  va_end(ap);
  built_free(&b);
}

static int layer_index(const kiln_net *net, const char *name) {
  for (int i = 0; i < net->nlayers; i++)
    if (strcmp(net->layers[i]->name, name) == 0) return i;
  return -1;
}

static kiln_layer *must_layer(const kiln_net *net, const char *name) {
  kiln_layer *l = kiln_net_layer(net, name);
  if (!l) fprintf(stderr, "no layer '%s'\n", name);
  assert_non_null(l);
  return l;
}

static int count_type(const kiln_net *net, const char *type) {
  int n = 0;
  for (int i = 0; i < net->nlayers; i++) n += strcmp(net->layers[i]->ops->type, type) == 0;
  return n;
}

static void fill_uniform(float *x, int64_t n, uint64_t seed, float lo, float hi) {
  kiln_rng r;
  kiln_rng_seed(&r, seed, 7);
  for (int64_t i = 0; i < n; i++) x[i] = kiln_rng_uniform(&r, lo, hi);
}

static void set_inputs(kiln_net *net, uint64_t seed) {
  kiln_blob *data = kiln_net_blob(net, "data"), *label = kiln_net_blob(net, "label");
  assert_non_null(data);
  fill_uniform(data->data, data->count, seed, -1.5f, 1.5f);
  if (label)
    for (int64_t i = 0; i < label->count; i++) label->data[i] = (float)((i * 2 + 1) % 3);
}

static double net_loss(kiln_net *net) {
  float l = 0;
  assert_int_equal(kiln_net_forward(net, &l), KILN_OK);
  return l;
}

static void forward_backward(kiln_net *net, float *loss) {
  kiln_net_zero_param_diff(net);
  assert_int_equal(kiln_net_forward(net, loss), KILN_OK);
  assert_int_equal(kiln_net_backward(net), KILN_OK);
}

/* Central differences of the net loss with respect to x[0..n) against `analytic`; returns the
 * number of mismatches. */
static int fd_check(kiln_net *net, float *x, const float *analytic, int64_t n, const char *what) {
  const double h = 1e-2, thr = 1e-3;
  int bad = 0;
  for (int64_t i = 0; i < n; i++) {
    float keep = x[i];
    x[i] = keep + (float)h;
    double lp = net_loss(net);
    x[i] = keep - (float)h;
    double lm = net_loss(net);
    x[i] = keep;
    double num = (lp - lm) / (2 * h);
    double scale = fmax(1.0, fmax(fabs(num), fabs(analytic[i])));
    if (fabs(num - analytic[i]) > thr * scale) {
      if (bad < 10)
        fprintf(stderr, "%s[%lld]: analytic %.6g numeric %.6g\n", what, (long long)i,
                analytic[i], num);
      bad++;
    }
  }
  return bad;
}

static float *copy_floats(const float *x, int64_t n) {
  float *c = malloc(sizeof(float) * (size_t)(n ? n : 1));
  assert_non_null(c);
  memcpy(c, x, sizeof(float) * (size_t)n);
  return c;
}

/* ---- phase, level, stage ------------------------------------------------------------------- */

static const char *rules_net =
    "name: 'rules'\n"
    "layer { name: 'in' type: 'Input' top: 'data' input_param { shape { dim: 2 dim: 3 } } }\n"
    "layer { name: 'train_only' type: 'ReLU' bottom: 'data' top: 'a' include { phase: TRAIN } }\n"
    "layer { name: 'test_only' type: 'ReLU' bottom: 'data' top: 'b' include { phase: TEST } }\n"
    "layer { name: 'not_test' type: 'ReLU' bottom: 'data' top: 'c' exclude { phase: TEST } }\n"
    "layer { name: 'level_1_2' type: 'ReLU' bottom: 'data' top: 'd'\n"
    "        include { min_level: 1 max_level: 2 } }\n"
    "layer { name: 'deploy' type: 'ReLU' bottom: 'data' top: 'e' include { stage: 'deploy' } }\n"
    "layer { name: 'not_deploy' type: 'ReLU' bottom: 'data' top: 'f'\n"
    "        include { not_stage: 'deploy' } }\n"
    "layer { name: 'test_or_x' type: 'ReLU' bottom: 'data' top: 'g'\n"
    "        include { phase: TEST } include { stage: 'x' } }\n"
    "layer { name: 'x_and_y' type: 'ReLU' bottom: 'data' top: 'h' include { stage: 'x' stage: 'y' } }\n"
    "layer { name: 'excl_deploy' type: 'ReLU' bottom: 'data' top: 'i' exclude { stage: 'deploy' } }\n"
    "layer { name: 'excl_train_lvl' type: 'ReLU' bottom: 'data' top: 'j'\n"
    "        exclude { phase: TRAIN min_level: 3 } }\n";

static void expect_layers(const char *text, int phase, int level, const char *const *stages,
                          int nstages, const char *const *want, int nwant) {
  static const char *const all[] = {"train_only", "test_only", "not_test",    "level_1_2",
                                    "deploy",     "not_deploy", "test_or_x", "x_and_y",
                                    "excl_deploy", "excl_train_lvl"};
  kiln_net_options o = train_opts();
  o.phase = phase;
  o.level = level;
  o.stages = stages;
  o.nstages = nstages;
  built b;
  build_ok(&b, text, &o);
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
    bool expected = false;
    for (int k = 0; k < nwant; k++) expected |= strcmp(want[k], all[i]) == 0;
    bool present = kiln_net_layer(b.net, all[i]) != NULL;
    if (present != expected)
      fprintf(stderr, "phase %d level %d: layer '%s' %s\n", phase, level, all[i],
              present ? "present but should not be" : "missing");
    assert_true(present == expected);
  }
  built_free(&b);
}

static void test_phase_level_stage_rules(void **state) {
  (void)state;
  {
    const char *want[] = {"train_only", "not_test", "not_deploy", "excl_deploy", "excl_train_lvl"};
    expect_layers(rules_net, CAFFE__PHASE__TRAIN, 0, NULL, 0, want, 5);
  }
  {
    const char *stages[] = {"deploy"};
    const char *want[] = {"test_only", "level_1_2", "deploy", "test_or_x", "excl_train_lvl"};
    expect_layers(rules_net, CAFFE__PHASE__TEST, 1, stages, 1, want, 5);
  }
  {
    const char *stages[] = {"x"};
    const char *want[] = {"train_only", "not_test",    "level_1_2",     "not_deploy",
                          "test_or_x",  "excl_deploy", "excl_train_lvl"};
    expect_layers(rules_net, CAFFE__PHASE__TRAIN, 2, stages, 1, want, 7);
  }
  {
    /* level 3 is above max_level 2 and triggers the TRAIN + min_level 3 exclusion */
    const char *stages[] = {"y", "x"};
    const char *want[] = {"train_only", "not_test", "not_deploy", "test_or_x", "x_and_y",
                          "excl_deploy"};
    expect_layers(rules_net, CAFFE__PHASE__TRAIN, 3, stages, 2, want, 6);
  }
}

static void test_include_and_exclude_is_error(void **state) {
  (void)state;
  expect_build_error(
      "layer { name: 'in' type: 'Input' top: 'data' input_param { shape { dim: 1 } } }\n"
      "layer { name: 'both_rules' type: 'ReLU' bottom: 'data' top: 'r'\n"
      "        include { phase: TRAIN } exclude { stage: 'x' } }\n",
      NULL, KILN_ERR_INVALID, "both_rules", "include", "exclude", NULL);
}

/* ---- wiring -------------------------------------------------------------------------------- */

static void test_in_place_shares_blob(void **state) {
  (void)state;
  built b;
  build_ok(&b,
           "layer { name: 'in' type: 'Input' top: 'data' input_param { shape { dim: 2 dim: 3 } } }\n"
           "layer { name: 'ip' type: 'InnerProduct' bottom: 'data' top: 'ip'\n"
           "        inner_product_param { num_output: 4 } }\n"
           "layer { name: 'relu' type: 'ReLU' bottom: 'ip' top: 'ip' }\n"
           "layer { name: 'sig' type: 'Sigmoid' bottom: 'ip' top: 'ip' }\n",
           NULL);
  kiln_net *net = b.net;
  assert_int_equal(net->nlayers, 4);
  assert_int_equal(net->nblobs, 2); /* data, ip: the in-place layers add no blob */
  kiln_blob *ip = kiln_net_blob(net, "ip");
  assert_non_null(ip);
  assert_ptr_equal(must_layer(net, "ip")->top[0], ip);
  kiln_layer *relu = must_layer(net, "relu"), *sig = must_layer(net, "sig");
  assert_ptr_equal(relu->bottom[0], ip);
  assert_ptr_equal(relu->top[0], ip);
  assert_ptr_equal(sig->bottom[0], ip);
  assert_ptr_equal(sig->top[0], ip);
  assert_int_equal(count_type(net, "Split"), 0);
  assert_int_equal(net->noutputs, 1);
  assert_ptr_equal(net->outputs[0], ip);
  built_free(&b);

  /* A long in-place chain ending in a loss: one blob carries every gradient, and backward
   * through it matches finite differences. (Only layers whose backward can be computed from
   * their output, as in Caffe; Dropout is the identity in TEST.) */
  kiln_net_options o = train_opts();
  o.phase = CAFFE__PHASE__TEST;
  build_ok(&b,
           "force_backward: true\n"
           "layer { name: 'in' type: 'Input' top: 'data' top: 'label'\n"
           "        input_param { shape { dim: 3 dim: 4 } shape { dim: 3 } } }\n"
           "layer { name: 'ip' type: 'InnerProduct' bottom: 'data' top: 'ip'\n"
           "        inner_product_param { num_output: 3 weight_filler { type: 'gaussian' std: 1 }\n"
           "                              bias_filler { type: 'constant' value: 0.5 } } }\n"
           "layer { name: 'r1' type: 'ReLU' bottom: 'ip' top: 'ip' }\n"
           "layer { name: 'd1' type: 'Dropout' bottom: 'ip' top: 'ip' }\n"
           "layer { name: 'r2' type: 'ReLU' bottom: 'ip' top: 'ip' }\n"
           "layer { name: 'd2' type: 'Dropout' bottom: 'ip' top: 'ip' }\n"
           "layer { name: 'r3' type: 'ReLU' bottom: 'ip' top: 'ip' }\n"
           "layer { name: 'd3' type: 'Dropout' bottom: 'ip' top: 'ip' }\n"
           "layer { name: 'loss' type: 'SoftmaxWithLoss' bottom: 'ip' bottom: 'label' top: 'loss' }\n",
           &o);
  net = b.net;
  assert_int_equal(net->nblobs, 4);
  for (int i = 0; i < net->nlayers; i++)
    if (strcmp(net->layers[i]->name, "in") != 0) assert_true(net->layer_need_backward[i]);
  set_inputs(net, 9);
  float loss;
  forward_backward(net, &loss);
  kiln_blob *data = kiln_net_blob(net, "data");
  float *dd = copy_floats(data->diff, data->count);
  assert_int_equal(fd_check(net, data->data, dd, data->count, "data"), 0);
  free(dd);
  built_free(&b);
}

static void test_top_reuse_not_in_place_is_error(void **state) {
  (void)state;
  expect_build_error(
      "layer { name: 'in' type: 'Input' top: 'data' top: 'other'\n"
      "        input_param { shape { dim: 2 dim: 3 } } }\n"
      "layer { name: 'first' type: 'ReLU' bottom: 'data' top: 'x' }\n"
      "layer { name: 'second' type: 'Sigmoid' bottom: 'other' top: 'x' }\n",
      NULL, KILN_ERR_INVALID, "'second'", "'first'", "'x'", NULL);
  /* Naming an existing blob as top while reading a different bottom is not in place either. */
  expect_build_error(
      "layer { name: 'in' type: 'Input' top: 'data' top: 'other'\n"
      "        input_param { shape { dim: 2 dim: 3 } } }\n"
      "layer { name: 'clobber' type: 'ReLU' bottom: 'other' top: 'data' }\n",
      NULL, KILN_ERR_INVALID, "'clobber'", "'in'", NULL);
}

static void test_missing_bottom_is_error(void **state) {
  (void)state;
  built b;
  expect_build_error(
      "layer { name: 'in' type: 'Input' top: 'data' input_param { shape { dim: 2 } } }\n"
      "layer { name: 'relu' type: 'ReLU' bottom: 'nowhere' top: 'r' }\n",
      NULL, KILN_ERR_INVALID, "'relu'", "'nowhere'", "TRAIN", NULL);
  /* The producer exists, but only in TRAIN: the TEST net cannot be wired. */
  const char *text =
      "layer { name: 'in' type: 'Input' top: 'data' input_param { shape { dim: 2 } } }\n"
      "layer { name: 'prep' type: 'ReLU' bottom: 'data' top: 'p' include { phase: TRAIN } }\n"
      "layer { name: 'use' type: 'Sigmoid' bottom: 'p' top: 's' }\n";
  build_ok(&b, text, NULL);
  built_free(&b);
  kiln_net_options o = train_opts();
  o.phase = CAFFE__PHASE__TEST;
  o.source = "nets/x.prototxt";
  expect_build_error(text, &o, KILN_ERR_INVALID, "nets/x.prototxt", "'use'", "'p'", "TEST", NULL);
  /* A layer may not read a blob that only a later layer produces. */
  expect_build_error(
      "layer { name: 'in' type: 'Input' top: 'data' input_param { shape { dim: 2 } } }\n"
      "layer { name: 'early' type: 'ReLU' bottom: 'late_blob' top: 'e' }\n"
      "layer { name: 'late' type: 'ReLU' bottom: 'data' top: 'late_blob' }\n",
      NULL, KILN_ERR_INVALID, "'early'", "'late_blob'", NULL);
}

/* ---- splits -------------------------------------------------------------------------------- */

static const char *fanout_net =
    "name: 'fanout'\n"
    "force_backward: true\n"
    "layer { name: 'in' type: 'Input' top: 'data' top: 'label'\n"
    "        input_param { shape { dim: 4 dim: 5 } shape { dim: 4 } } }\n"
    "layer { name: 'ip' type: 'InnerProduct' bottom: 'data' top: 'ip'\n"
    "        inner_product_param { num_output: 3 weight_filler { type: 'gaussian' std: 0.7 }\n"
    "                              bias_filler { type: 'uniform' min: -0.5 max: 0.5 } } }\n"
    "layer { name: 'loss1' type: 'SoftmaxWithLoss' bottom: 'ip' bottom: 'label' top: 'loss1' }\n"
    "layer { name: 'loss2' type: 'SoftmaxWithLoss' bottom: 'ip' bottom: 'label' top: 'loss2'\n"
    "        loss_weight: 0.5 }\n";


static void test_split_for_fanout(void **state) {
  (void)state;
  built b;
  build_ok(&b, fanout_net, NULL);
  kiln_net *net = b.net;
  /* ip feeds two losses, label feeds two losses: two Splits, each right after its producer. */
  assert_int_equal(count_type(net, "Split"), 2);
  int ip_i = layer_index(net, "ip"), sp_i = layer_index(net, "ip_ip_0_split");
  assert_true(ip_i >= 0);
  assert_int_equal(sp_i, ip_i + 1);
  kiln_layer *sp = net->layers[sp_i];
  assert_string_equal(sp->ops->type, "Split");
  assert_int_equal(sp->ntop, 2);
  assert_ptr_equal(sp->bottom[0], kiln_net_blob(net, "ip"));
  assert_string_equal(sp->top[0]->name, "ip_ip_0_split_0");
  assert_string_equal(sp->top[1]->name, "ip_ip_0_split_1");
  kiln_layer *lsp = must_layer(net, "label_in_1_split");
  assert_string_equal(lsp->top[0]->name, "label_in_1_split_0");
  assert_string_equal(lsp->top[1]->name, "label_in_1_split_1");
  kiln_layer *l1 = must_layer(net, "loss1"), *l2 = must_layer(net, "loss2");
  assert_ptr_equal(l1->bottom[0], sp->top[0]);
  assert_ptr_equal(l2->bottom[0], sp->top[1]);
  assert_ptr_equal(l1->bottom[1], lsp->top[0]);
  assert_ptr_equal(l2->bottom[1], lsp->top[1]);
  assert_true(net->layer_need_backward[sp_i]);
  assert_true(sp->propagate_down[0]);
  /* The Split's tops read ip's data (no copies); their gradients are their own. */
  for (int t = 0; t < 2; t++) {
    assert_ptr_equal(sp->top[t]->data_of, sp->bottom[0]);
    assert_ptr_equal(sp->top[t]->data, sp->bottom[0]->data);
    assert_ptr_not_equal(sp->top[t]->diff, sp->bottom[0]->diff);
  }
  assert_ptr_not_equal(sp->top[0]->diff, sp->top[1]->diff);

  /* The gradient reaching ip (and data) is the sum over both consumers. */
  set_inputs(net, 11);
  float loss;
  forward_backward(net, &loss);
  double l1v = l1->top[0]->data[0], l2v = l2->top[0]->data[0];
  assert_true(fabs(loss - (l1v + 0.5 * l2v)) < 1e-5);
  kiln_blob *data = kiln_net_blob(net, "data");
  float *ddata = copy_floats(data->diff, data->count);
  kiln_blob *w = must_layer(net, "ip")->param[0], *bias = must_layer(net, "ip")->param[1];
  float *dw = copy_floats(w->diff, w->count), *db = copy_floats(bias->diff, bias->count);
  double norm = 0;
  for (int64_t i = 0; i < data->count; i++) norm += fabs(ddata[i]);
  assert_true(norm > 1e-3); /* a real gradient, not zeros */
  assert_int_equal(fd_check(net, data->data, ddata, data->count, "data"), 0);
  assert_int_equal(fd_check(net, w->data, dw, w->count, "ip.w"), 0);
  assert_int_equal(fd_check(net, bias->data, db, bias->count, "ip.b"), 0);
  /* ip's top diff (written by the Split) is exactly the sum of its two tops' diffs. */
  forward_backward(net, &loss);
  kiln_blob *ipb = kiln_net_blob(net, "ip");
  for (int64_t i = 0; i < ipb->count; i++)
    assert_true(ipb->diff[i] == sp->top[0]->diff[i] + sp->top[1]->diff[i]);
  free(ddata);
  free(dw);
  free(db);
  built_free(&b);
}

static void test_split_for_loss_weighted_top_also_consumed(void **state) {
  (void)state;
  built b;
  build_ok(&b,
           "name: 'lw_split'\n"
           "force_backward: true\n"
           "layer { name: 'in' type: 'Input' top: 'data' top: 'label'\n"
           "        input_param { shape { dim: 4 dim: 5 } shape { dim: 4 } } }\n"
           "layer { name: 'ip' type: 'InnerProduct' bottom: 'data' top: 'ip' loss_weight: 0.25\n"
           "        inner_product_param { num_output: 3 weight_filler { type: 'gaussian' std: 0.7 } } }\n"
           "layer { name: 'loss' type: 'SoftmaxWithLoss' bottom: 'ip' bottom: 'label' top: 'loss' }\n",
           NULL);
  kiln_net *net = b.net;
  kiln_layer *ip = must_layer(net, "ip"), *sp = must_layer(net, "ip_ip_0_split");
  kiln_layer *loss_l = must_layer(net, "loss");
  assert_int_equal(count_type(net, "Split"), 1);
  assert_int_equal(sp->ntop, 2);
  /* The loss moves to the Split's first top; the consumer reads the second. */
  assert_true(ip->loss_weight[0] == 0.0f);
  assert_true(sp->loss_weight[0] == 0.25f);
  assert_true(sp->loss_weight[1] == 0.0f);
  assert_ptr_equal(loss_l->bottom[0], sp->top[1]);
  assert_true(loss_l->loss_weight[0] == 1.0f);
  /* Outputs: the Split's loss top (0.25) and the loss (1). */
  assert_int_equal(net->noutputs, 2);
  float want[2] = {0, 0};
  for (int o = 0; o < net->noutputs; o++) {
    if (net->outputs[o] == sp->top[0]) want[0] = net->output_loss_weight[o];
    if (net->outputs[o] == loss_l->top[0]) want[1] = net->output_loss_weight[o];
  }
  assert_true(want[0] == 0.25f && want[1] == 1.0f);

  set_inputs(net, 12);
  float loss;
  forward_backward(net, &loss);
  double sum_ip = 0;
  kiln_blob *ipb = kiln_net_blob(net, "ip");
  for (int64_t i = 0; i < ipb->count; i++) sum_ip += ipb->data[i];
  assert_true(fabs(loss - (0.25 * sum_ip + loss_l->top[0]->data[0])) < 1e-5);
  kiln_blob *data = kiln_net_blob(net, "data");
  float *ddata = copy_floats(data->diff, data->count);
  float *dw = copy_floats(ip->param[0]->diff, ip->param[0]->count);
  assert_int_equal(fd_check(net, data->data, ddata, data->count, "data"), 0);
  assert_int_equal(fd_check(net, ip->param[0]->data, dw, ip->param[0]->count, "ip.w"), 0);
  free(ddata);
  free(dw);
  built_free(&b);
}

/* ---- loss weights ---------------------------------------------------------------------------- */

static const char *loss_net_fmt =
    "name: 'lw'\n"
    "layer { name: 'in' type: 'Input' top: 'data' top: 'label'\n"
    "        input_param { shape { dim: 4 dim: 5 } shape { dim: 4 } } }\n"
    "layer { name: 'ip' type: 'InnerProduct' bottom: 'data' top: 'ip'\n"
    "        inner_product_param { num_output: 3 weight_filler { type: 'gaussian' std: 0.7 } } }\n"
    "layer { name: 'loss' type: 'SoftmaxWithLoss' bottom: 'ip' bottom: 'label' top: 'loss' %s }\n"
    "layer { name: 'acc' type: 'Accuracy' bottom: 'ip' bottom: 'label' top: 'acc' }\n";

static void test_loss_weight_default_and_explicit(void **state) {
  (void)state;
  char text[2048];
  built one, half;
  snprintf(text, sizeof text, loss_net_fmt, "");
  build_ok(&one, text, NULL);
  snprintf(text, sizeof text, loss_net_fmt, "loss_weight: 0.5");
  build_ok(&half, text, NULL);
  kiln_layer *l = must_layer(one.net, "loss");
  assert_true(l->loss_weight[0] == 1.0f);
  assert_true(must_layer(one.net, "acc")->loss_weight[0] == 0.0f);
  assert_true(must_layer(one.net, "ip")->loss_weight[0] == 0.0f);
  assert_true(must_layer(half.net, "loss")->loss_weight[0] == 0.5f);
  for (int o = 0; o < one.net->noutputs; o++) {
    const char *n = one.net->outputs[o]->name;
    float lw = one.net->output_loss_weight[o];
    if (strcmp(n, "loss") == 0) assert_true(lw == 1.0f);
    else assert_true(lw == 0.0f);
  }

  set_inputs(one.net, 5);
  set_inputs(half.net, 5);
  assert_int_equal(one.net->nparam_floats, half.net->nparam_floats);
  assert_memory_equal(one.net->param_data, half.net->param_data,
                      sizeof(float) * (size_t)one.net->nparam_floats);
  float l1, l2;
  forward_backward(one.net, &l1);
  forward_backward(half.net, &l2);
  assert_true(l1 > 0.1f);
  assert_true(fabs(l2 - 0.5 * l1) <= 1e-6 * l1);
  /* The top itself is unscaled; only its contribution to the objective is. */
  assert_true(must_layer(half.net, "loss")->top[0]->data[0] == must_layer(one.net, "loss")->top[0]->data[0]);
  double gsum = 0;
  for (int64_t i = 0; i < one.net->nparam_floats; i++) {
    float g1 = one.net->param_diff[i], g2 = half.net->param_diff[i];
    assert_true(fabs(g2 - 0.5 * g1) <= 1e-6 * fabs(g1) + 1e-9);
    gsum += fabs(g1);
  }
  assert_true(gsum > 1e-3);
  built_free(&one);
  built_free(&half);

  /* loss_weight count must match the tops */
  snprintf(text, sizeof text, loss_net_fmt, "loss_weight: 1 loss_weight: 2");
  expect_build_error(text, NULL, KILN_ERR_INVALID, "'loss'", NULL);
}

/* ---- parameters -------------------------------------------------------------------------------- */

static void test_lr_mult_decay_mult(void **state) {
  (void)state;
  built b;
  build_ok(&b,
           "layer { name: 'in' type: 'Input' top: 'data' top: 'label'\n"
           "        input_param { shape { dim: 2 dim: 3 } shape { dim: 2 } } }\n"
           "layer { name: 'frozen' type: 'InnerProduct' bottom: 'data' top: 'f'\n"
           "        param { lr_mult: 0 decay_mult: 0 } param { lr_mult: 0 decay_mult: 0 }\n"
           "        inner_product_param { num_output: 4 } }\n"
           "layer { name: 'ip' type: 'InnerProduct' bottom: 'f' top: 'ip'\n"
           "        param { lr_mult: 1 decay_mult: 1 } param { lr_mult: 2 decay_mult: 0 }\n"
           "        inner_product_param { num_output: 3 } }\n"
           "layer { name: 'ip2' type: 'InnerProduct' bottom: 'ip' top: 'ip2'\n"
           "        param { lr_mult: 0.5 }\n"
           "        inner_product_param { num_output: 3 } }\n"
           "layer { name: 'loss' type: 'SoftmaxWithLoss' bottom: 'ip2' bottom: 'label' top: 'loss' }\n",
           NULL);
  kiln_net *net = b.net;
  assert_int_equal(net->nlearnable, 6);
  const float lr[] = {0, 0, 1, 2, 0.5f, 1}, dec[] = {0, 0, 1, 0, 1, 1};
  kiln_layer *owners[] = {must_layer(net, "frozen"), must_layer(net, "ip"), must_layer(net, "ip2")};
  for (int k = 0; k < 6; k++) {
    assert_ptr_equal(net->learnable[k], owners[k / 2]->param[k % 2]);
    assert_true(net->lr_mult[k] == lr[k]);
    assert_true(net->decay_mult[k] == dec[k]);
    /* views into the flat buffers */
    assert_ptr_equal(net->learnable[k]->data, net->param_data + net->learnable_offset[k]);
    assert_ptr_equal(net->learnable[k]->diff, net->param_diff + net->learnable_offset[k]);
  }
  /* A layer whose parameters are all frozen and whose input needs no gradient skips backward. */
  assert_false(net->layer_need_backward[layer_index(net, "frozen")]);
  assert_true(net->layer_need_backward[layer_index(net, "ip")]);
  assert_true(must_layer(net, "ip")->propagate_down[0] == false);
  assert_true(must_layer(net, "ip2")->propagate_down[0] == true);
  built_free(&b);

  /* more ParamSpecs than parameter blobs */
  expect_build_error(
      "layer { name: 'in' type: 'Input' top: 'data' input_param { shape { dim: 2 dim: 3 } } }\n"
      "layer { name: 'ip' type: 'InnerProduct' bottom: 'data' top: 'ip'\n"
      "        param { } param { } param { } inner_product_param { num_output: 3 } }\n",
      NULL, KILN_ERR_INVALID, "'ip'", NULL);
}

static const char *shared_fmt =
    "force_backward: true\n"
    "layer { name: 'in' type: 'Input' top: 'a' top: 'b' top: 'label'\n"
    "        input_param { shape { dim: 4 dim: 5 } shape { dim: 4 dim: %d } shape { dim: 4 } } }\n"
    "layer { name: 'ip1' type: 'InnerProduct' bottom: 'a' top: 'ip1'\n"
    "        param { name: 'w' lr_mult: 3 } param { name: 'bias' }\n"
    "        inner_product_param { num_output: 3 weight_filler { type: 'gaussian' std: 0.6 }\n"
    "                              bias_filler { type: 'gaussian' std: 0.3 } } }\n"
    "layer { name: 'ip2' type: 'InnerProduct' bottom: 'b' top: 'ip2'\n"
    "        param { name: 'w' %s } param { name: 'bias' }\n"
    "        inner_product_param { num_output: %d weight_filler { type: 'gaussian' std: 0.6 }\n"
    "                              bias_filler { type: 'gaussian' std: 0.3 } } }\n"
    "layer { name: 'l1' type: 'SoftmaxWithLoss' bottom: 'ip1' bottom: 'label' top: 'l1' }\n"
    "layer { name: 'l2' type: 'SoftmaxWithLoss' bottom: 'ip2' bottom: 'label' top: 'l2' }\n";

/* ip1's 3x4 weights shared by name with ip2's 4x3 ones, in the share_mode given. */
static const char *share_mode_fmt =
    "layer { name: 'in' type: 'Input' top: 'a' top: 'b'\n"
    "        input_param { shape { dim: 2 dim: 4 } shape { dim: 2 dim: 3 } } }\n"
    "layer { name: 'ip1' type: 'InnerProduct' bottom: 'a' top: 'ip1'\n"
    "        param { name: 'w' } inner_product_param { num_output: 3 bias_term: false } }\n"
    "layer { name: 'ip2' type: 'InnerProduct' bottom: 'b' top: 'ip2'\n"
    "        param { name: 'w' share_mode: %s }\n"
    "        inner_product_param { num_output: 4 bias_term: false } }\n";

static void test_param_sharing_by_name(void **state) {
  (void)state;
  char text[4096];
  built b;
  snprintf(text, sizeof text, shared_fmt, 5, "", 3);
  build_ok(&b, text, NULL);
  kiln_net *net = b.net;
  kiln_layer *ip1 = must_layer(net, "ip1"), *ip2 = must_layer(net, "ip2");
  assert_int_equal(net->nlearnable, 2);
  assert_ptr_equal(net->learnable[0], ip1->param[0]);
  assert_ptr_equal(net->learnable[1], ip1->param[1]);
  assert_ptr_equal(ip2->param[0]->data, ip1->param[0]->data);
  assert_ptr_equal(ip2->param[0]->diff, ip1->param[0]->diff);
  assert_ptr_equal(ip2->param[1]->data, ip1->param[1]->data);
  assert_ptr_equal(ip2->param[1]->diff, ip1->param[1]->diff);
  assert_true(net->lr_mult[0] == 3.0f); /* the owner's spec */
  assert_int_equal(net->nparam_floats, 16 + 16); /* 15 and 3 floats in 64-byte slots */
  assert_true(net->layer_need_backward[layer_index(net, "ip2")]);

  /* The shared gradient accumulates both users' contributions. */
  kiln_blob *a = kiln_net_blob(net, "a"), *bb = kiln_net_blob(net, "b");
  fill_uniform(a->data, a->count, 3, -1, 1);
  fill_uniform(bb->data, bb->count, 4, -1, 1);
  kiln_blob *label = kiln_net_blob(net, "label");
  for (int i = 0; i < 4; i++) label->data[i] = (float)(i % 3);
  float loss;
  forward_backward(net, &loss);
  kiln_blob *w = ip1->param[0], *bias = ip1->param[1];
  float *dw = copy_floats(w->diff, w->count), *db = copy_floats(bias->diff, bias->count);
  assert_int_equal(fd_check(net, w->data, dw, w->count, "shared w"), 0);
  assert_int_equal(fd_check(net, bias->data, db, bias->count, "shared bias"), 0);
  /* Moved elsewhere (the communicator's shared memory), the gradients follow for the owner and
   * for the layer sharing its blobs, and backward writes the same values there. */
  forward_backward(net, &loss); /* fd_check moved the weights and back: the same gradient again */
  float *home = kiln_alloc(sizeof(float) * (size_t)net->nparam_floats);
  assert_non_null(home);
  kiln_net_place_param_diff(net, home);
  assert_ptr_equal(net->param_diff, home);
  assert_true(net->param_diff_placed);
  assert_memory_equal(home + net->learnable_offset[0], dw, sizeof(float) * (size_t)w->count);
  for (int i = 0; i < 2; i++) {
    assert_ptr_equal(ip1->param[i]->diff, home + net->learnable_offset[i]);
    assert_ptr_equal(ip2->param[i]->diff, home + net->learnable_offset[i]);
  }
  memset(home, 0, sizeof(float) * (size_t)net->nparam_floats);
  forward_backward(net, &loss);
  assert_memory_equal(home + net->learnable_offset[0], dw, sizeof(float) * (size_t)w->count);
  assert_memory_equal(home + net->learnable_offset[1], db, sizeof(float) * (size_t)bias->count);
  free(dw);
  free(db);
  built_free(&b); /* leaves the placed memory to its owner */
  kiln_free(home);

  /* Shape mismatch on a shared name. */
  snprintf(text, sizeof text, shared_fmt, 5, "", 4);
  expect_build_error(text, NULL, KILN_ERR_SHAPE, "'ip2'", "'w'", NULL);
  /* PERMISSIVE accepts the same count in another shape (4x3 against 3x4)... */
  snprintf(text, sizeof text, share_mode_fmt, "PERMISSIVE");
  build_ok(&b, text, NULL);
  assert_int_equal(b.net->nlearnable, 1);
  assert_ptr_equal(must_layer(b.net, "ip2")->param[0]->data, must_layer(b.net, "ip1")->param[0]->data);
  built_free(&b);
  /* ...STRICT does not. */
  snprintf(text, sizeof text, share_mode_fmt, "STRICT");
  expect_build_error(text, NULL, KILN_ERR_SHAPE, NULL);
}

/* ---- backward needs -------------------------------------------------------------------------- */

static const char *needs_fmt =
    "%s\n"
    "layer { name: 'in' type: 'Input' top: 'data' top: 'label'\n"
    "        input_param { shape { dim: 4 dim: 5 } shape { dim: 4 } } }\n"
    "layer { name: 'ip' type: 'InnerProduct' bottom: 'data' top: 'ip'\n"
    "        inner_product_param { num_output: 3 } }\n"
    "layer { name: 'side' type: 'InnerProduct' bottom: 'data' top: 'side'\n"
    "        inner_product_param { num_output: 2 } }\n"
    "layer { name: 'side_relu' type: 'ReLU' bottom: 'side' top: 'side' }\n"
    "layer { name: 'loss' type: 'SoftmaxWithLoss' bottom: 'ip' bottom: 'label' top: 'loss' }\n"
    "layer { name: 'acc' type: 'Accuracy' bottom: 'ip' bottom: 'label' top: 'acc' }\n";

static void test_need_backward(void **state) {
  (void)state;
  char text[4096];
  built b;
  snprintf(text, sizeof text, needs_fmt, "");
  build_ok(&b, text, NULL);
  kiln_net *net = b.net;
  struct {
    const char *name;
    bool need;
  } want[] = {{"in", false},  {"data_in_0_split", false}, {"label_in_1_split", false},
              {"ip", true},   {"ip_ip_0_split", true},    {"side", false},
              {"side_relu", false}, {"loss", true},       {"acc", false}};
  assert_int_equal(net->nlayers, (int)(sizeof want / sizeof want[0]));
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
    int li = layer_index(net, want[i].name);
    assert_true(li >= 0);
    if (net->layer_need_backward[li] != want[i].need)
      fprintf(stderr, "layer '%s': need_backward %d\n", want[i].name, net->layer_need_backward[li]);
    assert_true(net->layer_need_backward[li] == want[i].need);
  }
  kiln_layer *loss = must_layer(net, "loss");
  assert_true(loss->propagate_down[0]);
  assert_false(loss->propagate_down[1]); /* labels */
  assert_false(must_layer(net, "ip")->propagate_down[0]); /* data needs no gradient */
  kiln_layer *acc = must_layer(net, "acc");
  assert_false(acc->propagate_down[0]);
  assert_false(acc->propagate_down[1]);
  assert_false(must_layer(net, "side")->propagate_down[0]);
  /* Backward runs and fills only the needed gradients. */
  set_inputs(net, 2);
  float l;
  forward_backward(net, &l);
  kiln_layer *side = must_layer(net, "side");
  for (int64_t i = 0; i < side->param[0]->count; i++) assert_true(side->param[0]->diff[i] == 0.0f);
  double s = 0;
  kiln_layer *ip = must_layer(net, "ip");
  for (int64_t i = 0; i < ip->param[0]->count; i++) s += fabs(ip->param[0]->diff[i]);
  assert_true(s > 0);
  built_free(&b);

  /* force_backward: data gets a gradient, the labels still do not. */
  snprintf(text, sizeof text, needs_fmt, "force_backward: true");
  build_ok(&b, text, NULL);
  net = b.net;
  assert_true(must_layer(net, "ip")->propagate_down[0]);
  assert_true(net->layer_need_backward[layer_index(net, "data_in_0_split")]);
  assert_false(must_layer(net, "loss")->propagate_down[1]);
  assert_true(must_layer(net, "loss")->propagate_down[0]);
  built_free(&b);

  /* propagate_down: false on the data bottom stops the gradient there. */
  build_ok(&b,
           "force_backward: true\n"
           "layer { name: 'in' type: 'Input' top: 'data' top: 'label'\n"
           "        input_param { shape { dim: 4 dim: 5 } shape { dim: 4 } } }\n"
           "layer { name: 'ip' type: 'InnerProduct' bottom: 'data' top: 'ip' propagate_down: false\n"
           "        inner_product_param { num_output: 3 } }\n"
           "layer { name: 'loss' type: 'SoftmaxWithLoss' bottom: 'ip' bottom: 'label' top: 'loss' }\n",
           NULL);
  assert_false(must_layer(b.net, "ip")->propagate_down[0]);
  assert_true(b.net->layer_need_backward[layer_index(b.net, "ip")]); /* its weights still learn */
  built_free(&b);

  /* A layer whose every top is taken with propagate_down: false runs no backward, nor do the
   * layers below that feed only it (Caffe's blobs_skip_backp): here 'a' learns nothing and
   * Threshold, which has no gradient, is never asked for one (SSD's PriorBox below the priors
   * MultiBoxLoss takes without gradient); 'b' still learns. */
  build_ok(&b,
           "layer { name: 'in' type: 'Input' top: 'data' top: 'label'\n"
           "        input_param { shape { dim: 4 dim: 5 } shape { dim: 4 } } }\n"
           "layer { name: 'a' type: 'InnerProduct' bottom: 'data' top: 'h'\n"
           "        inner_product_param { num_output: 3 weight_filler { type: 'gaussian' } } }\n"
           "layer { name: 'th' type: 'Threshold' bottom: 'h' top: 't' }\n"
           "layer { name: 'b' type: 'InnerProduct' bottom: 't' top: 'ip' propagate_down: false\n"
           "        inner_product_param { num_output: 3 } }\n"
           "layer { name: 'loss' type: 'SoftmaxWithLoss' bottom: 'ip' bottom: 'label' top: 'loss' }\n",
           NULL);
  assert_false(b.net->layer_need_backward[layer_index(b.net, "a")]);
  assert_false(b.net->layer_need_backward[layer_index(b.net, "th")]);
  assert_false(must_layer(b.net, "th")->propagate_down[0]);
  assert_true(b.net->layer_need_backward[layer_index(b.net, "b")]);
  assert_false(must_layer(b.net, "b")->propagate_down[0]);
  set_inputs(b.net, 3);
  forward_backward(b.net, &l);
  kiln_layer *a = must_layer(b.net, "a"), *bl = must_layer(b.net, "b");
  for (int64_t i = 0; i < a->param[0]->count; i++) assert_true(a->param[0]->diff[i] == 0.0f);
  s = 0;
  for (int64_t i = 0; i < bl->param[0]->count; i++) s += fabs(bl->param[0]->diff[i]);
  assert_true(s > 0);
  built_free(&b);
}

/* kiln time's marking: every layer with a backward pass runs it, but bottom gradients only where
 * training computes them, so the net's input gradient is not timed (Caffe's bottom_need_backward)
 * and a deploy net without a loss is timed as if it trained. */
static void test_need_backward_everywhere(void **state) {
  (void)state;
  char text[4096];
  built b, plain;
  snprintf(text, sizeof text, needs_fmt, "");
  build_ok(&b, text, NULL);
  build_ok(&plain, text, NULL);
  kiln_net *net = b.net;
  assert_int_equal(kiln_net_need_backward_everywhere(net), KILN_OK);
  assert_false(must_layer(net, "ip")->propagate_down[0]);   /* the input's gradient */
  assert_true(must_layer(net, "side_relu")->propagate_down[0]);
  assert_true(must_layer(net, "loss")->propagate_down[0]);
  assert_false(must_layer(net, "loss")->propagate_down[1]); /* labels */
  assert_true(net->layer_need_backward[layer_index(net, "side")]);
  assert_true(net->layer_need_backward[layer_index(net, "side_relu")]);
  assert_false(net->layer_need_backward[layer_index(net, "in")]);
  assert_false(net->layer_need_backward[layer_index(net, "acc")]); /* no backward pass */
  /* The gradients training computes come out bit for bit as the training net's. */
  set_inputs(net, 2);
  set_inputs(plain.net, 2);
  float l1, l2;
  forward_backward(net, &l1);
  forward_backward(plain.net, &l2);
  assert_true(l1 == l2);
  const kiln_layer *ip = must_layer(net, "ip"), *ip_plain = must_layer(plain.net, "ip");
  for (int p = 0; p < ip->nparam; p++)
    assert_memory_equal(ip->param[p]->diff, ip_plain->param[p]->diff,
                        (size_t)ip->param[p]->count * sizeof(float));
  built_free(&b);
  built_free(&plain);

  /* A deploy net: nothing reaches a loss, so training's own marking runs no backward at all;
   * timing marks what a training step of it would run. */
  const char *deploy =
      "%s\n"
      "layer { name: 'in' type: 'Input' top: 'data' input_param { shape { dim: 4 dim: 5 } } }\n"
      "layer { name: 'ip1' type: 'InnerProduct' bottom: 'data' top: 'h'\n"
      "        inner_product_param { num_output: 3 } }\n"
      "layer { name: 'relu' type: 'ReLU' bottom: 'h' top: 'h' }\n"
      "layer { name: 'ip2' type: 'InnerProduct' bottom: 'h' top: 'out'\n"
      "        inner_product_param { num_output: 2 } }\n";
  snprintf(text, sizeof text, deploy, "");
  build_ok(&b, text, NULL);
  for (int i = 0; i < b.net->nlayers; i++) assert_false(b.net->layer_need_backward[i]);
  assert_int_equal(kiln_net_need_backward_everywhere(b.net), KILN_OK);
  assert_false(must_layer(b.net, "ip1")->propagate_down[0]);
  assert_true(must_layer(b.net, "relu")->propagate_down[0]);
  assert_true(must_layer(b.net, "ip2")->propagate_down[0]);
  assert_true(b.net->layer_need_backward[layer_index(b.net, "ip1")]);
  built_free(&b);
  /* force_backward: the input's gradient is timed too. */
  snprintf(text, sizeof text, deploy, "force_backward: true");
  build_ok(&b, text, NULL);
  assert_int_equal(kiln_net_need_backward_everywhere(b.net), KILN_OK);
  assert_true(must_layer(b.net, "ip1")->propagate_down[0]);
  built_free(&b);
}

/* ---- deploy headers -------------------------------------------------------------------------- */

static void test_deploy_headers(void **state) {
  (void)state;
  built b;
  build_ok(&b,
           "name: 'deploy'\n"
           "input: 'data' input_dim: 1 input_dim: 3 input_dim: 8 input_dim: 8\n"
           "layer { name: 'relu' type: 'ReLU' bottom: 'data' top: 'r' }\n",
           NULL);
  kiln_net *net = b.net;
  assert_int_equal(net->nlayers, 2);
  assert_string_equal(net->layers[0]->ops->type, "Input");
  assert_int_equal(net->layers[0]->ntop, 1);
  kiln_blob *d = kiln_net_blob(net, "data");
  assert_non_null(d);
  assert_ptr_equal(net->layers[0]->top[0], d);
  assert_int_equal(d->naxes, 4);
  const int64_t s1[] = {1, 3, 8, 8};
  for (int i = 0; i < 4; i++) assert_int_equal(d->shape[i], s1[i]);
  assert_int_equal(kiln_net_blob(net, "r")->count, 192);
  built_free(&b);

  build_ok(&b,
           "input: 'data' input_shape { dim: 2 dim: 3 dim: 5 }\n"
           "input: 'label' input_shape { dim: 2 }\n"
           "layer { name: 'ip' type: 'InnerProduct' bottom: 'data' top: 'ip'\n"
           "        inner_product_param { num_output: 4 } }\n"
           "layer { name: 'loss' type: 'SoftmaxWithLoss' bottom: 'ip' bottom: 'label' top: 'loss' }\n",
           NULL);
  net = b.net;
  assert_string_equal(net->layers[0]->ops->type, "Input");
  assert_int_equal(net->layers[0]->ntop, 2);
  d = kiln_net_blob(net, "data");
  assert_int_equal(d->naxes, 3);
  assert_int_equal(d->shape[0], 2);
  assert_int_equal(d->shape[1], 3);
  assert_int_equal(d->shape[2], 5);
  kiln_blob *lab = kiln_net_blob(net, "label");
  assert_int_equal(lab->naxes, 1);
  assert_int_equal(lab->shape[0], 2);
  assert_int_equal(must_layer(net, "ip")->param[0]->shape[1], 15);
  built_free(&b);

  expect_build_error(
      "input: 'data' input_dim: 1 input_dim: 3\n"
      "layer { name: 'relu' type: 'ReLU' bottom: 'data' top: 'r' }\n",
      NULL, KILN_ERR_INVALID, "input_dim", NULL);
  expect_build_error(
      "input: 'data' input: 'label' input_shape { dim: 2 dim: 3 }\n"
      "layer { name: 'relu' type: 'ReLU' bottom: 'data' top: 'r' }\n",
      NULL, KILN_ERR_INVALID, "input_shape", NULL);
}

/* ---- layer errors ------------------------------------------------------------------------------ */

static void test_unknown_type_and_bottom_count(void **state) {
  (void)state;
  built b;
  build_fails(&b,
              "layer { name: 'in' type: 'Input' top: 'data' input_param { shape { dim: 2 dim: 3 } } }\n"
              "layer { name: 'odd' type: 'Convolutionn' bottom: 'data' top: 'c' }\n",
              NULL, KILN_ERR_UNSUPPORTED);
  assert_contains(b.err, "'odd'");
  assert_contains(b.err, "Convolutionn");
  const char *known[] = {"Convolution", "InnerProduct", "SoftmaxWithLoss", "Data", "Input",
                         "Pooling", "ReLU", "Dropout", "Accuracy"};
  for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) assert_contains(b.err, known[i]);
  built_free(&b);

  expect_build_error(
      "layer { name: 'in' type: 'Input' top: 'data' input_param { shape { dim: 2 dim: 3 } } }\n"
      "layer { name: 'lonely_loss' type: 'SoftmaxWithLoss' bottom: 'data' top: 'l' }\n",
      NULL, KILN_ERR_INVALID, "'lonely_loss'", "bottom", NULL);
  expect_build_error(
      "layer { name: 'in' type: 'Input' top: 'data' top: 'x'\n"
      "        input_param { shape { dim: 2 dim: 3 } } }\n"
      "layer { name: 'relu2' type: 'ReLU' bottom: 'data' bottom: 'x' top: 'r' }\n",
      NULL, KILN_ERR_INVALID, "'relu2'", NULL);
}

/* ---- memory plan -------------------------------------------------------------------------------- */

static const char *big_net =
    "name: 'big'\n"
    "layer { name: 'in' type: 'Input' top: 'data'\n"
    "        input_param { shape { dim: 64 dim: 3 dim: 128 dim: 128 } } }\n"
    "layer { name: 'relu' type: 'ReLU' bottom: 'data' top: 'r' }\n"
    "layer { name: 'ip' type: 'InnerProduct' bottom: 'r' top: 'ip'\n"
    "        inner_product_param { num_output: 2 } }\n";

static void test_memory_plan(void **state) {
  (void)state;
  built ok;
  build_ok(&ok, big_net, NULL); /* no limit: what the machine has */
  const kiln_memory_plan *m = &ok.net->memory;
  const int64_t act = 64LL * 3 * 128 * 128;
  assert_true(m->activations >= 2 * act * 8); /* data and r, each with data and diff */
  assert_int_equal(m->params, (int64_t)(2 * act / 64 + 2) * 4);
  assert_int_equal(m->grads, m->params);
  assert_true(m->total >= m->params + m->grads + m->activations);
  int64_t total = m->total;
  char want[64];
  snprintf(want, sizeof want, "%.1f MiB", total / (double)(1 << 20));

  kiln_net_options o = train_opts();
  o.max_memory = 1 << 20;
  expect_build_error(big_net, &o, KILN_ERR_NOMEM, "activations", want, "'big'", NULL);

  /* Solver history counts too: a limit just above the plan without it fails with it. */
  o.max_memory = (uint64_t)total + 1024;
  built fits;
  build_ok(&fits, big_net, &o);
  built_free(&fits);
  o.history_per_param = 2;
  o.max_memory = (uint64_t)total + (uint64_t)m->params; /* one history copy short */
  expect_build_error(big_net, &o, KILN_ERR_NOMEM, NULL);
  built_free(&ok);
}

/* Inputs given a larger shape than the net was built with (kiln_net_reshape_inputs): the
 * convolution then asks for more workspace than planned, and the net's shared workspace grows
 * to it instead of being overrun (the sanitizer build would see an overrun). */
static void test_workspace_grows_past_the_plan(void **state) {
  (void)state;
  const char *text = "name: 'grow'\n"
                     "layer { name: 'in' type: 'Input' top: 'data'\n"
                     "  input_param { shape { dim: 1 dim: 3 dim: 8 dim: 8 } } }\n"
                     "layer { name: 'c' type: 'Convolution' bottom: 'data' top: 'c'\n"
                     "  convolution_param { num_output: 4 kernel_size: 3 pad: 1\n"
                     "    weight_filler { type: 'gaussian' std: 0.1 } } }\n";
  kiln_net_options o = train_opts();
  o.phase = CAFFE__PHASE__TEST;
  built b;
  build_ok(&b, text, &o);
  const int64_t planned = b.net->workspace_floats;
  kiln_blob *x = kiln_net_blob(b.net, "data");
  assert_int_equal(kiln_blob_reshape(x, 4, (const int64_t[]){2, 3, 40, 40}), KILN_OK);
  for (int64_t i = 0; i < x->count; i++) x->data[i] = (float)(i % 7) - 3.0f;
  assert_int_equal(kiln_net_reshape_inputs(b.net), KILN_OK);
  assert_true(b.net->workspace_floats > planned);
  for (int i = 0; i < b.net->nlayers; i++)
    assert_ptr_equal(b.net->layers[i]->workspace, b.net->workspace);
  assert_int_equal(kiln_net_forward(b.net, NULL), KILN_OK);
  const kiln_blob *y = kiln_net_blob(b.net, "c");
  assert_int_equal(y->count, 2 * 4 * 40 * 40);
  for (int64_t i = 0; i < y->count; i++) assert_true(isfinite(y->data[i]));
  built_free(&b);
}

/* ---- shared activation gradients ------------------------------------------------------------ */

/* A net with every kind of lifetime: in-place chains (BatchNorm, Scale, ReLU), a residual fork
 * (Split) joined by Eltwise, Concat of two poolings, Dropout, a top read only by Accuracy (its
 * diff is never written: it must stay zero for the Split that sums it), a Slice with an unused
 * top, and a branch cut with propagate_down: false. Shared gradient buffers must give the same
 * parameter gradients, bit for bit, as one buffer per blob, pass after pass, in less memory. */
static const char *lifetimes_net =
    "name: 'lifetimes'\n"
    "layer { name: 'data' type: 'DummyData' top: 'data' top: 'label'\n"
    "  dummy_data_param { shape { dim: 4 dim: 3 dim: 8 dim: 8 } shape { dim: 4 }\n"
    "    data_filler { type: 'gaussian' std: 1 } data_filler { type: 'constant' value: 2 } } }\n"
    "layer { name: 'c1' type: 'Convolution' bottom: 'data' top: 'c1'\n"
    "  convolution_param { num_output: 6 kernel_size: 3 pad: 1 weight_filler { type: 'xavier' } } }\n"
    "layer { name: 'bn1' type: 'BatchNorm' bottom: 'c1' top: 'c1' }\n"
    "layer { name: 'sc1' type: 'Scale' bottom: 'c1' top: 'c1' scale_param { bias_term: true } }\n"
    "layer { name: 'r1' type: 'ReLU' bottom: 'c1' top: 'c1' }\n"
    "layer { name: 'c2' type: 'Convolution' bottom: 'c1' top: 'c2'\n"
    "  convolution_param { num_output: 6 kernel_size: 3 pad: 1 weight_filler { type: 'xavier' } } }\n"
    "layer { name: 'bn2' type: 'BatchNorm' bottom: 'c2' top: 'c2' }\n"
    "layer { name: 'sum' type: 'Eltwise' bottom: 'c1' bottom: 'c2' top: 'sum' }\n"
    "layer { name: 'r2' type: 'ReLU' bottom: 'sum' top: 'sum' }\n"
    "layer { name: 'pmax' type: 'Pooling' bottom: 'sum' top: 'pmax'\n"
    "  pooling_param { pool: MAX kernel_size: 2 stride: 2 } }\n"
    "layer { name: 'pave' type: 'Pooling' bottom: 'sum' top: 'pave'\n"
    "  pooling_param { pool: AVE kernel_size: 2 stride: 2 } }\n"
    "layer { name: 'cat' type: 'Concat' bottom: 'pmax' bottom: 'pave' top: 'cat' }\n"
    "layer { name: 'sl' type: 'Slice' bottom: 'cat' top: 'sa' top: 'sb'\n"
    "  slice_param { axis: 1 slice_point: 8 } }\n"
    "layer { name: 'drop' type: 'Dropout' bottom: 'sa' top: 'sa' dropout_param { dropout_ratio: 0.3 } }\n"
    "layer { name: 'ip' type: 'InnerProduct' bottom: 'sa' top: 'ip'\n"
    "  inner_product_param { num_output: 5 weight_filler { type: 'gaussian' std: 0.1 } } }\n"
    "layer { name: 'side' type: 'InnerProduct' bottom: 'cat' top: 'side' propagate_down: false\n"
    "  inner_product_param { num_output: 5 weight_filler { type: 'gaussian' std: 0.1 } } }\n"
    "layer { name: 'both' type: 'Eltwise' bottom: 'ip' bottom: 'side' top: 'both' }\n"
    "layer { name: 'acc' type: 'Accuracy' bottom: 'both' bottom: 'label' top: 'acc' }\n"
    "layer { name: 'loss' type: 'SoftmaxWithLoss' bottom: 'both' bottom: 'label' top: 'loss' }\n";

static void test_shared_diffs_match_own_diffs(void **state) {
  (void)state;
  kiln_net_options own = train_opts(), shared = train_opts();
  shared.share_diffs = true;
  built a, b;
  build_ok(&a, lifetimes_net, &own);
  build_ok(&b, lifetimes_net, &shared);
  assert_true(b.net->memory.activations < a.net->memory.activations);
  assert_int_equal(a.net->nparam_floats, b.net->nparam_floats);
  size_t bytes = sizeof(float) * (size_t)a.net->nparam_floats;
  assert_memory_equal(a.net->param_data, b.net->param_data, bytes);
  for (int pass = 0; pass < 3; pass++) {
    float la, lb;
    kiln_net_zero_param_diff(a.net);
    kiln_net_zero_param_diff(b.net);
    assert_int_equal(kiln_net_forward(a.net, &la), KILN_OK);
    assert_int_equal(kiln_net_forward(b.net, &lb), KILN_OK);
    assert_true(la == lb);
    assert_int_equal(kiln_net_backward(a.net), KILN_OK);
    assert_int_equal(kiln_net_backward(b.net), KILN_OK);
    double norm = 0;
    for (int64_t i = 0; i < a.net->nparam_floats; i++) norm += fabs(a.net->param_diff[i]);
    assert_true(norm > 0);
    if (memcmp(a.net->param_diff, b.net->param_diff, bytes) != 0)
      fail_msg("pass %d: parameter gradients differ with shared activation gradients", pass);
    /* a step, so that the next pass sees new parameters */
    for (int64_t i = 0; i < a.net->nparam_floats; i++) {
      a.net->param_data[i] -= 0.1f * a.net->param_diff[i];
      b.net->param_data[i] -= 0.1f * b.net->param_diff[i];
    }
  }
  built_free(&a);
  built_free(&b);
}

/* Three training steps on two nets built from one text, with the same initial parameters: the
 * same parameter gradients to 1e-4 relative at each step (`na`, `nb` name the two in messages),
 * then an SGD step on each. `exact`: the loss, the parameters (BatchNorm's statistics among them)
 * and the data of `blobs` must also match bit for bit, and b continues from a's parameters;
 * otherwise the loss and parameters match to 1e-4. */
static void step_pair(kiln_net *a, kiln_net *b, uint64_t seed, bool exact, const char *na,
                      const char *nb, const char *const *blobs, int nblobs) {
  const size_t bytes = sizeof(float) * (size_t)a->nparam_floats;
  assert_int_equal(a->nparam_floats, b->nparam_floats);
  assert_memory_equal(a->param_data, b->param_data, bytes);
  for (int step = 0; step < 3; step++) {
    set_inputs(a, seed + (uint64_t)step);
    set_inputs(b, seed + (uint64_t)step);
    float la, lb;
    forward_backward(a, &la);
    forward_backward(b, &lb);
    for (int k = 0; k < nblobs; k++) {
      const kiln_blob *x = kiln_net_blob(a, blobs[k]), *y = kiln_net_blob(b, blobs[k]);
      assert_non_null(x);
      assert_non_null(y);
      if (memcmp(x->data, y->data, sizeof(float) * (size_t)x->count) != 0)
        fail_msg("step %d: blob '%s' differs between the %s and %s nets", step, blobs[k], na, nb);
    }
    if (exact) assert_true(la == lb);
    else assert_float_equal(lb, la, 1e-4 * (1 + fabsf(la)));
    double norm = 0;
    for (int64_t i = 0; i < a->nparam_floats; i++) {
      const float ga = a->param_diff[i], gb = b->param_diff[i];
      const float pa = a->param_data[i], pb = b->param_data[i];
      norm += fabs(ga);
      if (fabsf(ga - gb) > 1e-4f * (1 + fabsf(ga)))
        fail_msg("step %d: gradient %lld: %s %g, %s %g", step, (long long)i, na, ga, nb, gb);
      if (exact ? pa != pb : fabsf(pa - pb) > 1e-4f * (1 + fabsf(pa)))
        fail_msg("step %d: parameter %lld (BatchNorm statistics included) differs", step,
                 (long long)i);
    }
    assert_true(norm > 0);
    for (int64_t i = 0; i < a->nparam_floats; i++) {
      a->param_data[i] -= 0.05f * a->param_diff[i];
      b->param_data[i] = exact ? a->param_data[i] : b->param_data[i] - 0.05f * b->param_diff[i];
    }
  }
}

/* The TEST-phase nets of `text` under options a and b (phase and share_diffs set here) with
 * the parameters of the train nets ta and tb, and their losses on one input. */
static void test_pair(const char *text, kiln_net_options a, kiln_net_options b, kiln_net *ta,
                      kiln_net *tb, built *xa, built *xb, double *la, double *lb) {
  a.phase = b.phase = CAFFE__PHASE__TEST;
  a.share_diffs = b.share_diffs = false;
  build_ok(xa, text, &a);
  build_ok(xb, text, &b);
  assert_int_equal(kiln_net_share_params(xa->net, ta), KILN_OK);
  assert_int_equal(kiln_net_share_params(xb->net, tb), KILN_OK);
  set_inputs(xa->net, 99);
  set_inputs(xb->net, 99);
  *la = net_loss(xa->net);
  *lb = net_loss(xb->net);
}

/* ---- blocked activation layouts ------------------------------------------------------------ */

/* A residual block as resnet20 has them, after a max pooling with padding: conv -> BatchNorm ->
 * Scale -> ReLU -> conv ->
 * BatchNorm -> Scale, a shortcut (a Split the net inserts) summed by Eltwise, ReLU, then pooling
 * and a classifier that read the plain layout; 32 channels fill two blocks of 16. */
static const char *residual_net =
    "name: 'res'\n"
    "layer { name: 'in' type: 'Input' top: 'data' top: 'label'\n"
    "        input_param { shape { dim: 3 dim: 3 dim: 7 dim: 6 } shape { dim: 3 } } }\n"
    "layer { name: 'conv0' type: 'Convolution' bottom: 'data' top: 'c0'\n"
    "        convolution_param { num_output: 32 kernel_size: 3 pad: 1\n"
    "          weight_filler { type: 'msra' } bias_filler { type: 'gaussian' std: 0.1 } } }\n"
    "layer { name: 'relu0' type: 'ReLU' bottom: 'c0' top: 'c0' }\n"
    "layer { name: 'mp' type: 'Pooling' bottom: 'c0' top: 'p0'\n"
    "        pooling_param { pool: MAX kernel_size: 3 stride: 2 pad: 1 } }\n"
    "layer { name: 'conv1' type: 'Convolution' bottom: 'p0' top: 'c1'\n"
    "        convolution_param { num_output: 32 kernel_size: 3 pad: 1 bias_term: false\n"
    "          weight_filler { type: 'msra' } } }\n"
    "layer { name: 'bn1' type: 'BatchNorm' bottom: 'c1' top: 'c1' }\n"
    "layer { name: 'sc1' type: 'Scale' bottom: 'c1' top: 'c1'\n"
    "        scale_param { bias_term: true filler { type: 'uniform' min: 0.5 max: 1.5 }\n"
    "          bias_filler { type: 'uniform' min: -0.2 max: 0.2 } } }\n"
    "layer { name: 'relu1' type: 'ReLU' bottom: 'c1' top: 'c1' }\n"
    "layer { name: 'conv2' type: 'Convolution' bottom: 'c1' top: 'c2'\n"
    "        convolution_param { num_output: 32 kernel_size: 3 pad: 1 bias_term: false\n"
    "          weight_filler { type: 'msra' } } }\n"
    "layer { name: 'bn2' type: 'BatchNorm' bottom: 'c2' top: 'b2' }\n"
    "layer { name: 'sc2' type: 'Scale' bottom: 'b2' top: 'b2'\n"
    "        scale_param { bias_term: true filler { type: 'uniform' min: 0.5 max: 1.5 } } }\n"
    "layer { name: 'sum' type: 'Eltwise' bottom: 'b2' bottom: 'p0' top: 'sum' }\n"
    "layer { name: 'relu2' type: 'ReLU' bottom: 'sum' top: 'sum' }\n"
    "layer { name: 'pool' type: 'Pooling' bottom: 'sum' top: 'pool'\n"
    "        pooling_param { pool: AVE global_pooling: true } }\n"
    "layer { name: 'ip' type: 'InnerProduct' bottom: 'pool' top: 'ip'\n"
    "        inner_product_param { num_output: 3 weight_filler { type: 'xavier' } } }\n"
    "layer { name: 'loss' type: 'SoftmaxWithLoss' bottom: 'ip' bottom: 'label' top: 'loss' }\n";

/* The net keeps oneDNN's blocked layout between the layers that read it, and the result is the
 * plain-layout net's: same loss, same parameter gradients (to rounding; the sums run in another
 * order), same BatchNorm statistics, over a few steps in TRAIN and then in TEST. */
static void check_blocked_net(const char *residual_net) {
  kiln_net_options po = train_opts(), bo = train_opts();
  kiln_config plain_cfg = *kiln_test_config();
  plain_cfg.plain_layouts = true;
  po.config = &plain_cfg;
  po.share_diffs = bo.share_diffs = true;
  built p, b;
  build_ok(&p, residual_net, &po);
  build_ok(&b, residual_net, &bo);
  /* Where the blocked layout goes: between the convolutions and through BatchNorm, Scale, ReLU,
   * the shortcut's Split, Eltwise and pooling (whose 1x1 output is the same bytes in both
   * layouts, so the classifier reads it as it is); not into the Input's blob (3 channels) nor
   * the classifier's. */
  const char *blocked[] = {"c0", "p0", "c1", "c2", "b2", "sum", "pool"}, *plain[] = {"data", "ip"};
  for (int i = 0; i < 7; i++) {
    kiln_blob *x = kiln_net_blob(b.net, blocked[i]);
    assert_non_null(x);
    if (x->layout != KILN_LAYOUT_BLOCKED16) fail_msg("blob '%s' is not blocked", blocked[i]);
    assert_int_equal(kiln_net_blob(p.net, blocked[i])->layout, KILN_LAYOUT_PLAIN);
  }
  for (int i = 0; i < 2; i++) assert_int_equal(kiln_net_blob(b.net, plain[i])->layout, KILN_LAYOUT_PLAIN);
  int splits = 0;
  for (int i = 0; i < b.net->nblobs; i++)
    if (strstr(b.net->blobs[i]->name, "p0_") == b.net->blobs[i]->name) { /* Split's tops */
      assert_int_equal(b.net->blobs[i]->layout, KILN_LAYOUT_BLOCKED16);
      splits++;
    }
  assert_int_equal(splits, 2);
  step_pair(p.net, b.net, 40, false, "plain", "blocked", NULL, 0);
  /* TEST phase: BatchNorm normalises with the stored statistics. */
  built tp, tb;
  double a, c;
  test_pair(residual_net, po, bo, p.net, b.net, &tp, &tb, &a, &c);
  assert_int_equal(kiln_net_blob(tb.net, "c1")->layout, KILN_LAYOUT_BLOCKED16);
  assert_float_equal(c, a, 1e-4 * (1 + fabs(a)));
  built_free(&tp);
  built_free(&tb);
  built_free(&p);
  built_free(&b);
}

/* A convolution whose output cannot be blocked (12 channels) reads its input plain: oneDNN has
 * no optimised kernel from blocked to such an output. The convolution before it still works
 * blocked; and with 16 output channels (a plain output, for the classifier, of whole blocks)
 * the input stays blocked. */
static void test_plain_output_makes_plain_input(void **state) {
  (void)state;
  const char *engine = getenv("KILN_ENGINE");
  if (!kiln_dnnl_available() || (engine && !strcmp(engine, "ref"))) skip(); /* no oneDNN: plain */
  const char *fmt =
      "layer { name: 'in' type: 'Input' top: 'data' top: 'label'\n"
      "        input_param { shape { dim: 2 dim: 3 dim: 8 dim: 8 } shape { dim: 2 } } }\n"
      "layer { name: 'conv0' type: 'Convolution' bottom: 'data' top: 'c0'\n"
      "        convolution_param { num_output: 32 kernel_size: 3 pad: 1 } }\n"
      "layer { name: 'relu0' type: 'ReLU' bottom: 'c0' top: 'c0' }\n"
      "layer { name: 'conv1' type: 'Convolution' bottom: 'c0' top: 'c1'\n"
      "        convolution_param { num_output: 32 kernel_size: 3 pad: 1 } }\n"
      "layer { name: 'conv2' type: 'Convolution' bottom: 'c1' top: 'c2'\n"
      "        convolution_param { num_output: %d kernel_size: 3 pad: 1 } }\n"
      "layer { name: 'pool' type: 'Pooling' bottom: 'c2' top: 'pool'\n"
      "        pooling_param { pool: MAX kernel_size: 2 stride: 2 } }\n"
      "layer { name: 'ip' type: 'InnerProduct' bottom: 'pool' top: 'ip'\n"
      "        inner_product_param { num_output: 3 } }\n"
      "layer { name: 'loss' type: 'SoftmaxWithLoss' bottom: 'ip' bottom: 'label' top: 'loss' }\n";
  char text[2048];
  built b;
  snprintf(text, sizeof text, fmt, 16);
  build_ok(&b, text, NULL);
  assert_int_equal(kiln_net_blob(b.net, "c0")->layout, KILN_LAYOUT_BLOCKED16);
  assert_int_equal(kiln_net_blob(b.net, "c1")->layout, KILN_LAYOUT_BLOCKED16);
  built_free(&b);
  snprintf(text, sizeof text, fmt, 12);
  build_ok(&b, text, NULL);
  assert_int_equal(kiln_net_blob(b.net, "c2")->layout, KILN_LAYOUT_PLAIN);
  assert_int_equal(kiln_net_blob(b.net, "c1")->layout, KILN_LAYOUT_PLAIN);
  assert_int_equal(kiln_net_blob(b.net, "c0")->layout, KILN_LAYOUT_BLOCKED16);
  built_free(&b);
}

static void test_blocked_layouts_match_plain(void **state) {
  (void)state;
  const char *engine = getenv("KILN_ENGINE");
  if (!kiln_dnnl_available() || (engine && !strcmp(engine, "ref"))) skip(); /* no oneDNN: plain */
  check_blocked_net(residual_net);
  /* Another batch and odd image sizes (5x9, pooled to 3x5). */
  char other[4096];
  const char *at = strstr(residual_net, "dim: 3 dim: 3 dim: 7 dim: 6 } shape { dim: 3 }");
  assert_non_null(at);
  snprintf(other, sizeof other, "%.*s%s%s", (int)(at - residual_net), residual_net,
           "dim: 2 dim: 3 dim: 5 dim: 9 } shape { dim: 2 }",
           at + strlen("dim: 3 dim: 3 dim: 7 dim: 6 } shape { dim: 3 }"));
  check_blocked_net(other);
  /* A batch of 19: blocked BatchNorm sums in chunks of 8 images (8 + 8 + 3). */
  snprintf(other, sizeof other, "%.*s%s%s", (int)(at - residual_net), residual_net,
           "dim: 19 dim: 3 dim: 4 dim: 4 } shape { dim: 19 }",
           at + strlen("dim: 3 dim: 3 dim: 7 dim: 6 } shape { dim: 3 }"));
  check_blocked_net(other);
}

/* Scale working in place right after BatchNorm reads BatchNorm's normalised output instead of
 * saving its own copy of the input: no buffer of its own, and the gradients still match finite
 * differences. */
static void test_scale_after_batchnorm_reads_its_copy(void **state) {
  (void)state;
  const char *text =
      "name: 'bns'\n"
      "layer { name: 'in' type: 'Input' top: 'data' top: 'label'\n"
      "        input_param { shape { dim: 4 dim: 2 dim: 4 dim: 3 } shape { dim: 4 } } }\n"
      "layer { name: 'conv' type: 'Convolution' bottom: 'data' top: 'c'\n"
      "        convolution_param { num_output: 3 kernel_size: 3 pad: 1\n"
      "          weight_filler { type: 'gaussian' std: 0.5 } } }\n"
      "layer { name: 'bn' type: 'BatchNorm' bottom: 'c' top: 'c' }\n"
      "layer { name: 'sc' type: 'Scale' bottom: 'c' top: 'c'\n"
      "        scale_param { bias_term: true filler { type: 'uniform' min: 0.5 max: 1.5 }\n"
      "          bias_filler { type: 'uniform' min: -0.5 max: 0.5 } } }\n"
      "layer { name: 'relu' type: 'ReLU' bottom: 'c' top: 'c' }\n"
      "layer { name: 'ip' type: 'InnerProduct' bottom: 'c' top: 'ip'\n"
      "        inner_product_param { num_output: 3 weight_filler { type: 'xavier' } } }\n"
      "layer { name: 'loss' type: 'SoftmaxWithLoss' bottom: 'ip' bottom: 'label' top: 'loss' }\n";
  kiln_net_options o = train_opts();
  built b;
  build_ok(&b, text, &o);
  kiln_layer *sc = must_layer(b.net, "sc");
  assert_ptr_equal(sc->input_copy, must_layer(b.net, "bn")->buffer[0]);
  assert_int_equal(sc->buffer[0]->count, 1);
  set_inputs(b.net, 5);
  float loss;
  forward_backward(b.net, &loss);
  float *dp = copy_floats(b.net->param_diff, b.net->nparam_floats);
  assert_int_equal(fd_check(b.net, b.net->param_data, dp, b.net->nparam_floats, "param"), 0);
  free(dp);
  built_free(&b);
}

/* ---- fusion -------------------------------------------------------------------------------- */

/* BatchNorm with the Scale and ReLU after it run as one layer, and an Eltwise sum with the ReLU
 * after it (kiln_layer_ops.fuse), give the unfused net's results: the same forward bits (the
 * fused kernels compute Scale's and ReLU's expressions), and the same gradients and BatchNorm
 * statistics to rounding (its sums run in another order), over a few steps, then in TEST.
 * `groups` names each fused head and how many layers it takes; the unfused net has none. */
typedef struct {
  const char *head;
  int fused;
} fuse_group;

static void check_fused_net(const char *text, bool plain, const fuse_group *groups, int ngroups,
                            const char *const *blobs, int nblobs) {
  kiln_net_options uo = train_opts(), fo = train_opts();
  kiln_config uc = *kiln_test_config(), fc = *kiln_test_config();
  if (plain) uc.plain_layouts = fc.plain_layouts = true;
  uc.unfused = true;
  uo.config = &uc;
  fo.config = &fc;
  uo.share_diffs = fo.share_diffs = true;
  built u, f;
  build_ok(&u, text, &uo);
  build_ok(&f, text, &fo);
  for (int i = 0; i < u.net->nlayers; i++) {
    assert_int_equal(u.net->layers[i]->fused, 0);
    assert_null(u.net->layers[i]->fused_into);
  }
  int absorbed = 0;
  for (int i = 0; i < f.net->nlayers; i++) absorbed += f.net->layers[i]->fused_into != NULL;
  int expect = 0;
  for (int g = 0; g < ngroups; g++) {
    int h = layer_index(f.net, groups[g].head);
    assert_true(h >= 0);
    if (f.net->layers[h]->fused != groups[g].fused)
      fail_msg("layer '%s' fuses %d layers, expected %d", groups[g].head, f.net->layers[h]->fused,
               groups[g].fused);
    for (int j = 1; j <= groups[g].fused; j++)
      assert_ptr_equal(f.net->layers[h + j]->fused_into, f.net->layers[h]);
    expect += groups[g].fused;
  }
  assert_int_equal(absorbed, expect);
  step_pair(u.net, f.net, 70, true, "unfused", "fused", blobs, nblobs);
  built tu, tf;
  double lu, lf;
  test_pair(text, uo, fo, u.net, f.net, &tu, &tf, &lu, &lf);
  assert_int_equal(tf.net->layers[layer_index(tf.net, groups[0].head)]->fused, groups[0].fused);
  assert_true(lu == lf);
  built_free(&tu);
  built_free(&tf);
  built_free(&u);
  built_free(&f);
}

/* residual_net with the text `from` replaced by `to` (once) into buf. */
static const char *edit_net(char *buf, size_t n, const char *text, const char *from,
                            const char *to) {
  const char *at = strstr(text, from);
  assert_non_null(at);
  snprintf(buf, n, "%.*s%s%s", (int)(at - text), text, to, at + strlen(from));
  return buf;
}

static void test_fused_batchnorm_matches_unfused(void **state) {
  (void)state;
  /* bn1 + sc1 + relu1 in place; bn2 (out of place) + sc2, an Eltwise after it; the Eltwise sum +
   * relu2. */
  const fuse_group res[] = {{"bn1", 2}, {"bn2", 1}, {"sum", 1}};
  const char *blobs[] = {"c1", "b2", "sum", "loss"};
  char a[4096], b[4096];
  const char *engine = getenv("KILN_ENGINE");
  const bool blocked = kiln_dnnl_available() && !(engine && !strcmp(engine, "ref"));
  for (int plain = blocked ? 0 : 1; plain < 2; plain++) {
    check_fused_net(residual_net, plain, res, 3, blobs, 4);
    /* a leaky ReLU; a batch of 19 (chunks of 8 + 8 + 3 in the blocked sums) */
    edit_net(a, sizeof a, residual_net, "name: 'relu1' type: 'ReLU' bottom: 'c1' top: 'c1' }",
             "name: 'relu1' type: 'ReLU' bottom: 'c1' top: 'c1'\n"
             "        relu_param { negative_slope: 0.1 } }");
    check_fused_net(a, plain, res, 3, blobs, 4);
    edit_net(b, sizeof b, residual_net, "dim: 3 dim: 3 dim: 7 dim: 6 } shape { dim: 3 }",
             "dim: 19 dim: 3 dim: 4 dim: 4 } shape { dim: 19 }");
    check_fused_net(b, plain, res, 3, blobs, 4);
    /* The sum with coefficients over three bottoms (one pass per bottom after the first two),
     * then a leaky ReLU. */
    char c[4096];
    edit_net(a, sizeof a, residual_net, "bottom: 'b2' bottom: 'p0' top: 'sum' }",
             "bottom: 'b2' bottom: 'p0' bottom: 'c1' top: 'sum'\n"
             "        eltwise_param { coeff: 1 coeff: 0.5 coeff: -2 } }");
    edit_net(c, sizeof c, a, "name: 'relu2' type: 'ReLU' bottom: 'sum' top: 'sum' }",
             "name: 'relu2' type: 'ReLU' bottom: 'sum' top: 'sum'\n"
             "        relu_param { negative_slope: 0.2 } }");
    check_fused_net(c, plain, res, 3, blobs, 4);
    /* The sum in place on its first bottom: that bottom's gradient is the top's. */
    edit_net(a, sizeof a, residual_net, "bottom: 'b2' bottom: 'p0' top: 'sum' }",
             "bottom: 'b2' bottom: 'p0' top: 'b2' }");
    edit_net(c, sizeof c, a, "bottom: 'sum' top: 'sum' }", "bottom: 'b2' top: 'b2' }");
    edit_net(b, sizeof b, c, "bottom: 'sum' top: 'pool'", "bottom: 'b2' top: 'pool'");
    const char *inplace_blobs[] = {"c1", "b2", "loss"};
    check_fused_net(b, plain, res, 3, inplace_blobs, 3);
  }
  /* Not fused: a Scale without beta, or one that is not in place. */
  edit_net(a, sizeof a, residual_net,
           "scale_param { bias_term: true filler { type: 'uniform' min: 0.5 max: 1.5 }\n"
           "          bias_filler",
           "scale_param { bias_term: false filler { type: 'uniform' min: 0.5 max: 1.5 }\n"
           "          bias_filler");
  const fuse_group only_bn2[] = {{"bn2", 1}, {"bn1", 0}, {"sum", 1}};
  check_fused_net(a, true, only_bn2, 3, blobs, 4);
  /* BatchNorm on the net's input: nothing flows below it, but Scale's gamma and beta still get
   * their gradients from the fused backward. */
  const char *first =
      "name: 'bnfirst'\n"
      "layer { name: 'in' type: 'Input' top: 'data' top: 'label'\n"
      "        input_param { shape { dim: 5 dim: 16 dim: 3 dim: 2 } shape { dim: 5 } } }\n"
      "layer { name: 'bn' type: 'BatchNorm' bottom: 'data' top: 'n' }\n"
      "layer { name: 'sc' type: 'Scale' bottom: 'n' top: 'n'\n"
      "        scale_param { bias_term: true filler { type: 'uniform' min: 0.5 max: 1.5 }\n"
      "          bias_filler { type: 'uniform' min: -0.5 max: 0.5 } } }\n"
      "layer { name: 'relu' type: 'ReLU' bottom: 'n' top: 'n' }\n"
      "layer { name: 'ip' type: 'InnerProduct' bottom: 'n' top: 'ip'\n"
      "        inner_product_param { num_output: 3 weight_filler { type: 'xavier' } } }\n"
      "layer { name: 'loss' type: 'SoftmaxWithLoss' bottom: 'ip' bottom: 'label' top: 'loss' }\n";
  const fuse_group fg[] = {{"bn", 2}};
  const char *fb[] = {"n", "loss"};
  check_fused_net(first, true, fg, 1, fb, 2);
}

/* ---- weights ------------------------------------------------------------------------------------ */

static const char *weights_fmt =
    "name: 'wnet'\n"
    "layer { name: 'in' type: 'Input' top: 'data' top: 'label'\n"
    "        input_param { shape { dim: 2 dim: 1 dim: 6 dim: 6 } shape { dim: 2 } } }\n"
    "layer { name: 'conv' type: 'Convolution' bottom: 'data' top: 'conv'\n"
    "        convolution_param { num_output: 2 kernel_size: 3\n"
    "          weight_filler { type: 'gaussian' std: 0.1 } bias_filler { type: 'gaussian' std: 0.1 } } }\n"
    "layer { name: 'ip' type: 'InnerProduct' bottom: 'conv' top: 'ip'\n"
    "        inner_product_param { num_output: %d %s weight_filler { type: 'xavier' }\n"
    "          bias_filler { type: 'uniform' min: -1 max: 1 } } }\n"
    "layer { name: 'loss' type: 'SoftmaxWithLoss' bottom: 'ip' bottom: 'label' top: 'loss' }\n";

static bool dir_has_tmp(const char *dir) {
  DIR *d = opendir(dir);
  assert_non_null(d);
  bool found = false;
  struct dirent *e;
  while ((e = readdir(d)))
    if (strstr(e->d_name, ".tmp")) found = true;
  closedir(d);
  return found;
}

static void test_weights_round_trip(void **state) {
  (void)state;
  char dir[64], path[256], text[4096];
  make_tmpdir(dir, sizeof dir, "net");
  snprintf(path, sizeof path, "%s/w.caffemodel", dir);
  snprintf(text, sizeof text, weights_fmt, 3, "");
  built a, b;
  build_ok(&a, text, NULL);
  kiln_net_options o = train_opts();
  o.seed = 99;
  build_ok(&b, text, &o);
  assert_int_equal(a.net->nlearnable, 4);
  assert_int_equal(a.net->nparam_floats, b.net->nparam_floats);
  bool differ = false;
  for (int k = 0; k < a.net->nlearnable; k++)
    differ |= memcmp(a.net->learnable[k]->data, b.net->learnable[k]->data,
                     sizeof(float) * (size_t)a.net->learnable[k]->count) != 0;
  assert_true(differ); /* another seed, other weights: the load must do the work */

  assert_int_equal(kiln_net_save_weights(a.net, path), KILN_OK);
  assert_false(dir_has_tmp(dir));
  /* The file is a NetParameter with the learnable layers' blobs and no Split layers. */
  ProtobufCMessage *m;
  assert_int_equal(kiln_proto_read_binary(path, &caffe__net_parameter__descriptor, &m), KILN_OK);
  Caffe__NetParameter *np = (Caffe__NetParameter *)m;
  int with_blobs = 0;
  for (size_t i = 0; i < np->n_layer; i++) {
    assert_string_not_equal(np->layer[i]->type, "Split");
    if (np->layer[i]->n_blobs) {
      with_blobs++;
      assert_int_equal(np->layer[i]->n_blobs, 2);
      assert_non_null(np->layer[i]->blobs[0]->shape);
    }
  }
  assert_int_equal(with_blobs, 2);
  protobuf_c_message_free_unpacked(m, NULL);

  assert_int_equal(kiln_net_load_weights(b.net, path), KILN_OK);
  for (int k = 0; k < a.net->nlearnable; k++)
    assert_memory_equal(a.net->learnable[k]->data, b.net->learnable[k]->data,
                        sizeof(float) * (size_t)a.net->learnable[k]->count);
  /* Same weights, same inputs: the same loss. */
  set_inputs(a.net, 1);
  set_inputs(b.net, 1);
  assert_true(net_loss(a.net) == net_loss(b.net));
  built_free(&b);

  /* A blob whose shape differs: KILN_ERR_SHAPE naming the layer. */
  snprintf(text, sizeof text, weights_fmt, 4, "");
  build_ok(&b, text, NULL);
  float *before = copy_floats(b.net->param_data, b.net->nparam_floats);
  assert_int_equal(kiln_net_load_weights(b.net, path), KILN_ERR_SHAPE);
  assert_contains(kiln_last_error(), "'ip'");
  assert_contains(kiln_last_error(), path);
  free(before);
  built_free(&b);
  /* A missing bias blob: also a shape error naming the layer. */
  snprintf(text, sizeof text, weights_fmt, 3, "bias_term: false");
  build_ok(&b, text, NULL);
  assert_int_equal(kiln_net_load_weights(b.net, path), KILN_ERR_SHAPE);
  assert_contains(kiln_last_error(), "'ip'");
  built_free(&b);

  /* Truncated and corrupt files fail cleanly and change nothing. */
  char *buf;
  size_t len;
  assert_int_equal(kiln_read_file(path, &buf, &len), KILN_OK);
  assert_true(len > 100);
  char bad_path[256];
  snprintf(bad_path, sizeof bad_path, "%s/truncated.caffemodel", dir);
  write_plain(bad_path, buf, len / 2);
  snprintf(text, sizeof text, weights_fmt, 3, "");
  build_ok(&b, text, &o);
  float *keep = copy_floats(b.net->param_data, b.net->nparam_floats);
  int rc = kiln_net_load_weights(b.net, bad_path);
  assert_int_not_equal(rc, KILN_OK);
  assert_contains(kiln_last_error(), bad_path);
  assert_memory_equal(keep, b.net->param_data, sizeof(float) * (size_t)b.net->nparam_floats);
  for (size_t i = 0; i < len; i += 7) buf[i] = (char)(buf[i] ^ 0x5a);
  snprintf(bad_path, sizeof bad_path, "%s/corrupt.caffemodel", dir);
  write_plain(bad_path, buf, len);
  rc = kiln_net_load_weights(b.net, bad_path);
  assert_int_not_equal(rc, KILN_OK);
  assert_contains(kiln_last_error(), bad_path);
  snprintf(bad_path, sizeof bad_path, "%s/missing.caffemodel", dir);
  assert_int_equal(kiln_net_load_weights(b.net, bad_path), KILN_ERR_IO);
  free(buf);
  free(keep);

  /* Saving where it cannot be written leaves nothing behind. */
  snprintf(bad_path, sizeof bad_path, "%s/no/such/dir/w.caffemodel", dir);
  assert_int_equal(kiln_net_save_weights(b.net, bad_path), KILN_ERR_IO);
  assert_false(dir_has_tmp(dir));
  built_free(&b);
  built_free(&a);
  rm_tree(dir);
}

/* A .caffemodel of Caffe before 2015: V1 layers (`layers`, type enums) whose blobs carry the
 * legacy num/channels/height/width dims. It is upgraded on load and gives the same weights. */
static void test_weights_v1_caffemodel(void **state) {
  (void)state;
  char dir[64], path[256], v1path[256], text[4096];
  make_tmpdir(dir, sizeof dir, "net");
  snprintf(path, sizeof path, "%s/w.caffemodel", dir);
  snprintf(v1path, sizeof v1path, "%s/v1.caffemodel", dir);
  snprintf(text, sizeof text, weights_fmt, 3, "");
  built a, b;
  build_ok(&a, text, NULL);
  kiln_net_options o = train_opts();
  o.seed = 99;
  build_ok(&b, text, &o);
  assert_int_equal(kiln_net_save_weights(a.net, path), KILN_OK);
  ProtobufCMessage *m;
  assert_int_equal(kiln_proto_read_binary(path, &caffe__net_parameter__descriptor, &m), KILN_OK);
  Caffe__NetParameter *np = (Caffe__NetParameter *)m;
  /* the same layers as V1 messages: types as enums, blobs with 4 legacy dims */
  Caffe__V1LayerParameter v1[8], *v1p[8];
  Caffe__BlobShape *shapes[16];
  int nv1 = 0, nshapes = 0;
  assert_true(np->n_layer <= 8);
  for (size_t li = 0; li < np->n_layer; li++) {
    Caffe__LayerParameter *l = np->layer[li];
    if (!strcmp(l->type, "Input")) continue; /* V1 had no Input layer type */
    int i = nv1++;
    caffe__v1_layer_parameter__init(&v1[i]);
    v1p[i] = &v1[i];
    v1[i].name = l->name;
    v1[i].has_type = 1;
    v1[i].type = !strcmp(l->type, "Convolution")    ? CAFFE__V1_LAYER_PARAMETER__LAYER_TYPE__CONVOLUTION
                 : !strcmp(l->type, "InnerProduct") ? CAFFE__V1_LAYER_PARAMETER__LAYER_TYPE__INNER_PRODUCT
                 : !strcmp(l->type, "SoftmaxWithLoss") ? CAFFE__V1_LAYER_PARAMETER__LAYER_TYPE__SOFTMAX_LOSS
                                                       : CAFFE__V1_LAYER_PARAMETER__LAYER_TYPE__NONE;
    v1[i].n_blobs = l->n_blobs;
    v1[i].blobs = l->blobs;
    for (size_t k = 0; k < l->n_blobs; k++) {
      Caffe__BlobProto *bp = l->blobs[k];
      int64_t d[4] = {1, 1, 1, 1};
      size_t n = bp->shape->n_dim;
      for (size_t j = 0; j < n; j++) d[4 - n + j] = bp->shape->dim[j];
      bp->has_num = bp->has_channels = bp->has_height = bp->has_width = 1;
      bp->num = (int32_t)d[0], bp->channels = (int32_t)d[1], bp->height = (int32_t)d[2], bp->width = (int32_t)d[3];
      assert_true(nshapes < 16);
      shapes[nshapes++] = bp->shape;
      bp->shape = NULL; /* legacy dims only, as V1 files have them */
    }
  }
  Caffe__NetParameter old = CAFFE__NET_PARAMETER__INIT;
  old.name = np->name;
  old.n_layers = (size_t)nv1;
  old.layers = v1p;
  assert_int_equal(kiln_proto_write_binary(v1path, &old.base), KILN_OK);
  int rc = kiln_net_load_weights(b.net, v1path);
  if (rc) fprintf(stderr, "%s\n", kiln_last_error());
  assert_int_equal(rc, KILN_OK);
  for (int k = 0; k < a.net->nlearnable; k++)
    assert_memory_equal(a.net->learnable[k]->data, b.net->learnable[k]->data,
                        sizeof(float) * (size_t)a.net->learnable[k]->count);
  for (int k = 0; k < nshapes; k++) protobuf_c_message_free_unpacked(&shapes[k]->base, NULL);
  protobuf_c_message_free_unpacked(m, NULL);
  built_free(&b);
  built_free(&a);
  rm_tree(dir);
}

/* Loading into a net whose layers share a parameter writes the shared storage. */
static void test_weights_with_shared_params(void **state) {
  (void)state;
  char dir[64], path[256], text[4096];
  make_tmpdir(dir, sizeof dir, "net");
  snprintf(path, sizeof path, "%s/s.caffemodel", dir);
  snprintf(text, sizeof text, shared_fmt, 5, "", 3);
  built a, b;
  build_ok(&a, text, NULL);
  kiln_net_options o = train_opts();
  o.seed = 1234;
  build_ok(&b, text, &o);
  assert_int_equal(kiln_net_save_weights(a.net, path), KILN_OK);
  assert_int_equal(kiln_net_load_weights(b.net, path), KILN_OK);
  for (int k = 0; k < a.net->nlearnable; k++)
    assert_memory_equal(a.net->learnable[k]->data, b.net->learnable[k]->data,
                        sizeof(float) * (size_t)a.net->learnable[k]->count);
  assert_ptr_equal(must_layer(b.net, "ip2")->param[0]->data, must_layer(b.net, "ip1")->param[0]->data);
  built_free(&a);
  built_free(&b);
  rm_tree(dir);
}

/* ---- figures derived from a test pass ------------------------------------------------------ */

/* A tagger's outputs over T x N = 2 x 2 steps of 2 classes: a per-token cross-entropy and F1's
 * counts of class 1. */
static const char *derived_net =
    "layer { name: 'in' type: 'Input' top: 'seq' top: 'tags'\n"
    "        input_param { shape { dim: 2 dim: 2 dim: 2 } shape { dim: 2 dim: 2 } } }\n"
    "layer { name: 'loss' type: 'SoftmaxWithLoss' bottom: 'seq' bottom: 'tags' top: 'loss'\n"
    "        softmax_param { axis: 2 } }\n"
    "layer { name: 'f1' type: 'F1' bottom: 'seq' bottom: 'tags' top: 'tp' top: 'fp' top: '%s'\n"
    "        f1_param { axis: 2 } }\n";

/* One batch: each step predicts pred[i] (a score of 2 against 0) with tag tags[i]. */
static void tag_batch(kiln_net *net, const int *pred, const int *tags) {
  kiln_blob *seq = kiln_net_blob(net, "seq"), *t = kiln_net_blob(net, "tags");
  for (int i = 0; i < 4; i++) {
    seq->data[2 * i] = pred[i] ? 0 : 2;
    seq->data[2 * i + 1] = pred[i] ? 2 : 0;
    t->data[i] = (float)tags[i];
  }
}

/* Precision, recall and f1 come from the pass's mean counts, so they are the pooled ones:
 * batch A has tp 3, fn 1 (f1 6/7), batch B fp 1, fn 2 (f1 0); the pass has tp 3, fp 1, fn 3,
 * f1 = 6 / (6 + 1 + 3) = 0.6, where the mean of the two batches' f1 is 3/7. Perplexity is exp
 * of the mean loss. A figure whose name an output already has is that output's. */
static void test_derived_metrics_pool_the_pass(void **state) {
  (void)state;
  char text[1024];
  snprintf(text, sizeof text, derived_net, "fn");
  built b;
  build_ok(&b, text, NULL);
  const int pred[2][4] = {{1, 1, 1, 0}, {1, 0, 0, 0}}, tags[2][4] = {{1, 1, 1, 1}, {0, 1, 1, 0}};
  double mean[4] = {0};
  assert_int_equal(b.net->noutputs, 4);
  for (int k = 0; k < 2; k++) {
    tag_batch(b.net, pred[k], tags[k]);
    float loss;
    assert_int_equal(kiln_net_forward(b.net, &loss), KILN_OK);
    for (int o = 0; o < 4; o++) mean[o] += b.net->outputs[o]->data[0] / 2.0;
  }
  kiln_derived_metric d[KILN_NET_MAX_DERIVED];
  assert_int_equal(kiln_net_derived_metrics(b.net, mean, d), 4);
  const char *names[4] = {"perplexity", "precision", "recall", "f1"};
  int loss_out = -1;
  for (int o = 0; o < 4; o++)
    if (!strcmp(b.net->outputs[o]->name, "loss")) loss_out = o;
  assert_true(loss_out >= 0);
  const double want[4] = {exp(mean[loss_out]), 0.75, 0.5, 0.6};
  for (int k = 0; k < 4; k++) {
    assert_string_equal(d[k].name, names[k]);
    assert_float_equal(d[k].value, want[k], 1e-9);
  }
  assert_string_equal(d[0].from, "exp of loss");
  assert_string_equal(d[3].from, "2 tp / (2 tp + fp + fn)");
  built_free(&b);
  /* an output named f1 (here the false negatives) stands for itself */
  snprintf(text, sizeof text, derived_net, "f1");
  build_ok(&b, text, NULL);
  int n = kiln_net_derived_metrics(b.net, mean, d);
  assert_int_equal(n, 3);
  for (int k = 0; k < n; k++) assert_string_not_equal(d[k].name, "f1");
  built_free(&b);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_phase_level_stage_rules),
      cmocka_unit_test(test_include_and_exclude_is_error),
      cmocka_unit_test(test_in_place_shares_blob),
      cmocka_unit_test(test_top_reuse_not_in_place_is_error),
      cmocka_unit_test(test_missing_bottom_is_error),
      cmocka_unit_test(test_split_for_fanout),
      cmocka_unit_test(test_split_for_loss_weighted_top_also_consumed),
      cmocka_unit_test(test_loss_weight_default_and_explicit),
      cmocka_unit_test(test_lr_mult_decay_mult),
      cmocka_unit_test(test_param_sharing_by_name),
      cmocka_unit_test(test_need_backward),
      cmocka_unit_test(test_need_backward_everywhere),
      cmocka_unit_test(test_deploy_headers),
      cmocka_unit_test(test_unknown_type_and_bottom_count),
      cmocka_unit_test(test_memory_plan),
      cmocka_unit_test(test_workspace_grows_past_the_plan),
      cmocka_unit_test(test_shared_diffs_match_own_diffs),
      cmocka_unit_test(test_blocked_layouts_match_plain),
      cmocka_unit_test(test_plain_output_makes_plain_input),
      cmocka_unit_test(test_scale_after_batchnorm_reads_its_copy),
      cmocka_unit_test(test_fused_batchnorm_matches_unfused),
      cmocka_unit_test(test_weights_round_trip),
      cmocka_unit_test(test_weights_v1_caffemodel),
      cmocka_unit_test(test_weights_with_shared_params),
      cmocka_unit_test(test_derived_metrics_pool_the_pass),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
