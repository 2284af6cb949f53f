/* Test support for the CE tests: see ce_support.h. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "ce_support.h"

void assert_contains(const char *s, const char *want) {
  if (!s || !strstr(s, want)) fail_msg("'%s' does not contain '%s'", s ? s : "(null)", want);
}

int count_of(const char *s, const char *needle) {
  int n = 0;
  for (const char *p = s; (p = strstr(p, needle)); p += strlen(needle)) n++;
  return n;
}

kiln_ce_row make_row(const char *model, int workers, const char *kpi, double value,
                     kiln_ce_verdict v) {
  kiln_ce_row r;
  memset(&r, 0, sizeof r);
  snprintf(r.model, sizeof r.model, "%s", model);
  r.workers = workers;
  snprintf(r.kpi, sizeof r.kpi, "%s", kpi);
  r.value = value;
  r.spread = 0.01;
  r.nsamples = 3;
  r.samples[0] = value - 0.01, r.samples[1] = value, r.samples[2] = value + 0.01;
  r.baseline = r.baseline_spread = r.change = r.tolerance = NAN;
  r.verdict = v;
  r.seed = 1701;
  r.threads = 2;
  r.iterations = 1500;
  snprintf(r.config_hash, sizeof r.config_hash, "0123456789abcdef");
  return r;
}
