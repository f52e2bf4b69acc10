// CUDA matmul: cuBLASLt with cached plans, or wick's own GEMM while cuBLASLt warms up.
//
// Row-major C (m x n) = A (m x k) B (k x n) is the column-major product C^T = B^T A^T, so cuBLASLt
// gets B as its first operand and A as its second, with m and n swapped. A row-major operand is a
// column-major transpose with the same leading dimension, a column-major one is passed transposed.

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "cuda/cuda_device.h"
#include "cuda/cuda_storage.h"
#include "cuda/gemm.h"
#include "cuda_config.h"
#include "util.h"
#include "wick/cuda.h"

namespace wick {

namespace cuda {

namespace {

constexpr size_t kWorkspaceBytes = size_t{32} << 20;  // cuBLASLt's advice for Hopper

struct PlanKey {
  DType dtype;
  bool tf32, ta, tb;
  uint32_t align_a, align_b, align_c;
  int64_t m, n, k, lda, ldb, batch, sa, sb;
  bool operator==(const PlanKey&) const = default;
};

struct PlanKeyHash {
  size_t operator()(const PlanKey& p) const {
    size_t h = static_cast<size_t>(p.dtype) | (size_t{p.tf32} << 3) | (size_t{p.ta} << 4) |
               (size_t{p.tb} << 5) | (size_t{p.align_a} << 6) | (size_t{p.align_b} << 15) |
               (size_t{p.align_c} << 24);
    for (int64_t v : {p.m, p.n, p.k, p.lda, p.ldb, p.batch, p.sa, p.sb}) {
      h ^= static_cast<size_t>(v) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    }
    return h;
  }
};

struct Plan {
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

uint32_t alignment(const void* p) {
  auto v = reinterpret_cast<uintptr_t>(p);
  uintptr_t a = v & (~v + 1);
  return static_cast<uint32_t>(v == 0 || a > 256 ? 256 : a);
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

// A (rows x cols) row-major-indexed matrix with strides (rs, cs) as cuBLAS sees it: `trans`
// false when it is row-major (a column-major cols x rows matrix), true when column-major.
struct Form {
  bool ok = false, trans = false;
  int64_t ld = 0;
};

Form form(size_t rows, size_t cols, size_t rs, size_t cs) {
  Form f;
  auto R = static_cast<int64_t>(rows), C = static_cast<int64_t>(cols);
  auto RS = static_cast<int64_t>(rs), CS = static_cast<int64_t>(cs);
  if ((C == 1 || CS == 1) && (R == 1 || RS >= C)) {
    f = {true, false, R == 1 ? std::max<int64_t>(C, 1) : RS};
  } else if ((R == 1 || RS == 1) && (C == 1 || CS >= R)) {
    f = {true, true, C == 1 ? std::max<int64_t>(R, 1) : CS};
  }
  return f;
}

// The batch dims of `layout` (all but the last two) as one stride: true when batch index i sits
// at i * stride (stride 0 for a broadcast batch).
bool collapse_batch(const Layout& layout, int64_t& stride) {
  size_t nb = layout.rank() - 2;
  bool have = false;
  int64_t st = 0, span = 1;
  for (size_t i = nb; i-- > 0;) {
    auto d = static_cast<int64_t>(layout.dims()[i]);
    auto s = static_cast<int64_t>(layout.strides()[i]);
    if (d == 1) continue;
    if (!have) {
      st = s;
      span = d;
      have = true;
      continue;
    }
    if (s != st * span) return false;
    span *= d;
  }
  stride = st;
  return true;
}

}  // namespace

class MatmulEngine {
 public:
  explicit MatmulEngine(CudaDevice& dev) : dev_(dev) {
    double t0 = now_ms();
    preload_gemm_kernels();
    if (trace_enabled()) trace_line("LIB", "wick-gemm kernels", now_ms() - t0);
    if (config().warmup) {
      started_ = true;
      register_engine(this);
      thread_ = std::thread([this] { warm_up(); });
    }
  }
  ~MatmulEngine() { stop(); }

  void stop() {
    if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
  }

  static std::mutex& engines_mutex() {
    static auto* m = new std::mutex;
    return *m;
  }
  static std::vector<MatmulEngine*>& engines() {
    static auto* v = new std::vector<MatmulEngine*>;
    return *v;
  }
  static void register_engine(MatmulEngine* e) {
    std::lock_guard lock(engines_mutex());
    engines().push_back(e);
    std::atexit(wait_for_warm_ups);
  }

  bool ready() const { return ready_.load(std::memory_order_acquire); }

  /// Makes cuBLASLt ready on this thread (no warm-up thread) or waits for the warm-up thread.
  void wait_ready() {
    if (ready()) return;
    std::unique_lock lock(init_mutex_);
    if (!started_) {
      started_ = true;
      lock.unlock();
      warm_up();
      return;
    }
    ready_cv_.wait(lock, [&] { return ready(); });
  }

