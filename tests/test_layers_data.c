/* Layers that produce data. DummyData: its shapes and fills (constant tops filled once, the
 * others refilled each pass from the net's generator), its bad parameters. Data: batches in key
 * order with wrap-around, the transform ((x - mean) * scale, centre crop in TEST, random crop and
 * mirror in TRAIN), exact cursors for resume, its parameter errors, and the share each
 * data-parallel worker reads. ImageData: a batch from a list of PNG files. MemoryData: Caffe's
 * shapes, tops the caller writes, its bad parameters, a V1 net's MEMORY_DATA. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kiln/data.h"
#include "layer_test.h"

/* ---- DummyData --------------------------------------------------------------------------- */

static void expect_all(const char *what, const kiln_blob *b, float v) {
  for (int64_t i = 0; i < b->count; i++)
    if (b->data[i] != v) {
      print_error("%s[%lld] = %g, want %g\n", what, (long long)i, (double)b->data[i], (double)v);
      fail();
    }
}

static void test_dummy_data_shapes_and_constants(void **state) {
  (void)state;
  /* one shape and one filler for both tops */
  built a = build("name: 'dd' type: 'DummyData' dummy_data_param { shape { dim: 2 dim: 3 } "
                  "data_filler { type: 'constant' value: 3 } }",
                  TRAIN, NULL, 0, 2);
  assert_true(a.l->ops->is_data);
  assert_null(a.l->ops->backward);
  forward(&a);
  expect_shape(a.top[0], 2, SHAPE(2, 3));
  expect_shape(a.top[1], 2, SHAPE(2, 3));
  expect_all("constant top 0", a.top[0], 3);
  expect_all("constant top 1", a.top[1], 3);
  unbuild(&a);
  /* a shape per top, no filler: zeros */
  built b = build("name: 'dd' type: 'DummyData' dummy_data_param { shape { dim: 4 } shape { dim: "
                  "1 dim: 2 dim: 3 dim: 1 } }",
                  TRAIN, NULL, 0, 2);
  forward(&b);
  expect_shape(b.top[0], 1, SHAPE(4));
  expect_shape(b.top[1], 4, SHAPE(1, 2, 3, 1));
  expect_all("zero top 0", b.top[0], 0);
  expect_all("zero top 1", b.top[1], 0);
  unbuild(&b);
  /* legacy num/channels/height/width, each once or once per top */
  built c = build("name: 'dd' type: 'DummyData' dummy_data_param { num: 2 num: 5 channels: 3 "
                  "height: 1 width: 4 width: 2 }",
                  TRAIN, NULL, 0, 2);
  expect_shape(c.top[0], 4, SHAPE(2, 3, 1, 4));
  expect_shape(c.top[1], 4, SHAPE(5, 3, 1, 2));
  unbuild(&c);
}

/* Constant tops are filled once and never again (a value written into one stays); the others
 * are refilled on every forward pass, from the net's generator (so the same seed repeats). */
static void test_dummy_data_refill(void **state) {
  (void)state;
  const char *text = "name: 'dd' type: 'DummyData' dummy_data_param { shape { dim: 3 dim: 4 } "
                     "data_filler { type: 'constant' value: 1.5 } "
                     "data_filler { type: 'uniform' min: 2 max: 3 } "
                     "data_filler { type: 'gaussian' std: 0.5 } }";
  built a = build(text, TRAIN, NULL, 0, 3);
  built twin = build(text, TRAIN, NULL, 0, 3);
  forward(&a);
  forward(&twin);
  expect_all("constant", a.top[0], 1.5f);
  for (int64_t i = 0; i < a.top[1]->count; i++)
    assert_true(a.top[1]->data[i] >= 2 && a.top[1]->data[i] < 3);
  for (int t = 1; t < 3; t++)
    expect_close("same seed, same fill", twin.top[t]->data, a.top[t]->data, 12, 0);
  float before[12], gauss[12];
  memcpy(before, a.top[1]->data, sizeof before);
  memcpy(gauss, a.top[2]->data, sizeof gauss);
  a.top[0]->data[5] = -9;
  forward(&a);
  assert_float_equal(a.top[0]->data[5], -9, 0); /* not refilled */
  assert_float_equal(a.top[0]->data[4], 1.5f, 0);
  int same = 0, same_g = 0;
  for (int i = 0; i < 12; i++) {
    same += a.top[1]->data[i] == before[i];
    same_g += a.top[2]->data[i] == gauss[i];
    assert_true(a.top[1]->data[i] >= 2 && a.top[1]->data[i] < 3);
  }
  assert_true(same < 12);
  assert_true(same_g < 12);
  unbuild(&twin);
  unbuild(&a);
}

static void test_dummy_data_bad_parameters(void **state) {
  (void)state;
  expect_create_fails("name: 'd1' type: 'DummyData' dummy_data_param { shape { dim: 2 } shape { "
                      "dim: 3 } }",
                      TRAIN, NULL, 0, 3, KILN_ERR_INVALID, "layer 'd1' (DummyData)",
                      "'shape' once or once per top (3 tops), got 2");
  expect_create_fails("name: 'd2' type: 'DummyData'", TRAIN, NULL, 0, 1, KILN_ERR_INVALID,
                      "layer 'd2' (DummyData)", "got 0");
  expect_create_fails("name: 'd3' type: 'DummyData' dummy_data_param { shape { dim: 2 } "
                      "data_filler { value: 1 } data_filler { value: 2 } }",
                      TRAIN, NULL, 0, 3, KILN_ERR_INVALID, "layer 'd3' (DummyData)",
                      "data_filler");
  expect_create_fails("name: 'd4' type: 'DummyData' dummy_data_param { num: 2 channels: 1 "
                      "height: 1 width: 1 shape { dim: 2 } }",
                      TRAIN, NULL, 0, 1, KILN_ERR_INVALID, "layer 'd4' (DummyData)", "both");
  expect_create_fails("name: 'd5' type: 'DummyData' dummy_data_param { num: 2 num: 3 channels: "
                      "1 height: 1 width: 1 }",
                      TRAIN, NULL, 0, 3, KILN_ERR_INVALID, "layer 'd5' (DummyData)", "'num'");
  expect_create_fails("name: 'd6' type: 'DummyData' dummy_data_param { num: 2 height: 1 width: "
                      "1 }",
                      TRAIN, NULL, 0, 1, KILN_ERR_INVALID, "layer 'd6' (DummyData)",
                      "'channels'");
  expect_create_fails("name: 'd7' type: 'DummyData' dummy_data_param { shape { dim: 2 } "
                      "data_filler { type: 'bogus' } }",
                      TRAIN, NULL, 0, 1, KILN_ERR_INVALID, "layer 'd7' (DummyData)", "bogus");
  kiln_blob *x = blob_of("x", 1, SHAPE(2), NULL);
  expect_create_fails("name: 'd8' type: 'DummyData' dummy_data_param { shape { dim: 2 } }", TRAIN,
                      &x, 1, 1, KILN_ERR_INVALID, "layer 'd8' (DummyData)", "bottom");
  kiln_blob_free(x);
}

