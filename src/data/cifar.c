/* CIFAR-10 and CIFAR-100 in their published binary layout: fixed-size records of label byte(s)
 * followed by 3x32x32 channel-planar pixels, read straight from the distributed .tar.gz (zlib
 * plus a minimal ustar reader) or from a folder where the archive was unpacked, and converted
 * into an LMDB of Datum records the way Caffe's convert_cifar_data does. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "data/internal.h"
#include "kiln/data.h"

#define TAR_BLOCK 512
#define CHUNK_RECORDS 256 /* records read per call: 786 KiB of CIFAR-10 */
#define NAME_MAX_LEN 512
#define SOURCE_HINT "; give the binary .tar.gz or the folder of .bin files"

/* Where each layout keeps its files; the archive holds them under `folder`/. */
typedef struct cifar_layout {
  const char *folder;
  const char *train[5];
  int n_train;
  const char *test;
  int label_bytes; /* 1 (CIFAR-10) or 2 (CIFAR-100: coarse, then fine) */
} cifar_layout;

static const cifar_layout CIFAR10_LAYOUT = {"cifar-10-batches-bin",
                                            {"data_batch_1.bin", "data_batch_2.bin",
                                             "data_batch_3.bin", "data_batch_4.bin",
                                             "data_batch_5.bin"},
                                            5,
                                            "test_batch.bin",
                                            1};
static const cifar_layout CIFAR100_LAYOUT = {"cifar-100-binary", {"train.bin"}, 1, "test.bin", 2};

static bool kind_valid(kiln_cifar_kind kind) {
  return (int)kind >= 0 && (int)kind < (int)KILN_CIFAR_KIND_COUNT;
}

static const char *set_name(kiln_cifar_kind kind) {
  return kind == KILN_CIFAR10 ? "CIFAR-10" : "CIFAR-100";
}

int kiln_cifar_num_classes(kiln_cifar_kind kind) {
  switch (kind) {
  case KILN_CIFAR10: return 10;
  case KILN_CIFAR100_FINE: return 100;
  case KILN_CIFAR100_COARSE: return 20;
  default: return 0;
  }
}

size_t kiln_cifar_record_bytes(kiln_cifar_kind kind) {
  return kind == KILN_CIFAR10 ? 1 + KILN_CIFAR_IMAGE_BYTES : 2 + KILN_CIFAR_IMAGE_BYTES;
}

static const cifar_layout *layout_of(kiln_cifar_kind kind) {
  return kind == KILN_CIFAR10 ? &CIFAR10_LAYOUT : &CIFAR100_LAYOUT;
}

/* ---- byte streams: the decompressed archive, or one plain .bin file ---------------------- */

typedef struct stream {
  gzFile gz; /* archive (gzip or plain tar; zlib reads both) */
  int fd;    /* plain file when gz is NULL */
  const char *path;
  bool gzipped;
  uint64_t offset; /* bytes delivered so far */
} stream;

/* Reads up to `n` bytes; *got says how many arrived (fewer only at the end of the input). Fails
 * only on a read error or a corrupt compressed stream. */
static int stream_read(stream *s, void *buf, size_t n, size_t *got) {
  uint8_t *p = buf;
  *got = 0;
  while (*got < n) {
    size_t want = n - *got;
    if (want > (1u << 30)) want = 1u << 30;
    if (s->gz) {
      int r = gzread(s->gz, p + *got, (unsigned)want);
      if (r < 0) {
        int zerr;
        const char *msg = gzerror(s->gz, &zerr);
        if (zerr == Z_ERRNO)
          return kiln_errorf(KILN_ERR_IO, "%s: read error: %s", s->path, strerror(errno));
        return kiln_errorf(KILN_ERR_DATA, "%s: corrupt gzip data near byte %llu: %s", s->path,
                           (unsigned long long)(s->offset + *got), msg);
      }
      if (r == 0) break;
      *got += (size_t)r;
    } else {
      ssize_t r = read(s->fd, p + *got, want);
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) return kiln_errorf(KILN_ERR_IO, "%s: read error: %s", s->path, strerror(errno));
      if (r == 0) break;
      *got += (size_t)r;
    }
  }
  s->offset += *got;
  return KILN_OK;
}

/* True when the gzip stream ended before its end marker (zlib's "unexpected end of file"). */
static bool stream_cut(stream *s) {
  if (!s->gz || !s->gzipped) return false;
  int zerr;
  gzerror(s->gz, &zerr);
  return zerr == Z_BUF_ERROR;
}

