/* kiln's runtime configuration: every switch that changes what the library does at run time,
 * in one struct. The `kiln` command fills it once, from the environment (kiln_config_from_env,
 * the only code of the library that reads environment variables) and then from its command
 * line, and passes it down: kiln_net_options.config, kiln_solver_options.config (which hands it
 * to the solver's nets), kiln_comm_mpi_create, kiln_ce_options.config, and the data-set cache
 * functions. Whoever passes NULL gets kiln_config_defaults(). Each switch is listed with its
 * variable in the README's table of switches. */
#ifndef KILN_CONFIG_H
#define KILN_CONFIG_H

#include <stdbool.h>
#include <stdint.h>

#include "kiln/core.h"
#include "kiln/device.h"

/* How oneDNN's convolutions lay out plain-side activations (for kiln-conv-routes, which times
 * each route): kiln's rule, oneDNN's choice, or channels-last. */
typedef enum {
  KILN_DNNL_LAYOUT_RULE,
  KILN_DNNL_LAYOUT_ANY,
  KILN_DNNL_LAYOUT_NHWC
} kiln_dnnl_layout;

/* The kernels a net runs (include/kiln/backend.h): the optimised CPU ones, or the plain C
 * reference (kiln's im2col + GEMM convolutions and serial loops; results do not depend on the
 * thread count), which the optimised ones are tested against. */
typedef enum { KILN_ENGINE_CPU = 0, KILN_ENGINE_REF = 1, KILN_ENGINE_CUDA = 2 } kiln_engine;

/* The number format of the products (include/kiln/backend.h, "cpu-bf16"): kiln_config.precision
 * is DEFAULT until the command line (--precision) or KILN_PRECISION says, and then a solver's
 * `precision` field decides (fp32 where it has none). BF16 is mixed precision: the inputs of
 * convolutions, InnerProducts and the recurrent and attention projections rounded to bfloat16,
 * their sums and everything else (weights, their update, normalisation, losses) in fp32. */
typedef enum { KILN_PRECISION_DEFAULT = 0, KILN_PRECISION_FP32 = 1, KILN_PRECISION_BF16 = 2 } kiln_precision;

/* Sums of several workers on one host: through MPI's shared-memory window, gradients summed
 * where they lie (ON); through the window with copies in and out (COPY, for measurements); or
 * through MPI's own collectives (OFF). */
typedef enum { KILN_COMM_SHM_ON, KILN_COMM_SHM_OFF, KILN_COMM_SHM_COPY } kiln_comm_shm;

enum { KILN_CONFIG_PATH_MAX = 4096 };

/* The limit on a worker's wait for the others (--comm-timeout) unless the command line says
 * otherwise. */
#define KILN_COMM_DEFAULT_TIMEOUT_S 300.0

