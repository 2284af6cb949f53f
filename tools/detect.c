/* kiln detect: what a detection net (the SSD fork's DetectionOutput) finds in image files.
 *
 * Each image is decoded (B, G, R planes), warped whole to the deploy net's input H x W as the
 * training net's TEST phase does (resize_param's WARP, bilinear unless told otherwise), has the
 * mean subtracted and is scaled, and goes through the net in batches of the Input's batch size
 * (the last one padded with zeros, whose rows are ignored). The DetectionOutput rows (item,
 * label, score, xmin, ymin, xmax, ymax; boxes normalised) of each image at or above the
 * threshold are printed in the original image's pixels, best first, as text or JSON Lines, and
 * with --draw drawn onto the image (src/data/image_draw.c) and written as a PNG.
 *
 * The mean, scale and interpolation come from the command line (--mean, --scale, --interp, as
 * the fork's ssd_detect takes mean values) or from the TEST-phase data layer's transform_param
 * of the training net (--transform-from), the command line winning. An image that cannot be
 * read is said on stderr (and in the JSON) and the rest are still processed; the exit code is
 * then 1. docs/detection.md. */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "kiln/data.h"
#include "kiln/device.h"
#include "tool.h"

typedef struct {
  tool_common c;
  const char *model, *weights, *labels, *draw, *transform_from;
  double threshold;
  float mean[3];
  int nmean;      /* 0: not given */
  float scale;
  bool has_scale;
  kiln_interp interp; /* 0: not given */
  bool json;
  const char **images;
  int nimages;
} detect_args;

static void usage(FILE *f) {
  fprintf(f,
          "usage: kiln detect --model DEPLOY.prototxt --weights W.caffemodel [options] IMAGE...\n"
          "\n"
          "Runs a detection net (the SSD fork's DetectionOutput) on PNG and JPEG images and prints\n"
          "each image's detections at or above the threshold, best first, one a line:\n"
          "  IMAGE  NAME (LABEL)  SCORE  XMIN YMIN XMAX YMAX\n"
          "in the image's own pixels (0 to its width and height), or 'IMAGE  no detections'.\n"
          "Each image is warped whole to the net's input size, as the TEST phase of training\n"
          "does, has the mean subtracted and is scaled: give the training net's values with\n"
          "--mean and --scale, or --transform-from (models/ssd: --transform-from\n"
          "models/ssd/ssd_train_test.prototxt, or --mean 127.5 --scale 0.0078125). An image\n"
          "that cannot be read is named on stderr and the others are still processed (exit 1).\n"
          "Images named after -- may start with -.\n"
          "\n"
          "options:\n"
          "  --model FILE           the deploy net: an Input of N x C x H x W (C 1 or 3) in,\n"
          "                         a DetectionOutput's rows out (required)\n"
          "  --weights FILE         its trained .caffemodel (without it: the fillers' weights,\n"
          "                         with a warning)\n"
          "  --labels FILE          a label map (labelmap.prototxt): names instead of numbers\n"
          "  --threshold T          the lowest score shown, 0 to 1 (default 0.5)\n"
          "  --mean M[,M,M]         subtracted from each channel (B,G,R), as the training net's\n"
          "                         transform_param mean_value (default 0)\n"
          "  --scale S              the pixels are multiplied by S after it (default 1)\n"
          "  --interp MODE          the resize: linear (default), area, nearest, cubic, lanczos4\n"
          "  --transform-from FILE  the training net (train_test.prototxt): the mean, scale and\n"
          "                         interpolation of its TEST-phase data layer's transform_param,\n"
          "                         and its label map (annotated_data_param.label_map_file) unless\n"
          "                         --labels is given; the options above win over it\n"
          "  --draw DIR             write DIR/NAME.png for each image NAME.EXT: the image with\n"
          "                         each detection shown boxed and labelled, a colour a class\n"
          "                         (DIR is created when missing; an input is never replaced)\n"
          "  --json                 one JSON object a line for each image instead: {\"image\",\n"
          "                         \"width\", \"height\", \"detections\": [{\"label\", \"name\",\n"
          "                         \"score\", \"box\": [xmin, ymin, xmax, ymax]}]}, or {\"image\",\n"
          "                         \"error\"} for one that could not be read\n");
  tool_common_usage(f, NULL);
  tool_help_usage(f);
}

static bool parse_float(const char *v, double *out) {
  char *end;
  errno = 0;
  const double d = strtod(v, &end);
  if (end == v || *end || errno == ERANGE || !isfinite(d)) return false;
  *out = d;
  return true;
}

