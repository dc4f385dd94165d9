//! Checkpoints: one GGUF file (`general.type = "checkpoint"`) per save, `DIR/checkpoint-<step>.gguf`,
//! holding the trained f32 tensors (weights or adapter tensors) and per-parameter state groups
//! (optimizer moments `opt.m.<name>` / `opt.v.<name>`, an EMA `ema.<name>`, ...), the step, the
//! learning-rate schedule, the data position, named RNG states and the training config (JSON).
//! Every tensor's bytes carry a checksum, and the metadata one more, all checked on load.
//!
//! Saving writes the file atomically (temporary file, fsync, rename, fsync the directory), then
//! the `DIR/latest` pointer (the file name) the same way, and only then deletes checkpoints
//! beyond the newest `keep_last`. The pointer is the commit point: a crash before it is
//! replaced leaves the previous checkpoint current. [`load_latest`] follows the pointer; when it
//! is missing or its target does not load, it falls back to the newest checkpoint that loads and
//! says why. One writer per directory.

use std::io;
use std::path::{Path, PathBuf};

use tinynn_format::gguf::{Array, GgufFile, GgufString, GgufWriter, Value};
use tinynn_format::GgmlType;

use crate::data::DataPosition;
use crate::schedule::Schedule;
use tinynn_format::atomic_file::{sync_dir, write_atomic_io as write_atomic};

pub const POINTER: &str = "latest";
/// Version 2 added `checkpoint.meta_checksum`.
const FORMAT_VERSION: u32 = 2;

/// Everything in a checkpoint except tensors.
#[derive(Clone, Debug, PartialEq)]
pub struct CheckpointMeta {
    /// Optimizer updates done.
    pub step: u64,
    /// `general.architecture` of the model, when known.
    pub architecture: Option<String>,
    pub schedule: Option<Schedule>,
    pub data: Option<DataPosition>,
    /// Named RNG states (e.g. `("dropout", state)`).
    pub rngs: Vec<(String, u64)>,
    /// The training configuration, free-form JSON (`{}` when empty).
    pub config_json: String,
}

/// A tensor to save, borrowed from the trainer: `dims` in ggml order (`dims[0]` is the row).
#[derive(Clone, Copy, Debug)]
pub struct TensorRef<'a> {
    pub name: &'a str,
    pub dims: &'a [u64],
    pub data: &'a [f32],
}

/// What to save.
pub struct Checkpoint<'a> {
    pub meta: CheckpointMeta,
    pub params: Vec<TensorRef<'a>>,
    /// Per-parameter state: a name prefix (e.g. `"opt.m."`) and one tensor per parameter, in
    /// `params` order, each with its parameter's shape; saved as `<prefix><param name>`.
    pub groups: Vec<(String, Vec<&'a [f32]>)>,
}

#[derive(Clone, Debug, Default)]
pub struct SaveOptions {
    /// Checkpoints to keep (the newest by step, always including the new one); 0 keeps all.
    pub keep_last: usize,
    /// Tests only: abort the process after this many bytes of the new checkpoint's temporary
    /// file are written.
    #[doc(hidden)]
    pub abort_after_bytes: Option<u64>,
}

#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("{}: {cause}", path.display())]
    Io { path: PathBuf, cause: io::Error },
    /// The file is not valid GGUF (truncated, corrupt header).
    #[error(transparent)]
    Format(#[from] tinynn_format::Error),
    #[error("{}: not a checkpoint (general.type is {found:?})", path.display())]
    NotACheckpoint {
        path: PathBuf,
        found: Option<String>,
    },
    #[error("{}: metadata {key}: {message}", path.display())]
    Metadata {
        path: PathBuf,
        key: String,
        message: String,
    },
    #[error("{}: tensor '{name}' is missing", path.display())]
    MissingTensor { path: PathBuf, name: String },
    #[error("{}: tensor '{name}' is {found}, checkpoints hold F32", path.display())]
    WrongType {
        path: PathBuf,
        name: String,
        found: GgmlType,
    },
    #[error("{}: tensor '{name}' has dims {got:?}, its parameter has {want:?}", path.display())]
    Shape {
        path: PathBuf,
        name: String,
        got: Vec<u64>,
        want: Vec<u64>,
    },
    #[error("{}: tensor '{name}' is corrupt (checksum mismatch)", path.display())]
    Corrupt { path: PathBuf, name: String },
    /// No checkpoint in the directory loads; each candidate with why.
    #[error("{}: no loadable checkpoint{}", dir.display(), tried.iter().map(|t| format!("; {t}")).collect::<String>())]
    NoCheckpoint { dir: PathBuf, tried: Vec<String> },
    /// Bad input to `save` (group sizes, tensor names or sizes, config not JSON).
    #[error("saving a checkpoint: {0}")]
    Invalid(String),
}

