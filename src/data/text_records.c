/* The records of a text file (include/kiln/data.h, kiln_text_records, kiln_text_tagged_records
 * and kiln_text_pairs): a corpus is one record, a .tsv file one record per line, labelled
 * (LABEL<TAB>TEXT), tagged token by token (TAGS<TAB>TEXT) or a source and its target
 * (SOURCE<TAB>TARGET), as the text data sets of the cache are written. Every kind of line shares
 * the splitting and the escapes of the text after the tab; only the field before it differs. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "data/internal.h"
#include "kiln/data.h"

static bool ends_with(const char *s, const char *tail) {
  size_t n = strlen(s), m = strlen(tail);
  return n >= m && !strcmp(s + n - m, tail);
}

/* Decodes line[0 .. n) in place (\\ \t \n \r, and with `vocab` \s for a space and \0); the
 * decoded length, or -1 at a bad escape. The vocabulary file and the .tsv records share it. */
long kiln_text_unescape(char *s, size_t n, bool vocab) {
  size_t o = 0;
  for (size_t i = 0; i < n; i++) {
    if (s[i] != '\\') {
      s[o++] = s[i];
      continue;
    }
    if (++i == n) return -1;
    char c = s[i];
    if (c == '\\') s[o++] = '\\';
    else if (c == 't') s[o++] = '\t';
    else if (c == 'n') s[o++] = '\n';
    else if (c == 'r') s[o++] = '\r';
    else if (vocab && c == 's') s[o++] = ' ';
    else if (vocab && c == '0') s[o++] = '\0';
    else return -1;
  }
  return (long)o;
}

/* A whole number in 0 .. INT_MAX written in p[0 .. n) with digits alone; -1 otherwise. */
static long whole_number(const char *p, size_t n) {
  if (n == 0 || n > 10) return -1;
  long v = 0;
  for (size_t i = 0; i < n; i++) {
    if (p[i] < '0' || p[i] > '9') return -1;
    v = v * 10 + (p[i] - '0');
  }
  return v <= INT_MAX ? v : -1;
}

/* One line of a .tsv file: the field before the first tab (head[0 .. nhead) as it stands in the
 * file, NUL-free, not terminated, and the caller's to decode in place) and the decoded,
 * NUL-terminated text. */
typedef int (*tsv_line_fn)(void *ctx, const char *path, int line, char *head, size_t nhead,
                           const char *text, size_t len);

static int bad_escape(const char *path, int line) {
  return kiln_errorf(KILN_ERR_PARSE, "%s:%d: a backslash that is not one of \\\\ \\t \\n \\r",
                     path, line);
}

/* Calls fn with each line of text[0 .. n); `form` names the line's fields in messages
 * ("LABEL<TAB>TEXT"). */
static int tsv_lines(const char *path, char *text, size_t n, const char *form, tsv_line_fn fn,
                     void *ctx) {
  int line = 0;
  for (char *p = text; p < text + n;) {
    line++;
    char *end = memchr(p, '\n', (size_t)(text + n - p));
    if (!end) return kiln_errorf(KILN_ERR_PARSE, "%s:%d: the last line has no newline (a cut file?)", path, line);
    *end = '\0';
    char *tab = memchr(p, '\t', (size_t)(end - p));
    if (!tab)
      return kiln_errorf(KILN_ERR_PARSE, "%s:%d: no tab: a line is %s", path, line, form);
    long len = kiln_text_unescape(tab + 1, (size_t)(end - tab - 1), false);
    if (len < 0) return bad_escape(path, line);
    tab[1 + len] = '\0';
    KILN_TRY(fn(ctx, path, line, p, (size_t)(tab - p), tab + 1, (size_t)len));
    p = end + 1;
  }
  return KILN_OK;
}

typedef struct {
  kiln_text_record_fn fn;
  void *user;
} labelled_ctx;

static int labelled_line(void *ctx, const char *path, int line, char *head, size_t nhead,
                         const char *text, size_t len) {
  labelled_ctx *c = ctx;
  long label = whole_number(head, nhead);
  if (label < 0)
    return kiln_errorf(KILN_ERR_PARSE, "%s:%d: label '%.*s' is not a whole number in 0..%d", path,
                       line, (int)(nhead < 20 ? nhead : 20), head, INT_MAX);
  return c->fn(c->user, text, len, (int)label, line);
}

