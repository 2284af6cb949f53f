/* The emulation's side of src/cuda/kcuda.h: launches run as they are called, so they cannot fail
 * later; an op's scratch is host memory (its kernels run with hostsim's walls open) that lives
 * until the op returns, when the table's wrapper (src/cuda/emu/table.c) frees it, so that a
 * kernel that keeps a pointer to scratch past its op shows under the sanitizers. */
#define KCUDA_EMU
#include <stdlib.h>

#include "cuda/emu/emu.h"
#include "cuda/kcuda.h"

/* This thread's op's buffers (an op may run on any thread; ops do not nest). */
static _Thread_local void *scratch_[2];

int kcuda_launched(const kiln_op_ctx *c, const char *op) {
  (void)c;
  (void)op;
  return KILN_OK;
}

static int grab(int which, size_t bytes, void **out) {
  free(scratch_[which]);
  scratch_[which] = malloc(bytes ? bytes : 1);
  *out = scratch_[which];
  return *out ? KILN_OK : kiln_errorf(KILN_ERR_NOMEM, "cudaemu: out of memory for %zu bytes", bytes);
}

int kcuda_scratch(const kiln_op_ctx *c, size_t bytes, void **out) {
  (void)c;
  return grab(0, bytes, out);
}

int kcuda_host_scratch(const kiln_op_ctx *c, size_t bytes, void **out) {
  (void)c;
  return grab(1, bytes, out);
}

void kiln_cudaemu_op_done(void) {
  for (int i = 0; i < 2; i++) {
    free(scratch_[i]);
    scratch_[i] = NULL;
  }
}