fn io_err(path: &Path) -> impl Fn(io::Error) -> CheckpointError + '_ {
    move |cause| CheckpointError::Io {
        path: path.to_path_buf(),
        cause,
    }
}

/// The file name of the checkpoint of `step`.
pub fn file_name(step: u64) -> String {
    format!("checkpoint-{step}.gguf")
}

fn step_of(name: &str) -> Option<u64> {
    let digits = name.strip_prefix("checkpoint-")?.strip_suffix(".gguf")?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// The checkpoints in `dir` as (step, path), oldest first. Temporary files are not listed.
pub fn list(dir: &Path) -> Result<Vec<(u64, PathBuf)>, CheckpointError> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io_err(dir))? {
        let entry = entry.map_err(io_err(dir))?;
        if let Some(step) = entry.file_name().to_str().and_then(step_of) {
            out.push((step, entry.path()));
        }
    }
    out.sort();
    Ok(out)
}

/// A checksum of bytes that catches any change of one 8-byte word (each step is a bijection).
fn checksum(bytes: &[u8]) -> u64 {
    const P: u64 = 0x0000_0100_0000_01B3;
    let mut h = 0xCBF2_9CE4_8422_2325u64;
    let mut words = bytes.chunks_exact(8);
    for w in &mut words {
        h = (h ^ u64::from_le_bytes(w.try_into().unwrap())).wrapping_mul(P);
    }
    for &b in words.remainder() {
        h = (h ^ u64::from(b)).wrapping_mul(P);
    }
    (h ^ bytes.len() as u64).wrapping_mul(P)
}

/// `checkpoint.meta_checksum`: a checksum over `m`'s step, architecture, config, schedule (as
/// its JSON), data position and random states, the parameter and group names, and the tensor
/// checksums, each length-prefixed (absent ones marked), so that any edit of them is caught.
fn meta_checksum(
    m: &CheckpointMeta,
    schedule_json: Option<&str>,
    params: &[String],
    groups: &[String],
    sums: &[u64],
) -> u64 {
    fn put(buf: &mut Vec<u8>, bytes: &[u8]) {
        buf.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
        buf.extend_from_slice(bytes);
    }
    fn opt(buf: &mut Vec<u8>, s: Option<&str>) {
        buf.push(u8::from(s.is_some()));
        put(buf, s.unwrap_or("").as_bytes());
    }
    let mut b = Vec::new();
    b.extend_from_slice(&m.step.to_le_bytes());
    opt(&mut b, m.architecture.as_deref());
    put(&mut b, m.config_json.as_bytes());
    opt(&mut b, schedule_json);
    b.push(u8::from(m.data.is_some()));
    if let Some(d) = &m.data {
        for v in [d.epoch, d.index, d.rng] {
            b.extend_from_slice(&v.to_le_bytes());
        }
    }
    for list in [params, groups] {
        b.extend_from_slice(&(list.len() as u64).to_le_bytes());
        list.iter().for_each(|s| put(&mut b, s.as_bytes()));
    }
    b.extend_from_slice(&(m.rngs.len() as u64).to_le_bytes());
    for (name, state) in &m.rngs {
        put(&mut b, name.as_bytes());
        b.extend_from_slice(&state.to_le_bytes());
    }
    sums.iter()
        .for_each(|s| b.extend_from_slice(&s.to_le_bytes()));
    checksum(&b)
}

fn f32_bytes(data: &[f32]) -> &[u8] {
    // Checkpoints are little-endian f32, like the machines they are written on.
    #[cfg(target_endian = "big")]
    compile_error!("checkpoints assume a little-endian machine");
    bytemuck::cast_slice(data)
}