/* ---- MemoryData ---------------------------------------------------------------------------- */

/* The tops take memory_data_param's shapes (data N x C x H x W, label N), and a forward pass
 * leaves what the caller wrote in them; the tools that feed made-up data know it as theirs. */
static void test_memory_data_tops_fed_by_caller(void **state) {
  (void)state;
  built a = build("name: 'm' type: 'MemoryData' memory_data_param { batch_size: 2 channels: 3 "
                  "height: 4 width: 5 }",
                  TRAIN, NULL, 0, 2);
  assert_true(a.l->ops->is_data);
  assert_true(a.l->ops->fed_by_caller);
  expect_shape(a.top[0], 4, SHAPE(2, 3, 4, 5));
  expect_shape(a.top[1], 1, SHAPE(2));
  for (int64_t i = 0; i < a.top[0]->count; i++) a.top[0]->data[i] = (float)i * 0.5f;
  a.top[1]->data[0] = 7, a.top[1]->data[1] = 3;
  forward(&a);
  for (int64_t i = 0; i < a.top[0]->count; i++) assert_true(a.top[0]->data[i] == (float)i * 0.5f);
  assert_true(a.top[1]->data[0] == 7 && a.top[1]->data[1] == 3);
  unbuild(&a);

  /* in a V1 net, upgraded on load, feeding a layer */
  const char *v1 = "name: 'n'\n"
                   "layers { name: 'm' type: MEMORY_DATA top: 'data' top: 'label'\n"
                   "  memory_data_param { batch_size: 4 channels: 1 height: 2 width: 3 } }\n"
                   "layers { name: 'ip' type: INNER_PRODUCT bottom: 'data' top: 'ip'\n"
                   "  inner_product_param { num_output: 2 } }\n"
                   "layers { name: 'loss' type: SOFTMAX_LOSS bottom: 'ip' bottom: 'label' }\n";
  Caffe__NetParameter *np = NULL;
  assert_int_equal(kiln_net_param_from_text(v1, "v1.prototxt", &np), KILN_OK);
  kiln_net_options o = {.phase = TRAIN, .seed = 1, .config = kiln_test_net_config()};
  kiln_net *net = NULL;
  assert_int_equal(kiln_net_create(np, &o, &net), KILN_OK);
  expect_shape(kiln_net_blob(net, "data"), 4, SHAPE(4, 1, 2, 3));
  expect_shape(kiln_net_blob(net, "label"), 1, SHAPE(4));
  assert_int_equal(net->layers[0]->ntop, 2);
  assert_string_equal(net->layers[0]->ops->type, "MemoryData");
  kiln_net_free(net);
  protobuf_c_message_free_unpacked(&np->base, NULL);
}

static void test_memory_data_bad_parameters(void **state) {
  (void)state;
  expect_create_fails("name: 'm1' type: 'MemoryData'", TRAIN, NULL, 0, 2, KILN_ERR_INVALID,
                      "layer 'm1' (MemoryData)", "memory_data_param is required");
  expect_create_fails("name: 'm2' type: 'MemoryData' memory_data_param { batch_size: 2 "
                      "height: 4 width: 5 }",
                      TRAIN, NULL, 0, 2, KILN_ERR_INVALID, "layer 'm2' (MemoryData)",
                      "memory_data_param.channels is 0");
  expect_create_fails("name: 'm3' type: 'MemoryData' memory_data_param { batch_size: 2 "
                      "channels: 1 height: 4 width: 5 } transform_param { scale: 0.5 }",
                      TRAIN, NULL, 0, 2, KILN_ERR_UNSUPPORTED, "layer 'm3' (MemoryData)",
                      "transform_param is not applied");
  expect_create_fails("name: 'm4' type: 'MemoryData' memory_data_param { batch_size: 2 "
                      "channels: 1 height: 4 width: 5 }",
                      TRAIN, NULL, 0, 1, KILN_ERR_INVALID, "MemoryData", "2 to 2 top(s), got 1");
}

/* ---- Data -------------------------------------------------------------------------------- */

enum { NREC = 10, C = 2, H = 4, W = 4 };
/* db: NREC records labelled 0..NREC-1; db2 (for mixing): NREC2 records labelled 100 + r, the
 * same shape; db3: records of another shape. */
enum { NREC2 = 7, LABEL2 = 100 };
static char dir[256], db_path[300], db2_path[300], db3_path[300], ldb_path[300], ldb2_path[300];
/* What open_layer and mixed read: the LMDBs, or the LevelDB copies of db and db2 */
static const char *src1 = db_path, *src2 = db2_path, *backend = "backend: LMDB";

static uint8_t pixel(int rec, int c, int h, int w) { return (uint8_t)(rec * 16 + c * 7 + h * 4 + w); }

static int write_db(const char *path, kiln_db_backend b, int n, int label0, int channels) {
  kiln_datum_writer *w;
  if (kiln_datum_writer_open_as(path, b, &w)) return -1;
  for (int r = 0; r < n; r++) {
    uint8_t px[C * H * W];
    for (int c = 0; c < channels; c++)
      for (int h = 0; h < H; h++)
        for (int x = 0; x < W; x++) px[(c * H + h) * W + x] = pixel(label0 + r, c, h, x);
    kiln_datum d = {.channels = channels, .height = H, .width = W, .label = label0 + r, .u8 = px};
    char key[16];
    snprintf(key, sizeof key, "%08d", r);
    if (kiln_datum_writer_put(w, key, &d)) return -1;
  }
  return kiln_datum_writer_commit(w) ? -1 : 0;
}

