/* kiln_sgemm: cblas_sgemm's row-major product through whichever library is faster for the shape.
 *
 * OpenBLAS is the reference and the route of every call oneDNN does not take. oneDNN's matmul
 * picks its AVX-512 kernels by CPUID, whatever kernel OpenBLAS is told to use, and it is
 * markedly faster on the thin products of recurrent steps and fully connected layers (a few
 * dozen rows against a wide weight matrix); docs/PERF.md has the measurements behind the rule in
 * use_dnnl. A oneDNN primitive is made once per shape and kept in a small table, so a training
 * step after the first makes none; oneDNN keeps its own scratch memory between calls.
 *
 * The oneDNN route runs only outside OpenMP parallel regions (kernels that call GEMM from their
 * own threads get OpenBLAS, serially, as before) and never under the reference engine, whose
 * results must not depend on the thread count. A shape oneDNN serves only with its reference
 * kernel, or not at all, is remembered as OpenBLAS's. Either library splits the sum over K between
 * threads only for products with A transposed and fewer 64-column blocks of output than threads
 * (weight gradients of narrow layers over long batches), whose bits then depend on the thread
 * count on either route; every other product gives the same bits on any number of threads
 * (tests/test_gemm.c).
 *
 * A kiln_packed_gemm serves a product whose right operand stays the same over many calls (a
 * recurrent layer's weights over the steps of a pass): oneDNN copies B once into the blocked
 * layout its kernel for that shape reads fastest, and each call then reads only A and C.
 *
 * In bf16 (kiln_sgemm_bf16, the cpu-bf16 backend's products) the operands are rounded to
 * bfloat16 (nearest even) into a buffer the table keeps, and oneDNN's bf16 matmul sums their
 * products in fp32 into C; a packed B is packed in bf16 once per set_b, and each run rounds A. */
#include <cblas.h>
#include <omp.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "kiln/core.h"
#include "kiln/cpu.h"
#include "kiln/ops.h"
#include "ops/kernels.h"
#include "dnnl_rt.h"

static void blas(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                 int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              (int)M, (int)N, (int)K, alpha, A, (int)lda, B, (int)ldb, beta, C, (int)ldc);
}

#ifdef KILN_HAVE_DNNL

/* The rule, from kiln-gemm-routes on this project's reference machine (docs/PERF.md): oneDNN
 * wins by 10-55% on products with A as it lies, from recurrent steps (32 x 2048 x 512: 0.37
 * against 0.50 ms at 1 thread) to large projections. With A transposed (weight gradients,
 * where it copies A first) it loses by 1-14% against OpenBLAS's AVX-512 kernel (2048 x 512 x
 * 2048: 22.1 against 20.0 ms) but wins 1.8 times over the AVX2 kernel that
 * OPENBLAS_CORETYPE=Haswell forces (21.3 against 39.6 ms), so those go by the kernel OpenBLAS
 * runs. Below 2^19 multiply-adds oneDNN's fixed cost per call (memory objects, the table) is a
 * few microseconds, as much as the product (64 x 10 x 512: 5 against 3 microseconds). */
#define DNNL_MIN_MACS (1LL << 19)

typedef struct {
  int64_t M, N, K, lda, ldb, ldc;
  float alpha, beta;
  int ta, tb, nthreads, bf16;
} gemm_key;

typedef struct {
  gemm_key key;
  bool used;
  dnnl_primitive_t prim; /* NULL: this shape is OpenBLAS's */
  dnnl_memory_desc_t a, b, c;
} gemm_entry;

enum { GEMM_TABLE = 128 };
static gemm_entry g_table[GEMM_TABLE];
static int g_next; /* the slot the next new shape takes once the table is full */
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;

static bool key_eq(const gemm_key *a, const gemm_key *b) { return !memcmp(a, b, sizeof *a); }

