//! A Hugging Face model directory: `config.json` + `*.safetensors` (one file, or shards named by
//! `model.safetensors.index.json`) + optionally `tokenizer.json`.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use serde::Deserialize;

#[path = "model_dir_stack.rs"]
mod stack;
pub use stack::Stacked;

use crate::error::{Error, Result};
use crate::hf_config::HfConfig;
use crate::safetensors::{Dtype, SafetensorsFile};

/// JSON side files (config, index) larger than this are refused rather than read into memory.
pub const MAX_JSON_BYTES: u64 = 64 << 20;

pub const CONFIG_FILE: &str = "config.json";
pub const INDEX_FILE: &str = "model.safetensors.index.json";
pub const TOKENIZER_FILE: &str = "tokenizer.json";

/// Reads a UTF-8 text file, refusing files over [`MAX_JSON_BYTES`].
pub(crate) fn read_small_text(path: &Path) -> Result<String> {
    let len = std::fs::metadata(path)
        .map_err(|e| Error::io(path, e))?
        .len();
    if len > MAX_JSON_BYTES {
        return Err(Error::invalid(
            path,
            format!("{len} bytes is too large for a JSON side file (max {MAX_JSON_BYTES})"),
        ));
    }
    std::fs::read_to_string(path).map_err(|e| Error::io(path, e))
}

#[derive(Deserialize)]
struct ShardIndex {
    weight_map: BTreeMap<String, String>,
}

/// An opened HF model directory with every weight file mapped and validated.
pub struct HfModelDir {
    pub dir: PathBuf,
    pub config: HfConfig,
    /// Weight files in name order.
    pub shards: Vec<SafetensorsFile>,
    /// `tokenizer.json`, when present.
    pub tokenizer_json: Option<PathBuf>,
    /// Tensor name → index into `shards`.
    tensor_shard: HashMap<String, usize>,
    /// The 1-D F16 and BF16 tensors (norm weights, biases) converted to F32 once at open, back
    /// to back: the ops that read them (mul, add) take F32, and they are small.
    upcast: Vec<f32>,
    /// Tensor name → its element range in `upcast`.
    upcast_at: HashMap<String, std::ops::Range<usize>>,
    /// Rearranged copies of tensors stored in another layout, made by the first
    /// [`HfModelDir::rearrange`].
    transposed: std::sync::OnceLock<Transposed>,
    /// Tensors stored as many (a mixture of experts' per-expert matrices) stacked into one,
    /// made by the first [`HfModelDir::stack`].
    stacked: std::sync::OnceLock<stack::StackedCopies>,
}

/// How [`HfModelDir::rearrange`] reorders a tensor (PyTorch shape, outermost first).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rearrange {
    /// A matrix `[rows, cols]` becomes `[cols, rows]` (the shape then reads reversed).
    Transpose,
    /// The outermost dimension's rows, `groups` groups of `parts` parts (each part the same
    /// number of rows), regrouped as part-major: row `(g, p, i)` moves to `(p, g, i)`.
    GroupRows { groups: usize, parts: usize },
}

impl Rearrange {
    /// `data` (`shape`, `elem`-byte values) rearranged into `out` (the same size).
    fn apply(self, data: &[u8], shape: &[usize], elem: usize, out: &mut [u8]) {
        match self {
            Rearrange::Transpose => {
                let (rows, cols) = (shape[0], shape[1]);
                // Element (r, c) of [rows, cols] goes to (c, r) of [cols, rows].
                for r in 0..rows {
                    for c in 0..cols {
                        let (from, to) = ((r * cols + c) * elem, (c * rows + r) * elem);
                        out[to..to + elem].copy_from_slice(&data[from..from + elem]);
                    }
                }
            }
            Rearrange::GroupRows { groups, parts } => {
                let row = data.len() / shape[0];
                let per = shape[0] / (groups * parts) * row;
                for g in 0..groups {
                    for p in 0..parts {
                        let (from, to) = ((g * parts + p) * per, (p * groups + g) * per);
                        out[to..to + per].copy_from_slice(&data[from..from + per]);
                    }
                }
            }
        }
    }
}

/// Rearranged copies of tensors, back to back in an anonymous map, each starting on a
/// 64-byte boundary.
#[derive(Default)]
struct Transposed {
    /// `None` when nothing was selected.
    map: Option<memmap2::MmapMut>,
    /// Tensor name → its byte range in `map`, how it was rearranged, and the copy's dtype.
    at: HashMap<String, (std::ops::Range<usize>, Rearrange, Dtype)>,
}

/// A rearranged copy made by [`HfModelDir::rearrange`].
#[derive(Clone, Copy, Debug)]
pub struct Rearranged<'a> {
    /// The copy's little-endian bytes.
    pub bytes: &'a [u8],
    /// How it was rearranged.
    pub how: Rearrange,
    /// Its element type: the file's, except a 1-D F16 / BF16 tensor, whose copy is made from
    /// its F32 [`HfModelDir::upcast`] and is F32.
    pub dtype: Dtype,
}

