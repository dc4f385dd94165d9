//! GGUF writing: metadata, tensor infos, alignment padding, tensor data.
//!
//! Files are written atomically: into a temporary file in the destination's directory, fsync'd,
//! renamed over the final name, then the directory is fsync'd. A crash leaves either the old file
//! or the complete new one under the final name, never a half-written one.

use std::collections::HashSet;
use std::io::{self, Write};
use std::path::Path;

use super::keys::Key;
use super::reader::{Gguf, DEFAULT_ALIGNMENT, MAX_ALIGNMENT, MAX_DIMS, MAX_NAME_LEN};
use super::value::{Array, GgufString, Value};
use crate::error::{Error, Result};
use crate::ggml_type::GgmlType;

struct PendingTensor<'a> {
    name: String,
    dims: Vec<u64>,
    ggml_type: GgmlType,
    data: &'a [u8],
}

/// Collects metadata and tensors, then writes a GGUF v3 file.
pub struct GgufWriter<'a> {
    metadata: Vec<(String, Value)>,
    tensors: Vec<PendingTensor<'a>>,
    names: HashSet<String>,
}

impl Default for GgufWriter<'_> {
    fn default() -> Self {
        Self::new()
    }
}

impl<'a> GgufWriter<'a> {
    pub fn new() -> Self {
        GgufWriter {
            metadata: Vec::new(),
            tensors: Vec::new(),
            names: HashSet::new(),
        }
    }

    /// A writer holding the metadata and tensors of `gguf`, whose bytes are `file_bytes`.
    pub fn from_gguf(gguf: &Gguf, file_bytes: &'a [u8]) -> Result<Self> {
        let mut w = GgufWriter::new();
        for kv in gguf.metadata() {
            w.set(&kv.key, kv.value.clone());
        }
        for t in gguf.tensors() {
            let data = gguf.tensor_data(file_bytes, t).ok_or_else(|| {
                Error::Write(format!("tensor '{}' lies outside the given bytes", t.name))
            })?;
            w.add_tensor(&t.name, t.ggml_type, &t.dims, data)?;
        }
        Ok(w)
    }

    /// Sets a metadata value, replacing any earlier value of the same key in place.
    pub fn set(&mut self, key: &str, value: Value) {
        match self.metadata.iter_mut().find(|(k, _)| k == key) {
            Some(slot) => slot.1 = value,
            None => self.metadata.push((key.to_string(), value)),
        }
    }

    /// Sets a well-known key; architecture-scoped keys need `general.architecture` set first.
    pub fn set_key(&mut self, key: Key, value: Value) -> Result<()> {
        let name = if key.is_arch_scoped() {
            let arch = self
                .metadata
                .iter()
                .find(|(k, _)| k == Key::GeneralArchitecture.pattern())
                .and_then(|(_, v)| v.as_str())
                .ok_or_else(|| {
                    Error::Write(format!(
                        "{} needs general.architecture to be set first",
                        key.pattern()
                    ))
                })?;
            key.resolve(arch).into_owned()
        } else {
            key.pattern().to_string()
        };
        self.set(&name, value);
        Ok(())
    }

    pub fn set_str(&mut self, key: &str, value: &str) {
        self.set(key, Value::String(GgufString::from(value)));
    }

    /// Adds a tensor; `dims` in ggml order (`dims[0]` is the row length). `data` must be exactly the
    /// tensor's size for its type.
    pub fn add_tensor(
        &mut self,
        name: &str,
        ggml_type: GgmlType,
        dims: &[u64],
        data: &'a [u8],
    ) -> Result<()> {
        let bad = |msg: String| Error::Write(format!("tensor '{name}': {msg}"));
        if name.is_empty() || name.len() as u64 > MAX_NAME_LEN {
            return Err(bad(format!("name must be 1 to {MAX_NAME_LEN} bytes")));
        }
        if dims.is_empty()
            || dims.len() > MAX_DIMS
            || dims.iter().any(|&d| d == 0 || d > i64::MAX as u64)
        {
            return Err(bad(format!(
                "dims {dims:?} must be 1 to {MAX_DIMS} values, each at least 1"
            )));
        }
        let n_elements = dims
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
            .ok_or_else(|| bad("element count overflows".into()))?;
        let n_bytes = ggml_type.bytes_for(dims[0], n_elements).ok_or_else(|| {
            bad(format!(
                "row length {} is not a whole number of {ggml_type} blocks",
                dims[0]
            ))
        })?;
        if data.len() as u64 != n_bytes {
            return Err(bad(format!(
                "{} bytes of data given, {ggml_type} {dims:?} needs {n_bytes}",
                data.len()
            )));
        }
        if !self.names.insert(name.to_string()) {
            return Err(bad("added twice".into()));
        }
        self.tensors.push(PendingTensor {
            name: name.to_string(),
            dims: dims.to_vec(),
            ggml_type,
            data,
        });
        Ok(())
    }

    fn alignment(&self) -> Result<u64> {
        match self
            .metadata
            .iter()
            .find(|(k, _)| k == Key::GeneralAlignment.pattern())
        {
            None => Ok(DEFAULT_ALIGNMENT),
            Some((_, Value::U32(a))) if a.is_power_of_two() && u64::from(*a) <= MAX_ALIGNMENT => {
                Ok(u64::from(*a))
            }
            Some((_, v)) => Err(Error::Write(format!(
                "general.alignment must be a u32 power of two up to {MAX_ALIGNMENT}, got {v}"
            ))),
        }
    }

