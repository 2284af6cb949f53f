/* What every layer owes: a line in src/layers/layer_list.h that the registry serves, a test in
 * the tests/test_layers_<family>.c file of its family, its state in docs/caffe-layers.md, and
 * the gradient convention (bottom diffs OVERWRITTEN, parameter diffs ACCUMULATED). CTest also
 * runs this file with KILN_ENGINE=ref. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ctype.h>
#include <dirent.h>

#include "layer_test.h"

/* ---- the list, the registry and the tests ------------------------------------------------ */

/* The type strings of src/layers/layer_list.h, the list the registry is built from, read here
 * line by line. */
static const char *const listed[] = {
#define KILN_LAYER(type, ops) type,
#include "layers/layer_list.h"
#undef KILN_LAYER
};
enum { NLISTED = sizeof listed / sizeof listed[0] };

/* What the layer test files say about one type. */
typedef struct {
  bool built;    /* some top-level definition names it as `type: '<type>'` */
  bool gradient; /* one of those also checks gradients (check_grad / gradcheck_layer) */
} coverage;

/* Splits a test file into its top-level definitions (each starts at a line that begins with a
 * letter: a function, or a table at file scope, with the comment lines between two definitions
 * going to the first) and notes, for each listed type, whether one names it and whether that
 * one also checks gradients. A type's test is then a definition that builds it, wherever it
 * sits in its family file. */
static void scan_tests(char *text, coverage *cov) {
  char *p = text;
  while (*p) {
    char *end = p;
    do {
      char *nl = strchr(end, '\n');
      end = nl ? nl + 1 : end + strlen(end);
    } while (*end && !isalpha((unsigned char)*end));
    const char keep = *end;
    *end = '\0'; /* the definition alone, for strstr */
    const bool grad = strstr(p, "check_grad(") || strstr(p, "gradcheck_layer(");
    for (int i = 0; i < NLISTED; i++) {
      char single[128], dbl[128];
      snprintf(single, sizeof single, "type: '%s'", listed[i]);
      snprintf(dbl, sizeof dbl, "type: \\\"%s\\\"", listed[i]);
      if (strstr(p, single) || strstr(p, dbl)) {
        cov[i].built = true;
        cov[i].gradient |= grad;
      }
    }
    *end = keep;
    p = end;
  }
}

/* Every line of the list is registered under its own type string and the registry holds
 * nothing else; every listed type is built by a test in some tests/test_layers_*.c, and every
 * one with a backward pass has its gradients checked there against finite differences. A layer
 * added to the list without its tests fails here. */
static void test_every_listed_layer_registered_and_tested(void **state) {
  (void)state;
  const char *const *names = kiln_layer_type_names();
  int n = 0;
  for (; names[n]; n++) {
    assert_true(n < NLISTED);
    assert_string_equal(names[n], listed[n]);
  }
  assert_int_equal(n, NLISTED);
  assert_true(n >= 14);
  for (int i = 0; i < NLISTED; i++) {
    const kiln_layer_ops *ops = kiln_layer_find(listed[i]);
    assert_non_null(ops);
    assert_string_equal(ops->type, listed[i]);
    for (int j = 0; j < i; j++) assert_string_not_equal(listed[j], listed[i]);
  }
  assert_null(kiln_layer_find("Convolutoin"));

  const char *root = getenv("KILN_SOURCE_DIR"); /* the repository root, set by CTest */
  assert_non_null(root);
  char dir[4096];
  snprintf(dir, sizeof dir, "%s/tests", root);
  DIR *d = opendir(dir);
  assert_non_null(d);
  coverage cov[NLISTED] = {0};
  int files = 0;
  for (struct dirent *e; (e = readdir(d));) {
    const size_t len = strlen(e->d_name);
    if (strncmp(e->d_name, "test_layers_", 12) || len < 3 || strcmp(e->d_name + len - 2, ".c"))
      continue;
    char path[8192], *text = NULL;
    size_t size;
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    if (kiln_read_file(path, &text, &size)) fail_msg("%s", kiln_last_error());
    scan_tests(text, cov);
    free(text);
    files++;
  }
  closedir(d);
  assert_true(files >= 2);
  int missing = 0;
  for (int i = 0; i < NLISTED; i++) {
    if (!cov[i].built) {
      print_error("layer type '%s' (src/layers/layer_list.h) has no test in tests/test_layers_*.c "
                  "that builds it (type: '%s')\n",
                  listed[i], listed[i]);
      missing++;
    } else if (kiln_layer_find(listed[i])->backward && !cov[i].gradient) {
      print_error("layer type '%s' has a backward pass but no test in tests/test_layers_*.c that "
                  "checks its gradients (check_grad)\n",
                  listed[i]);
      missing++;
    }
  }
  assert_int_equal(missing, 0);
}

