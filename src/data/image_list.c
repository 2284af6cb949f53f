/* Image lists: the text file behind Caffe's ImageData layer and convert_imageset, one
 * "PATH LABEL" a line. Caffe takes the label after the last space of each line; kiln does the
 * same (so paths may hold spaces) but refuses, naming the line, what Caffe would read as label 0
 * or stop at: a line without a label, a label that is not a whole number. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/data.h"

/* Lists larger than this are refused before they are read (ImageNet's is 40 MB). */
#define LIST_MAX_BYTES ((size_t)1 << 30)

static bool blank(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f'; }

void kiln_image_list_free(kiln_image_list *list) {
  if (!list) return;
  free(list->path);
  free(list->label);
  free(list->line);
  free(list->text);
  free(list->source);
  memset(list, 0, sizeof *list);
}

/* The label: a whole number in int32's range, sign allowed (Caffe's atoi takes -1, which
 * ignore_label often is). */
static bool parse_label(const char *s, int32_t *out) {
  if (!*s) return false;
  char *end;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (*end || errno || v < INT32_MIN || v > INT32_MAX || (s[0] != '-' && s[0] != '+' &&
                                                            (s[0] < '0' || s[0] > '9')))
    return false;
  *out = (int32_t)v;
  return true;
}

int kiln_image_list_read(const char *path, kiln_image_list *out) {
  memset(out, 0, sizeof *out);
  char *text;
  size_t len;
  KILN_TRY(kiln_read_file_max(path, LIST_MAX_BYTES, &text, &len));
  int rc = kiln_text_check_nul(path, text, len); /* where, before the lines are cut */
  if (rc) {
    free(text);
    return rc;
  }
  out->text = text;
  out->source = kiln_strdup(path);
  size_t lines = 1;
  for (size_t i = 0; i < len; i++) lines += text[i] == '\n';
  out->path = malloc(lines * sizeof *out->path);
  out->label = malloc(lines * sizeof *out->label);
  out->line = malloc(lines * sizeof *out->line);
  if (!out->source || !out->path || !out->label || !out->line) {
    kiln_image_list_free(out);
    return kiln_errorf(KILN_ERR_NOMEM, "%s: out of memory for the image list", path);
  }
  int ln = 0;
  for (size_t at = 0; at <= len && !rc; ln++) {
    char *s = text + at, *nl = memchr(s, '\n', len - at);
    size_t n = nl ? (size_t)(nl - s) : len - at;
    at += n + 1;
    s[n] = '\0'; /* the newline, or the terminating NUL kiln_read_file added */
    while (n && blank(s[n - 1])) s[--n] = '\0';
    while (blank(*s)) s++, n--;
    if (!n) continue;
    char *sep = s + n;
    while (sep > s && !blank(sep[-1])) sep--;
    if (sep == s) {
      rc = kiln_errorf(KILN_ERR_PARSE,
                       "%s:%d: '%.200s' has no label: a line is an image path, a space and its "
                       "label",
                       path, ln + 1, s);
      break;
    }
    int32_t label;
    if (!parse_label(sep, &label)) {
      rc = kiln_errorf(KILN_ERR_PARSE,
                       "%s:%d: label '%.100s' is not a whole number (a line is an image path, a "
                       "space and its label)",
                       path, ln + 1, sep);
      break;
    }
    char *end = sep;
    while (end > s && blank(end[-1])) end--;
    *end = '\0';
    out->path[out->n] = s;
    out->label[out->n] = label;
    out->line[out->n] = ln + 1;
    out->n++;
  }
  if (!rc && out->n == 0) rc = kiln_errorf(KILN_ERR_DATA, "%s: the list names no images", path);
  if (rc) kiln_image_list_free(out);
  return rc;
}
