/* kiln metrics: the events a training run reports (kiln_event, from the solver) and the file
 * they are recorded in: JSON Lines, one object per event, each with "event", "iter", "time_ms"
 * and "rank" and then the event's own figures. The field and event names are declared here
 * once: the writer below uses them, and so does the continuous-evaluation reader
 * (src/ce/metrics.c), so the two cannot drift apart. */
#ifndef KILN_METRICS_H
#define KILN_METRICS_H

#include <stdbool.h>
#include <stdint.h>

/* Event names. */
#define KILN_EV_TRAIN "train"       /* every display iterations */
#define KILN_EV_TEST "test"         /* a test pass of one test net */
#define KILN_EV_SNAPSHOT "snapshot" /* a snapshot written */
#define KILN_EV_PROGRESS "progress" /* every iteration; for progress lines, not recorded */
#define KILN_EV_WORKER "worker"     /* one per worker at the end of a data-parallel run */
#define KILN_EV_DONE "done"         /* the end of training */
#define KILN_EV_TIME "time"         /* kiln time: the whole net */
#define KILN_EV_LAYER_TIME "layer_time" /* kiln time: one layer */
#define KILN_EV_DECODE "decode"     /* kiln decode: an encoder-decoder judged by decoding */

/* Field names. */
#define KILN_MF_EVENT "event"
#define KILN_MF_ITER "iter"
#define KILN_MF_TIME_MS "time_ms"
#define KILN_MF_RANK "rank"
#define KILN_MF_LOSS "loss"
#define KILN_MF_LR "lr"
#define KILN_MF_SAMPLES_PER_S "samples_per_s"
#define KILN_MF_PEAK_RSS_MB "peak_rss_mb"
#define KILN_MF_PEAK_DEVICE_MB "peak_device_mb" /* a net on a device: its memory's peak (GPU) */
#define KILN_MF_CPU_WAIT_MS "cpu_wait_ms"
#define KILN_MF_TEST_NET "test_net"
#define KILN_MF_ACCURACY "accuracy"     /* a test (or train) net's output of that name */
#define KILN_MF_PERPLEXITY "perplexity" /* likewise, or derived: kiln/net.h's KILN_NET_PERPLEXITY */
#define KILN_MF_F1 "f1" /* derived from an F1 layer's counts: kiln/net.h's KILN_NET_F1 */
#define KILN_MF_MAP "mAP" /* a detection test pass's mean average precision: KILN_NET_MAP */
#define KILN_MF_SYNC_MS "sync_ms"
#define KILN_MF_WALL_SAMPLES_PER_S "wall_samples_per_s"
#define KILN_MF_ITERS "iters"
#define KILN_MF_PATH "path"
#define KILN_MF_LAYER "layer"
#define KILN_MF_TYPE "type"
#define KILN_MF_FORWARD_MS "forward_ms"
#define KILN_MF_BACKWARD_MS "backward_ms"
#define KILN_MF_MFLOPS "mflops"
#define KILN_MF_TOTAL_MS "total_ms"
#define KILN_MF_BATCH "batch"
#define KILN_MF_PER "per"                     /* decode: token (phoneme) error rate */
#define KILN_MF_WORD_ACCURACY "word_accuracy" /* decode: the share decoded exactly right */
#define KILN_MF_WORDS "words"                 /* decode: how many records were decoded */
#define KILN_MF_BEAM "beam"                   /* decode: the beam width; 0 for greedy */

typedef struct kiln_event {
  const char *event;   /* KILN_EV_* */
  int iter, max_iter;
  double time_ms;      /* since the solver was created */
  float loss;          /* train: loss smoothed over average_loss iterations; test: loss outputs */
  float lr;
  double samples_per_s;
  double peak_rss_mb;
  double peak_device_mb; /* the nets' device's memory at its peak (kiln_device_memory); 0 or NaN for
                            nets on the host */
  double cpu_wait_ms;  /* since the solver was created, the training thread's time runnable but
                          waiting for a CPU (kiln_thread_cpu_wait_ms); NaN where unknown */
  int test_net;        /* test: which test net */
  int noutputs;        /* test and train: the net's outputs, averaged */
  const char *const *output_names;
  const float *output_values;
  const char *path;    /* snapshot: the .solverstate written */
  int rank;            /* the worker the figures describe (0 but for "worker" events) */
  int nworkers;
  double sync_ms;      /* worker: time spent waiting in collectives (gradient sums, averages) */
  double wall_samples_per_s; /* worker: its samples over its time in iterations and collectives */
  int64_t worker_iters;      /* worker: the iterations it ran (they differ in TIME mode) */
} kiln_event;
/* Events: "train" (every display iterations; loss and samples_per_s over all workers; in MODEL
 * and TIME mode the loss is rank 0's own), "test", "snapshot", "progress", "worker" (at the end of
 * solve, one per rank: its own samples_per_s while computing, wall_samples_per_s counting its
 * waits too, sync_ms and worker_iters) and "done". Only rank 0 emits. */

typedef void (*kiln_event_fn)(const kiln_event *e, void *user);

/* One figure of an event: a number, or text when `text` is not NULL. Non-finite numbers are
 * written as null (JSON has no NaN), which readers take as a missing figure. */
typedef struct kiln_metric_field {
  const char *name;
  double value;
  const char *text;
} kiln_metric_field;

typedef struct kiln_metrics_file kiln_metrics_file;

/* Creates (truncates) `path`; *out NULL and KILN_OK for a NULL path: every write is then a
 * no-op, so callers need not test whether metrics were asked for. A stream: a character device
 * (/dev/null) or a FIFO with a reader is written to; a folder, a socket, a block device or a
 * FIFO no process reads is refused (kiln_check_output, KILN_OUTPUT_STREAMED). */
int kiln_metrics_open(const char *path, kiln_metrics_file **out);
/* One line: event, iter, time_ms, rank, then the fields (a name given twice is written once,
 * the first time), flushed so that a reader sees whole lines while the run goes on. A failed
 * write is remembered: this and every later call return KILN_ERR_IO naming the file. */
int kiln_metrics_write(kiln_metrics_file *m, const char *event, int iter, double time_ms,
                       int rank, int nfields, const kiln_metric_field *fields);
/* A solver event with its figures under the names above (the train net's and test nets' outputs
 * under their own names, after the event's own figures, which win a clash of names: a train
 * event's "loss" is the smoothed loss); "progress" events are not recorded. */
int kiln_metrics_write_event(kiln_metrics_file *m, const kiln_event *e);
/* Flushes and closes; KILN_ERR_IO naming the file when any write or the close failed (a full
 * disk), so a cut file is never taken for a whole one. A file that open created and no event
 * was written to is removed: a command that failed before its first event leaves nothing under
 * the name. NULL: nothing. */
int kiln_metrics_close(kiln_metrics_file *m);

#endif
