/* 2-D convolution on the CPU: im2col / col2im and one GEMM per image and group (Caffe's method),
 * threaded over the batch with OpenMP. The GEMMs go to CBLAS (OpenBLAS). */
#include <cblas.h>
#include <omp.h>
#include <string.h>

#include "kiln/ops.h"

int kiln_conv_out_size(kiln_conv_geom *g) {
  if (g->channels < 1 || g->height < 1 || g->width < 1 || g->kernel_h < 1 || g->kernel_w < 1 ||
      g->pad_h < 0 || g->pad_w < 0 || g->stride_h < 1 || g->stride_w < 1 || g->dilation_h < 1 ||
      g->dilation_w < 1 || g->height > KILN_CONV_MAX_SIDE || g->width > KILN_CONV_MAX_SIDE ||
      g->kernel_h > KILN_CONV_MAX_PARAM || g->kernel_w > KILN_CONV_MAX_PARAM ||
      g->pad_h > KILN_CONV_MAX_PARAM || g->pad_w > KILN_CONV_MAX_PARAM ||
      g->stride_h > KILN_CONV_MAX_PARAM || g->stride_w > KILN_CONV_MAX_PARAM ||
      g->dilation_h > KILN_CONV_MAX_PARAM || g->dilation_w > KILN_CONV_MAX_PARAM)
    return -1;
  int64_t ext_h = (int64_t)g->dilation_h * (g->kernel_h - 1) + 1;
  int64_t ext_w = (int64_t)g->dilation_w * (g->kernel_w - 1) + 1;
  int64_t span_h = (int64_t)g->height + 2 * (int64_t)g->pad_h - ext_h;
  int64_t span_w = (int64_t)g->width + 2 * (int64_t)g->pad_w - ext_w;
  if (span_h < 0 || span_w < 0) return -1;
  g->out_h = (int)(span_h / g->stride_h + 1);
  g->out_w = (int)(span_w / g->stride_w + 1);
  return 0;
}

/* For kernel column offset `off` (= kj*dilation - pad), the output columns [*lo, *hi) whose input
 * column ow*stride + off lies inside [0, W); the others read padding. */
static void valid_out_range(int off, int stride, int W, int OW, int *lo, int *hi) {
  int a = off >= 0 ? 0 : (-off + stride - 1) / stride;
  int b = W - off <= 0 ? 0 : (W - off + stride - 1) / stride;
  if (a > OW) a = OW;
  if (b > OW) b = OW;
  if (b < a) b = a;
  *lo = a;
  *hi = b;
}

/* col is (C*kh*kw, OH*OW), im is (C, H, W). */
void kiln_im2col(float *col, const float *im, const kiln_conv_geom *g) {
  const int C = g->channels, H = g->height, W = g->width;
  const int OH = g->out_h, OW = g->out_w, sh = g->stride_h, sw = g->stride_w;
  const int64_t P = (int64_t)OH * OW;
  int64_t row = 0;
  for (int c = 0; c < C; c++) {
    const float *plane = im + (int64_t)c * H * W;
    for (int ki = 0; ki < g->kernel_h; ki++) {
      const int hoff = ki * g->dilation_h - g->pad_h;
      for (int kj = 0; kj < g->kernel_w; kj++, row++) {
        const int woff = kj * g->dilation_w - g->pad_w;
        int lo, hi;
        valid_out_range(woff, sw, W, OW, &lo, &hi);
        float *dst = col + row * P;
        for (int oh = 0; oh < OH; oh++, dst += OW) {
          const int ih = oh * sh + hoff;
          if (ih < 0 || ih >= H) {
            memset(dst, 0, sizeof(float) * (size_t)OW);
            continue;
          }
          const float *src = plane + (int64_t)ih * W + woff;
          for (int ow = 0; ow < lo; ow++) dst[ow] = 0.0f;
          if (sw == 1) {
            if (hi > lo) memcpy(dst + lo, src + lo, sizeof(float) * (size_t)(hi - lo));
          } else {
            for (int ow = lo; ow < hi; ow++) dst[ow] = src[(int64_t)ow * sw];
          }
          for (int ow = hi; ow < OW; ow++) dst[ow] = 0.0f;
        }
      }
    }
  }
}

