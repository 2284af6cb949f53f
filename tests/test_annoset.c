/* Object detection data: label maps (good, and refused for duplicates, missing fields, negative
 * labels and parse errors, naming the file and the line), PASCAL VOC annotations (a good file
 * normalised exactly as the fork does, and each bad case refused naming the file and the line,
 * with nothing printed), AnnotatedDatum records written and read back (raw and encoded, colour
 * and gray, LMDB and LevelDB, sequential and random access, the record's layout checked in its
 * bytes), damaged records refused naming their key, kiln convert annoset's keys, shuffle,
 * name-size file and clean failures, and the JPEG encoder. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <fcntl.h>
#include <lmdb.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "files.h"
#include "kiln/data.h"
#include "kiln/proto.h"

static int setup(void **state) { return tmpdir_setup(state, "anno"); }

/* The message of the last error holds `want`. */
static void expect_message(const char *want) {
  const char *msg = kiln_last_error();
  if (!strstr(msg, want)) fail_msg("message '%s' lacks '%s'", msg, want);
}

static const char labelmap_text[] =
    "# VOC's, cut short\n"
    "item {\n"
    "  name: \"none_of_the_above\"\n"
    "  label: 0\n"
    "  display_name: \"background\"\n"
    "}\n"
    "item { name: \"aeroplane\" label: 1 display_name: \"aeroplane\" }\n"
    "item { name: \"bicycle\" label: 2 }\n"
    "item {\n"
    "  name: \"dog\" # a comment with item { in it\n"
    "  label: 12\n"
    "  display_name: \"Dog\"\n"
    "}\n";

static kiln_labelmap voc_map(void) {
  kiln_labelmap m;
  if (kiln_labelmap_parse(labelmap_text, strlen(labelmap_text), "labelmap_voc.prototxt", &m))
    fail_msg("%s", kiln_last_error());
  return m;
}

/* ---- label maps ----------------------------------------------------------------------------- */

static void test_labelmap_good(void **state) {
  (void)state;
  kiln_labelmap m = voc_map();
  assert_int_equal(m.n, 4);
  assert_string_equal(m.name[0], "none_of_the_above");
  assert_string_equal(m.display_name[0], "background");
  assert_int_equal(m.label[0], 0);
  assert_int_equal(m.line[0], 2);
  assert_string_equal(m.name[2], "bicycle");
  assert_string_equal(m.display_name[2], ""); /* none given */
  assert_int_equal(m.line[2], 8);
  assert_int_equal(m.label[3], 12);
  assert_string_equal(m.display_name[3], "Dog");
  assert_int_equal(m.line[3], 9);
  assert_int_equal(kiln_labelmap_find_name(&m, "dog"), 3);
  assert_int_equal(kiln_labelmap_find_name(&m, "Dog"), -1);
  assert_int_equal(kiln_labelmap_find_name(&m, "cat"), -1);
  assert_int_equal(kiln_labelmap_find_label(&m, 12), 3);
  assert_int_equal(kiln_labelmap_find_label(&m, 0), 0);
  assert_int_equal(kiln_labelmap_find_label(&m, 3), -1);
  assert_string_equal(m.source, "labelmap_voc.prototxt");
  kiln_labelmap_free(&m);
  kiln_labelmap_free(&m); /* twice is harmless */
}

static void expect_bad_map(const char *text, int code, const char *want1, const char *want2) {
  kiln_labelmap m;
  int rc = kiln_labelmap_parse(text, strlen(text), "map.prototxt", &m);
  if (rc != code) fail_msg("'%s': status %d, want %d (%s)", text, rc, code, kiln_last_error());
  expect_message(want1);
  if (want2) expect_message(want2);
  assert_int_equal(m.n, 0);
  assert_null(m.name);
}

static void test_labelmap_bad(void **state) {
  tmpdir_fixture *f = *state;
  expect_bad_map("item { name: \"a\" label: 0 }\n"
                 "item { name: \"b\" label: 1 }\n"
                 "item {\n  name: \"a\"\n  label: 2\n}\n",
                 KILN_ERR_DATA, "map.prototxt:3: item 1 (line 1) and item 3 (line 3)",
                 "same name 'a' (labels 0 and 2)");
  expect_bad_map("item { name: \"a\" label: 0 }\n"
                 "item { name: \"b\" label: 1 }\n"
                 "item { name: \"c\" label: 1 }\n",
                 KILN_ERR_DATA, "map.prototxt:3: item 2 (line 2) ('b') and item 3 (line 3) ('c')",
                 "same label 1");
  expect_bad_map("item { name: \"a\" label: 0 }\n\nitem { label: 1 }\n", KILN_ERR_DATA,
                 "map.prototxt:3: item 2 (line 3) has no name", NULL);
  expect_bad_map("item { name: \"\" label: 1 }\n", KILN_ERR_DATA,
                 "map.prototxt:1: item 1 (line 1) has an empty name", NULL);
  expect_bad_map("item { name: \"a\" label: 0 }\nitem { name: \"b\" display_name: \"B\" }\n",
                 KILN_ERR_DATA, "map.prototxt:2: item 2 (line 2) ('b') has no label", NULL);
  expect_bad_map("item { name: \"a\" label: -1 }\n", KILN_ERR_DATA, "map.prototxt:1:",
                 "label -1: labels are 0 or more");
  expect_bad_map("item { name: \"a\" label: 0 }\nitem {\n  name: \"b\"\n  lable: 1\n}\n",
                 KILN_ERR_PARSE, "map.prototxt:4:", "unknown field 'lable'");
  expect_bad_map("item { name: \"a\" label: 0 \n", KILN_ERR_PARSE, "map.prototxt:", NULL);
  expect_bad_map("# nothing\n", KILN_ERR_DATA, "map.prototxt: the label map holds no items",
                 NULL);
  /* from a file: its path in the messages, and a missing file */
  char p[256];
  path_in(f, "dup.prototxt", p, sizeof p);
  const char dup[] = "item { name: \"a\" label: 3 }\nitem { name: \"b\" label: 3 }\n";
  write_plain(p, dup, strlen(dup));
  kiln_labelmap m;
  assert_int_equal(kiln_labelmap_read(p, &m), KILN_ERR_DATA);
  expect_message(p);
  expect_message("same label 3");
  assert_int_equal(kiln_labelmap_read(path_in(f, "nope.prototxt", p, sizeof p), &m), KILN_ERR_IO);
  expect_message("nope.prototxt");
}

