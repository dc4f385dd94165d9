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

    /// Lets the kernel drop the resident pages wholly inside `part` (a slice of [`bytes`]) from
    /// this process: e.g. a tensor that was copied into another layout. The bytes stay
    /// readable; touching them again reads them back from the file. Returns whether anything
    /// was released (nothing for slices outside the map, off unix, or on an error).
    ///
    /// [`bytes`]: MappedFile::bytes
    pub fn release(&self, part: &[u8]) -> bool {
        let Some(map) = &self.map else {
            return false;
        };
        let base = map.as_ptr() as usize;
        let (start, end) = (part.as_ptr() as usize, part.as_ptr() as usize + part.len());
        if start < base || end > base + map.len() {
            return false;
        }
        const PAGE: usize = 4096;
        let (first, last) = (
            (start - base).next_multiple_of(PAGE),
            (end - base) / PAGE * PAGE,
        );
        if last <= first {
            return false;
        }
        #[cfg(unix)]
        {
            // SAFETY: the map is a private read-only file mapping that nobody writes, so
            // MADV_DONTNEED only discards clean page copies: later reads (through the `&[u8]`
            // borrowed from this map) fault the same file contents back in. Rust sees no
            // change of the bytes.
            unsafe {
                map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, first, last - first)
            }
            .is_ok()
        }
        #[cfg(not(unix))]
        false
    }
}
