/* Fault injection: a deliberate slowdown, memory leak or scaled learning rate, switched on by the
 * KILN_FAULT environment variable, so a test can plant a real throughput, peak-memory or accuracy
 * regression in an unchanged trainer (the CE harness's tests); or a worker that stops during the
 * MPI start-up (the stall detection's tests). kiln_config_from_env parses the variable with
 * kiln_fault_parse; the solver applies the fault of its configuration to its nets and rates. */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kiln/core.h"

enum { MAX_SLEEP_MS = 60000, MAX_LEAK_KB = 1 << 20, MAX_LR_FACTOR = 1000 };

static const char syntax[] =
    "expected sleep:LAYER:MS (every forward of layer LAYER sleeps MS milliseconds, up to 3 "
    "decimals), slowread:LAYER:MS (data layer LAYER's reader takes MS milliseconds a batch), "
    "leak:KB (every training iteration leaks KB kilobytes), lr:FACTOR (every learning rate is "
    "multiplied by FACTOR) or stop:STAGE:RANK (rank RANK stops itself at "
    "STAGE start, init or setup of the MPI start-up)";

/* A whole decimal number in [lo, hi], nothing else (no sign, no spaces, no suffix). */
static bool parse_count(const char *s, size_t len, long lo, long hi, long *out) {
  if (len == 0 || len > 9) return false;
  long v = 0;
  for (size_t i = 0; i < len; i++) {
    if (s[i] < '0' || s[i] > '9') return false;
    v = v * 10 + (s[i] - '0');
  }
  if (v < lo || v > hi) return false;
  *out = v;
  return true;
}

/* Milliseconds with up to three decimals ("4.7", "20"), as whole microseconds in
 * [1, MAX_SLEEP_MS * 1000]: a bench slows a reader to one training step, which is rarely a whole
 * number of milliseconds, and a reader a fraction slower than the step would empty the ring. */
static bool parse_ms(const char *s, size_t len, int64_t *us) {
  const char *dot = memchr(s, '.', len);
  size_t whole = dot ? (size_t)(dot - s) : len, frac = dot ? len - whole - 1 : 0;
  long ms = 0, part = 0;
  if (whole == 0 || !parse_count(s, whole, 0, MAX_SLEEP_MS, &ms)) return false;
  if (dot && (frac == 0 || frac > 3 || !parse_count(dot + 1, frac, 0, 999, &part))) return false;
  for (size_t i = frac; i < 3; i++) part *= 10;
  const int64_t v = (int64_t)ms * 1000 + part;
  if (v < 1 || v > (int64_t)MAX_SLEEP_MS * 1000) return false;
  *us = v;
  return true;
}

/* "20", "4.7", "0.125": microseconds as the milliseconds they were given in */
static const char *ms_text(int64_t us, char *buf, size_t n) {
  if (us % 1000 == 0)
    snprintf(buf, n, "%lld", (long long)(us / 1000));
  else {
    snprintf(buf, n, "%lld.%03lld", (long long)(us / 1000), (long long)(us % 1000));
    for (char *end = buf + strlen(buf) - 1; *end == '0'; end--) *end = '\0';
  }
  return buf;
}

/* A plain decimal number in (0, hi]: digits with at most one point, an exponent allowed (1e-2);
 * no sign, no spaces, no suffix, no inf or nan. */
static bool parse_factor(const char *s, double hi, double *out) {
  if (!((*s >= '0' && *s <= '9') || *s == '.')) return false;
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (end == s || *end != '\0' || errno == ERANGE || !isfinite(v) || v <= 0 || v > hi)
    return false;
  *out = v;
  return true;
}

