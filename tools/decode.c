/* kiln decode: an encoder-decoder model's outputs for the sources of a .tsv of pairs, judged
 * against their targets: the token error rate (the phoneme error rate of a G2P model: the total
 * edit distance over the total reference length) and the share decoded exactly right (word
 * accuracy). The decoding itself, greedy or beam search, is the library's (src/net/seq2seq.c);
 * this reads the records, prints and writes (with --metrics, the figures as one "decode" event,
 * which `kiln ce` reads). */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/data.h"
#include "tool.h"

typedef struct {
  tool_common c;
  tool_decode_args d;
} decode_args;

/* A whole number in lo..hi for option o, or a message naming the range and false. */
static bool whole_option(const char *o, const char *v, int lo, int hi, int *out) {
  return tool_int_option_int("decode", o, v, lo, hi, out);
}

static void usage(FILE *f) {
  fprintf(f,
          "usage: kiln decode --model DEPLOY.prototxt --weights W.caffemodel --vocab SRC.txt\n"
          "                   --target-vocab TGT.txt --input PAIRS.tsv [options]\n"
          "\n"
          "Decodes the source of each SOURCE<TAB>TARGET pair with an encoder-decoder net (greedy,\n"
          "or beam search) and prints the token error rate against the targets (a G2P model's\n"
          "phoneme error rate) and the share decoded exactly right (word accuracy). A file\n"
          "written $KILN_DATA/... is read from the data set cache.\n"
          "\n"
          "options:\n"
          "  --model FILE           the deploy net (required)\n"
          "  --weights FILE         its trained .caffemodel (required)\n"
          "  --vocab FILE           the source vocabulary (required)\n"
          "  --target-vocab FILE    the target vocabulary, with <s> and </s> (required)\n"
          "  --input FILE           the .tsv of pairs to decode (required)\n"
          "  --beam K               beam search of width K (default: greedy)\n"
          "  --max-len L            the longest output, in tokens (default 50)\n"
          "  --limit N              only the first N pairs\n"
          "  --output FILE          write each source and its decoded output, a .tsv of pairs\n");
  tool_common_usage(f, "decode: per, word_accuracy, words");
  tool_help_usage(f);
}

static int parse_decode_args(int argc, char **argv, decode_args *a) {
  static const char *const names[] = {"--model", "--weights", "--vocab", "--target-vocab",
                                      "--input", "--output", "--beam", "--max-len",
                                      "--limit", NULL};
  memset(a, 0, sizeof *a);
  a->d.max_len = 50;
  for (int i = 1; i < argc; i++) {
    const char *o, *v;
    int r = tool_option_value("decode", names, usage, &a->c, argc, argv, &i, &o, &v);
    if (r < 0) return 2;
    if (r == 0) continue;
    if (!strcmp(o, "--model")) a->d.model = v;
    else if (!strcmp(o, "--weights")) a->d.weights = v;
    else if (!strcmp(o, "--vocab")) a->d.vocab = v;
    else if (!strcmp(o, "--target-vocab")) a->d.target_vocab = v;
    else if (!strcmp(o, "--input")) a->d.input = v;
    else if (!strcmp(o, "--output")) a->d.output = v;
    else if (!strcmp(o, "--beam")) {
      if (!whole_option(o, v, 1, TOOL_MAX_BEAM, &a->d.beam)) return 2;
    } else if (!strcmp(o, "--max-len")) {
      if (!whole_option(o, v, 1, TOOL_MAX_DECODE_LEN, &a->d.max_len)) return 2;
    } else if (!strcmp(o, "--limit")) {
      if (!whole_option(o, v, 1, INT_MAX, &a->d.limit)) return 2;
    } else {
      fprintf(stderr, "kiln decode: unknown option '%s' (see kiln decode --help)\n", o);
      return 2;
    }
  }
  if (!a->d.model || !a->d.weights || !a->d.vocab || !a->d.target_vocab || !a->d.input) {
    fprintf(stderr, "kiln decode: --model, --weights, --vocab, --target-vocab and --input are "
                    "required\n");
    return 2;
  }
  return 0;
}

/* The records: each source's ids (through the source vocabulary, <unk> for what it lacks) and
 * each reference's (through the target vocabulary, -1 for what it lacks: a token the model
 * cannot produce, so never a match), and the source texts for --output. */
