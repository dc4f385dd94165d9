//! How far ahead the packed tiles prefetch their weights (software prefetch), by tile size
//! and CPU vendor.

/// How far ahead (bytes) the first tile of 2 or more tokens over a group prefetches (batched
/// decode, and the first pass of a prefill GEMM over each group). Without it the hardware
/// prefetcher alone left a 4-token tile streaming at 6.3 GB/s against 11.4 for one token
/// (Q4_1, 576 × 1M rows from DRAM, one thread); with it, 11-12 GB/s.
pub(super) const PF_BYTES_TILE: usize = 4096;

/// The prefetch distance of a tile of `tokens` (0: none). A multi-token tile that reads its
/// group first prefetches; a later one finds the group in cache, read by the tile before. A
/// one-token (decode) tile prefetches by [`decode_prefetch`].
pub(super) fn prefetch_distance(tokens: usize, first: bool) -> usize {
    match tokens {
        _ if !first => 0,
        1 => decode_prefetch(),
        _ => PF_BYTES_TILE,
    }
}

/// How far ahead a decode tile prefetches its group's weights: `TINYNN_DECODE_PREFETCH`
/// (bytes, 0 for none) when set, else [`PF_BYTES_TILE`] on Intel CPUs and none elsewhere.
///
/// Each thread reads its share of a product as one forward stream. On AMD EPYC (Zen 4) the
/// hardware prefetcher follows it best alone: prefetching 2 KiB ahead cost 11–22% of
/// one-thread decode on every format (tg128 without / with it, 31–35 GB/s probe: Q8_0
/// 190–196 / 156–172, Q4_1 278–288 / 236–244, AVX2 Q8_0 191–195 / 152–153), and a C probe
/// summing 256 MiB read 31 GB/s without it, 27–28 with it. On an Intel Xeon (Sapphire
/// Rapids class), whose L2 streamer stops at every 4 KiB page, the same tile waited on its
/// loads instead (78% of AVX2 Q8_0 decode on the loads' consumers); 4 KiB ahead, tg128 at 2
/// threads rose 105–147 → 138–216 t/s for AVX2 Q8_0, 119–142 → 231–275 for AVX2 Q4_1,
/// 51–52 → 72–75 for AVX2 F16, 57–58 → 69–76 for F16 and 346–353 → 365–382 for Q4_1 (probe
/// 22–29 GB/s), and at 1 thread 72–81 → 81–107 for Q8_0.
pub(crate) fn decode_prefetch() -> usize {
    static BYTES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *BYTES.get_or_init(|| {
        let asked = std::env::var("TINYNN_DECODE_PREFETCH").ok();
        match asked.and_then(|v| v.trim().parse().ok()) {
            Some(bytes) => bytes,
            None if intel() => PF_BYTES_TILE,
            None => 0,
        }
    })
}

/// Whether the CPU's vendor string is Intel's.
fn intel() -> bool {
    let r = std::arch::x86_64::__cpuid(0);
    let vendor: Vec<u8> = [r.ebx, r.edx, r.ecx]
        .iter()
        .flat_map(|w| w.to_le_bytes())
        .collect();
    vendor == b"GenuineIntel"
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    /// CPUID's vendor, which picks the decode prefetch, agrees with the kernel's.
    #[test]
    fn the_vendor_is_the_one_the_kernel_reports() {
        let info = std::fs::read_to_string("/proc/cpuinfo").unwrap();
        let vendor = info
            .lines()
            .find_map(|l| l.strip_prefix("vendor_id"))
            .map(|v| v.trim_start_matches([' ', '\t', ':']).trim().to_string())
            .unwrap();
        assert_eq!(super::intel(), vendor == "GenuineIntel", "{vendor}");
    }
}