static int make_db(void **state) {
  (void)state;
  snprintf(dir, sizeof dir, "/tmp/kiln-data-layer-XXXXXX");
  if (!mkdtemp(dir)) return -1;
  snprintf(db_path, sizeof db_path, "%s/db", dir);
  snprintf(db2_path, sizeof db2_path, "%s/db2", dir);
  snprintf(db3_path, sizeof db3_path, "%s/db3", dir);
  snprintf(ldb_path, sizeof ldb_path, "%s/ldb", dir);
  snprintf(ldb2_path, sizeof ldb2_path, "%s/ldb2", dir);
  return write_db(db_path, KILN_DB_LMDB, NREC, 0, C) ||
                 write_db(db2_path, KILN_DB_LMDB, NREC2, LABEL2, C) ||
                 write_db(db3_path, KILN_DB_LMDB, 3, 200, 1) ||
                 write_db(ldb_path, KILN_DB_LEVELDB, NREC, 0, C) ||
                 write_db(ldb2_path, KILN_DB_LEVELDB, NREC2, LABEL2, C)
             ? -1
             : 0;
}

static int remove_db(void **state) {
  (void)state;
  char cmd[400];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  return system(cmd);
}

typedef struct {
  Caffe__LayerParameter *lp;
  kiln_blob *top[2];
  kiln_layer *l;
} data_layer;

static int open_layer(data_layer *d, const char *extra, int phase, uint64_t seed) {
  char text[1024];
  snprintf(text, sizeof text,
           "name: 'd' type: 'Data' top: 'data' top: 'label' data_param { source: '%s' %s %s",
           src1, backend, extra);
  d->lp = gc_layer_param(text);
  d->top[0] = kiln_blob_new("data");
  d->top[1] = kiln_blob_new("label");
  return kiln_layer_create(d->lp, phase, NULL, 0, d->top, 2, seed, kiln_test_config(), &d->l);
}

static void close_layer(data_layer *d) {
  kiln_layer_free(d->l);
  kiln_blob_free(d->top[0]);
  kiln_blob_free(d->top[1]);
  protobuf_c_message_free_unpacked(&d->lp->base, NULL);
}

static void test_batches_transform_and_wrap(void **state) {
  (void)state;
  data_layer d;
  assert_int_equal(open_layer(&d, "batch_size: 4 } transform_param { scale: 0.5 mean_value: 1 mean_value: 2 }",
                              CAFFE__PHASE__TRAIN, 1), KILN_OK);
  assert_int_equal(d.top[0]->naxes, 4);
  assert_int_equal(d.top[0]->shape[0], 4);
  assert_int_equal(d.top[0]->shape[1], C);
  int expect_labels[3][4] = {{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9, 0, 1}};
  for (int b = 0; b < 3; b++) {
    assert_int_equal(layer_forward(d.l), KILN_OK);
    for (int i = 0; i < 4; i++) {
      int rec = expect_labels[b][i];
      assert_true(d.top[1]->data[i] == (float)rec);
      for (int c = 0; c < C; c++)
        for (int h = 0; h < H; h++)
          for (int x = 0; x < W; x++) {
            float want = (pixel(rec, c, h, x) - (c == 0 ? 1.0f : 2.0f)) * 0.5f;
            assert_true(d.top[0]->data[((i * C + c) * H + h) * W + x] == want);
          }
    }
  }
  assert_int_equal(d.l->ops->get_cursor(d.l), 12);
  close_layer(&d);
}

static void test_cursor_resumes_exactly(void **state) {
  (void)state;
  data_layer a, b;
  const char *p = "batch_size: 3 } transform_param { crop_size: 3 mirror: true }";
  assert_int_equal(open_layer(&a, p, CAFFE__PHASE__TRAIN, 5), KILN_OK);
  assert_int_equal(open_layer(&b, p, CAFFE__PHASE__TRAIN, 5), KILN_OK);
  for (int i = 0; i < 2; i++) assert_int_equal(layer_forward(a.l), KILN_OK);
  uint64_t cur = a.l->ops->get_cursor(a.l);
  assert_int_equal(cur, 6);
  assert_int_equal(b.l->ops->set_cursor(b.l, cur), KILN_OK);
  for (int i = 0; i < 4; i++) { /* crosses the wrap-around */
    assert_int_equal(layer_forward(a.l), KILN_OK);
    assert_int_equal(layer_forward(b.l), KILN_OK);
    assert_memory_equal(a.top[0]->data, b.top[0]->data, sizeof(float) * a.top[0]->count);
    assert_memory_equal(a.top[1]->data, b.top[1]->data, sizeof(float) * 3);
  }
  close_layer(&a);
  close_layer(&b);
}

/* TEST: centre crop, no mirror. TRAIN: every sample is some 3x3 window of its record, mirrored
 * or not, and over many records both mirror states and several offsets occur. */
