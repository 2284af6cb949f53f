/* The seeded random generator. */
#ifndef KILN_RNG_H
#define KILN_RNG_H

#include <stdint.h>

/* PCG32: small state that snapshots can store, so a resumed run draws the same numbers. */
typedef struct kiln_rng {
  uint64_t state;
  uint64_t inc;
} kiln_rng;

void kiln_rng_seed(kiln_rng *r, uint64_t seed, uint64_t stream);
uint32_t kiln_rng_u32(kiln_rng *r);
uint32_t kiln_rng_below(kiln_rng *r, uint32_t n); /* uniform in [0, n) without bias */
float kiln_rng_uniform(kiln_rng *r, float lo, float hi); /* [lo, hi) */
float kiln_rng_gaussian(kiln_rng *r, float mean, float std);

#endif
