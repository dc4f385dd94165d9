//! LoRA: low-rank adapters on a frozen base. A targeted projection `y = W·x` becomes
//! `y = W·x + (alpha/r)·B·(A·dropout(x))`, with `A` (`[in, r]` in ggml dims, i.e. r rows of `in`
//! values) and `B` (`[r, out]`) the only trainable tensors. The base keeps its file type
//! (QLoRA: a quantized `W` is read by `mul_mat` as is; only the activation gradient flows
//! through it).
//!
//! - Names: the adapter tensors of `blk.L.attn_q.weight` are `blk.L.attn_q.weight.lora_a` and
//!   `.lora_b`, with the dims llama.cpp's adapter loader checks (`a.ne[0] == W.ne[0]`,
//!   `b.ne[1] == W.ne[1]`, `a.ne[1] == b.ne[0] == r`).
//! - Init (as peft's default): `A ~ U(−1/√in, 1/√in)` (PyTorch's `kaiming_uniform_(a=√5)`),
//!   seeded; `B = 0`, so an untrained adapter leaves the model unchanged.
//! - Dropout: each adapted projection has its own mask per micro-batch (keep with probability
//!   `1 − p`, scaled by `1/(1 − p)`), drawn from a seeded [`Rng`] whose state checkpoints keep.

use std::path::Path;

use tinynn_format::gguf::{GgufWriter, Value};
use tinynn_format::GgmlType;

use crate::error::{Result, TrainError};
use crate::params::NamedTensor;
use crate::rng::Rng;

/// The projections LoRA can target: short name → GGUF tensor stem (the last four: Mamba's).
pub const MODULES: [(&str, &str); 12] = [
    ("q", "attn_q"),
    ("k", "attn_k"),
    ("v", "attn_v"),
    ("o", "attn_output"),
    ("gate", "ffn_gate"),
    ("up", "ffn_up"),
    ("down", "ffn_down"),
    ("qkv", "attn_qkv"),
    ("in", "ssm_in"),
    ("x", "ssm_x"),
    ("dt", "ssm_dt"),
    ("out", "ssm_out"),
];

/// The fused q/k/v projection (GPT-2's `attn_qkv`), which `q`, `k` or `v` also target: a model
/// that has it has no separate ones (as peft adapts GPT-2's `c_attn` for them).
const FUSED_QKV: &str = "attn_qkv";

/// A set of [`MODULES`] (bit i = module i).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Targets(u16);

impl Targets {
    /// Parses a comma-separated list of short names (`q,k,v,o,gate,up,down,qkv`, Mamba's
    /// `in,x,dt,out`, or `all`).
    pub fn parse(s: &str) -> Result<Targets> {
        let mut bits = 0u16;
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            if part == "all" {
                bits = (1 << MODULES.len()) - 1;
                continue;
            }
            let i = MODULES
                .iter()
                .position(|(short, stem)| *short == part || *stem == part)
                .ok_or_else(|| {
                    TrainError::Invalid(format!(
                        "unknown LoRA target '{part}' (expected some of q,k,v,o,gate,up,down,qkv or Mamba's in,x,dt,out)"
                    ))
                })?;
            bits |= 1 << i;
        }
        if bits == 0 {
            return Err(TrainError::Invalid("no LoRA targets given".into()));
        }
        Ok(Targets(bits))
    }

    /// Whether GGUF tensor `name` (`blk.L.<stem>.weight`) is targeted.
    pub fn covers(&self, name: &str) -> bool {
        let Some(rest) = name.strip_prefix("blk.") else {
            return false;
        };
        let Some((layer, tail)) = rest.split_once('.') else {
            return false;
        };
        if layer.is_empty() || !layer.bytes().all(|b| b.is_ascii_digit()) {
            return false;
        }
        let Some(stem) = tail.strip_suffix(".weight") else {
            return false;
        };
        let chosen = |i: usize| self.0 & (1 << i) != 0;
        if stem == FUSED_QKV && (0..3).any(chosen) {
            return true;
        }
        MODULES
            .iter()
            .enumerate()
            .any(|(i, (_, s))| chosen(i) && stem == *s)
    }

    /// The short names, comma-separated.
    pub fn to_list(&self) -> String {
        MODULES
            .iter()
            .enumerate()
            .filter(|(i, _)| self.0 & (1 << i) != 0)
            .map(|(_, (short, _))| *short)
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// How to adapt a model.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LoraConfig {
    pub rank: usize,
    pub alpha: f32,
    /// Probability of zeroing an input element of the adapter branch (0 ≤ p < 1).
    pub dropout: f32,
    pub targets: Targets,
    /// Seeds `A`'s init and the dropout masks.
    pub seed: u64,
}

impl LoraConfig {
    /// `alpha / rank`.
    pub fn scale(&self) -> f32 {
        self.alpha / self.rank as f32
    }

    pub(crate) fn check(&self) -> Result<()> {
        if self.rank == 0 || !self.alpha.is_finite() || !(0.0..1.0).contains(&self.dropout) {
            return Err(TrainError::Invalid(format!(
                "LoRA needs rank ≥ 1, a finite alpha and 0 ≤ dropout < 1: {self:?}"
            )));
        }
        Ok(())
    }
}

/// The adapter tensor names of base tensor `w`.
pub fn adapter_names(w: &str) -> (String, String) {
    (format!("{w}.lora_a"), format!("{w}.lora_b"))
}