int kiln_text_records(const char *path, kiln_text_record_fn fn, void *user) {
  char *text;
  size_t n;
  KILN_TRY(kiln_read_file_max(path, KILN_TEXT_RECORDS_MAX_BYTES, &text, &n));
  labelled_ctx c = {fn, user};
  int rc = kiln_text_check_nul(path, text, n);
  if (!rc)
    rc = ends_with(path, ".tsv") ? tsv_lines(path, text, n, "LABEL<TAB>TEXT", labelled_line, &c)
                                 : fn(user, text, n, -1, 1);
  free(text);
  return rc;
}

typedef struct {
  kiln_text_tagged_fn fn;
  void *user;
  int32_t *tags; /* one line's, reused */
  size_t cap;
} tagged_ctx;

static int tagged_line(void *ctx, const char *path, int line, char *head, size_t nhead,
                       const char *text, size_t len) {
  tagged_ctx *c = ctx;
  size_t ntags = 0;
  for (size_t i = 0; i < nhead;) {
    if (head[i] == ' ') { /* any run of spaces separates */
      i++;
      continue;
    }
    size_t j = i;
    while (j < nhead && head[j] != ' ') j++;
    long tag = whole_number(head + i, j - i);
    if (tag < 0)
      return kiln_errorf(KILN_ERR_PARSE, "%s:%d: tag %zu '%.*s' is not a whole number in 0..%d",
                         path, line, ntags + 1, (int)(j - i < 20 ? j - i : 20), head + i, INT_MAX);
    if (ntags == c->cap) {
      size_t cap = c->cap ? 2 * c->cap : 256;
      int32_t *t = realloc(c->tags, cap * sizeof *t);
      if (!t) return kiln_errorf(KILN_ERR_NOMEM, "out of memory for the tags of %s", path);
      c->tags = t;
      c->cap = cap;
    }
    c->tags[ntags++] = (int32_t)tag;
    i = j;
  }
  return c->fn(c->user, text, len, c->tags, ntags, line);
}

/* The lines of a .tsv file of `what` records, each line `form` ("TAGS<TAB>TEXT"): any other
 * file is refused, as such records cannot be anything but lines of a .tsv. */
static int tsv_file(const char *path, const char *what, const char *form, tsv_line_fn fn,
                    void *ctx) {
  if (!ends_with(path, ".tsv"))
    return kiln_errorf(KILN_ERR_DATA, "%s: %s records are a .tsv file of %s lines", path, what,
                       form);
  char *text;
  size_t n;
  KILN_TRY(kiln_read_file_max(path, KILN_TEXT_RECORDS_MAX_BYTES, &text, &n));
  int rc = kiln_text_check_nul(path, text, n);
  if (!rc) rc = tsv_lines(path, text, n, form, fn, ctx);
  free(text);
  return rc;
}

int kiln_text_tagged_records(const char *path, kiln_text_tagged_fn fn, void *user) {
  tagged_ctx c = {.fn = fn, .user = user};
  int rc = tsv_file(path, "tagged", "TAGS<TAB>TEXT", tagged_line, &c);
  free(c.tags);
  return rc;
}

typedef struct {
  kiln_text_pair_fn fn;
  void *user;
} pair_ctx;

/* SOURCE is escaped as TARGET is; TARGET is the rest of the line, as TEXT is in the other kinds. */
static int pair_line(void *ctx, const char *path, int line, char *head, size_t nhead,
                     const char *text, size_t len) {
  pair_ctx *c = ctx;
  long slen = kiln_text_unescape(head, nhead, false);
  if (slen < 0) return bad_escape(path, line);
  head[slen] = '\0'; /* over the tab or an escape's second byte */
  return c->fn(c->user, head, (size_t)slen, text, len, line);
}

int kiln_text_pairs(const char *path, kiln_text_pair_fn fn, void *user) {
  pair_ctx c = {fn, user};
  return tsv_file(path, "paired", "SOURCE<TAB>TARGET", pair_line, &c);
}

void kiln_text_escape(kiln_strbuf *b, const char *text, size_t n) {
  size_t run = 0; /* the start of the bytes that need no escape */
  for (size_t i = 0; i < n; i++) {
    const char c = text[i];
    const char e = c == '\\' ? '\\' : c == '\t' ? 't' : c == '\n' ? 'n' : c == '\r' ? 'r' : 0;
    if (!e) continue;
    kiln_strbuf_printf(b, "%.*s\\%c", (int)(i - run), text + run, e);
    run = i + 1;
  }
  if (run < n) kiln_strbuf_printf(b, "%.*s", (int)(n - run), text + run);
}
