/* What machine a CE run measured on: a description for the history (CPU and its family, model,
 * stepping and flags, its measured FMA peaks, cores, memory, compiler, BLAS, threads) and a short
 * class name that keys the baselines, because timings and memory are only comparable between
 * machines of one kind. Hypervisors often shorten the model name ("AMD EPYC") and keep family
 * and model, and a VM that moves between hosts can keep all three while its AVX-512 rate halves:
 * so the class is made of the vendor, family, model, the measured full-rate vector width and
 * the usable cores. Also the git commit of the code. */
#include <ctype.h>
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <unistd.h>

#include "ce/internal.h"
#include "kiln/ce.h"
#include "kiln/cpu.h"

char *openblas_get_config(void);

static void trim(char *s) {
  size_t n = strlen(s);
  while (n && isspace((unsigned char)s[n - 1])) s[--n] = '\0';
  size_t b = 0;
  while (s[b] && isspace((unsigned char)s[b])) b++;
  memmove(s, s + b, n - b + 1);
}

/* ---- the CPU from /proc/cpuinfo ------------------------------------------------------------ */

/* The value of "key : value" when `line` has that key (keys are padded with tabs). */
static const char *field(const char *line, const char *key) {
  size_t n = strlen(key);
  if (strncmp(line, key, n)) return NULL;
  const char *p = line + n;
  while (*p == ' ' || *p == '\t') p++;
  if (*p != ':') return NULL;
  p++;
  while (*p == ' ' || *p == '\t') p++;
  return p;
}

static int number(const char *v) {
  char *end;
  long x = strtol(v, &end, 0); /* Arm's part numbers are hexadecimal, 0x... */
  return end == v || x < 0 || x > 1000000 ? -1 : (int)x;
}

static void copy_value(char *dst, size_t n, const char *v) {
  snprintf(dst, n, "%.*s", (int)strcspn(v, "\r\n"), v);
  trim(dst);
}

/* Whether the space-separated `list` (up to its line's end) has `flag` as one of its words. */
static bool has_word(const char *list, const char *flag) {
  size_t n = strlen(flag);
  for (const char *p = list; *p && *p != '\n';) {
    while (*p == ' ' || *p == '\t') p++;
    size_t w = strcspn(p, " \t\n");
    if (w == n && !strncmp(p, flag, n)) return true;
    p += w;
  }
  return false;
}

static void keep_flags(kiln_ce_machine *m, const char *list, const char *const *wanted) {
  size_t k = strlen(m->flags);
  for (; *wanted; wanted++)
    if (has_word(list, *wanted)) {
      int w = snprintf(m->flags + k, sizeof m->flags - k, "%s%s", k ? " " : "", *wanted);
      if (w > 0 && (size_t)w < sizeof m->flags - k) k += (size_t)w;
    }
}

static void vendor_name(kiln_ce_machine *m, const char *vendor_id) {
  static const struct {
    const char *id, *name;
  } x86[] = {{"GenuineIntel", "intel"}, {"AuthenticAMD", "amd"}, {"HygonGenuine", "hygon"},
             {"CentaurHauls", "centaur"}, {"  Shanghai  ", "zhaoxin"}};
  for (size_t i = 0; i < sizeof x86 / sizeof x86[0]; i++)
    if (!strcmp(vendor_id, x86[i].id)) {
      snprintf(m->vendor, sizeof m->vendor, "%s", x86[i].name);
      return;
    }
  size_t k = 0;
  for (const char *p = vendor_id; *p && k + 1 < sizeof m->vendor; p++)
    if (isalnum((unsigned char)*p)) m->vendor[k++] = (char)tolower((unsigned char)*p);
  m->vendor[k] = '\0';
}

/* Arm's implementer codes (the MIDR's top byte) for the vendors kiln is likely to meet. */
static void arm_vendor(kiln_ce_machine *m, int code) {
  static const struct {
    int code;
    const char *name;
  } arm[] = {{0x41, "arm"},      {0x42, "broadcom"}, {0x43, "cavium"}, {0x46, "fujitsu"},
             {0x48, "hisilicon"}, {0x4e, "nvidia"},   {0x51, "qualcomm"}, {0x61, "apple"},
             {0x6d, "microsoft"}, {0xc0, "ampere"}};
  for (size_t i = 0; i < sizeof arm / sizeof arm[0]; i++)
    if (arm[i].code == code) {
      snprintf(m->vendor, sizeof m->vendor, "%s", arm[i].name);
      return;
    }
  snprintf(m->vendor, sizeof m->vendor, "arm%02x", code & 0xff);
}