impl HfModelDir {
    /// True if `dir` looks like a HF model directory (has a `config.json`).
    pub fn is_model_dir(dir: &Path) -> bool {
        dir.is_dir() && dir.join(CONFIG_FILE).is_file()
    }

    pub fn open(dir: impl AsRef<Path>) -> Result<HfModelDir> {
        let dir = dir.as_ref().to_path_buf();
        let config_path = dir.join(CONFIG_FILE);
        if !config_path.is_file() {
            return Err(Error::invalid(
                &dir,
                "not a model directory: config.json is missing",
            ));
        }
        let config = HfConfig::from_file(&config_path)?;

        let index_path = dir.join(INDEX_FILE);
        let shard_names = if index_path.is_file() {
            shards_from_index(&index_path)?
        } else {
            let mut names = Vec::new();
            let entries = std::fs::read_dir(&dir).map_err(|e| Error::io(&dir, e))?;
            for entry in entries {
                let entry = entry.map_err(|e| Error::io(&dir, e))?;
                let name = entry.file_name().to_string_lossy().into_owned();
                if name.ends_with(".safetensors") && entry.path().is_file() {
                    names.push(name);
                }
            }
            names.sort();
            names
        };
        if shard_names.is_empty() {
            return Err(Error::invalid(&dir, "no *.safetensors weight files"));
        }

        let mut shards = Vec::with_capacity(shard_names.len());
        let mut tensor_shard = HashMap::new();
        for (i, name) in shard_names.iter().enumerate() {
            let file = SafetensorsFile::open(dir.join(name))?;
            for t in file.tensors() {
                if tensor_shard.insert(t.name.clone(), i).is_some() {
                    return Err(Error::invalid(
                        file.path(),
                        format!("tensor '{}' appears in more than one weight file", t.name),
                    ));
                }
            }
            shards.push(file);
        }
        if index_path.is_file() {
            check_index_matches(&index_path, &shard_names, &tensor_shard)?;
        }

        let (mut upcast, mut upcast_at) = (Vec::new(), HashMap::new());
        for shard in &shards {
            for t in shard.tensors() {
                let to_f32: fn([u8; 2]) -> f32 = match t.dtype {
                    Dtype::F16 => |b| half::f16::from_le_bytes(b).to_f32(),
                    Dtype::BF16 => |b| half::bf16::from_le_bytes(b).to_f32(),
                    _ => continue,
                };
                if t.shape.len() != 1 {
                    continue;
                }
                // The bytes are present (parsing checked them), so this grows by at most twice
                // their size.
                let start = upcast.len();
                let data = shard.tensor_data(t);
                upcast.extend(data.chunks_exact(2).map(|b| to_f32([b[0], b[1]])));
                upcast_at.insert(t.name.clone(), start..upcast.len());
            }
        }
        let tokenizer = dir.join(TOKENIZER_FILE);
        Ok(HfModelDir {
            dir,
            config,
            shards,
            tokenizer_json: tokenizer.is_file().then_some(tokenizer),
            tensor_shard,
            upcast,
            upcast_at,
            transposed: std::sync::OnceLock::new(),
            stacked: std::sync::OnceLock::new(),
        })
    }

    /// Makes a rearranged copy of every F32, F16 or BF16 tensor `plan` names (by its name in
    /// the files), which [`HfModelDir::transposed`] then gives instead of the file's bytes: for
    /// checkpoints that store some tensors in another layout than every other model (GPT-2's
    /// `Conv1D` weights `[in, out]`, GPT-NeoX's q/k/v rows interleaved per head). Only the
    /// first successful call makes copies (later ones return at once). The copies take as
    /// much memory as the tensors; their bytes were checked present when the files were
    /// opened. Another dtype, or a shape the rearrangement does not fit, is an error naming
    /// the tensor.
    pub fn rearrange(&self, plan: impl Fn(&str) -> Option<Rearrange>) -> Result<()> {
        if self.transposed.get().is_some() {
            return Ok(());
        }
        // First the place of each copy (64-byte aligned, as weights in files are), then one
        // map for all of them.
        let mut tr = Transposed::default();
        let mut selected = Vec::new();
        let mut len = 0usize;
        for shard in &self.shards {
            for t in shard.tensors() {
                let Some(how) = plan(&t.name) else {
                    continue;
                };
                if tr.at.contains_key(&t.name) {
                    continue;
                }
                // A 1-D half tensor (a bias) is rearranged from its F32 copy, as the ops
                // reading it take F32.
                let (data, dtype) = match self.upcast(&t.name) {
                    Some(up) => (up, Dtype::F32),
                    None => (shard.tensor_data(t), t.dtype),
                };
                let elem = match dtype {
                    Dtype::F32 => 4,
                    Dtype::F16 | Dtype::BF16 => 2,
                    other => {
                        return Err(Error::invalid(
                            &self.dir,
                            format!(
                                "{}: {other:?} cannot be rearranged (F32, F16 and BF16 can)",
                                t.name
                            ),
                        ))
                    }
                };
                let n: Option<usize> = t.shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
                if n.and_then(|n| n.checked_mul(elem)) != Some(data.len()) {
                    return Err(Error::invalid(
                        &self.dir,
                        format!("{}: {} bytes for shape {:?}", t.name, data.len(), t.shape),
                    ));
                }
                let fits = match how {
                    Rearrange::Transpose => t.shape.len() == 2,
                    Rearrange::GroupRows { groups, parts } => {
                        let rows = t.shape.first().copied().unwrap_or(0);
                        groups > 0 && parts > 0 && rows % (groups * parts) == 0 && rows > 0
                    }
                };
                if !fits {
                    return Err(Error::invalid(
                        &self.dir,
                        format!("{}: shape {:?} does not fit {how:?}", t.name, t.shape),
                    ));
                }
                let start = len.next_multiple_of(64);
                len = start + data.len();
                tr.at.insert(t.name.clone(), (start..len, how, dtype));
                selected.push((data, start, t.shape.clone(), elem, how));
            }
        }
        if len > 0 {
            let mut map = memmap2::MmapMut::map_anon(len).map_err(|e| Error::io(&self.dir, e))?;
            for (data, start, shape, elem, how) in selected {
                how.apply(data, &shape, elem, &mut map[start..start + data.len()]);
            }
            tr.map = Some(map);
        }
        // Another thread may have made them meanwhile: the same copies.
        let _ = self.transposed.set(tr);
        Ok(())
    }

