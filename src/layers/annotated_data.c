/* AnnotatedData: the SSD fork's data layer. Batches of AnnotatedDatum records (kiln convert
 * annoset, the fork's create_annoset) from one LMDB or LevelDB, each image augmented with its
 * boxes by include/kiln/anno.h's chain, then mean-subtracted and scaled into the data top; the
 * boxes that survive go into the label top, 1 x 1 x G x 8, one row (item, group_label,
 * instance_id, xmin, ymin, xmax, ymax, difficult) per box of the batch, items in order and each
 * item's boxes in its record's order (a batch with no box at all: one row of -1).
 *
 * TRAIN runs the whole chain (distort_param, expand_param, the batch samplers' crop,
 * resize_param, crop_size's random window, the emit constraint, mirror); TEST the resize and
 * crop_size's centre window alone (the fork's test nets set no other step; their empty
 * `batch_sampler {}` would keep the whole image anyway). The output is of one size for the
 * whole net: resize_param's height x width (WARP, FIT_LARGE_SIZE_AND_PAD), crop_size's, or the
 * images' own when neither is given (every record then of the first one's size); an output
 * whose size varies from image to image (FIT_SMALL_SIZE without crop_size, or an expansion or
 * a sampler's crop without a resize) takes batches of one image, the data top reshaped to each.
 *
 * The stream, the cursor and the workers' shares are Data's: position p of the endless stream
 * is a record in key order (or, with kiln's shuffle, through a permutation per epoch from the
 * seed); every draw of record p's augmentation comes from a generator seeded with (the layer's
 * seed, p), so a batch is a function of the seed and its position, whatever the thread's timing;
 * a cursor resumes exactly, and data-parallel workers deal whole global batches round-robin
 * (batch_ring.h). Batches are made on the ring's thread, the label rows into each slot's side
 * buffer, which grows to the largest batch seen. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "batch_ring.h"
#include "kiln/anno.h"
#include "kiln/data.h"
#include "kiln/sha256.h"

static const Caffe__DataParameter data_defaults = CAFFE__DATA_PARAMETER__INIT;
static const Caffe__TransformationParameter transform_defaults =
    CAFFE__TRANSFORMATION_PARAMETER__INIT;
static const Caffe__AnnotatedDataParameter anno_defaults = CAFFE__ANNOTATED_DATA_PARAMETER__INIT;

/* A label row's values, and the side buffers of a ring slot: the rows, and the image of a batch
 * whose size varies. */
enum { ROW = 8, SIDE_ROWS = 0, SIDE_IMAGE = 1 };

typedef struct {
  kiln_datum_db *db;
  char *source; /* the database's path, $KILN_DATA expanded */
  uint64_t size;
  kiln_labelmap map;
  char *map_path; /* NULL: no label map */
  /* the chain's parameters in this phase: a shallow copy of transform_param (TEST: without
   * distort_param, expand_param and mirror) and the samplers (TEST: none) */
  Caffe__TransformationParameter tp;
  Caffe__BatchSampler *const *samplers;
  size_t nsamplers;
  bool train, labels;
  int batch, C, H, W; /* the first record's channels and size */
  int outH, outW;     /* the output's size; with `varying`, the size planned at first */
  bool varying;       /* of each image's own size (batches of one) */
  float mean[3], scale;
  bool shuffle;
  int last_batch;
  int64_t plan_rows; /* the label top's rows at reshape */
  uint64_t seed;
  kiln_batch_stream stream;
  kiln_record_order order;
  /* on the ring's thread */
  kiln_image img;
  kiln_anno_boxes boxes;
  kiln_anno_work work;
  kiln_batch_ring ring;
} anno_state;

/* "record 12 (00000012_x.jpg) of /data/trainval_lmdb": the record just read. */
static void record_name(const anno_state *s, uint64_t index, char *buf, size_t n) {
  snprintf(buf, n, "record %llu (%s) of %s", (unsigned long long)index,
           kiln_datum_db_last_key(s->db), s->source);
}

/* The record at stream position pos. A worker of several, or a shuffled stream, reads at
 * random; otherwise the sequential cursor walks on. */
