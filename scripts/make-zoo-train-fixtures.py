#!/usr/bin/env python3
"""Tiny random models of the model-zoo architectures with one step's loss and gradients and a
10-step AdamW loss curve, for tinynn-train's PyTorch parity tests — the same files and rules as
scripts/make-train-fixtures.py (which makes the Llama family's):

    venv/bin/python scripts/make-zoo-train-fixtures.py crates/tinynn-train/tests/fixtures [NAME...]

For each model writes `<name>/`: config.json + model.safetensors (f32, seeded random init),
grads.safetensors (the gradient of the mean cross-entropy of the fixed batch with respect to
every parameter, under GGUF tensor names, PyTorch shapes), and expected.json (ids, labels with
-100 = not scored, batch, seq, the loss, and the losses of 10 AdamW steps on the same batch:
lr 1e-3, betas 0.9/0.999, eps 1e-8, weight decay 0.01 on every parameter, no clipping; each
loss measured before its step's update). The sliding windows are shorter than the sequence.
"""
import json
import os
import sys

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from transformers import (Gemma2Config, Gemma2ForCausalLM, Gemma3ForCausalLM, Gemma3TextConfig,
                          GemmaConfig, GemmaForCausalLM, GPT2Config, GPT2LMHeadModel,
                          GPTNeoXConfig, GPTNeoXForCausalLM, MambaConfig, MambaForCausalLM,
                          MixtralConfig, MixtralForCausalLM, Phi3Config, Phi3ForCausalLM)

out_root = sys.argv[1]
BATCH, SEQ, VOCAB = 2, 16, 256

common = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=96,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=64,
    rms_norm_eps=1e-6,
    hidden_activation="gelu_pytorch_tanh",
    query_pre_attn_scalar=16,
    sliding_window=5,
    initializer_range=0.1,
    tie_word_embeddings=True,
    torch_dtype="float32",
)
gemma1 = {k: v for k, v in common.items() if k not in ("query_pre_attn_scalar", "sliding_window")}
models = {
    # Embeddings x sqrt(d), GeGLU, 1 + w norms, no post norms, no window.
    "train-gemma": (GemmaConfig(**gemma1, num_hidden_layers=2, rope_theta=10000.0), GemmaForCausalLM),
    # Soft-capped attention and logits; a window layer then a global one.
    "train-gemma2": (Gemma2Config(**common, num_hidden_layers=2, rope_theta=10000.0,
                                  attn_logit_softcapping=5.0, final_logit_softcapping=8.0,
                                  layer_types=["sliding_attention", "full_attention"]),
                     Gemma2ForCausalLM),
    # q/k norms; window layers with their own RoPE base.
    "train-gemma3": (Gemma3TextConfig(**common, num_hidden_layers=2,
                                      layer_types=["sliding_attention", "full_attention"],
                                      rope_parameters={
                                          "full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
                                          "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}),
                     Gemma3ForCausalLM),
    # Learned positions, LayerNorm with biases, fused c_attn, tanh GELU, tied head; no dropout.
    "train-gpt2": (GPT2Config(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=64,
                              activation_function="gelu_new", layer_norm_epsilon=1e-5,
                              initializer_range=0.1, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                              bos_token_id=1, eos_token_id=2, torch_dtype="float32"),
                   GPT2LMHeadModel),
    # Parallel residual, RoPE on a quarter of each head, q/k/v interleaved per head, exact GELU.
    "train-gptneox": (GPTNeoXConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2,
                                    num_attention_heads=4, intermediate_size=96,
                                    max_position_embeddings=64, rotary_pct=0.25,
                                    rotary_emb_base=10000, layer_norm_eps=1e-5,
                                    use_parallel_residual=True, hidden_act="gelu",
                                    initializer_range=0.1, hidden_dropout=0.0, attention_dropout=0.0,
                                    tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
                                    torch_dtype="float32"),
                      GPTNeoXForCausalLM),
    # Fused q/k/v and gate/up projections, a 5-token window on every layer.
    "train-phi3": (Phi3Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                              original_max_position_embeddings=64, rms_norm_eps=1e-5, rope_theta=10000.0,
                              sliding_window=5, initializer_range=0.1, resid_pdrop=0.0, embd_pdrop=0.0,
                              attention_dropout=0.0, tie_word_embeddings=False, bos_token_id=1,
                              eos_token_id=2, pad_token_id=0, torch_dtype="float32"),
                   Phi3ForCausalLM),
    # A mixture of experts: 4 experts a block, 2 per token; the router learns through the
    # chosen experts' renormalized weights.
    "train-mixtral": (MixtralConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=96,
                                    num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                    num_local_experts=4, num_experts_per_tok=2,
                                    max_position_embeddings=64, rms_norm_eps=1e-5, rope_theta=10000.0,
                                    sliding_window=None, initializer_range=0.1, router_jitter_noise=0.0,
                                    tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
                                    torch_dtype="float32"),
                      MixtralForCausalLM),
    # A state-space model: a causal convolution and a selective scan, no attention; the
    # gradients of A are those of A_log (transformers' parameter).
    "train-mamba": (MambaConfig(vocab_size=VOCAB, hidden_size=64, state_size=8, num_hidden_layers=2,
                                conv_kernel=4, expand=2, time_step_rank=4, layer_norm_epsilon=1e-5,
                                use_bias=False, use_conv_bias=True, tie_word_embeddings=True,
                                bos_token_id=1, eos_token_id=2, pad_token_id=0,
                                torch_dtype="float32"),
                    MambaForCausalLM),
}

