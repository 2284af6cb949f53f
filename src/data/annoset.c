/* kiln convert annoset: the SSD fork's create_annoset. A list of `IMAGE ANNOTATION` pairs (the
 * fork's trainval.txt and test.txt), the images as kiln convert images writes them and each
 * PASCAL VOC annotation's objects as boxes, into a new LMDB or LevelDB of AnnotatedDatum
 * records keyed as convert_imageset keys its records; and, when asked, the name-size file
 * (the fork's get_image_size output) that DetectionEvaluate reads. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "data/internal.h"
#include "kiln/data.h"

/* Lists larger than this are refused before they are read (VOC's trainval is 0.9 MB). */
#define ANNO_LIST_MAX_BYTES ((size_t)1 << 30)
/* Image files larger than this are refused before they are read (as kiln convert images). */
#define ANNO_IMAGE_MAX_BYTES ((size_t)1 << 30)
/* The quality of re-encoded JPEG images: OpenCV's imencode default, which the fork gets. */
#define ANNO_JPEG_QUALITY 95

/* The list: pair i is image[i], anno[i], from line[i]. */
typedef struct anno_list {
  size_t n;
  char **image, **anno;
  int *line;
  char *text;
} anno_list;

static void anno_list_free(anno_list *l) {
  free(l->image);
  free(l->anno);
  free(l->line);
  free(l->text);
  memset(l, 0, sizeof *l);
}