typedef struct {
  const kiln_vocab *sv, *tv;
  const char *path;
  int line, limit;
  int32_t *ids;
  size_t nids, cap;
  size_t *src, *ref; /* record r: source ids[src[r] .. ref[r]), reference ids[ref[r] .. src[r+1]) */
  char **text;
  int n, rcap, longest;
  const kiln_vocab *v; /* the side being read: sv (unknown tokens to <unk>) or tv */
} records;

static int push_id(records *rs, int32_t id) {
  if (rs->nids == rs->cap) {
    size_t cap = rs->cap ? 2 * rs->cap : 4096;
    int32_t *ids = realloc(rs->ids, cap * sizeof *ids);
    if (!ids) return kiln_errorf(KILN_ERR_NOMEM, "out of memory for the records of %s", rs->path);
    rs->ids = ids;
    rs->cap = cap;
  }
  rs->ids[rs->nids++] = id;
  return KILN_OK;
}

static int take_id(void *user, const char *tok, size_t len) {
  records *rs = user;
  int id = kiln_vocab_id(rs->v, tok, len);
  if (id < 0 && rs->v == rs->sv) {
    id = kiln_vocab_unk_id(rs->v);
    if (id < 0)
      return kiln_errorf(KILN_ERR_DATA, "%s:%d: source token '%.*s' is not in the vocabulary, "
                         "which has no %s", rs->path, rs->line, (int)(len < 40 ? len : 40), tok,
                         KILN_VOCAB_UNK);
  }
  return push_id(rs, id);
}

static int take_record(void *user, const char *source, size_t slen, const char *target,
                       size_t tlen, int line) {
  records *rs = user;
  if (rs->limit && rs->n == rs->limit) return KILN_OK;
  if (rs->n + 1 >= rs->rcap) {
    int cap = rs->rcap ? 2 * rs->rcap : 1024;
    size_t *src = realloc(rs->src, (size_t)cap * sizeof *src);
    if (src) rs->src = src;
    size_t *ref = realloc(rs->ref, (size_t)cap * sizeof *ref);
    if (ref) rs->ref = ref;
    char **text = realloc(rs->text, (size_t)cap * sizeof *text);
    if (text) rs->text = text;
    if (!src || !ref || !text) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
    rs->rcap = cap;
  }
  rs->line = line;
  rs->src[rs->n] = rs->nids;
  rs->v = rs->sv;
  KILN_TRY(kiln_tokenize(source, slen, kiln_vocab_level(rs->sv), kiln_vocab_lowercase(rs->sv),
                         take_id, rs));
  int S = (int)(rs->nids - rs->src[rs->n]);
  if (S == 0) return kiln_errorf(KILN_ERR_DATA, "%s:%d: a record without source tokens", rs->path, line);
  if (S > rs->longest) rs->longest = S;
  rs->ref[rs->n] = rs->nids;
  rs->v = rs->tv;
  KILN_TRY(kiln_tokenize(target, tlen, kiln_vocab_level(rs->tv), kiln_vocab_lowercase(rs->tv),
                         take_id, rs));
  /* The error rate is edits per reference token: over none it is no figure (0 edits would
   * read as perfect, a few as infinite), so such a pair is refused rather than left out. */
  if (rs->nids == rs->ref[rs->n])
    return kiln_errorf(KILN_ERR_DATA, "%s:%d: a record without target tokens: the token error "
                       "rate is measured against the target, and an empty one has none", rs->path,
                       line);
  if (!(rs->text[rs->n] = kiln_strdup(source))) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  rs->n++;
  rs->src[rs->n] = rs->nids; /* where the next record starts: this one's reference ends */
  return KILN_OK;
}

static void free_records(records *rs) {
  for (int r = 0; r < rs->n; r++) free(rs->text[r]);
  free(rs->text);
  free(rs->ids);
  free(rs->src);
  free(rs->ref);
}

/* The marks the decoder needs, or a message naming the vocabulary. */
static bool target_marks(const kiln_vocab *tv, const char *path, kiln_seq2seq_marks *m) {
  m->bos = kiln_vocab_id(tv, KILN_VOCAB_BOS, strlen(KILN_VOCAB_BOS));
  m->eos = kiln_vocab_id(tv, KILN_VOCAB_EOS, strlen(KILN_VOCAB_EOS));
  m->pad = kiln_vocab_pad_id(tv);
  const char *missing = m->bos < 0 ? KILN_VOCAB_BOS : m->eos < 0 ? KILN_VOCAB_EOS : NULL;
  if (!missing) return true;
  fprintf(stderr,
          "kiln decode: --target-vocab: %s has no %s token: decoding starts with %s and ends at "
          "%s (kiln convert text --pairs target adds both)\n",
          path, missing, KILN_VOCAB_BOS, KILN_VOCAB_EOS);
  return false;
}

