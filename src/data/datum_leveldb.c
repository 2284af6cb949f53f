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
 * to count them and index their keys: LevelDB keeps no count.
 *
 * A view is named kiln-leveldb-PID-XXXXXX and removed on close; one that a killed process left
 * (its process gone, its LOCK held by none) is removed by the next open. Before a file is linked
 * into a view it must be a regular file (LevelDB waits for ever on a FIFO and spins on a link to
 * /dev/zero), and a log or MANIFEST must end where a record ends (LevelDB drops a last record
 * cut short without a word, paranoid_checks or not). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <leveldb/c.h>
#include <limits.h>
#include <signal.h>
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

/* Whether a process holds LevelDB's lock on the view's LOCK (an open database). */
static bool view_locked(const char *view) {
  char p[PATH_MAX];
  if ((size_t)snprintf(p, sizeof p, "%s/LOCK", view) >= sizeof p) return true;
  int fd = open(p, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return errno != ENOENT;
  struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET};
  bool held = fcntl(fd, F_GETLK, &fl) != 0 || fl.l_type != F_UNLCK;
  close(fd);
  return held;
}

/* The views that killed processes left (kiln_ldb_close never ran for them):
 * P_tmpdir/kiln-leveldb-PID-XXXXXX whose process no longer runs and whose LOCK no process holds
 * (a process of another PID namespace may share the folder). */