static const char *cut_note(stream *s) {
  return stream_cut(s) ? " (the gzip stream is cut short)" : "";
}

/* Reads and drops `n` bytes; *got says how many there were. */
static int stream_skip(stream *s, uint64_t n, uint64_t *got) {
  uint8_t buf[1 << 14];
  *got = 0;
  while (*got < n) {
    size_t want = n - *got < sizeof buf ? (size_t)(n - *got) : sizeof buf, r;
    KILN_TRY(stream_read(s, buf, want, &r));
    *got += r;
    if (r < want) break;
  }
  return KILN_OK;
}

/* ---- records ----------------------------------------------------------------------------- */

/* One file's records, kept apart until every file has been read (an archive stores them in any
 * order). */
typedef struct part {
  bool found;
  uint32_t n;
  uint8_t *labels, *pixels;
} part;

static void part_free(part *p) {
  free(p->labels);
  free(p->pixels);
  memset(p, 0, sizeof *p);
}

/* Reads `size` bytes of records from `s` into `p`. `what` names the file (and member) in
 * messages. The size comes from a tar header, so memory grows as records really arrive rather
 * than trusting it up front. */
static int read_records(stream *s, const char *what, uint64_t size, kiln_cifar_kind kind,
                        bool in_archive, part *p) {
  size_t rec = kiln_cifar_record_bytes(kind);
  if (size == 0) return kiln_errorf(KILN_ERR_DATA, "%s: holds no records (0 bytes)", what);
  if (size % rec != 0)
    return kiln_errorf(KILN_ERR_DATA,
                       "%s: wrong record size: %llu bytes is not a multiple of the %zu-byte "
                       "%s record (%llu whole records and %llu bytes over)",
                       what, (unsigned long long)size, rec, set_name(kind),
                       (unsigned long long)(size / rec), (unsigned long long)(size % rec));
  if (size / rec > KILN_CIFAR_MAX_RECORDS)
    return kiln_errorf(KILN_ERR_DATA, "%s: %llu records is more than the %u a CIFAR file can hold",
                       what, (unsigned long long)(size / rec), (unsigned)KILN_CIFAR_MAX_RECORDS);
  uint32_t n = (uint32_t)(size / rec);
  bool cifar100 = kind != KILN_CIFAR10;
  uint8_t *buf = malloc(CHUNK_RECORDS * rec);
  if (!buf) return kiln_errorf(KILN_ERR_NOMEM, "%s: out of memory", what);
  uint32_t cap = 0;
  int rc = KILN_OK;
  for (uint32_t i = 0; i < n;) {
    uint32_t k = n - i < CHUNK_RECORDS ? n - i : CHUNK_RECORDS;
    if (i + k > cap) {
      uint32_t want = cap ? cap : 1024;
      while (want < i + k)
        want *= 2;
      if (want > n) want = n;
      uint8_t *l = realloc(p->labels, want);
      if (l) p->labels = l;
      uint8_t *px = l ? realloc(p->pixels, (size_t)want * KILN_CIFAR_IMAGE_BYTES) : NULL;
      if (!px) {
        rc = kiln_errorf(KILN_ERR_NOMEM, "%s: cannot allocate %u records", what, (unsigned)want);
        break;
      }
      p->pixels = px;
      cap = want;
    }
    size_t got;
    if ((rc = stream_read(s, buf, k * rec, &got))) break;
    if (got < k * rec) {
      uint64_t have = (uint64_t)i * rec + got;
      if (in_archive)
        rc = kiln_errorf(KILN_ERR_DATA,
                         "%s: archive truncated: the member ends after %llu of its %llu bytes, "
                         "in record %llu%s",
                         what, (unsigned long long)have, (unsigned long long)size,
                         (unsigned long long)(have / rec), cut_note(s));
      else
        rc = kiln_errorf(
            KILN_ERR_DATA, "%s: truncated: ends after %llu of %llu bytes, in record %llu", what,
            (unsigned long long)have, (unsigned long long)size, (unsigned long long)(have / rec));
      break;
    }
    for (uint32_t j = 0; j < k; j++) {
      const uint8_t *r = buf + (size_t)j * rec;
      uint32_t index = i + j;
      unsigned long long at = (unsigned long long)index * rec;
      if (!cifar100) {
        if (r[0] >= 10) {
          rc = kiln_errorf(KILN_ERR_DATA,
                           "%s: record %u (byte offset %llu): label %u out of range (CIFAR-10 "
                           "labels are 0..9)",
                           what, (unsigned)index, at, r[0]);
          break;
        }
        p->labels[index] = r[0];
      } else {
        /* Both labels are checked whichever is kept: either one out of range means the record
         * is not what the layout says. */
        if (r[0] >= 20 || r[1] >= 100) {
          bool coarse = r[0] >= 20;
          rc = kiln_errorf(KILN_ERR_DATA,
                           "%s: record %u (byte offset %llu): %s label %u out of range (CIFAR-100 "
                           "%s labels are 0..%d)",
                           what, (unsigned)index, coarse ? at : at + 1, coarse ? "coarse" : "fine",
                           coarse ? r[0] : r[1], coarse ? "coarse" : "fine", coarse ? 19 : 99);
          break;
        }
        p->labels[index] = kind == KILN_CIFAR100_COARSE ? r[0] : r[1];
      }
      memcpy(p->pixels + (size_t)index * KILN_CIFAR_IMAGE_BYTES, r + (rec - KILN_CIFAR_IMAGE_BYTES),
             KILN_CIFAR_IMAGE_BYTES);
    }
    if (rc) break;
    i += k;
  }
  free(buf);
  if (rc) {
    part_free(p);
    return rc;
  }
  p->n = n;
  p->found = true;
  return KILN_OK;
}

