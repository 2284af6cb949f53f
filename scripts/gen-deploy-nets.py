#!/usr/bin/env python3
"""Writes the zoo's generated nets into models/: the trainable Fashion-MNIST nets resnet20, vgg and densenet40
(with DenseNet-BC benchmark nets of depth 40, 100 and 160 in bench/nets/);
the deploy nets of the classic ImageNet architectures (AlexNet, ZF Net, VGG-16, GoogLeNet,
ResNet-50) in the form Caffe's published deploy files use (an Input layer; ResNet-50 with the older
`input:` / `input_dim:` header); and training nets of AlexNet, GoogLeNet and ResNet-50 on
ILSVRC-2012 (train_val.prototxt). The architectures are the published ones (layer sizes are facts
of the papers); the text is generated here. Run from the repository root; the outputs are
committed, so the build never needs Python."""
import os


class Net:
    def __init__(self, name, train=False):
        self.lines = [f'name: "{name}"']
        # A training net gives each weight Caffe's learning-rate and decay multipliers (1 and 1)
        # and each bias its own (2 and 0); a deploy net needs none.
        self.train = train
        # Weight fillers of convolutions and inner products, and a constant for their biases
        # (None: Caffe's default, 0); a model sets its own, a layer may override them.
        self.conv_filler, self.fc_filler, self.bias = 'type: "msra"', 'type: "xavier"', None

    def params(self, bias):
        if not self.train:
            return ""
        return "param { lr_mult: 1 decay_mult: 1 }" + (" param { lr_mult: 2 decay_mult: 0 }" if bias else "") + "\n  "

    def layer(self, name, type_, bottoms, tops, body=""):
        b = "".join(f' bottom: "{x}"' for x in bottoms)
        t = "".join(f' top: "{x}"' for x in tops)
        self.lines.append(f'layer {{ name: "{name}" type: "{type_}"{b}{t}' + (f"\n  {body}" if body else "") + " }")

    def fillers(self, weight, bias_value, bias):
        text = f" weight_filler {{ {weight} }}"
        if bias and bias_value:  # 0 is the default
            text += f" bias_filler {{ type: \"constant\" value: {bias_value:g} }}"
        return text

    def conv(self, name, bottom, n, k, stride=1, pad=0, group=1, bias=True, top=None, w=None, b=None):
        opts = f"num_output: {n} kernel_size: {k}"
        if stride != 1:
            opts += f" stride: {stride}"
        if pad:
            opts += f" pad: {pad}"
        if group != 1:
            opts += f" group: {group}"
        if not bias:
            opts += " bias_term: false"
        self.layer(name, "Convolution", [bottom], [top or name], self.params(bias) +
                   f"convolution_param {{ {opts}{self.fillers(w or self.conv_filler, self.bias if b is None else b, bias)} }}")
        return top or name

    def relu(self, name, blob):
        self.layer(name, "ReLU", [blob], [blob])
        return blob

    def pool(self, name, bottom, method, k, stride, pad=0):
        p = f" pad: {pad}" if pad else ""
        self.layer(name, "Pooling", [bottom], [name],
                   f"pooling_param {{ pool: {method} kernel_size: {k} stride: {stride}{p} }}")
        return name

    def lrn(self, name, bottom, size=5, alpha=1e-4, beta=0.75):
        self.layer(name, "LRN", [bottom], [name],
                   f"lrn_param {{ local_size: {size} alpha: {alpha:g} beta: {beta:g} }}")
        return name

    def fc(self, name, bottom, n, w=None, b=None):
        self.layer(name, "InnerProduct", [bottom], [name], self.params(True) +
                   f"inner_product_param {{ num_output: {n}{self.fillers(w or self.fc_filler, self.bias if b is None else b, True)} }}")
        return name

    def write(self, path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write("\n".join(self.lines) + "\n")


def input_layer(net, shape):
    dims = " ".join(f"dim: {d}" for d in shape)
    net.layer("data", "Input", [], ["data"], f"input_param {{ shape: {{ {dims} }} }}")


# ILSVRC-2012 as Caffe's ImageNet example lays it out (data/ilsvrc12/train.txt and val.txt: one
# `PATH LABEL` a line, labels 0..999), kept under $KILN_DATA/ilsvrc12/ with the images in train/
# and val/. The training nets read the JPEG files through ImageData, resized to 256x256 as Caffe's
# ImageNet example resizes them, with Caffe's per-channel ImageNet means (BGR).
IMAGENET = "$KILN_DATA/ilsvrc12/"


def image_data_layers(n, crop, train_batch, test_batch):
    for phase, split, batch in (("TRAIN", "train", train_batch), ("TEST", "val", test_batch)):
        # Training: a random crop, mirrored half the time, in a new order each epoch. Testing:
        # the centre crop of every image, in the list's order.
        mirror = "\n    mirror: true" if phase == "TRAIN" else ""
        shuffle = "\n    shuffle: true" if phase == "TRAIN" else ""
        n.lines.append(f'''layer {{
  name: "data"
  type: "ImageData"
  top: "data"
  top: "label"
  include {{ phase: {phase} }}
  transform_param {{
    crop_size: {crop}{mirror}
    mean_value: 104
    mean_value: 117
    mean_value: 123
  }}
  image_data_param {{
    source: "{IMAGENET}{split}.txt"
    root_folder: "{IMAGENET}{split}/"
    batch_size: {batch}{shuffle}
    new_height: 256
    new_width: 256
  }}
}}''')


def outputs(n, x, prefix="", loss_weight=None):
    """A deploy net's Softmax; a training net's loss, and its top-1 and top-5 accuracy in TEST."""
    if not n.train:
        n.layer("prob", "Softmax", [x], ["prob"])
        return
    weight = f"loss_weight: {loss_weight:g}" if loss_weight is not None else ""
    n.layer(prefix + "loss", "SoftmaxWithLoss", [x, "label"], [prefix + "loss"], weight)
    for k in (1, 5):
        n.layer(f"{prefix}top-{k}", "Accuracy", [x, "label"], [f"{prefix}top-{k}"],
                f"include {{ phase: TEST }} accuracy_param {{ top_k: {k} }}")


def begin(n, comment, train, crop, train_batch, test_batch, deploy_input=True):
    if train:
        comment += ",\n# on ILSVRC-2012 through ImageData (models/README.md)"
    n.lines.insert(0, f"# {comment}: generated by scripts/gen-deploy-nets.py")
    if train:
        image_data_layers(n, crop, train_batch, test_batch)
    elif deploy_input:
        input_layer(n, [10, 3, crop, crop])


def model_path(model, train):
    return f"models/{model}/{'train_val' if train else 'deploy'}.prototxt"


def fc_head(n, x, w8=None, b8=None):
    """fc6 and fc7 of 4096 with ReLU and dropout, then fc8 of 1000 (AlexNet, ZF Net, VGG); w8 and
    b8: fc8's own fillers."""
    for i in (6, 7):
        x = n.relu(f"relu{i}", n.fc(f"fc{i}", x, 4096))
        n.layer(f"drop{i}", "Dropout", [x], [x], "dropout_param { dropout_ratio: 0.5 }")
    outputs(n, n.fc("fc8", x, 1000, w=w8, b=b8))


def alexnet(train=False):
    n = Net("AlexNet", train)
    begin(n, "AlexNet / CaffeNet " + ("training net" if train else "deploy net") + " (grouped convolutions, LRN)",
          train, 227, 256, 50)
    # Caffe's initialisation (the paper's, with biases of 0.1 where it has 1): Gaussian weights
    # of std 0.01 (fc6 and fc7: 0.005), biases 0.1 in conv2, conv4, conv5, fc6 and fc7, else 0.
    # The pixels are not scaled (0..255 less the mean): He's (msra) fillers would carry that range
    # through to fc8 and saturate the softmax from the first step.
    gauss = 'type: "gaussian" std: 0.01'
    n.conv_filler, n.fc_filler, n.bias = gauss, 'type: "gaussian" std: 0.005', 0.1
    x = n.relu("relu1", n.conv("conv1", "data", 96, 11, stride=4, b=0))
    x = n.pool("pool1", n.lrn("norm1", x), "MAX", 3, 2)
    x = n.relu("relu2", n.conv("conv2", x, 256, 5, pad=2, group=2))
    x = n.pool("pool2", n.lrn("norm2", x), "MAX", 3, 2)
    x = n.relu("relu3", n.conv("conv3", x, 384, 3, pad=1, b=0))
    x = n.relu("relu4", n.conv("conv4", x, 384, 3, pad=1, group=2))
    x = n.relu("relu5", n.conv("conv5", x, 256, 3, pad=1, group=2))
    fc_head(n, n.pool("pool5", x, "MAX", 3, 2), w8=gauss, b8=0)
    n.write(model_path("alexnet", train))


def zfnet():
    # Zeiler & Fergus's ImageNet net (their figure 3): as AlexNet but with a 7x7 stride-2 conv1
    # and a stride-2 conv2, on one device (no groups). Padding follows the figure's map sizes:
    # conv1 pad 1 (224 -> 110), conv2 no padding (55 -> 26), conv3-5 pad 1, and Caffe's pooling,
    # which rounds up (110 -> 55, 26 -> 13, 13 -> 6). Each of pool1 and pool2 is followed by the
    # contrast normalisation across feature maps, written as Caffe's LRN (5 maps, alpha 1e-4,
    # beta 0.75).
    n = Net("ZFNet")
    begin(n, "ZF Net (Zeiler & Fergus 2013) deploy net, 224x224 input", False, 224, 0, 0)
    x = n.relu("relu1", n.conv("conv1", "data", 96, 7, stride=2, pad=1))
    x = n.lrn("norm1", n.pool("pool1", x, "MAX", 3, 2))
    x = n.relu("relu2", n.conv("conv2", x, 256, 5, stride=2))
    x = n.lrn("norm2", n.pool("pool2", x, "MAX", 3, 2))
    x = n.relu("relu3", n.conv("conv3", x, 384, 3, pad=1))
    x = n.relu("relu4", n.conv("conv4", x, 384, 3, pad=1))
    x = n.relu("relu5", n.conv("conv5", x, 256, 3, pad=1))
    fc_head(n, n.pool("pool5", x, "MAX", 3, 2))
    n.write(model_path("zfnet", False))


def vgg16():
    # Simonyan & Zisserman's configuration D: five stages of 3x3 convolutions (pad 1, stride 1)
    # with ReLU, each stage ending in a 2x2 max pool of stride 2.
    n = Net("VGG_ILSVRC_16_layers")
    begin(n, "VGG-16 (configuration D of Simonyan & Zisserman) deploy net, 224x224 input", False, 224, 0, 0)
    x = "data"
    for stage, (convs, width) in enumerate(((2, 64), (2, 128), (3, 256), (3, 512), (3, 512)), start=1):
        for i in range(1, convs + 1):
            x = n.relu(f"relu{stage}_{i}", n.conv(f"conv{stage}_{i}", x, width, 3, pad=1))
        x = n.pool(f"pool{stage}", x, "MAX", 2, 2)
    fc_head(n, x)
    n.write(model_path("vgg16", False))


def googlenet(train=False):
    n = Net("GoogleNet", train)
    begin(n, "GoogLeNet (Inception v1) " + ("training net with the two auxiliary classifiers" if train else "deploy net")
          + " (Concat, LRN)", train, 224, 32, 50)
    # Caffe's bvlc_googlenet initialisation: Xavier weights, biases 0.2 (the classifiers' 0).
    n.conv_filler, n.bias = 'type: "xavier"', 0.2
    x = n.relu("conv1/relu_7x7", n.conv("conv1/7x7_s2", "data", 64, 7, stride=2, pad=3))
    x = n.lrn("pool1/norm1", n.pool("pool1/3x3_s2", x, "MAX", 3, 2))
    x = n.relu("conv2/relu_3x3_reduce", n.conv("conv2/3x3_reduce", x, 64, 1))
    x = n.relu("conv2/relu_3x3", n.conv("conv2/3x3", x, 192, 3, pad=1))
    x = n.pool("pool2/3x3_s2", n.lrn("conv2/norm2", x), "MAX", 3, 2)

    def inception(name, x, c1, r3, c3, r5, c5, cp):
        p = f"inception_{name}/"
        a = n.relu(p + "relu_1x1", n.conv(p + "1x1", x, c1, 1))
        b = n.relu(p + "relu_3x3_reduce", n.conv(p + "3x3_reduce", x, r3, 1))
        b = n.relu(p + "relu_3x3", n.conv(p + "3x3", b, c3, 3, pad=1))
        c = n.relu(p + "relu_5x5_reduce", n.conv(p + "5x5_reduce", x, r5, 1))
        c = n.relu(p + "relu_5x5", n.conv(p + "5x5", c, c5, 5, pad=2))
        d = n.pool(p + "pool", x, "MAX", 3, 1, pad=1)
        d = n.relu(p + "relu_pool_proj", n.conv(p + "pool_proj", d, cp, 1))
        n.layer(p + "output", "Concat", [a, b, c, d], [p + "output"])
        return p + "output"

    def auxiliary(name, x):
        # The paper's side classifier on 4a and 4d: 5x5 average pooling of stride 3 (14x14 -> 4x4),
        # a 1x1 convolution of 128 with ReLU, fc 1024 with ReLU, 70% dropout, fc 1000; its loss
        # weighted 0.3.
        if not n.train:
            return
        x = n.pool(f"{name}/ave_pool", x, "AVE", 5, 3)
        x = n.relu(f"{name}/relu_conv", n.conv(f"{name}/conv", x, 128, 1))
        x = n.relu(f"{name}/relu_fc", n.fc(f"{name}/fc", x, 1024))
        n.layer(f"{name}/drop_fc", "Dropout", [x], [x], "dropout_param { dropout_ratio: 0.7 }")
        outputs(n, n.fc(f"{name}/classifier", x, 1000, b=0), f"{name}/", 0.3)

    x = inception("3a", x, 64, 96, 128, 16, 32, 32)
    x = inception("3b", x, 128, 128, 192, 32, 96, 64)
    x = n.pool("pool3/3x3_s2", x, "MAX", 3, 2)
    for name, cfg in (("4a", (192, 96, 208, 16, 48, 64)), ("4b", (160, 112, 224, 24, 64, 64)),
                      ("4c", (128, 128, 256, 24, 64, 64)), ("4d", (112, 144, 288, 32, 64, 64)),
                      ("4e", (256, 160, 320, 32, 128, 128))):
        x = inception(name, x, *cfg)
        if name in ("4a", "4d"):
            auxiliary("loss1" if name == "4a" else "loss2", x)
    x = n.pool("pool4/3x3_s2", x, "MAX", 3, 2)
    x = inception("5a", x, 256, 160, 320, 32, 128, 128)
    x = inception("5b", x, 384, 192, 384, 48, 128, 128)
    x = n.pool("pool5/7x7_s1", x, "AVE", 7, 1)
    n.layer("pool5/drop_7x7_s1", "Dropout", [x], [x], "dropout_param { dropout_ratio: 0.4 }")
    outputs(n, n.fc("loss3/classifier", x, 1000, b=0), "loss3/" if train else "")
    n.write(model_path("googlenet", train))


def resnet50(train=False):
    n = Net("ResNet-50", train)
    begin(n, "ResNet-50 " + ("training net" if train else "deploy net")
          + " (BatchNorm + Scale, Eltwise shortcuts)" + ("" if train else " with the old input_dim header"),
          train, 224, 32, 50, deploy_input=False)
    if not train:
        n.lines[0] = n.lines[0].replace(": generated", ":\n# generated")
        n.lines += ['input: "data"', "input_dim: 1", "input_dim: 3", "input_dim: 224", "input_dim: 224"]

    def bn(suffix, blob):
        # A training net's BatchNorm uses the batch's statistics in TRAIN and the stored ones in
        # TEST (Caffe's default by phase); the deploy net says the latter.
        n.layer("bn" + suffix, "BatchNorm", [blob], [blob],
                "" if n.train else "batch_norm_param { use_global_stats: true }")
        n.layer("scale" + suffix, "Scale", [blob], [blob], "scale_param { bias_term: true }")
        return blob

    x = n.conv("conv1", "data", 64, 7, stride=2, pad=3, bias=False)
    x = n.relu("conv1_relu", bn("_conv1", x))
    x = n.pool("pool1", x, "MAX", 3, 2)
    for stage, (blocks, width) in enumerate(((3, 64), (4, 128), (6, 256), (3, 512)), start=2):
        for i in range(blocks):
            tag = f"{stage}{chr(ord('a') + i)}"
            stride = 2 if (i == 0 and stage > 2) else 1
            if i == 0:
                short = n.conv(f"res{tag}_branch1", x, width * 4, 1, stride=stride, bias=False)
                short = bn(f"{tag}_branch1", short)
            else:
                short = x
            y = n.conv(f"res{tag}_branch2a", x, width, 1, stride=stride, bias=False)
            y = n.relu(f"res{tag}_branch2a_relu", bn(f"{tag}_branch2a", y))
            y = n.conv(f"res{tag}_branch2b", y, width, 3, pad=1, bias=False)
            y = n.relu(f"res{tag}_branch2b_relu", bn(f"{tag}_branch2b", y))
            y = bn(f"{tag}_branch2c", n.conv(f"res{tag}_branch2c", y, width * 4, 1, bias=False))
            n.layer(f"res{tag}", "Eltwise", [short, y], [f"res{tag}"])
            x = n.relu(f"res{tag}_relu", f"res{tag}")
    x = n.pool("pool5", x, "AVE", 7, 1)
    outputs(n, n.fc("fc1000", x, 1000))
    n.write(model_path("resnet50", train))


def data_layers(n, batch):
    for phase, src, b in (("TRAIN", "train_lmdb", batch), ("TEST", "test_lmdb", 100)):
        # Fashion-MNIST pixels: mean 73 and standard deviation about 90 on the 0..255 scale.
        # Training reads a new order each epoch and mirrors half the images (a garment flipped
        # left to right is the same garment); testing reads the set as it is.
        mirror = " mirror: true" if phase == "TRAIN" else ""
        shuffle = " shuffle: true" if phase == "TRAIN" else ""
        n.layer("data", "Data", [], ["data", "label"],
                f"include {{ phase: {phase} }}\n  transform_param {{ mean_value: 73 scale: 0.011{mirror} }}\n"
                f"  data_param {{ source: \"$KILN_DATA/fashion-mnist/{src}\" batch_size: {b} backend: LMDB{shuffle} }}")


def head(n, x, classes=10):
    x = n.fc("fc", x, classes)
    # In both phases: in TRAIN it reports the accuracy of each display iteration's batch, which
    # CE reads as the train_accuracy KPI (docs/ce.md); it has no backward and costs one argmax.
    n.layer("accuracy", "Accuracy", [x, "label"], ["accuracy"])
    n.layer("loss", "SoftmaxWithLoss", [x, "label"], ["loss"])


def bn_train(n, name, blob, maf=None):
    # maf: moving_average_fraction. Caffe's default, 0.999, averages the statistics over about
    # a thousand iterations; in a 20-layer net trained at lr 0.1 for a few epochs the weights move
    # faster than that, and the stored statistics lag behind them (test accuracy near chance
    # while the train loss falls). 0.9 is PyTorch's default (momentum 0.1).
    bn_param = f"batch_norm_param {{ moving_average_fraction: {maf} }}" if maf is not None else ""
    n.layer("bn_" + name, "BatchNorm", [blob], [blob], bn_param)
    n.layer("scale_" + name, "Scale", [blob], [blob], "scale_param { bias_term: true }")
    return blob


def resnet20(bench=False):
    n = Net("ResNet-20")
    n.lines.insert(0, "# ResNet-20 (He et al.'s CIFAR ResNet: 3x3 convs, 16/32/64 channels, 3 blocks a stage, BatchNorm +\n"
                      "# Scale, Eltwise shortcuts with 1x1 projections where the shape changes) "
                      + ("on random 3x32x32 input, batch 128 (benchmark case).\n" if bench else "on Fashion-MNIST.\n") +
                      "# Generated by scripts/gen-deploy-nets.py")
    if bench:
        n.layer("data", "DummyData", [], ["data", "label"],
                "dummy_data_param { shape { dim: 128 dim: 3 dim: 32 dim: 32 } shape { dim: 128 }\n"
                "    data_filler { type: \"uniform\" } data_filler { type: \"constant\" value: 3 } }")
    else:
        data_layers(n, 128)
    x = n.conv("conv1", "data", 16, 3, pad=1, bias=False)
    maf = None if bench else 0.9
    x = n.relu("relu1", bn_train(n, "conv1", x, maf))
    cin = 16
    for stage, width in enumerate((16, 32, 64), start=1):
        for i in range(3):
            tag = f"s{stage}b{i}"
            stride = 2 if (i == 0 and stage > 1) else 1
            y = n.conv(f"{tag}_conv1", x, width, 3, stride=stride, pad=1, bias=False)
            y = n.relu(f"{tag}_relu1", bn_train(n, f"{tag}_conv1", y, maf))
            y = bn_train(n, f"{tag}_conv2", n.conv(f"{tag}_conv2", y, width, 3, pad=1, bias=False), maf)
            if stride != 1 or cin != width:
                short = bn_train(n, f"{tag}_proj", n.conv(f"{tag}_proj", x, width, 1, stride=stride, bias=False), maf)
            else:
                short = x
            n.layer(f"{tag}_sum", "Eltwise", [short, y], [f"{tag}_sum"])
            x = n.relu(f"{tag}_relu2", f"{tag}_sum")
            cin = width
    x = n.pool("pool", x, "AVE", 8 if bench else 7, 1)
    if bench:
        x = n.fc("fc", x, 10)
        n.layer("loss", "SoftmaxWithLoss", [x, "label"], ["loss"])
        n.write("bench/nets/resnet20.prototxt")
    else:
        head(n, x)
        n.write("models/resnet20/resnet20_train_test.prototxt")


def vgg():
    n = Net("VGG-F")
    n.lines.insert(0, "# A VGG-style stack sized for 28x28 input: three stages of two 3x3 convolutions (32, 64, 128\n"
                      "# channels) with BatchNorm + Scale and ReLU, 2x2 max pooling, then fc 256, dropout, fc 10.\n"
                      "# Generated by scripts/gen-deploy-nets.py")
    data_layers(n, 64)
    x = "data"
    for stage, width in enumerate((32, 64, 128), start=1):
        for i in (1, 2):
            name = f"conv{stage}_{i}"
            x = n.relu(f"relu{stage}_{i}", bn_train(n, name, n.conv(name, x, width, 3, pad=1, bias=False)))
        x = n.pool(f"pool{stage}", x, "MAX", 2, 2)
    x = n.relu("relu_fc1", n.fc("fc1", x, 256))
    n.layer("drop_fc1", "Dropout", [x], [x], "dropout_param { dropout_ratio: 0.5 }")
    head(n, x)
    n.write("models/vgg/vgg_train_test.prototxt")


def densenet(depth, growth=12, compression=0.5, bench=False, batch=64):
    """DenseNet-BC (Huang et al.): a 3x3 convolution of 2k channels, three dense blocks of
    (depth - 4) / 6 bottleneck layers (BatchNorm-Scale-ReLU, 1x1 convolution of 4k; BatchNorm-Scale-
    ReLU, 3x3 convolution of k; Concat of the block's features and the new k), transitions between
    them (BatchNorm-Scale-ReLU, 1x1 convolution to compression x the channels, 2x2 average pooling),
    then BatchNorm-Scale-ReLU, global average pooling and the classifier. bench: DummyData of
    batch x 1x28x28 in place of Fashion-MNIST, for the memory figures of docs/PERF.md."""
    assert (depth - 4) % 6 == 0, "DenseNet-BC depth is 6n + 4"
    layers = (depth - 4) // 6
    n = Net(f"DenseNet-BC-{depth}")
    n.lines.insert(0, f"# DenseNet-BC, depth {depth}, growth {growth}, compression {compression:g}: three dense blocks of "
                      f"{layers} bottleneck layers\n# "
                      + (f"on DummyData 1x28x28, batch {batch} (memory benchmark case).\n" if bench else "on Fashion-MNIST.\n") +
                      "# Generated by scripts/gen-deploy-nets.py")
    if bench:
        n.layer("data", "DummyData", [], ["data", "label"],
                f"dummy_data_param {{ shape {{ dim: {batch} dim: 1 dim: 28 dim: 28 }} shape {{ dim: {batch} }}\n"
                "    data_filler { type: \"uniform\" } data_filler { type: \"constant\" value: 3 } }")
    else:
        data_layers(n, batch)
    maf = 0.9

    def bn_relu(name, blob):
        # The first BatchNorm of a bottleneck or transition reads a block's concatenated
        # features, which later Concats read too: it writes a blob of its own. Scale and ReLU
        # then work in place on it.
        n.layer("bn_" + name, "BatchNorm", [blob], [name + "_bn"],
                f"batch_norm_param {{ moving_average_fraction: {maf} }}")
        n.layer("scale_" + name, "Scale", [name + "_bn"], [name + "_bn"], "scale_param { bias_term: true }")
        return n.relu("relu_" + name, name + "_bn")

    x = n.conv("conv0", "data", 2 * growth, 3, pad=1, bias=False)
    channels = 2 * growth
    for block in range(1, 4):
        for i in range(1, layers + 1):
            tag = f"b{block}_{i}"
            y = n.conv(f"{tag}_conv1", bn_relu(f"{tag}_1", x), 4 * growth, 1, bias=False)
            y = n.relu(f"relu_{tag}_2", bn_train(n, f"{tag}_conv1", y, maf))
            y = n.conv(f"{tag}_conv2", y, growth, 3, pad=1, bias=False)
            n.layer(f"{tag}_concat", "Concat", [x, y], [f"{tag}_concat"])
            x = f"{tag}_concat"
            channels += growth
        if block < 3:
            channels = int(channels * compression)
            y = n.conv(f"trans{block}_conv", bn_relu(f"trans{block}", x), channels, 1, bias=False)
            x = n.pool(f"trans{block}_pool", y, "AVE", 2, 2)
    x = bn_relu("final", x)
    n.layer("pool", "Pooling", [x], ["pool"], "pooling_param { pool: AVE global_pooling: true }")
    if bench:
        x = n.fc("fc", "pool", 10)
        n.layer("loss", "SoftmaxWithLoss", [x, "label"], ["loss"])
        n.write(f"bench/nets/densenet{depth}.prototxt")
    else:
        head(n, "pool")
        n.write(f"models/densenet/densenet{depth}_train_test.prototxt")


if __name__ == "__main__":
    resnet20()
    resnet20(bench=True)
    vgg()
    densenet(40)
    for depth in (40, 100, 160):
        densenet(depth, bench=True)
    for train in (False, True):
        alexnet(train)
        googlenet(train)
        resnet50(train)
    zfnet()
    vgg16()
