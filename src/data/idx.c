/* IDX files, the format MNIST and Fashion-MNIST ship in: a big-endian header (two zero bytes,
 * an element type, the number of dimensions, one 32-bit size per dimension) followed by the
 * elements, usually gzip-compressed. zlib reads compressed and plain files alike. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "kiln/data.h"

enum { IDX_TYPE_U8 = 0x08 };

static const char *idx_type_name(int type) {
  switch (type) {
  case 0x08: return "unsigned byte";
  case 0x09: return "signed byte";
  case 0x0B: return "short";
  case 0x0C: return "int";
  case 0x0D: return "float";
  case 0x0E: return "double";
  default: return NULL;
  }
}

/* Reads up to `n` bytes; *got says how many arrived (fewer at end of input). Fails only on a
 * read error or a corrupt compressed stream. */
static int read_upto(gzFile gz, const char *path, bool gzipped, void *buf, size_t n, size_t *got) {
  uint8_t *p = buf;
  *got = 0;
  while (*got < n) {
    size_t want = n - *got;
    if (want > (1u << 30)) want = 1u << 30; /* gzread counts in unsigned int */
    int r = gzread(gz, p + *got, (unsigned)want);
    if (r < 0) {
      int zerr;
      const char *msg = gzerror(gz, &zerr);
      if (zerr == Z_ERRNO)
        return kiln_errorf(KILN_ERR_IO, "%s: read error: %s", path, strerror(errno));
      /* zlib's message starts with its own name for the file ("<fd:3>: "), which says nothing */
      if (msg && msg[0] == '<') {
        const char *rest = strstr(msg, ">: ");
        if (rest) msg = rest + 3;
      }
      return kiln_errorf(KILN_ERR_DATA, "%s: %s: %s", path,
                         gzipped ? "corrupt gzip data" : "read error", msg);
    }
    if (r == 0) break;
    *got += (size_t)r;
  }
  return KILN_OK;
}

static uint32_t be32(const uint8_t *b) {
  return (uint32_t)b[0] << 24 | (uint32_t)b[1] << 16 | (uint32_t)b[2] << 8 | (uint32_t)b[3];
}

static int idx_read_stream(gzFile gz, const char *path, bool gzipped, kiln_idx *out) {
  uint8_t head[4];
  size_t got;
  KILN_TRY(read_upto(gz, path, gzipped, head, 4, &got));
  if (got < 4)
    return kiln_errorf(KILN_ERR_DATA, "%s: not an IDX file (%zu bytes, shorter than the header)",
                       path, got);
  uint32_t magic = be32(head);
  int type = head[2], ndims = head[3];
  if (head[0] != 0 || head[1] != 0 || !idx_type_name(type) || ndims == 0)
    return kiln_errorf(KILN_ERR_DATA, "%s: not an IDX file (magic 0x%08x)", path, magic);
  if (type != IDX_TYPE_U8)
    return kiln_errorf(
        KILN_ERR_UNSUPPORTED,
        "%s: IDX element type 0x%02x (%s) is not supported; only unsigned bytes (0x08)", path, type,
        idx_type_name(type));
  if (ndims > KILN_IDX_MAX_DIMS)
    return kiln_errorf(KILN_ERR_UNSUPPORTED,
                       "%s: IDX file with %d dimensions; at most %d are supported", path, ndims,
                       KILN_IDX_MAX_DIMS);

  uint8_t dimbytes[4 * KILN_IDX_MAX_DIMS];
  KILN_TRY(read_upto(gz, path, gzipped, dimbytes, 4 * (size_t)ndims, &got));
  if (got < 4 * (size_t)ndims)
    return kiln_errorf(KILN_ERR_DATA,
                       "%s: truncated: header announces %d dimensions but ends after %zu", path,
                       ndims, got / 4);
  uint64_t count = 1;
  for (int i = 0; i < ndims; i++) {
    out->dims[i] = be32(dimbytes + 4 * i);
    count *= out->dims[i]; /* cannot overflow: at most 2^31 * 2^32 before the check below */
    if (count > KILN_IDX_MAX_ELEMENTS) {
      char shape[96];
      size_t len = 0;
      for (int j = 0; j < ndims; j++)
        len += (size_t)snprintf(shape + len, sizeof shape - len, "%s%u", j ? "x" : "",
                                (unsigned)be32(dimbytes + 4 * j));
      return kiln_errorf(KILN_ERR_DATA, "%s: IDX dimensions %s exceed the limit of 2^31 elements",
                         path, shape);
    }
  }
  out->ndims = ndims;
  out->count = (size_t)count;
  /* The buffer grows with the data that really arrives (doubling from 1 MiB), so a short file
   * whose header announces 2^31 elements costs what it holds, not 2 GiB, before it is refused. */
  size_t cap = out->count < ((size_t)1 << 20) ? out->count : (size_t)1 << 20, have = 0;
  out->data = malloc(cap ? cap : 1);
  while (out->data) {
    KILN_TRY(read_upto(gz, path, gzipped, out->data + have, cap - have, &got));
    have += got;
    if (have < cap || have == out->count) break;
    cap = cap > out->count / 2 ? out->count : 2 * cap;
    uint8_t *grown = realloc(out->data, cap);
    if (!grown) {
      free(out->data);
      out->data = NULL;
    } else {
      out->data = grown;
    }
  }
  if (!out->data)
    return kiln_errorf(KILN_ERR_NOMEM, "%s: cannot allocate %zu bytes", path, cap);
  if (have < out->count)
    return kiln_errorf(KILN_ERR_DATA, "%s: truncated: expected %zu bytes of data, found %zu", path,
                       out->count, have);
  /* Bytes after the data mean the header and the payload disagree: refuse rather than guess. */
  uint8_t extra[256];
  KILN_TRY(read_upto(gz, path, gzipped, extra, sizeof extra, &got));
  if (got > 0) {
    size_t more = got;
    while (got == sizeof extra) {
      KILN_TRY(read_upto(gz, path, gzipped, extra, sizeof extra, &got));
      more += got;
    }
    return kiln_errorf(KILN_ERR_DATA, "%s: %zu unexpected bytes after the %zu bytes of data", path,
                       more, out->count);
  }
  return KILN_OK;
}

int kiln_idx_read(const char *path, kiln_idx *out) {
  memset(out, 0, sizeof *out);
  /* Opened without blocking, so that a FIFO with no writer is refused rather than waited on. */
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return kiln_errorf(KILN_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    const bool dir = S_ISDIR(st.st_mode);
    close(fd);
    return kiln_errorf(KILN_ERR_IO, "%s: %s", path,
                       dir ? "is a directory, not an IDX file" : "not a regular file");
  }
  uint8_t magic[2] = {0, 0};
  bool gzipped = pread(fd, magic, 2, 0) == 2 && magic[0] == 0x1f && magic[1] == 0x8b;
  gzFile gz = gzdopen(fd, "rb");
  if (!gz) {
    close(fd);
    return kiln_errorf(KILN_ERR_NOMEM, "%s: cannot set up decompression", path);
  }
  gzbuffer(gz, 1 << 17);
  int rc = idx_read_stream(gz, path, gzipped, out);
  gzclose_r(gz);
  if (rc != KILN_OK) kiln_idx_free(out);
  return rc;
}

void kiln_idx_free(kiln_idx *idx) {
  if (!idx) return;
  free(idx->data);
  memset(idx, 0, sizeof *idx);
}
