//! CPU kernels: one function per op family, each computing the rows of its output that belong
//! to thread `ith` of `nth`.
//!
//! Kernels see tensors as raw pointers plus layouts ([`RawTensor`]). The planner guarantees
//! that every pointer and layout addresses bytes inside a buffer that is live for the whole
//! step, that an op's output does not overlap its inputs except when it runs in place (then
//! element i is read before element i is written, by the same thread), and the executor puts a
//! barrier between steps. Each thread writes only its own rows. Those facts are what the
//! `// SAFETY:` notes below rely on.
//!
//! A kernel that meets at a barrier itself must return as soon as `ctx.barrier()` answers
//! `Err(Poisoned)` (another thread panicked): what it would read next was never written.

pub(crate) mod attention;
mod attention_back;
mod conv;
mod copy;
mod elementwise;
mod matmul;
mod matmul_back;
mod moe;
mod moe_back;
mod norm;
mod reduce;
mod rope;
mod rows;
mod shape;
pub(crate) mod shares;
mod softmax;
mod ssm_back;
mod train;
mod train_back;

use std::ops::Range;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};

use tinynn_core::ops::Op;
use tinynn_core::tensor::Layout;

use crate::pool::Ctx;

/// A tensor as a kernel sees it.
#[derive(Clone, Copy)]
pub(crate) struct RawTensor {
    pub ptr: *mut u8,
    pub layout: Layout,
}

impl RawTensor {
    /// Byte offset of element `(i0, i1, i2, i3)` (i0 counted in elements, not blocks).
    #[inline]
    fn elem_offset(&self, i: [usize; 4]) -> usize {
        let l = &self.layout;
        let blk = l.dtype.layout().block_elems as usize;
        (i[0] / blk) * l.nb[0] + i[1] * l.nb[1] + i[2] * l.nb[2] + i[3] * l.nb[3]
    }

    /// The f32 at `i`.
    ///
    /// # Safety
    /// `i` is inside the layout and the tensor is F32 (see the module notes).
    #[inline]
    pub unsafe fn f32_at(&self, i: [usize; 4]) -> f32 {
        // SAFETY: in bounds by the caller's contract; F32 data is 4-byte aligned (arena offsets,
        // view checks and weight binding all enforce it), read_unaligned costs nothing extra.
        unsafe { (self.ptr.add(self.elem_offset(i)) as *const f32).read_unaligned() }
    }

    /// Row `(i1, i2, i3)` as bytes (`row_bytes` long).
    ///
    /// # Safety
    /// The row is inside the layout and its elements are contiguous.
    #[inline]
    pub unsafe fn row(&self, i1: usize, i2: usize, i3: usize) -> &[u8] {
        // SAFETY: see the module notes; contiguous rows are `row_bytes()` long.
        unsafe {
            std::slice::from_raw_parts(
                self.ptr.add(self.layout.row_offset(i1, i2, i3)),
                self.layout.row_bytes(),
            )
        }
    }

    /// Row `(i1, i2, i3)` as mutable bytes.
    ///
    /// # Safety
    /// As [`RawTensor::row`], and only this thread touches this row during the step.
    #[inline]
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn row_mut(&self, i1: usize, i2: usize, i3: usize) -> &mut [u8] {
        // SAFETY: see the module notes.
        unsafe {
            std::slice::from_raw_parts_mut(
                self.ptr.add(self.layout.row_offset(i1, i2, i3)),
                self.layout.row_bytes(),
            )
        }
    }

    /// Row `(i1, i2, i3)` of an F32 tensor with contiguous rows.
    ///
    /// # Safety
    /// As [`RawTensor::row`]; the tensor is F32 and 4-byte aligned.
    #[inline]
    pub unsafe fn row_f32(&self, i1: usize, i2: usize, i3: usize) -> &[f32] {
        // SAFETY: see the module notes; F32 rows are 4-byte aligned.
        unsafe {
            std::slice::from_raw_parts(
                self.ptr.add(self.layout.row_offset(i1, i2, i3)) as *const f32,
                self.layout.ne[0],
            )
        }
    }

    /// A raw pointer to the start of row `(i1, i2, i3)` (computed, not dereferenced: any
    /// indices give a pointer, valid ones a pointer into the tensor).
    #[inline]
    pub fn row_ptr(&self, i1: usize, i2: usize, i3: usize) -> *const u8 {
        self.ptr.wrapping_add(self.layout.row_offset(i1, i2, i3))
    }

    /// A raw pointer to row `(i1, i2, i3)` of an F32 tensor with contiguous rows. Kernels that
    /// may run in place write through it (a `&mut` slice would alias the input being read).
    #[inline]
    pub fn row_f32_ptr(&self, i1: usize, i2: usize, i3: usize) -> *mut f32 {
        self.ptr.wrapping_add(self.layout.row_offset(i1, i2, i3)) as *mut f32
    }

