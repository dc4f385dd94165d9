//! Mamba's decoder (Mamba 1: state-spaces/mamba and its HF ports) for inference and training.
//! No attention: each block mixes tokens with a depthwise causal convolution and a selective
//! scan whose state carries the past, so a sequence keeps a fixed-size state instead of a KV
//! cache (`crate::common::recurrent`).
//!
//! ```text
//! x = token_embd[tokens]                                              [e, n]
//! per block:  h = rms_norm(x)
//!             u | z = ssm_in(h)                                        [d_inner, n] each
//!             u = silu(conv1d(u) + conv_b)       causal, width d_conv, per channel
//!             dt | B | C = ssm_x(u)                                    [dt_rank | d_state | d_state, n]
//!             dt = ssm_dt(dt) + dt_b;  A = ssm_a (GGUF) or −exp(A_log) (HF)
//!             y = scan(u, softplus(dt), A, B, C) + D·u                 [d_inner, n]
//!             x = x + ssm_out(y · silu(z))
//! logits = output(rms_norm(x))          (tied to the embeddings unless the file has a head)
//! ```
//!
//! llama.cpp's converter stores `A = −exp(A_log)` (`blk.N.ssm_a`) and the convolution weight
//! squeezed to `[d_conv, d_inner]`; transformers keeps `A_log` and `[d_inner, 1, d_conv]`.
//! [`gguf_from_hf`] is the converter's rewrite.

use std::borrow::Cow;

use tinynn_core::graph::Graph;
use tinynn_core::ops::Unary;
use tinynn_core::tensor::TensorId;
use tinynn_format::model_config::ModelConfig;

use super::decoder::Decoder;
use super::hparams::{Hparams, SsmHparams};
use crate::common::{rows_of, Attention, Init, Leaves, Norm};
use crate::{ModelError, Result};

/// The Mamba decoder.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mamba;

pub static MAMBA: Mamba = Mamba;

/// `t` as F32 (half-precision checkpoints keep the convolution, A and D in F16 or BF16; the
/// SSM ops read F32): `t` itself when it is F32, else a converted copy.
fn f32_of(g: &mut Graph, t: TensorId) -> Result<TensorId> {
    if g.layout(t).dtype == tinynn_format::GgmlType::F32 {
        return Ok(t);
    }
    let ne = g.layout(t).ne;
    let dst = g.fill(&ne, 0.0)?;
    Ok(g.cpy(t, dst)?)
}

/// The block sizes of a model the registry says is Mamba.
fn ssm_of(hp: &Hparams) -> Result<SsmHparams> {
    hp.ssm
        .ok_or_else(|| ModelError::Invalid("a Mamba model without its SSM sizes".into()))
}

