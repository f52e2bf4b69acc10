#pragma once
// Tensor: a cheap, copyable handle to a view of shared storage. Methods check shapes, dtypes and
// devices, then hand the work to the storage's backend.

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <new>
#include <optional>
#include <ostream>
#include <type_traits>
#include <vector>

#include "wick/device.h"
#include "wick/dtype.h"
#include "wick/error.h"
#include "wick/layout.h"
#include "wick/shape.h"

namespace wick {

struct TensorImpl;
class GradStore;

namespace detail {
template <class T>
constexpr bool is_element_type_v =
    std::is_same_v<T, uint8_t> || std::is_same_v<T, uint32_t> || std::is_same_v<T, int64_t> ||
    std::is_same_v<T, bf16> || std::is_same_v<T, f16> || std::is_same_v<T, float> ||
    std::is_same_v<T, double>;
template <class T>
constexpr bool is_char_v =
    std::is_same_v<T, bool> || std::is_same_v<T, char> || std::is_same_v<T, wchar_t> ||
    std::is_same_v<T, char8_t> || std::is_same_v<T, char16_t> || std::is_same_v<T, char32_t>;
template <class T>
constexpr auto element_type_of() {
  if constexpr (is_element_type_v<T>) {
    return std::type_identity<T>{};
  } else if constexpr (std::is_integral_v<T> && !is_char_v<T>) {
    if constexpr (std::is_unsigned_v<T> && sizeof(T) < 4) {
      return std::type_identity<uint32_t>{};
    } else {
      return std::type_identity<int64_t>{};  // signed, and 64-bit unsigned (range-checked)
    }
  } else {
    return std::type_identity<void>{};
  }
}
}  // namespace detail

/// The element type a creation function stores a C++ value as: the seven element types (uint8_t,
/// uint32_t, int64_t, bf16, f16, float, double) as themselves; other integers (int, long long,
/// short, size_t...) as int64_t, unsigned ones narrower than 32 bits as uint32_t (a 64-bit
/// unsigned value above INT64_MAX throws wick::Error). bool, character types and long double
/// have none.
template <class T>
using element_type_t = typename decltype(detail::element_type_of<T>())::type;
/// A C++ type the creation functions accept for an element value.
template <class T>
concept ElementValue = !std::is_void_v<element_type_t<T>>;
/// One of the seven element types (dtype_of<T>() compiles).
template <class T>
concept ElementType = detail::is_element_type_v<T>;
/// An integer usable as a dim index (not bool or a character type).
template <class T>
concept DimIndex = std::is_integral_v<T> && !detail::is_char_v<T>;

/// Threads: handles to shared storage may be used from several threads at once. Each op locks
/// the storages it reads (shared) and writes (exclusive), so concurrent reads run together and
/// a write is seen whole; one Tensor object must not be assigned while another thread uses it
/// (as with std::shared_ptr).
class Tensor {
 public:
  /// An empty handle; every op on it throws wick::Error.
  Tensor() = default;

