/* TextData: token ids of a text file through a vocabulary (kiln's own layer; docs/formats.md,
 * "TextData"). Time-major blobs (T x N), as Caffe's recurrent layers take them, with Caffe's
 * sequence-continuation blob `cont` (0 where a sequence starts).
 *
 * WINDOWS (language models): the corpus is one stream of tokens cut into windows of seq_len
 * steps; window w's data are tokens w*T .. w*T+T-1, its label the tokens one step later. Tops:
 * data, label, cont (cont is 0 at step 0: each window is a sequence of its own).
 * SEQUENCES (classification): one record per line of a .tsv file, LABEL<TAB>TEXT. The records
 * are sorted by length once, and cut into buckets of batch_size neighbours, so that a batch
 * pads little: a batch is one bucket, T is its longest sequence (at most seq_len), shorter ones
 * are padded at the end with <pad>. Tops: data, label (N), cont (1 inside a sequence after its
 * first step, 0 at its first step and on padding), mask (1 on the sequence's steps).
 * TAGGED (tagging): one record per line, TAGS<TAB>TEXT with a tag per token; batched exactly as
 * SEQUENCES (the same records, buckets and padding), but label is T x N: each step's tag, and
 * pad_label on padding, which a loss's ignore_label then leaves out.
 *
 * The whole file is tokenized when the net is built (the text data sets are megabytes), so a
 * batch is a gather of ids and needs no prefetch thread. The units of the stream are windows
 * (WINDOWS, batch_size of them per batch) or buckets (SEQUENCES and TAGGED, one per batch):
 * their order, the shuffle from (seed, epoch), the workers' shares and the cursor for exact
 * resume follow the Data layer's rules (data.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/data.h"
#include "kiln/parallel.h"
#include "layer_util.h"

static const Caffe__TextDataParameter text_defaults = CAFFE__TEXT_DATA_PARAMETER__INIT;

/* More unknown tokens than this share means the vocabulary is not the data's. */
#define UNKNOWN_SHARE_MAX 0.5

typedef struct {
  bool windows, tagged, shuffle, truncate, train;
  int batch, T;
  int32_t pad_label;  /* TAGGED: the label of padding steps */
  const char *mode;   /* the mode's name, for messages */
  char source[4096], vocab_path[4096];
  kiln_vocab *vocab;
  /* the tokens: WINDOWS one stream; otherwise record r is tokens[start[r] .. start[r] + len[r]),
   * and in TAGGED mode its tags are tags[start[r] ..] likewise */
  int32_t *tokens, *tags;
  int64_t ntokens, cap, tags_cap;
  int64_t *start;
  int32_t *len, *label;
  int64_t nrecords, rcap;
  int64_t unknown;
  int32_t *sorted; /* SEQUENCES, TAGGED: record ids by length */
  uint64_t units;  /* windows or buckets */
  kiln_batch_stream stream;
  kiln_record_order order;
  int rank, nworkers;
  uint64_t taken_k; /* this worker's batches so far */
  bool started;
} text_state;

/* ---- reading ------------------------------------------------------------------------------- */

typedef struct {
  text_state *s;
  kiln_layer *l;
  int line;
  int64_t record_start;
} reader;

static int push_token(text_state *s, int32_t id) {
  if (s->ntokens == s->cap) {
    int64_t cap = s->cap ? 2 * s->cap : 4096;
    int32_t *t = realloc(s->tokens, sizeof *t * (size_t)cap);
    if (!t) return kiln_errorf(KILN_ERR_NOMEM, "out of memory for the tokens of %s", s->source);
    s->tokens = t;
    s->cap = cap;
  }
  s->tokens[s->ntokens++] = id;
  return KILN_OK;
}

