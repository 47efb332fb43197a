/*
 * cpu_features.h — which instruction set the CPU kernels use, decided once
 * at run time so one binary runs on any x86-64 (or aarch64) machine.
 *
 * Levels are ordered: a CPU at AVX512 also runs the AVX2 and SCALAR
 * kernels, which is how the tests check every path against the plain C one
 * on the same machine. The environment variable SPARK_CPU=scalar|avx2|avx512|neon
 * caps the level (it can lower it, never raise it above what the CPU has).
 */
#ifndef SPARK_BACKEND_CPU_FEATURES_H
#define SPARK_BACKEND_CPU_FEATURES_H

typedef enum cpu_isa {
    CPU_ISA_SCALAR = 0, /* portable C: the reference path */
    CPU_ISA_AVX2,       /* AVX2 + FMA + F16C (Haswell, Zen 1 and later) */
    CPU_ISA_AVX512,     /* AVX-512 F/BW/VL/DQ (Skylake-X, Zen 4 and later) */
    CPU_ISA_NEON,       /* aarch64 Advanced SIMD */
    CPU_ISA_COUNT
} cpu_isa;

/* The best level this CPU supports (ignores SPARK_CPU). */
cpu_isa cpu_isa_detect(void);

/* The level the backend uses: cpu_isa_detect() capped by SPARK_CPU. */
cpu_isa cpu_isa_active(void);

/* Can this machine run kernels of level `isa`? */
int cpu_isa_supported(cpu_isa isa);

/* "scalar", "avx2", "avx512", "neon". */
const char *cpu_isa_name(cpu_isa isa);

/* Physical cores of the online CPUs (hyper-threads counted once), >= 1. */
int cpu_physical_cores(void);

/* An AMD x86 CPU (the single-token GEMVs' lane layout depends on it: cpu_backend.c). */
int cpu_is_amd(void);

/* Extra instructions present beyond the level (for reports): "avx512_vnni avx512_bf16 ...". */
const char *cpu_feature_string(void);

#endif
