/* PASCAL VOC's on-disk layout, as the cache's detection sets hold it (shapes-det, voc2007):
 *
 *   JPEGImages/ID.jpg          the images
 *   Annotations/ID.xml         VOC's XML: <size>, an <object> per box (1-based pixels)
 *   ImageSets/Main/SPLIT.txt   the ids of a split (trainval, test), one a line
 *   SPLIT.txt                  "JPEGImages/ID.jpg Annotations/ID.xml" a line: create_annoset's
 *                              (and kiln convert annoset's) list, paths relative to the entry
 *   test_name_size.txt         "ID HEIGHT WIDTH" a test image: DetectionOutput's and
 *                              DetectionEvaluate's name_size_file
 *   labelmap.prototxt          the SSD fork's LabelMap: background 0, the classes 1 .. K
 *
 * and the end that every detection set's fetch shares (kiln_voc_finish). The lists are derived
 * from ImageSets/Main alone, so the generated set and the imported one go through the same code.
 * The many small files are written plainly, without a temporary name or an fsync each: the
 * entry is complete only once READY is there, written after one sync of the file system. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data/det_sets.h"
#include "data/internal.h"
#include "kiln/data.h"

const char *const kiln_voc_split_names[KILN_VOC_SPLITS] = {"trainval", "test"};

/* An annotation larger than this is no VOC annotation (VOC2007's largest is about 10 KB). */
#define XML_MAX_BYTES (1u << 20)

bool kiln_voc_id_ok(const char *id, size_t n) {
  if (n == 0 || n > 64) return false;
  for (size_t i = 0; i < n; i++) {
    const char c = id[i];
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
          c == '_' || c == '-'))
      return false;
  }
  return true;
}

long kiln_voc_xml_int(const char *xml, size_t n, const char *tag, size_t *next) {
  char open[64], close[64];
  const int lo = snprintf(open, sizeof open, "<%s>", tag);
  const int lc = snprintf(close, sizeof close, "</%s>", tag);
  if (lo <= 0 || lc <= 0 || (size_t)lc >= sizeof close) return -1;
  const char *a = memmem(xml, n, open, (size_t)lo);
  if (!a) return -1;
  a += lo;
  const char *end = xml + n, *b = memmem(a, (size_t)(end - a), close, (size_t)lc);
  if (!b) return -1;
  /* white space around the digits, as XML allows */
  while (a < b && (*a == ' ' || *a == '\t' || *a == '\n' || *a == '\r')) a++;
  const char *d = b;
  while (d > a && (d[-1] == ' ' || d[-1] == '\t' || d[-1] == '\n' || d[-1] == '\r')) d--;
  if (a == d || d - a > 10) return -1;
  long v = 0;
  for (const char *p = a; p < d; p++) {
    if (*p < '0' || *p > '9') return -1;
    v = v * 10 + (*p - '0');
  }
  if (v > INT32_MAX) return -1;
  if (next) *next = (size_t)(b + lc - xml);
  return v;
}

int kiln_voc_write(const char *dir, const char *rel, const void *data, size_t len) {
  char path[4400];
  if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, rel) >= sizeof path)
    return kiln_errorf(KILN_ERR_INVALID, "%s: path too long", dir);
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0666);
  if (fd < 0) return kiln_errorf(KILN_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
  const bool ok = kiln_fd_write_all(fd, data, len);
  const int e = errno;
  if (close(fd) != 0 || !ok)
    return kiln_errorf(KILN_ERR_IO, "%s: write failed: %s", path, strerror(ok ? errno : e));
  return KILN_OK;
}

int kiln_voc_make_folders(const char *dir) {
  static const char *const sub[] = {"JPEGImages", "Annotations", "ImageSets/Main"};
  for (size_t i = 0; i < sizeof sub / sizeof sub[0]; i++) {
    char path[4400];
    if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, sub[i]) >= sizeof path)
      return kiln_errorf(KILN_ERR_INVALID, "%s: path too long", dir);
    KILN_TRY(kiln_mkdir_p(path));
  }
  return KILN_OK;
}

