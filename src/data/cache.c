/* The local data set cache ($KILN_DATA, else ~/.cache/kiln/datasets) and `kiln data fetch`:
 * check that the source files are the expected ones, convert them into LMDBs once, and mark the
 * result READY so that later runs reuse it. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "data/internal.h"
#include "kiln/data.h"

int kiln_data_cache_dir(const kiln_config *cfg, char *buf, size_t n) {
  if (!cfg) cfg = kiln_config_defaults();
  if (!cfg->data_dir[0])
    return kiln_errorf(KILN_ERR_INVALID,
                       "no data set cache: set KILN_DATA (or HOME) to say where data sets live");
  int len = snprintf(buf, n, "%s", cfg->data_dir);
  if (len < 0 || (size_t)len >= n)
    return kiln_errorf(KILN_ERR_INVALID, "data set cache path is longer than %zu bytes",
                       n ? n - 1 : 0);
  int rc = kiln_mkdir_p(buf);
  return rc ? kiln_error_context(rc, "the data set cache: ") : KILN_OK;
}

/* ---- Fashion-MNIST ----------------------------------------------------------------------- */

/* SHA-256 of the files shipped by Debian's dataset-fashion-mnist package, version
 * 0.0~git20200523.55506a9-1 (upstream zalandoresearch/fashion-mnist at 55506a9), computed with
 * sha256sum from /usr/share/datasets/fashion-mnist/. Debian recompressed the .gz files (their
 * gzip headers carry the packaging date), so they do not match the MD5 sums in upstream's
 * README; the second hash, of the decompressed IDX bytes, lets upstream's own downloads pass
 * too, provided their content is the same. */
static const struct fmnist_file {
  const char *name;
  const char *gz_sha256;
  const char *idx_sha256;
} fmnist_files[] = {
    {"train-images-idx3-ubyte.gz",
     "b0564c3eedabfbf835052cff8503ea422014ce006caf5b757f851416ee8300c7",
     "c59f468a2f672dc815687fe0f83887768d799fd8a3f3276145d20f83aa44d888"},
    {"train-labels-idx1-ubyte.gz",
     "0ae29f65d86684f32d1b9c85147786c547b9c6aebcaf235f0400a0cce308b056",
     "bad3541b69d912435c50bb6ba87bec294ff4f6a2e1246121d8633921760443d9"},
    {"t10k-images-idx3-ubyte.gz",
     "cc1d090a38ace84dfa1aa66e3ada7c336ef481a96936906477e6dd344da56eaa",
     "5b4141f0afbad91edebe8549f8fcffe087ea10ca49f1dbef5c9a5cd8815ce37b"},
    {"t10k-labels-idx1-ubyte.gz",
     "8d3605d196f4be44669e46906da9733c8131fef761fdbfec72c424d5222f1a05",
     "0402a96d92fd2663957122ceb108a494c5af83dab82d92729df917d7dec38c34"},
};

