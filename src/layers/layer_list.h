/* Every layer type kiln knows, one line each: KILN_LAYER(Caffe's type string, the symbol of its
 * const kiln_layer_ops table). The registry (registry.c) is built from these lines, and the
 * layer tests' coverage check (tests/test_layers_contract.c) reads the same lines, so that a
 * type listed here without a test in tests/test_layers_<family>.c fails it. The order is the
 * order of kiln_layer_type_names() (the "known:" list of an unknown-type error).
 *
 * No include guard: an includer defines KILN_LAYER(type, ops) to what it wants of each line,
 * includes this file, and undefines it. */
KILN_LAYER("Input", kiln_layer_input)
KILN_LAYER("Data", kiln_layer_data)
KILN_LAYER("TextData", kiln_layer_text_data)
KILN_LAYER("Convolution", kiln_layer_convolution)
KILN_LAYER("Pooling", kiln_layer_pooling)
KILN_LAYER("InnerProduct", kiln_layer_inner_product)
KILN_LAYER("ReLU", kiln_layer_relu)
KILN_LAYER("Sigmoid", kiln_layer_sigmoid)
KILN_LAYER("TanH", kiln_layer_tanh)
KILN_LAYER("Dropout", kiln_layer_dropout)
KILN_LAYER("Softmax", kiln_layer_softmax)
KILN_LAYER("SoftmaxWithLoss", kiln_layer_softmax_loss)
KILN_LAYER("Accuracy", kiln_layer_accuracy)
KILN_LAYER("Flatten", kiln_layer_flatten)
KILN_LAYER("Split", kiln_layer_split)
KILN_LAYER("BatchNorm", kiln_layer_batch_norm)
KILN_LAYER("Scale", kiln_layer_scale)
KILN_LAYER("Bias", kiln_layer_bias)
KILN_LAYER("Eltwise", kiln_layer_eltwise)
KILN_LAYER("Concat", kiln_layer_concat)
KILN_LAYER("Slice", kiln_layer_slice)
KILN_LAYER("Reshape", kiln_layer_reshape)
KILN_LAYER("LRN", kiln_layer_lrn)
KILN_LAYER("Power", kiln_layer_power)
KILN_LAYER("AbsVal", kiln_layer_absval)
KILN_LAYER("ELU", kiln_layer_elu)
KILN_LAYER("PReLU", kiln_layer_prelu)
KILN_LAYER("ArgMax", kiln_layer_argmax)
KILN_LAYER("EuclideanLoss", kiln_layer_euclidean_loss)
KILN_LAYER("SigmoidCrossEntropyLoss", kiln_layer_sigmoid_ce_loss)
KILN_LAYER("DummyData", kiln_layer_dummy_data)
KILN_LAYER("SequencePool", kiln_layer_sequence_pool)
KILN_LAYER("Exp", kiln_layer_exp)
KILN_LAYER("Log", kiln_layer_log)
KILN_LAYER("BNLL", kiln_layer_bnll)
KILN_LAYER("Threshold", kiln_layer_threshold)