static void test_crop_and_mirror(void **state) {
  (void)state;
  data_layer t;
  assert_int_equal(open_layer(&t, "batch_size: 2 } transform_param { crop_size: 2 mirror: true }",
                              CAFFE__PHASE__TEST, 1), KILN_OK);
  assert_int_equal(t.top[0]->shape[2], 2);
  assert_int_equal(layer_forward(t.l), KILN_OK);
  for (int c = 0; c < C; c++)
    for (int h = 0; h < 2; h++)
      for (int x = 0; x < 2; x++)
        assert_true(t.top[0]->data[(c * 2 + h) * 2 + x] == pixel(0, c, h + 1, x + 1));
  close_layer(&t);

  data_layer d;
  assert_int_equal(open_layer(&d, "batch_size: 10 } transform_param { crop_size: 3 mirror: true }",
                              CAFFE__PHASE__TRAIN, 3), KILN_OK);
  int seen_flip = 0, seen_plain = 0, offsets = 0;
  for (int rep = 0; rep < 4; rep++) {
    assert_int_equal(layer_forward(d.l), KILN_OK);
    for (int i = 0; i < 10; i++) {
      const float *out = d.top[0]->data + i * C * 9;
      int rec = (int)d.top[1]->data[i];
      bool found = false;
      for (int ho = 0; ho <= 1 && !found; ho++)
        for (int wo = 0; wo <= 1 && !found; wo++)
          for (int flip = 0; flip <= 1 && !found; flip++) {
            bool ok = true;
            for (int c = 0; c < C && ok; c++)
              for (int h = 0; h < 3 && ok; h++)
                for (int x = 0; x < 3 && ok; x++) {
                  int sx = flip ? 2 - x : x;
                  ok = out[(c * 3 + h) * 3 + x] == pixel(rec, c, h + ho, sx + wo);
                }
            if (ok) {
              found = true;
              flip ? seen_flip++ : seen_plain++;
              offsets |= 1 << (ho * 2 + wo);
            }
          }
      assert_true(found);
    }
  }
  assert_true(seen_flip > 5 && seen_plain > 5);
  assert_true(offsets == 0xf);
  close_layer(&d);
}

static void expect_fail(const char *extra, const char *want) {
  data_layer d;
  int rc = open_layer(&d, extra, CAFFE__PHASE__TRAIN, 1);
  assert_int_not_equal(rc, KILN_OK);
  if (!strstr(kiln_last_error(), want)) fail_msg("message '%s' lacks '%s'", kiln_last_error(), want);
  assert_non_null(strstr(kiln_last_error(), "layer 'd'"));
  kiln_blob_free(d.top[0]);
  kiln_blob_free(d.top[1]);
  protobuf_c_message_free_unpacked(&d.lp->base, NULL);
}

static void test_errors(void **state) {
  (void)state;
  expect_fail("batch_size: 0 }", "batch_size");
  expect_fail("batch_size: 2 } transform_param { crop_size: 5 }", "crop_size 5");
  expect_fail("batch_size: 2 } transform_param { mean_value: 1 mean_value: 2 mean_value: 3 }",
              "mean_value");
  expect_fail("batch_size: 2 } transform_param { mean_file: '/nonexistent/mean.binaryproto' }",
              "/nonexistent/mean.binaryproto");
}

/* A source that is not there is refused naming it (a backend that does not match what the
 * source holds: test_datum_leveldb.c). */
static void test_missing_source(void **state) {
  (void)state;
  kiln_blob *top = kiln_blob_new("data");
  kiln_layer *l;
  Caffe__LayerParameter *lp = gc_layer_param("name: 'd' type: 'Data' top: 'data' data_param { source: '/nonexistent/db' "
                      "batch_size: 2 backend: LMDB }");
  assert_int_not_equal(kiln_layer_create(lp, 0, NULL, 0, &top, 1, 1, kiln_test_config(), &l), KILN_OK);
  assert_non_null(strstr(kiln_last_error(), "/nonexistent/db"));
  protobuf_c_message_free_unpacked(&lp->base, NULL);
  kiln_blob_free(top);
}

/* Labels of the next batch (records carry their index as label). */
static int next_labels(data_layer *d, int *labels) {
  assert_int_equal(layer_forward(d->l), KILN_OK);
  int n = (int)d->top[1]->shape[0];
  for (int i = 0; i < n; i++) labels[i] = (int)d->top[1]->data[i];
  return n;
}

static void test_shuffle_per_epoch(void **state) {
  (void)state;
  data_layer a, b, c;
  const char *p = "batch_size: 5 shuffle: true }";
  assert_int_equal(open_layer(&a, p, CAFFE__PHASE__TRAIN, 7), KILN_OK);
  assert_int_equal(open_layer(&b, p, CAFFE__PHASE__TRAIN, 7), KILN_OK);
  assert_int_equal(open_layer(&c, p, CAFFE__PHASE__TRAIN, 8), KILN_OK);
  int ea[4][5], eb[5], ec[4][5];
  for (int k = 0; k < 4; k++) {
    assert_int_equal(next_labels(&a, ea[k]), 5);
    next_labels(&c, ec[k]);
    next_labels(&b, eb);
    assert_memory_equal(ea[k], eb, sizeof eb); /* same seed, same order */
  }
  for (int epoch = 0; epoch < 2; epoch++) { /* each epoch is a permutation of all records */
    int seen[NREC] = {0};
    for (int k = 0; k < 2; k++)
      for (int i = 0; i < 5; i++) seen[ea[2 * epoch + k][i]]++;
    for (int r = 0; r < NREC; r++) assert_int_equal(seen[r], 1);
  }
  bool identity = true;
  for (int i = 0; i < 10; i++) identity &= ea[i / 5][i % 5] == i;
  assert_false(identity);
  assert_true(memcmp(ea[0], ea[2], sizeof ea[0]) != 0 || memcmp(ea[1], ea[3], sizeof ea[1]) != 0);
  assert_true(memcmp(ea, ec, sizeof ea) != 0); /* another seed, another order */
  /* resume mid-epoch from the cursor */
  data_layer r;
  assert_int_equal(open_layer(&r, p, CAFFE__PHASE__TRAIN, 7), KILN_OK);
  assert_int_equal(r.l->ops->set_cursor(r.l, 15), KILN_OK);
  int er[5];
  next_labels(&r, er);
  assert_memory_equal(er, ea[3], sizeof er);
  close_layer(&a);
  close_layer(&b);
  close_layer(&c);
  close_layer(&r);
}

