/* Shared pieces of the `kiln` command's subcommands: argument helpers, the metrics (JSON Lines)
 * writer, the terminal progress line. */
#ifndef KILN_TOOL_H
#define KILN_TOOL_H

#include <stdbool.h>
#include <stdio.h>

#include "kiln/solver.h"

int cmd_train(int argc, char **argv);
int cmd_test(int argc, char **argv);
int cmd_time(int argc, char **argv);
int cmd_convert(int argc, char **argv);
int cmd_data(int argc, char **argv);
int cmd_compute_mean(int argc, char **argv);
int cmd_describe(int argc, char **argv);
int cmd_compare_weights(int argc, char **argv);
int cmd_ce(int argc, char **argv);
/* kiln ce history, kiln ce compare (cequery.c); argv[1] is the subcommand. */
int cmd_ce_history(int argc, char **argv);
int cmd_ce_compare(int argc, char **argv);
/* kiln ce bisect (cebisect.c); argv[1] is "bisect". */
int cmd_ce_bisect(int argc, char **argv);
/* The value of the `kiln ce` option argv[*i] (*i moves past it): the text into *slot, or else a
 * positive integer into *islot. 0, or -1 after printing why ("WHAT: --last needs a value"). */
int tool_ce_option_value(const char *what, int argc, char **argv, int *i, const char **slot,
                         int *islot);
int cmd_upgrade(int argc, char **argv);
int cmd_sample(int argc, char **argv);
int cmd_decode(int argc, char **argv);
int cmd_detect(int argc, char **argv);
int cmd_export(int argc, char **argv);
int cmd_import(int argc, char **argv);

/* Caffe's spellings of the options (-solver=F, --solver=F, -solver F) rewritten as kiln's
 * (--solver F), Caffe's -gpu checked and dropped (its value in tool_caffe_gpu): the new argument
 * count, *out the new arguments (kept for the life of the process); -1 when out of memory, -2
 * when -gpu names no device (the message printed). */
int tool_caffe_args(int argc, char **argv, char ***out);
/* Caffe's -gpu value ("0", "0,1", "all") when one was given, else NULL. */
extern const char *tool_caffe_gpu;

/* --help and -h: a request for a command's usage (only where an option may stand, never as the
 * value of another option). */
bool tool_is_help(const char *arg);
/* A command's usage on stdout for --help, then exit 0 (1 when stdout would not take it). */
_Noreturn void tool_help(void (*usage)(FILE *f));
/* The lines of --help text for the options tool_common_option takes (`metrics`: the events the
 * command writes to --metrics, e.g. "test, decode"; NULL: a command that takes no --metrics),
 * and the line for -h, --help itself. */
void tool_common_usage(FILE *f, const char *metrics);
void tool_help_usage(FILE *f);

/* Prints "kiln: <what>: <kiln_last_error()>" to stderr and returns exit code 1. */
int tool_fail(const char *what);
/* Parses "512M", "2G", "1048576"; false if malformed, not finite or past 2^64 bytes. */
bool tool_parse_size(const char *s, uint64_t *out);
bool tool_parse_int(const char *s, int *out);
/* The whole number `v` of option `opt` (of command `cmd`; NULL: one every command takes) in
 * lo..hi: true and *out; else false after printing why, always with the range: "kiln sample:
 * --length: '2147483648' is out of range: --length takes 0 to 16777216", or "... 'ten' is not a
 * whole number (--length takes 0 to 16777216)". */
bool tool_int_option(const char *cmd, const char *opt, const char *v, long long lo, long long hi,
                     long long *out);
bool tool_int_option_int(const char *cmd, const char *opt, const char *v, int lo, int hi,
                         int *out);
/* --threads takes 1 to this. */
#define TOOL_MAX_THREADS 1024
/* False after printing that `what` (an option: "kiln test: --model: the value is empty"; or an
 * argument: "kiln upgrade: IN is empty") is empty, when v is "". */
