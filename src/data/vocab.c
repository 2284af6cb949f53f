/* Text into token ids: the tokenizer (characters or words), vocabularies built from text with a
 * frequency cut-off, and the vocabulary file (docs/formats.md, "Vocabulary files").
 *
 * A character is a UTF-8 code point (a byte that is no valid UTF-8 is a token of its own). A word
 * is a run of letters and digits (ASCII, and every code point from U+0080 up except the general
 * punctuation block U+2000-U+206F, so that "ago—never" is three tokens), with apostrophes inside
 * it ("don't"); every other character but white space is a token of its own, and white space
 * separates. Lowercasing touches ASCII letters only. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/internal.h"
#include "kiln/data.h"

/* ---- tokens -------------------------------------------------------------------------------- */

/* The code point at s (n bytes left) and its length in bytes; an invalid sequence is one byte
 * with the code point -1. */
int kiln_utf8_next(const unsigned char *s, size_t n, int32_t *cp) {
  unsigned char c = s[0];
  int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
  if (len == 1) {
    *cp = c;
    return 1;
  }
  if (len == 0 || (size_t)len > n) {
    *cp = -1;
    return 1;
  }
  int32_t v = c & (0x7f >> len);
  for (int i = 1; i < len; i++) {
    if ((s[i] & 0xc0) != 0x80) {
      *cp = -1;
      return 1;
    }
    v = (v << 6) | (s[i] & 0x3f);
  }
  static const int32_t least[5] = {0, 0, 0x80, 0x800, 0x10000};
  if (v < least[len] || v > 0x10ffff || (v >= 0xd800 && v <= 0xdfff)) {
    *cp = -1;
    return 1;
  }
  *cp = v;
  return len;
}

