// Fused gated delta rule decode step: one thread block per head, one thread per value column b.
// Each thread owns column b of S (dk floats, kept in registers/local memory across the two passes):
//   S[:,b] *= exp(g);  u_b = β (v_b − Σ_a S[a,b] k_a);  S[:,b] += k u_b;  o_b = Σ_a S[a,b] q_a
// q and k are staged in shared memory. The state is read once and written once per token.

#include <cuda_runtime.h>

#include "gdn_cuda.hpp"

namespace gdn::cuda {
namespace {

template <int MaxDk>
__global__ void delta_rule_decode_kernel(const float* __restrict__ q, const float* __restrict__ k,
                                         const float* __restrict__ v, const float* __restrict__ g,
                                         const float* __restrict__ beta, float* __restrict__ state,
                                         float* __restrict__ out, int dk, int dv) {
  __shared__ float sq[MaxDk];
  __shared__ float sk[MaxDk];
  const int h = blockIdx.x;
  for (int a = threadIdx.x; a < dk; a += blockDim.x) {
    sq[a] = q[static_cast<long long>(h) * dk + a];
    sk[a] = k[static_cast<long long>(h) * dk + a];
  }
  __syncthreads();
  const float decay = __expf(g[h]);
  const float b_h = beta[h];
  float* S = state + static_cast<long long>(h) * dk * dv;
  for (int b = threadIdx.x; b < dv; b += blockDim.x) {
    float kv = 0.0f;
    for (int a = 0; a < dk; ++a) {
      const float s = S[static_cast<long long>(a) * dv + b] * decay;
      S[static_cast<long long>(a) * dv + b] = s;
      kv += s * sk[a];
    }
    const float u = b_h * (v[static_cast<long long>(h) * dv + b] - kv);
    float o = 0.0f;
    for (int a = 0; a < dk; ++a) {
      const float s = S[static_cast<long long>(a) * dv + b] + sk[a] * u;
      S[static_cast<long long>(a) * dv + b] = s;
      o += s * sq[a];
    }
    out[static_cast<long long>(h) * dv + b] = o;
  }
}

}  // namespace

int delta_rule_decode(const float* q, const float* k, const float* v, const float* g, const float* beta, float* state,
                      float* out, int heads, int dk, int dv, void* stream) noexcept {
  if (dk > 256 || dk <= 0 || dv <= 0 || heads <= 0) return static_cast<int>(cudaErrorInvalidValue);
  const int threads = dv < 128 ? dv : 128;
  delta_rule_decode_kernel<256><<<heads, threads, 0, static_cast<cudaStream_t>(stream)>>>(q, k, v, g, beta, state, out, dk, dv);
  return static_cast<int>(cudaGetLastError());
}

int delta_rule_decode_host(const float* q, const float* k, const float* v, const float* g, const float* beta,
                           float* state, float* out, int heads, int dk, int dv) noexcept {
  const size_t nq = static_cast<size_t>(heads) * dk, nv = static_cast<size_t>(heads) * dv;
  const size_t ns = static_cast<size_t>(heads) * dk * dv;
  float *dq = nullptr, *dk_ = nullptr, *dv_ = nullptr, *dg = nullptr, *db = nullptr, *ds = nullptr, *dout = nullptr;
  cudaError_t e = cudaSuccess;
  auto alloc = [&](float** p, size_t n) { if (e == cudaSuccess) e = cudaMalloc(p, n * sizeof(float)); };
  alloc(&dq, nq); alloc(&dk_, nq); alloc(&dv_, nv); alloc(&dg, heads); alloc(&db, heads); alloc(&ds, ns); alloc(&dout, nv);
  auto up = [&](float* d, const float* h, size_t n) { if (e == cudaSuccess) e = cudaMemcpy(d, h, n * sizeof(float), cudaMemcpyHostToDevice); };
  up(dq, q, nq); up(dk_, k, nq); up(dv_, v, nv); up(dg, g, heads); up(db, beta, heads); up(ds, state, ns);
  if (e == cudaSuccess) e = static_cast<cudaError_t>(delta_rule_decode(dq, dk_, dv_, dg, db, ds, dout, heads, dk, dv, nullptr));
  if (e == cudaSuccess) e = cudaMemcpy(state, ds, ns * sizeof(float), cudaMemcpyDeviceToHost);
  if (e == cudaSuccess) e = cudaMemcpy(out, dout, nv * sizeof(float), cudaMemcpyDeviceToHost);
  for (float* p : {dq, dk_, dv_, dg, db, ds, dout}) if (p) cudaFree(p);
  return static_cast<int>(e);
}

}  // namespace gdn::cuda
