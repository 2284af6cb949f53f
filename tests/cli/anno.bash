# A tiny detection set and net for the AnnotatedData shell tests (sourced after lib.bash, in
# $WORK; not a test):
#   - anno_tool: TOOL, tests/support/annoset_tool, which writes the images (exits 77 when it is
#     not built);
#   - anno_set: VOC/ (10 PNG images of 24..40 x 20..32 pixels, VOC annotations of 1 to 3
#     objects of 3 classes), labelmap.prototxt, trainval.txt, and train_lmdb (shuffled) and
#     test_lmdb written from them by `kiln convert annoset`;
#   - anno_net [LABELMAP]: a net on them, on standard output: SSD's training augmentation
#     (smaller: distortion, expansion, two batch samplers, a 16 x 16 WARP by any interpolation,
#     mirror; batch 3), a TEST-phase AnnotatedData as the fork's test nets have it (the resize
#     alone, an empty batch_sampler; batch 4), a convolution and an InnerProduct on the data
#     and an InnerProduct on each label row (axis 3), each summed into the loss, so that both
#     tops reach the weights; LABELMAP (in $WORK) is the train layer's label map;
#   - anno_solver NAME NET [EXTRA]: a solver of NET (6 iterations, seed 17, a test pass of 2
#     batches and a snapshot every 3) writing under $WORK/NAME, with EXTRA's lines appended.
anno_tool() {
  TOOL=${KILN_ANNOSET_TOOL:-$(dirname "$KILN")/tests/annoset_tool}
  [ -x "$TOOL" ] || { echo "no annoset_tool at $TOOL (build its target)"; exit 77; }
}

# anno_voc W H OBJECT...: an annotation; OBJECT is NAME:DIFFICULT:XMIN,YMIN,XMAX,YMAX
anno_voc() {
  local w=$1 h=$2 o name diff box x0 y0 x1 y1
  shift 2
  printf '<annotation><size><width>%s</width><height>%s</height><depth>3</depth></size>\n' "$w" "$h"
  for o in "$@"; do
    IFS=: read -r name diff box <<<"$o"
    IFS=, read -r x0 y0 x1 y1 <<<"$box"
    printf '<object><name>%s</name><difficult>%s</difficult><bndbox><xmin>%s</xmin>' "$name" "$diff" "$x0"
    printf '<ymin>%s</ymin><xmax>%s</xmax><ymax>%s</ymax></bndbox></object>\n' "$y0" "$x1" "$y1"
  done
  printf '</annotation>\n'
}

anno_set() {
  anno_tool
  mkdir -p VOC/JPEGImages VOC/Annotations
  cat > labelmap.prototxt <<'EOF'
item { name: "none_of_the_above" label: 0 display_name: "background" }
item { name: "disc" label: 1 display_name: "disc" }
item { name: "square" label: 2 display_name: "square" }
item { name: "cross" label: 3 display_name: "cross" }
EOF
  : > trainval.txt
  local i w h objs
  for i in $(seq 1 10); do
    w=$((24 + (i * 7) % 17)) h=$((20 + (i * 5) % 13))
    need "image $i" -- "$TOOL" png "VOC/JPEGImages/$i.png" "$w" "$h" "$i"
    objs=("disc:0:2,3,$((w / 2)),$((h / 2))")
    [ $((i % 2)) = 0 ] && objs+=("square:1:$((w / 3)),$((h / 4)),$((w - 2)),$((h - 1))")
    [ $((i % 3)) = 0 ] && objs+=("cross:0:1,$((h / 2)),$((w / 4)),$((h - 2))")
    anno_voc "$w" "$h" "${objs[@]}" > "VOC/Annotations/$i.xml"
    echo "VOC/JPEGImages/$i.png VOC/Annotations/$i.xml" >> trainval.txt
  done
  need "convert annoset" -- "$KILN" convert annoset trainval.txt ./ train_lmdb \
    --label-map labelmap.prototxt --shuffle
  need "convert annoset (test)" -- "$KILN" convert annoset trainval.txt ./ test_lmdb \
    --label-map labelmap.prototxt
}

anno_net() {
  cat <<NET
name: "anno"
layer { name: "data" type: "AnnotatedData" top: "data" top: "label" include { phase: TRAIN }
  transform_param { mirror: true mean_value: 104 mean_value: 117 mean_value: 123 scale: 0.0078125
    resize_param { prob: 1 resize_mode: WARP height: 16 width: 16 interp_mode: LINEAR
      interp_mode: AREA interp_mode: NEAREST interp_mode: CUBIC interp_mode: LANCZOS4 }
    emit_constraint { emit_type: CENTER }
    distort_param { brightness_prob: 0.5 brightness_delta: 32 contrast_prob: 0.5
      contrast_lower: 0.5 contrast_upper: 1.5 hue_prob: 0.5 hue_delta: 18 saturation_prob: 0.5
      saturation_lower: 0.5 saturation_upper: 1.5 random_order_prob: 0.0 }
    expand_param { prob: 0.5 max_expand_ratio: 2.0 } }
  data_param { source: "$WORK/train_lmdb" batch_size: 3 backend: LMDB }
  annotated_data_param {
    batch_sampler { max_sample: 1 max_trials: 1 }
    batch_sampler { sampler { min_scale: 0.3 max_scale: 1.0 min_aspect_ratio: 0.5
      max_aspect_ratio: 2.0 } sample_constraint { min_jaccard_overlap: 0.1 } max_sample: 1
      max_trials: 50 }
    label_map_file: "$WORK/${1:-labelmap.prototxt}" } }
layer { name: "data" type: "AnnotatedData" top: "data" top: "label" include { phase: TEST }
  transform_param { mean_value: 104 mean_value: 117 mean_value: 123 scale: 0.0078125
    resize_param { prob: 1 resize_mode: WARP height: 16 width: 16 interp_mode: LINEAR } }
  data_param { source: "$WORK/test_lmdb" batch_size: 4 backend: LMDB }
  annotated_data_param { batch_sampler { } label_map_file: "$WORK/labelmap.prototxt" } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
  convolution_param { num_output: 4 kernel_size: 3 stride: 2 weight_filler { type: "xavier" } } }
layer { name: "ip" type: "InnerProduct" bottom: "conv" top: "ip"
  inner_product_param { num_output: 1 weight_filler { type: "xavier" } } }
layer { name: "loss" type: "Reduction" bottom: "ip" top: "loss" loss_weight: 1
  reduction_param { operation: SUMSQ coeff: 0.1 } }
layer { name: "rows" type: "InnerProduct" bottom: "label" top: "rows"
  inner_product_param { num_output: 2 axis: 3 weight_filler { type: "xavier" } } }
layer { name: "rloss" type: "Reduction" bottom: "rows" top: "rloss" loss_weight: 1
  reduction_param { operation: SUMSQ coeff: 0.01 } }
NET
}

anno_solver() {
  printf 'net: "%s/%s"\nbase_lr: 0.01\nlr_policy: "fixed"\nmomentum: 0.9\n' "$WORK" "$2"
  printf 'max_iter: 6\ndisplay: 1\nrandom_seed: 17\ntest_iter: 2\ntest_interval: 3\n'
  printf 'snapshot: 3\nsnapshot_prefix: "%s/%s"\n%s' "$WORK" "$1" "${3:-}"
}
