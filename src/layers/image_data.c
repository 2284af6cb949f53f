/* ImageData: batches of PNG and JPEG images named in a list file ("PATH LABEL" a line), with
 * Caffe's image_data_param (root_folder joined to each path as it is, new_height and new_width
 * to resize, is_color false for one gray channel). The stream, its shuffle per epoch from the
 * net's seed, the transform, the prefetch ring, the cursor and the workers' shares are the Data
 * layer's (data.c, data_layer.h): only the source differs, an image file decoded on the prefetch
 * thread in place of a database record.
 *
 * Where kiln differs from Caffe: Caffe shuffles the list with its own generator at setup and at
 * every epoch's end and skips rand_skip lines at random; kiln shuffles each epoch from (seed,
 * epoch), which needs no saved state to resume exactly, and ignores rand_skip, as its Data layer
 * does. A list line without a label, or with one that is not a whole number, is refused (Caffe
 * reads label 0 or stops reading the list there). image_data_param's old transformation fields
 * are moved into transform_param when a net file is read (src/proto/upgrade.c), as
 * data_param's are; a layer built from a message that still holds one refuses it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data_layer.h"

static const Caffe__ImageDataParameter image_defaults = CAFFE__IMAGE_DATA_PARAMETER__INIT;
static const Caffe__DataParameter data_defaults = CAFFE__DATA_PARAMETER__INIT;
static const Caffe__TransformationParameter transform_defaults =
    CAFFE__TRANSFORMATION_PARAMETER__INIT;

/* s->file = root_folder + the path of list entry i (Caffe's string concatenation). */
static int join_path(kiln_data_state *s, uint64_t i) {
  const size_t need = strlen(s->root) + strlen(s->list.path[i]) + 1;
  if (need > s->file_cap) {
    char *p = realloc(s->file, need);
    if (!p) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
    s->file = p;
    s->file_cap = need;
  }
  snprintf(s->file, need, "%s%s", s->root, s->list.path[i]);
  return KILN_OK;
}

static void name_image(const kiln_data_state *s, uint64_t index, char *buf, size_t n) {
  snprintf(buf, n, "%s:%d: image %s%s", s->source, s->list.line[index], s->root,
           s->list.path[index]);
}

/* List entry i, decoded; messages name the list's line. */
static int read_entry(kiln_data_state *s, uint64_t i, kiln_datum *d) {
  KILN_TRY(join_path(s, i));
  int rc = kiln_image_read(s->file, s->color, s->new_height, s->new_width, &s->image);
  if (rc) return kiln_error_context(rc, "%s:%d: ", s->source, s->list.line[i]);
  *d = (kiln_datum){.channels = s->image.channels,
                    .height = s->image.height,
                    .width = s->image.width,
                    .label = s->list.label[i],
                    .u8 = s->image.data};
  return KILN_OK;
}

static int read_image(kiln_data_state *s, uint64_t pos, kiln_datum *d, uint64_t *index) {
  KILN_TRY(kiln_record_order_index(&s->order, pos, index));
  return read_entry(s, *index, d);
}