static int read_record(anno_state *s, uint64_t pos, kiln_annotated_datum *a, uint64_t *index) {
  KILN_TRY(kiln_record_order_index(&s->order, pos, index));
  if (s->shuffle || s->ring.nworkers > 1) return kiln_datum_db_read_annotated(s->db, *index, a);
  if (kiln_datum_db_position(s->db) != pos) KILN_TRY(kiln_datum_db_seek(s->db, pos));
  return kiln_datum_db_next_annotated(s->db, a);
}

/* The record's image and boxes into s->img and s->boxes, checked: bytes (not float_data), the
 * first record's channels, and each box's label in the label map. */
static int take_record(anno_state *s, const kiln_annotated_datum *a, uint64_t index) {
  const kiln_datum *d = &a->datum;
  char name[600];
  if (!d->u8) {
    record_name(s, index, name, sizeof name);
    return kiln_errorf(KILN_ERR_DATA, "%s holds float_data; detection images are bytes (raw or "
                       "encoded), as kiln convert annoset writes them", name);
  }
  if (d->channels != s->C) {
    record_name(s, index, name, sizeof name);
    return kiln_errorf(KILN_ERR_DATA, "%s has %d channel%s, the first record %d (give "
                       "transform_param.force_color or force_gray)", name, d->channels,
                       d->channels == 1 ? "" : "s", s->C);
  }
  const size_t n = (size_t)d->channels * d->height * d->width;
  if (s->img.cap < n) {
    uint8_t *p = realloc(s->img.data, n);
    if (!p) return kiln_errorf(KILN_ERR_NOMEM, "out of memory for a %dx%d image", d->width,
                               d->height);
    s->img.data = p;
    s->img.cap = n;
  }
  memcpy(s->img.data, d->u8, n);
  s->img.channels = d->channels;
  s->img.height = d->height;
  s->img.width = d->width;
  s->boxes.n = 0;
  for (size_t i = 0; i < a->n_box; i++) {
    if (s->map_path && kiln_labelmap_find_label(&s->map, a->box[i].label) < 0) {
      record_name(s, index, name, sizeof name);
      return kiln_errorf(KILN_ERR_DATA, "%s: box %zu has label %d, which the label map %s does "
                         "not have", name, i, a->box[i].label, s->map_path);
    }
    KILN_TRY(kiln_anno_boxes_add(&s->boxes, &a->box[i]));
  }
  return KILN_OK;
}

/* (pixel - mean[c]) * scale of s->img into out (C x h x w floats), Data's transform. */
static void to_floats(const anno_state *s, float *out) {
  const size_t plane = (size_t)s->img.height * s->img.width;
  for (int c = 0; c < s->C; c++) {
    const uint8_t *p = s->img.data + (size_t)c * plane;
    float *o = out + (size_t)c * plane;
    for (size_t i = 0; i < plane; i++) o[i] = ((float)p[i] - s->mean[c]) * s->scale;
  }
}

/* Global batch `global` of the stream into a slot, on the ring's thread: each record augmented
 * from its own generator, its pixels into the slot's data (or, when sizes vary, its image side
 * buffer) and its boxes' rows into the rows side buffer. */