fn strings(v: impl IntoIterator<Item = impl AsRef<str>>) -> Value {
    Value::Array(Array::String(
        v.into_iter()
            .map(|s| GgufString::from(s.as_ref()))
            .collect(),
    ))
}

/// Writes `ckpt` as `dir/checkpoint-<step>.gguf`, points `dir/latest` at it, then prunes old
/// checkpoints. Returns the new file's path.
pub fn save(
    dir: &Path,
    ckpt: &Checkpoint<'_>,
    opts: &SaveOptions,
) -> Result<PathBuf, CheckpointError> {
    let invalid = |m: String| CheckpointError::Invalid(m);
    let m = &ckpt.meta;
    serde_json::from_str::<serde_json::Value>(&m.config_json)
        .map_err(|e| invalid(format!("config is not JSON: {e}")))?;
    std::fs::create_dir_all(dir).map_err(io_err(dir))?;
    remove_stale_temps(dir);

    let mut w = GgufWriter::new();
    w.set_str("general.type", "checkpoint");
    if let Some(arch) = &m.architecture {
        w.set_str("general.architecture", arch);
    }
    w.set("checkpoint.version", Value::U32(FORMAT_VERSION));
    w.set("checkpoint.step", Value::U64(m.step));
    w.set_str("checkpoint.config", &m.config_json);
    if let Some(s) = &m.schedule {
        w.set_str("checkpoint.schedule", &s.to_json());
    }
    if let Some(d) = &m.data {
        w.set("checkpoint.data.epoch", Value::U64(d.epoch));
        w.set("checkpoint.data.index", Value::U64(d.index));
        w.set("checkpoint.data.rng", Value::U64(d.rng));
    }
    w.set("checkpoint.rng.names", strings(m.rngs.iter().map(|r| &r.0)));
    w.set(
        "checkpoint.rng.states",
        Value::Array(Array::U64(m.rngs.iter().map(|r| r.1).collect())),
    );
    w.set(
        "checkpoint.params",
        strings(ckpt.params.iter().map(|p| p.name)),
    );
    w.set(
        "checkpoint.groups",
        strings(ckpt.groups.iter().map(|g| &g.0)),
    );

    let mut sums = Vec::new();
    let mut add = |name: &str, dims: &[u64], data: &[f32]| {
        let n: u64 = dims.iter().product();
        if n != data.len() as u64 {
            return Err(invalid(format!(
                "tensor '{name}': dims {dims:?} need {n} values, {} given",
                data.len()
            )));
        }
        sums.push(checksum(f32_bytes(data)));
        Ok(())
    };
    // Checksums first (the writer borrows the data until it writes).
    for p in &ckpt.params {
        add(p.name, p.dims, p.data)?;
    }
    for (prefix, tensors) in &ckpt.groups {
        if tensors.len() != ckpt.params.len() {
            return Err(invalid(format!(
                "group '{prefix}' has {} tensors for {} parameters",
                tensors.len(),
                ckpt.params.len()
            )));
        }
        for (p, data) in ckpt.params.iter().zip(tensors) {
            add(&format!("{prefix}{}", p.name), p.dims, data)?;
        }
    }
    let schedule_json = m.schedule.as_ref().map(|s| s.to_json());
    let params: Vec<String> = ckpt.params.iter().map(|p| p.name.to_string()).collect();
    let groups: Vec<String> = ckpt.groups.iter().map(|g| g.0.to_string()).collect();
    let meta_sum = meta_checksum(m, schedule_json.as_deref(), &params, &groups, &sums);
    w.set("checkpoint.checksums", Value::Array(Array::U64(sums)));
    w.set("checkpoint.meta_checksum", Value::U64(meta_sum));
    let fmt = |e: tinynn_format::Error| invalid(e.to_string());
    for p in &ckpt.params {
        w.add_tensor(p.name, GgmlType::F32, p.dims, f32_bytes(p.data))
            .map_err(fmt)?;
    }
    for (prefix, tensors) in &ckpt.groups {
        for (p, data) in ckpt.params.iter().zip(tensors) {
            let name = format!("{prefix}{}", p.name);
            w.add_tensor(&name, GgmlType::F32, p.dims, f32_bytes(data))
                .map_err(fmt)?;
        }
    }

    let path = dir.join(file_name(m.step));
    write_atomic(&path, opts.abort_after_bytes, |out| {
        w.write_to(&mut &mut *out)
            .map(|_| ())
            .map_err(|e| io::Error::other(e.to_string()))
    })
    .map_err(io_err(&path))?;
    let pointer = dir.join(POINTER);
    let name = file_name(m.step);
    write_atomic(&pointer, None, |out| {
        out.write_all(format!("{name}\n").as_bytes())
    })
    .map_err(io_err(&pointer))?;
    if opts.keep_last > 0 {
        prune(dir, m.step, opts.keep_last)?;
    }
    Ok(path)
}