static bool parse_interp(const char *v, kiln_interp *out) {
  static const kiln_interp modes[] = {KILN_INTERP_LINEAR, KILN_INTERP_AREA, KILN_INTERP_NEAREST,
                                      KILN_INTERP_CUBIC, KILN_INTERP_LANCZOS4};
  for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++)
    if (!strcasecmp(v, kiln_interp_name(modes[i]))) {
      *out = modes[i];
      return true;
    }
  return false;
}

/* "M" or "M,M,M": finite numbers, one or three. */
static bool parse_mean(const char *v, detect_args *a) {
  const char *p = v;
  a->nmean = 0;
  for (;;) {
    char *end;
    errno = 0;
    const double d = strtod(p, &end);
    if (end == p || errno == ERANGE || !isfinite(d) || a->nmean == 3) return false;
    a->mean[a->nmean++] = (float)d;
    if (*end == '\0') break;
    if (*end != ',') return false;
    p = end + 1;
  }
  return a->nmean == 1 || a->nmean == 3;
}

static int parse_detect_args(int argc, char **argv, detect_args *a) {
  static const char *const names[] = {"--model", "--weights", "--labels", "--threshold",
                                      "--mean", "--scale", "--interp", "--transform-from",
                                      "--draw", NULL};
  memset(a, 0, sizeof *a);
  a->threshold = 0.5;
  a->scale = 1;
  a->images = calloc((size_t)argc, sizeof *a->images);
  if (!a->images) {
    fprintf(stderr, "kiln detect: out of memory\n");
    return 1;
  }
  bool options = true;
  for (int i = 1; i < argc; i++) {
    const char *o = argv[i];
    if (options && !strcmp(o, "--")) {
      options = false;
      continue;
    }
    if (!options || o[0] != '-' || !o[1]) {
      if (!tool_nonempty("detect", "IMAGE", o)) return 2;
      a->images[a->nimages++] = o;
      continue;
    }
    if (tool_is_help(o)) tool_help(usage);
    const int r = tool_common_option(&a->c, argc, argv, &i);
    if (r < 0) return 2;
    if (r > 0) continue;
    if (!strcmp(o, "--json")) {
      a->json = true;
      continue;
    }
    bool known = false;
    for (const char *const *n = names; *n && !known; n++) known = !strcmp(*n, o);
    if (!known) {
      fprintf(stderr, "kiln detect: unknown option '%s' (see kiln detect --help)\n", o);
      return 2;
    }
    if (i + 1 >= argc) {
      fprintf(stderr, "kiln detect: %s needs a value\n", o);
      return 2;
    }
    const char *v = argv[++i];
    if (!tool_nonempty("detect", o, v)) return 2;
    double d;
    if (!strcmp(o, "--model")) a->model = v;
    else if (!strcmp(o, "--weights")) a->weights = v;
    else if (!strcmp(o, "--labels")) a->labels = v;
    else if (!strcmp(o, "--draw")) a->draw = v;
    else if (!strcmp(o, "--transform-from")) a->transform_from = v;
    else if (!strcmp(o, "--threshold")) {
      if (!parse_float(v, &d) || d < 0 || d > 1) {
        fprintf(stderr, "kiln detect: --threshold: '%s' is not a number from 0 to 1\n", v);
        return 2;
      }
      a->threshold = d;
    } else if (!strcmp(o, "--scale")) {
      if (!parse_float(v, &d) || !isfinite((float)d)) {
        fprintf(stderr, "kiln detect: --scale: '%s' is not a finite number\n", v);
        return 2;
      }
      a->scale = (float)d;
      a->has_scale = true;
    } else if (!strcmp(o, "--mean")) {
      if (!parse_mean(v, a)) {
        fprintf(stderr, "kiln detect: --mean: '%s' is not one number or three separated by "
                        "commas (B,G,R)\n", v);
        return 2;
      }
    } else if (!strcmp(o, "--interp")) {
      if (!parse_interp(v, &a->interp)) {
        fprintf(stderr, "kiln detect: --interp: '%s' is not linear, area, nearest, cubic or "
                        "lanczos4\n", v);
        return 2;
      }
    }
  }
  if (a->c.metrics) {
    fprintf(stderr, "kiln detect: --metrics: detect writes no events\n");
    return 2;
  }
  if (!a->model) {
    fprintf(stderr, "kiln detect: --model is required\n");
    return 2;
  }
  if (a->nimages == 0) {
    fprintf(stderr, "kiln detect: no IMAGE given (see kiln detect --help)\n");
    return 2;
  }
  return 0;
}