static int take_token(void *user, const char *tok, size_t len) {
  reader *r = user;
  text_state *s = r->s;
  int id = kiln_vocab_id(s->vocab, tok, len);
  if (id < 0) {
    id = kiln_vocab_unk_id(s->vocab);
    if (id < 0)
      return KILN_LAYER_ERROR(r->l, KILN_ERR_DATA,
                              "%s:%d: token '%.*s' is not in the vocabulary %s, which has no %s",
                              s->source, r->line, (int)(len < 40 ? len : 40), tok, s->vocab_path,
                              KILN_VOCAB_UNK);
    s->unknown++;
  }
  return push_token(s, id);
}

/* Tokenizes one record's text onto the end of the stream, from token *first on. */
static int tokenize(reader *r, const char *text, size_t len, int line, int64_t *first) {
  text_state *s = r->s;
  r->line = line;
  *first = s->ntokens;
  return kiln_tokenize(text, len, kiln_vocab_level(s->vocab), kiln_vocab_lowercase(s->vocab),
                       take_token, r);
}

/* The tokens from `first` to the end of the stream as one sequence record with its label
 * (SEQUENCES) or its tags, one per token (TAGGED): refused when empty, cut to seq_len (or
 * refused) when longer. */
static int add_sequence(reader *r, int64_t first, int32_t label, const int32_t *tags,
                        size_t ntags) {
  text_state *s = r->s;
  int64_t n = s->ntokens - first;
  if (n == 0)
    return KILN_LAYER_ERROR(r->l, KILN_ERR_DATA, "%s:%d: a record without tokens", s->source,
                            r->line);
  if (s->tagged && (int64_t)ntags != n)
    return KILN_LAYER_ERROR(r->l, KILN_ERR_DATA,
                            "%s:%d: %zu tags for %lld tokens: a line is TAGS<TAB>TEXT with one tag "
                            "per token of TEXT as %s cuts it (%s level)",
                            s->source, r->line, ntags, (long long)n, s->vocab_path,
                            kiln_vocab_level(s->vocab) == KILN_TOKENS_CHAR ? "char" : "word");
  if (n > s->T) {
    if (!s->truncate)
      return KILN_LAYER_ERROR(r->l, KILN_ERR_DATA,
                              "%s:%d: a sequence of %lld tokens, longer than text_data_param.seq_len "
                              "%d (raise it, or set truncate: true to keep the first %d)",
                              s->source, r->line, (long long)n, s->T, s->T);
    s->ntokens = first + s->T;
    n = s->T;
  }
  if (s->tagged) {
    if (s->tags_cap < s->cap) {
      int32_t *t = realloc(s->tags, sizeof *t * (size_t)s->cap);
      if (!t) return kiln_errorf(KILN_ERR_NOMEM, "out of memory for the tags of %s", s->source);
      s->tags = t;
      s->tags_cap = s->cap;
    }
    memcpy(s->tags + first, tags, sizeof *tags * (size_t)n);
  }
  if (s->nrecords == s->rcap) {
    int64_t cap = s->rcap ? 2 * s->rcap : 1024;
    int64_t *st = realloc(s->start, sizeof *st * (size_t)cap);
    if (st) s->start = st;
    int32_t *ln = realloc(s->len, sizeof *ln * (size_t)cap);
    if (ln) s->len = ln;
    int32_t *lb = realloc(s->label, sizeof *lb * (size_t)cap);
    if (lb) s->label = lb;
    if (!st || !ln || !lb)
      return kiln_errorf(KILN_ERR_NOMEM, "out of memory for the records of %s", s->source);
    s->rcap = cap;
  }
  s->start[s->nrecords] = first;
  s->len[s->nrecords] = (int32_t)n;
  s->label[s->nrecords] = label;
  s->nrecords++;
  return KILN_OK;
}

static int take_record(void *user, const char *text, size_t len, int label, int line) {
  reader *r = user;
  int64_t first;
  KILN_TRY(tokenize(r, text, len, line, &first));
  if (r->s->windows) return KILN_OK;
  if (label < 0)
    return KILN_LAYER_ERROR(r->l, KILN_ERR_DATA,
                            "%s: mode SEQUENCES reads labelled records, a .tsv file of "
                            "LABEL<TAB>TEXT lines",
                            r->s->source);
  return add_sequence(r, first, label, NULL, 0);
}

