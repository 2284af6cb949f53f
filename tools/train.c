/* kiln train: trains the net a solver file names, optionally resuming from a .solverstate or
 * starting from a .caffemodel. */
#include <stdlib.h>
#include <string.h>

#include "tool.h"

int cmd_train(int argc, char **argv) {
  tool_common c = {0};
  const char *solver = NULL, *snapshot = NULL, *weights = NULL;
  for (int i = 1; i < argc; i++) {
    int r = tool_common_option(&c, argc, argv, &i);
    if (r < 0) return 2;
    if (r > 0) continue;
    const char *a = argv[i];
    const char **slot = !strcmp(a, "--solver") ? &solver : !strcmp(a, "--snapshot") ? &snapshot
                      : !strcmp(a, "--weights") ? &weights : NULL;
    if (!slot || i + 1 >= argc) {
      fprintf(stderr, "kiln train: %s '%s'\nusage: kiln train --solver S [--snapshot X | --weights W] "
              "[--metrics F] [--threads N] [--max-memory SIZE]\n",
              slot ? "missing value for" : "unknown option", a);
      return 2;
    }
    *slot = argv[++i];
  }
  if (!solver) {
    fprintf(stderr, "kiln train: --solver is required\n");
    return 2;
  }
  if (snapshot && weights) {
    fprintf(stderr, "kiln train: give --snapshot or --weights, not both\n");
    return 2;
  }
  tool_metrics m;
  if (tool_metrics_open(&m, c.metrics)) return tool_fail("metrics");
  kiln_solver_options o = {.max_memory = c.max_memory, .on_event = tool_on_event, .user = &m};
  kiln_solver *s;
  if (kiln_solver_create(solver, &o, &s)) {
    tool_metrics_close(&m);
    return tool_fail("train");
  }
  char *table = kiln_net_describe(s->net);
  if (table) fprintf(stderr, "%s", table);
  free(table);
  int rc = KILN_OK;
  if (snapshot) rc = kiln_solver_restore(s, snapshot);
  else if (weights) rc = kiln_net_load_weights(s->net, weights);
  if (!rc) rc = kiln_solver_solve(s);
  if (rc) {
    if (m.tty) fprintf(stderr, "\n");
    const char *what = snapshot && s->iter == 0 ? "resume" : weights && s->iter == 0 ? "weights" : "train";
    kiln_solver_free(s);
    tool_metrics_close(&m);
    return tool_fail(what);
  }
  kiln_solver_free(s);
  tool_metrics_close(&m);
  return 0;
}
