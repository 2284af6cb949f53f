/* Data-parallel pieces that run without MPI: the local communicator and the NULL (one process)
 * front end, the fixed-order sum, --sync parsing and checking, MODEL and TIME steps, the batch
 * stream against a batch-by-batch walk of WRAP / DROP / KEEP, and the solver driven by a fake
 * two-rank communicator (the configuration check names the rank that differs; parameters are
 * broadcast before the first step; the gradient sum is divided once by workers x passes; only
 * rank 0 emits events). Real MPI runs are in tests/cli/mpi_gradient.sh. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <ftw.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kiln/data.h"
#include "kiln/parallel.h"
#include "kiln/solver.h"
/* The private state, for the worker synchronisation's own: model averages counted, buckets
 * planned, the gradients' memory. */
#include "solver/solver_internal.h"

static void assert_contains(const char *hay, const char *needle) {
  if (!strstr(hay, needle)) fprintf(stderr, "'%s' does not contain '%s'\n", hay, needle);
  assert_non_null(strstr(hay, needle));
}

/* ---- communicators ------------------------------------------------------------------------- */

static void test_local_comm(void **state) {
  (void)state;
  kiln_comm *c;
  assert_int_equal(kiln_comm_local_create(&c), KILN_OK);
  assert_string_equal(c->ops->name, "local");
  assert_int_equal(kiln_comm_rank(c), 0);
  assert_int_equal(kiln_comm_size(c), 1);
  assert_int_equal(kiln_comm_barrier(c), KILN_OK);
  float buf[5] = {1, -2, 3.5f, 1e-30f, 7};
  const float want[5] = {1, -2, 3.5f, 1e-30f, 7};
  assert_int_equal(kiln_comm_broadcast(c, buf, 5, 0), KILN_OK);
  assert_int_equal(kiln_comm_allreduce_sum(c, buf, 5, false), KILN_OK);
  assert_int_equal(kiln_comm_allreduce_sum(c, buf, 5, true), KILN_OK);
  /* through the table too, not only the front end's shortcut for one rank */
  assert_int_equal(c->ops->allreduce_sum(c, buf, 5), KILN_OK);
  assert_int_equal(c->ops->allreduce_sum_ordered(c, buf, 5), KILN_OK);
  assert_int_equal(c->ops->broadcast(c, buf, 5, 0), KILN_OK);
  assert_memory_equal(buf, want, sizeof want);
  char got[8] = "";
  assert_int_equal(kiln_comm_allgather(c, "abcdefg", 8, got), KILN_OK);
  assert_string_equal(got, "abcdefg");
  memset(got, 0, sizeof got);
  assert_int_equal(c->ops->allgather(c, "xyz", 4, got), KILN_OK);
  assert_string_equal(got, "xyz");
  assert_int_equal(kiln_comm_broadcast(c, buf, 5, 3), KILN_OK); /* one rank: nothing to send */
  /* The watchdog's limit is checked and kept (one process never waits on it); 0 is no limit. */
  assert_int_equal(kiln_comm_set_timeout(c, 7.5), KILN_OK);
  assert_true(c->timeout_s == 7.5);
  assert_int_equal(kiln_comm_set_timeout(c, 0), KILN_OK);
  assert_true(c->timeout_s == 0);
  const double bad[] = {-1, NAN, INFINITY};
  for (int i = 0; i < 3; i++) {
    assert_int_equal(kiln_comm_set_timeout(c, bad[i]), KILN_ERR_INVALID);
    assert_contains(kiln_last_error(), "expected seconds");
  }
  assert_true(c->timeout_s == 0);
  assert_int_equal(kiln_comm_set_timeout(NULL, 5), KILN_OK);
  kiln_comm_end_job(c, 1); /* one process: returns, the caller exits */
  kiln_comm_free(c);
}

/* ---- options every rank must be given alike (kiln_comm_agree_settings) ---------------------- */

/* A job of `size` ranks played by one process: each rank's call is made in turn while the fake
 * records what it sends ("capture", answering every rank alike), then the call under test gets
 * every rank's record ("replay"). */
typedef struct {
  int size, replay;
  unsigned char sent[4][4096];
} agree_fake;

static int agree_allgather(kiln_comm *c, const void *send, size_t n, void *recv) {
  agree_fake *f = c->impl;
  assert_true(n <= sizeof f->sent[0]);
  for (int r = 0; r < f->size; r++)
    memcpy((unsigned char *)recv + (size_t)r * n, f->replay ? f->sent[r] : send, n);
  if (!f->replay) memcpy(f->sent[c->rank], send, n);
  return KILN_OK;
}

static const kiln_comm_ops agree_ops = {.name = "fake-agree", .allgather = agree_allgather};

/* Ranks 0..size-1 give `values[r]` for the settings `names`; the result of rank 0's call. */
static int agree(int size, const char *const *names, const char *const values[][3], int n) {
  agree_fake f = {.size = size};
  kiln_comm c = {.ops = &agree_ops, .size = size, .impl = &f};
  kiln_comm_setting s[3];
  for (int r = size - 1; r >= 0; r--) { /* capture every rank's record; rank 0's last */
    c.rank = r;
    for (int k = 0; k < n; k++) s[k] = (kiln_comm_setting){names[k], values[r][k]};
    assert_int_equal(kiln_comm_agree_settings(&c, s, n), KILN_OK);
  }
  f.replay = 1;
  return kiln_comm_agree_settings(&c, s, n);
}

