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
 * PAIRS (sequence to sequence): one record per line, SOURCE<TAB>TARGET, each side through its own
 * vocabulary; batched as SEQUENCES by the source's length. Tops: source, source_mask, source_cont
 * (S x N, as SEQUENCES' data, mask and cont), target_in (<s> then the target's tokens),
 * target_out (the target's tokens then </s>, pad_label on padding) and target_cont (T x N): the
 * decoder reads target_in and learns target_out, one step ahead, as a language model does.
 *
 * The whole file is tokenized when the net is built (the text data sets are megabytes), so a
 * batch is a gather of ids and needs no prefetch thread. The units of the stream are windows
 * (WINDOWS, batch_size of them per batch) or buckets (SEQUENCES, TAGGED and PAIRS, one a batch):
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

/* One side of the records (the text; in PAIRS the source or the target): its vocabulary and
 * the token ids read through it. WINDOWS: one stream; otherwise record r's tokens are
 * id[start[r] .. start[r] + len[r]). */
typedef struct {
  const char *what;   /* "source", "target": in messages about PAIRS; NULL otherwise */
  char vocab_path[4096];
  kiln_vocab *vocab;
  int32_t *id;
  int64_t n, cap;
  int64_t *start;
  int32_t *len;
  int64_t unknown;
} side;

typedef struct {
  bool windows, tagged, pairs, shuffle, truncate;
  int batch, T;
  int target_len;     /* PAIRS: the most target steps */
  int32_t pad_label;  /* TAGGED, PAIRS: the label of padding steps */
  int32_t bos, eos;   /* PAIRS: <s> and </s> in the target's vocabulary */
  const char *mode;   /* the mode's name, for messages */
  char source[4096];
  side text, target;  /* target: PAIRS only */
  /* TAGGED: record r's tags are tags[text.start[r] ..], one per token */
  int32_t *tags;
  int64_t tags_cap;
  int32_t *label;
  int64_t nrecords, rcap;
  int32_t *sorted; /* SEQUENCES, TAGGED, PAIRS: record ids by (source) length */
  uint64_t units;  /* windows or buckets */
  kiln_batch_share share;
  kiln_record_order order;
  kiln_stage stage; /* tops on a device are filled here, then handed over */
} text_state;

/* ---- reading ------------------------------------------------------------------------------- */

typedef struct {
  text_state *s;
  kiln_layer *l;
  side *side; /* the one being tokenized */
  int line;
} reader;

static int push_token(text_state *s, side *d, int32_t id) {
  if (d->n == d->cap) {
    int64_t cap = d->cap ? 2 * d->cap : 4096;
    int32_t *t = realloc(d->id, sizeof *t * (size_t)cap);
    if (!t) return kiln_errorf(KILN_ERR_NOMEM, "out of memory for the tokens of %s", s->source);
    d->id = t;
    d->cap = cap;
  }
  d->id[d->n++] = id;
  return KILN_OK;
}

static int take_token(void *user, const char *tok, size_t len) {
  reader *r = user;
  side *d = r->side;
  int id = kiln_vocab_id(d->vocab, tok, len);
  if (id < 0) {
    id = kiln_vocab_unk_id(d->vocab);
    if (id < 0)
      return KILN_LAYER_ERROR(r->l, KILN_ERR_DATA,
                              "%s:%d: token '%.*s' is not in the vocabulary %s, which has no %s",
                              r->s->source, r->line, (int)(len < 40 ? len : 40), tok,
                              d->vocab_path, KILN_VOCAB_UNK);
    d->unknown++;
  }
  return push_token(r->s, d, id);
}

/* Tokenizes one record's text onto the end of side d's stream, from token *first on. */
static int tokenize(reader *r, side *d, const char *text, size_t len, int line, int64_t *first) {
  r->side = d;
  r->line = line;
  *first = d->n;
  return kiln_tokenize(text, len, kiln_vocab_level(d->vocab), kiln_vocab_lowercase(d->vocab),
                       take_token, r);
}

/* The tokens of side d from `first` to the end of its stream, as record `rec`'s: refused when
 * empty (a source or a text; a target may be empty, and is then one step: </s>), and when its
 * steps (its tokens and `extra` more: a target's </s>) are more than `limit`, refused or cut to
 * `limit` tokens. */
static int take_sequence(reader *r, side *d, int64_t first, int64_t rec, int limit, int extra,
                         const char *limit_name) {
  text_state *s = r->s;
  int64_t n = d->n - first;
  if (n == 0 && d != &s->target)
    return KILN_LAYER_ERROR(r->l, KILN_ERR_DATA, "%s:%d: a record without %stokens", s->source,
                            r->line, d->what ? "source " : "");
  if (n + extra > limit) {
    if (!s->truncate)
      return KILN_LAYER_ERROR(r->l, KILN_ERR_DATA,
                              "%s:%d: a %s of %lld tokens%s, longer than text_data_param.%s %d "
                              "(raise it, or set truncate: true to keep the first %d steps)",
                              s->source, r->line, d->what ? d->what : "sequence", (long long)n,
                              extra ? " and </s>" : "", limit_name, limit, limit);
    /* a cut target keeps `limit` tokens: its last step is a token, not </s>, since it did not
     * end there */
    n = limit;
    d->n = first + n;
  }
  d->start[rec] = first;
  d->len[rec] = (int32_t)n;
  return KILN_OK;
}

/* Room for one more record in every per-record array. */
static int grow_records(text_state *s) {
  if (s->nrecords < s->rcap) return KILN_OK;
  int64_t cap = s->rcap ? 2 * s->rcap : 1024;
  side *sides[2] = {&s->text, &s->target};
  bool ok = true;
  for (int k = 0; k < (s->pairs ? 2 : 1); k++) {
    int64_t *st = realloc(sides[k]->start, sizeof *st * (size_t)cap);
    if (st) sides[k]->start = st;
    int32_t *ln = realloc(sides[k]->len, sizeof *ln * (size_t)cap);
    if (ln) sides[k]->len = ln;
    ok &= st && ln;
  }
  int32_t *lb = realloc(s->label, sizeof *lb * (size_t)cap);
  if (lb) s->label = lb;
  if (!ok || !lb) return kiln_errorf(KILN_ERR_NOMEM, "out of memory for the records of %s", s->source);
  s->rcap = cap;
  return KILN_OK;
}

/* The text's tokens from `first` on as a sequence record with its label (SEQUENCES) or its tags,
 * one per token (TAGGED). */
static int add_sequence(reader *r, int64_t first, int32_t label, const int32_t *tags,
                        size_t ntags) {
  text_state *s = r->s;
  int64_t n = s->text.n - first;
  if (s->tagged && n > 0 && (int64_t)ntags != n)
    return KILN_LAYER_ERROR(r->l, KILN_ERR_DATA,
                            "%s:%d: %zu tags for %lld tokens: a line is TAGS<TAB>TEXT with one tag "
                            "per token of TEXT as %s cuts it (%s level)",
                            s->source, r->line, ntags, (long long)n, s->text.vocab_path,
                            kiln_vocab_level(s->text.vocab) == KILN_TOKENS_CHAR ? "char" : "word");
  KILN_TRY(grow_records(s));
  KILN_TRY(take_sequence(r, &s->text, first, s->nrecords, s->T, 0, "seq_len"));
  n = s->text.len[s->nrecords];
  if (s->tagged) {
    if (s->tags_cap < s->text.cap) {
      int32_t *t = realloc(s->tags, sizeof *t * (size_t)s->text.cap);
      if (!t) return kiln_errorf(KILN_ERR_NOMEM, "out of memory for the tags of %s", s->source);
      s->tags = t;
      s->tags_cap = s->text.cap;
    }
    memcpy(s->tags + first, tags, sizeof *tags * (size_t)n);
  }
  s->label[s->nrecords++] = label;
  return KILN_OK;
}

static int take_record(void *user, const char *text, size_t len, int label, int line) {
  reader *r = user;
  int64_t first;
  KILN_TRY(tokenize(r, &r->s->text, text, len, line, &first));
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
  KILN_TRY(tokenize(r, &r->s->text, text, len, line, &first));
  return add_sequence(r, first, 0, tags, ntags);
}

static int take_pair(void *user, const char *source, size_t slen, const char *target,
                     size_t tlen, int line) {
  reader *r = user;
  text_state *s = r->s;
  int64_t sfirst, tfirst;
  KILN_TRY(tokenize(r, &s->text, source, slen, line, &sfirst));
  KILN_TRY(tokenize(r, &s->target, target, tlen, line, &tfirst));
  KILN_TRY(grow_records(s));
  KILN_TRY(take_sequence(r, &s->text, sfirst, s->nrecords, s->T, 0, "seq_len"));
  KILN_TRY(take_sequence(r, &s->target, tfirst, s->nrecords, s->target_len, 1, "target_len"));
  s->label[s->nrecords++] = 0;
  return KILN_OK;
}

static const int32_t *sort_len; /* qsort has no user pointer; nets are built on one thread */

static int by_length(const void *a, const void *b) {
  int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
  if (sort_len[x] != sort_len[y]) return sort_len[x] < sort_len[y] ? -1 : 1;
  return x < y ? -1 : x > y;
}

/* ---- the layer ----------------------------------------------------------------------------- */

/* The vocabulary at `given` (resolved as sources are), or `name` beside the source; a mode that
 * pads needs its <pad>. */
static int read_vocab(kiln_layer *l, text_state *s, side *d, const char *given, const char *name,
                      const char *field) {
  KILN_TRY(kiln_data_vocab_path(l->config, given, s->source, name, d->vocab_path,
                                sizeof d->vocab_path));
  int rc = kiln_vocab_read(d->vocab_path, &d->vocab);
  if (rc) return kiln_error_context(rc, "layer '%s' (TextData): %s: ", l->name, field);
  if (!s->windows && kiln_vocab_pad_id(d->vocab) < 0)
    return KILN_LAYER_ERROR(l, KILN_ERR_DATA, "%s has no %s token, which mode %s pads with",
                            d->vocab_path, KILN_VOCAB_PAD, s->mode);
  return KILN_OK;
}

/* A count that must be given, 1 to 2^20 (steps, the batch): unset and out of range are told
 * apart, the value named. */
static int count_param(kiln_layer *l, bool has, uint32_t v, const char *name, int *out) {
  if (!has)
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "text_data_param.%s must be set, 1 to %u", name,
                            1u << 20);
  if (v == 0 || v > 1u << 20)
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "text_data_param.%s %u is out of range: 1 to %u",
                            name, v, 1u << 20);
  *out = (int)v;
  return KILN_OK;
}

