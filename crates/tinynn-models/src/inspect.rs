//! What a model file or directory holds (`tnn inspect`, and any front end's model info):
//! format, architecture and whether tinynn can run, train and quantize it, parameters, file
//! type, config, metadata (long values summarized) and the tensor table, from a GGUF file, a
//! safetensors file or a Hugging Face directory.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Serialize;

use crate::arch;
use crate::{ModelError, Result};
use serde_json::{json, Value as Json};
use tinynn_format::gguf::{self, Array, GgufFile, Key, Value};
use tinynn_format::model_config::ModelConfig;
use tinynn_format::model_dir::HfModelDir;
use tinynn_format::safetensors::{dtype_name, SafetensorsFile, SafetensorsTensor};

/// Strings longer than this are shortened in the metadata listing (JSON keeps them whole).
const LONG_STRING: usize = 72;
/// Arrays longer than this are summarized as "N strings" / "N f32s".
const SHORT_ARRAY: usize = 8;

#[derive(Debug, Serialize)]
pub struct Report {
    pub path: String,
    /// `gguf`, `safetensors` or `hf-dir`.
    pub format: &'static str,
    pub gguf_version: Option<u32>,
    pub architecture: Option<String>,
    /// What tinynn does with the architecture (`run`, `train`, `quantize`; its registry line
    /// in `tinynn_models::arch`); empty when it does not know it.
    pub support: Vec<&'static str>,
    pub name: Option<String>,
    pub file_type: Option<String>,
    pub file_bytes: u64,
    pub n_params: u64,
    pub n_tensors: usize,
    pub tensor_bytes: u64,
    pub config: Option<ModelConfig>,
    /// Why `config` could not be derived, when it could not.
    pub config_error: Option<String>,
    pub split: Option<Json>,
    pub tokenizer_json: Option<String>,
    pub metadata: Vec<MetaEntry>,
    pub type_totals: Vec<TypeTotal>,
    pub tensors: Vec<TensorRow>,
}

#[derive(Debug, Serialize)]
pub struct MetaEntry {
    pub key: String,
    #[serde(rename = "type")]
    pub value_type: String,
    /// Short human form ("49152 strings").
    pub summary: String,
    /// Scalars and short arrays in full; long arrays as {element_type, len}.
    pub value: Json,
}

#[derive(Debug, Serialize)]
pub struct TensorRow {
    pub name: String,
    #[serde(rename = "type")]
    pub dtype: String,
    /// Outermost dimension first, as PyTorch prints shapes.
    pub shape: Vec<u64>,
    pub n_elements: u64,
    pub bytes: u64,
}

#[derive(Debug, Serialize)]
pub struct TypeTotal {
    #[serde(rename = "type")]
    pub dtype: String,
    pub tensors: usize,
    pub n_elements: u64,
    pub bytes: u64,
}

impl Report {
    pub fn build(path: &Path) -> Result<Report> {
        if path.is_dir() {
            return Report::from_hf_dir(path);
        }
        let is_safetensors = path.extension().is_some_and(|e| e == "safetensors");
        if is_safetensors {
            Report::from_safetensors(path)
        } else {
            Report::from_gguf(path)
        }
    }

    fn empty(path: &Path, format: &'static str) -> Report {
        Report {
            path: path.display().to_string(),
            format,
            gguf_version: None,
            architecture: None,
            support: Vec::new(),
            name: None,
            file_type: None,
            file_bytes: 0,
            n_params: 0,
            n_tensors: 0,
            tensor_bytes: 0,
            config: None,
            config_error: None,
            split: None,
            tokenizer_json: None,
            metadata: Vec::new(),
            type_totals: Vec::new(),
            tensors: Vec::new(),
        }
    }

