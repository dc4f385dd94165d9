//! Atomic file replacement: write a temporary file in the destination's directory, fsync it,
//! rename it over the destination, fsync the directory. A crash at any point leaves either the
//! old file or the complete new one under the final name.

use std::fs::{self, File};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

/// The temporary name used while writing `path` (hidden, in the same directory).
pub(crate) fn temp_path(path: &Path) -> PathBuf {
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    path.with_file_name(format!(".{name}.tmp-{}", std::process::id()))
}

/// Writes `path` atomically with `write`. `abort_after` (tests only) aborts the process once
/// that many bytes of the temporary file are on disk, as a crash mid-write would.
pub(crate) fn write_atomic<E: From<io::Error>>(
    path: &Path,
    abort_after: Option<u64>,
    write: impl FnOnce(&mut dyn Write) -> Result<(), E>,
) -> Result<(), E> {
    let tmp = temp_path(path);
    let result = (|| {
        let file = File::create(&tmp)?;
        let mut out = Aborting {
            inner: BufWriter::with_capacity(1 << 20, file),
            written: 0,
            abort_after,
        };
        write(&mut out)?;
        let file = out.inner.into_inner().map_err(|e| e.into_error())?;
        file.sync_all()?;
        fs::rename(&tmp, path)?;
        sync_dir(path)?;
        Ok(())
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// fsyncs the directory holding `path`, making a rename or removal in it durable.
pub(crate) fn sync_dir(path: &Path) -> io::Result<()> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    // Directories cannot be opened for syncing everywhere (e.g. Windows); that is not an error.
    match File::open(dir) {
        Ok(d) => d.sync_all(),
        Err(_) => Ok(()),
    }
}

struct Aborting<W: Write> {
    inner: W,
    written: u64,
    abort_after: Option<u64>,
}

impl<W: Write> Write for Aborting<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if let Some(limit) = self.abort_after {
            if self.written + buf.len() as u64 >= limit {
                let n = (limit - self.written) as usize;
                self.inner.write_all(&buf[..n])?;
                self.inner.flush()?;
                std::process::abort();
            }
        }
        let n = self.inner.write(buf)?;
        self.written += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}