/* The target vocabulary's <s> and </s>, without which a target cannot start or end. */
static int target_marks(kiln_layer *l, text_state *s) {
  const char *mark[2] = {KILN_VOCAB_BOS, KILN_VOCAB_EOS};
  int32_t *id[2] = {&s->bos, &s->eos};
  for (int k = 0; k < 2; k++) {
    *id[k] = kiln_vocab_id(s->target.vocab, mark[k], strlen(mark[k]));
    if (*id[k] < 0)
      return KILN_LAYER_ERROR(l, KILN_ERR_DATA,
                              "the target vocabulary %s has no %s token: mode PAIRS starts every "
                              "target_in with %s and ends every target_out with %s (kiln convert "
                              "text --pairs target adds both)",
                              s->target.vocab_path, mark[k], KILN_VOCAB_BOS, KILN_VOCAB_EOS);
  }
  return KILN_OK;
}

/* More unknown tokens than UNKNOWN_SHARE_MAX of a side's: not its vocabulary. */
static int check_unknown(kiln_layer *l, const text_state *s, const side *d) {
  if ((double)d->unknown <= UNKNOWN_SHARE_MAX * (double)d->n) return KILN_OK;
  return KILN_LAYER_ERROR(l, KILN_ERR_DATA,
                          "%lld of the %lld %s%stokens of %s are not in the vocabulary %s: it is "
                          "not this text's vocabulary (kiln convert text makes one)",
                          (long long)d->unknown, (long long)d->n, d->what ? d->what : "",
                          d->what ? " " : "", s->source, d->vocab_path);
}

