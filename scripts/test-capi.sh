#!/usr/bin/env bash
# The C ABI from C and Ruby: builds libtinynn (.so and .a), compiles tests/c/*.c with cc
# against include/tinynn.h, and checks on the default model that
#  - the C API's greedy text equals `tnn run`'s (shared and static library);
#  - tests/c/api.c's contract checks pass (with an adapter `tnn finetune --lora` makes);
#  - tests/c/train.c trains (LoRA on the default model: loss falls, resume is bit for bit, the
#    adapter loads; full fine-tuning of the tiny Llama fixture, exported and reopened);
#  - tests/c/graph.c builds, trains and runs graphs (an MLP to a loss threshold, ops against
#    values computed in C, a model's tensor as a leaf);
#  - a run under valgrind --leak-check=full has 0 errors and 0 definitely lost bytes;
#  - Ruby through ruby-ffi gets the same text.
# Installs Debian's gcc, valgrind, ruby and ruby-ffi when missing.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v cc >/dev/null || need+=(gcc libc6-dev)
command -v valgrind >/dev/null || need+=(valgrind)
command -v ruby >/dev/null || need+=(ruby)
ruby -e 'require "ffi"' 2>/dev/null || need+=(ruby-ffi)
if ((${#need[@]})); then
    echo "installing ${need[*]} (Debian packages)"
    sudo=""
    [[ "$(id -u)" == 0 ]] || sudo=sudo
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}" >/dev/null
fi

target="${CARGO_TARGET_DIR:-target}"
cargo build --release --quiet -p tinynn-capi
cargo build --release --quiet --bin tnn
lib="$(cd "$target/release" && pwd)"
out="$target/capi-tests"
mkdir -p "$out"
inc=crates/tinynn-capi/include
cflags=(-std=c11 -O2 -Wall -Wextra -Werror -pedantic -I "$inc")
cc "${cflags[@]}" tests/c/generate.c -L "$lib" -ltinynn -Wl,-rpath,"$lib" -o "$out/generate"
cc "${cflags[@]}" tests/c/generate.c "$lib/libtinynn.a" -lpthread -ldl -lm -o "$out/generate-static"
cc "${cflags[@]}" tests/c/api.c -L "$lib" -ltinynn -Wl,-rpath,"$lib" -lm -o "$out/api"
cc "${cflags[@]}" tests/c/train.c -L "$lib" -ltinynn -Wl,-rpath,"$lib" -lm -o "$out/train"
cc "${cflags[@]}" tests/c/graph.c -L "$lib" -ltinynn -Wl,-rpath,"$lib" -lm -o "$out/graph"

tnn="$target/release/tnn"
model="$("$tnn" list | sed -n 's/^cache: //p')/SmolLM2-135M-Instruct.Q4_1.gguf"
[[ -f "$model" ]] || { echo "the default model is missing ($model): run tnn pull smollm2"; exit 1; }
prompt="The capital of France is"
want="$("$tnn" run -m "$model" -p "$prompt" -n 32 --temp 0 --ignore-eos --no-display-prompt -t 2 2>/dev/null)"
for exe in generate generate-static; do
    got="$("$out/$exe" "$model" "$prompt" 32 2 2>/dev/null)"
    if [[ "$got" != "$want" ]]; then
        printf 'C API (%s) text differs from tnn run:\n--- tnn run\n%s\n--- C\n%s\n' "$exe" "$want" "$got"
        exit 1
    fi
done
echo "C API greedy text = tnn run's (shared and static): $want"

adapter_dir="$(mktemp -d)"
trap 'rm -rf "$adapter_dir"' EXIT
head -c 4000 /usr/share/common-licenses/GPL-3 >"$adapter_dir/data.txt"
"$tnn" finetune -m "$model" --data "$adapter_dir/data.txt" --lora --seq 32 --batch 1 --steps 2 \
    --lr 1e-2 --eval-frac 0 -t 2 --out "$adapter_dir/run" >/dev/null 2>&1
"$out/api" "$model" "$adapter_dir/run/adapter.gguf"
head -c 6000 /usr/share/common-licenses/GPL-3 >"$adapter_dir/text.txt"
"$tnn" convert crates/tinynn-models/tests/fixtures/tiny-llama "$adapter_dir/tiny.gguf" F32 >/dev/null 2>&1
"$out/train" "$model" "$adapter_dir/text.txt" "$adapter_dir" "$adapter_dir/tiny.gguf"
"$out/graph" "$model"

valgrind --quiet --leak-check=full --errors-for-leak-kinds=definite --error-exitcode=3 \
    "$out/generate" "$model" "$prompt" 4 1 >"$adapter_dir/vg.out" 2>"$adapter_dir/vg.err" || {
    cat "$adapter_dir/vg.err"
    echo "valgrind found errors or definite leaks"
    exit 1
}
echo "valgrind: 0 errors, 0 definitely lost ($(head -c 60 "$adapter_dir/vg.out"))"

got="$(ruby tests/ruby/generate.rb "$lib/libtinynn.so" "$model" "$prompt" 32)"
if [[ "$got" != "$want" ]]; then
    printf 'Ruby text differs from tnn run:\n--- tnn run\n%s\n--- Ruby\n%s\n' "$want" "$got"
    exit 1
fi
echo "Ruby (ruby-ffi) text = tnn run's"
