// Closes the region target_begin.hpp opened.
#if defined(GDN_CPU_TARGET_FEATURES)
#if defined(__clang__)
GDN_CPU_PRAGMA(clang attribute pop)
#elif defined(__GNUC__)
GDN_CPU_PRAGMA(GCC pop_options)
#endif
#undef GDN_CPU_TARGET_FEATURES
#endif
#undef GDN_CPU_TARGET_REGION
#undef GDN_CPU_AVX512BF16
#undef GDN_CPU_AVX512
#undef GDN_CPU_AVX2
