#!/usr/bin/env python3
"""Tiny random transformers models of the model-zoo architectures and their logits, for
tinynn's strict-mode reference tests (the Llama family's are made by make-torch-fixtures.py).

    python3 -m venv venv && venv/bin/pip install torch transformers safetensors
    venv/bin/python scripts/make-zoo-fixtures.py crates/tinynn-models/tests/fixtures [NAME...]

For each config below, writes `<name>/` with config.json and model.safetensors (f32, seeded
random init) and `<name>/logits.json` with the token ids fed and transformers' f32 logits for
every position. The sliding windows are shorter than the 14 tokens fed, so they bite (Gemma 2,
Gemma 3, and Mistral's on every layer).
"""
import json
import os
import sys

import torch
from transformers import (Gemma2Config, Gemma2ForCausalLM, Gemma3ForCausalLM, Gemma3TextConfig,
                          GemmaConfig, GemmaForCausalLM, GPT2Config, GPT2LMHeadModel,
                          GPTNeoXConfig, GPTNeoXForCausalLM, MambaConfig, MambaForCausalLM,
                          MistralConfig, MistralForCausalLM,
                          MixtralConfig, MixtralForCausalLM, Phi3Config, Phi3ForCausalLM)

out_root = sys.argv[1]
TOKENS = [1, 17, 42, 5, 63, 8, 31, 2, 40, 11, 26, 9, 300, 257]

common = dict(
    vocab_size=320,
    hidden_size=32,
    intermediate_size=48,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=128,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
    hidden_activation="gelu_pytorch_tanh",
    torch_dtype="float32",
)