bool kiln_text_is_space(int32_t cp) {
  return cp == ' ' || cp == '\t' || cp == '\n' || cp == '\r' || cp == '\f' || cp == '\v' ||
         cp == 0xa0 || cp == 0x3000 || (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 ||
         cp == 0x2029;
}

static bool is_word(int32_t cp) {
  if (cp < 0) return false;
  if (cp < 0x80) return (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') || (cp >= '0' && cp <= '9');
  return !(cp >= 0x2000 && cp <= 0x206f) && !kiln_text_is_space(cp) && cp != 0xab &&
         cp != 0xbb && cp != 0xbf && cp != 0xa1;
}

static bool is_apostrophe(int32_t cp) { return cp == '\'' || cp == 0x2019; }

/* Calls fn with each token, lowercased into `buf` when asked (buf holds a whole token: the
 * caller passes one as long as the text). */
static int emit(const char *tok, size_t len, bool lowercase, char *buf, kiln_token_fn fn,
                void *user) {
  if (!lowercase) return fn(user, tok, len);
  for (size_t i = 0; i < len; i++) {
    char c = tok[i];
    buf[i] = c >= 'A' && c <= 'Z' ? (char)(c - 'A' + 'a') : c;
  }
  return fn(user, buf, len);
}

int kiln_tokenize(const char *text, size_t n, kiln_token_level level, bool lowercase,
                  kiln_token_fn fn, void *user) {
  char small[256], *buf = small;
  if (lowercase && n > sizeof small && !(buf = malloc(n)))
    return kiln_errorf(KILN_ERR_NOMEM, "out of memory for a text of %zu bytes", n);
  const unsigned char *s = (const unsigned char *)text;
  int rc = KILN_OK;
  size_t i = 0;
  while (i < n && !rc) {
    int32_t cp;
    int len = kiln_utf8_next(s + i, n - i, &cp);
    if (level == KILN_TOKENS_CHAR) {
      rc = emit(text + i, (size_t)len, lowercase, buf, fn, user);
      i += (size_t)len;
      continue;
    }
    if (kiln_text_is_space(cp)) {
      i += (size_t)len;
      continue;
    }
    if (!is_word(cp)) {
      rc = emit(text + i, (size_t)len, lowercase, buf, fn, user);
      i += (size_t)len;
      continue;
    }
    size_t start = i;
    i += (size_t)len;
    while (i < n) {
      int32_t c2;
      int l2 = kiln_utf8_next(s + i, n - i, &c2);
      if (is_word(c2)) {
        i += (size_t)l2;
        continue;
      }
      if (is_apostrophe(c2) && i + (size_t)l2 < n) {
        int32_t c3;
        kiln_utf8_next(s + i + l2, n - i - (size_t)l2, &c3);
        if (is_word(c3)) {
          i += (size_t)l2;
          continue;
        }
      }
      break;
    }
    rc = emit(text + start, i - start, lowercase, buf, fn, user);
  }
  if (buf != small) free(buf);
  return rc;
}

/* ---- the vocabulary ------------------------------------------------------------------------ */

struct kiln_vocab {
  kiln_token_level level;
  bool lowercase;
  int size;
  char **token;
  size_t *len;
  int64_t *count; /* building only */
  int *slot;      /* open addressing: token id + 1, 0 for empty */
  size_t nslots;  /* a power of two */
  int pad_id, unk_id;
};

static uint64_t hash_bytes(const char *s, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
  return h;
}

static int find_slot(const kiln_vocab *v, const char *tok, size_t len, size_t *at) {
  size_t mask = v->nslots - 1, i = hash_bytes(tok, len) & mask;
  for (;;) {
    int id = v->slot[i] - 1;
    if (id < 0) {
      *at = i;
      return -1;
    }
    if (v->len[id] == len && !memcmp(v->token[id], tok, len)) {
      *at = i;
      return id;
    }
    i = (i + 1) & mask;
  }
}

int kiln_vocab_id(const kiln_vocab *v, const char *tok, size_t len) {
  size_t at;
  return v->nslots ? find_slot(v, tok, len, &at) : -1;
}

static int grow(kiln_vocab *v) {
  size_t n = v->nslots ? 2 * v->nslots : 1024;
  int *slot = calloc(n, sizeof *slot);
  char **token = realloc(v->token, n / 2 * sizeof *token);
  if (token) v->token = token;
  size_t *len = realloc(v->len, n / 2 * sizeof *len);
  if (len) v->len = len;
  int64_t *count = realloc(v->count, n / 2 * sizeof *count);
  if (count) v->count = count;
  if (!slot || !token || !len || !count) {
    free(slot);
    return kiln_errorf(KILN_ERR_NOMEM, "out of memory for a vocabulary of %d tokens", v->size);
  }
  free(v->slot);
  v->slot = slot;
  v->nslots = n;
  for (int id = 0; id < v->size; id++) {
    size_t at;
    find_slot(v, v->token[id], v->len[id], &at);
    v->slot[at] = id + 1;
  }
  return KILN_OK;
}

/* The token's id, added with count 0 when new (`added` says so). */
static int intern(kiln_vocab *v, const char *tok, size_t len, int *id, bool *added) {
  if (len == 0) return kiln_errorf(KILN_ERR_INVALID, "an empty token");
  if ((size_t)(v->size + 1) * 2 > v->nslots) {
    if (v->size >= KILN_VOCAB_MAX_TOKENS)
      return kiln_errorf(KILN_ERR_INVALID, "more than %d distinct tokens", KILN_VOCAB_MAX_TOKENS);
    KILN_TRY(grow(v));
  }
  size_t at;
  int found = find_slot(v, tok, len, &at);
  if (added) *added = found < 0;
  if (found >= 0) {
    *id = found;
    return KILN_OK;
  }
  char *copy = malloc(len + 1);
  if (!copy) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  memcpy(copy, tok, len);
  copy[len] = '\0';
  v->token[v->size] = copy;
  v->len[v->size] = len;
  v->count[v->size] = 0;
  v->slot[at] = v->size + 1;
  *id = v->size++;
  return KILN_OK;
}

static kiln_vocab *vocab_new(kiln_token_level level, bool lowercase) {
  kiln_vocab *v = calloc(1, sizeof *v);
  if (!v) return NULL;
  v->level = level;
  v->lowercase = lowercase;
  v->pad_id = v->unk_id = -1;
  return v;
}

void kiln_vocab_free(kiln_vocab *v) {
  if (!v) return;
  for (int i = 0; i < v->size; i++) free(v->token[i]);
  free(v->token);
  free(v->len);
  free(v->count);
  free(v->slot);
  free(v);
}

int kiln_vocab_size(const kiln_vocab *v) { return v->size; }
int kiln_vocab_pad_id(const kiln_vocab *v) { return v->pad_id; }
int kiln_vocab_unk_id(const kiln_vocab *v) { return v->unk_id; }
kiln_token_level kiln_vocab_level(const kiln_vocab *v) { return v->level; }
bool kiln_vocab_lowercase(const kiln_vocab *v) { return v->lowercase; }
const char *kiln_vocab_token(const kiln_vocab *v, int id, size_t *len) {
  if (id < 0 || id >= v->size) return NULL;
  if (len) *len = v->len[id];
  return v->token[id];
}

/* ---- building ------------------------------------------------------------------------------ */

struct kiln_vocab_builder {
  kiln_vocab *v;
  /* tokens the vocabulary holds whatever the text, right after <pad> and <unk> */
  char *reserved[KILN_VOCAB_MAX_RESERVED];
  int nreserved;
};

int kiln_vocab_builder_new(kiln_token_level level, bool lowercase, kiln_vocab_builder **out) {
  *out = NULL;
  kiln_vocab_builder *b = calloc(1, sizeof *b);
  if (!b || !(b->v = vocab_new(level, lowercase))) {
    free(b);
    return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  }
  *out = b;
  return KILN_OK;
}

static int count_token(void *user, const char *tok, size_t len) {
  kiln_vocab *v = user;
  int id;
  KILN_TRY(intern(v, tok, len, &id, NULL));
  v->count[id]++;
  return KILN_OK;
}

int kiln_vocab_builder_reserve(kiln_vocab_builder *b, const char *token) {
  if (b->nreserved == KILN_VOCAB_MAX_RESERVED)
    return kiln_errorf(KILN_ERR_INVALID, "more than %d reserved tokens", KILN_VOCAB_MAX_RESERVED);
  if (!token[0]) return kiln_errorf(KILN_ERR_INVALID, "an empty reserved token");
  if (!(b->reserved[b->nreserved] = kiln_strdup(token)))
    return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  b->nreserved++;
  return KILN_OK;
}

int kiln_vocab_builder_add(kiln_vocab_builder *b, const char *text, size_t n) {
  return kiln_tokenize(text, n, b->v->level, b->v->lowercase, count_token, b->v);
}

int kiln_vocab_builder_add_record(void *builder, const char *text, size_t len, int label,
                                  int line) {
  (void)label, (void)line;
  return kiln_vocab_builder_add(builder, text, len);
}

static const int64_t *sort_counts; /* qsort has no user pointer; building is single-threaded */
static char *const *sort_tokens;
static const size_t *sort_lens;

static int by_count(const void *a, const void *b) {
  int x = *(const int *)a, y = *(const int *)b;
  if (sort_counts[x] != sort_counts[y]) return sort_counts[x] > sort_counts[y] ? -1 : 1;
  size_t n = sort_lens[x] < sort_lens[y] ? sort_lens[x] : sort_lens[y];
  int c = memcmp(sort_tokens[x], sort_tokens[y], n);
  if (c) return c;
  return sort_lens[x] < sort_lens[y] ? -1 : sort_lens[x] > sort_lens[y];
}

int64_t kiln_vocab_builder_tokens(const kiln_vocab_builder *b) {
  int64_t n = 0;
  for (int i = 0; i < b->v->size; i++) n += b->v->count[i];
  return n;
}

int kiln_vocab_builder_check_size(const kiln_vocab_builder *b, int max_size) {
  int least = 3 + b->nreserved; /* <pad>, <unk>, the reserved ones and a token of the text */
  if (max_size < 0 || (max_size > 0 && max_size < least) || max_size > KILN_VOCAB_MAX_TOKENS)
    return kiln_errorf(KILN_ERR_INVALID,
                       "the largest vocabulary %d: expected 0 (no limit) or %d to %d tokens, "
                       "<pad> and <unk>%s included",
                       max_size, least, KILN_VOCAB_MAX_TOKENS,
                       b->nreserved ? " (and the reserved tokens)" : "");
  return KILN_OK;
}

int kiln_vocab_builder_finish(kiln_vocab_builder *b, int64_t min_count, int max_size,
                              kiln_vocab **out) {
  *out = NULL;
  kiln_vocab *seen = b->v;
  KILN_TRY(kiln_vocab_builder_check_size(b, max_size));
  int *order = malloc(sizeof(int) * (size_t)(seen->size ? seen->size : 1));
  kiln_vocab *v = vocab_new(seen->level, seen->lowercase);
  if (!order || !v) {
    free(order);
    kiln_vocab_free(v);
    return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  }
  for (int i = 0; i < seen->size; i++) order[i] = i;
  sort_counts = seen->count;
  sort_tokens = seen->token;
  sort_lens = seen->len;
  qsort(order, (size_t)seen->size, sizeof *order, by_count);
  int id, rc = intern(v, KILN_VOCAB_PAD, strlen(KILN_VOCAB_PAD), &id, NULL);
  v->pad_id = 0;
  if (!rc) rc = intern(v, KILN_VOCAB_UNK, strlen(KILN_VOCAB_UNK), &id, NULL);
  v->unk_id = 1;
  for (int i = 0; i < b->nreserved && !rc; i++)
    rc = intern(v, b->reserved[i], strlen(b->reserved[i]), &id, NULL);
  for (int i = 0; i < seen->size && !rc; i++) {
    int t = order[i];
    if (seen->count[t] < min_count || (max_size && v->size >= max_size)) break;
    bool added;
    rc = intern(v, seen->token[t], seen->len[t], &id, &added);
    /* a text that holds "<pad>" or "<unk>" as a word: the reserved ids stand for it */
    (void)added;
  }
  free(order);
  if (rc) {
    kiln_vocab_free(v);
    return rc;
  }
  *out = v;
  return KILN_OK;
}

void kiln_vocab_builder_free(kiln_vocab_builder *b) {
  if (!b) return;
  for (int i = 0; i < b->nreserved; i++) free(b->reserved[i]);
  kiln_vocab_free(b->v);
  free(b);
}

/* ---- the file ------------------------------------------------------------------------------ */

#define HEADER "# kiln vocabulary:"
/* The largest vocabulary file read: 2^24 tokens of up to ~15 bytes. */
#define VOCAB_FILE_MAX_BYTES ((size_t)256 << 20)

int kiln_vocab_write(const kiln_vocab *v, const char *path) {
  kiln_strbuf sb = {0};
  kiln_strbuf_printf(&sb, "%s level %s, lowercase %d, %d tokens\n", HEADER,
                     v->level == KILN_TOKENS_WORD ? "word" : "char", v->lowercase ? 1 : 0, v->size);
  for (int i = 0; i < v->size && !sb.failed; i++) {
    char *esc = malloc(2 * v->len[i] + 1), *o = esc;
    if (!esc) {
      sb.failed = 1;
      break;
    }
    for (size_t k = 0; k < v->len[i]; k++) {
      char c = v->token[i][k];
      const char *e = c == '\\' ? "\\\\" : c == '\n' ? "\\n" : c == '\t' ? "\\t" : c == '\r' ? "\\r"
                    : c == ' '  ? "\\s" : c == '\0' ? "\\0" : NULL;
      if (e) {
        *o++ = e[0];
        *o++ = e[1];
      } else {
        *o++ = c;
      }
    }
    kiln_strbuf_printf(&sb, "%.*s\n", (int)(o - esc), esc);
    free(esc);
  }
  if (sb.failed) {
    free(sb.s);
    return kiln_errorf(KILN_ERR_NOMEM, "out of memory for the vocabulary's text");
  }
  int rc = kiln_write_file_atomic(path, sb.s, sb.len);
  free(sb.s);
  return rc;
}

int kiln_vocab_read(const char *path, kiln_vocab **out) {
  *out = NULL;
  char *text;
  size_t n;
  KILN_TRY(kiln_read_file_max(path, VOCAB_FILE_MAX_BYTES, &text, &n));
  int rc = kiln_text_check_nul(path, text, n), line = 1; /* a NUL token is written \0 */
  kiln_vocab *v = NULL;
  if (rc) goto done;
  char *nl = memchr(text, '\n', n);
  char level[16];
  int lower = -1, declared = -1, used = 0;
  if (!nl || sscanf(text, HEADER " level %15[a-z], lowercase %d, %d tokens%n", level, &lower,
                    &declared, &used) != 3 ||
      text + used != nl || (strcmp(level, "char") && strcmp(level, "word")) ||
      (lower != 0 && lower != 1) || declared < 0 || declared > KILN_VOCAB_MAX_TOKENS) {
    rc = kiln_errorf(KILN_ERR_PARSE,
                     "%s:1: not a kiln vocabulary (the first line must read \"" HEADER
                     " level char|word, lowercase 0|1, N tokens\"; kiln convert text writes it)",
                     path);
    goto done;
  }
  v = vocab_new(!strcmp(level, "word") ? KILN_TOKENS_WORD : KILN_TOKENS_CHAR, lower == 1);
  if (!v) {
    rc = kiln_errorf(KILN_ERR_NOMEM, "out of memory");
    goto done;
  }
  for (char *p = nl + 1; p < text + n && !rc;) {
    line++;
    char *end = memchr(p, '\n', (size_t)(text + n - p));
    if (!end) {
      rc = kiln_errorf(KILN_ERR_PARSE, "%s:%d: the last line has no newline (a cut file?)", path, line);
      break;
    }
    long len = kiln_text_unescape(p, (size_t)(end - p), true);
    if (len < 0) {
      rc = kiln_errorf(KILN_ERR_PARSE, "%s:%d: a backslash that is not one of \\\\ \\n \\t \\r \\s \\0",
                       path, line);
      break;
    }
    if (len == 0) {
      rc = kiln_errorf(KILN_ERR_PARSE, "%s:%d: an empty token", path, line);
      break;
    }
    int id;
    bool added;
    rc = intern(v, p, (size_t)len, &id, &added);
    if (rc) {
      rc = kiln_error_context(rc, "%s:%d: ", path, line);
      break;
    }
    if (!added) {
      rc = kiln_errorf(KILN_ERR_PARSE, "%s:%d: token '%.*s' given twice (first at line %d)", path,
                       line, (int)(len < 40 ? len : 40), p, id + 2);
      break;
    }
    if ((size_t)len == strlen(KILN_VOCAB_PAD) && !memcmp(p, KILN_VOCAB_PAD, (size_t)len)) v->pad_id = id;
    if ((size_t)len == strlen(KILN_VOCAB_UNK) && !memcmp(p, KILN_VOCAB_UNK, (size_t)len)) v->unk_id = id;
    p = end + 1;
  }
  if (!rc && v->size != declared)
    rc = kiln_errorf(KILN_ERR_PARSE, "%s: %d tokens, but its first line says %d (a cut file?)",
                     path, v->size, declared);
done:
  free(text);
  if (rc) {
    kiln_vocab_free(v);
    return rc;
  }
  free(v->count);
  v->count = NULL;
  *out = v;
  return KILN_OK;
}
