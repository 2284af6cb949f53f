/* CE's machine description and class (src/ce/machine.c): the CPU fields read from /proc/cpuinfo
 * texts of several machines, the class they give with measured FMA peaks (hosts that differ
 * only in family and model, or only in the full-rate vector width, must get different classes),
 * and the once-a-boot cache of the peaks. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ce_support.h"
#include "files.h"
#include "gradcheck.h"
#include "kiln/ce.h"
#include "kiln/cpu.h"

/* The first two processors of the development VM on 2026-12-03 (an Intel host behind a
 * hypervisor that shortens the model name), as /proc/cpuinfo printed them. */
static const char intel_vm[] =
    "processor\t: 0\n"
    "vendor_id\t: GenuineIntel\n"
    "cpu family\t: 6\n"
    "model\t\t: 167\n"
    "model name\t: Intel(R) Xeon(R) Processor\n"
    "stepping\t: 1\n"
    "microcode\t: 0x1\n"
    "cpu MHz\t\t: 2600.000\n"
    "cache size\t: 491520 KB\n"
    "siblings\t: 2\n"
    "cpu cores\t: 2\n"
    "fpu\t\t: yes\n"
    "flags\t\t: fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 "
    "clflush mmx fxsr sse sse2 ss ht syscall nx pdpe1gb rdtscp lm constant_tsc rep_good nopl "
    "xtopology nonstop_tsc cpuid tsc_known_freq pni pclmulqdq ssse3 fma cx16 pcid sse4_1 sse4_2 "
    "x2apic movbe popcnt tsc_deadline_timer aes xsave avx f16c rdrand hypervisor lahf_lm abm "
    "3dnowprefetch cpuid_fault fsgsbase tsc_adjust bmi1 hle avx2 smep bmi2 erms invpcid rtm "
    "avx512f avx512dq rdseed adx smap avx512ifma clflushopt clwb avx512cd sha_ni avx512bw "
    "avx512vl xsaveopt xsavec xgetbv1 xsaves avx_vnni avx512_bf16 arat avx512vbmi umip "
    "avx512_vbmi2 gfni vaes vpclmulqdq avx512_vnni avx512_bitalg avx512_vpopcntdq rdpid "
    "cldemote movdiri movdir64b fsrm serialize tsxldtrk amx_bf16 avx512_fp16 amx_tile amx_int8 "
    "arch_capabilities\n"
    "bugs\t\t: spectre_v1 spectre_v2 spec_store_bypass swapgs retbleed bhi\n"
    "bogomips\t: 5200.00\n"
    "address sizes\t: 48 bits physical, 57 bits virtual\n"
    "power management:\n"
    "\n"
    "processor\t: 1\n"
    "vendor_id\t: GenuineIntel\n"
    "cpu family\t: 6\n"
    "model\t\t: 167\n"
    "model name\t: Intel(R) Xeon(R) Processor\n"
    "stepping\t: 1\n"
    "flags\t\t: fpu vme de pse tsc msr\n"
    "\n";

/* An AMD EPYC VM as its hypervisor presents it: the model name cut to "AMD EPYC", family 25
 * (0x19, Zen 3 and 4), model 17 (0x11), on every host it moves to. `%d`: the family, `%d` the
 * model, so that a host that differs only there can be written. */
