"""The text models the benchmark runs: file, params type, vocabulary, heads, AdamW settings
(as their train_step passes them to adam), and whether the model takes labels."""
MODELS = {
    "bert": dict(file="examples/bert.rag", ptype="Bert", vocab=30522, heads=2, layers=2,
                 labels=True, b2=0.999, wd=0.01, causal=False),
    "bert_small": dict(file="bench/text/bert_small.rag", ptype="Bert", vocab=30522, heads=8,
                       layers=4, labels=True, b2=0.999, wd=0.01, causal=False),
    "gpt": dict(file="examples/gpt.rag", ptype="Gpt", vocab=4096, heads=4, layers=2,
                labels=False, b2=0.95, wd=0.1, causal=True),
}
LR = 1e-3
