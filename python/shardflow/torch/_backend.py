"""The ``torch.compile`` backend ``"shardflow"``.

Dynamo's FX graph goes through AOTAutograd (a functional aten graph whose
writes to inputs stay in it, see ``_mutation``), is lowered to
shardflow IR (``_lowering``), and runs on the current runtime's devices:
propagated, partitioned and executed by shardflow. Inputs laid out eagerly by
``xs.mark_sharding`` are fed as their shards; other inputs are viewed without
a copy. Outputs come back as torch tensors.

``SHARDFLOW_DUMP_DIR=DIR`` writes each graph's IR to DIR (replay it with
``shardflow partition FILE`` and ``shardflow run FILE --check``).
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import os
import pathlib
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from torch._dynamo.backends.common import aot_autograd

import shardflow as sf

from . import _decompositions, _lowering, _mutation, _state, runtime

_graph_ids = itertools.count()
class CompiledGraphs:
    """The graphs this backend compiled, newest last: len() counts all of
    them; indexing and iteration see the most recent ones only, so that
    recompiling does not keep every old graph (and its constants) alive."""

    def __init__(self, keep: int = 64):
        self._recent: collections.deque = collections.deque(maxlen=keep)
        self._count = 0

    def append(self, graph: "CompiledGraph") -> None:
        self._recent.append(graph)
        self._count += 1

    def __len__(self) -> int:
        return self._count

    def __iter__(self):
        return iter(list(self._recent))

    def __getitem__(self, index: int) -> "CompiledGraph":
        return list(self._recent)[index]

    def since(self, count: int) -> list["CompiledGraph"]:
        """The graphs compiled after the first `count` (those still kept)."""
        newer = min(self._count - count, len(self._recent))
        return list(self._recent)[len(self._recent) - newer:] if newer > 0 else []


# Every graph compiled in this process (explain() reads them).
compiled_graphs = CompiledGraphs()
class Profile:
    """Where compiled graphs' calls spend their time (``shardflow.torch.profile()``).

    ``entries(device)``, ``function_calls`` and ``function_seconds``: the
    runs of the partitioned programs, per device and op kind
    (``shardflow.OpProfile``). ``graph_calls`` and ``graph_seconds``: each
    compiled graph's whole call, from the inputs AOTAutograd hands over to
    the torch tensors handed back, so ``graph_seconds - function_seconds``
    is this backend's own work (feeding inputs, writing state back). What a
    caller times beyond ``graph_seconds`` is Dynamo's and AOTAutograd's."""

    def __init__(self) -> None:
        self.ops = sf.OpProfile()
        self.graph_calls = 0
        self.graph_seconds = 0.0

    def entries(self, device: int = 0) -> list[tuple[str, int, float]]:
        """(op, calls, seconds) rows of one device, the most time first."""
        return self.ops.entries(device)

    @property
    def function_calls(self) -> int:
        return self.ops.function_calls

    @property
    def function_seconds(self) -> float:
        return self.ops.function_seconds


# When set (shardflow.torch.profile()), every graph call adds its times here.
active_profile: Profile | None = None


@dataclass
class Prepared:
    ir: str
    executable: sf.Executable
    constants: list[sf.Tensor]  # the graph's tensor constants, fed after its inputs
    num_user_outputs: int  # the function's outputs; the written inputs' outputs follow
    mutations: list[_mutation.Mutation]  # the inputs the graph writes in place
    donate: list[int]  # written inputs laid out as shards: their shards move into the run
    assertions: list[str]  # the messages of the last outputs, conditions that must hold
    draws_random: bool  # a seed input follows the constants (see _random)
    # Inputs that came unmarked and are kept laid out as propagation chose
    # (see _adoptable): (position, that layout, written in place).
    adopt: list[tuple[int, sf.Sharding, bool]] = field(default_factory=list)


@dataclass
class CompiledGraph:
    """One AOTAutograd forward graph, lowered and prepared per input layout."""

    gm: torch.fx.GraphModule
    name: str
    written: frozenset[int] = frozenset()  # the inputs the graph writes in place (copy_ into them)
    prepared: dict[tuple, Prepared] = field(default_factory=dict)
    last: Prepared | None = None
    # The sharding objects the last call came with: the same objects (marked
    # tensors keep theirs) reuse `last` without building the key again.
    _last_shardings: tuple = ()
    _last_runner: int = -1
    _boxed_call = True  # AOTAutograd passes the inputs as one list

    def prepare(self, shardings: list[sf.Sharding | None]) -> Prepared:
        runner = sf._core._runner_id()
        if (self.last is not None and runner == self._last_runner and len(shardings) == len(self._last_shardings)
                and all(a is b for a, b in zip(shardings, self._last_shardings))):
            return self.last
        key = (runner, _layout_key(shardings))
        entry = self.prepared.get(key)
        if entry is None:
            layouts = _layouts_that_matter(shardings, self.written)
            compiled_key = (runner, _layout_key(layouts))
            compiled = self.prepared.get(compiled_key)
            if compiled is None:
                compiled = self.prepared[compiled_key] = self._compile(layouts)
            # What to keep laid out depends on which inputs came unmarked.
            adopt = _adoptable(compiled.executable.input_shardings, shardings, compiled.mutations)
            entry = self.prepared[key] = dataclasses.replace(compiled, adopt=adopt)
        self.last, self._last_shardings, self._last_runner = entry, tuple(shardings), runner
        return entry

    def _compile(self, layouts: list[sf.Sharding | None]) -> Prepared:
        lowering = _lowering.lower(self.gm, layouts, self.name)
        _dump(self.name, lowering.ir)
        constant_inputs = [_state.to_shardflow(c) for c in lowering.constants]
        donate = [m.input_index for m in lowering.mutations if m.state_output is not None]
        draws_random = lowering.random_draws > 0
        try:
            graph = sf.Graph.parse(lowering.ir)
            executable = sf.Executable(graph, layouts + [None] * (len(constant_inputs) + draws_random))
        except sf.Error as error:
            located = lowering.located(error)
            if located is error:
                raise
            raise located from None
        return Prepared(lowering.ir, executable, constant_inputs, lowering.num_user_outputs, lowering.mutations,
                        donate, [message for _, message in lowering.assertions], draws_random)

    def __call__(self, args: list[Any]) -> list[torch.Tensor]:
        profile = active_profile
        if profile is None:
            return self._call(args, None)
        started = time.perf_counter()
        results = self._call(args, profile.ops)  # a failed call adds nothing, as in OpProfile
        profile.graph_calls += 1
        profile.graph_seconds += time.perf_counter() - started
        return results

    def _call(self, args: list[Any], ops: sf.OpProfile | None) -> list[torch.Tensor]:
        inputs, shardings, in_place = _state.as_inputs(args, self.written, _refuse_non_tensor)
        prepared = self.prepare(shardings)
        adopted = [(index, sharding, written) for index, sharding, written in prepared.adopt
                   if written or (_is_parameter(args[index]) and not args[index].is_complex())]
        if adopted:
            # The model's state the user did not mark (its weights, a KV
            # cache) keeps the layout propagation chose, as PyTorch/XLA keeps
            # device data between calls: laid out once here, then fed as it
            # is (a cache updated in place), not split or copied per call.
            # What every device reads whole stays in torch's memory.
            for index, sharding, written in adopted:
                t = args[index]
                if written and _state.writes_in_place(t, sharding):
                    inputs[index] = _state.keep_in_place(t, sharding)
                    in_place.append(index)
                elif not written and not any(sharding.dim_axes):
                    inputs[index] = _state.borrow_in_place(t, sharding)
                else:
                    inputs[index] = _state.lay_out(t, sharding)
                shardings[index] = sharding
            prepared = self.prepare(shardings)
        written = [args[m.input_index] for m in prepared.mutations]
        args.clear()  # the boxed convention: the callee lets go of the inputs
        try:
            seed = [_random_seed()] if prepared.draws_random else []
            outputs = prepared.executable(inputs + prepared.constants + seed, ops, prepared.donate)
        except BaseException:
            for tensor in written:  # donated shards may be gone: lay the (unchanged) tensor out again
                _state.invalidate(tensor)
            raise
        del inputs
        # From the capsule: torch.from_dlpack(out) first asks `out` which
        # device and DLPack version it speaks (0.02 ms per call more).
        results = [torch.from_dlpack(out.__dlpack__()) for out in outputs[:prepared.num_user_outputs]]
        _write_back(prepared.mutations, written, outputs, in_place)
        for mutation, tensor in zip(prepared.mutations, written):
            if mutation.state_output is None:
                continue
            new_value, sharding = outputs[mutation.state_output], shardings[mutation.input_index]
            if mutation.input_index in in_place:
                _state.keep_written_in_place(tensor, new_value, sharding)
            else:
                _state.set_sharded(tensor, new_value, sharding)
        # After the writes, as PyTorch's asynchronous assertion comes after
        # the work queued before it.
        _check_assertions(prepared.assertions, outputs)
        return results


def _random_seed() -> sf.Tensor:
    # From torch's default generator, so that torch.manual_seed repeats the
    # draws; below 2^62, so that adding each op's number stays in int64.
    return _state.to_shardflow(torch.randint(1 << 62, (), dtype=torch.int64))


def _is_parameter(t: torch.Tensor) -> bool:
    # Parameter's isinstance runs Python (it also accepts tensor subclasses
    # flagged _is_param); a plain tensor, what most inputs are, is not one.
    return type(t) is not torch.Tensor and isinstance(t, torch.nn.Parameter)


def _check_assertions(messages: list[str], outputs: list[sf.Tensor]) -> None:
    """The graph's _assert_async conditions (its last outputs): PyTorch's
    RuntimeError with the message of the first that does not hold."""
    for message, condition in zip(messages, outputs[len(outputs) - len(messages):]):
        if not torch.from_dlpack(condition.__dlpack__()).item():
            raise RuntimeError(message)


def _layout_key(shardings: list[sf.Sharding | None]) -> tuple:
    return tuple(None if s is None else (s.v1, str(s.mesh)) for s in shardings)


def _layouts_that_matter(shardings: list[sf.Sharding | None], written: frozenset[int]) -> list[sf.Sharding | None]:
    """The input layouts a graph is compiled for. A layout on one device (any
    on a one-device runtime; those kept for a graph without annotations on
    several) holds the input whole whatever it says: only a written input's
    tells the graph something (to return its new value for it to keep), so a
    read one kept from the first call on reuses the graph compiled for it unmarked."""
    return [None if s is not None and i not in written and _state.on_one_device(s) else s
            for i, s in enumerate(shardings)]


def _adoptable(chosen: list[sf.Sharding], given: list[sf.Sharding | None],
               mutations: list[_mutation.Mutation]) -> list[tuple[int, sf.Sharding, bool]]:
    """The unmarked inputs whose layout is worth keeping: written ones (else
    copied whole per call to be written), those split across devices (else
    tiled per call), and those every device reads whole (kept as views of
    their own memory, not converted again per call). The caller keeps the
    read ones that are the model's parameters. A graph with no annotation
    runs on one device of several: its inputs are kept as on a one-device
    runtime (a cache written where it lies, weights read where they lie)."""
    if not chosen:
        return []
    written = {m.input_index for m in mutations}
    devices = runtime.global_runtime_device_count()
    return [(i, sharding, i in written) for i, sharding in enumerate(chosen[:len(given)])
            if given[i] is None and len(sharding.mesh.device_ids) in (devices, 1)]


def _write_back(mutations: list[_mutation.Mutation], written: list[torch.Tensor], outputs: list[sf.Tensor],
                in_place: list[int]) -> None:
    """Brings the torch tensors the graph wrote up to date, in order. Row
    writes into their memory go to shardflow in one call; others are
    replayed with torch ops. A tensor fed its own memory (`in_place`) is
    left to `_state.keep_written_in_place`."""
    rows: list[tuple] = []
    for mutation, tensor in zip(mutations, written):
        if mutation.input_index in in_place:
            continue
        direct = mutation.rows_into(tensor, outputs)
        if direct is not None:
            rows += direct
            continue
        if rows:
            sf._core._put_rows_into(rows)
            rows = []
        mutation.apply(tensor, lambda i: torch.from_dlpack(outputs[i]))
    if rows:
        sf._core._put_rows_into(rows)


def _refuse_non_tensor(value: Any) -> None:
    if isinstance(value, (int, torch.SymInt)):
        raise sf.Error(f"a compiled graph got the size {value!r} as an input: Dynamo traced it with dynamic shapes "
                       "(dynamic=True, or by default once a second shape was seen). shardflow compiles static "
                       "shapes: use torch.compile(..., backend=\"shardflow\", dynamic=False), which compiles once "
                       "per shape")
    raise sf.Error(f"a compiled graph got the input {value!r} ({type(value).__name__}); shardflow graphs take "
                   "tensors (Python numbers inside forward are constants)")


def _dump(name: str, ir: str) -> None:
    folder = os.environ.get("SHARDFLOW_DUMP_DIR")
    if folder:
        path = pathlib.Path(folder)
        path.mkdir(parents=True, exist_ok=True)
        (path / f"{name}.ir").write_text(ir)


def _forward_compiler(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> CompiledGraph:
    del example_inputs  # shapes come from the graph's metadata; layouts from the first call
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    written = frozenset(placeholders.index(n.args[0]) for n in gm.graph.nodes
                        if n.target is torch.ops.aten.copy_.default and n.args[0] in placeholders)
    graph = CompiledGraph(gm, f"graph_{next(_graph_ids)}", written)
    compiled_graphs.append(graph)
    return graph


def _backward_compiler(gm: torch.fx.GraphModule, example_inputs: list[Any]):
    raise sf.Error("shardflow compiles inference graphs only: run the compiled model under torch.no_grad() or "
                   "torch.inference_mode() (training is not supported)")


# keep_inference_input_mutations: writes to inputs stay in the graph (as
# copy_ at its end) for shardflow to apply, instead of AOTAutograd copying
# every written input back whole after each call.
backend = aot_autograd(fw_compiler=_forward_compiler, bw_compiler=_backward_compiler,
                       keep_inference_input_mutations=True, decompositions=_decompositions.table())