static void amd_vm(char *buf, size_t n, int family, int model) {
  snprintf(buf, n,
           "processor\t: 0\n"
           "vendor_id\t: AuthenticAMD\n"
           "cpu family\t: %d\n"
           "model\t\t: %d\n"
           "model name\t: AMD EPYC\n"
           "stepping\t: 1\n"
           "microcode\t: 0x1000065\n"
           "cpu MHz\t\t: 3249.998\n"
           "flags\t\t: fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 "
           "clflush mmx fxsr sse sse2 ht syscall nx mmxext fxsr_opt pdpe1gb rdtscp lm "
           "constant_tsc rep_good nopl nonstop_tsc cpuid extd_apicid tsc_known_freq pni "
           "pclmulqdq ssse3 fma cx16 pcid sse4_1 sse4_2 x2apic movbe popcnt aes xsave avx f16c "
           "rdrand hypervisor lahf_lm cmp_legacy cr8_legacy abm sse4a misalignsse 3dnowprefetch "
           "osvw topoext perfctr_core ssbd ibrs ibpb stibp vmmcall fsgsbase bmi1 avx2 smep bmi2 "
           "erms invpcid avx512f avx512dq rdseed adx smap avx512ifma clflushopt clwb avx512cd "
           "sha_ni avx512bw avx512vl xsaveopt xsavec xgetbv1 xsaves avx512_bf16 clzero xsaveerptr "
           "wbnoinvd arat avx512vbmi umip pku ospke avx512_vbmi2 gfni vaes vpclmulqdq "
           "avx512_vnni avx512_bitalg avx512_vpopcntdq rdpid fsrm\n"
           "bogomips\t: 6499.99\n"
           "\n"
           "processor\t: 1\n"
           "vendor_id\t: AuthenticAMD\n"
           "cpu family\t: %d\n"
           "model\t\t: %d\n"
           "\n",
           family, model, family, model);
}

/* An Arm server (Neoverse N1: implementer 0x41, part 0xd0c) as an aarch64 kernel prints it. */
static const char arm_n1[] =
    "processor\t: 0\n"
    "BogoMIPS\t: 50.00\n"
    "Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid "
    "asimdrdm lrcpc dcpop asimddp ssbs\n"
    "CPU implementer\t: 0x41\n"
    "CPU architecture: 8\n"
    "CPU variant\t: 0x3\n"
    "CPU part\t: 0xd0c\n"
    "CPU revision\t: 1\n"
    "\n"
    "processor\t: 1\n"
    "BogoMIPS\t: 50.00\n"
    "CPU implementer\t: 0x41\n"
    "CPU part\t: 0xd0c\n"
    "\n";

/* A processor that gives nothing but its name (POWER's /proc/cpuinfo). */
static const char power9[] =
    "processor\t: 0\n"
    "cpu\t\t: POWER9 (architected), altivec supported\n"
    "clock\t\t: 2200.000000MHz\n"
    "model name\t: IBM POWER9\n"
    "\n";

static void class_of(const char *cpuinfo, int cores, double avx2, double avx512, char *cls,
                     size_t n) {
  kiln_ce_machine m;
  memset(&m, 0, sizeof m);
  kiln_ce_machine_parse_cpuinfo(&m, cpuinfo);
  m.cores = m.usable_cores = cores;
  kiln_ce_machine_set_peaks(&m, avx2, avx512);
  kiln_ce_machine_class(&m, cls, n);
}

static void test_parse_cpuinfo(void **state) {
  (void)state;
  kiln_ce_machine m;
  memset(&m, 0, sizeof m);
  kiln_ce_machine_parse_cpuinfo(&m, intel_vm);
  assert_string_equal(m.cpu, "Intel(R) Xeon(R) Processor");
  assert_string_equal(m.vendor, "intel");
  assert_int_equal(m.family, 6);
  assert_int_equal(m.model, 167);
  assert_int_equal(m.stepping, 1);
  /* the flags that matter, in a fixed order, from the first processor's full list only */
  assert_string_equal(m.flags, "avx2 fma avx512f avx512_bf16 amx_bf16 amx_tile");

  char amd[4096];
  amd_vm(amd, sizeof amd, 25, 17);
  memset(&m, 0, sizeof m);
  kiln_ce_machine_parse_cpuinfo(&m, amd);
  assert_string_equal(m.cpu, "AMD EPYC");
  assert_string_equal(m.vendor, "amd");
  assert_int_equal(m.family, 25);
  assert_int_equal(m.model, 17);
  assert_int_equal(m.stepping, 1);
  assert_string_equal(m.flags, "avx2 fma avx512f avx512_bf16");

  memset(&m, 0, sizeof m);
  kiln_ce_machine_parse_cpuinfo(&m, arm_n1);
  assert_string_equal(m.vendor, "arm");
  assert_int_equal(m.family, 8);
  assert_int_equal(m.model, 0xd0c);
  assert_int_equal(m.stepping, 1);
  assert_string_equal(m.flags, "asimd");
  assert_string_equal(m.cpu, "unknown CPU"); /* an Arm kernel prints no model name */

  memset(&m, 0, sizeof m);
  kiln_ce_machine_parse_cpuinfo(&m, power9);
  assert_string_equal(m.cpu, "IBM POWER9");
  assert_string_equal(m.vendor, "");
  assert_int_equal(m.family, -1);
  assert_int_equal(m.model, -1);

  /* nothing at all, and damaged values: unknown, not garbage */
  memset(&m, 0, sizeof m);
  kiln_ce_machine_parse_cpuinfo(&m, "");
  assert_string_equal(m.cpu, "unknown CPU");
  assert_int_equal(m.family, -1);
  memset(&m, 0, sizeof m);
  kiln_ce_machine_parse_cpuinfo(&m, "vendor_id : GenuineIntel\ncpu family : x\nmodel : -3\n"
                                    "model name :\nflags : avx2avx512f fma\n");
  assert_int_equal(m.family, -1);
  assert_int_equal(m.model, -1);
  assert_string_equal(m.flags, "fma");
  assert_string_equal(m.cpu, "unknown CPU");
}

