/* Caffe's command-line spelling, so that scripts written for `caffe train ...` run with `kiln` in
 * its place: Caffe parses flags with gflags, which takes `-solver F`, `--solver F`,
 * `-solver=F` and `--solver=F` alike. Before dispatch the arguments are rewritten to kiln's own
 * `--solver F`: `=` splits a flag from its value, a known flag name with one dash gets two, and
 * flags kiln has no use for are dropped: Caffe's signal-effect flags with a warning, and `-gpu`,
 * which is checked and kept in tool_caffe_gpu (kiln has no GPU backend: the command says so once,
 * `train` through the solver on rank 0 only). Anything else (values, file names, negative
 * numbers) passes unchanged. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tool.h"

/* Long option names of kiln's commands and Caffe's `caffe` tool. */
static const char *const known[] = {
    "solver",  "weights",     "snapshot",     "model",           "iterations", "phase",
    "threads", "metrics",     "max-memory",   "sync",            "deterministic", "no-overlap",
    "comm-timeout", "debug-slow-rank", "gpu", "sighup_effect", "sigint_effect", "help", "stage",
};

/* Caffe's flags that kiln accepts and ignores, each taking a value. */
static const char *const ignored[] = {"gpu", "sighup_effect", "sigint_effect"};

static bool is_known(const char *name, size_t len) {
  for (size_t i = 0; i < sizeof known / sizeof *known; i++)
    if (strlen(known[i]) == len && !strncmp(known[i], name, len)) return true;
  return false;
}

static bool is_ignored(const char *name) {
  for (size_t i = 0; i < sizeof ignored / sizeof *ignored; i++)
    if (!strcmp(ignored[i], name)) return true;
  return false;
}

static char **rewritten; /* kept for the life of the process */
const char *tool_caffe_gpu;

/* Caffe's -gpu takes "all" or device numbers separated by commas. A negative number names a
 * device that cannot exist: refused, as Caffe would fail on it, rather than dropped. */
static bool gpu_list_ok(const char *v) {
  if (!strcmp(v, "all")) return true;
  for (const char *p = v;; p++) {
    if (*p < '0' || *p > '9') return false;
    while (*p >= '0' && *p <= '9') p++;
    if (*p != ',') return *p == '\0';
  }
}

int tool_caffe_args(int argc, char **argv, char ***out) {
  /* at most two arguments out of each one in */
  rewritten = calloc((size_t)argc * 2 + 1, sizeof *rewritten);
  if (!rewritten) return -1;
  int n = 0;
  for (int i = 0; i < argc; i++) {
    char *a = argv[i];
    const char *name = a[0] == '-' && a[1] == '-' ? a + 2 : a[0] == '-' ? a + 1 : NULL;
    bool letter = name && ((*name >= 'a' && *name <= 'z') || (*name >= 'A' && *name <= 'Z'));
    const char *eq = letter ? strchr(name, '=') : NULL;
    size_t len = letter ? (eq ? (size_t)(eq - name) : strlen(name)) : 0;
    if (i == 0 || !letter || !is_known(name, len)) {
      rewritten[n++] = a;
      continue;
    }
    char *flag = malloc(len + 3);
    if (!flag) return -1;
    memcpy(flag, "--", 2);
    memcpy(flag + 2, name, len);
    flag[len + 2] = '\0';
    const char *value = eq ? eq + 1 : NULL;
    if (is_ignored(flag + 2)) {
      if (!value && i + 1 < argc) value = argv[++i];
      if (!strcmp(flag + 2, "gpu")) {
        if (!value || !gpu_list_ok(value)) {
          bool negative = value && (value[0] == '-' || strstr(value, ",-"));
          fprintf(stderr,
                  "kiln: -gpu %s: %s (Caffe's -gpu takes device numbers from 0, separated by "
                  "commas, or all; kiln runs on the CPU in any case)\n",
                  value ? value : "", negative ? "no such device" : "not a device");
          free(flag);
          return -2;
        }
        tool_caffe_gpu = value;
      } else {
        fprintf(stderr, "kiln: warning: -%s is Caffe's and has no effect in kiln\n", flag + 2);
      }
      free(flag);
      continue;
    }
    rewritten[n++] = flag;
    if (value) rewritten[n++] = (char *)value;
  }
  rewritten[n] = NULL;
  *out = rewritten;
  return n;
}
