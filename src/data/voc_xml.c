/* PASCAL VOC annotations (VOC2007/Annotations/000005.xml): the image's <size> and its
 * <object>s, read through libxml2 as the SSD fork's ReadXMLToAnnotatedDatum reads them with
 * boost's property tree, into normalised boxes with the fork's arithmetic.
 *
 * libxml2 is told to stay off the network (XML_PARSE_NONET) and not to load or substitute
 * anything (no XML_PARSE_NOENT, no DTD loading); a DOCTYPE stops the parse where it stands (a
 * SAX hook), so no entity is ever declared, which rules out external entities (XXE) and entity
 * expansion whatever libxml2's defaults. libxml2 reports errors to stderr unless told otherwise:
 * for the parse, this thread's error handlers are kiln's (they keep the first error's message
 * and line), and are put back afterwards. Where the fork warns and goes on (a box past the
 * image, a box upside down, no size, an unknown name is fatal there too), kiln refuses the file
 * naming its line: a bad box trains as a wrong target. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libxml/parser.h>
#include <libxml/tree.h>

#include "kiln/data.h"

/* Annotation files are about a kilobyte; anything past this is not one. */
#define VOC_MAX_BYTES ((size_t)16 << 20)

typedef struct xml_errors {
  bool have;    /* the first error is kept */
  bool doctype; /* the document declared a DOCTYPE (parse stopped) */
  int line;
  char msg[400];
} xml_errors;

static void on_error(void *user, xmlErrorPtr e) {
  xml_errors *x = user;
  if (x->have || !e || e->level == XML_ERR_WARNING || e->level == XML_ERR_NONE) return;
  x->have = true;
  x->line = e->line;
  snprintf(x->msg, sizeof x->msg, "%s", e->message ? e->message : "unknown error");
  size_t n = strlen(x->msg);
  while (n && (x->msg[n - 1] == '\n' || x->msg[n - 1] == ' ')) x->msg[--n] = '\0';
}

static void on_generic(void *user, const char *fmt, ...) { (void)user, (void)fmt; }

/* The SAX event for <!DOCTYPE ...>, before any of its declarations is read. */
static void on_doctype(void *ctx, const xmlChar *name, const xmlChar *external_id,
                       const xmlChar *system_id) {
  (void)name, (void)external_id, (void)system_id;
  xmlParserCtxtPtr ctxt = ctx;
  xml_errors *x = ctxt->_private;
  x->doctype = true;
  x->line = ctxt->input ? ctxt->input->line : 0;
  xmlStopParser(ctxt);
}

static pthread_once_t xml_once = PTHREAD_ONCE_INIT;
static void xml_init(void) { xmlInitParser(); }

/* Parses xml[0 .. len) into *doc; errors name `path` and the line. */
static int parse_document(const char *xml, size_t len, const char *path, xmlDocPtr *doc) {
  *doc = NULL;
  size_t i = 0;
  while (i < len && (xml[i] == ' ' || xml[i] == '\t' || xml[i] == '\n' || xml[i] == '\r')) i++;
  if (i == len)
    return kiln_errorf(KILN_ERR_PARSE, "%s:1: an empty file, not a VOC annotation", path);
  if (len > (size_t)INT32_MAX)
    return kiln_errorf(KILN_ERR_INVALID, "%s: %zu bytes; not an annotation", path, len);
  pthread_once(&xml_once, xml_init);
  xml_errors x = {0};
  /* this thread's handlers, kiln's for the parse */
  xmlStructuredErrorFunc old_structured = xmlStructuredError;
  void *old_structured_ctx = xmlStructuredErrorContext;
  xmlGenericErrorFunc old_generic = xmlGenericError;
  void *old_generic_ctx = xmlGenericErrorContext;
  xmlSetStructuredErrorFunc(&x, on_error);
  xmlSetGenericErrorFunc(NULL, on_generic);
  int rc = KILN_OK;
  xmlParserCtxtPtr ctxt = xmlNewParserCtxt();
  if (!ctxt) {
    rc = kiln_errorf(KILN_ERR_NOMEM, "%s: out of memory for the XML parser", path);
  } else {
    ctxt->_private = &x;
    ctxt->sax->internalSubset = on_doctype;
    *doc = xmlCtxtReadMemory(ctxt, xml, (int)len, NULL, NULL,
                             XML_PARSE_NONET | XML_PARSE_NOERROR | XML_PARSE_NOWARNING |
                                 XML_PARSE_BIG_LINES | XML_PARSE_NOCDATA);
    if (x.doctype) {
      rc = kiln_errorf(KILN_ERR_PARSE,
                       "%s:%d: a DOCTYPE: VOC annotations have none, and kiln reads no DTD (no "
                       "entity declarations, no external entities)",
                       path, x.line);
    } else if (!*doc) {
      rc = x.have ? kiln_errorf(KILN_ERR_PARSE, "%s:%d: not well-formed XML: %s", path, x.line,
                                x.msg)
                  : kiln_errorf(KILN_ERR_PARSE, "%s: not well-formed XML", path);
    }
    if (rc && *doc) {
      xmlFreeDoc(*doc);
      *doc = NULL;
    }
    xmlFreeParserCtxt(ctxt);
  }
  xmlSetStructuredErrorFunc(old_structured_ctx, old_structured);
  xmlSetGenericErrorFunc(old_generic_ctx, old_generic);
  return rc;
}

