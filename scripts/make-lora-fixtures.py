#!/usr/bin/env python3
"""peft LoRA on every architecture's training fixture, for tinynn-train's LoRA
parity test: one step's loss and the gradient of every adapter tensor.

    venv/bin/pip install torch transformers safetensors peft
    venv/bin/python scripts/make-lora-fixtures.py crates/tinynn-train/tests/fixtures [NAME...]

Reads `<name>/` (config.json + model.safetensors and expected.json, made by
scripts/make-train-fixtures.py and scripts/make-zoo-train-fixtures.py), adapts the projections
tinynn's `--targets all` adapts (Mamba: all but dt, see below) (rank 4, alpha 8, no dropout) with A and B drawn from
normal(0, 0.1) — B not zero, so both get gradients — and writes `<name>/lora.safetensors`:
each adapter tensor under tinynn's name (`blk.L.<stem>.weight.lora_a` / `.lora_b`, PyTorch
shapes [r, in] and [out, r]) and its gradient under the same name + `.grad`; and
`<name>/lora.json` with the loss (the mean cross-entropy of expected.json's batch). GPT-NeoX's
fused q/k/v rows are regrouped as tinynn holds them (all q, then all k, then all v).
"""
import json
import os
import sys

import torch
import torch.nn.functional as F
from peft import LoraConfig, get_peft_model
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM

RANK, ALPHA = 4, 8.0

LLAMA = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
         "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
         "mlp.down_proj": "ffn_down"}
# Per fixture: the HF prefix of the blocks, HF module → GGUF stem.
ARCHS = {
    "train-llama": ("model.layers", LLAMA),
    "train-qwen2-tied": ("model.layers", LLAMA),
    "train-gemma": ("model.layers", LLAMA),
    "train-gemma2": ("model.layers", LLAMA),
    "train-gemma3": ("model.layers", LLAMA),
    # The router (mlp.gate) and the experts are not projections tinynn adapts.
    "train-mixtral": ("model.layers", {k: v for k, v in LLAMA.items() if k.startswith("self_attn")}),
    "train-phi3": ("model.layers", {"self_attn.qkv_proj": "attn_qkv", "self_attn.o_proj": "attn_output",
                                    "mlp.gate_up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}),
    "train-gpt2": ("transformer.h", {"attn.c_attn": "attn_qkv", "attn.c_proj": "attn_output",
                                     "mlp.c_fc": "ffn_up", "mlp.c_proj": "ffn_down"}),
    "train-gptneox": ("gpt_neox.layers", {"attention.query_key_value": "attn_qkv",
                                          "attention.dense": "attn_output",
                                          "mlp.dense_h_to_4h": "ffn_up", "mlp.dense_4h_to_h": "ffn_down"}),
    # transformers computes dt_proj as `weight @ x` (not through the module), so an adapter
    # there would not apply: the fixture adapts the other three (tinynn `--targets in,x,out`).
    "train-mamba": ("backbone.layers", {"mixer.in_proj": "ssm_in", "mixer.x_proj": "ssm_x",
                                        "mixer.out_proj": "ssm_out"}),
}
# tinynn's `--targets` for each fixture (default: all).
TARGETS = {"train-mamba": "in,x,out"}


# peft refuses LoRA on Mamba's out_proj because the CUDA kernels read its weight directly; on
# the CPU path transformers calls the module, so the adapter applies as written. tinynn (and
# llama.cpp's Mamba graph) adapt it, so the check is lifted here.
import peft.tuners.tuners_utils as _tu  # noqa: E402
import peft.tuners.lora.model as _lm  # noqa: E402
for _m in (_tu, _lm):
    if hasattr(_m, "_check_lora_target_modules_mamba"):
        _m._check_lora_target_modules_mamba = lambda *a, **k: None


def neox_regroup(t, n_head):
    # HF interleaves q/k/v per head ([h][q|k|v][d]); GGUF holds all q, then all k, then all v.
    rows = t.shape[0]
    g = t.reshape(n_head, 3, rows // (3 * n_head), *t.shape[1:])
    return g.transpose(0, 1).reshape(t.shape)


out_root = sys.argv[1]
only = sys.argv[2:]
for name, (prefix, modules) in ARCHS.items():
    if only and name not in only:
        continue
    d = os.path.join(out_root, name)
    with open(os.path.join(d, "expected.json")) as f:
        e = json.load(f)
    model = AutoModelForCausalLM.from_pretrained(d, torch_dtype=torch.float32).eval()
    vocab = model.config.vocab_size
    # Module names of the blocks: `<prefix>.L.<module>`; peft matches the suffixes.
    targets = [f"{prefix}.{l}.{m}" for l in range(model.config.num_hidden_layers) for m in modules]
    cfg = LoraConfig(r=RANK, lora_alpha=ALPHA, lora_dropout=0.0, target_modules=targets,
                     fan_in_fan_out=name == "train-gpt2", bias="none")
    model = get_peft_model(model, cfg)
    torch.manual_seed(7)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_" in n:
                p.normal_(0.0, 0.1)
    ids = torch.tensor(e["ids"]).reshape(e["batch"], e["seq"])
    labels = torch.tensor(e["labels"]).reshape(e["batch"], e["seq"])
    logits = model(input_ids=ids).logits
    loss = F.cross_entropy(logits.reshape(-1, vocab), labels.reshape(-1), ignore_index=-100)
    loss.backward()
    out = {}
    for n, p in model.named_parameters():
        if "lora_" not in n:
            continue
        # base_model.model.<prefix>.L.<module>.lora_A.default.weight
        rest = n[len("base_model.model." + prefix) + 1:]
        layer, rest = rest.split(".", 1)
        module, kind = rest.split(".lora_")
        kind = "lora_a" if kind.startswith("A") else "lora_b"
        key = f"blk.{layer}.{modules[module]}.weight.{kind}"
        value, grad = p.detach().clone(), p.grad.detach().clone()
        if name == "train-gptneox" and module == "attention.query_key_value" and kind == "lora_b":
            value = neox_regroup(value, model.config.num_attention_heads)
            grad = neox_regroup(grad, model.config.num_attention_heads)
        out[key] = value.contiguous()
        out[key + ".grad"] = grad.contiguous()
    save_file(out, os.path.join(d, "lora.safetensors"))
    with open(os.path.join(d, "lora.json"), "w") as f:
        json.dump({"rank": RANK, "alpha": ALPHA, "loss": loss.item(), "tensors": len(out) // 2,
                   "targets": TARGETS.get(name, "all")}, f, indent=1)
    print(name, loss.item(), len(out) // 2, "adapter tensors")