bool tool_nonempty(const char *cmd, const char *what, const char *v);
/* "kiln CMD: unexpected argument 'ARG' (see kiln CMD --help)" on stderr; returns 2. */
int tool_unexpected(const char *cmd, const char *arg);
/* Standard options every command takes: --threads N (applied at once), --metrics FILE,
 * --max-memory SIZE. Returns 1 if argv[*i] was one of them (consuming its value), -1 on error. */
typedef struct {
  const char *metrics;
  uint64_t max_memory;
  int threads;
} tool_common;
int tool_common_option(tool_common *c, int argc, char **argv, int *i);
/* A command's option at argv[*i] taken as `--name value` (*opt, *val; *i moves past the value),
 * `names` (NULL-terminated) being the command's own options, each taking a value: 1; 0 for a
 * common option, taken; -1 after printing why (an argument that is no option, an unknown option,
 * a missing or empty value, a bad common one). --help or -h there prints `usage` (tool_help). */
int tool_option_value(const char *cmd, const char *const *names, void (*usage)(FILE *f),
                      tool_common *c, int argc, char **argv, int *i, const char **opt,
                      const char **val);

/* The metrics file (include/kiln/metrics.h; none without --metrics) and the human output. */
typedef struct {
  kiln_metrics_file *file;
  bool tty;            /* stderr is a terminal: progress line updates in place */
  double last_progress_ms;
  int rank;
  bool failed;         /* a write failed: the message is printed once, the run ends in error */
} tool_metrics;
/* --metrics FILE (path NULL: none) for a command that reads `inputs` (n paths, NULL ones
 * skipped; one that names no file is taken as a comma-separated list, as kiln train's --weights):
 * refused, naming both, when it is one of them, since opening it truncates it. */
int tool_metrics_open(tool_metrics *m, const char *path, const char *const *inputs, size_t n);
/* Closes the file; -1 (after printing why) when any write or the close failed. */
int tool_metrics_close(tool_metrics *m);
/* Writes an event of this process (rank m->rank) with its fields. */
void tool_metrics_write(tool_metrics *m, const char *event, int iter, double time_ms,
                        int nfields, const kiln_metric_field *fields);
/* The net of a model prototxt (upgraded from Caffe's old formats) in `phase` with the given
 * stages (Caffe's NetState), under the environment's configuration; `share_data`:
 * kiln_net_options.share_data (a tool that gives the net backward passes of its own, as kiln
 * time does, leaves it off). The net keeps pointers into *msg: free both with tool_free_net, the
 * net first. */
int tool_load_net(const char *model, int phase, const char *const *stages, int nstages,
                  uint64_t max_memory, bool share_data, kiln_net **net, ProtobufCMessage **msg);
/* tool_load_net with `edit` (when not NULL) run on the upgraded message before the net is built
 * (kiln decode plans its inputs' largest shapes). */
typedef int (*tool_net_edit)(Caffe__NetParameter *np, void *user);
int tool_load_net_edited(const char *model, int phase, const char *const *stages, int nstages,
                         uint64_t max_memory, bool share_data, tool_net_edit edit, void *user,
                         kiln_net **net, ProtobufCMessage **msg);
void tool_free_net(kiln_net *net, ProtobufCMessage *msg);

/* kiln decode's work (decode.c), also run by `kiln test --decode`: decodes the sources of the
 * pairs in `input` with the deploy net `model`, prints the token error rate and word accuracy,
 * and writes them as a "decode" event. Returns the exit code. */
/* --beam and --max-len (of decode, and of test --decode) take 1 to these. */
#define TOOL_MAX_BEAM 1024
#define TOOL_MAX_DECODE_LEN (1 << 20)
typedef struct {
  const char *model, *weights, *vocab, *target_vocab, *input, *output;
  int beam; /* 0: greedy */
  int max_len, limit;
  uint64_t max_memory;
} tool_decode_args;
int tool_decode(const tool_decode_args *a, tool_metrics *m);

/* The solver's event callback: metrics file plus human output on stderr. */
void tool_on_event(const kiln_event *e, void *user);

#endif
