/* LevelDB databases of Caffe Datum records (Caffe's default Data backend): the raw records that
 * kiln_datum_db (datum_db.c) decodes, and the writer behind `kiln convert idx --backend leveldb`.
 *
 * LevelDB has no read-only mode. Opening a database replays its log into a new table, writes a
 * new MANIFEST and log, deletes the files these supersede and holds an fcntl lock on LOCK for as
 * long as it is open, so a second process (another worker) cannot open the same database. kiln
 * therefore never opens the database's own directory: it makes a private view, a new directory
 * under P_tmpdir holding a symbolic link to each of the database's files but LOCK and LOG, and
 * opens that. LevelDB writes its new files, lock and log into the view and unlinks the links it
 * no longer needs; the database's files are only read (LevelDB never writes to a file it did not
 * create since it was opened). Every process and every layer has its own view, so any number may
 * read one database at once. Opening reads every record once (with the block checksums checked)
 * to count them and index their keys: LevelDB keeps no count. */
#include <dirent.h>
#include <errno.h>
#include <leveldb/c.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data/internal.h"
#include "kiln/data.h"

struct kiln_ldb {
  char *path; /* as given, for messages */
  char *view; /* the private directory LevelDB opens */
  leveldb_t *db;
  leveldb_options_t *options;
  leveldb_readoptions_t *read;
  leveldb_iterator_t *it[2]; /* KILN_LDB_SEQUENTIAL, KILN_LDB_RANDOM */
  uint64_t at[2];            /* the record each iterator stands on; UINT64_MAX: unknown */
  uint64_t size;
  size_t *key_off; /* size + 1 offsets into keys: record i's key is keys[key_off[i]..key_off[i+1]) */
  char *keys;
};

/* A LevelDB message names files of the view: put the database's path in its place. */
static int ldb_error(const kiln_ldb *d, const char *what, const char *err) {
  char msg[1024];
  size_t o = 0, vlen = d->view ? strlen(d->view) : 0;
  for (const char *s = err; *s && o + 1 < sizeof msg;) {
    if (vlen && !strncmp(s, d->view, vlen)) {
      o += (size_t)snprintf(msg + o, sizeof msg - o, "%s", d->path);
      if (o >= sizeof msg) o = sizeof msg - 1;
      s += vlen;
    } else {
      msg[o++] = *s++;
    }
  }
  msg[o] = '\0';
  int code = !strncmp(err, "IO error", 8) ? KILN_ERR_IO : KILN_ERR_DATA;
  return kiln_errorf(code, "%s: %s: %s", d->path, what, msg);
}

/* Unlinks every entry of a directory that kiln made, then the directory. */
static void remove_view(const char *dir) {
  DIR *dp = opendir(dir);
  if (dp) {
    const struct dirent *e;
    char p[PATH_MAX];
    while ((e = readdir(dp))) {
      if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
      if ((size_t)snprintf(p, sizeof p, "%s/%s", dir, e->d_name) < sizeof p) (void)unlink(p);
    }
    closedir(dp);
  }
  (void)rmdir(dir);
}

/* The private view of d->path (see the head of this file). */
static int make_view(kiln_ldb *d) {
  char real[PATH_MAX];
  if (!realpath(d->path, real))
    return kiln_errorf(KILN_ERR_IO, "%s: cannot open the LevelDB database: %s", d->path,
                       strerror(errno));
  char tmpl[] = P_tmpdir "/kiln-leveldb-XXXXXX";
  if (!mkdtemp(tmpl))
    return kiln_errorf(KILN_ERR_IO, "%s: cannot make a private view in %s: %s", d->path,
                       P_tmpdir, strerror(errno));
  if (!(d->view = kiln_strdup(tmpl))) {
    remove_view(tmpl);
    return kiln_errorf(KILN_ERR_NOMEM, "%s: out of memory", d->path);
  }
  DIR *dp = opendir(real);
  if (!dp)
    return kiln_errorf(KILN_ERR_IO, "%s: cannot list the LevelDB database: %s", d->path,
                       strerror(errno));
  int rc = KILN_OK;
  const struct dirent *e;
  while (!rc && (e = readdir(dp))) {
    const char *n = e->d_name;
    if (!strcmp(n, ".") || !strcmp(n, "..") || !strcmp(n, "LOCK") || !strncmp(n, "LOG", 3))
      continue;
    char from[PATH_MAX], to[PATH_MAX];
    if ((size_t)snprintf(from, sizeof from, "%s/%s", real, n) >= sizeof from ||
        (size_t)snprintf(to, sizeof to, "%s/%s", d->view, n) >= sizeof to)
      rc = kiln_errorf(KILN_ERR_IO, "%s/%s: path too long", d->path, n);
    else if (symlink(from, to) != 0)
      rc = kiln_errorf(KILN_ERR_IO, "%s: cannot link %s into the private view %s: %s", d->path,
                       n, d->view, strerror(errno));
  }
  closedir(dp);
  return rc;
}

