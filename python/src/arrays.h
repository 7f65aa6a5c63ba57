// Arrays across the language boundary without copies: NumPy arrays, torch
// CPU tensors and anything else with DLPack or the buffer protocol become
// DenseTensors that view their memory, and DenseTensors become read-only
// NumPy arrays (or DLPack capsules) that view theirs.
#pragma once
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include "shardflow/tensor/dense_tensor.h"

namespace shardflow::python {

namespace nb = nanobind;

// Any CPU array: row-major ones are viewed as they are, others are copied
// once into row-major order by their own library (as np.ascontiguousarray).
using InputArray = nb::ndarray<nb::ro, nb::c_contig, nb::device::cpu>;

DType dtype_from_dlpack(nb::dlpack::dtype dtype);
nb::dlpack::dtype dlpack_dtype(DType dtype);

// Views the array's memory; the array stays alive as long as the tensor (or
// any view of its buffer) does.
DenseTensor borrow_array(const InputArray& array, DenseTensor::Access access = DenseTensor::Access::kReadOnly);

// A read-only NumPy array viewing the tensor's buffer (bf16 has no NumPy
// dtype: an error says to use DLPack instead).
nb::object to_numpy(const DenseTensor& tensor);

// The tensor as a DLPack provider (`__dlpack__`, `__dlpack_device__`) for
// torch.from_dlpack, np.from_dlpack and other array libraries.
nb::object to_array_api(const DenseTensor& tensor);

}  // namespace shardflow::python
