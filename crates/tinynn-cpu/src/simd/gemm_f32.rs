//! Blocked f32 matrix product with AVX-512, shared by mul_mat (F32 weights), mul_mat_t and
//! out_prod: `C(m, i) = Σ_r A(r, i) · B(m, r)` with `C`'s rows contiguous in `i`.
//!
//! Output tiles are 32 `i` (two vectors) × up to 8 `m` (16 accumulators in registers). `A`
//! is packed per tile into a `[KC][32]` panel on the stack (a copy or a transpose, whichever
//! its strides need), so the micro-kernel reads it with unit stride; `B` is broadcast from
//! wherever it lies. Work is split into jobs of `IG` tiles of `i` × `MC` values of `m`, and a
//! job walks the reduction in blocks of `KC`, so the block of `B` it broadcasts from stays in
//! L2 across its `i` tiles. Every output element sums `r = 0, 1, …` in order in one f32
//! accumulator: the result depends neither on the job split nor on the thread count.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// Lanes of `i` per tile.
const NR: usize = 32;
/// Values of `m` per tile (accumulator columns).
const MR: usize = 8;
/// Reduction block.
const KC: usize = 256;
/// `i` tiles per job.
const IG: usize = 4;
/// `m` values per job.
const MC: usize = 128;

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
}

/// Whether this CPU runs [`Gemm::run_job`].
pub(crate) fn available() -> bool {
    super::Isa::detected() >= super::Isa::Avx512Vnni
}

impl Gemm {
    fn i_groups(&self) -> usize {
        self.ni.div_ceil(NR * IG)
    }

    /// Independent jobs (disjoint output blocks).
    pub(crate) fn jobs(&self) -> usize {
        self.i_groups() * self.nm.div_ceil(MC)
    }

    /// Job `job < jobs()`.
    ///
    /// # Safety
    /// [`available`]; every `A(r, i)`, `B(m, r)` and `C(m, i)` in range is readable (C
    /// writable) and C overlaps neither; the job's output block belongs to this thread.
    #[cfg(target_arch = "x86_64")]
    pub(crate) unsafe fn run_job(&self, job: usize) {
        // SAFETY: the caller's contract.
        unsafe { self.run_job_avx512(job) }
    }

    #[cfg(not(target_arch = "x86_64"))]
    pub(crate) unsafe fn run_job(&self, _: usize) {
        unreachable!("gemm_f32 is only offered where AVX-512 is available");
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,fma")]
    unsafe fn run_job_avx512(&self, job: usize) {
        let (g, mc) = (job % self.i_groups(), job / self.i_groups());
        let (m0, m1) = (mc * MC, ((mc + 1) * MC).min(self.nm));
        let (i_lo, i_hi) = (g * NR * IG, ((g + 1) * NR * IG).min(self.ni));
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
            let mut i0 = i_lo;
            while i0 < i_hi {
                let ni = NR.min(i_hi - i0);
                // SAFETY: A(r, i) for r0 ≤ r < r0 + kc, i0 ≤ i < i0 + ni (caller).
                unsafe { self.pack(&mut panel, r0, kc, i0, ni) };
                let mask = if ni == NR { u32::MAX } else { (1u32 << ni) - 1 };
                let mut m = m0;
                while m < m1 {
                    let mr = MR.min(m1 - m);
                    let t = Tile {
                        panel: panel.as_ptr(),
                        kc,
                        b: self.b.ptr.wrapping_add(m * self.b.xs + r0 * self.b.rs),
                        br: self.b.rs,
                        bm: self.b.xs,
                        c: self.c.wrapping_add(m * self.cm + i0),
                        cm: self.cm,
                        mask,
                        first: r0 == 0,
                    };
                    // SAFETY: the tile's B values and C rows are in range (caller).
                    unsafe {
                        match mr {
                            8 => t.run::<8>(),
                            7 => t.run::<7>(),
                            6 => t.run::<6>(),
                            5 => t.run::<5>(),
                            4 => t.run::<4>(),
                            3 => t.run::<3>(),
                            2 => t.run::<2>(),
                            _ => t.run::<1>(),
                        }
                    }
                    m += mr;
                }
                i0 += ni;
            }
            r0 += kc;
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
            // A transposed (unit stride in r): gather row by row.
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
        let (m_lo, m_hi) = (self.mask as u16, (self.mask >> 16) as u16);
        let mut acc = [[_mm512_setzero_ps(); 2]; M];
        if !self.first {
            for (m, a) in acc.iter_mut().enumerate() {
                // SAFETY: C row m, masked lanes.
                unsafe {
                    let c = self.c.add(m * self.cm);
                    a[0] = _mm512_maskz_loadu_ps(m_lo, c);
                    a[1] = _mm512_maskz_loadu_ps(m_hi, c.add(16));
                }
            }
        }
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
        for (m, a) in acc.iter().enumerate() {
            // SAFETY: C row m, masked lanes.
            unsafe {
                let c = self.c.add(m * self.cm);
                _mm512_mask_storeu_ps(c, m_lo, a[0]);
                _mm512_mask_storeu_ps(c.add(16), m_hi, a[1]);
            }
        }
    }
}