    /// Mutable row of an F32 tensor with contiguous rows.
    ///
    /// # Safety
    /// As [`RawTensor::row_mut`]; the tensor is F32 and 4-byte aligned.
    #[inline]
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn row_f32_mut(&self, i1: usize, i2: usize, i3: usize) -> &mut [f32] {
        // SAFETY: see the module notes.
        unsafe {
            std::slice::from_raw_parts_mut(
                self.ptr.add(self.layout.row_offset(i1, i2, i3)) as *mut f32,
                self.layout.ne[0],
            )
        }
    }

    /// The values of a contiguous I32 tensor.
    ///
    /// # Safety
    /// The tensor is contiguous I32.
    #[inline]
    pub unsafe fn i32s(&self) -> &[i32] {
        // SAFETY: see the module notes; I32 tensors are 4-byte aligned.
        unsafe { std::slice::from_raw_parts(self.ptr as *const i32, self.layout.n_elements()) }
    }
}

/// The first error a kernel ran into (bad run-time data such as a token id past the table).
#[derive(Default)]
pub(crate) struct RunErrors {
    code: AtomicU32,
    value: AtomicU32,
}

pub(crate) const ERR_INDEX: u32 = 1;
pub(crate) const ERR_KERNEL: u32 = 2;

impl RunErrors {
    pub fn record(&self, code: u32, value: u32) {
        if self
            .code
            .compare_exchange(0, code, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            self.value.store(value, Ordering::Release);
        }
    }

    pub fn take(&self) -> Option<(u32, u32)> {
        let code = self.code.swap(0, Ordering::AcqRel);
        (code != 0).then(|| (code, self.value.load(Ordering::Acquire)))
    }
}

/// Most sources an op has (`SsmScanBack`: the scan's state, x, dt, A, B, C, and dy).
pub(crate) const MAX_SRC: usize = 8;

/// Everything one step needs.
#[derive(Clone, Copy)]
pub(crate) struct StepArgs<'a> {
    pub op: Op,
    /// A packed copy of source 0 when it is a weight that has one (matrix products and row
    /// lookups; the latter read the same values from it).
    pub packed: Option<&'a crate::packed::PackedWeight>,
    /// Source 0's bytes are gone: only `packed` holds its values (a kernel that cannot use
    /// `packed` must report an error rather than read the bytes).
    pub source_dropped: bool,
    pub dst: RawTensor,
    pub src: [Option<RawTensor>; MAX_SRC],
    pub work: *mut u8,
    pub work_len: usize,
    pub errors: &'a RunErrors,
    /// Reference mode: f64 accumulation, activations not quantized.
    pub strict: bool,
    /// F32 products in bf16 (`ExecOptions::bf16_matmul`).
    pub bf16_matmul: bool,
    /// This step's shared work counter, 0 when the step starts (see [`StepArgs::claim`]).
    pub claims: &'a AtomicUsize,
    /// This step's shares of work, one per thread, none taken when the step starts (see
    /// [`StepArgs::for_shares`]).
    pub shares: &'a [shares::Share],
    /// Whether the kernel may use [`StepArgs::claim`]: false when it runs more than once in
    /// the step (per batch, see `per_batch`), where one counter cannot serve every run.
    pub claimable: bool,
    /// Chunks one query row's attention over a long F16 cache is split into (by kv rows):
    /// the executor's thread count, however many of its threads run this step, so results do
    /// not depend on the adaptive thread choice.
    pub kv_splits: usize,
    /// The step's index in its plan (`set_rows` spreads one-row writes of neighbouring steps
    /// over the threads with it).
    pub step: usize,
}