    fn from_gguf(path: &Path) -> Result<Report> {
        let file = GgufFile::open(path)?;
        let g = file.gguf();
        let mut r = Report::empty(path, "gguf");
        r.gguf_version = Some(g.version());
        r.file_bytes = file.bytes().len() as u64;
        r.architecture = g.architecture().map(str::to_string);
        r.support = r
            .architecture
            .as_deref()
            .and_then(arch::by_name)
            .map_or_else(Vec::new, arch::Arch::capabilities);
        r.name = g
            .get_str(Key::GeneralName)
            .ok()
            .flatten()
            .map(str::to_string);
        r.file_type = match g.get_u64(Key::GeneralFileType) {
            Ok(Some(id)) => Some(
                gguf::file_type_name(id).map_or_else(|| format!("unknown ({id})"), str::to_string),
            ),
            _ => None,
        };
        match ModelConfig::from_gguf(g) {
            Ok(c) => r.config = Some(c),
            Err(e) => r.config_error = Some(e.to_string()),
        }
        if let Some(s) = g
            .split()
            .map_err(|e| ModelError::Invalid(format!("{}: split metadata: {e}", path.display())))?
        {
            r.split =
                Some(json!({"index": s.index, "count": s.count, "total_tensors": s.total_tensors}));
        }
        r.metadata = g
            .metadata()
            .iter()
            .map(|kv| meta_entry(&kv.key, &kv.value))
            .collect();
        r.tensors = g
            .tensors()
            .iter()
            .map(|t| TensorRow {
                name: t.name.clone(),
                dtype: t.ggml_type.name().to_string(),
                shape: t.dims.iter().rev().copied().collect(),
                n_elements: t.n_elements,
                bytes: t.n_bytes,
            })
            .collect();
        r.finish();
        Ok(r)
    }

    fn from_safetensors(path: &Path) -> Result<Report> {
        let file = SafetensorsFile::open(path)?;
        let mut r = Report::empty(path, "safetensors");
        r.file_bytes = file_len(path)?;
        r.metadata = sorted_string_meta(&file.header().metadata);
        r.tensors = file.tensors().iter().map(safetensors_row).collect();
        r.finish();
        Ok(r)
    }

    fn from_hf_dir(path: &Path) -> Result<Report> {
        let dir = HfModelDir::open(path)?;
        let mut r = Report::empty(path, "hf-dir");
        for shard in &dir.shards {
            r.file_bytes += file_len(shard.path())?;
            r.tensors
                .extend(shard.tensors().iter().map(safetensors_row));
        }
        r.tensors.sort_by(|a, b| a.name.cmp(&b.name));
        r.architecture = dir.config.model_type.clone();
        r.support = r
            .architecture
            .as_deref()
            .and_then(arch::by_hf_model_type)
            .map_or_else(Vec::new, arch::Arch::capabilities);
        r.name = dir
            .config
            .architectures
            .as_ref()
            .and_then(|a| a.first().cloned());
        r.file_type = dir.config.weight_dtype().map(str::to_string);
        r.tokenizer_json = dir.tokenizer_json.as_ref().map(|p| p.display().to_string());
        match ModelConfig::from_hf(&dir.config) {
            Ok(c) => r.config = Some(c),
            Err(e) => r.config_error = Some(e.to_string()),
        }
        let config_json = serde_json::to_value(&dir.config)
            .map_err(|e| ModelError::Invalid(format!("{}: config: {e}", path.display())))?;
        if let Json::Object(map) = config_json {
            r.metadata = map
                .into_iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| MetaEntry {
                    key: k,
                    value_type: json_type(&v).into(),
                    summary: shorten(&v.to_string()),
                    value: v,
                })
                .collect();
        }
        r.finish();
        Ok(r)
    }

    /// Totals derived from the tensor rows.
    fn finish(&mut self) {
        self.n_tensors = self.tensors.len();
        self.n_params = self.tensors.iter().map(|t| t.n_elements).sum();
        self.tensor_bytes = self.tensors.iter().map(|t| t.bytes).sum();
        let mut by_type: BTreeMap<&str, TypeTotal> = BTreeMap::new();
        for t in &self.tensors {
            let e = by_type.entry(&t.dtype).or_insert_with(|| TypeTotal {
                dtype: t.dtype.clone(),
                tensors: 0,
                n_elements: 0,
                bytes: 0,
            });
            e.tensors += 1;
            e.n_elements += t.n_elements;
            e.bytes += t.bytes;
        }
        self.type_totals = by_type.into_values().collect();
    }
}