/* dims rows x cols of type t, stored row-major with leading dimension ld, or transposed. */
static dnnl_status_t typed_md(dnnl_memory_desc_t *md, int64_t rows, int64_t cols, int64_t ld,
                              bool trans, dnnl_data_type_t t) {
  dnnl_dims_t dims = {rows, cols};
  dnnl_dims_t strides = {trans ? 1 : ld, trans ? ld : 1};
  return dnnl_memory_desc_init_by_strides(md, 2, dims, t, strides);
}
static dnnl_status_t plain_md(dnnl_memory_desc_t *md, int64_t rows, int64_t cols, int64_t ld,
                              bool trans) {
  return typed_md(md, rows, cols, ld, trans, dnnl_f32);
}

/* The matmul C = alpha A B + beta C of these descriptors, or NULL where oneDNN has only its
 * reference kernel for them (far slower than OpenBLAS, and in bf16 an emulation) or none. */
static dnnl_primitive_t matmul_make(const dnnl_memory_desc_t *a, const dnnl_memory_desc_t *b,
                                    const dnnl_memory_desc_t *c, float alpha, float beta,
                                    dnnl_engine_t eng) {
  dnnl_matmul_desc_t md;
  if (dnnl_matmul_desc_init(&md, a, b, NULL, c) != dnnl_success) return NULL;
  dnnl_primitive_attr_t attr = NULL;
  dnnl_post_ops_t po = NULL;
  bool ok = dnnl_primitive_attr_create(&attr) == dnnl_success;
  if (ok && alpha != 1.0f)
    ok = dnnl_primitive_attr_set_output_scales(attr, 1, 0, &alpha) == dnnl_success;
  if (ok && beta != 0.0f) {
    ok = dnnl_post_ops_create(&po) == dnnl_success &&
         dnnl_post_ops_append_sum(po, beta) == dnnl_success &&
         dnnl_primitive_attr_set_post_ops(attr, po) == dnnl_success;
    if (po) dnnl_post_ops_destroy(po);
  }
  dnnl_primitive_desc_t pd = NULL;
  if (ok) ok = dnnl_primitive_desc_create(&pd, &md, attr, eng, NULL) == dnnl_success;
  if (attr) dnnl_primitive_attr_destroy(attr);
  if (!ok) return NULL;
  const char *impl = "";
  dnnl_primitive_t prim = NULL;
  dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl);
  if (impl && strncmp(impl, "ref", 3) && dnnl_primitive_create(&prim, pd) != dnnl_success)
    prim = NULL;
  dnnl_primitive_desc_destroy(pd);
  return prim;
}

/* Runs prim on A, B and C as the descriptors a, b, c lay them out: -1 when its memory objects
 * could not be made (nothing ran), else 0, or 1 where oneDNN reported a failure once running. */
static int matmul_run(dnnl_primitive_t prim, const dnnl_memory_desc_t *a,
                      const dnnl_memory_desc_t *b, const dnnl_memory_desc_t *c,
                      dnnl_engine_t eng, dnnl_stream_t stream, const void *A, const void *B,
                      void *C) {
  int rc = -1;
  dnnl_memory_t ma = NULL, mb = NULL, mc = NULL;
  if (dnnl_memory_create(&ma, a, eng, (void *)A) == dnnl_success &&
      dnnl_memory_create(&mb, b, eng, (void *)B) == dnnl_success &&
      dnnl_memory_create(&mc, c, eng, C) == dnnl_success) {
    dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, ma}, {DNNL_ARG_WEIGHTS, mb}, {DNNL_ARG_DST, mc}};
    rc = dnnl_primitive_execute(prim, stream, 3, args) == dnnl_success &&
                 dnnl_stream_wait(stream) == dnnl_success
             ? 0
             : 1;
  }
  if (ma) dnnl_memory_destroy(ma);
  if (mb) dnnl_memory_destroy(mb);
  if (mc) dnnl_memory_destroy(mc);
  return rc;
}

/* The matmul of one shape; e->prim stays NULL when oneDNN has no fast kernel for it. */
static void entry_make(gemm_entry *e, dnnl_engine_t eng) {
  const gemm_key *k = &e->key;
  e->prim = NULL;
  const dnnl_data_type_t in_t = k->bf16 ? dnnl_bf16 : dnnl_f32;
  if (typed_md(&e->a, k->M, k->K, k->lda, k->ta, in_t) ||
      typed_md(&e->b, k->K, k->N, k->ldb, k->tb, in_t) ||
      plain_md(&e->c, k->M, k->N, k->ldc, false))
    return;
  e->prim = matmul_make(&e->a, &e->b, &e->c, k->alpha, k->beta, eng);
}

