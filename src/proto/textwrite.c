/* Protobuf text format out of protobuf-c messages: the inverse of textformat.c. CE writes the
 * solver it actually ran (overrides applied) into each run folder and writes baselines with it,
 * so both are ordinary prototxt that kiln_text_parse_file reads back to an equal message. */
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/proto.h"

static void indent(kiln_strbuf *b, int depth) { kiln_strbuf_printf(b, "%*s", depth * 2, ""); }

/* Quoted with C escapes; bytes outside printable ASCII as octal, which the parser reads back. */
static void put_quoted(kiln_strbuf *b, const uint8_t *s, size_t n) {
  kiln_strbuf_printf(b, "\"");
  for (size_t i = 0; i < n; i++) {
    uint8_t c = s[i];
    if (c == '"' || c == '\\') kiln_strbuf_printf(b, "\\%c", c);
    else if (c == '\n') kiln_strbuf_printf(b, "\\n");
    else if (c == '\t') kiln_strbuf_printf(b, "\\t");
    else if (c < 0x20 || c >= 0x7f) kiln_strbuf_printf(b, "\\%03o", c);
    else kiln_strbuf_printf(b, "%c", c);
  }
  kiln_strbuf_printf(b, "\"");
}

/* The shortest decimal that reads back to the same value, so 0.01f prints as 0.01 and not as
 * 0.00999999978. */
static void put_real(kiln_strbuf *b, double v, int is_float) {
  if (isnan(v)) {
    kiln_strbuf_printf(b, "nan");
    return;
  }
  if (isinf(v)) {
    kiln_strbuf_printf(b, v < 0 ? "-inf" : "inf");
    return;
  }
  char tmp[64];
  for (int prec = 1; prec <= 17; prec++) {
    snprintf(tmp, sizeof tmp, "%.*g", prec, v);
    if (is_float ? strtof(tmp, NULL) == (float)v : strtod(tmp, NULL) == v) break;
  }
  kiln_strbuf_printf(b, "%s", tmp);
}

static void write_message(kiln_strbuf *b, const ProtobufCMessage *m, int depth);

static void write_value(kiln_strbuf *b, const ProtobufCFieldDescriptor *f, const void *p, int depth) {
  switch (f->type) {
  case PROTOBUF_C_TYPE_INT32:
  case PROTOBUF_C_TYPE_SINT32:
  case PROTOBUF_C_TYPE_SFIXED32: kiln_strbuf_printf(b, "%" PRId32, *(const int32_t *)p); break;
  case PROTOBUF_C_TYPE_UINT32:
  case PROTOBUF_C_TYPE_FIXED32: kiln_strbuf_printf(b, "%" PRIu32, *(const uint32_t *)p); break;
  case PROTOBUF_C_TYPE_INT64:
  case PROTOBUF_C_TYPE_SINT64:
  case PROTOBUF_C_TYPE_SFIXED64: kiln_strbuf_printf(b, "%" PRId64, *(const int64_t *)p); break;
  case PROTOBUF_C_TYPE_UINT64:
  case PROTOBUF_C_TYPE_FIXED64: kiln_strbuf_printf(b, "%" PRIu64, *(const uint64_t *)p); break;
  case PROTOBUF_C_TYPE_FLOAT: put_real(b, *(const float *)p, 1); break;
  case PROTOBUF_C_TYPE_DOUBLE: put_real(b, *(const double *)p, 0); break;
  case PROTOBUF_C_TYPE_BOOL: kiln_strbuf_printf(b, "%s", *(const protobuf_c_boolean *)p ? "true" : "false"); break;
  case PROTOBUF_C_TYPE_ENUM: {
    int v = *(const int *)p;
    const ProtobufCEnumValue *ev = protobuf_c_enum_descriptor_get_value(f->descriptor, v);
    if (ev) kiln_strbuf_printf(b, "%s", ev->name);
    else kiln_strbuf_printf(b, "%d", v);
    break;
  }
  case PROTOBUF_C_TYPE_STRING: {
    const char *s = *(char *const *)p;
    put_quoted(b, (const uint8_t *)(s ? s : ""), s ? strlen(s) : 0);
    break;
  }
  case PROTOBUF_C_TYPE_BYTES: {
    const ProtobufCBinaryData *d = p;
    put_quoted(b, d->data, d->len);
    break;
  }
  case PROTOBUF_C_TYPE_MESSAGE:
    kiln_strbuf_printf(b, "{\n");
    write_message(b, *(ProtobufCMessage *const *)p, depth + 1);
    indent(b, depth);
    kiln_strbuf_printf(b, "}");
    break;
  }
}

/* Whether a singular field is set: protobuf-c keeps a has_ flag for optional scalars, a NULL (or
 * the static default) for strings and messages, and the member number for oneofs. */
static int is_set(const ProtobufCMessage *m, const ProtobufCFieldDescriptor *f) {
  const char *base = (const char *)m;
  if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF)
    return *(const uint32_t *)(base + f->quantifier_offset) == f->id;
  if (f->type == PROTOBUF_C_TYPE_STRING || f->type == PROTOBUF_C_TYPE_MESSAGE) {
    const void *p = *(void *const *)(base + f->offset);
    return p != NULL && p != f->default_value;
  }
  if (f->label == PROTOBUF_C_LABEL_REQUIRED) return 1;
  if (f->label == PROTOBUF_C_LABEL_OPTIONAL && f->quantifier_offset)
    return *(const protobuf_c_boolean *)(base + f->quantifier_offset) != 0;
  /* proto3 singular scalars: set when not zero */
  const unsigned char *p = (const unsigned char *)(base + f->offset);
  for (size_t i = 0; i < kiln_proto_value_size(f->type); i++)
    if (p[i]) return 1;
  return 0;
}

static void write_message(kiln_strbuf *b, const ProtobufCMessage *m, int depth) {
  const ProtobufCMessageDescriptor *d = m->descriptor;
  /* Fields in declaration order (the descriptor keeps them sorted by number). */
  for (unsigned k = 0; k < d->n_fields; k++) {
    const ProtobufCFieldDescriptor *f = &d->fields[k];
    const char *base = (const char *)m;
    const char *sep = f->type == PROTOBUF_C_TYPE_MESSAGE ? " " : ": ";
    if (f->label == PROTOBUF_C_LABEL_REPEATED) {
      size_t n = *(const size_t *)(base + f->quantifier_offset);
      const char *arr = *(char *const *)(base + f->offset);
      for (size_t i = 0; i < n; i++) {
        indent(b, depth);
        kiln_strbuf_printf(b, "%s%s", f->name, sep);
        write_value(b, f, arr + i * kiln_proto_value_size(f->type), depth);
        kiln_strbuf_printf(b, "\n");
      }
    } else if (is_set(m, f)) {
      indent(b, depth);
      kiln_strbuf_printf(b, "%s%s", f->name, sep);
      write_value(b, f, base + f->offset, depth);
      kiln_strbuf_printf(b, "\n");
    }
  }
}

int kiln_text_format(const ProtobufCMessage *msg, char **out) {
  kiln_strbuf b = {0};
  kiln_strbuf_printf(&b, "%s", "");
  write_message(&b, msg, 0);
  if (b.failed) {
    free(b.s);
    *out = NULL;
    return kiln_errorf(KILN_ERR_NOMEM, "out of memory formatting a %s",
                       msg->descriptor->short_name);
  }
  *out = b.s;
  return KILN_OK;
}
