/* PCG32 (O'Neill's permuted congruential generator): reproducible streams with a two-word state
 * that snapshots store. Gaussians by Box-Muller without a cached spare, so the state alone
 * determines every later draw. */
#include <math.h>

#include "kiln/core.h"

void kiln_rng_seed(kiln_rng *r, uint64_t seed, uint64_t stream) {
  r->state = 0;
  r->inc = (stream << 1u) | 1u;
  kiln_rng_u32(r);
  r->state += seed;
  kiln_rng_u32(r);
}

uint32_t kiln_rng_u32(kiln_rng *r) {
  uint64_t old = r->state;
  r->state = old * 6364136223846793005ULL + r->inc;
  uint32_t xorshifted = (uint32_t)(((old >> 18u) ^ old) >> 27u);
  uint32_t rot = (uint32_t)(old >> 59u);
  return (xorshifted >> rot) | (xorshifted << ((-rot) & 31));
}

uint32_t kiln_rng_below(kiln_rng *r, uint32_t n) {
  if (n == 0) return 0;
  uint32_t threshold = -n % n;
  for (;;) {
    uint32_t x = kiln_rng_u32(r);
    if (x >= threshold) return x % n;
  }
}

float kiln_rng_uniform(kiln_rng *r, float lo, float hi) {
  /* 24 random bits give every float in [0,1) spaced 2^-24 apart. */
  float u = (kiln_rng_u32(r) >> 8) * (1.0f / 16777216.0f);
  return lo + (hi - lo) * u;
}

float kiln_rng_gaussian(kiln_rng *r, float mean, float std) {
  double u1 = ((kiln_rng_u32(r) >> 8) + 1.0) / 16777217.0; /* (0, 1] so log is finite */
  double u2 = (kiln_rng_u32(r) >> 8) / 16777216.0;
  double z = sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
  return (float)(mean + std * z);
}
