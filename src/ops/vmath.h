/* Vectorizable float math for kernels (src/ops) and the layers that still hold loops
 * (src/layers/layer_util.h includes it): exp, the logistic function, erfc and tanh written
 * without libm calls or branches, so that a loop of them vectorizes. */
#ifndef KILN_OPS_VMATH_H
#define KILN_OPS_VMATH_H

#include <stdint.h>

/* exp, the logistic function and tanh in float, written so that a loop of them vectorizes (no
 * calls into libm, no branches): the recurrent layers evaluate several per state element and
 * step, and libm's scalar expf and tanhf took most of an LSTM's element-wise time. exp splits
 * x into n ln 2 + r with |r| <= ln 2 / 2 (ln 2 in two parts, so r is exact), takes e^r from its
 * Taylor series to r^6 (the next term is below 2^-24 relative) and builds 2^n in the exponent
 * bits; x is held to [-87, 88], where e^x is a normal float. The others follow from it, to
 * within a few units of 2^-24 absolute; near 0, tanh's relative error is larger than libm's. */
static inline float kiln_vexpf(float x) {
  x = x < -87.0f ? -87.0f : x > 88.0f ? 88.0f : x;
  /* round to nearest: adding 1.5 * 2^23 pushes the fraction out of the mantissa */
  const float n = (x * 1.44269504f + 12582912.0f) - 12582912.0f;
  const float r = (x - n * 0.693145752f) - n * 1.42860677e-06f;
  float p = 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  union {
    int32_t i;
    float f;
  } two_n = {.i = ((int32_t)n + 127) << 23};
  return p * two_n.f;
}
static inline float kiln_vsigmoidf(float x) { return 1.0f / (1.0f + kiln_vexpf(-x)); }
/* erfc, vectorizable, for GELU's Phi: erfc(|z|) = t exp(-z^2 + P(t)) with t = 1 / (1 + |z| / 2)
 * and P a degree-9 polynomial (the Chebyshev fit published in Numerical Recipes, fractional
 * error under 1.2e-7 in exact arithmetic), and erfc(-z) = 2 - erfc(z). In float, z^2 costs
 * some digits for large z: within 4e-6 relative up to z = 9 (erfc 4e-37), 3.1e-7 absolute
 * everywhere; beyond 9.3 the exp floor makes it about 1e-38 rather than smaller. */
static inline float kiln_verfcf(float z) {
  const float a = z < 0 ? -z : z;
  const float t = 1.0f / (1.0f + 0.5f * a);
  float p = 0.17087277f;
  p = p * t - 0.82215223f;
  p = p * t + 1.48851587f;
  p = p * t - 1.13520398f;
  p = p * t + 0.27886807f;
  p = p * t - 0.18628806f;
  p = p * t + 0.09678418f;
  p = p * t + 0.37409196f;
  p = p * t + 1.00002368f;
  p = p * t - 1.26551223f;
  const float r = t * kiln_vexpf(p - a * a);
  return z < 0 ? 2.0f - r : r;
}
static inline float kiln_vtanhf(float x) { return 1.0f - 2.0f / (kiln_vexpf(2.0f * x) + 1.0f); }

#endif
