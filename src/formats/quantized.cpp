#include "wick/quantized.h"

#include "cpu/cpu_storage.h"
#include "cpu/dequant.h"
#include "formats/format_util.h"
#include "fused/quantized.h"
#include "tensor_internal.h"

namespace wick {

namespace {

struct TypeTraits {
  uint32_t id;
  const char* name;
  size_t block;
  size_t bytes;
};

// Block sizes from ggml's type traits (ggml-common.h's block structs).
constexpr TypeTraits kTypes[] = {
    {0, "f32", 1, 4},         {1, "f16", 1, 2},         {2, "q4_0", 32, 18},
    {3, "q4_1", 32, 20},      {6, "q5_0", 32, 22},      {7, "q5_1", 32, 24},
    {8, "q8_0", 32, 34},      {9, "q8_1", 32, 36},      {10, "q2_k", 256, 84},
    {11, "q3_k", 256, 110},   {12, "q4_k", 256, 144},   {13, "q5_k", 256, 176},
    {14, "q6_k", 256, 210},   {15, "q8_k", 256, 292},   {16, "iq2_xxs", 256, 66},
    {17, "iq2_xs", 256, 74},  {18, "iq3_xxs", 256, 98}, {19, "iq1_s", 256, 50},
    {20, "iq4_nl", 32, 18},   {21, "iq3_s", 256, 110},  {22, "iq2_s", 256, 82},
    {23, "iq4_xs", 256, 136}, {24, "i8", 1, 1},         {25, "i16", 1, 2},
    {26, "i32", 1, 4},        {27, "i64", 1, 8},        {28, "f64", 1, 8},
    {29, "iq1_m", 256, 56},   {30, "bf16", 1, 2},       {34, "tq1_0", 256, 54},
    {35, "tq2_0", 256, 66},   {39, "mxfp4", 32, 17},
};

const TypeTraits* traits(uint32_t id) {
  for (const auto& t : kTypes) {
    if (t.id == id) return &t;
  }
  return nullptr;
}

const TypeTraits& traits_or_throw(GgmlType type) {
  const TypeTraits* t = traits(static_cast<uint32_t>(type));
  if (t == nullptr) throw UnsupportedDType(str("ggml: unknown type ", static_cast<uint32_t>(type)));
  return *t;
}

}  // namespace

bool ggml_type_known(uint32_t type) {
  return traits(type) != nullptr;
}

std::string ggml_type_name(GgmlType type) {
  const TypeTraits* t = traits(static_cast<uint32_t>(type));
  return t ? std::string(t->name) : str("type ", static_cast<uint32_t>(type));
}

size_t ggml_block_size(GgmlType type) {
  return traits_or_throw(type).block;
}

size_t ggml_type_size(GgmlType type) {
  return traits_or_throw(type).bytes;
}

bool ggml_can_dequantize(GgmlType type) {
  switch (type) {
    case GgmlType::F32:
    case GgmlType::F16:
    case GgmlType::BF16:
    case GgmlType::Q8_0:
    case GgmlType::Q4_0:
    case GgmlType::Q4_1:
    case GgmlType::Q5_0:
    case GgmlType::Q4_K:
    case GgmlType::Q6_K:
      return true;
    default:
      return false;
  }
}

size_t ggml_bytes(GgmlType type, size_t n) {
  const TypeTraits& t = traits_or_throw(type);
  if (n % t.block != 0) {
    throw ShapeMismatch(str("ggml: ", n, " values of ", t.name, " are not a whole number of ",
                            t.block, "-value blocks"));
  }
  size_t bytes;
  if (__builtin_mul_overflow(n / t.block, t.bytes, &bytes)) {
    throw ShapeMismatch(str("ggml: ", n, " values of ", t.name, " overflow size_t"));
  }
  return bytes;
}

QTensor::QTensor(GgmlType type, Shape shape, Tensor data)
    : type_(type), shape_(std::move(shape)), data_(std::move(data)) {
  size_t last = shape_.rank() == 0 ? 1 : shape_[shape_.rank() - 1];
  if (last % ggml_block_size(type_) != 0) {
    throw ShapeMismatch(str("QTensor: last dim of ", shape_, " is not a multiple of the ",
                            ggml_type_name(type_), " block size ", ggml_block_size(type_)));
  }
  size_t need = ggml_bytes(type_, shape_.elem_count());
  if (!data_.defined() || data_.dtype() != DType::U8 || data_.rank() != 1 ||
      data_.elem_count() != need) {
    throw ShapeMismatch(str("QTensor: ", ggml_type_name(type_), " ", shape_,
                            " needs a rank-1 u8 tensor of ", need, " bytes"));
  }
}

QTensor QTensor::to_device(const Device& device) const {
  return QTensor(type_, shape_, data_.to_device(device));
}

Tensor QTensor::dequantize() const {
  if (!ggml_can_dequantize(type_)) {
    throw UnsupportedDType(
        str("dequantize: ggml type ", ggml_type_name(type_), " is not supported"));
  }
  size_t n = shape_.elem_count();
  Tensor raw = data_.is_contiguous() ? data_ : data_.contiguous();
  formats::count_copied(n * 4);
  return wick::apply(fused::DequantizeOp(type_, n), {raw})[0].reshape(shape_);
}

}  // namespace wick

namespace wick::fused {

// The kernels that read blocks from the start of their buffer only (CUDA) decline the others:
// they run on a copy.
TensorList DequantizeOp::fallback(const TensorList& in) const {
  if (in[0].layout().start_offset() == 0) {
    throw BackendError(
        str("dequantize: no kernel for ", ggml_type_name(type), " on ", in[0].device()));
  }
  return wick::apply(*this, {in[0].copy()});
}

}  // namespace wick::fused
