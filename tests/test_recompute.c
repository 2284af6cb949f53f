/* Recomputation in backward (src/net/net_recompute.c), the memory-efficient DenseNet technique:
 * a small DenseNet-BC gives the plain plan's losses and parameter gradients, bit for bit, over
 * three SGD steps, with the BatchNorm-Scale-ReLU outputs that only feed a convolution (and
 * BatchNorm's normalised copies) kept in two shared scratch buffers and recomputed in backward,
 * and each block's Concat tops but the last in two more, copied back in backward from the start
 * of the last. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gradcheck.h"
#include "kiln/net.h"

#define K 4 /* growth */

/* DenseNet-BC of depth 6L + 4 with growth K on N x 1 x 8 x 8 input, as
 * scripts/gen-deploy-nets.py writes it: conv0 of 2K channels; three blocks of L bottlenecks
 * (BatchNorm to a blob of its own, Scale and ReLU in place, 1x1 conv of 4K; BatchNorm, Scale and
 * ReLU in place, 3x3 conv of K; Concat); transitions (BatchNorm-Scale-ReLU, 1x1 conv to half the
 * channels, 2x2 average pooling); BatchNorm-Scale-ReLU (unless final_bn is false: then the
 * pooling reads the last Concat itself), global average pooling, fc 10. */
static char *densenet_text_final(int L, int N, bool final_bn) {
  size_t cap = 65536, used = 0;
  char *s = malloc(cap);
  assert_non_null(s);
#define OUT(...) used += (size_t)snprintf(s + used, cap - used, __VA_ARGS__)
#define BN(name, bottom, top)                                                                  \
  OUT("layer { name: 'bn_%s' type: 'BatchNorm' bottom: '%s' top: '%s' }\n"                     \
      "layer { name: 'sc_%s' type: 'Scale' bottom: '%s' top: '%s' scale_param { bias_term: true" \
      " filler { type: 'uniform' min: 0.5 max: 1.5 } bias_filler { type: 'uniform' min: -0.5"   \
      " max: 0.5 } } }\n"                                                                      \
      "layer { name: 'relu_%s' type: 'ReLU' bottom: '%s' top: '%s' }\n",                       \
      name, bottom, top, name, top, top, name, top, top)
#define CONV(name, bottom, n, k, pad)                                                          \
  OUT("layer { name: '%s' type: 'Convolution' bottom: '%s' top: '%s' convolution_param {"      \
      " num_output: %d kernel_size: %d pad: %d bias_term: false weight_filler { type: 'msra' }"  \
      " } }\n",                                                                                \
      name, bottom, name, n, k, pad)
  OUT("name: 'densenet'\nlayer { name: 'in' type: 'Input' top: 'data' top: 'label'\n"
      "  input_param { shape { dim: %d dim: 1 dim: 8 dim: 8 } shape { dim: %d } } }\n", N, N);
  CONV("conv0", "data", 2 * K, 3, 1);
  char x[64] = "conv0", a[64], b[64], c[64], d[64];
  int channels = 2 * K;
  for (int blk = 1; blk <= 3; blk++) {
    for (int i = 1; i <= L; i++) {
      snprintf(a, sizeof a, "b%d_%d_bn", blk, i);
      snprintf(b, sizeof b, "b%d_%d_conv1", blk, i);
      snprintf(c, sizeof c, "b%d_%d_conv2", blk, i);
      snprintf(d, sizeof d, "b%d_%d_concat", blk, i);
      BN(a, x, a);
      CONV(b, a, 4 * K, 1, 0);
      BN(b, b, b);
      CONV(c, b, K, 3, 1);
      OUT("layer { name: '%s' type: 'Concat' bottom: '%s' bottom: '%s' top: '%s' }\n", d, x, c, d);
      snprintf(x, sizeof x, "%s", d);
      channels += K;
    }
    if (blk < 3) {
      snprintf(a, sizeof a, "t%d_bn", blk);
      snprintf(b, sizeof b, "t%d_conv", blk);
      snprintf(c, sizeof c, "t%d_pool", blk);
      BN(a, x, a);
      channels /= 2;
      CONV(b, a, channels, 1, 0);
      OUT("layer { name: '%s' type: 'Pooling' bottom: '%s' top: '%s' pooling_param { pool: AVE"
          " kernel_size: 2 stride: 2 } }\n", c, b, c);
      snprintf(x, sizeof x, "%s", c);
    }
  }
  if (final_bn) BN("final", x, "final");
  OUT("layer { name: 'pool' type: 'Pooling' bottom: '%s' top: 'pool' pooling_param { pool: AVE"
      " global_pooling: true } }\n"
      "layer { name: 'fc' type: 'InnerProduct' bottom: 'pool' top: 'fc' inner_product_param {"
      " num_output: 10 weight_filler { type: 'xavier' } } }\n"
      "layer { name: 'loss' type: 'SoftmaxWithLoss' bottom: 'fc' bottom: 'label' top: 'loss' }\n",
      final_bn ? "final" : x);
#undef OUT
#undef BN
#undef CONV
  assert_true(used < cap);
  return s;
}

