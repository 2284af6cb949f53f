/* Solver behaviour: the seven lr policies against Caffe's formulas, few-step trajectories of
 * every update rule computed independently in double, iter_size accumulation, gradient
 * clipping, solver type selection and errors, exact resume from snapshots (data cursor and
 * generator state included, with a negative control), restore errors, test passes as events
 * (with precision, recall and f1 derived from a whole pass), and divergence detection. Solver
 * and net files live in a mkdtemp() folder with a small LMDB written by kiln_datum_writer. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <ftw.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kiln/data.h"
#include "kiln/metrics.h"
#include "kiln/solver.h"
#include "gradcheck.h"
/* The private state, for what has no accessor: the lr policy and resume checks set the iteration
 * directly and read multistep's position. */
#include "solver/solver_internal.h"

/* ---- fixture: a folder with a 64-record LMDB of 1x4x4 bytes, labels 0..3 ------------------ */

typedef struct fixture {
  char dir[64];
  char lmdb[128];
  int nfile;
} fixture;

static fixture *F;

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
  (void)st, (void)flag, (void)ftw;
  return remove(path);
}

static int group_setup(void **state) {
  (void)state;
  kiln_log_set_level(KILN_LOG_WARN);
  F = calloc(1, sizeof *F);
  if (!F) return -1;
  snprintf(F->dir, sizeof F->dir, "/tmp/kiln-test-solver-XXXXXX");
  if (!mkdtemp(F->dir)) return -1;
  snprintf(F->lmdb, sizeof F->lmdb, "%s/train_lmdb", F->dir);
  kiln_datum_writer *w;
  if (kiln_datum_writer_open(F->lmdb, &w)) return -1;
  kiln_rng r;
  kiln_rng_seed(&r, 2024, 1);
  for (int i = 0; i < 64; i++) {
    uint8_t px[16];
    int label = i % 4;
    /* a learnable pattern: the label's quadrant is bright, the rest is noise */
    for (int k = 0; k < 16; k++) {
      int quadrant = ((k / 4) / 2) * 2 + (k % 4) / 2;
      px[k] = (uint8_t)(kiln_rng_below(&r, 100) + (quadrant == label ? 150 : 0));
    }
    char key[16];
    snprintf(key, sizeof key, "%08d", i);
    kiln_datum d = {.channels = 1, .height = 4, .width = 4, .label = label, .u8 = px};
    if (kiln_datum_writer_put(w, key, &d)) {
      kiln_datum_writer_abort(w);
      return -1;
    }
  }
  return kiln_datum_writer_commit(w) ? -1 : 0;
}