static bool blank(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f'; }

/* One pair a line, two fields separated by blanks; blank lines skipped. */
static int anno_list_read(const char *path, anno_list *out) {
  memset(out, 0, sizeof *out);
  char *text;
  size_t len;
  KILN_TRY(kiln_read_file_max(path, ANNO_LIST_MAX_BYTES, &text, &len));
  int rc = kiln_text_check_nul(path, text, len);
  if (rc) {
    free(text);
    return rc;
  }
  out->text = text;
  size_t lines = 1;
  for (size_t i = 0; i < len; i++) lines += text[i] == '\n';
  out->image = malloc(lines * sizeof *out->image);
  out->anno = malloc(lines * sizeof *out->anno);
  out->line = malloc(lines * sizeof *out->line);
  if (!out->image || !out->anno || !out->line) {
    anno_list_free(out);
    return kiln_errorf(KILN_ERR_NOMEM, "%s: out of memory for the list", path);
  }
  int ln = 0;
  for (size_t at = 0; at <= len && !rc; ln++) {
    char *s = text + at, *nl = memchr(s, '\n', len - at);
    size_t n = nl ? (size_t)(nl - s) : len - at;
    at += n + 1;
    s[n] = '\0'; /* the newline, or the terminating NUL kiln_read_file added */
    char *field[3];
    int nf = 0;
    for (char *p = s; *p && nf < 3;) {
      while (blank(*p)) p++;
      if (!*p) break;
      field[nf++] = p;
      while (*p && !blank(*p)) p++;
      if (*p) *p++ = '\0';
    }
    if (nf == 0) continue;
    if (nf != 2) {
      rc = kiln_errorf(KILN_ERR_PARSE,
                       "%s:%d: %s: a line is an image path and its annotation's path, separated "
                       "by a space",
                       path, ln + 1, nf == 1 ? "one field" : "more than two fields");
      break;
    }
    out->image[out->n] = field[0];
    out->anno[out->n] = field[1];
    out->line[out->n] = ln + 1;
    out->n++;
  }
  if (!rc && out->n == 0) rc = kiln_errorf(KILN_ERR_DATA, "%s: the list names no images", path);
  if (rc) anno_list_free(out);
  return rc;
}

/* What one conversion keeps between records. */
typedef struct annoset_job {
  const kiln_convert_annoset_opts *o;
  char encode; /* 0: the file's own when unchanged, else PNG; 'j': JPEG; 'p': PNG */
  const kiln_labelmap *map;
  kiln_datum_writer *w;
  kiln_image img;
  uint8_t *resized;
  size_t resized_cap;
  kiln_anno_box *box;
  size_t box_cap;
  uint64_t boxes;
} annoset_job;

/* Whether an image file of `format` ("png", "jpeg") may go in as it is. */
static bool format_wanted(char encode, const char *format) {
  return !encode || (encode == 'j' ? !strcmp(format, "jpeg") : !strcmp(format, "png"));
}

/* One pair as a record under `key`; hw gets the image's own height and width. */
static int put_pair(annoset_job *j, const char *key, const char *image_file,
                    const char *anno_file, int hw[2]) {
  const kiln_convert_annoset_opts *o = j->o;
  const int want = o->gray ? 1 : 3;
  char *bytes = NULL;
  size_t n = 0;
  KILN_TRY(kiln_read_file_max(image_file, ANNO_IMAGE_MAX_BYTES, &bytes, &n));
  /* the file's own channels first when it may go in as it is, as kiln convert images does */
  bool as_is = false;
  int rc = KILN_OK;
  if (o->encoded && !o->new_height) {
    rc = kiln_image_decode(bytes, n, KILN_IMAGE_AS_IS, 0, 0, image_file, &j->img);
    as_is = !rc && j->img.channels == want &&
            format_wanted(j->encode, kiln_image_format(bytes, n));
  }
  if (!rc && !as_is)
    rc = kiln_image_decode(bytes, n, o->gray ? KILN_IMAGE_GRAY : KILN_IMAGE_COLOR, 0, 0,
                           image_file, &j->img);
  kiln_voc_annotation voc = {0};
  if (!rc) {
    hw[0] = j->img.height;
    hw[1] = j->img.width;
    rc = kiln_voc_read(anno_file, j->map, &voc);
  }
  if (!rc && o->check_size && (voc.width != j->img.width || voc.height != j->img.height))
    rc = kiln_errorf(KILN_ERR_DATA,
                     "%s: the image is %d x %d (width x height), but its annotation %s says %d x "
                     "%d",
                     image_file, j->img.width, j->img.height, anno_file, voc.width, voc.height);
  if (!rc && voc.n > j->box_cap) {
    kiln_anno_box *grown = realloc(j->box, voc.n * sizeof *grown);
    if (!grown) rc = kiln_errorf(KILN_ERR_NOMEM, "%s: out of memory", anno_file);
    else j->box = grown, j->box_cap = voc.n;
  }
  for (size_t i = 0; !rc && i < voc.n; i++) j->box[i] = voc.object[i].box;
  const size_t nbox = voc.n;
  kiln_voc_free(&voc);
  /* the image asked for: resized (bilinear, as the decoder resizes) or as decoded */
  kiln_datum d = {.channels = j->img.channels, .height = j->img.height, .width = j->img.width,
                  .label = -1, .u8 = j->img.data};
  if (!rc && o->new_height && (o->new_height != d.height || o->new_width != d.width)) {
    const size_t need = (size_t)d.channels * (size_t)o->new_height * (size_t)o->new_width;
    if (need > j->resized_cap) {
      uint8_t *grown = realloc(j->resized, need);
      if (!grown) rc = kiln_errorf(KILN_ERR_NOMEM, "%s: out of memory to resize", image_file);
      else j->resized = grown, j->resized_cap = need;
    }
    if (!rc)
      rc = kiln_image_resize(j->img.data, d.channels, d.height, d.width, j->resized,
                             o->new_height, o->new_width);
    d.height = o->new_height, d.width = o->new_width, d.u8 = j->resized;
  }
  if (!rc) {
    if (!o->encoded) {
      rc = kiln_datum_writer_put_annotated(j->w, key, &d, NULL, 0, j->box, nbox);
    } else if (as_is) {
      rc = kiln_datum_writer_put_annotated(j->w, key, &d, bytes, n, j->box, nbox);
    } else {
      uint8_t *enc = NULL;
      size_t len = 0;
      rc = j->encode == 'j' ? kiln_image_encode_jpeg(d.u8, d.channels, d.height, d.width,
                                                     ANNO_JPEG_QUALITY, &enc, &len)
                            : kiln_image_encode_png(d.u8, d.channels, d.height, d.width, &enc,
                                                    &len);
      if (!rc) rc = kiln_datum_writer_put_annotated(j->w, key, &d, enc, len, j->box, nbox);
      free(enc);
    }
  }
  if (!rc) j->boxes += nbox;
  free(bytes);
  return rc;
}

/* The fork's name-size file: `NAME HEIGHT WIDTH` per image, in the list's order. */
static int write_name_size(const char *path, const anno_list *list, const int (*hw)[2]) {
  kiln_strbuf b = {0};
  for (size_t i = 0; i < list->n; i++) {
    const char *name = strrchr(list->image[i], '/');
    name = name ? name + 1 : list->image[i];
    const char *dot = strrchr(name, '.');
    const int len = dot && dot != name ? (int)(dot - name) : (int)strlen(name);
    kiln_strbuf_printf(&b, "%.*s %d %d\n", len, name, hw[i][0], hw[i][1]);
  }
  int rc = b.failed ? kiln_errorf(KILN_ERR_NOMEM, "%s: out of memory", path)
                    : kiln_write_file_atomic(path, b.s, b.len);
  free(b.s);
  return rc;
}

/* Checks the options; *encode gets the encoding's letter. */
static int check_opts(const kiln_convert_annoset_opts *o, const char *out_path, char *encode) {
  if ((o->new_height > 0) != (o->new_width > 0) || o->new_height < 0 || o->new_width < 0)
    return kiln_errorf(KILN_ERR_INVALID, "resize to %d x %d: give both height and width (> 0)",
                       o->new_height, o->new_width);
  *encode = 0;
  if (o->encode_type && o->encode_type[0]) {
    const char *t = o->encode_type + (o->encode_type[0] == '.');
    if (!strcasecmp(t, "jpg") || !strcasecmp(t, "jpeg")) *encode = 'j';
    else if (!strcasecmp(t, "png")) *encode = 'p';
    else
      return kiln_errorf(KILN_ERR_INVALID, "encode type '%s': kiln writes jpg or png",
                         o->encode_type);
  }
  if (o->name_size && !strcmp(o->name_size, out_path))
    return kiln_errorf(KILN_ERR_INVALID, "%s: both the database and the name-size file",
                       out_path);
  struct stat st;
  if (stat(out_path, &st) == 0)
    return kiln_errorf(KILN_ERR_INVALID,
                       "%s: already exists; remove it or choose another output path", out_path);
  return KILN_OK;
}

int kiln_convert_annoset(const char *list_path, const char *root, const char *out_path,
                         const char *label_map_path, const kiln_convert_annoset_opts *opts,
                         uint64_t *n_written, uint64_t *n_boxes) {
  if (n_written) *n_written = 0;
  if (n_boxes) *n_boxes = 0;
  kiln_convert_annoset_opts o = *opts;
  annoset_job j = {.o = &o};
  KILN_TRY(check_opts(&o, out_path, &j.encode));
  if (j.encode) o.encoded = true; /* as convert_imageset: an encoding asked for encodes */
  if (o.name_size) {
    const char *inputs[] = {list_path, label_map_path};
    KILN_TRY(kiln_check_output(o.name_size, KILN_OUTPUT_RENAMED, inputs, 2));
  }
  kiln_labelmap map;
  KILN_TRY(kiln_labelmap_read(label_map_path, &map));
  j.map = &map;
  anno_list list;
  int rc = anno_list_read(list_path, &list);
  if (rc) {
    kiln_labelmap_free(&map);
    return rc;
  }
  size_t *order = malloc(list.n * sizeof *order);
  int(*hw)[2] = calloc(list.n, sizeof *hw);
  if (!order || !hw) rc = kiln_errorf(KILN_ERR_NOMEM, "%s: out of memory", list_path);
  for (size_t i = 0; !rc && i < list.n; i++) order[i] = i;
  if (!rc && o.shuffle) { /* Fisher-Yates from the seed, as kiln convert images */
    kiln_rng r;
    kiln_rng_seed(&r, o.seed, 0x434f4e56ULL);
    for (size_t i = list.n - 1; i > 0; i--) {
      size_t k = i < UINT32_MAX ? kiln_rng_below(&r, (uint32_t)(i + 1)) : i, t = order[i];
      order[i] = order[k];
      order[k] = t;
    }
  }
  const kiln_db_backend backend = o.backend == KILN_DB_LEVELDB ? KILN_DB_LEVELDB : KILN_DB_LMDB;
  if (!rc) rc = kiln_datum_writer_open_as(out_path, backend, &j.w);
  kiln_strbuf image = {0}, anno = {0}, key = {0};
  for (size_t i = 0; !rc && i < list.n; i++) {
    const size_t k = order[i];
    image.len = anno.len = key.len = 0;
    /* Caffe joins root_folder and the paths as they are */
    kiln_strbuf_printf(&image, "%s%s", root, list.image[k]);
    kiln_strbuf_printf(&anno, "%s%s", root, list.anno[k]);
    kiln_strbuf_printf(&key, "%08zu_%s", i, list.image[k]);
    if (image.failed || anno.failed || key.failed) {
      rc = kiln_errorf(KILN_ERR_NOMEM, "%s: out of memory", list_path);
      break;
    }
    rc = put_pair(&j, key.s, image.s, anno.s, hw[k]);
    if (rc) rc = kiln_error_context(rc, "%s:%d: ", list_path, list.line[k]);
  }
  if (j.w) {
    if (rc) kiln_datum_writer_abort(j.w);
    else rc = kiln_datum_writer_commit(j.w); /* frees it either way */
  }
  if (!rc && o.name_size) {
    rc = write_name_size(o.name_size, &list, (const int(*)[2])hw);
    if (rc) { /* nothing may look complete: the database goes too */
      if (backend == KILN_DB_LEVELDB) (void)kiln_ldb_destroy(out_path);
      else (void)kiln_data_remove_lmdb_dir(out_path);
    }
  }
  if (!rc && n_written) *n_written = list.n;
  if (!rc && n_boxes) *n_boxes = j.boxes;
  free(image.s);
  free(anno.s);
  free(key.s);
  kiln_image_free(&j.img);
  free(j.resized);
  free(j.box);
  free(order);
  free(hw);
  anno_list_free(&list);
  kiln_labelmap_free(&map);
  return rc;
}
