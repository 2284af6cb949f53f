/* Test support for the CE tests (test_ce.c, test_ce_report.c): a KPI row with the usual
 * figures, and a text check that names what it looked for. */
#ifndef KILN_TEST_CE_SUPPORT_H
#define KILN_TEST_CE_SUPPORT_H

#include "kiln/ce.h"

/* A row of `model` at `workers` for `kpi`: the value, three samples around it, no baseline, the
 * verdict, and a seed, threads, iterations and config hash. */
kiln_ce_row make_row(const char *model, int workers, const char *kpi, double value,
                     kiln_ce_verdict v);
/* Fails the running test when `s` is NULL or does not contain `want`. */
void assert_contains(const char *s, const char *want);
/* How many times `needle` occurs in `s` (not overlapping). */
int count_of(const char *s, const char *needle);

#endif
