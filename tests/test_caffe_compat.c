/* Files for Caffe 1.0 (src/proto/caffe_compat.c): the table of fields Caffe 1.0 lacks checked
 * against kiln's schema and Caffe 1.0's caffe.proto message by message, the layer types against
 * kiln's registry and Caffe 1.0's, and nets and solvers rewritten for Caffe 1.0: what is dropped
 * is gone and named, everything else is as it was, and what cannot be rewritten is refused with
 * the message left untouched. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/layers.h"
#include "kiln/proto.h"

/* Caffe 1.0's src/caffe/proto/caffe.proto (BVLC/caffe, tag 1.0, April 2017): the fields of every
 * message kiln's schema shares with it, as NAME=NUMBER, a leading + for a repeated field. Kept
 * here, apart from the library's table, so that each checks the other: a field kiln adds to one of
 * these messages must be either here (Caffe's own) or in kiln_caffe_fields(). Messages kiln lacks
 * (WindowDataParameter) and their LayerParameter fields are listed too, since Caffe 1.0 has
 * them. */
static const struct {
  const char *message, *fields;
} caffe10[] = {
    {"BlobShape", "+dim=1"},
    {"BlobProto", "shape=7 +data=5 +diff=6 +double_data=8 +double_diff=9 num=1 channels=2 height=3 "
                  "width=4"},
    {"BlobProtoVector", "+blobs=1"},
    {"Datum", "channels=1 height=2 width=3 data=4 label=5 +float_data=6 encoded=7"},
    {"FillerParameter", "type=1 value=2 min=3 max=4 mean=5 std=6 sparse=7 variance_norm=8"},
    {"NetParameter", "name=1 +input=3 +input_shape=8 +input_dim=4 force_backward=5 state=6 "
                     "debug_info=7 +layer=100 +layers=2"},
    {"SolverParameter",
     "net=24 net_param=25 train_net=1 +test_net=2 train_net_param=21 +test_net_param=22 "
     "train_state=26 +test_state=27 +test_iter=3 test_interval=4 test_compute_loss=19 "
     "test_initialization=32 base_lr=5 display=6 average_loss=33 max_iter=7 iter_size=36 "
     "lr_policy=8 gamma=9 power=10 momentum=11 weight_decay=12 regularization_type=29 stepsize=13 "
     "+stepvalue=34 clip_gradients=35 snapshot=14 snapshot_prefix=15 snapshot_diff=16 "
     "snapshot_format=37 solver_mode=17 device_id=18 random_seed=20 type=40 delta=31 momentum2=39 "
     "rms_decay=38 debug_info=23 snapshot_after_train=28 solver_type=30 layer_wise_reduce=41"},
    {"SolverState", "iter=1 learned_net=2 +history=3 current_step=4"},
    {"NetState", "phase=1 level=2 +stage=3"},
    {"NetStateRule", "phase=1 min_level=2 max_level=3 +stage=4 +not_stage=5"},
    {"ParamSpec", "name=1 share_mode=2 lr_mult=3 decay_mult=4"},
    {"LayerParameter",
     "name=1 type=2 +bottom=3 +top=4 phase=10 +loss_weight=5 +param=6 +blobs=7 +propagate_down=11 "
     "+include=8 +exclude=9 transform_param=100 loss_param=101 accuracy_param=102 argmax_param=103 "
     "batch_norm_param=139 bias_param=141 concat_param=104 contrastive_loss_param=105 "
     "convolution_param=106 crop_param=144 data_param=107 dropout_param=108 dummy_data_param=109 "
     "eltwise_param=110 elu_param=140 embed_param=137 exp_param=111 flatten_param=135 "
     "hdf5_data_param=112 hdf5_output_param=113 hinge_loss_param=114 image_data_param=115 "
     "infogain_loss_param=116 inner_product_param=117 input_param=143 log_param=134 lrn_param=118 "
     "memory_data_param=119 mvn_param=120 parameter_param=145 pooling_param=121 power_param=122 "
     "prelu_param=131 python_param=130 recurrent_param=146 reduction_param=136 relu_param=123 "
     "reshape_param=133 scale_param=142 sigmoid_param=124 softmax_param=125 spp_param=132 "
     "slice_param=126 tanh_param=127 threshold_param=128 tile_param=138 window_data_param=129"},
    {"TransformationParameter", "scale=1 mirror=2 crop_size=3 mean_file=4 +mean_value=5 "
                                "force_color=6 force_gray=7"},
    {"LossParameter", "ignore_label=1 normalization=3 normalize=2"},
    {"AccuracyParameter", "top_k=1 axis=2 ignore_label=3"},
    {"ArgMaxParameter", "out_max_val=1 top_k=2 axis=3"},
    {"ConcatParameter", "axis=2 concat_dim=1"},
    {"BatchNormParameter", "use_global_stats=1 moving_average_fraction=2 eps=3"},
    {"BiasParameter", "axis=1 num_axes=2 filler=3"},
    {"ContrastiveLossParameter", "margin=1 legacy_version=2"},
    {"ConvolutionParameter", "num_output=1 bias_term=2 +pad=3 +kernel_size=4 +stride=6 "
                             "+dilation=18 pad_h=9 pad_w=10 kernel_h=11 kernel_w=12 stride_h=13 "
                             "stride_w=14 group=5 weight_filler=7 bias_filler=8 engine=15 axis=16 "
                             "force_nd_im2col=17"},
    {"CropParameter", "axis=1 +offset=2"},
    {"DataParameter", "source=1 batch_size=4 rand_skip=7 backend=8 scale=2 mean_file=3 "
                      "crop_size=5 mirror=6 force_encoded_color=9 prefetch=10"},
    {"DropoutParameter", "dropout_ratio=1"},
    {"DummyDataParameter", "+data_filler=1 +shape=6 +num=2 +channels=3 +height=4 +width=5"},
    {"EltwiseParameter", "operation=1 +coeff=2 stable_prod_grad=3"},
    {"ELUParameter", "alpha=1"},
    {"EmbedParameter", "num_output=1 input_dim=2 bias_term=3 weight_filler=4 bias_filler=5"},
    {"ExpParameter", "base=1 scale=2 shift=3"},
    {"FlattenParameter", "axis=1 end_axis=2"},
    {"HDF5DataParameter", "source=1 batch_size=2 shuffle=3"},
    {"HDF5OutputParameter", "file_name=1"},
    {"HingeLossParameter", "norm=1"},
    {"ImageDataParameter", "source=1 batch_size=4 rand_skip=7 shuffle=8 new_height=9 new_width=10 "
                           "is_color=11 scale=2 mean_file=3 crop_size=5 mirror=6 root_folder=12"},
    {"InfogainLossParameter", "source=1 axis=2"},
    {"InnerProductParameter", "num_output=1 bias_term=2 weight_filler=3 bias_filler=4 axis=5 "
                              "transpose=6"},
    {"InputParameter", "+shape=1"},
    {"LogParameter", "base=1 scale=2 shift=3"},
    {"LRNParameter", "local_size=1 alpha=2 beta=3 norm_region=4 k=5 engine=6"},
    {"MemoryDataParameter", "batch_size=1 channels=2 height=3 width=4"},
    {"MVNParameter", "normalize_variance=1 across_channels=2 eps=3"},
    {"ParameterParameter", "shape=1"},
    {"PoolingParameter", "pool=1 pad=4 pad_h=9 pad_w=10 kernel_size=2 kernel_h=5 kernel_w=6 "
                         "stride=3 stride_h=7 stride_w=8 engine=11 global_pooling=12"},
    {"PowerParameter", "power=1 scale=2 shift=3"},
    {"RecurrentParameter", "num_output=1 weight_filler=2 bias_filler=3 debug_info=4 "
                           "expose_hidden=5"},
    {"ReductionParameter", "operation=1 axis=2 coeff=3"},
    {"ReLUParameter", "negative_slope=1 engine=2"},
    {"ReshapeParameter", "shape=1 axis=2 num_axes=3"},
    {"ScaleParameter", "axis=1 num_axes=2 filler=3 bias_term=4 bias_filler=5"},
    {"SigmoidParameter", "engine=1"},
    {"SliceParameter", "axis=3 +slice_point=2 slice_dim=1"},
    {"SoftmaxParameter", "engine=1 axis=2"},
    {"TanHParameter", "engine=1"},
    {"TileParameter", "axis=1 tiles=2"},
    {"ThresholdParameter", "threshold=1"},
    {"PythonParameter", "module=1 layer=2 param_str=3 share_in_parallel=4"},
    {"SPPParameter", "pyramid_height=1 pool=2 engine=6"},
    {"PReLUParameter", "filler=1 channel_shared=2"},
    {"V1LayerParameter",
     "+bottom=2 +top=3 name=4 +include=32 +exclude=33 type=5 +blobs=6 +param=1001 "
     "+blob_share_mode=1002 +blobs_lr=7 +weight_decay=8 +loss_weight=35 accuracy_param=27 "
     "argmax_param=23 concat_param=9 contrastive_loss_param=40 convolution_param=10 data_param=11 "
     "dropout_param=12 dummy_data_param=26 eltwise_param=24 exp_param=41 hdf5_data_param=13 "
     "hdf5_output_param=14 hinge_loss_param=29 image_data_param=15 infogain_loss_param=16 "
     "inner_product_param=17 lrn_param=18 memory_data_param=22 mvn_param=34 pooling_param=19 "
     "power_param=21 relu_param=30 sigmoid_param=38 softmax_param=39 slice_param=31 "
     "tanh_param=37 threshold_param=25 window_data_param=20 transform_param=36 loss_param=42 "
     "layer=1"},
    {"V0LayerParameter",
     "name=1 type=2 num_output=3 biasterm=4 weight_filler=5 bias_filler=6 pad=7 kernelsize=8 "
     "group=9 stride=10 pool=11 dropout_ratio=12 local_size=13 alpha=14 beta=15 k=22 source=16 "
     "scale=17 meanfile=18 batchsize=19 cropsize=20 mirror=21 +blobs=50 +blobs_lr=51 "
     "+weight_decay=52 rand_skip=53 det_fg_threshold=54 det_bg_threshold=55 det_fg_fraction=56 "
     "det_context_pad=58 det_crop_mode=59 new_num=60 new_channels=61 new_height=62 new_width=63 "
     "shuffle_images=64 concat_dim=65 hdf5_output_param=1001"},
};

