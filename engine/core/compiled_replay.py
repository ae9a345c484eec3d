"""Calls a torch.compile'd decode function's graph directly, under dynamo's own guards, without the rest of
dynamo's call path.

Why: on the reference model at batch 1 a compiled decode sub-step took ~0.49 ms, of which the graph's
kernels are ~0.29 ms. The rest was the path around them, paid on every call: dynamo's frame hook, its
transformed bytecode fetching the graph's 43 inputs through module attribute chains, the guard evaluation,
and AOTAutograd's runtime wrapper (measured with `python -m engine.benchmarks.compiled_call`). At one
token a step that is ~40% of the step. CUDA graphs cut the same cost on a GPU by replaying; this is the CPU
analogue for the call path.

How (`ReplayedFunction`):
- the backend (`ReplayBackend`) compiles each graph dynamo hands it with the backend torch.compile would
  use (inductor, its caches included), and keeps with it where each of the graph's inputs comes from:
  dynamo's source of every placeholder (`L['metadata'].slot_mapping`, `L['input_ids'].size()[0]`, a
  parameter's attribute chain), made into one generated function of the frame's locals;
- a call checks the cache entries it has learned, in order, with the guards dynamo built for each entry
  (its RootGuardManager, evaluated in C++, the same check dynamo's frame hook runs). The first whose guards
  pass calls its graph's compiled function with the inputs fetched by that generated function;
- anything else goes through dynamo as before (compiling a new entry if its guards say so). Then the
  entry dynamo ran is learned, if it can be replayed:
  * its transformed code calls one graph and does nothing after it but return the graph's outputs: no
    side effect replayed (a Python object dynamo saw mutated while tracing), no graph break;
  * the fetched inputs are the very objects dynamo passed (tensors by identity, sizes by value);
  * the graph called again on the same inputs returns what dynamo's call returned, value for value. The
    functions replayed here are decode steps, whose only write is the KV of their own positions: a
    second call writes the same values again.
  An entry that fails any of these runs through dynamo on every call, as without replay.
"""

from __future__ import annotations

import dis
import logging
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

log = logging.getLogger(__name__)

# opcodes allowed in an entry's code after its graph call: unpacking and returning the graph's outputs
_RETURN_ONLY = frozenset({
    "STORE_FAST", "DELETE_FAST", "LOAD_FAST", "LOAD_CONST", "BINARY_SUBSCR", "BUILD_TUPLE", "BUILD_LIST",
    "LIST_EXTEND", "UNPACK_SEQUENCE", "SWAP", "COPY", "POP_TOP", "RETURN_VALUE", "NOP", "CACHE",
})


@dataclass
class CompiledGraph:
    """One graph dynamo compiled: its compiled function and the generated fetch of its inputs."""

    compiled: Callable
    fetch: Callable[[dict], tuple] | None  # frame locals -> the graph's inputs; None: a source it cannot read
    last_args: tuple | None = field(default=None, repr=False)  # what dynamo passed on its last call


def _input_fetch(gm: torch.fx.GraphModule, frame_globals: dict) -> Callable[[dict], tuple] | None:
    """The frame's locals -> the graph's inputs, from dynamo's source of each placeholder. A Python number the
    trace left unspecialized (a float attribute, with dynamic=True) is passed as a 0-d tensor of its dtype,
    as dynamo's code passes it."""
    names, dtypes = [], {}
    for node in gm.graph.find_nodes(op="placeholder"):
        arg = node.meta.get("grapharg")
        if arg is None or arg.source is None:
            return None
        name = arg.source.name
        name = name() if callable(name) else name
        if getattr(arg, "pass_arg_as_tensor", False):
            fake = getattr(arg, "fake_tensor", None)
            if fake is None:
                return None
            dtypes[f"_dtype{len(dtypes)}"] = fake.dtype
            name = f"_as_tensor({name}, dtype=_dtype{len(dtypes) - 1})"
        names.append(name)
    scope = {"G": frame_globals, "_as_tensor": torch.as_tensor, **dtypes}
    try:
        return eval(f"lambda L: ({''.join(n + ', ' for n in names)})", scope)  # noqa: S307
    except SyntaxError:
        return None


class ReplayBackend:
    """A torch.compile backend: `inner`'s compiled function per graph, kept with the fetch of its inputs."""

    def __init__(self, inner: Callable, frame_globals: dict):
        self.inner = inner
        self.frame_globals = frame_globals
        self.last_called: CompiledGraph | None = None

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
        graph = CompiledGraph(self.inner(gm, example_inputs), _input_fetch(gm, self.frame_globals))

        def run(*args):
            graph.last_args, self.last_called = args, graph
            return graph.compiled(*args)

        run.compiled_graph = graph  # dynamo installs `run` wrapped by functools.wraps, which keeps this
        return run


