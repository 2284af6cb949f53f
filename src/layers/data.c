/* Data: batches of Datum records from an LMDB (Caffe's Data layer), transformed (crop, mirror,
 * mean subtraction, scale) on a prefetch thread that fills a bounded ring of batches while the
 * net computes.
 *
 * Records are addressed by their position in an endless stream (epoch = position / size): in key
 * order as Caffe reads them, or, with `shuffle`, through a permutation of each epoch drawn from
 * (seed, epoch). Random crops and mirrors are drawn from a generator seeded by (seed, position).
 * So the position of the next batch (the cursor) is all a snapshot needs to resume exactly.
 * `last_batch` chooses what happens at the end of an epoch: WRAP (Caffe), DROP or KEEP.
 *
 * Data-parallel training: in TRAIN, worker r of N reads global batches r, r + N, r + 2N, ... of
 * the same stream (kiln_batch_stream in include/kiln/parallel.h), whole batches round-robin, so the
 * N workers read together what one worker with iter_size N reads. The cursor reported is where
 * the global stream stands once every worker has read as many batches as this one: the same
 * number on every rank, so rank 0's snapshot resumes all of them, and a resume with another N
 * continues the same global stream from there.
 *
 * Several sources (kiln): with data_param { source: A source: B source_weight: 0.7
 * source_weight: 0.3 }, the record at stream position p comes from source i with probability
 * w_i / sum(w), drawn from (seed, p); it is the next record of that source's own stream (its key
 * order, or its own shuffle per epoch of its own size), so each source wraps on its own. The
 * draws up to a position fix every source's place in its stream, so the one cursor still
 * resumes exactly (the draws before it are counted again, a few nanoseconds each), and workers
 * deal whole batches of the mixed stream as above.
 *
 * Everything but the source is shared with ImageData (image_data.c, through data_layer.h): the
 * transform, the prefetch ring, the stream and its cursor, the workers' shares. Records of
 * several sizes pass when cropped (each crop taken from its own record) without a mean file;
 * otherwise every record must have the first one's shape. Encoded records (PNG, JPEG) are
 * decoded by the reader, with transform_param's force_color or force_gray. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data_layer.h"

static const Caffe__DataParameter data_defaults = CAFFE__DATA_PARAMETER__INIT;
static const Caffe__TransformationParameter transform_defaults =
    CAFFE__TRANSFORMATION_PARAMETER__INIT;

typedef kiln_data_state data_state;
typedef kiln_data_mix_source mix_source;

/* Transforms one record into `out` (C x outH x outW); a crop is taken from the record's own
 * size, which may differ from the first record's (shape_fits). */
static int transform_record(data_state *s, const kiln_datum *d, uint64_t pos, float *out) {
  const int H = d->height, W = d->width;
  int h_off = 0, w_off = 0;
  bool flip = false;
  if (s->crop || s->mirror) {
    kiln_rng r;
    kiln_rng_seed(&r, s->seed, pos + 1);
    if (s->crop) {
      if (s->train) {
        h_off = (int)kiln_rng_below(&r, (uint32_t)(H - s->crop + 1));
        w_off = (int)kiln_rng_below(&r, (uint32_t)(W - s->crop + 1));
      } else {
        h_off = (H - s->crop) / 2;
        w_off = (W - s->crop) / 2;
      }
    }
    flip = s->mirror && s->train && (kiln_rng_u32(&r) & 1);
  }
  for (int c = 0; c < s->C; c++)
    for (int h = 0; h < s->outH; h++)
      for (int w = 0; w < s->outW; w++) {
        int src = (c * H + h + h_off) * W + w + w_off;
        float v = d->u8 ? (float)d->u8[src] : d->f32[src];
        if (s->mean) v -= s->mean[src];
        else if (s->n_mean_value) v -= s->mean_value[s->n_mean_value == 1 ? 0 : c];
        int ww = flip ? s->outW - 1 - w : w;
        out[(c * s->outH + h) * s->outW + ww] = v * s->scale;
      }
  return KILN_OK;
}

/* Salt of the mixing draws' generator, apart from the crop and mirror draws of a position. */
#define MIX_SALT 0x6d69785f64726177ULL

