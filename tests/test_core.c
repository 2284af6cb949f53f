/* Core: blobs, errors, the random generator, fault injection (KILN_FAULT) and the process
 * figures it moves. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <float.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "kiln/config.h"
#include "kiln/core.h"
#include "kiln/cpu.h"

static void test_blob_reshape_keeps_capacity(void **state) {
  (void)state;
  kiln_blob *b = kiln_blob_new("x");
  int64_t s1[] = {2, 3, 4};
  assert_int_equal(kiln_blob_reshape(b, 3, s1), KILN_OK);
  assert_int_equal(b->count, 24);
  float *d = b->data;
  int64_t s2[] = {4, 5};
  assert_int_equal(kiln_blob_reshape(b, 2, s2), KILN_OK);
  assert_ptr_equal(b->data, d); /* shrinking does not reallocate */
  assert_int_equal(kiln_blob_count_range(b, 0, 2), 20);
  int64_t bad[] = {2, -1};
  assert_int_equal(kiln_blob_reshape(b, 2, bad), KILN_ERR_SHAPE);
  assert_non_null(strstr(kiln_last_error(), "negative"));
  kiln_blob_free(b);
}

/* kiln_alloc: 64-byte aligned and zeroed; kiln_alloc_huge: the same below 1 MiB, and from 1 MiB
 * up on a 2 MiB boundary (whole huge pages), zeroed over all of it. */
static void test_alloc_alignment_and_zeroing(void **state) {
  (void)state;
  size_t sizes[] = {1, 1000, (1 << 20) - 4, 1 << 20, (3 << 19) + 4, 5 << 20};
  for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
    for (int huge = 0; huge < 2; huge++) {
      size_t n = sizes[i];
      /* A dirty buffer of the size first, which the allocator may hand back (glibc does for
       * the small sizes; it maps the 2 MiB-aligned ones fresh, already zero). */
      unsigned char *d = huge ? kiln_alloc_huge(n) : kiln_alloc(n);
      assert_non_null(d);
      memset(d, 0xab, n); /* all of it is ours (ASan checks) */
      kiln_free(d);
      unsigned char *p = huge ? kiln_alloc_huge(n) : kiln_alloc(n);
      assert_non_null(p);
      uintptr_t align = huge && n >= (1 << 20) ? (uintptr_t)2 << 20 : 64;
      assert_int_equal((uintptr_t)p % align, 0);
      size_t nonzero = 0;
      for (size_t j = 0; j < n; j++) nonzero += p[j] != 0;
      assert_int_equal(nonzero, 0);
      kiln_free(p);
    }
  }
}

static void test_rng_reproducible_and_uniform(void **state) {
  (void)state;
  kiln_rng a, b;
  kiln_rng_seed(&a, 42, 1);
  kiln_rng_seed(&b, 42, 1);
  double sum = 0, sq = 0;
  for (int i = 0; i < 100000; i++) {
    float x = kiln_rng_uniform(&a, 0, 1);
    assert_true(x == kiln_rng_uniform(&b, 0, 1));
    assert_true(x >= 0 && x < 1);
    sum += x;
  }
  assert_true(sum / 100000 > 0.49 && sum / 100000 < 0.51);
  sum = 0;
  for (int i = 0; i < 100000; i++) {
    float g = kiln_rng_gaussian(&a, 1, 2);
    sum += g;
    sq += (g - 1) * (g - 1);
  }
  assert_true(sum / 100000 > 0.97 && sum / 100000 < 1.03);
  assert_true(sq / 100000 > 3.9 && sq / 100000 < 4.1);
}

static void test_error_context(void **state) {
  (void)state;
  int rc = kiln_errorf(KILN_ERR_INVALID, "bad thing %d", 3);
  assert_int_equal(rc, KILN_ERR_INVALID);
  kiln_error_context(rc, "layer '%s': ", "conv1");
  assert_string_equal(kiln_last_error(), "layer 'conv1': bad thing 3");
}