static int fill_slot(void *owner, kiln_ring_slot *slot, uint64_t global) {
  anno_state *s = owner;
  const uint64_t start = kiln_batch_stream_start(&s->stream, global, &slot->count);
  const int64_t per = (int64_t)s->C * s->outH * s->outW;
  int64_t rows = 0;
  for (int j = 0; j < slot->count; j++) {
    const uint64_t pos = start + (uint64_t)j;
    uint64_t index = 0;
    kiln_annotated_datum a;
    KILN_TRY(read_record(s, pos, &a, &index));
    KILN_TRY(take_record(s, &a, index));
    kiln_rng rng;
    kiln_rng_seed(&rng, s->seed, pos + 1);
    char name[600];
    int rc = kiln_anno_augment(&s->img, &s->boxes, &s->tp, s->samplers, s->nsamplers, s->train,
                               &rng, &s->work, NULL);
    if (rc) {
      record_name(s, index, name, sizeof name);
      return kiln_error_context(rc, "%s: ", name);
    }
    float *out;
    if (s->varying) {
      KILN_TRY(kiln_ring_slot_side(slot, SIDE_IMAGE,
                                   (int64_t)s->C * s->img.height * s->img.width));
      slot->dims[0] = s->img.height;
      slot->dims[1] = s->img.width;
      slot->side_n[SIDE_IMAGE] = (int64_t)s->C * s->img.height * s->img.width;
      out = slot->side[SIDE_IMAGE];
    } else if (s->img.height != s->outH || s->img.width != s->outW) {
      record_name(s, index, name, sizeof name);
      return kiln_errorf(KILN_ERR_DATA, "%s is %dx%d (width x height), the first record %dx%d: "
                         "without transform_param.resize_param or crop_size every image must "
                         "be of one size", name, s->img.width, s->img.height, s->outW, s->outH);
    } else {
      out = slot->top[0] + (size_t)j * (size_t)per;
    }
    to_floats(s, out);
    if (!s->labels) continue;
    KILN_TRY(kiln_ring_slot_side(slot, SIDE_ROWS, (rows + s->boxes.n) * ROW));
    float *row = slot->side[SIDE_ROWS] + rows * ROW;
    for (int b = 0; b < s->boxes.n; b++, row += ROW) {
      const kiln_anno_box *x = &s->boxes.v[b];
      row[0] = (float)j, row[1] = (float)x->label, row[2] = (float)x->instance_id;
      row[3] = x->box.xmin, row[4] = x->box.ymin, row[5] = x->box.xmax, row[6] = x->box.ymax;
      row[7] = x->difficult ? 1.0f : 0.0f;
    }
    rows += s->boxes.n;
  }
  if (s->labels && rows == 0) { /* the fork's batch without a box: one row of -1 */
    KILN_TRY(kiln_ring_slot_side(slot, SIDE_ROWS, ROW));
    for (int k = 0; k < ROW; k++) slot->side[SIDE_ROWS][k] = -1;
    rows = 1;
  }
  slot->side_n[SIDE_ROWS] = rows * ROW;
  return KILN_OK;
}

/* Whether the steps that run in this phase can change the image's size when nothing resizes
 * it to a fixed one: an expansion that can happen, a sampler that can crop. */
static bool changes_size(const anno_state *s) {
  const Caffe__ExpansionParameter *e = s->tp.expand_param;
  if (e && e->prob > 0 && fabsf(e->max_expand_ratio - 1) >= 1e-2f) return true;
  for (size_t i = 0; i < s->nsamplers; i++)
    if (s->samplers[i]->sampler && s->samplers[i]->sampler->min_scale < 1) return true;
  return false;
}

/* The output's size from the parameters and the first record's (outH, outW, varying). */
static int output_size(kiln_layer *l, anno_state *s) {
  const Caffe__ResizeParameter *r = s->tp.resize_param;
  const int crop = (int)s->tp.crop_size;
  const bool small = r && r->resize_mode == CAFFE__RESIZE_PARAMETER__RESIZE_MODE__FIT_SMALL_SIZE;
  if (crop) {
    if (small && (crop > (int)r->height || crop > (int)r->width))
      return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "transform_param.crop_size %d is larger than "
                              "resize_param's %u x %u (width x height), the least FIT_SMALL_SIZE "
                              "gives", crop, r->width, r->height);
    if (!r && (crop > s->H || crop > s->W))
      return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE, "transform_param.crop_size %d is larger than the "
                              "first record's %dx%d image", crop, s->W, s->H);
    s->outH = s->outW = crop;
    return KILN_OK;
  }
  if (r && !small) {
    s->outH = (int)r->height, s->outW = (int)r->width;
    return KILN_OK;
  }
  s->outH = small ? (int)r->height : s->H;
  s->outW = small ? (int)r->width : s->W;
  s->varying = small || changes_size(s);
  if (s->varying && s->batch > 1)
    return KILN_LAYER_ERROR(
        l, KILN_ERR_UNSUPPORTED,
        "%s gives each image a size of its own, which a batch of %d images cannot hold: give "
        "data_param.batch_size 1, or resize_param with resize_mode WARP or "
        "FIT_LARGE_SIZE_AND_PAD (or crop_size)",
        small ? "resize_param's FIT_SMALL_SIZE"
              : "an expansion or a batch_sampler's crop without resize_param",
        s->batch);
  return KILN_OK;
}