static int text_setup(kiln_layer *l) {
  const Caffe__TextDataParameter *p = KILN_PARAM_OR(l->lp->text_data_param, text_defaults);
  text_state *s = calloc(1, sizeof *s);
  if (!s) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  l->priv = s;
  s->windows = p->mode == CAFFE__TEXT_DATA_PARAMETER__MODE__WINDOWS;
  s->tagged = p->mode == CAFFE__TEXT_DATA_PARAMETER__MODE__TAGGED;
  s->pairs = p->mode == CAFFE__TEXT_DATA_PARAMETER__MODE__PAIRS;
  s->mode = s->windows ? "WINDOWS" : s->tagged ? "TAGGED" : s->pairs ? "PAIRS" : "SEQUENCES";
  s->pad_label = p->pad_label;
  static const char *const tops[] = {"data, label, cont", "data, label, cont, mask",
                                     "source, source_mask, source_cont, target_in, target_out, "
                                     "target_cont"};
  int most = s->windows ? 3 : s->pairs ? 6 : 4;
  if (l->ntop > most)
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "mode %s has at most %d tops (%s), not %d",
                            s->mode, most, tops[s->windows ? 0 : s->pairs ? 2 : 1], l->ntop);
  if (!p->source || !p->source[0])
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "text_data_param.source is required");
  KILN_TRY(count_param(l, p->has_batch_size, p->batch_size, "batch_size", &s->batch));
  KILN_TRY(count_param(l, p->has_seq_len, p->seq_len, "seq_len", &s->T));
  if (s->pairs) KILN_TRY(count_param(l, p->has_target_len, p->target_len, "target_len",
                                     &s->target_len));
  int longest = s->T > s->target_len ? s->T : s->target_len;
  if ((int64_t)s->batch * longest > (int64_t)1 << 30)
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID,
                            "text_data_param.batch_size %d x %s %d is more than 2^30 steps",
                            s->batch, s->T >= s->target_len ? "seq_len" : "target_len", longest);
  s->truncate = p->truncate;
  s->shuffle = p->shuffle;
  KILN_TRY(kiln_data_source_path(l->config, p->source, s->source, sizeof s->source));
  if (s->pairs) {
    s->text.what = "source";
    s->target.what = "target";
  }
  KILN_TRY(read_vocab(l, s, &s->text, p->vocab, "vocab.txt", "vocab"));
  if (s->pairs) {
    KILN_TRY(read_vocab(l, s, &s->target, p->target_vocab, "target_vocab.txt", "target_vocab"));
    KILN_TRY(target_marks(l, s));
  }
  reader r = {.s = s, .l = l};
  int rc = s->pairs    ? kiln_text_pairs(s->source, take_pair, &r)
           : s->tagged ? kiln_text_tagged_records(s->source, take_tagged, &r)
                       : kiln_text_records(s->source, take_record, &r);
  if (rc) return kiln_error_context(rc, "layer '%s' (TextData): ", l->name);
  if (s->text.n == 0)
    return KILN_LAYER_ERROR(l, KILN_ERR_DATA, "%s: no tokens (an empty corpus?)", s->source);
  KILN_TRY(check_unknown(l, s, &s->text));
  if (s->pairs) KILN_TRY(check_unknown(l, s, &s->target));
  if (s->windows) {
    if (s->text.n < (int64_t)s->T + 1)
      return KILN_LAYER_ERROR(l, KILN_ERR_DATA,
                              "%s: %lld tokens, fewer than one window of seq_len %d and its next "
                              "token",
                              s->source, (long long)s->text.n, s->T);
    s->units = (uint64_t)(s->text.n - 1) / (uint64_t)s->T;
  } else {
    s->sorted = malloc(sizeof *s->sorted * (size_t)s->nrecords);
    if (!s->sorted) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
    for (int64_t i = 0; i < s->nrecords; i++) s->sorted[i] = (int32_t)i;
    sort_len = s->text.len;
    qsort(s->sorted, (size_t)s->nrecords, sizeof *s->sorted, by_length);
    s->units = (uint64_t)((s->nrecords + s->batch - 1) / s->batch);
  }
  if (s->shuffle && s->units > UINT32_MAX)
    return KILN_LAYER_ERROR(l, KILN_ERR_UNSUPPORTED, "shuffle of more than 2^32 %s",
                            s->windows ? "windows" : "buckets");
  s->share.stream = (kiln_batch_stream){.base = 0, .size = s->units,
                                  .batch = s->windows ? s->batch : 1,
                                  .last_batch = KILN_LAST_BATCH_WRAP};
  s->order = (kiln_record_order){.seed = l->seed, .size = s->units, .shuffle = s->shuffle};
  return KILN_OK;
}

