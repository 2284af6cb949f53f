#!/usr/bin/env python3
"""Writes the zoo's detection nets into models/: `ssd`, a small SSD trained on the cache's
synthetic `shapes-det` set, and `ssd300`, SSD300 on VGG-16 for PASCAL VOC 2007 in the layout of
the SSD fork's ssd_pascal.py (its layer sizes, prior boxes, losses, augmentation and schedule are
facts of the paper and the fork's published nets; the text is generated here). Each gets a
training net with its TEST phase (ssd_train_test.prototxt: AnnotatedData, MultiBoxLoss;
DetectionOutput and DetectionEvaluate for mAP), a deploy net (Input to DetectionOutput) and a
solver. Run from the repository root; the outputs are committed, so the build never needs
Python."""
import importlib.util
import os

_spec = importlib.util.spec_from_file_location(
    "gen_deploy_nets", os.path.join(os.path.dirname(os.path.abspath(__file__)), "gen-deploy-nets.py"))
_gen = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_gen)


class DetNet(_gen.Net):
    def conv(self, name, bottom, n, k, stride=1, pad=0, dilation=1, bias=True, top=None):
        opts = f"num_output: {n} kernel_size: {k}"
        if pad:
            opts += f" pad: {pad}"
        if stride != 1:
            opts += f" stride: {stride}"
        if dilation != 1:
            opts += f" dilation: {dilation}"
        if not bias:
            opts += " bias_term: false"
        fill = f" weight_filler {{ {self.conv_filler} }}" if self.train else ""
        if self.train and bias:
            fill += ' bias_filler { type: "constant" value: 0 }'
        self.layer(name, "Convolution", [bottom], [top or name],
                   self.params(bias) + f"convolution_param {{ {opts}{fill} }}")
        return top or name

    def bn_relu(self, blob):
        """BatchNorm (batch statistics in TRAIN, the kept ones in TEST), Scale and ReLU in place."""
        self.layer(f"{blob}_bn", "BatchNorm", [blob], [blob],
                   "batch_norm_param { moving_average_fraction: 0.99 }" if self.train else "")
        self.layer(f"{blob}_scale", "Scale", [blob], [blob], "scale_param { bias_term: true }")
        return self.relu(f"{blob}_relu", blob)


def transform_text(train, size, mean, scale=None, distort=True, expand=4.0, interp_all=True):
    """transform_param of an AnnotatedData layer: SSD's augmentation in TRAIN, the resize alone in
    TEST."""
    means = "".join(f"\n    mean_value: {m:g}" for m in mean)
    sc = f"\n    scale: {scale:.10g}" if scale is not None else ""
    modes = ("LINEAR", "AREA", "NEAREST", "CUBIC", "LANCZOS4") if train and interp_all else ("LINEAR",)
    interp = "".join(f"\n      interp_mode: {m}" for m in modes)
    mirror = "\n    mirror: true" if train else ""
    text = f"""  transform_param {{{mirror}{means}{sc}
    resize_param {{
      prob: 1
      resize_mode: WARP
      height: {size}
      width: {size}{interp}
    }}"""
    if train:
        text += """
    emit_constraint {
      emit_type: CENTER
    }"""
        if distort:
            text += """
    distort_param {
      brightness_prob: 0.5
      brightness_delta: 32
      contrast_prob: 0.5
      contrast_lower: 0.5
      contrast_upper: 1.5
      hue_prob: 0.5
      hue_delta: 18
      saturation_prob: 0.5
      saturation_lower: 0.5
      saturation_upper: 1.5
      random_order_prob: 0.0
    }"""
        if expand:
            text += f"""
    expand_param {{
      prob: 0.5
      max_expand_ratio: {expand:g}
    }}"""
    return text + "\n  }"


def samplers_text(train, min_scale=0.3):
    """SSD's batch samplers: the whole image, and crops of at least min_scale whose overlap with
    some object is at least 0.1, 0.3, 0.5, 0.7, 0.9, or anything (TEST: the whole image)."""
    if not train:
        return "    batch_sampler {\n    }"
    blocks = ["    batch_sampler {\n      max_sample: 1\n      max_trials: 1\n    }"]
    for c in ("min_jaccard_overlap: 0.1", "min_jaccard_overlap: 0.3", "min_jaccard_overlap: 0.5",
              "min_jaccard_overlap: 0.7", "min_jaccard_overlap: 0.9", "max_jaccard_overlap: 1.0"):
        blocks.append(f"""    batch_sampler {{
      sampler {{
        min_scale: {min_scale:g}
        max_scale: 1.0
        min_aspect_ratio: 0.5
        max_aspect_ratio: 2.0
      }}
      sample_constraint {{
        {c}
      }}
      max_sample: 1
      max_trials: 50
    }}""")
    return "\n".join(blocks)