/* ---- --transform-from: the TEST phase's data transform of a training net -------------------- */

/* Whether layer lp runs in the TEST phase by its include and exclude rules' phases (levels and
 * stages aside: a training net selects its test data by phase). */
static bool in_test_phase(const Caffe__LayerParameter *lp) {
  for (size_t i = 0; i < lp->n_exclude; i++)
    if (lp->exclude[i]->has_phase && lp->exclude[i]->phase == CAFFE__PHASE__TEST) return false;
  if (lp->n_include == 0) return true;
  for (size_t i = 0; i < lp->n_include; i++)
    if (!lp->include[i]->has_phase || lp->include[i]->phase == CAFFE__PHASE__TEST) return true;
  return false;
}

/* What --transform-from gives: mean, scale and interpolation where the command line left them,
 * the label map's path (resolved; "" when none) and the resize's size (0 when none). */
typedef struct {
  char labelmap[4096];
  long long height, width;
  const char *layer;
} transform_info;

static int read_transform(detect_args *a, transform_info *t, Caffe__NetParameter **np_out) {
  ProtobufCMessage *msg = NULL;
  memset(t, 0, sizeof *t);
  KILN_TRY(kiln_text_parse_file(a->transform_from, &caffe__net_parameter__descriptor, &msg));
  Caffe__NetParameter *np = (Caffe__NetParameter *)msg;
  *np_out = np;
  KILN_TRY(kiln_net_param_upgrade(np, a->transform_from, NULL));
  const Caffe__LayerParameter *lp = NULL;
  for (size_t i = 0; i < np->n_layer && !lp; i++)
    if (np->layer[i]->transform_param && in_test_phase(np->layer[i])) lp = np->layer[i];
  if (!lp)
    return kiln_errorf(KILN_ERR_INVALID, "%s: no layer of the TEST phase has a transform_param "
                       "(--transform-from takes the training net whose test data layer says "
                       "how images are prepared)", a->transform_from);
  t->layer = lp->name ? lp->name : "?";
  const Caffe__TransformationParameter *tp = lp->transform_param;
  const char *what = a->transform_from;
  if (tp->mean_file && tp->mean_file[0])
    return kiln_errorf(KILN_ERR_UNSUPPORTED, "%s: layer '%s': transform_param.mean_file: kiln "
                       "detect subtracts a value per channel (mean_value; --mean)", what,
                       t->layer);
  if (tp->crop_size)
    return kiln_errorf(KILN_ERR_UNSUPPORTED, "%s: layer '%s': transform_param.crop_size %u: "
                       "kiln detect warps the whole image to the net's input (resize_param's "
                       "WARP)", what, t->layer, tp->crop_size);
  if (tp->n_mean_value != 0 && tp->n_mean_value != 1 && tp->n_mean_value != 3)
    return kiln_errorf(KILN_ERR_INVALID, "%s: layer '%s': transform_param has %zu mean_value: "
                       "expected 1 or 3", what, t->layer, tp->n_mean_value);
  if (a->nmean == 0 && tp->n_mean_value) {
    a->nmean = (int)tp->n_mean_value;
    for (int c = 0; c < a->nmean; c++) a->mean[c] = tp->mean_value[c];
  }
  if (!isfinite(tp->scale))
    return kiln_errorf(KILN_ERR_INVALID, "%s: layer '%s': transform_param.scale %g is not finite",
                       what, t->layer, (double)tp->scale);
  if (!a->has_scale) a->scale = tp->scale;
  const Caffe__ResizeParameter *r = tp->resize_param;
  if (r) {
    if (r->resize_mode != CAFFE__RESIZE_PARAMETER__RESIZE_MODE__WARP)
      return kiln_errorf(KILN_ERR_UNSUPPORTED, "%s: layer '%s': resize_param.resize_mode %d: "
                         "kiln detect warps the whole image (WARP)", what, t->layer,
                         (int)r->resize_mode);
    t->height = r->height;
    t->width = r->width;
    /* the test phase draws one of several modes at random: the first, for repeatable output */
    if (!a->interp && r->n_interp_mode) a->interp = (kiln_interp)r->interp_mode[0];
  }
  const Caffe__AnnotatedDataParameter *ap = lp->annotated_data_param;
  if (!a->labels && ap && ap->label_map_file && ap->label_map_file[0]) {
    kiln_config cfg;
    KILN_TRY(kiln_config_from_env(&cfg));
    KILN_TRY(kiln_data_source_path(&cfg, ap->label_map_file, t->labelmap, sizeof t->labelmap));
  }
  return KILN_OK;
}

