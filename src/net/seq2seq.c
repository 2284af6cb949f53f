/* Decoding with an encoder-decoder net (include/kiln/net.h, kiln_seq2seq_*; docs/sequence.md,
 * "Encoder-decoder models"): a deploy net whose inputs are TextData PAIRS' tops by name, run one
 * target token at a time.
 *
 * Greedy decoding feeds one token per pass (target_in and target_cont 1 x 1) and lets the
 * decoder's recurrent layers carry their state from pass to pass (cont 1 after the first step,
 * Caffe's rule), as kiln sample does; the encoder is recomputed every pass, which costs little
 * for short sources and needs no second net.
 *
 * Beam search cannot carry per-hypothesis state that way: the state a recurrent layer keeps is
 * one per stream, and the hypotheses of the next step are not the streams of this one (one
 * hypothesis may have two children and another none), so the carried state would have to be
 * reordered, which nothing outside the layer can do. Each step therefore recomputes every live
 * hypothesis's whole prefix: the K hypotheses, all of the same length k, are K streams of one
 * pass with T = k + 1 steps (<s> and the prefix), cont 0 at the first, so nothing carried counts.
 * That costs O(L^2) decoder steps for an output of L tokens, little for words; and the greedy
 * route and a beam of width 1 choose the same tokens, which checks one against the other. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/device.h"
#include "kiln/net.h"

static const char *const input_names[KILN_S2S_NINPUTS] = {"source", "source_mask", "source_cont",
                                                          "target_in", "target_cont"};
enum { IN_SOURCE, IN_MASK, IN_SCONT, IN_TARGET, IN_TCONT };

static int input_index(const char *name) {
  for (int i = 0; i < KILN_S2S_NINPUTS; i++)
    if (!strcmp(name, input_names[i])) return i;
  return -1;
}

/* ---- planning ------------------------------------------------------------------------------ */

/* One declared input: its shape set to the largest a decode uses (source inputs S x N, target
 * inputs T x N). */
static int plan_input(const char *model, const char *name, Caffe__BlobShape *shape,
                      const int64_t source[2], const int64_t target[2], bool seen[]) {
  int k = input_index(name);
  if (k < 0)
    return kiln_errorf(KILN_ERR_INVALID,
                       "%s: input '%s' is none of a decoding net's inputs (source, source_mask, "
                       "source_cont, target_in, target_cont: TextData PAIRS' tops)",
                       model, name);
  if (!shape || shape->n_dim != 2)
    return kiln_errorf(KILN_ERR_INVALID,
                       "%s: input '%s' must be declared with two axes, steps x streams "
                       "(input_shape { dim: 1 dim: 1 })",
                       model, name);
  const int64_t *want = k < IN_TARGET ? source : target;
  shape->dim[0] = want[0];
  shape->dim[1] = want[1];
  seen[k] = true;
  return KILN_OK;
}

int kiln_seq2seq_size_inputs(Caffe__NetParameter *np, const char *model, int max_source,
                             int max_streams, int max_steps) {
  if (max_source < 1 || max_streams < 1 || max_steps < 1)
    return kiln_errorf(KILN_ERR_INVALID, "%s: a decode of %d source steps, %d streams, %d steps",
                       model, max_source, max_streams, max_steps);
  const int64_t source[2] = {max_source, max_streams}, target[2] = {max_steps, max_streams};
  bool seen[KILN_S2S_NINPUTS] = {false};
  /* a deploy header (input: with input_shape; four input_dim each are images, never this) */
  for (size_t i = 0; i < np->n_input; i++)
    KILN_TRY(plan_input(model, np->input[i], i < np->n_input_shape ? np->input_shape[i] : NULL,
                        source, target, seen));
  for (size_t i = 0; i < np->n_layer; i++) {
    const Caffe__LayerParameter *lp = np->layer[i];
    if (!lp->type || strcmp(lp->type, "Input")) continue;
    const Caffe__InputParameter *p = lp->input_param;
    size_t nshape = p ? p->n_shape : 0;
    if (lp->n_top > 1 && nshape != lp->n_top)
      return kiln_errorf(KILN_ERR_INVALID,
                         "%s: layer '%s' (Input): a decoding net's inputs take shapes of their "
                         "own; give each of its %zu tops its own shape",
                         model, lp->name ? lp->name : "", lp->n_top);
    for (size_t t = 0; t < lp->n_top; t++)
      KILN_TRY(plan_input(model, lp->top[t], nshape ? p->shape[t] : NULL, source, target, seen));
  }
  if (!seen[IN_SOURCE] || !seen[IN_TARGET])
    return kiln_errorf(KILN_ERR_INVALID,
                       "%s: a decoding net takes the source (S x 1) and the current target token "
                       "(1 x 1) as inputs named 'source' and 'target_in' (and source_mask, "
                       "source_cont and target_cont where it reads them); it has no '%s'",
                       model, seen[IN_SOURCE] ? "target_in" : "source");
  return KILN_OK;
}

