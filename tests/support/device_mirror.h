/* A layer outside a net run on its backend's device (tests/support/device_mirror.c).
 *
 * A standalone layer (kiln_layer_create) keeps its blobs in host memory, where the tests write
 * their inputs and read what the layer made. layer_forward and layer_backward run one pass of
 * it; where its backend's device is not the host (KILN_DEVICE=hostsim), they first move every
 * blob it touches (bottoms, tops, parameters, buffers, its workspace) to the device through the
 * device table, fill the host copies with NaN, run the pass, and move everything back. A layer
 * that reads host memory behind the table's back (a pointer kept from setup, a host loop over
 * device memory) then faults or computes with NaN, and its test fails. On the host they run the
 * pass alone. */
#ifndef KILN_TEST_DEVICE_MIRROR_H
#define KILN_TEST_DEVICE_MIRROR_H

#include "kiln/net.h"

int layer_forward(kiln_layer *l);
int layer_backward(kiln_layer *l);

#endif