/* ---- the gradient contract ----------------------------------------------------------------- */

/* Backward twice after one forward, with different garbage in the bottom diff before each: the
 * bottom diff must come out the same (overwritten, every element written) and every parameter
 * diff doubled (accumulated). Convolution, Pooling, InnerProduct, ReLU, Sigmoid, TanH, Dropout,
 * Softmax, SoftmaxWithLoss (with labels that take no gradient), Flatten, Split, GELU, LayerNorm,
 * Exp, Log, BNLL, Tile, Reduction, MVN, Silence, Deconvolution, Im2col, SPP, Normalize and
 * Permute, on one 4-D bottom. */
static void test_backward_contract_one_bottom(void **state) {
  (void)state;
  static const struct {
    const char *text;
    int phase, ntop;
    bool labels;
  } cases[] = {
      {"name: 'c' type: 'Convolution' convolution_param { num_output: 4 kernel_size: 3 pad: 1 "
       "stride: 2 group: 2 weight_filler { type: 'gaussian' std: 0.5 } "
       "bias_filler { type: 'gaussian' std: 0.5 } }",
       TRAIN, 1, false},
      {"name: 'p' type: 'Pooling' pooling_param { pool: MAX kernel_size: 2 stride: 3 }", TRAIN, 1,
       false},
      {"name: 'p' type: 'Pooling' pooling_param { pool: AVE kernel_size: 2 stride: 3 }", TRAIN, 1,
       false},
      {"name: 'p' type: 'Pooling' pooling_param { pool: MAX kernel_size: 3 stride: 2 pad: 1 }",
       TRAIN, 1, false},
      {"name: 'ip' type: 'InnerProduct' inner_product_param { num_output: 3 "
       "weight_filler { type: 'xavier' } bias_filler { type: 'gaussian' } }",
       TRAIN, 1, false},
      {"name: 'ip' type: 'InnerProduct' inner_product_param { num_output: 3 transpose: true "
       "weight_filler { type: 'xavier' } bias_filler { type: 'gaussian' } }",
       TRAIN, 1, false},
      {"name: 'r' type: 'ReLU'", TRAIN, 1, false},
      {"name: 'r' type: 'ReLU' relu_param { negative_slope: 0.1 }", TRAIN, 1, false},
      {"name: 's' type: 'Sigmoid'", TRAIN, 1, false},
      {"name: 't' type: 'TanH'", TRAIN, 1, false},
      {"name: 'd' type: 'Dropout'", TRAIN, 1, false},
      {"name: 'd' type: 'Dropout'", TEST, 1, false},
      {"name: 'sm' type: 'Softmax'", TRAIN, 1, false},
      {"name: 'l' type: 'SoftmaxWithLoss' loss_param { ignore_label: 1 }", TRAIN, 1, true},
      {"name: 'l' type: 'SoftmaxWithLoss'", TRAIN, 2, true},
      {"name: 'f' type: 'Flatten'", TRAIN, 1, false},
      {"name: 'sp' type: 'Split'", TRAIN, 3, false},
      {"name: 'g' type: 'GELU'", TRAIN, 1, false},
      {"name: 'g' type: 'GELU' gelu_param { approximate: TANH }", TRAIN, 1, false},
      {"name: 'ln' type: 'LayerNorm' layer_norm_param { weight_filler { type: 'gaussian' } }",
       TRAIN, 1, false},
      {"name: 'ln' type: 'LayerNorm' layer_norm_param { axis: 1 }", TRAIN, 1, false},
      {"name: 'e' type: 'Exp' exp_param { base: 2 scale: 0.5 shift: 1 }", TRAIN, 1, false},
      {"name: 'lg' type: 'Log' log_param { shift: 2 }", TRAIN, 1, false},
      {"name: 'b' type: 'BNLL'", TRAIN, 1, false},
      {"name: 't' type: 'Tile' tile_param { axis: 2 tiles: 3 }", TRAIN, 1, false},
      {"name: 'r' type: 'Reduction' reduction_param { axis: 1 operation: SUMSQ }", TRAIN, 1,
       false},
      {"name: 'm' type: 'MVN'", TRAIN, 1, false},
      {"name: 's' type: 'Silence'", TRAIN, 0, false},
      {"name: 'd' type: 'Deconvolution' convolution_param { num_output: 3 kernel_size: 3 "
       "stride: 2 pad: 1 weight_filler { type: 'gaussian' std: 0.5 } "
       "bias_filler { type: 'gaussian' std: 0.5 } }",
       TRAIN, 1, false},
      {"name: 'd' type: 'Deconvolution' convolution_param { num_output: 4 kernel_size: 2 "
       "group: 2 weight_filler { type: 'gaussian' std: 0.5 } }",
       TRAIN, 1, false},
      {"name: 'i' type: 'Im2col' convolution_param { kernel_size: 2 stride: 2 pad: 1 }", TRAIN, 1,
       false},
      {"name: 'sp' type: 'SPP' spp_param { pyramid_height: 2 }", TRAIN, 1, false},
      {"name: 'sp' type: 'SPP' spp_param { pyramid_height: 2 pool: AVE }", TRAIN, 1, false},
      {"name: 'nz' type: 'Normalize' norm_param { across_spatial: false channel_shared: false "
       "scale_filler { type: 'gaussian' } }",
       TRAIN, 1, false},
      {"name: 'nz' type: 'Normalize' norm_param { scale_filler { type: 'constant' value: 20 } }",
       TRAIN, 1, false},
      {"name: 'pm' type: 'Permute' permute_param { order: 0 order: 2 order: 3 order: 1 }", TRAIN,
       1, false},
  };
  kiln_rng rng;
  kiln_rng_seed(&rng, 22, 1);
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    kiln_blob *x = gc_blob("x", 4, SHAPE(2, 4, 5, 5), -1, 1, &rng);
    kiln_blob *lab = label_blob("label", 3, SHAPE(2, 5, 5), 4, &rng);
    kiln_blob *b[2] = {x, lab};
    built l = build(cases[k].text, cases[k].phase, b, cases[k].labels ? 2 : 1, cases[k].ntop);
    assert_non_null(l.l->ops->backward);
    if (cases[k].labels) l.l->propagate_down[1] = false;
    forward(&l);
    for (int t = 0; t < l.ntop; t++)
      for (int64_t i = 0; i < l.top[t]->count; i++)
        l.top[t]->diff[i] = kiln_rng_uniform(&rng, -1, 1);
    for (int p = 0; p < l.l->nparam; p++) fill(l.l->param[p]->diff, l.l->param[p]->count, 0);
    fill(x->diff, x->count, 123.0f);
    backward(&l);
    float *dx1 = malloc(sizeof(float) * (size_t)x->count);
    float *dp1[KILN_MAX_LAYER_PARAMS];
    assert_non_null(dx1);
    memcpy(dx1, x->diff, sizeof(float) * (size_t)x->count);
    for (int p = 0; p < l.l->nparam; p++) {
      dp1[p] = malloc(sizeof(float) * (size_t)l.l->param[p]->count);
      assert_non_null(dp1[p]);
      for (int64_t i = 0; i < l.l->param[p]->count; i++) dp1[p][i] = 2 * l.l->param[p]->diff[i];
    }
    fill(x->diff, x->count, -77.0f);
    backward(&l);
    char what[600];
    snprintf(what, sizeof what, "%s: bottom diff after a second backward", cases[k].text);
    expect_close(what, x->diff, dx1, x->count, 0);
    snprintf(what, sizeof what, "%s: param diff after a second backward", cases[k].text);
    for (int p = 0; p < l.l->nparam; p++) {
      expect_close(what, l.l->param[p]->diff, dp1[p], l.l->param[p]->count, 1e-6);
      free(dp1[p]);
    }
    free(dx1);
    unbuild(&l);
    kiln_blob_free(lab);
    kiln_blob_free(x);
  }
}

