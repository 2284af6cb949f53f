/* What the kiln command calls of the Python runtime (python/src/pylayer.c), without Python's
 * headers. */
#ifndef KILNPY_EMBED_H
#define KILNPY_EMBED_H

/* Registers the Python layer type; the interpreter starts with the first net that has one. */
int kilnpy_register_embedded(void);
/* Ends that interpreter (flushing what layers printed), if it started. */
void kilnpy_finalize_embedded(void);

#endif
