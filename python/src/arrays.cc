#include "arrays.h"

#include <fmt/format.h>

#include <cstdint>
#include <vector>

#include "shardflow/base/error.h"

namespace shardflow::python {

using Code = nb::dlpack::dtype_code;

static std::string dlpack_name(nb::dlpack::dtype dtype) {
  const char* kind = "type";
  switch (static_cast<Code>(dtype.code)) {
    case Code::Int:
      kind = "int";
      break;
    case Code::UInt:
      kind = "uint";
      break;
    case Code::Float:
      kind = "float";
      break;
    case Code::Bfloat:
      kind = "bfloat";
      break;
    case Code::Complex:
      kind = "complex";
      break;
    case Code::Bool:
      kind = "bool";
      break;
    default:
      break;
  }
  return fmt::format("{}{}", kind, dtype.bits) + (dtype.lanes != 1 ? fmt::format("x{}", dtype.lanes) : "");
}

DType dtype_from_dlpack(nb::dlpack::dtype dtype) {
  if (dtype.lanes == 1) {
    switch (static_cast<Code>(dtype.code)) {
      case Code::Float:
        if (dtype.bits == 32) return DType::kF32;
        if (dtype.bits == 16) return DType::kF16;
        break;
      case Code::Bfloat:
        if (dtype.bits == 16) return DType::kBF16;
        break;
      case Code::Int:
        if (dtype.bits == 64) return DType::kI64;
        if (dtype.bits == 32) return DType::kI32;
        break;
      case Code::Bool:
        if (dtype.bits == 8) return DType::kBool;
        break;
      default:
        break;
    }
  }
  throw Error(
      fmt::format("shardflow has no dtype for arrays of {}; it has float32, bfloat16, float16, int64, int32 "
                  "and bool (convert first, e.g. array.astype(numpy.float32))",
                  dlpack_name(dtype)));
}

nb::dlpack::dtype dlpack_dtype(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return nb::dtype<float>();
    case DType::kBF16:
      return {static_cast<uint8_t>(Code::Bfloat), 16, 1};
    case DType::kF16:
      return {static_cast<uint8_t>(Code::Float), 16, 1};
    case DType::kI64:
      return nb::dtype<int64_t>();
    case DType::kI32:
      return nb::dtype<int32_t>();
    case DType::kBool:
      return nb::dtype<bool>();
  }
  return nb::dtype<float>();  // unreachable: the switch covers every dtype
}

DenseTensor borrow_array(const InputArray& array, DenseTensor::Access access) {
  const DType dtype = dtype_from_dlpack(array.dtype());
  Shape shape;
  for (std::size_t d = 0; d < array.ndim(); ++d) shape.push_back(static_cast<int64_t>(array.shape(d)));
  if (array.size() == 0) return DenseTensor::empty(dtype, std::move(shape));
  // The deleter may run on a device thread: it takes the GIL to let go of
  // the array, unless the interpreter is already gone.
  auto* kept = new InputArray(array);
  std::shared_ptr<std::byte> owner(
      reinterpret_cast<std::byte*>(const_cast<void*>(static_cast<const void*>(array.data()))), [kept](std::byte*) {
        if (!Py_IsInitialized() || _Py_IsFinalizing()) return;  // leak at exit
        nb::gil_scoped_acquire gil;
        delete kept;
      });
  return DenseTensor::borrow(dtype, std::move(shape), std::move(owner), access);
}

// A capsule that keeps the tensor's buffer alive for an array viewing it.
static nb::capsule buffer_owner(const DenseTensor& tensor) {
  return nb::capsule(new DenseTensor(tensor), [](void* p) noexcept { delete static_cast<DenseTensor*>(p); });
}

template <class Framework>
static nb::object view_as(const DenseTensor& tensor) {
  std::vector<std::size_t> shape(tensor.shape().begin(), tensor.shape().end());
  // A zero-size tensor may have no buffer; arrays still want a pointer.
  static const std::byte empty_buffer[64] = {};
  const void* data = tensor.data() != nullptr ? static_cast<const void*>(tensor.data()) : empty_buffer;
  nb::ndarray<Framework, nb::ro> array(data, shape.size(), shape.data(), buffer_owner(tensor), nullptr,
                                       dlpack_dtype(tensor.dtype()), nb::device::cpu::value);
  return array.cast();
}

nb::object to_numpy(const DenseTensor& tensor) {
  if (tensor.dtype() == DType::kBF16) {
    throw Error(
        "NumPy has no bfloat16 dtype: read a bf16 tensor with torch.from_dlpack(t), or convert it first "
        "with t.to('float32')");
  }
  return view_as<nb::numpy>(tensor);
}

nb::object to_array_api(const DenseTensor& tensor) { return view_as<nb::array_api>(tensor); }

}  // namespace shardflow::python