def data_layers(n, size, mean, scale, sources, batches, labelmap, **aug):
    for phase, source, batch in zip(("TRAIN", "TEST"), sources, batches):
        train = phase == "TRAIN"
        n.lines.append(f"""layer {{
  name: "data"
  type: "AnnotatedData"
  top: "data"
  top: "label"
  include {{ phase: {phase} }}
{transform_text(train, size, mean, scale, **aug)}
  data_param {{
    source: "{source}"
    batch_size: {batch}
    backend: LMDB
  }}
  annotated_data_param {{
{samplers_text(train)}
    label_map_file: "{labelmap}"
  }}
}}""")


def heads(n, sources, classes, img):
    """Each source's location and confidence predictions (3x3 convolutions, NCHW to NHWC, flat)
    and its prior boxes; then each kind concatenated over the sources."""
    locs, confs, priors = [], [], []
    for blob, min_size, max_size, ratios, step in sources:
        p = (1 + 2 * len(ratios)) + (1 if max_size else 0)
        for kind, per, out in (("loc", 4, locs), ("conf", classes, confs)):
            name = f"{blob}_mbox_{kind}"
            n.conv(name, blob, p * per, 3, pad=1)
            n.layer(f"{name}_perm", "Permute", [name], [f"{name}_perm"],
                    "permute_param { order: 0 order: 2 order: 3 order: 1 }")
            n.layer(f"{name}_flat", "Flatten", [f"{name}_perm"], [f"{name}_flat"],
                    "flatten_param { axis: 1 }")
            out.append(f"{name}_flat")
        r = "".join(f" aspect_ratio: {a:g}" for a in ratios)
        mx = f" max_size: {max_size:g}" if max_size else ""
        n.layer(f"{blob}_mbox_priorbox", "PriorBox", [blob, "data"], [f"{blob}_mbox_priorbox"],
                f"prior_box_param {{ min_size: {min_size:g}{mx}{r} flip: true clip: false "
                f"variance: 0.1 variance: 0.1 variance: 0.2 variance: 0.2 step: {step:g} offset: 0.5 }}")
        priors.append(f"{blob}_mbox_priorbox")
    for name, bottoms, axis in (("mbox_loc", locs, 1), ("mbox_conf", confs, 1), ("mbox_priorbox", priors, 2)):
        n.layer(name, "Concat", bottoms, [name], f"concat_param {{ axis: {axis} }}")


def detection_out(n, classes, top_k, keep_top_k, test_phase):
    include = "include { phase: TEST }\n  " if test_phase else ""
    n.layer("mbox_conf_reshape", "Reshape", ["mbox_conf"], ["mbox_conf_reshape"],
            include + f"reshape_param {{ shape {{ dim: 0 dim: -1 dim: {classes} }} }}")
    n.layer("mbox_conf_softmax", "Softmax", ["mbox_conf_reshape"], ["mbox_conf_softmax"],
            include + "softmax_param { axis: 2 }")
    n.layer("mbox_conf_flatten", "Flatten", ["mbox_conf_softmax"], ["mbox_conf_flatten"],
            include + "flatten_param { axis: 1 }")
    n.layer("detection_out", "DetectionOutput", ["mbox_loc", "mbox_conf_flatten", "mbox_priorbox"],
            ["detection_out"], include +
            f"detection_output_param {{ num_classes: {classes} share_location: true background_label_id: 0 "
            f"nms_param {{ nms_threshold: 0.45 top_k: {top_k} }} code_type: CENTER_SIZE "
            f"keep_top_k: {keep_top_k} confidence_threshold: 0.01 }}")


