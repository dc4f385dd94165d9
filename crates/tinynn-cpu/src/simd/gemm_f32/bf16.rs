//! The bf16 variant of the f32 GEMM (`Gemm::bf16`, AVX-512 BF16): operands rounded to bf16 as
//! they are packed, pairs of reduction steps multiplied by `vdpbf16ps` into f32 sums.

use std::arch::x86_64::*;

use super::{c_tile, pair, store_c_tile, Gemm, KC, MC, MR, NR};

impl Gemm {
    /// [`Gemm::run_job`] with bf16 operands: per reduction block, B's block is packed into
    /// `bp` as bf16 pairs, A's tile panel likewise, then [`TileBf16`] runs.
    ///
    /// # Safety
    /// As [`Gemm::run_job`]; AVX-512 BF16 present; `bp` holds `KC/2 × MC` values.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma")]
    pub(super) unsafe fn run_job_bf16(&self, job: usize, ig: usize, bp: &mut [u32]) {
        let (g, mc) = (job % self.i_groups(ig), job / self.i_groups(ig));
        let (m0, m1) = (mc * MC, ((mc + 1) * MC).min(self.nm));
        let (i_lo, i_hi) = (g * NR * ig, ((g + 1) * NR * ig).min(self.ni));
        if self.nr == 0 {
            // SAFETY: as in the f32 kernel.
            return unsafe { self.run_job_f32(job, ig, None, true) };
        }
        let mut panel = [0u32; KC / 2 * NR];
        // B pairs: [m][p] when B is contiguous in r, else [p][m].
        let b_rows = self.b.rs == 1;
        let (bms, bps) = if b_rows { (KC / 2, 1) } else { (1, MC) };
        let mut r0 = 0;
        while r0 < self.nr {
            let kc = KC.min(self.nr - r0);
            let kp = kc.div_ceil(2);
            // SAFETY: B(m, r) for m0 ≤ m < m1, r0 ≤ r < r0 + kc (caller).
            unsafe { self.pack_b_bf16(bp, r0, kc, m0, m1, b_rows) };
            let mut i0 = i_lo;
            while i0 < i_hi {
                let ni = NR.min(i_hi - i0);
                // SAFETY: A(r, i) for the block and tile (caller).
                unsafe { self.pack_a_bf16(&mut panel, r0, kc, i0, ni) };
                let mask = if ni == NR { u32::MAX } else { (1u32 << ni) - 1 };
                let mut m = m0;
                while m < m1 {
                    let mr = MR.min(m1 - m);
                    let t = TileBf16 {
                        panel: panel.as_ptr(),
                        kp,
                        b: bp.as_ptr().wrapping_add((m - m0) * bms),
                        bps,
                        bms,
                        c: self.c.wrapping_add(m * self.cm + i0),
                        cm: self.cm,
                        mask,
                        first: r0 == 0,
                    };
                    // SAFETY: kp panel rows, B pairs of columns m..m+mr, C rows in range.
                    unsafe { by_m!(t, mr, run) }
                    m += mr;
                }
                i0 += ni;
            }
            r0 += kc;
        }
    }

