/* Sparse data: the libsvm reader (records, comments, and the bad input it refuses by file, line
 * and token), InnerProduct on a sparse bottom against the dense layer on the same values
 * (forward and backward, plain and transposed weights) and against finite differences, the
 * LibSVMData layer (its batches, the shuffle, exact cursors and the workers' shares), the net's
 * refusal of a sparse blob anywhere but an InnerProduct, and the memory of a net over 10^6
 * features following the entries, not the features. */
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
#include "kiln/data.h"
#include "layer_test.h"

static char dir[64];

static int setup(void **state) {
  (void)state;
  make_tmpdir(dir, sizeof dir, "sparse");
  return 0;
}

static int teardown(void **state) {
  (void)state;
  rm_tree(dir);
  return 0;
}

static void write_file(const char *name, const char *text) {
  char path[256];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  write_plain(path, text, strlen(text));
}

/* ---- the reader ---------------------------------------------------------------------------- */

static void test_libsvm_records(void **state) {
  (void)state;
  const char *text = "# a header comment\n"
                     "1 3:0.5 7:1 12:-2.5e-1\n"
                     "\n"
                     "   \t\n"
                     "0\t1:2 # a comment after the features\n"
                     "-1\r\n"
                     "2.5 2:3\t4:4";
  kiln_libsvm s;
  assert_int_equal(kiln_libsvm_parse(text, strlen(text), "a.svm", 0, &s), KILN_OK);
  assert_int_equal(s.x.rows, 4);
  assert_int_equal(s.x.nnz, 6);
  assert_int_equal(s.x.cols, 12); /* the largest index, without dim */
  assert_int_equal(s.max_row_nnz, 3);
  const int64_t row_ptr[] = {0, 3, 4, 4, 6};
  const int32_t col[] = {2, 6, 11, 0, 1, 3};
  const float val[] = {0.5f, 1, -0.25f, 2, 3, 4}, label[] = {1, 0, -1, 2.5f};
  for (int r = 0; r <= 4; r++) assert_int_equal(s.x.row_ptr[r], row_ptr[r]);
  for (int k = 0; k < 6; k++) {
    assert_int_equal(s.x.col[k], col[k]);
    assert_true(s.x.val[k] == val[k]);
  }
  for (int r = 0; r < 4; r++) assert_true(s.label[r] == label[r]);
  kiln_libsvm_free(&s);
  /* with dim, the column count is dim */
  assert_int_equal(kiln_libsvm_parse(text, strlen(text), "a.svm", 100, &s), KILN_OK);
  assert_int_equal(s.x.cols, 100);
  kiln_libsvm_free(&s);
}