void kiln_ce_machine_parse_cpuinfo(kiln_ce_machine *m, const char *text) {
  static const char *const x86_flags[] = {"avx2",     "fma",      "avx512f", "avx512_bf16",
                                          "amx_bf16", "amx_tile", NULL};
  static const char *const arm_flags[] = {"asimd", "sve", "sve2", "bf16", NULL};
  m->vendor[0] = m->flags[0] = '\0';
  m->family = m->model = m->stepping = -1;
  bool named = false;
  int processors = 0;
  for (const char *line = text; line && *line; line = strchr(line, '\n'), line = line ? line + 1 : NULL) {
    const char *v;
    /* the first processor's block describes the machine (they are alike); Arm lists its
     * processors first and the model fields after them, so read on past a second block only
     * for the fields still unknown */
    if (field(line, "processor") && ++processors > 1 && m->vendor[0] && m->family >= 0) break;
    if (!named && ((v = field(line, "model name")) || (v = field(line, "Model name")))) {
      copy_value(m->cpu, sizeof m->cpu, v);
      named = m->cpu[0] != '\0';
    } else if ((v = field(line, "vendor_id")) && !m->vendor[0]) {
      char id[64];
      snprintf(id, sizeof id, "%.*s", (int)strcspn(v, "\r\n"), v);
      vendor_name(m, id);
    } else if ((v = field(line, "cpu family")) && m->family < 0) {
      m->family = number(v);
    } else if ((v = field(line, "model")) && m->model < 0) {
      m->model = number(v);
    } else if ((v = field(line, "stepping")) && m->stepping < 0) {
      m->stepping = number(v);
    } else if ((v = field(line, "flags")) && !m->flags[0]) {
      keep_flags(m, v, x86_flags);
    } else if ((v = field(line, "CPU implementer")) && !m->vendor[0]) {
      arm_vendor(m, number(v));
    } else if ((v = field(line, "CPU architecture")) && m->family < 0) {
      m->family = number(v);
    } else if ((v = field(line, "CPU part")) && m->model < 0) {
      m->model = number(v);
    } else if ((v = field(line, "CPU revision")) && m->stepping < 0) {
      m->stepping = number(v);
    } else if ((v = field(line, "Features")) && !m->flags[0]) {
      keep_flags(m, v, arm_flags);
    }
  }
  if (!m->cpu[0]) snprintf(m->cpu, sizeof m->cpu, "unknown CPU");
}

void kiln_ce_machine_set_peaks(kiln_ce_machine *m, double avx2, double avx512) {
  m->fma_gflops[0] = avx2;
  m->fma_gflops[1] = avx512;
  /* Two 512-bit FMA pipes give twice the 256-bit rate, one pipe (or 512-bit work split over
   * 256-bit halves) the same rate: 1.5 lies between, far from either, so frequency offsets
   * under AVX-512 and a little noise do not move a host across. */
  if (!isfinite(avx2) || !isfinite(avx512)) m->vector_rate[0] = '\0';
  else if (avx512 > 0 && avx2 > 0 && avx512 >= 1.5 * avx2)
    snprintf(m->vector_rate, sizeof m->vector_rate, "avx512rate");
  else if (avx2 > 0) snprintf(m->vector_rate, sizeof m->vector_rate, "avx2rate");
  else snprintf(m->vector_rate, sizeof m->vector_rate, "sserate");
}

void kiln_ce_machine_summary(const kiln_ce_machine *m, char *buf, size_t n) {
  kiln_strbuf b = {0};
  kiln_strbuf_printf(&b, "%s", m->cpu);
  if (m->family >= 0 && m->model >= 0)
    kiln_strbuf_printf(&b, ", family %d model %d stepping %d", m->family, m->model, m->stepping);
  if (m->flags[0]) kiln_strbuf_printf(&b, ", %s", m->flags);
  if (isfinite(m->fma_gflops[0]) && isfinite(m->fma_gflops[1]) && m->fma_gflops[0] > 0) {
    kiln_strbuf_printf(&b, "; one core's FMA peak %.1f GFLOP/s AVX2", m->fma_gflops[0]);
    if (m->fma_gflops[1] > 0) kiln_strbuf_printf(&b, ", %.1f AVX-512", m->fma_gflops[1]);
  }
  kiln_strbuf_printf(&b, "; %d of %d cores", m->usable_cores > 0 ? m->usable_cores : m->cores,
                     m->cores);
  snprintf(buf, n, "%s", b.s && !b.failed ? b.s : m->cpu);
  free(b.s);
}

