// The CPU numerics compiled for the avx512bf16 target (forward_impl.hpp).
#define GDN_CPU_TARGET avx512bf16
#include "forward_impl.hpp"
