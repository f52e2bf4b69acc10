#pragma once
// The wick::Error family: every failure in wick throws one of these.

#include <stdexcept>
#include <string>

namespace wick {

/// Base of every wick exception. The message starts with the op and names shapes/dtypes/devices.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Shapes that do not fit the op (ranks, dims, element counts, broadcasts).
class ShapeMismatch : public Error {
 public:
  using Error::Error;
};

/// Two operands, or an operand and a requested type, have different dtypes.
class DTypeMismatch : public Error {
 public:
  using Error::Error;
};

/// Operands live on different devices.
class DeviceMismatch : public Error {
 public:
  using Error::Error;
};

/// The op is not defined for this dtype (e.g. exp on u8, matmul on i64).
class UnsupportedDType : public Error {
 public:
  using Error::Error;
};

/// A dim or an index outside its bounds.
class IndexOutOfRange : public Error {
 public:
  using Error::Error;
};

/// A failure reported by a backend library or device (CUDA, cuBLAS, BLAS, out-of-memory).
class BackendError : public Error {
 public:
  using Error::Error;
};

/// A malformed file (or byte buffer) given to a loader: the message names the file and the offset
/// or tensor where it went wrong.
class FormatError : public Error {
 public:
  using Error::Error;
};

}  // namespace wick