  // ---- creation ----
  // The dtype of full, arange, arange_step, from_vec and scalar is their argument's C++ type
  // (element_type_t): an element type gives its own dtype (float F32, double F64, int64_t I64...),
  // a plain integer literal or variable I64 (unsigned ones narrower than 32 bits U32).
  static Tensor zeros(const Shape& shape, DType dtype, const Device& device);
  static Tensor ones(const Shape& shape, DType dtype, const Device& device);
  /// Every element equal to `value`.
  template <ElementValue T>
  static Tensor full(T value, const Shape& shape, const Device& device) {
    element_type_t<T> v = to_element(value, "full");
    return full_bytes(&v, dtype_of<element_type_t<T>>(), shape, device);
  }
  /// [start, end) in steps of 1: arange(0, 4, dev) is I64 [0, 1, 2, 3], arange(0.0f, 2.0f, dev)
  /// F32 [0, 1].
  template <ElementValue T>
  static Tensor arange(T start, T end, const Device& device) {
    return arange_step<T>(start, end, T(1), device);
  }
  /// [start, end) in steps of `step` (may be negative; not zero). Integer dtypes are computed
  /// exactly in integers; a range too large for memory throws wick::Error (BackendError).
  template <ElementValue T>
  static Tensor arange_step(T start, T end, T step, const Device& device) {
    using E = element_type_t<T>;
    if constexpr (std::is_integral_v<T>) {
      return arange_int(to_i64(start, "arange"), to_i64(end, "arange"), to_i64(step, "arange"),
                        dtype_of<E>(), device);
    } else {
      return arange_impl(static_cast<double>(start), static_cast<double>(end),
                         static_cast<double>(step), dtype_of<E>(), device);
    }
  }
  /// Takes `data` in row-major order; its size must equal shape.elem_count(). Plain integers
  /// are stored as I64 (element_type_t).
  template <ElementValue T>
  static Tensor from_vec(const std::vector<T>& data, const Shape& shape, const Device& device) {
    using E = element_type_t<T>;
    if constexpr (std::is_same_v<E, T>) {
      return from_bytes(data.data(), data.size(), dtype_of<T>(), shape, device);
    } else {
      std::vector<E> converted = host_vector<E>(data.size(), "from_vec");
      for (size_t i = 0; i < data.size(); ++i) converted[i] = to_element(data[i], "from_vec");
      return from_bytes(converted.data(), converted.size(), dtype_of<E>(), shape, device);
    }
  }
  /// from_vec of a braced list: from_vec({1.0f, 2.0f}, {2}, dev) is F32, from_vec({1, 2}, ...) I64.
  template <ElementValue T>
  static Tensor from_vec(std::initializer_list<T> data, const Shape& shape, const Device& device) {
    return from_vec(std::vector<T>(data), shape, device);
  }
  /// A rank-0 tensor.
  template <ElementValue T>
  static Tensor scalar(T value, const Device& device) {
    element_type_t<T> v = to_element(value, "scalar");
    return from_bytes(&v, 1, dtype_of<element_type_t<T>>(), Shape{}, device);
  }
  /// Normal samples of mean `mean` and standard deviation `std` (>= 0), of a float dtype (F32
  /// unless given), from the device's generator (Device::set_seed): randn(0.0, 1.0, shape, dev)
  /// is F32.
  static Tensor randn(double mean, double std, const Shape& shape, const Device& device,
                      DType dtype = DType::F32);
  /// Uniform samples in [lo, hi) of a float dtype (F32 unless given).
  static Tensor rand(double lo, double hi, const Shape& shape, const Device& device,
                     DType dtype = DType::F32);
  /// Standard normal samples, N(0, 1).
  static Tensor randn(const Shape& shape, DType dtype, const Device& device);
  /// Uniform samples in [0, 1).
  static Tensor rand(const Shape& shape, DType dtype, const Device& device);
  /// The same in T's dtype: randn<double>(0, 1, ...) is F64, randn(0.0f, 1.0f, ...) F32 (T an
  /// element type; integer ones throw UnsupportedDType).
  template <class T>
  requires ElementType<T>
  static Tensor randn(T mean, T std, const Shape& shape, const Device& device) {
    return random_impl(true, static_cast<double>(mean), static_cast<double>(std), dtype_of<T>(),
                       shape, device);
  }
  template <class T>
  requires ElementType<T>
  static Tensor rand(T lo, T hi, const Shape& shape, const Device& device) {
    return random_impl(false, static_cast<double>(lo), static_cast<double>(hi), dtype_of<T>(),
                       shape, device);
  }

  // ---- inspection ----
  const Shape& shape() const;
  const std::vector<size_t>& dims() const { return shape().dims(); }
  size_t dim(size_t i) const;
  size_t rank() const { return shape().rank(); }
  size_t elem_count() const { return shape().elem_count(); }
  DType dtype() const;
  Device device() const;
  const Layout& layout() const;
  bool is_contiguous() const { return layout().is_contiguous(); }
  /// Unique per tensor (views get their own id).
  uint64_t id() const;
  bool defined() const { return impl_ != nullptr; }
  /// True when the two handles share one storage buffer.
  bool same_storage(const Tensor& other) const;

