//! Where a trainer's initial weights come from, resolved into the model's hyperparameters, its
//! parameter list and f32 master values.

use tinynn_format::gguf::Value;
use tinynn_format::model_config::ModelConfig;
use tinynn_models::arch::{self, Arch, Hparams};
use tinynn_models::weights::WeightSource;

use tinynn_format::GgmlType;

use crate::error::{Result, TrainError};
use crate::lora::{init_adapter, LoraConfig};
use crate::params::{load_tensor, param_specs, random_params, Init, NamedTensor, ParamSpec};

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

/// A base tensor that is not trained (LoRA): its file type and bytes as they are.
pub(crate) struct Frozen {
    pub name: String,
    pub dtype: GgmlType,
    pub dims: Vec<usize>,
    /// The file's bytes (a map when large), so that they go back to the system when dropped
    /// after packing, instead of staying in the heap.
    pub bytes: HostBytes,
}

/// Bytes on the host that go back to the system when dropped.
pub(crate) enum HostBytes {
    Heap(Vec<u8>),
    /// From [`HostBytes::MAP_FROM`] bytes on: an anonymous map, unmapped when dropped (the
    /// allocator could keep a freed heap block resident, and the next buffers would not
    /// reuse it).
    Map(memmap2::MmapMut),
}

impl HostBytes {
    const MAP_FROM: usize = 64 << 10;

    /// A copy of `b`.
    fn copy_of(b: &[u8]) -> HostBytes {
        if b.len() >= HostBytes::MAP_FROM {
            if let Ok(mut m) = memmap2::MmapMut::map_anon(b.len()) {
                m.copy_from_slice(b);
                return HostBytes::Map(m);
            }
        }
        HostBytes::Heap(b.to_vec())
    }

    pub fn as_bytes(&self) -> &[u8] {
        match self {
            HostBytes::Heap(v) => v,
            HostBytes::Map(m) => m,
        }
    }
}

/// A resolved source.
pub(crate) struct Loaded<'a> {
    pub config: ModelConfig,
    /// The registry entry of the config's architecture (one the trainer takes).
    pub arch: &'static Arch,
    pub hparams: Hparams,
    /// The trainable parameters (the whole model, or the LoRA tensors).
    pub specs: Vec<ParamSpec>,
    pub values: Vec<NamedTensor>,
    /// Full fine-tuning of a model: the source the parameters' values are read from, straight
    /// into the trainer's buffers (`values` is then empty), one tensor at a time.
    pub deferred: Option<WeightSource<'a>>,
    /// With LoRA: the base model's tensors, in `param_specs` order.
    pub frozen: Vec<Frozen>,
    /// The GGUF metadata to copy into an export (GGUF sources only).
    pub gguf_metadata: Option<Vec<(String, Value)>>,
    /// A GGUF file's RoPE divisor tensors (`rope_freqs.weight`, LongRoPE's
    /// `rope_factors_short/long.weight`), carried into exports.
    pub rope_tensors: Vec<NamedTensor>,
}

/// Resolves `source`; with `lora`, the model's tensors become the frozen base (in their file
/// types) and the trainable parameters are the adapter's.
pub(crate) fn resolve<'a>(
    source: TrainSource<'a>,
    lora: Option<&LoraConfig>,
) -> Result<Loaded<'a>> {
    let Some(lora) = lora else {
        return resolve_full(source, false);
    };
    let mut loaded = resolve_full(source, true)?;
    if loaded.frozen.is_empty() {
        // A random base: its f32 values, frozen.
        loaded.frozen = std::mem::take(&mut loaded.values)
            .into_iter()
            .map(|t| Frozen {
                name: t.name,
                dtype: GgmlType::F32,
                dims: t.dims,
                bytes: HostBytes::copy_of(bytemuck::cast_slice(&t.data)),
            })
            .collect();
    }
    let base: Vec<(String, Vec<usize>)> = loaded
        .frozen
        .iter()
        .map(|f| (f.name.clone(), f.dims.clone()))
        .collect();
    let values = init_adapter(lora, &base);
    if values.is_empty() {
        return Err(TrainError::Invalid(format!(
            "the LoRA targets {} match no tensor of the model",
            lora.targets.to_list()
        )));
    }
    loaded.specs = values
        .iter()
        .map(|t| ParamSpec {
            name: t.name.clone(),
            dims: t.dims.clone(),
            init: Init::Zeros,
        })
        .collect();
    loaded.values = values;
    Ok(loaded)
}

