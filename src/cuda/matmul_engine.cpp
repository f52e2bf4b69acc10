// cuBLASLt gets B as its first operand and A as its second, with m and n swapped: row-major
// C (m x n) = A B is the column-major product C^T = B^T A^T (see matmul.cpp).

#include "cuda/matmul_engine.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "cuda/gemm.h"
#include "cuda/queue.h"
#include "cuda/trace.h"
#include "cuda_config.h"
#include "util.h"

namespace wick::cuda {

namespace {

constexpr size_t kWorkspaceBytes = size_t{32} << 20;  // cuBLASLt's advice for sm_90
constexpr int kCallsBeforeCapture = 3;
constexpr size_t kMaxGraphEntries = 4096;

size_t mix(size_t h, size_t v) {
  return h ^ (v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2));
}

cudaDataType_t data_type(DType dtype) {
  switch (dtype) {
    case DType::F16:
      return CUDA_R_16F;
    case DType::BF16:
      return CUDA_R_16BF;
    case DType::F64:
      return CUDA_R_64F;
    default:
      return CUDA_R_32F;
  }
}

// Engines with a warm-up thread, for wait_for_warm_ups (never destroyed: used at exit).
std::mutex& engines_mutex() {
  static auto* m = new std::mutex;
  return *m;
}
std::vector<MatmulEngine*>& engines() {
  static auto* v = new std::vector<MatmulEngine*>;
  return *v;
}

}  // namespace

size_t PlanKeyHash::operator()(const PlanKey& p) const {
  size_t h = static_cast<size_t>(p.dtype) | (size_t{p.tf32} << 3) | (size_t{p.ta} << 4) |
             (size_t{p.tb} << 5) | (size_t{p.align_a} << 6) | (size_t{p.align_b} << 15) |
             (size_t{p.align_c} << 24);
  for (int64_t v : {p.m, p.n, p.k, p.lda, p.ldb, p.batch, p.sa, p.sb}) {
    h = mix(h, static_cast<size_t>(v));
  }
  return h;
}

size_t MatmulEngine::GraphKeyHash::operator()(const GraphKey& g) const {
  size_t h = PlanKeyHash()(g.key);
  for (const void* p : {g.a, g.b, static_cast<const void*>(g.c)}) {
    h = mix(h, std::hash<const void*>()(p));
  }
  return h;
}

struct MatmulEngine::Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  size_t workspace = 0;
  bool ok = false;  // false: no cuBLASLt algorithm for this shape, use wick's GEMM
  ~Plan() {
    if (desc) cublasLtMatmulDescDestroy(desc);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (c) cublasLtMatrixLayoutDestroy(c);
  }
};

MatmulEngine::MatmulEngine(int ordinal, Allocator& allocator, const Queue& queue)
    : ordinal_(ordinal), allocator_(allocator), queue_(queue) {
  double t0 = now_ms();
  preload_gemm_kernels();
  if (trace_enabled()) trace_line("LIB", "wick-gemm kernels", now_ms() - t0);
  if (config().warmup != WarmUp::Off) {
    started_ = true;
    {
      std::lock_guard lock(engines_mutex());
      engines().push_back(this);
    }
    std::atexit(wait_for_warm_ups);
    thread_ = std::thread([this] { warm_up(config().warmup == WarmUp::Full); });
  }
}

MatmulEngine::~MatmulEngine() {
  {
    std::lock_guard lock(engines_mutex());
    auto& v = engines();
    v.erase(std::remove(v.begin(), v.end(), this), v.end());
  }
  stop();
}

void MatmulEngine::stop() {
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
}

void wait_for_warm_ups() {
  std::lock_guard lock(engines_mutex());
  for (MatmulEngine* e : engines()) e->stop();
}

void MatmulEngine::wait_ready() {
  if (ready()) return;
  std::unique_lock lock(init_mutex_);
  if (!started_) {
    started_ = true;
    lock.unlock();
    warm_up(false);  // the GEMMs only pay on a thread of their own
    return;
  }
  ready_cv_.wait(lock, [&] { return ready(); });
}

bool MatmulEngine::run(const PlanKey& key, const void* a, const void* b, void* c, cudaStream_t s) {
  std::lock_guard lock(plans_mutex_);
  Plan* plan = plan_locked(key);
  if (!plan->ok) return false;
  // In graph mode the whole batch is captured: no graph launch inside that capture.
  if (!matmul_graphs_enabled() || queue_.graph_mode() || queue_.step_capturing()) {
    call(*plan, key, a, b, c, s);
    return true;
  }
  // The same matmul on the same buffers, again and again (a training or decoding loop): after
  // a few calls it is captured once into a CUDA graph, whose launch costs less host time than
  // cublasLtMatmul's. Keyed by addresses, so a replay always reads what sits there now.
  if (graphs_.size() >= kMaxGraphEntries) clear_graphs_locked();
  GraphEntry& g = graphs_[GraphKey{key, a, b, c}];
  if (g.exec != nullptr) {
    WICK_CUDA_CHECK(cudaGraphLaunch(g.exec, s));
    return true;
  }
  if (++g.calls < kCallsBeforeCapture || !capture(*plan, key, a, b, c, g)) {
    call(*plan, key, a, b, c, s);
    return true;
  }
  WICK_CUDA_CHECK(cudaGraphLaunch(g.exec, s));
  return true;
}