/* ---- the net: its input and its DetectionOutput -------------------------------------------- */

typedef struct {
  kiln_blob *input, *rows;
  int N, C, H, W;
} det_net;

static int find_net_io(const kiln_net *net, const char *model, det_net *d) {
  memset(d, 0, sizeof *d);
  int ninputs = 0;
  for (int i = 0; i < net->nlayers; i++) {
    const kiln_layer *l = net->layers[i];
    if (!l->ops->fed_by_caller) continue;
    for (int t = 0; t < l->ntop; t++, ninputs++)
      if (!d->input) d->input = l->top[t];
  }
  if (ninputs != 1)
    return kiln_errorf(KILN_ERR_INVALID, "%s: a detection net takes one input (an Input layer "
                       "of N x C x H x W images); this one has %d", model, ninputs);
  const kiln_blob *in = d->input;
  if (in->naxes != 4 || (in->shape[1] != 1 && in->shape[1] != 3) || in->shape[0] < 1 ||
      in->shape[2] < 1 || in->shape[3] < 1 || in->shape[0] > 4096 ||
      in->shape[2] > KILN_IMAGE_MAX_SIDE || in->shape[3] > KILN_IMAGE_MAX_SIDE)
    return kiln_errorf(KILN_ERR_INVALID, "%s: input '%s' is not N x C x H x W images of 1 or 3 "
                       "channels", model, in->name);
  d->N = (int)in->shape[0], d->C = (int)in->shape[1];
  d->H = (int)in->shape[2], d->W = (int)in->shape[3];
  for (int i = 0; i < net->nlayers && !d->rows; i++) {
    const kiln_layer *l = net->layers[i];
    if (strcmp(l->ops->type, "DetectionOutput") || l->ntop != 1) continue;
    for (int o = 0; o < net->noutputs; o++)
      if (net->outputs[o] == l->top[0]) d->rows = l->top[0];
  }
  if (d->rows && d->rows->naxes >= 1 && d->rows->shape[d->rows->naxes - 1] == 7) return KILN_OK;
  /* name what the net puts out instead */
  kiln_strbuf s = {0};
  for (int o = 0; o < net->noutputs; o++) {
    const kiln_blob *b = net->outputs[o];
    kiln_strbuf_printf(&s, "%s'%s' (", o ? ", " : "", b->name);
    for (int k = 0; k < b->naxes; k++)
      kiln_strbuf_printf(&s, "%s%lld", k ? " x " : "", (long long)b->shape[k]);
    kiln_strbuf_printf(&s, ")");
  }
  const int rc = kiln_errorf(KILN_ERR_INVALID, "%s: no output of the net is a DetectionOutput "
                             "layer's rows of 7 (item, label, score, xmin, ymin, xmax, ymax): "
                             "not a detection net? Its outputs: %s", model,
                             s.s && !s.failed ? s.s : "none");
  free(s.s);
  return rc;
}

/* ---- one image's detections ---------------------------------------------------------------- */

typedef struct {
  int label;
  float score, box[4]; /* pixels */
  int order;
} detection;

static int by_score(const void *x, const void *y) {
  const detection *a = x, *b = y;
  if (a->score != b->score) return a->score > b->score ? -1 : 1;
  return a->order - b->order;
}

/* Label `label`'s name from the map, or NULL. */
static const char *label_name(const kiln_labelmap *map, int label) {
  if (!map) return NULL;
  const int i = kiln_labelmap_find_label(map, label);
  if (i < 0) return NULL;
  return map->display_name[i][0] ? map->display_name[i] : map->name[i];
}

static void json_string(const char *s) {
  putchar('"');
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    if (*p == '"' || *p == '\\') printf("\\%c", *p);
    else if (*p == '\n') printf("\\n");
    else if (*p == '\t') printf("\\t");
    else if (*p < 0x20 || *p == 0x7f) printf("\\u%04x", *p);
    else putchar(*p);
  }
  putchar('"');
}

