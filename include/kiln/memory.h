/* Host memory: aligned and huge-page allocations, and strings. */
#ifndef KILN_MEMORY_H
#define KILN_MEMORY_H

#include <stddef.h>

void *kiln_alloc(size_t bytes);       /* 64-byte aligned, zeroed; NULL on failure */
/* As kiln_alloc, but from 1 MiB up in whole 2 MiB pages the kernel is asked to back with
 * transparent huge pages (madvise): for the flat parameter, gradient and history buffers, which
 * every step streams through and which MPI's single-copy transfers pin page by page. */
void *kiln_alloc_huge(size_t bytes);
void kiln_free(void *p);
char *kiln_strdup(const char *s);

#endif