/* A message too long to keep (a huge path) loses its middle, never its end: the reason. */
static void test_error_shortened(void **state) {
  (void)state;
  enum { N = 100000 };
  char *path = malloc(N + 1);
  assert_non_null(path);
  memset(path, 'a', N);
  memcpy(path, "/start", 6);
  memcpy(path + N - 4, "/end", 4);
  path[N] = '\0';
  kiln_errorf(KILN_ERR_IO, "%s: cannot open: No such file", path);
  const char *m = kiln_last_error();
  assert_true(strlen(m) < 4096 && strlen(m) > 4000);
  assert_true(!strncmp(m, "/startaaa", 9));
  assert_non_null(strstr(m, "aaa...aaa"));
  const char *tail = "aaa/end: cannot open: No such file";
  assert_string_equal(m + strlen(m) - strlen(tail), tail);
  /* the context goes in front, the end stays */
  kiln_error_context(KILN_ERR_IO, "layer '%s': ", "d");
  m = kiln_last_error();
  assert_true(!strncmp(m, "layer 'd': /startaaa", 20));
  assert_string_equal(m + strlen(m) - strlen(tail), tail);
  /* a context longer than the message kept: its start and the message's end */
  kiln_errorf(KILN_ERR_IO, "cannot open");
  kiln_error_context(KILN_ERR_IO, "%s: ", path);
  m = kiln_last_error();
  assert_true(!strncmp(m, "/startaaa", 9));
  assert_string_equal(m + strlen(m) - strlen("aaa/end: cannot open"), "aaa/end: cannot open");
  free(path);
  /* no UTF-8 character is cut: 2-byte characters on both sides of "..." */
  char *utf = malloc(2 * N + 1);
  assert_non_null(utf);
  for (int i = 0; i < N; i++) memcpy(utf + 2 * i, "\xc3\xa9", 2);
  utf[2 * N] = '\0';
  kiln_errorf(KILN_ERR_IO, "x%s", utf);
  m = kiln_last_error();
  const char *dots = strstr(m, "...");
  assert_non_null(dots);
  assert_true(((dots - m) - 1) % 2 == 0);             /* "x", then whole characters */
  assert_true(strlen(dots + 3) % 2 == 0);             /* whole characters after it */
  assert_int_equal((unsigned char)dots[3], 0xc3);     /* starting with a lead byte */
  free(utf);
  /* short messages are untouched */
  char buf[16];
  kiln_shorten_middle(buf, sizeof buf, "short", 5);
  assert_string_equal(buf, "short");
  kiln_shorten_middle(buf, sizeof buf, "0123456789abcdefghij", 20);
  assert_string_equal(buf, "0123...cdefghij"); /* 15 bytes: a third, "...", the rest */
}

static void assert_parse_error(const char *text, const char *want) {
  kiln_fault f;
  assert_int_equal(kiln_fault_parse(text, &f), KILN_ERR_INVALID);
  if (!strstr(kiln_last_error(), want))
    fail_msg("'%s' does not contain '%s'", kiln_last_error(), want);
  assert_non_null(strstr(kiln_last_error(), "KILN_FAULT")); /* the message names the variable */
}

