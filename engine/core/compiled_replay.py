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
- where the graph is inductor's with `cpp_wrapper` (the runner's), a replay also skips what is around the
  graph's C++ entry: torch.compile's wrappers (dynamo's `disable`, AOTAutograd's argument list), called at
  AOTAutograd's runtime wrapper with the boxed argument list it gets; and the Python ints among the inputs
  (sizes: batch, context length) are passed as the 0-d tensors the cpp wrapper reads them from, made once
  per value rather than by `torch.tensor` on every call. That is ~60 us of a ~360 us call at batch 1 on the
  reference model (`python -m engine.benchmarks.compiled_call`). Learned only when that call returns what
  dynamo's did; else the graph is called through torch.compile's wrappers, as the graph of any backend is.
"""

from __future__ import annotations

import dis
import logging
import types
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
    # frame locals -> the inputs as one list, its ints as 0-d tensors (the cpp wrapper's convention)
    fetch_boxed: Callable[[dict], list] | None = None
    last_args: tuple | None = field(default=None, repr=False)  # what dynamo passed on its last call
    replay: Callable[[dict], Any] | None = None  # frame locals -> the graph's outputs, once learned
    boxed: bool = False  # replayed at AOTAutograd's runtime wrapper with `fetch_boxed`'s inputs


class _IntTensors(dict):
    """int -> the 0-d int64 tensor inductor's cpp wrapper would make of it (`torch.tensor(value)`), made once:
    the graph reads it (`aoti_torch_item_int64`) and never writes it."""

    def __missing__(self, value: int) -> torch.Tensor:
        if len(self) >= 4096:  # sizes seen over a long run: bounded, the next calls make theirs again
            self.clear()
        tensor = self[value] = torch.tensor(value)
        return tensor


_INT_TENSORS = _IntTensors()


def _input_sources(gm: torch.fx.GraphModule) -> tuple[list[str], dict, list[bool]] | None:
    """Each placeholder's expression over the frame's locals (L) and globals (G), the dtypes those name, and
    which placeholders are Python ints. A Python number the trace left unspecialized (a float attribute, with
    dynamic=True) is passed as a 0-d tensor of its dtype, as dynamo's code passes it."""
    names, dtypes, ints = [], {}, []
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
        ints.append(isinstance(node.meta.get("example_value"), (int, torch.SymInt))
                    and not isinstance(node.meta.get("example_value"), bool))
    return names, dtypes, ints


def _input_fetch(sources: tuple[list[str], dict, list[bool]] | None, frame_globals: dict,
                 boxed: bool = False) -> Callable[[dict], tuple | list] | None:
    """The frame's locals -> the graph's inputs, from `_input_sources`: a tuple, or with `boxed` a list whose
    ints are 0-d tensors (`_INT_TENSORS`)."""
    if sources is None:
        return None
    names, dtypes, ints = sources
    if boxed:
        names = [f"_T[{n}]" if is_int else n for n, is_int in zip(names, ints)]
    scope = {"G": frame_globals, "_as_tensor": torch.as_tensor, "_T": _INT_TENSORS, **dtypes}
    body = "".join(n + ", " for n in names)
    try:
        return eval(f"lambda L: [{body}]" if boxed else f"lambda L: ({body})", scope)  # noqa: S307
    except SyntaxError:
        return None


def _runtime_wrapper(compiled: Callable) -> Callable[[list], Any] | None:
    """AOTAutograd's runtime wrapper inside the function torch.compile's inductor backend returns, which takes
    the graph's inputs as one list (the boxed convention); None where the wrappers above it add inputs of
    their own (AOTAutograd's lifted parameters) or are not the ones known here."""
    from torch._functorch._aot_autograd.runtime_wrappers import SerializableCompiledFunction

    fn = compiled
    for _ in range(8):
        if isinstance(fn, SerializableCompiledFunction):
            return fn.compiled_fn
        code = getattr(fn, "__code__", None)
        if code is not None and "params_buffers_flat" in code.co_freevars:
            cell = fn.__closure__[code.co_freevars.index("params_buffers_flat")]
            if cell.cell_contents:  # parameters AOTAutograd prepends to the inputs: not handled here
                return None
        fn = getattr(fn, "__wrapped__", None)
        if fn is None:
            return None
    return None


class ReplayBackend:
    """A torch.compile backend: `inner`'s compiled function per graph, kept with the fetch of its inputs."""

    def __init__(self, inner: Callable, frame_globals: dict, boxed_ints: bool = False):
        self.inner = inner
        self.frame_globals = frame_globals
        self.boxed_ints = boxed_ints  # inductor with cpp_wrapper: ints may be passed as 0-d tensors
        self.last_called: CompiledGraph | None = None

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
        sources = _input_sources(gm)
        graph = CompiledGraph(self.inner(gm, example_inputs), _input_fetch(sources, self.frame_globals),
                              _input_fetch(sources, self.frame_globals, boxed=True) if self.boxed_ints else None)

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


