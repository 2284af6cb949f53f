/* kiln ce: continuous evaluation. A suite (CeSuite in kiln.proto) names models to train on one and
 * several workers and the KPIs to judge them by; the runner trains each as a child `kiln train`
 * process (so a crash is a recorded failure), reads its JSON Lines metrics, reduces them to KPI
 * values, applies the absolute checks (floor, NaN, crash, timeout, a run that ended early or never
 * learned), compares with the accepted baseline under per-KPI tolerances widened by the observed
 * noise, keeps every value in a SQLite history and writes reports (terminal table, JSON Lines,
 * one-file HTML with SVG trend plots). Like the rest of the library it prints nothing: progress
 * goes to a callback, reports to files or returned strings. docs/ce.md is the user's guide. */
#ifndef KILN_CE_H
#define KILN_CE_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kiln/config.h"
#include "kiln/proto.h"

/* ---- KPIs --------------------------------------------------------------------------------- */

typedef struct kiln_ce_kpi_info {
  const char *name;       /* as written in a suite: "accuracy", "duration_s", ... */
  const char *unit;       /* for tables: "", "MB", "s", "samples/s", "x" */
  bool higher_is_better;  /* the default direction */
  bool machine_dependent; /* compared only against a baseline of the same machine class */
  bool timing;            /* noisy: measured on every repeat, median compared, regressions re-run */
  bool multi_worker;      /* defined only for worker counts above 1 (speedup, efficiency) */
  bool decoded;           /* from `kiln decode` after training (per, word_accuracy): only for a
                             model with a decode entry */
  double default_rel_tolerance, default_abs_tolerance; /* when the suite declares neither */
} kiln_ce_kpi_info;

/* The catalogue entry for a KPI name, or NULL when there is none. */
const kiln_ce_kpi_info *kiln_ce_kpi_lookup(const char *name);
/* "accuracy, f1, mAP, perplexity, ..." for error messages. */
const char *kiln_ce_kpi_names(void);

/* A suite's CeKpi with every default applied. */
typedef struct kiln_ce_kpi_spec {
  const kiln_ce_kpi_info *info;
  bool higher_is_better;
  int reduction; /* CAFFE__CE_KPI__REDUCTION__LAST, __BEST, __MEAN_LAST */
  int mean_last_n;
  double rel_tolerance, abs_tolerance;
  double floor, ceiling; /* NaN when there is none; accuracy's floor is 0.5 unless declared */
} kiln_ce_kpi_spec;

/* KILN_ERR_INVALID for an unknown name (the message lists the known ones), a negative tolerance
 * or mean_last_n below 1. */
int kiln_ce_kpi_resolve(const Caffe__CeKpi *k, kiln_ce_kpi_spec *out);

/* ---- statistics and reductions ------------------------------------------------------------ */

double kiln_ce_median(const double *v, int n);  /* NaN when n == 0 */
double kiln_ce_stddev(const double *v, int n);  /* sample standard deviation; 0 when n < 2 */
/* A run's series reduced to one value: its last element, its best one (by direction) or the mean
 * of its last n. NaN for an empty series; non-finite elements make the result NaN. */
double kiln_ce_reduce(const double *v, int n, int reduction, int mean_last_n,
                      bool higher_is_better);

/* ---- metrics: kiln's JSON Lines (one flat object per event) -------------------------------- */

typedef struct kiln_ce_series {
  int n, cap;
  int *iter;
  double *value; /* NaN where the event said null (kiln writes non-finite figures as null) */
  double *time_s; /* each event's time_ms in seconds (since the solver was created); NaN where
                   * the event has none */
} kiln_ce_series;

