"""PyTorch/XLA's ``torch_xla.runtime`` (``xr``) names on shardflow.

``use_spmd(devices=N)`` starts N in-process devices (or, under ``mpirun``, one
device per MPI rank); compiled graphs then run on them.
"""

from __future__ import annotations

import atexit
import os

import shardflow as sf

_runtime: sf.Runtime | None = None
# Plain ints, so that compiled code reads them without calling into the
# extension (Dynamo guards on their values).
_device_count = 1
_process_index = 0
_process_count = 1


def _under_mpirun() -> bool:
    return "OMPI_COMM_WORLD_SIZE" in os.environ or "PMI_SIZE" in os.environ


def use_spmd(devices: int | None = None) -> sf.Runtime:
    """Starts the SPMD runtime: ``devices`` in-process devices, or MPI ranks under mpirun."""
    global _runtime
    if _runtime is not None and not _runtime.closed:
        if devices is not None and _runtime.num_devices != devices:
            raise sf.Error(f"use_spmd(devices={devices}): a runtime of {_runtime.num_devices} devices is already "
                           "running; call shutdown() first")
        return _runtime
    if _under_mpirun():
        _runtime = sf.Runtime.mpi()
        if devices is not None and _runtime.num_devices != devices:
            raise sf.Error(f"use_spmd(devices={devices}) under mpirun with {_runtime.num_devices} ranks: "
                           f"launch with mpirun -n {devices}")
    else:
        _runtime = sf.Runtime.local(1 if devices is None else devices)
    _remember(_runtime.num_devices, _runtime.process_index, _runtime.process_count)
    return _runtime


def _remember(devices: int, index: int, count: int) -> None:
    global _device_count, _process_index, _process_count
    _device_count, _process_index, _process_count = devices, index, count


def shutdown() -> None:
    """Ends the runtime started by use_spmd (also done at exit)."""
    global _runtime
    if _runtime is not None:
        _runtime.close()
        _runtime = None
    _remember(1, 0, 1)


atexit.register(shutdown)


def global_runtime_device_count() -> int:
    """The number of devices of the runtime (1 before use_spmd)."""
    return _device_count


def process_index() -> int:
    return _process_index


def process_count() -> int:
    return _process_count


def is_spmd() -> bool:
    return _runtime is not None