def module_tensor_guards_only(entries: list) -> list[bool]:
    """A `guard_filter_fn` for a function over modules that nothing changes once it is compiled: of the guards
    whose source lies inside an nn.Module, only the tensor guards are kept (a parameter's or buffer's dtype,
    shape, strides and device), not those on the modules' Python structure (each module's type, `__dict__`,
    `_modules` and `_parameters` dicts, `training`). Those were ~880 of the ~1,110 lines of the multi-step
    decode's guard tree on the reference model; its check went from 35-60 us to ~24 us a call. A module whose
    attributes change after compiling (a flag flipped, a submodule swapped) is not seen by these guards: the
    caller vouches that its modules are frozen; with `ReplayedFunction`, whose entries are its own (one per
    runner), no other model meets its graphs. Tensors are still checked, so a weight replaced by one of
    another dtype or shape still recompiles rather than running a graph made for the old one."""
    return [entry.guard_type == "TENSOR_MATCH" or not entry.orig_guard.source.is_unspecialized_nn_module()
            for entry in entries]


def _own_copy(func: Callable) -> Callable:
    """`func` with a new code object (equal to its own) and everything else the same."""
    copy = types.FunctionType(func.__code__.replace(), func.__globals__, func.__name__, func.__defaults__,
                              func.__closure__)
    copy.__kwdefaults__, copy.__qualname__ = func.__kwdefaults__, func.__qualname__
    copy.__dict__.update(func.__dict__)
    return copy


class ReplayedFunction:
    """`fn` compiled with `torch.compile(fn, dynamic=True, backend=...)`, called with its graph replayed
    where dynamo's guards allow (see the module's docstring). `fn` takes positional arguments, the first
    `self` when it is a bound method; it returns a tuple of tensors. `guard_filter`: torch.compile's
    `guard_filter_fn` (which of dynamo's guards are kept), for dynamo's calls and replays alike."""

    def __init__(self, fn: Callable, backend: str | Callable = "inductor", options: dict | None = None,
                 guard_filter: Callable | None = None):
        func = getattr(fn, "__func__", fn)
        self.bound_self = getattr(fn, "__self__", None)
        # a copy of the function with a code object of its own: dynamo keeps its cache entries (and counts its
        # recompiles) per code object, so this instance's entries are its own. Two runners' models in one
        # process never meet each other's graphs, which `guard_filter` may no longer tell apart
        func = _own_copy(func)
        fn = func if self.bound_self is None else types.MethodType(func, self.bound_self)
        self.code = func.__code__
        self.frame_globals = func.__globals__
        self.arg_names = self.code.co_varnames[:self.code.co_argcount]
        if backend == "inductor":
            inner = torch._TorchCompileInductorWrapper(None, options, True)
        else:
            from torch._dynamo.backends.registry import lookup_backend

            inner = lookup_backend(backend)
        cpp_wrapper = backend == "inductor" and bool((options or {}).get("cpp_wrapper"))
        self.backend = ReplayBackend(inner, self.frame_globals, boxed_ints=cpp_wrapper)
        compile_options = {"guard_filter_fn": guard_filter} if guard_filter is not None else None
        self.dynamo = torch.compile(fn, dynamic=True, backend=self.backend, options=compile_options)
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
                return graph.replay(frame_locals)
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
                graph.replay = self._replay(graph, frame_locals, result)
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

    @staticmethod
    def _replay(graph: CompiledGraph, frame_locals: dict, result: Any) -> Callable[[dict], Any]:
        """The call a learned graph replays with: at AOTAutograd's runtime wrapper with the boxed inputs where
        that returns dynamo's result (see the module's docstring), else the compiled function as dynamo calls it."""
        compiled, fetch = graph.compiled, graph.fetch
        direct = _runtime_wrapper(compiled) if graph.fetch_boxed is not None else None
        if direct is not None:
            fetch_boxed = graph.fetch_boxed
            try:
                same = _equal_outputs(direct(fetch_boxed(frame_locals)), result)
            except Exception as e:  # a wrapper that is not what it was when this was written
                log.info("compiled graph: called through torch.compile's wrappers (%r)", e)
                same = False
            if same:
                graph.boxed = True
                return lambda frame_locals: direct(fetch_boxed(frame_locals))
        return lambda frame_locals: compiled(*fetch(frame_locals))
