/* kiln: the command-line entry point; dispatches to one file per subcommand. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/config.h"
#include "kiln/device.h"
#include "tool.h"
#ifdef KILN_HAVE_PYTHON
#include "kilnpy_embed.h"
#endif

static void usage(FILE *f) {
  fprintf(f,
          "kiln: a Caffe-compatible deep-learning trainer in C\n"
          "\n"
          "usage: kiln COMMAND [options]\n"
          "       kiln COMMAND [FORM] --help   a command's options, one a line (a form's: kiln\n"
          "                                    convert idx --help); also -h, or kiln help COMMAND\n"
          "\n"
          "commands:\n"
          "  train --solver S.prototxt [--snapshot X.solverstate | --weights W.caffemodel]\n"
          "        [--sync grad] [--deterministic] [--comm-timeout SECONDS] [--check]\n"
          "        train the net the solver names; resume from a snapshot or start from weights;\n"
          "        --check: read the solver and build its nets, then stop without training;\n"
          "        under `mpirun -np N` on N workers, summing their gradients every iteration\n"
          "        (--deterministic: in rank order, bit-identical to one worker with iter_size N;\n"
          "        --comm-timeout: a worker waiting longer for the others ends the job, default 300)\n"
          "  test --model M.prototxt --weights W.caffemodel [--iterations N] [--stage S]...\n"
          "        [--decode DEPLOY.prototxt [--beam K] [--max-len L] [--limit N]]\n"
          "        run the TEST phase of a net and print its averaged outputs (and the\n"
          "        perplexity of a language model's loss, an F1 layer's precision, recall, f1);\n"
          "        --decode: then decode the test pairs as `kiln decode` does (PER, word accuracy)\n"
          "  sample --model DEPLOY.prototxt --weights W.caffemodel --vocab V.txt [--prime TEXT]\n"
          "        [--length N] [--temperature T] [--seed S]\n"
          "        text from a language model, a token at a time (temperature 0: the likeliest)\n"
          "  decode --model DEPLOY.prototxt --weights W.caffemodel --vocab SRC.txt\n"
          "        --target-vocab TGT.txt --input PAIRS.tsv [--beam K] [--max-len L] [--limit N]\n"
          "        [--output OUT.tsv]\n"
          "        decode each source of a .tsv of pairs with an encoder-decoder net (greedy, or\n"
          "        beam search of width K) and print the token (phoneme) error rate and the\n"
          "        share decoded exactly right (--metrics: one \"decode\" event with per,\n"
          "        word_accuracy and words)\n"
          "  detect --model DEPLOY.prototxt --weights W.caffemodel [--labels LABELMAP.prototxt]\n"
          "        [--threshold T] [--mean M[,M,M]] [--scale S] [--interp MODE]\n"
          "        [--transform-from TRAIN_TEST.prototxt] [--draw DIR] [--json] IMAGE...\n"
          "        what a detection net (SSD's DetectionOutput) finds in images: each box's class,\n"
          "        score and pixels, or --json; --draw: the images with their boxes, as PNGs\n"
          "  time --model M.prototxt [--iterations N] [--phase TRAIN|TEST]\n"
          "        per-layer forward and backward times (random weights and inputs)\n"
          "  describe --model M.prototxt [--phase TRAIN|TEST]\n"
          "        layer table (output shapes, parameters, FLOPs) and memory plan\n"
          "  export onnx --model DEPLOY.prototxt --weights W.caffemodel OUT.onnx [--dynamic-batch]\n"
          "        a deploy net and its weights as an ONNX model (opset 13; docs/onnx.md)\n"
          "  import onnx IN.onnx OUT_NET.prototxt OUT_WEIGHTS.caffemodel [--batch N]\n"
          "        an ONNX model (opsets 7 to 17, as PyTorch exports them) as a deploy net and\n"
          "        its weights (docs/onnx.md)\n"
          "  convert idx IMAGES LABELS OUT_LMDB|OUT.h5 [--backend lmdb|leveldb]\n"
          "        IDX files (gzip or plain; images N x H x W or N x C x H x W) to a\n"
          "        Caffe-style LMDB (or LevelDB) of Datum records, or (OUT named *.h5) to an\n"
          "        HDF5 data file of float datasets \"data\" and \"label\"\n"
          "  convert cifar10 ARCHIVE_OR_DIR OUT_LMDB [--test]\n"
          "  convert cifar100 ARCHIVE_OR_DIR OUT_LMDB [--test] [--coarse]\n"
          "        the binary CIFAR .tar.gz (or its unpacked folder) to an LMDB of Datum records;\n"
          "        the train split unless --test; CIFAR-100 fine labels unless --coarse\n"
          "  convert images LIST ROOT OUT_LMDB [--resize H W] [--gray] [--encoded]\n"
          "        [--shuffle [--seed S]]\n"
          "        PNG and JPEG files listed as 'PATH LABEL' lines (ROOT joined to each PATH)\n"
          "        to an LMDB of Datum records, as Caffe's convert_imageset: raw BGR bytes, or\n"
          "        with --encoded the image files (PNG where resized or recoloured); --gray: one\n"
          "        channel; --shuffle: the list's order shuffled from seed S (default 1701)\n"
          "  convert annoset LIST ROOT OUT_DB --label-map LABELMAP [--resize H W] [--gray]\n"
          "        [--encoded] [--encode-type jpg|png] [--shuffle [--seed S]]\n"
          "        [--backend lmdb|leveldb] [--name-size FILE] [--check-size]\n"
          "        images and their PASCAL VOC annotations ('IMAGE ANNOTATION' lines) to an LMDB\n"
          "        (or LevelDB) of AnnotatedDatum records for SSD, as the SSD fork's\n"
          "        create_annoset; --name-size: the images' sizes for DetectionEvaluate\n"
          "  convert text TEXT... OUT_VOCAB [--level char|word] [--lowercase] [--min-count K]\n"
          "        [--max-size V] [--pairs source|target]\n"
          "        a vocabulary of the texts (a .tsv's records; --pairs: one side of pairs)\n"
          "  compute-mean DB OUT.binaryproto\n"
          "        the mean record of an LMDB or LevelDB (Caffe's compute_image_mean), for\n"
          "        mean_file\n"
          "  data fetch fashion-mnist\n"
          "  data fetch moby-dick | sotu | spam-assassin | cmudict [--from TARBALL]\n"
          "  data fetch spam-bow [--from SPAM_ASSASSIN_TARBALL]\n"
          "  data fetch cifar10 | cifar100 --from ARCHIVE\n"
          "        fill the data set cache ($KILN_DATA, default ~/.cache/kiln/datasets)\n"
          "  data list | verify [NAME...] | dir\n"
          "        the data sets kiln knows (cached?, size, source); their checksums\n"
          "  upgrade [--caffe] IN OUT\n"
          "        a net (.prototxt or .caffemodel) or solver in Caffe's old formats (V0/V1 layers,\n"
          "        solver_type) in the current one; kiln also upgrades them on load. --caffe: for\n"
          "        Caffe 1.0 and OpenCV, without the fields kiln adds (each named)\n"
          "  ce run SUITE [--db F] [--report-dir D] [--warn-only] [--machine-class C]\n"
          "  ce accept SUITE|RUN_ID      ce stability MODEL [--times N]\n"
          "  ce history MODEL [KPI]      ce compare RUN_A RUN_B\n"
          "  ce bisect MODEL KPI GOOD BAD\n"
          "        continuous evaluation: train a suite of models, judge their KPIs against\n"
          "        baselines, keep the history, find the commit that regressed; `kiln ce --help`\n"
          "        (docs/ce.md)\n"
          "\n"
          "options of train, test, time, describe, sample, decode and detect:\n"
          "  --metrics FILE      write events as JSON Lines (train, test, snapshot, done, time,\n"
          "                      decode; not describe, sample or detect, which have none)\n"
          "  --threads N         threads for kernels and BLAS (default: OMP_NUM_THREADS or all)\n"
          "  --max-memory SIZE   refuse nets needing more (e.g. 512M, 4G; default: available)\n"
          "  --device D          where nets run: host (the default), cuda (the worker's GPU by\n"
          "                      local rank), cuda:N; the same as KILN_DEVICE. Caffe's -gpu N\n"
          "                      and solver_mode: GPU pick a GPU too (docs/formats.md)\n"
          "  --precision P       fp32 or bf16: products in bfloat16 with fp32 sums, on CPUs with\n"
          "                      AVX512_BF16 or AMX (the same as KILN_PRECISION; a solver's\n"
          "                      precision: BF16 too)\n"
          "  devices             the devices this build and machine have\n"
          "\n"
          "In a prototxt, a data source starting with $KILN_DATA/ is read from the cache.\n");
}

/* The subcommands, by name. compare-weights is hidden (tests and scripts): it compares two
 * .caffemodel files within tolerances. */
