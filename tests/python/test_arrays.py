"""Arrays cross the boundary without copies, for every dtype shardflow has."""

from __future__ import annotations

import gc

import numpy as np
import pytest
import torch

import shardflow as sf

NUMPY_DTYPES = [(np.float32, sf.float32), (np.float16, sf.float16), (np.int64, sf.int64), (np.int32, sf.int32),
                (np.bool_, sf.bool_)]
TORCH_DTYPES = [(torch.float32, sf.float32), (torch.bfloat16, sf.bfloat16), (torch.float16, sf.float16),
                (torch.int64, sf.int64), (torch.int32, sf.int32), (torch.bool, sf.bool_)]


@pytest.mark.parametrize("np_dtype, dtype", NUMPY_DTYPES)
def test_numpy_round_trip_shares_memory(np_dtype, dtype):
    a = (np.arange(24) % 3).astype(np_dtype).reshape(2, 3, 4)
    t = sf.from_dlpack(a)
    assert t.dtype == dtype and t.shape == (2, 3, 4)
    back = t.numpy()
    assert back.ctypes.data == a.ctypes.data
    np.testing.assert_array_equal(back, a)
    assert np.from_dlpack(t).ctypes.data == a.ctypes.data
    assert np.asarray(t).ctypes.data == a.ctypes.data


@pytest.mark.parametrize("torch_dtype, dtype", TORCH_DTYPES)
def test_torch_round_trip_shares_memory(torch_dtype, dtype):
    x = (torch.arange(24) % 3).to(torch_dtype).reshape(4, 6)
    t = sf.from_dlpack(x)
    assert t.dtype == dtype and t.shape == (4, 6)
    back = torch.from_dlpack(t)
    assert back.data_ptr() == x.data_ptr()
    assert torch.equal(back, x)


def test_results_of_ops_export_without_copies():
    y = sf.randn((64, 64), 3) * 2
    first, second = y.numpy(), torch.from_dlpack(y)
    assert first.ctypes.data == second.data_ptr()
    assert not first.flags.writeable  # shardflow's buffers are read-only once made


def test_non_contiguous_arrays_are_copied_once_and_read_correctly():
    a = np.arange(60, dtype=np.float32).reshape(6, 10)[:, ::3]
    t = sf.from_dlpack(a)
    np.testing.assert_array_equal(t.numpy(), a)
    x = torch.arange(12, dtype=torch.float32).reshape(3, 4).t()
    np.testing.assert_array_equal(sf.from_dlpack(x).numpy(), x.numpy())


def test_the_array_outlives_its_python_handle():
    a = np.arange(1000, dtype=np.float32)
    t = sf.from_dlpack(a)
    del a
    gc.collect()
    assert float(sf.sum(t).item()) == pytest.approx(499500.0)


def test_inputs_are_never_written_by_shardflow():
    a = np.ones((4, 8), dtype=np.float32)
    step = sf.compile(lambda x: sf.index_copy(x, 0, sf.tensor(np.array([1])), sf.zeros((1, 8))))
    out = step(sf.from_dlpack(a))
    assert out.numpy()[1].sum() == 0
    assert a.sum() == 32  # the input keeps its values: borrowed memory is not reused for results


@pytest.mark.parametrize("array, name", [
    (np.zeros(3, dtype=np.float64), "float64"),
    (np.zeros(3, dtype=np.uint8), "uint8"),
    (np.zeros(3, dtype=np.complex64), "complex64"),
])
def test_unsupported_dtypes_are_named(array, name):
    with pytest.raises(sf.Error, match=f"shardflow has no dtype for arrays of {name}"):
        sf.from_dlpack(array)


def test_bfloat16_to_numpy_says_what_to_do():
    t = sf.from_dlpack(torch.zeros(3, dtype=torch.bfloat16))
    with pytest.raises(sf.Error, match="torch.from_dlpack"):
        t.numpy()


def test_tensor_helper_converts_lists_and_numbers():
    assert sf.tensor([1.0, 2.0]).dtype == sf.float32
    assert sf.tensor([1, 2]).dtype == sf.int64
    assert sf.tensor(np.arange(3, dtype=np.int32), sf.float32).dtype == sf.float32
    assert sf.tensor(3.5).item() == 3.5


def test_empty_arrays_cross_too():
    t = sf.from_dlpack(np.zeros((0, 4), dtype=np.float32))
    assert t.shape == (0, 4) and t.numpy().shape == (0, 4)