  bool failed() const { return failed_.load(std::memory_order_acquire); }

  /// Enqueues one cuBLASLt matmul; false when cuBLASLt has no algorithm for it.
  bool run(const PlanKey& key, const void* a, const void* b, void* c, cudaStream_t s) {
    std::lock_guard lock(plans_mutex_);
    Plan* plan = plan_locked(key);
    if (!plan->ok) return false;
    // In graph mode the whole batch is captured: no graph launch inside that capture.
    if (!matmul_graphs_enabled() || dev_.graph_mode() || dev_.step_capturing()) {
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

  /// Whether this matmul is the first on the cuBLASLt path (for the trace).
  bool first_cublas() { return !cublas_traced_.exchange(true); }

 private:
  static constexpr int kCallsBeforeCapture = 3;
  static constexpr size_t kMaxGraphEntries = 4096;

  struct GraphKey {
    PlanKey key;
    const void* a;
    const void* b;
    void* c;
    bool operator==(const GraphKey&) const = default;
  };
  struct GraphKeyHash {
    size_t operator()(const GraphKey& g) const {
      size_t h = PlanKeyHash()(g.key);
      for (const void* p : {g.a, g.b, static_cast<const void*>(g.c)}) {
        h ^= std::hash<const void*>()(p) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
      }
      return h;
    }
  };
  struct GraphEntry {
    int calls = 0;
    cudaGraphExec_t exec = nullptr;
  };

  // cuBLASLt's operands are swapped: B first (see the top of this file).
  void call(const Plan& plan, const PlanKey& key, const void* a, const void* b, void* c,
            cudaStream_t s) {
    double one = 1, zero = 0;
    float onef = 1, zerof = 0;
    bool f64 = key.dtype == DType::F64;
    WICK_CUBLAS_CHECK(cublasLtMatmul(lt_, plan.desc, f64 ? static_cast<void*>(&one) : &onef, b,
                                     plan.a, a, plan.b, f64 ? static_cast<void*>(&zero) : &zerof, c,
                                     plan.c, c, plan.c, &plan.algo, workspace_, plan.workspace, s));
  }

  // Captures one call on a private stream; false (and never again for these buffers) on failure.
  bool capture(const Plan& plan, const PlanKey& key, const void* a, const void* b, void* c,
               GraphEntry& g) {
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

  void clear_graphs_locked() {
    for (auto& [k, g] : graphs_) {
      if (g.exec != nullptr) (void)cudaGraphExecDestroy(g.exec);
    }
    graphs_.clear();
  }

  Plan* plan_locked(const PlanKey& key) {
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
  std::unique_ptr<Plan> make_plan(const PlanKey& key) {
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

  // Creates the cuBLASLt handle and runs one GEMM per dtype on a side stream, so that cuBLAS's
  // first-use cost (80-115 ms) is paid here and not by the first matmul.
  void warm_up() {
    try {
      make_current(dev_.ordinal());
      double t0 = now_ms();
      WICK_CUBLAS_CHECK(cublasLtCreate(&lt_));
      workspace_ = dev_.allocator().alloc(kWorkspaceBytes);
      if (trace_enabled()) trace_line("LIB", "cublasLt handle", now_ms() - t0);
      cudaStream_t s = nullptr;
      WICK_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
      constexpr int64_t kN = 1024;
      void* bufs = dev_.allocator().alloc(3 * kN * kN * 8);
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
      dev_.allocator().free(bufs, 3 * kN * kN * 8);
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

  CudaDevice& dev_;
  cublasLtHandle_t lt_ = nullptr;
  void* workspace_ = nullptr;
  std::mutex plans_mutex_;
  std::unordered_map<PlanKey, std::unique_ptr<Plan>, PlanKeyHash> plans_;
  std::unordered_map<GraphKey, GraphEntry, GraphKeyHash> graphs_;
  cudaStream_t capture_stream_ = nullptr;
  std::mutex init_mutex_;
  std::condition_variable ready_cv_;
  bool started_ = false;
  std::thread thread_;
  std::atomic<bool> ready_{false};
  std::atomic<bool> failed_{false};
  std::atomic<bool> cublas_traced_{false};
};

void wait_for_warm_ups() {
  std::lock_guard lock(MatmulEngine::engines_mutex());
  for (MatmulEngine* e : MatmulEngine::engines()) e->stop();
}

void MatmulEngineDeleter::operator()(MatmulEngine* engine) const {
  {
    std::lock_guard lock(MatmulEngine::engines_mutex());
    auto& v = MatmulEngine::engines();
    v.erase(std::remove(v.begin(), v.end(), engine), v.end());
  }
  delete engine;
}

std::unique_ptr<MatmulEngine, MatmulEngineDeleter> make_matmul_engine(CudaDevice& device) {
  return std::unique_ptr<MatmulEngine, MatmulEngineDeleter>(new MatmulEngine(device));
}

void stop_matmul_engine(MatmulEngine& engine) {
  engine.stop();
}

namespace {

// One operand ready for either GEMM: base pointer (offset applied), strides, batch stride, and
// the contiguous copy it was made from when its layout needed one.
struct MatOperand {
  const void* ptr = nullptr;
  int64_t rs = 0, cs = 0, bs = 0;
  std::unique_ptr<CudaStorage> copy;
};

MatOperand mat_operand(const CudaStorage& s, const Layout& layout, size_t rows, size_t cols,
                       bool need_blas_form) {
  MatOperand op;
  size_t r = layout.rank();
  int64_t bs = 0;
  bool ok = collapse_batch(layout, bs);
  if (ok && need_blas_form) {
    ok = form(rows, cols, layout.strides()[r - 2], layout.strides()[r - 1]).ok;
  }
  if (ok) {
    op.ptr = s.data_at(layout.start_offset());
    op.rs = static_cast<int64_t>(layout.strides()[r - 2]);
    op.cs = static_cast<int64_t>(layout.strides()[r - 1]);
    op.bs = bs;
    return op;
  }
  // Batches no single stride reaches, or rows and columns both strided: one contiguous copy.
  op.copy = s.contiguous_copy(layout);
  op.ptr = op.copy->data();
  op.rs = static_cast<int64_t>(cols);
  op.cs = 1;
  op.bs = static_cast<int64_t>(rows * cols);
  return op;
}

}  // namespace

StoragePtr CudaStorage::matmul(const BackendStorage& rhs_storage, MatmulDims dims,
                               const Layout& lhs_layout, const Layout& rhs_layout) const {
  const auto& rhs = as_cuda(rhs_storage);
  CudaDevice& dev = cuda_device();
  size_t count = dims.b * dims.m * dims.n;
  if (count > 0 && dims.k == 0) {
    const uint64_t zero_bits = 0;  // 0.0 in every float dtype
    return dev.filled(count, dtype(), &zero_bits);
  }
  auto out = std::make_unique<CudaStorage>(dev, count, dtype());
  if (count == 0) return out;

  // The work estimate that lets a big product start at once in graph mode.
  double flops = 2.0 * static_cast<double>(dims.b) * static_cast<double>(dims.m) *
                 static_cast<double>(dims.n) * static_cast<double>(dims.k);
  MatmulEngine& engine = dev.matmul_engine();
  CudaMatmulPath path = cuda_matmul_path();
  bool use_cublas =
      path == CudaMatmulPath::Cublas || (path == CudaMatmulPath::Auto && engine.ready());
  if (path == CudaMatmulPath::Cublas) engine.wait_ready();
  if (engine.failed()) use_cublas = false;

  MatOperand a = mat_operand(*this, lhs_layout, dims.m, dims.k, use_cublas);
  MatOperand b = mat_operand(rhs, rhs_layout, dims.k, dims.n, use_cublas);

  if (use_cublas) {
    Form fa = form(dims.m, dims.k, a.rs, a.cs), fb = form(dims.k, dims.n, b.rs, b.cs);
    PlanKey key{dtype(),
                dtype() == DType::F32 && cuda_tf32_allowed(),
                fa.trans,
                fb.trans,
                alignment(a.ptr),
                alignment(b.ptr),
                alignment(out->data()),
                static_cast<int64_t>(dims.m),
                static_cast<int64_t>(dims.n),
                static_cast<int64_t>(dims.k),
                fa.ld,
                fb.ld,
                static_cast<int64_t>(dims.b),
                dims.b > 1 ? a.bs : 0,
                dims.b > 1 ? b.bs : 0};
    bool done = false;
    bool first = trace_enabled() && engine.first_cublas();
    dev.enqueue(
        "matmul", dtype(),
        [&](cudaStream_t s) { done = engine.run(key, a.ptr, b.ptr, out->data(), s); }, flops);
    if (first) {
      std::fprintf(stderr, "[wick] MATMUL cublasLt %s %zux%zux%zu b%zu (first cuBLASLt matmul)\n",
                   dtype_name(dtype()), dims.m, dims.n, dims.k, dims.b);
    }
    if (done) return out;
  } else if (trace_enabled()) {
    std::fprintf(stderr, "[wick] MATMUL wick-gemm %s %zux%zux%zu b%zu%s\n", dtype_name(dtype()),
                 dims.m, dims.n, dims.k, dims.b,
                 path == CudaMatmulPath::Wick ? "" : " (cuBLASLt warming up)");
  }
  dev.enqueue(
      "gemm", dtype(),
      [&](cudaStream_t s) {
        launch_gemm(dtype(), dims.b, dims.m, dims.n, dims.k, GemmOperand{a.ptr, a.rs, a.cs, a.bs},
                    GemmOperand{b.ptr, b.rs, b.cs, b.bs}, out->data(), s);
      },
      flops);
  return out;
}

}  // namespace cuda
}  // namespace wick
