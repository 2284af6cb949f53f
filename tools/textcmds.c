/* kiln sample: text from a trained language model, one token per forward pass.
 *
 * The model is a deploy net whose inputs are the token ids (W x 1: W steps of one stream) and,
 * for recurrent layers, `cont` (W x 1); one of its outputs holds the scores of the next token
 * at each step (a last axis of the vocabulary's size). With W = 1 the recurrent layers carry
 * their state from one pass to the next as Caffe's do while cont is 1, so each pass reads one
 * token and the state holds the rest of the text; the first pass has cont 0, a fresh sequence.
 * With W > 1 (a transformer's window) each pass reads the last W tokens again. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/data.h"
#include "kiln/device.h"
#include "tool.h"

typedef struct {
  tool_common c;
  const char *model, *weights, *vocab, *prime;
  int length;
  double temperature;
  uint64_t seed;
} sample_args;

static void usage(FILE *f) {
  fprintf(f,
          "usage: kiln sample --model DEPLOY.prototxt --weights W.caffemodel --vocab V.txt\n"
          "                   [options]\n"
          "\n"
          "Prints text from a trained language model, one token per forward pass, each drawn from\n"
          "the model's scores for the next one. A vocabulary written $KILN_DATA/... is read from\n"
          "the data set cache.\n"
          "\n"
          "options:\n"
          "  --model FILE           the deploy net: token ids (and cont) in, the next token's\n"
          "                         scores out (required)\n"
          "  --weights FILE         its trained .caffemodel (required)\n"
          "  --vocab FILE           the vocabulary it was trained with (required)\n"
          "  --prime TEXT           the text to start from, printed first (default: a line break)\n"
          "  --length N             the tokens to draw (default 200)\n"
          "  --temperature T        the scores are divided by T before the softmax (default 1;\n"
          "                         0: always the likeliest token)\n"
          "  --seed S               the seed of the draws (default 1)\n");
  tool_common_usage(f, NULL);
  tool_help_usage(f);
}

/* --length takes 0 to this: 16M tokens, a long book. */
#define SAMPLE_MAX_LENGTH (1 << 24)

static int parse_sample_args(int argc, char **argv, sample_args *a) {
  static const char *const names[] = {"--model", "--weights", "--vocab", "--prime", "--length",
                                      "--temperature", "--seed", NULL};
  memset(a, 0, sizeof *a);
  a->length = 200;
  a->temperature = 1.0;
  a->seed = 1;
  for (int i = 1; i < argc; i++) {
    const char *o, *v;
    int r = tool_option_value("sample", names, usage, &a->c, argc, argv, &i, &o, &v);
    if (r < 0) return 2;
    if (r == 0) continue;
    char *end;
    if (!strcmp(o, "--model")) a->model = v;
    else if (!strcmp(o, "--weights")) a->weights = v;
    else if (!strcmp(o, "--vocab")) a->vocab = v;
    else if (!strcmp(o, "--prime")) a->prime = v;
    else if (!strcmp(o, "--length")) {
      if (!tool_int_option_int("sample", o, v, 0, SAMPLE_MAX_LENGTH, &a->length)) return 2;
    } else if (!strcmp(o, "--temperature")) {
      a->temperature = strtod(v, &end);
      if (end == v || *end || !(a->temperature >= 0) || !isfinite(a->temperature)) {
        fprintf(stderr, "kiln sample: --temperature: '%s' is not a number >= 0\n", v);
        return 2;
      }
    } else if (!strcmp(o, "--seed")) {
      long long s;
      if (!tool_int_option("sample", o, v, 0, INT64_MAX, &s)) return 2;
      a->seed = (uint64_t)s;
    } else {
      fprintf(stderr, "kiln sample: unknown option '%s' (see kiln sample --help)\n", o);
      return 2;
    }
  }
  if (a->c.metrics) {
    fprintf(stderr, "kiln sample: --metrics: sample writes no events\n");
    return 2;
  }
  if (!a->model || !a->weights || !a->vocab) {
    fprintf(stderr, "kiln sample: --model, --weights and --vocab are required\n");
    return 2;
  }
  return 0;
}

typedef struct {
  const kiln_vocab *v;
  int *ids;
  int n, cap, unknown_at; /* unknown_at: the first token without an id, -1 if none */
} prime_ids;

