//! Every SIMD intrinsic in the release `tnn` is inlined into its kernel.
//!
//! An intrinsic called from code compiled without its instruction set (a `#[target_feature]`
//! list that misses one, e.g. `avx512dq` for `_mm512_andnot_ps`; or a closure run inside
//! `array::map`, which is compiled without the caller's features) is not an error: it becomes
//! a call to an out-of-line copy of the intrinsic, each one a function call and a spill of its
//! vectors. The AVX-512 activation quantizer ran at half its speed that way. Such a copy shows
//! in the symbol table as `core::core_arch::x86::<set>::<intrinsic>`, so this test lists them.

use std::process::Command;

/// Out-of-line intrinsics of dependencies (zlib-rs's CRC, aho-corasick's searchers and the
/// standard library's feature detection), checked by their callers with `objdump -d`.
const FROM_DEPENDENCIES: [&str; 4] = [
    "core::core_arch::x86::ssse3::_mm_shuffle_epi8",
    "core::core_arch::x86::avx::_mm256_loadu_si256",
    "core::core_arch::x86::pclmulqdq::_mm_clmulepi64_si128",
    "core::core_arch::x86::xsave::_xgetbv",
];

#[test]
fn release_binary_calls_no_out_of_line_intrinsic() {
    if cfg!(debug_assertions) || !cfg!(target_arch = "x86_64") {
        // Unoptimized builds inline nothing; the test command builds with --release.
        eprintln!("not a release x86-64 build: nothing to check");
        return;
    }
    let out = Command::new("nm")
        .args(["-C", "--defined-only", env!("CARGO_BIN_EXE_tnn")])
        .output()
        .expect("nm (binutils, which the linker comes with) must be installed");
    assert!(out.status.success(), "nm failed: {out:?}");
    let symbols = String::from_utf8_lossy(&out.stdout);
    // `address type name`; an out-of-line intrinsic is named `core::core_arch::x86::set::_mm…`
    // (types and drop glue that merely mention the vector types are named otherwise).
    let outlined: Vec<&str> = symbols
        .lines()
        .filter_map(|l| l.splitn(3, ' ').nth(2))
        .filter(|name| {
            name.starts_with("core::core_arch::x86::") && !FROM_DEPENDENCIES.contains(name)
        })
        .collect();
    assert!(
        outlined.is_empty(),
        "intrinsics compiled out of line (a #[target_feature] list misses their set, or a \
         closure runs them inside a generic function): {outlined:?}"
    );
    assert!(
        symbols.contains("tinynn_cpu::simd"),
        "no tinynn kernels in the symbol table: was the binary stripped?"
    );
}