typedef struct kiln_ce_metrics {
  kiln_ce_series train_loss;  /* "train" events of rank 0 */
  kiln_ce_series train_accuracy; /* the same events' "accuracy": a train net's Accuracy output
                                  * (phase TRAIN), on the batch of the display iteration */
  kiln_ce_series test_loss;   /* "test" events of rank 0, test net 0 */
  kiln_ce_series accuracy;    /* the same events' "accuracy" */
  kiln_ce_series f1;          /* their "f1" (an F1 layer's, derived over the whole pass) */
  kiln_ce_series map;         /* their "mAP" (DetectionEvaluate's rows, over the whole pass) */
  kiln_ce_series perplexity;  /* their "perplexity", or exp(loss) when they have none */
  double peak_rss_mb;         /* the largest over all events and ranks; NaN without any */
  double peak_device_mb;      /* likewise of peak_device_mb (nets on a GPU); NaN without any */
  double duration_s;          /* the "done" event's time_ms of rank 0; NaN without one */
  double samples_per_s;       /* the median over the train events after the first (rank 0 writes
                               * them with the throughput of all workers); NaN without any */
  double cpu_wait_s;          /* the "done" event's cpu_wait_ms (the training thread's time
                               * runnable but waiting for a CPU), in s; NaN without one */
  /* rank 0's train events in order: throughput, time_ms and cpu_wait_ms (NaN where null) */
  kiln_ce_series window_sps, window_time_ms, window_wait_ms;
  /* set by kiln_ce_metrics_discount_wait: the figures on the wall clock, and the wait taken out
   * (0 before, or when nothing could be taken out) */
  double wall_duration_s, wall_samples_per_s, discounted_wait_s;
  bool done;                  /* a "done" event was seen */
  int last_iter;              /* the largest iteration of any event; -1 without events */
  int nonfinite_iter;         /* first iteration whose loss was null or non-finite; -1 if none */
  int nranks;                 /* distinct ranks seen */
  int nworkers_reported;      /* distinct ranks of "worker" events (one per worker at the end of
                               * a multi-worker run) */
  int nevents;
  bool truncated_tail;        /* the last line was cut off (a killed process) and skipped */
  /* `kiln decode --metrics`: its "decode" event (the last one of rank 0) */
  bool decoded;               /* a "decode" event was seen */
  double per;                 /* its token (phoneme) error rate; NaN without one */
  double word_accuracy;       /* its share of records decoded exactly; NaN without one */
  int decode_words;           /* the records it decoded; 0 without one */
} kiln_ce_metrics;

/* Parses JSON Lines text. A malformed line other than the last gives KILN_ERR_PARSE naming
 * `name:line`; a malformed last line is what a killed writer leaves and is skipped. */
int kiln_ce_metrics_parse(const char *text, size_t len, const char *name, kiln_ce_metrics *out);
int kiln_ce_metrics_read(const char *path, kiln_ce_metrics *out);
void kiln_ce_metrics_free(kiln_ce_metrics *m);

/* Takes the machine's load out of the timing figures: the time the training thread waited for
 * a CPU (cpu_wait_s), as far as other processes' CPU time during the run (`others_cpu_s`: all
 * the machine's busy CPU time less the trainer's own; NaN when unknown) can account for it, is
 * taken out of duration_s and out of each throughput window before the median. A wait the
 * trainer's own threads caused (others_cpu_s near 0) stays in: oversubscribing the cores is a
 * regression of kiln's. Without a cpu_wait_s (older metrics, no schedstat) nothing changes. */
void kiln_ce_metrics_discount_wait(kiln_ce_metrics *m, double others_cpu_s);

/* The value of a (non multi-worker) KPI from one run's metrics; NaN when the run has no such
 * figure. per and word_accuracy come from a "decode" event: the runner reads the decode's own
 * metrics file and copies them into the training's (kiln_ce_metrics_take_decode). */
double kiln_ce_kpi_value(const kiln_ce_metrics *m, const kiln_ce_kpi_spec *k);
/* Copies the decode figures of `decode` (a `kiln decode --metrics` file's) into `m`. */
void kiln_ce_metrics_take_decode(kiln_ce_metrics *m, const kiln_ce_metrics *decode);

/* ---- verdicts ----------------------------------------------------------------------------- */

