/* CE baselines: the accepted KPI values of one model on one machine class, as a CeBaseline text
 * file (ce/baselines/<class>/<model>.prototxt) that people review in diffs like code. Only
 * `kiln ce accept` writes them, atomically, merging into what is there. */
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ce/internal.h"
#include "kiln/ce.h"

int kiln_ce_baseline_path(const char *dir, const char *machine_class, const char *model,
                          char *buf, size_t n) {
  if (!ce_valid_name(machine_class))
    return kiln_errorf(KILN_ERR_INVALID,
                       "machine class '%s' must be 1 to 63 letters, digits, '_', '-' or '.', not "
                       "starting with '.' (it names a folder of the baselines)",
                       machine_class ? machine_class : "");
  if (!ce_valid_name(model))
    return kiln_errorf(KILN_ERR_INVALID,
                       "model '%s' must be 1 to 63 letters, digits, '_', '-' or '.', not starting "
                       "with '.' (it names a baseline file)",
                       model ? model : "");
  if (snprintf(buf, n, "%s/%s/%s.prototxt", dir, machine_class, model) >= (int)n)
    return kiln_errorf(KILN_ERR_INVALID, "%s: baseline path too long", dir);
  return KILN_OK;
}

/* A baseline judges every later run: a value that cannot be compared with (NaN made every row
 * pass), a spread below 0, or two values for one KPI is refused with the field named. */
static int check_baseline(const char *path, const Caffe__CeBaseline *b) {
  if (b->n_value == 0) return kiln_errorf(KILN_ERR_INVALID, "%s: holds no values", path);
  for (size_t i = 0; i < b->n_value; i++) {
    const Caffe__CeBaselineValue *v = b->value[i];
    const char *kpi = v->kpi ? v->kpi : "";
    if (!*kpi) return kiln_errorf(KILN_ERR_INVALID, "%s: value %zu has no kpi", path, i + 1);
    /* A misspelt name would match no row: its KPI would judge as `new` for ever. */
    if (!kiln_ce_kpi_lookup(kpi))
      return kiln_errorf(KILN_ERR_INVALID, "%s: value %zu: unknown kpi '%s' (known: %s)", path,
                         i + 1, kpi, kiln_ce_kpi_names());
    if (!v->has_value || !isfinite(v->value))
      return kiln_errorf(KILN_ERR_INVALID, "%s: KPI '%s' (%d workers): value %s", path, kpi,
                         v->workers, v->has_value ? "is not a finite number" : "is missing");
    if (v->has_spread && !(v->spread >= 0 && isfinite(v->spread)))
      return kiln_errorf(KILN_ERR_INVALID, "%s: KPI '%s' (%d workers): spread %g must be >= 0",
                         path, kpi, v->workers, v->spread);
    if (v->workers < 1 || (v->has_samples && v->samples < 1))
      return kiln_errorf(KILN_ERR_INVALID, "%s: KPI '%s': workers %d and samples %d must be >= 1",
                         path, kpi, v->workers, v->has_samples ? v->samples : 1);
    for (size_t j = 0; j < i; j++)
      if (b->value[j]->kpi && !strcmp(b->value[j]->kpi, kpi) && b->value[j]->workers == v->workers)
        return kiln_errorf(KILN_ERR_INVALID, "%s: KPI '%s' (%d workers) given twice", path, kpi,
                           v->workers);
  }
  for (size_t i = 0; i < b->n_curve; i++) KILN_TRY(ce_curve_check(path, b->curve[i], i));
  return KILN_OK;
}

int kiln_ce_baseline_read(const char *path, Caffe__CeBaseline **out) {
  ProtobufCMessage *m;
  *out = NULL;
  KILN_TRY(kiln_text_parse_file(path, &caffe__ce_baseline__descriptor, &m));
  int rc = check_baseline(path, (Caffe__CeBaseline *)m);
  if (rc) {
    protobuf_c_message_free_unpacked(m, NULL);
    return rc;
  }
  *out = (Caffe__CeBaseline *)m;
  return KILN_OK;
}

/* The file's own model and machine class, when it states them, must be the ones it is filed
 * under: a baseline copied to the wrong place would judge the wrong runs. */