/* Caffe 1.0's field `number` of `message`: its name and whether it is repeated; false if none. */
static bool caffe10_field(const char *message, unsigned number, char *name, size_t n,
                          bool *repeated) {
  for (size_t i = 0; i < sizeof caffe10 / sizeof caffe10[0]; i++) {
    if (strcmp(caffe10[i].message, message)) continue;
    const char *p = caffe10[i].fields;
    while (*p) {
      const char *end = strchr(p, ' ');
      if (!end) end = p + strlen(p);
      const bool rep = *p == '+';
      const char *s = p + rep, *eq = memchr(s, '=', (size_t)(end - s));
      assert_non_null(eq);
      if ((unsigned)strtoul(eq + 1, NULL, 10) == number) {
        snprintf(name, n, "%.*s", (int)(eq - s), s);
        *repeated = rep;
        return true;
      }
      p = *end ? end + 1 : end;
    }
    return false;
  }
  fail_msg("message %s is not in Caffe 1.0's list", message);
  return false;
}

static bool caffe10_has_message(const char *message) {
  for (size_t i = 0; i < sizeof caffe10 / sizeof caffe10[0]; i++)
    if (!strcmp(caffe10[i].message, message)) return true;
  return false;
}

/* Walks every message reachable from one of Caffe's through fields Caffe 1.0 has: each must be a
 * Caffe 1.0 message, and each of its fields either Caffe 1.0's (same name, number and
 * cardinality) or in the table. */
