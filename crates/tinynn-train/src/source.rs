//! Where a trainer's initial weights come from, resolved into the model's hyperparameters, its
//! parameter list and f32 master values.

use tinynn_format::gguf::Value;
use tinynn_format::model_config::ModelConfig;
use tinynn_models::llama::LlamaHparams;
use tinynn_models::weights::WeightSource;

use crate::error::Result;
use crate::params::{
    load_params, load_tensor, param_specs, random_params, Features, NamedTensor, ParamSpec,
};

/// The starting point of training.
pub enum TrainSource<'a> {
    /// A GGUF file or an HF directory; weights become f32 master copies.
    Model(WeightSource<'a>),
    /// Random init from a config with a seed (`params` module doc). Weights are laid out as in
    /// GGUF files (RoPE on adjacent pairs for Llama/Mistral).
    Random { config: Box<ModelConfig>, seed: u64 },
}

impl<'a, T: Into<WeightSource<'a>>> From<T> for TrainSource<'a> {
    fn from(src: T) -> Self {
        TrainSource::Model(src.into())
    }
}

/// A resolved source.
pub(crate) struct Loaded {
    pub config: ModelConfig,
    pub hparams: LlamaHparams,
    pub specs: Vec<ParamSpec>,
    pub values: Vec<NamedTensor>,
    /// The GGUF metadata to copy into an export (GGUF sources only).
    pub gguf_metadata: Option<Vec<(String, Value)>>,
    /// A GGUF `rope_freqs.weight`, carried into exports.
    pub rope_freqs_tensor: Option<NamedTensor>,
}

pub(crate) fn resolve(source: TrainSource<'_>) -> Result<Loaded> {
    match source {
        TrainSource::Random { config, seed } => {
            let hparams = LlamaHparams::from_config(&config, false)?;
            let specs = param_specs(&hparams, Features::from_config(&config));
            let values = random_params(&specs, seed);
            Ok(Loaded {
                config: *config,
                hparams,
                specs,
                values,
                gguf_metadata: None,
                rope_freqs_tensor: None,
            })
        }
        TrainSource::Model(src) => {
            let config = src.config()?;
            let mut hparams = LlamaHparams::from_config(&config, src.is_hf())?;
            let specs = param_specs(&hparams, Features::from_source(&src)?);
            let values = load_params(&src, &specs)?;
            let n_pairs = hparams.rope.n_dims / 2;
            let rope_freqs_tensor = load_tensor(&src, "rope_freqs.weight", &[n_pairs])?;
            if let Some(t) = &rope_freqs_tensor {
                hparams.freq_factors = Some(t.data.clone());
            }
            let gguf_metadata = match src {
                WeightSource::Gguf(f) => Some(
                    f.gguf()
                        .metadata()
                        .iter()
                        .map(|kv| (kv.key.clone(), kv.value.clone()))
                        .collect(),
                ),
                WeightSource::Hf(_) => None,
            };
            Ok(Loaded {
                config,
                hparams,
                specs,
                values,
                gguf_metadata,
                rope_freqs_tensor,
            })
        }
    }
}
