#!/usr/bin/env bash
# The whole test suite, as CI runs it: formatting, lints, then every test in release mode.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== fetch the real models (checked by SHA-256; downloaded only when missing or damaged)"
cargo run --release --quiet --bin tnn -- pull smollm2 gemma3 >/dev/null

echo "== cargo fmt --check"
cargo fmt --all -- --check
cargo fmt --manifest-path fuzz/Cargo.toml -- --check

echo "== cargo clippy -D warnings"
cargo clippy --workspace --all-targets -- -D warnings

echo "== crate manifests (description, license, readme, keywords, categories)"
python3 scripts/check-manifests.py

echo "== fuzz targets compile"
cargo check --quiet --manifest-path fuzz/Cargo.toml --bins

echo "== cargo doc (warnings are errors)"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --quiet

echo "== library examples on the default model"
for example in generate chat batch_decode finetune_lora; do
    echo "-- $example"
    cargo run --release --quiet -p tinynn --example "$example"
done

echo "== cargo test --release"
cargo test --workspace --release

echo "== kernel, executor, training and model-fixture tests at TINYNN_ISA=avx2 and scalar"
scripts/test-isa-levels.sh

echo "== fuzz corpora replayed with integer overflow checks on (profile overflow)"
cargo test --profile overflow -p tinynn-format -p tinynn-train -p tinynn-models --test malformed --test fuzz_corpora --test fuzz_model_gguf

echo "== cargo install, and the installed tnn run from another directory"
scripts/test-install.sh

echo "== the openai Python client against tnn serve"
scripts/test-openai-client.sh

echo "== the C ABI from C (shared and static), under valgrind, and from Ruby"
scripts/test-capi.sh

echo "== the Python package: pip install ./python, then pytest"
scripts/test-python.sh

echo "== data-parallel training under mpirun (2 ranks; the mpi feature)"
scripts/test-mpi.sh
