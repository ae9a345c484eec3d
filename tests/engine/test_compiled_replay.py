"""A compiled function's graph called directly (engine/core/compiled_replay.py): replayed only where dynamo's
guards pass and dynamo's code around the graph does nothing else, with dynamo's results."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo

from engine.core.compiled_replay import ReplayedFunction


class Step:
    """A runner-like object whose bound methods are compiled, as ModelRunner's decode functions are."""

    def __init__(self):
        torch.manual_seed(0)
        self.weight = torch.randn(8, 8)
        self.double = False  # a Python flag the trace specializes on: dynamo guards it
        self.last: torch.Tensor | None = None
        self.touched = False

    def pure(self, x, y):
        out = x @ self.weight + y
        return (out * 2 if self.double else out).relu(), x.sum(-1)

    def with_side_effect(self, x):
        self.touched = True  # an attribute set: dynamo's code sets it after the graph, on every call
        return x * 2, x + 1

    def with_side_effect_output(self, x):
        self.last = x * 3  # set from one more output of the graph than the function returns
        return x * 2, x + 1

    def with_nan(self, x):
        return x * float("nan"), x.sum(-1)  # as a warm-up decode over a pool's unwritten (NaN) slots returns

    def with_graph_break(self, x):
        y = x + 1
        torch._dynamo.graph_break()
        return y * 2, y


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _equal(a, b):
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


def test_a_learned_graph_is_called_directly_with_dynamos_results():
    step = Step()
    fn = ReplayedFunction(step.pure, "eager")
    for batch in (3, 5, 5, 7, 3, 2):  # dynamic batch sizes: one graph past the first specializations
        x, y = torch.randn(batch, 8), torch.randn(batch, 8)
        assert _equal(fn(x, y), step.pure(x, y))
    assert fn.replays >= 3
    assert fn.dynamo_calls + fn.replays == 6
    assert not fn.refused


def test_guards_still_decide_which_graph_runs():
    """A flag the trace specialized on flips: dynamo's guards fail for the learned graph, dynamo compiles
    another, and each call gets its own branch's result (without the guard check, the learned graph would
    answer for the other branch too)."""
    step = Step()
    fn = ReplayedFunction(step.pure, "eager")
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    fn(x, y), fn(x, y)
    assert fn.replays == 1
    for flag in (True, False, True, False):
        step.double = flag
        assert _equal(fn(x, y), step.pure(x, y))
    assert len(fn.learned) == 2  # one per branch, both replayed once learned
    assert fn.replays >= 3
    x32, x64 = torch.randn(4, 8), torch.randn(4, 8, dtype=torch.float64)  # a dtype the graphs were not made for
    step.weight = step.weight.double()
    assert _equal(fn(x64, x64), step.pure(x64, x64))
    step.weight = step.weight.float()
    assert _equal(fn(x32, y), step.pure(x32, y))


def test_a_graph_with_side_effects_runs_through_dynamo_every_time():
    step = Step()
    fn = ReplayedFunction(step.with_side_effect, "eager")
    for _ in range(5):
        step.touched = False
        x = torch.randn(4, 8)
        assert _equal(fn(x), (x * 2, x + 1))
        assert step.touched  # set by this call too
    assert fn.replays == 0 and fn.refused and not fn.learned


def test_a_graph_with_more_outputs_than_the_result_runs_through_dynamo_every_time():
    step = Step()
    fn = ReplayedFunction(step.with_side_effect_output, "eager")
    for _ in range(5):
        x = torch.randn(4, 8)
        assert _equal(fn(x), (x * 2, x + 1))
        assert torch.equal(step.last, x * 3)  # set by this call, not left from the one before
    assert fn.replays == 0 and fn.refused and not fn.learned


def test_a_function_with_a_graph_break_runs_through_dynamo_every_time():
    step = Step()
    fn = ReplayedFunction(step.with_graph_break, "eager")
    x = torch.randn(4, 8)
    for _ in range(3):
        assert _equal(fn(x), ((x + 1) * 2, x + 1))
    assert fn.replays == 0 and not fn.learned


def test_a_graph_whose_outputs_hold_nan_is_still_replayed():
    """Learning compares the graph's outputs called again with dynamo's, NaN equal to NaN: the build's warm-up
    decodes read a scratch pool's unwritten slots, and a NaN there refused the multi-step graph at random."""
    step = Step()
    fn = ReplayedFunction(step.with_nan, "eager")
    x = torch.randn(4, 8)
    for _ in range(3):
        out = fn(x)
        assert out[0].isnan().all() and torch.equal(out[1], x.sum(-1))
    assert fn.learned and not fn.refused and fn.replays == 2