// cuBLASLt's operands are swapped: B first (see the top of this file).
void MatmulEngine::call(const Plan& plan, const PlanKey& key, const void* a, const void* b, void* c,
                        cudaStream_t s) {
  double one = 1, zero = 0;
  float onef = 1, zerof = 0;
  bool f64 = key.dtype == DType::F64;
  WICK_CUBLAS_CHECK(cublasLtMatmul(lt_, plan.desc, f64 ? static_cast<void*>(&one) : &onef, b,
                                   plan.a, a, plan.b, f64 ? static_cast<void*>(&zero) : &zerof, c,
                                   plan.c, c, plan.c, &plan.algo, workspace_, plan.workspace, s));
}

// Captures one call on a private stream; false (and never again for these buffers) on failure.
bool MatmulEngine::capture(const Plan& plan, const PlanKey& key, const void* a, const void* b,
                           void* c, GraphEntry& g) {
  double t0 = now_ms();
  if (capture_stream_ == nullptr) {
    WICK_CUDA_CHECK(cudaStreamCreateWithFlags(&capture_stream_, cudaStreamNonBlocking));
  }
  cudaGraph_t graph = nullptr;
  bool ok = cudaStreamBeginCapture(capture_stream_, cudaStreamCaptureModeRelaxed) == cudaSuccess;
  if (ok) {
    try {
      call(plan, key, a, b, c, capture_stream_);
    } catch (const Error&) {
      ok = false;
    }
    ok = cudaStreamEndCapture(capture_stream_, &graph) == cudaSuccess && ok;
  }
  if (ok) ok = cudaGraphInstantiate(&g.exec, graph, 0) == cudaSuccess;
  if (graph != nullptr) (void)cudaGraphDestroy(graph);
  if (!ok) {
    (void)cudaGetLastError();
    g.exec = nullptr;
    g.calls = -1000000000;  // plain calls from now on
    return false;
  }
  if (trace_enabled()) {
    trace_line("GRAPH",
               str("matmul ", dtype_name(key.dtype), " ", key.m, "x", key.n, "x", key.k, " b",
                   key.batch, " captured"),
               now_ms() - t0);
  }
  return true;
}

void MatmulEngine::clear_graphs_locked() {
  for (auto& [k, g] : graphs_) {
    if (g.exec != nullptr) (void)cudaGraphExecDestroy(g.exec);
  }
  graphs_.clear();
}

MatmulEngine::Plan* MatmulEngine::plan_locked(const PlanKey& key) {
  auto it = plans_.find(key);
  if (it != plans_.end()) return it->second.get();
  double t0 = now_ms();
  auto plan = make_plan(key);
  if (trace_enabled()) {
    trace_line("LIB",
               str("cublasLt algorithm ", dtype_name(key.dtype), key.tf32 ? "(tf32)" : "", " ",
                   key.m, "x", key.n, "x", key.k, " b", key.batch, plan->ok ? "" : " (none)"),
               now_ms() - t0);
  }
  Plan* p = plan.get();
  plans_.emplace(key, std::move(plan));
  return p;
}

