/* Caffe's HDF5 snapshot layout, checked with libhdf5 itself on files kiln writes: a
 * .caffemodel.h5 holds /data/<layer>/<j> float datasets shaped as the blobs (a group for every
 * layer); a .solverstate.h5 holds "iter" and "current_step" (one int each), "learned_net" (a
 * string) and /history/<j>; kiln's resume state lies in /kiln. Both read back to the messages they
 * were written from. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <hdf5.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "files.h"
#include "kiln/proto.h"

static Caffe__BlobProto *blob(int rank, const int64_t *dims, float first) {
  Caffe__BlobProto *b = malloc(sizeof *b);
  Caffe__BlobShape *s = malloc(sizeof *s);
  assert_non_null(b);
  assert_non_null(s);
  caffe__blob_proto__init(b);
  caffe__blob_shape__init(s);
  s->n_dim = (size_t)rank;
  s->dim = malloc(sizeof(int64_t) * (size_t)rank);
  size_t n = 1;
  for (int i = 0; i < rank; i++) n *= (size_t)(s->dim[i] = dims[i]);
  b->shape = s;
  b->n_data = n;
  b->data = malloc(sizeof(float) * n);
  for (size_t i = 0; i < n; i++) b->data[i] = first + (float)i * 0.25f;
  return b;
}

static void expect_dims(hid_t at, const char *name, int rank, const hsize_t *want) {
  hid_t d = H5Dopen2(at, name, H5P_DEFAULT);
  assert_true(d >= 0);
  hid_t s = H5Dget_space(d);
  hsize_t dims[8];
  assert_int_equal(H5Sget_simple_extent_ndims(s), rank);
  H5Sget_simple_extent_dims(s, dims, NULL);
  for (int i = 0; i < rank; i++) assert_int_equal(dims[i], want[i]);
  H5Sclose(s);
  H5Dclose(d);
}

static void test_caffemodel_layout(void **state) {
  (void)state;
  char dir[64], path[128];
  make_tmpdir(dir, sizeof dir, "h5");
  snprintf(path, sizeof path, "%s/m.caffemodel.h5", dir);
  Caffe__NetParameter np = CAFFE__NET_PARAMETER__INIT;
  Caffe__LayerParameter conv = CAFFE__LAYER_PARAMETER__INIT, relu = CAFFE__LAYER_PARAMETER__INIT;
  conv.name = "conv";
  relu.name = "relu";
  Caffe__BlobProto *cb[2] = {blob(4, (int64_t[]){2, 1, 3, 3}, 1), blob(1, (int64_t[]){2}, -1)};
  conv.n_blobs = 2;
  conv.blobs = cb;
  Caffe__LayerParameter *layers[2] = {&conv, &relu};
  np.n_layer = 2;
  np.layer = layers;
  assert_int_equal(kiln_h5_write_net(path, &np), KILN_OK);

  hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
  assert_true(f >= 0);
  hid_t g = H5Gopen2(f, "data/conv", H5P_DEFAULT);
  assert_true(g >= 0);
  expect_dims(g, "0", 4, (hsize_t[]){2, 1, 3, 3});
  expect_dims(g, "1", 1, (hsize_t[]){2});
  float v[18];
  hid_t d = H5Dopen2(g, "0", H5P_DEFAULT);
  assert_true(H5Dread(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, v) >= 0);
  assert_true(v[0] == 1 && v[17] == 1 + 17 * 0.25f);
  H5Dclose(d);
  H5Gclose(g);
  H5G_info_t info;
  g = H5Gopen2(f, "data/relu", H5P_DEFAULT);
  assert_true(g >= 0); /* every layer has its group, as Caffe writes them */
  assert_true(H5Gget_info(g, &info) >= 0);
  assert_int_equal(info.nlinks, 0);
  H5Gclose(g);
  H5Fclose(f);

  Caffe__NetParameter *back;
  assert_int_equal(kiln_h5_read_net(path, &back), KILN_OK);
  assert_int_equal(back->n_layer, 2);
  const Caffe__LayerParameter *c = !strcmp(back->layer[0]->name, "conv") ? back->layer[0] : back->layer[1];
  assert_string_equal(c->name, "conv");
  assert_int_equal(c->n_blobs, 2);
  assert_int_equal(c->blobs[0]->shape->n_dim, 4);
  assert_memory_equal(c->blobs[0]->data, cb[0]->data, sizeof(float) * 18);
  assert_memory_equal(c->blobs[1]->data, cb[1]->data, sizeof(float) * 2);
  protobuf_c_message_free_unpacked(&back->base, NULL);
  for (int i = 0; i < 2; i++) protobuf_c_message_free_unpacked(&cb[i]->base, NULL);
  rm_tree(dir);
}

