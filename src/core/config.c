/* The runtime configuration (include/kiln/config.h). This file is the library's only reader of
 * environment variables: whatever changes kiln's behaviour is visible in kiln_config, and code
 * further down is handed the struct instead of looking around for itself. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/config.h"

static const kiln_config defaults = {.dnnl_layout = KILN_DNNL_LAYOUT_RULE,
                                     .comm_shm = KILN_COMM_SHM_ON,
                                     .launcher_rank = -1,
                                     .local_rank = -1,
                                     .comm_timeout_s = KILN_COMM_DEFAULT_TIMEOUT_S,
                                     .fault = {.kind = KILN_FAULT_NONE}};

void kiln_config_init(kiln_config *c) { *c = defaults; }

const kiln_config *kiln_config_defaults(void) { return &defaults; }

static const char *env(const char *name) {
  const char *v = getenv(name);
  return v && *v ? v : NULL;
}

static bool is(const char *v, const char *word) { return v && !strcmp(v, word); }

int kiln_config_set_device(kiln_config *c, const char *name, const char *what) {
  if (is(name, "host") || is(name, "cpu")) {
    c->device = KILN_DEVICE_HOST;
    return KILN_OK;
  }
  if (is(name, "hostsim")) {
    c->device = KILN_DEVICE_HOSTSIM;
    return KILN_OK;
  }
  if (name && !strncmp(name, "cuda", 4) && (name[4] == '\0' || name[4] == ':')) {
    long n = -1; /* "cuda": the worker's GPU by its local rank */
    if (name[4] == ':') {
      char *end;
      errno = 0;
      n = strtol(name + 5, &end, 10);
      if (end == name + 5 || *end || errno || n < 0 || n > 1023)
        return kiln_errorf(KILN_ERR_INVALID, "%s: '%s' is not a GPU number (cuda:N)", what, name);
    }
    c->device = KILN_DEVICE_CUDA;
    c->device_index = (int)n;
    return KILN_OK;
  }
  return kiln_errorf(KILN_ERR_INVALID, "%s: unknown device '%s' (host, cuda, cuda:N, hostsim)", what,
                     name ? name : "");
}

int kiln_config_set_precision(kiln_config *c, const char *name, const char *what) {
  if (is(name, "fp32") || is(name, "FP32") || is(name, "float")) {
    c->precision = KILN_PRECISION_FP32;
    return KILN_OK;
  }
  if (is(name, "bf16") || is(name, "BF16") || is(name, "bfloat16")) {
    c->precision = KILN_PRECISION_BF16;
    return KILN_OK;
  }
  return kiln_errorf(KILN_ERR_INVALID, "%s: unknown precision '%s' (fp32, bf16)", what,
                     name ? name : "");
}

/* A positive whole number, or 0 for anything else. */
static int positive(const char *v) {
  if (!v) return 0;
  char *end;
  errno = 0;
  long n = strtol(v, &end, 10);
  return errno || *end || n < 1 || n > 1 << 30 ? 0 : (int)n;
}

/* A size in bytes, with an optional K, M, G or T (powers of 1024; "KiB", "MB" and the like are
 * read alike): false for anything else, or 0. */
static bool size_value(const char *v, uint64_t *out) {
  char *end;
  errno = 0;
  double x = strtod(v, &end);
  if (errno || end == v || !(x > 0)) return false;
  int shifts = 0;
  switch (*end) {
    case 't': case 'T': shifts++; /* fall through */
    case 'g': case 'G': shifts++; /* fall through */
    case 'm': case 'M': shifts++; /* fall through */
    case 'k': case 'K': shifts++; end++; break;
    default: break;
  }
  for (int i = 0; i < shifts; i++) x *= 1024;
  if (shifts && *end == 'i') end++;
  if (*end == 'B' || *end == 'b') end++;
  if (*end || x >= 18446744073709551616.0) return false;
  *out = (uint64_t)x;
  return *out > 0;
}

/* buf = a followed by b (NULL: nothing); an error naming `var` when it does not fit. */
static int place(char *buf, size_t n, const char *var, const char *a, const char *b) {
  int w = snprintf(buf, n, "%s%s", a, b ? b : "");
  if (w < 0 || (size_t)w >= n) {
    buf[0] = '\0';
    return kiln_errorf(KILN_ERR_INVALID, "%s is longer than %zu bytes", var, n - 1);
  }
  return KILN_OK;
}

