/* What machine a CE run measured on: a description for the history (CPU, cores, memory,
 * compiler, BLAS, threads) and a short class name that keys the baselines, because timings and
 * memory are only comparable between machines of one kind. Also the git commit of the code. */
#include <ctype.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <unistd.h>

#include "ce/internal.h"
#include "kiln/ce.h"

char *openblas_get_config(void);

static void trim(char *s) {
  size_t n = strlen(s);
  while (n && isspace((unsigned char)s[n - 1])) s[--n] = '\0';
  size_t b = 0;
  while (s[b] && isspace((unsigned char)s[b])) b++;
  memmove(s, s + b, n - b + 1);
}

void kiln_ce_machine_describe(kiln_ce_machine *m, const kiln_config *cfg) {
  if (!cfg) cfg = kiln_config_defaults();
  memset(m, 0, sizeof *m);
  snprintf(m->cpu, sizeof m->cpu, "unknown CPU");
  FILE *f = fopen("/proc/cpuinfo", "r");
  if (f) {
    char line[512];
    while (fgets(line, sizeof line, f)) {
      if (!strncmp(line, "model name", 10)) {
        char *c = strchr(line, ':');
        if (c) {
          snprintf(m->cpu, sizeof m->cpu, "%s", c + 1);
          trim(m->cpu);
        }
        break;
      }
    }
    fclose(f);
  }
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  m->cores = cores > 0 ? (int)cores : 1;
  f = fopen("/proc/meminfo", "r");
  if (f) {
    char line[256];
    while (fgets(line, sizeof line, f)) {
      unsigned long long kb;
      if (sscanf(line, "MemTotal: %llu kB", &kb) == 1) {
        m->mem_gib = (double)kb / (1024.0 * 1024.0);
        break;
      }
    }
    fclose(f);
  }
#if defined(__clang__)
  snprintf(m->compiler, sizeof m->compiler, "clang %s", __clang_version__);
#elif defined(__GNUC__)
  snprintf(m->compiler, sizeof m->compiler, "gcc %s", __VERSION__);
#else
  snprintf(m->compiler, sizeof m->compiler, "unknown compiler");
#endif
  const char *blas = openblas_get_config();
  snprintf(m->blas, sizeof m->blas, "%s", blas ? blas : "unknown BLAS");
  trim(m->blas);
  m->threads = cfg->omp_threads > 0 ? cfg->omp_threads : m->cores;
  struct utsname u;
  if (uname(&u) == 0) {
    snprintf(m->os, sizeof m->os, "%.30s %.40s %.20s", u.sysname, u.release, u.machine);
    ce_fmt(m->hostname, sizeof m->hostname, "%s", u.nodename);
  }
}

int kiln_ce_usable_cores(void) {
  long online = sysconf(_SC_NPROCESSORS_ONLN);
  int cores = online > 0 ? (int)online : 1;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    int allowed = CPU_COUNT(&set);
    if (allowed > 0 && allowed < cores) cores = allowed;
  }
  return cores;
}

void kiln_ce_machine_class(const kiln_ce_machine *m, char *buf, size_t n) {
  /* The model name without trademarks, "CPU", "Processor" and the "@ 2.20GHz" tail, as a slug:
   * "Intel(R) Xeon(R) CPU E5-2680 v4 @ 2.40GHz" -> "intel-xeon-e5-2680-v4". */
  char cpu[sizeof m->cpu];
  snprintf(cpu, sizeof cpu, "%s", m->cpu);
  char *at = strchr(cpu, '@');
  if (at) *at = '\0';
  static const char *const drop[] = {"(R)", "(r)", "(TM)", "(tm)", " CPU", " Processor"};
  for (size_t d = 0; d < sizeof drop / sizeof drop[0]; d++) {
    char *p;
    size_t len = strlen(drop[d]);
    while ((p = strstr(cpu, drop[d]))) memmove(p, p + len, strlen(p + len) + 1);
  }
  char slug[sizeof m->cpu];
  size_t k = 0;
  for (const char *p = cpu; *p && k + 1 < sizeof slug; p++) {
    unsigned char c = (unsigned char)*p;
    if (isalnum(c)) slug[k++] = (char)tolower(c);
    else if (k && slug[k - 1] != '-') slug[k++] = '-';
  }
  while (k && slug[k - 1] == '-') k--;
  slug[k] = '\0';
  snprintf(buf, n, "%s-%dc", k ? slug : "unknown-cpu", m->cores);
}

static void json_str(char *out, size_t n, const char *s) {
  size_t k = 0;
  for (; *s && k + 7 < n; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\') {
      out[k++] = '\\';
      out[k++] = (char)c;
    } else if (c < 0x20) {
      k += (size_t)snprintf(out + k, n - k, "\\u%04x", c);
    } else {
      out[k++] = (char)c;
    }
  }
  out[k] = '\0';
}

char *kiln_ce_machine_json(const kiln_ce_machine *m) {
  char cpu[300], compiler[160], blas[420], os[220], host[160];
  json_str(cpu, sizeof cpu, m->cpu);
  json_str(compiler, sizeof compiler, m->compiler);
  json_str(blas, sizeof blas, m->blas);
  json_str(os, sizeof os, m->os);
  json_str(host, sizeof host, m->hostname);
  size_t n = 2048;
  char *out = malloc(n);
  if (!out) return NULL;
  snprintf(out, n,
           "{\"cpu\":\"%s\",\"cores\":%d,\"mem_gib\":%.1f,\"compiler\":\"%s\",\"blas\":\"%s\","
           "\"threads\":%d,\"os\":\"%s\",\"hostname\":\"%s\"}",
           cpu, m->cores, m->mem_gib, compiler, blas, m->threads, os, host);
  return out;
}

void kiln_ce_git_commit(const char *dir, char *buf, size_t n) {
  snprintf(buf, n, "unknown");
  /* The folder goes to git as an argument vector element quoted for the shell: single quotes
   * with any single quote inside closed and escaped. */
  char q[4200];
  size_t k = 0;
  q[k++] = '\'';
  for (const char *p = dir ? dir : "."; *p && k + 6 < sizeof q; p++) {
    if (*p == '\'') {
      memcpy(q + k, "'\\''", 4);
      k += 4;
    } else {
      q[k++] = *p;
    }
  }
  q[k++] = '\'';
  q[k] = '\0';
  char cmd[4400];
  snprintf(cmd, sizeof cmd, "git -C %s describe --always --dirty 2>/dev/null", q);
  FILE *p = popen(cmd, "r");
  if (!p) return;
  char line[128];
  if (fgets(line, sizeof line, p)) {
    trim(line);
    if (line[0]) snprintf(buf, n, "%s", line);
  }
  pclose(p);
}