/* ---- the peaks, measured once a boot --------------------------------------------------------- */

/* This boot's identity: the kernel's random boot id. "" where there is none. */
static void boot_id(char *buf, size_t n) {
  buf[0] = '\0';
  FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
  if (!f) return;
  if (fgets(buf, (int)n, f)) trim(buf);
  else buf[0] = '\0';
  fclose(f);
}

/* The CPU the cache was measured on, as one line: a file of another boot or CPU is stale. */
static void cpu_key(const kiln_ce_machine *m, const char *boot, char *buf, size_t n) {
  snprintf(buf, n, "%s %s f%d m%d s%d %s", boot, m->vendor, m->family, m->model, m->stepping,
           m->cpu);
}

static bool read_cache(const char *path, const char *key, double *avx2, double *avx512) {
  char *text = NULL;
  size_t len = 0;
  if (!path[0] || kiln_read_file_max(path, 4096, &text, &len)) return false;
  bool ok = false;
  char want[512];
  snprintf(want, sizeof want, "key %s\n", key);
  const char *k = strstr(text, want);
  const char *a = strstr(text, "\navx2_gflops "), *b = strstr(text, "\navx512_gflops ");
  if (k && a && b) {
    char *end1, *end2;
    *avx2 = strtod(a + 13, &end1);
    *avx512 = strtod(b + 15, &end2);
    ok = end1 != a + 13 && end2 != b + 15 && isfinite(*avx2) && isfinite(*avx512) &&
         *avx2 >= 0 && *avx512 >= 0;
  }
  free(text);
  return ok;
}

static void write_cache(const char *path, const char *key, double avx2, double avx512) {
  if (!path[0]) return;
  char dir[KILN_CONFIG_PATH_MAX];
  snprintf(dir, sizeof dir, "%s", path);
  char *slash = strrchr(dir, '/');
  if (slash && slash != dir) {
    *slash = '\0';
    if (kiln_mkdir_p(dir)) return; /* no cache: measured again next time */
  }
  char text[1024];
  int n = snprintf(text, sizeof text,
                   "# kiln: this boot's one-thread FMA peaks in GFLOP/s, for CE's machine class\n"
                   "# (docs/ce.md); measured again after a reboot or on another CPU\n"
                   "key %s\navx2_gflops %.1f\navx512_gflops %.1f\n",
                   key, avx2, avx512);
  if (n > 0 && (size_t)n < sizeof text) (void)kiln_write_file_atomic(path, text, (size_t)n);
}

/* Five interleaved pairs of short runs, the best of each: a slice of time another process takes
 * touches one run, not the figure. */
static void measure_peaks(double *avx2, double *avx512) {
  *avx2 = *avx512 = 0;
  const long r8 = kiln_fma_calibrate(KILN_FMA_AVX2, 0.02);
  const long r16 = kiln_fma_calibrate(KILN_FMA_AVX512, 0.02);
  for (int rep = 0; rep < 5; rep++) {
    if (r8) *avx2 = fmax(*avx2, kiln_fma_gflops(KILN_FMA_AVX2, 1, r8, 1));
    if (r16) *avx512 = fmax(*avx512, kiln_fma_gflops(KILN_FMA_AVX512, 1, r16, 1));
  }
}

static void machine_peaks(kiln_ce_machine *m, const kiln_config *cfg) {
  kiln_ce_machine_set_peaks(m, NAN, NAN);
#if defined(__x86_64__)
  char boot[64], key[400];
  boot_id(boot, sizeof boot);
  cpu_key(m, boot, key, sizeof key);
  double avx2, avx512;
  if (boot[0] && read_cache(cfg->machine_cache, key, &avx2, &avx512)) {
    m->peaks_cached = true;
  } else {
    measure_peaks(&avx2, &avx512);
    if (boot[0]) write_cache(cfg->machine_cache, key, avx2, avx512);
  }
  kiln_ce_machine_set_peaks(m, avx2, avx512);
#else
  (void)cfg; /* the FMA loops are x86's: the class goes without a rate */
#endif
}

