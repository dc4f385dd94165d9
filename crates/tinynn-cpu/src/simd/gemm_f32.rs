//! Blocked f32 matrix product with AVX-512 or AVX2 + FMA, shared by mul_mat (F32 weights),
//! mul_mat_t and out_prod: `C(m, i) = Σ_r A(r, i) · B(m, r)` with `C`'s rows contiguous in `i`.
//!
//! Output tiles are 32 `i` (two vectors) × up to 8 `m` (16 accumulators in registers; the
//! AVX2 tile takes 6 `m` and each half of the 32 `i` in turn: 12 accumulators). `A`
//! is packed per tile into a `[KC][32]` panel on the stack (a copy or a transpose, whichever
//! its strides need), so the micro-kernel reads it with unit stride; `B` is broadcast from
//! wherever it lies. Work is split into jobs of `IG` tiles of `i` × `MC` values of `m`, and a
//! job walks the reduction in blocks of `KC`, so the block of `B` it broadcasts from stays in
//! L2 across its `i` tiles. Every output element sums `r = 0, 1, …` in order in one f32
//! accumulator: the result depends neither on the job split nor on the thread count, nor on
//! the instruction set (the AVX2 tile in `gemm_f32/avx2.rs` reads the same panels and makes
//! the same fused multiply-adds in the same order as the AVX-512 one).
//!
//! With `bf16` set (an explicit executor option, never the default) and AVX-512 BF16 present,
//! `A` and `B` are rounded to bf16 (to nearest, ties to even) as they are packed and
//! `vdpbf16ps` multiplies pairs of reduction steps, accumulating in f32: each accumulator
//! adds `A(r)·B(r) + A(r+1)·B(r+1)` per instruction, twice the f32 kernel's products.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// `$t.$run::<M>()` for `M = $mr` (1 to 8, the tile's values of `m`).
#[cfg(target_arch = "x86_64")]
macro_rules! by_m {
    ($t:expr, $mr:expr, $run:ident) => {
        match $mr {
            8 => $t.$run::<8>(),
            7 => $t.$run::<7>(),
            6 => $t.$run::<6>(),
            5 => $t.$run::<5>(),
            4 => $t.$run::<4>(),
            3 => $t.$run::<3>(),
            2 => $t.$run::<2>(),
            _ => $t.$run::<1>(),
        }
    };
}

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod bf16;

/// Lanes of `i` per tile.
const NR: usize = 32;
/// Values of `m` per tile (accumulator columns).
const MR: usize = 8;
/// Reduction block.
const KC: usize = 256;
/// B row stride (elements) from which a block of B is copied before use.
const COPY_B_MIN_STRIDE: usize = 8192;
/// Values of a thread's copy of a block of B: `KC × MC`, with room for the AVX2 packing's
/// last, partial tile.
#[cfg(target_arch = "x86_64")]
const B_COPY_LEN: usize = KC * MC.next_multiple_of(avx2::MR_AVX2);
/// The B row step that marks B packed tile by tile (AVX2, `run_job_f32`).
const PACKED_TILES: usize = usize::MAX;
/// `i` tiles per job.
const IG: usize = 4;
/// `m` values per job.
const MC: usize = 256;

/// A strided f32 matrix: element `(r, x)` at `ptr + r·rs + x·xs` (elements, not bytes).
#[derive(Clone, Copy)]
pub(crate) struct Strided {
    pub ptr: *const f32,
    pub rs: usize,
    pub xs: usize,
}

/// One product: `C(m, i)` at `c + m·cm + i` for `i < ni`, `m < nm`, summed over `r < nr`.
pub(crate) struct Gemm {
    /// `A(r, i)`.
    pub a: Strided,
    /// `B(m, r)`: `rs` steps in `r`, `xs` in `m`.
    pub b: Strided,
    pub c: *mut f32,
    pub cm: usize,
    pub ni: usize,
    pub nm: usize,
    pub nr: usize,
    /// Round the operands to bf16 (where [`bf16_available`]; f32 otherwise).
    pub bf16: bool,
}

