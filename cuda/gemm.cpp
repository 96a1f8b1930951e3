#include "gemm.hpp"

#include <cublasLt.h>

#include <map>
#include <tuple>

GDN_CUDA_NAMESPACE_BEGIN

struct Gemm::Impl {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  std::size_t workspace_bytes = 0;
  using Key = std::tuple<int, int, int, std::int64_t, std::int64_t, std::int64_t, std::int64_t, int, bool>;
  struct Plan {
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr, d = nullptr;
    cublasLtMatmulAlgo_t algo{};
  };
  std::map<Key, Plan> plans;

  ~Impl() {
    for (auto& [key, p] : plans) {
      if (p.op) cublasLtMatmulDescDestroy(p.op);
      for (auto* l : {p.a, p.b, p.c, p.d})
        if (l) cublasLtMatrixLayoutDestroy(l);
    }
    if (workspace) cudaFree(workspace);
    if (handle) cublasLtDestroy(handle);
  }

  cublasStatus_t plan(const GemmArgs& g, const Plan** out) {
    const Key key{g.rows, g.in, g.out, g.ldx, g.ldw, g.ldy, g.ldc, static_cast<int>(g.out_type), g.beta != 0.0f};
    if (const auto it = plans.find(key); it != plans.end()) {
      *out = &it->second;
      return CUBLAS_STATUS_SUCCESS;
    }
    Plan p;
    const cudaDataType_t dt = g.out_type == GemmOut::bfloat16 ? CUDA_R_16BF : CUDA_R_32F;
    cublasStatus_t s = cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    if (s == CUBLAS_STATUS_SUCCESS) s = cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta));
    if (s == CUBLAS_STATUS_SUCCESS) s = cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb));
    if (s == CUBLAS_STATUS_SUCCESS) s = cublasLtMatrixLayoutCreate(&p.a, CUDA_R_16BF, g.in, g.out, g.ldw);
    if (s == CUBLAS_STATUS_SUCCESS) s = cublasLtMatrixLayoutCreate(&p.b, CUDA_R_16BF, g.in, g.rows, g.ldx);
    if (s == CUBLAS_STATUS_SUCCESS) s = cublasLtMatrixLayoutCreate(&p.c, dt, g.out, g.rows, g.ldc);
    if (s == CUBLAS_STATUS_SUCCESS) s = cublasLtMatrixLayoutCreate(&p.d, dt, g.out, g.rows, g.ldy);
    cublasLtMatmulPreference_t pref = nullptr;
    if (s == CUBLAS_STATUS_SUCCESS) s = cublasLtMatmulPreferenceCreate(&pref);
    if (s == CUBLAS_STATUS_SUCCESS)
      s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes,
                                               sizeof(workspace_bytes));
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    if (s == CUBLAS_STATUS_SUCCESS) s = cublasLtMatmulAlgoGetHeuristic(handle, p.op, p.a, p.b, p.c, p.d, pref, 1, &result, &found);
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (s == CUBLAS_STATUS_SUCCESS && found == 0) s = CUBLAS_STATUS_NOT_SUPPORTED;
    if (s != CUBLAS_STATUS_SUCCESS) {
      if (p.op) cublasLtMatmulDescDestroy(p.op);
      for (auto* l : {p.a, p.b, p.c, p.d})
        if (l) cublasLtMatrixLayoutDestroy(l);
      return s;
    }
    p.algo = result.algo;
    *out = &plans.emplace(key, p).first->second;
    return CUBLAS_STATUS_SUCCESS;
  }
};

Gemm::Gemm() = default;
Gemm::~Gemm() = default;

int Gemm::init(std::size_t workspace_bytes) {
  auto impl = std::make_unique<Impl>();
  cublasStatus_t s = cublasLtCreate(&impl->handle);
  if (s != CUBLAS_STATUS_SUCCESS) return static_cast<int>(s);
  if (workspace_bytes > 0 && cudaMalloc(&impl->workspace, workspace_bytes) != cudaSuccess)
    return static_cast<int>(CUBLAS_STATUS_ALLOC_FAILED);
  impl->workspace_bytes = workspace_bytes;
  impl_ = std::move(impl);
  return 0;
}

int Gemm::run(const GemmArgs& a, cudaStream_t stream) {
  if (!impl_) return static_cast<int>(CUBLAS_STATUS_NOT_INITIALIZED);
  if (a.x == nullptr || a.w == nullptr || a.y == nullptr || a.rows < 0 || a.in < 1 || a.out < 1 || a.ldx < a.in ||
      a.ldw < a.in || a.ldy < a.out)
    return static_cast<int>(CUBLAS_STATUS_INVALID_VALUE);
  if (a.rows == 0) return 0;
  GemmArgs g = a;
  if (g.c == nullptr) {
    g.c = g.y;
    g.ldc = g.ldy;
  }
  const Impl::Plan* p = nullptr;
  cublasStatus_t s = impl_->plan(g, &p);
  if (s != CUBLAS_STATUS_SUCCESS) return static_cast<int>(s);
  s = cublasLtMatmul(impl_->handle, p->op, &g.alpha, g.w, p->a, g.x, p->b, &g.beta, g.c, p->c, g.y, p->d, &p->algo,
                     impl_->workspace, impl_->workspace_bytes, stream);
  return static_cast<int>(s);
}

GDN_CUDA_NAMESPACE_END
