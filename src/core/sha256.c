/* SHA-256 through Nettle (Debian's libnettle, which GnuTLS and much of the system already
 * use): the digests that check data set files before conversion and fingerprint configurations
 * and databases across workers. kiln keeps its own small interface so that no public header
 * exposes Nettle's. */
#include <errno.h>
#include <fcntl.h>
#include <nettle/sha2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kiln/core.h"

_Static_assert(sizeof(struct sha256_ctx) <= sizeof(((kiln_sha256_ctx *)0)->opaque),
               "kiln_sha256_ctx must hold Nettle's context");
_Static_assert(_Alignof(struct sha256_ctx) <= _Alignof(kiln_sha256_ctx),
               "kiln_sha256_ctx must be aligned for Nettle's context");

static struct sha256_ctx *ctx(kiln_sha256_ctx *c) { return (struct sha256_ctx *)c->opaque; }

void kiln_sha256_init(kiln_sha256_ctx *c) { sha256_init(ctx(c)); }

void kiln_sha256_update(kiln_sha256_ctx *c, const void *data, size_t len) {
  sha256_update(ctx(c), len, data);
}

void kiln_sha256_final(kiln_sha256_ctx *c, uint8_t digest[32]) {
  sha256_digest(ctx(c), SHA256_DIGEST_SIZE, digest);
}

void kiln_sha256(const void *data, size_t len, uint8_t digest[32]) {
  kiln_sha256_ctx c;
  kiln_sha256_init(&c);
  kiln_sha256_update(&c, data, len);
  kiln_sha256_final(&c, digest);
}

void kiln_sha256_hex(const uint8_t digest[32], char hex[65]) {
  static const char digits[] = "0123456789abcdef";
  for (int i = 0; i < 32; i++) {
    hex[2 * i] = digits[digest[i] >> 4];
    hex[2 * i + 1] = digits[digest[i] & 15];
  }
  hex[64] = '\0';
}

int kiln_sha256_file(const char *path, char hex[65]) {
  /* Regular files only: a device (`--from /dev/zero`) would be read for ever, and a FIFO with
   * no writer waited on (opened without blocking to find out). */
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return kiln_errorf(KILN_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return kiln_errorf(KILN_ERR_IO, "%s: not a regular file", path);
  }
  FILE *f = fdopen(fd, "rb");
  if (!f) {
    close(fd);
    return kiln_errorf(KILN_ERR_NOMEM, "%s: out of memory", path);
  }
  enum { CHUNK = 1 << 16 };
  uint8_t *buf = malloc(CHUNK);
  if (!buf) {
    fclose(f);
    return kiln_errorf(KILN_ERR_NOMEM, "%s: out of memory", path);
  }
  kiln_sha256_ctx c;
  kiln_sha256_init(&c);
  size_t got;
  while ((got = fread(buf, 1, CHUNK, f)) > 0) kiln_sha256_update(&c, buf, got);
  int failed = ferror(f);
  int saved = errno;
  free(buf);
  fclose(f);
  if (failed) return kiln_errorf(KILN_ERR_IO, "%s: read error: %s", path, strerror(saved));
  uint8_t digest[32];
  kiln_sha256_final(&c, digest);
  kiln_sha256_hex(digest, hex);
  return KILN_OK;
}