/* The same for BatchNorm, Scale, Bias, Eltwise, Concat, Slice, Reshape and Crop, on a smaller 4-D
 * bottom and, where the layer takes one, a second bottom (of the first's shape, or one value
 * per channel), with garbage in every bottom diff: bottom diffs come out the same (every
 * element overwritten), parameter diffs double (accumulated). */
static void test_backward_contract_second_bottoms(void **state) {
  (void)state;
  static const struct {
    const char *text;
    int nbottom, ntop;
    int naxes2; /* second bottom: 0 = same shape as the first, 1 = (4), -1 = none */
  } cases[] = {
      {"name: 'bn' type: 'BatchNorm'", 1, 1, -1},
      {"name: 'bn' type: 'BatchNorm' batch_norm_param { use_global_stats: true }", 1, 1, -1},
      {"name: 'sc' type: 'Scale' scale_param { bias_term: true filler { type: 'gaussian' } }", 1, 1, -1},
      {"name: 'sc' type: 'Scale' scale_param { bias_term: true }", 2, 1, 1},
      {"name: 'bi' type: 'Bias' bias_param { filler { type: 'gaussian' } }", 1, 1, -1},
      {"name: 'bi' type: 'Bias'", 2, 1, 1},
      {"name: 'el' type: 'Eltwise' eltwise_param { coeff: 2 coeff: -1 }", 2, 1, 0},
      {"name: 'el' type: 'Eltwise' eltwise_param { operation: PROD }", 2, 1, 0},
      {"name: 'el' type: 'Eltwise' eltwise_param { operation: MAX }", 2, 1, 0},
      {"name: 'cat' type: 'Concat'", 2, 1, 0},
      {"name: 'sl' type: 'Slice' slice_param { slice_point: 1 }", 1, 2, -1},
      {"name: 'rs' type: 'Reshape' reshape_param { shape { dim: 0 dim: -1 } }", 1, 1, -1},
      {"name: 'cr' type: 'Crop' crop_param { axis: 1 }", 2, 1, 0},
  };
  kiln_rng rng;
  kiln_rng_seed(&rng, 90, 1);
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    kiln_blob *b[2];
    b[0] = gc_blob("x", 4, SHAPE(2, 4, 3, 3), -1, 1, &rng);
    b[1] = cases[k].naxes2 == 0 ? gc_blob("x2", 4, SHAPE(2, 4, 3, 3), -1, 1, &rng)
                                : gc_blob("x2", 1, SHAPE(4), -1, 1, &rng);
    built l = build(cases[k].text, TRAIN, b, cases[k].nbottom, cases[k].ntop);
    assert_non_null(l.l->ops->backward);
    forward(&l);
    for (int t = 0; t < l.ntop; t++)
      for (int64_t i = 0; i < l.top[t]->count; i++) l.top[t]->diff[i] = kiln_rng_uniform(&rng, -1, 1);
    for (int p = 0; p < l.l->nparam; p++) fill(l.l->param[p]->diff, l.l->param[p]->count, 0);
    float *dx1[2], *dp1[KILN_MAX_LAYER_PARAMS];
    for (int i = 0; i < cases[k].nbottom; i++) fill(b[i]->diff, b[i]->count, 123.0f);
    backward(&l);
    for (int i = 0; i < cases[k].nbottom; i++) {
      dx1[i] = malloc(sizeof(float) * (size_t)b[i]->count);
      assert_non_null(dx1[i]);
      memcpy(dx1[i], b[i]->diff, sizeof(float) * (size_t)b[i]->count);
      fill(b[i]->diff, b[i]->count, -77.0f);
    }
    for (int p = 0; p < l.l->nparam; p++) {
      dp1[p] = malloc(sizeof(float) * (size_t)l.l->param[p]->count);
      assert_non_null(dp1[p]);
      for (int64_t i = 0; i < l.l->param[p]->count; i++) dp1[p][i] = 2 * l.l->param[p]->diff[i];
    }
    backward(&l);
    char what[300];
    for (int i = 0; i < cases[k].nbottom; i++) {
      snprintf(what, sizeof what, "%s: bottom %d diff after a second backward", cases[k].text, i);
      expect_close(what, b[i]->diff, dx1[i], b[i]->count, 0);
      free(dx1[i]);
    }
    for (int p = 0; p < l.l->nparam; p++) {
      snprintf(what, sizeof what, "%s: param %d diff after a second backward", cases[k].text, p);
      expect_close(what, l.l->param[p]->diff, dp1[p], l.l->param[p]->count, 1e-6);
      free(dp1[p]);
    }
    unbuild(&l);
    kiln_blob_free(b[0]);
    kiln_blob_free(b[1]);
  }
}

