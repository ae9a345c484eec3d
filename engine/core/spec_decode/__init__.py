"""Speculative decoding: proposers (n-gram prompt lookup, draft model), verification
by rejection sampling, and acceptance metrics in vLLM's conventions."""

from engine.core.spec_decode.metrics import SpecDecodeStats
from engine.core.spec_decode.ngram import NgramProposer
from engine.core.spec_decode.rejection import VerifyResult, rejection_sample, verify_greedy

__all__ = ["NgramProposer", "SpecDecodeStats", "VerifyResult", "rejection_sample", "verify_greedy"]