/// Whether this CPU runs [`Gemm::run_job`] (AVX2 + FMA at least).
pub(crate) fn available() -> bool {
    super::Isa::detected() >= super::Isa::Avx2
}

/// Whether the AVX-512 tile runs (else the AVX2 one).
fn wide() -> bool {
    super::Isa::detected() >= super::Isa::Avx512F
}

/// Whether this CPU runs the bf16 variant (AVX-512 BF16, not capped by `TINYNN_ISA`).
pub fn bf16_available() -> bool {
    super::Isa::detected() >= super::Isa::Avx512Bf16
}

/// `x` rounded to bf16, to nearest with ties to even (NaNs stay NaN): what `vcvtneps2bf16`
/// computes.
pub fn bf16_bits(x: f32) -> u16 {
    let b = x.to_bits();
    if x.is_nan() {
        return ((b >> 16) | 0x40) as u16;
    }
    ((b + 0x7fff + ((b >> 16) & 1)) >> 16) as u16
}

/// bf16 pairs `(lo, hi)` as the u32 `vdpbf16ps` reads: `lo` in the low half.
#[inline]
fn pair(lo: f32, hi: f32) -> u32 {
    u32::from(bf16_bits(lo)) | u32::from(bf16_bits(hi)) << 16
}

thread_local! {
    /// Each thread's copy of a block of B that is contiguous in m but strided in r (out_prod's
    /// gradient rows), `KC × MC` (made on first use).
    static B_COPY: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
    /// Each thread's packed bf16 block of B, `KC/2 × MC` pairs (made on first use).
    static B_PACK: std::cell::RefCell<Vec<u32>> = const { std::cell::RefCell::new(Vec::new()) };
}

impl Gemm {
    fn i_groups(&self, ig: usize) -> usize {
        self.ni.div_ceil(NR * ig)
    }

    /// Independent jobs (disjoint output blocks) of `ig` tiles of `i` each.
    pub(crate) fn jobs(&self, ig: usize) -> usize {
        self.i_groups(ig) * self.nm.div_ceil(MC)
    }

    /// The work of job `job < jobs(ig)`: its output values (tiles of `i` × values of `m`).
    fn job_load(&self, ig: usize, job: usize) -> usize {
        let groups = self.i_groups(ig);
        let (g, mc) = (job % groups, job / groups);
        let tiles = ig.min(self.ni.div_ceil(NR) - g * ig);
        tiles * MC.min(self.nm - mc * MC)
    }

    /// The jobs (of `batches` such products, numbered on across them) thread `ith` of `nth`
    /// runs: contiguous runs of about equal work, each job going to the thread its middle
    /// falls in. Jobs differ in size (the last `i` group and the last `m` chunk are partial),
    /// so equal counts were not equal work: SmolLM2's `[576, 576]` weight gradient made
    /// 15 jobs of 256 or 64 values of `m`, 8 : 7 jobs but 3 : 1 work on two threads.
    pub(crate) fn thread_jobs(
        &self,
        ig: usize,
        batches: usize,
        ith: usize,
        nth: usize,
    ) -> std::ops::Range<usize> {
        let per = self.jobs(ig);
        let n = per * batches;
        let nth = nth.max(1);
        let loads = || (0..n).map(|j| self.job_load(ig, j % per));
        let total: usize = loads().sum();
        if total == 0 {
            return if ith == 0 { 0..n } else { n..n };
        }
        let (mut start, mut end, mut before) = (n, n, 0);
        for (j, load) in loads().enumerate() {
            let owner = ((2 * before + load) * nth / (2 * total)).min(nth - 1);
            if owner == ith && start == n {
                start = j;
            }
            if owner > ith {
                end = j;
                break;
            }
            before += load;
        }
        start.min(end)..end
    }