typedef struct {
  int max_source, streams, steps;
  const char *model;
} plan_args;

static int plan(Caffe__NetParameter *np, void *user) {
  const plan_args *p = user;
  return kiln_seq2seq_size_inputs(np, p->model, p->max_source, p->streams, p->steps);
}

/* The net planned for a beam search could not be built: when the greedy one (one stream of one
 * step) can, what the model cannot hold is the beam (--beam streams of --max-len steps), and
 * the message says so, naming both options; otherwise the net's own message stands. */
static void beam_too_wide(const tool_decode_args *a, const plan_args *p) {
  char why[4096];
  snprintf(why, sizeof why, "%s", kiln_last_error());
  plan_args greedy = {p->max_source, 1, 1, p->model};
  kiln_net *net = NULL;
  ProtobufCMessage *msg = NULL;
  if (tool_load_net_edited(a->model, CAFFE__PHASE__TEST, NULL, 0, a->max_memory, true, plan,
                           &greedy, &net, &msg) == KILN_OK)
    kiln_errorf(KILN_ERR_INVALID,
                "--beam %d with --max-len %d: %s cannot decode %d hypotheses of %d steps at once "
                "(%s); give a smaller --beam or --max-len",
                a->beam, a->max_len, a->model, a->beam, a->max_len, why);
  else
    kiln_errorf(KILN_ERR_INVALID, "%s", why);
  tool_free_net(net, msg);
}

/* SOURCE<TAB>DECODED, the decoded tokens as the target vocabulary's tokenizer would cut them
 * again (words apart by a space), so the file is a .tsv of pairs itself. */
static void put_decoded(kiln_strbuf *b, const kiln_vocab *tv, const char *source,
                        const int32_t *ids, int n) {
  kiln_text_escape(b, source, strlen(source));
  kiln_strbuf_printf(b, "\t");
  for (int i = 0; i < n; i++) {
    size_t len;
    const char *t = kiln_vocab_token(tv, ids[i], &len);
    if (i && kiln_vocab_level(tv) == KILN_TOKENS_WORD) kiln_strbuf_printf(b, " ");
    if (t) kiln_text_escape(b, t, len);
  }
  kiln_strbuf_printf(b, "\n");
}

/* The files decode reads, $KILN_DATA/ resolved: model, weights, vocab, target_vocab, input. */
typedef struct {
  char path[5][4096];
  const char *p[5];
} decode_inputs;

static int resolve_inputs(const kiln_config *cfg, const tool_decode_args *a, decode_inputs *in) {
  const char *given[5] = {a->model, a->weights, a->vocab, a->target_vocab, a->input};
  for (int i = 0; i < 5; i++) {
    in->p[i] = given[i];
    if (i < 2 || !given[i]) continue; /* the net and weights are read as given */
    KILN_TRY(kiln_data_source_path(cfg, given[i], in->path[i], sizeof in->path[i]));
    in->p[i] = in->path[i];
  }
  return KILN_OK;
}