static void classify(const ProtobufCMessageDescriptor *d, const ProtobufCMessageDescriptor **seen,
                     size_t *nseen, int *table_rows_seen) {
  for (size_t i = 0; i < *nseen; i++)
    if (seen[i] == d) return;
  assert_true(*nseen < 128);
  seen[(*nseen)++] = d;
  if (!caffe10_has_message(d->short_name))
    fail_msg("%s is reached through Caffe 1.0's fields but is not a Caffe 1.0 message",
             d->short_name);
  for (unsigned k = 0; k < d->n_fields; k++) {
    const ProtobufCFieldDescriptor *f = &d->fields[k];
    const kiln_caffe_field *e = kiln_caffe_field_find(d, f->id);
    char name[64];
    bool repeated = false;
    const bool in_caffe = caffe10_field(d->short_name, f->id, name, sizeof name, &repeated);
    if (e) {
      (*table_rows_seen)++;
      if (strcmp(e->name, f->name))
        fail_msg("the table's %s.%s = %u is kiln's %s", d->short_name, e->name, e->number, f->name);
      if (e->rule == KILN_CAFFE_ONE_VALUE) {
        if (!in_caffe || strcmp(name, f->name) || repeated ||
            f->label != PROTOBUF_C_LABEL_REPEATED)
          fail_msg("%s.%s: listed as Caffe's singular field repeated in kiln, which it is not",
                   d->short_name, f->name);
      } else if (in_caffe) {
        fail_msg("%s.%s = %u is Caffe 1.0's own field ('%s'), not one to drop", d->short_name,
                 f->name, f->id, name);
      }
      if (e->rule != KILN_CAFFE_ONE_VALUE) continue; /* dropped whole: not walked */
    } else {
      if (!in_caffe)
        fail_msg("%s.%s = %u is neither Caffe 1.0's nor in kiln_caffe_fields(): classify it "
                 "(src/proto/caffe_compat.c)", d->short_name, f->name, f->id);
      if (strcmp(name, f->name))
        fail_msg("%s field %u: Caffe 1.0 calls it '%s', kiln '%s'", d->short_name, f->id, name,
                 f->name);
      if (repeated != (f->label == PROTOBUF_C_LABEL_REPEATED))
        fail_msg("%s.%s: repeated in one schema, singular in the other, and not in the table",
                 d->short_name, f->name);
    }
    if (f->type == PROTOBUF_C_TYPE_MESSAGE) classify(f->descriptor, seen, nseen, table_rows_seen);
  }
}