/* SHA-256 of a file's decompressed content (zlib passes plain files through unchanged). */
static int sha256_gz_content(const char *path, char hex[65]) {
  gzFile gz = gzopen(path, "rb");
  if (!gz) return kiln_errorf(KILN_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
  enum { CHUNK = 1 << 16 };
  uint8_t *buf = malloc(CHUNK);
  if (!buf) {
    gzclose_r(gz);
    return kiln_errorf(KILN_ERR_NOMEM, "%s: out of memory", path);
  }
  kiln_sha256_ctx c;
  kiln_sha256_init(&c);
  int got, rc = KILN_OK;
  while ((got = gzread(gz, buf, CHUNK)) > 0) kiln_sha256_update(&c, buf, (size_t)got);
  if (got < 0) {
    int zerr;
    const char *msg = gzerror(gz, &zerr);
    rc = kiln_errorf(KILN_ERR_DATA, "%s: corrupt gzip data: %s", path, msg);
  }
  free(buf);
  gzclose_r(gz);
  if (rc == KILN_OK) {
    uint8_t digest[32];
    kiln_sha256_final(&c, digest);
    kiln_sha256_hex(digest, hex);
  }
  return rc;
}

static int verify_file(const char *src_dir, const struct fmnist_file *f) {
  char path[4096], hex[65];
  if (snprintf(path, sizeof path, "%s/%s", src_dir, f->name) >= (int)sizeof path)
    return kiln_errorf(KILN_ERR_INVALID, "%s: path too long", src_dir);
  int rc = kiln_sha256_file(path, hex);
  if (rc == KILN_ERR_IO && access(path, F_OK) != 0)
    return kiln_errorf(
        KILN_ERR_IO,
        "%s: missing (Fashion-MNIST comes from the Debian package dataset-fashion-mnist)", path);
  KILN_TRY(rc);
  if (strcmp(hex, f->gz_sha256) == 0) return KILN_OK;
  char content[65];
  if (sha256_gz_content(path, content) == KILN_OK && strcmp(content, f->idx_sha256) == 0)
    return KILN_OK;
  return kiln_errorf(KILN_ERR_DATA, "%s: SHA-256 mismatch: expected %s, found %s", path,
                     f->gz_sha256, hex);
}

static int convert_split(const char *src_dir, const char *dir, const char *images,
                         const char *labels, const char *out_name, uint64_t expected) {
  char ipath[4096], lpath[4096], out[4096];
  snprintf(ipath, sizeof ipath, "%s/%s", src_dir, images);
  snprintf(lpath, sizeof lpath, "%s/%s", src_dir, labels);
  snprintf(out, sizeof out, "%s/%s", dir, out_name);
  /* Without READY an existing output is from an interrupted fetch: complete (it was renamed into
   * place) but not yet vouched for, so it is rebuilt. */
  int e = kiln_data_remove_lmdb_dir(out);
  if (e)
    return kiln_errorf(KILN_ERR_IO, "%s: cannot remove an unfinished database: %s", out,
                       strerror(e));
  kiln_log(KILN_LOG_INFO, "fashion-mnist: converting %s into %s", images, out);
  uint64_t n = 0;
  KILN_TRY(kiln_convert_idx_to_lmdb(ipath, lpath, out, &n));
  if (n != expected)
    return kiln_errorf(KILN_ERR_DATA, "%s: %llu records, expected %llu", out, (unsigned long long)n,
                       (unsigned long long)expected);
  return KILN_OK;
}

static int fetch_locked(const char *src_dir, const char *cache, const char *dir, const char *ready,
                        bool *already) {
  if (access(ready, F_OK) == 0) { /* another process finished while we waited for the lock */
    if (already) *already = true;
    return KILN_OK;
  }
  for (size_t i = 0; i < sizeof fmnist_files / sizeof fmnist_files[0]; i++)
    KILN_TRY(verify_file(src_dir, &fmnist_files[i]));
  KILN_TRY(convert_split(src_dir, dir, "train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
                         "train_lmdb", 60000));
  KILN_TRY(convert_split(src_dir, dir, "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz",
                         "test_lmdb", 10000));
  char text[512];
  int len = snprintf(text, sizeof text,
                     "fashion-mnist\nsource %s\ntrain_lmdb 60000 records 1x28x28\n"
                     "test_lmdb 10000 records 1x28x28\n",
                     src_dir);
  if (len < 0 || (size_t)len >= sizeof text) len = (int)strlen(text);
  KILN_TRY(kiln_data_entry_seal(cache, "fashion-mnist"));
  return kiln_write_file_atomic(ready, text, (size_t)len);
}

int kiln_data_fetch_fashion_mnist(const char *src_dir, const char *cache_dir, bool *already) {
  if (already) *already = false;
  if (!src_dir) src_dir = KILN_FASHION_MNIST_SYSTEM_DIR;
  char cache[4096], dir[4096 + 32], ready[4096 + 64], lock[4096 + 64];
  if (snprintf(cache, sizeof cache, "%s", cache_dir) >= (int)sizeof cache)
    return kiln_errorf(KILN_ERR_INVALID, "%s: path too long", cache_dir);
  snprintf(dir, sizeof dir, "%s/fashion-mnist", cache);
  snprintf(ready, sizeof ready, "%s/READY", dir);
  if (access(ready, F_OK) == 0) {
    if (already) *already = true;
    return KILN_OK;
  }
  KILN_TRY(kiln_mkdir_p(dir));
  /* Two fetches at once would race on the same outputs: the lock makes the second wait and then
   * find READY. */
  snprintf(lock, sizeof lock, "%s/.lock", dir);
  int fd = -1;
  KILN_TRY(kiln_data_lock_entry(lock, &fd));
  int rc = fetch_locked(src_dir, cache, dir, ready, already);
  close(fd); /* releases the lock */
  return rc;
}

int kiln_data_lock_entry(const char *lock, int *fd) {
  *fd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0664);
  if (*fd < 0) return kiln_errorf(KILN_ERR_IO, "%s: cannot create: %s", lock, strerror(errno));
  while (flock(*fd, LOCK_EX) != 0) {
    if (errno != EINTR) {
      int rc = kiln_errorf(KILN_ERR_IO, "%s: cannot lock: %s", lock, strerror(errno));
      close(*fd);
      *fd = -1;
      return rc;
    }
  }
  return KILN_OK;
}

int kiln_data_source_path(const kiln_config *cfg, const char *src, char *out, size_t n) {
  const char *rest = NULL;
  if (strncmp(src, "$KILN_DATA/", 11) == 0) rest = src + 10;
  else if (strncmp(src, "${KILN_DATA}/", 13) == 0) rest = src + 12;
  if (!rest) {
    if ((size_t)snprintf(out, n, "%s", src) >= n)
      return kiln_errorf(KILN_ERR_INVALID, "data source path too long: %.64s...", src);
    return KILN_OK;
  }
  char dir[4096];
  KILN_TRY(kiln_data_cache_dir(cfg, dir, sizeof dir));
  if ((size_t)snprintf(out, n, "%s%s", dir, rest) >= n)
    return kiln_errorf(KILN_ERR_INVALID, "data source path too long: %s", src);
  return KILN_OK;
}

int kiln_data_vocab_path(const kiln_config *cfg, const char *given, const char *source,
                         const char *name, char *out, size_t n) {
  if (given && given[0]) return kiln_data_source_path(cfg, given, out, n);
  const char *slash = strrchr(source, '/');
  if ((size_t)snprintf(out, n, "%.*s/%s", slash ? (int)(slash - source) : 1,
                       slash ? source : ".", name) >= n)
    return kiln_errorf(KILN_ERR_INVALID, "vocabulary path too long: beside %.64s...", source);
  return KILN_OK;
}