/* Opens the database and reads its first record: channels, size, boxes. */
static int open_source(kiln_layer *l, anno_state *s, const Caffe__DataParameter *p,
                       kiln_image_color color, size_t *first_boxes) {
  char path[4096];
  KILN_TRY(kiln_data_source_path(l->config, p->source[0], path, sizeof path));
  if (!(s->source = strdup(path))) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  const kiln_db_backend backend =
      p->backend == CAFFE__DATA_PARAMETER__DB__LMDB ? KILN_DB_LMDB : KILN_DB_LEVELDB;
  int rc = kiln_datum_db_open_annotated(path, backend, &s->db);
  kiln_annotated_datum first;
  if (!rc) {
    kiln_datum_db_set_color(s->db, color);
    rc = kiln_datum_db_next_annotated(s->db, &first);
  }
  if (!rc) rc = kiln_datum_db_seek(s->db, 0);
  if (rc && !p->has_backend && backend == KILN_DB_LEVELDB)
    return kiln_error_context(rc, "layer '%s' (%s): data_param names no backend, which in Caffe "
                              "means LEVELDB: ", l->name, l->ops->type);
  if (rc) return kiln_error_context(rc, "layer '%s' (%s): ", l->name, l->ops->type);
  if (!first.datum.u8)
    return KILN_LAYER_ERROR(l, KILN_ERR_DATA, "%s: record 0 (%s) holds float_data; detection "
                            "images are bytes (raw or encoded)", path,
                            kiln_datum_db_last_key(s->db));
  s->C = first.datum.channels, s->H = first.datum.height, s->W = first.datum.width;
  s->size = kiln_datum_db_size(s->db);
  *first_boxes = first.n_box;
  return KILN_OK;
}