    /// B's block as bf16 pairs `(B(m, r0+2p), B(m, r0+2p+1))` (0 past `kc`): at
    /// `bp[(m−m0)·KC/2 + p]` when `rows` (B contiguous in r), else `bp[p·MC + m−m0]`.
    ///
    /// # Safety
    /// AVX-512 BF16; the values exist.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
    unsafe fn pack_b_bf16(
        &self,
        bp: &mut [u32],
        r0: usize,
        kc: usize,
        m0: usize,
        m1: usize,
        rows: bool,
    ) {
        let b = self.b;
        let at = |m: usize, r: usize| {
            // SAFETY: B(m, r) exists for r < r0 + kc (caller).
            if r < r0 + kc {
                unsafe { *b.ptr.add(m * b.xs + r * b.rs) }
            } else {
                0.0
            }
        };
        if rows {
            for m in m0..m1 {
                let out = &mut bp[(m - m0) * (KC / 2)..][..KC / 2];
                let mut r = 0;
                while r + 32 <= kc {
                    // SAFETY: B(m, r0 + r .. r0 + r + 32) contiguous; 16 pairs of out.
                    unsafe {
                        let src = b.ptr.add(m * b.xs + r0 + r);
                        let v =
                            _mm512_cvtne2ps_pbh(_mm512_loadu_ps(src.add(16)), _mm512_loadu_ps(src));
                        _mm512_storeu_si512(
                            out.as_mut_ptr().add(r / 2) as *mut __m512i,
                            std::mem::transmute::<__m512bh, __m512i>(v),
                        );
                    }
                    r += 32;
                }
                while r < kc {
                    out[r / 2] = pair(at(m, r0 + r), at(m, r0 + r + 1));
                    r += 2;
                }
            }
        } else {
            for p in 0..kc.div_ceil(2) {
                let out = &mut bp[p * MC..][..m1 - m0];
                let (ra, rb) = (r0 + 2 * p, r0 + 2 * p + 1);
                let mut m = m0;
                if b.xs == 1 && rb < r0 + kc {
                    while m + 16 <= m1 {
                        // SAFETY: B(m..m+16, ra) and B(m..m+16, rb) contiguous; 16 outputs.
                        unsafe {
                            let lo = bf16_lanes(_mm512_loadu_ps(b.ptr.add(m + ra * b.rs)));
                            let hi = bf16_lanes(_mm512_loadu_ps(b.ptr.add(m + rb * b.rs)));
                            let v = _mm512_or_si512(lo, _mm512_slli_epi32::<16>(hi));
                            _mm512_storeu_si512(out.as_mut_ptr().add(m - m0) as *mut __m512i, v);
                        }
                        m += 16;
                    }
                }
                for m in m..m1 {
                    out[m - m0] = pair(at(m, ra), at(m, rb));
                }
            }
        }
    }

    /// `panel[p][i] = (A(r0+2p, i0+i), A(r0+2p+1, i0+i))` as bf16 pairs, zeros past `ni` / `kc`.
    ///
    /// # Safety
    /// AVX-512 BF16; the values exist.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
    unsafe fn pack_a_bf16(
        &self,
        panel: &mut [u32; KC / 2 * NR],
        r0: usize,
        kc: usize,
        i0: usize,
        ni: usize,
    ) {
        let a = self.a;
        let at = |r: usize, i: usize| {
            // SAFETY: A(r, i) exists for r < r0 + kc, i < i0 + ni (caller).
            if r < r0 + kc && i < i0 + ni {
                unsafe { *a.ptr.add(r * a.rs + i * a.xs) }
            } else {
                0.0
            }
        };
        let kp = kc.div_ceil(2);
        if a.xs == 1 && ni == NR {
            for p in 0..kp {
                let (ra, rb) = (r0 + 2 * p, r0 + 2 * p + 1);
                for h in 0..2 {
                    // SAFETY: A(ra, i0 + 16h ..+16) and A(rb, …) contiguous (rb checked).
                    unsafe {
                        let lo = bf16_lanes(_mm512_loadu_ps(a.ptr.add(ra * a.rs + i0 + 16 * h)));
                        let hi = if rb < r0 + kc {
                            bf16_lanes(_mm512_loadu_ps(a.ptr.add(rb * a.rs + i0 + 16 * h)))
                        } else {
                            _mm512_setzero_si512()
                        };
                        let v = _mm512_or_si512(lo, _mm512_slli_epi32::<16>(hi));
                        _mm512_storeu_si512(
                            panel.as_mut_ptr().add(p * NR + 16 * h) as *mut __m512i,
                            v,
                        );
                    }
                }
            }
        } else if a.rs == 1 {
            // Unit stride in r: 32 values of r (16 pairs) converted at once, stored into
            // column i of the panel (plain stores beat a scatter: 400 vs 370 GFLOP/s).
            for i in 0..NR {
                if i >= ni {
                    for p in 0..kp {
                        panel[p * NR + i] = 0;
                    }
                    continue;
                }
                // SAFETY: A(r0 .. r0 + kc, i0 + i) contiguous.
                let src = unsafe { a.ptr.add((i0 + i) * a.xs + r0) };
                let mut r = 0;
                while r < kc {
                    let left = kc - r;
                    let m_lo = if left >= 16 {
                        0xFFFF
                    } else {
                        (1u16 << left) - 1
                    };
                    let m_hi = if left >= 32 {
                        0xFFFF
                    } else if left > 16 {
                        (1u16 << (left - 16)) - 1
                    } else {
                        0
                    };
                    let pairs = left.min(32).div_ceil(2);
                    // SAFETY: values r.. < kc of the row (masked); panel rows r/2.. (KC/2 rows).
                    unsafe {
                        let lo = _mm512_maskz_loadu_ps(m_lo, src.add(r));
                        let hi = _mm512_maskz_loadu_ps(m_hi, src.add(r + 16));
                        let v =
                            std::mem::transmute::<__m512bh, __m512i>(_mm512_cvtne2ps_pbh(hi, lo));
                        let mut tmp = [0u32; 16];
                        _mm512_storeu_si512(tmp.as_mut_ptr() as *mut __m512i, v);
                        for (t, &x) in tmp.iter().enumerate().take(pairs) {
                            panel[(r / 2 + t) * NR + i] = x;
                        }
                    }
                    r += 32;
                }
            }
        } else {
            for p in 0..kp {
                for i in 0..NR {
                    panel[p * NR + i] = pair(at(r0 + 2 * p, i0 + i), at(r0 + 2 * p + 1, i0 + i));
                }
            }
        }
    }
}