static void test_classes(void **state) {
  (void)state;
  char cls[128], other[128], amd[4096];
  /* the VM of issue 33: AVX-512 at the AVX2 rate (112.7 GFLOP/s a core either way) */
  amd_vm(amd, sizeof amd, 25, 17);
  class_of(amd, 2, 112.7, 112.7, cls, sizeof cls);
  assert_string_equal(cls, "amd-f25m17-avx2rate-2c");
  /* the same cpuinfo on a host with two 512-bit pipes (226.5 against 112.7): another class */
  class_of(amd, 2, 112.7, 226.5, other, sizeof other);
  assert_string_equal(other, "amd-f25m17-avx512rate-2c");
  assert_string_not_equal(cls, other);
  /* the same peaks, another family and model: another class */
  amd_vm(amd, sizeof amd, 26, 2);
  class_of(amd, 2, 112.7, 112.7, other, sizeof other);
  assert_string_equal(other, "amd-f26m2-avx2rate-2c");
  assert_string_not_equal(cls, other);
  amd_vm(amd, sizeof amd, 25, 1);
  class_of(amd, 2, 112.7, 112.7, other, sizeof other);
  assert_string_not_equal(cls, other);
  /* the cores kiln may use count */
  amd_vm(amd, sizeof amd, 25, 17);
  class_of(amd, 8, 112.7, 112.7, other, sizeof other);
  assert_string_equal(other, "amd-f25m17-avx2rate-8c");

  /* this development VM: 125.6 and 233.7 GFLOP/s (kiln-fma-peak, 2026-12-03) */
  class_of(intel_vm, 2, 125.6, 233.7, cls, sizeof cls);
  assert_string_equal(cls, "intel-f6m167-avx512rate-2c");
  /* the rule's edge: 1.5 x the AVX2 rate; AVX-512's lower clocks on some Intel parts give
   * 1.6-1.9, one 512-bit pipe 0.9-1.1 */
  class_of(intel_vm, 2, 100, 149.9, cls, sizeof cls);
  assert_string_equal(cls, "intel-f6m167-avx2rate-2c");
  class_of(intel_vm, 2, 100, 160, cls, sizeof cls);
  assert_string_equal(cls, "intel-f6m167-avx512rate-2c");
  /* no AVX-512 at all (0: no such loop), no AVX2 either, and not measured */
  class_of(intel_vm, 4, 90, 0, cls, sizeof cls);
  assert_string_equal(cls, "intel-f6m167-avx2rate-4c");
  class_of(intel_vm, 4, 0, 0, cls, sizeof cls);
  assert_string_equal(cls, "intel-f6m167-sserate-4c");
  class_of(intel_vm, 4, NAN, NAN, cls, sizeof cls);
  assert_string_equal(cls, "intel-f6m167-4c");

  /* Arm: no FMA loops there, so no rate; POWER: the model name as a slug */
  class_of(arm_n1, 64, NAN, NAN, cls, sizeof cls);
  assert_string_equal(cls, "arm-f8m3340-64c");
  class_of(power9, 8, NAN, NAN, cls, sizeof cls);
  assert_string_equal(cls, "ibm-power9-8c");
  class_of("", 1, NAN, NAN, cls, sizeof cls);
  assert_string_equal(cls, "unknown-cpu-1c");
  class_of("model name : Intel(R) Xeon(R) CPU E5-2680 v4 @ 2.40GHz\n", 16, NAN, NAN, cls,
           sizeof cls);
  assert_string_equal(cls, "intel-xeon-e5-2680-v4-16c");
}