static int check_place(const char *path, const Caffe__CeBaseline *b, const char *model,
                       const char *machine_class) {
  if (b->model && *b->model && strcmp(b->model, model))
    return kiln_errorf(KILN_ERR_INVALID, "%s: model '%s', but it is the baseline file of '%s'",
                       path, b->model, model);
  if (b->machine_class && *b->machine_class && strcmp(b->machine_class, machine_class))
    return kiln_errorf(KILN_ERR_INVALID,
                       "%s: machine_class '%s', but it lies in the folder of class '%s'", path,
                       b->machine_class, machine_class);
  return KILN_OK;
}

int kiln_ce_baseline_write(const char *path, const Caffe__CeBaseline *b) {
  char dir[4096];
  ce_dirname(path, dir, sizeof dir);
  KILN_TRY(kiln_mkdir_p(dir));
  char *text;
  KILN_TRY(kiln_text_format(&b->base, &text));
  const char *head = "# kiln CE baseline: written by `kiln ce accept`; see docs/ce.md\n";
  size_t hl = strlen(head), tl = strlen(text);
  char *all = malloc(hl + tl + 1);
  if (!all) {
    free(text);
    return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  }
  memcpy(all, head, hl);
  memcpy(all + hl, text, tl + 1);
  free(text);
  int rc = kiln_write_file_atomic(path, all, hl + tl);
  free(all);
  return rc;
}

const Caffe__CeBaselineValue *kiln_ce_baseline_find(const Caffe__CeBaseline *b, const char *kpi,
                                                    int workers) {
  if (!b) return NULL;
  for (size_t i = 0; i < b->n_value; i++) {
    const Caffe__CeBaselineValue *v = b->value[i];
    if (v->kpi && !strcmp(v->kpi, kpi) && v->workers == workers && v->has_value) return v;
  }
  return NULL;
}

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

static int read_placed(const char *path, const char *model, const char *machine_class,
                       Caffe__CeBaseline **out) {
  KILN_TRY(kiln_ce_baseline_read(path, out));
  int rc = check_place(path, *out, model, machine_class);
  if (rc) {
    protobuf_c_message_free_unpacked(&(*out)->base, NULL);
    *out = NULL;
  }
  return rc;
}

int kiln_ce_baseline_lookup(const char *dir, const char *machine_class, const char *model,
                            Caffe__CeBaseline **out, char *found_class, size_t n) {
  char path[4096];
  *out = NULL;
  if (found_class && n) found_class[0] = '\0';
  KILN_TRY(kiln_ce_baseline_path(dir, machine_class, model, path, sizeof path));
  if (access(path, F_OK) == 0) {
    if (found_class) snprintf(found_class, n, "%s", machine_class);
    return read_placed(path, model, machine_class, out);
  }
  /* Another class's file still says what the machine-independent KPIs should be. Classes are
   * tried in name order so that the choice does not depend on the file system. */
  DIR *d = opendir(dir);
  if (!d) return KILN_OK;
  char **names = NULL;
  int count = 0, rc = KILN_OK;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (e->d_name[0] == '.' || !strcmp(e->d_name, machine_class)) continue;
    char **nn = realloc(names, (size_t)(count + 1) * sizeof *nn);
    if (!nn || !(nn[count] = strdup(e->d_name))) {
      if (nn) names = nn;
      rc = kiln_errorf(KILN_ERR_NOMEM, "out of memory");
      break;
    }
    names = nn;
    count++;
  }
  closedir(d);
  if (rc == KILN_OK && count > 1) qsort(names, (size_t)count, sizeof *names, cmp_str);
  for (int i = 0; rc == KILN_OK && i < count && !*out; i++) {
    if (kiln_ce_baseline_path(dir, names[i], model, path, sizeof path) || access(path, F_OK))
      continue;
    rc = read_placed(path, model, names[i], out);
    if (rc == KILN_OK && found_class) snprintf(found_class, n, "%s", names[i]);
  }
  for (int i = 0; i < count; i++) free(names[i]);
  free(names);
  return rc;
}

/* ---- accept ------------------------------------------------------------------------------- */

static Caffe__CeBaselineValue *new_value(const kiln_ce_row *row) {
  Caffe__CeBaselineValue *v = malloc(sizeof *v);
  if (!v) return NULL;
  caffe__ce_baseline_value__init(v);
  v->kpi = strdup(row->kpi);
  if (!v->kpi) {
    free(v);
    return NULL;
  }
  v->has_workers = 1;
  v->workers = row->workers;
  v->has_value = 1;
  v->value = row->value;
  v->has_spread = 1;
  v->spread = row->spread;
  v->has_samples = 1;
  v->samples = row->nsamples;
  return v;
}