static void test_fields_classified(void **state) {
  (void)state;
  const ProtobufCMessageDescriptor *seen[128];
  size_t nseen = 0;
  int rows_seen = 0;
  const ProtobufCMessageDescriptor *roots[] = {
      &caffe__net_parameter__descriptor, &caffe__solver_parameter__descriptor,
      &caffe__solver_state__descriptor, &caffe__datum__descriptor,
      &caffe__blob_proto_vector__descriptor};
  for (size_t i = 0; i < sizeof roots / sizeof roots[0]; i++)
    classify(roots[i], seen, &nseen, &rows_seen);
  /* every row of the table names a field of a message walked, once */
  int rows = 0;
  for (const kiln_caffe_field *e = kiln_caffe_fields(); e->message; e++, rows++) {
    const ProtobufCFieldDescriptor *f =
        protobuf_c_message_descriptor_get_field(e->message, e->number);
    if (!f || strcmp(f->name, e->name))
      fail_msg("the table's %s.%s = %u is not a field of kiln's schema", e->message->short_name,
               e->name, e->number);
    assert_non_null(e->origin);
    assert_non_null(e->note);
    for (const kiln_caffe_field *o = kiln_caffe_fields(); o < e; o++)
      if (o->message == e->message && o->number == e->number)
        fail_msg("%s.%s is in the table twice", e->message->short_name, e->name);
  }
  assert_int_equal(rows_seen, rows);
  assert_true(nseen > 50); /* the walk reached Caffe's parameter messages */
}

