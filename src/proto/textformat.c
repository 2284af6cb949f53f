/* Protobuf text format, the language of Caffe's .prototxt files, into protobuf-c messages. Fields
 * are found by name through the message descriptors, so one parser fills NetParameter,
 * SolverParameter or any other message of the schema. Everything is allocated with malloc in the
 * layout protobuf-c's own unpacker produces, so protobuf_c_message_free_unpacked(msg, NULL) frees a
 * parsed message, whole or (on an error path) partial. */
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/proto.h"

/* Real nets nest a handful of levels; the bound keeps hostile input from exhausting the stack. */
enum { MAX_DEPTH = 100 };
/* Longest name looked up or shown; longer ones cannot be fields of any sane schema. */
enum { MAX_NAME = 255 };

typedef enum { TOK_END, TOK_IDENT, TOK_NUMBER, TOK_STRING, TOK_SYMBOL } tok_kind;

typedef struct {
  tok_kind kind;
  size_t start, end; /* byte span in the text; a string's span includes its quotes */
  int is_float;      /* numbers: written with '.', an exponent or an 'f' suffix */
  int base;          /* numbers: 8, 10 or 16 */
} token;

typedef struct {
  const char *text;
  size_t len, pos;
  size_t bom; /* bytes of a UTF-8 byte-order mark, not counted as columns */
  const char *path;
  token tok; /* one token of lookahead */
  char *sbuf; /* decoded string literals (adjacent literals concatenate here) */
  size_t slen, scap;
} parser;

/* A parsed scalar, kept apart from the message until it is complete so that a failure halfway
 * never leaves a half-written field behind. */
typedef union {
  int32_t i32;
  int64_t i64;
  uint32_t u32;
  uint64_t u64;
  float f;
  double d;
  protobuf_c_boolean b;
  int e;
  char *s;
  ProtobufCBinaryData bytes;
} value;

/* ---- characters: ASCII only, so the locale cannot change what a token is ------------------ */