static void test_last_batch_drop_and_keep(void **state) {
  (void)state;
  data_layer d, k, w;
  int lab[8];
  assert_int_equal(open_layer(&d, "batch_size: 4 last_batch: DROP }", CAFFE__PHASE__TRAIN, 1), KILN_OK);
  int drop_expect[3][4] = {{0, 1, 2, 3}, {4, 5, 6, 7}, {0, 1, 2, 3}};
  for (int b = 0; b < 3; b++) {
    assert_int_equal(next_labels(&d, lab), 4);
    assert_memory_equal(lab, drop_expect[b], sizeof drop_expect[b]);
  }
  assert_int_equal(d.l->ops->get_cursor(d.l), 14); /* records 8 and 9 skipped */
  close_layer(&d);

  assert_int_equal(open_layer(&k, "batch_size: 4 last_batch: KEEP }", CAFFE__PHASE__TRAIN, 1), KILN_OK);
  assert_int_equal(next_labels(&k, lab), 4);
  assert_false(k.l->reshaped);
  assert_int_equal(next_labels(&k, lab), 4);
  assert_int_equal(next_labels(&k, lab), 2); /* the kept remainder */
  assert_true(lab[0] == 8 && lab[1] == 9);
  assert_true(k.l->reshaped);
  assert_int_equal(k.top[0]->shape[0], 2);
  k.l->reshaped = false;
  assert_int_equal(next_labels(&k, lab), 4);
  assert_true(lab[0] == 0 && k.l->reshaped && k.top[0]->shape[0] == 4);
  close_layer(&k);

  assert_int_equal(open_layer(&w, "batch_size: 4 }", CAFFE__PHASE__TRAIN, 1), KILN_OK);
  for (int b = 0; b < 3; b++) assert_int_equal(next_labels(&w, lab), 4);
  assert_true(lab[0] == 8 && lab[1] == 9 && lab[2] == 0 && lab[3] == 1); /* Caffe's wrap */
  close_layer(&w);

  expect_fail("batch_size: 11 last_batch: DROP }", "drop everything");
}

/* Streams of one source in every last_batch mode, with and without shuffle (and crop and mirror). */
enum { N_STREAM_CASES = 5 };
static const char *const stream_cases[N_STREAM_CASES] = {
    "batch_size: 4 }",
    "batch_size: 3 last_batch: DROP }",
    "batch_size: 4 last_batch: KEEP }",
    "batch_size: 3 shuffle: true last_batch: KEEP } transform_param { crop_size: 3 mirror: true }",
    "batch_size: 4 shuffle: true }",
};

/* Data-parallel: worker r of N reads global batches r, r + N, ... of the one-worker stream, whole
 * batches, in every last_batch mode and with shuffle; every worker reports the same cursor, the
 * one-worker cursor after all their batches; and a resume from it continues the global stream,
 * with the same N or another. */
static void test_sharded_workers_deal_whole_batches(void **state) {
  (void)state;
  const char *const *cases = stream_cases;
  enum { ROUNDS = 7, MAXN = 3 };
  for (size_t c = 0; c < N_STREAM_CASES; c++)
    for (int n = 2; n <= MAXN; n++) {
      /* the one-worker stream: ROUNDS * n + n batches, and its cursor after each */
      int total = (ROUNDS + 1) * n;
      int single_lab[(ROUNDS + 1) * MAXN][8], single_count[(ROUNDS + 1) * MAXN];
      uint64_t single_cursor[(ROUNDS + 1) * MAXN];
      float single_first[(ROUNDS + 1) * MAXN];
      data_layer one;
      assert_int_equal(open_layer(&one, cases[c], CAFFE__PHASE__TRAIN, 9), KILN_OK);
      for (int j = 0; j < total; j++) {
        single_count[j] = next_labels(&one, single_lab[j]);
        single_cursor[j] = one.l->ops->get_cursor(one.l);
        single_first[j] = one.top[0]->data[one.top[0]->count - 1];
      }
      close_layer(&one);
      data_layer w[MAXN];
      for (int r = 0; r < n; r++) {
        assert_int_equal(open_layer(&w[r], cases[c], CAFFE__PHASE__TRAIN, 9), KILN_OK);
        w[r].l->shard_rank = r;
        w[r].l->shard_count = n;
      }
      for (int k = 0; k < ROUNDS; k++)
        for (int r = 0; r < n; r++) {
          int lab[8], j = k * n + r;
          int got = next_labels(&w[r], lab);
          if (got != single_count[j] || memcmp(lab, single_lab[j], sizeof(int) * (size_t)got))
            fail_msg("case '%s', %d workers: rank %d batch %d is not global batch %d", cases[c], n,
                     r, k, j);
          assert_true(w[r].top[0]->data[w[r].top[0]->count - 1] == single_first[j]);
        }
      uint64_t cursor = w[0].l->ops->get_cursor(w[0].l);
      for (int r = 0; r < n; r++) assert_true(w[r].l->ops->get_cursor(w[r].l) == cursor);
      assert_true(cursor == single_cursor[ROUNDS * n - 1]);
      /* resume on n workers, and on one */
      for (int r = 0; r < n; r++) {
        assert_int_equal(w[r].l->ops->set_cursor(w[r].l, cursor), KILN_OK);
        int lab[8];
        int got = next_labels(&w[r], lab);
        assert_int_equal(got, single_count[ROUNDS * n + r]);
        assert_memory_equal(lab, single_lab[ROUNDS * n + r], sizeof(int) * (size_t)got);
        close_layer(&w[r]);
      }
      data_layer again;
      assert_int_equal(open_layer(&again, cases[c], CAFFE__PHASE__TRAIN, 9), KILN_OK);
      assert_int_equal(again.l->ops->set_cursor(again.l, cursor), KILN_OK);
      for (int j = ROUNDS * n; j < total; j++) {
        int lab[8];
        int got = next_labels(&again, lab);
        assert_int_equal(got, single_count[j]);
        assert_memory_equal(lab, single_lab[j], sizeof(int) * (size_t)got);
      }
      close_layer(&again);
    }
  /* A TEST-phase layer reads everything whatever the worker count (rank 0's test passes). */
  data_layer t;
  int lab[8];
  assert_int_equal(open_layer(&t, "batch_size: 4 }", CAFFE__PHASE__TEST, 1), KILN_OK);
  t.l->shard_rank = 1;
  t.l->shard_count = 2;
  next_labels(&t, lab);
  assert_true(lab[0] == 0 && lab[3] == 3);
  close_layer(&t);
  /* A rank outside the count is an error, not a silent share. */
  data_layer bad;
  assert_int_equal(open_layer(&bad, "batch_size: 4 }", CAFFE__PHASE__TRAIN, 1), KILN_OK);
  bad.l->shard_rank = 2;
  bad.l->shard_count = 2;
  assert_int_equal(layer_forward(bad.l), KILN_ERR_INVALID);
  close_layer(&bad);
}