/* The source that stream position pos comes from. */
static int mix_pick(const data_state *s, uint64_t pos) {
  kiln_rng r;
  kiln_rng_seed(&r, s->seed ^ MIX_SALT, pos + 1);
  const double u = kiln_rng_u32(&r) / 4294967296.0;
  for (int i = 0; i < s->nmix - 1; i++)
    if (u < s->mix[i].upto) return i;
  return s->nmix - 1;
}

/* The record at stream position pos of a mixed stream: counts the draws of the positions before
 * it (from 0 again when pos lies behind what was counted, as after a resume), then reads the
 * next record of the source drawn. */
static int mix_read(data_state *s, uint64_t pos, kiln_datum *d, uint64_t *index) {
  if (pos < s->mix_pos) {
    for (int i = 0; i < s->nmix; i++) s->mix[i].next = 0;
    s->mix_pos = 0;
  }
  for (; s->mix_pos < pos; s->mix_pos++) s->mix[mix_pick(s, s->mix_pos)].next++;
  mix_source *m = &s->mix[mix_pick(s, pos)];
  const uint64_t q = m->next++;
  s->mix_pos = pos + 1;
  int rc = kiln_record_order_index(&m->order, q, index);
  if (!rc) rc = kiln_datum_db_read(m->db, *index, d);
  return rc ? kiln_error_context(rc, "%s: ", m->path) : KILN_OK;
}

/* Data's read hook: the record at stream position pos of its database(s). A worker of several
 * skips the other workers' batches: random access beats walking past them with the sequential
 * cursor. */
static int read_db(data_state *s, uint64_t pos, kiln_datum *d, uint64_t *index) {
  if (s->nmix) return mix_read(s, pos, d, index);
  KILN_TRY(kiln_record_order_index(&s->order, pos, index));
  if (s->shuffle || s->ring.nworkers > 1) return kiln_datum_db_read(s->db, *index, d);
  if (kiln_datum_db_position(s->db) != pos) KILN_TRY(kiln_datum_db_seek(s->db, pos));
  return kiln_datum_db_next(s->db, d);
}

static void name_db(const data_state *s, uint64_t index, char *buf, size_t n) {
  snprintf(buf, n, "record %llu of %s", (unsigned long long)index, s->source);
}

/* Records of other sizes pass when each is cropped and no mean file (of one size) applies. */
static bool shape_fits(const data_state *s, const kiln_datum *d) {
  if (d->channels != s->C) return false;
  if (s->crop && !s->mean) return d->height >= s->crop && d->width >= s->crop;
  return d->height == s->H && d->width == s->W;
}

static int fill_slot(void *owner, kiln_ring_slot *slot, uint64_t global) {
  data_state *s = owner;
  int per = s->C * s->outH * s->outW;
  uint64_t start = kiln_batch_stream_start(&s->stream, global, &slot->count);
  for (int j = 0; j < slot->count; j++) {
    uint64_t pos = start + (uint64_t)j, index = 0;
    kiln_datum d;
    KILN_TRY(s->read(s, pos, &d, &index));
    if (!shape_fits(s, &d)) {
      char name[512];
      if (s->nmix) snprintf(name, sizeof name, "record %llu of %s", (unsigned long long)index,
                            s->mix[mix_pick(s, pos)].path);
      else s->name(s, index, name, sizeof name);
      return kiln_errorf(KILN_ERR_DATA, "%s is %dx%dx%d, the first record was %dx%dx%d%s", name,
                         d.channels, d.height, d.width, s->C, s->H, s->W,
                         d.channels != s->C ? ""
                         : s->crop && s->mean
                             ? " (records of several sizes cannot share a mean_file)"
                         : s->crop ? " (smaller than crop_size)"
                                   : " (give crop_size, or resize the images to one size)");
    }
    KILN_TRY(transform_record(s, &d, pos, slot->top[0] + (size_t)j * per));
    slot->top[1][j] = (float)d.label;
  }
  return KILN_OK;
}