static int take_tagged(void *user, const char *text, size_t len, const int32_t *tags,
                       size_t ntags, int line) {
  reader *r = user;
  int64_t first;
  KILN_TRY(tokenize(r, text, len, line, &first));
  return add_sequence(r, first, 0, tags, ntags);
}

static const int32_t *sort_len; /* qsort has no user pointer; nets are built on one thread */

static int by_length(const void *a, const void *b) {
  int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
  if (sort_len[x] != sort_len[y]) return sort_len[x] < sort_len[y] ? -1 : 1;
  return x < y ? -1 : x > y;
}

/* ---- the layer ----------------------------------------------------------------------------- */

static int text_setup(kiln_layer *l) {
  const Caffe__TextDataParameter *p = KILN_PARAM_OR(l->lp->text_data_param, text_defaults);
  text_state *s = calloc(1, sizeof *s);
  if (!s) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  l->priv = s;
  s->windows = p->mode == CAFFE__TEXT_DATA_PARAMETER__MODE__WINDOWS;
  s->tagged = p->mode == CAFFE__TEXT_DATA_PARAMETER__MODE__TAGGED;
  s->mode = s->windows ? "WINDOWS" : s->tagged ? "TAGGED" : "SEQUENCES";
  s->pad_label = p->pad_label;
  if (s->windows ? l->ntop > 3 : l->ntop > 4)
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "mode %s has at most %d tops (%s), not %d",
                            s->mode, s->windows ? 3 : 4,
                            s->windows ? "data, label, cont" : "data, label, cont, mask", l->ntop);
  if (!p->source || !p->source[0])
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "text_data_param.source is required");
  if (!p->has_batch_size || p->batch_size == 0 || p->batch_size > 1u << 20)
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID,
                            "text_data_param.batch_size must be set, 1 to %u", 1u << 20);
  if (!p->has_seq_len || p->seq_len == 0 || p->seq_len > 1u << 20)
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID,
                            "text_data_param.seq_len must be set, 1 to %u", 1u << 20);
  s->batch = (int)p->batch_size;
  s->T = (int)p->seq_len;
  if ((int64_t)s->batch * s->T > (int64_t)1 << 30)
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID,
                            "text_data_param.batch_size %d x seq_len %d is more than 2^30 steps",
                            s->batch, s->T);
  s->truncate = p->truncate;
  s->shuffle = p->shuffle;
  s->train = l->phase == CAFFE__PHASE__TRAIN;
  KILN_TRY(kiln_data_source_path(l->config, p->source, s->source, sizeof s->source));
  if (p->vocab && p->vocab[0]) {
    KILN_TRY(kiln_data_source_path(l->config, p->vocab, s->vocab_path, sizeof s->vocab_path));
  } else {
    const char *slash = strrchr(s->source, '/');
    int dir = slash ? (int)(slash - s->source) : 1;
    snprintf(s->vocab_path, sizeof s->vocab_path, "%.*s/vocab.txt", dir, slash ? s->source : ".");
  }
  int rc = kiln_vocab_read(s->vocab_path, &s->vocab);
  if (rc) return kiln_error_context(rc, "layer '%s' (TextData): vocab: ", l->name);
  if (!s->windows && kiln_vocab_pad_id(s->vocab) < 0)
    return KILN_LAYER_ERROR(l, KILN_ERR_DATA,
                            "%s has no %s token, which mode %s pads with", s->vocab_path,
                            KILN_VOCAB_PAD, s->mode);
  reader r = {.s = s, .l = l};
  rc = s->tagged ? kiln_text_tagged_records(s->source, take_tagged, &r)
                 : kiln_text_records(s->source, take_record, &r);
  if (rc) return kiln_error_context(rc, "layer '%s' (TextData): ", l->name);
  if (s->ntokens == 0)
    return KILN_LAYER_ERROR(l, KILN_ERR_DATA, "%s: no tokens (an empty corpus?)", s->source);
  if ((double)s->unknown > UNKNOWN_SHARE_MAX * (double)s->ntokens)
    return KILN_LAYER_ERROR(l, KILN_ERR_DATA,
                            "%lld of the %lld tokens of %s are not in the vocabulary %s: it is not "
                            "this text's vocabulary (kiln convert text makes one)",
                            (long long)s->unknown, (long long)s->ntokens, s->source, s->vocab_path);
  if (s->windows) {
    if (s->ntokens < (int64_t)s->T + 1)
      return KILN_LAYER_ERROR(l, KILN_ERR_DATA,
                              "%s: %lld tokens, fewer than one window of seq_len %d and its next "
                              "token",
                              s->source, (long long)s->ntokens, s->T);
    s->units = (uint64_t)(s->ntokens - 1) / (uint64_t)s->T;
  } else {
    s->sorted = malloc(sizeof *s->sorted * (size_t)s->nrecords);
    if (!s->sorted) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
    for (int64_t i = 0; i < s->nrecords; i++) s->sorted[i] = (int32_t)i;
    sort_len = s->len;
    qsort(s->sorted, (size_t)s->nrecords, sizeof *s->sorted, by_length);
    s->units = (uint64_t)((s->nrecords + s->batch - 1) / s->batch);
  }
  if (s->shuffle && s->units > UINT32_MAX)
    return KILN_LAYER_ERROR(l, KILN_ERR_UNSUPPORTED, "shuffle of more than 2^32 %s",
                            s->windows ? "windows" : "buckets");
  s->stream = (kiln_batch_stream){.base = 0, .size = s->units,
                                  .batch = s->windows ? s->batch : 1,
                                  .last_batch = KILN_LAST_BATCH_WRAP};
  s->order = (kiln_record_order){.seed = l->seed, .size = s->units, .shuffle = s->shuffle};
  s->nworkers = 1;
  return KILN_OK;
}

