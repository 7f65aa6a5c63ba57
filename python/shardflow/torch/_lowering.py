"""AOTAutograd's functional aten graph -> shardflow IR text.

Each FX node becomes one IR node through the op schemas: aten names and
overloads are the IR's (``torch.ops.aten.add.Tensor`` is ``aten::add.Tensor``),
arguments bind by the schema's names. Ops shardflow has run as they are; a
few are rewritten into ops it has (``REWRITES``); anything else is an error
naming the aten op, its schema and the user's source line. The sharding
annotations become ``xla::dynamo_mark_sharding`` nodes with concrete device
ids, and later uses of the annotated tensor read the annotated value, since
the annotation applies to the tensor passed in (its result may be ignored).
"""

from __future__ import annotations

import math
import operator
import pathlib
import re
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.fx

import shardflow as sf

from . import _complex, _mutation, _ops, _state

DTYPES = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16", torch.int64: "i64",
          torch.int32: "i32", torch.bool: "bool"}

# Keyword arguments that only say "CPU, dense, default layout": dropped.
_PLACEMENT_KWARGS = {"device", "layout", "pin_memory", "memory_format", "non_blocking"}


class LoweringError(sf.Error):
    """An FX graph shardflow cannot run, with the op and the user's source line."""


_PACKAGE_DIR = str(pathlib.Path(__file__).resolve().parent)


def source_line(node: torch.fx.Node) -> str:
    """The user's line that made the node: the innermost frame of its stack
    trace outside shardflow.torch (xs.mark_sharding's own lines are not it)."""
    trace = node.meta.get("stack_trace") or ""
    lines = [line.strip() for line in trace.strip().splitlines() if line.strip()]
    frames = [(line, lines[i + 1] if i + 1 < len(lines) and not lines[i + 1].startswith("File ") else "")
              for i, line in enumerate(lines) if line.startswith("File ")]
    for frame, code in reversed(frames):
        if _PACKAGE_DIR not in frame:
            return f"{frame}: {code}" if code else frame
    return "(no source line recorded)"


def ir_type(value: Any, node: torch.fx.Node) -> str:
    if not isinstance(value, torch.Tensor):
        raise LoweringError(f"{node.format_node()} produces {type(value).__name__}, not a tensor; "
                            f"shardflow graphs compute tensors only (at {source_line(node)})")
    if value.dtype not in DTYPES:
        raise LoweringError(f"{node.name} is {value.dtype}, which shardflow does not have (float32, bfloat16, "
                            f"float16, int64, int32, bool) (at {source_line(node)})")
    dims = []
    for d in value.shape:
        if not isinstance(d, int):
            raise LoweringError(f"{node.name} has a dynamic shape {tuple(value.shape)}; shardflow compiles static "
                                "shapes (torch.compile(..., dynamic=False)) (at " + source_line(node) + ")")
        dims.append(str(d))
    return _tensor_type(DTYPES[value.dtype], dims)


def _tensor_type(dtype: str, shape) -> str:
    """An IR type from a dtype name and static dims: f32[2,3]."""
    return f"{dtype}[{','.join(map(str, shape))}]"


def _literal(value: Any) -> str:
    if isinstance(value, Ref):
        return value.name
    if value is None:
        return "None"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        text = repr(value)
        return text if ("." in text or "e" in text) else text + ".0"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, torch.dtype):
        if value not in DTYPES:
            raise LoweringError(f"dtype {value} is not one shardflow has")
        return DTYPES[value]
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_literal(v) for v in value) + "]"
    raise LoweringError(f"cannot write {value!r} ({type(value).__name__}) as an IR argument")


@dataclass(frozen=True)
class Ref:
    """An IR value, by name ('%addmm')."""

    name: str


# The seed of a graph's random draws: one more input, after its constants,
# fed a fresh value from torch's default generator by each call (see _random).
SEED = Ref("%random_seed")
SEED_TYPE = "i64[]"


# Ops that only give their operand another shape: a reshape of a reshape
# reads the first operand directly, and one left unread is dropped.
_RESHAPES = frozenset({"aten::view", "aten::reshape"})


@dataclass
class _Line:
    names: tuple[str, ...]
    text: str
    uses: frozenset[str]  # the values it reads
    droppable: bool  # a reshape: dropped when nothing reads its result
    node: torch.fx.Node | None  # the FX node it lowers (for errors naming the user's line)


def _names_in(value: Any) -> list[str]:
    if isinstance(value, Ref):
        return [value.name]
    if isinstance(value, (list, tuple)):
        return [name for v in value for name in _names_in(v)]
    return []


@dataclass
class Emitter:
    """Builds the IR text of one function. Reshapes are folded as they are
    emitted (AOTAutograd spells every nn.Linear view -> mm -> view, every
    head split a view of a view): a reshape reads the value its operand
    reshaped, one to that value's own type is that value, and reshapes
    nothing reads are left out of the text."""

    lines: list[_Line] = field(default_factory=list)
    counter: int = 0
    types: dict[str, str] = field(default_factory=dict)  # value name -> IR type
    reshaped_from: dict[str, Ref] = field(default_factory=dict)  # reshape result -> the value it reshapes
    lowering_node: torch.fx.Node | None = None  # the FX node whose lines are being emitted

    def fresh(self, hint: str) -> Ref:
        self.counter += 1
        return Ref(f"%{hint}_sf{self.counter}")

    def declare(self, ref: Ref, type_text: str) -> None:
        """A function input's type (its reshapes to that type are the input itself)."""
        self.types[ref.name] = type_text

    def op(self, result: Ref | list[Ref], op: str, args: list[Any], kwargs: dict[str, Any], type_text: str):
        """One node; several results (`%a, %b = aten::topk(...) : (f32[2], i64[2])`) for a list."""
        reshape = op in _RESHAPES and isinstance(result, Ref) and args and isinstance(args[0], Ref)
        if reshape:
            source = self.reshaped_from.get(args[0].name, args[0])
            if self.types.get(source.name) == type_text:
                return source
            args = [source, *args[1:]]
        parts = [_literal(a) for a in args] + [f"{k}={_literal(v)}" for k, v in kwargs.items()]
        results = result if isinstance(result, list) else [result]
        names = tuple(r.name for r in results)
        self.lines.append(_Line(names, f"  {', '.join(names)} = {op}({', '.join(parts)}) : {type_text}",
                                frozenset(_names_in(args) + _names_in(list(kwargs.values()))), bool(reshape),
                                self.lowering_node))
        if isinstance(result, Ref):
            self.types[result.name] = type_text
            if reshape:
                self.reshaped_from[result.name] = args[0]
        return result

    def text(self, returned: list[Ref]) -> list[_Line]:
        """The lines, less the reshapes nothing reads (`returned`: the function's results)."""
        read = {r.name for r in returned}
        kept = []
        for line in reversed(self.lines):
            if line.droppable and not read.intersection(line.names):
                continue
            read |= line.uses
            kept.append(line)
        return kept[::-1]


def _ir_name(overload: torch._ops.OpOverload) -> str:
    schema = overload._schema
    return schema.name + (f".{schema.overload_name}" if schema.overload_name else "")