static int load_mean_file(kiln_layer *l, data_state *s, const char *path) {
  ProtobufCMessage *m;
  int rc = kiln_proto_read_binary(path, &caffe__blob_proto__descriptor, &m);
  if (rc) return kiln_error_context(rc, "layer '%s' (%s): mean_file: ", l->name, l->ops->type);
  Caffe__BlobProto *bp = (Caffe__BlobProto *)m;
  size_t want = (size_t)s->C * s->H * s->W;
  if (bp->n_data != want) {
    const size_t have = bp->n_data; /* read before the message is freed */
    protobuf_c_message_free_unpacked(m, NULL);
    return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE, "%s: mean has %zu values, the data %dx%dx%d", path,
                            have, s->C, s->H, s->W);
  }
  for (size_t i = 0; i < want; i++)
    if (!isfinite(bp->data[i])) {
      const double v = bp->data[i];
      protobuf_c_message_free_unpacked(m, NULL);
      return KILN_LAYER_ERROR(l, KILN_ERR_NUMERIC, "mean_file: %s: value %zu is %g; a mean is "
                              "finite", path, i, v);
    }
  s->mean = malloc(want * sizeof(float));
  if (s->mean) memcpy(s->mean, bp->data, want * sizeof(float));
  protobuf_c_message_free_unpacked(m, NULL);
  return s->mean ? KILN_OK : kiln_errorf(KILN_ERR_NOMEM, "out of memory");
}

/* Opens a database and reads its record shape (channels, height, width). */
static int open_db(kiln_layer *l, const char *given, char **path, kiln_datum_db **db,
                   int chw[3]) {
  char source[4096];
  KILN_TRY(kiln_data_source_path(l->config, given, source, sizeof source));
  *path = strdup(source);
  if (!*path) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  const kiln_data_state *s = l->priv;
  int rc = kiln_datum_db_open_as(source, s->backend, db);
  kiln_datum d;
  if (!rc) kiln_datum_db_set_color(*db, s->color);
  if (!rc) rc = kiln_datum_db_next(*db, &d);
  if (!rc) rc = kiln_datum_db_seek(*db, 0);
  /* Caffe's default backend is LevelDB: a data_param that names none (its examples' siamese
   * net, nets of 2014) reads a LevelDB, and the message says so when the path holds an LMDB */
  const Caffe__DataParameter *p = KILN_PARAM_OR(l->lp->data_param, data_defaults);
  if (rc && !p->has_backend && s->backend == KILN_DB_LEVELDB)
    return kiln_error_context(rc, "layer '%s' (Data): data_param names no backend, which in Caffe "
                              "means LEVELDB: ", l->name);
  if (rc) return kiln_error_context(rc, "layer '%s' (Data): ", l->name);
  chw[0] = d.channels, chw[1] = d.height, chw[2] = d.width;
  return KILN_OK;
}

/* The one source, or several mixed by source_weight (checked here, for one source too: one weight
 * per source, each finite and >= 0, not all 0; records of one shape in all; WRAP, since a mix has
 * no epochs). */
