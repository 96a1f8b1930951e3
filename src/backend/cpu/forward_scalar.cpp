// The CPU numerics compiled for the scalar target (forward_impl.hpp).
#define GDN_CPU_TARGET scalar
#include "forward_impl.hpp"