@dataclass
class Lowering:
    """One FX graph -> IR. `annotate_inputs[i]`: the sharding graph input i comes in with."""

    gm: torch.fx.GraphModule
    annotate_inputs: list[sf.Sharding | None]
    emit: Emitter = field(default_factory=Emitter)
    values: dict[torch.fx.Node, Any] = field(default_factory=dict)
    schemas: dict[str, str] = field(default_factory=sf.op_schemas)
    constants: list[torch.Tensor] = field(default_factory=list)  # get_attr tensors, fed after the inputs
    norms: dict[torch.fx.Node, tuple] = field(default_factory=dict)  # RMSNorms written in torch ops
    absorbed: set[torch.fx.Node] = field(default_factory=set)  # their inner nodes
    mutations: list[_mutation.Mutation] = field(default_factory=list)  # inputs the graph writes, in output order
    num_user_outputs: int = 0  # the function's own outputs come first; the mutations' after
    # _assert_async's conditions, the last outputs, with the message each
    # raises when false (checked by the caller after the run).
    assertions: list[tuple[Ref, str]] = field(default_factory=list)
    ir: str = ""  # the IR text, once run
    line_nodes: list[torch.fx.Node | None] = field(default_factory=list)  # the FX node of each line of `ir`
    # (index node, dim size) -> its positions wrapped into [0, size): every
    # layer's cache write at the same input_pos shares one.
    wrapped_positions: dict[tuple[torch.fx.Node, int], Ref] = field(default_factory=dict)
    # Complex values lowered once and shared (see _complex): moves of one
    # value, each product factor's tables, the pair swap index.
    complex_tables: dict[Any, Any] = field(default_factory=dict)
    random_draws: int = 0  # random ops lowered, each seeded by SEED plus its number

    def run(self, name: str = "main") -> str:
        self.norms, self.absorbed = find_rms_norms(self.gm.graph)
        params, outputs = [], []
        placeholders = [n for n in self.gm.graph.nodes if n.op == "placeholder"]
        for index, node in enumerate(placeholders):
            ref = Ref(f"%{node.name}")
            value = node.meta.get("val")
            if isinstance(value, torch.Tensor) and value.is_complex():
                # Fed as view_as_real(input): f32 with a trailing 2.
                type_text, self.values[node] = _complex.input_value(ref, node)
                params.append(f"{ref.name}: {type_text}")
                self.emit.declare(ref, type_text)
                continue
            type_text = ir_type(value, node)
            params.append(f"{ref.name}: {type_text}")
            self.emit.declare(ref, type_text)
            self.values[node] = ref
            sharding = self.annotate_inputs[index] if index < len(self.annotate_inputs) else None
            # A layout on one device holds the input whole: no constraint (on a
            # runtime of several devices no annotation can name that mesh).
            if sharding is not None and not _state.on_one_device(sharding):
                self.values[node] = self._annotation(ref, sharding, node)
        for node in self.gm.graph.nodes:
            if node.op == "get_attr" and not _only_device_ids(node):
                # A tensor constant of the graph: one more input, after the
                # graph's own (the caller feeds `constants`).
                value = getattr(self.gm, node.target)
                ref = Ref(f"%{node.name}")
                params.append(f"{ref.name}: {ir_type(value, node)}")
                self.emit.declare(ref, ir_type(value, node))
                self.values[node] = ref
                self.constants.append(value)
        self.emit.declare(SEED, SEED_TYPE)
        for node in self.gm.graph.nodes:
            self.emit.lowering_node = node
            if node.op == "call_function":
                self.values[node] = self._call(node)
            elif node.op == "output":
                for out in torch.fx.node.map_arg(node.args[0], lambda n: n):
                    if not isinstance(out, torch.fx.Node):
                        raise LoweringError(f"graph output {out!r} is not a tensor computed by the graph")
                    outputs.append((self.values[out], ir_type(out.meta.get("val"), out)))
                self.num_user_outputs = len(outputs)
                for mutation in self.mutations:
                    self._mutation_outputs(mutation, placeholders, outputs)
                outputs.extend((condition, "bool[]") for condition, _ in self.assertions)
        if self.random_draws:
            params.append(f"{SEED.name}: {SEED_TYPE}")  # the last input, after the constants
        header = (f"func @{name}({', '.join(params)}) -> ({', '.join(t for _, t in outputs)}) {{")
        footer = f"  return {', '.join(r.name for r, _ in outputs)}\n}}\n"
        body = self.emit.text([r for r, _ in outputs])
        self.line_nodes = [None, *(line.node for line in body), None]
        return "\n".join([header, *(line.text for line in body), footer])

    def located(self, error: sf.Error) -> sf.Error:
        """An error shardflow raised on the IR text ("... at line N: ..."),
        with the user's source line of the FX node that line lowers."""
        found = re.search(r"at line (\d+)", str(error))
        line = int(found.group(1)) if found else 0
        node = self.line_nodes[line - 1] if 0 < line <= len(self.line_nodes) else None
        if node is None or node.op != "call_function":
            return error
        return LoweringError(f"{error} (lowering {node.target} at {source_line(node)})")

    def seed(self, node: torch.fx.Node) -> Ref:
        """The seed of one random op: the call's seed plus the op's number,
        so that no two draws of a graph are alike."""
        self.random_draws += 1
        return self.emit_op(node, "aten::add.Scalar", [SEED, self.random_draws - 1], type_text=SEED_TYPE, hint="seed")

    # -- nodes ---------------------------------------------------------------

    def _arg(self, value: Any) -> Any:
        if isinstance(value, torch.fx.Node):
            found = self.values[value]
            if isinstance(found, _Unsupported):
                raise LoweringError(f"{found.what} is used (at {source_line(found.node)}); shardflow does not "
                                    "compute it")
            return found
        if isinstance(value, (list, tuple)):
            return [self._arg(v) for v in value]
        return value

    def _result(self, node: torch.fx.Node) -> tuple[Ref, str]:
        return Ref(f"%{node.name}"), ir_type(node.meta.get("val"), node)

    def _call(self, node: torch.fx.Node) -> Any:
        target = node.target
        if target is operator.getitem:
            return self.values[node.args[0]][node.args[1]]
        if target in _ops.ANNOTATIONS:
            return self._mark_sharding(node)
        if target is torch.ops.aten.copy_.default:
            return self._input_mutation(node)
        if _only_device_ids(node):
            return None  # computed when the annotation is lowered
        if node in self.absorbed:
            return None  # part of an RMSNorm lowered as one op
        if node in self.norms:
            x, weight, eps = self.norms[node]
            size = x.meta["val"].shape[-1]
            return self.emit_op(node, "aten::rms_norm", [self.values[x], [size], self.values[weight], eps])
        if _complex.is_complex(self, node):
            return _complex.lower(self, node)
        rewrite = REWRITES.get(target)
        if rewrite is not None:
            return rewrite(self, node)
        if not isinstance(target, torch._ops.OpOverload):
            raise LoweringError(f"{node.format_node()}: shardflow lowers aten ops only; {target} is not one "
                                f"(at {source_line(node)})")
        return self.direct(node, self._scalar_overload(_ir_name(target), node.args), node.args, node.kwargs)

    def _scalar_overload(self, op: str, args) -> str:
        """aten::mul.Tensor(x, 2) as PyTorch records it (a wrapped number) is
        aten::mul.Scalar in shardflow, whose .Tensor overloads take tensors
        (and a default overload such as floor_divide's has a .Scalar one)."""
        if len(args) < 2 or not isinstance(args[1], (int, float)) or isinstance(args[0], (int, float)):
            return op
        forms = ((".Tensor_Tensor", ".Tensor_Scalar"), (".Tensor", ".Scalar"), (".Tensor", ".Tensor_Scalar"),
                 (".Tensor_mode", ".Scalar_mode"))
        for tensor_form, scalar_form in forms:
            if op.endswith(tensor_form) and op[: -len(tensor_form)] + scalar_form in self.schemas:
                return op[: -len(tensor_form)] + scalar_form
        if "." not in op.partition("::")[2] and op + ".Scalar" in self.schemas:  # floor_divide(t, 3)
            return op + ".Scalar"
        return op

    def direct(self, node: torch.fx.Node, op: str, args, kwargs) -> Ref:
        if op not in self.schemas:
            schema = node.target._schema if isinstance(node.target, torch._ops.OpOverload) else op
            raise LoweringError(f"shardflow has no op {op} ({schema}), used at {source_line(node)}; "
                                "it is not in shardflow's op set nor rewritten into ops it has")
        kwargs = {k: v for k, v in kwargs.items() if k not in _PLACEMENT_KWARGS or not _is_default_placement(v)}
        value = node.meta.get("val")
        if isinstance(value, (tuple, list)):  # an op with several results, read with getitem
            results = [Ref(f"%{node.name}_{i}") for i in range(len(value))]
            types = "(" + ", ".join(ir_type(v, node) for v in value) + ")"
            return self.emit.op(results, op, self._arg(list(args)), {k: self._arg(v) for k, v in kwargs.items()},
                                types)
        result, type_text = self._result(node)
        return self.emit.op(result, op, self._arg(list(args)), {k: self._arg(v) for k, v in kwargs.items()},
                            type_text)

    def emit_op(self, node: torch.fx.Node, op: str, args: list[Any], kwargs: dict[str, Any] | None = None,
                type_text: str | None = None, hint: str | None = None) -> Ref:
        """An extra IR node for a rewrite (its own name unless it is the node's result)."""
        result = self.emit.fresh(hint or node.name) if type_text is not None else Ref(f"%{node.name}")
        return self.emit.op(result, op, args, kwargs or {}, type_text or ir_type(node.meta.get("val"), node))

    # -- inputs written in place ---------------------------------------------

    def _input_mutation(self, node: torch.fx.Node) -> None:
        """copy_(input, new_value) at the end of the graph: the function wrote the input."""
        target, new_value = node.args[:2]
        placeholders = [n for n in self.gm.graph.nodes if n.op == "placeholder"]
        if target not in placeholders or not isinstance(new_value, torch.fx.Node):
            raise LoweringError(f"{node.format_node()}: shardflow handles in-place writes of the compiled "
                                f"function's inputs only (at {source_line(node)})")
        if target.meta["val"].is_complex():
            raise LoweringError(f"the complex input {target.name} is written in place; shardflow does not "
                                f"support that (at {source_line(node)})")
        self.mutations.append(_mutation.Mutation(placeholders.index(target), target, new_value,
                                                 _mutation.host_writes(new_value, target)))

    def _mutation_outputs(self, mutation: _mutation.Mutation, placeholders: list, outputs: list) -> None:
        """The outputs one written input needs: its new value laid out like the input (when the input
        came in laid out: the next call's shards), and the operands of its writes (or the whole value)."""
        def add(ref: Ref, node: torch.fx.Node) -> int:
            outputs.append((ref, ir_type(node.meta.get("val"), node)))
            return len(outputs) - 1

        new_ref = self._arg(mutation.new_value)
        sharding = self.annotate_inputs[mutation.input_index] if mutation.input_index < len(self.annotate_inputs) else None
        if sharding is not None:
            whole = _state.on_one_device(sharding)
            kept = new_ref if whole else self._annotation(new_ref, sharding, mutation.new_value)
            mutation.state_output = add(kept, mutation.new_value)
        if mutation.writes is None:
            if mutation.state_output is None:
                mutation.whole_output = add(new_ref, mutation.new_value)
            return
        mutation.operand_outputs = {}
        for write in mutation.writes:
            for operand in write.operands:
                if operand is not None and operand not in mutation.operand_outputs:
                    mutation.operand_outputs[operand] = add(self._arg(operand), operand)

    # -- annotations ---------------------------------------------------------

    def _annotation(self, ref: Ref, sharding: sf.Sharding, node: torch.fx.Node) -> Ref:
        mesh = sharding.mesh
        names = "None" if mesh.axis_names is None else str(tuple(mesh.axis_names))
        result = self.emit.fresh(f"{node.name}_sharded")
        return self.emit.op(result, "xla::dynamo_mark_sharding",
                            [ref, list(mesh.device_ids), str(tuple(mesh.mesh_shape)), names, str(sharding.spec)], {},
                            ir_type(node.meta.get("val"), node))

    def _mark_sharding(self, node: torch.fx.Node) -> Ref:
        t, ids, mesh_shape, axis_names, spec = node.args[:5]
        if isinstance(ids, torch.fx.Node):
            ids = _constant(ids, node).flatten().tolist()
        if not isinstance(mesh_shape, str):
            mesh_shape = str(tuple(mesh_shape))
        result, type_text = self._result(node)
        annotated = self.emit.op(result, "xla::dynamo_mark_sharding", [self.values[t], [int(i) for i in ids],
                                                                       mesh_shape, axis_names, spec], {}, type_text)
        # The annotation applies to the tensor passed in: later readers of
        # `t` read the annotated value.
        self.values[t] = annotated
        return annotated