/* ---- VOC annotations ------------------------------------------------------------------------ */

static const char voc_good[] =
    "<annotation>\n"                                        /* 1 */
    "\t<folder>VOC2007</folder>\n"                          /* 2 */
    "\t<filename>000005.jpg</filename>\n"                   /* 3 */
    "\t<size>\n\t\t<width>500</width>\n"                    /* 4, 5 */
    "\t\t<height>375</height>\n\t\t<depth>3</depth>\n"      /* 6, 7 */
    "\t</size>\n"                                           /* 8 */
    "\t<object>\n"                                          /* 9 */
    "\t\t<name>dog</name>\n\t\t<pose>Left</pose>\n"         /* 10, 11 */
    "\t\t<truncated>1</truncated>\n"                        /* 12 */
    "\t\t<difficult>1</difficult>\n"                        /* 13 */
    "\t\t<bndbox><xmin>263</xmin><ymin>211</ymin>"          /* 14 */
    "<xmax>324</xmax><ymax>339</ymax></bndbox>\n"           /* 14 */
    "\t\t<part><name>head</name><bndbox><xmin>1</xmin><ymin>1</ymin>"
    "<xmax>900</xmax><ymax>2</ymax></bndbox></part>\n"      /* 15: not the object's own */
    "\t</object>\n"                                         /* 16 */
    "\t<object>\n"                                          /* 17 */
    "\t\t<bndbox>\n<xmin> 165.5 </xmin>\n<ymin>1</ymin>\n"  /* 18 - 20 */
    "<xmax>500</xmax>\n<ymax>375</ymax></bndbox>\n"         /* 21, 22 */
    "\t\t<name> <![CDATA[aeroplane]]> </name>\n"            /* 23 */
    "\t\t<difficult>0</difficult>\n"                        /* 24 */
    "\t</object>\n"                                         /* 25 */
    "\t<object><name>dog</name><bndbox><xmin>0</xmin><ymin>0</ymin><xmax>0</xmax>"
    "<ymax>0</ymax></bndbox></object>\n"                    /* 26 */
    "</annotation>\n";

static void test_voc_good(void **state) {
  (void)state;
  kiln_labelmap m = voc_map();
  kiln_voc_annotation a;
  if (kiln_voc_parse(voc_good, strlen(voc_good), "000005.xml", &m, &a))
    fail_msg("%s", kiln_last_error());
  assert_int_equal(a.width, 500);
  assert_int_equal(a.height, 375);
  assert_int_equal(a.depth, 3);
  assert_int_equal(a.n, 3);
  const kiln_voc_object *o = a.object;
  assert_int_equal(o[0].line, 9);
  assert_int_equal(o[0].box.label, 12);
  assert_int_equal(o[0].box.instance_id, 0);
  assert_true(o[0].box.difficult);
  /* exactly the fork's static_cast<float>(xmin) / width */
  assert_true(o[0].box.box.xmin == (float)263 / (float)500);
  assert_true(o[0].box.box.ymin == (float)211 / (float)375);
  assert_true(o[0].box.box.xmax == (float)324 / (float)500);
  assert_true(o[0].box.box.ymax == (float)339 / (float)375);
  assert_true(o[0].pixels[0] == 263 && o[0].pixels[3] == 339);
  assert_int_equal(o[1].line, 17);
  assert_int_equal(o[1].box.label, 1);
  assert_int_equal(o[1].box.instance_id, 0);
  assert_false(o[1].box.difficult);
  assert_true(o[1].pixels[0] == 165.5);
  assert_true(o[1].box.box.xmin == (float)165.5 / (float)500);
  assert_true(o[1].box.box.xmax == 1.0f && o[1].box.box.ymax == 1.0f);
  assert_int_equal(o[2].box.label, 12); /* the second dog */
  assert_int_equal(o[2].box.instance_id, 1);
  assert_false(o[2].box.difficult);
  assert_true(o[2].box.box.xmin == 0 && o[2].box.box.ymax == 0);
  kiln_voc_free(&a);
  kiln_labelmap_free(&m);
}

/* Runs the parse with stderr sent to a file; fails the test when anything was printed. */
static int parse_quietly(const char *xml, const char *name, const kiln_labelmap *m,
                         kiln_voc_annotation *a) {
  char tmp[] = "/tmp/kiln-test-anno-stderr-XXXXXX";
  int fd = mkstemp(tmp);
  assert_true(fd >= 0);
  fflush(stderr);
  int saved = dup(2);
  dup2(fd, 2);
  int rc = kiln_voc_parse(xml, strlen(xml), name, m, a);
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
  struct stat st;
  assert_int_equal(fstat(fd, &st), 0);
  close(fd);
  unlink(tmp);
  if (st.st_size) fail_msg("%s: %lld bytes printed on stderr", name, (long long)st.st_size);
  return rc;
}

typedef struct bad_voc {
  const char *xml;
  int code;
  const char *want, *want2;
} bad_voc;

#define SIZE "<size><width>20</width><height>10</height></size>\n"
#define BOX(a, b, c, d) \
  "<bndbox><xmin>" a "</xmin><ymin>" b "</ymin><xmax>" c "</xmax><ymax>" d "</ymax></bndbox>"