impl StepArgs<'_> {
    /// The next unclaimed `chunk` of `0..n`, for work handed out to whichever thread is free
    /// (a thread slowed by a busy sibling core takes less of it); `None` when all is taken.
    /// At most one loop of claims per step (the counter is not reset inside a step).
    #[inline]
    pub fn claim(&self, n: usize, chunk: usize) -> Option<Range<usize>> {
        let start = self.claims.fetch_add(chunk, Ordering::Relaxed);
        (start < n).then(|| start..(start + chunk).min(n))
    }

    /// Hands out `0..n` to the step's threads (`shares`): each takes its own contiguous share
    /// from the front, read in order so its weights stream, and one that runs out takes from
    /// the back of the others' shares, so a thread slowed by a busy sibling core hands its last
    /// items to the others. Calls `f` on each range; at most one such loop per step. Where the
    /// kernel runs more than once in the step (not [`StepArgs::claimable`]), a static split.
    ///
    /// Measured on SmolLM2 Q4_1 decode, 2 threads (median of 8 interleaved runs, 25–39 GB/s),
    /// when the last quarter went from one shared counter: every range claimed in eighths
    /// 206 t/s, three quarters static and a claimed quarter 223 t/s, a static split 221 t/s.
    pub fn for_shares(&self, n: usize, ith: usize, nth: usize, mut f: impl FnMut(Range<usize>)) {
        if n == 0 {
            return;
        }
        if nth == 1 {
            f(0..n);
        } else if self.claimable && self.shares.len() >= nth && n <= shares::MAX_ITEMS {
            shares::for_each_taken(self.shares, n, ith, nth, f);
        } else {
            f(split(n, ith, nth));
        }
    }

    /// Source `i` (the graph builder guarantees the op's sources are present).
    #[inline]
    pub fn src(&self, i: usize) -> RawTensor {
        match self.src[i] {
            Some(t) => t,
            None => self.dst,
        }
    }
}

