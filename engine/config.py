"""Engine configuration: one dataclass, hashed into the replica's identity."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field

# tokens per KV block where the attention backend has no better size for the step it runs
# (AttentionBackend.default_block_size)
DEFAULT_BLOCK_SIZE = 16


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
    kv_cache_memory_bytes: int = 256 * 1024**2  # memory budget for the KV pool
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
    # torch.compile the forward of pure decode steps (engine/model_runner.py); off: see there
    compile_decode: bool = False
    # float32 projections of PACKED_MIN_ROWS (4)+ rows on the CPU through oneDNN's packed weights
    # (engine/models/packed_linear.py: a 135M model's decode at batch 4-12 1.28-1.55x); off by default: a second
    # copy of those weights, made at start
    pack_weights: bool = False
    # CUDA only: pure decode steps replay CUDA graphs captured per batch size (engine/cuda_graph.py); they take
    # those steps from compile_decode. Off by default until engine/benchmarks/gpu_check.py has passed on a GPU
    cuda_graphs: bool = False
    # multi-step decode (engine/multi_step.py): up to this many decode steps per schedule, when the
    # batch is decodes only, nothing waits and every sequence is greedy without logits processors
    num_scheduler_steps: int = 1
    # tokenization
    tokenization_cache_size: int = 4096
    # the chat template in place of the model directory's, as vLLM's --chat-template takes it: a file's
    # path or the template itself (engine.tokenization.load_chat_template); its hash is the replica's
    chat_template: str | None = None
    # identity
    replica_id: str = "replica-0"
    served_model_name: str | None = None  # defaults to the model directory's name
    # the server's flags that shape which requests are answered (`infersight serve --max-queue`): not the
    # engine's to use, recorded in the identity so a replica that sheds or refuses more is explained by them
    serve_flags: dict = field(default_factory=dict)
    # (whether prompt / output text may be stored is the Recorder's decision, not the engine's:
    # `infersight serve --store-text`, telemetry.recorder.Recorder(store_text=...))

    def to_json(self, generation: dict | None = None) -> str:
        """The config as JSON; `generation` (what the model directory says about generation: eos
        and bos ids) is added under "generation" for the replica's identity."""
        d = asdict(self)
        if generation:
            d["generation"] = generation
        return json.dumps(d, sort_keys=True)

    def config_hash(self, generation: dict | None = None) -> str:
        """Hash of everything that can change what or how the engine computes.

        The replica id and the served name are labels, not behaviour: excluded,
        so that identical replicas share a config hash. `generation` is included: a
        generation_config.json with other eos ids changes where every answer stops.
        """
        d = asdict(self)
        for label in ("replica_id", "served_model_name"):
            d.pop(label)
        if generation:
            d["generation"] = generation
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]
