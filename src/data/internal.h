/* Helpers shared by the files of src/data/ and not part of the public API. */
#ifndef KILN_DATA_INTERNAL_H
#define KILN_DATA_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kiln/data.h"
#include "kiln/proto.h"

/* Removes an LMDB directory that kiln wrote (data.mdb, lock.mdb, then the directory itself).
 * Returns 0 or an errno value; a missing directory counts as success. Anything else inside makes
 * rmdir fail, so a directory that is not ours is never emptied. */
int kiln_data_remove_lmdb_dir(const char *dir);

/* Takes the lock file of a cache entry (created if missing), waiting for another fetch of the
 * same entry to finish; *fd holds it until closed. */
int kiln_data_lock_entry(const char *lock, int *fd);


/* Writes n images of channels x height x width bytes (record after record in `pixels`) with
 * their labels as a new LMDB or LevelDB (`backend`) of Datum records at out_path, keyed by the
 * index in `key_digits` zero-padded digits, as Caffe's converters key them. Nothing is left at out_path on failure;
 * messages name `source`. */
int kiln_data_write_images(const char *out_path, kiln_db_backend backend, const char *source,
                           uint32_t n, int key_digits, int channels, int height, int width,
                           const uint8_t *pixels, const uint8_t *labels);

/* A key as text for messages: itself when printable, else hex, cut short when long
 * (src/data/datum_db.c). */
const char *kiln_data_key_string(const void *key, size_t len, char *buf, size_t n);

/* LevelDB databases of Datum records, the raw records behind kiln_datum_db
 * (src/data/datum_leveldb.c). Opening reads the path through a private view, counts the records
 * and indexes their keys; kiln_ldb_record positions iterator `which` (KILN_LDB_SEQUENTIAL, which
 * steps forward cheaply, or KILN_LDB_RANDOM) on record `index` (< size) in key order, the
 * record's bytes being valid until that iterator's next move. Errors name the path and the key. */
typedef struct kiln_ldb kiln_ldb;
typedef struct kiln_ldb_rec {
  const void *key, *value;
  size_t key_len, value_len;
} kiln_ldb_rec;
enum { KILN_LDB_SEQUENTIAL = 0, KILN_LDB_RANDOM = 1 };
int kiln_ldb_open(const char *path, kiln_ldb **out, uint64_t *size);
int kiln_ldb_record(kiln_ldb *d, int which, uint64_t index, kiln_ldb_rec *r);
void kiln_ldb_close(kiln_ldb *d);

/* A new LevelDB at `path` (which must not exist), filled in batches; finish compacts it into
 * sorted tables and closes it, discard removes it. Both free `w`. */
typedef struct kiln_ldb_writer kiln_ldb_writer;
int kiln_ldb_writer_open(const char *path, kiln_ldb_writer **out);
int kiln_ldb_writer_put(kiln_ldb_writer *w, const void *key, size_t key_len, const void *value,
                        size_t value_len);
int kiln_ldb_writer_finish(kiln_ldb_writer *w);
void kiln_ldb_writer_discard(kiln_ldb_writer *w);
/* Removes a LevelDB directory (LevelDB's files, then the directory); a missing one is fine. */
int kiln_ldb_destroy(const char *path);

/* AnnotatedDatum records, kiln_datum_db's annotated mode (src/data/annotated_db.c). The state
 * keeps the boxes of the last record unpacked. kiln_anno_unpack unpacks an AnnotatedDatum from
 * v[0 .. n) and checks its annotations (errors name `path` and `key`): on success *msg is the
 * message (the caller frees it) and *datum its Datum, and the state holds its boxes. */
typedef struct kiln_anno_records kiln_anno_records;
int kiln_anno_unpack(kiln_anno_records *a, const char *path, const char *key, const void *v,
                     size_t n, ProtobufCMessage **msg, const Caffe__Datum **datum);
void kiln_anno_records_free(kiln_anno_records *a);
/* A db's annotated state (src/data/datum_db.c): NULL in plain mode; set once after opening, and
 * freed with the db. */
kiln_anno_records *kiln_datum_db_anno(const kiln_datum_db *db);
void kiln_datum_db_set_anno(kiln_datum_db *db, kiln_anno_records *a);
/* Puts a record of any message type (its packed bytes) under `key` (src/data/datum_db.c). */
int kiln_datum_writer_put_message(kiln_datum_writer *w, const char *key,
                                  const ProtobufCMessage *m);

/* Decodes an escaped line in place (\\ \t \n \r; with `vocab`, also \s for a space and \0):
 * the decoded length, or -1 at a bad escape (src/data/text_records.c). */
long kiln_text_unescape(char *s, size_t n, bool vocab);

/* The tokenizer's units (src/data/vocab.c), for code that must cut text as it does: the code
 * point at s (n > 0 bytes left) and its length in bytes, an invalid sequence being one byte with
 * the code point -1; and the white space that separates words. */
int kiln_utf8_next(const unsigned char *s, size_t n, int32_t *cp);
bool kiln_text_is_space(int32_t cp);

/* The HDF5 data readers in this process (src/data/h5data.c), which kiln_h5data_inspect and
 * kiln_h5data_load run in a worker process (src/data/h5data_server.c). The loader takes dst
 * buffers of room[i] values, or, with dst NULL, allocates into own[] what the file needs (at
 * most room[i] values each). */
int kiln_h5data_inspect_here(const char *path, int n, const char *const *names, uint64_t limit,
                             kiln_h5data_shape *shapes, uint64_t *bytes);
int kiln_h5data_load_here(const char *path, int n, const char *const *names, uint64_t limit,
                          kiln_h5data_shape *shapes, float *const *dst, const uint64_t *room,
                          float **own);

#endif