void kiln_ldb_close(kiln_ldb *d) {
  if (!d) return;
  for (int i = 0; i < 2; i++)
    if (d->it[i]) leveldb_iter_destroy(d->it[i]);
  if (d->db) leveldb_close(d->db);
  if (d->read) leveldb_readoptions_destroy(d->read);
  if (d->options) leveldb_options_destroy(d->options);
  if (d->view) {
    remove_view(d->view);
    free(d->view);
  }
  free(d->key_off);
  free(d->keys);
  free(d->path);
  free(d);
}

/* One pass over the records in key order: the count and every key. */
static int index_keys(kiln_ldb *d) {
  leveldb_iterator_t *it = leveldb_create_iterator(d->db, d->read);
  size_t n = 0, cap = 1024, bytes = 0, bytes_cap = 1 << 16;
  d->key_off = malloc(cap * sizeof *d->key_off);
  d->keys = malloc(bytes_cap);
  int rc = d->key_off && d->keys ? KILN_OK : kiln_errorf(KILN_ERR_NOMEM, "%s: out of memory",
                                                         d->path);
  for (leveldb_iter_seek_to_first(it); !rc && leveldb_iter_valid(it); leveldb_iter_next(it)) {
    size_t kl;
    const char *k = leveldb_iter_key(it, &kl);
    if (n + 2 > cap) {
      size_t *grown = realloc(d->key_off, 2 * cap * sizeof *grown);
      if (!grown) break;
      d->key_off = grown, cap *= 2;
    }
    if (bytes + kl > bytes_cap) {
      while (bytes + kl > bytes_cap) bytes_cap *= 2;
      char *grown = realloc(d->keys, bytes_cap);
      if (!grown) break;
      d->keys = grown;
    }
    d->key_off[n++] = bytes;
    memcpy(d->keys + bytes, k, kl);
    bytes += kl;
  }
  if (!rc && leveldb_iter_valid(it))
    rc = kiln_errorf(KILN_ERR_NOMEM, "%s: out of memory for the key index", d->path);
  char *err = NULL;
  leveldb_iter_get_error(it, &err);
  leveldb_iter_destroy(it);
  if (!rc && err) {
    /* LevelDB's iterator passes over a block it cannot read and keeps the error for the end,
     * so which records were lost is not known */
    char what[128];
    snprintf(what, sizeof what, "cannot read every record (%zu read)", n);
    rc = ldb_error(d, what, err);
  }
  leveldb_free(err);
  if (rc) return rc;
  if (n == 0) return kiln_errorf(KILN_ERR_DATA, "%s: the database holds no records", d->path);
  d->key_off[n] = bytes;
  d->size = n;
  return KILN_OK;
}

int kiln_ldb_open(const char *path, kiln_ldb **out, uint64_t *size) {
  *out = NULL;
  kiln_ldb *d = calloc(1, sizeof *d);
  if (!d || !(d->path = kiln_strdup(path))) {
    free(d);
    return kiln_errorf(KILN_ERR_NOMEM, "%s: out of memory", path);
  }
  d->at[0] = d->at[1] = UINT64_MAX;
  int rc = make_view(d);
  if (rc) goto fail;
  d->options = leveldb_options_create();
  leveldb_options_set_create_if_missing(d->options, 0);
  leveldb_options_set_paranoid_checks(d->options, 1);
  d->read = leveldb_readoptions_create();
  leveldb_readoptions_set_verify_checksums(d->read, 1);
  leveldb_readoptions_set_fill_cache(d->read, 0);
  char *err = NULL;
  d->db = leveldb_open(d->options, d->view, &err);
  if (err) {
    rc = ldb_error(d, "not a readable LevelDB database", err);
    leveldb_free(err);
    d->db = NULL;
    goto fail;
  }
  if ((rc = index_keys(d))) goto fail;
  *size = d->size;
  *out = d;
  return KILN_OK;
fail:
  kiln_ldb_close(d);
  return rc;
}