/* kiln's registry, Caffe 1.0's and the two lists between them agree. */
static void test_layer_types(void **state) {
  (void)state;
  for (const char *const *t = kiln_layer_type_names(); *t; t++) {
    const bool caffe = kiln_caffe10_has_layer_type(*t), extra = kiln_caffe_extra_layer_find(*t);
    if (caffe == extra)
      fail_msg("kiln's type '%s' is %s", *t,
               caffe ? "both Caffe 1.0's and listed as kiln's own" : "in neither list");
  }
  int n = 0;
  for (const char *const *t = kiln_caffe10_layer_types(); *t; t++, n++) {
    const bool have = kiln_layer_find(*t) != NULL, missing = kiln_caffe_missing_by_type(*t);
    if (have == missing)
      fail_msg("Caffe 1.0's type '%s' is %s", *t,
               have ? "in kiln and listed as missing" : "neither in kiln nor listed as missing");
  }
  assert_int_equal(n, 59);
  for (const kiln_caffe_extra_layer *x = kiln_caffe_extra_layers(); x->type; x++) {
    assert_non_null(kiln_layer_find(x->type));
    assert_false(kiln_caffe10_has_layer_type(x->type));
  }
  for (const kiln_caffe_missing_layer *m = kiln_caffe_missing_layers(); m->type; m++)
    assert_true(kiln_caffe10_has_layer_type(m->type));
  assert_string_equal(kiln_caffe_extra_layer_find("Swish")->origin, "Caffe's after 1.0");
  assert_string_equal(kiln_caffe_extra_layer_find("GELU")->origin, "kiln only");
}

static ProtobufCMessage *parse(const char *text, const ProtobufCMessageDescriptor *d) {
  ProtobufCMessage *m = NULL;
  if (kiln_text_parse(text, strlen(text), "t.prototxt", d, &m))
    fail_msg("parse: %s", kiln_last_error());
  return m;
}

static char *format(const ProtobufCMessage *m) {
  static char *s; /* static: GCC's -Wdangling-pointer takes a local's address for the text */
  s = NULL;
  assert_int_equal(kiln_text_format(m, &s), KILN_OK);
  return s;
}

/* Packed bytes, to compare two messages whole. */
static uint8_t *pack(const ProtobufCMessage *m, size_t *n) {
  *n = protobuf_c_message_get_packed_size(m);
  uint8_t *b = malloc(*n ? *n : 1);
  assert_non_null(b);
  protobuf_c_message_pack(m, b);
  return b;
}

static int occurrences(const char *text, const char *what) {
  int n = 0;
  for (const char *p = strstr(text, what); p; p = strstr(p + 1, what)) n++;
  return n;
}

static void assert_same_message(const ProtobufCMessage *a, const ProtobufCMessage *b) {
  char *ta = format(a), *tb = format(b);
  assert_string_equal(ta, tb);
  size_t na, nb;
  uint8_t *pa = pack(a, &na), *pb = pack(b, &nb);
  assert_int_equal(na, nb);
  assert_memory_equal(pa, pb, na);
  free(ta);
  free(tb);
  free(pa);
  free(pb);
}

static void assert_drop(const kiln_caffe_drops *d, size_t i, const char *where, const char *field) {
  assert_true(i < d->n);
  assert_string_equal(d->v[i].where, where);
  assert_string_equal(d->v[i].field, field);
  assert_non_null(d->v[i].entry);
  assert_string_equal(d->v[i].field + strlen(d->v[i].field) - strlen(d->v[i].entry->name),
                      d->v[i].entry->name);
}

