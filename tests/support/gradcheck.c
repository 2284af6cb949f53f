/* Finite-difference gradient checker for layers (see gradcheck.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device_mirror.h"
#include "kiln/backend.h"
#include "gradcheck.h"

const kiln_config *kiln_test_config(void) {
  static kiln_config cfg;
  static bool read;
  if (!read) {
    if (kiln_config_from_env(&cfg)) {
      fprintf(stderr, "test configuration: %s\n", kiln_last_error());
      abort();
    }
    /* KILN_DEVICE=cuda:N on a machine without that GPU: the whole binary skips (CTest's
     * SKIP_RETURN_CODE), saying why */
    if (cfg.device == KILN_DEVICE_CUDA && !kiln_config_device(&cfg)) {
      printf("skipped: no CUDA device (%s)\n", kiln_cuda_unavailable());
      fflush(stdout);
      exit(77);
    }
    read = true;
  }
  return &cfg;
}

const kiln_config *kiln_test_net_config(void) {
  static kiln_config cfg;
  static bool read;
  if (!read) {
    cfg = *kiln_test_config();
    cfg.device = KILN_DEVICE_HOST;
    read = true;
  }
  return &cfg;
}

bool kiln_test_data_shared(const kiln_blob *b) {
  while (b->data_of) b = b->data_of;
  return !strcmp(b->name, KILN_NET_SHARED_DATA);
}

int kiln_test_spoil_shared_data(kiln_net *net) {
  int n = 0;
  for (int i = 0; i < net->nblobs; i++) {
    kiln_blob *b = net->blobs[i];
    if (!kiln_test_data_shared(b)) continue;
    for (int64_t k = 0; k < b->count; k++) b->data[k] = NAN;
    n++;
  }
  return n;
}

Caffe__LayerParameter *gc_layer_param(const char *text) {
  ProtobufCMessage *m = NULL;
  if (kiln_text_parse(text, strlen(text), "<test>", &caffe__layer_parameter__descriptor, &m)) {
    fprintf(stderr, "gc_layer_param: %s\n", kiln_last_error());
    abort();
  }
  return (Caffe__LayerParameter *)m;
}

kiln_blob *gc_blob(const char *name, int naxes, const int64_t *shape, float lo, float hi,
                   kiln_rng *rng) {
  kiln_blob *b = kiln_blob_new(name);
  if (!b || kiln_blob_reshape(b, naxes, shape)) abort();
  for (int64_t i = 0; i < b->count; i++) b->data[i] = kiln_rng_uniform(rng, lo, hi);
  return b;
}

typedef struct {
  kiln_layer *l;
  float **R;
  kiln_rng rng_state; /* the layer's generator before each forward: dropout masks repeat */
} gc_ctx;

static double objective(gc_ctx *c) {
  *c->l->rng = c->rng_state;
  if (layer_forward(c->l)) {
    fprintf(stderr, "gradcheck: forward failed: %s\n", kiln_last_error());
    abort();
  }
  double L = 0;
  for (int t = 0; t < c->l->ntop; t++)
    for (int64_t i = 0; i < c->l->top[t]->count; i++)
      L += (double)c->l->top[t]->data[i] * c->R[t][i];
  return L;
}

static int compare(const char *what, int index, int64_t i, double analytic, double numeric,
                   const gradcheck_opts *o, int *shown) {
  double scale = fmax(fmax(fabs(analytic), fabs(numeric)), 1.0);
  if (fabs(analytic - numeric) <= o->threshold * scale) return 0;
  if ((*shown)++ < o->max_failures_shown)
    fprintf(stderr, "gradcheck: %s %d element %lld: analytic %.6g numeric %.6g\n", what, index,
            (long long)i, analytic, numeric);
  return 1;
}

