"""shardflow: one tensor program on many devices (SPMD), with PyTorch/XLA's sharding semantics.

The C++ core lives in ``shardflow._core``; this package re-exports it under
Python names:

>>> import shardflow as sf
>>> mesh = sf.Mesh([0, 1, 2, 3, 4, 5, 6, 7], (4, 2), ("data", "model"))
>>> sf.Sharding.from_spec(mesh, ("data", None)).v1
'{devices=[4,1,2]0,1,2,3,4,5,6,7 last_tile_dim_replicate}'
"""

from __future__ import annotations

from typing import Any

import numpy as _np

from . import _core
from ._core import (  # noqa: F401  (re-exported)
    Collective,
    CheckResult,
    CompiledFunction,
    DType,
    DeviceShard,
    Error,
    Executable,
    Graph,
    GuardMode,
    HloSharding,
    InvalidShardingError,
    LocalShard,
    OpProfile,
    Mesh,
    PartitionSpec,
    Program,
    Propagation,
    RunResult,
    Runtime,
    ShardLayout,
    Sharding,
    Tensor,
    abs,
    add,
    amax,
    amin,
    arange,
    argmax,
    call,
    cat,
    clear_sharding,
    compile,
    compress_device_list,
    cos,
    div,
    embedding,
    eq,
    exp,
    expand,
    flatten,
    from_dlpack,
    full,
    gather,
    ge,
    gelu,
    get_num_threads,
    gt,
    index_copy,
    index_select,
    le,
    linear,
    log,
    log_softmax,
    lt,
    mark_sharding,
    matmul,
    maximum,
    mean,
    minimum,
    mul,
    ne,
    neg,
    op_schemas,
    ones,
    partition,
    permute,
    pow,
    propagate,
    rand,
    randn,
    relu,
    reshape,
    rms_norm,
    rsqrt,
    run,
    scaled_dot_product_attention,
    select,
    set_num_threads,
    sigmoid,
    silu,
    sin,
    slice,
    softmax,
    sqrt,
    squeeze,
    stack,
    sub,
    sum,
    tanh,
    transpose,
    tril,
    triu,
    unsqueeze,
    where,
    zeros,
)

__version__ = "0.1.0"

# PyTorch-style dtype names.
float32 = DType.float32
bfloat16 = DType.bfloat16
float16 = DType.float16
int64 = DType.int64
int32 = DType.int32
bool_ = DType.bool


def _warn_about_narrow_matrix_kernels() -> None:
    """oneDNN picks its matrix kernels by the CPU's instruction sets; only
    ONEDNN_MAX_CPU_ISA can make them narrower. Say so once, here."""
    import warnings

    _, _, note = _core._matrix_kernel_check()
    if note:
        warnings.warn(note, RuntimeWarning, stacklevel=3)


_warn_about_narrow_matrix_kernels()


def tensor(data: Any, dtype: Any = None) -> Tensor:
    """A shardflow Tensor from an array, a torch CPU tensor, a list or a number.

    Arrays and tensors are viewed without a copy (``from_dlpack``) when they are
    row-major and already of ``dtype``; lists and numbers become a NumPy array
    first. Python floats default to float32, as in PyTorch.
    """
    if isinstance(data, Tensor):
        return data if dtype is None else data.to(dtype)
    if not (hasattr(data, "__dlpack__") or isinstance(data, _np.ndarray)):
        data = _np.asarray(data)
        if data.dtype == _np.float64:
            data = data.astype(_np.float32)
    result = from_dlpack(data)
    return result if dtype is None or result.dtype == _dtype(dtype) else result.to(dtype)


def _dtype(dtype: Any) -> DType:
    return dtype if isinstance(dtype, DType) else zeros((0,), dtype).dtype


__all__ = [name for name in dir() if not name.startswith("_")]