static int add_prime_token(void *user, const char *tok, size_t len) {
  prime_ids *p = user;
  int id = kiln_vocab_id(p->v, tok, len);
  if (id < 0) id = kiln_vocab_unk_id(p->v);
  if (id < 0) {
    if (p->unknown_at < 0) p->unknown_at = p->n;
    return KILN_OK;
  }
  if (p->n == p->cap) {
    int cap = p->cap ? 2 * p->cap : 64;
    int *ids = realloc(p->ids, (size_t)cap * sizeof *ids);
    if (!ids) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
    p->ids = ids;
    p->cap = cap;
  }
  p->ids[p->n++] = id;
  return KILN_OK;
}

/* The deploy net's parts: the ids input (W x 1), the cont input (W x 1, or NULL) and the scores
 * output (W x 1 x V). */
typedef struct {
  kiln_blob *ids, *cont, *scores;
  int64_t W;
  /* Host copies of the inputs (W each) and of one step's scores (V), moved through the net's
   * device table: the net's memory may be a device's. */
  float *ids_h, *cont_h, *scores_h;
} lm_io;

static bool is_window(const kiln_blob *b, int64_t W) {
  return b->naxes == 2 && b->shape[0] == W && b->shape[1] == 1;
}

static int find_io(const kiln_net *net, int vocab_size, const char *model, lm_io *io) {
  memset(io, 0, sizeof io[0]);
  for (int i = 0; i < net->nlayers; i++) {
    const kiln_layer *l = net->layers[i];
    if (!l->ops->fed_by_caller) continue;
    for (int t = 0; t < l->ntop; t++) {
      kiln_blob *b = l->top[t];
      if (!strcmp(b->name, "cont")) io->cont = b;
      else if (!io->ids) io->ids = b;
    }
  }
  io->W = io->ids && io->ids->naxes > 0 ? io->ids->shape[0] : 0;
  for (int o = 0; o < net->noutputs && !io->scores; o++) {
    kiln_blob *b = net->outputs[o];
    if (b->naxes > 0 && b->shape[b->naxes - 1] == vocab_size) io->scores = b;
  }
  if (!io->ids || io->W < 1 || !is_window(io->ids, io->W) ||
      (io->cont && !is_window(io->cont, io->W)))
    return kiln_errorf(KILN_ERR_INVALID,
                       "%s: a sampling net takes the token ids as an input of W steps of one "
                       "stream (W x 1), and cont likewise if it has one",
                       model);
  if (!io->scores || io->scores->count != io->W * vocab_size)
    return kiln_errorf(KILN_ERR_INVALID,
                       "%s: no output holds one score per token of the vocabulary (%d) for each "
                       "of the %lld steps",
                       model, vocab_size, (long long)io->W);
  return KILN_OK;
}

/* The next token: the largest score at temperature 0, else drawn from softmax(scores / T). */
static int draw(const float *scores, int V, double temperature, kiln_rng *rng) {
  int best = 0;
  for (int i = 1; i < V; i++)
    if (scores[i] > scores[best]) best = i;
  if (temperature == 0) return best;
  double total = 0;
  for (int i = 0; i < V; i++) total += exp((scores[i] - scores[best]) / temperature);
  double u = kiln_rng_uniform(rng, 0, 1) * total;
  for (int i = 0; i < V; i++) {
    u -= exp((scores[i] - scores[best]) / temperature);
    if (u < 0) return i;
  }
  return best;
}

static void put_token(const kiln_vocab *v, int id, bool words, bool first) {
  size_t len;
  const char *t = kiln_vocab_token(v, id, &len);
  if (!t) return;
  if (words && !first) putchar(' ');
  fwrite(t, 1, len, stdout);
}

/* W = 1: one token a pass, the state carried from the last (cont 1), or a fresh start. */
/* Hands the inputs to the net, runs it, and reads the scores of step `at` into io->scores_h. */
static int pass(kiln_net *net, const lm_io *io, int64_t at, int V) {
  const size_t in = sizeof(float) * (size_t)io->W;
  KILN_TRY(kiln_device_to_device(io->ids->device, io->ids->data, io->ids_h, in));
  if (io->cont) KILN_TRY(kiln_device_to_device(io->cont->device, io->cont->data, io->cont_h, in));
  KILN_TRY(kiln_net_forward(net, NULL));
  return kiln_device_to_host(io->scores->device, io->scores_h, io->scores->data + at * V,
                             sizeof(float) * (size_t)V);
}

static int step(kiln_net *net, const lm_io *io, int id, bool first, int V) {
  io->ids_h[0] = (float)id;
  if (io->cont) io->cont_h[0] = first ? 0.0f : 1.0f;
  return pass(net, io, 0, V);
}