static int is_digit(unsigned c) { return c >= '0' && c <= '9'; }
static int is_alpha(unsigned c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
static int is_ident(unsigned c) { return is_alpha(c) || is_digit(c) || c == '_'; }
static int is_space(unsigned c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}
static int hex_value(unsigned c) {
  if (is_digit(c)) return (int)(c - '0');
  if (c >= 'a' && c <= 'f') return (int)(c - 'a' + 10);
  if (c >= 'A' && c <= 'F') return (int)(c - 'A' + 10);
  return -1;
}
static int lower(unsigned c) { return c >= 'A' && c <= 'Z' ? (int)(c - 'A' + 'a') : (int)c; }

/* ---- errors ------------------------------------------------------------------------------- */

static void line_col(const parser *P, size_t off, size_t *line, size_t *col) {
  size_t l = 1, line_start = 0;
  if (off > P->len) off = P->len;
  for (size_t i = 0; i < off; i++)
    if (P->text[i] == '\n') {
      l++;
      line_start = i + 1;
    }
  size_t c = off - line_start + 1;
  if (l == 1 && c > P->bom) c -= P->bom;
  *line = l;
  *col = c;
}

__attribute__((format(printf, 3, 4))) static int perr(const parser *P, size_t off,
                                                       const char *fmt, ...) {
  char msg[3072];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  size_t line, col;
  line_col(P, off, &line, &col);
  return kiln_errorf(KILN_ERR_PARSE, "%s:%zu:%zu: %s", P->path, line, col, msg);
}

static int nomem(const parser *P) { return kiln_errorf(KILN_ERR_NOMEM, "%s: out of memory", P->path); }

/* Copies text for a message: at most 40 bytes, unprintable bytes as '?', "..." when cut, so
 * that fuzzed or binary input still gives a readable one-line message. */
static const char *clip(const char *p, size_t n, char *out, size_t outn) {
  size_t keep = n > 40 ? 40 : n, o = 0;
  for (size_t i = 0; i < keep && o + 1 < outn; i++) {
    unsigned char c = (unsigned char)p[i];
    out[o++] = (c >= 32 && c < 127) ? (char)c : '?';
  }
  if (keep < n)
    for (int k = 0; k < 3 && o + 1 < outn; k++) out[o++] = '.';
  out[o] = '\0';
  return out;
}

static const char *describe_char(unsigned char c, char *buf, size_t n) {
  if (c >= 32 && c < 127)
    snprintf(buf, n, "character '%c'", c);
  else
    snprintf(buf, n, "byte 0x%02X", c);
  return buf;
}

/* "end of file", "'foo'", "number 1.5", "string \"abc\"", "'{'" */
static const char *describe(const parser *P, const token *t, char *buf, size_t n) {
  char s[64];
  const char *p = P->text + t->start;
  size_t len = t->end - t->start;
  switch (t->kind) {
  case TOK_END: snprintf(buf, n, "end of file"); break;
  case TOK_IDENT: snprintf(buf, n, "'%s'", clip(p, len, s, sizeof s)); break;
  case TOK_NUMBER: snprintf(buf, n, "number %s", clip(p, len, s, sizeof s)); break;
  case TOK_STRING: snprintf(buf, n, "string %s", clip(p, len, s, sizeof s)); break;
  case TOK_SYMBOL: snprintf(buf, n, "'%c'", *p); break;
  }
  return buf;
}

static const char *type_name(ProtobufCType t) {
  switch (t) {
  case PROTOBUF_C_TYPE_INT32: return "int32";
  case PROTOBUF_C_TYPE_SINT32: return "sint32";
  case PROTOBUF_C_TYPE_SFIXED32: return "sfixed32";
  case PROTOBUF_C_TYPE_INT64: return "int64";
  case PROTOBUF_C_TYPE_SINT64: return "sint64";
  case PROTOBUF_C_TYPE_SFIXED64: return "sfixed64";
  case PROTOBUF_C_TYPE_UINT32: return "uint32";
  case PROTOBUF_C_TYPE_FIXED32: return "fixed32";
  case PROTOBUF_C_TYPE_UINT64: return "uint64";
  case PROTOBUF_C_TYPE_FIXED64: return "fixed64";
  case PROTOBUF_C_TYPE_FLOAT: return "float";
  case PROTOBUF_C_TYPE_DOUBLE: return "double";
  case PROTOBUF_C_TYPE_BOOL: return "bool";
  case PROTOBUF_C_TYPE_ENUM: return "enum";
  case PROTOBUF_C_TYPE_STRING: return "string";
  case PROTOBUF_C_TYPE_BYTES: return "bytes";
  case PROTOBUF_C_TYPE_MESSAGE: return "message";
  }
  return "?";
}

/* "LEVELDB, LMDB", cut with "..." when an enum is too long for one message. */
static void enum_names(const ProtobufCEnumDescriptor *ed, char *buf, size_t n) {
  size_t o = 0;
  buf[0] = '\0';
  for (unsigned i = 0; i < ed->n_values; i++) {
    int w = snprintf(buf + o, n - o, "%s%s", i ? ", " : "", ed->values[i].name);
    if (w < 0 || (size_t)w >= n - o - 4) {
      snprintf(buf + o, n - o, "%s...", i ? ", " : "");
      return;
    }
    o += (size_t)w;
  }
}

/* What a field wants, for "expects ..., got ..." messages. */
static const char *expectation(const ProtobufCFieldDescriptor *f, char *buf, size_t n) {
  switch (f->type) {
  case PROTOBUF_C_TYPE_INT32:
  case PROTOBUF_C_TYPE_SINT32:
  case PROTOBUF_C_TYPE_SFIXED32:
  case PROTOBUF_C_TYPE_INT64:
  case PROTOBUF_C_TYPE_SINT64:
  case PROTOBUF_C_TYPE_SFIXED64: snprintf(buf, n, "an integer (%s)", type_name(f->type)); break;
  case PROTOBUF_C_TYPE_UINT32:
  case PROTOBUF_C_TYPE_FIXED32:
  case PROTOBUF_C_TYPE_UINT64:
  case PROTOBUF_C_TYPE_FIXED64:
    snprintf(buf, n, "a non-negative integer (%s)", type_name(f->type));
    break;
  case PROTOBUF_C_TYPE_FLOAT:
  case PROTOBUF_C_TYPE_DOUBLE: snprintf(buf, n, "a number (%s)", type_name(f->type)); break;
  case PROTOBUF_C_TYPE_BOOL: snprintf(buf, n, "true or false"); break;
  case PROTOBUF_C_TYPE_ENUM: {
    char names[1024];
    enum_names(f->descriptor, names, sizeof names);
    snprintf(buf, n, "one of %s", names);
    break;
  }
  case PROTOBUF_C_TYPE_STRING: snprintf(buf, n, "a quoted string"); break;
  case PROTOBUF_C_TYPE_BYTES: snprintf(buf, n, "a quoted string (bytes)"); break;
  case PROTOBUF_C_TYPE_MESSAGE:
    snprintf(buf, n, "a message (%s)",
             ((const ProtobufCMessageDescriptor *)f->descriptor)->short_name);
    break;
  }
  return buf;
}

static int wrong_type(const parser *P, const ProtobufCMessageDescriptor *md,
                      const ProtobufCFieldDescriptor *f) {
  char want[1200], got[96];
  return perr(P, P->tok.start, "field '%s' in %s expects %s, got %s", f->name, md->short_name,
              expectation(f, want, sizeof want), describe(P, &P->tok, got, sizeof got));
}

/* ---- lexer -------------------------------------------------------------------------------- */

static int lex_number(parser *P, size_t i, token *t) {
  const unsigned char *s = (const unsigned char *)P->text;
  size_t n = P->len, st = i;
  char c1[32];
  t->base = 10;
  if (s[i] == '0' && i + 1 < n && (s[i + 1] == 'x' || s[i + 1] == 'X')) {
    i += 2;
    size_t d = i;
    while (i < n && hex_value(s[i]) >= 0) i++;
    if (i == d) return perr(P, st, "invalid number: '0x' without hex digits");
    t->base = 16;
  } else {
    while (i < n && is_digit(s[i])) i++;
    if (i < n && s[i] == '.') {
      t->is_float = 1;
      i++;
      while (i < n && is_digit(s[i])) i++;
    }
    if (i < n && (s[i] == 'e' || s[i] == 'E')) {
      t->is_float = 1;
      i++;
      if (i < n && (s[i] == '+' || s[i] == '-')) i++;
      size_t d = i;
      while (i < n && is_digit(s[i])) i++;
      if (i == d) return perr(P, st, "invalid number: exponent without digits");
    }
    if (i < n && (s[i] == 'f' || s[i] == 'F')) {
      t->is_float = 1;
      i++;
    }
    /* Protobuf reads a leading zero as octal, so kiln does too rather than disagree with Caffe. */
    if (!t->is_float && s[st] == '0' && i - st > 1) {
      t->base = 8;
      for (size_t k = st + 1; k < i; k++)
        if (s[k] > '7') {
          char txt[64];
          return perr(P, st, "invalid octal number '%s' (a leading 0 means octal)",
                      clip(P->text + st, i - st, txt, sizeof txt));
        }
    }
  }
  if (i < n && (is_ident(s[i]) || s[i] == '.'))
    return perr(P, i, "unexpected %s after a number", describe_char(s[i], c1, sizeof c1));
  t->kind = TOK_NUMBER;
  t->end = i;
  return KILN_OK;
}

static int lex_string(parser *P, size_t i, token *t) {
  const char *s = P->text;
  size_t n = P->len, st = i;
  char q = s[i++];
  for (;;) {
    if (i >= n || s[i] == '\n')
      return perr(P, st, "unterminated string (no closing %c on this line)", q);
    if (s[i] == '\\') {
      i++;
      if (i < n && s[i] != '\n') i++;
      continue;
    }
    if (s[i++] == q) break;
  }
  t->kind = TOK_STRING;
  t->end = i;
  return KILN_OK;
}

/* Reads the next token into P->tok, skipping white space and '#' comments. */
static int lex(parser *P) {
  const unsigned char *s = (const unsigned char *)P->text;
  size_t n = P->len, i = P->pos;
  for (;;) {
    while (i < n && is_space(s[i])) i++;
    if (i < n && s[i] == '#') {
      while (i < n && s[i] != '\n') i++;
      continue;
    }
    break;
  }
  token *t = &P->tok;
  memset(t, 0, sizeof *t);
  t->start = t->end = i;
  int rc = KILN_OK;
  if (i >= n) {
    t->kind = TOK_END;
  } else if (is_alpha(s[i]) || s[i] == '_') {
    while (i < n && is_ident(s[i])) i++;
    t->kind = TOK_IDENT;
    t->end = i;
  } else if (is_digit(s[i]) || (s[i] == '.' && i + 1 < n && is_digit(s[i + 1]))) {
    rc = lex_number(P, i, t);
  } else if (s[i] == '"' || s[i] == '\'') {
    rc = lex_string(P, i, t);
  } else if (s[i] != 0 && strchr("{}<>[]:,;-", s[i])) {
    t->kind = TOK_SYMBOL;
    t->end = i + 1;
  } else {
    char c[32];
    return perr(P, i, "unexpected %s", describe_char(s[i], c, sizeof c));
  }
  P->pos = t->end;
  return rc;
}

static int is_sym(const parser *P, char c) {
  return P->tok.kind == TOK_SYMBOL && P->text[P->tok.start] == c;
}

static int ident_is(const parser *P, const char *word, int any_case) {
  size_t n = P->tok.end - P->tok.start;
  if (P->tok.kind != TOK_IDENT || strlen(word) != n) return 0;
  for (size_t i = 0; i < n; i++) {
    unsigned a = (unsigned char)P->text[P->tok.start + i], b = (unsigned char)word[i];
    if (any_case ? lower(a) != lower(b) : a != b) return 0;
  }
  return 1;
}

/* The current identifier as a C string; 0 when it is too long to be a name. */
static int ident_copy(const parser *P, char *buf) {
  size_t n = P->tok.end - P->tok.start;
  if (n > MAX_NAME) return 0;
  memcpy(buf, P->text + P->tok.start, n);
  buf[n] = '\0';
  return 1;
}

/* ---- numbers ------------------------------------------------------------------------------ */

/* An integer token's magnitude; returns 0 on overflow of 64 bits. */
static int token_uint(const parser *P, const token *t, uint64_t *out) {
  const char *s = P->text;
  size_t i = t->start;
  unsigned base = (unsigned)t->base;
  if (base == 16) i += 2;
  uint64_t v = 0;
  for (; i < t->end; i++) {
    unsigned d = (unsigned)hex_value((unsigned char)s[i]);
    if (v > (UINT64_MAX - d) / base) return 0;
    v = v * base + d;
  }
  *out = v;
  return 1;
}

/* A decimal token as a double, independent of the C locale (strtod would want the locale's
 * decimal point): the digits are rewritten as an integer mantissa with a power of ten, "0.999"
 * as "999e-3", which strtod reads correctly rounded in any locale. */
static int token_double(const parser *P, const token *t, double *out) {
  const char *s = P->text;
  size_t len = t->end - t->start;
  char small[128];
  char *buf = len + 32 <= sizeof small ? small : malloc(len + 32);
  if (!buf) return nomem(P);
  size_t nd = 0, i = t->start;
  int64_t exp10 = 0;
  int frac = 0;
  for (; i < t->end; i++) {
    char c = s[i];
    if (c == '.') {
      frac = 1;
    } else if (is_digit((unsigned char)c)) {
      if (nd || c != '0') buf[nd++] = c; /* leading zeros only shift the exponent */
      if (frac) exp10--;
    } else {
      break;
    }
  }
  if (i < t->end && (s[i] == 'e' || s[i] == 'E')) {
    int neg = 0;
    int64_t e = 0;
    i++;
    if (s[i] == '+' || s[i] == '-') neg = s[i++] == '-';
    /* Saturates far beyond double's range, so the sum below cannot overflow. */
    for (; i < t->end && is_digit((unsigned char)s[i]); i++)
      if (e < 1000000000000LL) e = e * 10 + (s[i] - '0');
    exp10 += neg ? -e : e;
  }
  if (nd == 0) {
    *out = 0.0;
  } else {
    snprintf(buf + nd, 32, "e%lld", (long long)exp10);
    *out = strtod(buf, NULL);
  }
  if (buf != small) free(buf);
  return KILN_OK;
}

static float double_to_float(double d) {
  /* Converting a double beyond float's range is undefined behaviour in C, so round to the
   * nearest float by hand there: FLT_MAX plus half its ulp (2^103) and above is infinity. */
  if (d > FLT_MAX) return d >= (double)FLT_MAX + 0x1p103 ? INFINITY : FLT_MAX;
  if (d < -FLT_MAX) return d <= -(double)FLT_MAX - 0x1p103 ? -INFINITY : -FLT_MAX;
  return (float)d;
}

/* ---- string literals ---------------------------------------------------------------------- */

static void put_utf8(parser *P, uint32_t cp) {
  char *o = P->sbuf + P->slen;
  if (cp < 0x80) {
    o[0] = (char)cp;
    P->slen += 1;
  } else if (cp < 0x800) {
    o[0] = (char)(0xC0 | (cp >> 6));
    o[1] = (char)(0x80 | (cp & 0x3F));
    P->slen += 2;
  } else if (cp < 0x10000) {
    o[0] = (char)(0xE0 | (cp >> 12));
    o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[2] = (char)(0x80 | (cp & 0x3F));
    P->slen += 3;
  } else {
    o[0] = (char)(0xF0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    P->slen += 4;
  }
}

/* Reads exactly `digits` hex digits at s[*i]; -1 when they are not there. */
static long hex_run(const char *s, size_t *i, size_t end, int digits) {
  long v = 0;
  for (int k = 0; k < digits; k++) {
    if (*i >= end || hex_value((unsigned char)s[*i]) < 0) return -1;
    v = v * 16 + hex_value((unsigned char)s[(*i)++]);
  }
  return v;
}

/* Appends the decoded current string token to P->sbuf. */
static int decode_string(parser *P) {
  const char *s = P->text;
  size_t i = P->tok.start + 1, end = P->tok.end - 1; /* inside the quotes */
  /* Decoding never lengthens a literal (the longest output, 4 bytes of UTF-8, comes from a
   * 10-byte "\UXXXXXXXX"), so the raw length bounds the growth. */
  size_t need = P->slen + (end - i) + 1;
  if (need > P->scap) {
    size_t cap = P->scap ? P->scap : 64;
    while (cap < need) cap *= 2;
    char *nb = realloc(P->sbuf, cap);
    if (!nb) return nomem(P);
    P->sbuf = nb;
    P->scap = cap;
  }
  while (i < end) {
    char c = s[i];
    if (c != '\\') {
      P->sbuf[P->slen++] = c;
      i++;
      continue;
    }
    size_t at = i++; /* the lexer guarantees a character after every backslash */
    c = s[i++];
    switch (c) {
    case 'a': P->sbuf[P->slen++] = '\a'; break;
    case 'b': P->sbuf[P->slen++] = '\b'; break;
    case 'f': P->sbuf[P->slen++] = '\f'; break;
    case 'n': P->sbuf[P->slen++] = '\n'; break;
    case 'r': P->sbuf[P->slen++] = '\r'; break;
    case 't': P->sbuf[P->slen++] = '\t'; break;
    case 'v': P->sbuf[P->slen++] = '\v'; break;
    case '\\':
    case '\'':
    case '"':
    case '?': P->sbuf[P->slen++] = c; break;
    case '0': case '1': case '2': case '3': case '4': case '5': case '6': case '7': {
      unsigned v = (unsigned)(c - '0');
      for (int k = 0; k < 2 && i < end && s[i] >= '0' && s[i] <= '7'; k++) v = v * 8 + (unsigned)(s[i++] - '0');
      if (v > 255) return perr(P, at, "octal escape above \\377 in string");
      P->sbuf[P->slen++] = (char)v;
      break;
    }
    case 'x':
    case 'X': {
      int v = -1;
      for (int k = 0; k < 2 && i < end && hex_value((unsigned char)s[i]) >= 0; k++)
        v = (v < 0 ? 0 : v * 16) + hex_value((unsigned char)s[i++]);
      if (v < 0) return perr(P, at, "escape '\\x' without hex digits in string");
      P->sbuf[P->slen++] = (char)v;
      break;
    }
    case 'u':
    case 'U': {
      long cp = hex_run(s, &i, end, c == 'u' ? 4 : 8);
      if (cp < 0) return perr(P, at, "escape '\\%c' needs %d hex digits", c, c == 'u' ? 4 : 8);
      if (cp >= 0xD800 && cp <= 0xDBFF && i + 1 < end && s[i] == '\\' && s[i + 1] == 'u') {
        /* A UTF-16 surrogate pair written as two escapes, as JSON-minded writers do. */
        size_t j = i + 2;
        long lo = hex_run(s, &j, end, 4);
        if (lo >= 0xDC00 && lo <= 0xDFFF) {
          cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          i = j;
        }
      }
      if ((cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF)
        return perr(P, at, "escape '\\%c' is not a valid Unicode code point", c);
      put_utf8(P, (uint32_t)cp);
      break;
    }
    default:
      if ((unsigned char)c >= 32 && (unsigned char)c < 127)
        return perr(P, at, "invalid escape '\\%c' in string", c);
      return perr(P, at, "invalid escape: '\\' followed by byte 0x%02X in string",
                  (unsigned char)c);
    }
  }
  return KILN_OK;
}

/* ---- storing into messages ---------------------------------------------------------------- */

static void *member(ProtobufCMessage *m, unsigned offset) { return (char *)m + offset; }

static void free_value(ProtobufCType t, value *v) {
  if (t == PROTOBUF_C_TYPE_STRING) free(v->s);
  if (t == PROTOBUF_C_TYPE_BYTES) free(v->bytes.data);
}

/* Frees what a singular field owns, leaving the static defaults protobuf-c points at alone (the
 * same test protobuf_c_message_free_unpacked makes). */
static void release_singular(ProtobufCMessage *m, const ProtobufCFieldDescriptor *f) {
  void *slot = member(m, f->offset);
  if (f->type == PROTOBUF_C_TYPE_STRING) {
    char *old;
    memcpy(&old, slot, sizeof old);
    if (old && old != f->default_value) free(old);
  } else if (f->type == PROTOBUF_C_TYPE_BYTES) {
    ProtobufCBinaryData old;
    const ProtobufCBinaryData *def = f->default_value;
    memcpy(&old, slot, sizeof old);
    if (old.data && (!def || old.data != def->data)) free(old.data);
  } else if (f->type == PROTOBUF_C_TYPE_MESSAGE) {
    ProtobufCMessage *old;
    memcpy(&old, slot, sizeof old);
    if (old && old != f->default_value) protobuf_c_message_free_unpacked(old, NULL);
  }
}

/* Members of a oneof share storage: setting one frees whichever other member was set. */
static void select_oneof(ProtobufCMessage *m, const ProtobufCFieldDescriptor *f) {
  uint32_t *which = member(m, f->quantifier_offset);
  if (*which == f->id) return;
  const ProtobufCFieldDescriptor *other =
      *which ? protobuf_c_message_descriptor_get_field(m->descriptor, *which) : NULL;
  if (other) release_singular(m, other);
  memset(member(m, f->offset), 0, kiln_proto_value_size(f->type));
  *which = f->id;
}

/* Makes room for one more element of a repeated field and returns it, zeroed. Arrays grow in
 * powers of two (the capacity is implied by the count), so long lists stay linear. */
static void *append_slot(const parser *P, ProtobufCMessage *m, const ProtobufCFieldDescriptor *f,
                         void **slot_out) {
  size_t *count = member(m, f->quantifier_offset);
  void **array = member(m, f->offset);
  size_t n = *count, es = kiln_proto_value_size(f->type);
  if (n == 0 || (n & (n - 1)) == 0) {
    size_t cap = n ? 2 * n : 1;
    if (cap > SIZE_MAX / 2 / es) {
      nomem(P);
      return NULL;
    }
    void *na = realloc(*array, cap * es);
    if (!na) {
      nomem(P);
      return NULL;
    }
    *array = na;
  }
  void *slot = (char *)*array + n * es;
  memset(slot, 0, es);
  *slot_out = slot;
  return slot;
}

static ProtobufCMessage *new_message(const ProtobufCMessageDescriptor *d) {
  ProtobufCMessage *m = malloc(d->sizeof_message);
  if (m) protobuf_c_message_init(d, m);
  return m;
}

static int store_scalar(const parser *P, ProtobufCMessage *m, const ProtobufCFieldDescriptor *f,
                        value *v) {
  size_t es = kiln_proto_value_size(f->type);
  if (f->label == PROTOBUF_C_LABEL_REPEATED) {
    void *slot;
    if (!append_slot(P, m, f, &slot)) {
      free_value(f->type, v);
      return KILN_ERR_NOMEM;
    }
    memcpy(slot, v, es);
    (*(size_t *)member(m, f->quantifier_offset))++;
    return KILN_OK;
  }
  /* A singular field given twice: the last value wins, as in protobuf's own parser. */
  if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) select_oneof(m, f);
  release_singular(m, f);
  memcpy(member(m, f->offset), v, es);
  if (f->label == PROTOBUF_C_LABEL_OPTIONAL && !(f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) &&
      f->type != PROTOBUF_C_TYPE_STRING && f->type != PROTOBUF_C_TYPE_MESSAGE &&
      f->quantifier_offset != 0)
    *(protobuf_c_boolean *)member(m, f->quantifier_offset) = 1;
  return KILN_OK;
}

/* The message a `name { ... }` block fills: a new element of a repeated field, or the existing
 * sub-message of a singular one, so that a second block merges into the first. */
static ProtobufCMessage *message_slot(const parser *P, ProtobufCMessage *m,
                                      const ProtobufCFieldDescriptor *f) {
  const ProtobufCMessageDescriptor *sd = f->descriptor;
  ProtobufCMessage **slot;
  if (f->label == PROTOBUF_C_LABEL_REPEATED) {
    void *s;
    if (!append_slot(P, m, f, &s)) return NULL;
    slot = s;
  } else {
    if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) select_oneof(m, f);
    slot = member(m, f->offset);
    if (*slot) return *slot;
  }
  ProtobufCMessage *sub = new_message(sd);
  if (!sub) {
    nomem(P);
    return NULL;
  }
  *slot = sub;
  /* Counted before the body is parsed, so a failure inside still frees it with the rest. */
  if (f->label == PROTOBUF_C_LABEL_REPEATED) (*(size_t *)member(m, f->quantifier_offset))++;
  return sub;
}

/* ---- values ------------------------------------------------------------------------------- */

static int parse_integer(parser *P, const ProtobufCMessageDescriptor *md,
                         const ProtobufCFieldDescriptor *f, value *v) {
  size_t vstart = P->tok.start;
  int neg = is_sym(P, '-');
  if (neg) KILN_TRY(lex(P));
  if (P->tok.kind != TOK_NUMBER || P->tok.is_float) return wrong_type(P, md, f);
  uint64_t mag = 0;
  int fits = token_uint(P, &P->tok, &mag);
  int is_signed = 0;
  uint64_t max = 0;
  switch (f->type) {
  case PROTOBUF_C_TYPE_INT32:
  case PROTOBUF_C_TYPE_SINT32:
  case PROTOBUF_C_TYPE_SFIXED32: is_signed = 1; max = INT32_MAX; break;
  case PROTOBUF_C_TYPE_INT64:
  case PROTOBUF_C_TYPE_SINT64:
  case PROTOBUF_C_TYPE_SFIXED64: is_signed = 1; max = INT64_MAX; break;
  case PROTOBUF_C_TYPE_UINT32:
  case PROTOBUF_C_TYPE_FIXED32: max = UINT32_MAX; break;
  default: max = UINT64_MAX; break;
  }
  char lit[64];
  clip(P->text + vstart, P->tok.end - vstart, lit, sizeof lit);
  if (neg && !is_signed && mag != 0)
    return perr(P, vstart, "value %s is out of range for field '%s' (%s) in %s: it cannot be negative",
                lit, f->name, type_name(f->type), md->short_name);
  /* A signed type reaches one further below zero than above it. */
  if (!fits || mag > max + (uint64_t)(neg && is_signed))
    return perr(P, vstart, "value %s is out of range for field '%s' (%s) in %s", lit, f->name,
                type_name(f->type), md->short_name);
  if (kiln_proto_value_size(f->type) == 4) {
    if (is_signed)
      v->i32 = neg ? (int32_t)(-(int64_t)mag) : (int32_t)mag;
    else
      v->u32 = (uint32_t)mag;
  } else {
    if (is_signed)
      v->i64 = !neg ? (int64_t)mag : mag == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)mag;
    else
      v->u64 = mag;
  }
  return lex(P);
}