static int cmd_devices(int argc, char **argv);
static const struct {
  const char *name;
  int (*run)(int argc, char **argv);
} commands[] = {
    {"train", cmd_train},
    {"test", cmd_test},
    {"time", cmd_time},
    {"describe", cmd_describe},
    {"devices", cmd_devices},
    {"convert", cmd_convert},
    {"data", cmd_data},
    {"compute-mean", cmd_compute_mean},
    {"compare-weights", cmd_compare_weights},
    {"ce", cmd_ce},
    {"upgrade", cmd_upgrade},
    {"sample", cmd_sample},
    {"decode", cmd_decode},
    {"detect", cmd_detect},
    {"export", cmd_export},
    {"import", cmd_import},
};

static int (*find_command(const char *name))(int, char **) {
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
    if (!strcmp(commands[i].name, name)) return commands[i].run;
  return NULL;
}

/* kiln devices: one line a device, GPUs by the name --device takes, then why there are none. */
static int cmd_devices(int argc, char **argv) {
  if (argc > 1) {
    if (tool_is_help(argv[1])) {
      printf("usage: kiln devices\n  the devices this build of kiln can run nets on\n");
      return 0;
    }
    fprintf(stderr, "usage: kiln devices\n");
    return 2;
  }
  printf("host\n");
  const int n = kiln_cuda_device_count();
  for (int i = 0; i < n; i++) {
    char what[256];
    kiln_cuda_describe(i, what, sizeof what);
    printf("cuda:%d %s\n", i, what);
  }
  if (n == 0) printf("(no GPU: %s)\n", kiln_cuda_unavailable());
  return 0;
}