static void print_image(const detect_args *a, const kiln_labelmap *map, const char *image,
                        int width, int height, const detection *d, int n) {
  if (a->json) {
    printf("{\"image\": ");
    json_string(image);
    printf(", \"width\": %d, \"height\": %d, \"detections\": [", width, height);
    for (int i = 0; i < n; i++) {
      const char *name = label_name(map, d[i].label);
      printf("%s{\"label\": %d, \"name\": ", i ? ", " : "", d[i].label);
      if (name) json_string(name);
      else printf("null");
      printf(", \"score\": %.4f, \"box\": [%.1f, %.1f, %.1f, %.1f]}", d[i].score, d[i].box[0],
             d[i].box[1], d[i].box[2], d[i].box[3]);
    }
    printf("]}\n");
    return;
  }
  if (n == 0) printf("%s  no detections\n", image);
  for (int i = 0; i < n; i++) {
    const char *name = label_name(map, d[i].label);
    printf("%s  ", image);
    if (name) printf("%s (%d)", name, d[i].label);
    else printf("%d", d[i].label);
    printf("  %.4f  %.1f %.1f %.1f %.1f\n", d[i].score, d[i].box[0], d[i].box[1], d[i].box[2],
           d[i].box[3]);
  }
}

static void print_error(const detect_args *a, const char *image, const char *message) {
  fflush(stdout); /* in order with what came before, where both go to one file */
  fprintf(stderr, "kiln detect: %s\n", message);
  if (!a->json) return;
  printf("{\"image\": ");
  json_string(image);
  printf(", \"error\": ");
  json_string(message);
  printf("}\n");
}

/* ---- --draw --------------------------------------------------------------------------------- */

/* DIR/NAME.png for image path .../NAME.EXT (a name without an extension keeps it whole). */
static char *draw_path(const char *dir, const char *image) {
  const char *base = strrchr(image, '/');
  base = base ? base + 1 : image;
  const char *dot = strrchr(base, '.');
  const size_t len = dot && dot != base ? (size_t)(dot - base) : strlen(base);
  kiln_strbuf s = {0};
  kiln_strbuf_printf(&s, "%s%s%.*s.png", dir, dir[strlen(dir) - 1] == '/' ? "" : "/", (int)len,
                     base);
  if (s.failed) {
    free(s.s);
    return NULL;
  }
  return s.s;
}

typedef struct {
  dev_t dev;
  ino_t ino;
  int index;
} file_id;

static int by_file_id(const void *x, const void *y) {
  const file_id *a = x, *b = y;
  if (a->dev != b->dev) return a->dev < b->dev ? -1 : 1;
  return a->ino < b->ino ? -1 : a->ino > b->ino;
}

typedef struct {
  const char *path;
  int index;
} named;

static int by_name(const void *x, const void *y) {
  const named *a = x, *b = y;
  const int c = strcmp(a->path, b->path);
  return c ? c : a->index - b->index;
}

/* Every picture's path, checked before anything runs: two images of one name, an output that
 * is one of the images (by any name: a link, another spelling) or another input, or that is no
 * file to write over (kiln_check_output). */
static int check_draw(const detect_args *a, const char *labels, char **paths) {
  struct stat st;
  if (stat(a->draw, &st) == 0 && !S_ISDIR(st.st_mode))
    return kiln_errorf(KILN_ERR_INVALID, "--draw %s: exists and is not a folder", a->draw);
  file_id *ids = calloc((size_t)a->nimages, sizeof *ids);
  named *names = calloc((size_t)a->nimages, sizeof *names);
  int nids = 0, rc = KILN_OK;
  if (!ids || !names) rc = kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  for (int i = 0; !rc && i < a->nimages; i++) {
    names[i] = (named){paths[i], i};
    if (stat(a->images[i], &st) == 0) ids[nids++] = (file_id){st.st_dev, st.st_ino, i};
  }
  if (!rc) {
    qsort(ids, (size_t)nids, sizeof *ids, by_file_id);
    qsort(names, (size_t)a->nimages, sizeof *names, by_name);
  }
  for (int i = 1; !rc && i < a->nimages; i++)
    if (!strcmp(names[i].path, names[i - 1].path))
      rc = kiln_errorf(KILN_ERR_INVALID, "--draw: %s and %s would both be drawn to %s",
                       a->images[names[i - 1].index], a->images[names[i].index], names[i].path);
  const char *const fixed[] = {a->model, a->weights, labels, a->transform_from};
  for (int i = 0; !rc && i < a->nimages; i++) {
    rc = kiln_check_output(paths[i], KILN_OUTPUT_RENAMED, fixed, 4);
    if (rc || stat(paths[i], &st) != 0) continue;
    const file_id key = {st.st_dev, st.st_ino, -1};
    const file_id *hit = bsearch(&key, ids, (size_t)nids, sizeof *ids, by_file_id);
    if (hit)
      rc = kiln_errorf(KILN_ERR_INVALID, "--draw: %s is the image %s: an input is never "
                       "replaced", paths[i], a->images[hit->index]);
  }
  free(ids);
  free(names);
  return rc;
}