/* Every top T x N but SEQUENCES' label, one per sequence (N); in PAIRS the source's three S x N
 * and the target's three T x N. */
static int shape_tops(kiln_layer *l, int S, int T, int N) {
  text_state *s = l->priv;
  int64_t sn[2] = {S, N}, tn[2] = {T, N}, n[1] = {N};
  for (int t = 0; t < l->ntop; t++) {
    bool per_sequence = !s->windows && !s->tagged && !s->pairs && t == 1;
    bool target = s->pairs && t >= 3;
    KILN_TRY(kiln_blob_reshape(l->top[t], per_sequence ? 1 : 2,
                               per_sequence ? n : target ? tn : sn));
  }
  return KILN_OK;
}

static int text_reshape(kiln_layer *l) {
  text_state *s = l->priv;
  return shape_tops(l, s->T, s->target_len, s->batch);
}

static void set(kiln_blob *b, int64_t i, float v) {
  if (b) b->data[i] = v;
}

static kiln_blob *top(kiln_layer *l, int t) { return t < l->ntop ? l->top[t] : NULL; }

/* A target's steps: its tokens and </s>, or `target_len` tokens when it was cut. */
static int target_steps(const text_state *s, int32_t r) {
  int n = s->target.len[r] + 1;
  return n < s->target_len ? n : s->target_len;
}