/* A net of Caffe's layer types with every kind of kiln field set: the same net without them. */
static void test_strip_net(void **state) {
  (void)state;
  static const char with[] =
      "name: 'n'\n"
      "layer { name: 'data' type: 'Data' top: 'data' top: 'label' include { phase: TRAIN }\n"
      "  transform_param { scale: 0.5 mirror: true }\n"
      "  data_param { source: 'train_lmdb' batch_size: 8 backend: LMDB shuffle: true\n"
      "    last_batch: DROP source_weight: 1 } }\n"
      "layer { name: 'h5' type: 'HDF5Data' top: 'x' top: 'y' include { phase: TEST }\n"
      "  hdf5_data_param { source: 'list.txt' batch_size: 2 shuffle: true prefetch: 8 } }\n"
      "layer { name: 'conv' type: 'Convolution' bottom: 'data' top: 'conv'\n"
      "  param { lr_mult: 1 } convolution_param { num_output: 4 kernel_size: 3\n"
      "    weight_filler { type: 'xavier' } } }\n"
      "layer { name: 'pool' type: 'Pooling' bottom: 'conv' top: 'pool'\n"
      "  pooling_param { pool: MAX kernel_size: 2 stride: 2 round_mode: CEIL } }\n"
      "layer { name: 'ip' type: 'InnerProduct' bottom: 'pool' top: 'ip'\n"
      "  inner_product_param { num_output: 3 }\n"
      "  layer_norm_param { eps: 0.001 } }\n"
      "layer { name: 'lstm' type: 'LSTM' bottom: 'ip' bottom: 'label' top: 'h'\n"
      "  recurrent_param { num_output: 5 bidirectional: false } }\n"
      "layer { name: 'loss' type: 'SoftmaxWithLoss' bottom: 'ip' bottom: 'label' top: 'loss'\n"
      "  loss_param { ignore_label: -1 } }\n";
  static const char without[] =
      "name: 'n'\n"
      "layer { name: 'data' type: 'Data' top: 'data' top: 'label' include { phase: TRAIN }\n"
      "  transform_param { scale: 0.5 mirror: true }\n"
      "  data_param { source: 'train_lmdb' batch_size: 8 backend: LMDB } }\n"
      "layer { name: 'h5' type: 'HDF5Data' top: 'x' top: 'y' include { phase: TEST }\n"
      "  hdf5_data_param { source: 'list.txt' batch_size: 2 shuffle: true } }\n"
      "layer { name: 'conv' type: 'Convolution' bottom: 'data' top: 'conv'\n"
      "  param { lr_mult: 1 } convolution_param { num_output: 4 kernel_size: 3\n"
      "    weight_filler { type: 'xavier' } } }\n"
      "layer { name: 'pool' type: 'Pooling' bottom: 'conv' top: 'pool'\n"
      "  pooling_param { pool: MAX kernel_size: 2 stride: 2 } }\n"
      "layer { name: 'ip' type: 'InnerProduct' bottom: 'pool' top: 'ip'\n"
      "  inner_product_param { num_output: 3 } }\n"
      "layer { name: 'lstm' type: 'LSTM' bottom: 'ip' bottom: 'label' top: 'h'\n"
      "  recurrent_param { num_output: 5 } }\n"
      "layer { name: 'loss' type: 'SoftmaxWithLoss' bottom: 'ip' bottom: 'label' top: 'loss'\n"
      "  loss_param { ignore_label: -1 } }\n";
  ProtobufCMessage *m = parse(with, &caffe__net_parameter__descriptor);
  ProtobufCMessage *want = parse(without, &caffe__net_parameter__descriptor);
  kiln_caffe_drops d;
  assert_int_equal(kiln_net_param_to_caffe10((Caffe__NetParameter *)m, "t.prototxt", &d), KILN_OK);
  assert_int_equal(d.n, 7);
  assert_drop(&d, 0, "layer 'data'", "data_param.shuffle");
  assert_drop(&d, 1, "layer 'data'", "data_param.last_batch");
  assert_drop(&d, 2, "layer 'data'", "data_param.source_weight");
  assert_drop(&d, 3, "layer 'h5'", "hdf5_data_param.prefetch");
  assert_drop(&d, 4, "layer 'pool'", "pooling_param.round_mode");
  assert_drop(&d, 5, "layer 'ip'", "layer_norm_param");
  assert_drop(&d, 6, "layer 'lstm'", "recurrent_param.bidirectional");
  assert_string_equal(d.v[0].entry->origin, "kiln only");
  assert_string_equal(d.v[4].entry->origin, "Caffe's after 1.0");
  assert_same_message(m, want);
  /* the text kiln writes holds none of the dropped names (shuffle once: HDF5Data's is Caffe's) */
  char *t = format(m);
  for (size_t i = 0; i < d.n; i++)
    if (strcmp(d.v[i].entry->name, "shuffle")) assert_null(strstr(t, d.v[i].entry->name));
  assert_int_equal(occurrences(t, "shuffle"), 1);
  assert_int_equal(occurrences(t, "shuffle: true"), 1);
  free(t);
  kiln_caffe_drops_free(&d);
  assert_int_equal(d.n, 0);
  /* a net of Caffe's alone: nothing dropped, nothing changed */
  assert_int_equal(kiln_net_param_to_caffe10((Caffe__NetParameter *)want, "w.prototxt", &d),
                   KILN_OK);
  assert_int_equal(d.n, 0);
  assert_same_message(m, want);
  kiln_caffe_drops_free(&d);
  protobuf_c_message_free_unpacked(m, NULL);
  protobuf_c_message_free_unpacked(want, NULL);
}

