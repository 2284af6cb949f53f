/* A helper of tests/cli/onnx_export.sh and slow_onnx_zoo.sh (not installed): kiln's side of the
 * comparison with OpenCV's ONNX runtime. Builds a deploy net (TEST phase, plain layouts, every
 * blob kept), gives it random weights that make every part of it matter (He-scaled weights,
 * biases, BatchNorm statistics near those of what reaches it, stored with a scale factor other
 * than 1, Scale's gamma and beta, PReLU's slopes), saves them, runs one forward pass on random inputs and writes the inputs and the
 * blobs asked for as raw float32 files.
 *
 *   onnx_ref MODEL WEIGHTS_OUT DIR SEED [BLOB...]
 *
 * DIR/manifest.txt gets one line a file: "input NAME FILE D0 D1 ..." for each input, then
 * "blob NAME FILE D0 D1 ..." for each output of the net, "inner NAME FILE ..." for each BLOB
 * named (its value after the forward pass: the last in-place layer's). Exit 1 with kiln's
 * message on stderr when something fails. Inputs are uniform in [-1, 1), except those the
 * sequence layers read as something else: an Embed's ids (whole numbers below its input_dim), a
 * recurrent layer's cont (0 at the first step, 1 after: whole sequences, what the ONNX export
 * assumes) and an attention's or SequencePool's mask (1, with the last steps of every other
 * sequence 0, and the first step of every third 0: a causal query there sees no key).
 *
 *   onnx_ref --compare MODEL WEIGHTS DIR TOL
 *
 * The other direction (tests/cli/onnx_import.sh): runs a net with its weights (an imported one) on
 * the inputs of DIR/manifest.txt (written as above, by this helper or by PyTorch) and compares
 * each "blob" (and "inner") of the manifest with kiln's blob of that name: one line each, "NAME
 * max|d| X"; exit 1 when one differs by more than TOL (0: bit for bit). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/net.h"
#include "kiln/proto.h"

static int fail(const char *what) {
  fprintf(stderr, "onnx_ref: %s: %s\n", what, kiln_last_error());
  return 1;
}

static float uniform(kiln_rng *r, float lo, float hi) {
  return kiln_rng_uniform(r, lo, hi);
}

static void fill(kiln_rng *r, kiln_blob *b, float lo, float hi) {
  for (int64_t i = 0; i < b->count; i++) b->data[i] = uniform(r, lo, hi);
}

/* BatchNorm's statistics from what reaches it: one pass, layer by layer, each BatchNorm given
 * the mean and variance of its input (each channel's, perturbed by up to 20%) before it runs, so
 * that deep nets keep their activations near 1 and their scores unsaturated. */
static int calibrate(kiln_net *net, kiln_rng *r) {
  for (int i = 0; i < net->nlayers; i++) {
    kiln_layer *l = net->layers[i];
    if (!strcmp(l->ops->type, "BatchNorm")) {
      const kiln_blob *x = l->bottom[0];
      const int64_t N = x->shape[0], C = x->shape[1], S = x->count / (N * C);
      const float f = l->param[2]->data[0];
      for (int64_t c = 0; c < C; c++) {
        double sum = 0, sq = 0;
        for (int64_t n = 0; n < N; n++)
          for (int64_t k = 0; k < S; k++) {
            const double v = x->data[(n * C + c) * S + k];
            sum += v;
            sq += v * v;
          }
        const double mean = sum / (double)(N * S), var = sq / (double)(N * S) - mean * mean;
        l->param[0]->data[c] = (float)(mean + 0.2 * sqrt(var) * uniform(r, -1, 1)) * f;
        l->param[1]->data[c] = (float)(var * uniform(r, 0.8f, 1.25f) + 1e-3) * f;
      }
    }
    if (kiln_net_layer_forward(net, i)) return 1;
  }
  return 0;
}