/* The same for losses whose bottoms are not alike: MultinomialLogisticLoss, InfogainLoss (H as a
 * third bottom), HingeLoss and ContrastiveLoss (a pair of features and a similarity), on
 * predictions x (4, 5) (probabilities in (0.2, 1) for the multinomial loss) with labels in
 * [0, 5); no gradient goes to labels, H or the similarity. */
static void test_backward_contract_losses(void **state) {
  (void)state;
  static const struct {
    const char *text;
    int nbottom;
    bool pair; /* ContrastiveLoss: x, a second feature blob, a similarity */
  } cases[] = {
      {"name: 'm' type: 'MultinomialLogisticLoss'", 2, false},
      {"name: 'ig' type: 'InfogainLoss'", 3, false},
      {"name: 'h' type: 'HingeLoss' hinge_loss_param { norm: L2 }", 2, false},
      {"name: 'h' type: 'HingeLoss'", 2, false},
      {"name: 'c' type: 'ContrastiveLoss' contrastive_loss_param { margin: 2 }", 3, true},
  };
  kiln_rng rng;
  kiln_rng_seed(&rng, 91, 1);
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    kiln_blob *b[3];
    b[0] = gc_blob("x", 2, SHAPE(4, 5), 0.2f, 1, &rng);
    b[1] = cases[k].pair ? gc_blob("x2", 2, SHAPE(4, 5), -1, 1, &rng)
                         : label_blob("label", 1, SHAPE(4), 5, &rng);
    b[2] = cases[k].pair ? blob_of("y", 1, SHAPE(4), (const float[]){1, 0, 0, 1})
                         : gc_blob("H", 2, SHAPE(5, 5), 0, 1, &rng);
    const int ngrad = cases[k].pair ? 2 : 1;
    built l = build(cases[k].text, TRAIN, b, cases[k].nbottom, 1);
    for (int i = ngrad; i < cases[k].nbottom; i++) l.l->propagate_down[i] = false;
    forward(&l);
    l.top[0]->diff[0] = kiln_rng_uniform(&rng, 0.5f, 2);
    float *dx1[2];
    for (int i = 0; i < ngrad; i++) fill(b[i]->diff, b[i]->count, 123.0f);
    backward(&l);
    for (int i = 0; i < ngrad; i++) {
      dx1[i] = malloc(sizeof(float) * (size_t)b[i]->count);
      assert_non_null(dx1[i]);
      memcpy(dx1[i], b[i]->diff, sizeof(float) * (size_t)b[i]->count);
      fill(b[i]->diff, b[i]->count, -77.0f);
    }
    backward(&l);
    char what[300];
    for (int i = 0; i < ngrad; i++) {
      snprintf(what, sizeof what, "%s: bottom %d diff after a second backward", cases[k].text, i);
      expect_close(what, b[i]->diff, dx1[i], b[i]->count, 0);
      free(dx1[i]);
    }
    unbuild(&l);
    for (int i = 0; i < 3; i++) kiln_blob_free(b[i]);
  }
}