/* kiln help [COMMAND [FORM]]: the same as kiln [COMMAND [FORM]] --help. */
static int help(int argc, char **argv) {
  if (argc == 2 || tool_is_help(argv[2]) || !strcmp(argv[2], "help")) tool_help(usage);
  if (argc > 4) {
    fprintf(stderr, "usage: kiln help [COMMAND [FORM]]\n");
    return 2;
  }
  int (*run)(int, char **) = find_command(argv[2]);
  if (!run) {
    fprintf(stderr, "kiln help: unknown command '%s' (see kiln --help)\n", argv[2]);
    return 2;
  }
  char help_flag[] = "--help";
  char *args[] = {argv[2], argc == 4 ? argv[3] : help_flag, argc == 4 ? help_flag : NULL, NULL};
  return run(argc - 1, args);
}

static void quiet(kiln_log_level level, const char *msg, void *user) {
  (void)level, (void)msg, (void)user;
}

/* Subnormal floats flushed to zero on every kernel thread unless KILN_DENORMALS=keep: set on
 * this thread before any other exists, so that each inherits it. The configuration is read
 * again, and its complaints made, by the command itself. */
static void set_denormals(void) {
  kiln_config cfg;
  kiln_log_set_handler(quiet, NULL);
  const int rc = kiln_config_from_env(&cfg);
  kiln_log_set_handler(NULL, NULL);
  if (rc == KILN_OK && !cfg.keep_denormals) kiln_set_flush_denormals(true);
}