static void randomize(kiln_net *net, kiln_rng *r) {
  for (int i = 0; i < net->nlayers; i++) {
    kiln_layer *l = net->layers[i];
    const char *t = l->ops->type;
    if (!l->nparam) continue;
    if (!strcmp(t, "BatchNorm")) {
      const float f = uniform(r, 0.5f, 2.0f); /* Caffe's stored sums are the statistics x f */
      fill(r, l->param[0], -0.5f * f, 0.5f * f);
      fill(r, l->param[1], 0.5f * f, 2.0f * f);
      l->param[2]->data[0] = f;
    } else if (!strcmp(t, "Scale")) {
      fill(r, l->param[0], 0.5f, 1.5f);
      if (l->nparam > 1) fill(r, l->param[1], -0.5f, 0.5f);
    } else if (!strcmp(t, "PReLU")) {
      fill(r, l->param[0], 0.05f, 0.5f);
    } else if (!strcmp(t, "Convolution") || !strcmp(t, "Deconvolution") ||
               !strcmp(t, "InnerProduct")) {
      kiln_blob *w = l->param[0];
      const bool transposed = !strcmp(t, "InnerProduct") && l->lp->inner_product_param &&
                              l->lp->inner_product_param->transpose;
      const int64_t fan_in = !strcmp(t, "Deconvolution") ? w->count / w->shape[1]
                             : transposed                ? w->shape[0]
                                                         : w->count / w->shape[0];
      const float a = sqrtf(6.0f / (float)(fan_in > 0 ? fan_in : 1));
      fill(r, w, -a, a);
      if (l->nparam > 1) fill(r, l->param[1], -0.1f, 0.1f);
    } else {
      for (int p = 0; p < l->nparam; p++) fill(r, l->param[p], -0.5f, 0.5f);
    }
  }
}

/* What the layers that read input blob b (through kiln's Splits) take it as. */
enum { ROLE_VALUES, ROLE_IDS, ROLE_CONT, ROLE_MASK };
static int input_role(const kiln_net *net, const kiln_blob *b, int64_t *ids) {
  for (int i = 0; i < net->nlayers; i++) {
    const kiln_layer *l = net->layers[i];
    for (int k = 0; k < l->nbottom; k++) {
      if (l->bottom[k] != b) continue;
      const char *t = l->ops->type;
      if (!strcmp(t, "Split")) {
        for (int o = 0; o < l->ntop; o++) {
          const int r = input_role(net, l->top[o], ids);
          if (r != ROLE_VALUES) return r;
        }
      } else if (!strcmp(t, "Embed")) {
        *ids = l->param[0]->shape[0];
        return ROLE_IDS;
      } else if (k == 1 && (!strcmp(t, "LSTM") || !strcmp(t, "GRU") || !strcmp(t, "RNN"))) {
        return ROLE_CONT;
      } else if ((!strcmp(t, "MultiHeadAttention") && k > 0 && l->bottom[k]->naxes == 2) ||
                 (!strcmp(t, "SequencePool") && k == 1)) {
        return ROLE_MASK;
      }
    }
  }
  return ROLE_VALUES;
}

static void fill_input(const kiln_net *net, kiln_blob *b, kiln_rng *r) {
  int64_t ids = 0;
  const int role = input_role(net, b, &ids);
  const int64_t T = b->shape[0], N = b->count / (T ? T : 1);
  for (int64_t j = 0; j < b->count; j++) {
    const int64_t t = j / N, n = j % N;
    switch (role) {
      case ROLE_IDS: {
        int64_t v = (int64_t)uniform(r, 0.0f, (float)ids);
        b->data[j] = (float)(v < ids ? v : ids - 1);
        break;
      }
      case ROLE_CONT: b->data[j] = t > 0 ? 1.0f : 0.0f; break;
      case ROLE_MASK: /* padding at the end; sequence 2 also without its first step */
        b->data[j] =
            (n % 2 == 1 && t >= T - 1 - n / 2 && t > 0) || (n % 3 == 2 && t == 0) ? 0.0f : 1.0f;
        break;
      default: b->data[j] = uniform(r, -1.0f, 1.0f);
    }
  }
}