    /// The `i` tiles per job (at most `IG`) that load the busiest of `nth` threads least
    /// under [`Gemm::thread_jobs`]' split of `batches` such products; more tiles (more reuse
    /// of each block of B) unless fewer leave the busiest thread over 5% less. With few
    /// values of `m` the default cut is uneven: a 128-token chunk of SmolLM2's head gradient
    /// (576 lanes of `i`, 18 tiles) makes 5 jobs of 4, 4, 4, 4 and 2 tiles, 8 : 10 on two
    /// threads at best; 3 tiles a job make 9 : 9.
    pub(crate) fn tiles_per_job(&self, batches: usize, nth: usize) -> usize {
        let busiest = |ig: usize| {
            (0..nth.max(1))
                .map(|t| {
                    self.thread_jobs(ig, batches, t, nth)
                        .map(|job| self.job_load(ig, job % self.jobs(ig)))
                        .sum::<usize>()
                })
                .max()
                .unwrap_or(0)
        };
        let loads: [usize; IG] = std::array::from_fn(|i| busiest(i + 1));
        let best = loads.iter().copied().min().unwrap_or(0);
        (1..=IG)
            .rev()
            .find(|&ig| loads[ig - 1] * 100 <= best * 105)
            .unwrap_or(IG)
    }

    /// Job `job < jobs(ig)`.
    ///
    /// # Safety
    /// [`available`]; every `A(r, i)`, `B(m, r)` and `C(m, i)` in range is readable (C
    /// writable) and C overlaps neither; the job's output block belongs to this thread.
    #[cfg(target_arch = "x86_64")]
    pub(crate) unsafe fn run_job(&self, job: usize, ig: usize) {
        if self.bf16 && bf16_available() {
            return B_PACK.with_borrow_mut(|bp| {
                if bp.len() < KC / 2 * MC {
                    bp.resize(KC / 2 * MC, 0);
                }
                // SAFETY: the caller's contract; AVX-512 BF16 checked above.
                unsafe { self.run_job_bf16(job, ig, bp) }
            });
        }
        // B contiguous in m with rows far apart (the head's gradient, 192 KiB per row in
        // SmolLM2): each reduction step would touch another page. On AVX-512 copying costs
        // more than it saves at a few KiB per row (measured: 1536-float rows 230 -> 210
        // GFLOP/s); the AVX2 tile, which reads B once per half panel, gains from packing
        // every such B tile by tile (out_prod at 576 × 1536 × 1024, one thread, 76–78 ->
        // 80–81 GFLOP/s). Packing B given as rows of r (mul_mat's activations) lost 15–20%.
        let wide = wide();
        if self.b.xs == 1 && (self.b.rs >= COPY_B_MIN_STRIDE || !wide && self.b.rs >= NR) {
            return B_COPY.with_borrow_mut(|bc| {
                if bc.len() < B_COPY_LEN {
                    bc.resize(B_COPY_LEN, 0.0);
                }
                // SAFETY: the caller's contract.
                unsafe { self.run_job_f32(job, ig, Some(bc), wide) }
            });
        }
        // SAFETY: the caller's contract.
        unsafe { self.run_job_f32(job, ig, None, wide) }
    }

    #[cfg(not(target_arch = "x86_64"))]
    pub(crate) unsafe fn run_job(&self, _: usize, _: usize) {
        unreachable!("gemm_f32 is only offered where AVX2 or AVX-512 is available");
    }