typedef enum kiln_ce_verdict {
  KILN_CE_PASS,       /* within tolerance of the baseline */
  KILN_CE_IMPROVED,   /* better than the baseline by more than the tolerance (accept it?) */
  KILN_CE_NEW,        /* no baseline to compare with; the absolute checks passed */
  KILN_CE_SKIP,       /* not run, with the reason (no mpirun for a multi-worker entry) */
  KILN_CE_NA,         /* measured but not judged, with the reason: a timing KPI of more workers
                       * than the machine has cores ("n/a") */
  KILN_CE_REGRESSION, /* worse than the baseline by more than the tolerance */
  KILN_CE_ERROR,      /* the harness could not run this entry (missing data set, spawn failed) */
  KILN_CE_FAIL,       /* absolute failure: crash, timeout, NaN, under the floor, not learning */
  KILN_CE_VERDICT_COUNT
} kiln_ce_verdict;

const char *kiln_ce_verdict_name(kiln_ce_verdict v);

/* How one child training process ended. */
typedef enum kiln_ce_child_end {
  KILN_CE_CHILD_EXITED,   /* `code` is the exit status */
  KILN_CE_CHILD_SIGNALED, /* `code` is the signal */
  KILN_CE_CHILD_TIMEOUT,
  KILN_CE_CHILD_NOT_STARTED
} kiln_ce_child_end;

typedef struct kiln_ce_child {
  kiln_ce_child_end end;
  int code;
  double wall_s;
  double timeout_s;
  double cpu_s;        /* user + system CPU time of the child and the processes it waited for */
  double others_cpu_s; /* CPU time every other process on the machine used meanwhile (the
                        * machine's busy time less cpu_s); NaN when /proc/stat is unreadable */
  char last_error[512]; /* the last "kiln: ..." line of the child's log, if any */
} kiln_ce_child;

/* What the absolute checks need to know about a run besides the KPI value. */
typedef struct kiln_ce_run_facts {
  int planned_iter;           /* the max_iter the run was given */
  int reached_iter;           /* the last iteration its metrics report */
  double epochs;              /* passes over the training set; NaN when unknown */
  double min_epochs_learning; /* from this many epochs on, low accuracy means "not learning" */
} kiln_ce_run_facts;

/* Run-level absolute checks: crash (signal or non-zero exit), timeout, NaN or infinite loss, no
 * "done" event. Returns true and the reason in words when the run failed. */
bool kiln_ce_run_failed(const kiln_ce_child *c, const kiln_ce_metrics *m, char *reason, size_t n);

/* The same for the `kiln decode` a model with `decode` runs after training (`d`: its metrics,
 * NULL when unreadable): not started, timeout, crash, non-zero exit, no "decode" event. The
 * reason names the decode; the caller adds its log. */
bool kiln_ce_decode_failed(const kiln_ce_child *c, const kiln_ce_metrics *d, char *reason,
                           size_t n);

/* KPI-level absolute checks: floor and ceiling; for accuracy also a run that ended early with
 * accuracy under the floor, and many epochs with accuracy still under it; a KPI the metrics lack.
 * Returns true and the reason when the value fails. */
bool kiln_ce_kpi_failed(const kiln_ce_kpi_spec *k, double value, const kiln_ce_run_facts *f,
                        char *reason, size_t n);

/* Whether a KPI of a configuration of `workers` workers can be judged on `cores` cores: a timing
 * KPI (duration, throughput, speedup, efficiency) of more workers than cores measures how the
 * workers share the cores, not kiln, so it is not judged. Returns true with the reason ("4
 * workers on 2 cores: timing not judged") when it is not; accuracy, losses and memory always are.
 */
bool kiln_ce_kpi_not_applicable(const kiln_ce_kpi_info *k, int workers, int cores, char *reason,
                                size_t n);

/* Compares a value (median of its repeats, `spread` their standard deviation) with a baseline:
 * the allowed difference is max(rel_tolerance x |baseline|, abs_tolerance, noise_k x the larger
 * of the two spreads); worse by more is a regression, better by more an improvement. Fills the
 * effective tolerance, the relative change ((value - baseline) / |baseline|, NaN for a zero
 * baseline) and a reason in words. */