/* The image as read for the net, read again in colour, its detections drawn, written to `path`
 * through a temporary name. The font grows with the image: one pixel a font pixel up to 599
 * pixels on its shorter side, two up to 999, and so on. */
static int draw_image(const char *image, int width, int height, const detection *d, int n,
                      const kiln_labelmap *map, const char *path, kiln_image *img) {
  KILN_TRY(kiln_image_read(image, KILN_IMAGE_COLOR, 0, 0, img));
  if (img->width != width || img->height != height)
    return kiln_errorf(KILN_ERR_IO, "%s: changed while it was being read", image);
  const int side = width < height ? width : height;
  const int scale = 1 + (side >= 600 ? (side - 200) / 400 : 0);
  /* every box, then every label over them; the best drawn last, on top */
  for (int pass = 0; pass < 2; pass++)
    for (int i = n - 1; i >= 0; i--) {
      /* pixel edges to the pixels they cover */
      const int x0 = (int)floorf(d[i].box[0]), y0 = (int)floorf(d[i].box[1]);
      int x1 = (int)ceilf(d[i].box[2]) - 1, y1 = (int)ceilf(d[i].box[3]) - 1;
      if (x1 < x0) x1 = x0;
      if (y1 < y0) y1 = y0;
      const kiln_color c = kiln_class_color(d[i].label);
      if (pass == 0) {
        KILN_TRY(kiln_image_draw_rect(img, x0, y0, x1, y1, 2, c));
        continue;
      }
      char text[160];
      const char *name = label_name(map, d[i].label);
      if (name) snprintf(text, sizeof text, "%.120s %.2f", name, d[i].score);
      else snprintf(text, sizeof text, "%d %.2f", d[i].label, d[i].score);
      KILN_TRY(kiln_image_draw_label(img, x0, y0, text, c, scale));
    }
  uint8_t *png = NULL;
  size_t len = 0;
  int rc = kiln_image_encode_png(img->data, img->channels, img->height, img->width, &png, &len);
  if (!rc) rc = kiln_write_file_atomic(path, png, len);
  free(png);
  return rc;
}

/* ---- the run -------------------------------------------------------------------------------- */

typedef struct {
  const detect_args *a;
  const kiln_labelmap *map;
  kiln_net *net;
  det_net io;
  char **paths;        /* --draw's, or NULL */
  float *batch;        /* N x C x H x W */
  uint8_t *warped;     /* C x H x W */
  float *rows;
  int64_t rows_cap;
  detection *dets;
  int dets_cap;
  kiln_image img;
  kiln_warp_work warp;
  int *width, *height; /* each slot's image size; 0: not read */
  char **error;        /* each slot's, said in order after the batch */
  int failed;
} run_state;

/* Image i into slot j of the batch; on failure 0 width and the message kept. */
static void prepare(run_state *s, int i, int j) {
  const det_net *io = &s->io;
  const detect_args *a = s->a;
  const size_t per = (size_t)io->C * io->H * io->W, plane = (size_t)io->H * io->W;
  float *out = s->batch + (size_t)j * per;
  s->width[j] = s->height[j] = 0;
  int rc = kiln_image_read(a->images[i], io->C == 1 ? KILN_IMAGE_GRAY : KILN_IMAGE_COLOR, 0, 0,
                           &s->img);
  if (!rc)
    rc = kiln_image_warp(s->img.data, io->C, s->img.height, s->img.width, s->warped, io->H, io->W,
                         a->interp ? a->interp : KILN_INTERP_LINEAR, &s->warp);
  if (rc) {
    s->error[j] = strdup(kiln_last_error());
    s->failed++;
    memset(out, 0, per * sizeof(float));
    return;
  }
  for (int c = 0; c < io->C; c++) {
    const float m = a->nmean == 0 ? 0 : a->mean[a->nmean == 1 ? 0 : c];
    const uint8_t *p = s->warped + (size_t)c * plane;
    float *o = out + (size_t)c * plane;
    for (size_t k = 0; k < plane; k++) o[k] = ((float)p[k] - m) * a->scale;
  }
  s->width[j] = s->img.width;
  s->height[j] = s->img.height;
}