int kiln_config_from_env(kiln_config *c) {
  kiln_config_init(c);
  const char *engine = env("KILN_ENGINE");
  c->engine = is(engine, "ref") ? KILN_ENGINE_REF : is(engine, "cuda") ? KILN_ENGINE_CUDA
                                                                      : KILN_ENGINE_CPU;
  const char *device = env("KILN_DEVICE");
  if (device && device[0])
    KILN_TRY(kiln_config_set_device(c, device, "KILN_DEVICE"));
  const char *precision = env("KILN_PRECISION");
  if (precision) KILN_TRY(kiln_config_set_precision(c, precision, "KILN_PRECISION"));
  c->tf32 = is(env("KILN_TF32"), "1");
  c->no_cudnn = is(env("KILN_CUDNN"), "0");
  c->plain_layouts = is(env("KILN_LAYOUT"), "plain");
  c->unfused = is(env("KILN_FUSE"), "0");
  c->no_recompute = is(env("KILN_RECOMPUTE"), "0");
  c->no_share_data = is(env("KILN_SHARE_DATA"), "0");
  c->conv_direct = is(env("KILN_CONV_ALGO"), "direct");
  c->keep_denormals = is(env("KILN_DENORMALS"), "keep");
  const char *dl = env("KILN_DNNL_LAYOUT");
  c->dnnl_layout = is(dl, "any")    ? KILN_DNNL_LAYOUT_ANY
                   : is(dl, "nhwc") ? KILN_DNNL_LAYOUT_NHWC
                                    : KILN_DNNL_LAYOUT_RULE;

  /* KILN_COMM_THREAD=POLL_US (1 .. 100000) asks for the communication thread. */
  const char *ct = env("KILN_COMM_THREAD");
  if (ct) {
    int us = positive(ct);
    if (us < 1 || us > 100000)
      kiln_log(KILN_LOG_WARN,
               "KILN_COMM_THREAD='%s' is not a polling interval in microseconds (1 to 100000): "
               "no communication thread, the sums are polled between layers",
               ct);
    else c->comm_thread_us = us;
  }
  const char *shm = env("KILN_COMM_SHM");
  c->comm_shm = is(shm, "0") ? KILN_COMM_SHM_OFF : is(shm, "copy") ? KILN_COMM_SHM_COPY
                                                                   : KILN_COMM_SHM_ON;
  /* Open MPI's mpirun sets OMPI_COMM_WORLD_SIZE, MPICH's Hydra and Slurm's PMI set PMI_SIZE. */
  static const char *const sizes[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"};
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0] && !c->launcher_size; i++)
    c->launcher_size = positive(env(sizes[i]));
  static const char *const ranks[] = {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"};
  for (size_t i = 0; i < sizeof ranks / sizeof ranks[0] && c->launcher_rank < 0; i++) {
    const char *r = env(ranks[i]);
    if (is(r, "0")) c->launcher_rank = 0;
    else if (positive(r)) c->launcher_rank = positive(r);
  }
  c->local_ranks = positive(env("OMPI_COMM_WORLD_LOCAL_SIZE"));
  if (!c->local_ranks) c->local_ranks = positive(env("MPI_LOCALNRANKS"));
  /* The rank among this host's, which picks its GPU (one GPU a rank). */
  static const char *const local[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID",
                                      "SLURM_LOCALID"};
  for (size_t i = 0; i < sizeof local / sizeof local[0] && c->local_rank < 0; i++) {
    const char *r = env(local[i]);
    if (is(r, "0")) c->local_rank = 0;
    else if (positive(r)) c->local_rank = positive(r);
  }
  c->omp_threads = positive(env("OMP_NUM_THREADS"));

  KILN_TRY(kiln_fault_parse(env(KILN_FAULT_ENV), &c->fault));

  const char *lim = env("KILN_HDF5_FILE_LIMIT");
  if (lim && !size_value(lim, &c->hdf5_file_limit))
    return kiln_errorf(KILN_ERR_INVALID,
                       "KILN_HDF5_FILE_LIMIT='%s' is not a size in bytes (e.g. 512M, 4G)", lim);

  const char *home = env("HOME"), *v;
  if ((v = env("KILN_DATA")))
    KILN_TRY(place(c->data_dir, sizeof c->data_dir, "KILN_DATA", v, NULL));
  else if (home)
    KILN_TRY(place(c->data_dir, sizeof c->data_dir, "HOME", home, "/.cache/kiln/datasets"));
  if ((v = env("XDG_DATA_HOME")))
    KILN_TRY(place(c->ce_db, sizeof c->ce_db, "XDG_DATA_HOME", v, "/kiln/ce.db"));
  else if (home)
    KILN_TRY(place(c->ce_db, sizeof c->ce_db, "HOME", home, "/.local/share/kiln/ce.db"));
  if ((v = env("XDG_CACHE_HOME")))
    KILN_TRY(place(c->machine_cache, sizeof c->machine_cache, "XDG_CACHE_HOME", v,
                   "/kiln/machine.txt"));
  else if (home)
    KILN_TRY(place(c->machine_cache, sizeof c->machine_cache, "HOME", home,
                   "/.cache/kiln/machine.txt"));
  if ((v = env("KILN_GIT_COMMIT")))
    KILN_TRY(place(c->git_commit, sizeof c->git_commit, "KILN_GIT_COMMIT", v, NULL));
  /* A PATH too long to keep only means mpirun is not looked for there. */
  if ((v = env("PATH")) && place(c->search_path, sizeof c->search_path, "PATH", v, NULL))
    c->search_path[0] = '\0';
  return KILN_OK;
}
