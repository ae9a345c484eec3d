"""Float32 projections through oneDNN, the weight reordered once into its blocked layout (EngineConfig.pack_weights:
on by default on the CPU).

F.linear hands a float32 product to MKL's sgemm, which packs the weight into its own blocks on every
call. For a few dozen rows (a decode batch) that repacking is a large part of the call: oneDNN's
matmul over a weight reordered once (`mkldnn._reorder_linear_weight`, what vLLM's CPU build does for
every dense layer) skips it. The packed product is taken for weights of at least `PACKED_MIN_NUMEL` (below,
oneDNN's ~25 us a call costs more than the repacking saves: none of the reference model's) and from
`min_rows` rows up; fewer rows go to F.linear on the plain weight, one row to models/gemv.py.

Where MKL does well with few rows depends on the CPU, so the row threshold is measured once per process,
when a model is packed (`choose_min_rows`, over the model's own weights, F.linear against the packed product):
- on a 2-core Xeon MKL keeps 2-3 rows (packed 0.72-0.99x) and sgemv streams one row at full bandwidth:
  packed from PACKED_MIN_ROWS (4) rows, the plain weights kept;
- on a 2-core AMD EPYC MKL takes a generic path (`mkl_blas_def_sgemm`) and sgemv runs on one thread: the 135M
  model's projections at 1 / 2 / 3 rows took 28.8 / 48.6 / 60.4 ms through F.linear and 12.9 / 13.9 / 14.7 ms
  packed (the compiled one-row reduction of models/gemv.py: 13.4). Where one row is ONE_ROW_GAIN faster
  packed, the packed copy serves every row count and the plain weights are freed (`drop_plain`): one copy
  of the weights, as without packing. A lm_head tied to the embedding keeps its plain weight (the embedding's
  lookup reads it), so that one is held twice (the 135M model: 108 MiB).
The measurements are in the README ("Measured choices").

Rows of 2+ are routed inside the call, not by Python around it: under compile_decode a branch on the
batch size would be one more guard, and a graph per side of it (a new one met mid-run costs 10-100 s).
So a compiled graph calls one opaque op (`infersight::packed_linear`, engine/core/opaque_matmul.py, as the int8
kernel does) and the op chooses at run time. One row is a static shape in the graphs (dynamo specializes
size 1): the packed op where the plain weight was freed, else models/gemv.py's choice.

The copies are made at start (not at a first large batch: a reorder of the 135M model's weights mid-request
would be a stall a client sees). Results differ from sgemv's in the last bits (another summation order:
~1e-6 relative). A kept plain weight replaced or written in place is reordered again at its next call; a
freed one is a meta tensor of its shape (names, shapes and the state dict's keys stay; reading its values
fails loudly).
"""

from __future__ import annotations

import logging
import time

import torch
import torch.nn.functional as F
from torch import nn

from engine.core.models.gemv import linear, onednn_linear
from engine.core.opaque_matmul import OpaqueMatmul, tensor_version

log = logging.getLogger(__name__)

# from this many rows the packed product pays where MKL keeps 2-3 rows (the module docstring; it was 16, which
# left batches of 4-15 to MKL)
PACKED_MIN_ROWS = 4
# the packed product at 2 rows this much faster than F.linear, measured, and it takes 2 rows up (`choose_min_rows`)
FEW_ROWS_GAIN = 1.25
# ... at 1 row this much faster, and it takes every row count: the plain copy is freed. A wider margin: the
# batch-1 graphs bake this choice in, so a machine near the line must not flip it between starts
ONE_ROW_GAIN = 1.5
# the threshold in force: PACKED_MIN_ROWS until `choose_min_rows` measured this CPU
min_rows = PACKED_MIN_ROWS
_chosen = False
# below this many weights (1 MiB of float32) oneDNN's fixed cost a call exceeds what the packing saves
PACKED_MIN_NUMEL = 1 << 18
# the batch size oneDNN is told to expect when it picks its blocking (32 and 256 measured alike)
PACK_ROWS_HINT = 32

_HAS_ONEDNN = hasattr(torch.ops.mkldnn, "_reorder_linear_weight") and torch.backends.mkldnn.is_available()


def can_pack(weight: torch.Tensor | None) -> bool:
    """A float32 CPU weight large enough for the packed product to pay (see the module docstring)."""
    return (_HAS_ONEDNN and weight is not None and weight.dim() == 2 and weight.dtype == torch.float32
            and weight.device.type == "cpu" and weight.numel() >= PACKED_MIN_NUMEL)