static int write_blob(FILE *manifest, const char *dir, const char *kind, int k, const char *name,
                      const kiln_blob *b) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s%d.f32", dir, kind, k);
  FILE *f = fopen(path, "wb");
  if (!f || fwrite(b->data, sizeof(float), (size_t)b->count, f) != (size_t)b->count ||
      fclose(f)) {
    fprintf(stderr, "onnx_ref: cannot write %s\n", path);
    return 1;
  }
  fprintf(manifest, "%s %s %s%d.f32", kind, name, kind, k);
  for (int a = 0; a < b->naxes; a++) fprintf(manifest, " %lld", (long long)b->shape[a]);
  fprintf(manifest, "\n");
  return 0;
}

static float *read_floats(const char *dir, const char *file, int64_t n) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", dir, file);
  FILE *f = fopen(path, "rb");
  float *v = malloc(sizeof(float) * (size_t)(n ? n : 1));
  if (!f || !v || fread(v, sizeof(float), (size_t)n, f) != (size_t)n) {
    fprintf(stderr, "onnx_ref: cannot read %lld floats from %s\n", (long long)n, path);
    if (f) fclose(f);
    free(v);
    return NULL;
  }
  fclose(f);
  return v;
}

static int compare(int argc, char **argv) {
  if (argc != 6) {
    fprintf(stderr, "usage: onnx_ref --compare MODEL WEIGHTS DIR TOL\n");
    return 2;
  }
  const char *model = argv[2], *weights = argv[3], *dir = argv[4];
  const double tol = strtod(argv[5], NULL);
  kiln_config cfg;
  if (kiln_config_from_env(&cfg)) return fail("configuration");
  cfg.plain_layouts = true;
  ProtobufCMessage *msg;
  if (kiln_text_parse_file(model, &caffe__net_parameter__descriptor, &msg)) return fail(model);
  kiln_net_options o = {.phase = CAFFE__PHASE__TEST, .seed = 1, .source = model, .config = &cfg};
  kiln_net *net;
  if (kiln_net_create((Caffe__NetParameter *)msg, &o, &net)) return fail(model);
  if (kiln_net_load_weights(net, weights)) return fail(weights);
  char path[4096], line[4096];
  snprintf(path, sizeof path, "%s/manifest.txt", dir);
  FILE *mf = fopen(path, "r");
  if (!mf) {
    fprintf(stderr, "onnx_ref: cannot read %s\n", path);
    return 1;
  }
  /* the inputs first, then the forward pass, then the comparisons */
  for (int pass = 0; pass < 2; pass++) {
    rewind(mf);
    if (pass == 1) {
      float loss;
      if (kiln_net_forward(net, &loss)) return fail("forward");
    }
    while (fgets(line, sizeof line, mf)) {
      char kind[64], name[1024], file[1024];
      int off = 0;
      if (sscanf(line, "%63s %1023s %1023s%n", kind, name, file, &off) != 3) continue;
      const bool is_input = !strcmp(kind, "input");
      if (is_input != (pass == 0)) continue;
      kiln_blob *b = kiln_net_blob(net, name);
      if (!b) {
        fprintf(stderr, "onnx_ref: %s: no blob '%s'\n", model, name);
        return 1;
      }
      int64_t n = 1;
      long long d;
      int used;
      for (const char *p = line + off; sscanf(p, "%lld%n", &d, &used) == 1; p += used) n *= d;
      if (n != b->count) {
        fprintf(stderr, "onnx_ref: %s: '%s' has %lld values in %s, %lld in kiln\n", model, name,
                (long long)n, dir, (long long)b->count);
        return 1;
      }
      float *v = read_floats(dir, file, n);
      if (!v) return 1;
      if (is_input) {
        memcpy(b->data, v, sizeof(float) * (size_t)n);
      } else {
        double md = 0;
        for (int64_t j = 0; j < n; j++) {
          const double e = fabs((double)b->data[j] - (double)v[j]);
          if (!(e <= md)) md = e; /* a NaN shows as one */
        }
        printf("%s max|d| %.3g\n", name, md);
        if (!(md <= tol)) {
          fprintf(stderr, "onnx_ref: %s: '%s' differs by %.3g, more than %.3g\n", model, name, md, tol);
          free(v);
          return 1;
        }
      }
      free(v);
    }
  }
  fclose(mf);
  kiln_net_free(net);
  protobuf_c_message_free_unpacked(msg, NULL);
  return 0;
}