static void test_agree_settings(void **state) {
  (void)state;
  const char *names[3] = {"--weights", "--deterministic", "--comm-timeout"};
  const char *const same[2][3] = {{"w.caffemodel", "", "300"}, {"w.caffemodel", "", "300"}};
  assert_int_equal(agree(2, names, same, 3), KILN_OK);
  /* rank 1 alone given weights: named with both values, and the list that must agree */
  const char *const weights[2][3] = {{NULL, NULL, "300"}, {"w.caffemodel", NULL, "300"}};
  assert_int_equal(agree(2, names, weights, 3), KILN_ERR_INVALID);
  assert_contains(kiln_last_error(), "the 2 workers were given different options: --weights is "
                                     "'w.caffemodel' on rank 1 but not given on rank 0; every "
                                     "worker must be given the same --weights, --deterministic "
                                     "and --comm-timeout");
  /* a flag, another value, and a second setting that differs; the first rank that differs */
  const char *const two[3][3] = {{NULL, "", "300"}, {NULL, "", "300"}, {"a", NULL, "60"}};
  assert_int_equal(agree(3, names, two, 3), KILN_ERR_INVALID);
  assert_contains(kiln_last_error(), "--weights is 'a' on rank 2 but not given on rank 0 "
                                     "(--deterministic, --comm-timeout differ too)");
  const char *const flag[3][3] = {{NULL, "", "300"}, {NULL, NULL, "300"}, {NULL, NULL, "300"}};
  assert_int_equal(agree(3, names, flag, 3), KILN_ERR_INVALID);
  assert_contains(kiln_last_error(), "--deterministic is not given on rank 1 (and 1 more rank) "
                                     "but given on rank 0;");
  /* a long value is compared whole (by its digest) and shown shortened */
  static char long_a[3000], long_b[3000];
  memset(long_a, 'x', sizeof long_a - 1);
  memcpy(long_b, long_a, sizeof long_b);
  long_b[1500] = 'y';
  const char *const longs[2][3] = {{long_a, NULL, "1"}, {long_b, NULL, "1"}};
  assert_int_equal(agree(2, names, longs, 3), KILN_ERR_INVALID);
  assert_contains(kiln_last_error(), "--weights is 'xxx");
  assert_contains(kiln_last_error(), "...xxx");
  /* one rank: nothing to compare */
  assert_int_equal(kiln_comm_agree_settings(NULL, NULL, 0), KILN_OK);
}

static void test_null_comm_is_one_process(void **state) {
  (void)state;
  assert_int_equal(kiln_comm_rank(NULL), 0);
  assert_int_equal(kiln_comm_size(NULL), 1);
  assert_int_equal(kiln_comm_barrier(NULL), KILN_OK);
  float x[2] = {1, 2};
  assert_int_equal(kiln_comm_allreduce_sum(NULL, x, 2, true), KILN_OK);
  assert_true(x[0] == 1 && x[1] == 2);
  int a = 42, b = 0;
  assert_int_equal(kiln_comm_allgather(NULL, &a, sizeof a, &b), KILN_OK);
  assert_int_equal(b, 42);
  kiln_comm_end_job(NULL, 1);
  kiln_comm_free(NULL);
  if (!kiln_comm_mpi_built()) {
    kiln_comm *c = (kiln_comm *)1;
    assert_int_equal(kiln_comm_mpi_create(NULL, NULL, NULL, &c), KILN_ERR_UNSUPPORTED);
    assert_null(c);
    assert_contains(kiln_last_error(), "without MPI");
  }
}

static void test_launcher_size(void **state) {
  (void)state;
  const char *vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"};
  char *saved[3];
  for (int i = 0; i < 3; i++) {
    const char *v = getenv(vars[i]);
    saved[i] = v ? strdup(v) : NULL;
    unsetenv(vars[i]);
  }
  kiln_config cfg;
  assert_int_equal(kiln_config_from_env(&cfg), KILN_OK);
  assert_int_equal(cfg.launcher_size, 0);
  setenv("PMI_SIZE", "3", 1);
  assert_int_equal(kiln_config_from_env(&cfg), KILN_OK);
  assert_int_equal(cfg.launcher_size, 3);
  setenv("OMPI_COMM_WORLD_SIZE", "4", 1);
  assert_int_equal(kiln_config_from_env(&cfg), KILN_OK);
  assert_int_equal(cfg.launcher_size, 4);
  for (int i = 0; i < 3; i++) {
    if (saved[i]) setenv(vars[i], saved[i], 1);
    else unsetenv(vars[i]);
    free(saved[i]);
  }
}

/* ((g0 + g1) + g2): float addition is not associative, so the order is part of the result. */
static void test_accumulate_is_in_order(void **state) {
  (void)state;
  const float g[3][3] = {{1e8f, 1.0f, 0.1f}, {1.0f, 1e8f, 0.2f}, {-1e8f, -1e8f, 0.3f}};
  float acc[3];
  memcpy(acc, g[0], sizeof acc);
  kiln_parallel_accumulate(acc, g[1], 3);
  kiln_parallel_accumulate(acc, g[2], 3);
  for (int i = 0; i < 3; i++) {
    volatile float want = g[0][i];
    want = want + g[1][i];
    want = want + g[2][i];
    assert_true(acc[i] == want);
  }
  /* 1e8 + 1 rounds back to 1e8 in float: in this order the 1 is lost, in another it is kept. */
  assert_true(acc[0] == 0.0f);
  volatile float other = g[0][0];
  other = other + g[2][0];
  other = other + g[1][0];
  assert_true(other == 1.0f);
  /* a long run: every element gets exactly one addition */
  enum { N = 1003 };
  float *x = malloc(sizeof(float) * N), *y = malloc(sizeof(float) * N);
  assert_non_null(x);
  assert_non_null(y);
  kiln_rng r;
  kiln_rng_seed(&r, 3, 9);
  for (int i = 0; i < N; i++) x[i] = kiln_rng_gaussian(&r, 0, 1), y[i] = kiln_rng_gaussian(&r, 0, 1e-3f);
  float *z = malloc(sizeof(float) * N);
  assert_non_null(z);
  memcpy(z, x, sizeof(float) * N);
  kiln_parallel_accumulate(z, y, N);
  for (int i = 0; i < N; i++) {
    volatile float s = x[i];
    s = s + y[i];
    assert_true(z[i] == s);
  }
  free(x);
  free(y);
  free(z);
}

/* Every buffer gets ((p0 + p1) + p2) + p3, the accumulate's bits, across several of the
 * kernel's blocks and a short last one. */
static void test_sum_to_all(void **state) {
  (void)state;
  enum { N = 2500, NP = 4 };
  float *p[NP], *want = malloc(sizeof(float) * N);
  assert_non_null(want);
  kiln_rng r;
  kiln_rng_seed(&r, 7, 1);
  for (int k = 0; k < NP; k++) {
    assert_non_null(p[k] = malloc(sizeof(float) * N));
    for (int i = 0; i < N; i++) p[k][i] = kiln_rng_gaussian(&r, 0, k == 0 ? 1e4f : 1);
  }
  memcpy(want, p[0], sizeof(float) * N);
  for (int k = 1; k < NP; k++) kiln_parallel_accumulate(want, p[k], N);
  kiln_parallel_sum_to_all(p, NP, N);
  for (int k = 0; k < NP; k++) assert_memory_equal(p[k], want, sizeof(float) * N);
  for (int k = 0; k < NP; k++) free(p[k]);
  free(want);
}

/* ---- sync settings --------------------------------------------------------------------------- */