static int anno_setup(kiln_layer *l) {
  const Caffe__DataParameter *p = KILN_PARAM_OR(l->lp->data_param, data_defaults);
  const Caffe__TransformationParameter *t =
      KILN_PARAM_OR(l->lp->transform_param, transform_defaults);
  const Caffe__AnnotatedDataParameter *ap =
      KILN_PARAM_OR(l->lp->annotated_data_param, anno_defaults);
  anno_state *s = calloc(1, sizeof *s);
  if (!s) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  l->priv = s;
  kiln_batch_ring_init(&s->ring, l);
  s->ring.fill = fill_slot;
  s->ring.owner = s;
  s->seed = l->seed;
  s->train = l->phase == CAFFE__PHASE__TRAIN;
  s->labels = l->ntop > 1;

  if (p->n_source == 0 || !p->source[0][0])
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "data_param.source is required: a database of "
                            "AnnotatedDatum records (kiln convert annoset)");
  if (p->n_source > 1)
    return KILN_LAYER_ERROR(l, KILN_ERR_UNSUPPORTED, "data_param names %zu sources; AnnotatedData "
                            "reads one database (mixing sources by source_weight is the Data "
                            "layer's)", p->n_source);
  if (!p->has_batch_size || p->batch_size == 0)
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "data_param.batch_size must be set and > 0");
  if (p->prefetch > KILN_RING_MAX_SLOTS)
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "data_param.prefetch %u is more than %d batches",
                            p->prefetch, KILN_RING_MAX_SLOTS);
  if (ap->has_anno_type && ap->anno_type != CAFFE__ANNOTATED_DATUM__ANNOTATION_TYPE__BBOX)
    return KILN_LAYER_ERROR(l, KILN_ERR_UNSUPPORTED, "annotated_data_param.anno_type %d: kiln "
                            "reads BBOX annotations only", (int)ap->anno_type);
  if (t->mean_file && t->mean_file[0])
    return KILN_LAYER_ERROR(l, KILN_ERR_UNSUPPORTED, "transform_param.mean_file: AnnotatedData "
                            "subtracts a value per channel (mean_value), as the fork's SSD nets "
                            "do; a mean image cannot follow the crops and resizes");
  if (!isfinite(t->scale))
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "transform_param.scale %g is not finite",
                            (double)t->scale);
  s->batch = (int)p->batch_size;
  s->shuffle = p->shuffle;
  s->last_batch = p->last_batch;
  kiln_image_color color = KILN_IMAGE_AS_IS;
  KILN_TRY(kiln_data_color_of(l, t, p->force_encoded_color, &color));
  size_t first_boxes = 0;
  KILN_TRY(open_source(l, s, p, color, &first_boxes));
  int rc = kiln_anno_augment_check(t, ap->batch_sampler, ap->n_batch_sampler, s->C);
  if (rc) return kiln_error_context(rc, "layer '%s' (%s): ", l->name, l->ops->type);
  if (ap->label_map_file && ap->label_map_file[0]) {
    char path[4096];
    KILN_TRY(kiln_data_source_path(l->config, ap->label_map_file, path, sizeof path));
    rc = kiln_labelmap_read(path, &s->map);
    if (rc)
      return kiln_error_context(rc, "layer '%s' (%s): annotated_data_param.label_map_file: ",
                                l->name, l->ops->type);
    if (!(s->map_path = strdup(path))) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  }

  /* the chain in this phase */
  s->tp = *t;
  if (s->train) {
    s->samplers = ap->batch_sampler;
    s->nsamplers = ap->n_batch_sampler;
  } else {
    s->tp.distort_param = NULL;
    s->tp.expand_param = NULL;
    s->tp.mirror = false;
  }
  s->scale = t->scale;
  for (int c = 0; c < s->C; c++)
    s->mean[c] = t->n_mean_value == 0 ? 0 : t->mean_value[t->n_mean_value == 1 ? 0 : c];
  KILN_TRY(output_size(l, s));

  if (s->last_batch == CAFFE__DATA_PARAMETER__LAST_BATCH__DROP && (uint64_t)s->batch > s->size)
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID,
                            "last_batch: DROP with batch_size %d larger than the data set (%llu "
                            "records) would drop everything",
                            s->batch, (unsigned long long)s->size);
  if (s->size > UINT32_MAX && s->shuffle)
    return KILN_LAYER_ERROR(l, KILN_ERR_UNSUPPORTED, "shuffle of more than 2^32 records");
  s->stream = (kiln_batch_stream){.base = 0, .size = s->size, .batch = s->batch,
                                  .last_batch = (kiln_last_batch)s->last_batch};
  s->order = (kiln_record_order){.seed = s->seed, .size = s->size, .shuffle = s->shuffle};

  /* The ring: the data of `batch` records a slot (or, when sizes vary, an image side buffer
   * starting at the planned size) and the label rows' side buffer, starting at the rows of a
   * batch of images with as many boxes as the first record. Counted here, allocated at the
   * first forward. */
  s->plan_rows = (int64_t)s->batch * (int64_t)(first_boxes > 0 ? first_boxes : 1);
  s->ring.nslots = p->prefetch > 0 ? (int)p->prefetch : 1;
  s->ring.ntops = 1;
  s->ring.batch = s->batch;
  s->ring.per[0] = s->varying ? 0 : (int64_t)s->C * s->outH * s->outW;
  s->ring.side_init[SIDE_ROWS] = s->labels ? s->plan_rows * ROW : 0;
  s->ring.side_init[SIDE_IMAGE] = s->varying ? (int64_t)s->C * s->outH * s->outW : 0;
  return kiln_batch_ring_bytes(&s->ring, l, "data_param.batch_size", &l->extra_bytes);
}

static int anno_reshape(kiln_layer *l) {
  anno_state *s = l->priv;
  KILN_TRY(kiln_blob_reshape(l->top[0], 4, (const int64_t[]){s->batch, s->C, s->outH, s->outW}));
  if (l->ntop > 1)
    KILN_TRY(kiln_blob_reshape(l->top[1], 4, (const int64_t[]){1, 1, s->plan_rows, ROW}));
  return KILN_OK;
}

/* The next batch from the ring: the tops take its shapes (setting l->reshaped when one
 * changed: the rows nearly always do) and its values, through the tops' device. */
