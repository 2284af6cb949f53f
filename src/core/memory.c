/* Aligned allocation, whole-file reads, atomic writes (temporary name then rename), mkdir -p, a
 * growing string, and the process memory figures the net uses to refuse what would not fit. */
#include <errno.h>
#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kiln/core.h"

void *kiln_alloc(size_t bytes) {
  if (bytes == 0) bytes = 64;
  size_t rounded = (bytes + 63) & ~(size_t)63;
  void *p = aligned_alloc(64, rounded);
  if (p) memset(p, 0, rounded);
  return p;
}

void kiln_free(void *p) { free(p); }

enum { HUGE_PAGE = 2 << 20, HUGE_FROM = 1 << 20 };

/* Rounding up to whole huge pages costs less than 2 MiB a buffer, and never more than the
 * buffer's own size (buffers under 1 MiB are ordinary ones). Where the kernel has transparent
 * huge pages off (`never`), madvise fails or does nothing and the pages are ordinary ones. */
void *kiln_alloc_huge(size_t bytes) {
  if (bytes < HUGE_FROM) return kiln_alloc(bytes);
  size_t rounded = (bytes + HUGE_PAGE - 1) & ~(size_t)(HUGE_PAGE - 1);
  void *p = aligned_alloc(HUGE_PAGE, rounded);
  if (!p) return NULL;
  (void)madvise(p, rounded, MADV_HUGEPAGE);
  memset(p, 0, rounded);
  return p;
}

char *kiln_strdup(const char *s) {
  if (!s) return NULL;
  size_t n = strlen(s) + 1;
  char *d = malloc(n);
  if (d) memcpy(d, s, n);
  return d;
}

int kiln_read_file(const char *path, char **out, size_t *len) {
  return kiln_read_file_max(path, SIZE_MAX - 1, out, len);
}

int kiln_read_file_max(const char *path, size_t max, char **out, size_t *len) {
  /* Opened without blocking, so that a FIFO with no writer is refused rather than waited on. */
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return kiln_errorf(KILN_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return kiln_errorf(KILN_ERR_IO, "%s: not a regular file", path);
  }
  if ((uint64_t)st.st_size > (uint64_t)max) {
    close(fd);
    return kiln_errorf(KILN_ERR_INVALID, "%s: %lld bytes, more than the %zu kiln reads here", path,
                       (long long)st.st_size, max);
  }
  FILE *f = fdopen(fd, "rb");
  if (!f) {
    close(fd);
    return kiln_errorf(KILN_ERR_NOMEM, "%s: out of memory", path);
  }
  size_t cap = 1 << 16, n = 0;
  char *buf = malloc(cap);
  if (!buf) {
    fclose(f);
    return kiln_errorf(KILN_ERR_NOMEM, "%s: out of memory", path);
  }
  for (;;) {
    if (n + 1 >= cap) {
      char *nb = realloc(buf, cap *= 2);
      if (!nb) {
        free(buf);
        fclose(f);
        return kiln_errorf(KILN_ERR_NOMEM, "%s: out of memory", path);
      }
      buf = nb;
    }
    size_t got = fread(buf + n, 1, cap - n - 1, f);
    n += got;
    if (got == 0) break;
    if (n > max) { /* it grew while being read */
      free(buf);
      fclose(f);
      return kiln_errorf(KILN_ERR_INVALID, "%s: more than the %zu bytes kiln reads here", path,
                         max);
    }
  }
  int err = ferror(f);
  fclose(f);
  if (err) {
    free(buf);
    return kiln_errorf(KILN_ERR_IO, "%s: read error", path);
  }
  buf[n] = '\0';
  *out = buf;
  if (len) *len = n;
  return KILN_OK;
}

int kiln_write_file_atomic(const char *path, const void *data, size_t len) {
  KILN_TRY(kiln_check_output(path, KILN_OUTPUT_RENAMED, NULL, 0));
  size_t plen = strlen(path);
  char *tmp = malloc(plen + 32);
  if (!tmp) return kiln_errorf(KILN_ERR_NOMEM, "%s: out of memory", path);
  snprintf(tmp, plen + 32, "%s.tmp.%ld", path, (long)getpid());
  /* A new file, never one already under the temporary name (a FIFO, a link to a device): one
   * left by a killed process of the same id is removed first. */
  int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
  if (fd < 0 && errno == EEXIST && unlink(tmp) == 0)
    fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
  FILE *f = fd < 0 ? NULL : fdopen(fd, "wb");
  if (!f) {
    int e = errno;
    if (fd >= 0) close(fd), unlink(tmp);
    int rc = kiln_errorf(KILN_ERR_IO, "%s: cannot create: %s", tmp, strerror(e));
    free(tmp);
    return rc;
  }
  size_t wrote = len ? fwrite(data, 1, len, f) : 0;
  int bad = wrote != len;
  bad |= fflush(f) != 0;
  bad |= fsync(fileno(f)) != 0;
  bad |= fclose(f) != 0;
  if (bad || rename(tmp, path) != 0) {
    int rc = kiln_errorf(KILN_ERR_IO, "%s: write failed: %s", path, strerror(errno));
    remove(tmp);
    free(tmp);
    return rc;
  }
  free(tmp);
  return KILN_OK;
}

