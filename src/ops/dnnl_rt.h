/* The process's oneDNN engine and stream, shared by every oneDNN route (convolution, GEMM).
 * Private to src/ops. */
#ifndef KILN_OPS_DNNL_RT_H
#define KILN_OPS_DNNL_RT_H
#ifdef KILN_HAVE_DNNL
#include <oneapi/dnnl/dnnl.h>

/* One CPU engine and one in-order stream for the process, made on the first call (oneDNN's
 * handles, not kiln state: kiln's threading contract has one compute thread). Returns
 * dnnl_success with both set, or the status that made them fail, on this and every later call. */
dnnl_status_t kiln_dnnl_runtime(dnnl_engine_t *engine, dnnl_stream_t *stream);

#endif
#endif
