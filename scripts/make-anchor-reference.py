#!/usr/bin/env python3
"""Regenerates the PyTorch numbers `crates/tinynn-train/tests/smollm2_anchor.rs` holds: full
fine-tuning of SmolLM2-135M (the default Q4_1 file dequantized to f32 by transformers) on the
anchor's recipe, and the loss at step 1, at step 20, and of the first batch re-scored after 20
steps.

    python scripts/make-anchor-reference.py --tnn target/release/tnn [--labels shifted|next]
        [--steps 20] [--model GGUF]

The ids are tinynn's (`tnn tokenize --ids --no-bos`, equal to llama.cpp's on all of GPL-3):
transformers' own GGUF tokenizer splits some whitespace runs differently (see
`smollm2_tokenizer.rs`), which moves every loss. Recipe (as the test's header states it): GPL-3's
tokens without BOS, seq 256, batch 4, row j of
step s at ((s*4+j)*256) mod (N-256), AdamW lr 1e-4, betas 0.9/0.999, eps 1e-8, weight decay 0.01,
f32, 2 threads. `--labels shifted` (the default, the test's default): transformers' own loss,
`model(input_ids=x, labels=x)`, which scores 255 of 256 positions per row; `next`: all 256 next
tokens (the test's `TINYNN_ANCHOR_LABELS=next`). The committed numbers: torch 2.15.0 (CPU), transformers
5.24, gguf 0.21 on this project's development machine; rerun on 2026-12-03 they came out the
same to the printed digits (3.19496, 2.02061, 1.64784).

Needs torch, transformers and gguf: install them only where you regenerate; tinynn's tests never
run this.
"""
import argparse
import json
import os
import subprocess

import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM

SEQ, BATCH = 256, 4


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--labels", choices=["shifted", "next"], default="shifted")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--model",
        default=os.path.expanduser("~/.cache/tinynn/models/SmolLM2-135M-Instruct.Q4_1.gguf"),
    )
    ap.add_argument("--data", default="/usr/share/common-licenses/GPL-3")
    ap.add_argument("--tnn", required=True, help="a tnn binary, to tokenize as llama.cpp does")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    d, f = os.path.split(a.model)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32)
    model.train()
    out = subprocess.run([a.tnn, "tokenize", "-m", a.model, "-f", a.data, "--ids", "--no-bos"],
                         capture_output=True, check=True, text=True).stdout
    ids = json.loads(out)
    n = len(ids)

    def batch(s):
        rows = [((s * BATCH + j) * SEQ) % (n - SEQ) for j in range(BATCH)]
        x = torch.tensor([ids[p : p + SEQ] for p in rows])
        y = torch.tensor([ids[p + 1 : p + SEQ + 1] for p in rows])
        return x, y

    def loss_of(x, y):
        if a.labels == "shifted":
            return model(input_ids=x, labels=x).loss
        logits = model(input_ids=x).logits
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))

    opt = torch.optim.AdamW(
        model.parameters(), lr=1e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01
    )
    losses = []
    for s in range(a.steps):
        x, y = batch(s)
        opt.zero_grad(set_to_none=True)
        loss = loss_of(x, y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    with torch.no_grad():
        rescored = loss_of(*batch(0)).item()
    print(json.dumps({
        "labels": a.labels,
        "tokens": n,
        "step_1": round(losses[0], 5),
        f"step_{a.steps}": round(losses[-1], 5),
        "first_batch_rescored": round(rescored, 5),
        "losses": [round(v, 5) for v in losses],
        "torch": torch.__version__,
    }))


if __name__ == "__main__":
    main()