/* The table's entry for the key, made on first sight. Under g_lock. */
static gemm_entry *entry_for(const gemm_key *k, dnnl_engine_t eng) {
  for (int i = 0; i < GEMM_TABLE; i++)
    if (g_table[i].used && key_eq(&g_table[i].key, k)) return &g_table[i];
  gemm_entry *e = NULL;
  for (int i = 0; i < GEMM_TABLE && !e; i++)
    if (!g_table[i].used) e = &g_table[i];
  if (!e) { /* full: a net with this many shapes is unusual; reuse slots in turn */
    e = &g_table[g_next];
    g_next = (g_next + 1) % GEMM_TABLE;
    if (e->prim) dnnl_primitive_destroy(e->prim);
  }
  memset(e, 0, sizeof *e);
  e->key = *k;
  e->used = true;
  entry_make(e, eng);
  return e;
}

/* The bf16 operands of the product running under g_lock (grown, never shrunk: the largest
 * product's, as oneDNN keeps its own scratch). */
static uint16_t *g_bf16;
static size_t g_bf16_cap;

/* rows x cols of x (ld apart) rounded into y, cols apart. */
static void round_rows(uint16_t *y, const float *x, int64_t rows, int64_t cols, int64_t ld) {
  const int nt = rows * cols >= KILN_PARALLEL_FROM ? omp_get_max_threads() : 1;
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
  for (int64_t r = 0; r < rows; r++) kiln_bf16_from_f32(y + r * cols, x + r * ld, cols);
}

bool kiln_sgemm_bf16(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                     const float *A, int64_t lda, const float *B, int64_t ldb, float beta,
                     float *C, int64_t ldc) {
  if (M <= 0 || N <= 0 || K <= 0) return false;
  dnnl_engine_t eng;
  dnnl_stream_t stream;
  if (kiln_dnnl_runtime(&eng, &stream) != dnnl_success) return false;
  /* the operands as they lie: rows x cols, rounded into rows of cols */
  const int64_t ar = ta ? K : M, ac = ta ? M : K, br = tb ? N : K, bc = tb ? K : N;
  gemm_key k;
  memset(&k, 0, sizeof k);
  k.M = M, k.N = N, k.K = K, k.lda = ac, k.ldb = bc, k.ldc = ldc;
  k.alpha = alpha, k.beta = beta, k.ta = ta, k.tb = tb, k.nthreads = omp_get_max_threads();
  k.bf16 = 1;
  pthread_mutex_lock(&g_lock);
  gemm_entry *e = entry_for(&k, eng);
  bool done = false;
  const size_t need = (size_t)(ar * ac + br * bc) + 32;
  if (e->prim && need > g_bf16_cap) {
    free(g_bf16);
    g_bf16 = aligned_alloc(64, (need * sizeof *g_bf16 + 63) / 64 * 64);
    g_bf16_cap = g_bf16 ? need : 0;
  }
  uint16_t *a16 = g_bf16, *b16 = g_bf16 ? g_bf16 + (ar * ac + 31) / 32 * 32 : NULL;
  if (e->prim && g_bf16) {
    round_rows(a16, A, ar, ac, lda);
    round_rows(b16, B, br, bc, ldb);
    /* once running, the call is oneDNN's, as kiln_sgemm_onednn's */
    done = matmul_run(e->prim, &e->a, &e->b, &e->c, eng, stream, a16, b16, C) >= 0;
  }
  pthread_mutex_unlock(&g_lock);
  return done;
}

/* Batched bf16 products (attention's), one primitive per shape and strides, kept as the GEMMs'. */
typedef struct {
  int64_t dims[5], bs[4], cs[4];
  float alpha;
} bmm_key;
typedef struct {
  bmm_key key;
  bool used;
  dnnl_primitive_t prim; /* NULL: no JIT kernel for it */
  dnnl_memory_desc_t a, b, c;
} bmm_entry;
enum { BMM_TABLE = 32 };
static bmm_entry g_bmm[BMM_TABLE];
static int g_bmm_next;

