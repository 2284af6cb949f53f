/* SHA-256 of buffers and files. */
#ifndef KILN_SHA256_H
#define KILN_SHA256_H

#include <stddef.h>
#include <stdint.h>

/* Computed by Nettle (src/core/sha256.c); the context is its state, kept opaque here. */
/* (C++ spells the alignment differently: the CUDA kernels' files include these headers) */
#ifdef __cplusplus
#define KILN_ALIGNAS_(n) alignas(n)
#else
#define KILN_ALIGNAS_(n) _Alignas(n)
#endif
typedef struct kiln_sha256_ctx {
  KILN_ALIGNAS_(8) unsigned char opaque[128];
} kiln_sha256_ctx;

void kiln_sha256_init(kiln_sha256_ctx *c);
void kiln_sha256_update(kiln_sha256_ctx *c, const void *data, size_t len);
void kiln_sha256_final(kiln_sha256_ctx *c, uint8_t digest[32]);
void kiln_sha256(const void *data, size_t len, uint8_t digest[32]);
/* Lowercase hex of a digest; `hex` receives 64 characters and a NUL. */
void kiln_sha256_hex(const uint8_t digest[32], char hex[65]);
/* Hashes a file's bytes as stored (streaming). */
int kiln_sha256_file(const char *path, char hex[65]);

#endif