/* ---- Data with several sources ----------------------------------------------------------- */

/* The extra text of a layer reading db (weight w1) and db2 (weight w2). */
static const char *mixed(char *buf, size_t n, double w1, double w2, const char *rest) {
  snprintf(buf, n, "source: '%s' source_weight: %g source_weight: %g %s", src2, w1, w2, rest);
  return buf;
}

/* Over 10,000 records drawn 0.7 / 0.3 the shares are within 0.02 of the weights; each record
 * is its source's own and intact; each source's records come in its own key order, wrapping on
 * its own (db2 has 7 records, db 10); the same seed draws the same stream, another seed
 * another. */
static void test_mixed_sources_shares_and_order(void **state) {
  (void)state;
  char p[512];
  mixed(p, sizeof p, 0.7, 0.3, "batch_size: 100 }");
  data_layer a, twin, other;
  assert_int_equal(open_layer(&a, p, CAFFE__PHASE__TRAIN, 3), KILN_OK);
  assert_int_equal(open_layer(&twin, p, CAFFE__PHASE__TRAIN, 3), KILN_OK);
  assert_int_equal(open_layer(&other, p, CAFFE__PHASE__TRAIN, 4), KILN_OK);
  int n2 = 0, next1 = 0, next2 = 0, differ = 0;
  for (int b = 0; b < 100; b++) {
    int lab[100], lt[100], lo[100];
    assert_int_equal(next_labels(&a, lab), 100);
    next_labels(&twin, lt);
    next_labels(&other, lo);
    assert_memory_equal(lab, lt, sizeof lab);
    assert_memory_equal(a.top[0]->data, twin.top[0]->data, sizeof(float) * a.top[0]->count);
    for (int i = 0; i < 100; i++) {
      differ += lab[i] != lo[i];
      if (lab[i] >= LABEL2) {
        n2++;
        assert_int_equal(lab[i], LABEL2 + next2);
        next2 = (next2 + 1) % NREC2;
      } else {
        assert_int_equal(lab[i], next1);
        next1 = (next1 + 1) % NREC;
      }
      const float *x = a.top[0]->data + (size_t)i * C * H * W;
      for (int c = 0; c < C; c++)
        for (int h = 0; h < H; h++)
          for (int w = 0; w < W; w++)
            assert_true(x[(c * H + h) * W + w] == (float)pixel(lab[i], c, h, w));
    }
  }
  const double share = n2 / 10000.0;
  if (fabs(share - 0.3) > 0.02) fail_msg("source 2 gave %.4f of the records, weight 0.3", share);
  assert_true(differ > 1000); /* another seed, another mix */
  assert_int_equal(a.l->ops->get_cursor(a.l), 10000);
  close_layer(&a);
  close_layer(&twin);
  close_layer(&other);
  /* weight 0: that source never appears */
  data_layer z;
  assert_int_equal(open_layer(&z, mixed(p, sizeof p, 1, 0, "batch_size: 50 }"),
                           CAFFE__PHASE__TRAIN, 3),
                   KILN_OK);
  for (int b = 0; b < 4; b++) {
    int lab[50];
    next_labels(&z, lab);
    for (int i = 0; i < 50; i++) assert_true(lab[i] < LABEL2);
  }
  close_layer(&z);
}

/* With shuffle each source draws a permutation of its records per epoch of its own size; a
 * resume from a cursor mid-epoch gives the same batches, data and labels, as running on (the
 * draws before the cursor are counted again). */
static void test_mixed_sources_shuffle_and_resume(void **state) {
  (void)state;
  char p[512];
  mixed(p, sizeof p, 0.5, 0.5,
        "batch_size: 6 shuffle: true } transform_param { crop_size: 3 mirror: true }");
  data_layer a, b;
  assert_int_equal(open_layer(&a, p, CAFFE__PHASE__TRAIN, 11), KILN_OK);
  assert_int_equal(open_layer(&b, p, CAFFE__PHASE__TRAIN, 11), KILN_OK);
  int seen2[NREC2 * 6], n2 = 0;
  for (int k = 0; k < 7; k++) {
    int lab[6];
    next_labels(&a, lab);
    for (int i = 0; i < 6; i++)
      if (lab[i] >= LABEL2 && n2 < NREC2 * 6) seen2[n2++] = lab[i];
  }
  /* each run of NREC2 records of source 2 is a permutation of it */
  for (int e = 0; (e + 1) * NREC2 <= n2; e++) {
    bool hit[NREC2] = {false};
    for (int i = 0; i < NREC2; i++) {
      int r = seen2[e * NREC2 + i] - LABEL2;
      assert_true(r >= 0 && r < NREC2 && !hit[r]);
      hit[r] = true;
    }
  }
  const uint64_t cur = a.l->ops->get_cursor(a.l);
  assert_int_equal(cur, 42);
  assert_int_equal(b.l->ops->set_cursor(b.l, cur), KILN_OK);
  for (int k = 0; k < 9; k++) {
    assert_int_equal(layer_forward(a.l), KILN_OK);
    assert_int_equal(layer_forward(b.l), KILN_OK);
    assert_memory_equal(a.top[0]->data, b.top[0]->data, sizeof(float) * a.top[0]->count);
    assert_memory_equal(a.top[1]->data, b.top[1]->data, sizeof(float) * 6);
  }
  /* and backwards: a cursor behind what the layer counted */
  assert_int_equal(a.l->ops->set_cursor(a.l, 12), KILN_OK);
  data_layer c;
  assert_int_equal(open_layer(&c, p, CAFFE__PHASE__TRAIN, 11), KILN_OK);
  for (int k = 0; k < 2; k++) assert_int_equal(layer_forward(c.l), KILN_OK);
  for (int k = 0; k < 3; k++) {
    assert_int_equal(layer_forward(a.l), KILN_OK);
    assert_int_equal(layer_forward(c.l), KILN_OK);
    assert_memory_equal(a.top[0]->data, c.top[0]->data, sizeof(float) * a.top[0]->count);
  }
  close_layer(&a);
  close_layer(&b);
  close_layer(&c);
}

