// The CPU numerics compiled for the avx512 target (forward_impl.hpp).
#define GDN_CPU_TARGET avx512
#include "forward_impl.hpp"