/* im (C, H, W) = scatter-add of col (C*kh*kw, OH*OW); im is overwritten. */
void kiln_col2im(float *im, const float *col, const kiln_conv_geom *g) {
  const int C = g->channels, H = g->height, W = g->width;
  const int OH = g->out_h, OW = g->out_w, sh = g->stride_h, sw = g->stride_w;
  const int64_t P = (int64_t)OH * OW;
  memset(im, 0, sizeof(float) * (size_t)((int64_t)C * H * W));
  int64_t row = 0;
  for (int c = 0; c < C; c++) {
    float *plane = im + (int64_t)c * H * W;
    for (int ki = 0; ki < g->kernel_h; ki++) {
      const int hoff = ki * g->dilation_h - g->pad_h;
      for (int kj = 0; kj < g->kernel_w; kj++, row++) {
        const int woff = kj * g->dilation_w - g->pad_w;
        int lo, hi;
        valid_out_range(woff, sw, W, OW, &lo, &hi);
        const float *src = col + row * P;
        for (int oh = 0; oh < OH; oh++, src += OW) {
          const int ih = oh * sh + hoff;
          if (ih < 0 || ih >= H) continue;
          float *dst = plane + (int64_t)ih * W + woff;
          for (int ow = lo; ow < hi; ow++) dst[(int64_t)ow * sw] += src[ow];
        }
      }
    }
  }
}

/* A 1x1 kernel with stride 1 and no padding makes col equal to the input plane stack. */
static int is_pointwise(const kiln_conv_geom *g) {
  return g->kernel_h == 1 && g->kernel_w == 1 && g->stride_h == 1 && g->stride_w == 1 &&
         g->pad_h == 0 && g->pad_w == 0;
}

/* Threads for the batch loop: no more than there are images. */
static int team_size(int nthreads, int N) {
  if (nthreads > N) nthreads = N;
  return nthreads < 1 ? 1 : nthreads;
}

/* Every GEMM here runs on one BLAS thread (kiln_blas_serial_begin; include/kiln/ops.h says why):
 * parallelism comes only from our batch loop. */
int64_t kiln_conv_workspace(const kiln_conv_geom *g, int group, int nthreads) {
  if (group < 1) group = 1;
  if (nthreads < 1) nthreads = 1;
  int64_t K = (int64_t)(g->channels / group) * g->kernel_h * g->kernel_w;
  return K * g->out_h * g->out_w * nthreads;
}

/* out (N, M, OH, OW) = conv(in (N, C, H, W), w (M, C/group, kh, kw)) + bias (M or NULL).
 * col: kiln_conv_workspace() floats; thread t uses slice t. */
void kiln_conv2d_forward(float *out, const float *in, const float *w, const float *bias, int N,
                         int M, int group, const kiln_conv_geom *g, float *col, int nthreads) {
  if (nthreads < 1) nthreads = 1;
  const int Cg = g->channels / group, Mg = M / group;
  const int64_t HW = (int64_t)g->height * g->width;
  const int64_t P = (int64_t)g->out_h * g->out_w;
  const int64_t K = (int64_t)Cg * g->kernel_h * g->kernel_w;
  const int pointwise = is_pointwise(g);
  kiln_conv_geom gg = *g; /* geometry of one group's input channels */
  gg.channels = Cg;
  const int team = team_size(nthreads, N);
  const int blas_prev = kiln_blas_serial_begin();

#pragma omp parallel for schedule(static) num_threads(team)
  for (int n = 0; n < N; n++) {
    float *col_t = col ? col + (int64_t)omp_get_thread_num() * K * P : NULL;
    for (int grp = 0; grp < group; grp++) {
      const float *in_g = in + ((int64_t)n * g->channels + (int64_t)grp * Cg) * HW;
      const float *B = in_g;
      if (!pointwise) {
        kiln_im2col(col_t, in_g, &gg);
        B = col_t;
      }
      float *out_g = out + ((int64_t)n * M + (int64_t)grp * Mg) * P;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, Mg, (int)P, (int)K, 1.0f,
                  w + (int64_t)grp * Mg * K, (int)K, B, (int)P, 0.0f, out_g, (int)P);
      if (bias) {
        for (int m = 0; m < Mg; m++) {
          const float b = bias[grp * Mg + m];
          float *o = out_g + (int64_t)m * P;
          for (int64_t p = 0; p < P; p++) o[p] += b;
        }
      }
    }
  }
  kiln_blas_serial_end(blas_prev);
}