static void test_fault_parse(void **state) {
  (void)state;
  kiln_fault f;
  assert_int_equal(kiln_fault_parse(NULL, &f), KILN_OK);
  assert_int_equal(f.kind, KILN_FAULT_NONE);
  assert_int_equal(kiln_fault_parse("", &f), KILN_OK);
  assert_int_equal(f.kind, KILN_FAULT_NONE);
  assert_int_equal(kiln_fault_parse("sleep:conv1:20", &f), KILN_OK);
  assert_int_equal(f.kind, KILN_FAULT_SLEEP);
  assert_string_equal(f.layer, "conv1");
  assert_int_equal(f.us, 20000);
  /* a layer name may hold colons: MS is after the last one */
  assert_int_equal(kiln_fault_parse("sleep:block:1/conv:5", &f), KILN_OK);
  assert_string_equal(f.layer, "block:1/conv");
  assert_int_equal(f.us, 5000);
  assert_int_equal(kiln_fault_parse("slowread:data:40", &f), KILN_OK);
  assert_int_equal(f.kind, KILN_FAULT_SLOW_READ);
  assert_string_equal(f.layer, "data");
  assert_int_equal(f.us, 40000);
  char buf[128];
  assert_string_equal(kiln_fault_describe(&f, buf, sizeof buf),
                      "data layer 'data' reads a batch in 40 ms");
  /* a step is rarely whole milliseconds: up to three decimals */
  assert_int_equal(kiln_fault_parse("slowread:data:4.7", &f), KILN_OK);
  assert_int_equal(f.us, 4700);
  assert_string_equal(kiln_fault_describe(&f, buf, sizeof buf),
                      "data layer 'data' reads a batch in 4.7 ms");
  assert_int_equal(kiln_fault_parse("sleep:conv1:0.125", &f), KILN_OK);
  assert_int_equal(f.us, 125);
  assert_string_equal(kiln_fault_describe(&f, buf, sizeof buf),
                      "sleep 0.125 ms in every forward of layer 'conv1'");
  assert_int_equal(kiln_fault_parse("sleep:conv1:60000.000", &f), KILN_OK);
  assert_int_equal(f.us, 60000000);
  assert_int_equal(kiln_fault_parse("leak:1024", &f), KILN_OK);
  assert_int_equal(f.kind, KILN_FAULT_LEAK);
  assert_int_equal(f.kb, 1024);
  assert_string_equal(kiln_fault_describe(&f, buf, sizeof buf),
                      "leak 1024 KB every training iteration");

  assert_parse_error("slowread:data", "slowread:LAYER:MS");
  assert_parse_error("slowread:data:0", "milliseconds");
  assert_parse_error("slep:conv1:5", "unknown fault 'slep'");
  assert_parse_error("sleep", "expected sleep:LAYER:MS");
  assert_parse_error("sleep:conv1", "expected sleep:LAYER:MS");
  assert_parse_error("sleep::5", "no layer name");
  assert_parse_error("sleep:conv1:", "'' is not a number of milliseconds");
  assert_parse_error("sleep:conv1:0", "'0' is not a number of milliseconds in 0.001..60000");
  assert_parse_error("sleep:conv1:0.000", "in 0.001..60000");
  assert_parse_error("sleep:conv1:60000.001", "in 0.001..60000");
  assert_parse_error("sleep:conv1:60001", "in 0.001..60000");
  assert_parse_error("sleep:conv1:2.5001", "at most 3 decimals");
  assert_parse_error("sleep:conv1:2.", "'2.' is not a number");
  assert_parse_error("sleep:conv1:.5", "'.5' is not a number");
  assert_parse_error("sleep:conv1:1e3", "'1e3' is not a number");
  assert_parse_error("sleep:conv1: 5", "' 5' is not a number");
  assert_parse_error("leak", "expected sleep:LAYER:MS");
  assert_parse_error("leak:-1", "'-1' is not a whole number of kilobytes in 1..1048576");
  assert_parse_error("leak:1048577", "in 1..1048576");
  assert_parse_error("leak:12k", "'12k' is not a whole number of kilobytes");
  assert_parse_error("LEAK:12", "unknown fault 'LEAK'");
  assert_int_equal(kiln_fault_parse("lr:0.1", &f), KILN_OK);
  assert_int_equal(f.kind, KILN_FAULT_LR);
  assert_true(f.lr_factor == 0.1);
  assert_string_equal(kiln_fault_describe(&f, buf, sizeof buf),
                      "every learning rate multiplied by 0.1");
  assert_int_equal(kiln_fault_parse("lr:1000", &f), KILN_OK);
  assert_true(f.lr_factor == 1000);
  assert_int_equal(kiln_fault_parse("lr:.5", &f), KILN_OK);
  assert_true(f.lr_factor == 0.5);
  assert_int_equal(kiln_fault_parse("lr:1e-3", &f), KILN_OK);
  assert_true(f.lr_factor == 1e-3);
  assert_parse_error("lr", "lr:FACTOR");
  assert_parse_error("lr:", "'' is not a decimal factor in (0, 1000]");
  assert_parse_error("lr:0", "'0' is not a decimal factor in (0, 1000]");
  assert_parse_error("lr:0.0", "'0.0' is not a decimal factor");
  assert_parse_error("lr:-0.5", "'-0.5' is not a decimal factor");
  assert_parse_error("lr:+0.5", "'+0.5' is not a decimal factor");
  assert_parse_error("lr:1000.5", "'1000.5' is not a decimal factor in (0, 1000]");
  assert_parse_error("lr:1e9", "'1e9' is not a decimal factor");
  assert_parse_error("lr:half", "'half' is not a decimal factor");
  assert_parse_error("lr:0.1x", "'0.1x' is not a decimal factor");
  assert_parse_error("lr: 0.1", "' 0.1' is not a decimal factor");
  assert_parse_error("lr:nan", "'nan' is not a decimal factor");
  assert_parse_error("lr:inf", "'inf' is not a decimal factor");
  assert_parse_error("lr:1e-400", "'1e-400' is not a decimal factor"); /* underflows to 0 */
  assert_int_equal(kiln_fault_parse("stop:init:3", &f), KILN_OK);
  assert_int_equal(f.kind, KILN_FAULT_STOP);
  assert_string_equal(f.stage, "init");
  assert_int_equal(f.rank, 3);
  assert_string_equal(kiln_fault_describe(&f, buf, sizeof buf),
                      "rank 3 stops at the 'init' stage of the MPI start-up");
  kiln_fault_stop(&f, "init", 2); /* another rank, another stage: nothing happens */
  kiln_fault_stop(&f, "start", 3);
  assert_parse_error("stop:init", "stop:STAGE:RANK");
  assert_parse_error("stop:later:1", "unknown stage 'later' (start, init or setup)");
  assert_parse_error("stop:start:x", "'x' is not a rank");
  char longname[300] = "sleep:";
  memset(longname + 6, 'x', 200);
  strcpy(longname + 206, ":5");
  assert_parse_error(longname, "the layer name is longer than 127 characters");

  /* the environment is read into the configuration, and only there */
  kiln_config c;
  setenv("KILN_FAULT", "leak:3", 1);
  assert_int_equal(kiln_config_from_env(&c), KILN_OK);
  assert_int_equal(c.fault.kind, KILN_FAULT_LEAK);
  assert_int_equal(c.fault.kb, 3);
  setenv("KILN_FAULT", "nonsense", 1);
  assert_int_equal(kiln_config_from_env(&c), KILN_ERR_INVALID);
  assert_non_null(strstr(kiln_last_error(), "KILN_FAULT='nonsense'"));
  unsetenv("KILN_FAULT");
  assert_int_equal(kiln_config_from_env(&c), KILN_OK);
  assert_int_equal(c.fault.kind, KILN_FAULT_NONE);
}

