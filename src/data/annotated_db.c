/* AnnotatedDatum records, the SSD fork's create_annoset output and its AnnotatedData layer's
 * input: a Datum (the image, raw or encoded) with the image's boxes in AnnotationGroups, one
 * per label. Read through kiln_datum_db in annotated mode (datum_db.c does the database and
 * the Datum; this file unpacks the AnnotatedDatum around it and keeps its boxes), written
 * through kiln_datum_writer. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "data/internal.h"
#include "kiln/data.h"
#include "kiln/proto.h"

/* Largest C x H x W of a raw record (the Datum reader's limit too). */
#define ANNO_MAX_VALUES ((uint64_t)1 << 31)

struct kiln_anno_records {
  kiln_anno_box *box; /* the last record's boxes */
  size_t n, cap;
};

void kiln_anno_records_free(kiln_anno_records *a) {
  if (!a) return;
  free(a->box);
  free(a);
}

int kiln_anno_unpack(kiln_anno_records *a, const char *path, const char *key, const void *v,
                     size_t n, ProtobufCMessage **msg, const Caffe__Datum **datum) {
  Caffe__AnnotatedDatum *m = caffe__annotated_datum__unpack(NULL, n, v);
  if (!m)
    return kiln_errorf(KILN_ERR_DATA,
                       "%s: record %s: not an AnnotatedDatum (the records of create_annoset or "
                       "kiln convert annoset)",
                       path, key);
  int rc = KILN_OK;
  size_t total = 0;
  for (size_t g = 0; g < m->n_annotation_group; g++) total += m->annotation_group[g]->n_annotation;
  if (!m->datum) {
    rc = kiln_errorf(KILN_ERR_DATA,
                     "%s: record %s: an AnnotatedDatum without its datum (a plain Datum "
                     "record? AnnotatedData reads the records of kiln convert annoset)",
                     path, key);
  } else if (m->has_type && m->type != CAFFE__ANNOTATED_DATUM__ANNOTATION_TYPE__BBOX) {
    rc = kiln_errorf(KILN_ERR_UNSUPPORTED,
                     "%s: record %s: annotation type %d; kiln reads BBOX (0) records only", path,
                     key, (int)m->type);
  } else if (total > a->cap) {
    kiln_anno_box *grown = realloc(a->box, total * sizeof *grown);
    if (!grown)
      rc = kiln_errorf(KILN_ERR_NOMEM, "%s: record %s: out of memory for %zu boxes", path, key,
                       total);
    else
      a->box = grown, a->cap = total;
  }
  size_t k = 0;
  for (size_t g = 0; !rc && g < m->n_annotation_group; g++) {
    const Caffe__AnnotationGroup *grp = m->annotation_group[g];
    for (size_t i = 0; !rc && i < grp->n_annotation; i++) {
      const Caffe__Annotation *an = grp->annotation[i];
      const Caffe__NormalizedBBox *b = an->bbox;
      if (!b) {
        rc = kiln_errorf(KILN_ERR_DATA,
                         "%s: record %s: annotation %zu of group %zu (label %d) has no bbox",
                         path, key, i, g, (int)grp->group_label);
      } else if (!isfinite(b->xmin) || !isfinite(b->ymin) || !isfinite(b->xmax) ||
                 !isfinite(b->ymax)) {
        rc = kiln_errorf(KILN_ERR_DATA,
                         "%s: record %s: annotation %zu of group %zu (label %d): bbox %g %g %g "
                         "%g holds a value that is not a finite number",
                         path, key, i, g, (int)grp->group_label, (double)b->xmin,
                         (double)b->ymin, (double)b->xmax, (double)b->ymax);
      } else {
        a->box[k++] = (kiln_anno_box){.label = grp->group_label,
                                      .instance_id = an->instance_id,
                                      .box = {b->xmin, b->ymin, b->xmax, b->ymax},
                                      .difficult = b->difficult};
      }
    }
  }
  if (rc) {
    a->n = 0;
    caffe__annotated_datum__free_unpacked(m, NULL);
    return rc;
  }
  a->n = k;
  *msg = &m->base;
  *datum = m->datum;
  return KILN_OK;
}