static int parse_real(parser *P, const ProtobufCMessageDescriptor *md,
                      const ProtobufCFieldDescriptor *f, value *v) {
  size_t vstart = P->tok.start;
  int neg = is_sym(P, '-');
  if (neg) KILN_TRY(lex(P));
  double d = 0;
  if (P->tok.kind == TOK_NUMBER && P->tok.base != 10) {
    uint64_t mag;
    if (!token_uint(P, &P->tok, &mag)) {
      char lit[64];
      return perr(P, vstart, "value %s is out of range for field '%s' (%s) in %s",
                  clip(P->text + vstart, P->tok.end - vstart, lit, sizeof lit), f->name,
                  type_name(f->type), md->short_name);
    }
    d = (double)mag;
  } else if (P->tok.kind == TOK_NUMBER) {
    KILN_TRY(token_double(P, &P->tok, &d));
  } else if (ident_is(P, "inf", 1) || ident_is(P, "infinity", 1)) {
    d = INFINITY;
  } else if (ident_is(P, "nan", 1)) {
    d = NAN;
  } else {
    return wrong_type(P, md, f);
  }
  if (neg) d = -d;
  if (f->type == PROTOBUF_C_TYPE_FLOAT)
    v->f = double_to_float(d);
  else
    v->d = d;
  return lex(P);
}