/* kiln_set_flush_denormals on every thread of the pool: with it, half of FLT_MIN is flushed to
 * zero (FTZ) and a subnormal input reads as zero (DAZ); without it both are IEEE's. The
 * inputs are volatile, so that the compiler folds nothing. */
static int subnormal_results(volatile float *in) {
  int n = 0;
#pragma omp parallel num_threads(2) reduction(+ : n)
  {
    volatile float half = in[0] * 0.5f, twice = in[1] * 2.0f;
    n += (half != 0.0f) + (twice != 0.0f);
  }
  return n;
}

static void test_flush_denormals(void **state) {
  (void)state;
  volatile float in[2] = {FLT_MIN, FLT_MIN / 8}; /* a normal, and a subnormal made by IEEE */
  assert_true(in[1] > 0.0f);
  if (!kiln_set_flush_denormals(true)) {
    print_message("skipped: this processor has no FTZ/DAZ bits\n");
    return;
  }
  assert_int_equal(subnormal_results(in), 0);
  assert_true(kiln_set_flush_denormals(false));
  assert_int_equal(subnormal_results(in), 4); /* both threads, both results */
  assert_true(in[0] * 0.5f == FLT_MIN / 2);
}

/* Each switch of the runtime configuration from its variable; unknown values leave the
 * default. */
