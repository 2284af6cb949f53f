/* Activation layouts: how a blob's values lie in memory (kiln_blob.layout). Which layouts exist
 * is the kernels' business, not the blob's: the blocked one is what the cpu backend's oneDNN
 * route reads and writes (src/ops/conv_dnnl.c), and the net plans it between layers that ask
 * for it (kiln_layer_ops.layout_role, src/net/net_layout.c). */
#ifndef KILN_LAYOUT_H
#define KILN_LAYOUT_H

/* PLAIN is Caffe's row-major N x C x H x W (and every blob that is not 4-D).
 * BLOCKED16 is oneDNN's nChw16c for a 4-D blob whose C is a multiple of 16: element (n, c, h, w)
 * at ((n * C/16 + c/16) * H*W + h*W + w) * 16 + c%16. The net chooses BLOCKED16 only between
 * layers that read it (docs/architecture.md); everything outside a net sees PLAIN. */
enum { KILN_LAYOUT_PLAIN = 0, KILN_LAYOUT_BLOCKED16 = 1 };
/* The layout that keeps channels in blocks of `channels` (what a convolution route asks for,
 * kiln_layer_ops.block_channels): BLOCKED16 for 16, PLAIN for a block kiln has no layout for
 * (0 included). */
int kiln_layout_for_block(int channels);

#endif