/* ---- the decoder --------------------------------------------------------------------------- */

typedef struct {
  int32_t *tok; /* max_steps tokens */
  int n;
  double score;
} hyp;

struct kiln_seq2seq {
  kiln_net *net;
  const char *model;
  kiln_blob *in[KILN_S2S_NINPUTS]; /* NULL where the net has no such input */
  kiln_blob *scores;
  int V;
  kiln_seq2seq_marks marks;
  int max_source, max_streams, max_steps;
  double *logp;         /* max_streams x V: this step's log-probabilities */
  hyp *live, *next;     /* max_streams each */
  hyp best;             /* the best finished hypothesis */
  int32_t *tokens;      /* the hypotheses' token storage */
  struct cand { double score; int from, token; } *cand; /* max_streams x V */
  /* The inputs are written here and handed to the net's device before each pass; the scores
   * of the last step are read back into `row` (max_streams x V). */
  float *host_in[KILN_S2S_NINPUTS];
  float *row;
};

int kiln_seq2seq_open(kiln_net *net, int vocab_size, const kiln_seq2seq_marks *marks,
                      const char *model, kiln_seq2seq **out) {
  *out = NULL;
  kiln_seq2seq *d = calloc(1, sizeof *d);
  if (!d) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  d->net = net;
  d->model = model;
  d->V = vocab_size;
  d->marks = *marks;
  for (int i = 0; i < net->nlayers; i++) {
    const kiln_layer *l = net->layers[i];
    if (!l->ops->fed_by_caller) continue;
    for (int t = 0; t < l->ntop; t++) {
      int k = input_index(l->top[t]->name);
      if (k >= 0) d->in[k] = l->top[t];
    }
  }
  for (int o = 0; o < net->noutputs && !d->scores; o++) {
    kiln_blob *b = net->outputs[o];
    if (b->naxes == 3 && b->shape[2] == vocab_size) d->scores = b;
  }
  int rc = KILN_OK;
  if (!d->in[IN_SOURCE] || !d->in[IN_TARGET])
    rc = kiln_errorf(KILN_ERR_INVALID, "%s: a decoding net takes inputs 'source' and 'target_in'",
                     model);
  else if (!d->scores)
    rc = kiln_errorf(KILN_ERR_INVALID,
                     "%s: no output holds a score per token of the target vocabulary (%d) at "
                     "every step, T x N x %d",
                     model, vocab_size, vocab_size);
  if (rc) {
    free(d);
    return rc;
  }
  d->max_source = (int)d->in[IN_SOURCE]->shape[0];
  d->max_streams = (int)d->in[IN_SOURCE]->shape[1];
  d->max_steps = (int)d->in[IN_TARGET]->shape[0];
  size_t K = (size_t)d->max_streams, V = (size_t)vocab_size, L = (size_t)d->max_steps;
  d->logp = malloc(K * V * sizeof *d->logp);
  d->live = calloc(K, sizeof *d->live);
  d->next = calloc(K, sizeof *d->next);
  d->tokens = malloc((2 * K + 1) * L * sizeof *d->tokens);
  d->cand = malloc(K * V * sizeof *d->cand);
  d->row = malloc(K * V * sizeof *d->row);
  bool host_ok = true;
  for (int k = 0; k < KILN_S2S_NINPUTS; k++)
    if (d->in[k]) {
      size_t steps = k < IN_TARGET ? (size_t)d->max_source : L;
      d->host_in[k] = malloc(steps * K * sizeof(float));
      host_ok = host_ok && d->host_in[k];
    }
  if (!d->logp || !d->live || !d->next || !d->tokens || !d->cand || !d->row || !host_ok) {
    kiln_seq2seq_free(d);
    return kiln_errorf(KILN_ERR_NOMEM, "out of memory for a decoder of %zu streams", K);
  }
  for (size_t k = 0; k < K; k++) {
    d->live[k].tok = d->tokens + k * L;
    d->next[k].tok = d->tokens + (K + k) * L;
  }
  d->best.tok = d->tokens + 2 * K * L;
  *out = d;
  return KILN_OK;
}