static char *densenet_text(int L, int N) { return densenet_text_final(L, N, true); }

typedef struct {
  Caffe__NetParameter *np;
  kiln_net *net;
} built;

static void build(built *b, const char *text, const kiln_config *cfg, bool share_data) {
  memset(b, 0, sizeof *b);
  assert_int_equal(kiln_net_param_from_text(text, "<test>", &b->np), KILN_OK);
  kiln_net_options o = {0};
  o.phase = CAFFE__PHASE__TRAIN;
  o.seed = 7;
  o.nthreads = 2;
  o.config = cfg;
  o.share_diffs = true;
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
  for (int i = 0; i < net->nblobs; i++)
    if (!strcmp(net->blobs[i]->name, name)) return net->blobs[i];
  fail_msg("no blob '%s'", name);
  return NULL;
}

/* Both nets get the same inputs (a fixed pseudo-random sequence) and take three steps of plain
 * SGD; their losses and parameter gradients must be the same bits at every step. `spoil`: r's
 * shared activation data is overwritten with NaN between its forward and its backward. */
static void check_same_steps(kiln_net *p, kiln_net *r, bool spoil) {
  assert_int_equal(p->nparam_floats, r->nparam_floats);
  assert_memory_equal(p->param_data, r->param_data, (size_t)p->nparam_floats * sizeof(float));
  uint32_t seed = 12345;
  for (int step = 0; step < 3; step++) {
    kiln_blob *dp = blob(p, "data"), *dr = blob(r, "data");
    kiln_blob *lp = blob(p, "label"), *lr = blob(r, "label");
    for (int64_t k = 0; k < dp->count; k++) {
      seed = seed * 1664525u + 1013904223u;
      dp->data[k] = dr->data[k] = (float)(seed >> 8) / 16777216.0f * 2.0f - 1.0f;
    }
    for (int64_t k = 0; k < lp->count; k++) lp->data[k] = lr->data[k] = (float)((k * 7 + step) % 10);
    float loss_p, loss_r;
    kiln_net_zero_param_diff(p);
    kiln_net_zero_param_diff(r);
    assert_int_equal(kiln_net_forward(p, &loss_p), KILN_OK);
    assert_int_equal(kiln_net_forward(r, &loss_r), KILN_OK);
    if (spoil) assert_true(kiln_test_spoil_shared_data(r) > 0);
    assert_int_equal(kiln_net_backward(p), KILN_OK);
    assert_int_equal(kiln_net_backward(r), KILN_OK);
    assert_memory_equal(&loss_p, &loss_r, sizeof loss_p);
    assert_memory_equal(p->param_diff, r->param_diff, (size_t)p->nparam_floats * sizeof(float));
    /* BatchNorm's statistics (parameters without gradients) too */
    assert_memory_equal(p->param_data, r->param_data, (size_t)p->nparam_floats * sizeof(float));
    for (int64_t k = 0; k < p->nparam_floats; k++) {
      p->param_data[k] -= 0.05f * p->param_diff[k];
      r->param_data[k] -= 0.05f * r->param_diff[k];
    }
  }
}

