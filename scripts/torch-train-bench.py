#!/usr/bin/env python3
"""PyTorch's side of the training benchmark (issue 6's table): tokens/s and peak RSS of
SmolLM2-135M fine-tuning steps on the same recipe tinynn runs, one mode per process.

  python scripts/torch-train-bench.py MODE [--steps N] [--threads T] [--model GGUF] [--data FILE]

MODE: full (f32), bf16 (f32 weights, CPU autocast to bf16), lora (peft, r=8, alpha=16,
dropout 0.05 on q_proj,v_proj, f32). The model is the GGUF file dequantized to f32 by
transformers; batches are seq 256 x batch 4 from the data file's tokens (no BOS), row j of
step s at ((s*4+j)*256) % (N-256); AdamW lr 1e-4, betas 0.9/0.999, eps 1e-8, weight decay
0.01. The first step is a warm-up; tokens/s is over the steps after it. Prints one JSON line.

Needs torch, transformers, gguf (and peft for lora): install them only where you benchmark;
tinynn's tests never run this.
"""
import argparse
import json
import os
import resource
import time

import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, AutoTokenizer

SEQ, BATCH = 256, 4


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["full", "bf16", "lora"])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--model",
        default=os.path.expanduser(
            "~/.cache/tinynn/models/SmolLM2-135M-Instruct.Q4_1.gguf"
        ),
    )
    ap.add_argument("--data", default="/usr/share/common-licenses/GPL-3")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    d, f = os.path.split(a.model)
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32)
    if a.mode == "lora":
        from peft import LoraConfig, get_peft_model

        cfg = LoraConfig(
            r=8,
            lora_alpha=16,
            lora_dropout=0.05,
            target_modules=["q_proj", "v_proj"],
            task_type="CAUSAL_LM",
        )
        model = get_peft_model(model, cfg)
    model.train()
    ids = tok(open(a.data).read(), add_special_tokens=False).input_ids
    n = len(ids)

    def batch(s):
        rows = [((s * BATCH + j) * SEQ) % (n - SEQ) for j in range(BATCH)]
        x = torch.tensor([ids[p : p + SEQ] for p in rows])
        y = torch.tensor([ids[p + 1 : p + SEQ + 1] for p in rows])
        return x, y

    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(
        params, lr=1e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01
    )
    times, losses = [], []
    for s in range(a.steps):
        x, y = batch(s)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.mode == "bf16"):
            logits = model(input_ids=x).logits
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1))
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())
    steady = times[1:] if len(times) > 1 else times
    tps = SEQ * BATCH * len(steady) / sum(steady)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(
        json.dumps(
            {
                "mode": a.mode,
                "threads": a.threads,
                "tokens_per_s": round(tps, 1),
                "peak_rss_gib": round(rss / 2**30, 3),
                "step_s": [round(t, 3) for t in times],
                "losses": [round(v, 4) for v in losses],
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