def find_rms_norms(graph: torch.fx.Graph) -> tuple[dict, set]:
    """RMSNorm as people write it in torch ops (Meta's and Hugging Face's):
    x * rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight, found as the
    chain pow -> mean -> add -> rsqrt -> mul -> mul. Each becomes one
    aten::rms_norm(x, [d], weight, eps): the partitioner then gathers x once
    for the whole norm instead of reducing a partial mean and gathering the
    normalised value again before every linear that reads it."""
    aten = torch.ops.aten

    def only_user(node: torch.fx.Node, target) -> torch.fx.Node | None:
        users = list(node.users)
        return users[0] if len(users) == 1 and users[0].target in target else None

    norms, absorbed = {}, set()
    for power in graph.nodes:
        if power.target is not aten.pow.Tensor_Scalar or power.args[1] != 2:
            continue
        x = power.args[0]
        value = x.meta.get("val")
        if not isinstance(value, torch.Tensor) or value.dim() == 0 or value.dtype != torch.float32:
            continue
        mean = only_user(power, (aten.mean.dim,))
        if mean is None or list(mean.args[1]) not in ([-1], [value.dim() - 1]) or not (
                mean.args[2] if len(mean.args) > 2 else mean.kwargs.get("keepdim", False)) or mean.kwargs.get("dtype"):
            continue
        shifted = only_user(mean, (aten.add.Scalar, aten.add.Tensor))
        if shifted is None or shifted.args[0] is not mean or not isinstance(shifted.args[1], float) or shifted.kwargs:
            continue
        inverse = only_user(shifted, (aten.rsqrt.default,))
        scaled = only_user(inverse, (aten.mul.Tensor,)) if inverse is not None else None
        if scaled is None or {scaled.args[0], scaled.args[1]} != {x, inverse}:
            continue
        out = only_user(scaled, (aten.mul.Tensor,))
        if out is None:
            continue
        weight = out.args[1] if out.args[0] is scaled else out.args[0]
        weight_value = weight.meta.get("val") if isinstance(weight, torch.fx.Node) else None
        if (not isinstance(weight_value, torch.Tensor) or list(weight_value.shape) != [value.shape[-1]] or
                weight_value.dtype != torch.float32):
            continue
        norms[out] = (x, weight, shifted.args[1])
        absorbed.update((power, mean, shifted, inverse, scaled))
    return norms, absorbed