def _graph_of(entry, frame_globals: dict) -> CompiledGraph | None:
    """The graph an entry's code calls, if that code only calls it and returns its outputs."""
    code = entry.code
    fns = [n for n in code.co_names if n.startswith("__compiled_fn")]
    if len(fns) != 1 or any(n.startswith("__resume") for n in code.co_names):
        return None
    # dynamo stores the graph's outputs in `graph_out_0`; what follows builds the function's result
    after_call, stored = [], False
    for ins in dis.get_instructions(code):
        if stored:
            after_call.append(ins.opname)
        stored = stored or (ins.opname == "STORE_FAST" and ins.argval == "graph_out_0")
    if not stored or not set(after_call) <= _RETURN_ONLY:
        return None
    return getattr(frame_globals.get(fns[0]), "compiled_graph", None)


def _same(a: Any, b: Any) -> bool:
    """Is a fetched input what dynamo passed: the same tensor, or the same number (a 0-d tensor made from one)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return False
        return a is b or (a.dim() == b.dim() == 0 and a.dtype == b.dtype and torch.equal(a, b))
    return type(a) is type(b) and a == b


def _equal_tensors(x: Any, y: Any) -> bool:
    """Value for value, NaN equal to NaN: a warm-up decode reads a scratch pool's unwritten positions, which
    may hold NaN, and both calls then return it."""
    if not (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)) or x.shape != y.shape or x.dtype != y.dtype:
        return False
    if not x.is_floating_point():
        return torch.equal(x, y)
    return bool(((x == y) | (x.isnan() & y.isnan())).all())


def _equal_outputs(a: Any, b: Any) -> bool:
    if not isinstance(a, (tuple, list)) or not isinstance(b, (tuple, list)) or len(a) != len(b):
        return False
    return all(map(_equal_tensors, a, b))


class ReplayedFunction:
    """`fn` compiled with `torch.compile(fn, dynamic=True, backend=...)`, called with its graph replayed
    where dynamo's guards allow (see the module's docstring). `fn` takes positional arguments, the first
    `self` when it is a bound method; it returns a tuple of tensors."""

    def __init__(self, fn: Callable, backend: str | Callable = "inductor", options: dict | None = None):
        func = getattr(fn, "__func__", fn)
        self.code = func.__code__
        self.frame_globals = func.__globals__
        self.arg_names = self.code.co_varnames[:self.code.co_argcount]
        self.bound_self = getattr(fn, "__self__", None)
        if backend == "inductor":
            inner = torch._TorchCompileInductorWrapper(None, options, True)
        else:
            from torch._dynamo.backends.registry import lookup_backend

            inner = lookup_backend(backend)
        self.backend = ReplayBackend(inner, self.frame_globals)
        self.dynamo = torch.compile(fn, dynamic=True, backend=self.backend)
        self.learned: list[tuple[Any, CompiledGraph]] = []  # (cache entry, its graph), in the order learned
        self.refused: set[int] = set()  # ids of cache entries that run through dynamo every time
        self.replays = self.dynamo_calls = 0

    def _locals(self, args: tuple) -> dict:
        if self.bound_self is not None:
            args = (self.bound_self, *args)
        return dict(zip(self.arg_names, args))

    def __call__(self, *args):
        frame_locals = self._locals(args)
        for i, (entry, graph) in enumerate(self.learned):
            if entry.guard_manager.check(frame_locals):
                if i:  # most recently used first, as dynamo orders its entries: a steady batch checks one
                    self.learned.insert(0, self.learned.pop(i))
                self.replays += 1
                return graph.compiled(*graph.fetch(frame_locals))
        self.dynamo_calls += 1
        self.backend.last_called = None
        result = self.dynamo(*args)
        try:
            self._learn(frame_locals, result)
        finally:  # the call's inputs are not kept: a warm-up's scratch KV pool is freed once the build ends
            if self.backend.last_called is not None:
                self.backend.last_called.last_args = None
            self.backend.last_called = None
        return result

    def _learn(self, frame_locals: dict, result: Any) -> None:
        from torch._dynamo.eval_frame import _debug_get_cache_entry_list

        for entry in _debug_get_cache_entry_list(self.code):
            if id(entry) in self.refused or any(entry is e for e, _ in self.learned):
                continue
            if not entry.guard_manager.check(frame_locals):
                continue
            graph = _graph_of(entry, self.frame_globals)
            why = ("not the graph dynamo just called" if graph is not None and graph is not self.backend.last_called
                   else self._refusal(graph, frame_locals, result))
            if why:
                self.refused.add(id(entry))
                log.info("compiled %s: entry %s runs through dynamo (%s)", self.code.co_name, entry.compile_id, why)
            else:
                self.learned.append((entry, graph))
            return

    @staticmethod
    def _refusal(graph: CompiledGraph | None, frame_locals: dict, result: Any) -> str | None:
        if graph is None:
            return "its code does more than call one graph and return"
        if graph.fetch is None or graph.last_args is None:
            return "an input with no readable source"
        try:
            fetched = graph.fetch(frame_locals)
        except Exception as e:  # a source that does not read back from the locals
            return f"an input source failed: {e!r}"
        if len(fetched) != len(graph.last_args) or not all(map(_same, fetched, graph.last_args)):
            return "the fetched inputs are not what dynamo passed"
        if not _equal_outputs(graph.compiled(*fetched), result):
            return "the graph's outputs are not the function's result"
        return None