/* kiln's own --device NAME and --precision P (or --device=NAME, --precision=P), anywhere on the
 * line: the same as KILN_DEVICE and KILN_PRECISION, which they set for the command (the library
 * reads the configuration in one place). Taken out of argv; the count left, or -1 after saying
 * what is wrong. */
static const struct {
  const char *flag, *var, *what;
  int (*check)(kiln_config *, const char *, const char *);
} config_options[] = {
    {"--device", "KILN_DEVICE", "a device (host, cuda, cuda:N)", kiln_config_set_device},
    {"--precision", "KILN_PRECISION", "a precision (fp32, bf16)", kiln_config_set_precision},
};

static int config_option(int argc, char **argv) {
  int n = 0;
  for (int i = 0; i < argc; i++) {
    const char *a = argv[i];
    const char *v = NULL;
    size_t k = 0;
    for (; i > 0 && k < sizeof config_options / sizeof config_options[0]; k++) {
      const char *f = config_options[k].flag;
      const size_t len = strlen(f);
      if (!strcmp(a, f)) {
        if (i + 1 >= argc) {
          fprintf(stderr, "kiln: %s needs %s\n", f, config_options[k].what);
          return -1;
        }
        v = argv[++i];
        break;
      }
      if (!strncmp(a, f, len) && a[len] == '=') {
        v = a + len + 1;
        break;
      }
    }
    if (!v) {
      argv[n++] = argv[i];
      continue;
    }
    kiln_config probe;
    kiln_config_init(&probe);
    if (config_options[k].check(&probe, v, config_options[k].flag) != KILN_OK) {
      fprintf(stderr, "kiln: %s\n", kiln_last_error());
      return -1;
    }
    setenv(config_options[k].var, v, 1);
  }
  argv[n] = NULL;
  return n;
}

int main(int argc, char **argv) {
  set_denormals();
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  if ((argc = tool_caffe_args(argc, argv, &argv)) < 0) {
    if (argc == -2) return 2; /* a bad -gpu, already said */
    fprintf(stderr, "kiln: out of memory\n");
    return 1;
  }
  if (argc < 2) { /* nothing but Caffe's flags */
    usage(stderr);
    return 2;
  }
  if ((argc = config_option(argc, argv)) < 0) return 2;
  const char *cmd = argv[1];
  /* train resolves -gpu through the solver (with solver_mode and device_id, per worker); the
   * other commands run on the first GPU it names */
  if (tool_caffe_gpu && strcmp(cmd, "train")) {
    if (kiln_cuda_device_count() == 0) {
      kiln_log(KILN_LOG_WARN, "-gpu %s: no GPU (%s); running on the CPU", tool_caffe_gpu,
               kiln_cuda_unavailable());
    } else if (!getenv("KILN_DEVICE")) {
      char dev[32];
      snprintf(dev, sizeof dev, "cuda:%d", strcmp(tool_caffe_gpu, "all") ? atoi(tool_caffe_gpu) : 0);
      setenv("KILN_DEVICE", dev, 1);
    }
  }
  if (tool_is_help(cmd)) tool_help(usage);
  if (!strcmp(cmd, "help")) return help(argc, argv);
  int (*run)(int, char **) = find_command(cmd);
#ifdef KILN_HAVE_PYTHON
  /* Python layers: the interpreter starts with the first net that has one; at exit it ends,
   * flushing what the layers printed */
  if (run && kilnpy_register_embedded() == KILN_OK) atexit(kilnpy_finalize_embedded);
#endif
  if (run) return run(argc - 1, argv + 1);
  fprintf(stderr, "kiln: unknown command '%s' (see kiln --help)\n", cmd);
  return 2;
}