/* A solver's own fields and those of the nets written inside it. */
static void test_strip_solver(void **state) {
  (void)state;
  static const char with[] =
      "net_param { name: 'n' layer { name: 'd' type: 'Data' top: 'x'\n"
      "  data_param { source: 's' batch_size: 2 shuffle: true } } }\n"
      "test_net_param { layer { type: 'Data' top: 'x' data_param { source: 't' last_batch: KEEP } } }\n"
      "base_lr: 0.1 max_iter: 10 lr_policy: 'fixed' weights: 'a.caffemodel'\n"
      "sync { mode: MODEL interval_iters: 4 } divergence_factor: 0 random_seed: 3\n";
  static const char without[] =
      "net_param { name: 'n' layer { name: 'd' type: 'Data' top: 'x'\n"
      "  data_param { source: 's' batch_size: 2 } } }\n"
      "test_net_param { layer { type: 'Data' top: 'x' data_param { source: 't' } } }\n"
      "base_lr: 0.1 max_iter: 10 lr_policy: 'fixed' random_seed: 3\n";
  ProtobufCMessage *m = parse(with, &caffe__solver_parameter__descriptor);
  ProtobufCMessage *want = parse(without, &caffe__solver_parameter__descriptor);
  kiln_caffe_drops d;
  assert_int_equal(kiln_solver_param_to_caffe10((Caffe__SolverParameter *)m, "s.prototxt", &d),
                   KILN_OK);
  /* in field-number order: test_net_param 22, net_param 25, weights 42, sync 1000, ... */
  assert_int_equal(d.n, 5);
  assert_drop(&d, 0, "test_net_param[0]: layer 0 (unnamed)", "data_param.last_batch");
  assert_drop(&d, 1, "net_param: layer 'd'", "data_param.shuffle");
  assert_drop(&d, 2, "", "weights");
  assert_drop(&d, 3, "", "sync");
  assert_drop(&d, 4, "", "divergence_factor");
  assert_string_equal(d.v[2].entry->origin, "Caffe's after 1.0");
  assert_same_message(m, want);
  kiln_caffe_drops_free(&d);
  protobuf_c_message_free_unpacked(m, NULL);
  protobuf_c_message_free_unpacked(want, NULL);
}