static int open_sources(kiln_layer *l, data_state *s, const Caffe__DataParameter *p) {
  int chw[3];
  if (p->n_source_weight && p->n_source_weight != p->n_source)
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID,
                            "data_param has %zu source%s and %zu source_weight value%s: give one "
                            "weight per source",
                            p->n_source, p->n_source == 1 ? "" : "s", p->n_source_weight,
                            p->n_source_weight == 1 ? "" : "s");
  /* the weights' rules hold for one source too: a weight of 0 or below would give no records */
  double sum = 0;
  for (size_t i = 0; i < p->n_source_weight; i++) {
    const float w = p->source_weight[i];
    if (!isfinite(w) || w < 0)
      return KILN_LAYER_ERROR(l, KILN_ERR_INVALID,
                              "data_param.source_weight %zu (of source '%s') is %g; a weight is "
                              "finite and >= 0",
                              i + 1, p->source[i], (double)w);
    sum += w;
  }
  if (p->n_source_weight && !(sum > 0))
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID,
                            p->n_source == 1
                                ? "data_param.source_weight is 0: the one source would give no "
                                  "records; give it a positive weight (or none)"
                                : "data_param.source_weight values sum to 0: at least one source "
                                  "must have a positive weight");
  if (p->n_source == 1) {
    KILN_TRY(open_db(l, p->source[0], &s->source, &s->db, chw));
    s->C = chw[0], s->H = chw[1], s->W = chw[2];
    s->size = kiln_datum_db_size(s->db);
    return KILN_OK;
  }
  if (p->n_source > 64)
    return KILN_LAYER_ERROR(l, KILN_ERR_UNSUPPORTED, "data_param has %zu sources; at most 64",
                            p->n_source);
  if (!p->n_source_weight)
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID,
                            "data_param has %zu sources and no source_weight: give one weight per "
                            "source (the share of the records it gives)",
                            p->n_source);
  if (s->last_batch != CAFFE__DATA_PARAMETER__LAST_BATCH__WRAP)
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID,
                            "last_batch DROP and KEEP act at the end of an epoch, which a mix of "
                            "%zu sources does not have (each source wraps on its own): use WRAP",
                            p->n_source);
  s->mix = calloc(p->n_source, sizeof *s->mix);
  if (!s->mix) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  s->nmix = (int)p->n_source;
  double upto = 0;
  for (int i = 0; i < s->nmix; i++) {
    mix_source *m = &s->mix[i];
    KILN_TRY(open_db(l, p->source[i], &m->path, &m->db, chw));
    if (i == 0) {
      s->C = chw[0], s->H = chw[1], s->W = chw[2];
      s->source = strdup(m->path);
      if (!s->source) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
    } else if (chw[0] != s->C || chw[1] != s->H || chw[2] != s->W) {
      return KILN_LAYER_ERROR(l, KILN_ERR_DATA,
                              "source %s holds %dx%dx%d records, source %s %dx%dx%d: mixed "
                              "sources need records of one shape",
                              m->path, chw[0], chw[1], chw[2], s->mix[0].path, s->C, s->H, s->W);
    }
    m->size = kiln_datum_db_size(m->db);
    if (m->size > UINT32_MAX && s->shuffle)
      return KILN_LAYER_ERROR(l, KILN_ERR_UNSUPPORTED, "%s: shuffle of more than 2^32 records",
                              m->path);
    /* each source its own permutations: the seed, apart per source */
    m->order = (kiln_record_order){.seed = s->seed + 0x9e3779b97f4a7c15ULL * (uint64_t)(i + 1),
                                   .size = m->size,
                                   .shuffle = s->shuffle};
    upto += p->source_weight[i] / sum;
    m->upto = upto;
    s->size += m->size;
  }
  return KILN_OK;
}

int kiln_data_layer_init(kiln_layer *l, data_state **out) {
  data_state *s = calloc(1, sizeof *s);
  if (!s) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  l->priv = s;
  kiln_batch_ring_init(&s->ring, l);
  s->ring.fill = fill_slot;
  s->ring.owner = s;
  s->seed = l->seed;
  *out = s;
  return KILN_OK;
}

static int data_setup(kiln_layer *l) {
  const Caffe__DataParameter *p = KILN_PARAM_OR(l->lp->data_param, data_defaults);
  const Caffe__TransformationParameter *t =
      KILN_PARAM_OR(l->lp->transform_param, transform_defaults);
  data_state *s = NULL;
  KILN_TRY(kiln_data_layer_init(l, &s));
  if (p->n_source == 0 || !p->source[0][0])
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "data_param.source is required");
  s->backend = p->backend == CAFFE__DATA_PARAMETER__DB__LMDB ? KILN_DB_LMDB : KILN_DB_LEVELDB;
  if (!p->has_batch_size || p->batch_size == 0)
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "data_param.batch_size must be set and > 0");
  s->batch = (int)p->batch_size;
  s->shuffle = p->shuffle;
  s->last_batch = p->last_batch;
  s->read = read_db;
  s->name = name_db;
  KILN_TRY(kiln_data_color_of(l, t, p->force_encoded_color, &s->color));
  KILN_TRY(open_sources(l, s, p));
  return kiln_data_layer_finish(l, s, t, p->prefetch);
}