def _only_device_ids(node: torch.fx.Node) -> bool:
    """The node only feeds annotations' device ids (torch.arange(n) in forward)."""
    return bool(node.users) and all(u.target in _ops.ANNOTATIONS and u.args[1] is node for u in node.users)


def _is_default_placement(value: Any) -> bool:
    if value is None or value is False:
        return True
    if isinstance(value, torch.device):
        return value.type == "cpu"
    return value in (torch.strided, torch.contiguous_format, torch.preserve_format)


def _constant(node: torch.fx.Node, user: torch.fx.Node) -> torch.Tensor:
    """The value of a node that depends on no graph input (device ids built
    from torch.arange in forward), computed now with eager torch."""
    if node.op == "placeholder":
        raise LoweringError(
            f"the device ids of the mesh passed to mark_sharding depend on the compiled function's input "
            f"{node.name}, so they are not known when the graph is compiled (at {source_line(user)}); build the "
            "mesh from constants: a list, a tuple, np.arange(n) or torch.arange(n)")
    if node.op == "get_attr":
        return getattr(node.graph.owning_module, node.target)
    if node.op != "call_function":
        raise LoweringError(f"the device ids of the mesh passed to mark_sharding come from {node.op} {node.target}, which "
                            f"shardflow cannot compute when it compiles (at {source_line(user)})")
    args = torch.fx.node.map_arg(node.args, lambda n: _constant(n, user))
    kwargs = torch.fx.node.map_arg(node.kwargs, lambda n: _constant(n, user))
    with torch._subclasses.fake_tensor.unset_fake_temporarily():  # real values, even inside AOTAutograd's compile
        return node.target(*args, **kwargs)


# -- rewrites into ops shardflow has -------------------------------------------

def _rank(node: torch.fx.Node) -> int:
    return node.meta["val"].dim()


def _identity(lowering: Lowering, node: torch.fx.Node) -> Any:
    return lowering.values[node.args[0]]


@dataclass(frozen=True)
class _Transposed:
    """w.t() of a 2-D weight that only feeds matrix products: not emitted, the
    products become aten::linear(x, w), which reads w as nn.Linear stores it
    (a transpose would copy the weight on every call)."""

    weight: Ref


def _feeds_only_products(node: torch.fx.Node) -> bool:
    return all((u.target is torch.ops.aten.mm.default and u.args[1] is node and u.args[0] is not node) or
               (u.target is torch.ops.aten.addmm.default and u.args[2] is node and node not in u.args[:2]
                and u.kwargs.get("beta", 1) == 1 and u.kwargs.get("alpha", 1) == 1)
               for u in node.users)


def _t(lowering: Lowering, node: torch.fx.Node) -> Any:
    if _rank(node.args[0]) < 2:
        return lowering.values[node.args[0]]
    if node.users and _feeds_only_products(node):
        return _Transposed(lowering.values[node.args[0]])
    return lowering.emit_op(node, "aten::transpose.int", [lowering.values[node.args[0]], 0, 1])


_VIEWS = frozenset({torch.ops.aten.view.default, torch.ops.aten._unsafe_view.default, torch.ops.aten.reshape.default})


def _linear(lowering: Lowering, node: torch.fx.Node, x: torch.fx.Node, weight: Ref,
            bias: torch.fx.Node | None = None) -> Ref:
    """nn.Linear, which AOTAutograd spells view(x, [-1, k]) -> mm -> view to
    [..., n]: aten::linear takes any leading dims, so it is computed at the
    view's [..., k] (x before its view, see Emitter) and the views around it
    fold away."""
    x_ref = lowering.values[x]
    operands = [weight] if bias is None else [weight, lowering.values[bias]]
    (rows, k), n = x.meta["val"].shape, node.meta["val"].shape[-1]
    view_back = next(iter(node.users)) if len(node.users) == 1 else None
    if (view_back is None or view_back.target not in _VIEWS or (bias is not None and bias.meta["val"].dim() != 1)
            or view_back.meta["val"].dim() < 1 or view_back.meta["val"].shape[-1] != n
            or math.prod(view_back.meta["val"].shape[:-1]) != rows):  # (n = 0)
        return lowering.emit_op(node, "aten::linear", [x_ref, *operands])
    dtype = DTYPES[node.meta["val"].dtype]
    lead = list(view_back.meta["val"].shape[:-1])
    x_ref = lowering.emit_op(node, "aten::reshape", [x_ref, lead + [k]],
                             type_text=_tensor_type(dtype, lead + [k]), hint="rows")
    product = lowering.emit_op(node, "aten::linear", [x_ref, *operands],
                               type_text=_tensor_type(dtype, lead + [n]))
    return lowering.emit_op(node, "aten::reshape", [product, [rows, n]])


def _matmul(lowering: Lowering, node: torch.fx.Node) -> Ref:
    b = lowering.values[node.args[1]]
    if isinstance(b, _Transposed):
        return _linear(lowering, node, node.args[0], b.weight)
    return lowering.emit_op(node, "aten::matmul", [lowering.values[node.args[0]], b])


def _addmm(lowering: Lowering, node: torch.fx.Node) -> Ref:
    bias, a, b = (lowering.values[n] for n in node.args[:3])
    beta, alpha = node.kwargs.get("beta", 1), node.kwargs.get("alpha", 1)
    if isinstance(b, _Transposed):  # nn.Linear with a bias: linear(x, w, b)
        return _linear(lowering, node, node.args[1], b.weight, node.args[0])
    product = lowering.emit_op(node, "aten::matmul", [a, b], type_text=ir_type(node.meta["val"], node), hint="mm")
    if alpha != 1:
        product = lowering.emit_op(node, "aten::mul.Scalar", [product, alpha], type_text=ir_type(node.meta["val"], node))
    if beta == 0:  # as torch: the bias is not read (its nan and inf do not reach the result)
        return product
    if beta != 1:
        bias = lowering.emit_op(node, "aten::mul.Scalar", [bias, beta], type_text=ir_type(node.args[0].meta["val"], node))
    return lowering.emit_op(node, "aten::add.Tensor", [product, bias])


def _to_copy(lowering: Lowering, node: torch.fx.Node) -> Any:
    source = lowering.values[node.args[0]]
    dtype = node.kwargs.get("dtype")
    if dtype is None or dtype == node.args[0].meta["val"].dtype:
        return source
    return lowering.emit_op(node, "aten::to.dtype", [source, dtype])


def _view(lowering: Lowering, node: torch.fx.Node) -> Ref:
    return lowering.emit_op(node, "aten::reshape", [lowering.values[node.args[0]], list(node.args[1])])


def _rsub(lowering: Lowering, node: torch.fx.Node) -> Ref:
    # other - alpha * self
    x, other = lowering.values[node.args[0]], node.args[1]
    alpha = node.kwargs.get("alpha", 1)
    type_text = ir_type(node.meta["val"], node)
    scaled = lowering.emit_op(node, "aten::mul.Scalar", [x, -alpha], type_text=type_text, hint="neg")
    return lowering.emit_op(node, "aten::add.Scalar", [scaled, other])


