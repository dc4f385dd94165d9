//! Files that appear whole or not at all: written under a hidden temporary name beside the
//! target, flushed to disk, renamed over it, and the directory flushed; on any error the
//! temporary file is removed and an earlier file at the target is left as it was.

use std::fs::{self, File};
use std::io::BufWriter;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// Writes `path` atomically with `write`, which gets a buffered writer and the temporary
/// file's path (for its errors) and returns what the caller wants back.
pub fn write_atomic<T>(
    path: &Path,
    write: impl FnOnce(&mut BufWriter<File>, &Path) -> Result<T>,
) -> Result<T> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let file_name = path
        .file_name()
        .ok_or_else(|| Error::invalid(path, "output path has no file name"))?;
    let tmp = dir.join(format!(
        ".{}.tmp-{}",
        file_name.to_string_lossy(),
        std::process::id()
    ));
    let result = (|| {
        let file = File::create(&tmp).map_err(|e| Error::io(&tmp, e))?;
        let mut buf = BufWriter::with_capacity(1 << 20, file);
        let value = write(&mut buf, &tmp)?;
        let file = buf
            .into_inner()
            .map_err(|e| Error::io(&tmp, e.into_error()))?;
        file.sync_all().map_err(|e| Error::io(&tmp, e))?;
        fs::rename(&tmp, path).map_err(|e| Error::io(path, e))?;
        if let Ok(d) = File::open(&dir) {
            d.sync_all().map_err(|e| Error::io(&dir, e))?;
        }
        Ok(value)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}