def losses(n, classes, name_size):
    n.layer("mbox_loss", "MultiBoxLoss", ["mbox_loc", "mbox_conf", "mbox_priorbox", "label"], ["mbox_loss"],
            "include { phase: TRAIN }\n  propagate_down: true propagate_down: true propagate_down: false "
            "propagate_down: false\n  loss_param { normalization: VALID }\n  "
            f"multibox_loss_param {{ loc_loss_type: SMOOTH_L1 conf_loss_type: SOFTMAX loc_weight: 1 "
            f"num_classes: {classes} share_location: true match_type: PER_PREDICTION overlap_threshold: 0.5 "
            "use_prior_for_matching: true background_label_id: 0 use_difficult_gt: true neg_pos_ratio: 3 "
            "neg_overlap: 0.5 code_type: CENTER_SIZE ignore_cross_boundary_bbox: false mining_type: MAX_NEGATIVE }")


def evaluate(n, classes, name_size):
    n.layer("detection_eval", "DetectionEvaluate", ["detection_out", "label"], ["detection_eval"],
            "include { phase: TEST }\n  "
            f"detection_evaluate_param {{ num_classes: {classes} background_label_id: 0 overlap_threshold: 0.5 "
            f'evaluate_difficult_gt: false name_size_file: "{name_size}" }}')


def input_layer(n, size):
    n.layer("data", "Input", [], ["data"], f"input_param {{ shape {{ dim: 1 dim: 3 dim: {size} dim: {size} }} }}")


# ---- ssd: a small SSD for shapes-det ------------------------------------------------------------

SHAPES = "$KILN_DATA/shapes-det/"
SSD_SIZE = 96
SSD_CLASSES = 5  # background and disc, square, triangle, cross


def ssd_body(n):
    """Five 3x3 stages with BatchNorm, halving with max pooling (96 -> 48 -> 24 -> 12 -> 6), then
    two strided 3x3 convolutions (3, 1): predictions from 24x24 on, for objects of 11 to 58
    pixels in a 96x96 input."""
    n.conv_filler = 'type: "msra"'
    x = "data"
    for i, (c, pool) in enumerate(((16, True), (32, True), (64, False)), 1):
        x = n.bn_relu(n.conv(f"conv{i}", x, c, 3, pad=1, bias=False))
        if pool:
            x = n.pool(f"pool{i}", x, "MAX", 2, 2)
    srcs = [x]  # 24x24
    x = n.pool("pool3", x, "MAX", 2, 2)
    x = n.bn_relu(n.conv("conv4", x, 96, 3, pad=1, bias=False))  # 12x12
    srcs.append(x)
    x = n.pool("pool4", x, "MAX", 2, 2)
    x = n.bn_relu(n.conv("conv5", x, 128, 3, pad=1, bias=False))  # 6x6
    srcs.append(x)
    x = n.bn_relu(n.conv("conv6", x, 128, 3, stride=2, pad=1, bias=False))  # 3x3
    srcs.append(x)
    x = n.bn_relu(n.conv("conv7", x, 128, 3, bias=False))  # 1x1
    srcs.append(x)
    # (source, min size, max size, aspect ratios besides 1 (and their inverses), step) in pixels
    return [(srcs[0], 10, 20, (2,), 4), (srcs[1], 20, 36, (2,), 8), (srcs[2], 36, 54, (2,), 16),
            (srcs[3], 54, 72, (2,), 32), (srcs[4], 72, 96, (2,), 96)]


def ssd():
    header = ("# A small SSD (Liu et al.'s single-shot detector) for the cache's synthetic shapes-det set\n"
              "# (kiln data fetch shapes-det): a 7-layer BatchNorm backbone on a 96x96 input, predictions\n"
              "# from five scales (24x24 to 1x1), the SSD fork's MultiBoxLoss, DetectionOutput and\n"
              "# DetectionEvaluate: generated by scripts/gen-ssd-nets.py (models/README.md)")
    n = DetNet("SSD-shapes", train=True)
    n.lines.insert(0, header)
    data_layers(n, SSD_SIZE, (127.5, 127.5, 127.5), 1 / 128, (SHAPES + "trainval_lmdb", SHAPES + "test_lmdb"),
                (32, 25), SHAPES + "labelmap.prototxt", distort=True, expand=2.0)
    heads(n, ssd_body(n), SSD_CLASSES, SSD_SIZE)
    losses(n, SSD_CLASSES, SHAPES + "test_name_size.txt")
    detection_out(n, SSD_CLASSES, 100, 50, True)
    evaluate(n, SSD_CLASSES, SHAPES + "test_name_size.txt")
    n.write("models/ssd/ssd_train_test.prototxt")
    d = DetNet("SSD-shapes")
    d.lines.insert(0, header.replace("DetectionEvaluate: generated", "no DetectionEvaluate (deploy): generated"))
    input_layer(d, SSD_SIZE)
    heads(d, ssd_body(d), SSD_CLASSES, SSD_SIZE)
    detection_out(d, SSD_CLASSES, 100, 50, False)
    d.write("models/ssd/ssd_deploy.prototxt")