static int parse_bool(parser *P, const ProtobufCMessageDescriptor *md,
                      const ProtobufCFieldDescriptor *f, value *v) {
  if (ident_is(P, "true", 0) || ident_is(P, "True", 0) || ident_is(P, "t", 0)) {
    v->b = 1;
  } else if (ident_is(P, "false", 0) || ident_is(P, "False", 0) || ident_is(P, "f", 0)) {
    v->b = 0;
  } else if (P->tok.kind == TOK_NUMBER && !P->tok.is_float) {
    uint64_t mag;
    if (!token_uint(P, &P->tok, &mag) || mag > 1) return wrong_type(P, md, f);
    v->b = (protobuf_c_boolean)mag;
  } else {
    return wrong_type(P, md, f);
  }
  return lex(P);
}

static int parse_enum(parser *P, const ProtobufCMessageDescriptor *md,
                      const ProtobufCFieldDescriptor *f, value *v) {
  const ProtobufCEnumDescriptor *ed = f->descriptor;
  const ProtobufCEnumValue *ev = NULL;
  size_t vstart = P->tok.start;
  char shown[64], names[1024];
  if (P->tok.kind == TOK_IDENT) {
    char name[MAX_NAME + 1];
    if (ident_copy(P, name)) ev = protobuf_c_enum_descriptor_get_value_by_name(ed, name);
    clip(P->text + vstart, P->tok.end - vstart, shown, sizeof shown);
  } else if (is_sym(P, '-') || (P->tok.kind == TOK_NUMBER && !P->tok.is_float)) {
    /* Protobuf accepts an enum's number in place of its name. */
    int neg = is_sym(P, '-');
    if (neg) KILN_TRY(lex(P));
    if (P->tok.kind != TOK_NUMBER || P->tok.is_float) return wrong_type(P, md, f);
    uint64_t mag;
    if (token_uint(P, &P->tok, &mag) && mag <= (uint64_t)INT32_MAX + (uint64_t)neg)
      ev = protobuf_c_enum_descriptor_get_value(ed, neg ? (int)(-(int64_t)mag) : (int)mag);
    clip(P->text + vstart, P->tok.end - vstart, shown, sizeof shown);
  } else {
    return wrong_type(P, md, f);
  }
  if (!ev) {
    enum_names(ed, names, sizeof names);
    return perr(P, vstart, "unknown value '%s' for field '%s' in %s (valid values: %s)", shown,
                f->name, md->short_name, names);
  }
  v->e = ev->value;
  return lex(P);
}