/* Removes what is inside `path` (not `path` itself), `depth` more levels of folders at most. */
static int clear_folder(const char *path, int depth, bool keep_lock) {
  DIR *d = opendir(path);
  if (!d) return errno == ENOENT ? KILN_OK : kiln_errorf(KILN_ERR_IO, "%s: cannot list: %s", path, strerror(errno));
  int rc = KILN_OK;
  struct dirent *e;
  while (!rc && (errno = 0, e = readdir(d))) {
    const char *name = e->d_name;
    if (!strcmp(name, ".") || !strcmp(name, "..") || (keep_lock && !strcmp(name, ".lock")))
      continue;
    char sub[4400];
    if ((size_t)snprintf(sub, sizeof sub, "%s/%s", path, name) >= sizeof sub) {
      rc = kiln_errorf(KILN_ERR_INVALID, "%s/%s: path too long", path, name);
      break;
    }
    struct stat st;
    if (lstat(sub, &st) != 0) {
      rc = kiln_errorf(KILN_ERR_IO, "%s: %s", sub, strerror(errno));
    } else if (S_ISDIR(st.st_mode)) {
      if (depth <= 0)
        rc = kiln_errorf(KILN_ERR_IO, "%s: folders nested deeper than a cache entry's: not "
                         "removed (remove it yourself)", sub);
      else if (!(rc = clear_folder(sub, depth - 1, false)) && rmdir(sub) != 0)
        rc = kiln_errorf(KILN_ERR_IO, "%s: cannot remove: %s", sub, strerror(errno));
    } else if (unlink(sub) != 0) {
      rc = kiln_errorf(KILN_ERR_IO, "%s: cannot remove: %s", sub, strerror(errno));
    }
  }
  closedir(d);
  return rc;
}

int kiln_voc_clear_entry(const char *dir) { return clear_folder(dir, 3, true); }

/* Reads dir/rel whole (at most `max` bytes). */
static int read_rel(const char *dir, const char *rel, size_t max, char **text, size_t *len) {
  char path[4400];
  if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, rel) >= sizeof path)
    return kiln_errorf(KILN_ERR_INVALID, "%s: path too long", dir);
  return kiln_read_file_max(path, max, text, len);
}

/* The size that Annotations/ID.xml gives: KILN_ERR_DATA naming it when it gives none. */
static int annotation_size(const char *dir, const char *id, long *height, long *width) {
  char rel[128], *xml = NULL;
  size_t n = 0;
  snprintf(rel, sizeof rel, "Annotations/%s.xml", id);
  KILN_TRY(read_rel(dir, rel, XML_MAX_BYTES, &xml, &n));
  /* the image's own <width> and <height>, inside <size> (a part's <bndbox> has none) */
  const char *a = memmem(xml, n, "<size>", 6);
  const char *b = a ? memmem(a, n - (size_t)(a - xml), "</size>", 7) : NULL;
  *width = b ? kiln_voc_xml_int(a, (size_t)(b - a), "width", NULL) : -1;
  *height = b ? kiln_voc_xml_int(a, (size_t)(b - a), "height", NULL) : -1;
  free(xml);
  if (*width <= 0 || *height <= 0)
    return kiln_errorf(KILN_ERR_DATA, "%s/%s: no <size> with a <width> and a <height> above 0",
                       dir, rel);
  return KILN_OK;
}