/* The same for the SSD fork's MultiBoxLoss, whose bottoms are predictions (loc, conf) and
 * neither priors nor ground truth take a gradient: 2 images of 4 priors (the quarters of the
 * image), 3 classes, two boxes, random predictions; each mining type and both losses. */
static void test_backward_contract_multibox(void **state) {
  (void)state;
  static const char *const cases[] = {
      "multibox_loss_param { num_classes: 3 code_type: CENTER_SIZE neg_pos_ratio: 1 }",
      "multibox_loss_param { num_classes: 3 mining_type: NONE loc_loss_type: L2 "
      "conf_loss_type: LOGISTIC } loss_param { normalization: FULL }",
      "multibox_loss_param { num_classes: 3 mining_type: NONE share_location: false }",
      "multibox_loss_param { num_classes: 3 mining_type: HARD_EXAMPLE sample_size: 3 "
      "nms_param { nms_threshold: 0.5 } }",
  };
  static const float quarters[16] = {0, 0, .5f, .5f, .5f, 0, 1, .5f, 0, .5f, .5f, 1, .5f, .5f, 1, 1};
  static const float gt[16] = {0, 1, 0, .1f, .1f, .5f, .45f, 0, 1, 2, 0, .5f, .4f, .95f, 1, 0};
  kiln_rng rng;
  kiln_rng_seed(&rng, 92, 1);
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    const int L = strstr(cases[k], "share_location: false") ? 3 : 1;
    kiln_blob *b[4];
    b[0] = gc_blob("loc", 2, SHAPE(2, 16 * L), -1, 1, &rng);
    b[1] = gc_blob("conf", 2, SHAPE(2, 12), -1, 1, &rng);
    b[2] = blob_of("priors", 3, SHAPE(1, 2, 16), NULL);
    memcpy(b[2]->data, quarters, sizeof quarters);
    fill(b[2]->data + 16, 16, 0.1f);
    b[3] = blob_of("label", 4, SHAPE(1, 1, 2, 8), gt);
    char text[400];
    snprintf(text, sizeof text, "name: 'mb' type: 'MultiBoxLoss' %s", cases[k]);
    built l = build(text, TRAIN, b, 4, 1);
    l.l->propagate_down[2] = l.l->propagate_down[3] = false;
    forward(&l);
    l.top[0]->diff[0] = kiln_rng_uniform(&rng, 0.5f, 2);
    float *dx1[2];
    for (int i = 0; i < 2; i++) fill(b[i]->diff, b[i]->count, 123.0f);
    backward(&l);
    for (int i = 0; i < 2; i++) {
      dx1[i] = malloc(sizeof(float) * (size_t)b[i]->count);
      assert_non_null(dx1[i]);
      memcpy(dx1[i], b[i]->diff, sizeof(float) * (size_t)b[i]->count);
      fill(b[i]->diff, b[i]->count, -77.0f);
    }
    backward(&l);
    char what[500];
    for (int i = 0; i < 2; i++) {
      snprintf(what, sizeof what, "%s: bottom %d diff after a second backward", text, i);
      expect_close(what, b[i]->diff, dx1[i], b[i]->count, 0);
      free(dx1[i]);
    }
    unbuild(&l);
    for (int i = 0; i < 4; i++) kiln_blob_free(b[i]);
  }
}

