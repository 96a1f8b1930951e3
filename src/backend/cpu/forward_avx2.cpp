// The CPU numerics compiled for the avx2 target (forward_impl.hpp).
#define GDN_CPU_TARGET avx2
#include "forward_impl.hpp"