/// Removes temporary files a crashed save left behind.
fn remove_stale_temps(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let name = name.to_string_lossy();
        let ours = name.starts_with(".checkpoint-") || name.starts_with(".latest.");
        if ours && name.contains(".tmp-") {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

fn prune(dir: &Path, current: u64, keep: usize) -> Result<(), CheckpointError> {
    let all = list(dir)?;
    let n_old = all.len().saturating_sub(keep);
    let mut removed = false;
    for (step, path) in all.into_iter().take(n_old) {
        if step != current {
            std::fs::remove_file(&path).map_err(io_err(&path))?;
            removed = true;
        }
    }
    if removed {
        sync_dir(&dir.join(POINTER)).map_err(io_err(dir))?;
    }
    Ok(())
}

/// A loaded checkpoint; tensors are borrowed from the file's memory map.
pub struct LoadedCheckpoint {
    pub path: PathBuf,
    pub meta: CheckpointMeta,
    /// Parameter names, in saved order.
    pub params: Vec<String>,
    /// Group prefixes (`"opt.m."`, ...).
    pub groups: Vec<String>,
    /// When [`load_latest`] did not load the pointer's target: why, and what it loaded instead.
    pub fallback: Option<String>,
    file: GgufFile,
}

impl std::fmt::Debug for LoadedCheckpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedCheckpoint")
            .field("path", &self.path)
            .field("meta", &self.meta)
            .field("params", &self.params)
            .field("groups", &self.groups)
            .field("fallback", &self.fallback)
            .finish()
    }
}

/// A loaded tensor: dims (ggml order) and values.
#[derive(Clone, Copy, Debug)]
pub struct TensorData<'a> {
    pub name: &'a str,
    pub dims: &'a [u64],
    pub data: &'a [f32],
}

impl LoadedCheckpoint {
    /// A tensor by its full name (a parameter's, or `<prefix><param>`).
    pub fn tensor(&self, name: &str) -> Result<TensorData<'_>, CheckpointError> {
        let t = self
            .file
            .tensor(name)
            .ok_or_else(|| CheckpointError::MissingTensor {
                path: self.path.clone(),
                name: name.to_string(),
            })?;
        if t.ggml_type() != GgmlType::F32 {
            return Err(CheckpointError::WrongType {
                path: self.path.clone(),
                name: name.to_string(),
                found: t.ggml_type(),
            });
        }
        // GGUF data is aligned to at least 32 bytes in a page-aligned map.
        let data = bytemuck::try_cast_slice(t.data).map_err(|e| CheckpointError::Metadata {
            path: self.path.clone(),
            key: name.to_string(),
            message: format!("tensor data not readable as f32: {e}"),
        })?;
        Ok(TensorData {
            name: &t.info.name,
            dims: &t.info.dims,
            data,
        })
    }

    /// A parameter's state in group `prefix` (e.g. `group("opt.m.", "blk.0.attn_q.weight")`).
    pub fn group(&self, prefix: &str, param: &str) -> Result<&[f32], CheckpointError> {
        Ok(self.tensor(&format!("{prefix}{param}"))?.data)
    }

    /// The parameters in saved order.
    pub fn param_tensors(&self) -> impl Iterator<Item = Result<TensorData<'_>, CheckpointError>> {
        self.params.iter().map(|n| self.tensor(n))
    }

    /// A named RNG state.
    pub fn rng(&self, name: &str) -> Option<u64> {
        self.meta
            .rngs
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, s)| *s)
    }
}