/* Every top T x N but SEQUENCES' label, one per sequence (N). */
static int shape_tops(kiln_layer *l, int T, int N) {
  text_state *s = l->priv;
  int64_t tn[2] = {T, N}, n[1] = {N};
  for (int t = 0; t < l->ntop; t++) {
    bool per_sequence = !s->windows && !s->tagged && t == 1;
    KILN_TRY(kiln_blob_reshape(l->top[t], per_sequence ? 1 : 2, per_sequence ? n : tn));
  }
  return KILN_OK;
}

static int text_reshape(kiln_layer *l) {
  text_state *s = l->priv;
  return shape_tops(l, s->T, s->batch);
}

/* The share is fixed from the first batch on; TEST nets (rank 0's test passes) read it all. */
static int start(kiln_layer *l, text_state *s) {
  s->rank = 0;
  s->nworkers = 1;
  if (s->train && l->shard_count > 1) {
    if (l->shard_rank < 0 || l->shard_rank >= l->shard_count)
      return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "worker rank %d of %d", l->shard_rank,
                              l->shard_count);
    s->rank = l->shard_rank;
    s->nworkers = l->shard_count;
  }
  s->started = true;
  return KILN_OK;
}

static void set(kiln_blob *b, int64_t i, float v) {
  if (b) b->data[i] = v;
}