    /// The f32 kernel, with the AVX-512 tiles where `wide`, else the AVX2 ones; with `b_copy`
    /// (`KC × MC` values) each reduction block of B is first copied there contiguously (B
    /// contiguous in m, far apart in r: one page per r).
    ///
    /// # Safety
    /// As [`Gemm::run_job`]; AVX-512 present where `wide`.
    #[cfg(target_arch = "x86_64")]
    unsafe fn run_job_f32(
        &self,
        job: usize,
        ig: usize,
        mut b_copy: Option<&mut Vec<f32>>,
        wide: bool,
    ) {
        let (g, mc) = (job % self.i_groups(ig), job / self.i_groups(ig));
        let (m0, m1) = (mc * MC, ((mc + 1) * MC).min(self.nm));
        let (i_lo, i_hi) = (g * NR * ig, ((g + 1) * NR * ig).min(self.ni));
        if self.nr == 0 {
            for m in m0..m1 {
                for i in i_lo..i_hi {
                    // SAFETY: C(m, i) is this job's (caller).
                    unsafe { self.c.add(m * self.cm + i).write(0.0) };
                }
            }
            return;
        }
        let mut panel = [0f32; KC * NR];
        let mut r0 = 0;
        while r0 < self.nr {
            let kc = KC.min(self.nr - r0);
            // Where the tiles read B(m0, r0) and their steps in r and m.
            let (b_base, b_rs, b_xs) = match b_copy.as_deref_mut() {
                Some(bc) if !wide => {
                    // AVX2: B packed tile by tile, `[m tile][r][MR_AVX2]`, so a tile's
                    // broadcasts read one sequential stream instead of touching another
                    // page (out_prod's gradient rows) at each reduction step.
                    let mr = avx2::MR_AVX2;
                    for r in 0..kc {
                        // SAFETY: B(m0..m1, r0 + r) are contiguous (xs = 1) and exist.
                        let src = unsafe {
                            std::slice::from_raw_parts(
                                self.b.ptr.add(m0 + (r0 + r) * self.b.rs),
                                m1 - m0,
                            )
                        };
                        for (t, vals) in src.chunks(mr).enumerate() {
                            let at = t * kc * mr + r * mr;
                            bc[at..at + vals.len()].copy_from_slice(vals);
                        }
                    }
                    (bc.as_ptr(), PACKED_TILES, 1)
                }
                Some(bc) => {
                    for r in 0..kc {
                        // SAFETY: B(m0..m1, r0 + r) are contiguous (xs = 1) and exist.
                        let src = unsafe {
                            std::slice::from_raw_parts(
                                self.b.ptr.add(m0 + (r0 + r) * self.b.rs),
                                m1 - m0,
                            )
                        };
                        bc[r * MC..r * MC + (m1 - m0)].copy_from_slice(src);
                    }
                    (bc.as_ptr(), MC, 1)
                }
                None => (
                    self.b.ptr.wrapping_add(m0 * self.b.xs + r0 * self.b.rs),
                    self.b.rs,
                    self.b.xs,
                ),
            };
            let mut i0 = i_lo;
            while i0 < i_hi {
                let ni = NR.min(i_hi - i0);
                if wide {
                    // SAFETY: A(r, i) for r0 ≤ r < r0 + kc, i0 ≤ i < i0 + ni (caller).
                    unsafe { self.pack(&mut panel, r0, kc, i0, ni) };
                } else {
                    // SAFETY: as above.
                    unsafe { self.pack_portable(&mut panel, r0, kc, i0, ni) };
                }
                let mask = if ni == NR { u32::MAX } else { (1u32 << ni) - 1 };
                let mut m = m0;
                while m < m1 {
                    let mr = if wide { MR } else { avx2::MR_AVX2 }.min(m1 - m);
                    let (b, br) = if b_rs == PACKED_TILES {
                        let full = avx2::MR_AVX2;
                        (b_base.wrapping_add((m - m0) / full * kc * full), full)
                    } else {
                        (b_base.wrapping_add((m - m0) * b_xs), b_rs)
                    };
                    let t = Tile {
                        panel: panel.as_ptr(),
                        kc,
                        b,
                        br,
                        bm: b_xs,
                        c: self.c.wrapping_add(m * self.cm + i0),
                        cm: self.cm,
                        mask,
                        first: r0 == 0,
                    };
                    // SAFETY: the tile's B values and C rows are in range (caller); AVX-512
                    // where `wide`, AVX2 + FMA otherwise (`available`).
                    unsafe {
                        if wide {
                            by_m!(t, mr, run)
                        } else {
                            match mr {
                                6 => t.run_avx2::<6>(),
                                5 => t.run_avx2::<5>(),
                                4 => t.run_avx2::<4>(),
                                3 => t.run_avx2::<3>(),
                                2 => t.run_avx2::<2>(),
                                _ => t.run_avx2::<1>(),
                            }
                        }
                    }
                    m += mr;
                }
                i0 += ni;
            }
            r0 += kc;
        }
    }

