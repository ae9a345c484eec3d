"""The real-tokenizer models: converted faithfully, and served by the engine."""

from __future__ import annotations

import json

import pytest

from engine.core.llm import LLM
from engine.core.sampling_params import SamplingParams

TEXTS = ["Why is replica 3 slower than the others?", "Latency doubled… again, naïve café 日本語 🚀",
         "def add(a, b):\n    return a + b", "  two leading spaces"]
SPACE_RUNS = ("def add(a, b):\n    return a + b", "  two leading spaces")  # see the xfail below


def test_the_sentencepiece_conversion_encodes_as_sentencepiece_does(real_models, tokenizer_of):
    import sentencepiece
    from real_models import SENTENCEPIECE_FILE, data_file

    sp = sentencepiece.SentencePieceProcessor(model_file=str(data_file(SENTENCEPIECE_FILE)))
    tok = tokenizer_of(real_models("sentencepiece"))
    assert tok.vocab_size == sp.get_piece_size() == 32000
    for text in TEXTS:
        if text not in SPACE_RUNS:
            assert tok.encode(text) == [sp.bos_id(), *sp.encode(text)], text


@pytest.mark.xfail(strict=True, reason="a real slow/fast difference (transformers issues #25069, #24569): the "
                   "converted BPE makes '▁▁▁▁' + 'return' where SentencePiece makes '▁▁▁' + '▁return', so a "
                   "replica tokenizing with sentencepiece (mistral-common) and one with tokenizer.json diverge")
def test_runs_of_spaces_encode_as_sentencepiece_does(real_models, tokenizer_of):
    import sentencepiece
    from real_models import SENTENCEPIECE_FILE, data_file

    sp = sentencepiece.SentencePieceProcessor(model_file=str(data_file(SENTENCEPIECE_FILE)))
    tok = tokenizer_of(real_models("sentencepiece"))
    assert [tok.encode(t, add_special_tokens=False) for t in SPACE_RUNS] == [sp.encode(t) for t in SPACE_RUNS]


def test_the_tekken_conversion_encodes_as_mistral_common_does(real_models, tokenizer_of):
    from mistral_common.tokens.tokenizers.tekken import Tekkenizer
    from real_models import TEKKEN_VOCAB_SIZE, tekken_source_of

    model = real_models("tekken")
    tekken = Tekkenizer.from_file(str(tekken_source_of(model)))
    tok = tokenizer_of(model)
    assert tok.vocab_size == tekken.n_words == TEKKEN_VOCAB_SIZE
    for text in TEXTS:
        assert tok.encode(text) == tekken.encode(text, bos=True, eos=False), text


@pytest.mark.parametrize("family", ["sentencepiece", "tekken"])
def test_the_engine_serves_a_real_tokenizer_model(real_models, family):
    model = real_models(family)
    config = json.loads((model / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["tie_word_embeddings"]
    llm = LLM(model, block_size=8, num_kv_blocks=32)
    tok = llm.tokenizer
    assert config["vocab_size"] == tok.vocab_size
    assert json.loads((model / "generation_config.json").read_text())["eos_token_id"] == [tok.eos_token_id]
    rendered = tok.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False)
    assert rendered == {"sentencepiece": "<s>[INST] Hi [/INST]", "tekken": "<s>[INST]Hi[/INST]"}[family]
    params = SamplingParams(temperature=0.8, max_tokens=4, seed=0, ignore_eos=True)
    text_out, = llm.generate(["Why is replica 3 slower?"], params, use_tqdm=False)
    chat_out, = llm.chat([[{"role": "user", "content": "Hi"}]], params, use_tqdm=False)
    assert text_out.prompt_token_ids == tok.encode("Why is replica 3 slower?")
    assert chat_out.prompt_token_ids[0] == tok.bos_token_id
    for out in (text_out, chat_out):
        assert len(out.token_ids) == 4 and out.text == tok.decode(out.token_ids)


def _mistral_common_chat(messages) -> list[int]:
    """Mistral's own encoding of a chat for tokenizer.model.v1 (mistral-common's InstructTokenizerV1)."""
    from mistral_common.protocol.instruct.messages import AssistantMessage, UserMessage
    from mistral_common.protocol.instruct.request import ChatCompletionRequest
    from mistral_common.tokens.tokenizers.mistral import MistralTokenizer

    kinds = {"user": UserMessage, "assistant": AssistantMessage}
    request = ChatCompletionRequest(messages=[kinds[m["role"]](content=m["content"]) for m in messages])
    return MistralTokenizer.v1().encode_chat_completion(request).tokens


def test_the_inst_template_encodes_a_turn_as_mistral_common_does(real_models, tokenizer_of):
    # legacy=True: '<s>', '▁[', 'INST', ']': the reference; legacy=False would make it '<s>', '[', ...
    tok = tokenizer_of(real_models("sentencepiece"))
    chat = [{"role": "user", "content": "Why is replica 3 slower?"}]
    assert tok.apply_chat_template(chat) == _mistral_common_chat(chat)
    assert tok.apply_chat_template(chat)[:4] == [1, 733, 16289, 28793]


@pytest.mark.xfail(strict=True, reason="a real template incident: Mistral 7B Instruct v0.1's published template "
                   "writes '[/INST]' + answer, which encodes 'Hello' (16230) where mistral-common encodes the "
                   "answer on its own, '▁Hello' (22557): multi-turn prompts differ between the two")
def test_the_inst_template_encodes_a_conversation_as_mistral_common_does(real_models, tokenizer_of):
    tok = tokenizer_of(real_models("sentencepiece"))
    chat = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."},
            {"role": "user", "content": "What does the KV cache hold?"}]
    assert tok.apply_chat_template(chat) == _mistral_common_chat(chat)