/* ---- Caffe's layer types kiln lacks ------------------------------------------------------- */

/* The list of missing types stays true: none is registered, no parameter block of theirs is in
 * kiln's schema (a block that is gets parsed instead of named), and each is refused by type. */
static void test_caffe_missing_layers(void **state) {
  (void)state;
  int n = 0;
  for (const kiln_caffe_missing_layer *m = kiln_caffe_missing_layers(); m->type; m++, n++) {
    if (kiln_layer_find(m->type)) fail_msg("'%s' is registered but listed as missing", m->type);
    if (m->param_field &&
        protobuf_c_message_descriptor_get_field_by_name(&caffe__layer_parameter__descriptor,
                                                        m->param_field))
      fail_msg("'%s' is in kiln's LayerParameter but listed as missing", m->param_field);
  }
  assert_true(n > 0);
  /* a parameter block of a missing type: named by type, file and line */
  ProtobufCMessage *msg = NULL;
  const char *text = "name: 'n'\nlayer { name: 'w' type: 'WindowData' top: 'd'\n"
                     "  window_data_param { source: 'w.txt' } }\n";
  assert_int_equal(kiln_text_parse(text, strlen(text), "w.prototxt",
                                   &caffe__net_parameter__descriptor, &msg),
                   KILN_ERR_PARSE);
  expect_message("w.prototxt:3:3: 'window_data_param' is the parameter block of Caffe's "
                 "WindowData layer, which kiln does not have", NULL, NULL);
  /* the type itself, in a net: refused by type; Python says why */
  text = "name: 'n'\nlayer { name: 'p' type: 'Python' top: 'x' }\n";
  assert_int_equal(kiln_text_parse(text, strlen(text), "p.prototxt",
                                   &caffe__net_parameter__descriptor, &msg),
                   KILN_OK);
  kiln_net *net = NULL;
  kiln_net_options o = {.phase = CAFFE__PHASE__TRAIN, .config = kiln_test_net_config()};
  assert_int_equal(kiln_net_create((Caffe__NetParameter *)msg, &o, &net), KILN_ERR_UNSUPPORTED);
  expect_message("layer 'p': Caffe's layer type 'Python' is not in kiln", "where kiln has Python", NULL);
  assert_null(net);
  protobuf_c_message_free_unpacked(msg, NULL);
}

