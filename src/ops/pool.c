/* Max and average pooling with Caffe's window rules (CEIL/FLOOR output size, windows clipped to
 * the padded input, AVE divisor counting padding up to H + pad), threaded over the N*C planes. */
#include <float.h>
#include <stdbool.h>
#include <string.h>

#include "kiln/ops.h"

/* Below this many output values a parallel region costs more than it saves. */
#define POOL_PARALLEL_MIN 4096

static int pool_dim(int in, int k, int pad, int stride, int ceil_mode) {
  int span = in + 2 * pad - k; /* >= 0, checked by the caller */
  int out = (ceil_mode ? (span + stride - 1) / stride : span / stride) + 1;
  /* Caffe: with padding, the last window must start inside the image or its left/top padding. */
  if (pad > 0 && (out - 1) * stride >= in + pad) out--;
  return out;
}

/* Fills g->out_h, g->out_w; -1 (and nothing written) when the geometry is invalid: the kernel
 * does not fit in the padded input, or pad >= kernel (which Caffe refuses too). Dilation is
 * ignored (pooling has none). */
int kiln_pool_out_size(kiln_conv_geom *g, int ceil_mode) {
  if (g->channels < 1 || g->height < 1 || g->width < 1 || g->kernel_h < 1 || g->kernel_w < 1 ||
      g->pad_h < 0 || g->pad_w < 0 || g->stride_h < 1 || g->stride_w < 1 ||
      g->pad_h >= g->kernel_h || g->pad_w >= g->kernel_w)
    return -1;
  if (g->kernel_h > g->height + 2 * g->pad_h || g->kernel_w > g->width + 2 * g->pad_w) return -1;
  g->out_h = pool_dim(g->height, g->kernel_h, g->pad_h, g->stride_h, ceil_mode);
  g->out_w = pool_dim(g->width, g->kernel_w, g->pad_w, g->stride_w, ceil_mode);
  return 0;
}

static inline int imin(int a, int b) { return a < b ? a : b; }
static inline int imax(int a, int b) { return a > b ? a : b; }

typedef float v8f __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));
typedef float v4f __attribute__((vector_size(16)));
typedef int32_t v4i __attribute__((vector_size(16)));

/* L windows of 2x2 at stride 2 (L = 8 or 4): r0 and r1 hold the window rows' 2L values each,
 * split into left and right columns; ia is each window's top-left index. Compare-and-select in
 * vector registers, in the general loop's order (seeded with the top-left value, strict >, so
 * ties keep the earlier): which value wins is data-dependent, and branches on it mispredict. */
/* The even and odd lanes of two vectors (__builtin_shufflevector: GCC 12 and clang). */
#define EVEN8(x, y) __builtin_shufflevector(x, y, 0, 2, 4, 6, 8, 10, 12, 14)
#define ODD8(x, y) __builtin_shufflevector(x, y, 1, 3, 5, 7, 9, 11, 13, 15)
#define EVEN4(x, y) __builtin_shufflevector(x, y, 0, 2, 4, 6)
#define ODD4(x, y) __builtin_shufflevector(x, y, 1, 3, 5, 7)
#define MAX_WINDOWS(NAME, VF, VI, L, EVEN, EVEN_OF, ODD_OF)                                  \
  static inline void NAME(float *y, int32_t *mk, const float *r0, const float *r1, int32_t i0, \
                          int W) {                                                           \
    const VI even = EVEN;                                                                    \
    VF p0, p1, q0, q1;                                                                       \
    memcpy(&p0, r0, sizeof p0);                                                              \
    memcpy(&p1, r0 + L, sizeof p1);                                                          \
    memcpy(&q0, r1, sizeof q0);                                                              \
    memcpy(&q1, r1 + L, sizeof q1);                                                          \
    const VF a = EVEN_OF(p0, p1), b = ODD_OF(p0, p1);                                        \
    const VF c = EVEN_OF(q0, q1), d = ODD_OF(q0, q1);                                        \
    const VI ia = even + i0;                                                                 \
    VF best = a;                                                                             \
    VI arg = ia, m;                                                                          \
    m = b > best;                                                                            \
    best = (VF)((m & (VI)b) | (~m & (VI)best)), arg = (m & (ia + 1)) | (~m & arg);           \
    m = c > best;                                                                            \
    best = (VF)((m & (VI)c) | (~m & (VI)best)), arg = (m & (ia + W)) | (~m & arg);           \
    m = d > best;                                                                            \
    best = (VF)((m & (VI)d) | (~m & (VI)best)), arg = (m & (ia + W + 1)) | (~m & arg);       \
    memcpy(y, &best, sizeof best);                                                           \
    memcpy(mk, &arg, sizeof arg);                                                            \
  }