static void test_sync_parse_and_check(void **state) {
  (void)state;
  kiln_sync_config c = {.deterministic = true};
  assert_int_equal(kiln_sync_parse("grad", &c), KILN_OK);
  assert_int_equal(c.mode, KILN_SYNC_GRADIENT);
  assert_true(c.deterministic); /* left alone */
  assert_int_equal(kiln_sync_parse("gradient", &c), KILN_OK);
  assert_int_equal(kiln_sync_parse("model:10", &c), KILN_OK);
  assert_int_equal(c.mode, KILN_SYNC_MODEL);
  assert_int_equal(c.interval_iters, 10);
  assert_int_equal(kiln_sync_parse("time:2.5", &c), KILN_OK);
  assert_int_equal(c.mode, KILN_SYNC_TIME);
  assert_true(c.interval_seconds == 2.5);
  assert_int_equal(c.warmup_iters, 0);
  assert_string_equal(kiln_sync_mode_name(KILN_SYNC_TIME), "time");
  assert_int_equal(kiln_sync_parse("model:10:50", &c), KILN_OK);
  assert_int_equal(c.mode, KILN_SYNC_MODEL);
  assert_int_equal(c.interval_iters, 10);
  assert_int_equal(c.warmup_iters, 50);
  assert_int_equal(kiln_sync_parse("time:0.5:7", &c), KILN_OK);
  assert_true(c.interval_seconds == 0.5);
  assert_int_equal(c.warmup_iters, 7);
  const char *bad[] = {"", "grads", "grad:3", "model", "model:", "model:0", "model:x", "time:-1",
                       "time:0", "time:nan", "average", "model:10:", "model:10:-1", "model:10:x",
                       "time:1:2:3", "model:3x", "time:1s"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    kiln_sync_config d = {0};
    if (kiln_sync_parse(bad[i], &d) != KILN_ERR_INVALID) fail_msg("'%s' accepted", bad[i]);
  }
  assert_int_equal(kiln_sync_parse("model", &c), KILN_ERR_INVALID);
  assert_contains(kiln_last_error(), "model:10");
  kiln_sync_config g = {.mode = KILN_SYNC_GRADIENT};
  assert_int_equal(kiln_sync_check(&g, 8), KILN_OK);
  kiln_sync_config m = {.mode = KILN_SYNC_MODEL, .interval_iters = 5, .warmup_iters = 3};
  assert_int_equal(kiln_sync_check(&m, 1), KILN_OK);
  assert_int_equal(kiln_sync_check(&m, 2), KILN_OK);
  /* Local steps only with several workers and past the warm-up. */
  assert_false(kiln_sync_is_local(&m, 1, 10));
  assert_false(kiln_sync_is_local(&m, 2, 2));
  assert_true(kiln_sync_is_local(&m, 2, 3));
  assert_false(kiln_sync_is_local(&g, 2, 10));
  m.warmup_iters = -1;
  assert_int_equal(kiln_sync_check(&m, 2), KILN_ERR_INVALID);
  assert_contains(kiln_last_error(), "warmup_iters");
  m.warmup_iters = 0;
  m.interval_iters = 0;
  assert_int_equal(kiln_sync_check(&m, 2), KILN_ERR_INVALID);
  assert_contains(kiln_last_error(), "interval_iters");
  kiln_sync_config t = {.mode = KILN_SYNC_TIME, .interval_seconds = 1};
  assert_int_equal(kiln_sync_check(&t, 4), KILN_OK);
  assert_true(kiln_sync_is_local(&t, 4, 0));
  t.interval_seconds = 0;
  assert_int_equal(kiln_sync_check(&t, 4), KILN_ERR_INVALID);
  assert_contains(kiln_last_error(), "interval_seconds");
}

/* ---- the batch stream -------------------------------------------------------------------------- */

/* The Data layer's former batch-by-batch rule: from position p, DROP skips to the next epoch
 * when a batch would cross its end, KEEP stops the batch there. */
static uint64_t walk_start(uint64_t p, uint64_t size, int batch, kiln_last_batch lb, int *count) {
  uint64_t i = p % size;
  if (lb == KILN_LAST_BATCH_DROP && i + (uint64_t)batch > size) p += size - i, i = 0;
  *count = batch;
  if (lb == KILN_LAST_BATCH_KEEP && i + (uint64_t)batch > size) *count = (int)(size - i);
  return p;
}

static void test_batch_stream_matches_walk(void **state) {
  (void)state;
  const uint64_t sizes[] = {10, 7, 64, 1};
  const int batches[] = {1, 3, 4, 5, 7, 10, 11};
  const uint64_t bases[] = {0, 3, 7, 10, 15, 29, 64};
  int checked = 0;
  for (size_t a = 0; a < 4; a++)
    for (size_t b = 0; b < 7; b++)
      for (int lb = 0; lb < 3; lb++) {
        uint64_t size = sizes[a];
        int batch = batches[b];
        if (lb == KILN_LAST_BATCH_DROP && (uint64_t)batch > size) continue; /* refused */
        for (size_t c = 0; c < 7; c++) {
          kiln_batch_stream s = {.base = bases[c], .size = size, .batch = batch,
                                 .last_batch = (kiln_last_batch)lb};
          uint64_t p = bases[c];
          for (uint64_t j = 0; j < 50; j++) {
            int want_count, got_count;
            uint64_t want = walk_start(p, size, batch, (kiln_last_batch)lb, &want_count);
            uint64_t got = kiln_batch_stream_start(&s, j, &got_count);
            if (got != want || got_count != want_count)
              fail_msg("size %llu batch %d mode %d base %llu: batch %llu at %llu+%d, walk %llu+%d",
                       (unsigned long long)size, batch, lb, (unsigned long long)bases[c],
                       (unsigned long long)j, (unsigned long long)got, got_count,
                       (unsigned long long)want, want_count);
            assert_true(kiln_batch_stream_end(&s, j) == want + (uint64_t)want_count);
            p = want + (uint64_t)want_count;
            checked++;
          }
        }
      }
  assert_true(checked > 10000);
}

/* ---- the solver with a fake communicator ------------------------------------------------------ */

/* Two ranks that hold the same buffers: sums double them, gathers repeat this rank's bytes; a
 * 32-byte gather (the configuration digest) can be made to differ on the last rank. */
