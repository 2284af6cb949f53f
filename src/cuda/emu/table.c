/* The "cudaemu" backend: the CUDA backend's kernels (src/cuda/<family>.cu) built as C and run on the
 * hostsim device, each op between the device's enter and leave as hostsim's own are
 * (src/ops/backend.c). An op the CUDA files do not have stays NULL here, as it is on the GPU, so
 * that a layer needing it is refused by name on both. */
#include <pthread.h>

#include "cuda/emu/emu.h"

static kiln_backend raw; /* the kernels as registered */

#define EMU_WRAP_(name, params, args)      \
  static int emu_##name params {           \
    kiln_device_enter(c->device);          \
    int rc = raw.name args;                \
    kiln_cudaemu_op_done();                \
    kiln_device_leave(c->device);          \
    return rc;                             \
  }
KILN_OP_LIST(EMU_WRAP_)
#undef EMU_WRAP_

static kiln_backend emu;
static pthread_once_t emu_once = PTHREAD_ONCE_INIT;

static void make_emu(void) {
#define REGISTER_(family) kiln_cudaemu_register_##family(&raw);
  KCUDA_FAMILIES(REGISTER_)
#undef REGISTER_
  emu.name = "cudaemu";
  emu.device = kiln_device_hostsim();
#define ENTRY_(name, params, args) emu.name = raw.name ? emu_##name : NULL;
  KILN_OP_LIST(ENTRY_)
#undef ENTRY_
}

const kiln_backend *kiln_backend_cudaemu(void) {
  pthread_once(&emu_once, make_emu);
  return &emu;
}
