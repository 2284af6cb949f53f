/* Fault injection for the CE harness's tests (KILN_FAULT). */
#ifndef KILN_FAULT_H
#define KILN_FAULT_H

#include <stddef.h>
#include <stdint.h>

/* Deliberate faults that let tests plant a real regression in an unchanged trainer (the CE
 * harness's end-to-end tests; docs/ce.md). The environment variable KILN_FAULT chooses one:
 *   sleep:LAYER:MS   every forward of layer LAYER sleeps MS milliseconds (0.001..60000, at most
 *                    three decimals)
 *   slowread:LAYER:MS  data layer LAYER's reader (its prefetch thread) takes MS milliseconds (as
 *                    for sleep)
 *                    for each batch, reading included (it sleeps the rest): a slow disk, for
 *                    the prefetch measurement (bench/prefetch)
 *   leak:KB          every training iteration allocates and touches KB kilobytes (1..1048576)
 *                    that stay allocated (reachable, so LeakSanitizer stays quiet) until exit
 *   lr:FACTOR        every learning rate the solver applies is the lr_policy's times FACTOR
 *                    (a decimal number, 0 < FACTOR <= 1000): a planted accuracy drop
 *   stop:STAGE:RANK  the worker of rank RANK stops itself (SIGSTOP) at a point of the MPI start-up:
 *                    STAGE `start` (before MPI_Init), `init` (after it, before kiln's
 *                    communicators) or `setup` (before the first collective): a rank that stops
 *                    or hangs there, for the tests of the stall detection (docs/distributed.md)
 * Unset or empty: no fault. kiln_config_from_env (include/kiln/config.h) reads the variable. */
#define KILN_FAULT_ENV "KILN_FAULT"

typedef enum {
  KILN_FAULT_NONE,
  KILN_FAULT_SLEEP,
  KILN_FAULT_LEAK,
  KILN_FAULT_STOP,
  KILN_FAULT_SLOW_READ,
  KILN_FAULT_LR
} kiln_fault_kind;

typedef struct kiln_fault {
  kiln_fault_kind kind;
  char layer[128]; /* sleep, slowread: the layer's name */
  int64_t us;      /* sleep: per forward; slowread: per batch read (MS given to 0.001) */
  int64_t kb;      /* leak: per training iteration */
  char stage[8];   /* stop: "start", "init" or "setup" */
  int rank;        /* stop: the worker that stops */
  double lr_factor; /* lr: what every learning rate is multiplied by */
} kiln_fault;

/* Parses a KILN_FAULT value; a malformed one is KILN_ERR_INVALID with a message naming the
 * variable and the expected syntax. */
int kiln_fault_parse(const char *text, kiln_fault *out);
/* "sleep 20 ms in every forward of layer 'conv1'", for logs and warnings. */
const char *kiln_fault_describe(const kiln_fault *f, char *buf, size_t n);
/* The fault's effects; each does nothing for a fault of another kind. */
void kiln_fault_sleep(const kiln_fault *f);
int kiln_fault_leak(const kiln_fault *f);
/* Stops this process (SIGSTOP) when the fault is stop:STAGE:RANK with this stage and rank. */
void kiln_fault_stop(const kiln_fault *f, const char *stage, int rank);

#endif
