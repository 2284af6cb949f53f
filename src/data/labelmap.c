/* Label maps of the SSD fork of Caffe (labelmap_voc.prototxt): a LabelMap message in text
 * format, read with kiln's text-format parser, checked as the fork's MapNameToLabel and
 * MapLabelToName do with strict_check (no two items share a name, nor a label), and held as
 * plain arrays for lookups by name and by label. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/data.h"
#include "kiln/proto.h"

/* Label maps larger than this are refused before they are read (COCO's is 8 KB). */
#define LABELMAP_MAX_BYTES ((size_t)16 << 20)

void kiln_labelmap_free(kiln_labelmap *m) {
  if (!m) return;
  for (size_t i = 0; i < m->n; i++) {
    free(m->name ? m->name[i] : NULL);
    free(m->display_name ? m->display_name[i] : NULL);
  }
  free(m->name);
  free(m->display_name);
  free(m->label);
  free(m->line);
  free(m->source);
  memset(m, 0, sizeof *m);
}

/* The line of each top-level `item` field of text[0 .. len), as the parser reads them: the
 * first `n` found go into line[] (the rest of line[] stays 0). Strings and comments are
 * skipped; nested messages ({ } or < >) are not top level. */
static void item_lines(const char *text, size_t len, int *line, size_t n) {
  int ln = 1, depth = 0;
  size_t found = 0;
  for (size_t i = 0; i < len && found < n;) {
    const char c = text[i];
    if (c == '\n') {
      ln++, i++;
    } else if (c == '#') {
      while (i < len && text[i] != '\n') i++;
    } else if (c == '"' || c == '\'') {
      for (i++; i < len && text[i] != c && text[i] != '\n'; i++)
        if (text[i] == '\\' && i + 1 < len && text[i + 1] != '\n') i++;
      if (i < len && text[i] == c) i++;
    } else if (c == '{' || c == '<') {
      depth++, i++;
    } else if (c == '}' || c == '>') {
      depth -= depth > 0, i++;
    } else if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
               (c >= '0' && c <= '9')) {
      size_t s = i;
      while (i < len && ((text[i] >= 'a' && text[i] <= 'z') || (text[i] >= 'A' && text[i] <= 'Z') ||
                         text[i] == '_' || text[i] == '.' || (text[i] >= '0' && text[i] <= '9')))
        i++;
      if (depth == 0 && i - s == 4 && !memcmp(text + s, "item", 4)) line[found++] = ln;
    } else {
      i++;
    }
  }
}

/* "item 3 (line 12)", or "item 3" when the line is unknown. */
static const char *item_where(const kiln_labelmap *m, size_t i, char *buf, size_t n) {
  if (m->line[i] > 0)
    snprintf(buf, n, "item %zu (line %d)", i + 1, m->line[i]);
  else
    snprintf(buf, n, "item %zu", i + 1);
  return buf;
}

/* "PATH:LINE" of item i, or "PATH" when its line is unknown. */
static const char *file_line(const kiln_labelmap *m, size_t i, const char *path, char *buf,
                             size_t n) {
  if (m->line[i] > 0)
    snprintf(buf, n, "%s:%d", path, m->line[i]);
  else
    snprintf(buf, n, "%s", path);
  return buf;
}

/* The checks of the fork's strict MapNameToLabel and MapLabelToName, and kiln's own: every item
 * has a non-empty name and a label >= 0; no name and no label twice. Fills name[] and label[]. */