/// Initial adapter tensors for base tensors `(name, dims)` that `cfg` targets, in order:
/// A (seeded uniform), then B (zeros), per target.
pub fn init_adapter(cfg: &LoraConfig, base: &[(String, Vec<usize>)]) -> Vec<NamedTensor> {
    let mut rng = Rng::new(cfg.seed);
    let mut out = Vec::new();
    for (name, dims) in base
        .iter()
        .filter(|(n, d)| cfg.targets.covers(n) && d.len() == 2)
    {
        let (n_in, n_out) = (dims[0], dims[1]);
        let bound = 1.0 / (n_in as f32).sqrt();
        let (a, b) = adapter_names(name);
        out.push(NamedTensor {
            name: a,
            dims: vec![n_in, cfg.rank],
            data: (0..n_in * cfg.rank)
                .map(|_| bound * (2.0 * rng.next_f32() - 1.0))
                .collect(),
        });
        out.push(NamedTensor {
            name: b,
            dims: vec![cfg.rank, n_out],
            data: vec![0.0; cfg.rank * n_out],
        });
    }
    out
}

/// `w += scale · B·A` for a base tensor `w` of ggml dims `[n_in, n_out]` (row o holds output
/// o's `n_in` weights), `a` `[n_in, r]`, `b` `[r, n_out]`.
pub fn merge_into(w: &mut [f32], n_in: usize, a: &[f32], b: &[f32], rank: usize, scale: f32) {
    for (o, row) in w.chunks_exact_mut(n_in).enumerate() {
        let b_row = &b[o * rank..(o + 1) * rank];
        for (i, wi) in row.iter_mut().enumerate() {
            let mut d = 0f64;
            for (k, &bk) in b_row.iter().enumerate() {
                d += f64::from(bk) * f64::from(a[k * n_in + i]);
            }
            *wi += scale * d as f32;
        }
    }
}

/// Writes a llama.cpp GGUF LoRA adapter: `general.type = adapter`, `adapter.type = lora`,
/// `adapter.lora.alpha`, `general.architecture = arch`, and the `.lora_a`/`.lora_b` tensors
/// as F32. Atomic; returns the bytes written.
pub fn write_adapter(
    path: &Path,
    arch: &str,
    cfg: &LoraConfig,
    tensors: &[NamedTensor],
) -> Result<u64> {
    let mut w = GgufWriter::new();
    w.set_str("general.architecture", arch);
    w.set_str("general.type", "adapter");
    w.set_str("general.name", "tinynn LoRA adapter");
    w.set_str("adapter.type", "lora");
    w.set("adapter.lora.alpha", Value::F32(cfg.alpha));
    // Informative only (llama.cpp reads the rank from the tensors).
    w.set("adapter.lora.rank", Value::U32(cfg.rank as u32));
    w.set_str("adapter.lora.targets", &cfg.targets.to_list());
    let bytes: Vec<&[u8]> = tensors
        .iter()
        .map(|t| bytemuck::cast_slice::<f32, u8>(&t.data))
        .collect();
    for (t, b) in tensors.iter().zip(bytes) {
        let dims: Vec<u64> = t.dims.iter().map(|&d| d as u64).collect();
        w.add_tensor(&t.name, GgmlType::F32, &dims, b)?;
    }
    Ok(w.write_atomic(path)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_parse_and_cover() {
        let t = Targets::parse("q, v").unwrap();
        assert!(t.covers("blk.3.attn_q.weight") && t.covers("blk.0.attn_v.weight"));
        assert!(!t.covers("blk.0.attn_k.weight") && !t.covers("blk.0.attn_q.bias"));
        assert!(!t.covers("token_embd.weight") && !t.covers("blk.x.attn_q.weight"));
        assert_eq!(t.to_list(), "q,v");
        assert_eq!(
            Targets::parse("all").unwrap().to_list(),
            "q,k,v,o,gate,up,down,qkv,in,x,dt,out"
        );
        let m = Targets::parse("in,out").unwrap();
        assert!(m.covers("blk.0.ssm_in.weight") && m.covers("blk.2.ssm_out.weight"));
        assert!(!m.covers("blk.0.ssm_x.weight") && !m.covers("blk.0.ssm_conv1d.weight"));
        assert!(Targets::parse("q,zz").is_err() && Targets::parse("").is_err());
        // A fused q/k/v projection is adapted for any of q, k, v (or qkv), not for o alone.
        assert!(t.covers("blk.1.attn_qkv.weight"));
        assert!(Targets::parse("qkv")
            .unwrap()
            .covers("blk.1.attn_qkv.weight"));
        assert!(!Targets::parse("o,up")
            .unwrap()
            .covers("blk.1.attn_qkv.weight"));
        assert!(!t.covers("blk.1.attn_qkv.bias"));
    }

    #[test]
    fn merge_matches_the_product() {
        // W [in 3, out 2], A [3, r 2], B [2, 2].
        let a = [1.0, 2.0, 3.0, 0.5, -1.0, 0.0];
        let b = [1.0, 0.0, 2.0, -1.0];
        let mut w = vec![0.0; 6];
        merge_into(&mut w, 3, &a, &b, 2, 0.5);
        // ΔW[o][i] = Σ_k B[o][k]·A[k][i]; row 0 = A row 0, row 1 = 2·A0 − A1.
        assert_eq!(w, vec![0.5, 1.0, 1.5, 0.75, 2.5, 3.0]);
    }
}