  // ---- read-back (waits for the device; copies only the view's bytes) ----
  // A view too large for host memory throws BackendError before anything is allocated.
  template <class T>
  std::vector<T> to_vec1() const {
    std::vector<T> out = host_vector<T>(checked_read_size(dtype_of<T>(), 1, "to_vec1"), "to_vec1");
    read_into(out.data());
    return out;
  }
  template <class T>
  std::vector<std::vector<T>> to_vec2() const {
    std::vector<T> flat = host_vector<T>(checked_read_size(dtype_of<T>(), 2, "to_vec2"), "to_vec2");
    read_into(flat.data());
    std::vector<std::vector<T>> out(dims()[0]);
    for (size_t i = 0; i < out.size(); ++i) {
      out[i].assign(flat.begin() + i * dims()[1], flat.begin() + (i + 1) * dims()[1]);
    }
    return out;
  }
  template <class T>
  std::vector<std::vector<std::vector<T>>> to_vec3() const {
    std::vector<T> flat = host_vector<T>(checked_read_size(dtype_of<T>(), 3, "to_vec3"), "to_vec3");
    read_into(flat.data());
    size_t d0 = dims()[0], d1 = dims()[1], d2 = dims()[2];
    std::vector<std::vector<std::vector<T>>> out(d0, std::vector<std::vector<T>>(d1));
    for (size_t i = 0; i < d0; ++i)
      for (size_t j = 0; j < d1; ++j)
        out[i][j].assign(flat.begin() + (i * d1 + j) * d2, flat.begin() + (i * d1 + j + 1) * d2);
    return out;
  }
  /// The single element of a rank-0 tensor or of any tensor with one element.
  template <class T>
  T to_scalar() const {
    checked_read_size(dtype_of<T>(), -1, "to_scalar");
    T value;
    read_into(&value);
    return value;
  }
  /// All elements in row-major order, converted to double (any dtype).
  std::vector<double> to_vec_f64() const;

  // ---- views (no copy) ----
  /// A view when the layout allows it, otherwise a contiguous copy; element counts must match.
  Tensor reshape(const Shape& shape) const;
  Tensor transpose(size_t dim1, size_t dim2) const;
  /// Swaps the last two dims.
  Tensor t() const;
  Tensor permute(const std::vector<size_t>& order) const;
  /// Elements [start, start + len) of `dim`.
  Tensor narrow(size_t dim, size_t start, size_t len) const;
  /// Index `i` of dim 0, dropping that dim.
  Tensor get(size_t i) const;
  /// Removes `dim`, which must have size 1.
  Tensor squeeze(size_t dim) const;
  /// Inserts a dim of size 1 at `dim` (0..rank).
  Tensor unsqueeze(size_t dim) const;
  /// Numpy-style broadcast to `shape` (stride 0 for the broadcast dims).
  Tensor broadcast_as(const Shape& shape) const;
  /// Prepends the dims of `left`.
  Tensor broadcast_left(const Shape& left) const;
  Tensor flatten_all() const;
  /// Same storage, not tracked by autograd.
  Tensor detach() const;

  // ---- copies ----
  /// A row-major copy, or the same tensor when it already is row-major.
  Tensor contiguous() const;
  /// Always a fresh row-major copy.
  Tensor copy() const;
  Tensor to_device(const Device& device) const;
  Tensor to_dtype(DType dtype) const;
  /// Concatenates along `dim`; all inputs share dtype, device, rank and the other dims.
  static Tensor cat(const std::vector<Tensor>& tensors, size_t dim);
  /// Stacks along a new dim `dim`; all inputs share shape, dtype and device.
  static Tensor stack(const std::vector<Tensor>& tensors, size_t dim);

  // ---- matmul ----
  /// (..., m, k) x (..., k, n) -> (..., m, n); equal ranks >= 2 and equal batch dims.
  Tensor matmul(const Tensor& rhs) const;
  /// Like matmul, with numpy-style broadcasting of the batch dims (no copies).
  Tensor broadcast_matmul(const Tensor& rhs) const;

  // ---- element-wise binary (equal shapes) ----
  Tensor add(const Tensor& rhs) const;
  Tensor sub(const Tensor& rhs) const;
  Tensor mul(const Tensor& rhs) const;
  Tensor div(const Tensor& rhs) const;
  Tensor maximum(const Tensor& rhs) const;
  Tensor minimum(const Tensor& rhs) const;
  // ---- broadcasting binary ----
  Tensor broadcast_add(const Tensor& rhs) const;
  Tensor broadcast_sub(const Tensor& rhs) const;
  Tensor broadcast_mul(const Tensor& rhs) const;
  Tensor broadcast_div(const Tensor& rhs) const;
  Tensor broadcast_maximum(const Tensor& rhs) const;
  Tensor broadcast_minimum(const Tensor& rhs) const;

