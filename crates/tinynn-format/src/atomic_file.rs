//! Files that appear whole or not at all — the one writer every file tinynn saves goes through
//! (GGUF and safetensors files, checkpoints and their pointer, metrics, plots, saved chats).
//! The bytes go to a hidden temporary file beside the target (`.NAME.tmp-XXXXXX`, from
//! `tempfile`), which is flushed to disk, renamed over the target (`persist`), and the directory
//! is flushed so the rename survives a crash. On any error the temporary file is removed and an
//! earlier file at the target is left as it was; a process killed mid-write leaves at most a
//! hidden `.tmp-` file, which checkpoint saving clears.

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// Writes `path` atomically with `write`, which gets a buffered writer and the temporary file's
/// path (for its errors) and returns what the caller wants back.
pub fn write_atomic<T>(
    path: &Path,
    write: impl FnOnce(&mut dyn Write, &Path) -> Result<T>,
) -> Result<T> {
    write_atomic_with(path, None, |p, e| Error::io(p, e), write)
}

/// [`write_atomic`] with plain I/O errors (the caller names the path in its own error);
/// `abort_after` as in [`write_atomic_with`].
pub fn write_atomic_io(
    path: &Path,
    abort_after: Option<u64>,
    write: impl FnOnce(&mut dyn Write) -> io::Result<()>,
) -> io::Result<()> {
    write_atomic_with(path, abort_after, |_, e| e, |w, _| write(w))
}

/// [`write_atomic`] for any error type: `io_err` turns an I/O error on a path into it.
/// `abort_after` (a test hook for crash tests) aborts the process once that many bytes of the
/// temporary file are on disk, as a crash mid-write would.
pub fn write_atomic_with<T, E>(
    path: &Path,
    abort_after: Option<u64>,
    io_err: impl Fn(&Path, io::Error) -> E,
    write: impl FnOnce(&mut dyn Write, &Path) -> std::result::Result<T, E>,
) -> std::result::Result<T, E> {
    let dir = parent_dir(path);
    let Some(file_name) = path.file_name() else {
        return Err(io_err(
            path,
            io::Error::new(io::ErrorKind::InvalidInput, "output path has no file name"),
        ));
    };
    let prefix = format!(".{}.tmp-", file_name.to_string_lossy());
    let mut builder = tempfile::Builder::new();
    builder.prefix(&prefix);
    // A temporary file is private (0600) by default; the file it becomes is an ordinary one,
    // created with 0666 less the umask, as `File::create` would.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        builder.permissions(std::fs::Permissions::from_mode(0o666));
    }
    let tmp = builder.tempfile_in(&dir).map_err(|e| io_err(&dir, e))?;
    let tmp_path = tmp.path().to_path_buf();
    let (file, tmp_guard) = tmp.into_parts();
    let mut out = Aborting {
        inner: BufWriter::with_capacity(1 << 20, file),
        written: 0,
        abort_after,
    };
    // `tmp_guard` removes the temporary file if anything below fails.
    let value = write(&mut out, &tmp_path)?;
    let file = out
        .inner
        .into_inner()
        .map_err(|e| io_err(&tmp_path, e.into_error()))?;
    file.sync_all().map_err(|e| io_err(&tmp_path, e))?;
    drop(file);
    tmp_guard.persist(path).map_err(|e| io_err(path, e.error))?;
    sync_dir(path).map_err(|e| io_err(&dir, e))?;
    Ok(value)
}

/// fsyncs the directory holding `path`, making a rename or removal in it durable. Where a
/// directory cannot be opened for this (some platforms), that is not an error.
pub fn sync_dir(path: &Path) -> io::Result<()> {
    match File::open(parent_dir(path)) {
        Ok(d) => d.sync_all(),
        Err(_) => Ok(()),
    }
}

fn parent_dir(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn whole_or_not_at_all() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f.bin");
        let n = write_atomic(&path, |w, _| {
            w.write_all(b"first").map_err(|e| Error::io(&path, e))?;
            Ok(5)
        })
        .unwrap();
        assert_eq!(n, 5);
        assert_eq!(std::fs::read(&path).unwrap(), b"first");
        // A failing writer leaves the earlier file and no temporary file.
        let err = write_atomic(&path, |w, tmp| {
            assert!(tmp
                .file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with(".f.bin.tmp-"));
            w.write_all(b"half").map_err(|e| Error::io(tmp, e))?;
            Err::<(), _>(Error::invalid(tmp, "refused"))
        })
        .unwrap_err();
        assert!(err.to_string().contains("refused"), "{err}");
        assert_eq!(std::fs::read(&path).unwrap(), b"first");
        assert_eq!(names(dir.path()), ["f.bin"]);
        // Replacing works, and a new file in a missing folder is an error naming the folder.
        write_atomic(&path, |w, tmp| {
            w.write_all(b"second").map_err(|e| Error::io(tmp, e))
        })
        .unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"second");
        // An ordinary file's permissions (0666 less the umask), not a temporary file's 0600.
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
            assert_ne!(mode & 0o044, 0, "{mode:o}");
        }
        let missing = dir.path().join("no/such/f.bin");
        let err = write_atomic(&missing, |_, _| Ok(())).unwrap_err();
        assert!(err.to_string().contains("no/such"), "{err}");
    }
}