static int image_data_setup(kiln_layer *l) {
  const Caffe__ImageDataParameter *p = KILN_PARAM_OR(l->lp->image_data_param, image_defaults);
  const Caffe__TransformationParameter *t =
      KILN_PARAM_OR(l->lp->transform_param, transform_defaults);
  kiln_data_state *s;
  KILN_TRY(kiln_data_layer_init(l, &s));
  if (!p->source || !p->source[0])
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID,
                            "image_data_param.source is required: the list of images, one "
                            "'PATH LABEL' a line");
  if (p->batch_size == 0)
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "image_data_param.batch_size must be > 0");
  const char *old = p->has_scale ? "scale" : p->mean_file ? "mean_file"
                    : p->has_crop_size ? "crop_size" : p->has_mirror ? "mirror" : NULL;
  if (old)
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID,
                            "image_data_param.%s is the old place of transform_param's field: set "
                            "it in transform_param",
                            old);
  if ((p->new_height > 0) != (p->new_width > 0))
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID,
                            "image_data_param: new_height %u and new_width %u: give both, or "
                            "neither",
                            p->new_height, p->new_width);
  if (p->new_height > KILN_IMAGE_MAX_SIDE || p->new_width > KILN_IMAGE_MAX_SIDE ||
      (uint64_t)p->new_height * p->new_width > KILN_IMAGE_MAX_PIXELS)
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID,
                            "image_data_param: new_height %u x new_width %u is past kiln's image "
                            "limits (%d a side, %llu pixels)",
                            p->new_height, p->new_width, KILN_IMAGE_MAX_SIDE,
                            (unsigned long long)KILN_IMAGE_MAX_PIXELS);
  s->batch = (int)p->batch_size;
  s->shuffle = p->shuffle;
  s->last_batch = KILN_LAST_BATCH_WRAP; /* Caffe's: a batch runs on into the next epoch */
  s->color = p->is_color ? KILN_IMAGE_COLOR : KILN_IMAGE_GRAY;
  s->new_height = (int)p->new_height;
  s->new_width = (int)p->new_width;
  s->read = read_image;
  s->name = name_image;
  char path[4096];
  KILN_TRY(kiln_data_source_path(l->config, p->source, path, sizeof path));
  if (!(s->source = strdup(path))) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  path[0] = '\0';
  if (p->root_folder && p->root_folder[0])
    KILN_TRY(kiln_data_source_path(l->config, p->root_folder, path, sizeof path));
  if (!(s->root = strdup(path))) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  int rc = kiln_image_list_read(s->source, &s->list);
  kiln_datum first;
  if (!rc) rc = read_entry(s, 0, &first); /* the shape of the top, as Caffe takes it */
  if (rc) return kiln_error_context(rc, "layer '%s' (ImageData): ", l->name);
  s->size = s->list.n;
  s->C = first.channels, s->H = first.height, s->W = first.width;
  /* Caffe reads the prefetch depth from data_param, for every prefetching layer */
  const Caffe__DataParameter *dp = KILN_PARAM_OR(l->lp->data_param, data_defaults);
  return kiln_data_layer_finish(l, s, t, dp->prefetch);
}

/* Image files read for the fingerprint, spread over the list. */
enum { FINGERPRINT_IMAGES = 64 };

/* The list (paths and labels) and the bytes of up to 64 of its image files, spread over it;
 * the mean file's values when there is one. */
static int image_data_fingerprint(kiln_layer *l, uint8_t digest[32], char *what, size_t n) {
  kiln_data_state *s = l->priv;
  if (s->ring.running)
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "fingerprint asked for after the first forward");
  kiln_sha256_ctx h;
  kiln_sha256_init(&h);
  const uint64_t size = s->list.n;
  kiln_sha256_update(&h, &size, sizeof size);
  for (size_t i = 0; i < s->list.n; i++) {
    kiln_sha256_update(&h, s->list.path[i], strlen(s->list.path[i]) + 1);
    kiln_sha256_update(&h, &s->list.label[i], sizeof s->list.label[i]);
  }
  const uint64_t k = size < FINGERPRINT_IMAGES ? size : FINGERPRINT_IMAGES;
  for (uint64_t j = 0; j < k; j++) {
    const uint64_t i = k > 1 ? j * (size - 1) / (k - 1) : 0;
    char *bytes = NULL;
    size_t len = 0;
    int rc = join_path(s, i);
    if (!rc) rc = kiln_read_file_max(s->file, (size_t)1 << 30, &bytes, &len);
    if (rc)
      return kiln_error_context(rc, "layer '%s' (ImageData): %s:%d: ", l->name, s->source,
                                s->list.line[i]);
    const uint64_t blen = len;
    kiln_sha256_update(&h, &blen, sizeof blen);
    kiln_sha256_update(&h, bytes, len);
    free(bytes);
  }
  if (s->mean) kiln_sha256_update(&h, s->mean, sizeof(float) * (size_t)s->C * s->H * s->W);
  kiln_sha256_final(&h, digest);
  snprintf(what, n, "%s (%llu images, compared by the list and %d of the image files spread over "
           "it%s)", s->source, (unsigned long long)size, (int)k,
           s->mean ? ", and the mean file's values" : "");
  return KILN_OK;
}

const kiln_layer_ops kiln_layer_image_data = {
    .type = "ImageData", .min_bottoms = 0, .max_bottoms = 0, .min_tops = 1, .max_tops = 2,
    .is_data = true, .setup = image_data_setup, .reshape = kiln_data_layer_reshape,
    .forward = kiln_data_layer_forward, .destroy = kiln_data_layer_destroy,
    .get_cursor = kiln_data_layer_get_cursor, .set_cursor = kiln_data_layer_set_cursor,
    .fingerprint = image_data_fingerprint, .kernels = KILN_NO_KERNELS,
};
