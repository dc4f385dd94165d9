//! safetensors files over a read-only mmap, validated by the `safetensors` crate (header size,
//! JSON, contiguous in-bounds offsets, sizes matching shape × dtype) before any tensor is touched.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

pub use ::safetensors::Dtype;
use ::safetensors::SafeTensors;

use crate::error::{Error, Result};
use crate::mmap::MappedFile;

/// One tensor of a safetensors file. `shape` is in PyTorch order (outermost first).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SafetensorsTensor {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    /// Absolute byte offset of the data in the file.
    pub data_start: usize,
    pub n_bytes: usize,
}

impl SafetensorsTensor {
    pub fn n_elements(&self) -> u64 {
        self.shape.iter().map(|&d| d as u64).product()
    }
}

/// The parsed header of a safetensors file.
#[derive(Debug, Clone, Default)]
pub struct SafetensorsHeader {
    /// Tensors in data order.
    pub tensors: Vec<SafetensorsTensor>,
    /// The optional `__metadata__` string map.
    pub metadata: HashMap<String, String>,
}

impl SafetensorsHeader {
    /// Parses and validates the header of a whole safetensors file held in `bytes`.
    pub fn parse(bytes: &[u8]) -> std::result::Result<SafetensorsHeader, String> {
        let (header_len, meta) = SafeTensors::read_metadata(bytes).map_err(|e| e.to_string())?;
        let data_base = 8 + header_len;
        let mut tensors = Vec::new();
        for name in meta.offset_keys() {
            let info = meta
                .info(&name)
                .ok_or_else(|| format!("tensor '{name}' is listed but has no info"))?;
            let (start, end) = info.data_offsets;
            let data_start = data_base
                .checked_add(start)
                .filter(|s| s.checked_add(end - start).is_some_and(|e| e <= bytes.len()))
                .ok_or_else(|| {
                    format!("tensor '{name}' data [{start}, {end}) lies outside the file")
                })?;
            tensors.push(SafetensorsTensor {
                name,
                dtype: info.dtype,
                shape: info.shape.clone(),
                data_start,
                n_bytes: end - start,
            });
        }
        Ok(SafetensorsHeader {
            tensors,
            metadata: meta.metadata().clone().unwrap_or_default(),
        })
    }
}

/// A mapped, validated safetensors file.
pub struct SafetensorsFile {
    path: PathBuf,
    map: MappedFile,
    header: SafetensorsHeader,
    index: HashMap<String, usize>,
}

impl SafetensorsFile {
    pub fn open(path: impl AsRef<Path>) -> Result<SafetensorsFile> {
        let path = path.as_ref().to_path_buf();
        let map = MappedFile::open(&path)?;
        let header =
            SafetensorsHeader::parse(map.bytes()).map_err(|message| Error::Safetensors {
                path: path.clone(),
                message,
            })?;
        let index = header
            .tensors
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.clone(), i))
            .collect();
        Ok(SafetensorsFile {
            path,
            map,
            header,
            index,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn header(&self) -> &SafetensorsHeader {
        &self.header
    }

    /// The whole mapped file.
    pub fn bytes(&self) -> &[u8] {
        self.map.bytes()
    }

    pub fn tensors(&self) -> &[SafetensorsTensor] {
        &self.header.tensors
    }

    pub fn tensor(&self, name: &str) -> Option<&SafetensorsTensor> {
        self.index.get(name).map(|&i| &self.header.tensors[i])
    }

    /// The bytes of `t` (zero copy, borrowed from the map).
    pub fn tensor_data(&self, t: &SafetensorsTensor) -> &[u8] {
        // Parsing checked the range against these very bytes.
        self.map
            .bytes()
            .get(t.data_start..t.data_start + t.n_bytes)
            .unwrap_or_default()
    }
}

/// The safetensors name of a dtype (`F32`, `BF16`, `F8_E4M3`, ...).
pub fn dtype_name(d: Dtype) -> String {
    format!("{d:?}")
}