kiln_ce_verdict kiln_ce_compare(const kiln_ce_kpi_spec *k, double value, double spread,
                                double baseline, double baseline_spread, double noise_k,
                                double *tolerance, double *change, char *reason, size_t n);

/* ---- machines ----------------------------------------------------------------------------- */

typedef struct kiln_ce_machine {
  char cpu[128];       /* /proc/cpuinfo "model name" (hypervisors often shorten it) */
  char vendor[16];     /* "intel", "amd", "arm", ...: from vendor_id (x86) or the CPU
                        * implementer (Arm); "" when unknown */
  int family, model, stepping; /* x86: cpu family, model, stepping; Arm: the architecture, the
                                * part number and the revision; -1 when unknown */
  char flags[160];     /* the flags that matter for speed, as /proc/cpuinfo spells them, those
                        * the CPU has, space-separated: avx2 fma avx512f avx512_bf16 amx_bf16
                        * amx_tile (Arm: asimd sve sve2 bf16) */
  double fma_gflops[2]; /* one thread's FMA peak: [0] AVX2, [1] AVX-512 (kiln/cpu.h); 0 where
                         * the CPU has no such loop, NaN when not measured */
  char vector_rate[16]; /* the widest FMA that runs at full rate: "avx512rate" (512-bit FMAs
                         * at least 1.5 x the FLOP rate of 256-bit ones), "avx2rate",
                         * "sserate" (no AVX2 FMA); "" when not measured */
  bool peaks_cached;   /* the peaks came from this boot's cache (kiln_config.machine_cache) */
  int cores;           /* online */
  int usable_cores;    /* those this process may run on (kiln_ce_usable_cores) */
  double mem_gib;      /* MemTotal */
  char compiler[64];   /* the compiler that built this kiln */
  char blas[192];      /* OpenBLAS's configuration string */
  int threads;         /* the default thread count (OMP_NUM_THREADS or the cores) */
  char os[96];         /* uname: system, release, machine */
  char hostname[64];
} kiln_ce_machine;

/* Everything but the FMA peaks from this machine; then the peaks, from this boot's cache
 * (`cfg`->machine_cache, rewritten when missing, stale or of another CPU) or measured (a
 * fraction of a second). `cfg` (NULL: defaults) also gives the thread count OMP_NUM_THREADS
 * set (omp_threads). */
void kiln_ce_machine_describe(kiln_ce_machine *m, const kiln_config *cfg);
/* The CPU fields (cpu, vendor, family, model, stepping, flags) from the text of /proc/cpuinfo
 * (its first processor's block); what the text lacks stays unknown. */
void kiln_ce_machine_parse_cpuinfo(kiln_ce_machine *m, const char *text);
/* The one-thread FMA peaks (GFLOP/s; 0: no such loop on this CPU) and the vector_rate they
 * give. */
void kiln_ce_machine_set_peaks(kiln_ce_machine *m, double avx2_gflops, double avx512_gflops);
/* What identifies how fast the machine runs kiln, short and readable:
 * "<vendor>-f<family>m<model>-<vector rate>-<usable cores>c", e.g. "amd-f25m17-avx2rate-2c"
 * (the rate left out where it was not measured). A CPU without vendor, family and model falls
 * back on its model name as a slug ("ibm-power9-8c"). Machines of one class give comparable
 * timings; the stepping and the flags are in the description, not the class. */
void kiln_ce_machine_class(const kiln_ce_machine *m, char *buf, size_t n);
/* The description in words for the table and the report: the CPU, its family, model, stepping
 * and flags, the FMA peaks, the cores. */
void kiln_ce_machine_summary(const kiln_ce_machine *m, char *buf, size_t n);
/* The machine as one JSON object (malloc'd), for the history and the JSON Lines report. */
char *kiln_ce_machine_json(const kiln_ce_machine *m);
/* The cores this process may run on (its CPU affinity, at most the online ones): what the
 * workers of a run share. */