def _masked_fill(lowering: Lowering, node: torch.fx.Node) -> Ref:
    x, mask, value = node.args[:3]
    dtype = node.meta["val"].dtype
    fill = lowering.emit_op(node, "aten::full", [[], value], {"dtype": dtype}, type_text=f"{DTYPES[dtype]}[]",
                            hint="fill")
    return lowering.emit_op(node, "aten::where.self", [lowering.values[mask], fill, lowering.values[x]])


def _scalar_tensor(lowering: Lowering, node: torch.fx.Node) -> Ref:
    dtype = node.kwargs.get("dtype") or torch.float32
    return lowering.emit_op(node, "aten::full", [[], node.args[0]], {"dtype": dtype})


def _pow_scalar_base(lowering: Lowering, node: torch.fx.Node) -> Ref:
    """base ** tensor (aten::pow.Scalar, as in rotary frequencies) = exp(tensor * log(base))."""
    base, exponent = node.args[:2]
    if base <= 0:
        raise LoweringError(f"pow with the non-positive base {base} is not supported (at {source_line(node)})")
    scaled = lowering.emit_op(node, "aten::mul.Scalar", [lowering.values[exponent], math.log(base)],
                              type_text=ir_type(node.meta["val"], node), hint="log_scaled")
    return lowering.emit_op(node, "aten::exp", [scaled])


def _number_first(op: str) -> Callable[[Lowering, torch.fx.Node], Ref]:
    """op(number, tensor): aten's Scalar_Tensor forms (`5 % t`, `1 << t`) and
    floor_divide(7, t) as `7 // t` is recorded. The number becomes a 0-dim
    tensor of the result's dtype, then the tensor form (the tensor's dtype
    promotes to that dtype, so the values are PyTorch's)."""
    def lower(lowering: Lowering, node: torch.fx.Node) -> Ref:
        first, other = node.args[:2]
        if not isinstance(first, (bool, int, float)):
            return lowering.direct(node, lowering._scalar_overload(op, node.args), node.args, node.kwargs)
        dtype = node.meta["val"].dtype
        number = lowering.emit_op(node, "aten::full", [[], first], {"dtype": dtype}, type_text=f"{DTYPES[dtype]}[]",
                                  hint="number")
        return lowering.emit_op(node, op, [number, lowering.values[other]])
    return lower


def _assertion(lowering: Lowering, node: torch.fx.Node) -> None:
    """_assert_async(condition, message) (one_hot's class checks): the
    condition becomes one more output, checked after the run. A condition of
    one element of any dtype, true when nonzero, as in PyTorch."""
    condition = node.args[0]
    message = node.args[1] if len(node.args) > 1 else "Expected Tensor with single nonzero value, but got zero"
    value = condition.meta["val"]
    if value.numel() != 1:
        raise LoweringError(f"_assert_async on a tensor of {value.numel()} elements (at {source_line(node)}): "
                            "Assertion is expected to be on a Tensor with exactly one element")
    truth = lowering.values[condition]
    if value.dtype != torch.bool:
        truth = lowering.emit_op(node, "aten::ne.Scalar", [truth, 0], type_text=_tensor_type("bool", value.shape),
                                 hint="assertion")
    if value.dim() != 0:
        truth = lowering.emit_op(node, "aten::reshape", [truth, []], type_text="bool[]", hint="assertion")
    lowering.assertions.append((truth, f"{message} (at {source_line(node)})"))


def _random_draw(op: str) -> Callable[[Lowering, torch.fx.Node], Ref]:
    """aten::rand / aten::randn (what _random writes every random op in) as
    shardflow's counter-based draw seeded by the call."""
    def lower(lowering: Lowering, node: torch.fx.Node) -> Ref:
        value = node.meta["val"]
        return lowering.emit_op(node, op, [list(value.shape), lowering.seed(node)], {"dtype": value.dtype})
    return lower


def _reciprocal(lowering: Lowering, node: torch.fx.Node) -> Ref:
    return lowering.emit_op(node, "aten::pow.Tensor_Scalar", [lowering.values[node.args[0]], -1.0])


def _full_like(fill: float | None) -> Callable[[Lowering, torch.fx.Node], Ref]:
    def lower(lowering: Lowering, node: torch.fx.Node) -> Ref:
        value = node.meta["val"]
        return lowering.emit_op(node, "aten::full", [list(value.shape), node.args[1] if fill is None else fill],
                                {"dtype": value.dtype})
    return lower


def _softmax_as(op: str) -> Callable[[Lowering, torch.fx.Node], Ref]:
    """aten::_softmax(x, dim, half_to_float) (what softmax decomposes to) as softmax.int."""
    def lower(lowering: Lowering, node: torch.fx.Node) -> Ref:
        x, dim, half_to_float = node.args[:3]
        if half_to_float:
            raise LoweringError(f"{node.target} with half_to_float=True is not supported (at {source_line(node)})")
        return lowering.emit_op(node, op, [lowering.values[x], dim])
    return lower


def _safe_softmax(lowering: Lowering, node: torch.fx.Node) -> Ref:
    """aten::_safe_softmax (attention's math path): softmax, but a row whose
    every entry is -inf (a query that sees no key) is 0 instead of NaN."""
    x, dim = node.args[:2]
    dtype = node.args[2] if len(node.args) > 2 else node.kwargs.get("dtype")
    source = lowering.values[x]
    value = node.meta["val"]
    if dtype is not None and dtype != x.meta["val"].dtype:
        source = lowering.emit_op(node, "aten::to.dtype", [source, dtype], type_text=ir_type(value, node),
                                  hint="converted")
    type_text = ir_type(value, node)
    probabilities = lowering.emit_op(node, "aten::softmax.int", [source, dim], type_text=type_text, hint="softmax")
    reduced = list(value.shape)
    reduced[dim] = 1
    largest = lowering.emit_op(node, "aten::amax", [source, [dim], True],
                               type_text=_tensor_type(DTYPES[value.dtype], reduced), hint="row_max")
    unseen = lowering.emit_op(node, "aten::eq.Scalar", [largest, float("-inf")],
                              type_text=_tensor_type("bool", reduced), hint="sees_nothing")
    zero = lowering.emit_op(node, "aten::full", [[], 0.0], {"dtype": value.dtype}, type_text=f"{DTYPES[value.dtype]}[]",
                            hint="zero")
    return lowering.emit_op(node, "aten::where.self", [unseen, zero, probabilities])


def _layer_norm(lowering: Lowering, node: torch.fx.Node) -> list[Ref]:
    """native_layer_norm(x, shape, weight, bias, eps) -> (out, mean, rstd) in
    ops shardflow has: the mean and variance over the normalized dims (so a
    normalized dim split across devices is reduced, not gathered)."""
    x, normalized, weight, bias, eps = node.args[:5]
    dims = list(range(-len(normalized), 0))
    x_type = ir_type(x.meta["val"], node)
    _, mean_value, rstd_value = node.meta["val"]
    stat_type = ir_type(mean_value, node)

    def emit(op: str, args: list[Any], type_text: str, hint: str) -> Ref:
        return lowering.emit_op(node, op, args, type_text=type_text, hint=hint)

    source = lowering.values[x]
    mean = emit("aten::mean.dim", [source, dims, True], stat_type, "mean")
    centered = emit("aten::sub.Tensor", [source, mean], x_type, "centered")
    variance = emit("aten::mean.dim", [emit("aten::mul.Tensor", [centered, centered], x_type, "squared"), dims, True],
                    stat_type, "variance")
    rstd = emit("aten::rsqrt", [emit("aten::add.Scalar", [variance, eps], stat_type, "shifted")], ir_type(rstd_value, node),
                "rstd")
    out = emit("aten::mul.Tensor", [centered, rstd], x_type, "normalized")
    if weight is not None:
        out = emit("aten::mul.Tensor", [out, lowering.values[weight]], x_type, "scaled")
    if bias is not None:
        out = emit("aten::add.Tensor", [out, lowering.values[bias]], x_type, "shifted_out")
    return [out, mean, rstd]