/// Loads and fully checks one checkpoint file (types, shapes, checksums).
pub fn load(path: &Path) -> Result<LoadedCheckpoint, CheckpointError> {
    let file = GgufFile::open(path)?;
    let g = file.gguf();
    let path = path.to_path_buf();
    let meta_err = |key: &str, message: &str| CheckpointError::Metadata {
        path: path.clone(),
        key: key.to_string(),
        message: message.to_string(),
    };
    let kind = g.get_raw("general.type").and_then(Value::as_str);
    if kind != Some("checkpoint") {
        return Err(CheckpointError::NotACheckpoint {
            path: path.clone(),
            found: kind.map(str::to_string),
        });
    }
    let u64_of = |key: &str| -> Result<Option<u64>, CheckpointError> {
        match g.get_raw(key) {
            None => Ok(None),
            Some(Value::U64(v)) => Ok(Some(*v)),
            Some(_) => Err(meta_err(key, "must be a u64")),
        }
    };
    let str_of = |key: &str| -> Result<Option<&str>, CheckpointError> {
        match g.get_raw(key) {
            None => Ok(None),
            Some(Value::String(s)) => s
                .as_str()
                .map(Some)
                .ok_or_else(|| meta_err(key, "not UTF-8")),
            Some(_) => Err(meta_err(key, "must be a string")),
        }
    };
    let strs_of = |key: &str| -> Result<Vec<String>, CheckpointError> {
        match g.get_raw(key) {
            Some(Value::Array(Array::String(v))) => v
                .iter()
                .map(|s| s.as_str().map(str::to_string))
                .collect::<Option<_>>()
                .ok_or_else(|| meta_err(key, "not UTF-8")),
            _ => Err(meta_err(key, "missing or not an array of strings")),
        }
    };
    match g.get_raw("checkpoint.version") {
        Some(Value::U32(FORMAT_VERSION)) => {}
        other => {
            return Err(meta_err(
                "checkpoint.version",
                &format!("{other:?}, this build reads version {FORMAT_VERSION}"),
            ))
        }
    }
    let step = u64_of("checkpoint.step")?.ok_or_else(|| meta_err("checkpoint.step", "missing"))?;
    let schedule = str_of("checkpoint.schedule")?
        .map(|s| Schedule::from_json(s).map_err(|e| meta_err("checkpoint.schedule", &e.0)))
        .transpose()?;
    let data = match (
        u64_of("checkpoint.data.epoch")?,
        u64_of("checkpoint.data.index")?,
        u64_of("checkpoint.data.rng")?,
    ) {
        (Some(epoch), Some(index), Some(rng)) => Some(DataPosition { epoch, index, rng }),
        (None, None, None) => None,
        _ => {
            return Err(meta_err(
                "checkpoint.data",
                "epoch, index and rng go together",
            ))
        }
    };
    let rng_names = strs_of("checkpoint.rng.names")?;
    let rng_states = match g.get_raw("checkpoint.rng.states") {
        Some(Value::Array(Array::U64(v))) if v.len() == rng_names.len() => v.clone(),
        _ => {
            return Err(meta_err(
                "checkpoint.rng.states",
                "must be u64s, one per name",
            ))
        }
    };
    let config_json = str_of("checkpoint.config")?.unwrap_or("{}").to_string();
    let params = strs_of("checkpoint.params")?;
    let groups = strs_of("checkpoint.groups")?;
    let sums = match g.get_raw("checkpoint.checksums") {
        Some(Value::Array(Array::U64(v))) => v.clone(),
        _ => return Err(meta_err("checkpoint.checksums", "missing or not u64s")),
    };
    let schedule_json = str_of("checkpoint.schedule")?.map(str::to_string);
    let meta_sum = u64_of("checkpoint.meta_checksum")?;
    let ckpt = LoadedCheckpoint {
        meta: CheckpointMeta {
            step,
            architecture: str_of("general.architecture")?.map(str::to_string),
            schedule,
            data,
            rngs: rng_names.into_iter().zip(rng_states).collect(),
            config_json,
        },
        params,
        groups,
        fallback: None,
        path: path.clone(),
        file,
    };
    // One checksum per parameter and group: counts from the file, checked (with overflow
    // checks) against the checksums present before a single name is built.
    let tensors = (ckpt.groups.len().checked_add(1)).and_then(|g| g.checked_mul(ckpt.params.len()));
    if tensors != Some(sums.len()) {
        return Err(meta_err(
            "checkpoint.checksums",
            &format!(
                "{} checksums for {} parameters × {} state groups",
                sums.len(),
                ckpt.params.len(),
                ckpt.groups.len() + 1
            ),
        ));
    }
    // Every saved tensor, in saving order: F32, the parameter's shape, the right checksum.
    let mut names = ckpt.params.clone();
    for prefix in &ckpt.groups {
        names.extend(ckpt.params.iter().map(|p| format!("{prefix}{p}")));
    }
    if sums.len() != names.len() {
        return Err(meta_err(
            "checkpoint.checksums",
            &format!("{} checksums for {} tensors", sums.len(), names.len()),
        ));
    }
    for (i, name) in names.iter().enumerate() {
        let t = ckpt.tensor(name)?;
        let param = ckpt.tensor(&ckpt.params[i % ckpt.params.len()])?;
        if param.dims != t.dims {
            return Err(CheckpointError::Shape {
                path: path.clone(),
                name: name.clone(),
                got: t.dims.to_vec(),
                want: param.dims.to_vec(),
            });
        }
    }
    for (name, &sum) in names.iter().zip(&sums) {
        if checksum(f32_bytes(ckpt.tensor(name)?.data)) != sum {
            return Err(CheckpointError::Corrupt {
                path: path.clone(),
                name: name.clone(),
            });
        }
    }
    // The metadata (step, schedule, data position, random states) as written.
    let want = meta_checksum(
        &ckpt.meta,
        schedule_json.as_deref(),
        &ckpt.params,
        &ckpt.groups,
        &sums,
    );
    match meta_sum {
        Some(got) if got == want => Ok(ckpt),
        Some(_) => Err(meta_err(
            "checkpoint.meta_checksum",
            "the metadata does not match its checksum (the file was corrupted or edited)",
        )),
        None => Err(meta_err("checkpoint.meta_checksum", "missing")),
    }
}

