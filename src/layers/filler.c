/* Caffe's weight fillers: constant, uniform, gaussian (optionally sparse), xavier, msra,
 * positive_unitball. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/layers.h"

static float fan_n(const kiln_blob *b, const Caffe__FillerParameter *f) {
  int64_t count = b->count;
  float fan_in = b->naxes > 0 && b->shape[0] ? (float)count / b->shape[0] : 1.0f;
  float fan_out = b->naxes > 1 && b->shape[1] ? (float)count / b->shape[1] : 1.0f;
  switch (f->variance_norm) {
    case CAFFE__FILLER_PARAMETER__VARIANCE_NORM__FAN_OUT: return fan_out;
    case CAFFE__FILLER_PARAMETER__VARIANCE_NORM__AVERAGE: return (fan_in + fan_out) / 2;
    default: return fan_in;
  }
}

static int fill_host(kiln_blob *b, const Caffe__FillerParameter *f, float default_value,
                     kiln_rng *rng);

/* The values are drawn on the host, from the net's generator; a blob on a device gets them
 * through the device table. */
int kiln_fill(kiln_blob *b, const Caffe__FillerParameter *f, float default_value, kiln_rng *rng) {
  if (kiln_device_is_host(b->device)) return fill_host(b, f, default_value, rng);
  kiln_blob staged = *b;
  staged.device = NULL;
  staged.data = malloc(sizeof(float) * (size_t)(b->count > 0 ? b->count : 1));
  if (!staged.data) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  int rc = fill_host(&staged, f, default_value, rng);
  if (!rc) rc = kiln_device_to_device(b->device, b->data, staged.data, sizeof(float) * (size_t)b->count);
  free(staged.data);
  return rc;
}

static int fill_host(kiln_blob *b, const Caffe__FillerParameter *f, float default_value,
                     kiln_rng *rng) {
  float *x = b->data;
  int64_t n = b->count;
  if (!f) {
    for (int64_t i = 0; i < n; i++) x[i] = default_value;
    return KILN_OK;
  }
  const char *type = f->type ? f->type : "constant";
  if (strcmp(type, "constant") == 0) {
    for (int64_t i = 0; i < n; i++) x[i] = f->value;
  } else if (strcmp(type, "uniform") == 0) {
    if (f->max < f->min)
      return kiln_errorf(KILN_ERR_INVALID, "uniform filler: max %g < min %g", f->max, f->min);
    for (int64_t i = 0; i < n; i++) x[i] = kiln_rng_uniform(rng, f->min, f->max);
  } else if (strcmp(type, "gaussian") == 0) {
    if (!(f->std >= 0)) /* Caffe checks sigma > 0; a std of 0 stays a constant fill */
      return kiln_errorf(KILN_ERR_INVALID, "gaussian filler: std %g must be >= 0", f->std);
    for (int64_t i = 0; i < n; i++) x[i] = kiln_rng_gaussian(rng, f->mean, f->std);
    if (f->sparse >= 0) {
      /* Each output keeps about `sparse` non-zero inputs: zero with probability 1 - sparse/fan. */
      if (b->naxes < 1 || b->shape[0] == 0)
        return kiln_errorf(KILN_ERR_INVALID, "sparse gaussian filler needs a 2-d blob");
      float fan = (float)b->count / b->shape[0];
      float keep = fan > 0 ? f->sparse / fan : 0;
      for (int64_t i = 0; i < n; i++)
        if (kiln_rng_uniform(rng, 0, 1) >= keep) x[i] = 0;
    }
  } else if (strcmp(type, "xavier") == 0) {
    float scale = sqrtf(3.0f / fan_n(b, f));
    for (int64_t i = 0; i < n; i++) x[i] = kiln_rng_uniform(rng, -scale, scale);
  } else if (strcmp(type, "msra") == 0) {
    float std = sqrtf(2.0f / fan_n(b, f));
    for (int64_t i = 0; i < n; i++) x[i] = kiln_rng_gaussian(rng, 0, std);
  } else if (strcmp(type, "positive_unitball") == 0) {
    int64_t rows = b->naxes > 0 ? b->shape[0] : 1, dim = rows ? n / rows : 0;
    for (int64_t r = 0; r < rows; r++) {
      double sum = 0;
      for (int64_t i = 0; i < dim; i++) sum += x[r * dim + i] = kiln_rng_uniform(rng, 0, 1);
      for (int64_t i = 0; i < dim; i++) x[r * dim + i] /= (float)sum;
    }
  } else {
    return kiln_errorf(KILN_ERR_INVALID,
                       "unknown filler type '%s' (known: constant, uniform, gaussian, xavier, "
                       "msra, positive_unitball)",
                       type);
  }
  return KILN_OK;
}