typedef struct {
  int broadcasts, allreduces, ordered, allgathers;
  bool corrupt_digest;
  /* overlapped buckets: what each held when it was started (before the sum) */
  int nbuckets, finishes, ordered_buckets;
  float *bucket_buf[8];
  float *bucket_copy[8];
  int64_t bucket_n[8];
  /* a bucket started while the floats from watch_lo up to it were all still zero: before
   * backward reached the layers they belong to */
  const float *watch_lo;
  int started_early;
  /* bucket_progress calls while a started bucket's sum was in flight and backward had buckets
   * left to start: the sums are pushed on between layers, not only in bucket_finish */
  int progress_mid_backward;
  /* TIME rounds (a gather of `round_bytes`): the last rank reports `round_steps_factor` times
   * this rank's local steps and its data cursor `round_cursor_ahead` records further on */
  size_t round_bytes;
  int round_steps_factor;
  uint64_t round_cursor_ahead;
  /* claim_sum_buffer lends this (NULL: nothing to lend) */
  float *lend;
  int64_t lend_floats, claimed_floats;
  int claims, releases;
} fake_state;

static int fake_barrier(kiln_comm *c) {
  (void)c;
  return KILN_OK;
}
static int fake_broadcast(kiln_comm *c, float *buf, int64_t n, int root) {
  (void)buf, (void)n, (void)root;
  ((fake_state *)c->impl)->broadcasts++;
  return KILN_OK;
}
static int fake_broadcast_bytes(kiln_comm *c, void *buf, size_t n, int root) {
  (void)buf, (void)n, (void)root;
  ((fake_state *)c->impl)->broadcasts++;
  return KILN_OK;
}
static int fake_allreduce(kiln_comm *c, float *buf, int64_t n) {
  ((fake_state *)c->impl)->allreduces++;
  for (int64_t i = 0; i < n; i++) buf[i] *= (float)c->size;
  return KILN_OK;
}
static int fake_ordered(kiln_comm *c, float *buf, int64_t n) {
  ((fake_state *)c->impl)->ordered++;
  for (int64_t i = 0; i < n; i++) buf[i] *= (float)c->size;
  return KILN_OK;
}
static int fake_allgather(kiln_comm *c, const void *send, size_t n, void *recv) {
  fake_state *st = c->impl;
  st->allgathers++;
  for (int r = 0; r < c->size; r++) memcpy((char *)recv + n * (size_t)r, send, n);
  if (st->corrupt_digest && n == 32) ((uint8_t *)recv)[n * (size_t)(c->size - 1)] ^= 1;
  if (st->round_bytes && n == st->round_bytes) { /* steps, then one cursor per data layer */
    uint64_t *last = (uint64_t *)((char *)recv + n * (size_t)(c->size - 1));
    last[0] *= (uint64_t)st->round_steps_factor;
    last[1] += st->round_cursor_ahead;
  }
  return KILN_OK;
}
static int fake_bucket_start(kiln_comm *c, float *buf, int64_t n, bool ordered) {
  fake_state *st = c->impl;
  if (st->nbuckets >= 8) return kiln_errorf(KILN_ERR_INVALID, "too many buckets");
  st->ordered_buckets += ordered;
  int b = st->nbuckets++;
  st->bucket_buf[b] = buf;
  st->bucket_n[b] = n;
  if (st->watch_lo && buf > st->watch_lo) {
    bool zero = true;
    for (const float *p = st->watch_lo; p < buf && zero; p++) zero = *p == 0;
    st->started_early += zero;
  }
  st->bucket_copy[b] = malloc(sizeof(float) * (size_t)n);
  if (!st->bucket_copy[b]) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  memcpy(st->bucket_copy[b], buf, sizeof(float) * (size_t)n);
  for (int64_t i = 0; i < n; i++) buf[i] *= (float)c->size;
  return KILN_OK;
}
static int fake_bucket_progress(kiln_comm *c) {
  fake_state *st = c->impl;
  st->progress_mid_backward += st->nbuckets > 0 && st->finishes == 0 && st->watch_lo &&
                               st->bucket_buf[st->nbuckets - 1] > st->watch_lo;
  return KILN_OK;
}
static int fake_bucket_finish(kiln_comm *c) {
  ((fake_state *)c->impl)->finishes++;
  return KILN_OK;
}
static const kiln_comm_ops fake_bucket_ops = {
    .name = "fake-buckets", .barrier = fake_barrier, .broadcast = fake_broadcast,
    .broadcast_bytes = fake_broadcast_bytes,
    .allreduce_sum = fake_allreduce, .allreduce_sum_ordered = fake_ordered,
    .allgather = fake_allgather, .bucket_start = fake_bucket_start,
    .bucket_progress = fake_bucket_progress, .bucket_finish = fake_bucket_finish,
};
static float *fake_claim(kiln_comm *c, int64_t n) {
  fake_state *st = c->impl;
  st->claims++;
  st->claimed_floats = n;
  return n <= st->lend_floats ? st->lend : NULL;
}
static void fake_release(kiln_comm *c, float *buf) {
  fake_state *st = c->impl;
  assert_ptr_equal(buf, st->lend);
  st->releases++;
}
static const kiln_comm_ops fake_lend_ops = {
    .name = "fake-lend", .barrier = fake_barrier, .broadcast = fake_broadcast,
    .broadcast_bytes = fake_broadcast_bytes,
    .allreduce_sum = fake_allreduce, .allreduce_sum_ordered = fake_ordered,
    .allgather = fake_allgather, .claim_sum_buffer = fake_claim, .release_sum_buffer = fake_release,
};
static const kiln_comm_ops fake_ops = {
    .name = "fake", .barrier = fake_barrier, .broadcast = fake_broadcast,
    .broadcast_bytes = fake_broadcast_bytes,
    .allreduce_sum = fake_allreduce, .allreduce_sum_ordered = fake_ordered,
    .allgather = fake_allgather,
};

static char dir[64], lmdb[128], solver_path[160], net_path[160];

/* `path` (in the fixture's directory) holds `text` */
static void write_text(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  assert_true(fputs(text, f) >= 0);
  assert_int_equal(fclose(f), 0);
}