static void check_depth(int L, int N, bool plain_layouts) {
  char *text = densenet_text(L, N);
  kiln_config pc = *kiln_test_config(), rc = *kiln_test_config();
  pc.no_recompute = true;
  rc.no_recompute = false;
  if (plain_layouts) pc.plain_layouts = rc.plain_layouts = true;
  built p, r;
  build(&p, text, &pc, false);
  build(&r, text, &rc, false);
  /* The first BatchNorm of each bottleneck and transition, and the final one (its reader is the
   * pooling), recompute: their tops' data is the scratch's. The in-place ones do not. */
  int recomputed = 0;
  for (int i = 0; i < r.net->nblobs; i++) {
    const kiln_blob *b = r.net->blobs[i];
    const size_t n = strlen(b->name);
    const bool own = n > 3 && (!strcmp(b->name + n - 3, "_bn") || !strcmp(b->name, "final"));
    if (own) {
      assert_non_null(b->data_of);
      assert_null(blob(p.net, b->name)->data_of);
      recomputed++;
    }
  }
  assert_int_equal(recomputed, 3 * L + 2 + 1);
  /* A block's Concat tops are not kept but for its last. */
  for (int blk = 1; blk <= 3; blk++)
    for (int i = 1; i <= L; i++) {
      char name[64];
      snprintf(name, sizeof name, "b%d_%d_concat", blk, i);
      if (i < L)
        assert_non_null(blob(r.net, name)->data_of);
      else
        assert_null(blob(r.net, name)->data_of);
      assert_null(blob(p.net, name)->data_of);
    }
  assert_true(r.net->memory.activations < p.net->memory.activations);
  assert_true(r.net->memory.buffers < p.net->memory.buffers);
  check_same_steps(p.net, r.net, false);
  built_free(&p);
  built_free(&r);
  free(text);
}

/* With activation data shared by lifetime as well (kiln_net_options.share_data): the features
 * each 3x3 convolution adds, once copied into its block's Concat, and the transitions' and the
 * classifier's outputs are read by no backward, so they share memory, even with the recomputed
 * tops and the Concat chains in scratch buffers; the plain net's steps, bit for bit, with that
 * memory spoiled between forward and backward. */
static void check_shared_data(int L, int N, bool plain_layouts, bool final_bn) {
  char *text = densenet_text_final(L, N, final_bn);
  kiln_config pc = *kiln_test_config(), rc = *kiln_test_config();
  pc.no_recompute = true;
  rc.no_recompute = false;
  if (plain_layouts) pc.plain_layouts = rc.plain_layouts = true;
  built p, r, k;
  build(&p, text, &pc, false);
  build(&r, text, &rc, true);
  build(&k, text, &rc, false);
  for (int blk = 1; blk <= 3; blk++)
    for (int i = 1; i <= L; i++) {
      char name[64];
      snprintf(name, sizeof name, "b%d_%d_conv2", blk, i);
      assert_true(kiln_test_data_shared(blob(r.net, name)));
      assert_false(kiln_test_data_shared(blob(k.net, name)));
    }
  assert_true(kiln_test_data_shared(blob(r.net, "fc")));
  assert_true(r.net->memory.activations < k.net->memory.activations);
  check_same_steps(p.net, r.net, true);
  built_free(&p);
  built_free(&r);
  built_free(&k);
  free(text);
}

static void test_densenet10_recompute_matches_plain(void **state) {
  (void)state;
  check_depth(1, 6, false);
}

static void test_densenet16_recompute_matches_plain(void **state) {
  (void)state;
  check_depth(2, 5, true);
}

static void test_densenet22_recompute_matches_plain(void **state) {
  (void)state;
  check_depth(3, 3, false);
}

static void test_densenet16_shared_data_matches_plain(void **state) {
  (void)state;
  check_shared_data(2, 5, false, true);
}

/* Without the final BatchNorm the last block's kept Concat top is read in forward only by the
 * pooling, which reads nothing in backward; the refills of that block still copy from it, so it
 * must keep its memory to the end of the step. */
static void test_densenet16_shared_data_keeps_refill_source(void **state) {
  (void)state;
  check_shared_data(2, 5, false, false);
}

static void test_densenet22_shared_data_matches_plain_layouts(void **state) {
  (void)state;
  check_shared_data(3, 3, true, true);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_densenet10_recompute_matches_plain),
      cmocka_unit_test(test_densenet16_recompute_matches_plain),
      cmocka_unit_test(test_densenet22_recompute_matches_plain),
      cmocka_unit_test(test_densenet16_shared_data_matches_plain),
      cmocka_unit_test(test_densenet16_shared_data_keeps_refill_source),
      cmocka_unit_test(test_densenet22_shared_data_matches_plain_layouts),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