static void test_solverstate_layout(void **state) {
  (void)state;
  char dir[64], path[128];
  make_tmpdir(dir, sizeof dir, "h5");
  snprintf(path, sizeof path, "%s/s.solverstate.h5", dir);
  Caffe__SolverState st = CAFFE__SOLVER_STATE__INIT;
  st.has_iter = st.has_current_step = 1;
  st.iter = 7;
  st.current_step = 2;
  st.learned_net = "snap_iter_7.caffemodel.h5";
  Caffe__BlobProto *h[2] = {blob(2, (int64_t[]){2, 3}, 0.5f), blob(1, (int64_t[]){3}, 9)};
  st.n_history = 2;
  st.history = h;
  uint64_t cursors[2] = {12, 1ull << 40};
  st.n_kiln_data_cursor = 2;
  st.kiln_data_cursor = cursors;
  uint8_t rng[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
  st.has_kiln_rng_state = 1;
  st.kiln_rng_state.data = rng;
  st.kiln_rng_state.len = 16;
  ProtobufCBinaryData workers[2] = {{16, rng}, {16, rng}};
  st.n_kiln_worker_rng_state = 2;
  st.kiln_worker_rng_state = workers;
  st.has_kiln_workers = 1;
  st.kiln_workers = 3;
  float losses[3] = {2.5f, 2.25f, 2.0f};
  st.n_kiln_loss_history = 3;
  st.kiln_loss_history = losses;
  st.has_kiln_first_loss = st.has_kiln_divergence_run = 1;
  st.kiln_first_loss = 2.75f;
  st.kiln_divergence_run = 4;
  assert_int_equal(kiln_h5_write_state(path, &st), KILN_OK);

  hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
  assert_true(f >= 0);
  expect_dims(f, "iter", 1, (hsize_t[]){1});
  int iter = 0;
  hid_t d = H5Dopen2(f, "iter", H5P_DEFAULT);
  H5Dread(d, H5T_NATIVE_INT, H5S_ALL, H5S_ALL, H5P_DEFAULT, &iter);
  H5Dclose(d);
  assert_int_equal(iter, 7);
  d = H5Dopen2(f, "learned_net", H5P_DEFAULT);
  hid_t t = H5Dget_type(d);
  assert_int_equal(H5Tget_class(t), H5T_STRING);
  H5Tclose(t);
  H5Dclose(d);
  hid_t g = H5Gopen2(f, "history", H5P_DEFAULT);
  expect_dims(g, "0", 2, (hsize_t[]){2, 3});
  expect_dims(g, "1", 1, (hsize_t[]){3});
  H5Gclose(g);
  H5Fclose(f);

  Caffe__SolverState *b;
  assert_int_equal(kiln_h5_read_state(path, &b), KILN_OK);
  assert_int_equal(b->iter, 7);
  assert_int_equal(b->current_step, 2);
  assert_string_equal(b->learned_net, st.learned_net);
  assert_int_equal(b->n_history, 2);
  assert_memory_equal(b->history[0]->data, h[0]->data, sizeof(float) * 6);
  assert_int_equal(b->n_kiln_data_cursor, 2);
  assert_true(b->kiln_data_cursor[1] == (1ull << 40));
  assert_int_equal(b->kiln_rng_state.len, 16);
  assert_memory_equal(b->kiln_rng_state.data, rng, 16);
  assert_int_equal(b->n_kiln_worker_rng_state, 2);
  assert_memory_equal(b->kiln_worker_rng_state[1].data, rng, 16);
  assert_int_equal(b->kiln_workers, 3);
  assert_memory_equal(b->kiln_loss_history, losses, sizeof losses);
  assert_true(b->kiln_first_loss == 2.75f);
  assert_int_equal(b->kiln_divergence_run, 4);
  protobuf_c_message_free_unpacked(&b->base, NULL);
  for (int i = 0; i < 2; i++) protobuf_c_message_free_unpacked(&h[i]->base, NULL);
  rm_tree(dir);
}

/* A file on which libhdf5 1.10.8 itself crashes (a group's local heap claiming an impossible
 * size; found by fuzz_h5, tests/data/damaged-heap.fuzz_h5: the fuzzer's selector byte, then the
 * file): kiln reads HDF5 files in a child process, so this is an error naming the file, and the
 * test process lives on. Under AddressSanitizer the child reports and exits instead of dying by
 * the signal; either way the file is called damaged. */
static void test_libhdf5_crash_is_an_error(void **state) {
  (void)state;
  const char *root = getenv("KILN_SOURCE_DIR");
  assert_non_null(root);
  char path[4096], *bytes;
  size_t len;
  snprintf(path, sizeof path, "%s/tests/data/damaged-heap.fuzz_h5", root);
  assert_int_equal(kiln_read_file(path, &bytes, &len), KILN_OK);
  assert_true(len > 1);
  Caffe__SolverState *st = NULL;
  int rc = kiln_h5_unpack_state(bytes + 1, len - 1, "damaged.solverstate.h5", &st);
  assert_int_equal(rc, KILN_ERR_PARSE);
  assert_null(st);
  if (!strstr(kiln_last_error(), "damaged.solverstate.h5") ||
      !strstr(kiln_last_error(), "the file is damaged"))
    fail_msg("%s", kiln_last_error());
  free(bytes);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_libhdf5_crash_is_an_error),
      cmocka_unit_test(test_caffemodel_layout),
      cmocka_unit_test(test_solverstate_layout),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
