//! The model cache from the command line: `tnn list`, `tnn pull NAME`, `tnn rm NAME`, and
//! `-m NAME` (a known model's name, or a file in the cache) wherever `-m PATH` is taken.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
pub use tinynn::pull::human_size;
use tinynn::pull::{PullProgress, Pulled};
use tinynn_format::model_cache::{self, KnownModel};

/// Model `m`'s path, fetching it first (with progress on stderr) when it is not cached.
fn ensure(m: KnownModel) -> Result<PathBuf> {
    tinynn::pull::ensure(m, &mut Bars::default()).with_context(|| format!("fetching {}", m.name()))
}

/// Fetch progress on stderr: notes as `tinynn:` lines, byte phases as bars (drawn only when
/// stderr is a terminal).
#[derive(Default)]
struct Bars {
    bar: Option<ProgressBar>,
}

impl PullProgress for Bars {
    fn note(&mut self, line: &str) {
        eprintln!("tinynn: {line}");
    }

    fn begin(&mut self, label: &str, total: u64, done: u64) {
        let bar = ProgressBar::new(total);
        if let Ok(style) = ProgressStyle::with_template(
            "tinynn: {msg} {bar:30} {bytes}/{total_bytes} ({bytes_per_sec}, {eta})",
        ) {
            bar.set_style(style);
        }
        bar.set_message(label.to_string());
        bar.set_position(done);
        self.bar = Some(bar);
    }

    fn advance(&mut self, bytes: u64) {
        if let Some(bar) = &self.bar {
            bar.inc(bytes);
        }
    }

    fn end(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
    }
}

/// The model file `arg` names: an existing path as it is; otherwise a known model's name (fetched
/// into the cache when missing) or the name of a file in the cache. `None` is the default model.
pub fn resolve(arg: Option<&Path>) -> Result<PathBuf> {
    let Some(arg) = arg else {
        return ensure(KnownModel::SmolLm2);
    };
    if arg.exists() {
        return Ok(arg.to_path_buf());
    }
    let Some(name) = arg.to_str() else {
        return Ok(arg.to_path_buf());
    };
    if let Some(m) = KnownModel::from_name(name) {
        return ensure(m);
    }
    if let Some(p) = model_cache::find_cached(name)? {
        return Ok(p);
    }
    if name.contains(['/', '\\']) || name.ends_with(".gguf") {
        bail!("{name}: no such file");
    }
    bail!(
        "'{name}' is neither a file nor a model name (known models: {}; `tnn list` shows the \
         cache)",
        KnownModel::names()
    )
}

#[derive(Args)]
pub struct ListArgs {}

#[derive(Args)]
pub struct PullArgs {
    /// Models to fetch: smollm2 (the default), gemma3.
    #[arg(default_value = "smollm2")]
    pub names: Vec<String>,
    /// Fetch again even when a cached copy checks out.
    #[arg(long)]
    pub force: bool,
}

#[derive(Args)]
pub struct RmArgs {
    /// Models to remove from the cache: a known model's name or a cached file's name.
    #[arg(required = true)]
    pub names: Vec<String>,
}

/// `tnn list`: the known models (cached or not) and any other file in the cache.
pub fn list(_: &ListArgs) -> Result<()> {
    let dir = model_cache::models_dir()?;
    let files = model_cache::cached_files()?;
    use std::fmt::Write as _;
    let mut out = format!("{:<10} {:>10}  {:<8} FILE\n", "NAME", "SIZE", "STATUS");
    for m in KnownModel::ALL {
        let e = m.entry();
        let cached = files.iter().find(|f| f.known == Some(m));
        let status = match cached {
            Some(f) if f.size == e.size => "cached",
            Some(_) => "damaged",
            None => "-",
        };
        let _ = writeln!(
            out,
            "{:<10} {:>10}  {:<8} {}  ({})",
            e.name,
            human_size(e.size),
            status,
            e.file_name,
            e.description
        );
    }
    for f in files.iter().filter(|f| f.known.is_none()) {
        let name = f.path.file_name().unwrap_or_default().to_string_lossy();
        let _ = writeln!(
            out,
            "{:<10} {:>10}  {:<8} {}",
            "-",
            human_size(f.size),
            "cached",
            name
        );
    }
    let _ = writeln!(out, "cache: {}", dir.display());
    // A reader that stops early (`| grep -q`, `| head`) ends the output quietly.
    crate::generate::emit(&out)
}

/// `tnn pull NAME...`: fetch each (or check its cached copy); prints each file's path.
pub fn pull(args: &PullArgs) -> Result<()> {
    let models = args
        .names
        .iter()
        .map(|n| known(n))
        .collect::<Result<Vec<_>>>()?;
    for m in models {
        let how = tinynn::pull::pull(m, args.force, &mut Bars::default())
            .with_context(|| format!("fetching {}", m.name()))?;
        if how == Pulled::AlreadyCached {
            eprintln!("tinynn: {} is cached and intact", m.name());
        }
        crate::generate::emit(&format!("{}\n", model_cache::model_path(m)?.display()))?;
    }
    Ok(())
}

/// `tnn rm NAME...`: delete cached files (all names are checked before anything is deleted).
pub fn rm(args: &RmArgs) -> Result<()> {
    let mut paths = Vec::new();
    for name in &args.names {
        match model_cache::find_cached(name)? {
            Some(p) => paths.push(p),
            None if KnownModel::from_name(name).is_some() => {
                bail!("{name} is not in the model cache (nothing was removed)")
            }
            None => bail!(
                "no cached model named '{name}' (known models: {}; `tnn list` shows the cache; \
                 nothing was removed)",
                KnownModel::names()
            ),
        }
    }
    for p in paths {
        std::fs::remove_file(&p).with_context(|| format!("removing {}", p.display()))?;
        eprintln!("tinynn: removed {}", p.display());
    }
    Ok(())
}

fn known(name: &str) -> Result<KnownModel> {
    KnownModel::from_name(name).with_context(|| {
        format!(
            "unknown model '{name}': `tnn pull` knows {} (a file of your own needs no pull: pass \
             its path with -m)",
            KnownModel::names()
        )
    })
}
