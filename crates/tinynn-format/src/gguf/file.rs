//! A GGUF file opened over a read-only memory map; tensor data is borrowed from the map.

use std::path::{Path, PathBuf};

use super::reader::{Gguf, TensorInfo};
use crate::error::{Error, Result};
use crate::ggml_type::{BlockLayout, GgmlType};
use crate::mmap::MappedFile;

/// An opened, validated GGUF file.
pub struct GgufFile {
    path: PathBuf,
    map: MappedFile,
    gguf: Gguf,
}

/// A tensor's description and its bytes, borrowed from the file's memory map (zero copy).
#[derive(Debug, Clone, Copy)]
pub struct TensorView<'a> {
    pub info: &'a TensorInfo,
    pub data: &'a [u8],
}

impl TensorView<'_> {
    pub fn name(&self) -> &str {
        &self.info.name
    }

    pub fn ggml_type(&self) -> GgmlType {
        self.info.ggml_type
    }

    pub fn n_elements(&self) -> u64 {
        self.info.n_elements
    }

    pub fn layout(&self) -> BlockLayout {
        self.info.ggml_type.layout()
    }
}

impl GgufFile {
    /// Maps and validates `path`. Errors name the file, the byte offset and the field.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile> {
        let path = path.as_ref().to_path_buf();
        let map = MappedFile::open(&path)?;
        let gguf = Gguf::parse(map.bytes()).map_err(|cause| Error::Gguf {
            path: path.clone(),
            cause,
        })?;
        Ok(GgufFile { path, map, gguf })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn gguf(&self) -> &Gguf {
        &self.gguf
    }

    /// The whole file.
    pub fn bytes(&self) -> &[u8] {
        self.map.bytes()
    }

    /// Drops the resident pages of `part` (a slice of this file, e.g. a tensor's data that was
    /// repacked) from the process's memory; see [`MappedFile::release`].
    pub fn release(&self, part: &[u8]) -> bool {
        self.map.release(part)
    }

    fn view<'a>(&'a self, info: &'a TensorInfo) -> TensorView<'a> {
        // Parsing checked that every tensor lies inside the data section of these very bytes.
        let data = self
            .gguf
            .tensor_data(self.map.bytes(), info)
            .unwrap_or_default();
        TensorView { info, data }
    }

    pub fn tensor(&self, name: &str) -> Option<TensorView<'_>> {
        self.gguf.tensor_info(name).map(|info| self.view(info))
    }

    /// All tensors in file order.
    pub fn tensors(&self) -> impl Iterator<Item = TensorView<'_>> {
        self.gguf.tensors().iter().map(|info| self.view(info))
    }
}