    /// [`Gemm::pack`] without AVX-512 (the same panel).
    ///
    /// # Safety
    /// The values exist.
    #[cfg(target_arch = "x86_64")]
    unsafe fn pack_portable(
        &self,
        panel: &mut [f32; KC * NR],
        r0: usize,
        kc: usize,
        i0: usize,
        ni: usize,
    ) {
        let a = self.a;
        if a.xs != 1 {
            // SAFETY: the caller's contract; that branch is portable.
            return unsafe { self.pack_transposed(panel, r0, kc, i0, ni) };
        }
        for (r, row) in panel.chunks_exact_mut(NR).take(kc).enumerate() {
            // SAFETY: A(r0 + r, i0 + i) for i < ni are contiguous (xs = 1).
            let src = unsafe { std::slice::from_raw_parts(a.ptr.add((r0 + r) * a.rs + i0), ni) };
            if let (Ok(src), Ok(row)) = (
                <&[f32; NR]>::try_from(src),
                <&mut [f32; NR]>::try_from(&mut *row),
            ) {
                // A whole row: a copy of constant size, inlined (a `memmove` call per
                // 128 bytes took 8% of a head-gradient product).
                *row = *src;
            } else {
                row[..ni].copy_from_slice(src);
                row[ni..].fill(0.0);
            }
        }
    }

    /// `panel[r][i] = A(r0 + r, i0 + i)`, zeros past `ni`.
    ///
    /// # Safety
    /// AVX-512F; the values exist.
    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn pack(&self, panel: &mut [f32; KC * NR], r0: usize, kc: usize, i0: usize, ni: usize) {
        let a = self.a;
        if a.xs == 1 {
            // Rows of A are contiguous in i: a copy.
            let mask = if ni == NR { u32::MAX } else { (1u32 << ni) - 1 };
            let (m_lo, m_hi) = (mask as u16, (mask >> 16) as u16);
            for r in 0..kc {
                // SAFETY: A(r0 + r, i0 + i) for i < ni (masked loads); panel row r.
                unsafe {
                    let src = a.ptr.add((r0 + r) * a.rs + i0);
                    let dst = panel.as_mut_ptr().add(r * NR);
                    _mm512_storeu_ps(dst, _mm512_maskz_loadu_ps(m_lo, src));
                    _mm512_storeu_ps(dst.add(16), _mm512_maskz_loadu_ps(m_hi, src.add(16)));
                }
            }
        } else {
            // SAFETY: the caller's contract.
            unsafe { self.pack_transposed(panel, r0, kc, i0, ni) };
        }
    }

    /// [`Gemm::pack`] for A transposed (mul_mat's weights): element by element, each row of A
    /// read in order (AVX-512 scatters measured slower: 140-150 vs 185-195 GFLOP/s).
    ///
    /// # Safety
    /// The values exist.
    #[cfg(target_arch = "x86_64")]
    #[inline]
    unsafe fn pack_transposed(
        &self,
        panel: &mut [f32; KC * NR],
        r0: usize,
        kc: usize,
        i0: usize,
        ni: usize,
    ) {
        let a = self.a;
        for i in 0..NR {
            if i < ni {
                // SAFETY: A(r0 + r, i0 + i) for r < kc.
                let src = unsafe { a.ptr.add((i0 + i) * a.xs + r0 * a.rs) };
                for r in 0..kc {
                    // SAFETY: as above.
                    panel[r * NR + i] = unsafe { *src.add(r * a.rs) };
                }
            } else {
                for r in 0..kc {
                    panel[r * NR + i] = 0.0;
                }
            }
        }
    }
}

