/* Child processes of the CE runner (runner.c): a training (or a model's decode after it) runs as
 * a child process in its own process group, with its output in its run folder, and is waited
 * for within a timeout, after which the whole group is ended; the wall clock, the CPU time of the
 * child and the CPU time that other processes took meanwhile are measured. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ce/internal.h"
#include "kiln/ce.h"

double ce_now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + t.tv_nsec / 1e9;
}

static void last_error_line(const char *log, char *out, size_t n) {
  out[0] = '\0';
  char *text;
  size_t len;
  if (kiln_read_file(log, &text, &len)) return;
  char last_any[512] = "";
  char *save, *line = strtok_r(text, "\n", &save);
  for (; line; line = strtok_r(NULL, "\n", &save)) {
    while (*line == '\r') line++;
    if (!*line) continue;
    /* progress lines on a terminal start with \r; logs here are files, but be safe */
    char *cr = strrchr(line, '\r');
    if (cr) line = cr + 1;
    if (!strncmp(line, "kiln", 4)) snprintf(out, n, "%s", line);
    snprintf(last_any, sizeof last_any, "%s", line);
  }
  if (!out[0]) snprintf(out, n, "%s", last_any);
  free(text);
}

/* The CPU time all processes of the machine have used since boot (user, nice, system, irq,
 * softirq and steal: what kept a CPU from anyone else), in s; NaN when unknown. */
static double machine_busy_s(void) {
  FILE *f = fopen("/proc/stat", "r");
  if (!f) return NAN;
  unsigned long long user, nice, sys, idle, iowait, irq, softirq, steal;
  int got = fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &user, &nice, &sys, &idle,
                   &iowait, &irq, &softirq, &steal);
  fclose(f);
  long hz = sysconf(_SC_CLK_TCK);
  if (got != 8 || hz <= 0) return NAN;
  return (double)(user + nice + sys + irq + softirq + steal) / (double)hz;
}

/* Runs argv in `folder` with stdout and stderr in folder/log_name, in its own process group so
 * that a timeout kills mpirun and every rank together. */
void ce_run_child(char *const argv[], const char *folder, const char *log_name, double timeout_s,
                  const volatile sig_atomic_t *cancel, kiln_ce_child *c) {
  memset(c, 0, sizeof *c);
  c->timeout_s = timeout_s;
  char log[4200];
  ce_fmt(log, sizeof log, "%s/%s", folder, log_name);
  int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    c->end = KILN_CE_CHILD_NOT_STARTED;
    ce_fmt(c->last_error, sizeof c->last_error, "%s: %s", log, strerror(errno));
    return;
  }
  double t0 = ce_now_s(), busy0 = machine_busy_s();
  const pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) {
    close(fd);
    c->end = KILN_CE_CHILD_NOT_STARTED;
    snprintf(c->last_error, sizeof c->last_error, "fork: %s", strerror(errno));
    return;
  }
  if (pid == 0) {
    /* only async-signal-safe calls until exec */
    setpgid(0, 0);
    /* If the harness dies (even by SIGKILL, with no chance to stop its training), the training
     * gets SIGTERM: a kiln train ends, mpirun ends its ranks. A harness already gone before this
     * line leaves nothing to wait for the child either. */
    if (prctl(PR_SET_PDEATHSIG, SIGTERM) != 0 || getppid() != parent) _exit(126);
    int in = open("/dev/null", O_RDONLY);
    if (in >= 0) dup2(in, 0);
    dup2(fd, 1);
    dup2(fd, 2);
    if (chdir(folder) != 0) _exit(126);
    execvp(argv[0], argv);
    static const char msg[] = "kiln ce: cannot execute the command\n";
    (void)!write(2, msg, sizeof msg - 1);
    _exit(127);
  }
  setpgid(pid, pid); /* also here, so the group exists whichever process runs first */
  close(fd);
  int status = 0;
  bool timed_out = false;
  struct rusage ru;
  memset(&ru, 0, sizeof ru);
  for (;;) {
    pid_t w = wait4(pid, &status, WNOHANG, &ru);
    if (w == pid) break;
    if (w < 0 && errno != EINTR) break;
    bool cancelled = cancel && *cancel;
    if (!timed_out && (cancelled || ce_now_s() - t0 > timeout_s)) {
      timed_out = true;
      kill(-pid, SIGTERM);
      double grace = ce_now_s();
      while (wait4(pid, &status, WNOHANG, &ru) == 0 && ce_now_s() - grace < 5) {
        struct timespec ts = {0, 50 * 1000 * 1000};
        nanosleep(&ts, NULL);
      }
      kill(-pid, SIGKILL);
      wait4(pid, &status, 0, &ru);
      break;
    }
    struct timespec ts = {0, 50 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  c->wall_s = ce_now_s() - t0;
  c->cpu_s = (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + (double)ru.ru_stime.tv_sec +
             ru.ru_stime.tv_usec / 1e6;
  double others = machine_busy_s() - busy0 - c->cpu_s;
  c->others_cpu_s = isfinite(others) ? fmax(others, 0) : NAN;
  if (!timed_out) kill(-pid, SIGKILL); /* ranks mpirun left behind, if any */
  last_error_line(log, c->last_error, sizeof c->last_error);
  if (timed_out) {
    c->end = KILN_CE_CHILD_TIMEOUT;
  } else if (WIFSIGNALED(status)) {
    c->end = KILN_CE_CHILD_SIGNALED;
    c->code = WTERMSIG(status);
  } else {
    c->end = KILN_CE_CHILD_EXITED;
    c->code = WEXITSTATUS(status);
    if (c->code == 127 || c->code == 126) c->end = KILN_CE_CHILD_NOT_STARTED;
  }
}

bool ce_find_in_path(const char *path, const char *name, char *buf, size_t n) {
  if (!*path) return false;
  const char *p = path;
  while (*p) {
    const char *colon = strchr(p, ':');
    size_t len = colon ? (size_t)(colon - p) : strlen(p);
    if (len) {
      snprintf(buf, n, "%.*s/%s", (int)len, p, name);
      if (access(buf, X_OK) == 0) return true;
    }
    if (!colon) break;
    p = colon + 1;
  }
  return false;
}