/* docs/caffe-layers.md is the one list of Caffe's layer types and their state in kiln, and it
 * stays true: in its first table, a row marked yes is a registered type (so the test above finds a test that builds
 * it), a row marked no, never or python (registered only where a Python runtime is: not in this
 * test) is one the list of missing types refuses by name, every missing
 * type has its row, and every registered type is named in the file (in a row, or among kiln's
 * own types below the table). */
static void test_docs_list_matches(void **state) {
  (void)state;
  const char *root = getenv("KILN_SOURCE_DIR");
  assert_non_null(root);
  char path[4096], *text = NULL;
  size_t size;
  snprintf(path, sizeof path, "%s/docs/caffe-layers.md", root);
  if (kiln_read_file(path, &text, &size)) fail_msg("%s", kiln_last_error());
  int rows = 0, bad = 0;
  for (char *line = text; line && *line;) {
    char *nl = strchr(line, '\n');
    if (nl) *nl = '\0';
    char type[64], state[16];
    if (rows > 0 && line[0] != '|') { /* the end of the table (the file's first) */
      if (nl) *nl = '\n';
      break;
    }
    if (sscanf(line, "| %63[A-Za-z0-9] | %15[a-z] |", type, state) == 2 && strcmp(type, "Caffe")) {
      rows++;
      const bool yes = !strcmp(state, "yes"), missing = kiln_caffe_missing_by_type(type) != NULL;
      if (yes != (kiln_layer_find(type) != NULL) || yes == missing ||
          (!yes && strcmp(state, "no") && strcmp(state, "never") && strcmp(state, "python"))) {
        print_error("docs/caffe-layers.md: '%s' is marked '%s', but kiln %s it%s\n", type, state,
                    kiln_layer_find(type) ? "registers" : "does not register",
                    missing ? " and lists it as missing" : "");
        bad++;
      }
    }
    line = nl ? nl + 1 : NULL;
    if (nl) *nl = '\n';
  }
  for (const kiln_caffe_missing_layer *m = kiln_caffe_missing_layers(); m->type; m++) {
    char row[128];
    snprintf(row, sizeof row, "\n| %s | ", m->type);
    if (!strstr(text, row)) {
      print_error("docs/caffe-layers.md has no row for the missing type '%s'\n", m->type);
      bad++;
    }
  }
  for (int i = 0; i < NLISTED; i++) {
    char row[128], named[128];
    snprintf(row, sizeof row, "\n| %s | ", listed[i]);
    snprintf(named, sizeof named, "`%s`", listed[i]);
    if (!strstr(text, row) && !strstr(text, named)) {
      print_error("docs/caffe-layers.md does not name the registered type '%s'\n", listed[i]);
      bad++;
    }
  }
  free(text);
  assert_true(rows >= 60);
  assert_int_equal(bad, 0);
}

/* The same for the sequence layers on time-major T x N x D bottoms: PositionalEncoding, and
 * MultiHeadAttention with its key/value input and padding mask (whose diff, asked for, comes out
 * 0 every time). */