MAX_WINDOWS(max8, v8f, v8i, 8, ((v8i){0, 2, 4, 6, 8, 10, 12, 14}), EVEN8, ODD8)
MAX_WINDOWS(max4, v4f, v4i, 4, ((v4i){0, 2, 4, 6}), EVEN4, ODD4)

/* The common 2x2 window at stride 2 without padding, over the windows that lie whole inside
 * the image (rows < full_h): columns in steps of 8 and 4 windows, the general loop's
 * comparisons in its order, with the window bounds and loops taken out. Returns how many
 * columns it did (full_w rounded down to 4); the general loop does the rest, with the same
 * results. */
static int maxpool_2x2s2_whole(float *y, int32_t *mk, const float *x, int W, int OW, int full_h,
                               int full_w) {
  const int done = full_w / 4 * 4;
  for (int oh = 0; oh < full_h; oh++) {
    const float *r0 = x + (int64_t)2 * oh * W, *r1 = r0 + W;
    const int32_t base = 2 * oh * W;
    int ow = 0;
    for (; ow + 8 <= done; ow += 8)
      max8(y + oh * OW + ow, mk + oh * OW + ow, r0 + 2 * ow, r1 + 2 * ow, base + 2 * ow, W);
    if (ow < done)
      max4(y + oh * OW + ow, mk + oh * OW + ow, r0 + 2 * ow, r1 + 2 * ow, base + 2 * ow, W);
  }
  return done;
}

/* out (N, C, OH, OW), mask (N, C, OH, OW) = argmax index h*W + w in the input plane, in
 * (N, C, H, W). Padding never wins. Ties keep the first maximum in row-major window order.
 * An empty window (possible only without padding, in CEIL mode, when stride > kernel) gives 0 and
 * mask -1 (Caffe would write -FLT_MAX there and misroute its gradient). */
void kiln_maxpool_forward(float *out, int32_t *mask, const float *in, int N,
                          const kiln_conv_geom *g) {
  const int H = g->height, W = g->width, OH = g->out_h, OW = g->out_w;
  const int64_t planes = (int64_t)N * g->channels;
  const bool k2s2 = g->kernel_h == 2 && g->kernel_w == 2 && g->stride_h == 2 &&
                    g->stride_w == 2 && g->pad_h == 0 && g->pad_w == 0;
  const int full_h = k2s2 ? imin(OH, H / 2) : 0, full_w = k2s2 ? imin(OW, W / 2) : 0;
#pragma omp parallel for schedule(static) if (planes * OH * OW >= POOL_PARALLEL_MIN)
  for (int64_t pl = 0; pl < planes; pl++) {
    const float *x = in + pl * H * W;
    float *y = out + pl * OH * OW;
    int32_t *mk = mask + pl * OH * OW;
    const int done = maxpool_2x2s2_whole(y, mk, x, W, OW, full_h, full_w);
    for (int oh = 0; oh < OH; oh++) {
      const int h0 = imax(oh * g->stride_h - g->pad_h, 0);
      const int h1 = imin(oh * g->stride_h - g->pad_h + g->kernel_h, H);
      for (int ow = oh < full_h ? done : 0; ow < OW; ow++) {
        const int w0 = imax(ow * g->stride_w - g->pad_w, 0);
        const int w1 = imin(ow * g->stride_w - g->pad_w + g->kernel_w, W);
        if (h0 >= h1 || w0 >= w1) { /* an empty window (see above): output 0, no gradient */
          y[oh * OW + ow] = 0.0f;
          mk[oh * OW + ow] = -1;
          continue;
        }
        /* Seeded with the first value; selects instead of branches, since which value wins is
         * data-dependent and mispredicted branches dominated this loop. Ties keep the first. */
        float best = x[h0 * W + w0];
        int32_t arg = h0 * W + w0;
        for (int h = h0; h < h1; h++)
          for (int w = w0; w < w1; w++) {
            const float v = x[h * W + w];
            const int better = v > best;
            best = better ? v : best;
            arg = better ? h * W + w : arg;
          }
        y[oh * OW + ow] = best;
        mk[oh * OW + ow] = arg;
      }
    }
  }
}

/* din (N, C, H, W) = dout routed to the argmax of each window (overwritten). */
void kiln_maxpool_backward(float *din, const float *dout, const int32_t *mask, int N,
                           const kiln_conv_geom *g) {
  const int64_t HW = (int64_t)g->height * g->width, P = (int64_t)g->out_h * g->out_w;
  const int64_t planes = (int64_t)N * g->channels;
#pragma omp parallel for schedule(static) if (planes * HW >= POOL_PARALLEL_MIN)
  for (int64_t pl = 0; pl < planes; pl++) {
    float *dx = din + pl * HW;
    const float *dy = dout + pl * P;
    const int32_t *mk = mask + pl * P;
    memset(dx, 0, sizeof(float) * (size_t)HW);
    for (int64_t p = 0; p < P; p++)
      if (mk[p] >= 0) dx[mk[p]] += dy[p];
  }
}