typedef struct kiln_config {
  /* computation (KILN_ENGINE, KILN_DEVICE, KILN_LAYOUT, KILN_FUSE, KILN_RECOMPUTE, KILN_SHARE_DATA,
   * KILN_CONV_ALGO, KILN_DENORMALS, KILN_DNNL_LAYOUT) */
  kiln_precision precision; /* KILN_PRECISION=fp32|bf16 (--precision): the products' number
                               format; DEFAULT: the solver's field, else fp32 */
  kiln_engine engine;     /* which kernels run (KILN_ENGINE=ref: the reference; =cuda on hostsim:
                              the CUDA backend's kernels emulated, for tests) */
  kiln_device_kind device; /* where nets keep their tensors (KILN_DEVICE=hostsim: the host behind
                              a device's walls, for tests; =cuda:N, or a solver's solver_mode GPU:
                              GPU N; include/kiln/device.h) */
  int device_index;       /* the GPU's number for KILN_DEVICE_CUDA; -1: by local rank */
  bool no_cudnn;          /* KILN_CUDNN=0: the GPU's convolutions by im2col + cuBLAS even where
                             kiln was built with cuDNN */
  bool tf32;              /* KILN_TF32=1: cuBLAS and cuDNN may use TF32 tensor cores for fp32
                             products (10-bit mantissas in the products); off, results track fp32 */
  bool plain_layouts;     /* every activation in Caffe's plain layout */
  bool unfused;           /* every layer on its own (no kiln_layer_ops.fuse) */
  bool no_recompute;      /* every activation kept for backward (no kiln_layer_ops.recompute) */
  bool no_share_data;     /* every activation keeps its own data (no sharing by lifetime,
                             kiln_net_options.share_data) */
  bool conv_direct;       /* no Winograd for 3x3 convolutions */
  bool keep_denormals;    /* KILN_DENORMALS=keep: subnormal floats as IEEE computes them, not
                             flushed to zero (kiln_set_flush_denormals; the tools apply it) */
  kiln_dnnl_layout dnnl_layout;
  /* workers (KILN_COMM_THREAD, KILN_COMM_SHM, and what the MPI launcher announces) */
  int comm_thread_us;     /* > 0: a communication thread polls the sums this often */
  kiln_comm_shm comm_shm;
  int launcher_size;      /* processes announced by an MPI launcher (0: none) */
  int launcher_rank;      /* this process's rank as the launcher announces it (-1: none) */
  int local_rank;         /* its rank among this host's processes (-1: none announced) */
  double comm_timeout_s;  /* a worker waiting longer for the others ends the job, from the
                             start-up on (--comm-timeout; 0: wait forever) */
  int local_ranks;        /* of them on this host (0: unknown) */
  int omp_threads;        /* OMP_NUM_THREADS when set to a positive count, else 0 */
  /* debugging and planted faults (KILN_FAULT; --debug-slow-rank) */
  kiln_fault fault;
  int debug_slow_rank;    /* this rank sleeps debug_slow_ms after each iteration (0 ms: off) */
  double debug_slow_ms;
  /* data (KILN_HDF5_FILE_LIMIT) */
  uint64_t hdf5_file_limit; /* bytes one HDF5 data file may take in memory (its bytes and its
                               values as floats); 0: a quarter of the memory available when the
                               layer is set up (docs/formats.md, HDF5 data files) */
  /* places (KILN_DATA or HOME; XDG_DATA_HOME or HOME; XDG_CACHE_HOME or HOME;
   * KILN_GIT_COMMIT; PATH) */
  char data_dir[KILN_CONFIG_PATH_MAX]; /* the data set cache; "" when neither variable is set */
  char ce_db[KILN_CONFIG_PATH_MAX];    /* CE history's default database; "" as above */
  char machine_cache[KILN_CONFIG_PATH_MAX]; /* this boot's measured FMA peaks, which CE's
                                               machine class needs; "" as above (measured
                                               every time) */
  char git_commit[64];                 /* overrides what git says of the sources ("" none) */
  char search_path[KILN_CONFIG_PATH_MAX]; /* PATH, where the CE runner looks for mpirun */
} kiln_config;

/* Compiled-in defaults: every switch off, no fault, no places known. */
void kiln_config_init(kiln_config *c);
/* The device from its name: "host", "hostsim", "cuda" (the GPU of the worker's local rank, around
 * the GPUs there are: GPU 0 for a single process) or "cuda:N"; another is
 * KILN_ERR_INVALID naming `what` (the variable or option it came from). */
int kiln_config_set_device(kiln_config *c, const char *name, const char *what);
/* The precision from its name: "fp32" (or "float", "FP32") or "bf16" ("BF16", "bfloat16"); another
 * is KILN_ERR_INVALID naming `what`. */
int kiln_config_set_precision(kiln_config *c, const char *name, const char *what);
const kiln_config *kiln_config_defaults(void);
/* kiln_config_init, then the environment. A malformed KILN_FAULT or KILN_HDF5_FILE_LIMIT is
 * KILN_ERR_INVALID with a message naming it; a malformed KILN_COMM_THREAD is logged as a warning and ignored, as is any
 * unknown value of the other switches; a path longer than KILN_CONFIG_PATH_MAX - 1 is
 * KILN_ERR_INVALID. */
int kiln_config_from_env(kiln_config *c);

#endif
