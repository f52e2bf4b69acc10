#pragma once
// The determinism conformance (docs/NUMERICS.md, "Determinism"), shared by `wick-conform
// --determinism` and tests/test_determinism.cpp. Public API only.
//
// - thread_suite(): every op family, forward and backward, on inputs drawn from a fixed seed and
//   shaped so that the CPU splits them across threads. Run by processes with different thread
//   counts (and twice by one), whose results must be identical bit for bit.
// - batch_suite(): rows alone against the same rows inside batches of 1..max_rows rows
//   (matmul, quantized matmul, norms, softmax, row reductions, attention): a row's bits must not
//   depend on the rest of its batch.

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <functional>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "wick/wick.h"

namespace wick::determinism {

/// One result of the thread suite: its name and its bytes (dtype, shape, raw elements).
struct Result {
  std::string op;
  DType dtype = DType::F32;
  std::vector<size_t> shape;
  std::vector<uint8_t> bytes;
};

/// A difference found: op (with what differed), dtype, shape, how many elements differ, the
/// largest absolute difference and the largest distance in units in the last place.
struct Diff {
  std::string op;
  DType dtype = DType::F32;
  std::vector<size_t> shape;
  size_t count = 0;
  double max_abs = 0;
  uint64_t max_ulps = 0;
};

inline std::string shape_str(const std::vector<size_t>& s) {
  std::string out = "(";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + ")";
}

/// The raw elements of `t` (row-major, contiguous).
inline std::vector<uint8_t> bytes_of(const Tensor& t) {
  Tensor flat = t.flatten_all().contiguous();
  std::vector<uint8_t> out(flat.elem_count() * size_in_bytes(t.dtype()));
  auto put = [&]<class T>(std::vector<T> v) {
    if (!v.empty()) std::memcpy(out.data(), v.data(), out.size());
  };
  switch (t.dtype()) {
    case DType::U8:
      put(flat.to_vec1<uint8_t>());
      break;
    case DType::U32:
      put(flat.to_vec1<uint32_t>());
      break;
    case DType::I64:
      put(flat.to_vec1<int64_t>());
      break;
    case DType::BF16:
      put(flat.to_vec1<bf16>());
      break;
    case DType::F16:
      put(flat.to_vec1<f16>());
      break;
    case DType::F32:
      put(flat.to_vec1<float>());
      break;
    case DType::F64:
      put(flat.to_vec1<double>());
      break;
  }
  return out;
}

/// Element i of raw bytes of `dtype` as a double, and as an integer ordered like the values
/// (floats: adjacent representable values are adjacent integers).
inline double value_at(const uint8_t* p, DType dtype, size_t i) {
  switch (dtype) {
    case DType::U8:
      return p[i];
    case DType::U32: {
      uint32_t v;
      std::memcpy(&v, p + 4 * i, 4);
      return v;
    }
    case DType::I64: {
      int64_t v;
      std::memcpy(&v, p + 8 * i, 8);
      return static_cast<double>(v);
    }
    case DType::BF16: {
      uint16_t h;
      std::memcpy(&h, p + 2 * i, 2);
      return std::bit_cast<float>(static_cast<uint32_t>(h) << 16);
    }
    case DType::F16: {
      f16 h;
      std::memcpy(&h, p + 2 * i, 2);
      return static_cast<float>(h);
    }
    case DType::F32: {
      float v;
      std::memcpy(&v, p + 4 * i, 4);
      return v;
    }
    case DType::F64: {
      double v;
      std::memcpy(&v, p + 8 * i, 8);
      return v;
    }
  }
  return 0;
}

inline int64_t ordered_at(const uint8_t* p, DType dtype, size_t i) {
  // Floats as sign and magnitude: adjacent values of one sign are adjacent integers.
  auto signed_mag = [](uint64_t bits, int width) {
    const uint64_t sign = uint64_t{1} << (width - 1);
    const auto mag = static_cast<int64_t>(bits & (sign - 1));
    return bits & sign ? -mag : mag;
  };
  switch (dtype) {
    case DType::BF16:
    case DType::F16: {
      uint16_t h;
      std::memcpy(&h, p + 2 * i, 2);
      return signed_mag(h, 16);
    }
    case DType::F32: {
      uint32_t v;
      std::memcpy(&v, p + 4 * i, 4);
      return signed_mag(v, 32);
    }
    case DType::F64: {
      uint64_t v;
      std::memcpy(&v, p + 8 * i, 8);
      return signed_mag(v, 64);
    }
    default:
      return static_cast<int64_t>(value_at(p, dtype, i));
  }
}

/// The differences between two results of one op (none: nullopt). Shapes or dtypes that differ
/// count every element.
inline std::optional<Diff> compare(const std::string& op, DType dtype,
                                   const std::vector<size_t>& shape, const uint8_t* a,
                                   const uint8_t* b, size_t count) {
  if (std::memcmp(a, b, count * size_in_bytes(dtype)) == 0) return std::nullopt;
  Diff d{op, dtype, shape, 0, 0, 0};
  for (size_t i = 0; i < count; ++i) {
    size_t w = size_in_bytes(dtype);
    if (std::memcmp(a + i * w, b + i * w, w) == 0) continue;
    ++d.count;
    double x = value_at(a, dtype, i), y = value_at(b, dtype, i);
    double diff = std::isnan(x) || std::isnan(y) ? INFINITY : std::fabs(x - y);
    d.max_abs = std::max(d.max_abs, diff);
    int64_t ox = ordered_at(a, dtype, i), oy = ordered_at(b, dtype, i);
    d.max_ulps = std::max<uint64_t>(d.max_ulps, static_cast<uint64_t>(std::llabs(ox - oy)));
  }
  return d;
}

inline std::optional<Diff> compare(const Result& a, const Result& b) {
  if (a.dtype != b.dtype || a.shape != b.shape || a.bytes.size() != b.bytes.size()) {
    return Diff{a.op + " (dtype or shape)", a.dtype, a.shape, a.bytes.size(), INFINITY, 0};
  }
  return compare(a.op, a.dtype, a.shape, a.bytes.data(), b.bytes.data(),
                 a.bytes.size() / size_in_bytes(a.dtype));
}

// ---- inputs from a fixed seed ----

class Inputs {
 public:
  explicit Inputs(uint64_t seed, Device device = Device::cpu()) : gen_(seed), device_(device) {}
  const Device& device() const { return device_; }
  /// Uniform values in [lo, hi) of `dtype`.
  Tensor uniform(const Shape& shape, DType dtype = DType::F32, double lo = -2, double hi = 2) {
    std::uniform_real_distribution<double> dist(lo, hi);
    std::vector<double> v(shape.elem_count());
    for (auto& x : v) x = dist(gen_);
    return Tensor::from_vec(v, shape, Device::cpu()).to_dtype(dtype).to_device(device_);
  }
  /// Integers in [0, n) as u32.
  Tensor ids(size_t count, uint32_t n) {
    std::uniform_int_distribution<uint32_t> dist(0, n - 1);
    std::vector<uint32_t> v(count);
    for (auto& x : v) x = dist(gen_);
    return Tensor::from_vec(v, {count}, Device::cpu()).to_device(device_);
  }
  /// Random blocks of `type` for an (n, k) weight, with scales keeping the values about +-1.
  QTensor qweight(GgmlType type, size_t n, size_t k) {
    size_t bytes = ggml_bytes(type, n * k), bs = ggml_type_size(type);
    std::vector<uint8_t> raw(bytes);
    std::uniform_int_distribution<int> byte(0, 255);
    std::uniform_real_distribution<float> scale(0.01f, 0.05f), shift(-0.5f, 0.5f);
    for (auto& b : raw) b = static_cast<uint8_t>(byte(gen_));
    auto put = [&](size_t at, float v) {
      uint16_t h = std::bit_cast<uint16_t>(f16(v));
      std::memcpy(raw.data() + at, &h, 2);
    };
    for (size_t off = 0; off < bytes; off += bs) {
      switch (type) {
        case GgmlType::Q4_0:
        case GgmlType::Q5_0:
          put(off, scale(gen_));
          break;
        case GgmlType::Q8_0:
          put(off, scale(gen_) * 0.1f);
          break;
        case GgmlType::Q4_1:
          put(off, scale(gen_));
          put(off + 2, shift(gen_));
          break;
        case GgmlType::Q4_K:
          put(off, scale(gen_) * 0.05f);
          put(off + 2, scale(gen_) * 0.05f);
          break;
        case GgmlType::Q6_K:
          put(off + 208, scale(gen_) * 0.002f);
          break;
        default:
          break;
      }
    }
    return QTensor(type, Shape({n, k}), Tensor::from_vec(raw, {bytes}, Device::cpu()))
        .to_device(device_);
  }