def _packed_product(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return onednn_linear(x, packed, bias)  # the same op over a plain or a reordered weight


class PackedMatmul(OpaqueMatmul, op="packed_linear"):
    """y = x @ weight^T + bias: packed from `min_rows` rows, F.linear below (see the module docstring); every row
    count once `drop_plain` freed the plain weight."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        self.weight, self.bias = weight, bias
        self.packed_only = False  # `drop_plain`: the plain weight is freed, `weight` a meta tensor of its shape
        self._packed_for: tuple | None = None  # (data_ptr, _version) of the weight the copy was made from
        self._packed = self._pack()
        super().__init__()

    @property
    def out_features(self) -> int:
        return self.weight.shape[0]

    @property
    def nbytes(self) -> int:
        """The packed copy's bytes (for the start summary's weights: engine/core/process_memory.py)."""
        return self._packed.numel() * self._packed.element_size()

    def _key(self) -> tuple:
        return self.weight.data_ptr(), tensor_version(self.weight)

    def _pack(self) -> torch.Tensor:
        self._packed_for = self._key()
        with torch.no_grad():
            return torch.ops.mkldnn._reorder_linear_weight(self.weight.detach(), PACK_ROWS_HINT)

    def drop_plain(self) -> nn.Parameter:
        """Serve every row count from the packed copy and let the plain weight go; a meta parameter of its
        shape, for the owner (which must stop holding the plain one too, or nothing is freed)."""
        self.weight = nn.Parameter(self.weight.detach().to("meta"), requires_grad=False)
        self.packed_only = True
        return self.weight

    def eager(self, x: torch.Tensor) -> torch.Tensor:
        if not self.packed_only:
            if x.numel() < min_rows * x.shape[-1]:
                return F.linear(x, self.weight, self.bias)
            if self._packed_for != self._key():  # the weight was written in place since
                self._packed = self._pack()
        return _packed_product(x, self._packed, self.bias)


def packed_gain(matmuls: list[PackedMatmul], rows: int, repeats: int = 3) -> float:
    """F.linear's time over the packed product's at `rows` rows through all of `matmuls` (a model's own
    weights: the working set a step streams), best of `repeats` each, interleaved so that a busy moment of the
    machine hits both."""
    matmuls = [mm for mm in matmuls if not mm.packed_only]
    if not matmuls:
        return 1.0
    xs = {mm.weight.shape[1]: torch.ones(rows, mm.weight.shape[1]) for mm in matmuls}
    best_plain = best_packed = float("inf")
    with torch.inference_mode():
        for i in range(repeats + 1):  # the first pass of each warms the allocator and the BLAS up
            start = time.perf_counter()
            for mm in matmuls:
                F.linear(xs[mm.weight.shape[1]], mm.weight, mm.bias)
            plain = time.perf_counter() - start
            start = time.perf_counter()
            for mm in matmuls:
                _packed_product(xs[mm.weight.shape[1]], mm._packed, mm.bias)
            packed = time.perf_counter() - start
            if i:
                best_plain, best_packed = min(best_plain, plain), min(best_packed, packed)
    return best_plain / best_packed


def choose_min_rows(matmuls: list[PackedMatmul]) -> int:
    """The row threshold for this process, measured once over the first packed model's matmuls (the module
    docstring): 1 where the packed product is ONE_ROW_GAIN faster than F.linear at one row (the model then
    frees its plain copies: `drop_plain`), else 2 where it is FEW_ROWS_GAIN faster at 2 rows, else
    PACKED_MIN_ROWS. Rows of 2+ are chosen inside the op at each call, so no compiled graph bakes that in;
    one row's choice is baked into the batch-1 graphs (packed op or reduction), hence the wide margin."""
    global min_rows, _chosen
    if not _chosen and matmuls:
        one = packed_gain(matmuls, 1)
        two = None if one >= ONE_ROW_GAIN else packed_gain(matmuls, 2)  # one row decided it: 2 rows need no pass
        min_rows = 1 if two is None else 2 if two >= FEW_ROWS_GAIN else PACKED_MIN_ROWS
        _chosen = True
        log.info("packed weights: F.linear / packed %.2fx at 1 row%s: the packed product from %d row(s)",
                 one, "" if two is None else f", {two:.2f}x at 2", min_rows)
    return min_rows


class PackedLinear(nn.Linear):
    """An nn.Linear whose products of many rows are packed (`pack_linear` turns one into this in place:
    same module, same parameters, so tied weights, names and the state dict stay as they were).
    A subclass, so quantization still finds it; one row goes through models/gemv.py like any projection."""

    _matmul: PackedMatmul | None = None  # made by `pack_linear`; again by `matmul` when a parameter is replaced

    def matmul(self) -> PackedMatmul:
        """The matmul over the current parameters (rebuilt when assignment or `.to()` replaced them)."""
        mm = self._matmul
        if mm is None or mm.weight is not self.weight or mm.bias is not self.bias:
            mm = self._matmul = PackedMatmul(self.weight, self.bias)
        return mm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mm = self._matmul
        if mm is not None and mm.packed_only:  # the packed copy is the weight (`drop_plain`: not re-packed from a
            return mm(x)  # weight assigned later; pack a fresh module instead)
        if x.shape[0] == 1 or not can_pack(self.weight):
            return linear(x, self.weight, self.bias)
        return self.matmul()(x)

    def drop_plain(self) -> None:
        """Free the plain weight (`PackedMatmul.drop_plain`): the parameter becomes a meta tensor of its shape,
        so the names, shapes and the state dict's keys stay, and any read of its values fails loudly."""
        self.weight = self.matmul().drop_plain()


def pack_linear(module: nn.Module) -> PackedMatmul | None:
    """Make a plain float32 nn.Linear a PackedLinear in place, where packing pays; its matmul, or None."""
    if type(module) is not nn.Linear or not can_pack(module.weight):
        return None
    module.__class__ = PackedLinear
    return module.matmul()
