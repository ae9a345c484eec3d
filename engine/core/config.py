"""Engine configuration: one dataclass, hashed into the replica's identity."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field

# tokens per KV block where the attention backend has no better size for the step it runs
# (AttentionBackend.default_block_size)
DEFAULT_BLOCK_SIZE = 16
ROLES = ("", "baseline", "candidate")
COMPILE_DECODE_ENV = "INFERSIGHT_COMPILE_DECODE"  # see compile_decode_default
DEPLOY_LABELS = ("role", "deploy_time")  # recorded in columns of their own (ReplicaRecord)


def compile_decode_default() -> bool | None:
    """EngineConfig.compile_decode where it is not given: None (decided at start for the backend and device:
    engine/core/attention compile_decode_for), or False where INFERSIGHT_COMPILE_DECODE says 0 / false / no / off
    (a process whose engines should all run eager: the test suite, a host without a C++ compiler)."""
    off = os.environ.get(COMPILE_DECODE_ENV, "").strip().lower() in ("0", "false", "no", "off")
    return False if off else None


@dataclass
class EngineConfig:
    model: str  # local Hugging Face directory
    dtype: str = "float32"  # "float32" | "bfloat16" (| "float16" on CUDA)
    device: str = "cpu"
    attention_backend: str = "auto"  # "auto" | "torch" | "flashinfer"
    seed: int = 0
    # KV cache. block_size: tokens per KV block; None: the attention backend's choice for this model and
    # config (AttentionBackend.default_block_size: 16, or 64 where the torch backend's compile_decode attends
    # the pool in place on a CPU), written back into the replica's config at start
    block_size: int | None = None
    # memory budget for the KV pool; None: what max_num_seqs full-length sequences can fill, at most 256 MiB
    # (engine/core/kv_cache.py kv_pool_blocks)
    kv_cache_memory_bytes: int | None = None
    num_kv_blocks: int | None = None  # overrides the memory budget when set (tests)
    enable_prefix_caching: bool = True
    # scheduler budgets
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    enable_chunked_prefill: bool = True
    max_model_len: int | None = None  # defaults to the model's max_position_embeddings
    # quantization: "none" | "int8" | "int4"; group size for int4; layers (name substrings) to skip
    quantization: str = "none"
    quant_group_size: int = 128
    quant_skip_layers: list[str] = field(default_factory=lambda: ["lm_head"])
    # speculative decoding: "none" | "ngram" | "draft"
    speculative_mode: str = "none"
    num_speculative_tokens: int = 4
    draft_model: str | None = None
    ngram_min: int = 1
    ngram_max: int = 4
    # pure decode steps run one torch.compile'd graph (engine/core/model_runner.py), built at start in a thread
    # while the first requests run eager (engine/core/compile_warmup.py). None: on for the torch backend on a CPU,
    # where it pays at every batch shape measured (README, "Defaults and why": engine/benchmarks/decode_host.py),
    # written back into the replica's config at start; off (--no-compile-decode, or INFERSIGHT_COMPILE_DECODE=0
    # for every engine of a process) keeps torch._dynamo and inductor out of the replica (~140 MB of RSS) and
    # the build's work off its CPU
    compile_decode: bool | None = field(default_factory=lambda: compile_decode_default())
    # float32 projections on the CPU through oneDNN's packed weights, reordered once at start (weights of 1 MiB and
    # up: none of the reference model's), from a row count measured per process (engine/core/models/packed_linear.py).
    # None: on for a CPU engine (the 135M model: batch 1 2x, batched decode 2-3x, prefill-heavy work 1.3-2x;
    # README, "Defaults and why"), written back at start. Where the packed product also serves one row the plain
    # copies are freed; else (a BLAS that keeps few rows) it costs a second copy of those weights
    pack_weights: bool | None = None
    # CUDA only: pure decode steps replay CUDA graphs captured per batch size (engine/core/cuda_graph.py); they take
    # those steps from compile_decode. Off by default until engine/benchmarks/gpu_check.py has passed on a GPU
    cuda_graphs: bool = False
    # multi-step decode (engine/core/multi_step.py): up to this many decode steps per schedule, when the
    # batch is decodes only, nothing waits and every sequence is greedy without logits processors; None ("auto",
    # --num-scheduler-steps auto): as many as fit in a few ms by the measured step time; 1: off
    num_scheduler_steps: int | None = field(default=None, metadata={"auto": True})
    # the model's sampling defaults for requests that leave them unset (engine/core/generation_defaults.py), vLLM's
    # --generation-config: "auto" (the model directory's generation_config.json), "vllm" (none), or a directory
    generation_config: str = "auto"
    # tokenization
    tokenization_cache_size: int = 4096
    # the chat template in place of the model directory's, as vLLM's --chat-template takes it: a file's
    # path or the template itself (engine.core.tokenization.load_chat_template); its hash is the replica's
    chat_template: str | None = None
    # identity
    replica_id: str = "replica-0"
    served_model_name: str | None = None  # defaults to the model directory's name
    # the deploy, as the baseline rule reads it (diagnostics/baseline.py): "baseline" | "candidate" | ""
    # (not given), and when it was deployed (epoch seconds; None: when the engine starts building, before its
    # model loads). Labels, not
    # behaviour: columns of the replica row of their own, in neither the config document nor its hash
    role: str = ""
    deploy_time: float | None = None
    # how the server in front of the engine serves (`infersight serve`'s own flags and limits: max queue,
    # timeouts, API options; engine/serving/server/cli.py fills it): behaviour, so part of the identity; {} offline
    serve_options: dict = field(default_factory=dict)
    # (whether prompt / output text may be stored is the Recorder's decision, not the engine's:
    # `infersight serve --store-text`, telemetry.recorder.Recorder(store_text=...))

    def __post_init__(self):
        if self.role not in ROLES:
            raise ValueError(f"role must be one of {', '.join(repr(r) for r in ROLES)}, got {self.role!r}")

    def _document(self) -> dict:
        d = asdict(self)
        for label in DEPLOY_LABELS:
            d.pop(label)
        return d

    def to_json(self, sections: dict | None = None) -> str:
        """The config as JSON; `sections` (what the model directory says: "generation" eos and bos ids,
        "model_files" ...) are added under their names for the replica's identity."""
        return json.dumps({**self._document(), **(sections or {})}, sort_keys=True)

    def config_hash(self, sections: dict | None = None) -> str:
        """Hash of everything that can change what or how the engine computes.

        The replica id and the served name are labels, not behaviour: excluded,
        so that identical replicas share a config hash. `sections` are included: a
        generation_config.json with other eos ids, a config.json with another RoPE base,
        change every answer even at the same path.
        """
        d = self._document()
        for label in ("replica_id", "served_model_name"):
            d.pop(label)
        d.update(sections or {})
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]
