//! Read-only memory maps of model files.

use std::fs::File;
use std::path::Path;

use memmap2::Mmap;

use crate::error::{Error, Result};

/// A whole file mapped read-only. Empty files (which cannot be mapped) read as no bytes.
pub struct MappedFile {
    map: Option<Mmap>,
}

impl MappedFile {
    pub fn open(path: &Path) -> Result<MappedFile> {
        let file = File::open(path).map_err(|e| Error::io(path, e))?;
        let meta = file.metadata().map_err(|e| Error::io(path, e))?;
        if !meta.is_file() {
            return Err(Error::invalid(path, "not a regular file"));
        }
        if meta.len() == 0 {
            return Ok(MappedFile { map: None });
        }
        // SAFETY: the map is read-only and private to this process. Like every mmap-based model
        // loader (llama.cpp included) we accept that another process truncating or rewriting the
        // file while it is mapped is outside our control; all parsing goes through bounds-checked
        // slices of the map, never raw pointers.
        let map = unsafe { Mmap::map(&file) }.map_err(|e| Error::io(path, e))?;
        Ok(MappedFile { map: Some(map) })
    }

    pub fn bytes(&self) -> &[u8] {
        self.map.as_deref().unwrap_or(&[])
    }
}
