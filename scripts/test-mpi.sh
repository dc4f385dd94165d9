#!/usr/bin/env bash
# Data-parallel training under MPI: builds `tnn` with the `mpi` feature and runs
# crates/tinynn-cli/tests/mpi_cli.rs, which starts `mpirun -np 2` (two ranks on this machine,
# --oversubscribe) and checks that
#  - 2 ranks × --batch 2 give the per-step losses and final weights of 1 process × --batch 4
#    (full fine-tuning, LoRA, QLoRA on a Q8_0 file and `tnn train` from scratch; gradient
#    accumulation 2), within 1e-5, and summing during the backward pass (--overlap on) changes
#    no bit;
#  - a resume under MPI is bit-exact, and one with another number of ranks is refused;
#  - a rank killed mid-run ends the job with an error within 60 s, and the last checkpoint
#    resumes.
# Also lints the feature's code (clippy -D warnings). Installs Debian's Open MPI (openmpi-bin,
# libopenmpi-dev) and libclang-dev (the mpi crate's bindings) when missing.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v mpirun >/dev/null || need+=(openmpi-bin)
command -v mpicc >/dev/null || need+=(libopenmpi-dev)
# libclang itself (libclang.so / libclang-N.so), not libclang-cpp, which LLVM's packages bring.
compgen -G "/usr/lib/llvm-*/lib/libclang.so*" >/dev/null ||
  compgen -G "/usr/lib/*-linux-gnu/libclang-[0-9]*.so*" >/dev/null || need+=(libclang-dev)
if ((${#need[@]})); then
    echo "installing ${need[*]} (Debian packages)"
    sudo=""
    [[ "$(id -u)" == 0 ]] || sudo=sudo
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}" >/dev/null
fi

cargo clippy --quiet -p tinynn-cli --all-targets --features mpi -- -D warnings
cargo test --release -p tinynn-cli --features mpi --test mpi_cli