int kiln_data_layer_finish(kiln_layer *l, data_state *s, const Caffe__TransformationParameter *t,
                           uint32_t prefetch) {
  const char *param = strcmp(l->ops->type, "Data") ? "image_data_param" : "data_param";
  if (s->last_batch == CAFFE__DATA_PARAMETER__LAST_BATCH__DROP && (uint64_t)s->batch > s->size)
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID,
                            "last_batch: DROP with batch_size %d larger than the data set (%llu "
                            "records) would drop everything",
                            s->batch, (unsigned long long)s->size);
  if (s->size > UINT32_MAX && s->shuffle && !s->nmix)
    return KILN_LAYER_ERROR(l, KILN_ERR_UNSUPPORTED, "shuffle of more than 2^32 records");
  _Static_assert((int)KILN_LAST_BATCH_WRAP == (int)CAFFE__DATA_PARAMETER__LAST_BATCH__WRAP &&
                     (int)KILN_LAST_BATCH_DROP == (int)CAFFE__DATA_PARAMETER__LAST_BATCH__DROP &&
                     (int)KILN_LAST_BATCH_KEEP == (int)CAFFE__DATA_PARAMETER__LAST_BATCH__KEEP,
                 "kiln_last_batch out of step with DataParameter.LastBatch");
  s->stream = (kiln_batch_stream){.base = 0, .size = s->size, .batch = s->batch,
                                  .last_batch = (kiln_last_batch)s->last_batch};
  s->scale = t->scale;
  s->crop = (int)t->crop_size;
  s->mirror = t->mirror;
  s->train = l->phase == CAFFE__PHASE__TRAIN;
  /* a mixed stream reads through each source's own order */
  s->order = (kiln_record_order){.seed = s->seed, .size = s->size, .shuffle = s->shuffle && !s->nmix};
  if (s->crop > s->H || s->crop > s->W)
    return KILN_LAYER_ERROR(l, KILN_ERR_SHAPE, "crop_size %d is larger than the %dx%d images",
                            s->crop, s->H, s->W);
  s->outH = s->crop ? s->crop : s->H;
  s->outW = s->crop ? s->crop : s->W;
  if (t->mean_file && t->n_mean_value)
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "give mean_file or mean_value, not both");
  if (t->mean_file) KILN_TRY(load_mean_file(l, s, t->mean_file));
  if (t->n_mean_value) {
    if (t->n_mean_value != 1 && (int)t->n_mean_value != s->C)
      return KILN_LAYER_ERROR(l, KILN_ERR_INVALID,
                              "mean_value needs 1 value or one per channel (%d), got %zu", s->C,
                              t->n_mean_value);
    if (t->n_mean_value > 64)
      return KILN_LAYER_ERROR(l, KILN_ERR_UNSUPPORTED, "more than 64 mean values");
    s->n_mean_value = (int)t->n_mean_value;
    memcpy(s->mean_value, t->mean_value, sizeof(float) * t->n_mean_value);
  }
  if (prefetch > 64)
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "data_param.prefetch %u is more than 64 batches",
                            prefetch);
  /* The queue is only counted here (extra_bytes, in the net's memory plan, which refuses a net
   * that would not fit before anything is allocated); it is allocated when the data start
   * flowing. */
  s->ring.nslots = prefetch > 0 ? (int)prefetch : 1;
  s->ring.ntops = 2;
  s->ring.batch = s->batch;
  s->ring.per[0] = (int64_t)s->C * s->outH * s->outW;
  s->ring.per[1] = 1;
  char what[64];
  snprintf(what, sizeof what, "%s.batch_size", param);
  return kiln_batch_ring_bytes(&s->ring, l, what, &l->extra_bytes);
}


int kiln_data_layer_reshape(kiln_layer *l) {
  data_state *s = l->priv;
  int64_t shape[4] = {s->batch, s->C, s->outH, s->outW};
  KILN_TRY(kiln_blob_reshape(l->top[0], 4, shape));
  if (l->ntop > 1) {
    int64_t lshape[1] = {s->batch};
    KILN_TRY(kiln_blob_reshape(l->top[1], 1, lshape));
  }
  return KILN_OK;
}

int kiln_data_layer_forward(kiln_layer *l) {
  data_state *s = l->priv;
  const kiln_ring_slot *slot;
  KILN_TRY(kiln_batch_ring_take(&s->ring, l, &slot));
  if (l->top[0]->shape[0] != slot->count) {
    int64_t shape[4] = {slot->count, s->C, s->outH, s->outW};
    KILN_TRY(kiln_blob_reshape(l->top[0], 4, shape));
    if (l->ntop > 1) KILN_TRY(kiln_blob_reshape(l->top[1], 1, shape));
    l->reshaped = true;
  }
  /* the batch, made on the host, handed to the tops' device */
  int rc = kiln_device_to_device(l->top[0]->device, l->top[0]->data, slot->top[0],
                                 sizeof(float) * (size_t)l->top[0]->count);
  if (!rc && l->ntop > 1)
    rc = kiln_device_to_device(l->top[1]->device, l->top[1]->data, slot->top[1],
                               sizeof(float) * (size_t)slot->count);
  kiln_batch_ring_release(&s->ring);
  return rc;
}