/* Slot j's rows at or above the threshold, in pixels, best first, into s->dets; the count. */
static int collect(run_state *s, int64_t nrows, int j) {
  const float w = (float)s->width[j], h = (float)s->height[j];
  int n = 0;
  for (int64_t r = 0; r < nrows; r++) {
    const float *v = s->rows + 7 * r;
    /* the fork's "nothing found" rows have label -1 */
    if (v[0] != (float)j || !(v[1] >= 0 && v[1] <= 1e9f) || !(v[2] >= s->a->threshold)) continue;
    detection *d = &s->dets[n];
    d->label = (int)v[1];
    d->score = v[2];
    d->order = n;
    for (int k = 0; k < 4; k++) {
      const float x = v[3 + k] > 0 ? (v[3 + k] < 1 ? v[3 + k] : 1) : 0; /* NaN and -0 to 0 */
      d->box[k] = x * (k % 2 ? h : w);
    }
    n++;
  }
  qsort(s->dets, (size_t)n, sizeof *s->dets, by_score);
  return n;
}

/* What slot j's image could not be read for, said; true when there was something. */
static bool said_error(run_state *s, int j, const char *image) {
  if (s->width[j]) return false;
  print_error(s->a, image, s->error[j] ? s->error[j] : "out of memory");
  free(s->error[j]);
  s->error[j] = NULL;
  return true;
}

/* One batch: images first .. first + count - 1, each said in order. KILN_OK, or the net's
 * failure. */
static int run_batch(run_state *s, int first, int count) {
  const det_net *io = &s->io;
  const detect_args *a = s->a;
  int ok = 0;
  for (int j = 0; j < io->N; j++) {
    if (j < count) prepare(s, first + j, j);
    else {
      s->width[j] = 0;
      memset(s->batch + (size_t)j * io->C * io->H * io->W, 0,
             sizeof(float) * (size_t)io->C * io->H * io->W);
    }
    ok += s->width[j] > 0;
  }
  if (!ok) {
    for (int j = 0; j < count; j++) said_error(s, j, a->images[first + j]);
    return KILN_OK;
  }
  KILN_TRY(kiln_device_to_device(io->input->device, io->input->data, s->batch,
                                 sizeof(float) * (size_t)io->input->count));
  KILN_TRY(kiln_net_forward(s->net, NULL));
  const kiln_blob *rb = io->rows;
  const int64_t nrows = rb->count / 7;
  if (nrows > s->rows_cap) {
    float *r = realloc(s->rows, sizeof(float) * 7 * (size_t)nrows);
    detection *d = realloc(s->dets, sizeof(detection) * (size_t)nrows);
    if (r) s->rows = r;
    if (d) s->dets = d;
    if (!r || !d) return kiln_errorf(KILN_ERR_NOMEM, "out of memory for %lld rows",
                                     (long long)nrows);
    s->rows_cap = nrows;
  }
  KILN_TRY(kiln_net_blob_read(s->net, rb, s->rows, 7 * nrows));
  for (int j = 0; j < count; j++) {
    const int i = first + j;
    if (said_error(s, j, a->images[i])) continue;
    const int n = collect(s, nrows, j);
    print_image(a, s->map, a->images[i], s->width[j], s->height[j], s->dets, n);
    if (!s->paths) continue;
    const int rc = draw_image(a->images[i], s->width[j], s->height[j], s->dets, n, s->map,
                              s->paths[i], &s->img);
    if (rc) {
      print_error(a, a->images[i], kiln_last_error());
      s->failed++;
    }
  }
  return KILN_OK;
}

