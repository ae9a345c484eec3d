"""Train the reference models' byte-level BPE tokenizer on the synthetic corpus.

Same specials and chat template as `engine.core.tiny_model` (BOS / EOS / PAD and
role markers), but digits, punctuation and one-letter words are split into
single tokens before BPE: a model can then add digit by digit, see every
bracket and copy letters, instead of having to learn the spelling of merged
tokens.

    python -m evals.reference.train_tokenizer --out evals/reference/models/target
"""

from __future__ import annotations

import argparse
import itertools
from pathlib import Path

from engine.core.tiny_model import BOS, CHAT_TEMPLATE, EOS, PAD, SPECIAL_TOKENS
from evals.reference.corpus import TASKS, TRAIN_SEED, stream

DEFAULT_VOCAB = 512


def corpus_texts(n: int, seed: int = TRAIN_SEED) -> list[str]:
    # every task equally: the vocabulary must not change when the training mix does
    uniform = {task: 1 for task in TASKS}
    return [f"{ex.prompt}\n{ex.answer}" for ex in itertools.islice(stream(seed, weights=uniform), n)]


def train_tokenizer(out_dir: str | Path, vocab_size: int = DEFAULT_VOCAB, num_texts: int = 20000,
                    seed: int = TRAIN_SEED):
    """Train, save in Hugging Face format to `out_dir`, return the PreTrainedTokenizerFast."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        # a one-letter word is split from its space: "k" is one token wherever it stands, so copying
        # letters (reverse, key lookup) never has to map " k" to "k"
        pre_tokenizers.Split(Regex(r"\b[A-Za-z]\b"), behavior="isolated"),
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.Punctuation(behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus_texts(num_texts, seed), trainer=trainer)
    bos_id = tok.token_to_id(BOS)
    tok.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B",
                                                       special_tokens=[(BOS, bos_id)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=PAD,
                                   additional_special_tokens=SPECIAL_TOKENS[3:], model_max_length=256)
    fast.chat_template = CHAT_TEMPLATE
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(out_dir)
    return fast


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--vocab-size", type=int, default=DEFAULT_VOCAB)
    p.add_argument("--num-texts", type=int, default=20000)
    p.add_argument("--seed", type=int, default=TRAIN_SEED)
    a = p.parse_args()
    tok = train_tokenizer(a.out, a.vocab_size, a.num_texts, a.seed)
    print(f"tokenizer: {len(tok)} tokens -> {a.out}")


if __name__ == "__main__":
    main()
