/* HDF5 data files read in a child process: the public path functions of the HDF5 data reader
 * (include/kiln/data.h), running the readers of src/data/h5data.c in a worker process that a
 * reader server forks. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "data/internal.h"
#include "kiln/data.h"
#include "kiln/proto.h"

/* ---- reading in a child process -------------------------------------------------------------
 * libhdf5 1.10.8 itself crashes on some damaged files before kiln can look at anything (a
 * group's local heap or symbol table node claiming an impossible size: fuzz_h5data finds them
 * in its first minutes, as fuzz_h5 did). So files are inspected and loaded in a child process,
 * as src/proto/h5.c reads snapshots: a crash there is an error naming the file.
 *
 * The children are not forked from the caller: HDF5Data's loader threads ask while other
 * threads run, and a child forked then may find a lock held by a thread it does not have
 * (libhdf5's, or the allocator's: AddressSanitizer's allocator is not fork-safe in GCC 12, and
 * such a child hung in test_layers_hdf5). The first request forks a reader server instead, a
 * small single-threaded process with nothing but a socket to the caller (every other
 * descriptor closed, so no pipe of the caller's stays open in it), under kiln_h5_lock so that
 * no thread is inside libhdf5 at that moment; in practice at HDF5Data's set-up, before any data
 * thread runs. For each request (one at a time) the server forks a worker, which reads the file
 * and writes its status, the shapes, the file's size, then the values of each dataset (or the
 * error's text) into a pipe whose other end the caller reads straight into its buffers; the
 * server then sends the worker's exit status. Buffers that are a shared memory file
 * (kiln_h5data_region, HDF5Data's) travel with the request instead, and the worker converts the
 * values straight into them: the pipe then carries only the answer, and a file's values are
 * neither copied through it nor held twice. Forking from the server is safe, and cheap (it is
 * small, where the trainer may hold gigabytes). The worker holds the file's bytes and its
 * values, which is what the memory allowance counts; the caller, only its buffers. A fuzzing
 * build reads in process, so that the fuzzer sees kiln's own faults. */

typedef struct {
  int32_t rc, n;
  uint32_t text; /* bytes of the error's text that follow */
  uint64_t bytes;
  kiln_h5data_shape shapes[KILN_H5DATA_MAX_SETS];
} answer;

typedef struct {
  const char *path;
  int n;
  const char *const *names;
  uint64_t limit;
  float *const *dst; /* NULL: inspect only */
  const uint64_t *room;
  /* a load into a shared region: the worker maps it and writes dst there itself */
  const kiln_h5data_region *region;
  const uint64_t *offset;
} request;

#ifdef KILN_FUZZ_BUILD
static int isolated(const request *q, kiln_h5data_shape *shapes, uint64_t *bytes) {
  if (!q->dst) return kiln_h5data_inspect_here(q->path, q->n, q->names, q->limit, shapes, bytes);
  return kiln_h5data_load_here(q->path, q->n, q->names, q->limit, shapes, q->dst, q->room, NULL);
}
#else
static uint64_t values_of(const kiln_h5data_shape *s) {
  return (uint64_t)s->dims[0] * (uint64_t)kiln_h5data_record_size(s);
}

/* A worker: does the request and answers into `fd`, then ends. With a shared region (`shared`
 * >= 0, `shared_bytes` long) the values go straight into it, and only the answer into `fd`. */
static void worker(int fd, const request *q, int shared, uint64_t shared_bytes) {
  kiln_child_default_signals();
  answer a;
  memset(&a, 0, sizeof a);
  a.n = q->n;
  float *own[KILN_H5DATA_MAX_SETS] = {NULL};
  bool in_place = false;
  if (q->room && shared >= 0) {
    void *map = mmap(NULL, (size_t)shared_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, shared, 0);
    if (map == MAP_FAILED) {
      a.rc = kiln_errorf(KILN_ERR_IO, "%s: cannot map the reader's buffer: %s", q->path,
                         strerror(errno));
    } else {
      float *dst[KILN_H5DATA_MAX_SETS];
      for (int i = 0; i < q->n; i++) dst[i] = (float *)map + q->offset[i];
      a.rc = kiln_h5data_load_here(q->path, q->n, q->names, q->limit, a.shapes, dst, q->room,
                                   NULL);
      in_place = true;
    }
  } else if (q->room) {
    a.rc = kiln_h5data_load_here(q->path, q->n, q->names, q->limit, a.shapes, NULL, q->room, own);
  } else {
    a.rc = kiln_h5data_inspect_here(q->path, q->n, q->names, q->limit, a.shapes, &a.bytes);
  }
  const char *text = a.rc ? kiln_last_error() : NULL;
  a.text = text ? (uint32_t)strlen(text) : 0;
  bool ok = kiln_fd_write_all(fd, &a, sizeof a) && (!text || kiln_fd_write_all(fd, text, a.text));
  for (int i = 0; ok && !a.rc && q->room && !in_place && i < q->n; i++)
    ok = kiln_fd_write_all(fd, own[i], sizeof(float) * (size_t)values_of(&a.shapes[i]));
  _exit(ok ? 0 : 3); /* no atexit handlers: they belong to the caller */
}

