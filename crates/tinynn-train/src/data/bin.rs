//! Pre-tokenized files: little-endian i32 token ids, read from disk a sequence at a time (never
//! whole). Each file is its own stream: it is cut into sequences of `seq` inputs (labels are the
//! next tokens), the last one padded. Sizes are checked when opening; ids are checked against
//! the vocabulary as they are read, and a bad one is an error naming the file and byte offset.

use std::fs::File;
use std::path::{Path, PathBuf};

use super::source::{fill_window, Sequences, SourceStats};
use super::DataError;

struct BinFile {
    path: PathBuf,
    file: File,
    n_tokens: u64,
    /// Index of this file's first sequence.
    first: usize,
}

pub struct BinTokens {
    files: Vec<BinFile>,
    seq: usize,
    vocab: usize,
    n_sequences: usize,
}

#[cfg(unix)]
fn read_at(f: &File, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
    std::os::unix::fs::FileExt::read_exact_at(f, buf, offset)
}

#[cfg(windows)]
fn read_at(f: &File, mut buf: &mut [u8], mut offset: u64) -> std::io::Result<()> {
    while !buf.is_empty() {
        match std::os::windows::fs::FileExt::seek_read(f, buf, offset)? {
            0 => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            n => {
                buf = &mut buf[n..];
                offset += n as u64;
            }
        }
    }
    Ok(())
}

impl BinTokens {
    /// Opens `paths`; ids must be `< vocab`.
    pub fn open(paths: &[PathBuf], seq: usize, vocab: usize) -> Result<BinTokens, DataError> {
        if seq == 0 {
            return Err(DataError::Config(
                "sequence length must be at least 1".into(),
            ));
        }
        let mut files = Vec::with_capacity(paths.len());
        let mut first = 0usize;
        for path in paths {
            let file = File::open(path).map_err(|e| DataError::io(path, e))?;
            let len = file.metadata().map_err(|e| DataError::io(path, e))?.len();
            if len == 0 {
                return Err(DataError::file(path, "the file is empty"));
            }
            if len % 4 != 0 {
                return Err(DataError::file(
                    path,
                    format!(
                        "length {len} is not a multiple of 4 (little-endian i32 token ids); \
                         the last {} bytes are a partial id",
                        len % 4
                    ),
                ));
            }
            let n_tokens = len / 4;
            if n_tokens < 2 {
                return Err(DataError::file(path, "1 token: at least 2 are needed"));
            }
            let n_seq = usize::try_from((n_tokens - 1).div_ceil(seq as u64))
                .map_err(|_| DataError::file(path, "too many sequences"))?;
            files.push(BinFile {
                path: path.clone(),
                file,
                n_tokens,
                first,
            });
            first += n_seq;
        }
        if files.is_empty() {
            return Err(DataError::Config("no token files given".into()));
        }
        Ok(BinTokens {
            files,
            seq,
            vocab,
            n_sequences: first,
        })
    }

    /// Reads every id once (in 1 MiB chunks) and reports the first bad one.
    pub fn check_all(&self) -> Result<(), DataError> {
        let mut buf = vec![0u8; 1 << 20];
        for f in &self.files {
            let total = f.n_tokens * 4;
            let mut at = 0u64;
            while at < total {
                let n = (total - at).min(buf.len() as u64) as usize;
                read_at(&f.file, &mut buf[..n], at).map_err(|e| DataError::io(&f.path, e))?;
                self.check_ids(&f.path, at, &buf[..n], &mut Vec::new())?;
                at += n as u64;
            }
        }
        Ok(())
    }

    fn check_ids(
        &self,
        path: &Path,
        base: u64,
        bytes: &[u8],
        out: &mut Vec<u32>,
    ) -> Result<(), DataError> {
        out.clear();
        for (k, c) in bytes.chunks_exact(4).enumerate() {
            let id = i32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            if id < 0 || id as usize >= self.vocab {
                return Err(DataError::TokenOutOfRange {
                    path: path.to_path_buf(),
                    offset: base + 4 * k as u64,
                    id: i64::from(id),
                    vocab: self.vocab,
                });
            }
            out.push(id as u32);
        }
        Ok(())
    }
}

impl std::fmt::Debug for BinTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BinTokens")
            .field(
                "files",
                &self.files.iter().map(|f| &f.path).collect::<Vec<_>>(),
            )
            .field("seq", &self.seq)
            .field("vocab", &self.vocab)
            .finish()
    }
}

impl Sequences for BinTokens {
    fn len(&self) -> usize {
        self.n_sequences
    }

    fn seq_len(&self) -> usize {
        self.seq
    }

    fn read(&self, i: usize, inputs: &mut [i32], labels: &mut [i32]) -> Result<(), DataError> {
        if i >= self.n_sequences {
            return Err(DataError::Config(format!(
                "sequence {i} of {} does not exist",
                self.n_sequences
            )));
        }
        let f = &self.files[self.files.partition_point(|f| f.first <= i) - 1];
        let start = (i - f.first) as u64 * self.seq as u64;
        let n = (self.seq as u64 + 1).min(f.n_tokens - start) as usize;
        let mut bytes = vec![0u8; n * 4];
        read_at(&f.file, &mut bytes, start * 4).map_err(|e| DataError::io(&f.path, e))?;
        let mut ids = Vec::with_capacity(n);
        self.check_ids(&f.path, start * 4, &bytes, &mut ids)?;
        fill_window(&ids, |_| true, inputs, labels);
        Ok(())
    }

    fn stats(&self) -> SourceStats {
        let tokens: u64 = self.files.iter().map(|f| f.n_tokens).sum();
        let real: u64 = self.files.iter().map(|f| f.n_tokens - 1).sum();
        SourceStats {
            sequences: self.n_sequences,
            tokens,
            padded: self.n_sequences as u64 * self.seq as u64 - real,
            ..SourceStats::default()
        }
    }
}