/* This machine, twice: measured and cached, then read from the cache; a cache of another boot
 * or CPU, or a damaged one, is measured again. */
static void test_describe_and_cache(void **state) {
  (void)state;
  char dir[64];
  make_tmpdir(dir, sizeof dir, "mach");
  kiln_config cfg = *kiln_test_config();
  snprintf(cfg.machine_cache, sizeof cfg.machine_cache, "%s/sub/machine.txt", dir);
  kiln_ce_machine a, b;
  kiln_ce_machine_describe(&a, &cfg);
  assert_true(a.cores >= 1);
  assert_true(a.usable_cores >= 1 && a.usable_cores <= a.cores);
  assert_true(a.mem_gib > 0);
  assert_true(a.compiler[0] && a.blas[0]);
  char cls[128];
  kiln_ce_machine_class(&a, cls, sizeof cls);
  char tail[16];
  snprintf(tail, sizeof tail, "-%dc", a.usable_cores);
  assert_true(strlen(cls) > strlen(tail) && !strcmp(cls + strlen(cls) - strlen(tail), tail));
  char *json = kiln_ce_machine_json(&a);
  assert_non_null(json);
  assert_contains(json, "\"family\":");
  assert_contains(json, "\"stepping\":");
  assert_contains(json, "\"flags\":\"");
  assert_contains(json, "\"fma_gflops_1thread\":{\"avx2\":");
  assert_contains(json, "\"vector_rate\":\"");
  assert_contains(json, "\"usable_cores\":");
  free(json);
#if defined(__x86_64__)
  assert_false(a.peaks_cached);
  assert_true(a.vector_rate[0] != '\0');
  assert_true(a.fma_gflops[0] >= 0 && isfinite(a.fma_gflops[1]));
  if (kiln_fma_supported(KILN_FMA_AVX2)) assert_true(a.fma_gflops[0] > 1);
  assert_true(strstr(cls, a.vector_rate) != NULL);
  char *text = NULL;
  size_t len = 0;
  assert_int_equal(kiln_read_file(cfg.machine_cache, &text, &len), KILN_OK);
  assert_contains(text, "\navx2_gflops ");
  kiln_ce_machine_describe(&b, &cfg);
  assert_true(b.peaks_cached);
  assert_true(fabs(b.fma_gflops[0] - a.fma_gflops[0]) < 0.06);
  assert_true(fabs(b.fma_gflops[1] - a.fma_gflops[1]) < 0.06);
  assert_string_equal(b.vector_rate, a.vector_rate);
  /* another boot's figures: measured again, and the file rewritten for this boot */
  char *key = strstr(text, "key ");
  assert_non_null(key);
  key[4] = key[4] == '0' ? '1' : '0';
  assert_int_equal(kiln_write_file_atomic(cfg.machine_cache, text, len), KILN_OK);
  kiln_ce_machine_describe(&b, &cfg);
  assert_false(b.peaks_cached);
  kiln_ce_machine_describe(&b, &cfg);
  assert_true(b.peaks_cached);
  /* damaged: a figure that is not a number */
  free(text);
  assert_int_equal(kiln_read_file(cfg.machine_cache, &text, &len), KILN_OK);
  char *fig = strstr(text, "avx512_gflops ");
  assert_non_null(fig);
  fig[14] = 'x';
  assert_int_equal(kiln_write_file_atomic(cfg.machine_cache, text, len), KILN_OK);
  kiln_ce_machine_describe(&b, &cfg);
  assert_false(b.peaks_cached);
  free(text);
#endif
  /* no cache place at all: measured every time, nothing written */
  cfg.machine_cache[0] = '\0';
  kiln_ce_machine_describe(&b, &cfg);
  assert_false(b.peaks_cached);
  rm_tree(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_parse_cpuinfo),
      cmocka_unit_test(test_classes),
      cmocka_unit_test(test_describe_and_cache),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