static void test_voc_bad(void **state) {
  (void)state;
  kiln_labelmap m = voc_map();
  static const bad_voc cases[] = {
      /* not well formed: libxml2's message and line */
      {"<annotation>\n" SIZE "<object><name>dog</name>\n</objet>\n</annotation>\n",
       KILN_ERR_PARSE, "a.xml:4: not well-formed XML", "mismatch"},
      {"<annotation>\n" SIZE "<object><name>dog</name>\n", KILN_ERR_PARSE,
       "a.xml:4: not well-formed XML", "Premature end"},
      {"<annotation>\n" SIZE "<object><name>d&og;</name>" BOX("1", "1", "2", "2")
       "</object></annotation>\n", KILN_ERR_PARSE, "a.xml:3: not well-formed XML", "og"},
      {"", KILN_ERR_PARSE, "a.xml:1: an empty file", NULL},
      {" \n\n", KILN_ERR_PARSE, "a.xml:1: an empty file", NULL},
      {"<?xml version=\"1.0\"?>\n<!DOCTYPE a [\n<!ENTITY x SYSTEM \"file:///etc/passwd\">\n]>\n"
       "<annotation>&x;</annotation>\n", KILN_ERR_PARSE, "a.xml:2: a DOCTYPE", NULL},
      {"<?xml version=\"1.0\"?>\n<!DOCTYPE annotation [<!ENTITY a \"aaaaaaaaaa\">"
       "<!ENTITY b \"&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;\">]>\n<annotation>&b;</annotation>\n",
       KILN_ERR_PARSE, "a.xml:2: a DOCTYPE", NULL},
      {"<voc>\n" SIZE "</voc>\n", KILN_ERR_DATA, "a.xml:1: the root element is <voc>", NULL},
      {"<annotation>\n<object><name>dog</name>" BOX("1", "1", "2", "2") "</object>\n</annotation>",
       KILN_ERR_DATA, "a.xml:1: <annotation> has no <size>", NULL},
      {"<annotation>\n<size><width>abc</width><height>10</height></size>\n</annotation>",
       KILN_ERR_DATA, "a.xml:2: <width> 'abc' is not a whole number", NULL},
      {"<annotation>\n<size><width>20</width>\n<height>0</height></size>\n</annotation>",
       KILN_ERR_DATA, "a.xml:3: <height> '0' is not a whole number from 1", NULL},
      {"<annotation>\n<size><width>20</width>\n<height>-5</height></size>\n</annotation>",
       KILN_ERR_DATA, "a.xml:3: <height> '-5'", NULL},
      {"<annotation>\n<size><width>20.5</width><height>10</height></size>\n</annotation>",
       KILN_ERR_DATA, "a.xml:2: <width> '20.5'", NULL},
      {"<annotation>\n<size>\n<height>10</height></size>\n</annotation>", KILN_ERR_DATA,
       "a.xml:2: <size> has no <width>", NULL},
      {"<annotation>\n" SIZE "<filename>x.jpg</filename>\n</annotation>\n", KILN_ERR_DATA,
       "a.xml:1: no objects", NULL},
      {"<annotation>\n" SIZE "<object>\n<name>cat</name>" BOX("1", "1", "2", "2")
       "</object></annotation>", KILN_ERR_DATA, "a.xml:4: object name 'cat' is not in the label "
       "map", "labelmap_voc.prototxt"},
      {"<annotation>\n" SIZE "<object>\n" BOX("1", "1", "2", "2") "</object></annotation>",
       KILN_ERR_DATA, "a.xml:3: an <object> without a <name>", NULL},
      {"<annotation>\n" SIZE "<object>\n<name>dog</name>\n</object></annotation>", KILN_ERR_DATA,
       "a.xml:3: an <object> without a <bndbox>", NULL},
      {"<annotation>\n" SIZE "<object>\n<name>dog</name>\n<name>dog</name>" BOX("1", "1", "2", "2")
       "</object></annotation>", KILN_ERR_DATA, "a.xml:3: an <object> with 2 <name>s", NULL},
      {"<annotation>\n" SIZE "<object><name>dog</name>\n" BOX("12", "1", "11", "2")
       "</object></annotation>", KILN_ERR_DATA, "a.xml:4: box 12 1 11 2", "xmin > xmax"},
      {"<annotation>\n" SIZE "<object><name>dog</name>\n" BOX("1", "3", "11", "2")
       "</object></annotation>", KILN_ERR_DATA, "a.xml:4: box 1 3 11 2", "ymin > ymax"},
      {"<annotation>\n" SIZE "<object><name>dog</name>\n" BOX("-1", "1", "11", "2")
       "</object></annotation>", KILN_ERR_DATA, "a.xml:4:", "outside the 20 x 10 image"},
      {"<annotation>\n" SIZE "<object><name>dog</name>\n" BOX("1", "1", "20.5", "2")
       "</object></annotation>", KILN_ERR_DATA, "a.xml:4:", "xmax 20.5"},
      {"<annotation>\n" SIZE "<object><name>dog</name>\n" BOX("1", "1", "2", "11")
       "</object></annotation>", KILN_ERR_DATA, "a.xml:4:", "ymax 11"},
      {"<annotation>\n" SIZE "<object><name>dog</name>\n<bndbox><xmin>1</xmin><ymin>1</ymin>"
       "\n<xmax>two</xmax><ymax>2</ymax></bndbox></object></annotation>", KILN_ERR_DATA,
       "a.xml:5: <xmax> 'two' is not a number", NULL},
      {"<annotation>\n" SIZE "<object><name>dog</name>\n<bndbox><xmin>1</xmin><ymin>1</ymin>"
       "<xmax>nan</xmax><ymax>2</ymax></bndbox></object></annotation>", KILN_ERR_DATA,
       "a.xml:4: <xmax> 'nan' is not a number", NULL},
      {"<annotation>\n" SIZE "<object><name>dog</name>\n<bndbox><xmin>1</xmin><ymin>1</ymin>"
       "<xmax>2</xmax></bndbox></object></annotation>", KILN_ERR_DATA,
       "a.xml:4: <bndbox> has no <ymax>", NULL},
      {"<annotation>\n" SIZE "<object><name>dog</name>\n<difficult>2</difficult>"
       BOX("1", "1", "2", "2") "</object></annotation>", KILN_ERR_DATA,
       "a.xml:4: <difficult> '2'", NULL},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    kiln_voc_annotation a;
    int rc = parse_quietly(cases[i].xml, "a.xml", &m, &a);
    if (rc != cases[i].code)
      fail_msg("case %zu: status %d, want %d (%s)", i, rc, cases[i].code, kiln_last_error());
    expect_message(cases[i].want);
    if (cases[i].want2) expect_message(cases[i].want2);
    assert_int_equal(a.n, 0);
    assert_null(a.object);
  }
  kiln_labelmap_free(&m);
}

static void test_voc_file(void **state) {
  tmpdir_fixture *f = *state;
  kiln_labelmap m = voc_map();
  char p[256];
  path_in(f, "000005.xml", p, sizeof p);
  write_plain(p, voc_good, strlen(voc_good));
  kiln_voc_annotation a;
  assert_int_equal(kiln_voc_read(p, &m, &a), KILN_OK);
  assert_int_equal(a.n, 3);
  kiln_voc_free(&a);
  const char bad[] = "<annotation>\n" SIZE "<object><name>dog</name>\n" BOX("1", "1", "21", "2")
                     "</object></annotation>";
  write_plain(p, bad, strlen(bad));
  assert_int_equal(kiln_voc_read(p, &m, &a), KILN_ERR_DATA);
  char want[300];
  snprintf(want, sizeof want, "%s:4:", p);
  expect_message(want);
  assert_int_equal(kiln_voc_read(path_in(f, "nope.xml", p, sizeof p), &m, &a), KILN_ERR_IO);
  expect_message("nope.xml");
  kiln_labelmap_free(&m);
}

