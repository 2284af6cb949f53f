/* The net builder: a net's text parsed and built (phase rules, wiring, Splits, shapes, the memory
 * plan) under a small memory limit, then one forward pass when it builds and is small enough to
 * run in a moment. One thread: the point is the builder, not the kernels' threading. Inputs come
 * from Input layers; data sources name nothing that exists. */
#include <protobuf-c/protobuf-c.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "kiln/net.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  Caffe__NetParameter *np = NULL;
  char *text = malloc(size + 1);
  if (!text) return 0;
  memcpy(text, data, size);
  text[size] = '\0';
  if (kiln_net_param_from_text(text, "fuzz", &np) == KILN_OK) {
    kiln_log_set_level(KILN_LOG_ERROR);
    kiln_set_num_threads(1);
    kiln_net_options o = {.phase = size % 2, .seed = 1, .nthreads = 1, .max_memory = 64 << 20};
    kiln_net *net = NULL;
    if (kiln_net_create(np, &o, &net) == KILN_OK) {
      float loss;
      if (kiln_net_forward_flops(net) < 5e7) (void)kiln_net_forward(net, &loss);
      kiln_net_free(net);
    }
    protobuf_c_message_free_unpacked(&np->base, NULL);
  }
  free(text);
  return 0;
}