void kiln_seq2seq_free(kiln_seq2seq *d) {
  if (!d) return;
  free(d->logp);
  free(d->live);
  free(d->next);
  free(d->tokens);
  free(d->cand);
  free(d->row);
  for (int k = 0; k < KILN_S2S_NINPUTS; k++) free(d->host_in[k]);
  free(d);
}

static int set_shape(kiln_blob *b, int64_t T, int64_t N, bool *changed) {
  if (!b || (b->shape[0] == T && b->shape[1] == N)) return KILN_OK;
  *changed = true;
  return kiln_blob_reshape(b, 2, (const int64_t[]){T, N});
}

/* Shapes the inputs for S source steps, T target steps and N streams, reshaping the net when
 * they change, and writes the source into every stream. */
static int shape_inputs(kiln_seq2seq *d, const int32_t *source, int S, int T, int N) {
  if (S > d->max_source || N > d->max_streams || T > d->max_steps)
    return kiln_errorf(KILN_ERR_INVALID,
                       "%s: a pass of %d source steps, %d target steps and %d streams, more than "
                       "the %d, %d and %d planned",
                       d->model, S, T, N, d->max_source, d->max_steps, d->max_streams);
  bool changed = false;
  for (int k = 0; k < KILN_S2S_NINPUTS; k++)
    KILN_TRY(set_shape(d->in[k], k < IN_TARGET ? S : T, N, &changed));
  if (changed) KILN_TRY(kiln_net_reshape_inputs(d->net));
  for (int t = 0; t < S; t++)
    for (int n = 0; n < N; n++) {
      int64_t i = (int64_t)t * N + n;
      d->host_in[IN_SOURCE][i] = (float)source[t];
      if (d->in[IN_MASK]) d->host_in[IN_MASK][i] = 1;
      if (d->in[IN_SCONT]) d->host_in[IN_SCONT][i] = t ? 1.0f : 0.0f;
    }
  return KILN_OK;
}

/* Runs the net and turns stream n's scores at the last step into log-probabilities in
 * d->logp[n * V ..]. */
static int run(kiln_seq2seq *d, int T, int N) {
  for (int k = 0; k < KILN_S2S_NINPUTS; k++) {
    kiln_blob *b = d->in[k];
    if (b)
      KILN_TRY(kiln_device_to_device(b->device, b->data, d->host_in[k],
                                     sizeof(float) * (size_t)b->count));
  }
  KILN_TRY(kiln_net_forward(d->net, NULL));
  const kiln_blob *s = d->scores;
  if (s->naxes != 3 || s->shape[0] != T || s->shape[1] != N || s->shape[2] != d->V)
    return kiln_errorf(KILN_ERR_INVALID,
                       "%s: output '%s' is not the target steps x streams x %d scores (a pass of "
                       "%d steps of %d streams)",
                       d->model, s->name, d->V, T, N);
  const int V = d->V;
  KILN_TRY(kiln_device_to_host(s->device, d->row, s->data + (int64_t)(T - 1) * N * V,
                                sizeof(float) * (size_t)N * (size_t)V));
  for (int n = 0; n < N; n++) {
    const float *x = d->row + (int64_t)n * V;
    double *lp = d->logp + (int64_t)n * V, top = x[0], sum = 0;
    for (int v = 1; v < V; v++)
      if (x[v] > top) top = x[v];
    for (int v = 0; v < V; v++) sum += exp(x[v] - top);
    double norm = top + log(sum);
    for (int v = 0; v < V; v++) lp[v] = x[v] - norm;
  }
  return KILN_OK;
}

/* Neither <pad> nor <s> is ever a target token (TextData's target_out holds neither). */
static bool emittable(const kiln_seq2seq *d, int v) {
  return v != d->marks.pad && v != d->marks.bos;
}