/* ---- tar --------------------------------------------------------------------------------- */

/* A numeric header field: octal digits (space or NUL padded), or GNU's base-256 form for big
 * values (high bit of the first byte set). False when the field is malformed. */
static bool tar_number(const uint8_t *f, size_t len, uint64_t *out) {
  uint64_t v = 0;
  if (f[0] & 0x80) {
    if (f[0] & 0x40) return false; /* negative */
    v = f[0] & 0x3f;
    for (size_t i = 1; i < len; i++) {
      if (v >> 55) return false;
      v = v << 8 | f[i];
    }
    *out = v;
    return true;
  }
  size_t i = 0;
  while (i < len && f[i] == ' ')
    i++;
  for (; i < len && f[i] >= '0' && f[i] <= '7'; i++) {
    if (v >> 60) return false;
    v = v << 3 | (uint64_t)(f[i] - '0');
  }
  for (; i < len; i++)
    if (f[i] != ' ' && f[i] != '\0') return false;
  *out = v;
  return true;
}

/* The stored checksum must equal the byte sum of the header with its checksum field read as
 * spaces; old tars summed signed chars, so either sum is accepted. */
static bool tar_checksum_ok(const uint8_t *h) {
  uint64_t want;
  if (!tar_number(h + 148, 8, &want)) return false;
  unsigned long usum = 0;
  long ssum = 0;
  for (int i = 0; i < TAR_BLOCK; i++) {
    uint8_t b = i >= 148 && i < 156 ? ' ' : h[i];
    usum += b;
    ssum += (signed char)b;
  }
  return want == usum || (ssum >= 0 && want == (uint64_t)ssum);
}

static bool all_zero(const uint8_t *b, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (b[i]) return false;
  return true;
}

/* The member's path: POSIX ustar joins prefix and name; GNU headers use the prefix bytes for
 * other things. Leading "./" (from `tar -C dir .`) is dropped. */
static void tar_name(const uint8_t *h, char *out, size_t n) {
  char name[101], prefix[156];
  memcpy(name, h, 100);
  name[100] = '\0';
  prefix[0] = '\0';
  if (!memcmp(h + 257, "ustar\0", 6)) {
    memcpy(prefix, h + 345, 155);
    prefix[155] = '\0';
  }
  if (prefix[0])
    snprintf(out, n, "%s/%s", prefix, name);
  else
    snprintf(out, n, "%s", name);
  char *p = out;
  while (p[0] == '.' && p[1] == '/')
    p += 2;
  memmove(out, p, strlen(p) + 1);
}

/* Printable copy of a member name for messages. */
static void printable(char *s) {
  for (; *s; s++)
    if ((unsigned char)*s < 0x20 || (unsigned char)*s >= 0x7f) *s = '?';
}

typedef struct wanted {
  const char *file; /* name inside the layout's folder */
  part *dst;
} wanted;

/* One pass over the archive: every wanted member is read into its part, everything else is
 * skipped; the stream is then read to its end so that a damaged tail is noticed too. */