/* Records sorted[lo .. lo + N), N of them, as one batch of S source steps (data) and T target
 * steps: the ids, and 1 where a step is in its sequence (mask), and where it goes on from the
 * step before (cont), padding elsewhere. */
static void fill_bucket(kiln_layer *l, int64_t lo, int N, int S, int T) {
  text_state *s = l->priv;
  kiln_blob *data = l->top[0];
  kiln_blob *label = s->pairs ? NULL : top(l, 1), *cont = top(l, 2);
  kiln_blob *mask = top(l, s->pairs ? 1 : 3);
  float pad = (float)kiln_vocab_pad_id(s->text.vocab);
  for (int n = 0; n < N; n++) {
    int32_t r = s->sorted[lo + n];
    const int32_t *tok = s->text.id + s->text.start[r];
    const int32_t *tag = s->tagged ? s->tags + s->text.start[r] : NULL;
    if (label && !tag) set(label, n, (float)s->label[r]);
    for (int t = 0; t < S; t++) {
      int64_t i = (int64_t)t * N + n;
      bool in = t < s->text.len[r];
      data->data[i] = in ? (float)tok[t] : pad;
      if (tag) set(label, i, (float)(in ? tag[t] : s->pad_label));
      set(cont, i, in && t > 0 ? 1.0f : 0.0f);
      set(mask, i, in ? 1.0f : 0.0f);
    }
  }
  if (!s->pairs) return;
  kiln_blob *in_ = top(l, 3), *out = top(l, 4), *tcont = top(l, 5);
  float tpad = (float)kiln_vocab_pad_id(s->target.vocab);
  for (int n = 0; n < N; n++) {
    int32_t r = s->sorted[lo + n];
    const int32_t *tok = s->target.id + s->target.start[r];
    int len = s->target.len[r], steps = target_steps(s, r);
    for (int t = 0; t < T; t++) {
      int64_t i = (int64_t)t * N + n;
      bool in = t < steps;
      set(in_, i, !in ? tpad : t == 0 ? (float)s->bos : (float)tok[t - 1]);
      set(out, i, !in ? (float)s->pad_label : t < len ? (float)tok[t] : (float)s->eos);
      set(tcont, i, in && t > 0 ? 1.0f : 0.0f);
    }
  }
}