/* Workers deal whole batches of the mixed stream: worker r of 2 reads global batches r, r + 2,
 * ... of the one-worker stream, so 2 workers read what one worker with iter_size 2 reads. */
static void test_mixed_sources_sharded(void **state) {
  (void)state;
  char p[512];
  mixed(p, sizeof p, 0.6, 0.4, "batch_size: 5 shuffle: true }");
  enum { ROUNDS = 6, N = 2 };
  int single[ROUNDS * N][5];
  data_layer one;
  assert_int_equal(open_layer(&one, p, CAFFE__PHASE__TRAIN, 21), KILN_OK);
  for (int j = 0; j < ROUNDS * N; j++) next_labels(&one, single[j]);
  const uint64_t end = one.l->ops->get_cursor(one.l);
  close_layer(&one);
  data_layer w[N];
  for (int r = 0; r < N; r++) {
    assert_int_equal(open_layer(&w[r], p, CAFFE__PHASE__TRAIN, 21), KILN_OK);
    w[r].l->shard_rank = r;
    w[r].l->shard_count = N;
  }
  for (int k = 0; k < ROUNDS; k++)
    for (int r = 0; r < N; r++) {
      int lab[5];
      next_labels(&w[r], lab);
      if (memcmp(lab, single[k * N + r], sizeof lab))
        fail_msg("rank %d batch %d is not global batch %d", r, k, k * N + r);
    }
  for (int r = 0; r < N; r++) {
    assert_true(w[r].l->ops->get_cursor(w[r].l) == end);
    close_layer(&w[r]);
  }
}

static void test_mixed_sources_errors(void **state) {
  (void)state;
  char p[512];
  snprintf(p, sizeof p, "source: '%s' batch_size: 2 }", db2_path);
  expect_fail(p, "no source_weight");
  snprintf(p, sizeof p, "source: '%s' source_weight: 1 batch_size: 2 }", db2_path);
  expect_fail(p, "2 sources and 1 source_weight value");
  expect_fail(mixed(p, sizeof p, 0.5, -0.5, "batch_size: 2 }"), "source_weight 2");
  expect_fail(mixed(p, sizeof p, 0, 0, "batch_size: 2 }"), "sum to 0");
  expect_fail(mixed(p, sizeof p, 1, 1, "batch_size: 2 last_batch: DROP }"), "use WRAP");
  snprintf(p, sizeof p, "source: '%s' source_weight: 1 source_weight: 1 batch_size: 2 }",
           db3_path);
  expect_fail(p, "one shape");
  snprintf(p, sizeof p, "source: '/nonexistent/db2' source_weight: 1 source_weight: 1 "
           "batch_size: 2 }");
  expect_fail(p, "/nonexistent/db2");
}

/* A smaller last batch flows through the net: the layers after the data layer are reshaped, and
 * the loss is normalised by the smaller batch. */
static void test_keep_reshapes_the_net(void **state) {
  (void)state;
  char text[1024];
  snprintf(text, sizeof text,
           "layer { name: 'd' type: 'Data' top: 'data' top: 'label' data_param { source: '%s' "
           "batch_size: 4 backend: LMDB last_batch: KEEP } transform_param { scale: 0.01 } }"
           "layer { name: 'ip' type: 'InnerProduct' bottom: 'data' top: 'ip' "
           "inner_product_param { num_output: 10 weight_filler { type: 'xavier' } } }"
           "layer { name: 'loss' type: 'SoftmaxWithLoss' bottom: 'ip' bottom: 'label' top: 'loss' }",
           db_path);
  Caffe__NetParameter *np;
  assert_int_equal(kiln_net_param_from_text(text, "<keep>", &np), KILN_OK);
  kiln_net_options o = {.phase = CAFFE__PHASE__TRAIN, .seed = 1, .config = kiln_test_net_config()};
  kiln_net *net;
  assert_int_equal(kiln_net_create(np, &o, &net), KILN_OK);
  float loss;
  for (int b = 0; b < 3; b++) {
    assert_int_equal(kiln_net_forward(net, &loss), KILN_OK);
    assert_int_equal(kiln_net_backward(net), KILN_OK);
    assert_true(isfinite(loss) && loss > 0);
  }
  assert_int_equal(kiln_net_blob(net, "ip")->shape[0], 2);
  assert_int_equal(kiln_net_forward(net, &loss), KILN_OK);
  assert_int_equal(kiln_net_blob(net, "ip")->shape[0], 4);
  kiln_net_free(net);
  protobuf_c_message_free_unpacked(&np->base, NULL);
}

/* ---- ImageData (its decoding, shuffle, resume and shares: tests/test_images.c) ---------- */

/* The records of the Data tests' database as PNG files (2-channel records: B and G planes of an
 * image whose R plane is 0) in a list; one batch holds their pixels and labels, as Data does. */
static void test_image_data_reads_a_list(void **state) {
  (void)state;
  char path[512], list[400];
  snprintf(list, sizeof list, "%s/images.txt", dir);
  FILE *f = fopen(list, "w");
  assert_non_null(f);
  for (int r = 0; r < 3; r++) {
    uint8_t planes[3 * H * W] = {0};
    for (int c = 0; c < C; c++)
      for (int h = 0; h < H; h++)
        for (int x = 0; x < W; x++) planes[(c * H + h) * W + x] = pixel(r, c, h, x);
    uint8_t *png;
    size_t len;
    assert_int_equal(kiln_image_encode_png(planes, 3, H, W, &png, &len), KILN_OK);
    snprintf(path, sizeof path, "%s/rec %d.png", dir, r);
    assert_int_equal(kiln_write_file_atomic(path, png, len), KILN_OK);
    free(png);
    fprintf(f, "rec %d.png %d\n", r, 40 + r);
  }
  fclose(f);
  char text[1200];
  snprintf(text, sizeof text,
           "name: 'img' type: 'ImageData' top: 'data' top: 'label' image_data_param { source: "
           "'%s' root_folder: '%s/' batch_size: 2 } transform_param { scale: 2 }",
           list, dir);
  built b = build(text, TRAIN, NULL, 0, 2);
  expect_shape(b.top[0], 4, SHAPE(2, 3, H, W));
  for (int pass = 0; pass < 2; pass++) {
    forward(&b);
    for (int i = 0; i < 2; i++) {
      const int r = (pass * 2 + i) % 3;
      assert_true(b.top[1]->data[i] == 40 + r);
      for (int c = 0; c < 3; c++)
        for (int h = 0; h < H; h++)
          for (int x = 0; x < W; x++)
            assert_true(b.top[0]->data[((i * 3 + c) * H + h) * W + x] ==
                        2.0f * (c < C ? pixel(r, c, h, x) : 0));
    }
  }
  unbuild(&b);
}