int kiln_ce_usable_cores(void);
/* `git describe --always --dirty` of the repository holding `dir`; "unknown" outside a
 * repository. (kiln_config.git_commit, KILN_GIT_COMMIT, overrides it in kiln_ce_run.) */
void kiln_ce_git_commit(const char *dir, char *buf, size_t n);

/* ---- results of one suite run --------------------------------------------------------------- */

#define KILN_CE_MAX_SAMPLES 32

/* One row per model, worker count and KPI; a run-level failure or skip is one row with KPI
 * "run". */
typedef struct kiln_ce_row {
  char model[64];
  int workers;
  char kpi[32];
  char unit[16];
  bool higher_is_better;
  double value;                 /* median of the samples; NaN when there is none */
  double spread;                /* standard deviation of the samples */
  int nsamples;
  double samples[KILN_CE_MAX_SAMPLES]; /* one per repeat (a confirming re-run adds its own) */
  bool has_baseline;
  double baseline, baseline_spread;
  double change;                /* relative to the baseline */
  double tolerance;             /* effective, in the KPI's unit */
  kiln_ce_verdict verdict;
  char reason[512];
  double busy;                  /* timing KPIs: the median share of the wall clock their samples
                                 * had taken out (waiting for a CPU other processes held); NaN
                                 * when unknown or not a timing KPI */
  int64_t seed;
  int threads;                  /* per worker */
  int iterations;               /* max_iter the run was given */
  char config_hash[17];         /* of the solver as run and its net files */
} kiln_ce_row;

typedef struct kiln_ce_result {
  int64_t run_id;               /* in the history; 0 until recorded */
  char suite_name[128];
  char suite_path[4096];        /* absolute */
  char started_at[32];          /* UTC, ISO 8601 */
  double duration_s;
  char git_commit[64];
  char machine_class[128];
  kiln_ce_machine machine;
  char report_dir[4096];
  char baseline_dir[4096];      /* the suite's baselines (the report draws their curves); empty
                                 * when unknown */
  kiln_ce_row *rows;
  int nrows, cap_rows;
  char **warnings;
  int nwarnings;
} kiln_ce_result;