/* Window rows [*a, *b) inside the image and the divisor extent (clipped to size + pad only). */
static inline void ave_window(int o, int stride, int pad, int k, int size, int *a, int *b,
                              int *extent) {
  int start = o * stride - pad;
  int end = imin(start + k, size + pad);
  *extent = end - start;
  *a = imax(start, 0);
  *b = imin(end, size);
}

/* out (N, C, OH, OW) = mean over each window of in (N, C, H, W); the divisor counts the window
 * clipped to [-pad, size + pad) (padding counts as zeros), as Caffe does. */
void kiln_avepool_forward(float *out, const float *in, int N, const kiln_conv_geom *g) {
  const int H = g->height, W = g->width, OH = g->out_h, OW = g->out_w;
  const int64_t planes = (int64_t)N * g->channels;
#pragma omp parallel for schedule(static) if (planes * OH * OW >= POOL_PARALLEL_MIN)
  for (int64_t pl = 0; pl < planes; pl++) {
    const float *x = in + pl * H * W;
    float *y = out + pl * OH * OW;
    for (int oh = 0; oh < OH; oh++) {
      int h0, h1, eh;
      ave_window(oh, g->stride_h, g->pad_h, g->kernel_h, H, &h0, &h1, &eh);
      for (int ow = 0; ow < OW; ow++) {
        int w0, w1, ew;
        ave_window(ow, g->stride_w, g->pad_w, g->kernel_w, W, &w0, &w1, &ew);
        float s = 0.0f;
        for (int h = h0; h < h1; h++)
          for (int w = w0; w < w1; w++) s += x[h * W + w];
        /* An empty window (see kiln_maxpool_forward) has extent <= 0: output 0. */
        y[oh * OW + ow] = (eh > 0 && ew > 0) ? s / (float)(eh * ew) : 0.0f;
      }
    }
  }
}

/* din (N, C, H, W) = each dout spread evenly over its window's in-image cells (overwritten). */
void kiln_avepool_backward(float *din, const float *dout, int N, const kiln_conv_geom *g) {
  const int H = g->height, W = g->width, OH = g->out_h, OW = g->out_w;
  const int64_t planes = (int64_t)N * g->channels;
#pragma omp parallel for schedule(static) if (planes * H * W >= POOL_PARALLEL_MIN)
  for (int64_t pl = 0; pl < planes; pl++) {
    float *dx = din + pl * H * W;
    const float *dy = dout + pl * OH * OW;
    memset(dx, 0, sizeof(float) * (size_t)H * W);
    for (int oh = 0; oh < OH; oh++) {
      int h0, h1, eh;
      ave_window(oh, g->stride_h, g->pad_h, g->kernel_h, H, &h0, &h1, &eh);
      for (int ow = 0; ow < OW; ow++) {
        int w0, w1, ew;
        ave_window(ow, g->stride_w, g->pad_w, g->kernel_w, W, &w0, &w1, &ew);
        if (eh <= 0 || ew <= 0) continue;
        const float d = dy[oh * OW + ow] / (float)(eh * ew);
        for (int h = h0; h < h1; h++)
          for (int w = w0; w < w1; w++) dx[h * W + w] += d;
      }
    }
  }
}

/* ---- the same pooling over oneDNN's nChw16c layout --------------------------------------------
 * A blocked (N, C, H, W) tensor is N * C/16 planes of H x W cells of 16 channels; each window is
 * taken for the 16 channels of a cell at once, one per vector lane, with the plain kernels' rules
 * (ties keep the first maximum in row-major order; the mask holds h*W + w per lane). The 16
 * lanes are a GCC vector, so the running maximum stays in a register (a 16-float array would go
 * through memory at every window cell; `kiln time` on cifar10_quick shows the pooling's cost). */
typedef float v16f __attribute__((vector_size(64)));
typedef int32_t v16i __attribute__((vector_size(64)));

/* Loads and stores through memcpy (any alignment); by pointer, so that a portable build, where
 * the vector is wider than the target's registers, passes no vector by value. */
#define V16_LOAD(v, p) memcpy(&(v), (p), sizeof(v16f))
#define V16_STORE(p, v) memcpy((p), &(v), sizeof(v16f))