static int group_teardown(void **state) {
  (void)state;
  nftw(F->dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
  free(F);
  return 0;
}

static void path_in(const char *name, char *buf, size_t n) { snprintf(buf, n, "%s/%s", F->dir, name); }

static void write_text(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  assert_int_equal(fputs(text, f) >= 0, 1);
  fclose(f);
}

/* Writes the net and a solver naming it (net: relative to the solver's folder), returns the
 * solver path in `solver_path`. `solver_body` gets `net: ...` added. */
static void write_pair(const char *net_text, const char *solver_body, char *solver_path, size_t n) {
  int id = F->nfile++;
  char net_name[64], net_path[256], text[8192];
  snprintf(net_name, sizeof net_name, "net_%d.prototxt", id);
  path_in(net_name, net_path, sizeof net_path);
  write_text(net_path, net_text);
  char sname[64];
  snprintf(sname, sizeof sname, "solver_%d.prototxt", id);
  path_in(sname, solver_path, n);
  snprintf(text, sizeof text, "net: \"%s\"\n%s", net_name, solver_body);
  write_text(solver_path, text);
}

/* Solver options naming only the tests' configuration. */
#define TEST_OPTS (&(kiln_solver_options){.config = kiln_test_config()})

/* `opt` (NULL: none) with the tests' configuration when it names none. */
static kiln_solver_options with_config(const kiln_solver_options *opt) {
  kiln_solver_options o = {0};
  if (opt) o = *opt;
  if (!o.config) o.config = kiln_test_config();
  return o;
}

static kiln_solver *make_solver(const char *net_text, const char *solver_body,
                                const kiln_solver_options *opt) {
  char sp[256];
  write_pair(net_text, solver_body, sp, sizeof sp);
  kiln_solver *s = NULL;
  kiln_solver_options o = with_config(opt);
  int rc = kiln_solver_create(sp, &o, &s);
  if (rc) fprintf(stderr, "solver create: %s\n", kiln_last_error());
  assert_int_equal(rc, KILN_OK);
  return s;
}

static int make_solver_opt_rc(const char *net_text, const char *solver_body,
                              const kiln_solver_options *opt, char *err, size_t n) {
  char sp[256];
  write_pair(net_text, solver_body, sp, sizeof sp);
  kiln_solver *s = NULL;
  kiln_solver_options o = with_config(opt);
  int rc = kiln_solver_create(sp, &o, &s);
  snprintf(err, n, "%s", rc ? kiln_last_error() : "");
  if (rc) assert_null(s);
  kiln_solver_free(s);
  return rc;
}

static int make_solver_rc(const char *net_text, const char *solver_body, char *err, size_t n) {
  return make_solver_opt_rc(net_text, solver_body, NULL, err, n);
}

static void assert_contains(const char *hay, const char *needle) {
  if (!strstr(hay, needle)) fprintf(stderr, "'%s' does not contain '%s'\n", hay, needle);
  assert_non_null(strstr(hay, needle));
}

static float *snapshot_params(const kiln_net *net) {
  float *p = malloc(sizeof(float) * (size_t)net->nparam_floats);
  assert_non_null(p);
  memcpy(p, net->param_data, sizeof(float) * (size_t)net->nparam_floats);
  return p;
}

static bool close_to(double got, double want, double tol) {
  return fabs(got - want) <= tol * fmax(1.0, fabs(want));
}

/* ---- nets ------------------------------------------------------------------------------------ */

/* Input-fed: the test writes data and labels by hand. */
static const char *tiny_net =
    "name: 'tiny'\n"
    "layer { name: 'data' type: 'Input' top: 'data' top: 'label'\n"
    "        input_param { shape { dim: 4 dim: 3 } shape { dim: 4 } } }\n"
    "layer { name: 'ip' type: 'InnerProduct' bottom: 'data' top: 'ip'\n"
    "        param { lr_mult: 1 decay_mult: 1 } param { lr_mult: 2 decay_mult: 0 }\n"
    "        inner_product_param { num_output: 3 weight_filler { type: 'gaussian' std: 0.5 }\n"
    "                              bias_filler { type: 'uniform' min: -0.2 max: 0.2 } } }\n"
    "layer { name: 'loss' type: 'SoftmaxWithLoss' bottom: 'ip' bottom: 'label' top: 'loss' }\n";

static void set_tiny_inputs(kiln_net *net) {
  kiln_blob *d = kiln_net_blob(net, "data"), *l = kiln_net_blob(net, "label");
  assert_non_null(d);
  assert_non_null(l);
  kiln_rng r;
  kiln_rng_seed(&r, 77, 3);
  for (int64_t i = 0; i < d->count; i++) d->data[i] = kiln_rng_uniform(&r, -1.5f, 1.5f);
  const float labels[4] = {0, 1, 2, 1};
  for (int i = 0; i < 4; i++) l->data[i] = labels[i];
}

/* Data-fed, from the fixture's LMDB. %s: the LMDB path; %d: batch size; %s: extra layers after
 * relu1 (Dropout). */
static const char *data_net_fmt =
    "name: 'datanet'\n"
    "layer { name: 'data' type: 'Data' top: 'data' top: 'label' include { phase: TRAIN }\n"
    "        data_param { source: '%s' batch_size: %d backend: LMDB }\n"
    "        transform_param { scale: 0.00390625 } }\n"
    "layer { name: 'data' type: 'Data' top: 'data' top: 'label' include { phase: TEST }\n"
    "        data_param { source: '%s' batch_size: 8 backend: LMDB }\n"
    "        transform_param { scale: 0.00390625 } }\n"
    "layer { name: 'ip1' type: 'InnerProduct' bottom: 'data' top: 'ip1'\n"
    "        inner_product_param { num_output: 8 weight_filler { type: 'xavier' }\n"
    "                              bias_filler { type: 'constant' value: 0.1 } } }\n"
    "layer { name: 'relu1' type: 'ReLU' bottom: 'ip1' top: 'ip1' }\n"
    "%s"
    "layer { name: 'ip2' type: 'InnerProduct' bottom: 'ip1' top: 'ip2'\n"
    "        inner_product_param { num_output: 4 weight_filler { type: 'xavier' } } }\n"
    "layer { name: 'loss' type: 'SoftmaxWithLoss' bottom: 'ip2' bottom: 'label' top: 'loss' }\n"
    "layer { name: 'accuracy' type: 'Accuracy' bottom: 'ip2' bottom: 'label' top: 'accuracy'\n"
    "        include { phase: TEST } }\n";

static const char *dropout_layer =
    "layer { name: 'drop1' type: 'Dropout' bottom: 'ip1' top: 'ip1'\n"
    "        dropout_param { dropout_ratio: 0.3 } }\n";

static void data_net(char *buf, size_t n, int batch, const char *extra) {
  snprintf(buf, n, data_net_fmt, F->lmdb, batch, F->lmdb, extra);
}

/* ---- lr policies --------------------------------------------------------------------------- */

static void check_policy(const char *body, const int *iters, int n,
                         double (*formula)(int iter, const void *ctx), const void *ctx) {
  kiln_solver *s = make_solver(tiny_net, body, NULL);
  for (int i = 0; i < n; i++) {
    s->iter = iters[i];
    double want = formula(iters[i], ctx);
    float got = kiln_solver_learning_rate(s);
    if (!close_to(got, want, 1e-6))
      fprintf(stderr, "%s iter %d: got %.9g want %.9g\n", kiln_solver_param(s)->lr_policy,
              iters[i], got, want);
    assert_true(close_to(got, want, 1e-6));
  }
  kiln_solver_free(s);
}

static double f_fixed(int it, const void *c) { (void)it, (void)c; return 0.01; }
static double f_step(int it, const void *c) { (void)c; return 0.1 * pow(0.5, floor(it / 3.0)); }
static double f_exp(int it, const void *c) { (void)c; return 0.1 * pow(0.99, it); }
static double f_inv(int it, const void *c) { (void)c; return 0.1 * pow(1 + 1e-3 * it, -0.75); }
static double f_multistep(int it, const void *c) {
  (void)c;
  const int sv[] = {3, 5, 9};
  int k = 0;
  while (k < 3 && it >= sv[k]) k++;
  return 0.2 * pow(0.1, k);
}
static double f_poly(int it, const void *c) { (void)c; return 0.05 * pow(1.0 - it / 100.0, 2.0); }
static double f_sigmoid(int it, const void *c) {
  (void)c;
  return 0.3 / (1.0 + exp(0.1 * (it - 50)));
}

static void test_lr_policies(void **state) {
  (void)state;
  const int its[] = {0, 1, 2, 3, 4, 5, 7, 8, 9, 10, 25, 50, 77, 99, 100};
  const int n = (int)(sizeof its / sizeof its[0]);
  check_policy("base_lr: 0.01 lr_policy: 'fixed' max_iter: 100\n", its, n, f_fixed, NULL);
  check_policy("base_lr: 0.1 lr_policy: 'step' gamma: 0.5 stepsize: 3 max_iter: 100\n", its, n,
               f_step, NULL);
  check_policy("base_lr: 0.1 lr_policy: 'exp' gamma: 0.99 max_iter: 100\n", its, n, f_exp, NULL);
  check_policy("base_lr: 0.1 lr_policy: 'inv' gamma: 0.001 power: 0.75 max_iter: 100\n", its, n,
               f_inv, NULL);
  check_policy("base_lr: 0.2 lr_policy: 'multistep' gamma: 0.1 stepvalue: 3 stepvalue: 5\n"
               "stepvalue: 9 max_iter: 100\n",
               its, n, f_multistep, NULL);
  check_policy("base_lr: 0.05 lr_policy: 'poly' power: 2 max_iter: 100\n", its, n, f_poly, NULL);
  check_policy("base_lr: 0.3 lr_policy: 'sigmoid' gamma: -0.1 stepsize: 50 max_iter: 100\n", its,
               n, f_sigmoid, NULL);
}


/* ---- update rules: 3-step trajectories computed here in double --------------------------- */

typedef struct rule_case {
  const char *name;
  const char *body; /* solver settings besides net and lr schedule */
  kiln_solver_type type;
  double base_lr, momentum, momentum2, delta, rms_decay, wd;
  bool l1;
} rule_case;

typedef struct {
  double *w, *h, *h2;
} traj;

/* Gradient of the tiny net (no regularisation) at parameters `w`. */
static void ref_gradient(kiln_net *ref, const double *w, float *g) {
  for (int64_t i = 0; i < ref->nparam_floats; i++) ref->param_data[i] = (float)w[i];
  kiln_net_zero_param_diff(ref);
  float loss;
  assert_int_equal(kiln_net_forward(ref, &loss), KILN_OK);
  assert_int_equal(kiln_net_backward(ref), KILN_OK);
  memcpy(g, ref->param_diff, sizeof(float) * (size_t)ref->nparam_floats);
}

static double sgn(double x) { return (x > 0) - (x < 0); }

static void expected_step(const rule_case *c, const kiln_net *net, traj *t, const float *graw,
                          int iter) {
  double rate = c->base_lr * pow(0.5, floor(iter / 2.0)); /* lr_policy step, stepsize 2 */
  for (int k = 0; k < net->nlearnable; k++) {
    int64_t off = net->learnable_offset[k], n = net->learnable[k]->count;
    double lr = rate * net->lr_mult[k], wd = c->wd * net->decay_mult[k];
    for (int64_t j = off; j < off + n; j++) {
      double w = t->w[j], g = graw[j];
      g += c->l1 ? wd * sgn(w) : wd * w;
      double m = c->momentum, d = c->delta;
      switch (c->type) {
        case KILN_SOLVER_SGD:
          t->h[j] = m * t->h[j] + lr * g;
          w -= t->h[j];
          break;
        case KILN_SOLVER_NESTEROV: {
          double old = t->h[j];
          t->h[j] = m * t->h[j] + lr * g;
          w -= (1 + m) * t->h[j] - m * old;
          break;
        }
        case KILN_SOLVER_ADAGRAD:
          t->h[j] += g * g;
          w -= lr * g / (sqrt(t->h[j]) + d);
          break;
        case KILN_SOLVER_RMSPROP:
          t->h[j] = c->rms_decay * t->h[j] + (1 - c->rms_decay) * g * g;
          w -= lr * g / (sqrt(t->h[j]) + d);
          break;
        case KILN_SOLVER_ADADELTA: {
          t->h[j] = m * t->h[j] + (1 - m) * g * g;
          double u = g * sqrt((t->h2[j] + d) / (t->h[j] + d));
          t->h2[j] = m * t->h2[j] + (1 - m) * u * u;
          w -= lr * u;
          break;
        }
        case KILN_SOLVER_ADAM: {
          double b1 = m, b2 = c->momentum2, tt = iter + 1;
          t->h[j] = b1 * t->h[j] + (1 - b1) * g;
          t->h2[j] = b2 * t->h2[j] + (1 - b2) * g * g;
          double corr = sqrt(1 - pow(b2, tt)) / (1 - pow(b1, tt));
          w -= lr * corr * t->h[j] / (sqrt(t->h2[j]) + d);
          break;
        }
        default: fail();
      }
      t->w[j] = w;
    }
  }
}

static void run_rule_case(const rule_case *c) {
  char body[1024];
  snprintf(body, sizeof body,
           "base_lr: %g lr_policy: 'step' gamma: 0.5 stepsize: 2 max_iter: 10 random_seed: 3\n"
           "display: 0\n%s",
           c->base_lr, c->body);
  kiln_solver *s = make_solver(tiny_net, body, NULL);
  assert_int_equal(kiln_solver_type_of(s), c->type);
  kiln_net *net = kiln_solver_net(s);
  set_tiny_inputs(net);
  Caffe__NetParameter *np;
  assert_int_equal(kiln_net_param_from_text(tiny_net, "<ref>", &np), KILN_OK);
  kiln_net_options o = {.phase = CAFFE__PHASE__TRAIN, .seed = 99, .nthreads = 1,
                        .config = kiln_test_config()};
  kiln_net *ref;
  assert_int_equal(kiln_net_create(np, &o, &ref), KILN_OK);
  set_tiny_inputs(ref);
  int64_t n = net->nparam_floats;
  assert_int_equal(ref->nparam_floats, n);
  assert_int_equal(net->nlearnable, 2);
  traj t = {calloc((size_t)n, sizeof(double)), calloc((size_t)n, sizeof(double)),
            calloc((size_t)n, sizeof(double))};
  float *g = calloc((size_t)n, sizeof(float));
  assert_true(t.w && t.h && t.h2 && g);
  for (int64_t i = 0; i < n; i++) t.w[i] = net->param_data[i];
  float *w0 = snapshot_params(net);
  int nhist;
  const float *hist = kiln_solver_history(s, &nhist);
  double moved = 0;
  for (int iter = 0; iter < 3; iter++) {
    ref_gradient(ref, t.w, g);
    expected_step(c, net, &t, g, iter);
    assert_int_equal(kiln_solver_step(s, 1), KILN_OK);
    assert_int_equal(kiln_solver_iter(s), iter + 1);
    int bad = 0;
    moved = 0;
    for (int k = 0; k < net->nlearnable; k++) {
      int64_t off = net->learnable_offset[k];
      for (int64_t j = off; j < off + net->learnable[k]->count; j++) {
        if (!close_to(net->param_data[j], t.w[j], 1e-5)) {
          if (bad++ < 5)
            fprintf(stderr, "%s iter %d param %lld: got %.8g want %.8g\n", c->name, iter,
                    (long long)j, net->param_data[j], t.w[j]);
        }
        if (!close_to(hist[j], t.h[j], 1e-5)) {
          if (bad++ < 5)
            fprintf(stderr, "%s iter %d history %lld: got %.8g want %.8g\n", c->name, iter,
                    (long long)j, hist[j], t.h[j]);
        }
        if (nhist > 1 && !close_to(hist[n + j], t.h2[j], 1e-5)) {
          if (bad++ < 5)
            fprintf(stderr, "%s iter %d history2 %lld: got %.8g want %.8g\n", c->name, iter,
                    (long long)j, hist[n + j], t.h2[j]);
        }
        moved += fabs(net->param_data[j] - w0[j]);
      }
    }
    assert_int_equal(bad, 0);
  }
  /* The run really moved the parameters (not a comparison of two unchanged buffers). */
  assert_true(moved > 1e-3);
  free(w0);
  free(t.w);
  free(t.h);
  free(t.h2);
  free(g);
  kiln_net_free(ref);
  protobuf_c_message_free_unpacked(&np->base, NULL);
  kiln_solver_free(s);
}

static void test_update_rules(void **state) {
  (void)state;
  const rule_case cases[] = {
      {"SGD+L2", "type: 'SGD' momentum: 0.9 weight_decay: 0.05\n", KILN_SOLVER_SGD, 0.5, 0.9, 0,
       0, 0, 0.05, false},
      {"SGD+L1", "type: 'SGD' momentum: 0.8 weight_decay: 0.03 regularization_type: 'L1'\n",
       KILN_SOLVER_SGD, 0.5, 0.8, 0, 0, 0, 0.03, true},
      {"Nesterov", "type: 'Nesterov' momentum: 0.9 weight_decay: 0.01\n", KILN_SOLVER_NESTEROV,
       0.3, 0.9, 0, 0, 0, 0.01, false},
      {"AdaGrad", "type: 'AdaGrad' weight_decay: 0.01 delta: 1e-6\n", KILN_SOLVER_ADAGRAD, 0.2, 0,
       0, 1e-6, 0, 0.01, false},
      {"RMSProp", "type: 'RMSProp' rms_decay: 0.9 weight_decay: 0.02 delta: 1e-6\n",
       KILN_SOLVER_RMSPROP, 0.05, 0, 0, 1e-6, 0.9, 0.02, false},
      {"AdaDelta", "type: 'AdaDelta' momentum: 0.95 weight_decay: 0.01 delta: 1e-4\n",
       KILN_SOLVER_ADADELTA, 1.0, 0.95, 0, 1e-4, 0, 0.01, false},
      {"Adam", "type: 'Adam' momentum: 0.9 momentum2: 0.999 weight_decay: 0.01 delta: 1e-8\n",
       KILN_SOLVER_ADAM, 0.05, 0.9, 0.999, 1e-8, 0, 0.01, false},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_rule_case(&cases[i]);
}

/* ---- iter_size ------------------------------------------------------------------------------ */

static void test_iter_size_equals_combined_batch(void **state) {
  (void)state;
  char net4[4096], net8[4096];
  data_net(net4, sizeof net4, 4, "");
  data_net(net8, sizeof net8, 8, "");
  const char *common = "base_lr: 0.5 lr_policy: 'fixed' momentum: 0.9 weight_decay: 0.01\n"
                       "max_iter: 20 random_seed: 11 display: 0\n";
  char body[1024];
  snprintf(body, sizeof body, "%siter_size: 2\n", common);
  kiln_solver *a = make_solver(net4, body, NULL);
  kiln_solver *b = make_solver(net8, common, NULL);
  kiln_net *na = kiln_solver_net(a), *nb = kiln_solver_net(b);
  assert_int_equal(na->nparam_floats, nb->nparam_floats);
  assert_memory_equal(na->param_data, nb->param_data,
                      sizeof(float) * (size_t)na->nparam_floats);
  float *w0 = snapshot_params(na);
  assert_int_equal(kiln_solver_step(a, 5), KILN_OK);
  assert_int_equal(kiln_solver_step(b, 5), KILN_OK);
  double moved = 0;
  for (int64_t i = 0; i < na->nparam_floats; i++) {
    float x = na->param_data[i], y = nb->param_data[i];
    if (!close_to(x, y, 2e-5)) fprintf(stderr, "param %lld: %.8g vs %.8g\n", (long long)i, x, y);
    assert_true(close_to(x, y, 2e-5));
    moved += fabs(x - w0[i]);
  }
  assert_true(moved > 1e-2);
  /* Both consumed the same records. */
  uint64_t ca, cb;
  assert_int_equal(kiln_net_get_cursors(na, &ca), 1);
  assert_int_equal(kiln_net_get_cursors(nb, &cb), 1);
  assert_int_equal(ca, 40);
  assert_int_equal(cb, 40);
  /* A one-pass solver with the small batch takes a different path. */
  kiln_solver *c = make_solver(net4, common, NULL);
  assert_int_equal(kiln_solver_step(c, 5), KILN_OK);
  double diff = 0;
  for (int64_t i = 0; i < na->nparam_floats; i++)
    diff += fabs(na->param_data[i] - kiln_solver_net(c)->param_data[i]);
  assert_true(diff > 1e-3);
  free(w0);
  kiln_solver_free(a);
  kiln_solver_free(b);
  kiln_solver_free(c);
}

/* ---- clip_gradients ------------------------------------------------------------------------- */

static void clip_case(double clip, bool expect_clipped) {
  char body[512];
  snprintf(body, sizeof body,
           "base_lr: 1 lr_policy: 'fixed' momentum: 0 max_iter: 10 display: 0\n"
           "clip_gradients: %g\n",
           clip);
  kiln_solver *s = make_solver(tiny_net, body, NULL);
  kiln_net *net = kiln_solver_net(s);
  set_tiny_inputs(net);
  /* the raw gradient, from the solver's own net */
  kiln_net_zero_param_diff(net);
  float loss;
  assert_int_equal(kiln_net_forward(net, &loss), KILN_OK);
  assert_int_equal(kiln_net_backward(net), KILN_OK);
  int64_t n = net->nparam_floats;
  float *g = malloc(sizeof(float) * (size_t)n);
  memcpy(g, net->param_diff, sizeof(float) * (size_t)n);
  double sumsq = 0;
  for (int64_t i = 0; i < n; i++) sumsq += (double)g[i] * g[i];
  double norm = sqrt(sumsq);
  assert_true(norm > 0.05);
  double scale = norm > clip ? clip / norm : 1.0;
  assert_true((scale < 1.0) == expect_clipped);
  float *w0 = snapshot_params(net);
  assert_int_equal(kiln_solver_step(s, 1), KILN_OK);
  double stepsq = 0;
  for (int k = 0; k < net->nlearnable; k++) {
    int64_t off = net->learnable_offset[k];
    double lr = net->lr_mult[k];
    for (int64_t j = off; j < off + net->learnable[k]->count; j++) {
      double want = w0[j] - lr * scale * g[j];
      assert_true(close_to(net->param_data[j], want, 1e-6));
      double d = (w0[j] - net->param_data[j]) / lr;
      stepsq += d * d;
    }
  }
  /* the global norm of the (lr_mult-free) step is the clip threshold */
  if (expect_clipped) assert_true(fabs(sqrt(stepsq) - clip) < 1e-5);
  else assert_true(fabs(sqrt(stepsq) - norm) < 1e-5);
  free(g);
  free(w0);
  kiln_solver_free(s);
}

static void test_clip_gradients(void **state) {
  (void)state;
  clip_case(0.01, true);
  clip_case(1000, false);
}

/* ---- solver type and parameter errors ---------------------------------------------------- */

static void test_solver_type_selection(void **state) {
  (void)state;
  const char *base = "base_lr: 0.1 lr_policy: 'fixed' max_iter: 10\n";
  struct {
    const char *line;
    kiln_solver_type type;
    int hist;
  } cases[] = {
      {"", KILN_SOLVER_SGD, 1},
      {"type: 'SGD'", KILN_SOLVER_SGD, 1},
      {"type: 'Adam'", KILN_SOLVER_ADAM, 2},
      {"solver_type: ADAM", KILN_SOLVER_ADAM, 2},
      {"solver_type: NESTEROV", KILN_SOLVER_NESTEROV, 1},
      {"solver_type: ADADELTA", KILN_SOLVER_ADADELTA, 2},
      {"type: 'AdaGrad'", KILN_SOLVER_ADAGRAD, 1},
      {"type: 'RMSProp'", KILN_SOLVER_RMSPROP, 1},
      {"type: 'AdaDelta'", KILN_SOLVER_ADADELTA, 2},
      {"type: 'Nesterov'", KILN_SOLVER_NESTEROV, 1},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char body[512];
    snprintf(body, sizeof body, "%s%s\n", base, cases[i].line);
    kiln_solver *s = make_solver(tiny_net, body, NULL);
    kiln_solver_type type = kiln_solver_type_of(s);
    if (type != cases[i].type)
      fprintf(stderr, "'%s' selected %s\n", cases[i].line, kiln_solver_type_name(type));
    assert_int_equal(type, cases[i].type);
    int nhist;
    kiln_solver_history(s, &nhist);
    assert_int_equal(nhist, cases[i].hist);
    kiln_solver_free(s);
  }
}

static void test_solver_param_errors(void **state) {
  (void)state;
  char err[2048];
  assert_int_equal(make_solver_rc(tiny_net, "base_lr: 0.1 lr_policy: 'fixed' type: 'Adamm'\n", err,
                                  sizeof err),
                   KILN_ERR_INVALID);
  assert_contains(err, "Adamm");
  const char *valid[] = {"SGD", "Nesterov", "AdaGrad", "RMSProp", "AdaDelta", "Adam"};
  for (int i = 0; i < 6; i++) assert_contains(err, valid[i]);
  assert_contains(err, "solver_");

  assert_int_equal(make_solver_rc(tiny_net, "base_lr: 0.1 max_iter: 3\n", err, sizeof err),
                   KILN_ERR_INVALID);
  assert_contains(err, "lr_policy");
  assert_int_equal(make_solver_rc(tiny_net, "base_lr: 0.1 lr_policy: 'cosine'\n", err, sizeof err),
                   KILN_ERR_INVALID);
  assert_contains(err, "cosine");
  assert_contains(err, "multistep");
  assert_int_equal(make_solver_rc(tiny_net, "base_lr: 0.1 lr_policy: 'step'\n", err, sizeof err),
                   KILN_ERR_INVALID);
  assert_contains(err, "stepsize");
  assert_int_equal(make_solver_rc(tiny_net,
                                  "base_lr: 0.1 lr_policy: 'fixed' regularization_type: 'L3'\n",
                                  err, sizeof err),
                   KILN_ERR_INVALID);
  assert_contains(err, "L3");
  assert_int_equal(make_solver_rc(tiny_net,
                                  "base_lr: 0.1 lr_policy: 'multistep' stepvalue: 5 stepvalue: 3\n",
                                  err, sizeof err),
                   KILN_ERR_INVALID);
  assert_contains(err, "stepvalue");

  /* fields out of range are refused, naming the field and its value */
  const struct {
    const char *body, *want;
  } bad[] = {
      {"max_iter: -5", "max_iter is -5; it cannot be negative"},
      {"display: -1", "display is -1; it cannot be negative"},
      {"snapshot: -10", "snapshot is -10; it cannot be negative"},
      {"test_interval: -2", "test_interval is -2; it cannot be negative"},
      {"base_lr: -0.1", "base_lr is -0.1; it must be finite and at least 0"},
      {"base_lr: inf", "base_lr is inf; it must be finite"},
      {"momentum: -0.9", "momentum is -0.9; it must be finite, at least 0 and below 1"},
      {"momentum: 1", "momentum is 1; it must be finite, at least 0 and below 1"},
      {"weight_decay: nan", "weight_decay is nan; it must be finite"},
      {"weight_decay: -0.0005", "weight_decay is -0.0005; it must be finite and at least 0"},
      {"type: 'RMSProp' rms_decay: 5", "rms_decay is 5; it must be finite, at least 0 and below 1"},
      {"type: 'Adam' momentum2: 1.5", "momentum2 is 1.5"},
      {"type: 'Adam' delta: 0", "delta is 0; Adam divides by it"},
      {"delta: -1e-8", "delta is -1e-08; it must be finite and at least 0"},
      {"gamma: nan", "gamma is nan; it must be finite"},
      {"clip_gradients: inf", "clip_gradients is inf"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    char body[256];
    snprintf(body, sizeof body, "base_lr: 0.1 lr_policy: 'fixed' %s\n", bad[i].body);
    assert_int_equal(make_solver_rc(tiny_net, body, err, sizeof err), KILN_ERR_INVALID);
    if (!strstr(err, bad[i].want)) fail_msg("'%s': message '%s' lacks '%s'", bad[i].body, err, bad[i].want);
    assert_contains(err, "solver_"); /* the file is named */
  }
  /* a test net's test_iter of 0 */
  assert_int_equal(make_solver_rc(tiny_net, "base_lr: 0.1 lr_policy: 'fixed' test_iter: 0\n", err,
                                  sizeof err),
                   KILN_ERR_INVALID);
  assert_contains(err, "test_iter 0 (test net 0) must be at least 1");
  /* the edges of the ranges are accepted */
  assert_int_equal(make_solver_rc(tiny_net,
                                  "base_lr: 0 lr_policy: 'fixed' momentum: 0 weight_decay: 0 "
                                  "max_iter: 0 display: 0 snapshot: 0 clip_gradients: -1\n",
                                  err, sizeof err),
                   KILN_OK);
}

typedef struct {
  int n;
  int iters[16];
  float acc[16], loss[16];
  int test_net[16];
  bool has_accuracy[16], has_loss[16];
  int snapshots;
} events;

static void on_event(const kiln_event *e, void *user) {
  events *ev = user;
  if (strcmp(e->event, "snapshot") == 0) ev->snapshots++;
  if (strcmp(e->event, "test") != 0 || ev->n >= 16) return;
  int i = ev->n++;
  ev->iters[i] = e->iter;
  ev->test_net[i] = e->test_net;
  ev->loss[i] = e->loss;
  for (int o = 0; o < e->noutputs; o++) {
    if (strcmp(e->output_names[o], "accuracy") == 0) {
      ev->has_accuracy[i] = true;
      ev->acc[i] = e->output_values[o];
    }
    if (strcmp(e->output_names[o], "loss") == 0) ev->has_loss[i] = true;
  }
}

/* ---- snapshot and exact resume ------------------------------------------------------------- */

static const char *snap_body_fmt =
    "base_lr: 0.2 lr_policy: 'multistep' gamma: 0.5 stepvalue: 5 stepvalue: 15\n"
    "momentum: 0.9 weight_decay: 0.0005 max_iter: 20 random_seed: 7 display: 0\n"
    "average_loss: 4 snapshot: 10 snapshot_prefix: '%s'\n";

static void test_snapshot_and_exact_resume(void **state) {
  (void)state;
  char net[4096], body[1024], prefix[256], path[512];
  data_net(net, sizeof net, 6, dropout_layer); /* 6 does not divide 64: the cursor wraps mid-batch */
  path_in("snap", prefix, sizeof prefix);
  snprintf(body, sizeof body, snap_body_fmt, prefix);
  char sp[256];
  write_pair(net, body, sp, sizeof sp);

  kiln_solver *a;
  assert_int_equal(kiln_solver_create(sp, TEST_OPTS, &a), KILN_OK);
  assert_int_equal(kiln_net_data_layer_count(kiln_solver_net(a)), 1);
  assert_int_equal(kiln_solver_step(a, 20), KILN_OK);
  assert_int_equal(kiln_solver_iter(a), 20);
  float *straight = snapshot_params(kiln_solver_net(a));
  int64_t nfloats = kiln_solver_net(a)->nparam_floats;
  int nlearnable = kiln_solver_net(a)->nlearnable;

  /* the iteration-10 files */
  snprintf(path, sizeof path, "%s_iter_10.caffemodel", prefix);
  ProtobufCMessage *m;
  assert_int_equal(kiln_proto_read_binary(path, &caffe__net_parameter__descriptor, &m), KILN_OK);
  Caffe__NetParameter *wnp = (Caffe__NetParameter *)m;
  int with_blobs = 0;
  for (size_t i = 0; i < wnp->n_layer; i++) with_blobs += wnp->layer[i]->n_blobs > 0;
  assert_int_equal(with_blobs, 2);
  protobuf_c_message_free_unpacked(m, NULL);
  char state10[512];
  snprintf(state10, sizeof state10, "%s_iter_10.solverstate", prefix);
  assert_int_equal(kiln_proto_read_binary(state10, &caffe__solver_state__descriptor, &m), KILN_OK);
  Caffe__SolverState *st = (Caffe__SolverState *)m;
  assert_int_equal(st->iter, 10);
  assert_int_equal(st->current_step, 1); /* past stepvalue 5, not yet 15 */
  assert_int_equal((int)st->n_history, nlearnable);
  assert_string_equal(st->learned_net, path);
  assert_int_equal((int)st->n_kiln_data_cursor, 1);
  assert_int_equal(st->kiln_data_cursor[0], 60);
  assert_true(st->has_kiln_rng_state);
  assert_int_equal((int)st->n_kiln_loss_history, 4);
  protobuf_c_message_free_unpacked(m, NULL);
  snprintf(path, sizeof path, "%s_iter_20.solverstate", prefix);
  assert_int_equal(access(path, R_OK), 0);

  /* resumed at 10 and run to 20: bit-identical */
  kiln_solver *b;
  assert_int_equal(kiln_solver_create(sp, TEST_OPTS, &b), KILN_OK);
  assert_int_equal(kiln_solver_restore(b, state10), KILN_OK);
  assert_int_equal(kiln_solver_iter(b), 10);
  assert_int_equal(b->current_step, 1);
  uint64_t cur;
  assert_int_equal(kiln_net_get_cursors(kiln_solver_net(b), &cur), 1);
  assert_int_equal(cur, 60);
  assert_int_equal(kiln_solver_step(b, 10), KILN_OK);
  assert_int_equal(kiln_solver_iter(b), 20);
  assert_int_equal(kiln_solver_net(b)->nparam_floats, nfloats);
  assert_memory_equal(kiln_solver_net(b)->param_data, straight, sizeof(float) * (size_t)nfloats);
  kiln_solver_free(b);

  /* negative controls: the same resume, but from the wrong data position, or with another
   * dropout generator state, ends elsewhere */
  kiln_solver *c;
  assert_int_equal(kiln_solver_create(sp, TEST_OPTS, &c), KILN_OK);
  assert_int_equal(kiln_solver_restore(c, state10), KILN_OK);
  uint64_t zero = 0;
  assert_int_equal(kiln_net_set_cursors(kiln_solver_net(c), &zero, 1), KILN_OK);
  assert_int_equal(kiln_solver_step(c, 10), KILN_OK);
  assert_true(memcmp(kiln_solver_net(c)->param_data, straight,
                     sizeof(float) * (size_t)nfloats) != 0);
  kiln_solver_free(c);
  assert_int_equal(kiln_solver_create(sp, TEST_OPTS, &c), KILN_OK);
  assert_int_equal(kiln_solver_restore(c, state10), KILN_OK);
  kiln_rng_seed(&kiln_solver_net(c)->rng, 12345, 1);
  assert_int_equal(kiln_solver_step(c, 10), KILN_OK);
  assert_true(memcmp(kiln_solver_net(c)->param_data, straight,
                     sizeof(float) * (size_t)nfloats) != 0);
  kiln_solver_free(c);
  /* and without restoring at all, 10 steps from scratch are not 20 */
  assert_int_equal(kiln_solver_create(sp, TEST_OPTS, &c), KILN_OK);
  c->iter = 10;
  assert_int_equal(kiln_solver_step(c, 10), KILN_OK);
  assert_true(memcmp(kiln_solver_net(c)->param_data, straight,
                     sizeof(float) * (size_t)nfloats) != 0);
  kiln_solver_free(c);

  /* Snapshot files moved elsewhere: the .caffemodel is found beside the .solverstate. */
  char moved_dir[256], moved_state[512], moved_model[512], model10[512];
  path_in("moved", moved_dir, sizeof moved_dir);
  assert_int_equal(mkdir(moved_dir, 0700), 0);
  snprintf(model10, sizeof model10, "%s_iter_10.caffemodel", prefix);
  snprintf(moved_model, sizeof moved_model, "%s/snap_iter_10.caffemodel", moved_dir);
  snprintf(moved_state, sizeof moved_state, "%s/snap_iter_10.solverstate", moved_dir);
  assert_int_equal(rename(model10, moved_model), 0);
  assert_int_equal(rename(state10, moved_state), 0);
  assert_int_equal(kiln_solver_create(sp, TEST_OPTS, &c), KILN_OK);
  assert_int_equal(kiln_solver_restore(c, moved_state), KILN_OK);
  assert_int_equal(kiln_solver_step(c, 10), KILN_OK);
  assert_memory_equal(kiln_solver_net(c)->param_data, straight, sizeof(float) * (size_t)nfloats);
  kiln_solver_free(c);

  kiln_solver_free(a);
  free(straight);
}

/* solve(): snapshots every `snapshot` iterations and once more at the end unless that
 * iteration was just saved. */
static void solve_snapshots(int snapshot, int max_iter, const int *want, int nwant) {
  char net[4096], body[1024], prefix[256], path[512];
  data_net(net, sizeof net, 4, "");
  static int run = 0;
  char name[64];
  snprintf(name, sizeof name, "final_%d", run++);
  path_in(name, prefix, sizeof prefix);
  snprintf(body, sizeof body,
           "base_lr: 0.1 lr_policy: 'fixed' max_iter: %d display: 0 snapshot: %d\n"
           "snapshot_prefix: '%s'\n",
           max_iter, snapshot, prefix);
  events ev = {0};
  kiln_solver_options o = {.on_event = on_event, .user = &ev};
  kiln_solver *s = make_solver(net, body, &o);
  assert_int_equal(kiln_solver_solve(s), KILN_OK);
  assert_int_equal(ev.snapshots, nwant);
  for (int i = 0; i < nwant; i++) {
    snprintf(path, sizeof path, "%s_iter_%d.solverstate", prefix, want[i]);
    assert_int_equal(access(path, R_OK), 0);
    snprintf(path, sizeof path, "%s_iter_%d.caffemodel", prefix, want[i]);
    assert_int_equal(access(path, R_OK), 0);
  }
  kiln_solver_free(s);
}

static void test_solve_final_snapshot(void **state) {
  (void)state;
  const int a[] = {3, 6, 7};
  solve_snapshots(3, 7, a, 3);
  const int b[] = {3, 6};
  solve_snapshots(3, 6, b, 2);
  const int c[] = {5};
  solve_snapshots(0, 5, c, 1);
}

/* Adam keeps two histories per parameter; both come back. */
static void test_snapshot_resume_adam(void **state) {
  (void)state;
  char net[4096], body[1024], prefix[256], st[512];
  data_net(net, sizeof net, 5, dropout_layer);
  path_in("adam", prefix, sizeof prefix);
  snprintf(body, sizeof body,
           "type: 'Adam' base_lr: 0.01 lr_policy: 'fixed' momentum: 0.9 momentum2: 0.999\n"
           "max_iter: 8 random_seed: 9 display: 0 snapshot: 4 snapshot_prefix: '%s'\n",
           prefix);
  char sp[256];
  write_pair(net, body, sp, sizeof sp);
  kiln_solver *a, *b;
  assert_int_equal(kiln_solver_create(sp, TEST_OPTS, &a), KILN_OK);
  assert_int_equal(kiln_solver_step(a, 8), KILN_OK);
  snprintf(st, sizeof st, "%s_iter_4.solverstate", prefix);
  ProtobufCMessage *m;
  assert_int_equal(kiln_proto_read_binary(st, &caffe__solver_state__descriptor, &m), KILN_OK);
  assert_int_equal((int)((Caffe__SolverState *)m)->n_history, 2 * kiln_solver_net(a)->nlearnable);
  protobuf_c_message_free_unpacked(m, NULL);
  assert_int_equal(kiln_solver_create(sp, TEST_OPTS, &b), KILN_OK);
  assert_int_equal(kiln_solver_restore(b, st), KILN_OK);
  assert_int_equal(kiln_solver_step(b, 4), KILN_OK);
  assert_memory_equal(kiln_solver_net(a)->param_data, kiln_solver_net(b)->param_data,
                      sizeof(float) * (size_t)kiln_solver_net(a)->nparam_floats);
  assert_memory_equal(kiln_solver_history(a, NULL), kiln_solver_history(b, NULL),
                      sizeof(float) * (size_t)kiln_solver_net(a)->nparam_floats * 2);
  kiln_solver_free(a);
  kiln_solver_free(b);
}

/* `from` with iter, current_step and (when not 0) kiln_workers replaced, written to `to`. */
static void edit_state(const char *from, const char *to, int iter, int current_step, int workers) {
  ProtobufCMessage *m;
  assert_int_equal(kiln_proto_read_binary(from, &caffe__solver_state__descriptor, &m), KILN_OK);
  Caffe__SolverState *st = (Caffe__SolverState *)m;
  st->iter = iter;
  st->current_step = current_step;
  if (workers) {
    st->has_kiln_workers = true;
    st->kiln_workers = workers;
  }
  assert_int_equal(kiln_proto_write_binary(to, m), KILN_OK);
  protobuf_c_message_free_unpacked(m, NULL);
}

static void test_restore_errors(void **state) {
  (void)state;
  char body[512], prefix[256];
  path_in("restore_err", prefix, sizeof prefix);
  snprintf(body, sizeof body,
           "base_lr: 0.1 lr_policy: 'fixed' momentum: 0.9 max_iter: 10 display: 0\n"
           "snapshot_prefix: '%s'\n",
           prefix);
  kiln_solver *a = make_solver(tiny_net, body, NULL);
  set_tiny_inputs(kiln_solver_net(a));
  assert_int_equal(kiln_solver_step(a, 2), KILN_OK);
  char *state_path = NULL;
  assert_int_equal(kiln_solver_snapshot(a, &state_path), KILN_OK);
  assert_non_null(state_path);
  assert_contains(state_path, "_iter_2.solverstate");

  /* another net: no bias, one learnable blob instead of two */
  char other[4096];
  snprintf(other, sizeof other,
           "name: 'tiny'\n"
           "layer { name: 'data' type: 'Input' top: 'data' top: 'label'\n"
           "        input_param { shape { dim: 4 dim: 3 } shape { dim: 4 } } }\n"
           "layer { name: 'ip' type: 'InnerProduct' bottom: 'data' top: 'ip'\n"
           "        inner_product_param { num_output: 3 bias_term: false } }\n"
           "layer { name: 'loss' type: 'SoftmaxWithLoss' bottom: 'ip' bottom: 'label' top: 'loss' }\n");
  kiln_solver *b = make_solver(other, body, NULL);
  float *before = snapshot_params(kiln_solver_net(b));
  assert_int_equal(kiln_solver_restore(b, state_path), KILN_ERR_SHAPE);
  assert_contains(kiln_last_error(), state_path);
  assert_int_equal(kiln_solver_iter(b), 0);
  assert_memory_equal(before, kiln_solver_net(b)->param_data,
                      sizeof(float) * (size_t)kiln_solver_net(b)->nparam_floats);
  free(before);
  kiln_solver_free(b);

  /* an Adam solver needs two histories per parameter */
  snprintf(body, sizeof body, "type: 'Adam' base_lr: 0.1 lr_policy: 'fixed' max_iter: 10\n");
  b = make_solver(tiny_net, body, NULL);
  assert_int_equal(kiln_solver_restore(b, state_path), KILN_ERR_SHAPE);
  assert_contains(kiln_last_error(), "Adam");
  kiln_solver_free(b);

  /* missing and corrupt files */
  char missing[512];
  path_in("no_such.solverstate", missing, sizeof missing);
  assert_int_equal(kiln_solver_restore(a, missing), KILN_ERR_IO);
  assert_contains(kiln_last_error(), "no_such.solverstate");
  char corrupt[512];
  path_in("corrupt.solverstate", corrupt, sizeof corrupt);
  write_text(corrupt, "\xff\xff\xff\xff this is not a solver state");
  assert_int_not_equal(kiln_solver_restore(a, corrupt), KILN_OK);
  assert_int_equal(kiln_solver_iter(a), 2);

  /* well-formed files with fields out of range: refused, naming the field, nothing restored */
  const struct {
    int iter, current_step, workers;
    const char *want;
  } bad[] = {
      {-100, 0, 0, "iter is -100; it cannot be negative"},
      {2, -7, 0, "current_step is -7"},
      {2, 0, -2, "kiln_workers is -2; a run has at least 1 worker"},
  };
  char edited[512];
  path_in("edited.solverstate", edited, sizeof edited);
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    edit_state(state_path, edited, bad[i].iter, bad[i].current_step, bad[i].workers);
    assert_int_equal(kiln_solver_restore(a, edited), KILN_ERR_INVALID);
    assert_contains(kiln_last_error(), "edited.solverstate");
    assert_contains(kiln_last_error(), bad[i].want);
    assert_int_equal(kiln_solver_iter(a), 2);
  }
  /* multistep: a step past the schedule's last (the learning rate would silently be the last) */
  snprintf(body, sizeof body,
           "base_lr: 0.1 lr_policy: 'multistep' stepvalue: 3 stepvalue: 6 gamma: 0.1 "
           "momentum: 0.9 max_iter: 10\n");
  b = make_solver(tiny_net, body, NULL);
  edit_state(state_path, edited, 2, 1000000, 0);
  assert_int_equal(kiln_solver_restore(b, edited), KILN_ERR_INVALID);
  assert_contains(kiln_last_error(),
                  "current_step is 1000000; the solver's multistep schedule has steps 0 to 2");
  kiln_solver_free(b);

  free(state_path);
  kiln_solver_free(a);
}

/* ---- test passes ---------------------------------------------------------------------------- */

static void run_with_tests(bool init, const int *want, int nwant) {
  char net[4096], body[1024];
  data_net(net, sizeof net, 8, "");
  snprintf(body, sizeof body,
           "base_lr: 0.5 lr_policy: 'fixed' momentum: 0.9 max_iter: 10 display: 0\n"
           "test_iter: 2 test_interval: 5 test_initialization: %s snapshot_after_train: false\n",
           init ? "true" : "false");
  events ev = {0};
  kiln_solver_options o = {.on_event = on_event, .user = &ev};
  kiln_solver *s = make_solver(net, body, &o);
  assert_int_equal(kiln_solver_test_net_count(s), 1);
  assert_int_equal(kiln_solver_solve(s), KILN_OK);
  assert_int_equal(kiln_solver_iter(s), 10);
  assert_int_equal(ev.n, nwant);
  for (int i = 0; i < nwant; i++) {
    assert_int_equal(ev.iters[i], want[i]);
    assert_int_equal(ev.test_net[i], 0);
    assert_true(ev.has_accuracy[i]);
    assert_true(ev.has_loss[i]);
    assert_true(ev.acc[i] >= 0 && ev.acc[i] <= 1);
    /* the mean of 2 batches of 8: a multiple of 1/16 */
    float k = ev.acc[i] * 16;
    assert_true(fabsf(k - roundf(k)) < 1e-4f);
    assert_true(ev.loss[i] > 0 && isfinite(ev.loss[i]));
  }
  /* The pattern is easy: accuracy rises, loss falls. */
  assert_true(ev.acc[nwant - 1] >= 0.75f);
  assert_true(ev.loss[nwant - 1] < ev.loss[0] || !init);
  assert_int_equal(ev.snapshots, 0);
  kiln_solver_free(s);
}

/* Adam at base_lr 1e6 saturates the softmax: the loss stays finite (~87 per sample at the
 * clamp) and nothing but the divergence rule stops the run. */
static const char *saturating_solver = "type: 'Adam' base_lr: 1e6 lr_policy: 'fixed' max_iter: 400 "
                                       "display: 0 momentum: 0.9 momentum2: 0.999 delta: 1e-8\n";

static void test_divergence_of_a_finite_loss(void **state) {
  (void)state;
  char net[4096], body[512];
  data_net(net, sizeof net, 8, "");
  /* without the rule: 400 iterations of a finite, saturated loss */
  snprintf(body, sizeof body, "%sdivergence_factor: 0\n", saturating_solver);
  kiln_solver *s = make_solver(net, body, NULL);
  assert_int_equal(kiln_solver_step(s, 400), KILN_OK);
  kiln_solver_free(s);

  /* with it: stopped once the loss stayed above 10x its first value for 20 iterations */
  s = make_solver(net, saturating_solver, NULL);
  assert_int_equal(kiln_solver_step(s, 400), KILN_ERR_NUMERIC);
  assert_contains(kiln_last_error(), "for 20 iterations; training diverged");
  assert_contains(kiln_last_error(), "divergence_factor 10 times its first value");
  int stop = kiln_solver_iter(s);
  assert_true(stop >= 20 && stop < 400);
  kiln_solver_free(s);

  /* snapshotted 10 iterations before the stop and resumed: it stops at the same iteration */
  char sp[256];
  snprintf(body, sizeof body, "%ssnapshot_prefix: '%s/div'\n", saturating_solver, F->dir);
  write_pair(net, body, sp, sizeof sp);
  kiln_solver *a;
  assert_int_equal(kiln_solver_create(sp, TEST_OPTS, &a), KILN_OK);
  assert_int_equal(kiln_solver_step(a, stop - 10), KILN_OK);
  char *state_path = NULL;
  assert_int_equal(kiln_solver_snapshot(a, &state_path), KILN_OK);
  kiln_solver_free(a);
  kiln_solver *b;
  assert_int_equal(kiln_solver_create(sp, TEST_OPTS, &b), KILN_OK);
  assert_int_equal(kiln_solver_restore(b, state_path), KILN_OK);
  assert_int_equal(kiln_solver_step(b, 400), KILN_ERR_NUMERIC);
  assert_int_equal(kiln_solver_iter(b), stop);
  kiln_solver_free(b);
  free(state_path);

  /* the fields' own range */
  char err[512];
  snprintf(body, sizeof body, "%sdivergence_factor: 0.5\n", saturating_solver);
  assert_int_equal(make_solver_rc(net, body, err, sizeof err), KILN_ERR_INVALID);
  assert_contains(err, "divergence_factor is 0.5; it must be above 1");
  snprintf(body, sizeof body, "%sdivergence_iters: 0\n", saturating_solver);
  assert_int_equal(make_solver_rc(net, body, err, sizeof err), KILN_ERR_INVALID);
  assert_contains(err, "divergence_iters is 0");
}

static void test_test_passes_emit_events(void **state) {
  (void)state;
  const int with_init[] = {0, 5, 10};
  run_with_tests(true, with_init, 3);
  const int without_init[] = {5, 10};
  run_with_tests(false, without_init, 2);
}

/* ---- divergence ----------------------------------------------------------------------------- */

static void test_divergence_is_numeric_error(void **state) {
  (void)state;
  char net[4096];
  data_net(net, sizeof net, 8, "");
  kiln_solver *s = make_solver(net,
                               "base_lr: 1e30 lr_policy: 'fixed' momentum: 0.9 weight_decay: 0.1\n"
                               "max_iter: 50 display: 0\n",
                               NULL);
  int rc = kiln_solver_step(s, 50);
  assert_int_equal(rc, KILN_ERR_NUMERIC);
  assert_contains(kiln_last_error(), "iteration");
  char it[32];
  snprintf(it, sizeof it, "iteration %d", kiln_solver_iter(s));
  assert_contains(kiln_last_error(), it);
  assert_true(kiln_solver_iter(s) < 50);
  kiln_solver_free(s);
}

/* ---- fault injection --------------------------------------------------------------------- */

static void on_event_count(const kiln_event *e, void *user) {
  if (!strcmp(e->event, "done")) *(double *)user = e->cpu_wait_ms;
}

/* The warnings logged while a solver is created, one a line. */
typedef struct {
  char text[4096];
  int n;
} warnings;

static void keep_warning(kiln_log_level level, const char *msg, void *user) {
  warnings *w = user;
  if (level != KILN_LOG_WARN) return;
  size_t used = strlen(w->text);
  snprintf(w->text + used, sizeof w->text - used, "%s\n", msg);
  w->n++;
}

/* The warnings of creating a solver from `body` (and the create's status in *rc, its error in
 * `err`). */
static warnings create_warnings(const char *body, const kiln_solver_options *opt, int *rc,
                                char *err, size_t n) {
  warnings w = {.n = 0};
  kiln_log_set_handler(keep_warning, &w);
  *rc = make_solver_opt_rc(tiny_net, body, opt, err, n);
  kiln_log_set_handler(NULL, NULL);
  return w;
}

/* Where kiln has no GPU (built without CUDA, or none in the machine), a solver asking for one
 * trains on the CPU and says so once, naming the file and the field; a device_id that cannot
 * exist is refused naming the field. As in Caffe's tool, solver_mode counts only when the file
 * gives it, and -gpu replaces it. (With a GPU, tests/cli/gpu.sh.) */
static void test_solver_mode_gpu(void **state) {
  (void)state;
  if (kiln_cuda_device_count() > 0) skip();
  char err[2048];
  int rc;
  const char *base = "base_lr: 0.1 lr_policy: 'fixed' ";
  char body[256];

  snprintf(body, sizeof body, "%ssolver_mode: GPU\n", base);
  warnings w = create_warnings(body, NULL, &rc, err, sizeof err);
  assert_int_equal(rc, KILN_OK);
  assert_int_equal(w.n, 1);
  assert_contains(w.text, "solver_"); /* the file */
  assert_contains(w.text, ".prototxt: solver_mode: GPU: no GPU (");
  assert_contains(w.text, "); training on the CPU");

  snprintf(body, sizeof body, "%ssolver_mode: GPU device_id: 3\n", base);
  w = create_warnings(body, NULL, &rc, err, sizeof err);
  assert_int_equal(rc, KILN_OK);
  assert_int_equal(w.n, 1);
  assert_contains(w.text, "solver_mode: GPU (device_id: 3): no GPU (");

  /* Caffe's CPU mode, or no mode at all (the field's default does not count): nothing to say */
  const char *quiet[] = {"solver_mode: CPU", "", "device_id: 1", "solver_mode: CPU device_id: -1"};
  for (size_t i = 0; i < sizeof quiet / sizeof quiet[0]; i++) {
    snprintf(body, sizeof body, "%s%s\n", base, quiet[i]);
    w = create_warnings(body, NULL, &rc, err, sizeof err);
    if (rc != KILN_OK || w.n != 0) fail_msg("'%s': rc %d, warnings '%s' %s", quiet[i], rc, w.text, err);
  }

  /* a device that cannot exist: refused, naming the file and the field */
  snprintf(body, sizeof body, "%ssolver_mode: GPU device_id: -1\n", base);
  w = create_warnings(body, NULL, &rc, err, sizeof err);
  assert_int_equal(rc, KILN_ERR_INVALID);
  assert_contains(err, "solver_");
  assert_contains(err, "device_id: -1: no such device");

  /* Caffe's -gpu replaces the file's mode and device: one warning, naming the flag */
  kiln_solver_options o = {.gpu_flag = "0,1"};
  w = create_warnings(body, &o, &rc, err, sizeof err);
  assert_int_equal(rc, KILN_OK);
  assert_int_equal(w.n, 1);
  assert_contains(w.text, "-gpu 0,1: no GPU (");
  assert_contains(w.text, "); training on the CPU\n");
}

static void test_fault_injection(void **state) {
  (void)state;
  const char *body = "base_lr: 0.1 lr_policy: 'fixed' max_iter: 5 display: 0\n";
  char err[2048];
  /* a sleep in every forward of 'ip': five iterations take at least five sleeps */
  kiln_config fc;
  kiln_solver_options fo = {.config = &fc};
  setenv("KILN_FAULT", "sleep:ip:20", 1);
  assert_int_equal(kiln_config_from_env(&fc), KILN_OK);
  kiln_solver *s = make_solver(tiny_net, body, &fo);
  set_tiny_inputs(kiln_solver_net(s));
  double t0 = kiln_now_ms();
  assert_int_equal(kiln_solver_step(s, 5), KILN_OK);
  assert_true(kiln_now_ms() - t0 >= 5 * 20);
  kiln_solver_free(s);
  /* a layer the train net does not have, and a malformed value, are errors */
  setenv("KILN_FAULT", "sleep:conv9:20", 1);
  assert_int_equal(kiln_config_from_env(&fc), KILN_OK);
  assert_int_equal(make_solver_opt_rc(tiny_net, body, &fo, err, sizeof err), KILN_ERR_INVALID);
  assert_contains(err, "KILN_FAULT=sleep:conv9:20: the train net 'tiny' has no layer 'conv9'");
  assert_contains(err, "its layers: data, ip, loss");
  setenv("KILN_FAULT", "sleep:ip", 1); /* refused where the configuration is read */
  assert_int_equal(kiln_config_from_env(&fc), KILN_ERR_INVALID);
  assert_contains(kiln_last_error(), "KILN_FAULT='sleep:ip': expected sleep:LAYER:MS");
  /* a leak: every iteration keeps 4 MB */
  setenv("KILN_FAULT", "leak:4096", 1);
  assert_int_equal(kiln_config_from_env(&fc), KILN_OK);
  s = make_solver(tiny_net, body, &fo);
  set_tiny_inputs(kiln_solver_net(s));
  double before = kiln_peak_rss_mb();
  assert_int_equal(kiln_solver_step(s, 5), KILN_OK);
  assert_true(kiln_peak_rss_mb() - before >= 5 * 4 - 1);
  kiln_solver_free(s);
  unsetenv("KILN_FAULT");
  /* no fault: a clean run, and the done event carries the training thread's CPU wait */
  double wait = -1;
  kiln_solver_options o = {.on_event = on_event_count, .user = &wait};
  t0 = kiln_now_ms();
  s = make_solver(tiny_net, body, &o);
  set_tiny_inputs(kiln_solver_net(s));
  assert_int_equal(kiln_solver_solve(s), KILN_OK);
  assert_true(isnan(wait) || (wait >= 0 && wait <= kiln_now_ms() - t0 + 1));
  kiln_solver_free(s);
}

static void on_event_lr(const kiln_event *e, void *user) {
  if (!strcmp(e->event, "progress")) *(float *)user = e->lr;
}

/* KILN_FAULT=lr:0.5 halves the rate the solver applies: one plain SGD step (no momentum, no
 * decay: w -= lr x lr_mult x g) from the same weights and data moves every parameter half as
 * far as without the fault, and the events report the halved rate. */
static void test_fault_lr_factor(void **state) {
  (void)state;
  const char *body = "base_lr: 0.1 lr_policy: 'step' gamma: 0.5 stepsize: 1 max_iter: 5 "
                     "random_seed: 7 display: 0\n";
  float *moved[2];
  float lr[2] = {-1, -1};
  int64_t n = 0;
  for (int faulted = 0; faulted < 2; faulted++) {
    kiln_config fc;
    if (faulted) setenv("KILN_FAULT", "lr:0.5", 1);
    else unsetenv("KILN_FAULT");
    assert_int_equal(kiln_config_from_env(&fc), KILN_OK);
    kiln_solver_options fo = {.config = &fc, .on_event = on_event_lr, .user = &lr[faulted]};
    kiln_solver *s = make_solver(tiny_net, body, &fo);
    kiln_net *net = kiln_solver_net(s);
    set_tiny_inputs(net);
    n = net->nparam_floats;
    moved[faulted] = snapshot_params(net);
    /* the rate of the second iteration: the step policy's 0.05, times the factor */
    s->iter = 1;
    assert_true(close_to(kiln_solver_learning_rate(s), faulted ? 0.025 : 0.05, 1e-7));
    s->iter = 0;
    assert_int_equal(kiln_solver_step(s, 1), KILN_OK);
    for (int64_t i = 0; i < n; i++) moved[faulted][i] = net->param_data[i] - moved[faulted][i];
    kiln_solver_free(s);
  }
  unsetenv("KILN_FAULT");
  assert_true(close_to(lr[0], 0.1, 1e-7));
  assert_true(close_to(lr[1], 0.05, 1e-7));
  /* the differences are of float weights near 1: a few ulps of 1 is the tolerance */
  double largest = 0;
  for (int64_t i = 0; i < n; i++) {
    largest = fmax(largest, fabs(moved[0][i]));
    if (fabs(moved[1][i] - 0.5 * moved[0][i]) > 1e-6)
      fail_msg("param %lld moved %.9g with lr:0.5, %.9g without", (long long)i, moved[1][i],
               moved[0][i]);
  }
  assert_true(largest > 1e-3); /* the clean step really moved the weights, by far more than that */
  free(moved[0]);
  free(moved[1]);
}

static void write_metrics(const kiln_event *e, void *user) {
  assert_int_equal(kiln_metrics_write_event(user, e), KILN_OK);
}

/* The train events record the train net's outputs: an Accuracy layer computed in training too
 * gives every train line an "accuracy" (CE's train_accuracy), while "loss" stays the smoothed
 * loss the event reports, not the loss output of the iteration. */
static void test_train_event_records_outputs(void **state) {
  (void)state;
  char net[4096], path[256];
  snprintf(net, sizeof net, "%s%s", tiny_net,
           "layer { name: 'accuracy' type: 'Accuracy' bottom: 'ip' bottom: 'label' "
           "top: 'accuracy' }\n");
  path_in("train_outputs.jsonl", path, sizeof path);
  kiln_metrics_file *m;
  assert_int_equal(kiln_metrics_open(path, &m), KILN_OK);
  kiln_solver_options o = {.on_event = write_metrics, .user = m};
  kiln_solver *s = make_solver(net, "base_lr: 0.1 lr_policy: 'fixed' max_iter: 4 display: 1 "
                                    "average_loss: 4\n", &o);
  set_tiny_inputs(kiln_solver_net(s));
  assert_int_equal(kiln_solver_solve(s), KILN_OK);
  kiln_solver_free(s);
  assert_int_equal(kiln_metrics_close(m), KILN_OK);
  char *text;
  size_t len;
  assert_int_equal(kiln_read_file(path, &text, &len), KILN_OK);
  int lines = 0;
  for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
    if (!strstr(line, "\"event\":\"train\"")) continue;
    lines++;
    /* one key each: the output named loss does not repeat it */
    char *loss = strstr(line, "\"loss\":");
    assert_non_null(loss);
    assert_null(strstr(loss + 1, "\"loss\":"));
    char *acc = strstr(line, "\"accuracy\":");
    if (!acc) fail_msg("no accuracy in '%s'", line);
    double a = atof(acc + strlen("\"accuracy\":"));
    /* four samples: a multiple of a quarter */
    assert_true(a >= 0 && a <= 1 && fabs(a * 4 - round(a * 4)) < 1e-6);
  }
  assert_int_equal(lines, 4);
  free(text);
}

/* ---- figures derived from a test pass ------------------------------------------------------- */

/* The outputs of the last test event, by name. */
typedef struct {
  int n;
  char name[16][32];
  float value[16];
} test_outputs;

static void on_test_outputs(const kiln_event *e, void *user) {
  test_outputs *t = user;
  if (strcmp(e->event, "test") != 0) return;
  t->n = e->noutputs < 16 ? e->noutputs : 16;
  for (int o = 0; o < t->n; o++) {
    snprintf(t->name[o], sizeof t->name[o], "%s", e->output_names[o]);
    t->value[o] = e->output_values[o];
  }
}

static float output_value(const test_outputs *t, const char *name) {
  for (int o = 0; o < t->n; o++)
    if (!strcmp(t->name[o], name)) return t->value[o];
  fprintf(stderr, "no output '%s' in the test event\n", name);
  fail();
  return 0;
}

/* A test pass of two batches of 4 whose scores are the records' two bytes, so the predictions
 * are the records' own (class 1 where the second byte is larger); label 2 is ignored:
 *   batch 1: pred 1 1 1 0, labels 1 1 1 1: tp 3, fn 1 (f1 6/7)
 *   batch 2: pred 1 0 0 1, labels 0 1 1 2: fp 1, fn 2 (f1 0; the last is ignored)
 * The event carries the mean counts, tp 1.5, fp 0.5, fn 1.5, and from them the pass's
 * precision 0.75, recall 0.5 and f1 = 3 / (3 + 0.5 + 1.5) = 0.6, not the mean of the batches'
 * f1, 3/7. */
static void test_test_event_derives_f1_of_the_pass(void **state) {
  (void)state;
  char lmdb[256];
  path_in("f1_lmdb", lmdb, sizeof lmdb);
  const int pred[8] = {1, 1, 1, 0, 1, 0, 0, 1}, label[8] = {1, 1, 1, 1, 0, 1, 1, 2};
  kiln_datum_writer *w;
  assert_int_equal(kiln_datum_writer_open(lmdb, &w), KILN_OK);
  for (int i = 0; i < 8; i++) {
    uint8_t scores[2] = {pred[i] ? 10 : 200, pred[i] ? 200 : 10};
    char key[16];
    snprintf(key, sizeof key, "%08d", i);
    kiln_datum d = {.channels = 2, .height = 1, .width = 1, .label = label[i], .u8 = scores};
    assert_int_equal(kiln_datum_writer_put(w, key, &d), KILN_OK);
  }
  assert_int_equal(kiln_datum_writer_commit(w), KILN_OK);
  char net[2048];
  snprintf(net, sizeof net,
           "layer { name: 'data' type: 'Data' top: 'data' top: 'label'\n"
           "        data_param { source: '%s' batch_size: 4 backend: LMDB } }\n"
           "layer { name: 'ip' type: 'InnerProduct' bottom: 'data' top: 'ip'\n"
           "        inner_product_param { num_output: 3 weight_filler { type: 'xavier' } }\n"
           "        include { phase: TRAIN } }\n"
           "layer { name: 'loss' type: 'SoftmaxWithLoss' bottom: 'ip' bottom: 'label' top: 'loss'\n"
           "        include { phase: TRAIN } }\n"
           "layer { name: 'f1' type: 'F1' bottom: 'data' bottom: 'label' top: 'tp' top: 'fp'\n"
           "        top: 'fn' f1_param { ignore_label: 2 } include { phase: TEST } }\n",
           lmdb);
  test_outputs t = {0};
  kiln_solver_options o = {.on_event = on_test_outputs, .user = &t};
  kiln_solver *s = make_solver(net, "base_lr: 0.1 lr_policy: 'fixed' max_iter: 1 test_iter: 2\n"
                               "test_interval: 1 display: 0", &o);
  assert_int_equal(kiln_solver_test(s, 0), KILN_OK);
  const struct {
    const char *name;
    float want;
  } want[] = {{"tp", 1.5f}, {"fp", 0.5f}, {"fn", 1.5f},
              {"precision", 0.75f}, {"recall", 0.5f}, {"f1", 0.6f}};
  assert_int_equal(t.n, 6);
  /* the names the net derives are those the metrics file's readers look for */
  assert_string_equal(KILN_NET_F1, KILN_MF_F1);
  assert_string_equal(KILN_NET_PERPLEXITY, KILN_MF_PERPLEXITY);
  for (int k = 0; k < 6; k++)
    assert_float_equal(output_value(&t, want[k].name), want[k].want, 1e-6);
  kiln_solver_free(s);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_lr_policies),
      cmocka_unit_test(test_update_rules),
      cmocka_unit_test(test_iter_size_equals_combined_batch),
      cmocka_unit_test(test_clip_gradients),
      cmocka_unit_test(test_solver_type_selection),
      cmocka_unit_test(test_solver_param_errors),
      cmocka_unit_test(test_solver_mode_gpu),
      cmocka_unit_test(test_snapshot_and_exact_resume),
      cmocka_unit_test(test_snapshot_resume_adam),
      cmocka_unit_test(test_solve_final_snapshot),
      cmocka_unit_test(test_restore_errors),
      cmocka_unit_test(test_test_passes_emit_events),
      cmocka_unit_test(test_test_event_derives_f1_of_the_pass),
      cmocka_unit_test(test_divergence_is_numeric_error),
      cmocka_unit_test(test_divergence_of_a_finite_loss),
      cmocka_unit_test(test_fault_injection),
      cmocka_unit_test(test_fault_lr_factor),
      cmocka_unit_test(test_train_event_records_outputs),
  };
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