static int text_fill(kiln_layer *l) {
  text_state *s = l->priv;
  int count = 0;
  uint64_t first = 0;
  KILN_TRY(kiln_batch_share_next(l, &s->share, &first, &count));
  if (s->windows) {
    KILN_TRY(kiln_stage_begin(l, &s->stage));
    kiln_blob *data = l->top[0], *label = top(l, 1), *cont = top(l, 2);
    int N = s->batch, T = s->T;
    for (int n = 0; n < N; n++) {
      uint64_t w = 0;
      KILN_TRY(kiln_record_order_index(&s->order, first + (uint64_t)n, &w));
      const int32_t *tok = s->text.id + (int64_t)w * T;
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
    int N = (int)(hi - lo), S = 0, T = 0;
    for (int64_t k = lo; k < hi; k++) {
      int32_t r = s->sorted[k];
      if (s->text.len[r] > S) S = s->text.len[r];
      if (s->pairs && target_steps(s, r) > T) T = target_steps(s, r);
    }
    kiln_blob *tt = top(l, 3);
    if (l->top[0]->shape[0] != S || l->top[0]->shape[1] != N ||
        (s->pairs && tt && tt->shape[0] != T)) {
      KILN_TRY(shape_tops(l, S, T, N));
      l->reshaped = true;
    }
    KILN_TRY(kiln_stage_begin(l, &s->stage)); /* after the reshape: it may move the tops */
    fill_bucket(l, lo, N, S, T);
  }
  return KILN_OK;
}

static int text_forward(kiln_layer *l) {
  text_state *s = l->priv;
  int rc = text_fill(l);
  int rc2 = kiln_stage_end(l, &s->stage);
  return rc ? rc : rc2;
}

static uint64_t text_get_cursor(kiln_layer *l) {
  text_state *s = l->priv;
  return kiln_batch_share_cursor(&s->share);
}

static int text_set_cursor(kiln_layer *l, uint64_t cursor) {
  text_state *s = l->priv;
  kiln_batch_share_set_cursor(&s->share, cursor);
  return KILN_OK;
}

/* The source and the vocabularies, whole: workers on several hosts must read the same text. */
static int text_fingerprint(kiln_layer *l, uint8_t digest[32], char *what, size_t n) {
  text_state *s = l->priv;
  const char *files[3] = {s->source, s->text.vocab_path, s->target.vocab_path};
  int nfiles = s->pairs ? 3 : 2;
  kiln_sha256_ctx h;
  kiln_sha256_init(&h);
  for (int f = 0; f < nfiles; f++) {
    char hex[65];
    int rc = kiln_sha256_file(files[f], hex);
    if (rc) return kiln_error_context(rc, "layer '%s' (TextData): ", l->name);
    kiln_sha256_update(&h, hex, 64);
  }
  kiln_sha256_final(&h, digest);
  if (s->pairs)
    snprintf(what, n, "%s and its vocabularies %s and %s (compared whole)", s->source,
             s->text.vocab_path, s->target.vocab_path);
  else
    snprintf(what, n, "%s and its vocabulary %s (compared whole)", s->source, s->text.vocab_path);
  return KILN_OK;
}

static void free_side(side *d) {
  kiln_vocab_free(d->vocab);
  free(d->id);
  free(d->start);
  free(d->len);
}

static void text_destroy(kiln_layer *l) {
  text_state *s = l->priv;
  if (!s) return;
  free_side(&s->text);
  free_side(&s->target);
  free(s->tags);
  free(s->label);
  free(s->sorted);
  kiln_record_order_free(&s->order);
  kiln_stage_free(&s->stage);
  free(s);
}

const kiln_layer_ops kiln_layer_text_data = {
    .type = "TextData", .min_bottoms = 0, .max_bottoms = 0, .min_tops = 1, .max_tops = 6,
    .is_data = true, .setup = text_setup, .reshape = text_reshape, .forward = text_forward,
    .destroy = text_destroy, .get_cursor = text_get_cursor, .set_cursor = text_set_cursor,
    .fingerprint = text_fingerprint, .kernels = KILN_NO_KERNELS,
};