void kiln_pool_blocked16_forward(float *out, int32_t *mask, const float *in, int N,
                                 const kiln_conv_geom *g, bool max) {
  const int H = g->height, W = g->width, OH = g->out_h, OW = g->out_w;
  const int64_t planes = (int64_t)N * (g->channels / 16);
#pragma omp parallel for schedule(static) if (planes * OH * OW * 16 >= POOL_PARALLEL_MIN)
  for (int64_t pl = 0; pl < planes; pl++) {
    const float *x = in + pl * H * W * 16;
    float *y = out + pl * OH * OW * 16;
    int32_t *mk = max ? mask + pl * OH * OW * 16 : NULL;
    for (int oh = 0; oh < OH; oh++)
      for (int ow = 0; ow < OW; ow++) {
        float *yo = y + (oh * OW + ow) * 16;
        int h0, h1, w0, w1, eh = 1, ew = 1;
        if (max) {
          h0 = imax(oh * g->stride_h - g->pad_h, 0);
          h1 = imin(oh * g->stride_h - g->pad_h + g->kernel_h, H);
          w0 = imax(ow * g->stride_w - g->pad_w, 0);
          w1 = imin(ow * g->stride_w - g->pad_w + g->kernel_w, W);
        } else {
          ave_window(oh, g->stride_h, g->pad_h, g->kernel_h, H, &h0, &h1, &eh);
          ave_window(ow, g->stride_w, g->pad_w, g->kernel_w, W, &w0, &w1, &ew);
        }
        if (h0 >= h1 || w0 >= w1 || eh <= 0 || ew <= 0) { /* an empty window: 0, no gradient */
          for (int k = 0; k < 16; k++) {
            yo[k] = 0.0f;
            if (mk) mk[(oh * OW + ow) * 16 + k] = -1;
          }
          continue;
        }
        if (max) {
          v16f best;
          V16_LOAD(best, x + (h0 * W + w0) * 16);
          v16i arg = (v16i){0} + (h0 * W + w0);
          for (int h = h0; h < h1; h++)
            for (int w = w0; w < w1; w++) {
              v16f v;
              V16_LOAD(v, x + (h * W + w) * 16);
              const v16i better = v > best; /* all ones where v wins */
              best = (v16f)(((v16i)v & better) | ((v16i)best & ~better));
              arg = (((v16i){0} + (h * W + w)) & better) | (arg & ~better);
            }
          V16_STORE(yo, best);
          memcpy(mk + (oh * OW + ow) * 16, &arg, sizeof arg);
        } else {
          v16f sum = {0};
          for (int h = h0; h < h1; h++)
            for (int w = w0; w < w1; w++) {
              v16f v;
              V16_LOAD(v, x + (h * W + w) * 16);
              sum += v;
            }
          sum /= (float)(eh * ew);
          V16_STORE(yo, sum);
        }
      }
  }
}

void kiln_pool_blocked16_backward(float *din, const float *dout, const int32_t *mask, int N,
                                  const kiln_conv_geom *g, bool max) {
  const int H = g->height, W = g->width, OH = g->out_h, OW = g->out_w;
  const int64_t planes = (int64_t)N * (g->channels / 16);
#pragma omp parallel for schedule(static) if (planes * H * W * 16 >= POOL_PARALLEL_MIN)
  for (int64_t pl = 0; pl < planes; pl++) {
    float *dx = din + pl * H * W * 16;
    const float *dy = dout + pl * OH * OW * 16;
    memset(dx, 0, sizeof(float) * (size_t)H * W * 16);
    if (max) {
      const int32_t *mk = mask + pl * OH * OW * 16;
      for (int64_t p = 0; p < (int64_t)OH * OW * 16; p++)
        if (mk[p] >= 0) dx[(int64_t)mk[p] * 16 + p % 16] += dy[p];
      continue;
    }
    for (int oh = 0; oh < OH; oh++) {
      int h0, h1, eh;
      ave_window(oh, g->stride_h, g->pad_h, g->kernel_h, H, &h0, &h1, &eh);
      for (int ow = 0; ow < OW; ow++) {
        int w0, w1, ew;
        ave_window(ow, g->stride_w, g->pad_w, g->kernel_w, W, &w0, &w1, &ew);
        if (eh <= 0 || ew <= 0) continue;
        float d[16];
        for (int k = 0; k < 16; k++) d[k] = dy[(oh * OW + ow) * 16 + k] / (float)(eh * ew);
        for (int h = h0; h < h1; h++)
          for (int w = w0; w < w1; w++) {
            float *dc = dx + (h * W + w) * 16;
#pragma omp simd
            for (int k = 0; k < 16; k++) dc[k] += d[k];
          }
      }
    }
  }
}