/// Loads the checkpoint `dir/latest` names; when that fails, the newest checkpoint in `dir`
/// that loads, with the reason in `fallback`. [`CheckpointError::NoCheckpoint`] when none
/// loads (including a directory without checkpoints).
pub fn load_latest(dir: &Path) -> Result<LoadedCheckpoint, CheckpointError> {
    let pointer = dir.join(POINTER);
    let pointed = match std::fs::read_to_string(&pointer) {
        Ok(s) => {
            let name = s.trim();
            match step_of(name) {
                Some(_) => Ok(name.to_string()),
                None => Err(format!(
                    "{}: does not name a checkpoint: {name:?}",
                    pointer.display()
                )),
            }
        }
        Err(e) => Err(format!("{}: {e}", pointer.display())),
    };
    let mut tried = Vec::new();
    let mut skip = None;
    match pointed {
        Ok(name) => match load(&dir.join(&name)) {
            Ok(c) => return Ok(c),
            Err(e) => {
                tried.push(format!("{POINTER} names {name}, which does not load: {e}"));
                skip = Some(dir.join(&name));
            }
        },
        Err(why) => tried.push(why),
    }
    let candidates = match list(dir) {
        Ok(c) => c,
        Err(e) => {
            tried.push(e.to_string());
            Vec::new()
        }
    };
    for (_, path) in candidates.into_iter().rev() {
        if Some(&path) == skip.as_ref() {
            continue;
        }
        match load(&path) {
            Ok(mut c) => {
                tried.push(format!("loaded {} instead", path.display()));
                c.fallback = Some(tried.join("; "));
                return Ok(c);
            }
            Err(e) => tried.push(e.to_string()),
        }
    }
    Err(CheckpointError::NoCheckpoint {
        dir: dir.to_path_buf(),
        tried,
    })
}
