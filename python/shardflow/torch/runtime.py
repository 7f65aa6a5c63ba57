"""PyTorch/XLA's ``torch_xla.runtime`` (``xr``) names on shardflow.

``use_spmd(devices=N)`` starts N in-process devices (or, under ``mpirun``, one
device per MPI rank); compiled graphs then run on them. In-process devices
at least as many as the CPUs of the process's affinity mask are pinned to
them, round-robin (``SHARDFLOW_PIN_DEVICES``: ``auto``, ``1``, ``0``; see the
README's "Device threads are pinned").

While shardflow runs on more than one thread of this host (several devices,
or one device whose kernels use several threads), torch's own ops run on one
thread (``torch.set_num_threads(1)``; ``shutdown()`` gives back the count it
found). torch's OpenMP workers wait for their next job by spinning, for
milliseconds after each parallel op (an ``argmax`` over a batch of logits
between two decode steps, a ``cache.zero_()`` before a prompt), on the cores
shardflow runs on: a stories15M decode step on a (4,1,2) mesh took 18 ms
instead of 11, and a stories110M prefill on one device right after zeroing
its caches 34 ms instead of 26, on a 2-core Zen 2. Started with
``OMP_WAIT_POLICY=passive``, the workers sleep instead and torch's thread
count is left alone.
"""

from __future__ import annotations

import atexit
import os
import warnings

import torch

import shardflow as sf

_runtime: sf.Runtime | None = None
# torch's intra-op thread count before use_spmd lowered it to one.
_torch_threads_before: int | None = None
# Plain ints, so that compiled code reads them without calling into the
# extension (Dynamo guards on their values).
_device_count = 1
_process_index = 0
_process_count = 1


def _leave_the_cores_to_the_devices(runtime: sf.Runtime) -> None:
    """torch's threads down to one while shardflow runs on several threads of
    this host (several devices, or one device's kernels on several threads:
    see the module's text), unless its OpenMP workers wait passively."""
    global _torch_threads_before
    before, here = torch.get_num_threads(), runtime.devices_on_this_host
    if here > 1:
        what = f"{here} devices"
    elif sf.get_num_threads() > 1:
        what = f"one device's kernels on {sf.get_num_threads()} threads"
    else:
        return
    if before == 1 or os.environ.get("OMP_WAIT_POLICY", "").strip().lower() == "passive":
        return
    torch.set_num_threads(1)
    _torch_threads_before = before
    warnings.warn(f"shardflow runs {what} here: torch's own ops now run on 1 thread "
                  f"(was {before}) until shutdown(), since torch's OpenMP workers spin for milliseconds after "
                  "each op on the cores shardflow needs. Start Python with OMP_WAIT_POLICY=passive to keep "
                  "torch's threads.", RuntimeWarning, stacklevel=3)


def _give_back_torch_threads() -> None:
    global _torch_threads_before
    if _torch_threads_before is not None:
        if torch.get_num_threads() == 1:  # not changed by the user since
            torch.set_num_threads(_torch_threads_before)
        _torch_threads_before = None


def use_spmd(devices: int | None = None) -> sf.Runtime:
    """Starts the SPMD runtime: ``devices`` in-process devices, or MPI ranks under mpirun."""
    global _runtime
    if _runtime is not None and not _runtime.closed:
        if devices is not None and _runtime.num_devices != devices:
            raise sf.Error(f"use_spmd(devices={devices}): a runtime of {_runtime.num_devices} devices is already "
                           "running; call shutdown() first")
        return _runtime
    if sf.Runtime.started_by_mpi_launcher():
        _runtime = sf.Runtime.mpi()
        if devices is not None and _runtime.num_devices != devices:
            raise sf.Error(f"use_spmd(devices={devices}) under mpirun with {_runtime.num_devices} ranks: "
                           f"launch with mpirun -n {devices}")
    else:
        _runtime = sf.Runtime.local(1 if devices is None else devices)
    _leave_the_cores_to_the_devices(_runtime)
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
    _give_back_torch_threads()
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