static bool is_element(const xmlNode *n, const char *name) {
  return n->type == XML_ELEMENT_NODE && !strcmp((const char *)n->name, name);
}

/* The first element child of `parent` called `name` (NULL: none); *count (may be NULL) gets how
 * many there are. */
static xmlNodePtr child(const xmlNode *parent, const char *name, int *count) {
  xmlNodePtr first = NULL;
  int n = 0;
  for (xmlNodePtr c = parent->children; c; c = c->next)
    if (is_element(c, name)) {
      if (!first) first = c;
      n++;
    }
  if (count) *count = n;
  return first;
}

static int line_of(const xmlNode *n) {
  long l = xmlGetLineNo(n);
  return l > 0 && l < INT32_MAX ? (int)l : 0;
}

/* The text of element n, spaces around it cut, into buf (cut short at n bytes). */
static const char *text_of(const xmlNode *n, char *buf, size_t cap) {
  xmlChar *t = xmlNodeGetContent(n);
  const char *s = t ? (const char *)t : "";
  while (*s == ' ' || *s == '\t' || *s == '\n' || *s == '\r') s++;
  size_t len = strlen(s);
  while (len && (s[len - 1] == ' ' || s[len - 1] == '\t' || s[len - 1] == '\n' ||
                 s[len - 1] == '\r'))
    len--;
  snprintf(buf, cap, "%.*s", (int)(len < cap ? len : cap - 1), s);
  xmlFree(t);
  return buf;
}

/* The number in element n's text: finite, the whole text. */
static bool number_of(const xmlNode *n, double *out, char *text, size_t cap) {
  text_of(n, text, cap);
  if (!text[0]) return false;
  char *end;
  double v = strtod(text, &end);
  if (*end || !isfinite(v)) return false;
  *out = v;
  return true;
}

/* <size>'s child `name`: a whole number in lo .. hi; absent is KILN_ERR_DATA unless `optional`
 * (then *out = 0). */
static int size_field(const xmlNode *size, const char *name, long lo, long hi, bool optional,
                      const char *path, int *out) {
  *out = 0;
  xmlNodePtr n = child(size, name, NULL);
  if (!n) {
    if (optional) return KILN_OK;
    return kiln_errorf(KILN_ERR_DATA, "%s:%d: <size> has no <%s>", path, line_of(size), name);
  }
  char text[64];
  double v;
  if (!number_of(n, &v, text, sizeof text) || v != floor(v) || v < (double)lo || v > (double)hi)
    return kiln_errorf(KILN_ERR_DATA, "%s:%d: <%s> '%s' is not a whole number from %ld to %ld",
                       path, line_of(n), name, text, lo, hi);
  *out = (int)v;
  return KILN_OK;
}

static const char *const coord_names[4] = {"xmin", "ymin", "xmax", "ymax"};

/* One <object>: its label, difficult flag and box, checked against the image's size. */
static int read_object(const xmlNode *obj, const kiln_labelmap *map, const char *path, int width,
                       int height, kiln_voc_object *o, int *map_index) {
  const int line = line_of(obj);
  int count;
  char text[256];
  xmlNodePtr name = child(obj, "name", &count);
  if (!name) return kiln_errorf(KILN_ERR_DATA, "%s:%d: an <object> without a <name>", path, line);
  if (count > 1)
    return kiln_errorf(KILN_ERR_DATA, "%s:%d: an <object> with %d <name>s", path, line, count);
  text_of(name, text, sizeof text);
  const int at = kiln_labelmap_find_name(map, text);
  if (at < 0)
    return kiln_errorf(KILN_ERR_DATA, "%s:%d: object name '%s' is not in the label map %s", path,
                       line_of(name), text, map->source ? map->source : "");
  *map_index = at;
  o->line = line;
  o->box.label = map->label[at];
  xmlNodePtr diff = child(obj, "difficult", &count);
  if (diff) {
    text_of(diff, text, sizeof text);
    if (count > 1 || (strcmp(text, "0") && strcmp(text, "1")))
      return kiln_errorf(KILN_ERR_DATA, "%s:%d: <difficult> '%s'%s: 0 or 1", path, line_of(diff),
                         text, count > 1 ? " (given twice)" : "");
    o->box.difficult = text[0] == '1';
  }
  xmlNodePtr box = child(obj, "bndbox", &count);
  if (!box)
    return kiln_errorf(KILN_ERR_DATA, "%s:%d: an <object> without a <bndbox>", path, line);
  if (count > 1)
    return kiln_errorf(KILN_ERR_DATA, "%s:%d: an <object> with %d <bndbox>es", path, line, count);
  for (int k = 0; k < 4; k++) {
    xmlNodePtr c = child(box, coord_names[k], NULL);
    if (!c)
      return kiln_errorf(KILN_ERR_DATA, "%s:%d: <bndbox> has no <%s>", path, line_of(box),
                         coord_names[k]);
    if (!number_of(c, &o->pixels[k], text, sizeof text))
      return kiln_errorf(KILN_ERR_DATA, "%s:%d: <%s> '%s' is not a number", path, line_of(c),
                         coord_names[k], text);
  }
  const double *p = o->pixels;
  const int bline = line_of(box);
  if (p[0] > p[2] || p[1] > p[3])
    return kiln_errorf(KILN_ERR_DATA, "%s:%d: box %g %g %g %g (xmin ymin xmax ymax) has %s",
                       path, bline, p[0], p[1], p[2], p[3],
                       p[0] > p[2] ? "xmin > xmax" : "ymin > ymax");
  for (int k = 0; k < 4; k++)
    if (p[k] < 0 || p[k] > (k % 2 ? height : width))
      return kiln_errorf(KILN_ERR_DATA,
                         "%s:%d: box %g %g %g %g (xmin ymin xmax ymax) lies outside the %d x %d "
                         "image (width x height): %s %g",
                         path, bline, p[0], p[1], p[2], p[3], width, height, coord_names[k],
                         p[k]);
  /* the fork's static_cast<float>(xmin) / width */
  o->box.box.xmin = (float)p[0] / (float)width;
  o->box.box.ymin = (float)p[1] / (float)height;
  o->box.box.xmax = (float)p[2] / (float)width;
  o->box.box.ymax = (float)p[3] / (float)height;
  return KILN_OK;
}