static int text_forward(kiln_layer *l) {
  text_state *s = l->priv;
  if (!s->started) KILN_TRY(start(l, s));
  uint64_t global = s->taken_k * (uint64_t)s->nworkers + (uint64_t)s->rank;
  int count = 0;
  uint64_t first = kiln_batch_stream_start(&s->stream, global, &count);
  kiln_blob *data = l->top[0], *label = l->ntop > 1 ? l->top[1] : NULL;
  kiln_blob *cont = l->ntop > 2 ? l->top[2] : NULL, *mask = l->ntop > 3 ? l->top[3] : NULL;
  if (s->windows) {
    int N = s->batch, T = s->T;
    for (int n = 0; n < N; n++) {
      uint64_t w = 0;
      KILN_TRY(kiln_record_order_index(&s->order, first + (uint64_t)n, &w));
      const int32_t *tok = s->tokens + (int64_t)w * T;
      for (int t = 0; t < T; t++) {
        int64_t i = (int64_t)t * N + n;
        data->data[i] = (float)tok[t];
        set(label, i, (float)tok[t + 1]);
        set(cont, i, t ? 1.0f : 0.0f);
      }
    }
  } else {
    uint64_t b = 0;
    KILN_TRY(kiln_record_order_index(&s->order, first, &b));
    int64_t lo = (int64_t)b * s->batch, hi = lo + s->batch;
    if (hi > s->nrecords) hi = s->nrecords;
    int N = (int)(hi - lo), T = 0;
    for (int64_t k = lo; k < hi; k++)
      if (s->len[s->sorted[k]] > T) T = s->len[s->sorted[k]];
    if (data->shape[0] != T || data->shape[1] != N) {
      KILN_TRY(shape_tops(l, T, N));
      l->reshaped = true;
    }
    float pad = (float)kiln_vocab_pad_id(s->vocab);
    for (int n = 0; n < N; n++) {
      int32_t r = s->sorted[lo + n];
      const int32_t *tok = s->tokens + s->start[r];
      const int32_t *tag = s->tagged ? s->tags + s->start[r] : NULL;
      if (!tag) set(label, n, (float)s->label[r]);
      for (int t = 0; t < T; t++) {
        int64_t i = (int64_t)t * N + n;
        bool in = t < s->len[r];
        data->data[i] = in ? (float)tok[t] : pad;
        if (tag) set(label, i, (float)(in ? tag[t] : s->pad_label));
        set(cont, i, in && t > 0 ? 1.0f : 0.0f);
        set(mask, i, in ? 1.0f : 0.0f);
      }
    }
  }
  s->taken_k++;
  return KILN_OK;
}

/* Where the global stream stands once every worker has read as many batches as this one. */
static uint64_t text_get_cursor(kiln_layer *l) {
  text_state *s = l->priv;
  if (s->taken_k == 0) return s->stream.base;
  return kiln_batch_stream_end(&s->stream, s->taken_k * (uint64_t)(s->nworkers ? s->nworkers : 1) - 1);
}

static int text_set_cursor(kiln_layer *l, uint64_t cursor) {
  text_state *s = l->priv;
  s->stream.base = cursor;
  s->taken_k = 0;
  return KILN_OK;
}

/* The source and the vocabulary, whole: workers on several hosts must read the same text. */
static int text_fingerprint(kiln_layer *l, uint8_t digest[32], char *what, size_t n) {
  text_state *s = l->priv;
  char a[65], b[65];
  int rc = kiln_sha256_file(s->source, a);
  if (!rc) rc = kiln_sha256_file(s->vocab_path, b);
  if (rc) return kiln_error_context(rc, "layer '%s' (TextData): ", l->name);
  kiln_sha256_ctx h;
  kiln_sha256_init(&h);
  kiln_sha256_update(&h, a, 64);
  kiln_sha256_update(&h, b, 64);
  kiln_sha256_final(&h, digest);
  snprintf(what, n, "%s and its vocabulary %s (compared whole)", s->source, s->vocab_path);
  return KILN_OK;
}

static void text_destroy(kiln_layer *l) {
  text_state *s = l->priv;
  if (!s) return;
  kiln_vocab_free(s->vocab);
  free(s->tokens);
  free(s->tags);
  free(s->start);
  free(s->len);
  free(s->label);
  free(s->sorted);
  kiln_record_order_free(&s->order);
  free(s);
}

const kiln_layer_ops kiln_layer_text_data = {
    .type = "TextData", .min_bottoms = 0, .max_bottoms = 0, .min_tops = 1, .max_tops = 4,
    .is_data = true, .setup = text_setup, .reshape = text_reshape, .forward = text_forward,
    .destroy = text_destroy, .get_cursor = text_get_cursor, .set_cursor = text_set_cursor,
    .fingerprint = text_fingerprint,
};