/* Gradients of kiln_conv2d_forward. dout is (N, M, OH, OW).
 *   din (N, C, H, W) is OVERWRITTEN; dw (M, C/group, kh, kw) and dbias (M) are ACCUMULATED (+=).
 *   Any of the three may be NULL to skip it.
 * Determinism: each image's weight gradient is computed whole (one GEMM per group, beta = 0) into
 * the computing thread's slice of dw_ws, then added into dw inside an `ordered` region, so dw
 * receives the images' contributions one by one in image order 0, 1, ..., N-1. The float additions
 * are therefore the same for every thread count and schedule, and dw is bitwise independent of
 * nthreads: every GEMM runs on one BLAS thread (kiln_blas_serial_begin) and gives the same bits on
 * whichever of our threads runs it. din (per-image work) and the forward pass are independent of
 * nthreads for the same reason; dbias sums over (n, oh, ow) in a fixed order, in double, one
 * thread per channel. The tests check 1, 2 and 3 threads bit for bit. Only N threads are used
 * when nthreads > N (the batch is the only parallel axis). */
void kiln_conv2d_backward(float *din, float *dw, float *dbias, const float *dout, const float *in,
                          const float *w, int N, int M, int group, const kiln_conv_geom *g,
                          float *col, float *dw_ws, int nthreads) {
  if (nthreads < 1) nthreads = 1;
  const int Cg = g->channels / group, Mg = M / group;
  const int64_t HW = (int64_t)g->height * g->width;
  const int64_t P = (int64_t)g->out_h * g->out_w;
  const int64_t K = (int64_t)Cg * g->kernel_h * g->kernel_w;
  const int64_t wcount = (int64_t)M * K;
  const int pointwise = is_pointwise(g);
  kiln_conv_geom gg = *g;
  gg.channels = Cg;

  if (dbias) {
#pragma omp parallel for schedule(static) num_threads(nthreads)
    for (int m = 0; m < M; m++) {
      double s = 0.0;
      for (int n = 0; n < N; n++) {
        const float *d = dout + ((int64_t)n * M + m) * P;
        for (int64_t p = 0; p < P; p++) s += d[p];
      }
      dbias[m] += (float)s;
    }
  }
  if (!dw && !din) return;

  const int team = team_size(nthreads, N);
  const int blas_prev = kiln_blas_serial_begin();
#pragma omp parallel for schedule(static, 1) ordered num_threads(team)
  for (int n = 0; n < N; n++) {
    const int t = omp_get_thread_num();
    float *col_t = col ? col + (int64_t)t * K * P : NULL;
    float *dw_t = dw ? dw_ws + (int64_t)t * wcount : NULL;
    for (int grp = 0; grp < group; grp++) {
      const float *dout_g = dout + ((int64_t)n * M + (int64_t)grp * Mg) * P;
      const int64_t in_off = ((int64_t)n * g->channels + (int64_t)grp * Cg) * HW;
      const float *w_g = w + (int64_t)grp * Mg * K;
      if (dw) {
        const float *B = in + in_off;
        if (!pointwise) {
          kiln_im2col(col_t, in + in_off, &gg);
          B = col_t;
        }
        /* dw_g (Mg, K) = dout_g (Mg, P) * col^T (P, K) */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, Mg, (int)K, (int)P, 1.0f, dout_g,
                    (int)P, B, (int)P, 0.0f, dw_t + (int64_t)grp * Mg * K, (int)K);
      }
      if (din) {
        /* dcol (K, P) = w_g^T (K, Mg) * dout_g (Mg, P), then scattered back to the image */
        float *dst = pointwise ? din + in_off : col_t;
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)K, (int)P, Mg, 1.0f, w_g,
                    (int)K, dout_g, (int)P, 0.0f, dst, (int)P);
        if (!pointwise) kiln_col2im(din + in_off, col_t, &gg);
      }
    }
#pragma omp ordered
    {
      if (dw)
        for (int64_t i = 0; i < wcount; i++) dw[i] += dw_t[i];
    }
  }
  kiln_blas_serial_end(blas_prev);
}