static int read_annotation(const xmlNode *root, const kiln_labelmap *map, const char *path,
                           kiln_voc_annotation *out) {
  int count;
  xmlNodePtr size = child(root, "size", &count);
  if (!size)
    return kiln_errorf(KILN_ERR_DATA, "%s:%d: <annotation> has no <size>", path, line_of(root));
  if (count > 1)
    return kiln_errorf(KILN_ERR_DATA, "%s:%d: <annotation> has %d <size>s", path, line_of(root),
                       count);
  KILN_TRY(size_field(size, "width", 1, KILN_IMAGE_MAX_SIDE, false, path, &out->width));
  KILN_TRY(size_field(size, "height", 1, KILN_IMAGE_MAX_SIDE, false, path, &out->height));
  KILN_TRY(size_field(size, "depth", 0, 1 << 20, true, path, &out->depth));
  child(root, "object", &count);
  if (count == 0)
    return kiln_errorf(KILN_ERR_DATA, "%s:%d: no objects: the <annotation> holds no <object>",
                       path, line_of(root));
  out->object = calloc((size_t)count, sizeof *out->object);
  int *seen = calloc(map->n ? map->n : 1, sizeof *seen); /* objects so far, per map item */
  if (!out->object || !seen) {
    free(seen);
    return kiln_errorf(KILN_ERR_NOMEM, "%s: out of memory for %d objects", path, count);
  }
  int rc = KILN_OK;
  for (xmlNodePtr c = root->children; c && !rc; c = c->next) {
    if (!is_element(c, "object")) continue;
    kiln_voc_object *o = &out->object[out->n];
    int at = 0;
    rc = read_object(c, map, path, out->width, out->height, o, &at);
    if (!rc) {
      o->box.instance_id = seen[at]++;
      out->n++;
    }
  }
  free(seen);
  return rc;
}

void kiln_voc_free(kiln_voc_annotation *a) {
  if (!a) return;
  free(a->object);
  memset(a, 0, sizeof *a);
}

int kiln_voc_parse(const char *xml, size_t len, const char *path, const kiln_labelmap *map,
                   kiln_voc_annotation *out) {
  memset(out, 0, sizeof *out);
  if (!path) path = "annotation";
  xmlDocPtr doc;
  KILN_TRY(parse_document(xml, len, path, &doc));
  int rc;
  xmlNodePtr root = xmlDocGetRootElement(doc);
  if (!root)
    rc = kiln_errorf(KILN_ERR_PARSE, "%s:1: an XML document without an element", path);
  else if (!is_element(root, "annotation"))
    rc = kiln_errorf(KILN_ERR_DATA, "%s:%d: the root element is <%s>, not <annotation>", path,
                     line_of(root), (const char *)root->name);
  else
    rc = read_annotation(root, map, path, out);
  xmlFreeDoc(doc);
  if (rc) kiln_voc_free(out);
  return rc;
}

int kiln_voc_read(const char *path, const kiln_labelmap *map, kiln_voc_annotation *out) {
  memset(out, 0, sizeof *out);
  char *text;
  size_t len;
  KILN_TRY(kiln_read_file_max(path, VOC_MAX_BYTES, &text, &len));
  int rc = kiln_voc_parse(text, len, path, map, out);
  free(text);
  return rc;
}