    /// Writes the whole file to `out`. Returns the number of bytes written.
    pub fn write_to(&self, out: &mut impl Write) -> Result<u64> {
        let alignment = self.alignment()?;
        let mut w = CountingWriter {
            inner: out,
            written: 0,
        };
        let io = |e: io::Error| Error::Write(e.to_string());

        w.put(b"GGUF").map_err(io)?;
        w.put(&3u32.to_le_bytes()).map_err(io)?;
        w.put(&(self.tensors.len() as u64).to_le_bytes())
            .map_err(io)?;
        w.put(&(self.metadata.len() as u64).to_le_bytes())
            .map_err(io)?;
        for (key, value) in &self.metadata {
            put_string(&mut w, key.as_bytes()).map_err(io)?;
            w.put(&(value.value_type() as u32).to_le_bytes())
                .map_err(io)?;
            put_value(&mut w, value).map_err(io)?;
        }
        let mut offset = 0u64;
        for t in &self.tensors {
            put_string(&mut w, t.name.as_bytes()).map_err(io)?;
            w.put(&(t.dims.len() as u32).to_le_bytes()).map_err(io)?;
            for d in &t.dims {
                w.put(&d.to_le_bytes()).map_err(io)?;
            }
            w.put(&t.ggml_type.id().to_le_bytes()).map_err(io)?;
            w.put(&offset.to_le_bytes()).map_err(io)?;
            offset = (offset + t.data.len() as u64).div_ceil(alignment) * alignment;
        }
        w.pad_to(alignment).map_err(io)?;
        for t in &self.tensors {
            w.put(t.data).map_err(io)?;
            w.pad_to(alignment).map_err(io)?;
        }
        Ok(w.written)
    }

    /// Writes the file atomically to `path` (temporary file, fsync, rename, fsync of the directory).
    pub fn write_atomic(&self, path: &Path) -> Result<u64> {
        crate::atomic_file::write_atomic(path, |mut out, _| self.write_to(&mut out))
    }
}

struct CountingWriter<'w, W: Write> {
    inner: &'w mut W,
    written: u64,
}

impl<W: Write> CountingWriter<'_, W> {
    fn put(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.inner.write_all(bytes)?;
        self.written += bytes.len() as u64;
        Ok(())
    }

    fn pad_to(&mut self, alignment: u64) -> io::Result<()> {
        const ZEROS: [u8; 64] = [0; 64];
        let mut pad = self.written.next_multiple_of(alignment) - self.written;
        while pad > 0 {
            let n = pad.min(ZEROS.len() as u64);
            self.put(&ZEROS[..n as usize])?;
            pad -= n;
        }
        Ok(())
    }
}

fn put_string<W: Write>(w: &mut CountingWriter<'_, W>, s: &[u8]) -> io::Result<()> {
    w.put(&(s.len() as u64).to_le_bytes())?;
    w.put(s)
}

fn put_value<W: Write>(w: &mut CountingWriter<'_, W>, v: &Value) -> io::Result<()> {
    match v {
        Value::U8(x) => w.put(&x.to_le_bytes()),
        Value::I8(x) => w.put(&x.to_le_bytes()),
        Value::U16(x) => w.put(&x.to_le_bytes()),
        Value::I16(x) => w.put(&x.to_le_bytes()),
        Value::U32(x) => w.put(&x.to_le_bytes()),
        Value::I32(x) => w.put(&x.to_le_bytes()),
        Value::F32(x) => w.put(&x.to_le_bytes()),
        Value::U64(x) => w.put(&x.to_le_bytes()),
        Value::I64(x) => w.put(&x.to_le_bytes()),
        Value::F64(x) => w.put(&x.to_le_bytes()),
        Value::Bool(x) => w.put(&[u8::from(*x)]),
        Value::String(s) => put_string(w, s.as_bytes()),
        Value::Array(a) => put_array(w, a),
    }
}

fn put_array<W: Write>(w: &mut CountingWriter<'_, W>, a: &Array) -> io::Result<()> {
    w.put(&(a.element_type() as u32).to_le_bytes())?;
    w.put(&(a.len() as u64).to_le_bytes())?;
    macro_rules! each_le {
        ($v:expr) => {{
            for x in $v {
                w.put(&x.to_le_bytes())?;
            }
            Ok(())
        }};
    }
    match a {
        Array::U8(v) => w.put(v),
        Array::I8(v) => each_le!(v),
        Array::U16(v) => each_le!(v),
        Array::I16(v) => each_le!(v),
        Array::U32(v) => each_le!(v),
        Array::I32(v) => each_le!(v),
        Array::F32(v) => each_le!(v),
        Array::U64(v) => each_le!(v),
        Array::I64(v) => each_le!(v),
        Array::F64(v) => each_le!(v),
        Array::Bool(v) => {
            for x in v {
                w.put(&[u8::from(*x)])?;
            }
            Ok(())
        }
        Array::String(v) => {
            for s in v {
                put_string(w, s.as_bytes())?;
            }
            Ok(())
        }
        Array::Array(v) => {
            for inner in v {
                put_array(w, inner)?;
            }
            Ok(())
        }
    }
}
