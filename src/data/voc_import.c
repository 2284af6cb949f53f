/* `kiln data fetch voc2007 --from TAR [--from TAR]`: the user's PASCAL VOC 2007 archives
 * (VOCtrainval_06-Nov-2007.tar, VOCtest_06-Nov-2007.tar; kiln downloads neither) into the cache,
 * in the layout shapes-det has (src/data/voc_layout.c), so that one SSD recipe reads either.
 *
 * Each tar is read twice through libarchive: its headers first (cheap: a plain tar's members are
 * skipped by seeking), to refuse an archive that is not VOC 2007's before anything is written
 * and to learn which split it holds (ImageSets/Main/trainval.txt or test.txt); then the members
 * the layout keeps (JPEGImages/ID.jpg, Annotations/ID.xml, ImageSets/Main/NAME.txt; not the
 * segmentation masks) are streamed into the entry. The lists are then derived from the splits'
 * id files, which checks that every listed image has its JPEG and its annotation. A tar of the
 * split that an entry lacks is added to it (the trainval archive one day, the test one the
 * next); without READY the entry is cleared first, so nothing of an interrupted fetch stays. */
#include <archive.h>
#include <archive_entry.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "data/det_sets.h"
#include "data/internal.h"
#include "kiln/data.h"

#define PREFIX "VOCdevkit/VOC2007/"
/* A member larger than this is no VOC image, annotation or list: refused, not copied. */
#define MEMBER_MAX_BYTES ((int64_t)64 << 20)

static const char *const voc_classes[20] = {
    "aeroplane", "bicycle", "bird",  "boat",        "bottle", "bus",         "car",
    "cat",       "chair",   "cow",   "diningtable", "dog",    "horse",       "motorbike",
    "person",    "pottedplant", "sheep", "sofa",     "train",  "tvmonitor"};

/* The member's path inside VOCdevkit/VOC2007/ ("./" before it allowed), or NULL. */
static const char *voc_path(const char *name) {
  if (!name) return NULL;
  if (!strncmp(name, "./", 2)) name += 2;
  return strncmp(name, PREFIX, strlen(PREFIX)) ? NULL : name + strlen(PREFIX);
}

/* Where in the entry a member goes ("JPEGImages/000005.jpg"), or false for one the layout does
 * not keep: a plain name (an id's characters) in one of the three folders, with its suffix. */
static bool kept(const char *rel, char *out, size_t n, bool *jpeg) {
  static const struct {
    const char *folder, *suffix;
  } kinds[] = {{"JPEGImages/", ".jpg"}, {"Annotations/", ".xml"}, {"ImageSets/Main/", ".txt"}};
  for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
    const size_t fl = strlen(kinds[k].folder), sl = strlen(kinds[k].suffix), len = strlen(rel);
    if (strncmp(rel, kinds[k].folder, fl) || len < fl + sl ||
        strcmp(rel + len - sl, kinds[k].suffix) || !kiln_voc_id_ok(rel + fl, len - fl - sl))
      continue;
    *jpeg = k == 0;
    return (size_t)snprintf(out, n, "%s", rel) < n;
  }
  return false;
}

static int open_tar(const char *tar, struct archive **out) {
  struct archive *a = *out = archive_read_new();
  if (!a) return kiln_errorf(KILN_ERR_NOMEM, "%s: out of memory for libarchive", tar);
  archive_read_support_filter_gzip(a);
  archive_read_support_format_tar(a);
  if (archive_read_open_filename(a, tar, 1 << 16) != ARCHIVE_OK) {
    int rc = kiln_errorf(access(tar, R_OK) ? KILN_ERR_IO : KILN_ERR_DATA,
                         "%s: cannot read as a tar: %s", tar, archive_error_string(a));
    archive_read_free(a);
    *out = NULL;
    return rc;
  }
  return KILN_OK;
}