/* A request on the wire: this header, then the path and the dataset names, each ended by a NUL;
 * the answer pipe's writing end rides along (SCM_RIGHTS), and for a load into a shared region
 * the region's memory file after it. */
typedef struct {
  int32_t n, load, shared;
  uint64_t limit, shared_bytes;
  uint64_t room[KILN_H5DATA_MAX_SETS], offset[KILN_H5DATA_MAX_SETS];
} wire;

enum { WIRE_MAX = 1 << 16 };

/* The server's loop: a worker per request, then its wait status; ends when the caller's end of
 * the socket closes. */
static void server_loop(int sock) {
  /* nothing of the caller's stays open here: its pipes must see their ends when it closes them */
  int null = open("/dev/null", O_RDWR);
  if (null >= 0) dup2(null, 0), dup2(null, 1);
  if (sock != 3) {
    dup2(sock, 3);
    sock = 3;
  }
  close_range(4, ~0U, 0);
  signal(SIGPIPE, SIG_IGN);
  static char buf[WIRE_MAX];
  for (;;) {
    char control[CMSG_SPACE(2 * sizeof(int))];
    struct iovec iov = {buf, sizeof buf - 1};
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control,
                       .msg_controllen = sizeof control};
    const ssize_t got = recvmsg(sock, &m, 0);
    if (got == 0 || (got < 0 && errno != EINTR)) _exit(0);
    if (got < 0) continue;
    int fds[2] = {-1, -1};
    struct cmsghdr *c = CMSG_FIRSTHDR(&m);
    if (c && c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
      const size_t nfd = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      memcpy(fds, CMSG_DATA(c), (nfd < 2 ? nfd : 2) * sizeof(int));
    }
    const int fd = fds[0];
    int32_t status = -1;
    wire w;
    const char *names[KILN_H5DATA_MAX_SETS];
    bool ok = fd >= 0 && (size_t)got > sizeof w;
    if (ok) {
      memcpy(&w, buf, sizeof w);
      buf[got] = '\0';
      ok = w.n >= 1 && w.n <= KILN_H5DATA_MAX_SETS && (!w.shared || (w.load && fds[1] >= 0));
    }
    const char *at = buf + sizeof w, *end = buf + got;
    const char *path = at;
    at += strlen(at) + 1;
    for (int i = 0; ok && i < w.n; i++) {
      ok = at < end;
      names[i] = at;
      at += strlen(at) + 1;
    }
    if (ok) {
      const request q = {.path = path, .n = w.n, .names = names, .limit = w.limit,
                         .room = w.load ? w.room : NULL, .offset = w.offset};
      const pid_t pid = fork();
      if (pid == 0) {
        close(sock);
        worker(fd, &q, w.shared ? fds[1] : -1, w.shared_bytes);
      }
      if (pid > 0)
        while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
        }
    }
    for (int i = 0; i < 2; i++)
      if (fds[i] >= 0) close(fds[i]);
    send(sock, &status, sizeof status, MSG_NOSIGNAL);
  }
}

static struct {
  pthread_mutex_t mu;
  pid_t pid; /* -1: none */
  int sock;
} server = {PTHREAD_MUTEX_INITIALIZER, -1, -1};

static void server_stop(void) {
  if (server.sock >= 0) close(server.sock);
  if (server.pid > 0)
    while (waitpid(server.pid, NULL, 0) < 0 && errno == EINTR) {
    }
  server.sock = server.pid = -1;
}