static void expect_refused(const char *text, const char *message) {
  ProtobufCMessage *m = parse(text, &caffe__net_parameter__descriptor);
  size_t n0;
  uint8_t *before = pack(m, &n0);
  kiln_caffe_drops d = {0};
  assert_int_equal(kiln_net_param_to_caffe10((Caffe__NetParameter *)m, "r.prototxt", &d),
                   KILN_ERR_UNSUPPORTED);
  assert_string_equal(kiln_last_error(), message);
  assert_int_equal(d.n, 0);
  assert_null(d.v);
  size_t n1;
  uint8_t *after = pack(m, &n1); /* left as it was */
  assert_int_equal(n0, n1);
  assert_memory_equal(before, after, n0);
  free(before);
  free(after);
  protobuf_c_message_free_unpacked(m, NULL);
}

/* What Caffe 1.0 cannot express: refused by name, nothing changed. */
static void test_refusals(void **state) {
  (void)state;
  expect_refused("layer { name: 'g' type: 'GELU' bottom: 'x' top: 'y' }\n",
                 "r.prototxt: layer 'g': type 'GELU' is kiln's own; Caffe 1.0 has no such layer "
                 "type");
  expect_refused("layer { name: 's' type: 'Swish' bottom: 'x' top: 'y' }\n",
                 "r.prototxt: layer 's': type 'Swish' was added to Caffe after 1.0; Caffe 1.0 "
                 "has no such layer type");
  expect_refused("layer { name: 'f' type: 'Frobnicate' }\n",
                 "r.prototxt: layer 'f': type 'Frobnicate' is not a layer type of Caffe 1.0");
  expect_refused("layer { type: 'TextData' top: 'x' text_data_param { source: 'a.txt' } }\n",
                 "r.prototxt: layer 0 (unnamed): type 'TextData' is kiln's own; Caffe 1.0 has no "
                 "such layer type");
  expect_refused("layer { name: 'l' type: 'LSTM' recurrent_param { num_output: 2 "
                 "bidirectional: true } }\n",
                 "r.prototxt: layer 'l': recurrent_param.bidirectional: true (kiln only) has no "
                 "Caffe 1.0 equivalent: Caffe 1.0's RNN and LSTM run in one direction, with other "
                 "output and weight shapes");
  expect_refused("layer { name: 'p' type: 'Pooling' pooling_param { round_mode: FLOOR } }\n",
                 "r.prototxt: layer 'p': pooling_param.round_mode: FLOOR (Caffe's after 1.0) has "
                 "no Caffe 1.0 equivalent: Caffe 1.0 always rounds the pooled size up (CEIL)");
  expect_refused("layer { name: 'd' type: 'Data' data_param { source: 'a' source: 'b' "
                 "source_weight: 1 source_weight: 3 } }\n",
                 "r.prototxt: layer 'd': data_param.source has 2 values (repeated in kiln, "
                 "singular in Caffe): kiln mixes several databases; Caffe 1.0 reads one");
  /* several: the first named, the others counted */
  expect_refused("layer { name: 'a' type: 'LayerNorm' }\nlayer { name: 'b' type: 'GRU' }\n"
                 "layer { name: 'c' type: 'ReLU' }\nlayer { name: 'd' type: 'F1' }\n",
                 "r.prototxt: layer 'a': type 'LayerNorm' is kiln's own; Caffe 1.0 has no such "
                 "layer type (and 2 more layers or fields Caffe 1.0 cannot take)");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fields_classified),
      cmocka_unit_test(test_layer_types),
      cmocka_unit_test(test_strip_net),
      cmocka_unit_test(test_strip_solver),
      cmocka_unit_test(test_refusals),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