/* ---- records -------------------------------------------------------------------------------- */

/* Image `seed` of c x h x w planes, smooth enough for JPEG. */
static uint8_t *pattern(int c, int h, int w, int seed) {
  uint8_t *p = malloc((size_t)c * h * w);
  assert_non_null(p);
  for (int k = 0; k < c; k++)
    for (int y = 0; y < h; y++)
      for (int x = 0; x < w; x++) p[((size_t)k * h + y) * w + x] = (uint8_t)(seed * 40 + k * 60 + y * 4 + x * 3);
  return p;
}

/* Writes image `seed` as a PNG or JPEG file at `path`. */
static void write_image(const char *path, bool jpeg, int c, int h, int w, int seed) {
  uint8_t *p = pattern(c, h, w, seed), *out = NULL;
  size_t len = 0;
  assert_int_equal(jpeg ? kiln_image_encode_jpeg(p, c, h, w, 95, &out, &len)
                        : kiln_image_encode_png(p, c, h, w, &out, &len),
                   KILN_OK);
  write_plain(path, out, len);
  free(out);
  free(p);
}

static void expect_box(const kiln_anno_box *b, int label, int instance, float x0, float y0,
                       float x1, float y1, bool difficult) {
  if (b->label != label || b->instance_id != instance || b->box.xmin != x0 ||
      b->box.ymin != y0 || b->box.xmax != x1 || b->box.ymax != y1 || b->difficult != difficult)
    fail_msg("box %d %d %g %g %g %g %d, want %d %d %g %g %g %g %d", b->label, b->instance_id,
             (double)b->box.xmin, (double)b->box.ymin, (double)b->box.xmax, (double)b->box.ymax,
             b->difficult, label, instance, (double)x0, (double)y0, (double)x1, (double)y1,
             difficult);
}

/* A VOC tree in the fixture's folder: images a.png (3 x 10 x 20), b.jpg (3 x 12 x 16), c.png
 * (gray, 1 x 8 x 8), their annotations, the label map and a list naming them in that order. */
static void write_tree(const tmpdir_fixture *f) {
  char p[256];
  write_image(path_in(f, "a.png", p, sizeof p), false, 3, 10, 20, 1);
  write_image(path_in(f, "b.jpg", p, sizeof p), true, 3, 12, 16, 2);
  write_image(path_in(f, "c.png", p, sizeof p), false, 1, 8, 8, 3);
  const char a[] = "<annotation><size><width>20</width><height>10</height></size>\n"
                   "<object><name>dog</name>" BOX("2", "1", "10", "5") "</object>\n"
                   "<object><name>aeroplane</name><difficult>1</difficult>" BOX("0", "0", "20", "10")
                   "</object>\n<object><name>dog</name>" BOX("4", "2", "6", "8") "</object>\n"
                   "</annotation>\n";
  const char b[] = "<annotation><size><width>16</width><height>12</height></size>\n"
                   "<object><name>bicycle</name>" BOX("1", "2", "3", "4") "</object></annotation>";
  const char c[] = "<annotation><size><width>8</width><height>8</height></size>\n"
                   "<object><name>dog</name>" BOX("0", "0", "8", "4") "</object></annotation>";
  write_plain(path_in(f, "a.xml", p, sizeof p), a, strlen(a));
  write_plain(path_in(f, "b.xml", p, sizeof p), b, strlen(b));
  write_plain(path_in(f, "c.xml", p, sizeof p), c, strlen(c));
  write_plain(path_in(f, "labelmap.prototxt", p, sizeof p), labelmap_text, strlen(labelmap_text));
  const char list[] = "a.png a.xml\n\n  b.jpg\tb.xml  \r\nc.png c.xml";
  write_plain(path_in(f, "list.txt", p, sizeof p), list, strlen(list));
}

/* The decoded file `name` in the fixture as the reader should give it. */
static void expect_image(const tmpdir_fixture *f, const char *name, kiln_image_color color,
                         const kiln_datum *d) {
  char p[256];
  kiln_image img = {0};
  assert_int_equal(kiln_image_read(path_in(f, name, p, sizeof p), color, 0, 0, &img), KILN_OK);
  assert_int_equal(d->channels, img.channels);
  assert_int_equal(d->height, img.height);
  assert_int_equal(d->width, img.width);
  assert_non_null(d->u8);
  assert_memory_equal(d->u8, img.data, (size_t)img.channels * img.height * img.width);
  kiln_image_free(&img);
}

/* The records of write_tree's list, in list order, read back both ways. */
static void check_tree_db(const tmpdir_fixture *f, const char *db_path, bool gray, bool encoded) {
  kiln_datum_db *db;
  if (kiln_datum_db_open_annotated(db_path, KILN_DB_ANY, &db)) fail_msg("%s", kiln_last_error());
  assert_true(kiln_datum_db_is_annotated(db));
  assert_int_equal(kiln_datum_db_size(db), 3);
  assert_int_equal(kiln_datum_db_position(db), 0);
  const kiln_image_color color = gray ? KILN_IMAGE_GRAY : KILN_IMAGE_COLOR;
  for (int pass = 0; pass < 2; pass++) {
    kiln_annotated_datum r[3];
    for (int i = 0; i < 3; i++) {
      if (pass == 0) assert_int_equal(kiln_datum_db_next_annotated(db, &r[i]), KILN_OK);
      else assert_int_equal(kiln_datum_db_read_annotated(db, (uint64_t)(2 - i), &r[i]), KILN_OK);
      const int k = pass == 0 ? i : 2 - i;
      static const char *const keys[] = {"00000000_a.png", "00000001_b.jpg", "00000002_c.png"};
      assert_string_equal(kiln_datum_db_last_key(db), keys[k]);
      kiln_annotated_datum *a = &r[i];
      assert_int_equal(a->datum.label, -1);
      if (k == 0) {
        expect_image(f, "a.png", color, &a->datum);
        assert_int_equal(a->n_box, 3); /* aeroplane (1) first, then the dogs (12) */
        expect_box(&a->box[0], 1, 0, 0, 0, 1, 1, true);
        expect_box(&a->box[1], 12, 0, 2.0f / 20, 1.0f / 10, 10.0f / 20, 5.0f / 10, false);
        expect_box(&a->box[2], 12, 1, 4.0f / 20, 2.0f / 10, 6.0f / 20, 8.0f / 10, false);
      } else if (k == 1) {
        expect_image(f, "b.jpg", color, &a->datum);
        assert_int_equal(a->n_box, 1);
        expect_box(&a->box[0], 2, 0, 1.0f / 16, 2.0f / 12, 3.0f / 16, 4.0f / 12, false);
      } else {
        /* c.png is gray: as it is only where one channel was asked for */
        if (encoded && !gray) {
          kiln_image img = {0};
          char p[256];
          assert_int_equal(
              kiln_image_read(path_in(f, "c.png", p, sizeof p), KILN_IMAGE_COLOR, 0, 0, &img),
              KILN_OK);
          assert_int_equal(a->datum.channels, 3);
          assert_memory_equal(a->datum.u8, img.data, 3 * 8 * 8);
          kiln_image_free(&img);
        } else {
          expect_image(f, "c.png", color, &a->datum);
        }
        assert_int_equal(a->n_box, 1);
        expect_box(&a->box[0], 12, 0, 0, 0, 1, 0.5f, false);
      }
    }
    if (pass == 0) assert_int_equal(kiln_datum_db_position(db), 3);
  }
  /* kiln_datum_db_next gives the image alone; the cursor wrapped round to the first */
  kiln_datum d;
  assert_int_equal(kiln_datum_db_next(db, &d), KILN_OK);
  assert_string_equal(kiln_datum_db_last_key(db), "00000000_a.png");
  kiln_datum_db_close(db);
}

