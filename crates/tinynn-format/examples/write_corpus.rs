//! Writes the malformed GGUF corpus (and the valid seed) into a directory, one file per case:
//! `cargo run -p tinynn-format --example write_corpus -- DIR [--no-truncations]`.
//! Used to seed `fuzz/corpus/gguf` and to test other GGUF readers against the same files.

use std::path::PathBuf;

use tinynn_format::malformed_corpus::{cases, valid_small_file};

fn main() -> std::io::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(dir) = args
        .iter()
        .find(|a| !a.starts_with("--"))
        .map(PathBuf::from)
    else {
        eprintln!("usage: write_corpus DIR [--no-truncations]");
        std::process::exit(2);
    };
    let skip_truncations = args.iter().any(|a| a == "--no-truncations");
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join("valid_small.gguf"), valid_small_file())?;
    let mut n = 1;
    for case in cases() {
        if skip_truncations && case.name.starts_with("truncated_") {
            continue;
        }
        std::fs::write(dir.join(format!("{}.gguf", case.name)), &case.bytes)?;
        n += 1;
    }
    println!("wrote {n} files to {}", dir.display());
    Ok(())
}