static int read_archive(stream *s, kiln_cifar_kind kind, const cifar_layout *lay,
                        const wanted *want, int n_want) {
  uint8_t h[TAR_BLOCK];
  char name[NAME_MAX_LEN], what[NAME_MAX_LEN + 4096];
  for (bool first = true;; first = false) {
    uint64_t at = s->offset;
    size_t got;
    KILN_TRY(stream_read(s, h, TAR_BLOCK, &got));
    if (got < TAR_BLOCK && stream_cut(s))
      return kiln_errorf(
          KILN_ERR_DATA,
          "%s: archive truncated: the gzip stream is cut short (after %llu bytes of tar data)",
          s->path, (unsigned long long)s->offset);
    if (got == 0 && !first) break; /* no end-of-archive blocks, but nothing is missing */
    if (got < TAR_BLOCK) {
      if (first)
        return kiln_errorf(KILN_ERR_DATA, "%s: not a %s (%zu bytes, shorter than one tar header)%s",
                           s->path,
                           s->gzipped ? "tar archive inside the gzip data" : "gzip or tar archive",
                           got, SOURCE_HINT);
      return kiln_errorf(KILN_ERR_DATA,
                         "%s: archive truncated: a tar header at byte offset %llu is cut short%s",
                         s->path, (unsigned long long)at, cut_note(s));
    }
    if (all_zero(h, TAR_BLOCK)) break; /* end of archive */
    if (!tar_checksum_ok(h)) {
      if (first)
        return kiln_errorf(KILN_ERR_DATA, "%s: not a %s (no tar header at the start)%s", s->path,
                           s->gzipped ? "tar archive inside the gzip data" : "gzip or tar archive",
                           SOURCE_HINT);
      return kiln_errorf(KILN_ERR_DATA,
                         "%s: corrupt tar header at byte offset %llu (checksum mismatch)", s->path,
                         (unsigned long long)at);
    }
    tar_name(h, name, sizeof name);
    printable(name);
    /* The same page offers the sets as Python pickles (what the tutorials' code loads) and as
     * MATLAB files; kiln reads neither, and says which archive it does read. */
    if (!strncmp(name, "cifar-10-batches-py", 19) || !strncmp(name, "cifar-100-python", 16) ||
        !strncmp(name, "cifar-10-batches-mat", 20) || !strncmp(name, "cifar-100-matlab", 16))
      return kiln_errorf(KILN_ERR_DATA,
                         "%s: this is the %s version of %s (member %s); kiln reads the binary "
                         "version of %s, %s, from the same page",
                         s->path, strstr(name, "py") ? "Python (pickle)" : "MATLAB",
                         strncmp(name, "cifar-10-", 9) ? "CIFAR-100" : "CIFAR-10", name,
                         set_name(kind),
                         kind == KILN_CIFAR10 ? "cifar-10-binary.tar.gz" : "cifar-100-binary.tar.gz");
    uint64_t size;
    if (!tar_number(h + 124, 12, &size))
      return kiln_errorf(KILN_ERR_DATA,
                         "%s: corrupt tar header at byte offset %llu: member %s has a malformed "
                         "size field",
                         s->path, (unsigned long long)at, name);
    char type = (char)h[156];
    /* Links, devices, fifos and directories carry no data whatever the size field says. */
    if (type >= '1' && type <= '6') size = 0;
    bool regular = type == '0' || type == '\0' || type == '7';

    part *dst = NULL;
    size_t folder_len = strlen(lay->folder);
    if (regular && !strncmp(name, lay->folder, folder_len) && name[folder_len] == '/')
      for (int i = 0; i < n_want; i++)
        if (!strcmp(name + folder_len + 1, want[i].file)) dst = want[i].dst;
    uint64_t pad = (TAR_BLOCK - size % TAR_BLOCK) % TAR_BLOCK;
    snprintf(what, sizeof what, "%s: member %s", s->path, name);
    if (dst) {
      part_free(dst); /* a later copy of a member replaces an earlier one, as tar extracts */
      KILN_TRY(read_records(s, what, size, kind, true, dst));
    } else {
      uint64_t skipped;
      KILN_TRY(stream_skip(s, size, &skipped));
      if (skipped < size)
        return kiln_errorf(
            KILN_ERR_DATA, "%s: archive truncated: the member ends after %llu of its %llu bytes%s",
            what, (unsigned long long)skipped, (unsigned long long)size, cut_note(s));
    }
    uint64_t skipped;
    KILN_TRY(stream_skip(s, pad, &skipped));
    if (skipped < pad)
      return kiln_errorf(KILN_ERR_DATA,
                         "%s: archive truncated: the padding after the member is cut short%s", what,
                         cut_note(s));
  }
  /* The rest is zero padding up to the tar record size; reading it checks the gzip trailer. */
  uint64_t rest;
  KILN_TRY(stream_skip(s, UINT64_MAX, &rest));
  if (stream_cut(s))
    return kiln_errorf(
        KILN_ERR_DATA,
        "%s: archive truncated: the gzip stream is cut short (after %llu bytes of tar data)",
        s->path, (unsigned long long)s->offset);
  for (int i = 0; i < n_want; i++)
    if (!want[i].dst->found)
      return kiln_errorf(KILN_ERR_DATA, "%s: missing member %s/%s (is this the %s binary archive?)",
                         s->path, lay->folder, want[i].file, set_name(kind));
  return KILN_OK;
}