void kiln_ce_machine_describe(kiln_ce_machine *m, const kiln_config *cfg) {
  if (!cfg) cfg = kiln_config_defaults();
  memset(m, 0, sizeof *m);
  char *text = NULL;
  size_t len = 0;
  if (kiln_read_file_max("/proc/cpuinfo", 64u << 20, &text, &len) == KILN_OK) {
    kiln_ce_machine_parse_cpuinfo(m, text);
  } else {
    kiln_ce_machine_parse_cpuinfo(m, "");
  }
  free(text);
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  m->cores = cores > 0 ? (int)cores : 1;
  m->usable_cores = kiln_ce_usable_cores();
  FILE *f = fopen("/proc/meminfo", "r");
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
  machine_peaks(m, cfg);
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

/* The model name without trademarks, "CPU", "Processor" and the "@ 2.20GHz" tail, as a slug:
 * "Intel(R) Xeon(R) CPU E5-2680 v4 @ 2.40GHz" -> "intel-xeon-e5-2680-v4". */
static void model_slug(const char *name, char *slug, size_t n) {
  char cpu[sizeof ((kiln_ce_machine *)0)->cpu];
  snprintf(cpu, sizeof cpu, "%s", name);
  char *at = strchr(cpu, '@');
  if (at) *at = '\0';
  static const char *const drop[] = {"(R)", "(r)", "(TM)", "(tm)", " CPU", " Processor"};
  for (size_t d = 0; d < sizeof drop / sizeof drop[0]; d++) {
    char *p;
    size_t len = strlen(drop[d]);
    while ((p = strstr(cpu, drop[d]))) memmove(p, p + len, strlen(p + len) + 1);
  }
  size_t k = 0;
  for (const char *p = cpu; *p && k + 1 < n; p++) {
    unsigned char c = (unsigned char)*p;
    if (isalnum(c)) slug[k++] = (char)tolower(c);
    else if (k && slug[k - 1] != '-') slug[k++] = '-';
  }
  while (k && slug[k - 1] == '-') k--;
  slug[k] = '\0';
}

void kiln_ce_machine_class(const kiln_ce_machine *m, char *buf, size_t n) {
  const int cores = m->usable_cores > 0 ? m->usable_cores : m->cores;
  if (m->vendor[0] && m->family >= 0 && m->model >= 0) {
    snprintf(buf, n, "%s-f%dm%d%s%s-%dc", m->vendor, m->family, m->model,
             m->vector_rate[0] ? "-" : "", m->vector_rate, cores);
    return;
  }
  char slug[48]; /* a class is a folder name of at most 63 characters (ce_valid_name) */
  model_slug(!strcmp(m->cpu, "unknown CPU") ? "" : m->cpu, slug, sizeof slug);
  snprintf(buf, n, "%s%s%s-%dc", slug[0] ? slug : "unknown-cpu", m->vector_rate[0] ? "-" : "",
           m->vector_rate, cores);
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

/* A peak as JSON: null when not measured. */
static void json_peak(char *out, size_t n, double v) {
  if (isfinite(v)) snprintf(out, n, "%.1f", v);
  else snprintf(out, n, "null");
}

char *kiln_ce_machine_json(const kiln_ce_machine *m) {
  char cpu[300], vendor[40], flags[330], compiler[160], blas[420], os[220], host[160];
  json_str(cpu, sizeof cpu, m->cpu);
  json_str(vendor, sizeof vendor, m->vendor);
  json_str(flags, sizeof flags, m->flags);
  json_str(compiler, sizeof compiler, m->compiler);
  json_str(blas, sizeof blas, m->blas);
  json_str(os, sizeof os, m->os);
  json_str(host, sizeof host, m->hostname);
  char p8[32], p16[32];
  json_peak(p8, sizeof p8, m->fma_gflops[0]);
  json_peak(p16, sizeof p16, m->fma_gflops[1]);
  size_t n = 4096;
  char *out = malloc(n);
  if (!out) return NULL;
  snprintf(out, n,
           "{\"cpu\":\"%s\",\"vendor\":\"%s\",\"family\":%d,\"model\":%d,\"stepping\":%d,"
           "\"flags\":\"%s\",\"fma_gflops_1thread\":{\"avx2\":%s,\"avx512\":%s},"
           "\"vector_rate\":\"%s\",\"cores\":%d,\"usable_cores\":%d,\"mem_gib\":%.1f,"
           "\"compiler\":\"%s\",\"blas\":\"%s\",\"threads\":%d,\"os\":\"%s\",\"hostname\":\"%s\"}",
           cpu, vendor, m->family, m->model, m->stepping, flags, p8, p16, m->vector_rate,
           m->cores, m->usable_cores, m->mem_gib, compiler, blas, m->threads, os, host);
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
