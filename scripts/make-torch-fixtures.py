#!/usr/bin/env python3
"""Tiny random transformers models and their logits, for tinynn's strict-mode model tests.

    python3 -m venv venv && venv/bin/pip install torch transformers safetensors
    venv/bin/python scripts/make-torch-fixtures.py crates/tinynn-models/tests/fixtures

For each of a Llama, a Qwen2 (q/k/v biases), a Qwen3 (q/k norms) and a Llama-3-scaled config, writes `<name>/` with config.json and
model.safetensors (f32, seeded random init), and `<name>/logits.json` with the token ids fed and
transformers' f32 logits for every position. The outputs are committed; CI needs no PyTorch.
"""
import json
import os
import sys

import torch
from transformers import (LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM,
                          Qwen3Config, Qwen3ForCausalLM)

out_root = sys.argv[1]
TOKENS = [1, 17, 42, 5, 63, 8, 31, 2, 40, 11, 26, 9, 300, 257]

common = dict(
    vocab_size=320,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
    rms_norm_eps=1e-5,
    rope_theta=500000.0,
    tie_word_embeddings=False,
    torch_dtype="float32",
)

llama3_scaling = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                      original_max_position_embeddings=16)
models = {
    "tiny-llama": (LlamaConfig(**common), LlamaForCausalLM),
    "tiny-qwen2": (Qwen2Config(**common), Qwen2ForCausalLM),
    # q/k RMSNorm per head, head_dim not hidden/heads.
    "tiny-qwen3": (Qwen3Config(**{**common, "head_dim": 16}), Qwen3ForCausalLM),
    # YaRN RoPE scaling with a short original context, so it bites within 14 positions.
    "tiny-llama-yarn": (LlamaConfig(**{**common, "rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                        "original_max_position_embeddings": 32, "rope_theta": 10000.0}}), LlamaForCausalLM),
    # Llama 3 RoPE scaling (frequency divisors), with a short original context so it bites.
    "tiny-llama3": (LlamaConfig(**{**common, "rope_scaling": {**llama3_scaling, "rope_theta": 500000.0}}),
                    LlamaForCausalLM),
}

def train_tokenizer(path):
    """A tiny byte-level BPE (256 bytes + merges + 2 specials = 320 ids) trained on Debian's
    GPL-3 text, saved as tokenizer.json for the Llama fixture."""
    from tokenizers import Tokenizer, decoders, models as tmodels, pre_tokenizers, trainers
    tok = Tokenizer(tmodels.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=["<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train(["/usr/share/common-licenses/GPL-3"], trainer)
    tok.save(path)
    return tok

for name, (config, cls) in models.items():
    torch.manual_seed(1234)
    model = cls(config).eval()
    # Random init is small; scale weights up a little so logits are not all near zero, and give
    # the Qwen2 biases non-zero values.
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith("bias"):
                p.normal_(0.0, 0.5)
            elif "norm" in n:
                p.uniform_(0.5, 1.5)
            else:
                p.normal_(0.0, 0.2)
    d = os.path.join(out_root, name)
    os.makedirs(d, exist_ok=True)
    model.save_pretrained(d, safe_serialization=True)
    with torch.no_grad():
        logits = model(torch.tensor([TOKENS])).logits[0]
    with open(os.path.join(d, "logits.json"), "w") as f:
        json.dump({"tokens": TOKENS, "logits": logits.tolist()}, f)
    print(name, tuple(logits.shape), float(logits.abs().max()))

tok = train_tokenizer(os.path.join(out_root, "tiny-llama", "tokenizer.json"))
print("tokenizer", tok.get_vocab_size(), tok.encode("the license").ids)
