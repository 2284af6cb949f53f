/* The FMA peak loops (include/kiln/cpu.h): twelve independent FMA chains a thread, enough in
 * flight to cover the FMA latency on every core kiln has met, in registers only. The kernels
 * carry their own target attributes, so the figures do not depend on the flags the build was
 * made with. */
#include <pthread.h>

#include "kiln/core.h"
#include "kiln/cpu.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#define KILN_HAVE_FMA_LOOPS 1
#endif

enum { CHAINS = 12, INNER = 1000, MAX_THREADS = 256 };

#ifdef KILN_HAVE_FMA_LOOPS
/* The chains' values stay finite: x = x * a + b with a just below 1 converges to b / (1 - a). */
__attribute__((noinline, target("avx2,fma"))) static float run8(long rounds, float seed) {
  const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-6f);
  __m256 x[CHAINS];
  for (int c = 0; c < CHAINS; c++) x[c] = _mm256_set1_ps(seed + (float)c);
  for (long r = 0; r < rounds; r++)
    for (int i = 0; i < INNER; i++)
#pragma GCC unroll 12
      for (int c = 0; c < CHAINS; c++) x[c] = _mm256_fmadd_ps(x[c], a, b);
  float sum = 0;
  for (int c = 0; c < CHAINS; c++) sum += _mm256_cvtss_f32(x[c]);
  return sum;
}

__attribute__((noinline, target("avx512f"))) static float run16(long rounds, float seed) {
  const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-6f);
  __m512 x[CHAINS];
  for (int c = 0; c < CHAINS; c++) x[c] = _mm512_set1_ps(seed + (float)c);
  for (long r = 0; r < rounds; r++)
    for (int i = 0; i < INNER; i++)
#pragma GCC unroll 12
      for (int c = 0; c < CHAINS; c++) x[c] = _mm512_fmadd_ps(x[c], a, b);
  float sum = 0;
  for (int c = 0; c < CHAINS; c++) sum += _mm512_cvtss_f32(x[c]);
  return sum;
}

/* VDPBF16PS: each of 16 fp32 lanes adds two bf16 products, 32 multiply-adds an instruction, the
 * rate bf16 training's products can reach on AVX512-BF16 (twice fp32's where the unit is the
 * same). The sums grow by 2^-14 a step (products of 2^-7 and 2^-7), so they stay finite. */
__attribute__((noinline, target("avx512f,avx512bf16"))) static float run32bf16(long rounds,
                                                                               float seed) {
  const __m512 half = _mm512_set1_ps(0.0078125f);
  const __m512bh a = _mm512_cvtne2ps_pbh(half, half);
  __m512 x[CHAINS];
  for (int c = 0; c < CHAINS; c++) x[c] = _mm512_set1_ps(seed + (float)c);
  for (long r = 0; r < rounds; r++)
    for (int i = 0; i < INNER; i++)
#pragma GCC unroll 12
      for (int c = 0; c < CHAINS; c++) x[c] = _mm512_dpbf16_ps(x[c], a, a);
  float sum = 0;
  for (int c = 0; c < CHAINS; c++) sum += _mm512_cvtss_f32(x[c]);
  return sum;
}
#endif

bool kiln_amx_bf16_supported(void) {
#if defined(__x86_64__)
  unsigned a, b, c, d;
  return __get_cpuid_count(7, 0, &a, &b, &c, &d) && (d >> 22 & 1u);
#else
  return false;
#endif
}

bool kiln_fma_supported(int lanes) {
#ifdef KILN_HAVE_FMA_LOOPS
  __builtin_cpu_init();
  if (lanes == KILN_FMA_AVX2)
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (lanes == KILN_FMA_AVX512) return __builtin_cpu_supports("avx512f");
  if (lanes == KILN_FMA_AVX512_BF16)
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bf16");
#endif
  (void)lanes;
  return false;
}

/* The sum of the chains' ends is kept where the compiler cannot see it unused. */
static volatile float sink;

static float run(int lanes, long rounds, float seed) {
#ifdef KILN_HAVE_FMA_LOOPS
  return lanes == KILN_FMA_AVX512_BF16 ? run32bf16(rounds, seed)
         : lanes == KILN_FMA_AVX512    ? run16(rounds, seed)
                                       : run8(rounds, seed);
#else
  (void)lanes, (void)rounds;
  return seed;
#endif
}

long kiln_fma_calibrate(int lanes, double seconds) {
  if (!kiln_fma_supported(lanes) || !(seconds > 0)) return 0;
  long rounds = 100;
  /* grow the trial until it is long enough to time (a millisecond or more) */
  for (;;) {
    const double t0 = kiln_now_ms();
    sink += run(lanes, rounds, 0.0f);
    const double ms = kiln_now_ms() - t0;
    if (ms >= 1.0 || rounds > (1L << 40)) {
      const double want = rounds * seconds * 1e3 / (ms > 0 ? ms : 1e-3);
      return want < 1 ? 1 : want > 1e12 ? (long)1e12 : (long)want;
    }
    rounds *= 8;
  }
}

/* The threads of one measurement start together: each waits at the gate until every one of
 * them exists (or until the measurement is called off because one could not be started). */
typedef struct {
  pthread_mutex_t lock;
  pthread_cond_t opened;
  int state; /* 0 closed, 1 open, -1 called off */
} gate;

typedef struct {
  int lanes;
  long rounds;
  gate *start;
  float out;
} job;

static void *worker(void *arg) {
  job *j = arg;
  pthread_mutex_lock(&j->start->lock);
  while (j->start->state == 0) pthread_cond_wait(&j->start->opened, &j->start->lock);
  const int state = j->start->state;
  pthread_mutex_unlock(&j->start->lock);
  if (state > 0) j->out = run(j->lanes, j->rounds, 1.0f);
  return NULL;
}

static void gate_set(gate *g, int state) {
  pthread_mutex_lock(&g->lock);
  g->state = state;
  pthread_cond_broadcast(&g->opened);
  pthread_mutex_unlock(&g->lock);
}

double kiln_fma_gflops(int lanes, int threads, long rounds, int reps) {
  if (!kiln_fma_supported(lanes) || threads < 1 || threads > MAX_THREADS || rounds < 1)
    return 0;
  double best = 0;
  for (int rep = 0; rep < (reps > 0 ? reps : 1); rep++) {
    pthread_t t[MAX_THREADS];
    job jobs[MAX_THREADS];
    gate start = {.lock = PTHREAD_MUTEX_INITIALIZER, .opened = PTHREAD_COND_INITIALIZER};
    int made = 0;
    for (; made < threads; made++) {
      jobs[made] = (job){.lanes = lanes, .rounds = rounds, .start = &start};
      if (pthread_create(&t[made], NULL, worker, &jobs[made]) != 0) break;
    }
    const double t0 = kiln_now_ms();
    gate_set(&start, made < threads ? -1 : 1);
    for (int i = 0; i < made; i++) pthread_join(t[i], NULL);
    const double ms = kiln_now_ms() - t0;
    if (made < threads) return 0;
    for (int i = 0; i < threads; i++) sink += jobs[i].out;
    /* 2 FLOPs (multiply and add) per lane per FMA; a bf16 "lane" is one product of a pair */
    const double gflops =
        2.0 * lanes * CHAINS * INNER * (double)rounds * threads / ((ms > 0 ? ms : 1e-3) * 1e6);
    if (gflops > best) best = gflops;
  }
  return best;
}
