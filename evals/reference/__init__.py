"""The reference models: a synthetic corpus, their tokenizer and training scripts, the trained weights."""