models = {
    "tiny-gemma": (GemmaConfig(**{**common, "num_hidden_layers": 2, "rope_theta": 10000.0}),
                   GemmaForCausalLM),
    # Soft-capped attention and logits; every other layer in a 4-token window.
    "tiny-gemma2": (Gemma2Config(**{**common, "num_hidden_layers": 2, "rope_theta": 10000.0,
                                    "sliding_window": 4, "query_pre_attn_scalar": 16,
                                    "attn_logit_softcapping": 5.0, "final_logit_softcapping": 3.0,
                                    "layer_types": ["sliding_attention", "full_attention"]}),
                    Gemma2ForCausalLM),
    # q/k norms; two window layers (local RoPE base) then a global one (its own base).
    "tiny-gemma3": (Gemma3TextConfig(**{**common, "num_hidden_layers": 3, "sliding_window": 4,
                                        "query_pre_attn_scalar": 16,
                                        "layer_types": ["sliding_attention", "sliding_attention",
                                                        "full_attention"],
                                        "rope_parameters": {
                                            "full_attention": {"rope_type": "default",
                                                               "rope_theta": 1000000.0},
                                            "sliding_attention": {"rope_type": "default",
                                                                  "rope_theta": 10000.0}}}),
                    Gemma3ForCausalLM),
    # Mistral's sliding window on every layer (4 tokens, so it bites within the 14 fed).
    "tiny-mistral-swa": (MistralConfig(vocab_size=320, hidden_size=32, intermediate_size=48,
                                       num_hidden_layers=2, num_attention_heads=4,
                                       num_key_value_heads=2, max_position_embeddings=128,
                                       rms_norm_eps=1e-5, rope_theta=10000.0, sliding_window=4,
                                       tie_word_embeddings=False, torch_dtype="float32"),
                         MistralForCausalLM),
    # Learned positions, LayerNorm with biases, fused c_attn (HF Conv1D: weights stored
    # [in, out]), tanh GELU, tied head.
    "tiny-gpt2": (GPT2Config(vocab_size=320, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                             activation_function="gelu_new", layer_norm_epsilon=1e-5,
                             bos_token_id=1, eos_token_id=2,
                             torch_dtype="float32"),
                  GPT2LMHeadModel),
    # Parallel residual, RoPE on a quarter of each head, q/k/v fused and interleaved per head,
    # LayerNorm with biases, exact GELU, untied head.
    "tiny-gptneox": (GPTNeoXConfig(vocab_size=320, hidden_size=32, num_hidden_layers=2,
                                   num_attention_heads=4, intermediate_size=64,
                                   max_position_embeddings=64, rotary_pct=0.25,
                                   rotary_emb_base=10000, layer_norm_eps=1e-5,
                                   use_parallel_residual=True, hidden_act="gelu",
                                   tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
                                   torch_dtype="float32"),
                     GPTNeoXForCausalLM),
    # Fused q/k/v and gate/up projections, a 4-token sliding window on every layer, untied head.
    "tiny-phi3": (Phi3Config(vocab_size=320, hidden_size=32, intermediate_size=48,
                             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                             max_position_embeddings=128, original_max_position_embeddings=128,
                             rms_norm_eps=1e-5, rope_theta=10000.0, sliding_window=4,
                             tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
                             pad_token_id=0, torch_dtype="float32"),
                  Phi3ForCausalLM),
    # LongRoPE: short factors up to 16 tokens, long ones past them (logits_long.json feeds 24
    # tokens, so transformers switches to the long factors), cos/sin scaled by
    # sqrt(1 + ln 4 / ln 16); no window.
    "tiny-phi3-longrope": (Phi3Config(vocab_size=320, hidden_size=32, intermediate_size=48,
                                      num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, max_position_embeddings=64,
                                      original_max_position_embeddings=16, rms_norm_eps=1e-5,
                                      rope_theta=10000.0,
                                      rope_scaling={"type": "longrope",
                                                    "short_factor": [1.0, 1.3, 2.1, 3.7],
                                                    "long_factor": [1.1, 2.9, 6.5, 11.0]},
                                      sliding_window=None, tie_word_embeddings=False,
                                      bos_token_id=1, eos_token_id=2, pad_token_id=0,
                                      torch_dtype="float32"),
                           Phi3ForCausalLM),
    # A mixture of experts: 4 experts a block, each token routed to 2 (softmax over all,
    # renormalized over the chosen); per-expert matrices in the checkpoint; no window.
    "tiny-mixtral": (MixtralConfig(vocab_size=320, hidden_size=32, intermediate_size=48,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, num_local_experts=4,
                                   num_experts_per_tok=2, max_position_embeddings=128,
                                   rms_norm_eps=1e-5, rope_theta=10000.0, sliding_window=None,
                                   tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
                                   torch_dtype="float32"),
                     MixtralForCausalLM),
    # A state-space model: no attention; a width-4 causal convolution and a selective scan
    # with 8 states per channel over 64 channels; biases on the convolution and the time step.
    "tiny-mamba": (MambaConfig(vocab_size=320, hidden_size=32, state_size=8, num_hidden_layers=2,
                               conv_kernel=4, expand=2, time_step_rank=6, layer_norm_epsilon=1e-5,
                               use_bias=False, use_conv_bias=True, tie_word_embeddings=True,
                               bos_token_id=1, eos_token_id=2, pad_token_id=0,
                               torch_dtype="float32"),
                   MambaForCausalLM),
}
LONG_TOKENS = TOKENS + [77, 3, 150, 12, 9, 210, 44, 5, 61, 18]

only = sys.argv[2:]  # names to make (default: all)
for name, (config, cls) in models.items():
    if only and name not in only:
        continue
    torch.manual_seed(1234)
    model = cls(config).eval()
    # Random init is small; scale weights up so logits are not all near zero. Gemma's norms
    # multiply by 1 + w, so their w stays around 0; Mistral's multiply by w.
    gemma = name.startswith("tiny-gemma")
    with torch.no_grad():
        for n, p in model.named_parameters():
            if ("norm" in n or ".ln_" in n) and n.endswith(".weight") and "mixer" not in n:
                p.uniform_(-0.5, 0.5) if gemma else p.uniform_(0.5, 1.5)
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
    if name == "tiny-phi3-longrope":
        with torch.no_grad():
            long_logits = model(torch.tensor([LONG_TOKENS])).logits[0]
        with open(os.path.join(d, "logits_long.json"), "w") as f:
            json.dump({"tokens": LONG_TOKENS, "logits": long_logits.tolist()}, f)