def _sdpa(lowering: Lowering, node: torch.fx.Node) -> list[Any]:
    """The CPU attention kernels F.scaled_dot_product_attention dispatches to,
    as shardflow's one aten::scaled_dot_product_attention op. Their second
    output (the log-sum-exp, for backward) has no lowering."""
    q = lowering.values[node.args[0]]
    dropout = node.args[3] if len(node.args) > 3 else node.kwargs.get("dropout_p", 0.0)
    is_causal = node.args[4] if len(node.args) > 4 else node.kwargs.get("is_causal", False)
    mask = node.kwargs.get("attn_mask")
    if dropout:
        raise LoweringError(f"scaled_dot_product_attention with dropout_p={dropout} is not supported in inference "
                            f"graphs (at {source_line(node)})")
    kwargs = {"scale": node.kwargs["scale"]} if node.kwargs.get("scale") is not None else {}
    k, v = (_heads_per_query_head(lowering, node, n, node.args[0].meta["val"]) for n in node.args[1:3])
    out = lowering.emit_op(node, "aten::scaled_dot_product_attention",
                           [q, k, v, None if mask is None else lowering.values[mask], 0.0, is_causal], kwargs,
                           type_text=ir_type(node.meta["val"][0], node), hint=f"{node.name}_out")
    return [out, _Unsupported(node, "the log-sum-exp output of scaled_dot_product_attention")]


