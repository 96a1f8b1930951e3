#pragma once
// A check that holds in every build type: a fuzz target reports a broken promise as a crash, with
// the condition and line, so libFuzzer saves the input that broke it.

#include <cstdio>
#include <cstdlib>

#define GDN_FUZZ_CHECK(cond)                                                                   \
  do {                                                                                         \
    if (!(cond)) {                                                                             \
      std::fprintf(stderr, "%s:%d: fuzz check failed: %s\n", __FILE__, __LINE__, #cond);     \
      std::abort();                                                                            \
    }                                                                                          \
  } while (0)