static void test_convert_and_read_back(void **state) {
  tmpdir_fixture *f = *state;
  write_tree(f);
  char list[256], map[256], out[256];
  path_in(f, "list.txt", list, sizeof list);
  path_in(f, "labelmap.prototxt", map, sizeof map);
  char root[128];
  snprintf(root, sizeof root, "%s/", f->dir);
  static const struct {
    const char *name;
    bool gray, encoded;
    kiln_db_backend backend;
  } runs[] = {{"raw_lmdb", false, false, KILN_DB_LMDB},
              {"gray_leveldb", true, false, KILN_DB_LEVELDB},
              {"enc_lmdb", false, true, KILN_DB_ANY},
              {"enc_gray_leveldb", true, true, KILN_DB_LEVELDB}};
  for (size_t i = 0; i < sizeof runs / sizeof *runs; i++) {
    kiln_convert_annoset_opts o = {.gray = runs[i].gray, .encoded = runs[i].encoded,
                                   .backend = runs[i].backend};
    uint64_t n = 0, boxes = 0;
    path_in(f, runs[i].name, out, sizeof out);
    if (kiln_convert_annoset(list, root, out, map, &o, &n, &boxes))
      fail_msg("%s: %s", runs[i].name, kiln_last_error());
    assert_int_equal(n, 3);
    assert_int_equal(boxes, 5);
    check_tree_db(f, out, runs[i].gray, runs[i].encoded);
  }

  /* the record's own bytes: type BBOX, groups in ascending label order, instance ids, the
   * file's own bytes in an encoded record (a.png went in as it is) with its shape */
  MDB_env *env;
  MDB_txn *txn;
  MDB_dbi dbi;
  assert_int_equal(mdb_env_create(&env), 0);
  assert_int_equal(mdb_env_open(env, path_in(f, "enc_lmdb", out, sizeof out), MDB_RDONLY, 0664),
                   0);
  assert_int_equal(mdb_txn_begin(env, NULL, MDB_RDONLY, &txn), 0);
  assert_int_equal(mdb_dbi_open(txn, NULL, 0, &dbi), 0);
  MDB_val k = {strlen("00000000_a.png"), "00000000_a.png"}, v;
  assert_int_equal(mdb_get(txn, dbi, &k, &v), 0);
  Caffe__AnnotatedDatum *m = caffe__annotated_datum__unpack(NULL, v.mv_size, v.mv_data);
  assert_non_null(m);
  assert_true(m->has_type && m->type == CAFFE__ANNOTATED_DATUM__ANNOTATION_TYPE__BBOX);
  assert_non_null(m->datum);
  assert_true(m->datum->encoded);
  assert_int_equal(m->datum->label, -1);
  assert_int_equal(m->datum->channels, 3);
  assert_int_equal(m->datum->height, 10);
  assert_int_equal(m->datum->width, 20);
  char *file;
  size_t len;
  assert_int_equal(kiln_read_file(path_in(f, "a.png", out, sizeof out), &file, &len), KILN_OK);
  assert_int_equal(m->datum->data.len, len);
  assert_memory_equal(m->datum->data.data, file, len);
  free(file);
  assert_int_equal(m->n_annotation_group, 2);
  assert_int_equal(m->annotation_group[0]->group_label, 1);
  assert_int_equal(m->annotation_group[0]->n_annotation, 1);
  assert_true(m->annotation_group[0]->annotation[0]->bbox->difficult);
  assert_int_equal(m->annotation_group[1]->group_label, 12);
  assert_int_equal(m->annotation_group[1]->n_annotation, 2);
  assert_int_equal(m->annotation_group[1]->annotation[1]->instance_id, 1);
  assert_true(m->annotation_group[1]->annotation[1]->bbox->has_difficult);
  caffe__annotated_datum__free_unpacked(m, NULL);
  mdb_txn_abort(txn);
  mdb_env_close(env);
}