/* The splits a tar holds (bit KILN_VOC_TRAINVAL, KILN_VOC_TEST), from its headers alone. */
static int scan_tar(const char *tar, unsigned *splits) {
  *splits = 0;
  struct archive *a;
  KILN_TRY(open_tar(tar, &a));
  struct archive_entry *e;
  uint64_t voc = 0, other = 0;
  int rc = KILN_OK, r;
  while ((r = archive_read_next_header(a, &e)) == ARCHIVE_OK) {
    const char *rel = voc_path(archive_entry_pathname(e));
    if (!rel) {
      other++;
      continue;
    }
    voc++;
    for (int s = 0; s < KILN_VOC_SPLITS; s++) {
      char list[64];
      snprintf(list, sizeof list, "ImageSets/Main/%s.txt", kiln_voc_split_names[s]);
      if (!strcmp(rel, list) && archive_entry_filetype(e) == AE_IFREG) *splits |= 1u << s;
    }
  }
  if (r != ARCHIVE_EOF)
    rc = kiln_errorf(KILN_ERR_DATA, "%s: damaged archive: %s", tar, archive_error_string(a));
  else if (voc == 0)
    rc = kiln_errorf(KILN_ERR_DATA,
                     "%s: not a PASCAL VOC 2007 archive (%llu members, none under " PREFIX
                     "): give VOCtrainval_06-Nov-2007.tar or VOCtest_06-Nov-2007.tar",
                     tar, (unsigned long long)other);
  else if (*splits == 0)
    rc = kiln_errorf(KILN_ERR_DATA,
                     "%s: holds no split: neither " PREFIX "ImageSets/Main/trainval.txt nor "
                     "test.txt (give VOCtrainval_06-Nov-2007.tar or VOCtest_06-Nov-2007.tar)",
                     tar);
  archive_read_free(a);
  return rc;
}

/* The member at the archive's position into dir/rel, streamed. */
static int copy_member(struct archive *a, const char *tar, const char *member, const char *dir,
                       const char *rel, bool jpeg) {
  char path[4400];
  if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, rel) >= sizeof path)
    return kiln_errorf(KILN_ERR_INVALID, "%s: path too long", dir);
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0666);
  if (fd < 0) return kiln_errorf(KILN_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
  int rc = KILN_OK;
  int64_t total = 0;
  for (;;) {
    const void *buf;
    size_t len;
    la_int64_t off;
    const int r = archive_read_data_block(a, &buf, &len, &off);
    if (r == ARCHIVE_EOF) break;
    if (r != ARCHIVE_OK) {
      rc = kiln_errorf(KILN_ERR_DATA, "%s: member %s: damaged archive: %s", tar, member,
                       archive_error_string(a));
      break;
    }
    if (off != total) { /* a sparse member: no VOC file is one */
      rc = kiln_errorf(KILN_ERR_DATA, "%s: member %s: a sparse file", tar, member);
      break;
    }
    if (jpeg && total == 0 && len > 0 &&
        (len < 3 || memcmp(buf, "\xff\xd8\xff", 3))) {
      rc = kiln_errorf(KILN_ERR_DATA, "%s: member %s is not a JPEG image", tar, member);
      break;
    }
    if (!kiln_fd_write_all(fd, buf, len)) {
      rc = kiln_errorf(KILN_ERR_IO, "%s: write failed: %s", path, strerror(errno));
      break;
    }
    total += (int64_t)len;
  }
  if (!rc && jpeg && total == 0)
    rc = kiln_errorf(KILN_ERR_DATA, "%s: member %s is empty", tar, member);
  if (close(fd) != 0 && !rc)
    rc = kiln_errorf(KILN_ERR_IO, "%s: write failed: %s", path, strerror(errno));
  return rc;
}

/* The members the layout keeps, into dir; *copied counts them. */
static int extract_tar(const char *tar, const char *dir, uint64_t *copied) {
  struct archive *a;
  KILN_TRY(open_tar(tar, &a));
  struct archive_entry *e;
  int rc = KILN_OK, r;
  while (!rc && (r = archive_read_next_header(a, &e)) == ARCHIVE_OK) {
    const char *member = archive_entry_pathname(e), *rel = voc_path(member);
    char out[256];
    bool jpeg = false;
    if (!rel || archive_entry_filetype(e) != AE_IFREG || !kept(rel, out, sizeof out, &jpeg))
      continue;
    if (archive_entry_size(e) > MEMBER_MAX_BYTES) {
      rc = kiln_errorf(KILN_ERR_DATA, "%s: member %s: %lld bytes, more than a VOC file has", tar,
                       member, (long long)archive_entry_size(e));
      break;
    }
    rc = copy_member(a, tar, member, dir, out, jpeg);
    if (!rc) ++*copied;
  }
  if (!rc && r != ARCHIVE_EOF)
    rc = kiln_errorf(KILN_ERR_DATA, "%s: damaged archive: %s", tar, archive_error_string(a));
  archive_read_free(a);
  return rc;
}

/* The splits a cached entry holds (its id files). */
static unsigned entry_splits(const char *dir) {
  unsigned s = 0;
  for (int k = 0; k < KILN_VOC_SPLITS; k++) {
    char path[4400];
    snprintf(path, sizeof path, "%s/ImageSets/Main/%s.txt", dir, kiln_voc_split_names[k]);
    if (access(path, F_OK) == 0) s |= 1u << k;
  }
  return s;
}

/* READY's line for a split: "test 4952 images from PATH" (kept from the old READY for a split
 * this fetch does not bring). */
