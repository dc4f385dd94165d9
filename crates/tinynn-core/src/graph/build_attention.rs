//! Builders for the attention family: softmax (mask, ALiBi), causal masking, RoPE, and fused
//! attention.

use tinynn_format::GgmlType;

use super::{err, Graph, Result};
use crate::ops::{Op, Rope};
use crate::tensor::{Layout, TensorId};

const F32: GgmlType = GgmlType::F32;

/// Largest head size the fused attention kernel keeps on the stack.
pub const MAX_HEAD_DIM: usize = 512;

impl Graph {
    /// Softmax of each row of `a * scale + mask` (mask `[ne0, ≥ne1, m2, m3]`, m2 and m3
    /// dividing a's). With `max_bias > 0` the mask is scaled per head (dim 2) by ALiBi's slope.
    pub fn soft_max_ext(
        &mut self,
        a: TensorId,
        mask: Option<TensorId>,
        scale: f32,
        max_bias: f32,
    ) -> Result<TensorId> {
        const OP: &str = "soft_max";
        let la = self.f32_rows(OP, a)?;
        let mut src = vec![a];
        if let Some(m) = mask {
            let lm = self.f32_rows(OP, m)?;
            let fits = lm.ne[0] == la.ne[0]
                && lm.ne[1] >= la.ne[1]
                && la.ne[2] % lm.ne[2] == 0
                && la.ne[3] % lm.ne[3] == 0;
            if !fits {
                return err(
                    OP,
                    format!("mask {:?} does not fit scores {:?}", lm.ne, la.ne),
                );
            }
            src.push(m);
        }
        if !(max_bias >= 0.0 && max_bias.is_finite()) {
            return err(
                OP,
                format!("max_bias {max_bias} must be a finite number ≥ 0"),
            );
        }
        if max_bias > 0.0 && mask.is_none() {
            return err(OP, "ALiBi (max_bias > 0) needs a mask to scale");
        }
        let op = Op::SoftMax {
            scale,
            max_bias,
            has_mask: mask.is_some(),
        };
        Ok(self.computed(op, Layout::contiguous(F32, la.ne), src))
    }

    /// Softmax of each row of `a * scale (+ mask)`.
    pub fn soft_max(
        &mut self,
        a: TensorId,
        mask: Option<TensorId>,
        scale: f32,
    ) -> Result<TensorId> {
        self.soft_max_ext(a, mask, scale, 0.0)
    }

    /// `a` with `-inf` where `i0 > n_past + i1` (causal masking of `[n_kv, n_q, ..]` scores).
    pub fn diag_mask_inf(&mut self, a: TensorId, n_past: usize) -> Result<TensorId> {
        let la = self.f32_rows("diag_mask_inf", a)?;
        Ok(self.computed(
            Op::DiagMaskInf { n_past },
            Layout::contiguous(F32, la.ne),
            vec![a],
        ))
    }

    /// Rotary embedding of `a` `[head_dim, n_head, n_tokens, 1]` at I32 positions `[n_tokens]`,
    /// optionally dividing each frequency by `freq_factors` (F32 `[n_dims/2]`).
    pub fn rope_ext(
        &mut self,
        a: TensorId,
        positions: TensorId,
        freq_factors: Option<TensorId>,
        rope: Rope,
    ) -> Result<TensorId> {
        const OP: &str = "rope";
        let la = self.f32_rows(OP, a)?;
        self.check_id(OP, positions)?;
        let lp = *self.layout(positions);
        if lp.dtype != GgmlType::I32 || lp.ne != [la.ne[2], 1, 1, 1] || !lp.is_contiguous() {
            return err(
                OP,
                format!(
                    "positions must be contiguous I32 [{}], got {} {:?}",
                    la.ne[2], lp.dtype, lp.ne
                ),
            );
        }
        if la.ne[3] != 1 {
            return err(OP, "expects [head_dim, n_head, n_tokens, 1]");
        }
        if rope.n_dims == 0 || !rope.n_dims.is_multiple_of(2) || rope.n_dims > la.ne[0] {
            return err(
                OP,
                format!(
                    "n_dims {} must be even and at most the head size {}",
                    rope.n_dims, la.ne[0]
                ),
            );
        }
        let positive = [
            rope.freq_base,
            rope.freq_scale,
            rope.attn_factor,
            rope.beta_fast,
            rope.beta_slow,
        ];
        if positive.iter().any(|v| !(*v > 0.0 && v.is_finite()))
            || !(0.0..=1.0).contains(&rope.ext_factor)
        {
            return err(
                OP,
                "frequencies, factors and betas must be positive; ext_factor in [0, 1]",
            );
        }
        if rope.ext_factor > 0.0 && rope.n_ctx_orig == 0 {
            return err(
                OP,
                "YaRN (ext_factor > 0) needs the original context length",
            );
        }
        let mut src = vec![a, positions];
        if let Some(f) = freq_factors {
            let lf = self.f32_rows(OP, f)?;
            if lf.ne != [rope.n_dims / 2, 1, 1, 1] {
                return err(
                    OP,
                    format!(
                        "freq_factors must be [{}], got {:?}",
                        rope.n_dims / 2,
                        lf.ne
                    ),
                );
            }
            src.push(f);
        }
        let op = Op::Rope {
            rope,
            has_freq_factors: freq_factors.is_some(),
        };
        Ok(self.computed(op, Layout::contiguous(F32, la.ne), src))
    }

