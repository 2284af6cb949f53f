/* The records of a text file (include/kiln/data.h, kiln_text_records): a corpus is one record,
 * a .tsv file one labelled record per line, as the text data sets of the cache are written. */
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

static int tsv_records(const char *path, char *text, size_t n, kiln_text_record_fn fn,
                       void *user) {
  int line = 0;
  for (char *p = text; p < text + n;) {
    line++;
    char *end = memchr(p, '\n', (size_t)(text + n - p));
    if (!end) return kiln_errorf(KILN_ERR_PARSE, "%s:%d: the last line has no newline (a cut file?)", path, line);
    *end = '\0';
    char *tab = memchr(p, '\t', (size_t)(end - p));
    if (!tab)
      return kiln_errorf(KILN_ERR_PARSE, "%s:%d: no tab: a line is LABEL<TAB>TEXT", path, line);
    long label = 0;
    bool digits = tab > p && tab - p <= 10;
    for (char *q = p; digits && q < tab; q++) {
      digits = *q >= '0' && *q <= '9';
      label = label * 10 + (*q - '0');
    }
    if (!digits || label > INT_MAX)
      return kiln_errorf(KILN_ERR_PARSE, "%s:%d: label '%.*s' is not a whole number in 0..%d",
                         path, line, (int)(tab - p < 20 ? tab - p : 20), p, INT_MAX);
    long len = kiln_text_unescape(tab + 1, (size_t)(end - tab - 1), false);
    if (len < 0)
      return kiln_errorf(KILN_ERR_PARSE, "%s:%d: a backslash that is not one of \\\\ \\t \\n \\r",
                         path, line);
    tab[1 + len] = '\0';
    KILN_TRY(fn(user, tab + 1, (size_t)len, (int)label, line));
    p = end + 1;
  }
  return KILN_OK;
}

int kiln_text_records(const char *path, kiln_text_record_fn fn, void *user) {
  char *text;
  size_t n;
  KILN_TRY(kiln_read_file_max(path, KILN_TEXT_RECORDS_MAX_BYTES, &text, &n));
  int rc = ends_with(path, ".tsv") ? tsv_records(path, text, n, fn, user) : fn(user, text, n, -1, 1);
  free(text);
  return rc;
}