/// The tensors of `specs` from `src` with their file types and bytes.
fn load_frozen(src: &WeightSource<'_>, specs: &[ParamSpec]) -> Result<Vec<Frozen>> {
    specs
        .iter()
        .map(|s| {
            let w = crate::params::source_weight(src, &s.name, &s.dims)?.ok_or_else(|| {
                TrainError::Param {
                    name: s.name.clone(),
                    message: "missing from the source".into(),
                }
            })?;
            let bytes = HostBytes::copy_of(w.data);
            // The copy serves from now on; the file's pages can go.
            src.release(w.data);
            Ok(Frozen {
                name: s.name.clone(),
                dtype: w.dtype,
                dims: s.dims.clone(),
                bytes,
            })
        })
        .collect()
}

/// `frozen`: load a model source's tensors as they are (into `Loaded::frozen`), not as f32.
fn resolve_full(source: TrainSource<'_>, frozen: bool) -> Result<Loaded<'_>> {
    match source {
        TrainSource::Random { config, seed } => {
            let arch = arch::for_training(&config)?;
            let hparams = Hparams::from_config(&config, false)?;
            let fresh = |name: &str| Ok(arch.decoder.fresh_has(&config, name));
            let specs = param_specs(arch, &hparams, &fresh)?;
            let values = random_params(&specs, seed);
            Ok(Loaded {
                config: *config,
                arch,
                hparams,
                specs,
                values,
                deferred: None,
                frozen: Vec::new(),
                gguf_metadata: None,
                rope_tensors: Vec::new(),
            })
        }
        TrainSource::Model(src) => {
            let config = src.config()?;
            let arch = arch::for_training(&config)?;
            let mut hparams = Hparams::from_config(&config, src.is_hf())?;
            let has = |name: &str| Ok(src.get(name)?.is_some());
            let specs = param_specs(arch, &hparams, &has)?;
            let (deferred, frozen) = if frozen {
                (None, load_frozen(&src, &specs)?)
            } else {
                // Fail now, before plans are compiled (and gradients and optimizer moments
                // sized from the config), if a parameter is missing or of other dims.
                for s in &specs {
                    if !crate::params::check_source_dims(&src, &s.name, &s.dims)? {
                        return Err(TrainError::Param {
                            name: s.name.clone(),
                            message: "missing from the source".into(),
                        });
                    }
                }
                (Some(src), Vec::new())
            };
            let n_pairs = hparams.rope.n_dims / 2;
            let mut rope_tensors = Vec::new();
            for name in [
                "rope_freqs.weight",
                "rope_factors_short.weight",
                "rope_factors_long.weight",
            ] {
                rope_tensors.extend(load_tensor(&src, name, &[n_pairs])?);
            }
            // Llama 3's divisors, or LongRoPE's short ones (the trainer switches to the long
            // ones for sequences past the original context: `Hparams::for_context`).
            for t in &rope_tensors {
                match t.name.as_str() {
                    "rope_factors_long.weight" => {
                        if let Some(l) = &mut hparams.longrope {
                            l.long = Some(t.data.clone());
                        }
                    }
                    _ => hparams.freq_factors = Some(t.data.clone()),
                }
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
                arch,
                hparams,
                specs,
                values: Vec::new(),
                deferred,
                frozen,
                gguf_metadata,
                rope_tensors,
            })
        }
    }
}