/* The batches (data and labels) of `n` layers on `extra`, `rank` of `n` workers each (n = 1:
 * one stream), round after round, and the cursor after them. */
enum { CMP_BATCHES = 12, CMP_MAX = 4 * C * H * W };
typedef struct {
  int count[CMP_BATCHES];
  float label[CMP_BATCHES][4], data[CMP_BATCHES][CMP_MAX];
  uint64_t cursor;
} batches;
static void read_batches(const char *extra, int n, batches *out) {
  data_layer w[2];
  memset(out, 0, sizeof *out);
  for (int r = 0; r < n; r++) {
    if (open_layer(&w[r], extra, CAFFE__PHASE__TRAIN, 5))
      fail_msg("'%s' on %s: %s", extra, src1, kiln_last_error());
    w[r].l->shard_rank = r;
    w[r].l->shard_count = n;
  }
  for (int j = 0; j < CMP_BATCHES; j++) {
    data_layer *d = &w[j % n];
    assert_int_equal(layer_forward(d->l), KILN_OK);
    out->count[j] = (int)d->top[1]->shape[0];
    memcpy(out->label[j], d->top[1]->data, sizeof(float) * (size_t)out->count[j]);
    memcpy(out->data[j], d->top[0]->data, sizeof(float) * (size_t)d->top[0]->count);
  }
  out->cursor = w[0].l->ops->get_cursor(w[0].l);
  for (int r = 0; r < n; r++) close_layer(&w[r]);
}

/* Layers read the LMDBs (`which`: "backend: LMDB") or the LevelDBs; the case (NULL: the mix). */
static const char *with_sources(const char *lmdb_case, const char *which, char *mix, size_t n) {
  const bool leveldb = strcmp(which, "backend: LMDB") != 0;
  src1 = leveldb ? ldb_path : db_path, src2 = leveldb ? ldb2_path : db2_path, backend = which;
  return lmdb_case ? lmdb_case : mixed(mix, n, 0.6, 0.4, "batch_size: 4 shuffle: true }");
}
static int back_to_lmdb(void **state) {
  (void)state;
  return !with_sources("", "backend: LMDB", NULL, 0);
}

/* The LevelDB copies give the LMDBs' batches bit for bit: in order, shuffled, cropped and
 * mirrored, the last batch dropped or kept, two sources mixed, dealt to 2 workers; with backend
 * LEVELDB and with no backend (Caffe's default). The cursor they end at too (a resume from it on
 * a LevelDB: tests/cli/leveldb_data.sh). */
static void test_leveldb_gives_lmdb_batches(void **state) {
  (void)state;
  char mix[512];
  const char *cases[N_STREAM_CASES + 1] = {NULL}; /* the last: db (or ldb) and db2 (or ldb2) mixed */
  memcpy(cases, stream_cases, sizeof stream_cases);
  static batches want, got;
  for (size_t c = 0; c < N_STREAM_CASES + 1; c++)
    for (int n = 1; n <= 2; n++) {
      const char *extra = with_sources(cases[c], "backend: LMDB", mix, sizeof mix);
      read_batches(extra, n, &want);
      for (int v = 0; v < 2; v++) {
        extra = with_sources(cases[c], v ? "" : "backend: LEVELDB", mix, sizeof mix);
        read_batches(extra, n, &got);
        if (memcmp(&want, &got, sizeof want))
          fail_msg("case '%s' on %d worker(s), %s: the LevelDB's batches differ", extra, n,
                   v ? "no backend" : "backend LEVELDB");
      }
    }
}

/* Two groups: the Data tests share a database made once (make_db); DummyData and MemoryData
 * need none. */
int main(void) {
  const struct CMUnitTest dummy_tests[] = {
      cmocka_unit_test(test_dummy_data_shapes_and_constants),
      cmocka_unit_test(test_dummy_data_refill),
      cmocka_unit_test(test_dummy_data_bad_parameters),
      cmocka_unit_test(test_memory_data_tops_fed_by_caller),
      cmocka_unit_test(test_memory_data_bad_parameters),
  };
  const struct CMUnitTest data_tests[] = {
      cmocka_unit_test(test_batches_transform_and_wrap),
      cmocka_unit_test(test_cursor_resumes_exactly),
      cmocka_unit_test(test_crop_and_mirror),
      cmocka_unit_test(test_errors),
      cmocka_unit_test(test_missing_source),
      cmocka_unit_test_teardown(test_leveldb_gives_lmdb_batches, back_to_lmdb),
      cmocka_unit_test(test_mixed_sources_shares_and_order),
      cmocka_unit_test(test_mixed_sources_shuffle_and_resume),
      cmocka_unit_test(test_mixed_sources_sharded),
      cmocka_unit_test(test_mixed_sources_errors),
      cmocka_unit_test(test_shuffle_per_epoch),
      cmocka_unit_test(test_last_batch_drop_and_keep),
      cmocka_unit_test(test_keep_reshapes_the_net),
      cmocka_unit_test(test_sharded_workers_deal_whole_batches),
      cmocka_unit_test(test_image_data_reads_a_list),
  };
  int failed = cmocka_run_group_tests_name("DummyData", dummy_tests, NULL, NULL);
  failed += cmocka_run_group_tests_name("Data", data_tests, make_db, remove_db);
  return failed;
}