static int anno_forward(kiln_layer *l) {
  anno_state *s = l->priv;
  const kiln_ring_slot *slot;
  KILN_TRY(kiln_batch_ring_take(&s->ring, l, &slot));
  kiln_blob *data = l->top[0];
  const int64_t h = s->varying ? slot->dims[0] : s->outH, w = s->varying ? slot->dims[1] : s->outW;
  int rc = KILN_OK;
  if (data->naxes != 4 || data->shape[0] != slot->count || data->shape[2] != h ||
      data->shape[3] != w) {
    rc = kiln_blob_reshape(data, 4, (const int64_t[]){slot->count, s->C, h, w});
    l->reshaped = true;
  }
  if (!rc)
    rc = kiln_device_to_device(data->device, data->data,
                               s->varying ? slot->side[SIDE_IMAGE] : slot->top[0],
                               sizeof(float) * (size_t)data->count);
  if (!rc && l->ntop > 1) {
    kiln_blob *label = l->top[1];
    const int64_t rows = slot->side_n[SIDE_ROWS] / ROW;
    if (label->naxes != 4 || label->shape[2] != rows) {
      rc = kiln_blob_reshape(label, 4, (const int64_t[]){1, 1, rows, ROW});
      l->reshaped = true;
    }
    if (!rc)
      rc = kiln_device_to_device(label->device, label->data, slot->side[SIDE_ROWS],
                                 sizeof(float) * (size_t)label->count);
  }
  kiln_batch_ring_release(&s->ring);
  return rc ? kiln_error_context(rc, "layer '%s' (%s): ", l->name, l->ops->type) : KILN_OK;
}

static uint64_t anno_get_cursor(kiln_layer *l) {
  anno_state *s = l->priv;
  return kiln_batch_ring_cursor(&s->ring, &s->stream);
}

static int anno_set_cursor(kiln_layer *l, uint64_t cursor) {
  anno_state *s = l->priv;
  kiln_batch_ring_reset(&s->ring);
  s->stream.base = cursor;
  int rc = kiln_datum_db_seek(s->db, cursor);
  return rc ? kiln_error_context(rc, "layer '%s' (%s): ", l->name, l->ops->type) : KILN_OK;
}

enum { FINGERPRINT_SAMPLES = 64 };

/* The database's fingerprint (Data's: the record count and 64 records spread over the key
 * order) and the label map's items. */
static int anno_fingerprint(kiln_layer *l, uint8_t digest[32], char *what, size_t n) {
  anno_state *s = l->priv;
  if (s->ring.running)
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "fingerprint asked for after the first forward");
  uint8_t db_digest[32];
  int rc = kiln_datum_db_fingerprint(s->db, FINGERPRINT_SAMPLES, db_digest);
  if (rc) return kiln_error_context(rc, "layer '%s' (%s): ", l->name, l->ops->type);
  kiln_sha256_ctx h;
  kiln_sha256_init(&h);
  kiln_sha256_update(&h, db_digest, sizeof db_digest);
  for (size_t i = 0; s->map_path && i < s->map.n; i++) {
    kiln_sha256_update(&h, s->map.name[i], strlen(s->map.name[i]) + 1);
    kiln_sha256_update(&h, &s->map.label[i], sizeof s->map.label[i]);
  }
  kiln_sha256_final(&h, digest);
  snprintf(what, n, "%s (%llu records, compared by their count and %d of them spread over the "
           "key order%s)", s->source, (unsigned long long)s->size,
           (int)(s->size < FINGERPRINT_SAMPLES ? s->size : FINGERPRINT_SAMPLES),
           s->map_path ? ", and the label map's names and labels" : "");
  return KILN_OK;
}

static void anno_destroy(kiln_layer *l) {
  anno_state *s = l->priv;
  if (!s) return;
  kiln_batch_ring_destroy(&s->ring); /* its thread reads the database */
  if (s->db) kiln_datum_db_close(s->db);
  kiln_labelmap_free(&s->map);
  free(s->map_path);
  free(s->source);
  kiln_image_free(&s->img);
  kiln_anno_boxes_free(&s->boxes);
  kiln_anno_work_free(&s->work);
  kiln_record_order_free(&s->order);
  free(s);
}

const kiln_layer_ops kiln_layer_annotated_data = {
    .type = "AnnotatedData", .min_bottoms = 0, .max_bottoms = 0, .min_tops = 1, .max_tops = 2,
    .is_data = true, .setup = anno_setup, .reshape = anno_reshape, .forward = anno_forward,
    .destroy = anno_destroy, .get_cursor = anno_get_cursor, .set_cursor = anno_set_cursor,
    .fingerprint = anno_fingerprint, .kernels = KILN_NO_KERNELS,
};