static int parse_text(parser *P, const ProtobufCMessageDescriptor *md,
                      const ProtobufCFieldDescriptor *f, value *v) {
  size_t vstart = P->tok.start;
  if (P->tok.kind != TOK_STRING) return wrong_type(P, md, f);
  P->slen = 0;
  while (P->tok.kind == TOK_STRING) { /* "a" "b" is "ab", as in C */
    KILN_TRY(decode_string(P));
    KILN_TRY(lex(P));
  }
  if (f->type == PROTOBUF_C_TYPE_STRING) {
    /* A C string would silently end at the NUL; say so instead. */
    if (memchr(P->sbuf, 0, P->slen))
      return perr(P, vstart, "string for field '%s' in %s contains a NUL character", f->name,
                  md->short_name);
    v->s = malloc(P->slen + 1);
    if (!v->s) return nomem(P);
    memcpy(v->s, P->sbuf, P->slen);
    v->s[P->slen] = '\0';
  } else {
    v->bytes.len = P->slen;
    v->bytes.data = NULL;
    if (P->slen) {
      v->bytes.data = malloc(P->slen);
      if (!v->bytes.data) return nomem(P);
      memcpy(v->bytes.data, P->sbuf, P->slen);
    }
  }
  return KILN_OK;
}

static int parse_scalar(parser *P, ProtobufCMessage *m, const ProtobufCFieldDescriptor *f) {
  const ProtobufCMessageDescriptor *md = m->descriptor;
  value v;
  memset(&v, 0, sizeof v);
  int rc;
  switch (f->type) {
  case PROTOBUF_C_TYPE_FLOAT:
  case PROTOBUF_C_TYPE_DOUBLE: rc = parse_real(P, md, f, &v); break;
  case PROTOBUF_C_TYPE_BOOL: rc = parse_bool(P, md, f, &v); break;
  case PROTOBUF_C_TYPE_ENUM: rc = parse_enum(P, md, f, &v); break;
  case PROTOBUF_C_TYPE_STRING:
  case PROTOBUF_C_TYPE_BYTES: rc = parse_text(P, md, f, &v); break;
  case PROTOBUF_C_TYPE_MESSAGE: rc = KILN_ERR_INTERNAL; break;
  default: rc = parse_integer(P, md, f, &v); break;
  }
  if (rc != KILN_OK) {
    free_value(f->type, &v);
    return rc;
  }
  return store_scalar(P, m, f, &v);
}