static int read_from_archive(const char *path, int fd, kiln_cifar_kind kind,
                             const cifar_layout *lay, const wanted *want, int n_want) {
  uint8_t magic[2] = {0, 0};
  stream s = {.fd = -1, .path = path};
  s.gzipped = pread(fd, magic, 2, 0) == 2 && magic[0] == 0x1f && magic[1] == 0x8b;
  s.gz = gzdopen(fd, "rb");
  if (!s.gz) {
    close(fd);
    return kiln_errorf(KILN_ERR_NOMEM, "%s: cannot set up decompression", path);
  }
  gzbuffer(s.gz, 1 << 17);
  int rc = read_archive(&s, kind, lay, want, n_want);
  gzclose_r(s.gz);
  return rc;
}

/* ---- extracted folders ------------------------------------------------------------------- */

static bool is_file(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

static int read_bin_file(const char *path, kiln_cifar_kind kind, part *p) {
  /* O_NONBLOCK: a FIFO in the folder is refused below instead of waited on forever (it has no
   * effect on a regular file's reads). */
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return kiln_errorf(KILN_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return kiln_errorf(KILN_ERR_IO, "%s: not a regular file", path);
  }
  stream s = {.fd = fd, .path = path};
  int rc = read_records(&s, path, (uint64_t)st.st_size, kind, false, p);
  close(fd);
  return rc;
}

/* `dir` is either the folder of .bin files or the folder holding it (where the archive was
 * unpacked); the first file needed decides which. */
static int read_from_dir(const char *dir, kiln_cifar_kind kind, const cifar_layout *lay,
                         const wanted *want, int n_want) {
  size_t len = strlen(dir) + strlen(lay->folder) + 64;
  char *base = malloc(len), *path = malloc(len), *alt = malloc(len);
  int rc = KILN_OK;
  if (!base || !path || !alt) {
    rc = kiln_errorf(KILN_ERR_NOMEM, "%s: out of memory", dir);
    goto done;
  }
  snprintf(path, len, "%s/%s", dir, want[0].file);
  snprintf(alt, len, "%s/%s/%s", dir, lay->folder, want[0].file);
  if (is_file(path)) {
    snprintf(base, len, "%s", dir);
  } else if (is_file(alt)) {
    snprintf(base, len, "%s/%s", dir, lay->folder);
  } else {
    rc = kiln_errorf(KILN_ERR_IO, "%s: missing file %s (looked for %s and %s)", dir, want[0].file,
                     path, alt);
    goto done;
  }
  for (int i = 0; i < n_want && rc == KILN_OK; i++) {
    snprintf(path, len, "%s/%s", base, want[i].file);
    struct stat st;
    if (stat(path, &st) != 0 && errno == ENOENT)
      rc = kiln_errorf(KILN_ERR_IO, "%s: missing file %s", path, want[i].file);
    else
      rc = read_bin_file(path, kind, want[i].dst);
  }
done:
  free(base);
  free(path);
  free(alt);
  return rc;
}

/* ---- public ------------------------------------------------------------------------------ */

int kiln_cifar_read(const char *source, kiln_cifar_kind kind, bool train, kiln_cifar_set *out) {
  memset(out, 0, sizeof *out);
  if (!kind_valid(kind)) return kiln_errorf(KILN_ERR_INVALID, "unknown CIFAR kind %d", (int)kind);
  const cifar_layout *lay = layout_of(kind);
  part parts[5];
  memset(parts, 0, sizeof parts);
  wanted want[5];
  int n_want = train ? lay->n_train : 1;
  for (int i = 0; i < n_want; i++) {
    want[i].file = train ? lay->train[i] : lay->test;
    want[i].dst = &parts[i];
  }

  int rc;
  int fd = open(source, O_RDONLY | O_CLOEXEC | O_NONBLOCK); /* a FIFO is refused, not waited on */
  struct stat st;
  if (fd < 0) {
    rc = kiln_errorf(KILN_ERR_IO, "%s: cannot open: %s", source, strerror(errno));
  } else if (fstat(fd, &st) != 0) {
    rc = kiln_errorf(KILN_ERR_IO, "%s: cannot stat: %s", source, strerror(errno));
    close(fd);
  } else if (!S_ISDIR(st.st_mode) && !S_ISREG(st.st_mode)) {
    rc = kiln_errorf(KILN_ERR_IO, "%s: neither a regular file nor a folder", source);
    close(fd);
  } else if (S_ISDIR(st.st_mode)) {
    close(fd);
    rc = read_from_dir(source, kind, lay, want, n_want);
  } else {
    rc = read_from_archive(source, fd, kind, lay, want, n_want); /* closes fd */
  }
  if (rc == KILN_OK) {
    /* Concatenate in file order; the first part's buffers grow in place where they can. */
    uint64_t total = 0;
    for (int i = 0; i < n_want; i++)
      total += parts[i].n;
    if (total > KILN_CIFAR_MAX_RECORDS) {
      rc = kiln_errorf(KILN_ERR_DATA, "%s: %llu records in all, more than the %u allowed", source,
                       (unsigned long long)total, (unsigned)KILN_CIFAR_MAX_RECORDS);
    } else {
      uint8_t *labels = realloc(parts[0].labels, (size_t)total);
      if (labels) parts[0].labels = labels;
      uint8_t *pixels =
          labels ? realloc(parts[0].pixels, (size_t)total * KILN_CIFAR_IMAGE_BYTES) : NULL;
      if (!pixels) {
        rc = kiln_errorf(KILN_ERR_NOMEM, "%s: cannot allocate %llu records", source,
                         (unsigned long long)total);
      } else {
        parts[0].pixels = pixels;
        uint64_t at = parts[0].n;
        for (int i = 1; i < n_want; i++) {
          memcpy(labels + at, parts[i].labels, parts[i].n);
          memcpy(pixels + at * KILN_CIFAR_IMAGE_BYTES, parts[i].pixels,
                 (size_t)parts[i].n * KILN_CIFAR_IMAGE_BYTES);
          at += parts[i].n;
          part_free(&parts[i]);
        }
        out->n = (uint32_t)total;
        out->labels = labels;
        out->pixels = pixels;
        parts[0].labels = parts[0].pixels = NULL;
      }
    }
  }
  for (int i = 0; i < n_want; i++)
    part_free(&parts[i]);
  return rc;
}

void kiln_cifar_free(kiln_cifar_set *s) {
  if (!s) return;
  free(s->labels);
  free(s->pixels);
  memset(s, 0, sizeof *s);
}

int kiln_convert_cifar_to_lmdb(const char *source, kiln_cifar_kind kind, bool train,
                               const char *out_path, uint64_t *n_written) {
  if (n_written) *n_written = 0;
  struct stat st;
  /* Checked before reading the archive, which takes a while; the writer checks again. */
  if (stat(out_path, &st) == 0)
    return kiln_errorf(KILN_ERR_INVALID,
                       "%s: already exists; remove it or choose another output path", out_path);
  kiln_cifar_set set;
  KILN_TRY(kiln_cifar_read(source, kind, train, &set));
  int rc = KILN_OK;
  /* Caffe's keys have five digits; more records would sort out of order. */
  if (set.n > 100000) {
    rc = kiln_errorf(KILN_ERR_DATA, "%s: %u records do not fit five-digit keys (at most 100000)",
                     source, (unsigned)set.n);
    goto done;
  }
  rc = kiln_data_write_images(out_path, KILN_DB_LMDB, source, set.n, 5, KILN_CIFAR_CHANNELS,
                              KILN_CIFAR_SIZE, KILN_CIFAR_SIZE, set.pixels, set.labels);
  if (rc == KILN_OK && n_written) *n_written = set.n;
done:
  kiln_cifar_free(&set);
  return rc;
}
