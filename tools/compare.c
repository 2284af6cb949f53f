/* kiln compare-weights A B [--rtol R] [--atol A] [--blob LAYER:K]: a hidden command for tests
 * and scripts. Loads two .caffemodel files, matches layers by name and blobs by index (only blob
 * K of layer LAYER with --blob), and checks every value:
 * |a - b| <= atol + rtol * max(|a|, |b|) (the defaults, 0 and 0, ask for equal values). Prints
 * the largest differences; exit 0 when every value is within tolerance, 1 when one is not or the
 * files hold different layers or shapes, 2 for a usage error. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tool.h"

static bool parse_tol(const char *s, double *out) {
  char *end;
  double v = strtod(s, &end);
  if (end == s || *end || !(v >= 0) || !isfinite(v)) return false;
  *out = v;
  return true;
}

static const Caffe__LayerParameter *find_layer(const Caffe__NetParameter *np, const char *name) {
  for (size_t i = 0; i < np->n_layer; i++)
    if (np->layer[i]->name && !strcmp(np->layer[i]->name, name)) return np->layer[i];
  return NULL;
}

static float blob_value(const Caffe__BlobProto *bp, size_t i) {
  return bp->n_data ? bp->data[i] : (float)bp->double_data[i];
}

static void usage_text(FILE *f) {
  fprintf(f, "usage: kiln compare-weights A.caffemodel B.caffemodel [--rtol R] [--atol A] "
             "[--blob LAYER:K]\n"
             "\n"
             "(for tests and scripts) Exit 0 when every value is within atol + rtol x max(|a|, |b|),\n"
             "1 when one is not or the files hold other layers or shapes.\n"
             "\n"
             "options:\n"
             "  --rtol R               relative tolerance (default 0)\n"
             "  --atol A               absolute tolerance (default 0)\n"
             "  --blob LAYER:K         compare only blob K of layer LAYER\n");
  tool_help_usage(f);
}

int cmd_compare_weights(int argc, char **argv) {
  const char *path[2] = {NULL, NULL};
  double rtol = 0, atol = 0;
  int npath = 0;
  char only_layer[256] = "";
  long only_blob = -1;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (tool_is_help(a)) tool_help(usage_text);
    if (!strcmp(a, "--rtol") || !strcmp(a, "--atol")) {
      if (i + 1 >= argc || !parse_tol(argv[i + 1], !strcmp(a, "--rtol") ? &rtol : &atol)) {
        fprintf(stderr, "kiln compare-weights: %s needs a number >= 0\n", a);
        return 2;
      }
      i++;
    } else if (!strcmp(a, "--blob")) {
      const char *v = i + 1 < argc ? argv[++i] : "";
      const char *colon = strrchr(v, ':');
      char *end = NULL;
      if (colon && colon > v && (size_t)(colon - v) < sizeof only_layer)
        only_blob = strtol(colon + 1, &end, 10);
      if (!colon || colon == v || !end || end == colon + 1 || *end || only_blob < 0) {
        fprintf(stderr, "kiln compare-weights: --blob needs LAYER:K (K >= 0), not '%s'\n", v);
        return 2;
      }
      memcpy(only_layer, v, (size_t)(colon - v));
      only_layer[colon - v] = '\0';
    } else if (a[0] != '-' && npath < 2) {
      if (!tool_nonempty("compare-weights", npath ? "B.caffemodel" : "A.caffemodel", a)) return 2;
      path[npath++] = a;
    } else if (a[0] != '-') {
      return tool_unexpected("compare-weights", a);
    } else {
      if (a[0] == '-') fprintf(stderr, "kiln compare-weights: unknown option '%s'\n", a);
      usage_text(stderr);
      return 2;
    }
  }
  if (npath != 2) {
    usage_text(stderr);
    return 2;
  }
  ProtobufCMessage *m[2] = {NULL, NULL};
  for (int k = 0; k < 2; k++)
    if ((kiln_h5_path(path[k])
             ? kiln_h5_read_net(path[k], (Caffe__NetParameter **)&m[k])
             : kiln_proto_read_binary(path[k], &caffe__net_parameter__descriptor, &m[k])) ||
        kiln_net_param_upgrade((Caffe__NetParameter *)m[k], path[k], NULL)) {
      if (k == 1 && m[1]) protobuf_c_message_free_unpacked(m[1], NULL);
      if (m[0]) protobuf_c_message_free_unpacked(m[0], NULL);
      return tool_fail("compare-weights");
    }
  const Caffe__NetParameter *A = (const Caffe__NetParameter *)m[0];
  const Caffe__NetParameter *B = (const Caffe__NetParameter *)m[1];
  int status = 0;
  size_t compared = 0, outside = 0;
  double max_abs = 0, max_rel = 0;
  char worst[512] = "";
  for (size_t i = 0; i < A->n_layer && status < 2; i++) {
    const Caffe__LayerParameter *la = A->layer[i];
    if (!la->n_blobs) continue;
    if (only_blob >= 0 && strcmp(la->name ? la->name : "", only_layer)) continue;
    const Caffe__LayerParameter *lb = find_layer(B, la->name ? la->name : "");
    if (!lb || lb->n_blobs != la->n_blobs) {
      printf("layer '%s': %zu blobs in %s, %zu in %s\n", la->name, la->n_blobs, path[0],
             lb ? lb->n_blobs : 0, path[1]);
      status = 2;
      break;
    }
    for (size_t b = 0; b < la->n_blobs; b++) {
      if (only_blob >= 0 && b != (size_t)only_blob) continue;
      const Caffe__BlobProto *ba = la->blobs[b], *bb = lb->blobs[b];
      size_t na = ba->n_data ? ba->n_data : ba->n_double_data;
      size_t nb = bb->n_data ? bb->n_data : bb->n_double_data;
      if (na != nb) {
        printf("layer '%s' blob %zu: %zu values in %s, %zu in %s\n", la->name, b, na, path[0], nb,
               path[1]);
        status = 2;
        break;
      }
      for (size_t k = 0; k < na; k++) {
        double x = blob_value(ba, k), y = blob_value(bb, k);
        double d = fabs(x - y), scale = fmax(fabs(x), fabs(y));
        bool ok = d <= atol + rtol * scale && !isnan(x) == !isnan(y);
        double rel = scale > 0 ? d / scale : 0;
        compared++;
        if (d > max_abs) max_abs = d;
        if (rel > max_rel) max_rel = rel;
        if (!ok && ++outside == 1)
          snprintf(worst, sizeof worst, "first outside: layer '%s' blob %zu [%zu]: %.9g vs %.9g",
                   la->name, b, k, x, y);
      }
    }
  }
  if (status < 2) {
    printf("%zu values compared, max |a-b| %.3g, max relative %.3g; %zu outside rtol %g atol %g\n",
           compared, max_abs, max_rel, outside, rtol, atol);
    if (outside) printf("%s\n", worst);
    if (compared == 0) printf("no parameter blobs to compare\n");
    status = outside || compared == 0;
  }
  protobuf_c_message_free_unpacked(m[0], NULL);
  protobuf_c_message_free_unpacked(m[1], NULL);
  return status ? 1 : 0;
}