int kiln_ce_result_add_row(kiln_ce_result *r, const kiln_ce_row *row);
void kiln_ce_result_warn(kiln_ce_result *r, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
void kiln_ce_result_free(kiln_ce_result *r);
/* 2 when any row is an absolute failure, else 3 when the harness could not run an entry, else 1
 * for a regression, else 0. */
int kiln_ce_result_exit_code(const kiln_ce_result *r);

/* ---- baselines: text files per machine class ----------------------------------------------- */

/* <dir>/<machine_class>/<model>.prototxt */
int kiln_ce_baseline_path(const char *dir, const char *machine_class, const char *model,
                          char *buf, size_t n);
int kiln_ce_baseline_read(const char *path, Caffe__CeBaseline **out);
/* Creates the folders and writes through a temporary file and rename(). */
int kiln_ce_baseline_write(const char *path, const Caffe__CeBaseline *b);
const Caffe__CeBaselineValue *kiln_ce_baseline_find(const Caffe__CeBaseline *b, const char *kpi,
                                                    int workers);
/* The baseline of `model` for this machine class; failing that, one from another class (the
 * first in name order), with its class in `found_class`. *out is NULL when there is none. */
int kiln_ce_baseline_lookup(const char *dir, const char *machine_class, const char *model,
                            Caffe__CeBaseline **out, char *found_class, size_t n);
/* Writes the baselines of every model of `r` that has no failed or errored row, merging into an
 * existing file (values this run did not measure are kept). `written` (may be NULL) receives how
 * many files were written; models left out are named in kiln_ce_result warnings of `r`. */
int kiln_ce_accept(kiln_ce_result *r, const char *baseline_dir, int *written);

/* ---- history: SQLite ----------------------------------------------------------------------- */

typedef struct kiln_ce_history kiln_ce_history;

/* kiln_config.ce_db: $XDG_DATA_HOME/kiln/ce.db, or ~/.local/share/kiln/ce.db. */
int kiln_ce_history_default_path(const kiln_config *cfg, char *buf, size_t n);
/* Opens (creating the folders, the file and the schema) in WAL mode. */
int kiln_ce_history_open(const char *path, kiln_ce_history **out);
/* An existing history, read-only (for history, compare and accept, which read it): a missing
 * path, one that is not a regular file, or a database without kiln's tables is KILN_ERR_IO
 * ("not a CE history"), and the file is left as it was. Writing through it fails. */
int kiln_ce_history_open_existing(const char *path, kiln_ce_history **out);
void kiln_ce_history_close(kiln_ce_history *h); /* an open transaction is rolled back */
/* One transaction per run: begin inserts the run (setting r->run_id), add_row one KPI row,
 * commit makes them visible together. A process killed before commit leaves the database as it
 * was before begin. */
int kiln_ce_history_begin(kiln_ce_history *h, kiln_ce_result *r);
int kiln_ce_history_add_row(kiln_ce_history *h, const kiln_ce_result *r, const kiln_ce_row *row);
int kiln_ce_history_commit(kiln_ce_history *h);
/* begin, every row, commit. */
int kiln_ce_history_record(kiln_ce_history *h, kiln_ce_result *r);
/* The newest run of a suite (by absolute path); KILN_ERR_INVALID when there is none. */
int kiln_ce_history_last_run(kiln_ce_history *h, const char *suite_path, int64_t *run_id);
/* A recorded run back into a result (machine description excepted: only its class). */
int kiln_ce_history_load_run(kiln_ce_history *h, int64_t run_id, kiln_ce_result *out);
int kiln_ce_history_count(kiln_ce_history *h, int64_t *runs, int64_t *rows);

typedef struct kiln_ce_point {
  int64_t run_id;
  char time[32];
  char git_commit[64]; /* of the run */
  double value;
  char verdict[16];
} kiln_ce_point;
/* Up to `max_points` newest values of one KPI on one machine class, oldest first. */
int kiln_ce_history_series(kiln_ce_history *h, const char *model, int workers, const char *kpi,
                           const char *machine_class, int max_points, kiln_ce_point **out,
                           int *n);

/* ---- history queries: `kiln ce history` and `kiln ce compare` (query.c) --------------------- */

/* Which rows of the history: one model's, optionally narrowed. */
typedef struct kiln_ce_query {
  const char *model;         /* required */
  const char *kpi;           /* NULL or "": every KPI of the model */
  const char *machine_class; /* NULL or "": every machine class */
  const char *suite;         /* NULL or "": every suite (by its name) */
  int workers;               /* > 0: this worker count only */
  int last;                  /* > 0: the newest `last` values of each KPI and worker count */
} kiln_ce_query;

/* One recorded value, with its run. NaN where the history has none. */
typedef struct kiln_ce_history_row {
  int64_t run_id;
  char time[32];             /* the run's start, UTC, ISO 8601 */
  char git_commit[64];
  char suite[128];
  char machine_class[128];
  char model[64];
  int workers;
  char kpi[32];
  char unit[16];
  bool higher_is_better;
  double value, spread, baseline, change;
  char verdict[16];          /* as kiln_ce_verdict_name wrote it */
  char reason[512];
} kiln_ce_history_row;

/* The matching rows (malloc'd), grouped by KPI in the order the newest run recorded them, then by
 * worker count, each series oldest run first. No matching row is KILN_ERR_INVALID with a message
 * naming what the history holds instead: the models (of the machine class, or the classes the
 * model has history on), the model's KPIs, or the series' worker counts and suites. */
int kiln_ce_history_query(kiln_ce_history *h, const kiln_ce_query *q, kiln_ce_history_row **out,
                          int *n);

/* A run named as `kiln ce run` prints it ("42"), or "latest", or "latest~N" (N runs before the
 * newest). KILN_ERR_PARSE for anything else (a sign, hex, an id past 2^63 - 1: bad usage);
 * KILN_ERR_INVALID for a latest~N beyond the history; a plain id is not looked up here
 * (kiln_ce_history_load_run says when there is no such run). */
int kiln_ce_history_resolve_run(kiln_ce_history *h, const char *spec, int64_t *run_id);

/* One model, worker count and KPI of two runs side by side. */
typedef struct kiln_ce_pair {
  char model[64];
  int workers;
  char kpi[32];
  char unit[16];
  bool higher_is_better;
  bool in_a, in_b;            /* whether each run has the row */
  double a, b;                /* the values; NaN when a run lacks the row or its value */
  kiln_ce_verdict verdict_a, verdict_b; /* KILN_CE_VERDICT_COUNT when a run lacks the row */
  double change;              /* (b - a) / |a|; NaN unless both are finite and a is not 0 */
  int better;                 /* +1 when b is better than a by the KPI's direction, -1 worse, 0
                               * the same or not comparable */
} kiln_ce_pair;

/* Every row of either run (a's in its order, then those only b has), as pairs (malloc'd). */
int kiln_ce_compare_runs(const kiln_ce_result *a, const kiln_ce_result *b, kiln_ce_pair **out,
                         int *n);

/* ---- reports ------------------------------------------------------------------------------- */

/* A KPI value as the reports write it: 4 significant digits (whole numbers from 1000), the unit
 * after a space, "-" for NaN. */
void kiln_ce_format_value(char *buf, size_t n, double v, const char *unit);

/* The terminal table (model, workers, KPI, value, baseline, change, verdict), reasons below it;
 * ANSI colours when `colour`. Malloc'd; NULL when out of memory. */
char *kiln_ce_report_table(const kiln_ce_result *r, bool colour);
/* A "run" object, then one object per row. */
int kiln_ce_report_jsonl(const kiln_ce_result *r, const char *path);
/* One self-contained HTML file: the pass/fail grid, the reasons, and per KPI an inline SVG plot
 * of its history on this machine class (`h` may be NULL: this run's values only). */
int kiln_ce_report_html(const kiln_ce_result *r, kiln_ce_history *h, const char *path);

/* ---- suites and the runner ----------------------------------------------------------------- */

/* Parses and checks a suite: model names, solvers that exist, known KPIs, worker counts. */
int kiln_ce_suite_load(const char *path, Caffe__CeSuite **out);

/* Where a suite's baselines live: its baseline_dir relative to the suite file's folder, or
 * "baselines" beside the suite file. */
void kiln_ce_suite_baseline_dir(const Caffe__CeSuite *s, const char *suite_path, char *buf,
                                size_t n);

typedef void (*kiln_ce_progress_fn)(const char *msg, void *user);

typedef struct kiln_ce_options {
  const char *kiln_path;      /* the kiln executable to train with (required) */
  const char *report_dir;     /* run folders and reports (required; created) */
  const char *machine_class;  /* NULL: this machine's */
  const char *mpirun;         /* NULL: "mpirun" from PATH when there */
  const char *only_model;     /* NULL: every model of the suite */
  int only_workers;           /* > 0: only that worker count of the model (and 1 worker beside
                               * it where a speedup or efficiency KPI needs one); 0: every one */
  const char *baseline_dir;   /* NULL: the suite's (kiln_ce_suite_baseline_dir) */
  bool assume_mpi;            /* tests: launch N > 1 workers even when built without MPI */
  int repeats;                /* > 0: overrides the suite's */
  int cores;                  /* > 0: the cores the workers share (tests); 0: kiln_ce_usable_cores */
  kiln_ce_progress_fn progress;
  void *user;
  /* When not NULL and set non-zero (by the caller's signal handler), the running training is
   * stopped and kiln_ce_run returns KILN_ERR_INVALID ("interrupted"). */
  const volatile sig_atomic_t *cancel;
  /* The runtime configuration (NULL: defaults): the data set cache, PATH for mpirun, the
   * commit to record (git_commit) and the planted fault the trainings will inherit (fault). */
  const kiln_config *config;
} kiln_ce_options;

/* Runs a suite and fills `out` (rows, warnings, machine, commit). A failure status means the
 * harness could not run at all (bad suite, report folder); training failures are rows. */
int kiln_ce_run(const char *suite_path, const kiln_ce_options *o, kiln_ce_result *out);

/* ---- bisection: the commit that regressed ---------------------------------------------------- */

enum { KILN_CE_BISECT_MAX_STEPS = 96 };

typedef struct kiln_ce_bisect_options {
  const char *repo;          /* a folder of the git repository (required) */
  const char *good, *bad;    /* commits (anything `git rev-parse` takes); GOOD an ancestor of BAD */
  const char *suite;         /* the suite file, in the repository: its tolerances judge, and each
                              * commit's own copy of it (same path in its tree) is what that
                              * commit runs, so solvers and nets are the commit's */
  const char *model, *kpi;   /* a model of the suite and a KPI it declares */
  int workers;               /* the worker count whose KPI is followed; 0: the model's first */
  const char *build_command; /* run by /bin/sh in the commit's tree; NULL: CMake's release build
                              * of kiln into build/ */
  const char *kiln_path;     /* the built kiln, relative to the tree; NULL: "build/kiln" */
  double build_timeout_s;    /* per build; 0: an hour */
  const char *work_dir;      /* scratch (created; the worktree, logs and run folders go there);
                              * required */
  bool keep_worktree;        /* leave the worktree registered (else removed at the end) */
  int repeats;               /* > 0: instead of the suite's */
  const char *machine_class, *mpirun; /* as kiln_ce_options */
  kiln_ce_progress_fn progress;
  void *user;
  const volatile sig_atomic_t *cancel;
  const kiln_config *config;
} kiln_ce_bisect_options;

typedef enum {
  KILN_CE_STEP_GOOD,         /* not worse than GOOD's value by more than the tolerance */
  KILN_CE_STEP_BAD,          /* worse by more */
  KILN_CE_STEP_SKIP          /* untestable: its build failed, or its run gave no value */
} kiln_ce_step_verdict;

typedef struct kiln_ce_bisect_step {
  char commit[41];
  char subject[160];
  int position;              /* 0: GOOD, 1..n: the commits after it up to BAD, oldest first */
  double value, spread;      /* median over the repeats, their standard deviation */
  double change;             /* relative to GOOD's value; NaN for GOOD itself or a skip */
  kiln_ce_step_verdict verdict;
  char reason[512];          /* a skip's cause (with its log), or the comparison in words */
} kiln_ce_bisect_step;

typedef struct kiln_ce_bisect_result {
  char good[41], bad[41];    /* the commits, resolved */
  int commits;               /* after GOOD up to BAD, first-parent */
  char kpi[32], unit[16];
  bool higher_is_better;
  int workers;
  double tolerance;          /* the effective one of BAD's comparison with GOOD */
  bool reproduced;           /* BAD is worse than GOOD by more than the tolerance */
  kiln_ce_bisect_step steps[KILN_CE_BISECT_MAX_STEPS]; /* in the order they ran */
  int nsteps;
  int first_bad;             /* index into steps, -1 when not found */
  /* when skipped commits lie just before the first bad one, any of them may be it: their
   * positions are [ambiguous_from, first bad]; ambiguous_from is -1 otherwise */
  int ambiguous_from;
  char worktree[4096];       /* where the commits were built (kept when keep_worktree) */
} kiln_ce_bisect_result;

/* Builds commits between GOOD and BAD in a scratch worktree of the repository (`git worktree`;
 * the user's tree, index and HEAD are never touched), runs the suite's case of the model on each
 * with the suite's repeats, and finds the first commit whose KPI is worse than GOOD's by more
 * than the suite's tolerance (with the noise rule of kiln_ce_compare), by binary search over the
 * first-parent history. GOOD and BAD are measured first: a regression that does not reproduce
 * between them ends the search (reproduced false, KILN_OK). A failure status means the search
 * could not run (bad arguments, not a repository, GOOD or BAD untestable). */
int kiln_ce_bisect(const kiln_ce_bisect_options *o, kiln_ce_bisect_result *out);

#endif