static void test_convert_options(void **state) {
  tmpdir_fixture *f = *state;
  write_tree(f);
  char list[256], map[256], out[256], ns[256];
  path_in(f, "list.txt", list, sizeof list);
  path_in(f, "labelmap.prototxt", map, sizeof map);
  char root[128];
  snprintf(root, sizeof root, "%s/", f->dir);

  /* resized, re-encoded as JPEG, shuffled, with the name-size file in the list's order */
  kiln_convert_annoset_opts o = {.new_height = 6, .new_width = 7, .encode_type = "jpg",
                                 .shuffle = true, .seed = 3,
                                 .name_size = path_in(f, "name_size.txt", ns, sizeof ns)};
  assert_int_equal(kiln_convert_annoset(list, root, path_in(f, "s1", out, sizeof out), map, &o,
                                        NULL, NULL),
                   KILN_OK);
  char *text;
  size_t len;
  assert_int_equal(kiln_read_file(ns, &text, &len), KILN_OK);
  assert_string_equal(text, "a 10 20\nb 12 16\nc 8 8\n");
  free(text);
  kiln_datum_db *db;
  assert_int_equal(kiln_datum_db_open_annotated(out, KILN_DB_LMDB, &db), KILN_OK);
  char order1[3][64];
  for (int i = 0; i < 3; i++) {
    kiln_annotated_datum a;
    assert_int_equal(kiln_datum_db_next_annotated(db, &a), KILN_OK);
    assert_int_equal(a.datum.channels, 3);
    assert_int_equal(a.datum.height, 6);
    assert_int_equal(a.datum.width, 7);
    snprintf(order1[i], sizeof order1[i], "%s", kiln_datum_db_last_key(db));
    assert_true(order1[i][0] == '0' && order1[i][7] == (char)('0' + i));
  }
  kiln_datum_db_close(db);
  /* the same seed, the same order; the records' images are JPEG files */
  o.name_size = NULL;
  assert_int_equal(kiln_convert_annoset(list, root, path_in(f, "s2", out, sizeof out), map, &o,
                                        NULL, NULL),
                   KILN_OK);
  assert_int_equal(kiln_datum_db_open_annotated(out, KILN_DB_LMDB, &db), KILN_OK);
  bool moved = false;
  for (int i = 0; i < 3; i++) {
    kiln_annotated_datum a;
    assert_int_equal(kiln_datum_db_next_annotated(db, &a), KILN_OK);
    assert_string_equal(kiln_datum_db_last_key(db), order1[i]);
    static const char names[] = "abc";
    moved |= order1[i][9] != names[i];
  }
  assert_true(moved); /* seed 3 moves at least one of three */
  kiln_datum_db_close(db);

  /* --check-size: an image whose size is not its annotation's, both files named */
  const char c_wrong[] = "<annotation><size><width>9</width><height>8</height></size>\n"
                         "<object><name>dog</name>" BOX("0", "0", "8", "4") "</object></annotation>";
  char p[256];
  write_plain(path_in(f, "c.xml", p, sizeof p), c_wrong, strlen(c_wrong));
  kiln_convert_annoset_opts check = {.check_size = true,
                                     .name_size = path_in(f, "ns2.txt", ns, sizeof ns)};
  path_in(f, "s3", out, sizeof out);
  assert_int_equal(kiln_convert_annoset(list, root, out, map, &check, NULL, NULL), KILN_ERR_DATA);
  expect_message("list.txt:4:"); /* c.png's line, past the blank one */
  expect_message("c.png: the image is 8 x 8 (width x height), but its annotation");
  expect_message("c.xml says 9 x 8");
  assert_false(exists(out));
  assert_false(exists(ns));
  char tmp[300];
  snprintf(tmp, sizeof tmp, "%s.tmp", out);
  assert_false(exists(tmp));
  /* without the check it converts, normalised by the annotation's size */
  check.check_size = false;
  assert_int_equal(kiln_convert_annoset(list, root, out, map, &check, NULL, NULL), KILN_OK);
  assert_true(exists(ns));
  /* an existing output is refused, and left as it is */
  assert_int_equal(kiln_convert_annoset(list, root, out, map, &check, NULL, NULL),
                   KILN_ERR_INVALID);
  expect_message("already exists");
}

