/*
 * cpu_features.c — run-time CPU detection for kernel dispatch, and the
 * physical core count that sets the default thread count.
 *
 * x86 uses GCC/Clang's __builtin_cpu_supports (which also checks that the OS
 * saves the wide registers); aarch64 always has NEON. The physical core count
 * comes from sysfs topology (package id, core id) pairs, so SMT siblings are
 * counted once: decode is memory-bound and a second hyper-thread per core
 * only adds contention.
 */
#include "backend/cpu/cpu_features.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

cpu_isa cpu_isa_detect(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("fma"))
        return CPU_ISA_AVX512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c"))
        return CPU_ISA_AVX2;
    return CPU_ISA_SCALAR;
#elif defined(__aarch64__) && defined(__ARM_NEON)
    return CPU_ISA_NEON;
#else
    return CPU_ISA_SCALAR;
#endif
}

int cpu_isa_supported(cpu_isa isa)
{
    cpu_isa best = cpu_isa_detect();
    if (isa == CPU_ISA_SCALAR) return 1;
    if (isa == CPU_ISA_NEON) return best == CPU_ISA_NEON;
    return best != CPU_ISA_NEON && isa <= best;
}

const char *cpu_isa_name(cpu_isa isa)
{
    static const char *const names[CPU_ISA_COUNT] = {"scalar", "avx2", "avx512", "neon"};
    return (unsigned)isa < CPU_ISA_COUNT ? names[isa] : "invalid";
}

cpu_isa cpu_isa_active(void)
{
    cpu_isa best = cpu_isa_detect();
    const char *want = getenv("SPARK_CPU");
    if (!want || !*want) return best;
    for (int i = 0; i < CPU_ISA_COUNT; i++)
        if (!strcmp(want, cpu_isa_name((cpu_isa)i)) && cpu_isa_supported((cpu_isa)i)) return (cpu_isa)i;
    return best; /* unknown or unsupported request: the best level */
}

static int read_int_file(const char *path, int *out)
{
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    int ok = fscanf(f, "%d", out) == 1;
    fclose(f);
    return ok;
}

int cpu_physical_cores(void)
{
    cpu_set_t set;
    int logical = (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (logical < 1) logical = 1;
    if (sched_getaffinity(0, sizeof set, &set) != 0) return logical;
    logical = CPU_COUNT(&set) > 0 ? CPU_COUNT(&set) : logical;
    enum { MAX_CORES = 1024 };
    long seen[MAX_CORES];
    int n_seen = 0;
    for (int cpu = 0; cpu < CPU_SETSIZE && n_seen < MAX_CORES; cpu++) {
        if (!CPU_ISSET(cpu, &set)) continue;
        char path[128];
        int pkg = 0, core = 0;
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%d/topology/core_id", cpu);
        if (!read_int_file(path, &core)) return logical; /* no topology: trust the logical count */
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%d/topology/physical_package_id", cpu);
        read_int_file(path, &pkg);
        long key = (long)pkg * 1000000L + core;
        int dup = 0;
        for (int i = 0; i < n_seen && !dup; i++) dup = seen[i] == key;
        if (!dup) seen[n_seen++] = key;
    }
    return n_seen > 0 && n_seen <= logical ? n_seen : logical;
}

const char *cpu_feature_string(void)
{
#if defined(__x86_64__) || defined(__i386__)
    static char buf[160];
    buf[0] = '\0';
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512vnni")) strcat(buf, "avx512_vnni ");
    if (__builtin_cpu_supports("avx512bf16")) strcat(buf, "avx512_bf16 ");
    if (__builtin_cpu_supports("avx512fp16")) strcat(buf, "avx512_fp16 ");
    if (__builtin_cpu_supports("avxvnni")) strcat(buf, "avx_vnni ");
    size_t n = strlen(buf);
    if (n) buf[n - 1] = '\0';
    return buf;
#else
    return "";
#endif
}

int cpu_is_amd(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    return __builtin_cpu_is("amd");
#else
    return 0;
#endif
}
