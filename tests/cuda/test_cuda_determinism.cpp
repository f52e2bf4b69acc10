// Bitwise determinism on CUDA (docs/NUMERICS.md, "Determinism"): every op family forward and
// backward gives the same bits run to run (twice in this process and once in a child process);
// index_add, scatter_add and the backward of embedding and gather (which add duplicates) give the
// same bits whatever the duplicates, within the bounds of wick/numerics.h of a float64 reference;
// and a row's result is the same alone or inside batches of 1..64 rows for the ops CUDA keeps
// batch-invariant: norms, softmax, row reductions, attention sequences and decode attention
// (sequences of different lengths by a mask), and under the batch-invariance switch matmul and
// quantized matmul rows. The reference of each bit comparison is the same
// op computed another way (another run, another batch); the comparison itself is checked to see a
// one-ulp difference.

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "../tools/conform_determinism.h"
#include "expect_error.h"
#include "gpu_tolerance.h"
#include "test_util.h"
#include "wick/wick.h"

namespace {

using namespace wick;
using determinism::Diff;

const Device& gpu() {
  static const Device d = Device::cuda(0);
  return d;
}

std::string describe(const Diff& d) {
  return d.op + " " + dtype_name(d.dtype) + " " + determinism::shape_str(d.shape) + ": " +
         std::to_string(d.count) + " elements differ, max " + std::to_string(d.max_abs) + " (" +
         std::to_string(d.max_ulps) + " ulps)";
}

std::vector<double> f64(const Tensor& t) {
  return t.to_device(Device::cpu()).to_dtype(DType::F64).flatten_all().to_vec1<double>();
}

// The child's request: a path to write the thread suite's results to (on the GPU).
const char* child_request() {
  const char* v = std::getenv("WICK_CUDA_DETERMINISM_CHILD");
  return v != nullptr && *v != '\0' ? v : nullptr;
}

std::string self_exe() {
  std::vector<char> buf(4096);
  ssize_t n = readlink("/proc/self/exe", buf.data(), buf.size() - 1);
  return n > 0 ? std::string(buf.data(), static_cast<size_t>(n)) : std::string();
}

TEST(CudaDeterminismChild, Suite) {
  const char* path = child_request();
  if (path == nullptr) GTEST_SKIP() << "runs in the child process of EveryOpRunToRun";
  WICK_REQUIRE_GPU();
  determinism::write_results(path, determinism::thread_suite(52, gpu()));
}

// The comparison reports a one-ulp difference in any float dtype and none for equal bytes.
TEST(CudaDeterminism, ComparisonSeesOneUlp) {
  WICK_REQUIRE_GPU();
  for (DType dt : {DType::F32, DType::BF16, DType::F16, DType::F64}) {
    Tensor t = wick::testing::random_tensor({3, 7}, dt);
    determinism::Result a{"op", dt, t.dims(), determinism::bytes_of(t)}, b = a;
    EXPECT_FALSE(determinism::compare(a, b).has_value()) << dtype_name(dt);
    b.bytes[size_in_bytes(dt) * 5] ^= 1;  // the lowest mantissa bit of element 5
    auto d = determinism::compare(a, b);
    ASSERT_TRUE(d.has_value()) << dtype_name(dt);
    EXPECT_EQ(d->count, 1u);
    EXPECT_EQ(d->max_ulps, 1u);
  }
}

// Every op family, forward and backward (tools/conform_determinism.h), twice in this process and
// once in a fresh one: the same bits. Matmuls take cuBLASLt in both processes: under the default
// path the ones made while its warm-up runs take wick's GEMM, the one choice that follows timing
// (docs/NUMERICS.md).
TEST(CudaDeterminism, EveryOpRunToRun) {
  WICK_REQUIRE_GPU();
  struct PathGuard {
    CudaMatmulPath was = cuda_matmul_path();
    ~PathGuard() { cuda_set_matmul_path(was); }
  } guard;
  cuda_set_matmul_path(CudaMatmulPath::Cublas);
  auto a = determinism::thread_suite(52, gpu());
  auto b = determinism::thread_suite(52, gpu());
  ASSERT_GT(a.size(), 100u);
  size_t unsupported = 0;
  for (const auto& r : a) unsupported += r.op.find("unsupported here") != std::string::npos;
  EXPECT_LT(unsupported * 4, a.size()) << "most of the suite is unsupported on CUDA";
  for (const Diff& d : determinism::compare_runs(a, b, "run to run")) {
    ADD_FAILURE() << describe(d);
  }
  std::string path = ::testing::TempDir() + "wick_cuda_determinism_" + std::to_string(getpid());
  std::string cmd = "WICK_CUDA_MATMUL=cublas WICK_CUDA_DETERMINISM_CHILD=" + path + " '" +
                    self_exe() + "' --gtest_filter=CudaDeterminismChild.Suite > /dev/null 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  auto c = determinism::read_results(path);
  std::remove(path.c_str());
  for (const Diff& d : determinism::compare_runs(a, c, "this process vs a child process")) {
    ADD_FAILURE() << describe(d);
  }
}

// Ids with heavy duplicates: half of them one id, a quarter among 16 ids, the rest anywhere in
// [0, n).
std::vector<uint32_t> duplicated_ids(size_t count, uint32_t n) {
  std::vector<uint32_t> ids(count);
  auto& gen = wick::testing::rng();
  for (size_t j = 0; j < count; ++j) {
    uint32_t r = static_cast<uint32_t>(gen() % 4);
    ids[j] = r < 2    ? 7 % n
             : r == 2 ? static_cast<uint32_t>(gen() % 16) % n
                      : static_cast<uint32_t>(gen() % n);
  }
  return ids;
}

// Runs `op` three times: the same bits each time; returns the first result.
Tensor same_bits_thrice(const std::string& what, const std::function<Tensor()>& op) {
  Tensor first = op();
  auto bytes = determinism::bytes_of(first);
  for (int run = 1; run < 3; ++run) {
    Tensor again = op();
    auto d = determinism::compare(what, first.dtype(), first.dims(), bytes.data(),
                                  determinism::bytes_of(again).data(), first.elem_count());
    if (d) ADD_FAILURE() << "run " << run << ": " << describe(*d);
  }
  return first;
}

// dst (outer, rows, inner) + index_add of src (outer, ids, inner) along dim 1, in float64, with
// each element's term count and absolute sum for its bound.
struct AddReference {
  std::vector<double> want, abs_sum;
  std::vector<size_t> terms;
};

AddReference index_add_reference(const std::vector<double>& dst, const std::vector<double>& src,
                                 const std::vector<uint32_t>& ids, size_t outer, size_t rows,
                                 size_t inner) {
  AddReference r{dst, dst, std::vector<size_t>(dst.size(), 1)};
  for (auto& x : r.abs_sum) x = std::abs(x);
  const size_t n = ids.size();
  for (size_t o = 0; o < outer; ++o) {
    for (size_t j = 0; j < n; ++j) {
      for (size_t e = 0; e < inner; ++e) {
        size_t at = (o * rows + ids[j]) * inner + e;
        double v = src[(o * n + j) * inner + e];
        r.want[at] += v;
        r.abs_sum[at] += std::abs(v);
        ++r.terms[at];
      }
    }
  }
  return r;
}

void expect_within(const std::string& what, DType dt, const Tensor& got, const AddReference& r) {
  EXPECT_TRUE(wick::testing::within_bounds(f64(got), r.want, [&](size_t i, double want) {
    return numerics::index_add_bound(dt, r.terms[i], want, r.abs_sum[i]);
  })) << what;
}

// index_add with heavy duplicates (an embedding-backward shape: 32k rows, 4096 ids), along dim 0
// and along a middle dim from a transposed source: the same bits thrice, within the bound of a
// float64 reference; integers exact.
TEST(CudaDeterminism, IndexAddHeavyDuplicates) {
  WICK_REQUIRE_GPU();
  struct Case {
    size_t outer, rows, inner, n;
  };
  for (Case c : {Case{1, 32000, 64, 4096}, Case{3, 500, 5, 2000}}) {
    auto ids = duplicated_ids(c.n, static_cast<uint32_t>(c.rows));
    Tensor ids_gpu = Tensor::from_vec(ids, {c.n}, Device::cpu()).to_device(gpu());
    const size_t dim = c.outer == 1 ? 0 : 1;
    for (DType dt : {DType::F32, DType::BF16, DType::F16, DType::F64, DType::I64, DType::U32}) {
      std::string what = std::string("index_add ") + dtype_name(dt) + " rows " +
                         std::to_string(c.rows) + " ids " + std::to_string(c.n);
      Shape dst_shape = c.outer == 1 ? Shape{c.rows, c.inner} : Shape{c.outer, c.rows, c.inner};
      Tensor dst = wick::testing::random_tensor(dst_shape, dt);
      // The source as a transposed view when it has three dims (a strided source).
      Tensor src =
          c.outer == 1
              ? wick::testing::random_tensor({c.n, c.inner}, dt)
              : wick::testing::random_tensor({c.inner, c.n, c.outer}, dt).permute({2, 1, 0});
      Tensor dst_gpu = dst.to_device(gpu()), src_gpu = src.to_device(gpu());
      Tensor got = same_bits_thrice(what, [&] { return dst_gpu.index_add(ids_gpu, src_gpu, dim); });
      AddReference ref =
          index_add_reference(f64(dst), f64(src.contiguous()), ids, c.outer, c.rows, c.inner);
      if (is_float(dt)) {
        expect_within(what, dt, got, ref);
      } else {
        EXPECT_EQ(f64(got), ref.want) << what;
      }
    }
  }
}

// scatter_add with heavy duplicates along each dim: the same bits thrice, within the bound of a
// float64 reference.
TEST(CudaDeterminism, ScatterAddHeavyDuplicates) {
  WICK_REQUIRE_GPU();
  const size_t lines = 64, width = 300, len = 3000;
  for (size_t dim : {0, 1}) {
    for (DType dt : {DType::F32, DType::BF16, DType::F16, DType::F64}) {
      std::string what =
          std::string("scatter_add dim ") + std::to_string(dim) + " " + dtype_name(dt);
      auto ids = duplicated_ids(lines * len, static_cast<uint32_t>(width));
      // dim 1: dst (lines, width), ids and src (lines, len); dim 0: their transposes.
      Shape dst_shape = dim == 1 ? Shape{lines, width} : Shape{width, lines};
      Shape src_shape = dim == 1 ? Shape{lines, len} : Shape{len, lines};
      Tensor ids_t = Tensor::from_vec(ids, src_shape, Device::cpu());
      Tensor dst = wick::testing::random_tensor(dst_shape, dt),
             src = wick::testing::random_tensor(src_shape, dt);
      Tensor ids_gpu = ids_t.to_device(gpu()), dst_gpu = dst.to_device(gpu()),
             src_gpu = src.to_device(gpu());
      Tensor got =
          same_bits_thrice(what, [&] { return dst_gpu.scatter_add(ids_gpu, src_gpu, dim); });
      // As index_add per line: line l's ids and sources are row l (dim 1) or column l (dim 0).
      std::vector<double> d = f64(dst), s = f64(src);
      AddReference ref{d, d, std::vector<size_t>(d.size(), 1)};
      for (auto& x : ref.abs_sum) x = std::abs(x);
      for (size_t l = 0; l < lines; ++l) {
        for (size_t j = 0; j < len; ++j) {
          size_t from = dim == 1 ? l * len + j : j * lines + l;
          size_t at = dim == 1 ? l * width + ids[from] : ids[from] * lines + l;
          ref.want[at] += s[from];
          ref.abs_sum[at] += std::abs(s[from]);
          ++ref.terms[at];
        }
      }
      expect_within(what, dt, got, ref);
    }
  }
}

// The backward of embedding and gather (index_add and scatter_add of the gradient): the same bits
// thrice, within the bound of a float64 reference.
TEST(CudaDeterminism, EmbeddingAndGatherBackward) {
  WICK_REQUIRE_GPU();
  for (DType dt : {DType::F32, DType::BF16}) {
    const size_t vocab = 32000, width = 64, n = 4096;
    auto ids = duplicated_ids(n, vocab);
    Tensor ids_gpu = Tensor::from_vec(ids, {n}, Device::cpu()).to_device(gpu());
    Tensor table =
        wick::testing::random_tensor({vocab, width}, dt).to_device(gpu()).requires_grad();
    Tensor w = wick::testing::random_tensor({n, width}, dt);
    Tensor w_gpu = w.to_device(gpu());
    std::string what = std::string("embedding backward ") + dtype_name(dt);
    Tensor grad = same_bits_thrice(
        what, [&] { return *table.embedding(ids_gpu).mul(w_gpu).sum_all().backward().get(table); });
    AddReference ref =
        index_add_reference(std::vector<double>(vocab * width, 0.0), f64(w), ids, 1, vocab, width);
    for (auto& t : ref.terms) --t;  // no destination term: the gradient starts from zero
    expect_within(what, dt, grad, ref);

    const size_t rows = 64, cols = 500, picks = 2000;
    auto gids = duplicated_ids(rows * picks, cols);
    Tensor gids_gpu = Tensor::from_vec(gids, {rows, picks}, Device::cpu()).to_device(gpu());
    Tensor x = wick::testing::random_tensor({rows, cols}, dt).to_device(gpu()).requires_grad();
    Tensor gw = wick::testing::random_tensor({rows, picks}, dt);
    Tensor gw_gpu = gw.to_device(gpu());
    what = std::string("gather backward ") + dtype_name(dt);
    Tensor gx = same_bits_thrice(
        what, [&] { return *x.gather(gids_gpu, 1).mul(gw_gpu).sum_all().backward().get(x); });
    std::vector<double> g = f64(gw);
    AddReference gref{std::vector<double>(rows * cols, 0.0), std::vector<double>(rows * cols, 0.0),
                      std::vector<size_t>(rows * cols, 0)};
    for (size_t r = 0; r < rows; ++r) {
      for (size_t j = 0; j < picks; ++j) {
        size_t at = r * cols + gids[r * picks + j];
        gref.want[at] += g[r * picks + j];
        gref.abs_sum[at] += std::abs(g[r * picks + j]);
        ++gref.terms[at];
      }
    }
    expect_within(what, dt, gx, gref);
  }
}

// An id out of range: IndexOutOfRange at the read-back, nothing added for it, and the device
// usable after.
TEST(CudaDeterminism, IndexAddIdOutOfRange) {
  WICK_REQUIRE_GPU();
  Tensor dst = Tensor::zeros({10, 4}, DType::F32, gpu());
  Tensor ids =
      Tensor::from_vec(std::vector<uint32_t>{1, 12, 1}, {3}, Device::cpu()).to_device(gpu());
  Tensor src = Tensor::ones({3, 4}, DType::F32, gpu());
  EXPECT_BAD(IndexOutOfRange, "index_add", dst.index_add(ids, src, 0).to_vec2<float>());
  Tensor sids =
      Tensor::from_vec(std::vector<uint32_t>{0, 4, 9}, {1, 3}, Device::cpu()).to_device(gpu());
  EXPECT_BAD(IndexOutOfRange, "scatter_add",
             dst.narrow(0, 0, 1)
                 .scatter_add(sids, src.narrow(0, 0, 1).narrow(1, 0, 3), 1)
                 .to_vec2<float>());
  Tensor ok = Tensor::from_vec(std::vector<uint32_t>{1, 3, 1}, {3}, Device::cpu()).to_device(gpu());
  auto v = dst.index_add(ok, src, 0).to_vec2<float>();
  EXPECT_EQ(v[1], std::vector<float>(4, 2.0f));
  EXPECT_EQ(v[3], std::vector<float>(4, 1.0f));
  EXPECT_EQ(v[0], std::vector<float>(4, 0.0f));
}

// Rows alone against the same rows inside batches of 1..64 (tools/conform_determinism.h,
// batch_suite_cuda): norms, softmax, row reductions, the split attention kernel and the decode
// kernel, sequences of different lengths included.
TEST(CudaDeterminism, RowsAloneVsBatches) {
  WICK_REQUIRE_GPU();
  for (const Diff& d : determinism::batch_suite_cuda(64, 56, gpu())) ADD_FAILURE() << describe(d);
}

// Under batch invariance (WICK_BATCH_INVARIANT=1, wick-serve --deterministic) matmul rows (wick's
// GEMM) and quantized matmul rows (its kernel for every row count, 1..64 here) too.
TEST(CudaDeterminism, MatmulAndQmatmulRowsUnderTheSwitch) {
  WICK_REQUIRE_GPU();
  const bool was = wick::batch_invariant();
  wick::set_batch_invariant(true);
  auto diffs = determinism::batch_suite_cuda_unpromised(64, 57, gpu());
  wick::set_batch_invariant(was);
  for (const Diff& d : diffs) ADD_FAILURE() << describe(d);
}

// The decode kernel's batched result is attention itself (so the bit comparisons above compare
// real results): sequences of different lengths in one batch against the CPU in f32.
TEST(CudaDeterminism, DecodeOfSequencesOfDifferentLengths) {
  WICK_REQUIRE_GPU();
  for (DType dt : {DType::BF16, DType::F16}) {
    const size_t b = 12, s_kv = 700;
    Tensor q = wick::testing::random_tensor({b, 8, 1, 64}, dt),
           k = wick::testing::random_tensor({b, 2, s_kv, 64}, dt),
           v = wick::testing::random_tensor({b, 2, s_kv, 64}, dt);
    Tensor mask = determinism::length_mask(b, s_kv, dt, Device::cpu());
    nn::AttentionOptions o;
    o.mask = mask.to_device(gpu());
    Tensor got = nn::scaled_dot_product_attention(q.to_device(gpu()), k.to_device(gpu()),
                                                  v.to_device(gpu()), o);
    nn::AttentionOptions oc;
    oc.mask = mask.to_dtype(DType::F32);
    Tensor want = nn::scaled_dot_product_attention(q.to_dtype(DType::F32), k.to_dtype(DType::F32),
                                                   v.to_dtype(DType::F32), oc);
    const double tol = wick::testing::tolerance(dt);
    EXPECT_TRUE(wick::testing::all_close(f64(got), f64(want), tol, tol)) << dtype_name(dt);
  }
}

}  // namespace
