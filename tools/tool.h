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
int cmd_describe(int argc, char **argv);
int cmd_compare_weights(int argc, char **argv);
int cmd_ce(int argc, char **argv);

/* Prints "kiln: <what>: <kiln_last_error()>" to stderr and returns exit code 1. */
int tool_fail(const char *what);
/* Parses "512M", "2G", "1048576"; false if malformed. */
bool tool_parse_size(const char *s, uint64_t *out);
bool tool_parse_int(const char *s, int *out);
/* Standard options every command takes: --threads N (applied at once), --metrics FILE,
 * --max-memory SIZE. Returns 1 if argv[*i] was one of them (consuming its value), -1 on error. */
typedef struct {
  const char *metrics;
  uint64_t max_memory;
  int threads;
} tool_common;
int tool_common_option(tool_common *c, int argc, char **argv, int *i);

/* JSON Lines metrics: one object per event. */
typedef struct {
  FILE *f;
  bool tty;            /* stderr is a terminal: progress line updates in place */
  double last_progress_ms;
  int rank;
} tool_metrics;
int tool_metrics_open(tool_metrics *m, const char *path);
void tool_metrics_close(tool_metrics *m);
/* Writes an event with extra numeric fields (name/value pairs). */
void tool_metrics_write(tool_metrics *m, const char *event, int iter, double time_ms,
                        int nfields, const char *const *names, const double *values);
void tool_json_string(FILE *f, const char *s);
/* The solver's event callback: metrics file plus human output on stderr. */
void tool_on_event(const kiln_event *e, void *user);

#endif
