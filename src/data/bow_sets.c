/* Bag-of-words data sets in libsvm files, derived from a cached text set (`kiln data fetch
 * spam-bow`, from spam-assassin): the text set's own splits, each mail a row whose features are
 * the words of the text set's vocabulary it holds. The rows are binary presence scaled to unit
 * length: a word's count mostly measures the mail's length and its repeated headers and markup,
 * and unit rows keep one learning rate right for a two-line mail and a 2,000-line one. Writes
 * each file through a temporary name, SHA256SUMS, then READY last (the cache's conventions). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

#include "data/internal.h"
#include "kiln/data.h"

static const char *const splits[3] = {"train", "valid", "test"};

typedef struct {
  const char *path;
  kiln_vocab *vocab;
  int32_t *ids;
  size_t n, cap;
  kiln_strbuf out;
  uint64_t records, entries;
} bow_state;

static int take_word(void *user, const char *tok, size_t len) {
  bow_state *s = user;
  int id = kiln_vocab_id(s->vocab, tok, len);
  if (id < 0) id = kiln_vocab_unk_id(s->vocab);
  if (id < 0) return KILN_OK;
  if (s->n == s->cap) {
    size_t cap = s->cap ? 2 * s->cap : 4096;
    int32_t *t = realloc(s->ids, cap * sizeof *t);
    if (!t) return kiln_errorf(KILN_ERR_NOMEM, "%s: out of memory", s->path);
    s->ids = t;
    s->cap = cap;
  }
  s->ids[s->n++] = id;
  return KILN_OK;
}

static int by_id(const void *a, const void *b) {
  int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
  return (x > y) - (x < y);
}

/* One mail: "LABEL i:v ..." over its distinct words, feature i being vocabulary id i - 1. */
static int take_mail(void *user, const char *text, size_t len, int label, int line) {
  bow_state *s = user;
  if (label < 0)
    return kiln_errorf(KILN_ERR_PARSE, "%s:%d: a record without a label", s->path, line);
  s->n = 0;
  KILN_TRY(kiln_tokenize(text, len, kiln_vocab_level(s->vocab), kiln_vocab_lowercase(s->vocab),
                         take_word, s));
  qsort(s->ids, s->n, sizeof *s->ids, by_id);
  size_t distinct = 0;
  for (size_t i = 0; i < s->n; i++)
    if (i == 0 || s->ids[i] != s->ids[i - 1]) s->ids[distinct++] = s->ids[i];
  const double v = distinct ? 1.0 / sqrt((double)distinct) : 0;
  kiln_strbuf_printf(&s->out, "%d", label);
  for (size_t i = 0; i < distinct; i++) kiln_strbuf_printf(&s->out, " %d:%.6g", s->ids[i] + 1, v);
  kiln_strbuf_printf(&s->out, "\n");
  s->records++;
  s->entries += distinct;
  return KILN_OK;
}

/* dir/SPLIT.svm from text/SPLIT.tsv; its counts added to READY's text. */
static int write_split(const char *text_dir, const char *dir, int split, kiln_vocab *vocab,
                       kiln_strbuf *ready) {
  char in[4300], out[4300];
  snprintf(in, sizeof in, "%s/%s.tsv", text_dir, splits[split]);
  snprintf(out, sizeof out, "%s/%s.svm", dir, splits[split]);
  bow_state s = {.path = in, .vocab = vocab};
  kiln_strbuf_printf(&s.out, "%s", ""); /* an empty split is an empty file */
  int rc = kiln_text_records(in, take_mail, &s);
  if (!rc && s.out.failed) rc = kiln_errorf(KILN_ERR_NOMEM, "%s: out of memory", out);
  if (!rc) rc = kiln_write_file_atomic(out, s.out.s, s.out.len);
  if (!rc)
    kiln_strbuf_printf(ready, "%s.svm %llu records, %llu entries\n", splits[split],
                       (unsigned long long)s.records, (unsigned long long)s.entries);
  free(s.ids);
  free(s.out.s);
  return rc;
}

static int build_locked(const char *cache_dir, const char *from, const char *dir,
                        const char *ready) {
  char text_dir[4200], vpath[4300], vout[4300];
  snprintf(text_dir, sizeof text_dir, "%s/%s", cache_dir, from);
  snprintf(vpath, sizeof vpath, "%s/vocab.txt", text_dir);
  snprintf(vout, sizeof vout, "%s/vocab.txt", dir);
  kiln_vocab *vocab = NULL;
  KILN_TRY(kiln_vocab_read(vpath, &vocab));
  kiln_strbuf r = {0};
  kiln_strbuf_printf(&r,
                     "spam-bow\nsource the cached %s (its splits and vocab.txt)\nSpamAssassin's "
                     "mails as bags of words, ham 0 and spam 1: train.svm, valid.svm, test.svm "
                     "(libsvm; feature i = vocab.txt's id i - 1, binary presence scaled to unit "
                     "length)\ndim %d\n",
                     from, kiln_vocab_size(vocab));
  int rc = KILN_OK;
  for (int k = 0; k < 3 && !rc; k++) rc = write_split(text_dir, dir, k, vocab, &r);
  if (!rc) rc = kiln_vocab_write(vocab, vout);
  kiln_vocab_free(vocab);
  if (!rc && r.failed) rc = kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  if (!rc) rc = kiln_data_entry_seal(cache_dir, "spam-bow");
  if (!rc) rc = kiln_write_file_atomic(ready, r.s, r.len);
  free(r.s);
  return rc;
}

int kiln_data_fetch_spam_bow(const char *cache_dir, bool *already) {
  if (already) *already = false;
  char dir[4096], ready[4200], lock[4200], text_ready[4200];
  if (snprintf(dir, sizeof dir, "%s/spam-bow", cache_dir) >= (int)sizeof dir)
    return kiln_errorf(KILN_ERR_INVALID, "%s: path too long", cache_dir);
  snprintf(ready, sizeof ready, "%s/READY", dir);
  snprintf(lock, sizeof lock, "%s/.lock", dir);
  snprintf(text_ready, sizeof text_ready, "%s/spam-assassin/READY", cache_dir);
  if (access(ready, F_OK) == 0) {
    if (already) *already = true;
    return KILN_OK;
  }
  if (access(text_ready, F_OK) != 0)
    return kiln_errorf(KILN_ERR_INVALID,
                       "spam-bow is built from spam-assassin, which is not in the cache (kiln "
                       "data fetch spam-assassin)");
  KILN_TRY(kiln_mkdir_p(dir));
  int fd = -1;
  KILN_TRY(kiln_data_lock_entry(lock, &fd));
  int rc = KILN_OK;
  if (access(ready, F_OK) == 0) { /* another fetch finished while this one waited */
    if (already) *already = true;
  } else {
    rc = build_locked(cache_dir, "spam-assassin", dir, ready);
  }
  flock(fd, LOCK_UN);
  close(fd);
  return rc;
}