static void test_backward_contract_sequences(void **state) {
  (void)state;
  static const struct {
    const char *text;
    int nbottom;
    bool kv; /* bottom 1 is the key/value input (else the mask) */
  } cases[] = {
      {"name: 'pe' type: 'PositionalEncoding' positional_encoding_param { mode: LEARNED "
       "max_len: 4 }",
       1, false},
      {"name: 'pe' type: 'PositionalEncoding'", 1, false},
      {"name: 'att' type: 'MultiHeadAttention' multihead_attention_param { num_heads: 2 "
       "bias_filler { type: 'gaussian' } }",
       1, false},
      {"name: 'att' type: 'MultiHeadAttention' multihead_attention_param { num_heads: 2 "
       "causal: true bias_filler { type: 'gaussian' } }",
       2, false},
      {"name: 'att' type: 'MultiHeadAttention' multihead_attention_param { num_heads: 4 "
       "bias_filler { type: 'gaussian' } }",
       3, true},
  };
  kiln_rng rng;
  kiln_rng_seed(&rng, 91, 1);
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    kiln_blob *b[3];
    b[0] = gc_blob("x", 3, SHAPE(3, 2, 4), -1, 1, &rng);
    b[1] = cases[k].kv ? gc_blob("kv", 3, SHAPE(4, 2, 4), -1, 1, &rng)
                       : blob_of("mask", 2, SHAPE(3, 2), (const float[]){1, 1, 1, 1, 0, 1});
    b[2] = blob_of("mask", 2, SHAPE(4, 2), (const float[]){1, 1, 1, 0, 1, 0, 0, 0});
    const int nb = cases[k].nbottom;
    built l = build(cases[k].text, TRAIN, b, nb, 1);
    assert_non_null(l.l->ops->backward);
    forward(&l);
    for (int64_t i = 0; i < l.top[0]->count; i++) l.top[0]->diff[i] = kiln_rng_uniform(&rng, -1, 1);
    for (int p = 0; p < l.l->nparam; p++) fill(l.l->param[p]->diff, l.l->param[p]->count, 0);
    float *dx1[3], *dp1[KILN_MAX_LAYER_PARAMS];
    for (int i = 0; i < nb; i++) fill(b[i]->diff, b[i]->count, 123.0f);
    backward(&l);
    for (int i = 0; i < nb; i++) {
      dx1[i] = malloc(sizeof(float) * (size_t)b[i]->count);
      assert_non_null(dx1[i]);
      memcpy(dx1[i], b[i]->diff, sizeof(float) * (size_t)b[i]->count);
      fill(b[i]->diff, b[i]->count, -77.0f);
    }
    for (int p = 0; p < l.l->nparam; p++) {
      dp1[p] = malloc(sizeof(float) * (size_t)l.l->param[p]->count);
      assert_non_null(dp1[p]);
      for (int64_t i = 0; i < l.l->param[p]->count; i++) dp1[p][i] = 2 * l.l->param[p]->diff[i];
    }
    backward(&l);
    char what[300];
    for (int i = 0; i < nb; i++) {
      snprintf(what, sizeof what, "%s: bottom %d diff after a second backward", cases[k].text, i);
      expect_close(what, b[i]->diff, dx1[i], b[i]->count, 0);
      free(dx1[i]);
    }
    for (int p = 0; p < l.l->nparam; p++) {
      snprintf(what, sizeof what, "%s: param %d diff after a second backward", cases[k].text, p);
      expect_close(what, l.l->param[p]->diff, dp1[p], l.l->param[p]->count, 1e-6);
      free(dp1[p]);
    }
    if (nb > 1 && !cases[k].kv)
      for (int64_t i = 0; i < b[1]->count; i++) assert_true(b[1]->diff[i] == 0);
    if (nb > 2)
      for (int64_t i = 0; i < b[2]->count; i++) assert_true(b[2]->diff[i] == 0);
    unbuild(&l);
    for (int i = 0; i < 3; i++) kiln_blob_free(b[i]);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_every_listed_layer_registered_and_tested),
      cmocka_unit_test(test_caffe_missing_layers),
      cmocka_unit_test(test_docs_list_matches),
      cmocka_unit_test(test_backward_contract_one_bottom),
      cmocka_unit_test(test_backward_contract_second_bottoms),
      cmocka_unit_test(test_backward_contract_sequences),
      cmocka_unit_test(test_backward_contract_losses),
      cmocka_unit_test(test_backward_contract_multibox),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