static const char *const config_vars[] = {
    "KILN_ENGINE", "KILN_DEVICE", "KILN_LAYOUT", "KILN_FUSE", "KILN_CONV_ALGO", "KILN_DENORMALS",
    "KILN_DNNL_LAYOUT",
    "KILN_COMM_THREAD", "KILN_COMM_SHM", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE",
    "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "OMP_NUM_THREADS", "KILN_DATA",
    "XDG_DATA_HOME", "XDG_CACHE_HOME", "KILN_GIT_COMMIT", "HOME", "KILN_FAULT",
    "KILN_HDF5_FILE_LIMIT", "KILN_TF32", "KILN_CUDNN", "OMPI_COMM_WORLD_LOCAL_RANK",
    "MPI_LOCALRANKID", "SLURM_LOCALID"};
enum { NCONFIG_VARS = sizeof config_vars / sizeof config_vars[0] };

static void test_config_from_env(void **state) {
  (void)state;
  char *saved[NCONFIG_VARS];
  for (int i = 0; i < NCONFIG_VARS; i++) {
    const char *v = getenv(config_vars[i]);
    saved[i] = v ? kiln_strdup(v) : NULL;
    unsetenv(config_vars[i]);
  }
  kiln_config c;
  assert_int_equal(kiln_config_from_env(&c), KILN_OK);
  assert_memory_equal(&c, kiln_config_defaults(), offsetof(kiln_config, search_path));
  assert_int_equal(c.engine, KILN_ENGINE_CPU);
  assert_false(c.plain_layouts || c.unfused || c.conv_direct || c.keep_denormals);
  assert_int_equal(c.device, KILN_DEVICE_HOST);
  assert_int_equal(c.comm_shm, KILN_COMM_SHM_ON);
  assert_string_equal(c.data_dir, "");
  assert_string_equal(c.ce_db, "");

  setenv("KILN_ENGINE", "ref", 1);
  setenv("KILN_LAYOUT", "plain", 1);
  setenv("KILN_FUSE", "0", 1);
  setenv("KILN_CONV_ALGO", "direct", 1);
  setenv("KILN_DENORMALS", "keep", 1);
  setenv("KILN_DEVICE", "hostsim", 1);
  setenv("KILN_DNNL_LAYOUT", "nhwc", 1);
  setenv("KILN_COMM_THREAD", "50", 1);
  setenv("KILN_COMM_SHM", "copy", 1);
  setenv("PMI_SIZE", "3", 1);
  setenv("PMI_RANK", "2", 1);
  setenv("MPI_LOCALNRANKS", "2", 1);
  setenv("OMP_NUM_THREADS", "4", 1);
  setenv("HOME", "/home/k", 1);
  setenv("KILN_GIT_COMMIT", "abc1234", 1);
  setenv("KILN_HDF5_FILE_LIMIT", "1.5GiB", 1);
  assert_int_equal(kiln_config_from_env(&c), KILN_OK);
  assert_true(c.hdf5_file_limit == 3ull << 29);
  assert_int_equal(c.engine, KILN_ENGINE_REF);
  assert_true(c.plain_layouts && c.unfused && c.conv_direct && c.keep_denormals);
  assert_int_equal(c.device, KILN_DEVICE_HOSTSIM);
  assert_int_equal(c.dnnl_layout, KILN_DNNL_LAYOUT_NHWC);
  assert_int_equal(c.comm_thread_us, 50);
  assert_int_equal(c.comm_shm, KILN_COMM_SHM_COPY);
  assert_int_equal(c.launcher_size, 3);
  assert_int_equal(c.launcher_rank, 2);
  assert_int_equal(c.local_ranks, 2);
  assert_int_equal(c.omp_threads, 4);
  assert_string_equal(c.data_dir, "/home/k/.cache/kiln/datasets");
  assert_string_equal(c.ce_db, "/home/k/.local/share/kiln/ce.db");
  assert_string_equal(c.machine_cache, "/home/k/.cache/kiln/machine.txt");
  assert_string_equal(c.git_commit, "abc1234");

  /* the specific variables win over HOME; other values of the switches are the defaults */
  setenv("KILN_DATA", "/data", 1);
  setenv("XDG_DATA_HOME", "/xdg", 1);
  setenv("KILN_ENGINE", "fast", 1);
  setenv("KILN_FUSE", "1", 1);
  setenv("KILN_DNNL_LAYOUT", "any", 1);
  setenv("KILN_COMM_THREAD", "5ms", 1); /* warned about, no thread */
  setenv("KILN_COMM_SHM", "0", 1);
  setenv("OMPI_COMM_WORLD_SIZE", "4", 1);
  setenv("OMPI_COMM_WORLD_RANK", "0", 1);
  assert_int_equal(kiln_config_from_env(&c), KILN_OK);
  assert_int_equal(c.engine, KILN_ENGINE_CPU);
  assert_false(c.unfused);
  assert_int_equal(c.dnnl_layout, KILN_DNNL_LAYOUT_ANY);
  assert_int_equal(c.comm_thread_us, 0);
  assert_int_equal(c.comm_shm, KILN_COMM_SHM_OFF);
  assert_int_equal(c.launcher_size, 4);
  assert_int_equal(c.launcher_rank, 0);
  assert_string_equal(c.data_dir, "/data");
  assert_string_equal(c.ce_db, "/xdg/kiln/ce.db");

  /* a limit that is no size is refused, naming the variable; plain bytes and K are sizes */
  setenv("KILN_HDF5_FILE_LIMIT", "4096", 1);
  assert_int_equal(kiln_config_from_env(&c), KILN_OK);
  assert_true(c.hdf5_file_limit == 4096);
  setenv("KILN_HDF5_FILE_LIMIT", "64k", 1);
  assert_int_equal(kiln_config_from_env(&c), KILN_OK);
  assert_true(c.hdf5_file_limit == 65536);
  const char *bad_limits[] = {"0", "-1M", "lots", "5 G", "2Q", "inf"};
  for (size_t i = 0; i < sizeof bad_limits / sizeof bad_limits[0]; i++) {
    setenv("KILN_HDF5_FILE_LIMIT", bad_limits[i], 1);
    assert_int_equal(kiln_config_from_env(&c), KILN_ERR_INVALID);
    assert_non_null(strstr(kiln_last_error(), "KILN_HDF5_FILE_LIMIT='"));
  }
  unsetenv("KILN_HDF5_FILE_LIMIT");

  /* a path that does not fit is refused, naming the variable */
  char big[KILN_CONFIG_PATH_MAX + 10];
  memset(big, 'd', sizeof big - 1);
  big[sizeof big - 1] = '\0';
  setenv("KILN_DATA", big, 1);
  unsetenv("KILN_COMM_THREAD"); /* warned about once above */
  assert_int_equal(kiln_config_from_env(&c), KILN_ERR_INVALID);
  assert_non_null(strstr(kiln_last_error(), "KILN_DATA is longer than"));

  for (int i = 0; i < NCONFIG_VARS; i++) {
    if (saved[i]) setenv(config_vars[i], saved[i], 1);
    else unsetenv(config_vars[i]);
    free(saved[i]);
  }
}