def _heads_per_query_head(lowering: Lowering, node: torch.fx.Node, kv: torch.fx.Node, query: torch.Tensor) -> Any:
    """Keys or values with fewer heads than the query (F.scaled_dot_product_attention's
    enable_gqa=True, which the CPU kernel takes as it is): each of their heads
    repeated for the query heads that share it (query head h reads head h // group),
    as repeat_interleave on the head dim would, for shardflow's attention op,
    which takes as many heads as the query."""
    value = kv.meta["val"]
    ref = lowering.values[kv]
    if value.dim() < 3 or query.dim() < 3 or value.shape[-3] == query.shape[-3]:
        return ref
    heads, query_heads = value.shape[-3], query.shape[-3]
    if heads == 0 or query_heads % heads:
        raise LoweringError(f"scaled_dot_product_attention with enable_gqa: the query's {query_heads} heads are "
                            f"not a multiple of {kv.name}'s {heads} (at {source_line(node)})")
    dtype = DTYPES[value.dtype]
    lead, tail = list(value.shape[:-2]), list(value.shape[-2:])
    apart = lowering.emit_op(node, "aten::unsqueeze", [ref, value.dim() - 2],
                             type_text=_tensor_type(dtype, lead + [1] + tail), hint=f"{kv.name}_heads")
    repeated = lead + [query_heads // heads] + tail
    spread = lowering.emit_op(node, "aten::expand", [apart, repeated], type_text=_tensor_type(dtype, repeated),
                              hint=f"{kv.name}_shared")
    merged = list(value.shape[:-3]) + [query_heads] + tail
    return lowering.emit_op(node, "aten::reshape", [spread, merged], type_text=_tensor_type(dtype, merged),
                            hint=f"{kv.name}_per_query_head")


@dataclass(frozen=True)
class _Unsupported:
    """A result that has no lowering; an error when something reads it."""

    node: torch.fx.Node
    what: str


def _split(lowering: Lowering, node: torch.fx.Node) -> list[Ref]:
    x, sizes = node.args[0], node.args[1]
    dim = node.args[2] if len(node.args) > 2 else node.kwargs.get("dim", 0)
    length = x.meta["val"].shape[dim]
    if isinstance(sizes, int):
        sizes = [min(sizes, length - start) for start in range(0, length, sizes)]
    pieces, start = [], 0
    for i, (size, value) in enumerate(zip(sizes, node.meta["val"])):
        pieces.append(lowering.emit_op(node, "aten::slice.Tensor", [lowering.values[x], dim, start, start + size],
                                       type_text=ir_type(value, node), hint=f"{node.name}_{i}"))
        start += size
    return pieces


def _positions(lowering: Lowering, node: torch.fx.Node, start: int, end: int, step: int) -> Ref:
    """The i64 positions start, start + step, ... below end, as a graph value."""
    count = max(0, -(-(end - start) // step))
    return lowering.emit_op(node, "aten::arange.start_step", [start, start + count * step, step],
                            {"dtype": torch.int64}, type_text=f"i64[{count}]", hint="positions")


def _clamped_slice(node: torch.fx.Node, size: int) -> tuple[int, int, int, int]:
    dim, start, end, step = _mutation._view_params(node.target, node.args[2:], lambda d: size)
    if step <= 0:
        raise LoweringError(f"slice_scatter with step {step} (at {source_line(node)}): steps must be positive")
    start, end = (max(0, min(size, v + size if v < 0 else v)) for v in (start, end))
    return dim, start, max(start, end), step


def _slice_scatter(lowering: Lowering, node: torch.fx.Node) -> Ref:
    """t[..., a:b:s] = src: an index_copy of src at the positions a, a+s, ..."""
    self_node, src = node.args[:2]
    rank = _rank(self_node)
    dim = node.args[2] if len(node.args) > 2 else 0
    dim, start, end, step = _clamped_slice(node, self_node.meta["val"].shape[dim % rank])
    positions = _positions(lowering, node, start, end, step)
    return lowering.emit_op(node, "aten::index_copy", [lowering.values[self_node], dim % rank, positions,
                                                       lowering.values[src]])


def _select_scatter(lowering: Lowering, node: torch.fx.Node) -> Ref:
    """t[..., i] = src: an index_copy of src (with dim i restored) at position i."""
    self_node, src, dim, index = node.args[:4]
    shape = self_node.meta["val"].shape
    dim %= len(shape)
    if not -shape[dim] <= index < shape[dim]:
        raise LoweringError(f"select_scatter: index {index} is out of range for dimension {dim} of size {shape[dim]} "
                            f"(at {source_line(node)})")
    index %= shape[dim]
    positions = _positions(lowering, node, index, index + 1, 1)
    rows = list(src.meta["val"].shape)
    rows.insert(dim, 1)
    unsqueezed = lowering.emit_op(node, "aten::unsqueeze", [lowering.values[src], dim],
                                  type_text=_tensor_type(DTYPES[src.meta['val'].dtype], rows),
                                  hint="row")
    return lowering.emit_op(node, "aten::index_copy", [lowering.values[self_node], dim, positions, unsqueezed])


def _wrapped_positions(lowering: Lowering, node: torch.fx.Node, index: torch.fx.Node, size: int) -> Ref:
    """An integer index tensor as i64 positions in [0, size): negative ones count from the end, as in PyTorch."""
    known = lowering.wrapped_positions.get((index, size))
    if known is not None:
        return known
    count = index.meta["val"].numel()
    positions = lowering.values[index]
    if index.meta["val"].dtype != torch.int64:
        positions = lowering.emit_op(node, "aten::to.dtype", [positions, torch.int64],
                                     type_text=ir_type(index.meta["val"].to(torch.int64), node), hint="positions")
    if index.meta["val"].dim() != 1:
        positions = lowering.emit_op(node, "aten::reshape", [positions, [count]], type_text=f"i64[{count}]",
                                     hint="positions")
    negative = lowering.emit_op(node, "aten::lt.Scalar", [positions, 0], type_text=f"bool[{count}]", hint="negative")
    wrapped = lowering.emit_op(node, "aten::add.Scalar", [positions, size], type_text=f"i64[{count}]", hint="wrapped")
    lowering.wrapped_positions[(index, size)] = lowering.emit_op(
        node, "aten::where.self", [negative, wrapped, positions], type_text=f"i64[{count}]", hint="positions")
    return lowering.wrapped_positions[(index, size)]


def _index_tensors(node: torch.fx.Node, indices: list, what: str) -> list[tuple[int, torch.fx.Node]]:
    """(dim, node) of each integer index tensor in `indices` (None elsewhere), or an error."""
    given = [(d, i) for d, i in enumerate(indices) if i is not None]
    for _, index in given:
        value = index.meta.get("val") if isinstance(index, torch.fx.Node) else None
        if not isinstance(value, torch.Tensor) or value.dtype not in (torch.int64, torch.int32):
            raise LoweringError(
                f"{node.format_node()}: shardflow {what} with integer index tensors (at {source_line(node)}); "
                "a boolean mask is supported only to write one value, or one row of values, into every element "
                "it selects (t[mask] = 0.0): anything else depends on how many it selects")
    return given


@dataclass
class _IndexedView:
    """A tensor with the dims its index tensors stand for merged into one
    (moved first when apart, as PyTorch orders the result's dims then), and
    the positions to take there: what reading and writing t[indices] share."""

    source: Ref  # the tensor, permuted and reshaped so: shape
    shape: list[int]
    dim: int  # the merged dim
    positions: Ref  # i64[count]: flattened, wrapped, linear in the merged dims
    broadcast: list[int]  # the index tensors' broadcast shape (count elements)
    moved: list[int]  # the shape before merging (permuted)
    order: list[int]  # the permutation applied (identity when none)

    @property
    def read(self) -> list[int]:
        """The shape of t[indices]."""
        return self.moved[:self.dim] + self.broadcast + self.moved[self.dim + self.merged:]

    @property
    def merged(self) -> int:
        return len(self.moved) - len(self.shape) + 1

    @property
    def rows(self) -> list[int]:
        """The merged shape with the merged dim replaced by the positions."""
        return self.shape[:self.dim] + [math.prod(self.broadcast)] + self.shape[self.dim + 1:]


def _indexed_view(lowering: Lowering, node: torch.fx.Node, given: list[tuple[int, torch.fx.Node]]) -> _IndexedView:
    self_node = node.args[0]
    shape = list(self_node.meta["val"].shape)
    dtype = DTYPES[self_node.meta["val"].dtype]
    source = lowering.values[self_node]
    dims = [d for d, _ in given]
    order = list(range(len(shape)))
    if len(given) == 1:
        index = given[0][1]
        positions = _wrapped_positions(lowering, node, index, shape[dims[0]])
        return _IndexedView(source, shape, dims[0], positions, list(index.meta["val"].shape), shape, order)
    positions, _ = _linear_positions(lowering, node, given, shape)
    broadcast = list(torch.broadcast_shapes(*(index.meta["val"].shape for _, index in given)))
    if dims != list(range(dims[0], dims[0] + len(dims))):
        order = dims + [d for d in range(len(shape)) if d not in dims]
        shape = [shape[d] for d in order]
        source = lowering.emit_op(node, "aten::permute", [source, order], type_text=_tensor_type(dtype, shape),
                                  hint="indexed_first")
        dims = list(range(len(dims)))
    merged = shape[:dims[0]] + [math.prod(shape[d] for d in dims)] + shape[dims[-1] + 1:]
    source = lowering.emit_op(node, "aten::reshape", [source, merged], type_text=_tensor_type(dtype, merged),
                              hint="indexed_merged")
    return _IndexedView(source, merged, dims[0], positions, broadcast, shape, order)


def _index(lowering: Lowering, node: torch.fx.Node) -> Ref:
    """t[..., idx] with integer index tensors: index_select of flattened
    positions, reshaped to the result. Several index tensors (t[rows, cols])
    broadcast together and index the dims they stand for merged into one, at
    linear positions; as in PyTorch, their broadcast dims replace the indexed
    dims where those are adjacent, and lead the result where they are not."""
    view = _indexed_view(lowering, node, _index_tensors(node, node.args[1], "reads t[..., idx]"))
    dtype = DTYPES[node.meta["val"].dtype]
    if view.rows == list(node.meta["val"].shape):
        return lowering.emit_op(node, "aten::index_select", [view.source, view.dim, view.positions])
    selected = lowering.emit_op(node, "aten::index_select", [view.source, view.dim, view.positions],
                                type_text=_tensor_type(dtype, view.rows), hint="selected")
    return lowering.emit_op(node, "aten::reshape", [selected, list(node.meta["val"].shape)])


def _linear_positions(lowering: Lowering, node: torch.fx.Node, given: list[tuple[int, torch.fx.Node]],
                      shape: list[int]) -> tuple[Ref, int]:
    """Index tensors for dims d1 < d2 < ... broadcast together, as positions in
    those dims merged row-major: sum of each wrapped index times the product
    of the later indexed dims' sizes. Returns them flattened, and their count."""
    broadcast = list(torch.broadcast_shapes(*(index.meta["val"].shape for _, index in given)))
    count = math.prod(broadcast)
    linear = None
    stride = 1
    for d, index in reversed(given):
        wrapped = _wrapped_positions(lowering, node, index, shape[d])
        own = [1] * (len(broadcast) - index.meta["val"].dim()) + list(index.meta["val"].shape)
        term = lowering.emit_op(node, "aten::reshape", [wrapped, own], type_text=_tensor_type("i64", own),
                                hint="positions")
        if stride != 1:
            term = lowering.emit_op(node, "aten::mul.Scalar", [term, stride], type_text=_tensor_type("i64", own),
                                    hint="positions")
        if linear is None:
            linear = lowering.emit_op(node, "aten::expand", [term, broadcast],
                                      type_text=_tensor_type("i64", broadcast), hint="positions")
        else:
            linear = lowering.emit_op(node, "aten::add.Tensor", [linear, term],
                                      type_text=_tensor_type("i64", broadcast), hint="positions")
        stride *= shape[d]
    flat = lowering.emit_op(node, "aten::reshape", [linear, [count]], type_text=f"i64[{count}]", hint="positions")
    return flat, count


def _index_put(lowering: Lowering, node: torch.fx.Node) -> Ref:
    """t[..., idx] = values (index_put). With one 1-D integer index tensor (a
    cache written at tensor positions): an index_copy of the values broadcast
    to the rows. Otherwise (several index tensors, an index of any shape,
    accumulate=True) at linear positions in the indexed dims merged into one,
    as _index reads them: index_copy, or scatter_add to accumulate (which
    adds duplicates, as PyTorch does). Negative positions count from the end."""
    self_node, indices, values = node.args[:3]
    accumulate = node.args[3] if len(node.args) > 3 else node.kwargs.get("accumulate", False)
    given = _index_tensors(node, indices, "writes t[..., idx] = v")
    if len(given) != 1 or given[0][1].meta["val"].dim() != 1 or accumulate:
        return _put_at_positions(lowering, node, given, accumulate)
    dim, index = given[0]
    shape = list(self_node.meta["val"].shape)
    count = index.meta["val"].shape[0]
    positions = _wrapped_positions(lowering, node, index, shape[dim])
    rows = shape[:dim] + [count] + shape[dim + 1:]
    dtype = DTYPES[node.meta["val"].dtype]
    source = lowering.values[values]
    given = list(values.meta["val"].shape)
    if given != rows:
        # Only leading 1s missing: the same elements, a reshape (which folds
        # into the one that made the values).
        fill = "aten::reshape" if math.prod(given) == math.prod(rows) else "aten::expand"
        source = lowering.emit_op(node, fill, [source, rows],
                                  type_text=_tensor_type(dtype, rows), hint="rows")
    return lowering.emit_op(node, "aten::index_copy", [lowering.values[self_node], dim, positions, source])


def _put_at_positions(lowering: Lowering, node: torch.fx.Node, given: list[tuple[int, torch.fx.Node]],
                      accumulate: bool) -> Ref:
    """index_put in general: into the indexed view (see _IndexedView), the
    values broadcast to what t[indices] reads and flattened alike, written
    at its positions; then the view undone."""
    values = node.args[2]
    dtype = DTYPES[node.meta["val"].dtype]
    view = _indexed_view(lowering, node, given)
    read, rows = view.read, view.rows
    given_shape = list(values.meta["val"].shape)
    fits = len(given_shape) <= len(read) and all(g in (1, r) for g, r in zip(reversed(given_shape), reversed(read)))
    if not fits:
        raise LoweringError(f"shape mismatch: value tensor of shape {given_shape} cannot be broadcast to indexing "
                            f"result of shape {read} (at {source_line(node)})")
    source = lowering.emit_op(node, "aten::expand", [lowering.values[values], read],
                              type_text=_tensor_type(dtype, read), hint="values")
    source = lowering.emit_op(node, "aten::reshape", [source, rows], type_text=_tensor_type(dtype, rows),
                              hint="values")
    if accumulate:
        spots = [1] * len(rows)
        spots[view.dim] = rows[view.dim]
        at = lowering.emit_op(node, "aten::reshape", [view.positions, spots], type_text=_tensor_type("i64", spots),
                              hint="positions")
        at = lowering.emit_op(node, "aten::expand", [at, rows], type_text=_tensor_type("i64", rows), hint="positions")
        written = lowering.emit_op(node, "aten::scatter_add", [view.source, view.dim, at, source],
                                   type_text=_tensor_type(dtype, view.shape), hint="written")
    else:
        written = lowering.emit_op(node, "aten::index_copy", [view.source, view.dim, view.positions, source],
                                   type_text=_tensor_type(dtype, view.shape), hint="written")
    if view.order == sorted(view.order):
        return lowering.emit_op(node, "aten::reshape", [written, view.moved])
    unmerged = lowering.emit_op(node, "aten::reshape", [written, view.moved],
                                type_text=_tensor_type(dtype, view.moved), hint="written")
    return lowering.emit_op(node, "aten::permute", [unmerged, [view.order.index(d) for d in range(len(view.order))]])


def _copy(lowering: Lowering, node: torch.fx.Node) -> Ref:
    """copy(t, src): src converted to t's dtype and broadcast to its shape (t's values are not read)."""
    self_node, src = node.args[:2]
    value = node.meta["val"]
    source = lowering.values[src]
    src_value = src.meta["val"]
    if src_value.dtype != value.dtype:
        source = lowering.emit_op(node, "aten::to.dtype", [source, value.dtype],
                                  type_text=ir_type(src_value.to(value.dtype), node), hint="converted")
    if list(src_value.shape) == list(value.shape):
        return source
    return lowering.emit_op(node, "aten::expand", [source, list(value.shape)])


REWRITES: dict[Any, Callable[[Lowering, torch.fx.Node], Any]] = {
    torch.ops.aten.rand.default: _random_draw("shardflow::rand.seed_tensor"),
    torch.ops.aten.randn.default: _random_draw("shardflow::randn.seed_tensor"),
    torch.ops.aten.slice_scatter.default: _slice_scatter,
    torch.ops.aten.select_scatter.default: _select_scatter,
    torch.ops.aten.index_put.default: _index_put,
    torch.ops.aten.index.Tensor: _index,
    torch.ops.aten._unsafe_index.Tensor: _index,  # index without bounds checks (interpolate's); shardflow checks
    torch.ops.aten.copy.default: _copy,
    torch.ops.aten.t.default: _t,
    torch.ops.aten.mm.default: _matmul,
    torch.ops.aten.bmm.default: _matmul,
    torch.ops.aten.addmm.default: _addmm,
    torch.ops.aten.clone.default: _identity,
    torch.ops.aten.alias.default: _identity,
    torch.ops.aten.detach.default: _identity,
    torch.ops.aten.lift_fresh_copy.default: _identity,
    torch.ops.aten._to_copy.default: _to_copy,
    torch.ops.aten._unsafe_view.default: _view,
    torch.ops.aten.rsub.Scalar: _rsub,
    torch.ops.aten.masked_fill.Scalar: _masked_fill,
    torch.ops.aten.scalar_tensor.default: _scalar_tensor,
    torch.ops.aten.split.Tensor: _split,
    torch.ops.aten._softmax.default: _softmax_as("aten::softmax.int"),
    torch.ops.aten.pow.Scalar: _pow_scalar_base,
    torch.ops.aten.reciprocal.default: _reciprocal,
    torch.ops.aten._assert_async.msg: _assertion,
    torch.ops.aten._assert_async.default: _assertion,
    torch.ops.aten.floor_divide.default: _number_first("aten::floor_divide"),
    torch.ops.aten.remainder.Scalar_Tensor: _number_first("aten::remainder.Tensor"),
    torch.ops.aten.bitwise_and.Scalar_Tensor: _number_first("aten::bitwise_and.Tensor"),
    torch.ops.aten.bitwise_or.Scalar_Tensor: _number_first("aten::bitwise_or.Tensor"),
    torch.ops.aten.bitwise_xor.Scalar_Tensor: _number_first("aten::bitwise_xor.Tensor"),
    torch.ops.aten.bitwise_left_shift.Scalar_Tensor: _number_first("aten::bitwise_left_shift.Tensor"),
    torch.ops.aten.bitwise_right_shift.Scalar_Tensor: _number_first("aten::bitwise_right_shift.Tensor"),
    torch.ops.aten.ones_like.default: _full_like(1.0),
    torch.ops.aten.zeros_like.default: _full_like(0.0),
    torch.ops.aten.full_like.default: _full_like(None),
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default: _sdpa,
    torch.ops.aten._log_softmax.default: _softmax_as("aten::log_softmax.int"),
    torch.ops.aten._safe_softmax.default: _safe_softmax,
    torch.ops.aten.native_layer_norm.default: _layer_norm,
    torch.ops.aten.split_with_sizes.default: _split,
}


def lower(gm: torch.fx.GraphModule, input_shardings: list[sf.Sharding | None],
          name: str = "main") -> Lowering:
    """An AOTAutograd forward graph lowered: its IR text (`ir`), the tensor
    constants its inputs end with, and the inputs it writes in place."""
    lowering = Lowering(gm, input_shardings)
    lowering.ir = lowering.run(name)
    return lowering