static bool is_file(const char *dir, const char *rel) {
  char path[4400];
  struct stat st;
  snprintf(path, sizeof path, "%s/%s", dir, rel);
  return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

int kiln_voc_write_list(const char *dir, int split, uint32_t *images) {
  if (images) *images = 0;
  const char *name = kiln_voc_split_names[split];
  char rel[128], *ids = NULL;
  size_t n = 0;
  snprintf(rel, sizeof rel, "ImageSets/Main/%s.txt", name);
  KILN_TRY(read_rel(dir, rel, (size_t)1 << 26, &ids, &n));
  kiln_strbuf list = {0}, sizes = {0};
  kiln_strbuf_printf(&list, "%s", "");
  kiln_strbuf_printf(&sizes, "%s", "");
  int rc = KILN_OK, line = 0;
  uint32_t count = 0;
  for (char *l = ids; !rc && l < ids + n; line++) {
    char *nl = memchr(l, '\n', (size_t)(ids + n - l));
    char *end = nl ? nl : ids + n;
    if (end > l && end[-1] == '\r') end--; /* lists written on Windows */
    const size_t len = (size_t)(end - l);
    if (len == 0) { /* blank lines: nothing */
    } else if (!kiln_voc_id_ok(l, len)) {
      rc = kiln_errorf(KILN_ERR_DATA, "%s/%s:%d: '%.*s' is no image id (letters, digits, _ or -)",
                       dir, rel, line + 1, (int)(len > 80 ? 80 : len), l);
    } else {
      char jpg[128], xml[128];
      snprintf(jpg, sizeof jpg, "JPEGImages/%.*s.jpg", (int)len, l);
      snprintf(xml, sizeof xml, "Annotations/%.*s.xml", (int)len, l);
      const char *missing = !is_file(dir, jpg) ? jpg : !is_file(dir, xml) ? xml : NULL;
      if (missing)
        rc = kiln_errorf(KILN_ERR_DATA, "%s/%s:%d: image %.*s: %s is missing", dir, rel,
                         line + 1, (int)len, l, missing);
      kiln_strbuf_printf(&list, "%s %s\n", jpg, xml);
      if (!rc && split == KILN_VOC_TEST) {
        char id[80];
        long h = 0, w = 0;
        snprintf(id, sizeof id, "%.*s", (int)len, l);
        rc = annotation_size(dir, id, &h, &w);
        kiln_strbuf_printf(&sizes, "%s %ld %ld\n", id, h, w);
      }
      count++;
    }
    l = nl ? nl + 1 : ids + n;
  }
  if (!rc && count == 0) rc = kiln_errorf(KILN_ERR_DATA, "%s/%s: names no image", dir, rel);
  if (!rc && (list.failed || sizes.failed)) rc = kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  char out[64];
  snprintf(out, sizeof out, "%s.txt", name);
  if (!rc) rc = kiln_voc_write(dir, out, list.s, list.len);
  if (!rc && split == KILN_VOC_TEST) rc = kiln_voc_write(dir, "test_name_size.txt", sizes.s, sizes.len);
  if (!rc && images) *images = count;
  free(ids);
  free(list.s);
  free(sizes.s);
  return rc;
}

int kiln_voc_write_labelmap(const char *dir, const char *const *names, int n) {
  kiln_strbuf b = {0};
  kiln_strbuf_printf(&b, "item {\n  name: \"none_of_the_above\"\n  label: 0\n"
                         "  display_name: \"background\"\n}\n");
  for (int i = 0; i < n; i++)
    kiln_strbuf_printf(&b, "item {\n  name: \"%s\"\n  label: %d\n  display_name: \"%s\"\n}\n",
                       names[i], i + 1, names[i]);
  int rc = b.failed ? kiln_errorf(KILN_ERR_NOMEM, "out of memory")
                    : kiln_voc_write(dir, "labelmap.prototxt", b.s, b.len);
  free(b.s);
  return rc;
}

/* ---- the end of a fetch --------------------------------------------------------------------- */

/* The files a detection set's entry derives from its VOC layout before it is sealed: for each
 * split whose list dir/SPLIT.txt exists, dir/SPLIT_lmdb, the AnnotatedDatum records that
 * AnnotatedData reads (the images' own JPEG bytes, the boxes through the label map), as
 * `kiln convert annoset` writes them. trainval is shuffled with a fixed seed, as the SSD fork's
 * create_list.sh shuffles its list, so that a batch mixes images of the whole set in any order
 * the net reads it; test keeps the list's order, which test_name_size.txt follows. A leftover
 * SPLIT_lmdb of an interrupted fetch is removed first. */
#define KILN_VOC_SHUFFLE_SEED 1701
static int kiln_voc_derive(const char *dir) {
  char list[4300], out[4300], labels[4300], root[4300];
  snprintf(labels, sizeof labels, "%s/labelmap.prototxt", dir);
  snprintf(root, sizeof root, "%s/", dir); /* the lists' paths are joined to it as they are */
  for (int k = 0; k < KILN_VOC_SPLITS; k++) {
    const char *split = kiln_voc_split_names[k];
    snprintf(list, sizeof list, "%s/%s.txt", dir, split);
    if (access(list, F_OK) != 0) continue;
    snprintf(out, sizeof out, "%s/%s_lmdb", dir, split);
    const int e = kiln_data_remove_lmdb_dir(out);
    if (e) return kiln_errorf(KILN_ERR_IO, "%s: cannot remove what an interrupted fetch left: %s",
                              out, strerror(e));
    const kiln_convert_annoset_opts o = {.encoded = true,
                                         .shuffle = k == KILN_VOC_TRAINVAL,
                                         .seed = KILN_VOC_SHUFFLE_SEED,
                                         .backend = KILN_DB_LMDB};
    KILN_TRY(kiln_convert_annoset(list, root, out, labels, &o, NULL, NULL));
  }
  return KILN_OK;
}

int kiln_voc_finish(const char *cache_dir, const char *name, const char *ready, size_t len) {
  char dir[4200], path[4300];
  if ((size_t)snprintf(dir, sizeof dir, "%s/%s", cache_dir, name) >= sizeof dir)
    return kiln_errorf(KILN_ERR_INVALID, "%s: path too long", cache_dir);
  KILN_TRY(kiln_voc_derive(dir));
  /* the files were written without an fsync each: all of them on disk before READY is */
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0 || syncfs(fd) != 0) {
    int rc = kiln_errorf(KILN_ERR_IO, "%s: cannot sync: %s", dir, strerror(errno));
    if (fd >= 0) close(fd);
    return rc;
  }
  close(fd);
  KILN_TRY(kiln_data_entry_seal(cache_dir, name));
  snprintf(path, sizeof path, "%s/READY", dir);
  return kiln_write_file_atomic(path, ready, len);
}