static void bmm_make(bmm_entry *e, dnnl_engine_t eng) {
  const bmm_key *k = &e->key;
  const int64_t B0 = k->dims[0], B1 = k->dims[1], M = k->dims[2], N = k->dims[3], K = k->dims[4];
  dnnl_dims_t ad = {B0, B1, M, K}, bd = {B0, B1, K, N}, cd = {B0, B1, M, N};
  dnnl_dims_t as = {B1 * M * K, M * K, K, 1};
  dnnl_dims_t bs = {k->bs[0], k->bs[1], k->bs[2], k->bs[3]}, cs = {k->cs[0], k->cs[1], k->cs[2], k->cs[3]};
  e->prim = NULL;
  if (dnnl_memory_desc_init_by_strides(&e->a, 4, ad, dnnl_bf16, as) ||
      dnnl_memory_desc_init_by_strides(&e->b, 4, bd, dnnl_bf16, bs) ||
      dnnl_memory_desc_init_by_strides(&e->c, 4, cd, dnnl_f32, cs))
    return;
  e->prim = matmul_make(&e->a, &e->b, &e->c, k->alpha, 0.0f, eng);
}

bool kiln_bmm_bf16(int64_t B0, int64_t B1, int64_t M, int64_t N, int64_t K, float alpha,
                   const uint16_t *A, const uint16_t *B, const int64_t bs[4], float *C,
                   const int64_t cs[4]) {
  if (B0 <= 0 || B1 <= 0 || M <= 0 || N <= 0 || K <= 0) return false;
  dnnl_engine_t eng;
  dnnl_stream_t stream;
  if (kiln_dnnl_runtime(&eng, &stream) != dnnl_success) return false;
  bmm_key k;
  memset(&k, 0, sizeof k);
  const int64_t dims[5] = {B0, B1, M, N, K};
  memcpy(k.dims, dims, sizeof dims);
  memcpy(k.bs, bs, sizeof k.bs);
  memcpy(k.cs, cs, sizeof k.cs);
  k.alpha = alpha;
  pthread_mutex_lock(&g_lock);
  bmm_entry *e = NULL;
  for (int i = 0; i < BMM_TABLE && !e; i++)
    if (g_bmm[i].used && !memcmp(&g_bmm[i].key, &k, sizeof k)) e = &g_bmm[i];
  if (!e) {
    for (int i = 0; i < BMM_TABLE && !e; i++)
      if (!g_bmm[i].used) e = &g_bmm[i];
    if (!e) {
      e = &g_bmm[g_bmm_next];
      g_bmm_next = (g_bmm_next + 1) % BMM_TABLE;
      if (e->prim) dnnl_primitive_destroy(e->prim);
    }
    memset(e, 0, sizeof *e);
    e->key = k;
    e->used = true;
    bmm_make(e, eng);
  }
  /* C is written whole (no beta): after a failed run the fp32 kernel may redo it */
  const bool done = e->prim && matmul_run(e->prim, &e->a, &e->b, &e->c, eng, stream, A, B, C) == 0;
  pthread_mutex_unlock(&g_lock);
  return done;
}

bool kiln_sgemm_onednn(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                       const float *A, int64_t lda, const float *B, int64_t ldb, float beta,
                       float *C, int64_t ldc) {
  if (M <= 0 || N <= 0 || K <= 0) return false;
  dnnl_engine_t eng;
  dnnl_stream_t stream;
  if (kiln_dnnl_runtime(&eng, &stream) != dnnl_success) return false;
  gemm_key k;
  memset(&k, 0, sizeof k); /* padding too: keys compare bytewise */
  k.M = M, k.N = N, k.K = K, k.lda = lda, k.ldb = ldb, k.ldc = ldc;
  k.alpha = alpha, k.beta = beta, k.ta = ta, k.tb = tb, k.nthreads = omp_get_max_threads();
  pthread_mutex_lock(&g_lock);
  gemm_entry *e = entry_for(&k, eng);
  /* Once executing, the call is oneDNN's: a second run through OpenBLAS could add twice. */
  const bool done = e->prim && matmul_run(e->prim, &e->a, &e->b, &e->c, eng, stream, A, B, C) >= 0;
  pthread_mutex_unlock(&g_lock);
  return done;
}