  // ---- element-wise unary ----
  // One method per entry of wick/unary_ops.def, which gives each op's doc and dtypes: neg abs
  // exp log sqrt sqr recip tanh sin cos relu silu sigmoid gelu gelu_erf erf floor ceil round sign
  // softplus log1p expm1 and more. An unsupported dtype throws UnsupportedDType.
#define WICK_UNARY_OP(K, name, ...) Tensor name() const;
#define WICK_UNARY_PARAM_OP(...)
#include "wick/unary_ops.def"
  /// x * mul + add; every dtype (integers: computed in double, then saturated).
  Tensor affine(double mul, double add) const;
  /// x ^ e.
  Tensor powf(double e) const;
  /// min(max(x, lo), hi); every dtype.
  Tensor clamp(double lo, double hi) const;
  /// x for x > 0, alpha (e^x - 1) otherwise.
  Tensor elu(double alpha = 1.0) const;

  // ---- comparisons (broadcasting; result U8 with 0/1) ----
  Tensor eq(const Tensor& rhs) const;
  Tensor ne(const Tensor& rhs) const;
  Tensor lt(const Tensor& rhs) const;
  Tensor le(const Tensor& rhs) const;
  Tensor gt(const Tensor& rhs) const;
  Tensor ge(const Tensor& rhs) const;
  /// this (U8, broadcast) selects on_true where nonzero, on_false elsewhere.
  Tensor where_cond(const Tensor& on_true, const Tensor& on_false) const;

  // ---- reductions ----
  Tensor sum(const std::vector<size_t>& dims) const;
  Tensor sum_keepdim(const std::vector<size_t>& dims) const;
  Tensor mean(const std::vector<size_t>& dims) const;
  Tensor mean_keepdim(const std::vector<size_t>& dims) const;
  /// One dim: sum(1) is sum({1}). A negative dim throws IndexOutOfRange.
  template <DimIndex I>
  Tensor sum(I dim) const {
    return sum(std::vector<size_t>{dim_arg(dim, "sum")});
  }
  template <DimIndex I>
  Tensor sum_keepdim(I dim) const {
    return sum_keepdim(std::vector<size_t>{dim_arg(dim, "sum")});
  }
  template <DimIndex I>
  Tensor mean(I dim) const {
    return mean(std::vector<size_t>{dim_arg(dim, "mean")});
  }
  template <DimIndex I>
  Tensor mean_keepdim(I dim) const {
    return mean_keepdim(std::vector<size_t>{dim_arg(dim, "mean")});
  }
  Tensor sum_all() const;
  Tensor mean_all() const;
  Tensor max(size_t dim) const;
  Tensor max_keepdim(size_t dim) const;
  Tensor min(size_t dim) const;
  Tensor min_keepdim(size_t dim) const;
  /// Index (U32) of the first maximum along `dim`.
  Tensor argmax(size_t dim) const;
  Tensor argmax_keepdim(size_t dim) const;
  Tensor argmin(size_t dim) const;
  Tensor argmin_keepdim(size_t dim) const;
  Tensor softmax(size_t dim) const;
  /// log(softmax(x)) along `dim`, computed as (x - max) - log(sum(exp(x - max))): finite for any
  /// finite input (float dtypes; f16/bf16 computed in f32). Gradients recorded.
  Tensor log_softmax(size_t dim) const;

  // ---- fused transformer ops (one kernel per backend; float dtypes; gradients recorded) ----
  /// softmax over the last dim.
  Tensor softmax_last_dim() const;
  /// (x - mean) / sqrt(var + eps) * weight + bias over the last dim (biased variance, as
  /// PyTorch). weight and bias: (d) with d the last dim; an empty `bias` handle means none.
  Tensor layer_norm(const Tensor& weight, const Tensor& bias, double eps) const;
  /// x / sqrt(mean(x^2) + eps) * weight over the last dim; weight (d). f16/bf16 round the
  /// normalised x before the weight multiplies it (as transformers' LlamaRMSNorm); an f32 weight
  /// of an f16/bf16 x keeps all in f32 and rounds once (as Gemma's norms).
  Tensor rms_norm(const Tensor& weight, double eps) const;
  /// Rotary embedding, rotate-half form (Llama in Hugging Face): x (b, h, s, d), cos and sin
  /// (s, d / 2); out[i] = x[i] cos[i] - x[i + d/2] sin[i], out[i + d/2] = x[i + d/2] cos[i] +
  /// x[i] sin[i].
  Tensor rope(const Tensor& cos, const Tensor& sin) const;
  /// Rotary embedding on interleaved pairs (2i, 2i + 1) (GGUF, original Llama); same shapes.
  Tensor rope_interleaved(const Tensor& cos, const Tensor& sin) const;