static void test_fault_effects(void **state) {
  (void)state;
  kiln_fault sleep_fault, leak_fault, none;
  assert_int_equal(kiln_fault_parse("sleep:x:30", &sleep_fault), KILN_OK);
  assert_int_equal(kiln_fault_parse("leak:16384", &leak_fault), KILN_OK);
  assert_int_equal(kiln_fault_parse(NULL, &none), KILN_OK);
  double t0 = kiln_now_ms();
  kiln_fault_sleep(&sleep_fault);
  assert_true(kiln_now_ms() - t0 >= 30);
  t0 = kiln_now_ms();
  kiln_fault_sleep(&leak_fault); /* another kind: nothing */
  kiln_fault_sleep(&none);
  assert_true(kiln_now_ms() - t0 < 30);
  /* 16 MB leaked and touched: the peak resident set grows by about that much */
  double before = kiln_peak_rss_mb();
  assert_int_equal(kiln_fault_leak(&leak_fault), KILN_OK);
  assert_true(kiln_peak_rss_mb() - before >= 15);
  assert_int_equal(kiln_fault_leak(&none), KILN_OK);
  assert_int_equal(kiln_fault_leak(&sleep_fault), KILN_OK);
}

static void test_thread_cpu_wait(void **state) {
  (void)state;
  /* the kernel's run-queue delay of this thread: a non-negative number that never decreases
   * (NaN only where /proc does not report it) */
  double a = kiln_thread_cpu_wait_ms();
  if (isnan(a)) return;
  assert_true(a >= 0);
  volatile double x = 0;
  for (int i = 0; i < 1000000; i++) x = x + i;
  assert_true(x > 0);
  assert_true(kiln_thread_cpu_wait_ms() >= a);
}