MAMBA_FIXED = {"backbone.embeddings.weight": "token_embd.weight", "backbone.norm_f.weight": "output_norm.weight",
               "lm_head.weight": "output.weight"}
MAMBA_MODULES = {"norm": "attn_norm", "mixer.in_proj": "ssm_in", "mixer.conv1d": "ssm_conv1d",
                 "mixer.x_proj": "ssm_x", "mixer.dt_proj": "ssm_dt", "mixer.out_proj": "ssm_out"}


def gguf_name_mamba(hf):
    if hf in MAMBA_FIXED:
        return MAMBA_FIXED[hf]
    parts = hf.split(".")  # backbone.layers.L.<module...>.<kind>
    if parts[-1] in ("A_log", "D"):
        return f"blk.{parts[2]}.ssm_{'a' if parts[-1] == 'A_log' else 'd'}"
    return f"blk.{parts[2]}.{MAMBA_MODULES['.'.join(parts[3:-1])]}.{parts[-1]}"

NEOX_FIXED = {"gpt_neox.embed_in.weight": "token_embd.weight", "embed_out.weight": "output.weight",
              "lm_head.weight": "output.weight",
              "gpt_neox.final_layer_norm.weight": "output_norm.weight",
              "gpt_neox.final_layer_norm.bias": "output_norm.bias"}
NEOX_MODULES = {"input_layernorm": "attn_norm", "attention.query_key_value": "attn_qkv",
                "attention.dense": "attn_output", "post_attention_layernorm": "ffn_norm",
                "mlp.dense_h_to_4h": "ffn_up", "mlp.dense_4h_to_h": "ffn_down"}


def gguf_name_neox(hf):
    if hf in NEOX_FIXED:
        return NEOX_FIXED[hf]
    parts = hf.split(".")  # gpt_neox.layers.L.<module...>.<kind>
    return f"blk.{parts[2]}.{NEOX_MODULES['.'.join(parts[3:-1])]}.{parts[-1]}"


def neox_regroup(grad, n_head):
    # HF interleaves q/k/v per head ([h][q|k|v][d]); GGUF holds all q, then all k, then all v.
    rows = grad.shape[0]
    g = grad.reshape(n_head, 3, rows // (3 * n_head), *grad.shape[1:])
    return g.transpose(0, 1).reshape(grad.shape)

GPT2_FIXED = {"transformer.wte.weight": "token_embd.weight", "transformer.wpe.weight": "position_embd.weight",
              "transformer.ln_f.weight": "output_norm.weight", "transformer.ln_f.bias": "output_norm.bias"}
GPT2_MODULES = {"ln_1": "attn_norm", "attn.c_attn": "attn_qkv", "attn.c_proj": "attn_output", "ln_2": "ffn_norm",
                "mlp.c_fc": "ffn_up", "mlp.c_proj": "ffn_down"}


def gguf_name_gpt2(hf):
    if hf in GPT2_FIXED:
        return GPT2_FIXED[hf]
    parts = hf.split(".")  # transformer.h.L.<module...>.<kind>
    return f"blk.{parts[2]}.{GPT2_MODULES['.'.join(parts[3:-1])]}.{parts[-1]}"


def gguf_name(hf, gemma1):
    fixed = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    if hf in fixed:
        return fixed[hf]
    parts = hf.split(".")  # model.layers.L.<module...>.<kind>
    layer, module, kind = parts[2], ".".join(parts[3:-1]), parts[-1]
    table = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
             "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
             "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
             "post_attention_layernorm": "post_attention_norm",
             "pre_feedforward_layernorm": "ffn_norm", "post_feedforward_layernorm": "post_ffw_norm",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
             "self_attn.qkv_proj": "attn_qkv", "mlp.gate_up_proj": "ffn_up"}
    if gemma1:  # Gemma's (and Phi-3's, Mixtral's) one norm after attention is the feed-forward's input norm
        table["post_attention_layernorm"] = "ffn_norm"
    return f"blk.{layer}.{table[module]}.{kind}"