int gradcheck_layer(const char *layer_text, kiln_blob **bottoms, int nbottom, int ntop,
                    const gradcheck_opts *opts) {
  gradcheck_opts o = {.step = 1e-2, .threshold = 1e-3, .kink_range = -1, .max_failures_shown = 10};
  if (opts) {
    o = *opts;
    if (o.step == 0) o.step = 1e-2;
    if (o.threshold == 0) o.threshold = 1e-3;
    if (o.max_failures_shown == 0) o.max_failures_shown = 10;
  }
  Caffe__LayerParameter *lp = gc_layer_param(layer_text);
  kiln_blob *tops[16];
  for (int t = 0; t < ntop; t++) tops[t] = kiln_blob_new("top");
  kiln_layer *l;
  if (kiln_layer_create(lp, o.phase, bottoms, nbottom, tops, ntop, o.seed ? o.seed : 1,
                        kiln_test_config(), &l)) {
    fprintf(stderr, "gradcheck: cannot create layer: %s\n", kiln_last_error());
    abort();
  }
  kiln_rng rng;
  kiln_rng_seed(&rng, 99, 3);
  gc_ctx c = {.l = l, .rng_state = *l->rng};
  float *R[16];
  for (int t = 0; t < ntop; t++) {
    R[t] = malloc(sizeof(float) * (size_t)(tops[t]->count + 1));
    for (int64_t i = 0; i < tops[t]->count; i++) R[t][i] = kiln_rng_uniform(&rng, -1, 1);
  }
  c.R = R;
  /* analytic */
  objective(&c);
  for (int t = 0; t < ntop; t++) memcpy(tops[t]->diff, R[t], sizeof(float) * (size_t)tops[t]->count);
  for (int p = 0; p < l->nparam; p++) memset(l->param[p]->diff, 0, sizeof(float) * (size_t)l->param[p]->count);
  for (int b = 0; b < nbottom; b++)
    l->propagate_down[b] = !bottoms[b]->csr && (!o.bottom_mask || (o.bottom_mask >> b & 1));
  if (l->ops->backward && layer_backward(l)) {
    fprintf(stderr, "gradcheck: backward failed: %s\n", kiln_last_error());
    abort();
  }
  float *bgrad[16], *pgrad[KILN_MAX_LAYER_PARAMS];
  for (int b = 0; b < nbottom; b++) {
    bgrad[b] = NULL;
    if (bottoms[b]->csr) continue; /* sparse: no dense values, no gradient, never checked */
    bgrad[b] = malloc(sizeof(float) * (size_t)(bottoms[b]->count + 1));
    memcpy(bgrad[b], bottoms[b]->diff, sizeof(float) * (size_t)bottoms[b]->count);
  }
  for (int p = 0; p < l->nparam; p++) {
    pgrad[p] = malloc(sizeof(float) * (size_t)(l->param[p]->count + 1));
    memcpy(pgrad[p], l->param[p]->diff, sizeof(float) * (size_t)l->param[p]->count);
  }
  int failures = 0, shown = 0;
  for (int b = 0; b < nbottom; b++) {
    if ((o.bottom_mask && !(o.bottom_mask >> b & 1)) || bottoms[b]->csr) continue;
    float *x = bottoms[b]->data;
    for (int64_t i = 0; i < bottoms[b]->count; i++) {
      float keep = x[i];
      if (o.kink_range >= 0 && fabsf(keep - o.kink) < o.kink_range) continue;
      x[i] = keep + (float)o.step;
      double up = objective(&c);
      x[i] = keep - (float)o.step;
      double down = objective(&c);
      x[i] = keep;
      failures += compare("bottom", b, i, bgrad[b][i], (up - down) / (2 * o.step), &o, &shown);
    }
  }
  for (int p = 0; p < l->nparam; p++) {
    float *w = l->param[p]->data;
    for (int64_t i = 0; i < l->param[p]->count; i++) {
      float keep = w[i];
      w[i] = keep + (float)o.step;
      double up = objective(&c);
      w[i] = keep - (float)o.step;
      double down = objective(&c);
      w[i] = keep;
      failures += compare("param", p, i, pgrad[p][i], (up - down) / (2 * o.step), &o, &shown);
    }
  }
  for (int b = 0; b < nbottom; b++) free(bgrad[b]);
  for (int p = 0; p < l->nparam; p++) free(pgrad[p]);
  for (int t = 0; t < ntop; t++) free(R[t]);
  kiln_layer_free(l);
  for (int t = 0; t < ntop; t++) kiln_blob_free(tops[t]);
  protobuf_c_message_free_unpacked(&lp->base, NULL);
  return failures;
}