static void test_convert_errors(void **state) {
  tmpdir_fixture *f = *state;
  write_tree(f);
  char list[256], map[256], out[256], p[300];
  path_in(f, "labelmap.prototxt", map, sizeof map);
  char root[128];
  snprintf(root, sizeof root, "%s/", f->dir);
  path_in(f, "out", out, sizeof out);
  kiln_convert_annoset_opts o = {0};
  static const struct {
    const char *list;
    int code;
    const char *want, *want2;
  } cases[] = {
      {"a.png a.xml\nb.jpg\n", KILN_ERR_PARSE, "bad.txt:2: one field", NULL},
      {"a.png a.xml x\n", KILN_ERR_PARSE, "bad.txt:1: more than two fields", NULL},
      {"\n\n", KILN_ERR_DATA, "bad.txt: the list names no images", NULL},
      {"a.png a.xml\nmissing.png b.xml\n", KILN_ERR_IO, "bad.txt:2:", "missing.png"},
      {"a.png a.xml\nb.jpg missing.xml\n", KILN_ERR_IO, "bad.txt:2:", "missing.xml"},
      {"a.xml a.xml\n", KILN_ERR_DATA, "bad.txt:1:", "not a PNG or JPEG"},
      {"a.png a.png\n", KILN_ERR_PARSE, "bad.txt:1:", "a.png:1: not well-formed XML"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    path_in(f, "bad.txt", list, sizeof list);
    write_plain(list, cases[i].list, strlen(cases[i].list));
    int rc = kiln_convert_annoset(list, root, out, map, &o, NULL, NULL);
    if (rc != cases[i].code)
      fail_msg("case %zu: status %d, want %d (%s)", i, rc, cases[i].code, kiln_last_error());
    expect_message(cases[i].want);
    if (cases[i].want2) expect_message(cases[i].want2);
    assert_false(exists(out));
    snprintf(p, sizeof p, "%s.tmp", out);
    assert_false(exists(p));
  }
  /* a label map with duplicates, before anything is read */
  const char dup[] = "item { name: \"dog\" label: 1 }\nitem { name: \"dog\" label: 2 }\n";
  write_plain(path_in(f, "dup.prototxt", p, sizeof p), dup, strlen(dup));
  assert_int_equal(kiln_convert_annoset(path_in(f, "list.txt", list, sizeof list), root, out, p,
                                        &o, NULL, NULL),
                   KILN_ERR_DATA);
  expect_message("dup.prototxt:2:");
  /* options */
  kiln_convert_annoset_opts bad = {.new_height = 4};
  assert_int_equal(kiln_convert_annoset(list, root, out, map, &bad, NULL, NULL), KILN_ERR_INVALID);
  bad = (kiln_convert_annoset_opts){.encode_type = "gif"};
  assert_int_equal(kiln_convert_annoset(list, root, out, map, &bad, NULL, NULL), KILN_ERR_INVALID);
  expect_message("gif");
  bad = (kiln_convert_annoset_opts){.name_size = list}; /* the list itself */
  assert_int_equal(kiln_convert_annoset(list, root, out, map, &bad, NULL, NULL), KILN_ERR_INVALID);
  assert_false(exists(out));
}

/* An LMDB at `dir` holding the given values under keys "00000000", "00000001", ... */
static void write_raw_lmdb(const char *dir, int n, const ProtobufCMessage *const *msgs,
                           const char *const *raw) {
  assert_int_equal(mkdir(dir, 0775), 0);
  MDB_env *env;
  MDB_txn *txn;
  MDB_dbi dbi;
  assert_int_equal(mdb_env_create(&env), 0);
  assert_int_equal(mdb_env_open(env, dir, 0, 0664), 0);
  assert_int_equal(mdb_txn_begin(env, NULL, 0, &txn), 0);
  assert_int_equal(mdb_dbi_open(txn, NULL, 0, &dbi), 0);
  for (int i = 0; i < n; i++) {
    char key[16];
    snprintf(key, sizeof key, "%08d", i);
    uint8_t buf[4096];
    size_t len = msgs[i] ? protobuf_c_message_pack(msgs[i], buf) : strlen(raw[i]);
    MDB_val k = {strlen(key), key}, v = {len, msgs[i] ? (void *)buf : (void *)raw[i]};
    assert_int_equal(mdb_put(txn, dbi, &k, &v, 0), 0);
  }
  assert_int_equal(mdb_txn_commit(txn), 0);
  mdb_env_close(env);
}

static void test_damaged_records(void **state) {
  tmpdir_fixture *f = *state;
  uint8_t pixels[2 * 3 * 4];
  for (size_t i = 0; i < sizeof pixels; i++) pixels[i] = (uint8_t)i;
  /* a good record: 2 x 3 x 4 raw, one box */
  Caffe__Datum datum = CAFFE__DATUM__INIT;
  datum.has_channels = datum.has_height = datum.has_width = datum.has_data = 1;
  datum.channels = 2, datum.height = 3, datum.width = 4;
  datum.data.data = pixels, datum.data.len = sizeof pixels;
  Caffe__NormalizedBBox bb = CAFFE__NORMALIZED_BBOX__INIT;
  bb.has_xmin = bb.has_xmax = bb.has_ymin = bb.has_ymax = 1;
  bb.xmin = 0.25f, bb.ymin = 0.5f, bb.xmax = 0.75f, bb.ymax = 1;
  Caffe__Annotation an = CAFFE__ANNOTATION__INIT, *anp = &an;
  an.bbox = &bb;
  Caffe__AnnotationGroup g = CAFFE__ANNOTATION_GROUP__INIT, *gp = &g;
  g.has_group_label = 1, g.group_label = 7, g.n_annotation = 1, g.annotation = &anp;
  Caffe__AnnotatedDatum good = CAFFE__ANNOTATED_DATUM__INIT;
  good.datum = &datum, good.n_annotation_group = 1, good.annotation_group = &gp;

  char dir[256], want[400];
  /* damaged in the second record: open reads the first; the second fails naming its key, and
   * the cursor stays on it */
  Caffe__AnnotatedDatum nodatum = good;
  nodatum.datum = NULL;
  const ProtobufCMessage *two[] = {&good.base, &nodatum.base};
  write_raw_lmdb(path_in(f, "second", dir, sizeof dir), 2, two, NULL);
  kiln_datum_db *db;
  assert_int_equal(kiln_datum_db_open_annotated(dir, KILN_DB_LMDB, &db), KILN_OK);
  kiln_annotated_datum a;
  assert_int_equal(kiln_datum_db_next_annotated(db, &a), KILN_OK);
  assert_int_equal(a.datum.channels, 2);
  assert_int_equal(a.n_box, 1);
  expect_box(&a.box[0], 7, 0, 0.25f, 0.5f, 0.75f, 1, false);
  assert_int_equal(kiln_datum_db_next_annotated(db, &a), KILN_ERR_DATA);
  snprintf(want, sizeof want, "%s: record 00000001: an AnnotatedDatum without its datum", dir);
  expect_message(want);
  assert_int_equal(kiln_datum_db_position(db), 1);
  assert_int_equal(kiln_datum_db_read_annotated(db, 1, &a), KILN_ERR_DATA);
  assert_int_equal(kiln_datum_db_read_annotated(db, 0, &a), KILN_OK);
  assert_int_equal(kiln_datum_db_read_annotated(db, 2, &a), KILN_ERR_INVALID);
  kiln_datum_db_close(db);

  /* damaged first records: refused at open */
  Caffe__Annotation nobox = an, *nbp = &nobox;
  nobox.bbox = NULL;
  Caffe__AnnotationGroup g2 = g, *g2p = &g2;
  g2.annotation = &nbp;
  Caffe__AnnotatedDatum no_bbox = good;
  no_bbox.annotation_group = &g2p;
  Caffe__NormalizedBBox nan_bb = bb;
  nan_bb.ymax = NAN;
  Caffe__Annotation nan_an = an, *nan_anp = &nan_an;
  nan_an.bbox = &nan_bb;
  Caffe__AnnotationGroup g3 = g, *g3p = &g3;
  g3.annotation = &nan_anp;
  Caffe__AnnotatedDatum nan_box = good;
  nan_box.annotation_group = &g3p;
  Caffe__AnnotatedDatum other_type = good;
  other_type.has_type = 1, other_type.type = 3;
  Caffe__Datum short_data = datum;
  short_data.data.len = 5;
  Caffe__AnnotatedDatum short_datum = good;
  short_datum.datum = &short_data;
  static const struct {
    const char *name;
    int code;
    const char *want;
  } cases[] = {
      {"garbage", KILN_ERR_DATA, "record 00000000: not an AnnotatedDatum"},
      {"plain", KILN_ERR_DATA, "record 00000000: not an AnnotatedDatum"},
      {"no_bbox", KILN_ERR_DATA, "record 00000000: annotation 0 of group 0 (label 7) has no bbox"},
      {"nan", KILN_ERR_DATA, "record 00000000: annotation 0 of group 0 (label 7): bbox"},
      {"type", KILN_ERR_UNSUPPORTED, "record 00000000: annotation type 3"},
      {"short", KILN_ERR_DATA, "record 00000000: data holds 5 bytes"},
  };
  const ProtobufCMessage *msgs[] = {NULL, &datum.base, &no_bbox.base, &nan_box.base,
                                    &other_type.base, &short_datum.base};
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    const char *raw[] = {"\xff\xff\xff garbage"};
    write_raw_lmdb(path_in(f, cases[i].name, dir, sizeof dir), 1, &msgs[i], raw);
    db = (kiln_datum_db *)1;
    int rc = kiln_datum_db_open_annotated(dir, KILN_DB_ANY, &db);
    if (rc != cases[i].code)
      fail_msg("%s: status %d, want %d (%s)", cases[i].name, rc, cases[i].code,
               kiln_last_error());
    assert_null(db);
    expect_message(dir);
    expect_message(cases[i].want);
  }
  /* a plain database opened plainly is not annotated */
  assert_int_equal(kiln_datum_db_open(path_in(f, "plain", dir, sizeof dir), &db), KILN_OK);
  assert_false(kiln_datum_db_is_annotated(db));
  assert_int_equal(kiln_datum_db_next_annotated(db, &a), KILN_ERR_INVALID);
  kiln_datum_db_close(db);
}