def mixtral_grads(n, grad, ff):
    """Gradients of transformers' fused Mixtral experts under the GGUF names of their parts:
    gate_up_proj [n_expert, 2·ff, e] holds each expert's gate rows, then its up rows."""
    if not n.startswith("model.layers."):
        return None
    blk = f"blk.{n.split('.')[2]}."
    if n.endswith("mlp.experts.gate_up_proj"):
        return {blk + "ffn_gate_exps.weight": grad[:, :ff, :], blk + "ffn_up_exps.weight": grad[:, ff:, :]}
    if n.endswith("mlp.experts.down_proj"):
        return {blk + "ffn_down_exps.weight": grad}
    if n.endswith("mlp.gate.weight"):
        return {blk + "ffn_gate_inp.weight": grad}
    return None


def loss_of(model, ids, labels):
    logits = model(input_ids=ids).logits
    return F.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1), ignore_index=-100)


only = sys.argv[2:]  # names to make (default: all)
for name, (config, cls) in models.items():
    if only and name not in only:
        continue
    torch.manual_seed(1234)
    model = cls(config).float().eval()
    # Gemma's norms multiply by 1 + w and start at w = 0; move them off 0. GPT-2's
    # LayerNorms (weight 1, bias 0) and biases (0) move off their starting values too.
    gpt2, neox = name == "train-gpt2", name == "train-gptneox"
    mamba = name == "train-mamba"
    with torch.no_grad():
        for n, p in model.named_parameters():
            if mamba and "norm" in n:
                p.uniform_(0.5, 1.5)
            elif mamba and n.endswith((".D", ".conv1d.bias")):
                p.normal_(0.0, 0.3)
            elif neox and "layernorm" in n or neox and "layer_norm" in n:
                p.uniform_(0.5, 1.5) if n.endswith(".weight") else p.normal_(0.0, 0.1)
            elif "norm" in n:
                p.uniform_(-0.5, 0.5)
            elif gpt2 and ".ln_" in n and n.endswith(".weight"):
                p.uniform_(0.5, 1.5)
            elif (gpt2 or neox) and n.endswith(".bias"):
                p.normal_(0.0, 0.1)
    out = os.path.join(out_root, name)
    os.makedirs(out, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    if name == "train-mixtral":
        # The checkpoint keeps transformers' per-expert w1 (gate) / w3 (up) / w2 (down): check
        # they are the parts the gradients are named after.
        from safetensors.torch import load_file
        saved = load_file(os.path.join(out, "model.safetensors"))
        ff = config.intermediate_size
        gu = model.model.layers[0].mlp.experts.gate_up_proj
        assert torch.equal(saved["model.layers.0.block_sparse_moe.experts.1.w1.weight"], gu[1, :ff])
        assert torch.equal(saved["model.layers.0.block_sparse_moe.experts.1.w3.weight"], gu[1, ff:])
    for extra in ("generation_config.json",):
        if os.path.exists(os.path.join(out, extra)):
            os.remove(os.path.join(out, extra))

    g = torch.Generator().manual_seed(99)
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=g)
    ids, labels = tokens[:, :-1].contiguous(), tokens[:, 1:].clone()
    labels[0, :3] = -100  # a few positions not scored
    labels[1, 7] = -100

    model.zero_grad()
    loss = loss_of(model, ids, labels)
    loss.backward()
    grads = {}
    for n, p in model.named_parameters():
        grad = p.grad.detach().clone()
        if mamba:
            grads[gguf_name_mamba(n)] = grad.contiguous()
        elif neox:
            if "query_key_value" in n:
                grad = neox_regroup(grad, config.num_attention_heads)
            grads[gguf_name_neox(n)] = grad.contiguous()
        elif gpt2:
            # HF Conv1D weights are [in, out]; GGUF's (PyTorch-shaped) are [out, in].
            if grad.dim() == 2 and any(n.endswith(m + ".weight") for m in (".c_attn", ".c_proj", ".c_fc")):
                grad = grad.t()
            grads[gguf_name_gpt2(n)] = grad.contiguous()
        elif name == "train-mixtral" and mixtral_grads(n, grad, config.intermediate_size):
            for k, v in mixtral_grads(n, grad, config.intermediate_size).items():
                grads[k] = v.contiguous()
        else:
            grads[gguf_name(n, name in ("train-gemma", "train-phi3", "train-mixtral"))] = grad.contiguous()
    save_file(grads, os.path.join(out, "grads.safetensors"))

    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    losses = []
    for _ in range(10):
        opt.zero_grad()
        l = loss_of(model, ids, labels)
        l.backward()
        opt.step()
        losses.append(l.item())

    with open(os.path.join(out, "expected.json"), "w") as f:
        json.dump({"batch": BATCH, "seq": SEQ, "ids": ids.flatten().tolist(),
                   "labels": labels.flatten().tolist(), "loss": loss.item(), "adamw_losses": losses,
                   "torch": torch.__version__}, f, indent=1)
    print(name, loss.item(), losses[-1])