static int make_fixture(void **state) {
  (void)state;
  kiln_log_set_level(KILN_LOG_WARN);
  snprintf(dir, sizeof dir, "/tmp/kiln-test-dist-XXXXXX");
  if (!mkdtemp(dir)) return -1;
  snprintf(lmdb, sizeof lmdb, "%s/lmdb", dir);
  kiln_datum_writer *w;
  if (kiln_datum_writer_open(lmdb, &w)) return -1;
  kiln_rng r;
  kiln_rng_seed(&r, 5, 5);
  for (int i = 0; i < 32; i++) {
    uint8_t px[16];
    for (int k = 0; k < 16; k++) px[k] = (uint8_t)kiln_rng_below(&r, 256);
    char key[16];
    snprintf(key, sizeof key, "%08d", i);
    kiln_datum d = {.channels = 1, .height = 4, .width = 4, .label = i % 3, .u8 = px};
    if (kiln_datum_writer_put(w, key, &d)) return -1;
  }
  if (kiln_datum_writer_commit(w)) return -1;
  snprintf(net_path, sizeof net_path, "%s/net.prototxt", dir);
  snprintf(solver_path, sizeof solver_path, "%s/solver.prototxt", dir);
  FILE *f = fopen(net_path, "w");
  if (!f) return -1;
  fprintf(f,
          "layer { name: 'd' type: 'Data' top: 'data' top: 'label'\n"
          "  data_param { source: '%s' batch_size: 4 backend: LMDB }\n"
          "  transform_param { scale: 0.00390625 } }\n"
          "layer { name: 'ip' type: 'InnerProduct' bottom: 'data' top: 'ip'\n"
          "  inner_product_param { num_output: 3 weight_filler { type: 'xavier' } } }\n"
          "layer { name: 'loss' type: 'SoftmaxWithLoss' bottom: 'ip' bottom: 'label' top: 'loss' }\n",
          lmdb);
  fclose(f);
  f = fopen(solver_path, "w");
  if (!f) return -1;
  fprintf(f, "net: 'net.prototxt'\nbase_lr: 0.1\nlr_policy: 'fixed'\nmomentum: 0.9\n"
             "weight_decay: 0.01\nmax_iter: 4\ndisplay: 1\nrandom_seed: 3\nsnapshot_after_train: false\n");
  fclose(f);
  return 0;
}

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
  (void)st, (void)flag, (void)ftw;
  return remove(path);
}

