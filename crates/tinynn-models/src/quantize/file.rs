//! Quantizing a whole GGUF file: plan every tensor's type, convert tensor by tensor (the input
//! stays mapped; only the converted bytes are held), then write the result atomically.

use std::collections::BTreeMap;
use std::path::Path;

use tinynn_core::quant::has_quantizer;
use tinynn_format::gguf::{GgufFile, GgufWriter, Key, Value};
use tinynn_format::model_config::ModelConfig;
use tinynn_format::GgmlType;

use super::convert::convert_rows;
use super::policy::{choose_types, Choice, Fallback, ModelShape, TensorDesc};
use super::target::Target;
use super::QuantizeError;

/// How to quantize.
#[derive(Debug, Clone)]
pub struct Options {
    pub target: Target,
    /// Convert tensors that are already quantized (their quantization error adds up).
    pub allow_requantize: bool,
    pub threads: usize,
}

/// One tensor of the plan.
#[derive(Debug, Clone)]
pub struct TensorPlan {
    pub name: String,
    pub dims: Vec<u64>,
    pub from: GgmlType,
    pub choice: Choice,
}

impl TensorPlan {
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }

    /// True when the bytes change (otherwise they are copied).
    pub fn converts(&self) -> bool {
        self.from != self.choice.ty
    }
}

/// What happened, for the summary line.
#[derive(Debug, Clone)]
pub struct Report {
    pub input_bytes: u64,
    pub output_bytes: u64,
    /// Tensors per output type.
    pub counts: BTreeMap<GgmlType, usize>,
    /// Tensors that could not get the type the rules chose.
    pub fallbacks: Vec<(String, Fallback, GgmlType)>,
}

/// A progress notice, sent before each tensor is converted or copied.
pub struct Progress<'a> {
    pub index: usize,
    pub total: usize,
    pub tensor: &'a TensorPlan,
}

/// The model facts the policy needs, for the architectures it knows.
fn model_shape(file: &GgufFile) -> Result<ModelShape, QuantizeError> {
    let g = file.gguf();
    let arch = g
        .architecture()
        .ok_or_else(|| QuantizeError::Model("no general.architecture".into()))?
        .to_string();
    // The architectures whose tensor rules the policy knows: their registry lines say so.
    if crate::arch::by_name(&arch)
        .and_then(|a| a.quantize)
        .is_none()
    {
        return Err(QuantizeError::Architecture(arch));
    }
    let c = ModelConfig::from_gguf(g).map_err(|e| QuantizeError::Model(e.to_string()))?;
    Ok(ModelShape {
        arch,
        n_layer: c.n_layer,
        n_head: c.n_head,
        n_head_kv: c.n_head_kv,
        n_expert: c.experts.map_or(0, |x| x.count),
    })
}

/// Every tensor's output type for `target`, checking that the conversion can be done:
/// no already-quantized source unless `allow_requantize`, and readable / writable types only.
pub fn plan(file: &GgufFile, opts: &Options) -> Result<Vec<TensorPlan>, QuantizeError> {
    let model = model_shape(file)?;
    let descs: Vec<TensorDesc> = file
        .gguf()
        .tensors()
        .iter()
        .map(|t| TensorDesc {
            name: t.name.clone(),
            dims: t.dims.clone(),
            ty: t.ggml_type,
        })
        .collect();
    let choices = choose_types(&model, opts.target, &descs);
    let plan: Vec<TensorPlan> = descs
        .into_iter()
        .zip(choices)
        .map(|(d, choice)| TensorPlan {
            name: d.name,
            dims: d.dims,
            from: d.ty,
            choice,
        })
        .collect();
    let converted = || plan.iter().filter(|t| t.converts());
    // Dequantizing to F32 is exact: only a quantized or half-precision target adds error.
    let mut requantized: Vec<GgmlType> = converted()
        .filter(|t| t.choice.ty != GgmlType::F32)
        .map(|t| t.from)
        .filter(|ty| ty.is_quantized())
        .collect();
    if !requantized.is_empty() && !opts.allow_requantize {
        requantized.sort();
        requantized.dedup();
        return Err(QuantizeError::Requantize { types: requantized });
    }
    for t in converted() {
        if !has_quantizer(t.from) || !has_quantizer(t.choice.ty) {
            return Err(QuantizeError::Model(format!(
                "tensor '{}': {} → {} is not supported",
                t.name, t.from, t.choice.ty
            )));
        }
    }
    Ok(plan)
}

/// Quantizes `input` into a new GGUF file at `output` (written atomically). `progress` is called
/// before each tensor.
pub fn quantize_file(
    input: &GgufFile,
    output: &Path,
    opts: &Options,
    progress: &mut dyn FnMut(Progress<'_>),
) -> Result<Report, QuantizeError> {
    let dir = match output.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    if !dir.is_dir() {
        return Err(QuantizeError::NoOutputDir {
            path: output.to_path_buf(),
            dir: dir.to_path_buf(),
        });
    }
    let plan = plan(input, opts)?;
    let mut converted: Vec<Option<Vec<u8>>> = Vec::with_capacity(plan.len());
    for (index, (t, view)) in plan.iter().zip(input.tensors()).enumerate() {
        progress(Progress {
            index,
            total: plan.len(),
            tensor: t,
        });
        converted.push(if t.converts() {
            let row_len = t.dims[0] as usize;
            let n_rows = (t.n_elements() / t.dims[0]) as usize;
            let bytes = convert_rows(
                t.from,
                view.data,
                row_len,
                n_rows,
                t.choice.ty,
                opts.threads,
            )
            .map_err(|e| QuantizeError::Tensor {
                tensor: t.name.clone(),
                cause: e.to_string(),
            })?;
            Some(bytes)
        } else {
            None
        });
    }

    let mut w = GgufWriter::new();
    for kv in input.gguf().metadata() {
        // One output file: split bookkeeping of the input does not apply to it.
        if !kv.key.starts_with("split.") {
            w.set(&kv.key, kv.value.clone());
        }
    }
    w.set(
        Key::GeneralQuantizationVersion.pattern(),
        Value::U32(QUANTIZATION_VERSION),
    );
    w.set(
        Key::GeneralFileType.pattern(),
        Value::U32(opts.target.file_type()),
    );
    let mut report = Report {
        input_bytes: input.bytes().len() as u64,
        output_bytes: 0,
        counts: BTreeMap::new(),
        fallbacks: Vec::new(),
    };
    for ((t, view), bytes) in plan.iter().zip(input.tensors()).zip(&converted) {
        let data = bytes.as_deref().unwrap_or(view.data);
        w.add_tensor(&t.name, t.choice.ty, &t.dims, data)?;
        *report.counts.entry(t.choice.ty).or_default() += 1;
        if let Some(f) = t.choice.fallback {
            report.fallbacks.push((t.name.clone(), f, t.choice.ty));
        }
    }
    report.output_bytes = w
        .write_atomic(output)
        .map_err(|cause| QuantizeError::Write {
            path: output.to_path_buf(),
            cause,
        })?;
    Ok(report)
}

/// ggml's `GGML_QNT_VERSION`: the block layouts written are the current ones.
pub const QUANTIZATION_VERSION: u32 = 2;