int tool_decode(const tool_decode_args *a, tool_metrics *m) {
  kiln_vocab *sv = NULL, *tv = NULL;
  kiln_net *net = NULL;
  ProtobufCMessage *msg = NULL;
  kiln_seq2seq *dec = NULL;
  records rs = {0};
  int32_t *out = NULL;
  kiln_strbuf decoded = {0}; /* --output, written whole at the end */
  int code = 0;
  kiln_config cfg;
  char spath[4096], tpath[4096], ipath[4096];
  if (kiln_config_from_env(&cfg) || kiln_data_source_path(&cfg, a->vocab, spath, sizeof spath) ||
      kiln_data_source_path(&cfg, a->target_vocab, tpath, sizeof tpath) ||
      kiln_data_source_path(&cfg, a->input, ipath, sizeof ipath) || kiln_vocab_read(spath, &sv) ||
      kiln_vocab_read(tpath, &tv)) {
    code = tool_fail("decode");
    goto done;
  }
  decode_inputs in;
  if (a->output && (resolve_inputs(&cfg, a, &in) ||
                    kiln_check_output(a->output, KILN_OUTPUT_RENAMED, in.p, 5))) {
    code = tool_fail("decode: --output");
    goto done;
  }
  kiln_seq2seq_marks marks;
  if (!target_marks(tv, tpath, &marks)) {
    code = 2;
    goto done;
  }
  rs = (records){.sv = sv, .tv = tv, .path = ipath, .limit = a->limit};
  if (kiln_text_pairs(ipath, take_record, &rs)) {
    code = tool_fail("decode");
    goto done;
  }
  if (rs.n == 0) {
    fprintf(stderr, "kiln decode: %s: no records\n", ipath);
    code = 1;
    goto done;
  }
  plan_args p = {rs.longest, a->beam ? a->beam : 1, a->beam ? a->max_len : 1, a->model};
  out = malloc((size_t)a->max_len * sizeof *out);
  if (!out) {
    fprintf(stderr, "kiln: decode: out of memory for --max-len %d\n", a->max_len);
    code = 1;
    goto done;
  }
  if (tool_load_net_edited(a->model, CAFFE__PHASE__TEST, NULL, 0, a->max_memory, true, plan, &p,
                           &net, &msg)) {
    if (a->beam) beam_too_wide(a, &p);
    code = tool_fail("decode");
    goto done;
  }
  if (kiln_net_load_weights(net, a->weights) ||
      kiln_seq2seq_open(net, kiln_vocab_size(tv), &marks, a->model, &dec)) {
    code = tool_fail("decode");
    goto done;
  }
  size_t edits = 0, reference = 0;
  int exact = 0;
  double start = kiln_now_ms();
  for (int k = 0; k < rs.n; k++) {
    const int32_t *src = rs.ids + rs.src[k], *ref = rs.ids + rs.ref[k];
    int S = (int)(rs.ref[k] - rs.src[k]), R = (int)(rs.src[k + 1] - rs.ref[k]), n = 0;
    double score;
    size_t d = 0;
    int rc = a->beam ? kiln_seq2seq_beam(dec, src, S, a->beam, a->max_len, out, &n, &score)
                    : kiln_seq2seq_greedy(dec, src, S, a->max_len, out, &n, &score);
    if (!rc) rc = kiln_edit_distance(out, (size_t)n, ref, (size_t)R, &d);
    if (rc) {
      code = tool_fail("decode");
      goto done;
    }
    edits += d;
    reference += (size_t)R;
    exact += d == 0;
    if (a->output) put_decoded(&decoded, tv, rs.text[k], out, n);
  }
  if (a->output) {
    int rc = decoded.failed ? kiln_errorf(KILN_ERR_NOMEM, "out of memory for %s", a->output)
                            : kiln_write_file_atomic(a->output, decoded.s, decoded.len);
    if (rc) {
      code = tool_fail("decode: --output");
      goto done;
    }
  }
  double per = reference ? (double)edits / (double)reference : 0.0;
  double word_accuracy = (double)exact / rs.n;
  printf("records = %d (%s)\n", rs.n, a->beam ? "beam search" : "greedy");
  if (a->beam) printf("beam = %d\n", a->beam);
  printf("per = %.6f (%zu edits / %zu reference tokens)\n", per, edits, reference);
  printf("word_accuracy = %.6f (%d / %d exactly right)\n", word_accuracy, exact, rs.n);
  if (fflush(stdout) != 0) code = 1;
  const kiln_metric_field fl[] = {{KILN_MF_PER, per, NULL},
                                  {KILN_MF_WORD_ACCURACY, word_accuracy, NULL},
                                  {KILN_MF_WORDS, rs.n, NULL},
                                  {KILN_MF_BEAM, a->beam, NULL},
                                  {KILN_MF_PEAK_RSS_MB, kiln_peak_rss_mb(), NULL}};
  tool_metrics_write(m, KILN_EV_DECODE, 0, kiln_now_ms() - start, 5, fl);
done:
  free(decoded.s);
  kiln_seq2seq_free(dec);
  tool_free_net(net, msg);
  free(out);
  free_records(&rs);
  kiln_vocab_free(sv);
  kiln_vocab_free(tv);
  return code;
}

int cmd_decode(int argc, char **argv) {
  decode_args a;
  int r = parse_decode_args(argc, argv, &a);
  if (r) return r;
  a.d.max_memory = a.c.max_memory;
  tool_metrics m;
  kiln_config cfg;
  decode_inputs in = {0};
  if (a.c.metrics && (kiln_config_from_env(&cfg) || resolve_inputs(&cfg, &a.d, &in)))
    return tool_fail("decode");
  if (tool_metrics_open(&m, a.c.metrics, in.p, 5)) return tool_fail("metrics");
  int code = tool_decode(&a.d, &m);
  if (tool_metrics_close(&m) && !code) code = 1;
  return code;
}