/* ---- messages ----------------------------------------------------------------------------- */

static int parse_fields(parser *P, ProtobufCMessage *m, int depth, char close, size_t open_at);

static int parse_message_value(parser *P, ProtobufCMessage *m, const ProtobufCFieldDescriptor *f,
                               int depth) {
  if (!is_sym(P, '{') && !is_sym(P, '<')) {
    char want[256], got[96];
    return perr(P, P->tok.start, "field '%s' in %s is %s: expected '{', got %s", f->name,
                m->descriptor->short_name, expectation(f, want, sizeof want),
                describe(P, &P->tok, got, sizeof got));
  }
  size_t open_at = P->tok.start;
  char close = is_sym(P, '{') ? '}' : '>';
  if (depth + 1 > MAX_DEPTH)
    return perr(P, open_at, "messages nested more than %d levels deep", MAX_DEPTH);
  ProtobufCMessage *sub = message_slot(P, m, f);
  if (!sub) return KILN_ERR_NOMEM;
  KILN_TRY(lex(P));
  return parse_fields(P, sub, depth + 1, close, open_at);
}

/* `field: [v1, v2, ...]`, protobuf's short form for a repeated field. */
static int parse_list(parser *P, ProtobufCMessage *m, const ProtobufCFieldDescriptor *f,
                      int depth) {
  if (f->label != PROTOBUF_C_LABEL_REPEATED)
    return perr(P, P->tok.start,
                "field '%s' in %s is not repeated: the list syntax [...] needs a repeated field",
                f->name, m->descriptor->short_name);
  KILN_TRY(lex(P));
  if (is_sym(P, ']')) return lex(P);
  for (;;) {
    if (f->type == PROTOBUF_C_TYPE_MESSAGE)
      KILN_TRY(parse_message_value(P, m, f, depth));
    else
      KILN_TRY(parse_scalar(P, m, f));
    if (is_sym(P, ']')) return lex(P);
    if (!is_sym(P, ',')) {
      char got[96];
      return perr(P, P->tok.start, "expected ',' or ']' in the list for field '%s' in %s, got %s",
                  f->name, m->descriptor->short_name, describe(P, &P->tok, got, sizeof got));
    }
    KILN_TRY(lex(P));
  }
}

