/* kiln-conv-routes: one convolution shape through each route kiln has (the plain im2col + GEMM
 * kernels, oneDNN with its blocked or its channels-last layouts, by kiln's algorithm rule and
 * with direct convolution forced (where the rule takes Winograd, the two differ), and the
 * shifted-row direct kernels for stride 1 and group 1), forward and backward, the
 * best of R repetitions in ms. It is the measurement behind the route each shape takes
 * (docs/PERF.md); not a test.
 *
 *   kiln-conv-routes N C H W M K PAD STRIDE [GROUP [REPS [DIN]]]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kiln/core.h"
#include "kiln/ops.h"

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

int main(int argc, char **argv) {
  if (argc < 9) {
    fprintf(stderr, "usage: %s N C H W M K PAD STRIDE [GROUP [REPS [DIN 0|1]]]\n", argv[0]);
    return 2;
  }
  int N = atoi(argv[1]), C = atoi(argv[2]), H = atoi(argv[3]), W = atoi(argv[4]);
  int M = atoi(argv[5]), K = atoi(argv[6]), P = atoi(argv[7]), S = atoi(argv[8]);
  int G = argc > 9 ? atoi(argv[9]) : 1, reps = argc > 10 ? atoi(argv[10]) : 10;
  int want_din = argc > 11 ? atoi(argv[11]) : 1;
  kiln_conv_geom g = {C, H, W, K, K, P, P, S, S, 1, 1, 0, 0};
  if (kiln_conv_out_size(&g) != 0 || C % G || M % G) {
    fprintf(stderr, "bad shape\n");
    return 2;
  }
  int nt = kiln_get_num_threads();
  int64_t nin = (int64_t)N * C * H * W, nout = (int64_t)N * M * g.out_h * g.out_w;
  int64_t nw = (int64_t)M * (C / G) * K * K;
  float *in = kiln_alloc(4 * nin), *din = kiln_alloc(4 * nin), *out = kiln_alloc(4 * nout);
  float *dout = kiln_alloc(4 * nout), *w = kiln_alloc(4 * nw), *dw = kiln_alloc(4 * nw);
  float *b = kiln_alloc(4 * M), *db = kiln_alloc(4 * M);
  for (int64_t i = 0; i < nin; i++) in[i] = (float)((i * 7919) % 1000) / 1000.0f - 0.5f;
  for (int64_t i = 0; i < nout; i++) dout[i] = (float)((i * 104729) % 1000) / 1000.0f - 0.5f;
  for (int64_t i = 0; i < nw; i++) w[i] = (float)((i * 31) % 100) / 100.0f - 0.5f;
  printf("N%d C%d %dx%d M%d k%d pad%d stride%d group%d threads%d din%d\n", N, C, H, W, M, K, P, S,
         G, nt, want_din);
  printf("%-12s %9s %9s %9s  %s\n", "route", "fwd ms", "bwd ms", "total", "oneDNN's forward");
  char impl[3][64] = {"", "", ""}; /* the rule's forward implementation, by layout */
  const char *routes[] = {"plain", "dnnl-blocked", "dnnl-nhwc", "blocked-dir", "nhwc-dir",
                          "shift"};
  enum { R_SHIFT = 5 };
  for (int r = 0; r < 6; r++) {
    kiln_dnnl_conv *dn = NULL;
    int64_t ws_n = kiln_conv_workspace(&g, G, nt) + (int64_t)nt * nw;
    if (r == R_SHIFT) {
      if (!kiln_conv_shift_supported(&g, G)) continue;
      ws_n = kiln_conv_shift_workspace(&g, N, M, nt, true);
    } else if (r > 0) {
      if (!kiln_dnnl_available()) continue;
      kiln_config cfg;
      kiln_config_init(&cfg);
      cfg.dnnl_layout = r % 2 ? KILN_DNNL_LAYOUT_ANY : KILN_DNNL_LAYOUT_NHWC;
      cfg.conv_direct = r >= 3;
      if (kiln_dnnl_conv_create(&dn, N, M, G, &g, true, true, KILN_LAYOUT_PLAIN,
                                KILN_LAYOUT_PLAIN, &cfg, 0, false) != KILN_OK) {
        printf("%-12s %s\n", routes[r], kiln_last_error());
        continue;
      }
      /* direct forced where the rule took the same kernel: the row above again */
      if (r >= 3 && strcmp(kiln_dnnl_conv_impl(dn, 0), impl[r - 2]) == 0) {
        kiln_dnnl_conv_destroy(dn);
        continue;
      }
      if (r < 3) snprintf(impl[r], sizeof impl[r], "%s", kiln_dnnl_conv_impl(dn, 0));
      ws_n = kiln_dnnl_conv_workspace(dn);
    }
    float *ws = kiln_alloc(4 * (size_t)(ws_n > 0 ? ws_n : 1));
    double best_f = 1e30, best_b = 1e30;
    for (int it = 0; it < reps + 1; it++) {
      double t0 = now_ms();
      if (r == R_SHIFT)
        kiln_conv_shift_forward(out, in, w, b, N, M, &g, ws, nt);
      else if (dn)
        kiln_dnnl_conv_forward(dn, out, in, w, b, ws);
      else
        kiln_conv2d_forward(out, in, w, b, N, M, G, &g, ws, nt);
      double t1 = now_ms();
      if (r == R_SHIFT)
        kiln_conv_shift_backward(want_din ? din : NULL, dw, db, dout, in, w, N, M, &g, ws, nt);
      else if (dn)
        kiln_dnnl_conv_backward(dn, want_din ? din : NULL, dw, db, dout, in, w, ws);
      else
        kiln_conv2d_backward(want_din ? din : NULL, dw, db, dout, in, w, N, M, G, &g, ws,
                             ws + kiln_conv_workspace(&g, G, nt), nt);
      double t2 = now_ms();
      if (it > 0) { /* the first call warms caches and JIT */
        if (t1 - t0 < best_f) best_f = t1 - t0;
        if (t2 - t1 < best_b) best_b = t2 - t1;
      }
    }
    printf("%-12s %9.3f %9.3f %9.3f  %s\n", routes[r], best_f, best_b, best_f + best_b,
           dn ? kiln_dnnl_conv_impl(dn, 0) : "");
    kiln_free(ws);
    kiln_dnnl_conv_destroy(dn);
  }
  kiln_free(in), kiln_free(din), kiln_free(out), kiln_free(dout);
  kiln_free(w), kiln_free(dw), kiln_free(b), kiln_free(db);
  return 0;
}