/// 16 f32 lanes rounded to bf16, each in the low half of a u32 lane.
///
/// # Safety
/// AVX-512 BF16.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
unsafe fn bf16_lanes(x: __m512) -> __m512i {
    let h = _mm512_cvtneps_pbh(x);
    // SAFETY: __m256bh and __m256i are both 32 plain bytes.
    _mm512_cvtepu16_epi32(unsafe { std::mem::transmute::<__m256bh, __m256i>(h) })
}

/// One bf16 register tile: 32 lanes of `i` × `M` values of `m`, `kp` reduction pairs.
struct TileBf16 {
    panel: *const u32,
    kp: usize,
    /// Pair 0 of the tile's first column.
    b: *const u32,
    bps: usize,
    bms: usize,
    c: *mut f32,
    cm: usize,
    mask: u32,
    first: bool,
}

impl TileBf16 {
    /// # Safety
    /// AVX-512 BF16; `kp` panel rows, pairs `b[m·bms + p·bps]` for `m < M`, `p < kp`, C rows
    /// `m < M` (the masked lanes).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bf16")]
    unsafe fn run<const M: usize>(&self) {
        // SAFETY: C rows m < M, masked lanes (caller).
        let mut acc = unsafe { c_tile::<M>(self.c, self.cm, self.mask, self.first) };
        for p in 0..self.kp {
            // SAFETY: panel row p; pairs of columns m < M; __m512i and __m512bh are both
            // 64 plain bytes.
            unsafe {
                let a0: __m512bh = std::mem::transmute(_mm512_loadu_si512(
                    self.panel.add(p * NR) as *const __m512i
                ));
                let a1: __m512bh = std::mem::transmute(_mm512_loadu_si512(
                    self.panel.add(p * NR + 16) as *const __m512i,
                ));
                let b = self.b.add(p * self.bps);
                for (m, a) in acc.iter_mut().enumerate() {
                    let bv: __m512bh =
                        std::mem::transmute(_mm512_set1_epi32(*b.add(m * self.bms) as i32));
                    a[0] = _mm512_dpbf16_ps(a[0], a0, bv);
                    a[1] = _mm512_dpbf16_ps(a[1], a1, bv);
                }
            }
        }
        // SAFETY: as above.
        unsafe { store_c_tile(self.c, self.cm, self.mask, &acc) };
    }
}