int cmd_detect(int argc, char **argv) {
  detect_args a;
  int code = parse_detect_args(argc, argv, &a);
  if (code) {
    free(a.images);
    return code;
  }
  Caffe__NetParameter *tnp = NULL;
  transform_info t;
  memset(&t, 0, sizeof t);
  kiln_labelmap map = {0};
  bool have_map = false;
  ProtobufCMessage *msg = NULL;
  run_state s = {.a = &a};
  char **paths = NULL;
  const bool mean_given = a.nmean > 0;
  if (a.transform_from && read_transform(&a, &t, &tnp)) {
    code = tool_fail("detect: --transform-from");
    goto done;
  }
  const char *labels = a.labels ? a.labels : t.labelmap[0] ? t.labelmap : NULL;
  char label_path[4096] = "";
  if (labels) {
    kiln_config cfg;
    if (kiln_config_from_env(&cfg) ||
        kiln_data_source_path(&cfg, labels, label_path, sizeof label_path) ||
        kiln_labelmap_read(label_path, &map)) {
      if (!a.labels)
        kiln_error_context(1, "the label map of layer '%s' of %s (--labels to give another): ",
                           t.layer, a.transform_from);
      code = tool_fail(a.labels ? "detect: --labels" : "detect: --transform-from");
      goto done;
    }
    have_map = true;
  }
  s.map = have_map ? &map : NULL;
  if (a.draw) {
    paths = calloc((size_t)a.nimages, sizeof *paths);
    for (int i = 0; paths && i < a.nimages; i++)
      if (!(paths[i] = draw_path(a.draw, a.images[i]))) break;
    if (!paths || !paths[a.nimages - 1]) {
      fprintf(stderr, "kiln detect: out of memory\n");
      code = 1;
      goto done;
    }
    if (check_draw(&a, label_path[0] ? label_path : NULL, paths)) {
      code = tool_fail("detect");
      goto done;
    }
  }
  if (!a.weights)
    fprintf(stderr, "kiln detect: no --weights given: detecting with the fillers' weights\n");
  if (!a.transform_from && !a.nmean && !a.has_scale)
    fprintf(stderr, "kiln detect: no --mean, --scale or --transform-from: the pixels go in as "
                    "they are, 0 to 255\n");
  if (tool_load_net(a.model, CAFFE__PHASE__TEST, NULL, 0, a.c.max_memory, true, &s.net, &msg) ||
      (a.weights && kiln_net_load_weights(s.net, a.weights)) ||
      find_net_io(s.net, a.model, &s.io)) {
    code = tool_fail("detect");
    goto done;
  }
  const det_net *io = &s.io;
  if (a.nmean == 3 && io->C != 3) {
    fprintf(stderr, "kiln detect: %s: three mean values (B,G,R) for the %d channel of %s's "
                    "input\n", a.transform_from && !mean_given ? "--transform-from" : "--mean",
            io->C, a.model);
    code = 2;
    goto done;
  }
  if (t.height && t.width && (t.height != io->H || t.width != io->W)) {
    fprintf(stderr, "kiln detect: --transform-from: layer '%s' of %s resizes to %lld x %lld "
                    "(height x width), the input of %s is %d x %d: not the same net?\n", t.layer,
            a.transform_from, t.height, t.width, a.model, io->H, io->W);
    code = 2;
    goto done;
  }
  if (a.draw && kiln_mkdir_p(a.draw)) {
    code = tool_fail("detect: --draw");
    goto done;
  }
  s.paths = paths;
  s.batch = malloc(sizeof(float) * (size_t)io->input->count);
  s.warped = malloc((size_t)io->C * io->H * io->W);
  s.width = calloc((size_t)io->N, sizeof(int));
  s.height = calloc((size_t)io->N, sizeof(int));
  s.error = calloc((size_t)io->N, sizeof(char *));
  if (!s.batch || !s.warped || !s.width || !s.height || !s.error) {
    fprintf(stderr, "kiln detect: out of memory\n");
    code = 1;
    goto done;
  }
  for (int first = 0; first < a.nimages; first += io->N) {
    const int count = a.nimages - first < io->N ? a.nimages - first : io->N;
    if (run_batch(&s, first, count)) {
      code = tool_fail("detect");
      goto done;
    }
    if (fflush(stdout) != 0) {
      fprintf(stderr, "kiln detect: writing the output: %s\n", strerror(errno));
      code = 1;
      goto done;
    }
  }
  if (s.failed) {
    fprintf(stderr, "kiln detect: %d of %d image%s not processed in full\n", s.failed,
            a.nimages, a.nimages == 1 ? "" : "s");
    code = 1;
  }
done:
  tool_free_net(s.net, msg);
  if (tnp) protobuf_c_message_free_unpacked(&tnp->base, NULL);
  if (have_map) kiln_labelmap_free(&map);
  for (int i = 0; paths && i < a.nimages; i++) free(paths[i]);
  free(paths);
  free(s.batch);
  free(s.warped);
  free(s.rows);
  free(s.dets);
  free(s.width);
  free(s.height);
  for (int j = 0; s.error && j < s.io.N; j++) free(s.error[j]);
  free(s.error);
  kiln_image_free(&s.img);
  kiln_warp_work_free(&s.warp);
  free(a.images);
  return code;
}
