//! The trainable parameters of a model: which tensors exist (GGUF names and ggml dims, read
//! off its architecture's decoder by `tinynn_models::arch::declare`), and their initial f32
//! values — loaded from a GGUF file (quantized tensors dequantized) or an HF directory
//! (f32/f16/bf16 safetensors), or drawn at random.
//!
//! Random init follows transformers' `LlamaPreTrainedModel._init_weights`: every matrix (the
//! embedding included) ~ normal(0, 0.02), biases 0, RMSNorm weights 1.

use tinynn_core::quant::dequantize_row;
use tinynn_models::arch::{declare, Arch, Hparams};
use tinynn_models::weights::{Weight, WeightSource};

use crate::error::{Result, TrainError};

/// A named f32 tensor (a parameter, a gradient or an optimizer moment), dims in ggml order.
#[derive(Clone, Debug, PartialEq)]
pub struct NamedTensor {
    pub name: String,
    pub dims: Vec<usize>,
    pub data: Vec<f32>,
}

/// How a parameter starts in a random init (the decoder says, per tensor).
pub use tinynn_models::common::Init;

/// One trainable tensor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParamSpec {
    pub name: String,
    pub dims: Vec<usize>,
    pub init: Init,
}

/// Every parameter of a model of architecture `arch` with hyperparameters `hp`, in the order
/// the forward pass reads them; `has` says which optional tensors (biases, per-head norms, an
/// untied head) the model has — a source's own tensors, or `Decoder::fresh_has` for a random
/// init.
pub fn param_specs(
    arch: &Arch,
    hp: &Hparams,
    has: &dyn Fn(&str) -> tinynn_models::Result<bool>,
) -> Result<Vec<ParamSpec>> {
    Ok(declare(arch.decoder, hp, has)?
        .into_iter()
        .map(|d| ParamSpec {
            name: d.name,
            dims: d.dims,
            init: d.init,
        })
        .collect())
}

/// The f32 values of tensor `name` of `src` (dequantized), which must have `dims`; `None` when
/// the source lacks it.
pub fn load_tensor(
    src: &WeightSource<'_>,
    name: &str,
    dims: &[usize],
) -> Result<Option<NamedTensor>> {
    // The dims are checked against the file before a buffer is sized from them.
    let Some(w) = source_weight(src, name, dims)? else {
        return Ok(None);
    };
    let mut data = vec![0f32; dims.iter().product()];
    dequantize_weight(src, name, &w, &mut data)?;
    Ok(Some(NamedTensor {
        name: name.into(),
        dims: dims.to_vec(),
        data,
    }))
}

/// Whether `src` has tensor `name`, and an error when its dims are not `dims` (the values a
/// config implies must be the file's before anything is sized from the config).
pub fn check_source_dims(src: &WeightSource<'_>, name: &str, dims: &[usize]) -> Result<bool> {
    Ok(source_weight(src, name, dims)?.is_some())
}

/// Tensor `name` of `src` (`None` when it lacks it), which must have `dims`.
pub(crate) fn source_weight<'a>(
    src: &WeightSource<'a>,
    name: &str,
    dims: &[usize],
) -> Result<Option<Weight<'a>>> {
    let Some(w) = src.get(name)? else {
        return Ok(None);
    };
    let want: Vec<u64> = dims.iter().map(|&d| d as u64).collect();
    if w.dims != want {
        return Err(TrainError::Param {
            name: name.into(),
            message: format!(
                "the source has dims {:?}, the config implies {want:?}",
                w.dims
            ),
        });
    }
    Ok(Some(w))
}

/// [`load_tensor`] into `out` (`dims`' product of values) without a copy, then lets the file's
/// pages go; false when the source lacks the tensor.
pub fn dequantize_into(
    src: &WeightSource<'_>,
    name: &str,
    dims: &[usize],
    out: &mut [f32],
) -> Result<bool> {
    let Some(w) = source_weight(src, name, dims)? else {
        return Ok(false);
    };
    dequantize_weight(src, name, &w, out)?;
    Ok(true)
}

/// `w`'s values into `out`, then lets the file's pages go.
fn dequantize_weight(
    src: &WeightSource<'_>,
    name: &str,
    w: &Weight<'_>,
    out: &mut [f32],
) -> Result<()> {
    // Rows are whole blocks, so the tensor dequantizes as one long row.
    dequantize_row(w.dtype, w.data, out).map_err(|e| TrainError::Dequantize {
        name: name.into(),
        message: e.to_string(),
    })?;
    src.release(w.data);
    Ok(())
}

/// Every parameter of `specs` from `src`, as f32 master copies.
pub fn load_params(src: &WeightSource<'_>, specs: &[ParamSpec]) -> Result<Vec<NamedTensor>> {
    specs
        .iter()
        .map(|s| {
            load_tensor(src, &s.name, &s.dims)?.ok_or_else(|| TrainError::Param {
                name: s.name.clone(),
                message: "missing from the source".into(),
            })
        })
        .collect()
}

/// Seeded random values for `specs` (see the module doc). The same seed gives the same values.
pub fn random_params(specs: &[ParamSpec], seed: u64) -> Vec<NamedTensor> {
    let mut rng = crate::rng::Rng::new(seed);
    specs
        .iter()
        .map(|s| {
            let n: usize = s.dims.iter().product();
            let row = s.dims.first().copied().unwrap_or(1);
            let data = match s.init {
                Init::Normal => (0..n).map(|_| 0.02 * rng.normal()).collect(),
                fixed => (0..n).map(|k| fixed.fixed(k, row).unwrap_or(0.0)).collect(),
            };
            NamedTensor {
                name: s.name.clone(),
                dims: s.dims.clone(),
                data,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normal_init_has_the_asked_spread_and_is_seeded() {
        let specs = [
            ParamSpec {
                name: "w".into(),
                dims: vec![100, 200],
                init: Init::Normal,
            },
            ParamSpec {
                name: "b".into(),
                dims: vec![7],
                init: Init::Ones,
            },
        ];
        let p = random_params(&specs, 7);
        let xs: Vec<f64> = p[0].data.iter().map(|&x| f64::from(x)).collect();
        let mean = xs.iter().sum::<f64>() / xs.len() as f64;
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / xs.len() as f64;
        assert!(
            mean.abs() < 0.001 && (var.sqrt() - 0.02).abs() < 0.0005,
            "{mean} {var}"
        );
        assert_eq!(p[1].data, vec![1.0; 7]);
        assert_eq!(random_params(&specs, 7)[0].data, p[0].data);
        assert_ne!(random_params(&specs, 8)[0].data, p[0].data);
    }
}