static int server_start(const char *path) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0)
    return kiln_errorf(KILN_ERR_IO, "%s: cannot start the HDF5 reader: socketpair: %s", path,
                       strerror(errno));
  kiln_h5_lock(); /* no other thread inside libhdf5 while the server is made */
  const pid_t pid = fork();
  if (pid == 0) {
    close(sv[0]);
    server_loop(sv[1]);
  }
  kiln_h5_unlock();
  close(sv[1]);
  if (pid < 0) {
    const int e = errno;
    close(sv[0]);
    return kiln_errorf(KILN_ERR_IO, "%s: cannot start the HDF5 reader: fork: %s", path,
                       strerror(e));
  }
  server.pid = pid;
  server.sock = sv[0];
  return KILN_OK;
}

/* Sends the request with the pipe's writing end; false when the server is gone. */
static bool server_send(const request *q, int fd) {
  char buf[WIRE_MAX];
  const bool shared = q->region && q->region->fd >= 0;
  wire w = {.n = q->n, .load = q->dst != NULL, .shared = shared, .limit = q->limit,
            .shared_bytes = shared ? q->region->bytes : 0};
  for (int i = 0; q->dst && i < q->n; i++) {
    w.room[i] = q->room[i];
    w.offset[i] = shared ? q->offset[i] : 0;
  }
  memcpy(buf, &w, sizeof w);
  size_t used = sizeof w;
  for (int i = -1; i < q->n; i++) {
    const char *str = i < 0 ? q->path : q->names[i];
    const size_t len = strlen(str) + 1;
    if (used + len > sizeof buf) return false;
    memcpy(buf + used, str, len);
    used += len;
  }
  const int fds[2] = {fd, shared ? q->region->fd : -1};
  const size_t nfd = shared ? 2 : 1;
  char control[CMSG_SPACE(2 * sizeof(int))];
  memset(control, 0, sizeof control);
  struct iovec iov = {buf, used};
  struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control,
                     .msg_controllen = CMSG_SPACE(nfd * sizeof(int))};
  struct cmsghdr *c = CMSG_FIRSTHDR(&m);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(nfd * sizeof(int));
  memcpy(CMSG_DATA(c), fds, nfd * sizeof(int));
  ssize_t sent;
  while ((sent = sendmsg(server.sock, &m, MSG_NOSIGNAL)) < 0 && errno == EINTR) {
  }
  return sent == (ssize_t)used;
}