 private:
  std::mt19937_64 gen_;
  Device device_;
};

constexpr GgmlType kQTypes[] = {GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0,
                                GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q6_K};

// ---- the thread suite ----

/// Every op family forward and backward, on inputs from `seed`, sized so that the CPU splits
/// them across threads (long rows, few rows, tall column sums, products above the parallel
/// threshold).
inline std::vector<Result> thread_suite(uint64_t seed = 52, const Device& device = Device::cpu()) {
  Inputs in(seed, device);
  std::vector<Result> out;
  auto add = [&](const std::string& op, const Tensor& t) {
    out.push_back({op, t.dtype(), t.dims(), bytes_of(t)});
  };
  // On CUDA an op in a dtype the device does not take (UnsupportedDType) is recorded as such and
  // skipped, alike in every run.
  auto section = [&](const std::string& what, const std::function<void()>& body) {
    try {
      body();
    } catch (const UnsupportedDType& e) {
      if (!device.is_cuda()) throw;
      out.push_back({what + " (unsupported here: " + e.what() + ")", DType::U8, {}, {}});
    }
  };
  // Reductions: few long rows (split within a row), many rows, column sums (split along rows).
  for (DType dt : {DType::F32, DType::F64, DType::BF16, DType::F16}) {
    std::string s = dtype_name(dt);
    section("reductions " + s, [&] {
      Tensor few = in.uniform({3, 100003}, dt);
      add("sum/rows " + s, few.sum(1));
      add("sum_all " + s, few.sum_all());
      add("mean/rows " + s, few.mean(1));
      Tensor tall = in.uniform({70001, 3}, dt);
      add("sum/cols " + s, tall.sum(0));
      add("mean/cols " + s, tall.mean(0));
      Tensor wide = in.uniform({9000, 40}, dt);
      add("sum/cols-wide " + s, wide.sum(0));
      add("sum/transposed " + s, wide.t().sum(1));
      add("max/rows " + s, few.max(1));
      add("min/cols " + s, tall.min(0));
      add("argmax/rows " + s, few.argmax(1));
      add("argmin/cols " + s, tall.argmin(0));
    });
  }
  section("sum/rows i64", [&] {
    Tensor ints = in.uniform({2, 90001}, DType::F32, 0, 100).to_dtype(DType::I64);
    add("sum/rows i64", ints.sum(1));
  });
  // Softmax and norms.
  for (DType dt : {DType::F32, DType::BF16, DType::F64}) {
    std::string s = dtype_name(dt);
    section("softmax and norms " + s, [&] {
      Tensor x = in.uniform({64, 3000}, dt);
      add("softmax " + s, x.softmax_last_dim());
      add("log_softmax " + s, x.log_softmax(1));
      add("softmax/dim0 " + s, x.softmax(0));
      Tensor one = in.uniform({1, 200003}, dt);
      add("softmax/long-row " + s, one.softmax_last_dim());
      Tensor w = in.uniform({3000}, dt), b = in.uniform({3000}, dt);
      add("rms_norm " + s, x.rms_norm(w, 1e-5));
      add("layer_norm " + s, x.layer_norm(w, b, 1e-5));
    });
  }
  // Products: gemv, thin, square-ish, batched, f64, the narrow bf16/f16 path and the wide one.
  struct Mm {
    size_t b, m, k, n;
  };
  for (Mm p : {Mm{1, 1, 512, 1024}, Mm{1, 3, 512, 700}, Mm{1, 37, 300, 130}, Mm{1, 200, 256, 64},
               Mm{1, 500, 700, 1}, Mm{1, 600, 300, 200}, Mm{4, 33, 64, 50}, Mm{1, 64, 1100, 96}}) {
    for (DType dt : {DType::F32, DType::F64, DType::BF16}) {
      std::string name = "matmul " + shape_str({p.b, p.m, p.k, p.n}) + " " + dtype_name(dt);
      section(name, [&] {
        Tensor a = in.uniform({p.b, p.m, p.k}, dt), w = in.uniform({p.b, p.k, p.n}, dt);
        add(name, a.matmul(w));
      });
    }
  }
  section("matmul/narrow", [&] {
    Tensor a = in.uniform({6, 768}, DType::F16), w = in.uniform({1000, 768}, DType::F16);
    add("matmul/narrow f16", a.matmul(w.t()));
    Tensor a2 = in.uniform({5, 768}, DType::BF16), w2 = in.uniform({1000, 768}, DType::BF16);
    add("matmul/narrow bf16", a2.matmul(w2.t()));
  });
  // Quantized products.
  for (GgmlType type : kQTypes) {
    section("qmatmul " + ggml_type_name(type), [&] {
      QTensor w = in.qweight(type, 300, 512);
      for (size_t m : {1, 5, 33}) {
        add("qmatmul " + ggml_type_name(type) + " m=" + std::to_string(m),
            qmatmul(in.uniform({m, 512}), w));
      }
    });
  }
  // Attention: prefill (causal), decode against a long cache, grouped heads (two k/v heads and
  // one), a mask.
  for (DType dt : {DType::F32, DType::BF16}) {
    std::string s = dtype_name(dt);
    section("attention " + s, [&] {
      Tensor q = in.uniform({2, 4, 37, 64}, dt), k = in.uniform({2, 2, 37, 64}, dt),
             v = in.uniform({2, 2, 37, 64}, dt);
      add("attention/causal " + s, nn::scaled_dot_product_attention(q, k, v, {true, 0, {}}));
      Tensor q1 = in.uniform({1, 8, 1, 64}, dt), k1 = in.uniform({1, 2, 3000, 64}, dt),
             v1 = in.uniform({1, 2, 3000, 64}, dt);
      add("attention/decode " + s, nn::scaled_dot_product_attention(q1, k1, v1, {true, 0, {}}));
      // One k/v head (Gemma-3-1B's grouping): its query rows split across the threads.
      Tensor q2 = in.uniform({1, 4, 1, 64}, dt), k2 = in.uniform({1, 1, 700, 64}, dt),
             v2 = in.uniform({1, 1, 700, 64}, dt);
      add("attention/decode one k/v head " + s,
          nn::scaled_dot_product_attention(q2, k2, v2, {true, 0, {}}));
      Tensor mask = in.uniform({2, 1, 37, 37}, dt, -3, 0);
      add("attention/mask " + s, nn::scaled_dot_product_attention(q, k, v, {false, 0.1, mask}));
    });
  }
  // Indexing that accumulates.
  section("indexing", [&] {
    Tensor table = in.uniform({5000, 64});
    Tensor ids = in.ids(20000, 5000);
    add("embedding", table.embedding(ids));
    Tensor src = in.uniform({20000, 64});
    add("index_add", Tensor::zeros({5000, 64}, DType::F32, device).index_add(ids, src, 0));
    Tensor sids = in.ids(64 * 3000, 64).reshape({64, 3000});
    Tensor ssrc = in.uniform({64, 3000});
    add("scatter_add", Tensor::zeros({64, 64}, DType::F32, device).scatter_add(sids, ssrc, 1));
  });
  // Backward: a small network's gradients (matmul, softmax, norms, reductions, indexing).
  for (DType dt : {DType::F32, DType::F64}) {
    std::string s = dtype_name(dt);
    section("backward " + s, [&] {
      Tensor x = in.uniform({96, 300}, dt).requires_grad();
      Tensor w1 = in.uniform({300, 500}, dt, -0.1, 0.1).requires_grad();
      Tensor g = in.uniform({500}, dt).requires_grad();
      Tensor bias = in.uniform({500}, dt).requires_grad();
      Tensor w2 = in.uniform({500, 40}, dt, -0.1, 0.1).requires_grad();
      Tensor table = in.uniform({300, 500}, dt).requires_grad();
      Tensor ids = in.ids(96, 300);
      Tensor h = x.matmul(w1).add(table.embedding(ids)).layer_norm(g, bias, 1e-5).tanh();
      Tensor h2 = h.rms_norm(g, 1e-6).matmul(w2).log_softmax(1);
      Tensor loss = h2.mul(h2.exp()).sum_all().add(h.sum(0).sqr().mean_all());
      GradStore grads = loss.backward();
      add("backward/loss " + s, loss);
      for (auto [name, t] : {std::pair<const char*, Tensor>{"x", x},
                             {"w1", w1},
                             {"gamma", g},
                             {"beta", bias},
                             {"w2", w2},
                             {"table", table}}) {
        add(std::string("backward/grad ") + name + " " + s, *grads.get(t));
      }
    });
    section("backward/attention " + s, [&] {
      Tensor q = in.uniform({1, 4, 40, 32}, dt).requires_grad();
      Tensor k = in.uniform({1, 4, 40, 32}, dt).requires_grad();
      Tensor v = in.uniform({1, 4, 40, 32}, dt).requires_grad();
      Tensor o = nn::scaled_dot_product_attention(q, k, v, {true, 0, {}});
      GradStore ga = o.sqr().sum_all().backward();
      add("backward/attention dq " + s, *ga.get(q));
      add("backward/attention dk " + s, *ga.get(k));
      add("backward/attention dv " + s, *ga.get(v));
    });
  }
  return out;
}

/// The suite's results in a file: per result a header line (op, dtype, rank, dims, bytes), then
/// the bytes.
inline void write_results(const std::string& path, const std::vector<Result>& results) {
  std::ofstream f(path, std::ios::binary);
  for (const Result& r : results) {
    f << r.op << '\n' << dtype_name(r.dtype) << ' ' << r.shape.size();
    for (size_t d : r.shape) f << ' ' << d;
    f << ' ' << r.bytes.size() << '\n';
    f.write(reinterpret_cast<const char*>(r.bytes.data()),
            static_cast<std::streamsize>(r.bytes.size()));
  }
  if (!f) throw Error("determinism: cannot write " + path);
}

inline std::vector<Result> read_results(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error("determinism: cannot read " + path);
  std::vector<Result> out;
  std::string op, header;
  while (std::getline(f, op) && std::getline(f, header)) {
    std::istringstream h(header);
    std::string dt;
    size_t rank = 0, bytes = 0;
    h >> dt >> rank;
    Result r;
    r.op = op;
    for (DType d :
         {DType::U8, DType::U32, DType::I64, DType::BF16, DType::F16, DType::F32, DType::F64}) {
      if (dt == dtype_name(d)) r.dtype = d;
    }
    r.shape.resize(rank);
    for (auto& d : r.shape) h >> d;
    h >> bytes;
    r.bytes.resize(bytes);
    f.read(reinterpret_cast<char*>(r.bytes.data()), static_cast<std::streamsize>(bytes));
    if (!h || !f) throw FormatError("determinism: truncated results in " + path);
    out.push_back(std::move(r));
  }
  return out;
}

/// The differences between two runs of the suite (`what` names the pair, e.g. "1 vs 2 threads").
inline std::vector<Diff> compare_runs(const std::vector<Result>& a, const std::vector<Result>& b,
                                      const std::string& what) {
  std::vector<Diff> out;
  if (a.size() != b.size()) {
    out.push_back({what + ": " + std::to_string(a.size()) + " against " + std::to_string(b.size()) +
                       " results",
                   DType::F32,
                   {},
                   0,
                   INFINITY,
                   0});
    return out;
  }
  for (size_t i = 0; i < a.size(); ++i) {
    if (auto d = compare(a[i], b[i])) {
      d->op += " [" + what + "]";
      out.push_back(*d);
    }
  }
  return out;
}

// ---- the batch suite ----

/// A row-wise op: rows [first, first + n) of its input (n, ...) -> (n, ...), each output row a
/// function of its input row (and of its index, for ops with per-row operands).
using RowOp = std::function<Tensor(const Tensor& rows, size_t first)>;

/// Each row of `x` alone against the same row inside the batches x[0..m) for m = 1..rows of x;
/// the differences found, one per batch size that differs.
inline void check_rows(const std::string& op, const Tensor& x, const RowOp& f,
                       std::vector<Diff>& diffs) {
  const size_t rows = x.dim(0);
  std::vector<std::vector<uint8_t>> alone(rows);
  for (size_t i = 0; i < rows; ++i) alone[i] = bytes_of(f(x.narrow(0, i, 1), i));
  for (size_t m = 1; m <= rows; ++m) {
    Tensor y = f(x.narrow(0, 0, m), 0);
    std::vector<uint8_t> all = bytes_of(y);
    const size_t row_bytes = all.size() / m;
    std::vector<size_t> shape = y.dims();
    shape[0] = 1;
    std::optional<Diff> worst;
    for (size_t i = 0; i < m; ++i) {
      auto d = compare(op, y.dtype(), shape, alone[i].data(), all.data() + i * row_bytes,
                       row_bytes / size_in_bytes(y.dtype()));
      if (!d) continue;
      if (!worst) {
        worst = d;
      } else {
        worst->count += d->count;
        worst->max_abs = std::max(worst->max_abs, d->max_abs);
        worst->max_ulps = std::max(worst->max_ulps, d->max_ulps);
      }
    }
    if (worst) {
      worst->op = op + " [rows alone vs batch of " + std::to_string(m) + "]";
      worst->shape = y.dims();
      diffs.push_back(*worst);
    }
  }
}

/// Matmul rows alone against rows in batches of 1..max_rows (f32, f64, bf16, f16; k below and
/// above OpenBLAS's k-block; a linear layer's transposed weight), and attention's last queries
/// alone against the same queries inside their prefill. On the CPU these hold with
/// WICK_BATCH_INVARIANT=1 (the default path takes OpenBLAS's gemv for one row, and another
/// attention kernel for a few queries).
inline std::vector<Diff> batch_suite_switched(size_t max_rows = 64, uint64_t seed = 54,
                                              const Device& device = Device::cpu()) {
  Inputs in(seed, device);
  std::vector<Diff> diffs;
  for (DType dt : {DType::F32, DType::F64, DType::BF16, DType::F16}) {
    for (auto [k, n] : {std::pair<size_t, size_t>{256, 320}, {1100, 96}, {64, 1}}) {
      Tensor x = in.uniform({max_rows, k}, dt), w = in.uniform({k, n}, dt);
      check_rows(
          "matmul k=" + std::to_string(k) + " n=" + std::to_string(n) + " " + dtype_name(dt), x,
          [&](const Tensor& r, size_t) { return r.matmul(w); }, diffs);
    }
    Tensor x = in.uniform({max_rows, 384}, dt), w = in.uniform({200, 384}, dt);
    check_rows(
        std::string("matmul/linear ") + dtype_name(dt), x,
        [&](const Tensor& r, size_t) { return r.matmul(w.t()); }, diffs);
  }
  // Attention's queries: the last s_q queries of a causal prefill computed alone (decode is
  // s_q = 1) against the same queries inside the whole prefill.
  for (auto [dt, s] : {std::pair<DType, size_t>{DType::F32, 33},
                       {DType::F32, 40},
                       {DType::F32, 64},
                       {DType::BF16, 33}}) {
    s = std::min(s, max_rows);
    Tensor q = in.uniform({1, 4, s, 64}, dt), k = in.uniform({1, 2, s, 64}, dt),
           v = in.uniform({1, 2, s, 64}, dt);
    Tensor full = nn::scaled_dot_product_attention(q, k, v, {true, 0, {}});
    for (size_t s_q = 1; s_q < s; ++s_q) {
      Tensor part =
          nn::scaled_dot_product_attention(q.narrow(2, s - s_q, s_q), k, v, {true, 0, {}});
      std::vector<uint8_t> a = bytes_of(full.narrow(2, s - s_q, s_q)), b = bytes_of(part);
      if (auto d = compare(std::string("attention/queries ") + dtype_name(dt) + " [last " +
                               std::to_string(s_q) + " queries alone vs prefill of " +
                               std::to_string(s) + "]",
                           dt, part.dims(), a.data(), b.data(), part.elem_count())) {
        diffs.push_back(*d);
      }
    }
  }
  return diffs;
}

/// Rows alone against rows in batches of 1..max_rows for the ops that hold it by default:
/// quantized matmul (every tiled type), norms, softmax, row sums and maxima (short rows, and
/// long ones that a lone row splits across threads), attention (sequences alone against
/// batches of sequences).
inline std::vector<Diff> batch_suite(size_t max_rows = 64, uint64_t seed = 53,
                                     const Device& device = Device::cpu()) {
  Inputs in(seed, device);
  std::vector<Diff> diffs;
  for (GgmlType type : kQTypes) {
    QTensor w = in.qweight(type, 96, 512);
    check_rows(
        "qmatmul " + ggml_type_name(type), in.uniform({max_rows, 512}),
        [&](const Tensor& r, size_t) { return qmatmul(r, w); }, diffs);
  }
  for (DType dt : {DType::F32, DType::BF16, DType::F64}) {
    std::string s = dtype_name(dt);
    Tensor x = in.uniform({max_rows, 1000}, dt);
    Tensor w = in.uniform({1000}, dt), b = in.uniform({1000}, dt);
    check_rows(
        "rms_norm " + s, x, [&](const Tensor& r, size_t) { return r.rms_norm(w, 1e-5); }, diffs);
    check_rows(
        "layer_norm " + s, x, [&](const Tensor& r, size_t) { return r.layer_norm(w, b, 1e-5); },
        diffs);
    check_rows(
        "softmax " + s, x, [](const Tensor& r, size_t) { return r.softmax_last_dim(); }, diffs);
    check_rows(
        "log_softmax " + s, x, [](const Tensor& r, size_t) { return r.log_softmax(1); }, diffs);
    check_rows(
        "sum/rows " + s, x, [](const Tensor& r, size_t) { return r.sum(1); }, diffs);
    check_rows(
        "max/rows " + s, x, [](const Tensor& r, size_t) { return r.max(1); }, diffs);
  }
  const size_t long_rows = std::min<size_t>(max_rows, 6);
  Tensor longx = in.uniform({long_rows, 100003});
  check_rows(
      "sum/long-rows f32", longx, [](const Tensor& r, size_t) { return r.sum(1); }, diffs);
  check_rows(
      "softmax/long-rows f32", longx, [](const Tensor& r, size_t) { return r.softmax_last_dim(); },
      diffs);
  for (DType dt : {DType::F32, DType::BF16}) {
    const size_t seqs = std::min<size_t>(max_rows, 16);
    Tensor q = in.uniform({seqs, 4, 9, 64}, dt), k = in.uniform({seqs, 2, 9, 64}, dt),
           v = in.uniform({seqs, 2, 9, 64}, dt);
    check_rows(
        std::string("attention/sequences ") + dtype_name(dt), q,
        [&](const Tensor& r, size_t b0) {
          size_t n = r.dim(0);
          return nn::scaled_dot_product_attention(r, k.narrow(0, b0, n), v.narrow(0, b0, n),
                                                  {true, 0, {}});
        },
        diffs);
  }
  return diffs;
}

/// A mask (b, 1, 1, s_kv) of `dtype` that shows keys [0, len_i) of sequence i and hides the rest
/// (-inf): sequences of different lengths in one batch, len_i from `s_kv` down to about half.
inline Tensor length_mask(size_t b, size_t s_kv, DType dtype, const Device& device) {
  std::vector<double> m(b * s_kv, 0.0);
  for (size_t i = 0; i < b; ++i) {
    size_t len = s_kv - (i * 37) % (s_kv / 2);
    for (size_t j = len; j < s_kv; ++j) m[i * s_kv + j] = -INFINITY;
  }
  return Tensor::from_vec(m, {b, 1, 1, s_kv}, Device::cpu()).to_dtype(dtype).to_device(device);
}

/// Attention sequences alone against the same sequences inside batches of 1..rows of x's dim 0:
/// q (b, h, s, d) against k, v (b, h_kv, s_kv, d) on `device`, with a per-sequence mask when
/// `mask` is given.
inline void check_sequences(const std::string& op, const Tensor& q, const Tensor& k,
                            const Tensor& v, const std::optional<Tensor>& mask, bool causal,
                            std::vector<Diff>& diffs) {
  check_rows(
      op, q,
      [&](const Tensor& r, size_t b0) {
        size_t n = r.dim(0);
        nn::AttentionOptions o;
        o.causal = causal;
        if (mask) o.mask = mask->narrow(0, b0, n);
        return nn::scaled_dot_product_attention(r, k.narrow(0, b0, n), v.narrow(0, b0, n), o);
      },
      diffs);
}

/// Rows alone against rows in batches of 1..max_rows for what the CUDA backend keeps
/// batch-invariant (docs/NUMERICS.md, "CUDA"): norms, softmax (rows of the warp kernel and of the
/// bulk kernel), row sums, means, maxima and argmax (short rows, and long ones split in chunks),
/// attention sequences (the split kernel: prefill of a few queries, f32 decode) and decode
/// attention (f16/bf16, one query a head against a cache; sequences of different lengths by a
/// mask, and a cache long enough for two merge rounds of its splits).
inline std::vector<Diff> batch_suite_cuda(size_t max_rows, uint64_t seed, const Device& device) {
  Inputs in(seed, device);
  device.set_seed(seed);
  std::vector<Diff> diffs;
  // An op the device does not take is a difference too (named), and the suite goes on.
  auto section = [&](const std::string& what, const std::function<void()>& f) {
    try {
      f();
    } catch (const UnsupportedDType& e) {
      diffs.push_back({what + " (unsupported: " + e.what() + ")", DType::U8, {}, 0, INFINITY, 0});
    }
  };
  auto big = [&](const Shape& shape, DType dt) {
    return Tensor::rand(-2.0, 2.0, shape, device, dt);
  };
  for (DType dt : {DType::F32, DType::BF16, DType::F16, DType::F64}) {
    std::string s = dtype_name(dt);
    section("rows " + s, [&] {
      Tensor x = in.uniform({max_rows, 1000}, dt);
      Tensor w = in.uniform({1000}, dt), b = in.uniform({1000}, dt);
      check_rows(
          "rms_norm " + s, x, [&](const Tensor& r, size_t) { return r.rms_norm(w, 1e-5); }, diffs);
      check_rows(
          "layer_norm " + s, x, [&](const Tensor& r, size_t) { return r.layer_norm(w, b, 1e-5); },
          diffs);
      check_rows(
          "log_softmax " + s, x, [](const Tensor& r, size_t) { return r.log_softmax(1); }, diffs);
      check_rows(
          "sum/rows " + s, x, [](const Tensor& r, size_t) { return r.sum(1); }, diffs);
      check_rows(
          "mean/rows " + s, x, [](const Tensor& r, size_t) { return r.mean(1); }, diffs);
      check_rows(
          "max/rows " + s, x, [](const Tensor& r, size_t) { return r.max(1); }, diffs);
      check_rows(
          "argmax/rows " + s, x, [](const Tensor& r, size_t) { return r.argmax(1); }, diffs);
      check_rows(
          "sum/tiny-rows " + s, in.uniform({max_rows, 12}, dt),
          [](const Tensor& r, size_t) { return r.sum(1); }, diffs);
      // Softmax rows of 1000, 3000 and 6000 elements: the warp kernel, and for f16/bf16 rows above
      // 8 KB the bulk kernel.
      for (size_t cols : {1000, 3000, 6000}) {
        check_rows(
            "softmax/" + std::to_string(cols) + " " + s,
            cols == 1000 ? x : in.uniform({max_rows, cols}, dt),
            [](const Tensor& r, size_t) { return r.softmax_last_dim(); }, diffs);
      }
    });
  }
  // Long rows (chunked reductions): a decode step's vocabulary.
  const size_t long_rows = std::min<size_t>(max_rows, 12);
  for (DType dt : {DType::F32, DType::BF16}) {
    std::string s = dtype_name(dt);
    Tensor longx = big({long_rows, 131072}, dt);
    check_rows(
        "sum/long-rows " + s, longx, [](const Tensor& r, size_t) { return r.sum(1); }, diffs);
    check_rows(
        "argmax/long-rows " + s, longx, [](const Tensor& r, size_t) { return r.argmax(1); }, diffs);
    check_rows(
        "softmax/long-rows " + s, longx,
        [](const Tensor& r, size_t) { return r.softmax_last_dim(); }, diffs);
  }
  // The split kernel: prefill of 9 queries (causal), and f32 decode against 3000 keys.
  for (DType dt : {DType::F32, DType::BF16, DType::F64}) {
    const size_t seqs = std::min<size_t>(max_rows, 16);
    check_sequences(std::string("attention/prefill-9 ") + dtype_name(dt), big({seqs, 4, 9, 64}, dt),
                    big({seqs, 2, 9, 64}, dt), big({seqs, 2, 9, 64}, dt), std::nullopt, true,
                    diffs);
  }
  {
    const size_t seqs = std::min<size_t>(max_rows, 32);
    check_sequences("attention/decode f32", big({seqs, 8, 1, 64}, DType::F32),
                    big({seqs, 2, 3000, 64}, DType::F32), big({seqs, 2, 3000, 64}, DType::F32),
                    length_mask(seqs, 3000, DType::F32, device), false, diffs);
  }
  // The decode kernel (f16/bf16): sequences of different lengths (a mask) in batches of up to
  // max_rows, and a cache of 4100 keys (17 splits) without a mask.
  for (DType dt : {DType::BF16, DType::F16}) {
    std::string s = dtype_name(dt);
    check_sequences("attention/decode-masked " + s, big({max_rows, 8, 1, 64}, dt),
                    big({max_rows, 2, 700, 64}, dt), big({max_rows, 2, 700, 64}, dt),
                    length_mask(max_rows, 700, dt, device), false, diffs);
    const size_t seqs = std::min<size_t>(max_rows, 8);
    check_sequences("attention/decode-long " + s, big({seqs, 4, 1, 128}, dt),
                    big({seqs, 1, 4100, 128}, dt), big({seqs, 1, 4100, 128}, dt), std::nullopt,
                    false, diffs);
  }
  return diffs;
}

/// What the CUDA backend does not keep batch-invariant (docs/NUMERICS.md): matmul rows (cuBLASLt
/// picks its algorithm per shape) and quantized matmul rows (one row takes the decode GEMV).
/// Reported, never a failure.
inline std::vector<Diff> batch_suite_cuda_unpromised(size_t max_rows, uint64_t seed,
                                                     const Device& device) {
  Inputs in(seed, device);
  std::vector<Diff> diffs;
  for (DType dt : {DType::F32, DType::BF16, DType::F16}) {
    Tensor x = in.uniform({max_rows, 384}, dt), w = in.uniform({200, 384}, dt);
    check_rows(
        std::string("matmul/linear ") + dtype_name(dt), x,
        [&](const Tensor& r, size_t) { return r.matmul(w.t()); }, diffs);
  }
  QTensor q = in.qweight(GgmlType::Q4_0, 96, 512);
  check_rows(
      "qmatmul q4_0", in.uniform({max_rows, 512}),
      [&](const Tensor& r, size_t) { return qmatmul(r, q); }, diffs);
  return diffs;
}

/// Sentences of varied lengths for the embedding check (sentence i of `count`).
inline std::vector<std::string> sentences(size_t count) {
  static const char* words[] = {"the",    "quick", "model",  "embeds", "every",   "sentence",
                                "alone",  "or",    "inside", "a",      "batch",   "with",
                                "others", "of",    "any",    "length", "numbers", "42"};
  std::vector<std::string> out;
  std::mt19937_64 gen(55);
  for (size_t i = 0; i < count; ++i) {
    std::string s;
    size_t n = 1 + gen() % 6;
    for (size_t w = 0; w < n; ++w) {
      if (w > 0) s.push_back(' ');
      s.append(words[gen() % 18]);
    }
    s.push_back('.');
    out.push_back(s);
  }
  return out;
}

/// A sentence embedded alone against the same sentence inside batches of 1..max_batch sentences
/// (whose padding, lengths and row counts differ), for the model folder `model_dir`.
inline std::vector<Diff> embedding_suite(const std::string& model_dir, const Device& device,
                                         size_t max_batch = 128) {
  auto embedder = SentenceEmbedder::load(model_dir, device);
  std::vector<std::string> texts = sentences(max_batch);
  std::vector<Diff> diffs;
  std::vector<std::vector<uint8_t>> alone(max_batch);
  for (size_t i = 0; i < max_batch; ++i) alone[i] = bytes_of(embedder.embed({texts[i]}));
  for (size_t m = 1; m <= max_batch; ++m) {
    Tensor y = embedder.embed(std::vector<std::string>(texts.begin(), texts.begin() + m));
    std::vector<uint8_t> all = bytes_of(y);
    const size_t row = all.size() / m, dim = row / size_in_bytes(y.dtype());
    for (size_t i = 0; i < m; ++i) {
      if (auto d = compare("embedding [sentence " + std::to_string(i) + " alone vs batch of " +
                               std::to_string(m) + "]",
                           y.dtype(), {1, dim}, alone[i].data(), all.data() + i * row, dim)) {
        diffs.push_back(*d);
      }
    }
  }
  return diffs;
}

}  // namespace wick::determinism
