/* Test support: finite-difference gradient checks of layers (Caffe's method: central
 * differences, step ~1e-2, relative threshold ~1e-3 scaled by max(|analytic|, |numeric|, 1),
 * elements near a kink skipped) and small helpers for building layers from prototxt text. */
#ifndef KILN_TEST_GRADCHECK_H
#define KILN_TEST_GRADCHECK_H

#include "kiln/net.h"

/* The configuration tests build layers and nets under: the environment's, read once, so that
 * CTest's reruns with KILN_ENGINE=ref run the reference kernels. A malformed value aborts. */
const kiln_config *kiln_test_config(void);
/* The same on the host: the nets that layer tests build and read directly (their reruns with
 * KILN_DEVICE=hostsim move standalone layers to the device, device_mirror.h; nets on a device
 * are tested through the net's own device table, tests/cli/hostsim.sh). */
const kiln_config *kiln_test_net_config(void);

/* Whether b's data lies in a net's shared activation data (kiln_net_options.share_data),
 * directly or as a Split top reading such a blob. */
bool kiln_test_data_shared(const kiln_blob *b);
/* NaN over the data of every blob of `net` that lies in shared activation data: after a training
 * net's forward, no backward may read any of it. Returns how many blobs it spoiled. */
int kiln_test_spoil_shared_data(kiln_net *net);

typedef struct gradcheck_opts {
  double step;          /* default 1e-2 */
  double threshold;     /* default 1e-3 */
  float kink;           /* value where the function is not differentiable (ReLU: 0) */
  float kink_range;     /* skip inputs within this distance of the kink; < 0 disables */
  unsigned bottom_mask; /* which bottoms to check (bit i); 0 = all */
  int phase;            /* CAFFE__PHASE__TRAIN (default 0) or TEST */
  uint64_t seed;
  int max_failures_shown;
} gradcheck_opts;

/* A layer from prototxt text ("name: 'x' type: 'ReLU' ..."); aborts the test on error. */
Caffe__LayerParameter *gc_layer_param(const char *text);
/* A blob of the given shape filled uniformly in [lo, hi). */
kiln_blob *gc_blob(const char *name, int naxes, const int64_t *shape, float lo, float hi,
                   kiln_rng *rng);

/* Builds the layer (setup + reshape) on `bottoms` with `ntop` fresh tops, then checks the
 * gradient of L = sum_t <top_t, R_t> (R random) with respect to every checked bottom element and
 * every parameter element. Returns the number of mismatches (printed). The layer, its tops and
 * its parameter message are freed; the bottoms are the caller's. */
int gradcheck_layer(const char *layer_text, kiln_blob **bottoms, int nbottom, int ntop,
                    const gradcheck_opts *opts);

#endif