/* The string builder grows past its first buffer and keeps everything in order. */
static void test_strbuf(void **state) {
  (void)state;
  kiln_strbuf b = {0};
  char want[8000];
  size_t w = 0;
  for (int i = 0; i < 1000; i++) {
    kiln_strbuf_printf(&b, "%d,", i);
    w += (size_t)snprintf(want + w, sizeof want - w, "%d,", i);
  }
  kiln_strbuf_printf(&b, "%s", "");
  assert_false(b.failed);
  assert_true(b.cap > 1024); /* it grew */
  assert_int_equal(b.len, w);
  assert_string_equal(b.s, want);
  free(b.s);
}

/* mkdir -p: nested folders, an existing one again, and a file in the way named. */
static void test_mkdir_p(void **state) {
  (void)state;
  char root[] = "/tmp/kiln-test-core-XXXXXX", path[128], file[128];
  assert_non_null(mkdtemp(root));
  snprintf(path, sizeof path, "%s/a/b/c", root);
  assert_int_equal(kiln_mkdir_p(path), KILN_OK);
  struct stat st;
  assert_int_equal(stat(path, &st), 0);
  assert_true(S_ISDIR(st.st_mode));
  assert_int_equal(kiln_mkdir_p(path), KILN_OK);
  snprintf(file, sizeof file, "%s/a/f", root);
  FILE *f = fopen(file, "w");
  assert_non_null(f);
  fclose(f);
  assert_int_equal(kiln_mkdir_p(file), KILN_ERR_IO);
  assert_non_null(strstr(kiln_last_error(), "/a/f: cannot create folder"));
  snprintf(path, sizeof path, "%s/a/f/g", root);
  assert_int_equal(kiln_mkdir_p(path), KILN_ERR_IO);
  assert_non_null(strstr(kiln_last_error(), "/a/f/g: cannot create folder: Not a directory"));
  char cmd[160];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
  assert_int_equal(system(cmd), 0);
}

/* The device switches: KILN_DEVICE's names (a GPU by number, or by local rank), a name that is
 * none refused naming the variable, the GPU switches, and the local rank from each launcher's
 * variable. */
