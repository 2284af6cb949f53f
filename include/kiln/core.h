/* kiln core: what every module uses, one header per concern, included together here. */
#ifndef KILN_CORE_H
#define KILN_CORE_H

#include "kiln/status.h"  /* status codes, error messages, logging */
#include "kiln/memory.h"  /* aligned and huge-page allocation */
#include "kiln/files.h"   /* files, folders, pipes, child readers */
#include "kiln/system.h"  /* the OS's figures about this process, the clock */
#include "kiln/blob.h"    /* blobs and sparse matrices */
#include "kiln/rng.h"     /* the seeded random generator */
#include "kiln/strbuf.h"  /* a growing string */
#include "kiln/sha256.h"  /* SHA-256 */
#include "kiln/threads.h" /* the kernels' threads */
#include "kiln/fault.h"   /* fault injection */

#endif