/* Whether OpenBLAS runs one of its AVX-512 kernels (its core name, e.g. "SkylakeX"), and whether
 * it runs a kernel without AVX on a CPU with AVX2: an OpenBLAS that does not know the CPU's model
 * falls back to its SSE3 kernel ("Prescott"; Debian 12's 0.3.21 on Intel's family 6 model 207),
 * which oneDNN, choosing by the CPU's features, beats at every size (kiln-gemm-routes, 1
 * thread: 64 x 64 x 64 in 0.006 against 0.023 ms, 64 x 10 x 512 in 0.012 against 0.046). Then
 * every product outside a parallel region goes to oneDNN. */
static bool g_blas_avx512, g_blas_narrow;
static pthread_once_t g_blas_once = PTHREAD_ONCE_INIT;
static void blas_kernel_once(void) {
  const char *name = openblas_get_corename();
  static const char *const wide[] = {"skylakex", "cooperlake", "sapphirerapids"};
  static const char *const narrow[] = {"prescott", "core2", "penryn", "dunnington", "nehalem",
                                       "atom", "barcelona", "opteron", "opteron_sse3"};
  for (size_t i = 0; name && i < sizeof wide / sizeof wide[0]; i++)
    if (!strcasecmp(name, wide[i])) g_blas_avx512 = true;
  for (size_t i = 0; name && i < sizeof narrow / sizeof narrow[0]; i++)
    if (!strcasecmp(name, narrow[i]) && kiln_fma_supported(KILN_FMA_AVX2)) g_blas_narrow = true;
}

static bool use_dnnl(const kiln_config *cfg, bool ta, int64_t M, int64_t N, int64_t K) {
  if (cfg && cfg->engine == KILN_ENGINE_REF) return false;
  if (omp_in_parallel()) return false;
  pthread_once(&g_blas_once, blas_kernel_once);
  if (g_blas_narrow) return true;
  if (ta && g_blas_avx512) return false;
  return M * N * K >= DNNL_MIN_MACS;
}
#endif

#ifndef KILN_HAVE_DNNL
bool kiln_bmm_bf16(int64_t B0, int64_t B1, int64_t M, int64_t N, int64_t K, float alpha,
                   const uint16_t *A, const uint16_t *B, const int64_t bs[4], float *C,
                   const int64_t cs[4]) {
  (void)B0, (void)B1, (void)M, (void)N, (void)K, (void)alpha, (void)A, (void)B, (void)bs;
  (void)C, (void)cs;
  return false;
}
bool kiln_sgemm_bf16(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                     const float *A, int64_t lda, const float *B, int64_t ldb, float beta,
                     float *C, int64_t ldc) {
  (void)ta, (void)tb, (void)M, (void)N, (void)K, (void)alpha, (void)A, (void)lda, (void)B;
  (void)ldb, (void)beta, (void)C, (void)ldc;
  return false;
}
bool kiln_sgemm_onednn(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                       const float *A, int64_t lda, const float *B, int64_t ldb, float beta,
                       float *C, int64_t ldc) {
  (void)ta, (void)tb, (void)M, (void)N, (void)K, (void)alpha, (void)A, (void)lda, (void)B;
  (void)ldb, (void)beta, (void)C, (void)ldc;
  return false;
}
#endif