int kiln_ldb_record(kiln_ldb *d, int which, uint64_t index, kiln_ldb_rec *r) {
  const char *want = d->keys + d->key_off[index];
  const size_t want_len = d->key_off[index + 1] - d->key_off[index];
  if (!d->it[which]) d->it[which] = leveldb_create_iterator(d->db, d->read);
  leveldb_iterator_t *it = d->it[which];
  if (d->at[which] != index) {
    if (d->at[which] != UINT64_MAX && d->at[which] + 1 == index)
      leveldb_iter_next(it);
    else
      leveldb_iter_seek(it, want, want_len);
    d->at[which] = index;
  }
  size_t kl = 0;
  const char *k = leveldb_iter_valid(it) ? leveldb_iter_key(it, &kl) : NULL;
  if (!k || kl != want_len || memcmp(k, want, kl)) {
    d->at[which] = UINT64_MAX;
    char key[160], what[256];
    kiln_data_key_string(want, want_len, key, sizeof key);
    char *err = NULL;
    leveldb_iter_get_error(it, &err);
    if (!err) return kiln_errorf(KILN_ERR_DATA, "%s: record %s is gone", d->path, key);
    snprintf(what, sizeof what, "record %s", key);
    int rc = ldb_error(d, what, err);
    leveldb_free(err);
    return rc;
  }
  r->key = k;
  r->key_len = kl;
  r->value = leveldb_iter_value(it, &r->value_len);
  return KILN_OK;
}

/* ---- writer ------------------------------------------------------------------------------ */

#define LDB_BATCH_RECORDS 1000

struct kiln_ldb_writer {
  char *path;
  leveldb_t *db;
  leveldb_options_t *options;
  leveldb_writeoptions_t *write;
  leveldb_writebatch_t *batch;
  size_t pending;
};

static int writer_error(const kiln_ldb_writer *w, const char *what, char *err) {
  int rc = kiln_errorf(!strncmp(err, "IO error", 8) ? KILN_ERR_IO : KILN_ERR_INTERNAL,
                       "%s: %s: %s", w->path, what, err);
  leveldb_free(err);
  return rc;
}

static void writer_free(kiln_ldb_writer *w) {
  if (w->db) leveldb_close(w->db);
  if (w->batch) leveldb_writebatch_destroy(w->batch);
  if (w->write) leveldb_writeoptions_destroy(w->write);
  if (w->options) leveldb_options_destroy(w->options);
  free(w->path);
  free(w);
}

int kiln_ldb_destroy(const char *path) {
  leveldb_options_t *o = leveldb_options_create();
  char *err = NULL;
  leveldb_destroy_db(o, path, &err);
  leveldb_options_destroy(o);
  int rc = KILN_OK;
  if (err) rc = kiln_errorf(KILN_ERR_IO, "%s: cannot remove: %s", path, err);
  leveldb_free(err);
  return rc;
}

int kiln_ldb_writer_open(const char *path, kiln_ldb_writer **out) {
  *out = NULL;
  kiln_ldb_writer *w = calloc(1, sizeof *w);
  if (!w || !(w->path = kiln_strdup(path))) {
    free(w);
    return kiln_errorf(KILN_ERR_NOMEM, "%s: out of memory", path);
  }
  w->options = leveldb_options_create();
  leveldb_options_set_create_if_missing(w->options, 1);
  leveldb_options_set_error_if_exists(w->options, 1);
  leveldb_options_set_write_buffer_size(w->options, (size_t)64 << 20);
  w->write = leveldb_writeoptions_create();
  w->batch = leveldb_writebatch_create();
  char *err = NULL;
  w->db = leveldb_open(w->options, path, &err);
  if (err) {
    w->db = NULL;
    int rc = writer_error(w, "cannot create the LevelDB database", err);
    writer_free(w);
    return rc;
  }
  *out = w;
  return KILN_OK;
}

static int writer_flush(kiln_ldb_writer *w) {
  if (!w->pending) return KILN_OK;
  char *err = NULL;
  leveldb_write(w->db, w->write, w->batch, &err);
  if (err) return writer_error(w, "cannot write records", err);
  leveldb_writebatch_clear(w->batch);
  w->pending = 0;
  return KILN_OK;
}

int kiln_ldb_writer_put(kiln_ldb_writer *w, const void *key, size_t key_len, const void *value,
                        size_t value_len) {
  leveldb_writebatch_put(w->batch, key, key_len, value, value_len);
  return ++w->pending >= LDB_BATCH_RECORDS ? writer_flush(w) : KILN_OK;
}

int kiln_ldb_writer_finish(kiln_ldb_writer *w) {
  int rc = writer_flush(w);
  if (!rc) {
    /* every record into sorted tables, so that a reader's open has no log to replay */
    leveldb_compact_range(w->db, NULL, 0, NULL, 0);
    leveldb_close(w->db);
    w->db = NULL;
  }
  writer_free(w);
  return rc;
}

void kiln_ldb_writer_discard(kiln_ldb_writer *w) {
  if (!w) return;
  char *path = kiln_strdup(w->path);
  writer_free(w);
  if (path) (void)kiln_ldb_destroy(path);
  free(path);
}