static void remove_stale_views(void) {
  DIR *dp = opendir(P_tmpdir);
  if (!dp) return;
  const struct dirent *e;
  while ((e = readdir(dp))) {
    long pid = 0;
    int used = 0;
    if (sscanf(e->d_name, "kiln-leveldb-%ld-%n", &pid, &used) != 1 || !used || pid <= 0 ||
        pid > INT_MAX || pid == (long)getpid())
      continue;
    if (kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue; /* alive, or not ours to judge */
    char p[PATH_MAX];
    if ((size_t)snprintf(p, sizeof p, "%s/%s", P_tmpdir, e->d_name) >= sizeof p) continue;
    struct stat st;
    if (lstat(p, &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != geteuid() || view_locked(p))
      continue;
    remove_view(p);
  }
  closedir(dp);
}

/* LevelDB's log (and its MANIFEST, written in the same format): 32 KiB blocks of records, each a
 * 7-byte header (checksum, 2-byte length, type) and its bytes; a record too short for a header
 * is never written, the block's rest is zeros. LevelDB's reader takes a file that ends inside a
 * record, or inside its header, for the writer's last write cut short and drops it without a
 * word, even with paranoid_checks (a MANIFEST cut so loses the tables of its last edit); kiln
 * refuses such a file (docs/formats.md). The checksums LevelDB checks itself. */
enum { LOG_BLOCK = 32768, LOG_HEADER = 7 };

/* `name` says which file in messages ("log 000004.log", "MANIFEST-000002"). */
static int check_log(const kiln_ldb *d, const char *file, const char *name) {
  FILE *f = fopen(file, "rb");
  if (!f)
    return kiln_errorf(KILN_ERR_IO, "%s: cannot read %s: %s", d->path, name,
                       strerror(errno));
  unsigned char *b = malloc(LOG_BLOCK);
  if (!b) {
    fclose(f);
    return kiln_errorf(KILN_ERR_NOMEM, "%s: out of memory", d->path);
  }
  int rc = KILN_OK;
  bool inside = false; /* between a FIRST fragment and its LAST */
  uint64_t at = 0;     /* the block's offset in the file */
  for (size_t got = LOG_BLOCK; !rc && got == LOG_BLOCK; at += got) {
    got = fread(b, 1, LOG_BLOCK, f);
    if (ferror(f)) {
      rc = kiln_errorf(KILN_ERR_IO, "%s: cannot read %s", d->path, name);
      break;
    }
    for (size_t i = 0; !rc && i < got;) {
      const uint64_t where = at + i;
      const size_t left = got - i;
      const unsigned len = left >= LOG_HEADER ? b[i + 4] | (unsigned)b[i + 5] << 8 : 0;
      const int type = left >= LOG_HEADER ? b[i + 6] : 0;
      if (left < LOG_HEADER || (type == 0 && len == 0)) { /* a trailer, or preallocated space */
        bool zeros = true;
        for (size_t k = i; zeros && k < got; k++) zeros = b[k] == 0;
        if (zeros) break;
        rc = left < LOG_HEADER && got < LOG_BLOCK
                 ? kiln_errorf(KILN_ERR_DATA, "%s: %s ends inside a record's header, at byte "
                               "%llu (a write cut short, or damage); LevelDB would drop it "
                               "unsaid", d->path, name, (unsigned long long)where)
                 : kiln_errorf(KILN_ERR_DATA, "%s: %s: bytes that are no record at byte %llu, "
                               "where a block's padding of zeros belongs (damage)", d->path, name,
                               (unsigned long long)where);
        break;
      }
      if (LOG_HEADER + len > left) {
        rc = got < LOG_BLOCK
                 ? kiln_errorf(KILN_ERR_DATA, "%s: %s: the record at byte %llu claims %u "
                               "bytes, but only %zu follow its header before the file ends (a "
                               "write cut short, or damage); LevelDB would drop it unsaid",
                               d->path, name, (unsigned long long)where, len, left - LOG_HEADER)
                 : kiln_errorf(KILN_ERR_DATA, "%s: %s: the record at byte %llu claims %u "
                               "bytes, past the end of its 32 KiB block (damage)",
                               d->path, name, (unsigned long long)where, len);
      } else if (type < 1 || type > 4 || (type <= 2 && inside) || (type >= 3 && !inside)) {
        rc = kiln_errorf(KILN_ERR_DATA, "%s: %s: the record at byte %llu is of type %d%s "
                         "(damage)", d->path, name, (unsigned long long)where, type,
                         type < 1 || type > 4 ? ", which LevelDB does not write"
                         : inside             ? " inside a record cut in fragments"
                                              : ", a fragment with no first one");
      }
      if (type == 2) inside = true;
      if (type == 4) inside = false;
      i += LOG_HEADER + len;
    }
  }
  if (!rc && inside)
    rc = kiln_errorf(KILN_ERR_DATA, "%s: %s ends inside a record cut in fragments (its last "
                     "fragment is missing: a write cut short, or damage); LevelDB would drop it "
                     "unsaid", d->path, name);
  free(b);
  fclose(f);
  return rc;
}

/* What a directory entry of the database is, for a message ("a FIFO", "a link to a device"). */
static const char *entry_kind(const char *path, const struct stat *st) {
  struct stat l;
  const bool link = lstat(path, &l) == 0 && S_ISLNK(l.st_mode);
  if (S_ISDIR(st->st_mode)) return link ? "a link to a folder" : "a folder";
  if (S_ISFIFO(st->st_mode)) return link ? "a link to a FIFO" : "a FIFO";
  if (S_ISCHR(st->st_mode) || S_ISBLK(st->st_mode)) return link ? "a link to a device" : "a device";
  if (S_ISSOCK(st->st_mode)) return link ? "a link to a socket" : "a socket";
  return "not a regular file";
}

/* The private view of d->path (see the head of this file). Every file LevelDB would read is
 * checked first: a regular file (LevelDB waits for ever on a FIFO's open, spins on a link to
 * /dev/zero), and each log and MANIFEST whole to its end (check_log). */
static int make_view(kiln_ldb *d) {
  char real[PATH_MAX];
  if (!realpath(d->path, real))
    return kiln_errorf(KILN_ERR_IO, "%s: cannot open the LevelDB database: %s", d->path,
                       strerror(errno));
  remove_stale_views();
  char tmpl[sizeof P_tmpdir + 48];
  snprintf(tmpl, sizeof tmpl, "%s/kiln-leveldb-%ld-XXXXXX", P_tmpdir, (long)getpid());
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
    struct stat st;
    const size_t nlen = strlen(n);
    if ((size_t)snprintf(from, sizeof from, "%s/%s", real, n) >= sizeof from ||
        (size_t)snprintf(to, sizeof to, "%s/%s", d->view, n) >= sizeof to)
      rc = kiln_errorf(KILN_ERR_IO, "%s/%s: path too long", d->path, n);
    else if (stat(from, &st) != 0)
      rc = kiln_errorf(KILN_ERR_IO, "%s: cannot read %s: %s", d->path, n, strerror(errno));
    else if (!S_ISREG(st.st_mode))
      rc = kiln_errorf(KILN_ERR_DATA, "%s: %s is %s: a LevelDB database holds regular files "
                       "only (CURRENT, MANIFEST, its log and tables; LevelDB would wait on a FIFO, "
                       "or read a device, for ever)", d->path, n, entry_kind(from, &st));
    if (!rc && nlen > 4 && !strcmp(n + nlen - 4, ".log")) {
      char what[300];
      snprintf(what, sizeof what, "log %s", n);
      rc = check_log(d, from, what);
    } else if (!rc && !strncmp(n, "MANIFEST-", 9)) {
      rc = check_log(d, from, n); /* written in the log's format */
    }
    if (!rc && symlink(from, to) != 0)
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
