#!/usr/bin/env bash
# Issue 6's training table, tinynn and PyTorch interleaved on this machine:
#   [TNN=path/to/tnn] scripts/train-sxs.sh [STEPS] [PYTHON]
# For each mode (full f32, full bf16, LoRA r=8 q,v on an F32 base, QLoRA on the Q4_1 base)
# it runs `tnn finetune` (seq 256 x batch 4, 2 threads) under /usr/bin/time, then PyTorch's
# scripts/torch-train-bench.py for the same mode when PYTHON (a Python with torch,
# transformers, gguf, peft) is given. tinynn's tokens/s is over the steps after the first
# (from metrics.jsonl), like PyTorch's; peak RSS is the process's maximum resident set.
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${1:-8}
PY=${2:-}
T=2
MODEL=${TINYNN_CACHE:-$HOME/.cache/tinynn}/models/SmolLM2-135M-Instruct.Q4_1.gguf
DATA=/usr/share/common-licenses/GPL-3
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
# TNN=/path/to/tnn compares another build (A/B); by default the tree's own.
if [ -z "${TNN:-}" ]; then
  cargo build --release -q -p tinynn-cli
  TNN=target/release/tnn
fi
[ -f "$MODEL" ] || "$TNN" pull smollm2 >/dev/null
"$TNN" quantize "$MODEL" "$WORK/f32.gguf" F32 --allow-requantize >/dev/null 2>&1

tinynn() { # name, extra args...
  local name=$1
  shift
  rm -rf "$WORK/out"
  /usr/bin/time -f "%M" -o "$WORK/rss" "$TNN" finetune --data "$DATA" --seq 256 --batch 4 \
    --steps "$STEPS" --out "$WORK/out" -t $T --eval-frac 0 "$@" >/dev/null 2>&1
  python3 - "$name" "$WORK/out/metrics.jsonl" "$(cat "$WORK/rss")" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[2])]
steady = (rows[-1]["elapsed_s"] - rows[0]["elapsed_s"]) / (len(rows) - 1)
print(json.dumps({"tinynn": sys.argv[1], "tokens_per_s": round(1024 / steady, 1),
                  "peak_rss_gib": round(int(sys.argv[3]) * 1024 / 2**30, 3),
                  "losses": [round(r["loss"], 4) for r in rows]}))
EOF
}

torch() { # mode
  [ -n "$PY" ] || return 0
  "$PY" scripts/torch-train-bench.py "$1" --steps "$STEPS" --threads $T --model "$MODEL" \
    --data "$DATA" 2>/dev/null | tail -1
}

tinynn full -m "$MODEL"
torch full
tinynn bf16 -m "$MODEL" --bf16
torch bf16
tinynn lora-f32 -m "$WORK/f32.gguf" --lora --rank 8 --alpha 16 --targets q,v
torch lora
tinynn qlora-q4_1 -m "$MODEL" --lora --rank 8 --alpha 16 --targets q,v