/// The accumulators of a 32-lane × `M` tile of C: zeros on the first reduction block,
/// else C's `mask` lanes of rows `c + m·cm`.
///
/// # Safety
/// AVX-512F; unless `first`, C rows m < M readable in the masked lanes.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn c_tile<const M: usize>(
    c: *mut f32,
    cm: usize,
    mask: u32,
    first: bool,
) -> [[__m512; 2]; M] {
    let (m_lo, m_hi) = (mask as u16, (mask >> 16) as u16);
    let mut acc = [[_mm512_setzero_ps(); 2]; M];
    if !first {
        for (m, a) in acc.iter_mut().enumerate() {
            // SAFETY: C row m, masked lanes (caller).
            unsafe {
                let c = c.add(m * cm);
                a[0] = _mm512_maskz_loadu_ps(m_lo, c);
                a[1] = _mm512_maskz_loadu_ps(m_hi, c.add(16));
            }
        }
    }
    acc
}

/// Stores a tile's accumulators into C's `mask` lanes of rows `c + m·cm`.
///
/// # Safety
/// AVX-512F; C rows m < M writable in the masked lanes.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn store_c_tile<const M: usize>(c: *mut f32, cm: usize, mask: u32, acc: &[[__m512; 2]; M]) {
    let (m_lo, m_hi) = (mask as u16, (mask >> 16) as u16);
    for (m, a) in acc.iter().enumerate() {
        // SAFETY: C row m, masked lanes (caller).
        unsafe {
            let c = c.add(m * cm);
            _mm512_mask_storeu_ps(c, m_lo, a[0]);
            _mm512_mask_storeu_ps(c.add(16), m_hi, a[1]);
        }
    }
}

/// One register tile: 32 lanes of `i` × `M` values of `m`.
#[cfg(target_arch = "x86_64")]
struct Tile {
    panel: *const f32,
    kc: usize,
    /// `B(m, r0)` of the tile's first column.
    b: *const f32,
    br: usize,
    bm: usize,
    /// `C(m, i0)`.
    c: *mut f32,
    cm: usize,
    /// Valid lanes of `i`.
    mask: u32,
    /// First reduction block: start from zero instead of C.
    first: bool,
}

#[cfg(target_arch = "x86_64")]
impl Tile {
    /// # Safety
    /// AVX-512F; `kc` panel rows, `B(m, r)` for `m < M`, `r < kc`, and C rows `m < M` (the
    /// masked lanes) exist.
    #[inline]
    #[target_feature(enable = "avx512f,fma")]
    unsafe fn run<const M: usize>(&self) {
        // SAFETY: C rows m < M, masked lanes (caller).
        let mut acc = unsafe { c_tile::<M>(self.c, self.cm, self.mask, self.first) };
        for r in 0..self.kc {
            // SAFETY: panel row r; B(m, r) for m < M.
            unsafe {
                let a0 = _mm512_loadu_ps(self.panel.add(r * NR));
                let a1 = _mm512_loadu_ps(self.panel.add(r * NR + 16));
                let b = self.b.add(r * self.br);
                for (m, a) in acc.iter_mut().enumerate() {
                    let bv = _mm512_set1_ps(*b.add(m * self.bm));
                    a[0] = _mm512_fmadd_ps(a0, bv, a[0]);
                    a[1] = _mm512_fmadd_ps(a1, bv, a[1]);
                }
            }
        }
        // SAFETY: as above.
        unsafe { store_c_tile(self.c, self.cm, self.mask, &acc) };
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests;
