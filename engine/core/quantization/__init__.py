"""Weight-only quantization (int8 per output channel, int4 group-wise) of nn.Linear layers."""

from engine.core.quantization.int4 import Int4Linear, dequantize_int4, pack_int4, quantize_int4, unpack_int4
from engine.core.quantization.int8 import Int8Linear, dequantize_int8, quantize_int8
from engine.core.quantization.quantize_model import LayerQuantStats, QuantReport, quantization_label, quantize_model

__all__ = [
    "Int4Linear", "Int8Linear", "LayerQuantStats", "QuantReport", "dequantize_int4", "dequantize_int8",
    "pack_int4", "quantization_label", "quantize_int4", "quantize_int8", "quantize_model", "unpack_int4",
]