static int isolated(const request *q, kiln_h5data_shape *shapes, uint64_t *bytes) {
  const char *path = q->path;
  size_t need = sizeof(wire) + strlen(path) + 1;
  for (int i = 0; i < q->n; i++) need += strlen(q->names[i]) + 1;
  if (need > WIRE_MAX)
    return kiln_errorf(KILN_ERR_INVALID, "%s: the path and dataset names are too long", path);
  pthread_mutex_lock(&server.mu); /* one request at a time */
  int fds[2] = {-1, -1}, rc = KILN_OK;
  bool sent = false;
  for (int attempt = 0; attempt < 2 && !sent && !rc; attempt++) {
    if (server.pid < 0) rc = server_start(path);
    if (!rc && pipe(fds) != 0)
      rc = kiln_errorf(KILN_ERR_IO, "%s: cannot read it in a child process: pipe: %s", path,
                       strerror(errno));
    if (rc) break;
    sent = server_send(q, fds[1]);
    close(fds[1]);
    if (!sent) { /* the server is gone (killed?): once more with a new one */
      close(fds[0]);
      server_stop();
    }
  }
  if (!rc && !sent)
    rc = kiln_errorf(KILN_ERR_IO, "%s: the HDF5 reader process does not answer", path);
  answer a;
  memset(&a, 0, sizeof a);
  char text[4096] = "";
  bool whole = false;
  int32_t status = -1;
  if (!rc) {
    whole = kiln_fd_read_all(fds[0], &a, sizeof a) && a.n == q->n;
    if (whole && a.rc) {
      const size_t t = a.text < sizeof text - 1 ? a.text : sizeof text - 1;
      whole = kiln_fd_read_all(fds[0], text, t);
      text[t] = '\0';
    } else if (whole && q->dst) {
      const bool in_place = q->region && q->region->fd >= 0;
      for (int i = 0; whole && i < q->n; i++) {
        const uint64_t count = values_of(&a.shapes[i]);
        /* the worker checked the room; a damaged answer must not overrun it here either */
        whole = a.shapes[i].naxes >= 1 && a.shapes[i].naxes <= KILN_MAX_AXES &&
                count <= q->room[i] &&
                (in_place || kiln_fd_read_all(fds[0], q->dst[i], sizeof(float) * (size_t)count));
      }
    }
    close(fds[0]); /* a worker still writing ends on the broken pipe */
    ssize_t r;
    while ((r = recv(server.sock, &status, sizeof status, 0)) < 0 && errno == EINTR) {
    }
    if (r != sizeof status) {
      server_stop();
      rc = kiln_errorf(KILN_ERR_IO, "%s: the HDF5 reader process ended", path);
    }
  }
  pthread_mutex_unlock(&server.mu);
  if (!rc) {
    if (!whole || status == -1 || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
      rc = kiln_child_failed(path, "libhdf5", "the HDF5 reader", status);
    else if (a.rc)
      rc = kiln_errorf(a.rc, "%s", text);
  }
  if (!rc) {
    memcpy(shapes, a.shapes, sizeof(kiln_h5data_shape) * (size_t)q->n);
    if (bytes) *bytes = a.bytes;
  }
  return rc;
}
#endif

int kiln_h5data_inspect(const char *path, int n, const char *const *names, uint64_t limit,
                        kiln_h5data_shape *shapes, uint64_t *bytes) {
  if (n < 1 || n > KILN_H5DATA_MAX_SETS)
    return kiln_errorf(KILN_ERR_INVALID, "%s: %d datasets asked for; 1 to %d are read", path, n,
                       KILN_H5DATA_MAX_SETS);
  const request q = {.path = path, .n = n, .names = names, .limit = limit};
  return isolated(&q, shapes, bytes);
}

int kiln_h5data_region_new(size_t bytes, kiln_h5data_region *r) {
  memset(r, 0, sizeof *r);
  r->fd = -1;
  if (bytes == 0) bytes = sizeof(float);
#ifndef KILN_FUZZ_BUILD
  /* a memory file the worker can map; where there is none, plain memory and the pipe */
  const int fd = memfd_create("kiln-hdf5-buffer", MFD_CLOEXEC);
  if (fd >= 0) {
    void *map = MAP_FAILED;
    if (ftruncate(fd, (off_t)bytes) == 0)
      map = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (map != MAP_FAILED) {
      r->base = map;
      r->bytes = bytes;
      r->fd = fd;
      return KILN_OK;
    }
    close(fd);
  }
#endif
  if (!(r->base = kiln_alloc(bytes)))
    return kiln_errorf(KILN_ERR_NOMEM, "out of memory for a %zu-byte HDF5 file buffer", bytes);
  r->bytes = bytes;
  return KILN_OK;
}

void kiln_h5data_region_free(kiln_h5data_region *r) {
  if (!r->base) return;
  if (r->fd >= 0) {
    munmap(r->base, r->bytes);
    close(r->fd);
  } else {
    kiln_free(r->base);
  }
  memset(r, 0, sizeof *r);
  r->fd = -1;
}

int kiln_h5data_load_region(const char *path, int n, const char *const *names, uint64_t limit,
                            kiln_h5data_shape *shapes, const kiln_h5data_region *r,
                            const uint64_t *offset, const uint64_t *room) {
  if (n < 1 || n > KILN_H5DATA_MAX_SETS)
    return kiln_errorf(KILN_ERR_INVALID, "%s: %d datasets asked for; 1 to %d are read", path, n,
                       KILN_H5DATA_MAX_SETS);
  float *dst[KILN_H5DATA_MAX_SETS];
  const uint64_t values = r->bytes / sizeof(float);
  for (int i = 0; i < n; i++) {
    if (offset[i] > values || room[i] > values - offset[i])
      return kiln_errorf(KILN_ERR_INVALID, "%s: dataset '%s' placed past the end of its buffer",
                         path, names[i]);
    dst[i] = r->base + offset[i];
  }
  const request q = {.path = path, .n = n, .names = names, .limit = limit, .dst = dst,
                     .room = room, .region = r, .offset = offset};
  return isolated(&q, shapes, NULL);
}

int kiln_h5data_load(const char *path, int n, const char *const *names, uint64_t limit,
                     kiln_h5data_shape *shapes, float *const *dst, const uint64_t *room) {
  if (n < 1 || n > KILN_H5DATA_MAX_SETS)
    return kiln_errorf(KILN_ERR_INVALID, "%s: %d datasets asked for; 1 to %d are read", path, n,
                       KILN_H5DATA_MAX_SETS);
  const request q = {.path = path, .n = n, .names = names, .limit = limit, .dst = dst,
                     .room = room};
  return isolated(&q, shapes, NULL);
}