  // ---- indexing (ids U32 or I64) ----
  /// Rows `ids` (rank 1) of `dim`.
  Tensor index_select(const Tensor& ids, size_t dim) const;
  /// out[i][j][k] = self[i][ids[i][j][k]][k] for dim 1; ids has this tensor's rank.
  Tensor gather(const Tensor& ids, size_t dim) const;
  /// Rows of this (vocab, hidden) table: ids shape + [hidden].
  Tensor embedding(const Tensor& ids) const;
  /// Adds `src` into a copy of this at the rows `ids` (rank 1) of `dim` (index_select's adjoint).
  Tensor index_add(const Tensor& ids, const Tensor& src, size_t dim) const;
  /// Adds `src` into a copy of this at positions `ids` along `dim` (gather's adjoint).
  Tensor scatter_add(const Tensor& ids, const Tensor& src, size_t dim) const;

  // ---- autograd ----
  /// A tracked leaf sharing this tensor's storage.
  Tensor requires_grad() const;
  bool is_tracked() const;
  /// Gradients of this one-element tensor with respect to every tracked tensor it depends on.
  GradStore backward() const;
  /// Copies `value` (same shape, dtype, device) into this tensor's elements in place.
  void assign(const Tensor& value) const;

  // Internal: used by the library's own sources.
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}
  const std::shared_ptr<TensorImpl>& impl() const {
    return impl_;
  }

 private:
  static Tensor full_bytes(const void* value, DType dtype, const Shape& shape, const Device& dev);
  static Tensor arange_impl(double start, double end, double step, DType dtype, const Device& dev);
  static Tensor arange_int(int64_t start, int64_t end, int64_t step, DType dtype,
                           const Device& dev);
  static Tensor from_bytes(const void* data, size_t count, DType dtype, const Shape& shape,
                           const Device& device);
  static Tensor random_impl(bool normal, double a, double b, DType dtype, const Shape& shape,
                            const Device& device);
  // An ElementValue as its element type; a 64-bit unsigned value above INT64_MAX throws Error.
  template <class T>
  static element_type_t<T> to_element(T value, const char* op) {
    if constexpr (std::is_integral_v<T> && std::is_unsigned_v<T> && sizeof(T) == 8) {
      if (value > static_cast<uint64_t>(INT64_MAX)) throw_literal_range(op, value);
    }
    return static_cast<element_type_t<T>>(value);
  }
  template <class T>
  static int64_t to_i64(T value, const char* op) {
    return static_cast<int64_t>(to_element(value, op));
  }
  [[noreturn]] static void throw_literal_range(const char* op, uint64_t value);
  template <class I>
  static size_t dim_arg(I dim, const char* op) {
    if constexpr (std::is_signed_v<I>) {
      if (dim < 0) throw_negative_dim(op, static_cast<int64_t>(dim));
    }
    return static_cast<size_t>(dim);
  }
  [[noreturn]] static void throw_negative_dim(const char* op, int64_t dim);
  // Checks dtype, rank (-1: one element) and that the elements fit in host memory; returns the
  // element count.
  size_t checked_read_size(DType requested, int rank, const char* op) const;
  // A vector of `count` elements; BackendError naming the bytes when the allocation fails.
  template <class T>
  static std::vector<T> host_vector(size_t count, const char* op) {
    try {
      return std::vector<T>(count);
    } catch (const std::bad_alloc&) {
      throw_out_of_memory(op, count, sizeof(T));
    } catch (const std::length_error&) {
      throw_out_of_memory(op, count, sizeof(T));
    }
  }
  [[noreturn]] static void throw_out_of_memory(const char* op, size_t count, size_t elem_size);
  void read_into(void* dst) const;

  std::shared_ptr<TensorImpl> impl_;
};

// Operators broadcast numpy-style; a scalar operand is promoted to the tensor's dtype and device.
Tensor operator+(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, const Tensor& b);
Tensor operator/(const Tensor& a, const Tensor& b);
Tensor operator+(const Tensor& a, double b);
Tensor operator-(const Tensor& a, double b);
Tensor operator*(const Tensor& a, double b);
Tensor operator/(const Tensor& a, double b);
Tensor operator+(double a, const Tensor& b);
Tensor operator-(double a, const Tensor& b);
Tensor operator*(double a, const Tensor& b);
Tensor operator/(double a, const Tensor& b);
Tensor operator-(const Tensor& a);

/// Prints up to 6 values per dim, then the shape and dtype.
std::ostream& operator<<(std::ostream& os, const Tensor& t);

}  // namespace wick