/// Runs an attention kernel once per batch of q's dimension 3 (`Op::FlashAttn` with B
/// independent batches, and its gradient): q, k, v and the output (or, for `backward`, dO)
/// are narrowed to batch b; the mask and kv length are shared. The gradient's flat output
/// holds all of dq, then dk, then dv: `run` gets a pointer to batch b's dq and where its dk
/// and dv are from there (elements). Every thread walks the batches in the same order, so
/// the kernels' barriers match, and waits for the others between batches (a kernel's shared
/// scratch, like the gradient's per-row statistics, serves every batch).
fn per_batch(
    a: &StepArgs<'_>,
    ctx: &Ctx<'_>,
    backward: bool,
    run: impl Fn(&StepArgs<'_>, Option<[usize; 2]>),
) {
    let batches = a.src(0).layout.ne[3];
    if batches <= 1 {
        return run(a, None);
    }
    let narrow = |t: RawTensor, b: usize| RawTensor {
        ptr: t.ptr.wrapping_add(b * t.layout.nb[3]),
        layout: Layout {
            ne: [t.layout.ne[0], t.layout.ne[1], t.layout.ne[2], 1],
            ..t.layout
        },
    };
    let n_src = a.src.iter().take_while(|s| s.is_some()).count();
    let [nq, nk] = [0, 1].map(|i| a.src(i).layout.n_elements());
    let [bq, bk, bv] = [0, 1, 2].map(|i| a.src(i).layout.n_elements() / batches);
    for b in 0..batches {
        if b > 0 && ctx.barrier().is_err() {
            return;
        }
        let mut src = a.src;
        for (i, s) in src.iter_mut().enumerate().take(n_src) {
            let is_batched = i < 3 || (backward && i == n_src - 1);
            if let (true, Some(t)) = (is_batched, *s) {
                *s = Some(narrow(t, b));
            }
        }
        if backward {
            let dst = RawTensor {
                ptr: a.dst.ptr.wrapping_add(b * bq * 4),
                layout: a.dst.layout,
            };
            // dk_b and dv_b, counted from dq_b.
            let dk = nq - b * bq + b * bk;
            let dv = nq + nk - b * bq + b * bv;
            run(
                &StepArgs {
                    src,
                    dst,
                    claimable: false,
                    ..*a
                },
                Some([dk, dv]),
            );
        } else {
            let dst = narrow(a.dst, b);
            run(
                &StepArgs {
                    src,
                    dst,
                    claimable: false,
                    ..*a
                },
                None,
            );
        }
    }
}

/// The part of `0..n` thread `ith` of `nth` works on.
#[inline]
pub(crate) fn split(n: usize, ith: usize, nth: usize) -> Range<usize> {
    let per = n.div_ceil(nth);
    let start = (ith * per).min(n);
    start..(start + per).min(n)
}

/// `(i1, i2, i3)` of flat row `r` of a layout.
#[inline]
pub(crate) fn row_index(l: &Layout, r: usize) -> (usize, usize, usize) {
    (
        r % l.ne[1],
        (r / l.ne[1]) % l.ne[2],
        r / (l.ne[1] * l.ne[2]),
    )
}

pub(crate) use matmul::mul_mat_fused;

/// Runs one step's share on this thread.
pub(crate) fn compute(a: &StepArgs<'_>, ctx: &Ctx<'_>) {
    match a.op {
        Op::Leaf | Op::View => {}
        Op::MulMat => matmul::mul_mat(a, ctx),
        Op::Unary(u) => elementwise::unary(u, a, ctx),
        Op::Binary(b) => elementwise::binary(b, a, ctx),
        Op::Scale(s) => elementwise::scale(s, a, ctx),
        Op::Dropout { p, salt } => train::dropout(p, salt, a, ctx),
        Op::SwiGlu => elementwise::swiglu(a, ctx),
        Op::SwiGluBack => train_back::swiglu_back(a, ctx),
        Op::GeGlu => elementwise::geglu(a, ctx),
        Op::RmsNorm { eps } => norm::rms_norm(eps, a, ctx),
        Op::LayerNorm {
            eps,
            has_weight,
            has_bias,
        } => norm::layer_norm(eps, has_weight, has_bias, a, ctx),
        Op::SoftMax {
            scale,
            max_bias,
            has_mask,
        } => softmax::soft_max(scale, max_bias, has_mask, a, ctx),
        Op::DiagMaskInf { n_past } => attention::diag_mask_inf(n_past, a, ctx),
        Op::Rope {
            rope: r,
            has_freq_factors,
        } => rope::rope(&r, has_freq_factors, false, a, ctx),
        Op::FlashAttn {
            scale,
            softcap,
            has_mask,
            has_kv_len,
        } => per_batch(a, ctx, false, |a, _| {
            attention::flash_attn(scale, softcap, has_mask, has_kv_len, a, ctx)
        }),
        Op::GetRows => rows::get_rows(a, ctx),
        Op::SetRows => rows::set_rows(a, ctx),
        Op::Cpy => copy::cpy(a.src(0), a.dst, a, ctx),
        Op::Cont => copy::cpy(a.src(0), a.dst, a, ctx),
        Op::Concat { dim } => shape::concat(dim, a, ctx),
        Op::Sum => reduce::sum(false, a, ctx),
        Op::SumSq => reduce::sum(true, a, ctx),
        Op::SumRows => reduce::sum_rows(false, a, ctx),
        Op::Mean => reduce::sum_rows(true, a, ctx),
        Op::Argmax => reduce::argmax(a, ctx),
        Op::Argsort { descending } => reduce::argsort(descending, a, ctx),
        Op::TopK { k } => reduce::top_k(k, a, ctx),
        Op::OutProd => matmul::out_prod(a, ctx),
        Op::MulMatId => moe::mul_mat_id(a, ctx),
        Op::AddId => moe::add_id(a, ctx),
        Op::TakeRows => moe_back::take_rows(a, ctx),
        Op::TakeRowsBack => moe_back::take_rows_back(a, ctx),
        Op::MulMatIdT => moe_back::mul_mat_id_t(a, ctx),
        Op::OutProdId => moe_back::out_prod_id(a, ctx),
        Op::SsmConv => conv::ssm_conv(a, ctx),
        Op::SsmScan => conv::ssm_scan(a, ctx),
        Op::SsmConvBack => ssm_back::ssm_conv_back(a, ctx),
        Op::SsmScanBack => ssm_back::ssm_scan_back(a, ctx),
        Op::Im2Col {
            stride,
            pad,
            dilation,
        } => conv::im2col(stride, pad, dilation, a, ctx),
        Op::CrossEntropyLoss => train::cross_entropy_loss(a, ctx),
        Op::AdamW => train::adamw(a, ctx),
        Op::Sgd => train::sgd(a, ctx),
        Op::Fill(v) => train_back::fill(v, a, ctx),
        Op::UnaryBack(u) => train_back::unary_back(u, a, ctx),
        Op::ReduceTo => train_back::reduce_to(a, ctx),
        Op::Repeat => train_back::repeat(a, ctx),
        Op::RmsNormBack { eps } => train_back::rms_norm_back(eps, a, ctx),
        Op::LayerNormBack { eps } => train_back::layer_norm_back(eps, a, ctx),
        Op::SoftMaxBack { scale } => train_back::soft_max_back(scale, a, ctx),
        Op::DiagMaskZero { n_past } => train_back::diag_mask_zero(n_past, a, ctx),
        Op::RopeBack {
            rope: r,
            has_freq_factors,
        } => rope::rope(&r, has_freq_factors, true, a, ctx),
        Op::FlashAttnBack {
            scale,
            softcap,
            has_mask,
        } => per_batch(a, ctx, true, |a, at| {
            attention_back::flash_attn_back(scale, softcap, has_mask, at, a, ctx)
        }),
        Op::GetRowsBack => train_back::get_rows_back(a, ctx),
        Op::CrossEntropyLossBack => train_back::cross_entropy_loss_back(a, ctx),
        Op::MulMatT => matmul_back::mul_mat_t(a, ctx),
        Op::ViewBack { offset, nb, src_nb } => train_back::view_back(offset, nb, src_nb, a, ctx),
    }
}
