/* What the data layers share (layer_util.h): the order of the records in the stream, and data
 * set paths in the cache. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/data.h"
#include "layer_util.h"

int kiln_record_order_index(kiln_record_order *o, uint64_t q, uint64_t *index) {
  uint64_t e = q / o->size, i = q % o->size;
  if (!o->shuffle) {
    *index = i;
    return KILN_OK;
  }
  if (o->size > UINT32_MAX) return kiln_errorf(KILN_ERR_UNSUPPORTED, "shuffle of more than 2^32 records");
  int k = -1;
  for (int j = 0; j < 2; j++)
    if (o->epoch[j].perm && o->epoch[j].epoch == e) k = j;
  if (k < 0) {
    /* Replace the older of the two. */
    k = !o->epoch[0].perm ? 0 : !o->epoch[1].perm ? 1 : o->epoch[0].epoch < o->epoch[1].epoch ? 0 : 1;
    uint32_t *perm = o->epoch[k].perm;
    if (!perm && !(perm = o->epoch[k].perm = malloc(sizeof(uint32_t) * (size_t)o->size)))
      return kiln_errorf(KILN_ERR_NOMEM, "out of memory for the shuffled order");
    o->epoch[k].epoch = e;
    kiln_rng r;
    kiln_rng_seed(&r, o->seed, 0x5348554646ULL + e); /* a stream per epoch */
    for (uint64_t j = 0; j < o->size; j++) perm[j] = (uint32_t)j;
    for (uint64_t j = o->size - 1; j > 0; j--) { /* Fisher-Yates */
      uint32_t x = kiln_rng_below(&r, (uint32_t)(j + 1)), t = perm[j];
      perm[j] = perm[x];
      perm[x] = t;
    }
  }
  *index = o->epoch[k].perm[i];
  return KILN_OK;
}

void kiln_record_order_free(kiln_record_order *o) {
  free(o->epoch[0].perm);
  free(o->epoch[1].perm);
  o->epoch[0].perm = o->epoch[1].perm = NULL;
}
