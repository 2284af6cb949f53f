/* The process's oneDNN engine and stream (see dnnl_rt.h). */
#include "dnnl_rt.h"

#ifdef KILN_HAVE_DNNL
#include <pthread.h>

static dnnl_engine_t g_engine;
static dnnl_stream_t g_stream;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static dnnl_status_t g_status = dnnl_runtime_error;

static void runtime_once(void) {
  g_status = dnnl_engine_create(&g_engine, dnnl_cpu, 0);
  if (g_status == dnnl_success)
    g_status = dnnl_stream_create(&g_stream, g_engine, dnnl_stream_default_flags);
}

dnnl_status_t kiln_dnnl_runtime(dnnl_engine_t *engine, dnnl_stream_t *stream) {
  pthread_once(&g_once, runtime_once);
  *engine = g_engine;
  *stream = g_stream;
  return g_status;
}
#endif
