#!/usr/bin/env bash
# The kernel, executor and training tests, and the model tests on the fixtures and the default
# model's greedy text, run again at the lower instruction-set levels: TINYNN_ISA=avx2 (what most
# users' CPUs have) and TINYNN_ISA=scalar; the kernel and training tests also at the two AVX-512
# levels below the native one: avx512f (512-bit float kernels beside the AVX2 integer tiles, as on
# a CPU without VNNI) and avx512vnni (no BF16). They are the binaries `cargo test --workspace
# --release` built (listed by cargo, nothing is rebuilt), each run from its package folder as
# cargo runs it. A test that needs an instruction set a level lacks says so and stands down
# (tinynn_cpu::simd::required_by_test); everything else must pass as it does natively.
set -euo pipefail
cd "$(dirname "$0")/.."

mapfile -t runs < <(cargo test --workspace --release --no-run --message-format=json 2>/dev/null |
  python3 -c '
import json, os, sys
# (package folder, test target): None = every test target of the package.
wanted = {
    "tinynn-cpu": None,
    "tinynn-train": None,
    "tinynn-models": {"tinynn_models", "hf_fixtures", "convert_fixtures", "hf_half_precision",
                      "smollm2_greedy", "zero_alloc_decode"},
}
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") != "compiler-artifact" or not m.get("executable") or not m["profile"]["test"]:
        continue
    pkg_dir = os.path.dirname(m["manifest_path"])
    names = wanted.get(os.path.basename(pkg_dir), False)
    if names is False or (names is not None and m["target"]["name"] not in names):
        continue
    print(os.path.basename(pkg_dir) + "\t" + pkg_dir + "\t" + m["executable"])
')
[ "${#runs[@]}" -gt 10 ] || { echo "expected the test binaries of three crates, found ${#runs[@]}" >&2; exit 1; }

log=$(mktemp)
trap 'rm -f "$log"' EXIT
for level in "avx2:*" "scalar:*" "avx512f:tinynn-cpu tinynn-train" "avx512vnni:tinynn-cpu tinynn-train"; do
  isa=${level%%:*}
  crates=${level#*:}
  start=$SECONDS
  count=0
  for run in "${runs[@]}"; do
    crate=${run%%$'\t'*}
    rest=${run#*$'\t'}
    dir=${rest%%$'\t'*}
    exe=${rest#*$'\t'}
    [[ "$crates" == "*" || " $crates " == *" $crate "* ]] || continue
    count=$((count + 1))
    if ! (cd "$dir" && TINYNN_ISA=$isa "$exe" --quiet >"$log" 2>&1); then
      cat "$log" >&2
      echo "FAILED at TINYNN_ISA=$isa: $exe" >&2
      exit 1
    fi
  done
  echo "TINYNN_ISA=$isa: $count test binaries passed in $((SECONDS - start)) s"
done