// `key` in row-major terms; cuBLASLt gets B first (m' = n, n' = m).
std::unique_ptr<MatmulEngine::Plan> MatmulEngine::make_plan(const PlanKey& key) {
  auto plan = std::make_unique<Plan>();
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  cudaDataType_t scale = CUDA_R_32F;
  if (key.dtype == DType::F64) {
    compute = CUBLAS_COMPUTE_64F;
    scale = CUDA_R_64F;
  } else if (key.dtype == DType::F32 && key.tf32) {
    compute = CUBLAS_COMPUTE_32F_FAST_TF32;
  }
  cudaDataType_t dt = data_type(key.dtype);
  WICK_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan->desc, compute, scale));
  // First operand: B (k x n); second: A (m x k).
  cublasOperation_t op_first = key.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasOperation_t op_second = key.ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  WICK_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA,
                                                   &op_first, sizeof(op_first)));
  WICK_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB,
                                                   &op_second, sizeof(op_second)));
  auto m = static_cast<uint64_t>(key.m), n = static_cast<uint64_t>(key.n),
       k = static_cast<uint64_t>(key.k);
  // B row-major: an n x k column-major matrix; column-major: k x n, transposed.
  WICK_CUBLAS_CHECK(
      cublasLtMatrixLayoutCreate(&plan->a, dt, key.tb ? k : n, key.tb ? n : k, key.ldb));
  WICK_CUBLAS_CHECK(
      cublasLtMatrixLayoutCreate(&plan->b, dt, key.ta ? m : k, key.ta ? k : m, key.lda));
  WICK_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->c, dt, n, m, key.n));
  if (key.batch > 1) {
    auto count = static_cast<int32_t>(key.batch);
    int64_t sc = key.m * key.n;
    auto set_batch = [&](cublasLtMatrixLayout_t l, int64_t stride) {
      WICK_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                                                         &count, sizeof(count)));
      WICK_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(
          l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)));
    };
    set_batch(plan->a, key.sb);
    set_batch(plan->b, key.sa);
    set_batch(plan->c, sc);
  }
  cublasLtMatmulPreference_t pref = nullptr;
  WICK_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  uint64_t ws = kWorkspaceBytes;
  uint32_t al_first = key.align_b, al_second = key.align_a, al_c = key.align_c;
  cublasStatus_t st = cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
  if (st == CUBLAS_STATUS_SUCCESS) {
    st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                              &al_first, sizeof(al_first));
  }
  if (st == CUBLAS_STATUS_SUCCESS) {
    st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                              &al_second, sizeof(al_second));
  }
  if (st == CUBLAS_STATUS_SUCCESS) {
    st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                              &al_c, sizeof(al_c));
  }
  if (st == CUBLAS_STATUS_SUCCESS) {
    st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                              &al_c, sizeof(al_c));
  }
  // f16/bf16: split-K parts are summed in f32 (the compute type) or not split at all, never
  // added up in the 16-bit output type, which loses several bits on long sums (a weight
  // gradient's k is the batch) and rounds differently from one split to the next.
  if (st == CUBLAS_STATUS_SUCCESS && (key.dtype == DType::F16 || key.dtype == DType::BF16)) {
    uint32_t schemes = CUBLASLT_REDUCTION_SCHEME_NONE | CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
    st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                                              &schemes, sizeof(schemes));
  }
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  if (st == CUBLAS_STATUS_SUCCESS) {
    st = cublasLtMatmulAlgoGetHeuristic(lt_, plan->desc, plan->a, plan->b, plan->c, plan->c, pref,
                                        1, &result, &found);
  }
  cublasLtMatmulPreferenceDestroy(pref);
  if (st == CUBLAS_STATUS_NOT_SUPPORTED || (st == CUBLAS_STATUS_SUCCESS && found == 0)) {
    return plan;  // not ok: wick's GEMM takes it
  }
  if (st != CUBLAS_STATUS_SUCCESS) {
    throw_cublas_error(st, "cublasLtMatmulAlgoGetHeuristic", __FILE__, __LINE__);
  }
  plan->algo = result.algo;
  plan->workspace = result.workspaceSize;
  plan->ok = true;
  return plan;
}

// The handle first; then, on the warm-up thread, one GEMM per dtype on a side stream, so that
// cuBLAS's first-use cost is paid here and not by the first matmul.
void MatmulEngine::warm_up(bool gemms) {
  try {
    make_current(ordinal_);
    double t0 = now_ms();
    WICK_CUBLAS_CHECK(cublasLtCreate(&lt_));
    workspace_ = allocator_.alloc(kWorkspaceBytes);
    if (trace_enabled()) trace_line("LIB", "cublasLt handle", now_ms() - t0);
    if (gemms) {
      cudaStream_t s = nullptr;
      WICK_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
      constexpr int64_t kN = 1024;
      void* bufs = allocator_.alloc(3 * kN * kN * 8);
      WICK_CUDA_CHECK(cudaMemsetAsync(bufs, 0, 3 * kN * kN * 8, s));
      for (DType dt : {DType::F32, DType::BF16, DType::F16, DType::F64}) {
        double t1 = now_ms();
        size_t es = size_in_bytes(dt);
        auto* base = static_cast<char*>(bufs);
        PlanKey key{dt, false, false, false, 256, 256, 256, kN, kN, kN, kN, kN, 1, 0, 0};
        run(key, base, base + kN * kN * es, base + 2 * kN * kN * es, s);
        WICK_CUDA_CHECK(cudaStreamSynchronize(s));
        if (trace_enabled()) {
          trace_line("LIB", str("cublasLt warm-up ", dtype_name(dt), " 1024^3"), now_ms() - t1);
        }
      }
      WICK_CUDA_CHECK(cudaStreamDestroy(s));
      allocator_.free(bufs, 3 * kN * kN * 8);
    }
    if (trace_enabled()) trace_line("LIB", "cublasLt ready", now_ms() - t0);
  } catch (const std::exception& e) {
    // cuBLASLt unusable: every matmul stays on wick's GEMM.
    failed_.store(true, std::memory_order_release);
    if (trace_enabled()) std::fprintf(stderr, "[wick] LIB cublasLt failed: %s\n", e.what());
  }
  {
    std::lock_guard lock(init_mutex_);
    ready_.store(true, std::memory_order_release);
  }
  ready_cv_.notify_all();
}

}  // namespace wick::cuda