impl Decoder for Mamba {
    fn block(
        &self,
        g: &mut Graph,
        lv: &mut dyn Leaves,
        hp: &Hparams,
        at: &mut Attention<'_>,
        l: usize,
        x: TensorId,
    ) -> Result<TensorId> {
        let s = ssm_of(hp)?;
        let (e, di, ds, dtr, dc) = (hp.n_embd, s.d_inner, s.d_state, s.dt_rank, s.d_conv);
        let n = at.n_tokens;
        let blk = |p: &str| format!("blk.{l}.{p}");
        let norm = Norm::rms(g, lv, &blk("attn_norm.weight"), e, hp.norm_eps)?;
        let w_in = lv.linear(g, &blk("ssm_in"), e, 2 * di, true)?;
        // The convolution: `[d_conv, d_inner]` in GGUF files, `[d_conv, 1, d_inner]` in HF.
        let conv_dims: &[usize] = if hp.hf_layout {
            &[dc, 1, di]
        } else {
            &[dc, di]
        };
        let conv_w = lv.tensor(g, &blk("ssm_conv1d.weight"), conv_dims, Init::Normal)?;
        let conv_b = lv.optional(g, &blk("ssm_conv1d.bias"), &[di], Init::Zeros)?;
        let w_x = lv.linear(g, &blk("ssm_x"), di, dtr + 2 * ds, true)?;
        let w_dt = lv.linear(g, &blk("ssm_dt"), dtr, di, true)?;
        let a_init = Init::SsmA { log: hp.hf_layout };
        let a = lv.tensor(g, &blk("ssm_a"), &[ds, di], a_init)?; // [ds, di]
        let d = lv.tensor(g, &blk("ssm_d"), &[di], Init::Ones)?; // [di]
        let w_out = lv.linear(g, &blk("ssm_out"), di, e, true)?;

        let st = at.load_state(g, l, s.state_dims())?;
        let (nt, ns) = (st.n_t, st.n_seqs);
        let h = norm.forward(g, x)?; // [e, n]
        let uz = w_in.forward(g, h)?; // [2·di, n]
        let u = rows_of(g, uz, 0, di, n)?; // [di, n]
        let z = rows_of(g, uz, di, di, n)?; // [di, n]

        // The convolution reads each channel's inputs along time: [nt, di, ns] after the
        // state's d_conv − 1 earlier ones.
        let ut = g.reshape(u, &[di, nt, ns])?;
        let ut = g.permute(ut, [1, 0, 2, 3])?;
        let ut = g.cont(ut)?; // [nt, di, ns]
        let sx = g.concat(st.conv, ut, 0)?; // [dc − 1 + nt, di, ns]
        let conv_w = f32_of(g, conv_w)?;
        let conv_w = g.reshape(conv_w, &[dc, di])?;
        let uc = g.ssm_conv(sx, conv_w)?; // [di, nt, ns]
        let uc = match conv_b {
            Some(b) => {
                let b = f32_of(g, b)?;
                g.add(uc, b)?
            }
            None => uc,
        };
        let uc = g.silu(uc)?;
        // The next run's convolution state: the last d_conv − 1 inputs.
        let nb = g.layout(sx).nb;
        let conv_next = g.view(sx, &[dc - 1, di, ns], &[nb[1], nb[2]], nt * 4)?;
        let conv_next = g.cont(conv_next)?; // [dc − 1, di, ns]

        let uc = g.reshape(uc, &[di, n])?;
        let dbc = w_x.forward(g, uc)?; // [dtr + 2·ds, n]
        let dt = rows_of(g, dbc, 0, dtr, n)?; // [dtr, n]
        let b = rows_of(g, dbc, dtr, ds, n)?; // [ds, n]
        let c = rows_of(g, dbc, dtr + ds, ds, n)?; // [ds, n]
        let dt = w_dt.forward(g, dt)?; // [di, n]
        let a = f32_of(g, a)?;
        let a = if hp.hf_layout {
            // transformers keeps A_log: A = −exp(A_log).
            let ea = g.unary(Unary::Exp, a)?;
            g.scale(ea, -1.0)?
        } else {
            a
        };
        let grid = |g: &mut Graph, t: TensorId, rows: usize| g.reshape(t, &[rows, nt, ns]);
        let (ug, dtg) = (grid(g, uc, di)?, grid(g, dt, di)?);
        let (bg, cg) = (grid(g, b, ds)?, grid(g, c, ds)?);
        let scan = g.ssm_scan(st.ssm, ug, dtg, a, bg, cg)?; // flat: y, then the states
        let y = g.view(scan, &[di, n], &[di * 4], 0)?; // [di, n]
        let ssm_next = g.view(scan, &[ds, di, ns], &[ds * 4, ds * di * 4], di * n * 4)?;
        let ssm_next = g.cont(ssm_next)?; // [ds, di, ns]
        at.store_state(g, l, conv_next, ssm_next)?;

        let d = f32_of(g, d)?;
        let skip = g.mul(uc, d)?; // [di, n]
        let y = g.add(y, skip)?;
        let gate = g.silu(z)?;
        let y = g.mul(y, gate)?;
        let out = w_out.forward(g, y)?; // [e, n]
        Ok(g.add(x, out)?)
    }

    fn output_norm(
        &self,
        g: &mut Graph,
        lv: &mut dyn Leaves,
        hp: &Hparams,
        x: TensorId,
    ) -> Result<TensorId> {
        Norm::rms(g, lv, "output_norm.weight", hp.n_embd, hp.norm_eps)?.forward(g, x)
    }

    fn fresh_has(&self, c: &ModelConfig, name: &str) -> bool {
        if name == "output.weight" {
            return !c.tie_word_embeddings.unwrap_or(true);
        }
        // Mamba's defaults: biases on the convolution and the time step only.
        name.ends_with("ssm_conv1d.bias") || name.ends_with("ssm_dt.bias")
    }
}