def test_an_inductor_cpp_wrapper_graph_is_replayed_at_its_runtime_wrapper_with_its_ints_as_tensors(tmp_path,
                                                                                               monkeypatch):
    """The runner's graphs (inductor, cpp_wrapper) skip torch.compile's wrappers and take their size inputs as
    0-d tensors made once per value: the same results as eager over changing sizes, the sizes among the inputs."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    step = Step()
    fn = ReplayedFunction(step.pure, "inductor", {"cpp_wrapper": True})
    for batch in (3, 5, 5, 7, 3, 6, 6):
        x, y = torch.randn(batch, 8), torch.randn(batch, 8)
        out, expected = fn(x, y), step.pure(x, y)
        assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(out, expected))
    assert fn.replays >= 3 and not fn.refused
    boxed = [graph for _, graph in fn.learned if graph.boxed]
    assert boxed, "no learned graph replays at AOTAutograd's runtime wrapper"
    frame_locals = fn._locals((torch.randn(6, 8), torch.randn(6, 8)))
    ints = [v for v in boxed[0].fetch_boxed(frame_locals) if v.dim() == 0]
    assert ints and all(v.dtype == torch.int64 for v in ints)  # the batch size, as the cpp wrapper reads it
    assert 6 in [int(v) for v in ints]


def test_a_backend_without_the_cpp_wrapper_replays_through_torch_compiles_wrappers():
    step = Step()
    fn = ReplayedFunction(step.pure, "eager")
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    fn(x, y), fn(x, y)
    assert fn.replays == 1 and not any(graph.boxed for _, graph in fn.learned)


class Frozen(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)
        self.scale = 2.0

    def forward(self, x):
        return (self.proj(x) * self.scale * (3.0 if self.training else 1.0),)


def test_module_tensor_guards_only_keeps_tensor_guards_and_drops_the_modules_structure():
    """With the filter a module's Python attributes are no longer guarded (the caller vouches they do not change):
    flipping `training` reuses the graph. Its tensors still are: a weight of another dtype recompiles, and the
    result is that weight's."""
    from engine.core.compiled_replay import module_tensor_guards_only

    def call(module, x):
        return module(x)

    x = torch.randn(4, 8)
    unfiltered, filtered = Frozen().eval(), Frozen().eval()
    plain = ReplayedFunction(call, "eager")
    kept = ReplayedFunction(call, "eager", guard_filter=module_tensor_guards_only)
    for fn, module in ((plain, unfiltered), (kept, filtered)):
        assert _equal(fn(module, x), module(x))
    unfiltered.train(), filtered.train()
    assert _equal(plain(unfiltered, x), unfiltered(x))  # the full guards see the flag: recompiled, 3x
    kept(filtered, x)
    assert plain.dynamo_calls == 2 and kept.dynamo_calls == 1  # the filtered guards do not
    filtered.eval()
    filtered.proj.weight = torch.nn.Parameter(filtered.proj.weight.double())
    filtered.proj.bias = torch.nn.Parameter(filtered.proj.bias.double())
    x64 = x.double()
    assert _equal(kept(filtered, x64), filtered(x64))
    assert kept.dynamo_calls == 2


class Runner:
    """Holds a frozen model and compiles a method over it, as ModelRunner does."""

    def __init__(self, scale: float):
        from engine.core.compiled_replay import module_tensor_guards_only

        torch.manual_seed(0)
        self.model = Frozen().eval()
        self.model.scale = scale  # a Python constant the trace bakes into the graph
        self.compiled = ReplayedFunction(self.step, "eager", guard_filter=module_tensor_guards_only)

    def step(self, x):
        return self.model(x)


def test_each_replayed_function_has_cache_entries_of_its_own():
    """Two runners whose models differ only in a constant the module guards would have told apart: with those
    guards filtered out, each still gets its own model's result, because each compiled its own copy of the
    method's code (dynamo's entries are per code object)."""
    x = torch.randn(4, 8)
    first, second = Runner(2.0), Runner(5.0)
    for _ in range(3):
        assert _equal(first.compiled(x), first.step(x))
        assert _equal(second.compiled(x), second.step(x))
    assert first.compiled.code is not second.compiled.code
    assert first.compiled.dynamo_calls == second.compiled.dynamo_calls == 1  # each traced its own, once
    assert first.compiled.replays == second.compiled.replays == 2