static void test_writer_groups(void **state) {
  tmpdir_fixture *f = *state;
  char out[256];
  kiln_datum_writer *w;
  assert_int_equal(kiln_datum_writer_open_as(path_in(f, "w", out, sizeof out), KILN_DB_LEVELDB, &w),
                   KILN_OK);
  uint8_t *p = pattern(1, 5, 6, 1);
  kiln_datum img = {.channels = 1, .height = 5, .width = 6, .label = 4, .u8 = p};
  const kiln_anno_box boxes[] = {{5, 0, false, {0.1f, 0.1f, 0.2f, 0.2f}},
                                 {2, 0, true, {0.3f, 0.3f, 0.4f, 0.4f}},
                                 {5, 7, false, {0.5f, 0.5f, 0.6f, 0.6f}},
                                 {2, 3, false, {0.7f, 0.7f, 0.8f, 0.8f}}};
  assert_int_equal(kiln_datum_writer_put_annotated(w, "r0", &img, NULL, 0, boxes, 4), KILN_OK);
  assert_int_equal(kiln_datum_writer_put_annotated(w, "r1", &img, NULL, 0, NULL, 0), KILN_OK);
  const kiln_anno_box nan_box = {1, 0, false, {NAN, 0, 1, 1}};
  assert_int_equal(kiln_datum_writer_put_annotated(w, "r2", &img, NULL, 0, &nan_box, 1),
                   KILN_ERR_INVALID);
  kiln_datum f32 = {.channels = 1, .height = 1, .width = 1, .f32 = (const float[]){1}};
  assert_int_equal(kiln_datum_writer_put_annotated(w, "r2", &f32, NULL, 0, NULL, 0),
                   KILN_ERR_INVALID);
  assert_int_equal(kiln_datum_writer_commit(w), KILN_OK);
  kiln_datum_db *db;
  assert_int_equal(kiln_datum_db_open_annotated(out, KILN_DB_LEVELDB, &db), KILN_OK);
  kiln_annotated_datum a;
  assert_int_equal(kiln_datum_db_next_annotated(db, &a), KILN_OK);
  assert_int_equal(a.datum.label, 4);
  assert_memory_equal(a.datum.u8, p, 30);
  assert_int_equal(a.n_box, 4); /* label 2's in the order given, then label 5's */
  expect_box(&a.box[0], 2, 0, 0.3f, 0.3f, 0.4f, 0.4f, true);
  expect_box(&a.box[1], 2, 3, 0.7f, 0.7f, 0.8f, 0.8f, false);
  expect_box(&a.box[2], 5, 0, 0.1f, 0.1f, 0.2f, 0.2f, false);
  expect_box(&a.box[3], 5, 7, 0.5f, 0.5f, 0.6f, 0.6f, false);
  assert_int_equal(kiln_datum_db_next_annotated(db, &a), KILN_OK);
  assert_int_equal(a.n_box, 0);
  assert_null(a.box);
  kiln_datum_db_close(db);
  free(p);
}

static void test_jpeg_encode(void **state) {
  (void)state;
  for (int c = 1; c <= 3; c += 2) {
    uint8_t *p = malloc((size_t)c * 17 * 23), *out = NULL;
    assert_non_null(p);
    for (int k = 0; k < c; k++) /* smooth planes, far apart: a swapped plane would show */
      for (int y = 0; y < 17; y++)
        for (int x = 0; x < 23; x++) p[(k * 17 + y) * 23 + x] = (uint8_t)(30 + k * 80 + y + x);
    size_t len = 0;
    assert_int_equal(kiln_image_encode_jpeg(p, c, 17, 23, 95, &out, &len), KILN_OK);
    assert_string_equal(kiln_image_format(out, len), "jpeg");
    kiln_image img = {0};
    assert_int_equal(kiln_image_decode(out, len, KILN_IMAGE_AS_IS, 0, 0, "jpeg", &img), KILN_OK);
    assert_int_equal(img.channels, c);
    assert_int_equal(img.height, 17);
    assert_int_equal(img.width, 23);
    double err = 0;
    for (size_t i = 0; i < (size_t)c * 17 * 23; i++) err += fabs((double)img.data[i] - p[i]);
    err /= c * 17 * 23;
    if (err > 3) fail_msg("%d channels: mean error %.2f levels", c, err);
    kiln_image_free(&img);
    free(out);
    free(p);
  }
  uint8_t one = 0, *out = NULL;
  size_t len;
  assert_int_equal(kiln_image_encode_jpeg(&one, 2, 1, 1, 95, &out, &len), KILN_ERR_INVALID);
  assert_int_equal(kiln_image_encode_jpeg(&one, 1, 1, 1, 0, &out, &len), KILN_ERR_INVALID);
  assert_int_equal(kiln_image_encode_jpeg(&one, 1, 0, 1, 95, &out, &len), KILN_ERR_INVALID);
  assert_null(out);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_labelmap_good),
      cmocka_unit_test_setup_teardown(test_labelmap_bad, setup, tmpdir_teardown),
      cmocka_unit_test(test_voc_good),
      cmocka_unit_test(test_voc_bad),
      cmocka_unit_test_setup_teardown(test_voc_file, setup, tmpdir_teardown),
      cmocka_unit_test_setup_teardown(test_convert_and_read_back, setup, tmpdir_teardown),
      cmocka_unit_test_setup_teardown(test_convert_options, setup, tmpdir_teardown),
      cmocka_unit_test_setup_teardown(test_convert_errors, setup, tmpdir_teardown),
      cmocka_unit_test_setup_teardown(test_damaged_records, setup, tmpdir_teardown),
      cmocka_unit_test_setup_teardown(test_writer_groups, setup, tmpdir_teardown),
      cmocka_unit_test(test_jpeg_encode),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