static int remove_fixture(void **state) {
  (void)state;
  return nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

static void count_events(const kiln_event *e, void *user) {
  (void)e;
  (*(int *)user)++;
}

static void test_solver_config_mismatch_names_the_rank(void **state) {
  (void)state;
  fake_state st = {.corrupt_digest = true};
  kiln_comm c = {.ops = &fake_ops, .rank = 0, .size = 3, .impl = &st};
  kiln_solver_options o = {.comm = &c};
  kiln_solver *s = NULL;
  assert_int_equal(kiln_solver_create(solver_path, &o, &s), KILN_ERR_COMM);
  assert_null(s);
  assert_contains(kiln_last_error(), "the 3 workers disagree on the solver and train net");
  assert_contains(kiln_last_error(), "rank 2 differs from rank 0");
  assert_int_equal(st.allgathers, 1);
  /* A mode without its interval is refused before anything is built. */
  fake_state st2 = {0};
  kiln_comm c2 = {.ops = &fake_ops, .rank = 0, .size = 2, .impl = &st2};
  kiln_solver_options o2 = {.comm = &c2, .sync = {.mode = KILN_SYNC_TIME}};
  assert_int_equal(kiln_solver_create(solver_path, &o2, &s), KILN_ERR_INVALID);
  assert_contains(kiln_last_error(), "solver.prototxt: sync mode TIME needs interval_seconds > 0");
  assert_int_equal(st2.allgathers, 0);
}

/* Rank 0 of two identical twins: the sum is twice the gradient and the update divides by two, so
 * the first step equals one worker's on the same batch, bit for bit. */
static void test_solver_twin_workers(void **state) {
  (void)state;
  for (int det = 0; det < 2; det++) {
    fake_state st = {0};
    kiln_comm c = {.ops = &fake_ops, .rank = 0, .size = 2, .impl = &st};
    int events = 0, single_events = 0;
    kiln_solver_options o = {.comm = &c, .sync = {.deterministic = det}, .on_event = count_events,
                             .user = &events};
    kiln_solver_options o1 = {.on_event = count_events, .user = &single_events};
    kiln_solver *s, *one;
    assert_int_equal(kiln_solver_create(solver_path, &o, &s), KILN_OK);
    assert_int_equal(kiln_solver_create(solver_path, &o1, &one), KILN_OK);
    assert_int_equal(kiln_solver_nworkers(s), 2);
    assert_int_equal(kiln_solver_sync(s)->mode, KILN_SYNC_GRADIENT);
    assert_int_equal(kiln_solver_sync(s)->deterministic, det);
    assert_memory_equal(kiln_solver_net(s)->param_data, kiln_solver_net(one)->param_data,
                        sizeof(float) * (size_t)kiln_solver_net(one)->nparam_floats);
    assert_int_equal(kiln_solver_step(s, 1), KILN_OK);
    assert_int_equal(kiln_solver_step(one, 1), KILN_OK);
    assert_memory_equal(kiln_solver_net(s)->param_data, kiln_solver_net(one)->param_data,
                        sizeof(float) * (size_t)kiln_solver_net(one)->nparam_floats);
    assert_int_equal(st.broadcasts, 2); /* parameters and history, once */
    assert_int_equal(det ? st.ordered : st.allreduces, 1);
    assert_int_equal(det ? st.allreduces : st.ordered, 0);
    /* The next batch of rank 0 of 2 is global batch 2, not 1: the twins part ways. */
    assert_int_equal(kiln_solver_step(s, 1), KILN_OK);
    assert_int_equal(kiln_solver_step(one, 1), KILN_OK);
    assert_memory_not_equal(kiln_solver_net(s)->param_data, kiln_solver_net(one)->param_data,
                            sizeof(float) * (size_t)kiln_solver_net(one)->nparam_floats);
    assert_int_equal(st.broadcasts, 2);
    uint64_t cur;
    assert_int_equal(kiln_net_get_cursors(kiln_solver_net(s), &cur), 1);
    assert_int_equal(cur, 16); /* the global stream: 2 rounds x 2 workers x 4 records */
    assert_int_equal(events, single_events);
    kiln_solver_free(s);
    kiln_solver_free(one);
  }
  /* Rank 1 emits nothing: rank 0 speaks for the job. */
  fake_state st = {0};
  kiln_comm c = {.ops = &fake_ops, .rank = 1, .size = 2, .impl = &st};
  int events = 0;
  kiln_solver_options o = {.comm = &c, .on_event = count_events, .user = &events};
  kiln_solver *s;
  assert_int_equal(kiln_solver_create(solver_path, &o, &s), KILN_OK);
  assert_int_equal(kiln_solver_solve(s), KILN_OK);
  assert_int_equal(events, 0);
  assert_int_equal(kiln_solver_iter(s), 4);
  kiln_solver_free(s);
}

/* Rank 0 of two GRADIENT twins after `steps` iterations (the fake state must outlive it). */
static kiln_solver *gradient_twin(fake_state *gs, kiln_comm *gc, int steps) {
  *gc = (kiln_comm){.ops = &fake_ops, .rank = 0, .size = 2, .impl = gs};
  kiln_solver_options go = {.comm = gc};
  kiln_solver *grad;
  assert_int_equal(kiln_solver_create(solver_path, &go, &grad), KILN_OK);
  assert_int_equal(kiln_solver_step(grad, steps), KILN_OK);
  assert_int_equal(gs->allreduces, steps); /* one gradient sum an iteration */
  return grad;
}

/* Twin workers (the fake communicator gives every rank the same buffers) in MODEL and TIME mode:
 * local steps divide by one worker, averaging identical twins with weight 1/2 changes no bit, so
 * each run must equal the GRADIENT twin's (whose sum of two equal gradients, halved, is exact)
 * on the same shard, while the collectives called tell the modes apart. */
static void test_solver_model_and_time_twins(void **state) {
  (void)state;
  fake_state gs = {0};
  kiln_comm gc;
  kiln_solver *grad = gradient_twin(&gs, &gc, 4);
  size_t bytes = sizeof(float) * (size_t)kiln_solver_net(grad)->nparam_floats;
  struct {
    kiln_sync_config sync;
    int allreduces; /* gradient sums + 2 per average (parameters and history) */
    int64_t averages;
  } cases[] = {
      {{.mode = KILN_SYNC_MODEL, .interval_iters = 2}, 4, 2},
      {{.mode = KILN_SYNC_MODEL, .interval_iters = 1, .warmup_iters = 2}, 2 + 4, 2},
      {{.mode = KILN_SYNC_MODEL, .interval_iters = 8}, 0, 0}, /* no average within 4 steps */
      {{.mode = KILN_SYNC_TIME, .interval_seconds = 1000}, 2, 1}, /* one round, to `stop` */
      {{.mode = KILN_SYNC_TIME, .interval_seconds = 1e-9}, 8, 4}, /* a round per step */
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    fake_state st = {0};
    kiln_comm c = {.ops = &fake_ops, .rank = 0, .size = 2, .impl = &st};
    kiln_solver_options o = {.comm = &c, .sync = cases[i].sync};
    kiln_solver *s;
    assert_int_equal(kiln_solver_create(solver_path, &o, &s), KILN_OK);
    if (kiln_solver_step(s, 4) != KILN_OK) fail_msg("case %zu: %s", i, kiln_last_error());
    if (memcmp(kiln_solver_net(s)->param_data, kiln_solver_net(grad)->param_data, bytes) != 0)
      fail_msg("case %zu: parameters differ from the GRADIENT twins'", i);
    assert_int_equal(kiln_solver_iter(s), 4);
    assert_int_equal(st.allreduces, cases[i].allreduces);
    assert_int_equal(s->naverages, cases[i].averages);
    uint64_t cur;
    assert_int_equal(kiln_net_get_cursors(kiln_solver_net(s), &cur), 1);
    assert_int_equal(cur, 32); /* 4 rounds x 2 workers x 4 records, as in GRADIENT mode */
    /* A snapshot makes one model first: only MODEL K=8 still has local steps to average. */
    char *path = NULL;
    int before = st.allreduces;
    assert_int_equal(kiln_solver_snapshot(s, &path), KILN_OK);
    assert_int_equal(st.allreduces - before, cases[i].averages || i == 1 ? 0 : 2);
    assert_non_null(path);
    remove(path);
    path[strlen(path) - strlen(".solverstate")] = '\0';
    char model[512];
    snprintf(model, sizeof model, "%s.caffemodel", path);
    remove(model);
    free(path);
    kiln_solver_free(s);
  }
  kiln_solver_free(grad);
}

/* One overlapped run against the sum after backward (--no-overlap), with `det` (ordered sums)
 * and the solver's iter_size: two buckets (ip2 with the layers after it, then ip1), each started
 * only once backward (the last pass's) has finished with it and the earlier passes are added in
 * (what it held when started is what it holds at the end, which the update scaled by
 * 2 / (2 x iter_size), a power of two, in place), covering the whole
 * buffer in order, and the same parameters as the whole-buffer sum. */
static void check_overlapped(const char *solver_file, bool det, int iter_size) {
  fake_state st = {0}, st2 = {0};
  kiln_comm c = {.ops = &fake_bucket_ops, .rank = 0, .size = 2, .impl = &st};
  kiln_comm c2 = {.ops = &fake_bucket_ops, .rank = 0, .size = 2, .impl = &st2};
  kiln_solver_options o = {.comm = &c, .sync = {.deterministic = det}},
                      o2 = {.comm = &c2, .sync = {.deterministic = det}, .no_overlap = true};
  kiln_solver *s, *whole;
  assert_int_equal(kiln_solver_create(solver_file, &o, &s), KILN_OK);
  assert_int_equal(kiln_solver_create(solver_file, &o2, &whole), KILN_OK);
  assert_true(s->overlap);
  assert_false(whole->overlap);
  assert_int_equal(s->nbuckets, 2);
  st.watch_lo = kiln_solver_net(s)->param_diff;
  assert_int_equal(kiln_solver_step(s, 1), KILN_OK);
  assert_int_equal(st.nbuckets, 2);
  /* the first bucket (ip2, ip3) went out while backward had yet to compute ip1's gradient */
  assert_int_equal(st.started_early, 1);
  /* and was pushed on (bucket_progress) while backward went on to ip1 */
  assert_true(st.progress_mid_backward >= 1);
  assert_int_equal(st.ordered_buckets, det ? 2 : 0);
  assert_int_equal(st.finishes, 1);
  assert_int_equal(st.allreduces + st.ordered, 0);
  kiln_net *net = kiln_solver_net(s);
  /* from the end of the buffer down to 0, without gaps */
  assert_true(st.bucket_buf[0] + st.bucket_n[0] == net->param_diff + net->nparam_floats);
  assert_true(st.bucket_buf[1] + st.bucket_n[1] == st.bucket_buf[0]);
  assert_true(st.bucket_buf[1] == net->param_diff);
  for (int b = 0; b < 2; b++) {
    double norm = 0;
    for (int64_t i = 0; i < st.bucket_n[b]; i++) {
      norm += fabsf(st.bucket_copy[b][i]);
      if (st.bucket_buf[b][i] != st.bucket_copy[b][i] / (float)iter_size)
        fail_msg("bucket %d changed after it was started, at %lld: %g then %g", b, (long long)i,
                 (double)st.bucket_copy[b][i], (double)st.bucket_buf[b][i] * iter_size);
    }
    if (!(norm > 0)) fail_msg("bucket %d was started before its gradient was computed", b);
  }
  assert_int_equal(kiln_solver_step(whole, 1), KILN_OK);
  assert_int_equal(st2.nbuckets, 0);
  assert_int_equal(det ? st2.ordered : st2.allreduces, 1);
  assert_memory_equal(kiln_solver_net(s)->param_data, kiln_solver_net(whole)->param_data,
                      sizeof(float) * (size_t)net->nparam_floats);
  for (int b = 0; b < st.nbuckets; b++) free(st.bucket_copy[b]);
  kiln_solver_free(s);
  kiln_solver_free(whole);
}

/* A communicator that lends memory for the sums (shared memory on one host): the train net's
 * gradients move there, backward writes them there, the twins' step is the same bit for bit as
 * with the gradients in the net's own memory, and the memory goes back when the solver is
 * freed. One that has none to lend (too small) leaves the net as it was. */
static void test_solver_gradients_in_lent_memory(void **state) {
  (void)state;
  fake_state gs = {0};
  kiln_comm gc;
  kiln_solver *ref = gradient_twin(&gs, &gc, 3);
  int64_t n = kiln_solver_net(ref)->nparam_floats;
  float *lend = kiln_alloc(sizeof(float) * (size_t)n);
  assert_non_null(lend);
  fake_state st = {.lend = lend, .lend_floats = n};
  kiln_comm c = {.ops = &fake_lend_ops, .rank = 0, .size = 2, .impl = &st};
  kiln_solver_options o = {.comm = &c};
  kiln_solver *s;
  /* the fixture's solver with a test net (never run before the end), which shares the train
   * net's parameters */
  char tsolver[192];
  snprintf(tsolver, sizeof tsolver, "%s/solver_with_test.prototxt", dir);
  write_text(tsolver, "net: 'net.prototxt'\nbase_lr: 0.1\nlr_policy: 'fixed'\nmomentum: 0.9\n"
                     "weight_decay: 0.01\nmax_iter: 4\ndisplay: 1\nrandom_seed: 3\n"
                     "snapshot_after_train: false\ntest_iter: 1\ntest_interval: 100\n"
                     "test_initialization: false\n");
  assert_int_equal(kiln_solver_create(tsolver, &o, &s), KILN_OK);
  kiln_net *net = kiln_solver_net(s), *ref_net = kiln_solver_net(ref);
  assert_int_equal(kiln_solver_test_net_count(s), 1);
  kiln_layer *tip = kiln_net_layer(kiln_solver_test_net(s, 0), "ip");
  assert_non_null(tip);
  assert_ptr_equal(tip->param[0]->diff, lend + net->learnable_offset[0]);
  assert_ptr_equal(tip->param[1]->diff, lend + net->learnable_offset[1]);
  assert_ptr_equal(tip->param[0]->data, net->param_data + net->learnable_offset[0]);
  assert_int_equal(st.claims, 1);
  assert_int_equal(st.claimed_floats, n);
  assert_ptr_equal(net->param_diff, lend);
  assert_ptr_equal(s->sum_buffer, lend);
  for (int k = 0; k < net->nlearnable; k++)
    assert_ptr_equal(net->learnable[k]->diff, lend + net->learnable_offset[k]);
  kiln_layer *ip = kiln_net_layer(net, "ip");
  assert_non_null(ip);
  assert_ptr_equal(ip->param[0]->diff, lend + net->learnable_offset[0]);
  assert_int_equal(kiln_solver_step(s, 3), KILN_OK);
  assert_int_equal(st.allreduces, 3);
  assert_memory_equal(net->param_data, ref_net->param_data, sizeof(float) * (size_t)n);
  /* the last gradient is where the sums read it */
  assert_memory_equal(lend, ref_net->param_diff, sizeof(float) * (size_t)n);
  bool nonzero = false;
  for (int64_t i = 0; i < n && !nonzero; i++) nonzero = lend[i] != 0;
  assert_true(nonzero);
  assert_int_equal(st.releases, 0);
  kiln_solver_free(s);
  assert_int_equal(st.releases, 1);
  /* too little to lend: the net keeps its own memory, nothing to give back */
  fake_state small = {.lend = lend, .lend_floats = n - 1};
  c.impl = &small;
  assert_int_equal(kiln_solver_create(solver_path, &o, &s), KILN_OK);
  assert_int_equal(small.claims, 1);
  assert_ptr_not_equal(kiln_solver_net(s)->param_diff, lend);
  assert_null(s->sum_buffer);
  kiln_solver_free(s);
  assert_int_equal(small.releases, 0);
  kiln_free(lend);
  kiln_solver_free(ref);
}

/* GRADIENT twins with the gradient summed in buckets during backward: plain; in rank order
 * (--deterministic) with iter_size 2, where each bucket gets the first pass added before it
 * goes out. */
static void test_solver_overlapped_buckets(void **state) {
  (void)state;
  char net2[192], solver2[192], solver3[192];
  snprintf(net2, sizeof net2, "%s/wide.prototxt", dir);
  snprintf(solver2, sizeof solver2, "%s/wide_solver.prototxt", dir);
  snprintf(solver3, sizeof solver3, "%s/wide_solver_i2.prototxt", dir);
  FILE *f = fopen(net2, "w");
  assert_non_null(f);
  fprintf(f,
          "layer { name: 'd' type: 'DummyData' top: 'data' top: 'label'\n"
          "  dummy_data_param { shape { dim: 2 dim: 64 } shape { dim: 2 }\n"
          "    data_filler { type: 'gaussian' std: 1 } data_filler { type: 'constant' value: 1 } } }\n"
          "layer { name: 'ip1' type: 'InnerProduct' bottom: 'data' top: 'ip1'\n"
          "  inner_product_param { num_output: 4500 weight_filler { type: 'gaussian' std: 0.01 } } }\n"
          "layer { name: 'relu' type: 'ReLU' bottom: 'ip1' top: 'ip1' }\n"
          "layer { name: 'ip2' type: 'InnerProduct' bottom: 'ip1' top: 'ip2'\n"
          "  inner_product_param { num_output: 70 weight_filler { type: 'gaussian' std: 0.01 } } }\n"
          "layer { name: 'ip3' type: 'InnerProduct' bottom: 'ip2' top: 'ip3'\n"
          "  inner_product_param { num_output: 3 weight_filler { type: 'gaussian' std: 0.1 } } }\n"
          "layer { name: 'loss' type: 'SoftmaxWithLoss' bottom: 'ip3' bottom: 'label' top: 'loss' }\n");
  fclose(f);
  for (int i = 0; i < 2; i++) {
    f = fopen(i ? solver3 : solver2, "w");
    assert_non_null(f);
    fprintf(f, "net: 'wide.prototxt'\nbase_lr: 0.1\nlr_policy: 'fixed'\nmomentum: 0.9\n"
               "max_iter: 2\nrandom_seed: 3\nsnapshot_after_train: false\niter_size: %d\n", i + 1);
    fclose(f);
  }
  check_overlapped(solver2, false, 1);
  check_overlapped(solver3, true, 2);
}

/* TIME mode's weights: in a round where the other worker ran 3 times this one's steps, this one's
 * change counts for 1/4 of the average (not 1/2), the iteration count moves to the furthest
 * worker's, and so does the data cursor. The fake sum doubles what it is given, so after the
 * round rank 0's parameters are 2 x 1/4 x its own: half the GRADIENT twin's (exact in float). */
static void test_solver_time_weights(void **state) {
  (void)state;
  fake_state gs = {0};
  kiln_comm gc;
  kiln_solver *grad = gradient_twin(&gs, &gc, 2);
  uint64_t grad_cursor;
  assert_int_equal(kiln_net_get_cursors(kiln_solver_net(grad), &grad_cursor), 1);
  for (int factor = 1; factor <= 3; factor += 2) {
    fake_state st = {.round_bytes = 2 * sizeof(uint64_t), .round_steps_factor = factor,
                     .round_cursor_ahead = factor == 1 ? 0 : 8};
    kiln_comm c = {.ops = &fake_ops, .rank = 0, .size = 2, .impl = &st};
    kiln_solver_options o = {.comm = &c,
                             .sync = {.mode = KILN_SYNC_TIME, .interval_seconds = 1000}};
    kiln_solver *s;
    assert_int_equal(kiln_solver_create(solver_path, &o, &s), KILN_OK);
    assert_int_equal(kiln_solver_step(s, 2), KILN_OK); /* one round: 2 local steps */
    assert_int_equal(s->naverages, 1);
    assert_int_equal(kiln_solver_iter(s), 2 * factor);
    float scale = factor == 1 ? 1.0f : 0.5f;
    const kiln_net *net = kiln_solver_net(s), *grad_net = kiln_solver_net(grad);
    for (int64_t i = 0; i < net->nparam_floats; i++)
      if (net->param_data[i] != scale * grad_net->param_data[i])
        fail_msg("steps 2 against %d: parameter %lld is %.9g, not %g x %.9g", 2 * factor,
                 (long long)i, (double)net->param_data[i], (double)scale,
                 (double)grad_net->param_data[i]);
    uint64_t cur;
    assert_int_equal(kiln_net_get_cursors(kiln_solver_net(s), &cur), 1);
    assert_int_equal(cur, grad_cursor + st.round_cursor_ahead);
    kiln_solver_free(s);
  }
  kiln_solver_free(grad);
}

/* The solver file's sync { } sets the mode, and the command line's --sync (the options) replaces
 * the mode and its intervals; --deterministic from either side holds. */
static void test_solver_sync_from_file_and_override(void **state) {
  (void)state;
  char path[192];
  snprintf(path, sizeof path, "%s/sync_solver.prototxt", dir);
  write_text(path, "net: 'net.prototxt'\nbase_lr: 0.1\nlr_policy: 'fixed'\nmax_iter: 4\n"
                   "random_seed: 3\nsnapshot_after_train: false\n"
                   "sync { mode: TIME interval_seconds: 2.5 warmup_iters: 3 deterministic: true }\n");
  fake_state st = {0};
  kiln_comm c = {.ops = &fake_ops, .rank = 0, .size = 2, .impl = &st};
  kiln_solver_options o = {.comm = &c};
  kiln_solver *s;
  assert_int_equal(kiln_solver_create(path, &o, &s), KILN_OK);
  assert_int_equal(kiln_solver_sync(s)->mode, KILN_SYNC_TIME);
  assert_true(kiln_solver_sync(s)->interval_seconds == 2.5);
  assert_int_equal(kiln_solver_sync(s)->warmup_iters, 3);
  assert_true(kiln_solver_sync(s)->deterministic);
  kiln_solver_free(s);
  o.sync = (kiln_sync_config){.mode = KILN_SYNC_MODEL, .interval_iters = 4};
  assert_int_equal(kiln_solver_create(path, &o, &s), KILN_OK);
  assert_int_equal(kiln_solver_sync(s)->mode, KILN_SYNC_MODEL);
  assert_int_equal(kiln_solver_sync(s)->interval_iters, 4);
  /* the file's warm-up went with its mode */
  assert_int_equal(kiln_solver_sync(s)->warmup_iters, 0);
  assert_true(kiln_solver_sync(s)->deterministic);
  kiln_solver_free(s);
  o.sync = (kiln_sync_config){.mode = KILN_SYNC_GRADIENT};
  assert_int_equal(kiln_solver_create(path, &o, &s), KILN_OK);
  assert_int_equal(kiln_solver_sync(s)->mode, KILN_SYNC_GRADIENT);
  kiln_solver_free(s);
  /* a file's MODEL without its interval is refused, unless the command line replaces it */
  write_text(path, "net: 'net.prototxt'\nbase_lr: 0.1\nlr_policy: 'fixed'\nmax_iter: 4\n"
                   "sync { mode: MODEL }\n");
  o.sync = (kiln_sync_config){0};
  assert_int_equal(kiln_solver_create(path, &o, &s), KILN_ERR_INVALID);
  assert_contains(kiln_last_error(), "sync_solver.prototxt: sync mode MODEL needs interval_iters");
  o.sync = (kiln_sync_config){.mode = KILN_SYNC_GRADIENT};
  assert_int_equal(kiln_solver_create(path, &o, &s), KILN_OK);
  assert_int_equal(kiln_solver_sync(s)->mode, KILN_SYNC_GRADIENT);
  kiln_solver_free(s);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_local_comm),
      cmocka_unit_test(test_null_comm_is_one_process),
      cmocka_unit_test(test_agree_settings),
      cmocka_unit_test(test_launcher_size),
      cmocka_unit_test(test_accumulate_is_in_order),
      cmocka_unit_test(test_sum_to_all),
      cmocka_unit_test(test_sync_parse_and_check),
      cmocka_unit_test(test_batch_stream_matches_walk),
      cmocka_unit_test(test_solver_config_mismatch_names_the_rank),
      cmocka_unit_test(test_solver_twin_workers),
      cmocka_unit_test(test_solver_model_and_time_twins),
      cmocka_unit_test(test_solver_gradients_in_lent_memory),
      cmocka_unit_test(test_solver_overlapped_buckets),
      cmocka_unit_test(test_solver_time_weights),
      cmocka_unit_test(test_solver_sync_from_file_and_override),
  };
  return cmocka_run_group_tests(tests, make_fixture, remove_fixture);
}
