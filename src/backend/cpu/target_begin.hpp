// Opens a region of code compiled for one CPU target (no include guard: once per target TU).
//
// The CPU numerics (src/backend/cpu/kernels/) are compiled once per target — avx512 (x86-64-v4
// features), avx2 (x86-64-v3) and scalar (the baseline x86-64 every CPU has) — in the namespace
// gdn::cpu::<target>, and the backend picks one at run time from CPUID (target.hpp); avx512bf16 is
// avx512 plus the bf16 dot-product instruction, which only the bf16 KV cache's attention uses. The library
// itself is built without -march flags, so it runs on any x86-64 CPU.
//
// The target is applied by pragma to the functions defined in the region, not by compiler flags to
// the whole file: templates and inline functions defined outside it (the standard library, libgdn's
// public headers) are then compiled for the baseline wherever they are instantiated, so no copy of
// them built with AVX-512 instructions can be chosen by the linker for code that runs elsewhere.
// That is why everything a kernel header needs is included before this file (forward_impl.hpp).
//
// Defines GDN_CPU_AVX512BF16 / GDN_CPU_AVX512 / GDN_CPU_AVX2 (0 or 1) for the kernels' vector paths: the compiler's own
// __AVX512F__ / __AVX2__ follow the command line, not the pragma.

#if !defined(GDN_CPU_TARGET)
#error "define GDN_CPU_TARGET (avx512, avx2 or scalar) before including target_begin.hpp"
#endif
#define GDN_CPU_TARGET_REGION 1

#define GDN_CPU_TARGET_avx512 1
#define GDN_CPU_TARGET_avx2 2
#define GDN_CPU_TARGET_scalar 3
#define GDN_CPU_TARGET_reference 4
#define GDN_CPU_TARGET_avx512bf16 5
#define GDN_CPU_CAT_(a, b) a##b
#define GDN_CPU_CAT(a, b) GDN_CPU_CAT_(a, b)
#define GDN_CPU_TARGET_ID GDN_CPU_CAT(GDN_CPU_TARGET_, GDN_CPU_TARGET)
#define GDN_CPU_STR_(x) #x
#define GDN_CPU_STR(x) GDN_CPU_STR_(x)

#if GDN_CPU_TARGET_ID == GDN_CPU_TARGET_avx512bf16 && defined(__x86_64__)
#define GDN_CPU_AVX512BF16 1
#define GDN_CPU_AVX512 1
#define GDN_CPU_AVX2 1
#define GDN_CPU_TARGET_FEATURES "avx512f,avx512bw,avx512dq,avx512vl,avx512bf16,avx2,fma,f16c,bmi,bmi2,lzcnt,popcnt,movbe"
#elif GDN_CPU_TARGET_ID == GDN_CPU_TARGET_avx512 && defined(__x86_64__)
#define GDN_CPU_AVX512BF16 0
#define GDN_CPU_AVX512 1
#define GDN_CPU_AVX2 1
#define GDN_CPU_TARGET_FEATURES "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c,bmi,bmi2,lzcnt,popcnt,movbe"
#elif GDN_CPU_TARGET_ID == GDN_CPU_TARGET_avx2 && defined(__x86_64__)
#define GDN_CPU_AVX512BF16 0
#define GDN_CPU_AVX512 0
#define GDN_CPU_AVX2 1
#define GDN_CPU_TARGET_FEATURES "avx2,fma,f16c,bmi,bmi2,lzcnt,popcnt,movbe"
#elif GDN_CPU_TARGET_ID == GDN_CPU_TARGET_scalar || GDN_CPU_TARGET_ID == GDN_CPU_TARGET_reference || !defined(__x86_64__)
#define GDN_CPU_AVX512BF16 0
#define GDN_CPU_AVX512 0
#define GDN_CPU_AVX2 0
#else
#error "unknown GDN_CPU_TARGET"
#endif

#define GDN_CPU_PRAGMA_(x) _Pragma(#x)
#define GDN_CPU_PRAGMA(x) GDN_CPU_PRAGMA_(x)
#if defined(GDN_CPU_TARGET_FEATURES)
#if defined(__clang__)
GDN_CPU_PRAGMA(clang attribute push(__attribute__((target(GDN_CPU_TARGET_FEATURES))), apply_to = function))
#elif defined(__GNUC__)
GDN_CPU_PRAGMA(GCC push_options)
GDN_CPU_PRAGMA(GCC target(GDN_CPU_TARGET_FEATURES))
#endif
#endif