    /// Plain rotary embedding (no frequency factors).
    pub fn rope(&mut self, a: TensorId, positions: TensorId, rope: Rope) -> Result<TensorId> {
        self.rope_ext(a, positions, None, rope)
    }

    /// Fused attention: for every head h and query i, `softmax(q·kᵀ·scale + mask)·v` over the
    /// first `kv_len` (or all `n_kv`) rows of k and v, with `softcap > 0` applying
    /// `softcap·tanh(s/softcap)` to the scores. Shapes: q `[D, n_q, H, B]` F32, k `[D, n_kv, H_kv, B]`,
    /// v `[Dv, n_kv, H_kv, B]` (F32/F16/BF16, contiguous rows, H a multiple of H_kv), mask
    /// `[n_kv, ≥n_q]` F32 (shared by the B independent batches, e.g. the sequences of a
    /// training batch), kv_len I32 `[1]`. Result `[Dv, H, n_q, B]` F32.
    #[allow(clippy::too_many_arguments)]
    pub fn flash_attn(
        &mut self,
        q: TensorId,
        k: TensorId,
        v: TensorId,
        mask: Option<TensorId>,
        kv_len: Option<TensorId>,
        scale: f32,
        softcap: f32,
    ) -> Result<TensorId> {
        const OP: &str = "flash_attn";
        let lq = self.f32_operand(OP, q)?;
        self.check_id(OP, k)?;
        self.check_id(OP, v)?;
        let (lk, lv) = (*self.layout(k), *self.layout(v));
        for (name, l) in [("k", lk), ("v", lv)] {
            if !matches!(l.dtype, GgmlType::F32 | GgmlType::F16 | GgmlType::Bf16)
                || !l.rows_contiguous()
                || l.ne[3] != lq.ne[3]
            {
                return err(OP, format!("{name} must be F32/F16/BF16 [dim, n_kv, heads, {}] with contiguous rows, got {} {:?}", lq.ne[3], l.dtype, l.ne));
            }
        }
        let (d, n_q, h) = (lq.ne[0], lq.ne[1], lq.ne[2]);
        if lk.ne[0] != d || lv.ne[1] != lk.ne[1] || lv.ne[2] != lk.ne[2] || h % lk.ne[2] != 0 {
            return err(
                OP,
                format!(
                    "q {:?}, k {:?}, v {:?} do not fit together",
                    lq.ne, lk.ne, lv.ne
                ),
            );
        }
        if d > MAX_HEAD_DIM || lv.ne[0] > MAX_HEAD_DIM {
            return err(
                OP,
                format!("head sizes above {MAX_HEAD_DIM} are not supported"),
            );
        }
        if !(softcap >= 0.0 && softcap.is_finite()) {
            return err(OP, format!("softcap {softcap} must be a finite number ≥ 0"));
        }
        let mut src = vec![q, k, v];
        if let Some(m) = mask {
            let lm = self.f32_rows(OP, m)?;
            if lm.ne[0] != lk.ne[1] || lm.ne[1] < n_q || lm.ne[2] * lm.ne[3] != 1 {
                return err(
                    OP,
                    format!("mask {:?} must be [{}, ≥{}]", lm.ne, lk.ne[1], n_q),
                );
            }
            src.push(m);
        }
        if let Some(n) = kv_len {
            self.check_id(OP, n)?;
            let ln = *self.layout(n);
            if ln.dtype != GgmlType::I32 || ln.ne != [1, 1, 1, 1] {
                return err(OP, "kv_len must be an I32 [1]");
            }
            src.push(n);
        }
        let op = Op::FlashAttn {
            scale,
            softcap,
            has_mask: mask.is_some(),
            has_kv_len: kv_len.is_some(),
        };
        Ok(self.computed(
            op,
            Layout::contiguous(F32, [lv.ne[0], h, n_q, lq.ne[3]]),
            src,
        ))
    }
}