void kiln_sgemm_blas(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                     const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C,
                     int64_t ldc) {
  if (M <= 0 || N <= 0) return;
  blas(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void kiln_sgemm(const kiln_config *cfg, bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                float alpha, const float *A, int64_t lda, const float *B, int64_t ldb, float beta,
                float *C, int64_t ldc) {
  if (M <= 0 || N <= 0) return;
#ifdef KILN_HAVE_DNNL
  if (K > 0 && use_dnnl(cfg, ta, M, N, K) &&
      kiln_sgemm_onednn(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc))
    return;
#else
  (void)cfg;
#endif
  blas(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

struct kiln_packed_gemm {
  const kiln_config *cfg;
  bool tb, bf16;
  uint16_t *a16; /* bf16: A rounded for the run (M x K) */
  int64_t M, N, K, lda, ldb, ldc;
  float beta;
  int nthreads;
  const float *B; /* the OpenBLAS route's operand, as last set */
#ifdef KILN_HAVE_DNNL
  dnnl_primitive_t mm, pack; /* NULL mm: the OpenBLAS route */
  dnnl_memory_t m_a, m_b, m_packed, m_c;
  dnnl_stream_t stream;
#endif
};

#ifdef KILN_HAVE_DNNL
static void pg_dnnl_free(kiln_packed_gemm *p) {
  if (p->mm) dnnl_primitive_destroy(p->mm);
  if (p->pack) dnnl_primitive_destroy(p->pack);
  dnnl_memory_t *m[] = {&p->m_a, &p->m_b, &p->m_packed, &p->m_c};
  for (int i = 0; i < 4; i++)
    if (*m[i]) dnnl_memory_destroy(*m[i]);
  p->mm = p->pack = NULL;
  p->m_a = p->m_b = p->m_packed = p->m_c = NULL;
  free(p->a16);
  p->a16 = NULL;
}

/* The matmul with B in the layout oneDNN picks ("any") and the reorder that packs a plain B into
 * it; on any failure the product stays on the OpenBLAS route. */
static void pg_dnnl_make(kiln_packed_gemm *p) {
  dnnl_engine_t eng;
  if (kiln_dnnl_runtime(&eng, &p->stream) != dnnl_success) return;
  dnnl_memory_desc_t a, b, c, b_any;
  dnnl_dims_t b_dims = {p->K, p->N};
  const dnnl_data_type_t in_t = p->bf16 ? dnnl_bf16 : dnnl_f32;
  if (p->bf16 && !(p->a16 = aligned_alloc(64, ((size_t)(p->M * p->K) * 2 + 63) / 64 * 64)))
    return;
  if (typed_md(&a, p->M, p->K, p->bf16 ? p->K : p->lda, false, in_t) ||
      plain_md(&b, p->K, p->N, p->ldb, p->tb) || plain_md(&c, p->M, p->N, p->ldc, false) ||
      dnnl_memory_desc_init_by_tag(&b_any, 2, b_dims, in_t, dnnl_format_tag_any))
    return;
  dnnl_matmul_desc_t md;
  if (dnnl_matmul_desc_init(&md, &a, &b_any, NULL, &c) != dnnl_success) return;
  dnnl_primitive_attr_t attr = NULL;
  dnnl_post_ops_t po = NULL;
  bool ok = dnnl_primitive_attr_create(&attr) == dnnl_success;
  if (ok && p->beta != 0.0f) {
    ok = dnnl_post_ops_create(&po) == dnnl_success &&
         dnnl_post_ops_append_sum(po, p->beta) == dnnl_success &&
         dnnl_primitive_attr_set_post_ops(attr, po) == dnnl_success;
    if (po) dnnl_post_ops_destroy(po);
  }
  dnnl_primitive_desc_t pd = NULL, rpd = NULL;
  if (ok) ok = dnnl_primitive_desc_create(&pd, &md, attr, eng, NULL) == dnnl_success;
  if (attr) dnnl_primitive_attr_destroy(attr);
  if (!ok) return;
  const char *impl = "";
  dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl);
  const dnnl_memory_desc_t *packed = dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
  ok = impl && strncmp(impl, "ref", 3) && packed &&
       dnnl_primitive_create(&p->mm, pd) == dnnl_success &&
       dnnl_reorder_primitive_desc_create(&rpd, &b, eng, packed, eng, NULL) == dnnl_success &&
       dnnl_primitive_create(&p->pack, rpd) == dnnl_success &&
       dnnl_memory_create(&p->m_a, &a, eng, DNNL_MEMORY_NONE) == dnnl_success &&
       dnnl_memory_create(&p->m_b, &b, eng, DNNL_MEMORY_NONE) == dnnl_success &&
       dnnl_memory_create(&p->m_c, &c, eng, DNNL_MEMORY_NONE) == dnnl_success &&
       dnnl_memory_create(&p->m_packed, packed, eng, DNNL_MEMORY_ALLOCATE) == dnnl_success;
  if (rpd) dnnl_primitive_desc_destroy(rpd);
  dnnl_primitive_desc_destroy(pd);
  if (!ok) pg_dnnl_free(p);
}
#endif

static int pg_update(kiln_packed_gemm **pg, const kiln_config *cfg, bool tb, int64_t M,
                     int64_t N, int64_t K, int64_t lda, int64_t ldb, float beta, int64_t ldc,
                     bool bf16) {
  kiln_packed_gemm *p = *pg;
  const int nthreads = omp_get_max_threads();
  if (p && p->cfg == cfg && p->tb == tb && p->bf16 == bf16 && p->M == M && p->N == N && p->K == K &&
      p->lda == lda && p->ldb == ldb && p->beta == beta && p->ldc == ldc &&
      p->nthreads == nthreads)
    return KILN_OK;
  kiln_packed_gemm_destroy(p);
  *pg = p = calloc(1, sizeof *p);
  if (!p) return kiln_errorf(KILN_ERR_NOMEM, "out of memory for a packed GEMM");
  p->cfg = cfg, p->tb = tb, p->M = M, p->N = N, p->K = K, p->lda = lda, p->ldb = ldb;
  p->beta = beta, p->ldc = ldc, p->nthreads = nthreads, p->bf16 = bf16;
#ifdef KILN_HAVE_DNNL
  if (M > 0 && N > 0 && K > 0 &&
      (bf16 ? !omp_in_parallel() && M * N * K >= KILN_BF16_MIN_MACS : use_dnnl(cfg, false, M, N, K)))
    pg_dnnl_make(p);
#endif
  return KILN_OK;
}

int kiln_packed_gemm_update(kiln_packed_gemm **pg, const kiln_config *cfg, bool tb, int64_t M,
                            int64_t N, int64_t K, int64_t lda, int64_t ldb, float beta,
                            int64_t ldc) {
  return pg_update(pg, cfg, tb, M, N, K, lda, ldb, beta, ldc, false);
}

int kiln_packed_gemm_update_bf16(kiln_packed_gemm **pg, const kiln_config *cfg, bool tb,
                                 int64_t M, int64_t N, int64_t K, int64_t lda, int64_t ldb,
                                 float beta, int64_t ldc) {
  return pg_update(pg, cfg, tb, M, N, K, lda, ldb, beta, ldc, true);
}

void kiln_packed_gemm_set_b(kiln_packed_gemm *p, const float *B) {
  p->B = B;
#ifdef KILN_HAVE_DNNL
  if (p->mm) {
    dnnl_memory_set_data_handle(p->m_b, (void *)B);
    dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, p->m_b}, {DNNL_ARG_TO, p->m_packed}};
    if (dnnl_primitive_execute(p->pack, p->stream, 2, args) != dnnl_success ||
        dnnl_stream_wait(p->stream) != dnnl_success)
      pg_dnnl_free(p); /* not packed: the OpenBLAS route reads B as it lies */
  }
#endif
}

void kiln_packed_gemm_run(kiln_packed_gemm *p, const float *A, float *C) {
#ifdef KILN_HAVE_DNNL
  if (p->mm) {
    if (p->bf16) round_rows(p->a16, A, p->M, p->K, p->lda);
    dnnl_memory_set_data_handle(p->m_a, p->bf16 ? (void *)p->a16 : (void *)A);
    dnnl_memory_set_data_handle(p->m_c, C);
    dnnl_exec_arg_t args[3] = {
        {DNNL_ARG_SRC, p->m_a}, {DNNL_ARG_WEIGHTS, p->m_packed}, {DNNL_ARG_DST, p->m_c}};
    dnnl_primitive_execute(p->mm, p->stream, 3, args);
    dnnl_stream_wait(p->stream);
    return;
  }
#endif
  if (p->M > 0 && p->N > 0)
    blas(false, p->tb, p->M, p->N, p->K, 1.0f, A, p->lda, p->B, p->ldb, p->beta, C, p->ldc);
}

void kiln_packed_gemm_destroy(kiln_packed_gemm *p) {
  if (!p) return;
#ifdef KILN_HAVE_DNNL
  pg_dnnl_free(p);
#endif
  free(p);
}