static size_t edit_distance(const char *a, size_t la, const char *b, size_t lb) {
  size_t row[MAX_NAME + 2];
  for (size_t j = 0; j <= lb; j++) row[j] = j;
  for (size_t i = 1; i <= la; i++) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= lb; j++) {
      size_t up = row[j];
      size_t best = diag + (a[i - 1] != b[j - 1]);
      if (up + 1 < best) best = up + 1;
      if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
      row[j] = best;
      diag = up;
    }
  }
  return row[lb];
}

static int unknown_field(const parser *P, const ProtobufCMessageDescriptor *md) {
  const char *name = P->text + P->tok.start;
  size_t len = P->tok.end - P->tok.start;
  char shown[64], hint[MAX_NAME + 32] = "";
  clip(name, len, shown, sizeof shown);
  const kiln_caffe_missing_layer *m =
      !strcmp(md->name, "caffe.LayerParameter") || !strcmp(md->name, "caffe.V1LayerParameter")
          ? kiln_caffe_missing_by_field(name, len)
          : NULL;
  if (m)
    return perr(P, P->tok.start, "'%s' is the parameter block of Caffe's %s layer, which kiln "
                "does not have%s%s", shown, m->type, m->note ? ": " : "", m->note ? m->note : "");
  if (len <= MAX_NAME) {
    size_t limit = len / 3 > 2 ? len / 3 : 2, best = limit + 1;
    const char *best_name = NULL;
    for (unsigned i = 0; i < md->n_fields; i++) {
      const char *cand = md->fields[i].name;
      size_t lc = strlen(cand);
      if (lc > MAX_NAME) continue;
      size_t d = edit_distance(name, len, cand, lc);
      if (d < best) {
        best = d;
        best_name = cand;
      }
    }
    if (best_name) snprintf(hint, sizeof hint, " (did you mean '%s'?)", best_name);
  }
  return perr(P, P->tok.start, "unknown field '%s' in %s%s", shown, md->short_name, hint);
}

static int parse_field(parser *P, ProtobufCMessage *m, int depth) {
  const ProtobufCMessageDescriptor *md = m->descriptor;
  char name[MAX_NAME + 1];
  const ProtobufCFieldDescriptor *f = NULL;
  if (ident_copy(P, name)) {
    f = protobuf_c_message_descriptor_get_field_by_name(md, name);
  }
  if (!f) return unknown_field(P, md);
  KILN_TRY(lex(P));
  int colon = is_sym(P, ':');
  if (colon) KILN_TRY(lex(P));
  if (colon && is_sym(P, '[')) return parse_list(P, m, f, depth);
  if (f->type == PROTOBUF_C_TYPE_MESSAGE) return parse_message_value(P, m, f, depth);
  if (!colon) {
    char got[96];
    if (is_sym(P, '{') || is_sym(P, '<'))
      return perr(P, P->tok.start, "field '%s' in %s is a %s, not a message: write '%s: VALUE'",
                  f->name, md->short_name, type_name(f->type), f->name);
    return perr(P, P->tok.start, "expected ':' after field name '%s' in %s, got %s", f->name,
                md->short_name, describe(P, &P->tok, got, sizeof got));
  }
  return parse_scalar(P, m, f);
}