# ---- ssd300: SSD300 on VGG-16 for VOC 2007 (the fork's ssd_pascal layout) ------------------------

VOC = "$KILN_DATA/voc2007/"
VOC_CLASSES = 21


def vgg_reduced(n):
    """VGG-16's convolutions, pool5 3x3 stride 1, fc6 and fc7 as convolutions (fc6 dilated 6),
    then the extra layers conv6 to conv9; the sources of the six heads."""
    n.conv_filler = 'type: "xavier"'
    x = "data"
    for stage, (c, k) in enumerate(((64, 2), (128, 2), (256, 3), (512, 3), (512, 3)), 1):
        for i in range(1, k + 1):
            x = n.relu(f"relu{stage}_{i}", n.conv(f"conv{stage}_{i}", x, c, 3, pad=1))
        if stage == 4:
            conv4_3 = x
        x = n.pool(f"pool{stage}", x, "MAX", 3 if stage == 5 else 2, 1 if stage == 5 else 2, 1 if stage == 5 else 0)
    x = n.relu("relu6", n.conv("fc6", x, 1024, 3, pad=6, dilation=6))
    fc7 = x = n.relu("relu7", n.conv("fc7", x, 1024, 1))
    extra = []
    for i, (c1, c2, stride, pad) in enumerate(((256, 512, 2, 1), (128, 256, 2, 1), (128, 256, 1, 0),
                                                (128, 256, 1, 0)), 6):
        x = n.relu(f"conv{i}_1_relu", n.conv(f"conv{i}_1", x, c1, 1))
        x = n.relu(f"conv{i}_2_relu", n.conv(f"conv{i}_2", x, c2, 3, stride=stride, pad=pad))
        extra.append(x)
    n.layer("conv4_3_norm", "Normalize", [conv4_3], ["conv4_3_norm"],
            "norm_param { across_spatial: false scale_filler { type: \"constant\" value: 20 } channel_shared: false }")
    return [("conv4_3_norm", 30, 60, (2,), 8), (fc7, 60, 111, (2, 3), 16), (extra[0], 111, 162, (2, 3), 32),
            (extra[1], 162, 213, (2, 3), 64), (extra[2], 213, 264, (2,), 100), (extra[3], 264, 315, (2,), 300)]


def ssd300():
    header = ("# SSD300 on VGG-16 (Liu et al.) for PASCAL VOC 2007 (kiln data fetch voc2007 --from ...), in\n"
              "# the layout of the SSD fork's ssd_pascal.py: its layers, prior boxes, augmentation, losses\n"
              "# and evaluation: generated by scripts/gen-ssd-nets.py (models/README.md)")
    n = DetNet("VGG_VOC2007_SSD_300x300", train=True)
    n.lines.insert(0, header)
    data_layers(n, 300, (104, 117, 123), None, (VOC + "trainval_lmdb", VOC + "test_lmdb"), (32, 8),
                VOC + "labelmap.prototxt", distort=True, expand=4.0)
    heads(n, vgg_reduced(n), VOC_CLASSES, 300)
    losses(n, VOC_CLASSES, VOC + "test_name_size.txt")
    detection_out(n, VOC_CLASSES, 400, 200, True)
    evaluate(n, VOC_CLASSES, VOC + "test_name_size.txt")
    n.write("models/ssd300/ssd300_train_test.prototxt")
    d = DetNet("VGG_VOC2007_SSD_300x300")
    d.lines.insert(0, header)
    input_layer(d, 300)
    heads(d, vgg_reduced(d), VOC_CLASSES, 300)
    detection_out(d, VOC_CLASSES, 400, 200, False)
    d.write("models/ssd300/ssd300_deploy.prototxt")


if __name__ == "__main__":
    ssd()
    ssd300()