static uint64_t status_kb(const char *file, const char *key) {
  FILE *f = fopen(file, "r");
  if (!f) return 0;
  char line[256];
  uint64_t v = 0;
  size_t klen = strlen(key);
  while (fgets(line, sizeof line, f)) {
    if (strncmp(line, key, klen) == 0) {
      v = strtoull(line + klen, NULL, 10);
      break;
    }
  }
  fclose(f);
  return v;
}

double kiln_peak_rss_mb(void) { return status_kb("/proc/self/status", "VmHWM:") / 1024.0; }

double kiln_thread_cpu_wait_ms(void) {
  FILE *f = fopen("/proc/thread-self/schedstat", "r");
  if (!f) return NAN;
  unsigned long long on_cpu_ns, waiting_ns;
  int got = fscanf(f, "%llu %llu", &on_cpu_ns, &waiting_ns);
  fclose(f);
  return got == 2 ? waiting_ns / 1e6 : NAN;
}

uint64_t kiln_mem_available(void) { return status_kb("/proc/meminfo", "MemAvailable:") * 1024; }

double kiln_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

void kiln_sleep_ms(double ms) {
  if (!(ms > 0)) return;
  struct timespec ts = {(time_t)(ms / 1e3), (long)(fmod(ms, 1e3) * 1e6)};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

void kiln_strbuf_printf(kiln_strbuf *b, const char *fmt, ...) {
  if (b->failed) return;
  for (;;) {
    va_list ap;
    va_start(ap, fmt);
    size_t room = b->s ? b->cap - b->len : 0;
    int n = vsnprintf(b->s ? b->s + b->len : NULL, room, fmt, ap);
    va_end(ap);
    if (n < 0) {
      b->failed = 1;
      return;
    }
    if (b->s && (size_t)n < room) {
      b->len += (size_t)n;
      return;
    }
    size_t cap = b->cap ? b->cap : 1024;
    while (cap <= b->len + (size_t)n) cap *= 2;
    char *ns = realloc(b->s, cap);
    if (!ns) {
      b->failed = 1;
      return;
    }
    b->s = ns;
    b->cap = cap;
  }
}

int kiln_mkdir_p(const char *path) {
  char *p = kiln_strdup(path);
  if (!p) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  size_t len = strlen(p);
  for (size_t i = 1; i <= len; i++) {
    if (p[i] != '/' && p[i] != '\0') continue;
    char saved = p[i];
    p[i] = '\0';
    if (mkdir(p, 0775) != 0 && errno != EEXIST) {
      int rc = kiln_errorf(KILN_ERR_IO, "%s: cannot create folder: %s", p, strerror(errno));
      free(p);
      return rc;
    }
    p[i] = saved;
  }
  free(p);
  struct stat st;
  int e = stat(path, &st) != 0 ? errno : S_ISDIR(st.st_mode) ? 0 : ENOTDIR;
  if (e) return kiln_errorf(KILN_ERR_IO, "%s: cannot create folder: %s", path, strerror(e));
  return KILN_OK;
}

/* "<anything>.tmp.<digits>": the process id kiln_write_file_atomic wrote it with, or 0. */
static long temporary_pid(const char *name) {
  const char *t = strstr(name, ".tmp.");
  if (!t) return 0;
  for (const char *n; (n = strstr(t + 1, ".tmp.")); t = n) {
  }
  const char *d = t + 5;
  if (!*d) return 0;
  long pid = 0;
  for (; *d; d++) {
    if (*d < '0' || *d > '9' || pid > 1L << 40) return 0;
    pid = pid * 10 + (*d - '0');
  }
  return pid;
}

int kiln_remove_stale_temporaries(const char *path_prefix, int *removed) {
  if (removed) *removed = 0;
  char *dir = kiln_strdup(path_prefix);
  if (!dir) return kiln_errorf(KILN_ERR_NOMEM, "out of memory");
  char *slash = strrchr(dir, '/');
  const char *base = slash ? path_prefix + (slash - dir) + 1 : path_prefix;
  if (slash) slash[slash == dir ? 1 : 0] = '\0';
  DIR *d = opendir(slash ? dir : ".");
  if (!d) {
    int rc = kiln_errorf(KILN_ERR_IO, "%s: cannot list: %s", slash ? dir : ".", strerror(errno));
    free(dir);
    return rc;
  }
  size_t blen = strlen(base);
  int rc = KILN_OK;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (strncmp(e->d_name, base, blen) != 0) continue;
    long pid = temporary_pid(e->d_name);
    if (pid <= 0 || pid > INT_MAX || pid == (long)getpid()) continue;
    if (kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue; /* alive, or not ours to judge */
    char *path = malloc(strlen(dir) + strlen(e->d_name) + 2);
    if (!path) {
      rc = kiln_errorf(KILN_ERR_NOMEM, "out of memory");
      break;
    }
    sprintf(path, "%s/%s", slash ? dir : ".", e->d_name);
    if (unlink(path) == 0 && removed) (*removed)++;
    free(path);
  }
  closedir(d);
  free(dir);
  return rc;
}

bool kiln_fd_write_all(int fd, const void *p, size_t n) {
  for (const char *c = p; n > 0;) {
    ssize_t w = write(fd, c, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    c += w, n -= (size_t)w;
  }
  return true;
}

bool kiln_fd_read_all(int fd, void *p, size_t n) {
  for (char *c = p; n > 0;) {
    ssize_t r = read(fd, c, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    c += r, n -= (size_t)r;
  }
  return true;
}