bool kiln_datum_db_is_annotated(const kiln_datum_db *db) { return kiln_datum_db_anno(db) != NULL; }

static int not_annotated(const char *fn) {
  return kiln_errorf(KILN_ERR_INVALID,
                     "%s: the database was not opened for AnnotatedDatum records "
                     "(kiln_datum_db_open_annotated)",
                     fn);
}

static void boxes_out(const kiln_datum_db *db, kiln_annotated_datum *out) {
  const kiln_anno_records *a = kiln_datum_db_anno(db);
  out->box = a->n ? a->box : NULL;
  out->n_box = a->n;
}

int kiln_datum_db_next_annotated(kiln_datum_db *db, kiln_annotated_datum *out) {
  memset(out, 0, sizeof *out);
  if (!kiln_datum_db_anno(db)) return not_annotated("kiln_datum_db_next_annotated");
  KILN_TRY(kiln_datum_db_next(db, &out->datum));
  boxes_out(db, out);
  return KILN_OK;
}

int kiln_datum_db_read_annotated(kiln_datum_db *db, uint64_t index, kiln_annotated_datum *out) {
  memset(out, 0, sizeof *out);
  if (!kiln_datum_db_anno(db)) return not_annotated("kiln_datum_db_read_annotated");
  KILN_TRY(kiln_datum_db_read(db, index, &out->datum));
  boxes_out(db, out);
  return KILN_OK;
}

int kiln_datum_db_open_annotated(const char *path, kiln_db_backend backend, kiln_datum_db **out) {
  KILN_TRY(kiln_datum_db_open_as(path, backend, out));
  kiln_anno_records *a = calloc(1, sizeof *a);
  if (!a) {
    kiln_datum_db_close(*out);
    *out = NULL;
    return kiln_errorf(KILN_ERR_NOMEM, "%s: out of memory", path);
  }
  kiln_datum_db_set_anno(*out, a);
  /* the first record, so that a database of other records is refused at once */
  kiln_annotated_datum first;
  int rc = kiln_datum_db_next_annotated(*out, &first);
  if (!rc) rc = kiln_datum_db_seek(*out, 0);
  if (rc) {
    kiln_datum_db_close(*out);
    *out = NULL;
  }
  return rc;
}

/* ---- writer -------------------------------------------------------------------------------- */

typedef struct {
  int32_t label;
  size_t index;
} box_order;

static int by_label(const void *x, const void *y) {
  const box_order *a = x, *b = y;
  if (a->label != b->label) return a->label < b->label ? -1 : 1;
  return a->index < b->index ? -1 : a->index > b->index; /* stable: the order given */
}

