/* Private to src/net: the layer lifecycle steps that net.c and layer.c share. */
#ifndef KILN_NET_INTERNAL_H
#define KILN_NET_INTERNAL_H

#include "kiln/net.h"

/* Fills `l` (zeroed by the caller) and checks the number of bottoms and tops. */
int kiln_layer_wire(kiln_layer *l, const Caffe__LayerParameter *lp, const kiln_layer_ops *ops,
                    const char *name, int phase, kiln_blob **bottoms, int nbottom,
                    kiln_blob **tops, int ntop);
/* Runs the layer's destroy and frees what wire and setup allocated (not `l` itself). */
void kiln_layer_release(kiln_layer *l);

#endif
