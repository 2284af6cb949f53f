/* What the operating system reports about this process and machine (memory, run-queue delay),
 * and the clock. */
#ifndef KILN_SYSTEM_H
#define KILN_SYSTEM_H

#include <stdint.h>

/* Peak resident set size of this process in MiB (VmHWM). */
double kiln_peak_rss_mb(void);
/* How long the calling thread has been runnable but waiting for a CPU since it started (the
 * kernel's run-queue delay, /proc/thread-self/schedstat), in ms: time other threads and
 * processes held the cores it wanted. NaN where the kernel does not report it. */
double kiln_thread_cpu_wait_ms(void);
/* Memory the OS reports as available (MemAvailable), in bytes; 0 if unknown. */
uint64_t kiln_mem_available(void);
double kiln_now_ms(void); /* monotonic clock */
void kiln_sleep_ms(double ms); /* sleeps (through signals) */

#endif
