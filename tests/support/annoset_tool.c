/* A helper of tests/cli/annoset.sh (not installed): writes the test's images with kiln's own
 * encoders, and prints what a database of AnnotatedDatum records holds, through the reader the
 * AnnotatedData layer uses, so that the shell test can compare it with what it expects.
 *
 *   annoset_tool png|jpeg OUT WIDTH HEIGHT SEED [gray]   an image of a fixed pattern
 *   annoset_tool dump DB [as-is|color|gray]              every record in key order:
 *     KEY CxHxW label L bytes SUM (SUM: the sum of the decoded bytes), then one line per box:
 *       "  box LABEL INSTANCE XMIN YMIN XMAX YMAX DIFFICULT" (%.9g: floats exactly)
 *   annoset_tool read DB INDEX                           record INDEX by random access, the same
 *                                                        way (to compare with dump's)
 * Exit 1 with kiln's message on stderr when something fails. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/data.h"

static int fail(const char *what) {
  fprintf(stderr, "annoset_tool: %s: %s\n", what, kiln_last_error());
  return 1;
}

static int write_image(int argc, char **argv) {
  if (argc < 6) return 2;
  const bool jpeg = !strcmp(argv[1], "jpeg"), gray = argc > 6 && !strcmp(argv[6], "gray");
  const int w = atoi(argv[3]), h = atoi(argv[4]), seed = atoi(argv[5]), c = gray ? 1 : 3;
  uint8_t *chw = malloc((size_t)c * h * w);
  if (!chw) return 1;
  for (int k = 0; k < c; k++) /* smooth, so that JPEG keeps it close */
    for (int y = 0; y < h; y++)
      for (int x = 0; x < w; x++)
        chw[((size_t)k * h + y) * w + x] = (uint8_t)(seed * 29 + k * 70 + y * 3 + x * 2);
  uint8_t *out = NULL;
  size_t len = 0;
  int rc = jpeg ? kiln_image_encode_jpeg(chw, c, h, w, 90, &out, &len)
                : kiln_image_encode_png(chw, c, h, w, &out, &len);
  free(chw);
  if (rc) return fail("encode");
  FILE *f = fopen(argv[2], "wb");
  const bool ok = f && fwrite(out, 1, len, f) == len;
  if (f && fclose(f) != 0) return 1;
  free(out);
  return ok ? 0 : 1;
}

static void print_record(const kiln_datum_db *db, const kiln_annotated_datum *a) {
  const kiln_datum *d = &a->datum;
  unsigned long long sum = 0;
  const size_t n = (size_t)d->channels * d->height * d->width;
  for (size_t i = 0; d->u8 && i < n; i++) sum += d->u8[i];
  printf("%s %dx%dx%d label %d bytes %llu\n", kiln_datum_db_last_key(db), d->channels, d->height,
         d->width, d->label, sum);
  for (size_t i = 0; i < a->n_box; i++) {
    const kiln_anno_box *b = &a->box[i];
    printf("  box %d %d %.9g %.9g %.9g %.9g %d\n", b->label, b->instance_id,
           (double)b->box.xmin, (double)b->box.ymin, (double)b->box.xmax, (double)b->box.ymax,
           b->difficult ? 1 : 0);
  }
}

int main(int argc, char **argv) {
  if (argc >= 2 && (!strcmp(argv[1], "png") || !strcmp(argv[1], "jpeg")))
    return write_image(argc, argv);
  if (argc < 3 || (strcmp(argv[1], "dump") && strcmp(argv[1], "read"))) {
    fprintf(stderr, "usage: annoset_tool png|jpeg OUT W H SEED [gray] | dump DB [as-is|color|gray]"
                    " | read DB INDEX\n");
    return 2;
  }
  kiln_datum_db *db;
  if (kiln_datum_db_open_annotated(argv[2], KILN_DB_ANY, &db)) return fail("open");
  int rc = 0;
  kiln_annotated_datum a;
  if (!strcmp(argv[1], "read")) {
    if (argc < 4 || kiln_datum_db_read_annotated(db, strtoull(argv[3], NULL, 10), &a))
      rc = fail("read");
    else
      print_record(db, &a);
  } else {
    if (argc > 3)
      kiln_datum_db_set_color(db, !strcmp(argv[3], "gray")    ? KILN_IMAGE_GRAY
                                  : !strcmp(argv[3], "color") ? KILN_IMAGE_COLOR
                                                              : KILN_IMAGE_AS_IS);
    const uint64_t n = kiln_datum_db_size(db);
    for (uint64_t i = 0; i < n && !rc; i++) {
      if (kiln_datum_db_next_annotated(db, &a)) rc = fail("next");
      else print_record(db, &a);
    }
  }
  kiln_datum_db_close(db);
  return rc;
}