static int check_items(kiln_labelmap *m, const Caffe__LabelMap *msg, const char *path) {
  char a[64], b[64], at[4200];
  if (m->n == 0) return kiln_errorf(KILN_ERR_DATA, "%s: the label map holds no items", path);
  for (size_t i = 0; i < m->n; i++) {
    const Caffe__LabelMapItem *it = msg->item[i];
    file_line(m, i, path, at, sizeof at);
    if (!it->name || !it->name[0])
      return kiln_errorf(KILN_ERR_DATA, "%s: %s has %s: every item needs a name and a label", at,
                         item_where(m, i, a, sizeof a), it->name ? "an empty name" : "no name");
    if (!it->has_label)
      return kiln_errorf(KILN_ERR_DATA,
                         "%s: %s ('%s') has no label: every item needs a name and a label", at,
                         item_where(m, i, a, sizeof a), it->name);
    if (it->label < 0)
      return kiln_errorf(KILN_ERR_DATA, "%s: %s ('%s') has label %d: labels are 0 or more", at,
                         item_where(m, i, a, sizeof a), it->name, (int)it->label);
    for (size_t j = 0; j < i; j++) {
      if (!strcmp(m->name[j], it->name))
        return kiln_errorf(KILN_ERR_DATA,
                           "%s: %s and %s have the same name '%s' (labels %d and %d): a name "
                           "may stand for one label only",
                           at, item_where(m, j, a, sizeof a), item_where(m, i, b, sizeof b),
                           it->name, (int)m->label[j], (int)it->label);
      if (m->label[j] == it->label)
        return kiln_errorf(KILN_ERR_DATA,
                           "%s: %s ('%s') and %s ('%s') have the same label %d: a label may "
                           "have one name only",
                           at, item_where(m, j, a, sizeof a), m->name[j],
                           item_where(m, i, b, sizeof b), it->name, (int)it->label);
    }
    m->label[i] = it->label; /* kept as soon as checked: later items compare against it */
    if (!(m->name[i] = kiln_strdup(it->name)))
      return kiln_errorf(KILN_ERR_NOMEM, "%s: out of memory", path);
  }
  return KILN_OK;
}

int kiln_labelmap_parse(const char *text, size_t len, const char *path, kiln_labelmap *out) {
  memset(out, 0, sizeof *out);
  if (!path) path = "label map";
  ProtobufCMessage *parsed = NULL;
  KILN_TRY(kiln_text_parse(text, len, path, &caffe__label_map__descriptor, &parsed));
  const Caffe__LabelMap *msg = (const Caffe__LabelMap *)parsed;
  const size_t n = msg->n_item, cnt = n ? n : 1;
  out->source = kiln_strdup(path);
  out->name = calloc(cnt, sizeof *out->name);
  out->display_name = calloc(cnt, sizeof *out->display_name);
  out->label = calloc(cnt, sizeof *out->label);
  out->line = calloc(cnt, sizeof *out->line);
  int rc = KILN_OK;
  if (!out->source || !out->name || !out->display_name || !out->label || !out->line) {
    rc = kiln_errorf(KILN_ERR_NOMEM, "%s: out of memory for the label map", path);
  } else {
    out->n = n;
    item_lines(text, len, out->line, n);
    rc = check_items(out, msg, path);
  }
  for (size_t i = 0; !rc && i < n; i++) {
    const char *d = msg->item[i]->display_name;
    if (!(out->display_name[i] = kiln_strdup(d ? d : "")))
      rc = kiln_errorf(KILN_ERR_NOMEM, "%s: out of memory", path);
  }
  protobuf_c_message_free_unpacked(parsed, NULL);
  if (rc) kiln_labelmap_free(out);
  return rc;
}

int kiln_labelmap_read(const char *path, kiln_labelmap *out) {
  memset(out, 0, sizeof *out);
  char *text;
  size_t len;
  KILN_TRY(kiln_read_file_max(path, LABELMAP_MAX_BYTES, &text, &len));
  int rc = kiln_labelmap_parse(text, len, path, out);
  free(text);
  return rc;
}

int kiln_labelmap_find_name(const kiln_labelmap *m, const char *name) {
  for (size_t i = 0; i < m->n; i++)
    if (!strcmp(m->name[i], name)) return (int)i;
  return -1;
}

int kiln_labelmap_find_label(const kiln_labelmap *m, int32_t label) {
  for (size_t i = 0; i < m->n; i++)
    if (m->label[i] == label) return (int)i;
  return -1;
}