/* W > 1: the last (at most W) tokens of the text from step 0, the rest padding, and the scores
 * of the step that holds the last token. A causal model's prediction there depends on the
 * steps up to it alone, and a recurrent one starts afresh (cont 0) at step 0, so the padding
 * after it changes nothing; a text longer than W slides through the window. */
static const float *window_scores(kiln_net *net, const lm_io *io, const int *text, int64_t len,
                                  int V) {
  const int64_t start = len > io->W ? len - io->W : 0, L = len - start;
  for (int64_t t = 0; t < io->W; t++) {
    io->ids_h[t] = t < L ? (float)text[start + t] : 0.0f;
    if (io->cont) io->cont_h[t] = t == 0 ? 0.0f : 1.0f;
  }
  if (pass(net, io, L - 1, V)) return NULL;
  return io->scores_h;
}

int cmd_sample(int argc, char **argv) {
  sample_args a;
  int r = parse_sample_args(argc, argv, &a);
  if (r) return r;
  kiln_vocab *v = NULL;
  kiln_net *net = NULL;
  ProtobufCMessage *msg = NULL;
  prime_ids p = {.unknown_at = -1};
  int *text = NULL; /* the prime's ids, then what is drawn */
  float *io_host = NULL;
  int code = 0;
  kiln_config cfg;
  char vocab_path[4096];
  if (kiln_config_from_env(&cfg) ||
      kiln_data_source_path(&cfg, a.vocab, vocab_path, sizeof vocab_path) ||
      kiln_vocab_read(vocab_path, &v)) {
    code = tool_fail("sample");
    goto done;
  }
  p.v = v;
  const int V = kiln_vocab_size(v);
  const bool words = kiln_vocab_level(v) == KILN_TOKENS_WORD;
  const char *prime = a.prime ? a.prime : "\n";
  if (kiln_tokenize(prime, strlen(prime), kiln_vocab_level(v), kiln_vocab_lowercase(v),
                    add_prime_token, &p)) {
    code = tool_fail("sample");
    goto done;
  }
  if (p.unknown_at >= 0) {
    fprintf(stderr,
            "kiln sample: --prime: token %d is not in %s, which has no unknown token\n",
            p.unknown_at + 1, vocab_path);
    code = 2;
    goto done;
  }
  if (p.n == 0) {
    fprintf(stderr, "kiln sample: --prime has no token under %s\n", vocab_path);
    code = 2;
    goto done;
  }
  lm_io io;
  if (tool_load_net(a.model, CAFFE__PHASE__TEST, NULL, 0, a.c.max_memory, true, &net, &msg) ||
      kiln_net_load_weights(net, a.weights) || find_io(net, V, a.model, &io)) {
    code = tool_fail("sample");
    goto done;
  }
  kiln_rng rng;
  kiln_rng_seed(&rng, a.seed, 0x5a3d);
  text = malloc(sizeof(int) * ((size_t)p.n + (size_t)a.length));
  io_host = malloc(sizeof(float) * (2 * (size_t)io.W + (size_t)V));
  if (!text || !io_host) {
    fprintf(stderr, "kiln sample: out of memory\n");
    code = 1;
    goto done;
  }
  io.ids_h = io_host;
  io.cont_h = io_host + io.W;
  io.scores_h = io_host + 2 * io.W;
  memcpy(text, p.ids, sizeof(int) * (size_t)p.n);
  int64_t len = p.n;
  for (int i = 0; i < p.n; i++) {
    put_token(v, p.ids[i], words, i == 0);
    if (io.W == 1 && step(net, &io, p.ids[i], i == 0, V)) {
      code = tool_fail("sample");
      goto done;
    }
  }
  for (int i = 0; i < a.length; i++) {
    const float *scores = io.W == 1 ? io.scores_h : window_scores(net, &io, text, len, V);
    if (!scores) {
      code = tool_fail("sample");
      goto done;
    }
    const int id = draw(scores, V, a.temperature, &rng);
    text[len++] = id;
    put_token(v, id, words, false);
    if (io.W == 1 && i + 1 < a.length && step(net, &io, id, false, V)) {
      code = tool_fail("sample");
      goto done;
    }
  }
  putchar('\n');
  if (fflush(stdout) != 0) code = 1;
done:
  free(text);
  free(io_host);
  free(p.ids);
  tool_free_net(net, msg);
  kiln_vocab_free(v);
  return code;
}