static int set_string(char **slot, const char *s) {
  char *c = strdup(s);
  if (!c) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  free(*slot); /* parsed strings are malloc'd; fresh messages hold NULL */
  *slot = c;
  return KILN_OK;
}

static int accept_model(kiln_ce_result *r, const char *baseline_dir, const char *model) {
  char path[4096];
  KILN_TRY(kiln_ce_baseline_path(baseline_dir, r->machine_class, model, path, sizeof path));
  Caffe__CeBaseline *b = NULL;
  if (access(path, F_OK) == 0) {
    /* As a run reads it: a file of another model or class is refused, not merged into. */
    KILN_TRY(read_placed(path, model, r->machine_class, &b));
  } else {
    b = malloc(sizeof *b);
    if (!b) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
    caffe__ce_baseline__init(b);
  }
  char now[32];
  ce_utc_now(now, sizeof now, 0);
  int rc = set_string(&b->model, model);
  if (!rc) rc = set_string(&b->machine_class, r->machine_class);
  if (!rc) rc = set_string(&b->accepted_at, now);
  if (!rc) rc = set_string(&b->git_commit, r->git_commit);
  b->has_run_id = r->run_id > 0;
  b->run_id = r->run_id;
  for (int i = 0; rc == KILN_OK && i < r->nrows; i++) {
    const kiln_ce_row *row = &r->rows[i];
    if (strcmp(row->model, model) || !strcmp(row->kpi, "run") || !isfinite(row->value) ||
        row->verdict == KILN_CE_SKIP || row->verdict == KILN_CE_NA)
      continue;
    if (row->config_hash[0]) rc = set_string(&b->config_hash, row->config_hash);
    Caffe__CeBaselineValue *v = new_value(row);
    if (!v) {
      rc = kiln_errorf(KILN_ERR_NOMEM, "out of memory");
      break;
    }
    /* Replace the value of this KPI and worker count, or append it. */
    size_t k = 0;
    while (k < b->n_value && !(b->value[k]->kpi && !strcmp(b->value[k]->kpi, row->kpi) &&
                               b->value[k]->workers == row->workers))
      k++;
    if (k < b->n_value) {
      protobuf_c_message_free_unpacked(&b->value[k]->base, NULL);
      b->value[k] = v;
    } else {
      Caffe__CeBaselineValue **nv = realloc(b->value, (b->n_value + 1) * sizeof *nv);
      if (!nv) {
        protobuf_c_message_free_unpacked(&v->base, NULL);
        rc = kiln_errorf(KILN_ERR_NOMEM, "out of memory");
        break;
      }
      b->value = nv;
      b->value[b->n_value++] = v;
    }
  }
  if (!rc) rc = ce_curves_accept(b, r, model);
  if (!rc) rc = kiln_ce_baseline_write(path, b);
  protobuf_c_message_free_unpacked(&b->base, NULL);
  return rc;
}

int kiln_ce_accept(kiln_ce_result *r, const char *baseline_dir, int *written) {
  if (written) *written = 0;
  for (int i = 0; i < r->nrows; i++) {
    const char *model = r->rows[i].model;
    bool seen = false, failed = false, any = false;
    const char *why = "";
    for (int j = 0; j < i && !seen; j++) seen = !strcmp(r->rows[j].model, model);
    if (seen) continue;
    for (int j = i; j < r->nrows; j++) {
      const kiln_ce_row *row = &r->rows[j];
      if (strcmp(row->model, model)) continue;
      if (row->verdict == KILN_CE_FAIL || row->verdict == KILN_CE_ERROR) {
        if (!failed) why = row->reason;
        failed = true;
      }
      any |= strcmp(row->kpi, "run") && isfinite(row->value) && row->verdict != KILN_CE_SKIP &&
             row->verdict != KILN_CE_NA;
    }
    if (failed) {
      kiln_ce_result_warn(r, "%s: not accepted, the run failed: %s", model, why);
      continue;
    }
    if (!any) {
      kiln_ce_result_warn(r, "%s: not accepted, no KPI values were measured", model);
      continue;
    }
    KILN_TRY(accept_model(r, baseline_dir, model));
    if (written) (*written)++;
  }
  return KILN_OK;
}