static void split_line(kiln_strbuf *b, const char *old, int split, uint32_t images,
                       const char *tar) {
  const char *name = kiln_voc_split_names[split];
  if (tar) {
    kiln_strbuf_printf(b, "%s %u images from %s\n", name, images, tar);
    return;
  }
  const size_t n = strlen(name);
  for (const char *l = old; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL)
    if (!strncmp(l, name, n) && l[n] == ' ') {
      kiln_strbuf_printf(b, "%.*s\n", (int)strcspn(l, "\n"), l);
      return;
    }
  kiln_strbuf_printf(b, "%s %u images\n", name, images);
}

static int import_locked(const char *const *tars, int n, const unsigned *splits,
                         const char *cache_dir, const char *dir, const char *ready) {
  char *old = NULL;
  if (access(ready, F_OK) == 0) {
    /* adding a split: the entry (verified before the fetch) stays, unsealed while it grows */
    KILN_TRY(kiln_read_file_max(ready, 1 << 16, &old, NULL));
    if (unlink(ready) != 0) {
      free(old);
      return kiln_errorf(KILN_ERR_IO, "%s: cannot remove: %s", ready, strerror(errno));
    }
  } else {
    KILN_TRY(kiln_voc_clear_entry(dir));
  }
  int rc = kiln_voc_make_folders(dir);
  const char *from[KILN_VOC_SPLITS] = {NULL, NULL};
  for (int t = 0; !rc && t < n; t++) {
    uint64_t copied = 0;
    kiln_log(KILN_LOG_INFO, "voc2007: copying %s into %s", tars[t], dir);
    rc = extract_tar(tars[t], dir, &copied);
    for (int s = 0; s < KILN_VOC_SPLITS; s++)
      if (splits[t] & (1u << s)) from[s] = tars[t];
  }
  kiln_strbuf r = {0};
  kiln_strbuf_printf(&r, "voc2007\nsource PASCAL VOC 2007 (your VOCtrainval_06-Nov-2007.tar, "
                         "VOCtest_06-Nov-2007.tar)\n");
  const unsigned have = entry_splits(dir);
  for (int s = 0; !rc && s < KILN_VOC_SPLITS; s++) {
    if (!(have & (1u << s))) continue;
    uint32_t images = 0;
    rc = kiln_voc_write_list(dir, s, &images);
    if (!rc) split_line(&r, old, s, images, from[s]);
  }
  if (!rc) rc = kiln_voc_write_labelmap(dir, voc_classes, 20);
  if (!rc && r.failed) rc = kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  if (!rc) rc = kiln_voc_finish(cache_dir, "voc2007", r.s, r.len);
  free(r.s);
  free(old);
  return rc;
}

int kiln_data_fetch_voc2007(const char *const *tars, int n, const char *cache_dir, bool *already) {
  if (already) *already = false;
  char dir[4096], ready[4200], lock[4200];
  if ((size_t)snprintf(dir, sizeof dir, "%s/voc2007", cache_dir) >= sizeof dir)
    return kiln_errorf(KILN_ERR_INVALID, "%s: path too long", cache_dir);
  snprintf(ready, sizeof ready, "%s/READY", dir);
  snprintf(lock, sizeof lock, "%s/.lock", dir);
  if (n < 0 || n > 2)
    return kiln_errorf(KILN_ERR_INVALID, "voc2007: %d archives; give one or two", n);
  if (n == 0) {
    if (access(ready, F_OK) == 0) {
      if (already) *already = true;
      return KILN_OK;
    }
    return kiln_errorf(KILN_ERR_INVALID,
                       "voc2007 is not in the cache, and kiln downloads no VOC archive: give "
                       "VOCtrainval_06-Nov-2007.tar and VOCtest_06-Nov-2007.tar (PASCAL VOC "
                       "2007, http://host.robots.ox.ac.uk/pascal/VOC/voc2007/) with --from");
  }
  unsigned splits[2] = {0, 0}, wanted = 0;
  for (int t = 0; t < n; t++) {
    KILN_TRY(scan_tar(tars[t], &splits[t]));
    wanted |= splits[t];
  }
  if (access(ready, F_OK) == 0 && (wanted & ~entry_splits(dir)) == 0) {
    if (already) *already = true;
    return KILN_OK;
  }
  KILN_TRY(kiln_mkdir_p(dir));
  int fd = -1;
  KILN_TRY(kiln_data_lock_entry(lock, &fd));
  int rc = KILN_OK;
  if (access(ready, F_OK) == 0 && (wanted & ~entry_splits(dir)) == 0) {
    if (already) *already = true; /* another fetch brought them while this one waited */
  } else {
    rc = import_locked(tars, n, splits, cache_dir, dir, ready);
  }
  close(fd); /* releases the lock */
  return rc;
}