/// The HF (transformers Mamba layout) name of a GGUF tensor name.
pub fn hf_name(gguf: &str) -> Option<Cow<'static, str>> {
    const FIXED: [(&str, &str); 3] = [
        ("token_embd.weight", "backbone.embeddings.weight"),
        ("output_norm.weight", "backbone.norm_f.weight"),
        ("output.weight", "lm_head.weight"),
    ];
    if let Some(&(_, hf)) = FIXED.iter().find(|(g, _)| *g == gguf) {
        return Some(Cow::Borrowed(hf));
    }
    let rest = gguf.strip_prefix("blk.")?;
    let (layer, tail) = rest.split_once('.')?;
    let hf = match tail {
        "ssm_a" => "mixer.A_log",
        "ssm_d" => "mixer.D",
        _ => {
            let (part, kind) = tail.rsplit_once('.')?;
            let module = match part {
                "attn_norm" => "norm",
                "ssm_in" => "mixer.in_proj",
                "ssm_conv1d" => "mixer.conv1d",
                "ssm_x" => "mixer.x_proj",
                "ssm_dt" => "mixer.dt_proj",
                "ssm_out" => "mixer.out_proj",
                _ => return None,
            };
            return Some(Cow::Owned(format!(
                "backbone.layers.{layer}.{module}.{kind}"
            )));
        }
    };
    Some(Cow::Owned(format!("backbone.layers.{layer}.{hf}")))
}

/// llama.cpp's converter's rewrite of an HF tensor (GGUF name, dims, values): `A = −exp(A_log)`,
/// and the convolution weight squeezed to `[d_conv, d_inner]`.
pub fn gguf_from_hf(name: &str, dims: &mut Vec<usize>, values: &mut [f32]) {
    if name.ends_with(".ssm_a") {
        values.iter_mut().for_each(|v| *v = -v.exp());
    }
    if name.ends_with(".ssm_conv1d.weight") && dims.len() == 3 && dims[1] == 1 {
        dims.remove(1);
    }
}

/// The inverse of [`gguf_from_hf`] (export to transformers' layout): `A_log = ln(−A)` and the
/// convolution weight as `[d_conv, 1, d_inner]`.
pub fn hf_from_gguf(name: &str, dims: &mut Vec<usize>, values: &mut [f32]) {
    if name.ends_with(".ssm_a") {
        values.iter_mut().for_each(|v| *v = (-*v).ln());
    }
    if name.ends_with(".ssm_conv1d.weight") && dims.len() == 2 {
        dims.insert(1, 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_map_both_ways_of_writing_a_block() {
        assert_eq!(
            hf_name("blk.3.ssm_a").as_deref(),
            Some("backbone.layers.3.mixer.A_log")
        );
        assert_eq!(
            hf_name("blk.0.ssm_d").as_deref(),
            Some("backbone.layers.0.mixer.D")
        );
        assert_eq!(
            hf_name("blk.1.ssm_conv1d.bias").as_deref(),
            Some("backbone.layers.1.mixer.conv1d.bias")
        );
        assert_eq!(
            hf_name("blk.2.attn_norm.weight").as_deref(),
            Some("backbone.layers.2.norm.weight")
        );
        assert_eq!(
            hf_name("output_norm.weight").as_deref(),
            Some("backbone.norm_f.weight")
        );
        assert_eq!(hf_name("blk.0.attn_q.weight"), None);
    }

    #[test]
    fn a_starts_as_s4d_real_in_both_layouts() {
        let gguf = Init::SsmA { log: false };
        let hf = Init::SsmA { log: true };
        // [d_state = 3, d_inner = 2]: each channel's states are −1, −2, −3.
        let a: Vec<f32> = (0..6).map(|k| gguf.fixed(k, 3).unwrap()).collect();
        assert_eq!(a, [-1.0, -2.0, -3.0, -1.0, -2.0, -3.0]);
        for (k, want) in a.iter().enumerate() {
            let log = hf.fixed(k, 3).unwrap();
            assert!((-log.exp() - want).abs() < 1e-6);
        }
    }

    #[test]
    fn the_rewrite_round_trips() {
        let mut dims = vec![4, 1, 8];
        let mut v = vec![0.5f32, -1.0, 2.0];
        gguf_from_hf("blk.0.ssm_conv1d.weight", &mut dims, &mut v);
        assert_eq!(dims, [4, 8]);
        let mut a = vec![0.5f32, -1.0, 2.0];
        gguf_from_hf("blk.0.ssm_a", &mut vec![3], &mut a);
        assert!(a.iter().all(|&x| x < 0.0));
        hf_from_gguf("blk.0.ssm_a", &mut vec![3], &mut a);
        for (x, y) in a.iter().zip([0.5f32, -1.0, 2.0]) {
            assert!((x - y).abs() < 1e-6, "{x} vs {y}");
        }
        hf_from_gguf("blk.0.ssm_conv1d.weight", &mut dims, &mut v);
        assert_eq!(dims, [4, 1, 8]);
    }
}