static void test_config_devices(void **state) {
  (void)state;
  char *saved[NCONFIG_VARS];
  for (int i = 0; i < NCONFIG_VARS; i++) {
    const char *v = getenv(config_vars[i]);
    saved[i] = v ? kiln_strdup(v) : NULL;
    unsetenv(config_vars[i]);
  }
  kiln_config c;
  assert_int_equal(kiln_config_from_env(&c), KILN_OK);
  assert_int_equal(c.local_rank, -1);
  assert_false(c.tf32 || c.no_cudnn);
  setenv("KILN_DEVICE", "cuda:3", 1);
  setenv("KILN_TF32", "1", 1);
  setenv("KILN_CUDNN", "0", 1);
  setenv("MPI_LOCALRANKID", "1", 1);
  assert_int_equal(kiln_config_from_env(&c), KILN_OK);
  assert_int_equal(c.device, KILN_DEVICE_CUDA);
  assert_int_equal(c.device_index, 3);
  assert_true(c.tf32 && c.no_cudnn);
  assert_int_equal(c.local_rank, 1);
  setenv("KILN_DEVICE", "cuda", 1);
  setenv("OMPI_COMM_WORLD_LOCAL_RANK", "0", 1); /* Open MPI's comes first */
  assert_int_equal(kiln_config_from_env(&c), KILN_OK);
  assert_int_equal(c.device, KILN_DEVICE_CUDA);
  assert_int_equal(c.device_index, -1);
  assert_int_equal(c.local_rank, 0);
  setenv("KILN_DEVICE", "host", 1);
  assert_int_equal(kiln_config_from_env(&c), KILN_OK);
  assert_int_equal(c.device, KILN_DEVICE_HOST);
  const char *bad[] = {"gpu", "cuda:", "cuda:x", "cuda:-1", "cuda:1x", "cudax"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    setenv("KILN_DEVICE", bad[i], 1);
    assert_int_equal(kiln_config_from_env(&c), KILN_ERR_INVALID);
    if (!strstr(kiln_last_error(), "KILN_DEVICE") || !strstr(kiln_last_error(), bad[i]))
      fail_msg("KILN_DEVICE=%s: %s", bad[i], kiln_last_error());
  }
  for (int i = 0; i < NCONFIG_VARS; i++) {
    if (saved[i]) setenv(config_vars[i], saved[i], 1);
    else unsetenv(config_vars[i]);
    free(saved[i]);
  }
}

/* The peak loops run where the CPU has their instructions and say 0 elsewhere; the bf16 one
 * wants AVX512-BF16 beside AVX-512F. (Their rates are measurements, kiln-fma-peak's.) */
static void test_fma_loops(void **state) {
  (void)state;
  const int kinds[] = {KILN_FMA_AVX2, KILN_FMA_AVX512, KILN_FMA_AVX512_BF16};
  for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
    const long rounds = kiln_fma_calibrate(kinds[k], 0.005);
    const double g = kiln_fma_gflops(kinds[k], 1, rounds > 0 ? rounds : 1, 1);
    if (kiln_fma_supported(kinds[k])) assert_true(rounds > 0 && g > 0 && isfinite(g));
    else assert_true(rounds == 0 && g == 0);
  }
#if defined(__x86_64__)
  __builtin_cpu_init();
  assert_int_equal(kiln_fma_supported(KILN_FMA_AVX512_BF16),
                   __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bf16"));
#endif
  assert_false(kiln_fma_supported(7));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_blob_reshape_keeps_capacity),
      cmocka_unit_test(test_rng_reproducible_and_uniform),
      cmocka_unit_test(test_error_context),
      cmocka_unit_test(test_error_shortened),
      cmocka_unit_test(test_fault_parse),
      cmocka_unit_test(test_fault_effects),
      cmocka_unit_test(test_config_from_env),
      cmocka_unit_test(test_config_devices),
      cmocka_unit_test(test_fma_loops),
      cmocka_unit_test(test_flush_denormals),
      cmocka_unit_test(test_strbuf),
      cmocka_unit_test(test_mkdir_p),
      cmocka_unit_test(test_thread_cpu_wait),
      /* last: its buffers raise the peak resident set that test_fault_effects reads */
      cmocka_unit_test(test_alloc_alignment_and_zeroing),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