/* Where the global stream stands once every worker has read as many batches as this one. */
uint64_t kiln_data_layer_get_cursor(kiln_layer *l) {
  data_state *s = l->priv;
  return kiln_batch_ring_cursor(&s->ring, &s->stream);
}

int kiln_data_layer_set_cursor(kiln_layer *l, uint64_t cursor) {
  data_state *s = l->priv;
  kiln_batch_ring_reset(&s->ring);
  s->stream.base = cursor;
  if (!s->db) return KILN_OK; /* a mix counts the draws up to the cursor at its next read */
  int rc = kiln_datum_db_seek(s->db, cursor);
  if (rc) return kiln_error_context(rc, "layer '%s' (Data): ", l->name);
  return KILN_OK;
}

/* Records sampled for the fingerprint: LMDB reads at random positions, milliseconds even for
 * a large database once the key index (which several workers build anyway) exists. */
enum { FINGERPRINT_SAMPLES = 64 };

/* The database's fingerprint, and the mean file's values when there is one (mean_value and the
 * other settings are in the net, which the workers compare already). */
static int data_fingerprint(kiln_layer *l, uint8_t digest[32], char *what, size_t n) {
  data_state *s = l->priv;
  if (s->ring.running)
    return KILN_LAYER_ERROR(l, KILN_ERR_INVALID, "fingerprint asked for after the first forward");
  uint8_t db_digest[32];
  kiln_sha256_ctx h;
  kiln_sha256_init(&h);
  for (int i = 0; i < (s->nmix ? s->nmix : 1); i++) {
    int rc = kiln_datum_db_fingerprint(s->nmix ? s->mix[i].db : s->db, FINGERPRINT_SAMPLES,
                                       db_digest);
    if (rc) return kiln_error_context(rc, "layer '%s' (Data): ", l->name);
    kiln_sha256_update(&h, db_digest, sizeof db_digest);
  }
  if (s->mean) kiln_sha256_update(&h, s->mean, sizeof(float) * (size_t)s->C * s->H * s->W);
  kiln_sha256_final(&h, digest);
  if (s->nmix)
    snprintf(what, n, "%s and %d more sources (compared by their record counts and up to %d "
             "records of each spread over the key order%s)", s->source, s->nmix - 1,
             FINGERPRINT_SAMPLES, s->mean ? ", and the mean file's values" : "");
  else
    snprintf(what, n, "%s (%llu records, compared by their count and %d of them spread over the "
             "key order%s)", s->source, (unsigned long long)s->size,
             (int)(s->size < FINGERPRINT_SAMPLES ? s->size : FINGERPRINT_SAMPLES),
             s->mean ? ", and the mean file's values" : "");
  return KILN_OK;
}

void kiln_data_layer_destroy(kiln_layer *l) {
  data_state *s = l->priv;
  if (!s) return;
  kiln_batch_ring_destroy(&s->ring); /* its thread reads the databases */
  if (s->db) kiln_datum_db_close(s->db);
  for (int i = 0; s->mix && i < s->nmix; i++) {
    if (s->mix[i].db) kiln_datum_db_close(s->mix[i].db);
    free(s->mix[i].path);
    kiln_record_order_free(&s->mix[i].order);
  }
  free(s->mix);
  free(s->source);
  free(s->mean);
  kiln_image_list_free(&s->list);
  kiln_image_free(&s->image);
  free(s->root);
  free(s->file);
  kiln_record_order_free(&s->order);
  free(s);
}

const kiln_layer_ops kiln_layer_data = {
    .type = "Data", .min_bottoms = 0, .max_bottoms = 0, .min_tops = 1, .max_tops = 2,
    .is_data = true, .setup = data_setup, .reshape = kiln_data_layer_reshape,
    .forward = kiln_data_layer_forward, .destroy = kiln_data_layer_destroy,
    .get_cursor = kiln_data_layer_get_cursor, .set_cursor = kiln_data_layer_set_cursor,
    .fingerprint = data_fingerprint, .kernels = KILN_NO_KERNELS,
};
