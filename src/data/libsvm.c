/* libsvm (svmlight) text files into CSR rows (include/kiln/data.h, kiln_libsvm_parse): one
 * record per line, `LABEL INDEX:VALUE ...`, as libsvm's and svmlight's tools write them. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/data.h"

/* The longest token read as a number; anything longer is not one. */
#define TOKEN_MAX 63

typedef struct {
  const char *name;
  int line;
  int64_t dim;
  kiln_libsvm *out;
  int64_t label_cap;
} parser;

static bool blank(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f'; }

static int bad(const parser *p, const char *tok, size_t n, const char *why) {
  return kiln_errorf(KILN_ERR_PARSE, "%s:%d: token '%.*s': %s", p->name, p->line,
                     (int)(n < 40 ? n : 40), tok, why);
}

/* A finite float written as the whole of tok[0 .. n). */
static bool number(const char *tok, size_t n, float *v) {
  if (n == 0 || n > TOKEN_MAX) return false;
  char buf[TOKEN_MAX + 1], *end;
  memcpy(buf, tok, n);
  buf[n] = '\0';
  *v = strtof(buf, &end);
  return end == buf + n && isfinite(*v);
}

/* Room for one more record and `more` more entries. */
static int grow(parser *p, int64_t more) {
  kiln_libsvm *o = p->out;
  kiln_csr *x = &o->x;
  int64_t rows = x->row_cap, nnz = x->nnz_cap;
  if (x->rows + 1 > rows) rows = rows ? 2 * rows : 1024;
  if (x->nnz + more > nnz) nnz = nnz ? 2 * nnz : 4096;
  if (nnz < x->nnz + more) nnz = x->nnz + more;
  KILN_TRY(kiln_csr_reserve(x, rows, nnz));
  if (p->label_cap < x->row_cap) {
    float *l = realloc(o->label, sizeof *l * (size_t)x->row_cap);
    if (!l) return kiln_errorf(KILN_ERR_NOMEM, "%s: out of memory for the labels", p->name);
    o->label = l;
    p->label_cap = x->row_cap;
  }
  return KILN_OK;
}

/* One INDEX:VALUE token of the current record, after the entry with column `prev` (-1: none). */
static int entry(parser *p, const char *tok, size_t n, int64_t *prev) {
  const char *colon = memchr(tok, ':', n);
  if (!colon) return bad(p, tok, n, "not INDEX:VALUE");
  size_t ni = (size_t)(colon - tok);
  if (ni == 3 && !memcmp(tok, "qid", 3))
    return bad(p, tok, n, "qid (svmlight's query ids) is not supported");
  int64_t idx = 0;
  if (ni == 0 || ni > 10) return bad(p, tok, n, "the index is not a whole number");
  for (size_t i = 0; i < ni; i++) {
    if (tok[i] < '0' || tok[i] > '9') return bad(p, tok, n, "the index is not a whole number");
    idx = idx * 10 + (tok[i] - '0');
  }
  if (idx == 0) return bad(p, tok, n, "index 0 (indices start at 1)");
  if (idx > KILN_LIBSVM_MAX_DIM) return bad(p, tok, n, "index past 2^31 - 1");
  if (p->dim > 0 && idx > p->dim) {
    char why[96];
    snprintf(why, sizeof why, "index %lld is past the %lld features (dim)", (long long)idx,
             (long long)p->dim);
    return bad(p, tok, n, why);
  }
  if (idx - 1 <= *prev) {
    char why[96];
    snprintf(why, sizeof why, "index %lld does not follow %lld (indices must increase)",
             (long long)idx, (long long)*prev + 1);
    return bad(p, tok, n, why);
  }
  float v;
  if (!number(colon + 1, n - ni - 1, &v)) return bad(p, tok, n, "the value is not a finite number");
  KILN_TRY(grow(p, 1));
  kiln_csr *x = &p->out->x;
  x->col[x->nnz] = (int32_t)(idx - 1);
  x->val[x->nnz++] = v;
  if (idx > x->cols) x->cols = idx;
  *prev = idx - 1;
  return KILN_OK;
}

/* One line s[0 .. n), its comment included. */
static int record(parser *p, const char *s, size_t n) {
  const char *hash = memchr(s, '#', n);
  if (hash) n = (size_t)(hash - s);
  size_t i = 0;
  while (i < n && blank(s[i])) i++;
  if (i == n) return KILN_OK; /* blank or a comment */
  size_t t = i;
  while (i < n && !blank(s[i])) i++;
  float label;
  if (!number(s + t, i - t, &label))
    return bad(p, s + t, i - t, "the label is not a finite number");
  KILN_TRY(grow(p, 0));
  kiln_libsvm *o = p->out;
  int64_t first = o->x.nnz, prev = -1;
  for (;;) {
    while (i < n && blank(s[i])) i++;
    if (i == n) break;
    t = i;
    while (i < n && !blank(s[i])) i++;
    KILN_TRY(entry(p, s + t, i - t, &prev));
  }
  int64_t r = o->x.rows++;
  o->label[r] = label;
  o->x.row_ptr[r + 1] = o->x.nnz;
  if (o->x.nnz - first > o->max_row_nnz) o->max_row_nnz = o->x.nnz - first;
  return KILN_OK;
}

int kiln_libsvm_parse(const char *text, size_t len, const char *name, int64_t dim,
                      kiln_libsvm *out) {
  memset(out, 0, sizeof *out);
  if (dim < 0 || dim > KILN_LIBSVM_MAX_DIM)
    return kiln_errorf(KILN_ERR_INVALID, "%s: dim %lld is not 1 to 2^31 - 1 (or 0: any)", name,
                       (long long)dim);
  parser p = {.name = name, .dim = dim, .out = out};
  /* a NUL would end strtof's number early and be blamed on the token it sits in */
  int rc = kiln_text_check_nul(name, text, len);
  if (!rc) rc = kiln_csr_reserve(&out->x, 0, 0);
  for (size_t at = 0; !rc && at < len;) {
    const char *nl = memchr(text + at, '\n', len - at);
    size_t end = nl ? (size_t)(nl - text) : len;
    if (p.line == INT32_MAX) {
      rc = kiln_errorf(KILN_ERR_PARSE, "%s: more than 2^31 lines", name);
      break;
    }
    p.line++;
    rc = record(&p, text + at, end - at);
    at = end + 1;
  }
  if (rc) {
    kiln_libsvm_free(out);
    return rc;
  }
  if (dim > 0) out->x.cols = dim;
  return KILN_OK;
}

int kiln_libsvm_read(const char *path, int64_t dim, kiln_libsvm *out) {
  memset(out, 0, sizeof *out);
  char *text = NULL;
  size_t len = 0;
  KILN_TRY(kiln_read_file(path, &text, &len));
  int rc = kiln_libsvm_parse(text, len, path, dim, out);
  free(text);
  return rc;
}

void kiln_libsvm_free(kiln_libsvm *s) {
  kiln_csr_free(&s->x);
  free(s->label);
  memset(s, 0, sizeof *s);
}