int kiln_fault_parse(const char *text, kiln_fault *out) {
  memset(out, 0, sizeof *out);
  out->kind = KILN_FAULT_NONE;
  if (!text || !*text) return KILN_OK;
  const char *colon = strchr(text, ':');
  size_t kind_len = colon ? (size_t)(colon - text) : strlen(text);
  const bool sleep = kind_len == 5 && !strncmp(text, "sleep", 5);
  if (sleep || (kind_len == 8 && !strncmp(text, "slowread", 8))) {
    /* the layer name is everything between the first and the last colon */
    const char *last = strrchr(text, ':');
    if (!colon || last == colon)
      return kiln_errorf(KILN_ERR_INVALID, "%s='%s': %s", KILN_FAULT_ENV, text, syntax);
    if (last == colon + 1)
      return kiln_errorf(KILN_ERR_INVALID, "%s='%s': no layer name (%s)", KILN_FAULT_ENV, text,
                         syntax);
    size_t name_len = (size_t)(last - colon - 1);
    if (name_len >= sizeof out->layer)
      return kiln_errorf(KILN_ERR_INVALID, "%s='%s': the layer name is longer than %zu characters",
                         KILN_FAULT_ENV, text, sizeof out->layer - 1);
    int64_t us;
    if (!parse_ms(last + 1, strlen(last + 1), &us))
      return kiln_errorf(KILN_ERR_INVALID,
                         "%s='%s': '%s' is not a number of milliseconds in 0.001..%d (at most 3 "
                         "decimals)",
                         KILN_FAULT_ENV, text, last + 1, MAX_SLEEP_MS);
    out->kind = sleep ? KILN_FAULT_SLEEP : KILN_FAULT_SLOW_READ;
    memcpy(out->layer, colon + 1, name_len);
    out->layer[name_len] = '\0';
    out->us = us;
    return KILN_OK;
  }
  if (kind_len == 4 && !strncmp(text, "leak", 4)) {
    if (!colon)
      return kiln_errorf(KILN_ERR_INVALID, "%s='%s': %s", KILN_FAULT_ENV, text, syntax);
    long kb;
    if (!parse_count(colon + 1, strlen(colon + 1), 1, MAX_LEAK_KB, &kb))
      return kiln_errorf(KILN_ERR_INVALID,
                         "%s='%s': '%s' is not a whole number of kilobytes in 1..%d",
                         KILN_FAULT_ENV, text, colon + 1, MAX_LEAK_KB);
    out->kind = KILN_FAULT_LEAK;
    out->kb = kb;
    return KILN_OK;
  }
  if (kind_len == 2 && !strncmp(text, "lr", 2)) {
    if (!colon)
      return kiln_errorf(KILN_ERR_INVALID, "%s='%s': %s", KILN_FAULT_ENV, text, syntax);
    double factor;
    if (!parse_factor(colon + 1, MAX_LR_FACTOR, &factor))
      return kiln_errorf(KILN_ERR_INVALID,
                         "%s='%s': '%s' is not a decimal factor in (0, %d] (e.g. 0.1)",
                         KILN_FAULT_ENV, text, colon + 1, MAX_LR_FACTOR);
    out->kind = KILN_FAULT_LR;
    out->lr_factor = factor;
    return KILN_OK;
  }
  if (kind_len == 4 && !strncmp(text, "stop", 4)) {
    const char *last = strrchr(text, ':');
    if (!colon || last == colon)
      return kiln_errorf(KILN_ERR_INVALID, "%s='%s': %s", KILN_FAULT_ENV, text, syntax);
    size_t stage_len = (size_t)(last - colon - 1);
    static const char *const stages[] = {"start", "init", "setup"};
    bool known = false;
    for (size_t i = 0; i < sizeof stages / sizeof *stages; i++)
      known |= stage_len == strlen(stages[i]) && !strncmp(colon + 1, stages[i], stage_len);
    if (!known)
      return kiln_errorf(KILN_ERR_INVALID, "%s='%s': unknown stage '%.*s' (start, init or setup)",
                         KILN_FAULT_ENV, text, (int)stage_len, colon + 1);
    long rank;
    if (!parse_count(last + 1, strlen(last + 1), 0, 1 << 20, &rank))
      return kiln_errorf(KILN_ERR_INVALID, "%s='%s': '%s' is not a rank (a whole number)",
                         KILN_FAULT_ENV, text, last + 1);
    out->kind = KILN_FAULT_STOP;
    memcpy(out->stage, colon + 1, stage_len);
    out->stage[stage_len] = '\0';
    out->rank = (int)rank;
    return KILN_OK;
  }
  return kiln_errorf(KILN_ERR_INVALID, "%s='%s': unknown fault '%.*s': %s", KILN_FAULT_ENV, text,
                     (int)kind_len, text, syntax);
}

const char *kiln_fault_describe(const kiln_fault *f, char *buf, size_t n) {
  char ms[32];
  switch (f->kind) {
  case KILN_FAULT_SLEEP:
    snprintf(buf, n, "sleep %s ms in every forward of layer '%s'", ms_text(f->us, ms, sizeof ms),
             f->layer);
    break;
  case KILN_FAULT_SLOW_READ:
    snprintf(buf, n, "data layer '%s' reads a batch in %s ms", f->layer,
             ms_text(f->us, ms, sizeof ms));
    break;
  case KILN_FAULT_LEAK:
    snprintf(buf, n, "leak %lld KB every training iteration", (long long)f->kb);
    break;
  case KILN_FAULT_LR:
    snprintf(buf, n, "every learning rate multiplied by %g", f->lr_factor);
    break;
  case KILN_FAULT_STOP:
    snprintf(buf, n, "rank %d stops at the '%s' stage of the MPI start-up", f->rank, f->stage);
    break;
  default: snprintf(buf, n, "none"); break;
  }
  return buf;
}

void kiln_fault_stop(const kiln_fault *f, const char *stage, int rank) {
  if (f->kind == KILN_FAULT_STOP && f->rank == rank && !strcmp(f->stage, stage)) raise(SIGSTOP);
}

void kiln_fault_sleep(const kiln_fault *f) {
  if (f->kind != KILN_FAULT_SLEEP) return;
  struct timespec ts = {(time_t)(f->us / 1000000), (long)(f->us % 1000000) * 1000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

/* The leaked blocks stay linked from this list until the process ends: "leaked" in the sense
 * of resident memory that only grows, while LeakSanitizer still sees every block reachable. */
typedef struct leaked_block {
  struct leaked_block *next;
} leaked_block;
static leaked_block *leaked;

int kiln_fault_leak(const kiln_fault *f) {
  if (f->kind != KILN_FAULT_LEAK) return KILN_OK;
  size_t bytes = (size_t)f->kb * 1024;
  leaked_block *b = malloc(bytes);
  if (!b)
    return kiln_errorf(KILN_ERR_NOMEM, "%s: cannot allocate the %lld KB to leak", KILN_FAULT_ENV,
                       (long long)f->kb);
  /* touch every page, so the memory is resident and not only reserved */
  long page = sysconf(_SC_PAGESIZE);
  size_t step = page > 0 ? (size_t)page : 4096;
  for (size_t i = 0; i < bytes; i += step) ((volatile char *)b)[i] = 1;
  b->next = leaked;
  leaked = b;
  return KILN_OK;
}