fn safetensors_row(t: &SafetensorsTensor) -> TensorRow {
    TensorRow {
        name: t.name.clone(),
        dtype: dtype_name(t.dtype),
        shape: t.shape.iter().map(|&d| d as u64).collect(),
        n_elements: t.n_elements(),
        bytes: t.n_bytes as u64,
    }
}

fn sorted_string_meta(meta: &std::collections::HashMap<String, String>) -> Vec<MetaEntry> {
    let mut keys: Vec<&String> = meta.keys().collect();
    keys.sort();
    keys.into_iter()
        .map(|k| MetaEntry {
            key: k.clone(),
            value_type: "string".into(),
            summary: shorten(&format!("{:?}", meta[k])),
            value: Json::String(meta[k].clone()),
        })
        .collect()
}

/// The size of the file at `path`.
fn file_len(path: &Path) -> Result<u64> {
    std::fs::metadata(path)
        .map(|m| m.len())
        .map_err(|e| ModelError::Invalid(format!("{}: {e}", path.display())))
}

fn json_type(v: &Json) -> &'static str {
    match v {
        Json::Null => "null",
        Json::Bool(_) => "bool",
        Json::Number(_) => "number",
        Json::String(_) => "string",
        Json::Array(_) => "array",
        Json::Object(_) => "object",
    }
}

/// Cuts long text to [`LONG_STRING`] characters, saying how long it was.
fn shorten(s: &str) -> String {
    let n = s.chars().count();
    if n <= LONG_STRING {
        return s.to_string();
    }
    let head: String = s.chars().take(LONG_STRING - 12).collect();
    format!("{head}… ({n} chars)")
}

fn meta_entry(key: &str, v: &Value) -> MetaEntry {
    let value_type = match v {
        Value::Array(a) => format!("array<{}>", a.element_type().name()),
        _ => v.value_type().name().to_string(),
    };
    MetaEntry {
        key: key.to_string(),
        value_type,
        summary: shorten(&v.to_string()).replace('\n', "\\n"),
        value: value_json(v),
    }
}

fn value_json(v: &Value) -> Json {
    match v {
        Value::U8(x) => json!(x),
        Value::I8(x) => json!(x),
        Value::U16(x) => json!(x),
        Value::I16(x) => json!(x),
        Value::U32(x) => json!(x),
        Value::I32(x) => json!(x),
        Value::U64(x) => json!(x),
        Value::I64(x) => json!(x),
        Value::F32(x) => json!(x),
        Value::F64(x) => json!(x),
        Value::Bool(x) => json!(x),
        Value::String(s) => json!(s.to_string_lossy()),
        Value::Array(a) => array_json(a),
    }
}

fn array_json(a: &Array) -> Json {
    if a.len() > SHORT_ARRAY || matches!(a, Array::Array(_)) {
        return json!({"element_type": a.element_type().name(), "len": a.len()});
    }
    match a {
        Array::U8(v) => json!(v),
        Array::I8(v) => json!(v),
        Array::U16(v) => json!(v),
        Array::I16(v) => json!(v),
        Array::U32(v) => json!(v),
        Array::I32(v) => json!(v),
        Array::U64(v) => json!(v),
        Array::I64(v) => json!(v),
        Array::F32(v) => json!(v),
        Array::F64(v) => json!(v),
        Array::Bool(v) => json!(v),
        Array::String(v) => json!(v.iter().map(|s| s.to_string_lossy()).collect::<Vec<_>>()),
        Array::Array(v) => json!({"element_type": "array", "len": v.len()}),
    }
}
