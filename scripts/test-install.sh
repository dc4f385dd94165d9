#!/usr/bin/env bash
# `cargo install --path crates/tinynn-cli` works and the installed `tnn` runs from any directory,
# knowing nothing of the source tree: from /, with an empty model cache of its own, it fetches
# the default model and generates text. Prints a closing line: '1 passed, 0 failed'.
set -euo pipefail
cd "$(dirname "$0")/.."
repo="$PWD"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# The workspace's target folder is reused, so only what differs is rebuilt.
cargo install --quiet --locked --path crates/tinynn-cli --root "$work/root" --target-dir "${CARGO_TARGET_DIR:-$repo/target}"
bin="$work/root/bin/tnn"

fail() { echo "install test: $*" >&2; echo "0 passed, 1 failed"; exit 1; }

cd /
"$bin" --version | grep -q '^tnn ' || fail "tnn --version"
out="$(TINYNN_CACHE="$work/cache" "$bin" run -p "The capital of France is" -n 6 --temp 0 -t 2 2>"$work/err")" \
    || { cat "$work/err" >&2; fail "tnn run from / exited non-zero"; }
case "$out" in
  "The capital of France is Paris"*) ;;
  *) cat "$work/err" >&2; fail "unexpected text: $out" ;;
esac
grep -q "model ready" "$work/err" || fail "the default model was not fetched into the new cache"
TINYNN_CACHE="$work/cache" "$bin" list | grep -q '^smollm2 .* cached ' || fail "tnn list"
echo "install test: installed tnn ran from / and wrote: $out"
echo "1 passed, 0 failed"
