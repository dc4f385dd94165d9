#!/usr/bin/env bash
# The whole test suite, as CI runs it: formatting, lints, then every test in release mode.
set -euo pipefail
cd "$(dirname "$0")/.."

# Each step's header says when it started (seconds since the suite began), so a slow CI run
# shows which step grew.
step() { echo "== $1   [at ${SECONDS}s]"; }

step "fetch the real models (checked by SHA-256; downloaded only when missing or damaged)"
cargo run --release --quiet --bin tnn -- pull smollm2 gemma3 >/dev/null

step "cargo fmt --check"
cargo fmt --all -- --check
cargo fmt --manifest-path fuzz/Cargo.toml -- --check

step "cargo clippy -D warnings"
cargo clippy --workspace --all-targets -- -D warnings

step "crate manifests (description, license, readme, keywords, categories)"
python3 scripts/check-manifests.py

step "fuzz targets compile"
cargo check --quiet --manifest-path fuzz/Cargo.toml --bins

step "cargo doc (warnings are errors)"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --quiet

step "cargo test --release"
cargo test --workspace --release

# The examples `cargo test` just built, run as they are: `cargo run -p tinynn --example` would
# build the library crates a second time, with the features of `tinynn` alone rather than the
# workspace's (minutes of a cold run).
step "library examples on the default model"
for example in generate chat batch_decode finetune_lora; do
    echo "-- $example"
    "${CARGO_TARGET_DIR:-target}/release/examples/$example"
done

step "kernel, executor, training and model-fixture tests at TINYNN_ISA=avx2 and scalar"
scripts/test-isa-levels.sh

step "fuzz corpora replayed with integer overflow checks on (profile overflow)"
cargo test --profile overflow -p tinynn-format -p tinynn-train -p tinynn-models --test malformed --test fuzz_corpora --test fuzz_model_gguf

step "cargo install, and the installed tnn run from another directory"
scripts/test-install.sh

step "the openai Python client against tnn serve"
scripts/test-openai-client.sh

step "the C ABI from C (shared and static), under valgrind, and from Ruby"
scripts/test-capi.sh

step "the Python package: pip install ./python, then pytest"
scripts/test-python.sh

step "data-parallel training under mpirun (2 ranks; the mpi feature)"
scripts/test-mpi.sh

step "all passed"
