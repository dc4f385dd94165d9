#!/usr/bin/env bash
# The Python package: `pip install ./python` (maturin builds the extension against the
# workspace's target directory) into a venv under the target directory, then pytest on
# python/tests (the default model, the tiny fixtures, `tnn` for reference text).
set -euo pipefail
cd "$(dirname "$0")/.."

target="${CARGO_TARGET_DIR:-target}"
mkdir -p "$target"
target="$(cd "$target" && pwd)"
venv="$target/py-tinynn"
if ! "$venv/bin/python" -c "import numpy, pytest, maturin" 2>/dev/null; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check \
        "numpy>=1.21" "pytest>=8,<10" "maturin>=1.7,<2"
fi
cargo build --release --quiet --bin tnn
# pip builds in place (no isolation: maturin comes from the venv), so cargo reuses the
# workspace's compiled crates.
PATH="$venv/bin:$PATH" CARGO_TARGET_DIR="$target" "$venv/bin/pip" install --quiet --disable-pip-version-check \
    --no-build-isolation --force-reinstall --no-deps ./python
# From outside python/, whose tinynn/ source folder would shadow the installed package.
tests="$(pwd)/python/tests"
cd "$target"
TINYNN_TNN="$target/release/tnn" timeout 900 "$venv/bin/pytest" -q -p no:cacheprovider "$tests"