/* Fields up to `close` ('}' or '>'), or to the end of the text for the outermost message. */
static int parse_fields(parser *P, ProtobufCMessage *m, int depth, char close, size_t open_at) {
  const char *msg_name = m->descriptor->short_name;
  char got[96];
  for (;;) {
    if (P->tok.kind == TOK_END) {
      if (!close) return KILN_OK;
      size_t line, col;
      line_col(P, open_at, &line, &col);
      return perr(P, P->tok.start,
                  "unexpected end of file: missing '%c' to close %s opened at %zu:%zu", close,
                  msg_name, line, col);
    }
    if (close && is_sym(P, close)) return lex(P);
    if (is_sym(P, '}') || is_sym(P, '>')) {
      if (!close)
        return perr(P, P->tok.start, "unexpected '%c' with no open message to close",
                    P->text[P->tok.start]);
      size_t line, col;
      line_col(P, open_at, &line, &col);
      return perr(P, P->tok.start, "expected '%c' to close %s opened at %zu:%zu, got '%c'", close,
                  msg_name, line, col, P->text[P->tok.start]);
    }
    if (P->tok.kind != TOK_IDENT)
      return perr(P, P->tok.start, "expected a field name of %s, got %s", msg_name,
                  describe(P, &P->tok, got, sizeof got));
    KILN_TRY(parse_field(P, m, depth));
    if (is_sym(P, ',') || is_sym(P, ';')) KILN_TRY(lex(P));
  }
}

/* Required strings and messages left unset would crash protobuf-c's packer later. (A required
 * scalar has no presence flag in protobuf-c, so it cannot be checked; Caffe's schema has no
 * required fields at all.) */
static int check_required(const parser *P, const ProtobufCMessage *m) {
  const ProtobufCMessageDescriptor *md = m->descriptor;
  for (unsigned i = 0; i < md->n_fields; i++) {
    const ProtobufCFieldDescriptor *f = &md->fields[i];
    const void *slot = (const char *)m + f->offset;
    if ((f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) &&
        *(const uint32_t *)((const char *)m + f->quantifier_offset) != f->id)
      continue;
    if (f->type != PROTOBUF_C_TYPE_STRING && f->type != PROTOBUF_C_TYPE_MESSAGE) continue;
    if (f->label == PROTOBUF_C_LABEL_REPEATED) {
      if (f->type != PROTOBUF_C_TYPE_MESSAGE) continue;
      size_t n = *(const size_t *)((const char *)m + f->quantifier_offset);
      ProtobufCMessage *const *subs = *(ProtobufCMessage *const *const *)slot;
      for (size_t k = 0; k < n; k++) KILN_TRY(check_required(P, subs[k]));
      continue;
    }
    const void *p = *(const void *const *)slot;
    if (!p && f->label == PROTOBUF_C_LABEL_REQUIRED)
      return kiln_errorf(KILN_ERR_PARSE, "%s: missing required field '%s' in %s", P->path,
                         f->name, md->short_name);
    if (p && f->type == PROTOBUF_C_TYPE_MESSAGE) KILN_TRY(check_required(P, p));
  }
  return KILN_OK;
}

/* ---- entry points ------------------------------------------------------------------------- */

int kiln_text_parse(const char *text, size_t len, const char *path,
                    const ProtobufCMessageDescriptor *desc, ProtobufCMessage **out) {
  if (!out) return kiln_errorf(KILN_ERR_INVALID, "kiln_text_parse: no output pointer");
  *out = NULL;
  if (!path) path = "<text>";
  if (!desc || desc->magic != PROTOBUF_C__MESSAGE_DESCRIPTOR_MAGIC)
    return kiln_errorf(KILN_ERR_INVALID, "%s: no valid message descriptor to parse into", path);
  if (!text && len) return kiln_errorf(KILN_ERR_INVALID, "%s: no text to parse", path);
  parser P;
  memset(&P, 0, sizeof P);
  P.text = text ? text : "";
  P.len = len;
  P.path = path;
  /* Editors on Windows may start a UTF-8 file with a byte-order mark. */
  if (len >= 3 && memcmp(text, "\xEF\xBB\xBF", 3) == 0) P.pos = P.bom = 3;
  ProtobufCMessage *msg = new_message(desc);
  if (!msg) return nomem(&P);
  int rc = lex(&P);
  if (rc == KILN_OK) rc = parse_fields(&P, msg, 0, 0, 0);
  if (rc == KILN_OK) rc = check_required(&P, msg);
  free(P.sbuf);
  if (rc != KILN_OK) {
    protobuf_c_message_free_unpacked(msg, NULL);
    return rc;
  }
  *out = msg;
  return KILN_OK;
}

int kiln_text_parse_file(const char *path, const ProtobufCMessageDescriptor *desc,
                         ProtobufCMessage **out) {
  if (out) *out = NULL;
  if (!path) return kiln_errorf(KILN_ERR_INVALID, "kiln_text_parse_file: no path");
  char *text;
  size_t len;
  KILN_TRY(kiln_read_file_max(path, KILN_TEXT_MAX_BYTES, &text, &len));
  int rc = kiln_text_parse(text, len, path, desc, out);
  free(text);
  return rc;
}