int kiln_seq2seq_greedy(kiln_seq2seq *d, const int32_t *source, int S, int max_len,
                        int32_t *out, int *n, double *score) {
  *n = 0;
  *score = 0;
  for (int k = 0; k < max_len; k++) {
    KILN_TRY(shape_inputs(d, source, S, 1, 1));
    d->host_in[IN_TARGET][0] = (float)(k ? out[k - 1] : d->marks.bos);
    if (d->in[IN_TCONT]) d->host_in[IN_TCONT][0] = k ? 1.0f : 0.0f;
    KILN_TRY(run(d, 1, 1));
    int best = -1;
    for (int v = 0; v < d->V; v++)
      if (emittable(d, v) && (best < 0 || d->logp[v] > d->logp[best])) best = v;
    *score += d->logp[best];
    if (best == d->marks.eos) return KILN_OK;
    out[(*n)++] = best;
  }
  return KILN_OK;
}

/* Candidates best first; ties by hypothesis, then token, so that a beam of one is greedy. */
static int by_score(const void *a, const void *b) {
  const struct cand *x = a, *y = b;
  if (x->score != y->score) return x->score > y->score ? -1 : 1;
  if (x->from != y->from) return x->from < y->from ? -1 : 1;
  return (x->token > y->token) - (x->token < y->token);
}

int kiln_seq2seq_beam(kiln_seq2seq *d, const int32_t *source, int S, int beam, int max_len,
                      int32_t *out, int *n, double *score) {
  *n = 0;
  *score = 0;
  if (beam < 1 || beam > d->max_streams)
    return kiln_errorf(KILN_ERR_INVALID, "%s: a beam of %d, planned for 1 to %d", d->model, beam,
                       d->max_streams);
  const int V = d->V;
  int nlive = 1;
  d->live[0].n = 0;
  d->live[0].score = 0;
  bool finished = false;
  for (int k = 0; k < max_len && nlive > 0; k++) {
    /* every live hypothesis holds k tokens: <s> and them are k + 1 steps */
    KILN_TRY(shape_inputs(d, source, S, k + 1, nlive));
    for (int t = 0; t <= k; t++)
      for (int h = 0; h < nlive; h++) {
        int64_t i = (int64_t)t * nlive + h;
        d->host_in[IN_TARGET][i] = (float)(t ? d->live[h].tok[t - 1] : d->marks.bos);
        if (d->in[IN_TCONT]) d->host_in[IN_TCONT][i] = t ? 1.0f : 0.0f;
      }
    KILN_TRY(run(d, k + 1, nlive));
    int nc = 0;
    for (int h = 0; h < nlive; h++)
      for (int v = 0; v < V; v++)
        if (emittable(d, v))
          d->cand[nc++] = (struct cand){d->live[h].score + d->logp[(int64_t)h * V + v], h, v};
    qsort(d->cand, (size_t)nc, sizeof *d->cand, by_score);
    /* the best `beam` candidates: those ending go to the finished, the others live on */
    int nnext = 0;
    for (int c = 0; c < nc && c < beam; c++) {
      const hyp *from = &d->live[d->cand[c].from];
      if (d->cand[c].token == d->marks.eos) {
        if (!finished || d->cand[c].score > d->best.score) {
          memcpy(d->best.tok, from->tok, sizeof *from->tok * (size_t)from->n);
          d->best.n = from->n;
          d->best.score = d->cand[c].score;
          finished = true;
        }
        continue;
      }
      hyp *h = &d->next[nnext++];
      memcpy(h->tok, from->tok, sizeof *from->tok * (size_t)from->n);
      h->tok[from->n] = d->cand[c].token;
      h->n = from->n + 1;
      h->score = d->cand[c].score;
    }
    hyp *swap = d->live;
    d->live = d->next;
    d->next = swap;
    nlive = nnext;
    /* log-probabilities are at most 0: no live hypothesis can end better than it stands */
    if (finished && (nlive == 0 || d->best.score >= d->live[0].score)) break;
  }
  const hyp *won = finished ? &d->best : &d->live[0]; /* at max_len: the best unfinished */
  memcpy(out, won->tok, sizeof *out * (size_t)won->n);
  *n = won->n;
  *score = won->score;
  return KILN_OK;
}