int kiln_datum_writer_put_annotated(kiln_datum_writer *w, const char *key,
                                    const kiln_datum *image, const void *encoded, size_t n,
                                    const kiln_anno_box *box, size_t n_box) {
  if (!image)
    return kiln_errorf(KILN_ERR_INVALID, "record '%s': no image (give its shape and label)", key);
  Caffe__Datum d = CAFFE__DATUM__INIT;
  d.has_label = d.has_data = d.has_encoded = 1;
  d.label = image->label;
  if (encoded) {
    if (n == 0) return kiln_errorf(KILN_ERR_INVALID, "record '%s': no image bytes", key);
    d.encoded = 1;
    d.data.data = (uint8_t *)encoded;
    d.data.len = n;
    /* the shape, as the fork's EncodeCVMatToDatum records it (readers take the image's own) */
    d.has_channels = d.has_height = d.has_width = image->channels > 0 && image->height > 0 &&
                                                  image->width > 0;
  } else {
    const uint64_t c = image->channels > 0 ? (uint64_t)image->channels : 0,
                   h = image->height > 0 ? (uint64_t)image->height : 0,
                   wd = image->width > 0 ? (uint64_t)image->width : 0;
    if (!c || !h || !wd || c * h > ANNO_MAX_VALUES || c * h * wd > ANNO_MAX_VALUES)
      return kiln_errorf(KILN_ERR_INVALID, "record '%s': invalid shape %dx%dx%d", key,
                         image->channels, image->height, image->width);
    if (!image->u8)
      return kiln_errorf(KILN_ERR_INVALID, "record '%s': a raw image needs its bytes (u8)", key);
    d.has_channels = d.has_height = d.has_width = 1;
    d.data.data = (uint8_t *)image->u8;
    d.data.len = (size_t)(c * h * wd);
  }
  d.channels = image->channels;
  d.height = image->height;
  d.width = image->width;
  for (size_t i = 0; i < n_box; i++)
    if (!isfinite(box[i].box.xmin) || !isfinite(box[i].box.ymin) ||
        !isfinite(box[i].box.xmax) || !isfinite(box[i].box.ymax))
      return kiln_errorf(KILN_ERR_INVALID, "record '%s': box %zu holds a coordinate that is not "
                         "a finite number", key, i);

  const size_t cnt = n_box ? n_box : 1;
  box_order *order = malloc(cnt * sizeof *order);
  Caffe__AnnotationGroup *groups = malloc(cnt * sizeof *groups);
  Caffe__AnnotationGroup **gp = malloc(cnt * sizeof *gp);
  Caffe__Annotation *ann = malloc(cnt * sizeof *ann);
  Caffe__Annotation **ap = malloc(cnt * sizeof *ap);
  Caffe__NormalizedBBox *bb = malloc(cnt * sizeof *bb);
  int rc = KILN_OK;
  if (!order || !groups || !gp || !ann || !ap || !bb) {
    rc = kiln_errorf(KILN_ERR_NOMEM, "record '%s': out of memory for %zu boxes", key, n_box);
  } else {
    for (size_t i = 0; i < n_box; i++) order[i] = (box_order){box[i].label, i};
    qsort(order, n_box, sizeof *order, by_label);
    size_t ng = 0;
    for (size_t k = 0; k < n_box; k++) {
      const kiln_anno_box *b = &box[order[k].index];
      if (k == 0 || order[k].label != order[k - 1].label) {
        groups[ng] = (Caffe__AnnotationGroup)CAFFE__ANNOTATION_GROUP__INIT;
        groups[ng].has_group_label = 1;
        groups[ng].group_label = b->label;
        groups[ng].annotation = ap + k; /* the group's annotations follow one another */
        gp[ng] = &groups[ng];
        ng++;
      }
      groups[ng - 1].n_annotation++;
      bb[k] = (Caffe__NormalizedBBox)CAFFE__NORMALIZED_BBOX__INIT;
      bb[k].has_xmin = bb[k].has_ymin = bb[k].has_xmax = bb[k].has_ymax = 1;
      bb[k].has_difficult = 1;
      bb[k].xmin = b->box.xmin;
      bb[k].ymin = b->box.ymin;
      bb[k].xmax = b->box.xmax;
      bb[k].ymax = b->box.ymax;
      bb[k].difficult = b->difficult;
      ann[k] = (Caffe__Annotation)CAFFE__ANNOTATION__INIT;
      ann[k].has_instance_id = 1;
      ann[k].instance_id = b->instance_id;
      ann[k].bbox = &bb[k];
      ap[k] = &ann[k];
    }
    Caffe__AnnotatedDatum m = CAFFE__ANNOTATED_DATUM__INIT;
    m.datum = &d;
    m.has_type = 1;
    m.type = CAFFE__ANNOTATED_DATUM__ANNOTATION_TYPE__BBOX;
    m.n_annotation_group = ng;
    m.annotation_group = gp;
    rc = kiln_datum_writer_put_message(w, key, &m.base);
  }
  free(order);
  free(groups);
  free(gp);
  free(ann);
  free(ap);
  free(bb);
  return rc;
}
