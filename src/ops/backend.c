/* The backend tables (include/kiln/backend.h): ref from every op's reference kernel, cpu from
 * ref with its faster kernels in their place, hostsim as cpu's kernels run between the hostsim
 * device's enter and leave. */
#include <pthread.h>
#include <stddef.h>

#include "ops/kernels.h"

#define REF_ENTRY_(name, params, args) .name = kiln_ref_##name,
static const kiln_backend ref = {
    .name = "ref", .device = NULL, /* the host */
    KILN_OP_LIST(REF_ENTRY_)};
#undef REF_ENTRY_

static kiln_backend cpu;
static pthread_once_t cpu_once = PTHREAD_ONCE_INIT;

static void make_cpu(void) {
  cpu = ref;
  cpu.name = "cpu";
  cpu.gemm = kiln_cpu_gemm;
  cpu.conv_route_update = kiln_cpu_conv_route_update;
  cpu.packed_gemm_update = kiln_cpu_packed_gemm_update;
  cpu.gemm_rows = kiln_cpu_gemm_rows;
}

/* cpu-bf16: cpu's table with the products in bf16 (src/ops/bf16.c). */
static kiln_backend cpu_bf16;
static pthread_once_t bf16_once = PTHREAD_ONCE_INIT;

static void make_bf16(void) {
  cpu_bf16 = *kiln_backend_cpu();
  cpu_bf16.name = "cpu-bf16";
  cpu_bf16.gemm = kiln_bf16_gemm;
  cpu_bf16.gemm_rows = kiln_bf16_gemm_rows;
  cpu_bf16.packed_gemm_update = kiln_bf16_packed_gemm_update;
  cpu_bf16.conv_route_update = kiln_bf16_conv_route_update;
  cpu_bf16.attention_fwd = kiln_bf16_attention_fwd;
  cpu_bf16.attention_bwd = kiln_bf16_attention_bwd;
}

/* hostsim: every op is cpu's, with the device's walls opened for the call. */
#define SIM_WRAP_(name, params, args)                                 \
  static int sim_##name params {                                      \
    const kiln_backend *kiln_cpu_ = kiln_backend_cpu();               \
    kiln_device_enter(c->device);                                      \
    int rc = kiln_cpu_->name args;                                     \
    kiln_device_leave(c->device);                                      \
    return rc;                                                         \
  }
KILN_OP_LIST(SIM_WRAP_)
#undef SIM_WRAP_

#define SIM_ENTRY_(name, params, args) .name = sim_##name,
static const kiln_backend hostsim = {
    .name = "hostsim", .device = NULL, /* set by kiln_backend_hostsim: not a constant */
    KILN_OP_LIST(SIM_ENTRY_)};
#undef SIM_ENTRY_

static kiln_backend sim;
static pthread_once_t sim_once = PTHREAD_ONCE_INIT;
static void make_sim(void) {
  sim = hostsim;
  sim.device = kiln_device_hostsim();
}

const kiln_backend *kiln_backend_ref(void) { return &ref; }

const kiln_backend *kiln_backend_cpu(void) {
  pthread_once(&cpu_once, make_cpu);
  return &cpu;
}

const kiln_backend *kiln_backend_cpu_bf16(void) {
  pthread_once(&bf16_once, make_bf16);
  return &cpu_bf16;
}

const kiln_backend *kiln_backend_hostsim(void) {
  pthread_once(&sim_once, make_sim);
  return &sim;
}

const kiln_backend *kiln_backend_for(const kiln_device *d, kiln_engine e) {
  if (kiln_device_is_host(d)) return e == KILN_ENGINE_REF ? kiln_backend_ref() : kiln_backend_cpu();
  if (d->kind == KILN_DEVICE_HOSTSIM)
    return e == KILN_ENGINE_CUDA ? kiln_backend_cudaemu() : kiln_backend_hostsim();
  if (d->kind == KILN_DEVICE_CUDA) return kiln_backend_cuda(d->index);
  return NULL;
}

int kiln_backend_choose(const kiln_config *cfg, const kiln_device *d, const kiln_backend **out) {
  *out = NULL;
  if (cfg->precision != KILN_PRECISION_BF16) {
    if (!(*out = kiln_backend_for(d, cfg->engine)))
      return kiln_errorf(KILN_ERR_UNSUPPORTED, "no backend for device %s", d ? d->name : "(none)");
    return KILN_OK;
  }
  if (!kiln_device_is_host(d))
    return kiln_errorf(KILN_ERR_UNSUPPORTED,
                       "precision BF16 runs on the CPU (device host), not on %s; there, train in "
                       "fp32", d ? d->name : "a missing device");
  if (cfg->engine == KILN_ENGINE_REF)
    return kiln_errorf(KILN_ERR_UNSUPPORTED,
                       "precision BF16 runs on the cpu engine's kernels; KILN_ENGINE=ref is fp32 "
                       "alone");
  KILN_TRY(kiln_bf16_check());
  kiln_bf16_rate_note();
  *out = kiln_backend_cpu_bf16();
  return KILN_OK;
}

const kiln_device *kiln_config_device(const kiln_config *c) {
  switch (c->device) {
    case KILN_DEVICE_HOSTSIM: return kiln_device_hostsim();
    case KILN_DEVICE_CUDA: {
      const int n = kiln_cuda_device_count();
      if (c->device_index >= 0 || n == 0) return kiln_device_cuda(c->device_index);
      return kiln_device_cuda((c->local_rank > 0 ? c->local_rank : 0) % n);
    }
    default: return kiln_device_host();
  }
}

#define OP_NAME_(name, params, args) #name,
static const char *const op_names[] = {KILN_OP_LIST(OP_NAME_)};
#undef OP_NAME_

#define OP_OFFSET_(name, params, args) offsetof(kiln_backend, name),
static const size_t op_offsets[] = {KILN_OP_LIST(OP_OFFSET_)};
#undef OP_OFFSET_

const char *kiln_op_name(int op) { return op >= 0 && op < KILN_OP_COUNT ? op_names[op] : NULL; }

bool kiln_backend_has(const kiln_backend *b, int op) {
  if (!b || op < 0 || op >= KILN_OP_COUNT) return false;
  void *const *slot = (void *const *)((const char *)b + op_offsets[op]);
  return *slot != NULL;
}

/* The blocked layout is the oneDNN route's (src/ops/conv_dnnl.c): 16 channels a block. */
int kiln_layout_for_block(int channels) {
  return channels == 16 ? KILN_LAYOUT_BLOCKED16 : KILN_LAYOUT_PLAIN;
}
