// gemm.hpp for the CPU emulator: y = alpha·x·Wᵀ + beta·c in a float loop (float32 sums in input
// order, one rounding to the output type), run or recorded on the emulated stream like a kernel.

#include "emulate.hpp"
#include "gemm.hpp"

GDN_CUDA_NAMESPACE_BEGIN

struct Gemm::Impl {};

Gemm::Gemm() = default;
Gemm::~Gemm() = default;

int Gemm::init(std::size_t) {
  impl_ = std::make_unique<Impl>();
  return 0;
}

int Gemm::run(const GemmArgs& a, cudaStream_t) {
  if (!impl_) return 1;  // CUBLAS_STATUS_NOT_INITIALIZED
  if (a.x == nullptr || a.w == nullptr || a.y == nullptr || a.rows < 0 || a.in < 1 || a.out < 1 || a.ldx < a.in ||
      a.ldw < a.in || a.ldy < a.out)
    return 7;  // CUBLAS_STATUS_INVALID_VALUE
  if (emu::device().sticky != cudaSuccess) return 13;  // CUBLAS_STATUS_EXECUTION_FAILED
  GemmArgs g = a;
  if (g.c == nullptr) {
    g.c = g.y;
    g.ldc = g.ldy;
  }
  emu::enqueue([g] {
    const bool f32 = g.out_type == GemmOut::float32;
    for (int r = 0; r < g.rows; ++r)
      for (int o = 0; o < g.out; ++o) {
        float acc = 0.0f;
        for (int i = 0; i < g.in; ++i) acc += __bfloat162float(g.x[r * g.ldx + i]) * __bfloat162float(g.w[o * g.ldw + i]);
        float c = 0.0f;
        if (g.beta != 0.0f)
          c = f32 ? static_cast<const float*>(g.c)[r * g.ldc + o]
                  : __bfloat162float(static_cast<const __nv_bfloat16*>(g.c)[r * g.ldc + o]);
        const float v = g.alpha * acc + g.beta * c;
        if (f32) static_cast<float*>(g.y)[r * g.ldy + o] = v;
        else static_cast<__nv_bfloat16*>(g.y)[r * g.ldy + o] = __float2bfloat16(v);
      }
  });
  return 0;
}

GDN_CUDA_NAMESPACE_END