    /// The rearranged copy of `name` made by [`HfModelDir::rearrange`] (a transposed one's
    /// shape is the file's reversed), when there is one.
    pub fn transposed(&self, name: &str) -> Option<&[u8]> {
        self.rearranged(name).map(|r| r.bytes)
    }

    /// [`HfModelDir::transposed`] with the rearrangement that made the copy and its dtype.
    pub fn rearranged(&self, name: &str) -> Option<Rearranged<'_>> {
        let (range, how, dtype) = self.transposed.get()?.at.get(name)?;
        Some(Rearranged {
            bytes: &self.transposed_bytes()[range.clone()],
            how: *how,
            dtype: *dtype,
        })
    }

    /// Whether [`HfModelDir::rearrange`] has made its copies (later calls do nothing).
    pub fn is_rearranged(&self) -> bool {
        self.transposed.get().is_some()
    }

    /// Every copy of [`HfModelDir::transposed`], back to back (empty before
    /// [`HfModelDir::rearrange`]).
    pub fn transposed_bytes(&self) -> &[u8] {
        match self.transposed.get().and_then(|t| t.map.as_ref()) {
            Some(m) => m,
            None => &[],
        }
    }

    /// The F32 copy of 1-D F16 / BF16 tensor `name` (little-endian bytes), made at open.
    pub fn upcast(&self, name: &str) -> Option<&[u8]> {
        let range = self.upcast_at.get(name)?;
        Some(&self.upcast_bytes()[4 * range.start..4 * range.end])
    }

    /// Every F32 copy of [`HfModelDir::upcast`], back to back.
    pub fn upcast_bytes(&self) -> &[u8] {
        bytemuck::cast_slice(&self.upcast)
    }

    /// The weight file holding `name`, and the tensor.
    pub fn tensor(
        &self,
        name: &str,
    ) -> Option<(&SafetensorsFile, &crate::safetensors::SafetensorsTensor)> {
        let shard = &self.shards[*self.tensor_shard.get(name)?];
        Some((shard, shard.tensor(name)?))
    }

    pub fn n_tensors(&self) -> usize {
        self.tensor_shard.len()
    }
}

fn read_index(index_path: &Path) -> Result<ShardIndex> {
    let text = read_small_text(index_path)?;
    serde_json::from_str(&text).map_err(|e| Error::json(index_path, &e))
}

/// The distinct shard file names of an index, each a plain file name inside the directory.
fn shards_from_index(index_path: &Path) -> Result<Vec<String>> {
    let index = read_index(index_path)?;
    let mut names: Vec<String> = index.weight_map.values().cloned().collect();
    names.sort();
    names.dedup();
    for n in &names {
        let plain = !n.is_empty() && !n.contains('/') && !n.contains('\\') && n != "." && n != "..";
        if !plain {
            return Err(Error::invalid(
                index_path,
                format!("weight_map names '{n}', which is not a plain file name in this directory"),
            ));
        }
    }
    Ok(names)
}

/// Every tensor the index names is in the shard it names.
fn check_index_matches(
    index_path: &Path,
    shard_names: &[String],
    tensor_shard: &HashMap<String, usize>,
) -> Result<()> {
    let index = read_index(index_path)?;
    for (tensor, file) in &index.weight_map {
        match tensor_shard.get(tensor) {
            Some(&i) if shard_names[i] == *file => {}
            Some(&i) => {
                return Err(Error::invalid(
                    index_path,
                    format!(
                        "tensor '{tensor}' is listed in {file} but found in {}",
                        shard_names[i]
                    ),
                ));
            }
            None => {
                return Err(Error::invalid(
                    index_path,
                    format!("tensor '{tensor}' is listed in {file} but not found there"),
                ));
            }
        }
    }
    Ok(())
}