/* Each bad line is refused with the file, its line and the token, and nothing is kept. */
static void test_libsvm_bad_input(void **state) {
  (void)state;
  static const struct {
    const char *text, *where, *what;
  } cases[] = {
      {"1 1:1\n0 0:1\n", "b.svm:2: token '0:1'", "index 0"},
      {"1 2:1 5:1 5:2\n", "b.svm:1: token '5:2'", "does not follow 5"},
      {"1 2:1 9:1 4:2\n", "b.svm:1: token '4:2'", "indices must increase"},
      {"1 1:1\n\n1 2:1 junk\n", "b.svm:3: token 'junk'", "not INDEX:VALUE"},
      {"1 1:x\n", "b.svm:1: token '1:x'", "value is not a finite number"},
      {"1 1:nan\n", "b.svm:1: token '1:nan'", "value is not a finite number"},
      {"1 a:1\n", "b.svm:1: token 'a:1'", "index is not a whole number"},
      {"1 -3:1\n", "b.svm:1: token '-3:1'", "index is not a whole number"},
      {"yes 1:1\n", "b.svm:1: token 'yes'", "label is not a finite number"},
      {"1 qid:4 1:1\n", "b.svm:1: token 'qid:4'", "qid"},
      {"1 10:1 11:1\n", "b.svm:1: token '11:1'", "past the 10 features"},
      {"1 4294967297:1\n", "b.svm:1: token '4294967297:1'", "past 2^31 - 1"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    kiln_libsvm s;
    int rc = kiln_libsvm_parse(cases[i].text, strlen(cases[i].text), "b.svm", 10, &s);
    assert_int_equal(rc, KILN_ERR_PARSE);
    expect_message(cases[i].where, cases[i].what, NULL);
    assert_null(s.x.row_ptr);
    assert_null(s.label);
  }
  kiln_libsvm s;
  assert_int_equal(kiln_libsvm_read("/nonexistent/x.svm", 0, &s), KILN_ERR_IO);
  expect_message("/nonexistent/x.svm", NULL, NULL);
}

/* ---- InnerProduct on a sparse bottom --------------------------------------------------------- */

/* An M x K sparse blob of about `per_row` entries a row (row 1 left empty), and its dense twin. */
static void random_rows(int64_t M, int64_t K, int per_row, kiln_rng *rng, kiln_blob **sparse,
                        kiln_blob **dense) {
  *sparse = kiln_blob_new("xs");
  assert_int_equal(kiln_blob_make_sparse(*sparse), KILN_OK);
  assert_int_equal(kiln_blob_reshape(*sparse, 2, SHAPE(M, K)), KILN_OK);
  kiln_csr *x = (*sparse)->csr;
  assert_int_equal(kiln_csr_reserve(x, M, M * per_row), KILN_OK);
  x->rows = M, x->cols = K, x->nnz = 0;
  x->row_ptr[0] = 0;
  if (dense) *dense = blob_of("xd", 2, SHAPE(M, K), NULL);
  for (int64_t m = 0; m < M; m++) {
    int64_t c = kiln_rng_below(rng, (uint32_t)(K / per_row));
    for (int j = 0; j < per_row && c < K && m != 1; j++) {
      float v = kiln_rng_uniform(rng, -1, 1);
      x->col[x->nnz] = (int32_t)c;
      x->val[x->nnz++] = v;
      if (dense) (*dense)->data[m * K + c] = v;
      c += 1 + kiln_rng_below(rng, (uint32_t)(K / per_row));
    }
    x->row_ptr[m + 1] = x->nnz;
  }
}

static void sparse_matches_dense(const char *params) {
  kiln_rng rng;
  kiln_rng_seed(&rng, 5, 1);
  const int64_t M = 6, K = 40, N = 3;
  kiln_blob *xs, *xd;
  random_rows(M, K, 6, &rng, &xs, &xd);
  char text[256];
  snprintf(text, sizeof text,
           "name: 'ip' type: 'InnerProduct' inner_product_param { num_output: 3 %s "
           "weight_filler { type: 'gaussian' std: 0.5 } bias_filler { type: 'uniform' } }",
           params);
  built s = build(text, TRAIN, &xs, 1, 1), d = build(text, TRAIN, &xd, 1, 1);
  set_params(&d, 0, s.l->param[0]->data);
  set_params(&d, 1, s.l->param[1]->data);
  forward(&s);
  forward(&d);
  expect_shape(s.top[0], 2, SHAPE(M, N));
  expect_close("forward", s.top[0]->data, d.top[0]->data, M * N, 1e-5);
  for (int64_t i = 0; i < M * N; i++)
    s.top[0]->diff[i] = d.top[0]->diff[i] = kiln_rng_uniform(&rng, -1, 1);
  for (int p = 0; p < 2; p++) { /* accumulated onto what is there */
    fill(s.l->param[p]->diff, s.l->param[p]->count, 0.25f);
    fill(d.l->param[p]->diff, d.l->param[p]->count, 0.25f);
  }
  s.l->propagate_down[0] = d.l->propagate_down[0] = false;
  backward(&s);
  backward(&d);
  expect_close("weight gradient", s.l->param[0]->diff, d.l->param[0]->diff, K * N, 1e-5);
  expect_close("bias gradient", s.l->param[1]->diff, d.l->param[1]->diff, N, 1e-5);
  /* a gradient for the sparse bottom is refused */
  s.l->propagate_down[0] = true;
  assert_int_equal(layer_backward(s.l), KILN_ERR_UNSUPPORTED);
  expect_message("layer 'ip' (InnerProduct)", "'xs' is sparse", "propagate_down: false");
  unbuild(&s);
  unbuild(&d);
  kiln_blob_free(xs);
  kiln_blob_free(xd);
}

static void test_sparse_inner_product_matches_dense(void **state) {
  (void)state;
  sparse_matches_dense("");
  sparse_matches_dense("transpose: true");
}

/* A batch large enough for threads gives the same bits on 1 and 3 threads, forward and backward
 * (each output's sum keeps one order). */
static void same_bits_on_threads(const char *params) {
  kiln_rng rng;
  kiln_rng_seed(&rng, 9, 4);
  kiln_blob *xs;
  random_rows(64, 20000, 300, &rng, &xs, NULL); /* 64 x 300 entries x 16 outputs > 2^18 */
  char text[256];
  snprintf(text, sizeof text,
           "name: 'ip' type: 'InnerProduct' inner_product_param { num_output: 16 %s "
           "weight_filler { type: 'gaussian' std: 0.5 } bias_filler { type: 'uniform' } }",
           params);
  built b[2] = {build(text, TRAIN, &xs, 1, 1), build(text, TRAIN, &xs, 1, 1)};
  b[0].l->nthreads = 1;
  b[1].l->nthreads = 3;
  for (int k = 0; k < 2; k++) {
    forward(&b[k]);
    for (int64_t i = 0; i < b[k].top[0]->count; i++) b[k].top[0]->diff[i] = (float)(i % 7) - 3;
    b[k].l->propagate_down[0] = false;
    backward(&b[k]);
  }
  assert_memory_equal(b[0].top[0]->data, b[1].top[0]->data, sizeof(float) * 64 * 16);
  assert_memory_equal(b[0].l->param[0]->diff, b[1].l->param[0]->diff, sizeof(float) * 16 * 20000);
  unbuild(&b[0]);
  unbuild(&b[1]);
  kiln_blob_free(xs);
}

static void test_sparse_inner_product_threads(void **state) {
  (void)state;
  same_bits_on_threads("");
  same_bits_on_threads("transpose: true");
}

/* Finite differences of the weights and bias, plain and transposed (the sparse bottom itself
 * takes no gradient). */
static void test_sparse_inner_product_gradient(void **state) {
  (void)state;
  kiln_rng rng;
  kiln_rng_seed(&rng, 8, 2);
  kiln_blob *xs;
  random_rows(4, 12, 3, &rng, &xs, NULL);
  check_grad("name: 'ip' type: 'InnerProduct' inner_product_param { num_output: 3 "
             "weight_filler { type: 'gaussian' std: 0.5 } bias_filler { type: 'uniform' } }",
             &xs, 1, 1, NULL);
  check_grad("name: 'ip' type: 'InnerProduct' inner_product_param { num_output: 2 "
             "transpose: true weight_filler { type: 'gaussian' std: 0.5 } }",
             &xs, 1, 1, NULL);
  kiln_blob_free(xs);
}

static void test_sparse_inner_product_refusals(void **state) {
  (void)state;
  kiln_rng rng;
  kiln_rng_seed(&rng, 8, 3);
  kiln_blob *xs;
  random_rows(4, 12, 3, &rng, &xs, NULL);
  expect_create_fails("name: 'ip' type: 'InnerProduct' inner_product_param { num_output: 2 "
                      "axis: 0 }",
                      TRAIN, &xs, 1, 1, KILN_ERR_INVALID, "layer 'ip' (InnerProduct)",
                      "axis must be 1");
  /* the rows the blob holds must be the shape's */
  built b = build("name: 'ip' type: 'InnerProduct' inner_product_param { num_output: 2 }", TRAIN,
                  &xs, 1, 1);
  xs->csr->rows = 3;
  assert_int_equal(layer_forward(b.l), KILN_ERR_SHAPE);
  expect_message("'xs' holds 3 x 12", "expects 4 x 12", NULL);
  assert_false(kiln_layer_allows_gradient(b.l, 0));
  unbuild(&b);
  kiln_blob_free(xs);
}

/* ---- LibSVMData ---------------------------------------------------------------------------- */

/* Record r (0 .. 9) of rows.svm: label r % 3, feature r + 1 = r + 0.5 and feature 20 = 1. */
static void write_rows(void) {
  char text[512] = "";
  for (int r = 0; r < 10; r++)
    snprintf(text + strlen(text), sizeof text - strlen(text), "%d %d:%g 20:1\n", r % 3, r + 1,
             r + 0.5);
  write_file("rows.svm", text);
}

static built libsvm_layer(const char *extra, int phase) {
  char text[512];
  snprintf(text, sizeof text,
           "name: 'd' type: 'LibSVMData' libsvm_data_param { source: '%s/rows.svm' dim: 20 %s }",
           dir, extra);
  return build(text, phase, NULL, 0, 2);
}

/* The record each row of the current batch is, from its first feature. */
static void batch_records(const built *b, int *rec) {
  const kiln_csr *x = b->top[0]->csr;
  for (int64_t m = 0; m < x->rows; m++) {
    assert_int_equal(x->row_ptr[m + 1] - x->row_ptr[m], 2);
    int r = x->col[x->row_ptr[m]];
    rec[m] = r;
    assert_true(x->val[x->row_ptr[m]] == r + 0.5f);
    assert_int_equal(x->col[x->row_ptr[m] + 1], 19);
    assert_true(b->top[1]->data[m] == (float)(r % 3));
  }
}

static void test_libsvm_data_batches(void **state) {
  (void)state;
  write_rows();
  built b = libsvm_layer("batch_size: 4", TRAIN);
  expect_shape(b.top[0], 2, SHAPE(4, 20));
  expect_shape(b.top[1], 1, SHAPE(4));
  assert_non_null(b.top[0]->csr);
  assert_null(b.top[0]->data); /* no dense values */
  int rec[4];
  const int want[3][4] = {{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9, 0, 1}}; /* wraps into epoch 2 */
  for (int k = 0; k < 3; k++) {
    forward(&b);
    assert_int_equal(b.top[0]->csr->rows, 4);
    assert_int_equal(b.top[0]->csr->cols, 20);
    batch_records(&b, rec);
    for (int m = 0; m < 4; m++) assert_int_equal(rec[m], want[k][m]);
  }
  assert_int_equal(b.l->ops->get_cursor(b.l), 12);
  unbuild(&b);
}

/* Shuffled: each epoch a permutation drawn from the seed; a layer set to another's cursor reads
 * what it would have read next; two workers read alternate batches of the one stream. */
static void test_libsvm_data_shuffle_cursor_shards(void **state) {
  (void)state;
  write_rows();
  built a = libsvm_layer("batch_size: 5 shuffle: true", TRAIN);
  int seen[10] = {0}, rec[5], first[5];
  for (int k = 0; k < 2; k++) {
    forward(&a);
    batch_records(&a, rec);
    for (int m = 0; m < 5; m++) seen[rec[m]]++;
    if (k == 0) memcpy(first, rec, sizeof first);
  }
  for (int r = 0; r < 10; r++) assert_int_equal(seen[r], 1); /* one epoch: each record once */
  bool ordered = true;
  for (int m = 0; m < 5; m++) ordered &= first[m] == m;
  assert_false(ordered);
  /* resume */
  forward(&a);
  uint64_t cursor = a.l->ops->get_cursor(a.l);
  assert_int_equal(cursor, 15);
  built r = libsvm_layer("batch_size: 5 shuffle: true", TRAIN);
  assert_int_equal(r.l->ops->set_cursor(r.l, cursor), KILN_OK);
  int ra[5], rr[5];
  for (int k = 0; k < 3; k++) {
    forward(&a);
    forward(&r);
    batch_records(&a, ra);
    batch_records(&r, rr);
    for (int m = 0; m < 5; m++) assert_int_equal(ra[m], rr[m]);
  }
  unbuild(&r);
  /* two workers: rank w reads global batches w, w + 2, ... of the one stream */
  built one = libsvm_layer("batch_size: 3 shuffle: true", TRAIN), w[2];
  int stream[6][3];
  for (int k = 0; k < 6; k++) {
    forward(&one);
    batch_records(&one, stream[k]);
  }
  for (int k = 0; k < 2; k++) {
    w[k] = libsvm_layer("batch_size: 3 shuffle: true", TRAIN);
    w[k].l->shard_rank = k;
    w[k].l->shard_count = 2;
  }
  for (int j = 0; j < 3; j++)
    for (int k = 0; k < 2; k++) {
      forward(&w[k]);
      batch_records(&w[k], rec);
      for (int m = 0; m < 3; m++) assert_int_equal(rec[m], stream[2 * j + k][m]);
    }
  assert_int_equal(w[0].l->ops->get_cursor(w[0].l), one.l->ops->get_cursor(one.l));
  /* a TEST net reads every batch whatever its shard */
  built t = libsvm_layer("batch_size: 3", TEST);
  t.l->shard_rank = 1;
  t.l->shard_count = 2;
  forward(&t);
  batch_records(&t, rec);
  assert_int_equal(rec[0], 0);
  unbuild(&t);
  unbuild(&w[0]);
  unbuild(&w[1]);
  unbuild(&one);
  unbuild(&a);
}

static void test_libsvm_data_refusals(void **state) {
  (void)state;
  write_file("bad.svm", "1 1:1\n0 3:1 2:1\n");
  char text[512];
  snprintf(text, sizeof text,
           "name: 'd' type: 'LibSVMData' libsvm_data_param { source: '%s/bad.svm' dim: 5 "
           "batch_size: 2 }",
           dir);
  expect_create_fails(text, TRAIN, NULL, 0, 2, KILN_ERR_PARSE, "layer 'd' (LibSVMData)",
                      "bad.svm:2: token '2:1'");
  write_rows();
  snprintf(text, sizeof text,
           "name: 'd' type: 'LibSVMData' libsvm_data_param { source: '%s/rows.svm' dim: 19 "
           "batch_size: 2 }",
           dir);
  expect_create_fails(text, TRAIN, NULL, 0, 2, KILN_ERR_PARSE, "rows.svm:1: token '20:1'",
                      "past the 19 features");
  snprintf(text, sizeof text,
           "name: 'd' type: 'LibSVMData' libsvm_data_param { source: '%s/rows.svm' "
           "batch_size: 2 }",
           dir);
  expect_create_fails(text, TRAIN, NULL, 0, 2, KILN_ERR_INVALID, "layer 'd' (LibSVMData)",
                      "dim (the feature count) must be set");
  snprintf(text, sizeof text,
           "name: 'd' type: 'LibSVMData' libsvm_data_param { source: '%s/rows.svm' "
           "batch_size: 2 dim: 0 }",
           dir);
  expect_create_fails(text, TRAIN, NULL, 0, 2, KILN_ERR_INVALID, "layer 'd' (LibSVMData)",
                      "dim (the feature count) 0 is out of range: 1 to");
  snprintf(text, sizeof text,
           "name: 'd' type: 'LibSVMData' libsvm_data_param { source: '%s/rows.svm' "
           "batch_size: 4294967295 dim: 19 }",
           dir);
  expect_create_fails(text, TRAIN, NULL, 0, 2, KILN_ERR_INVALID, "layer 'd' (LibSVMData)",
                      "batch_size 4294967295 is out of range: 1 to 1048576");
  write_file("empty.svm", "# nothing\n\n");
  snprintf(text, sizeof text,
           "name: 'd' type: 'LibSVMData' libsvm_data_param { source: '%s/empty.svm' dim: 3 "
           "batch_size: 2 }",
           dir);
  expect_create_fails(text, TRAIN, NULL, 0, 2, KILN_ERR_DATA, "layer 'd' (LibSVMData)",
                      "no records");
}

/* ---- in a net ------------------------------------------------------------------------------ */

static int build_net(const char *text, kiln_net **net, Caffe__NetParameter **np) {
  assert_int_equal(kiln_net_param_from_text(text, "<test>", np), KILN_OK);
  kiln_net_options opt = {.phase = TRAIN, .seed = 1, .nthreads = 1, .config = kiln_test_net_config()};
  int rc = kiln_net_create(*np, &opt, net);
  if (rc) {
    protobuf_c_message_free_unpacked(&(*np)->base, NULL);
    *np = NULL;
  }
  return rc;
}

/* A LibSVMData net with `body` after the data layer. */
static int sparse_net(const char *file, int64_t dim, const char *body, kiln_net **net,
                      Caffe__NetParameter **np) {
  char text[2048];
  snprintf(text, sizeof text,
           "layer { name: 'd' type: 'LibSVMData' top: 'x' top: 'label' libsvm_data_param { "
           "source: '%s/%s' dim: %lld batch_size: 8 } } %s",
           dir, file, (long long)dim, body);
  return build_net(text, net, np);
}

static void test_sparse_blob_only_into_inner_product(void **state) {
  (void)state;
  write_rows();
  static const struct {
    const char *body, *what, *what2;
  } cases[] = {
      {"layer { name: 'r' type: 'ReLU' bottom: 'x' top: 'y' }", "layer 'r' (ReLU)",
       "bottom 'x' is sparse"},
      /* fanned out: the net's Split would read it */
      {"layer { name: 'a' type: 'InnerProduct' bottom: 'x' top: 'a' inner_product_param { "
       "num_output: 2 } } layer { name: 'b' type: 'InnerProduct' bottom: 'x' top: 'b' "
       "inner_product_param { num_output: 2 } }",
       "(Split)", "cannot feed two layers"},
      {"layer { name: 'f' type: 'Flatten' bottom: 'x' top: 'y' }", "layer 'f' (Flatten)",
       "bottom 'x' is sparse"},
      {"", "blob 'x' is sparse and no layer reads it", NULL},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    kiln_net *net = NULL;
    Caffe__NetParameter *np = NULL;
    int rc = sparse_net("rows.svm", 20, cases[i].body, &net, &np);
    if (rc != KILN_ERR_INVALID) print_error("case %zu: %s\n", i, kiln_last_error());
    assert_int_equal(rc, KILN_ERR_INVALID);
    expect_message(cases[i].what, cases[i].what2, NULL);
  }
}

/* force_backward asks nothing of the sparse blob; logistic regression trains on it. */
static void test_sparse_net_trains(void **state) {
  (void)state;
  write_rows();
  kiln_net *net;
  Caffe__NetParameter *np;
  assert_int_equal(
      sparse_net("rows.svm", 20,
                 "force_backward: true layer { name: 'ip' type: 'InnerProduct' bottom: 'x' "
                 "top: 'ip' inner_product_param { num_output: 3 } } layer { name: 'loss' type: "
                 "'SoftmaxWithLoss' bottom: 'ip' bottom: 'label' top: 'loss' }",
                 &net, &np),
      KILN_OK);
  kiln_layer *ip = kiln_net_layer(net, "ip");
  assert_false(ip->propagate_down[0]);
  float first = 0, loss = 0;
  for (int it = 0; it < 60; it++) {
    kiln_net_zero_param_diff(net);
    assert_int_equal(kiln_net_forward(net, &loss), KILN_OK);
    if (it == 0) first = loss;
    assert_int_equal(kiln_net_backward(net), KILN_OK);
    for (int64_t i = 0; i < net->nparam_floats; i++)
      net->param_data[i] -= 0.5f * net->param_diff[i];
  }
  assert_true(fabsf(first - logf(3)) < 1e-5f); /* zero weights: uniform over 3 classes */
  assert_true(loss < 0.5f * first);
  kiln_net_free(net);
  protobuf_c_message_free_unpacked(&np->base, NULL);
}

/* Over 10^6 features the activations and the layers' memory are those of 10^2 features: the
 * batch's entries, not batch x features; only the weights grow with the features. */
static void test_sparse_memory_follows_entries(void **state) {
  (void)state;
  write_rows();
  char text[512] = "";
  for (int r = 0; r < 10; r++)
    snprintf(text + strlen(text), sizeof text - strlen(text), "%d %d:1 %d:2 1000000:0.5\n", r % 2,
             r + 1, 1000 * r + 500);
  write_file("wide.svm", text);
  const char *body = "layer { name: 'ip' type: 'InnerProduct' bottom: 'x' top: 'ip' "
                     "inner_product_param { num_output: 2 } } layer { name: 'loss' type: "
                     "'SoftmaxWithLoss' bottom: 'ip' bottom: 'label' top: 'loss' }";
  kiln_net *wide, *narrow;
  Caffe__NetParameter *npw, *npn;
  assert_int_equal(sparse_net("wide.svm", 1000000, body, &wide, &npw), KILN_OK);
  snprintf(text, sizeof text, "%s", "");
  for (int r = 0; r < 10; r++)
    snprintf(text + strlen(text), sizeof text - strlen(text), "%d %d:1 %d:2 100:0.5\n", r % 2,
             r + 1, r + 50);
  write_file("narrow.svm", text);
  assert_int_equal(sparse_net("narrow.svm", 100, body, &narrow, &npn), KILN_OK);
  kiln_blob *x = kiln_net_blob(wide, "x");
  expect_shape(x, 2, SHAPE(8, 1000000));
  assert_null(x->data);
  assert_null(x->diff);
  /* 8 rows of 3 entries: 9 row pointers and 24 (column, value) pairs */
  assert_int_equal(kiln_csr_bytes(x->csr), 9 * 8 + 24 * 8);
  assert_int_equal(wide->memory.activations, narrow->memory.activations);
  assert_int_equal(wide->memory.buffers, narrow->memory.buffers);
  assert_int_equal(wide->memory.workspace, narrow->memory.workspace);
  assert_true(wide->memory.activations < 4096);
  assert_int_equal(wide->memory.params, (2 * 1000000 + 2) * 4);
  /* and it runs, allocating nothing more for the batch */
  float loss;
  kiln_net_zero_param_diff(wide);
  for (int k = 0; k < 3; k++) {
    assert_int_equal(kiln_net_forward(wide, &loss), KILN_OK);
    assert_int_equal(kiln_net_backward(wide), KILN_OK);
  }
  assert_true(fabsf(loss - logf(2)) < 1e-5f);
  assert_int_equal(kiln_csr_bytes(x->csr), 9 * 8 + 24 * 8);
  /* weight gradient: only the columns of the batches' features are touched */
  const kiln_blob *w = kiln_net_layer(wide, "ip")->param[0];
  int64_t touched = 0;
  for (int64_t i = 0; i < w->count; i++) touched += w->diff[i] != 0;
  assert_true(touched > 0 && touched <= 2 * 21);
  kiln_net_free(wide);
  kiln_net_free(narrow);
  protobuf_c_message_free_unpacked(&npw->base, NULL);
  protobuf_c_message_free_unpacked(&npn->base, NULL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_libsvm_records),
      cmocka_unit_test(test_libsvm_bad_input),
      cmocka_unit_test(test_sparse_inner_product_matches_dense),
      cmocka_unit_test(test_sparse_inner_product_threads),
      cmocka_unit_test(test_sparse_inner_product_gradient),
      cmocka_unit_test(test_sparse_inner_product_refusals),
      cmocka_unit_test(test_libsvm_data_batches),
      cmocka_unit_test(test_libsvm_data_shuffle_cursor_shards),
      cmocka_unit_test(test_libsvm_data_refusals),
      cmocka_unit_test(test_sparse_blob_only_into_inner_product),
      cmocka_unit_test(test_sparse_net_trains),
      cmocka_unit_test(test_sparse_memory_follows_entries),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