int main(int argc, char **argv) {
  if (argc >= 2 && !strcmp(argv[1], "--compare")) return compare(argc, argv);
  if (argc < 5) {
    fprintf(stderr, "usage: onnx_ref MODEL WEIGHTS_OUT DIR SEED [BLOB...]\n");
    return 2;
  }
  const char *model = argv[1], *weights = argv[2], *dir = argv[3];
  const uint64_t seed = strtoull(argv[4], NULL, 10);
  kiln_config cfg;
  if (kiln_config_from_env(&cfg)) return fail("configuration");
  cfg.plain_layouts = true;
  cfg.unfused = true; /* calibrate() reads each BatchNorm's input before it runs */
  ProtobufCMessage *msg;
  if (kiln_text_parse_file(model, &caffe__net_parameter__descriptor, &msg)) return fail(model);
  if (kiln_net_param_upgrade((Caffe__NetParameter *)msg, model, NULL)) return fail(model);
  kiln_net_options o = {.phase = CAFFE__PHASE__TEST, .seed = seed, .source = model,
                        .config = &cfg};
  kiln_net *net;
  if (kiln_net_create((Caffe__NetParameter *)msg, &o, &net)) return fail(model);
  kiln_rng r;
  kiln_rng_seed(&r, seed, 11);
  randomize(net, &r);
  int k = 0;
  for (int i = 0; i < net->nlayers; i++) {
    kiln_layer *l = net->layers[i];
    if (strcmp(l->ops->type, "Input")) continue;
    for (int t = 0; t < l->ntop; t++, k++) fill_input(net, l->top[t], &r);
  }
  if (calibrate(net, &r)) return fail("forward");
  if (kiln_net_save_weights(net, weights)) return fail(weights);
  char path[4096];
  snprintf(path, sizeof path, "%s/manifest.txt", dir);
  FILE *manifest = fopen(path, "w");
  if (!manifest) {
    fprintf(stderr, "onnx_ref: cannot write %s\n", path);
    return 1;
  }
  k = 0;
  for (int i = 0; i < net->nlayers; i++) {
    kiln_layer *l = net->layers[i];
    if (strcmp(l->ops->type, "Input")) continue;
    for (int t = 0; t < l->ntop; t++, k++)
      if (write_blob(manifest, dir, "input", k, l->top[t]->name, l->top[t])) return 1;
  }
  float loss;
  if (kiln_net_forward(net, &loss)) return fail("forward");
  k = 0;
  for (int o2 = 0; o2 < net->noutputs; o2++, k++)
    if (write_blob(manifest, dir, "blob", k, net->outputs[o2]->name, net->outputs[o2])) return 1;
  for (int a = 5; a < argc; a++, k++) {
    const kiln_blob *b = kiln_net_blob(net, argv[a]);
    if (!b) {
      fprintf(stderr, "onnx_ref: %s: no blob '%s'\n", model, argv[a]);
      return 1;
    }
    if (write_blob(manifest, dir, "inner", k, b->name, b)) return 1;
  }
  if (fclose(manifest)) return 1;
  kiln_net_free(net);
  protobuf_c_message_free_unpacked(msg, NULL);
  return 0;
}
