//! The metrics log: one JSON object per line and step, appended and flushed as it is written,
//! so a crashed run's log is complete up to its last step. Non-finite numbers are written as
//! `null` (and read back as NaN).

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Deserializer, Serialize};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StepMetrics {
    pub step: u64,
    #[serde(deserialize_with = "null_as_nan")]
    pub loss: f32,
    #[serde(deserialize_with = "null_as_nan")]
    pub lr: f32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grad_norm: Option<f32>,
    pub tokens_per_s: f64,
    /// Seconds since the run started.
    pub elapsed_s: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eval_loss: Option<f32>,
    /// The update was skipped (non-finite loss or gradient).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub skipped: bool,
}

fn null_as_nan<'de, D: Deserializer<'de>>(d: D) -> Result<f32, D::Error> {
    Ok(Option::<f32>::deserialize(d)?.unwrap_or(f32::NAN))
}

#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    #[error("{}: {cause}", path.display())]
    Io {
        path: PathBuf,
        cause: std::io::Error,
    },
    #[error("{}:{line}: {message}", path.display())]
    Line {
        path: PathBuf,
        line: usize,
        message: String,
    },
}

pub struct MetricsLog {
    path: PathBuf,
    file: File,
}

impl MetricsLog {
    /// A new, empty log (an existing file is replaced).
    pub fn create(path: &Path) -> Result<MetricsLog, MetricsError> {
        let file = File::create(path).map_err(|e| io(path, e))?;
        Ok(MetricsLog {
            path: path.to_path_buf(),
            file,
        })
    }

    /// Continues a log after resuming from the checkpoint of `step`: entries after `step` (the
    /// interrupted run's steps that will be redone) and an unfinished last line are dropped (the
    /// file is rewritten atomically), then new entries are appended.
    pub fn resume(path: &Path, step: u64) -> Result<MetricsLog, MetricsError> {
        let kept: Vec<StepMetrics> = match std::fs::read_to_string(path) {
            Ok(text) => {
                // A line without its newline was cut by a crash.
                let complete = &text[..text.rfind('\n').map_or(0, |i| i + 1)];
                parse(path, complete)?
                    .into_iter()
                    .filter(|m| m.step <= step)
                    .collect()
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(io(path, e)),
        };
        tinynn_format::atomic_file::write_atomic_io(path, None, |out| -> std::io::Result<()> {
            for m in &kept {
                writeln!(out, "{}", line(m))?;
            }
            Ok(())
        })
        .map_err(|e| io(path, e))?;
        let file = OpenOptions::new()
            .append(true)
            .open(path)
            .map_err(|e| io(path, e))?;
        Ok(MetricsLog {
            path: path.to_path_buf(),
            file,
        })
    }

    /// Appends one entry and flushes it.
    pub fn log(&mut self, m: &StepMetrics) -> Result<(), MetricsError> {
        let text = format!("{}\n", line(m));
        self.file
            .write_all(text.as_bytes())
            .and_then(|()| self.file.flush())
            .map_err(|e| io(&self.path, e))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

fn line(m: &StepMetrics) -> String {
    serde_json::to_string(m).expect("metrics always serialize")
}

fn io(path: &Path, cause: std::io::Error) -> MetricsError {
    MetricsError::Io {
        path: path.to_path_buf(),
        cause,
    }
}

fn parse(path: &Path, text: &str) -> Result<Vec<StepMetrics>, MetricsError> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str(l).map_err(|e| MetricsError::Line {
                path: path.to_path_buf(),
                line: i + 1,
                message: e.to_string(),
            })
        })
        .collect()
}

/// Reads a whole log.
pub fn read(path: &Path) -> Result<Vec<StepMetrics>, MetricsError> {
    parse(
        path,
        &std::fs::read_to_string(path).map_err(|e| io(path, e))?,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(step: u64, loss: f32) -> StepMetrics {
        StepMetrics {
            step,
            loss,
            lr: 1e-4,
            grad_norm: Some(0.5),
            tokens_per_s: 300.0,
            elapsed_s: step as f64,
            eval_loss: step.is_multiple_of(2).then_some(loss + 0.1),
            skipped: false,
        }
    }

    #[test]
    fn lines_are_flushed_resumed_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("metrics.jsonl");
        let mut log = MetricsLog::create(&path).unwrap();
        for s in 1..=5 {
            log.log(&m(s, 3.0 - s as f32 * 0.1)).unwrap();
            // Flushed per line: readable while the log is open.
            assert_eq!(read(&path).unwrap().len(), s as usize);
        }
        let mut nan = m(6, f32::NAN);
        nan.skipped = true;
        log.log(&nan).unwrap();
        drop(log);
        let text = std::fs::read_to_string(&path).unwrap();
        let first = text.lines().next().unwrap();
        assert!(first.starts_with("{\"step\":1,\"loss\":2.9"), "{first}");
        assert!(
            !first.contains("eval_loss") && !first.contains("skipped"),
            "{first}"
        );
        assert!(
            text.lines().nth(5).unwrap().contains("\"loss\":null,"),
            "{text}"
        );
        let back = read(&path).unwrap();
        assert_eq!(
            back[..5],
            (1..=5)
                .map(|s| m(s, 3.0 - s as f32 * 0.1))
                .collect::<Vec<_>>()[..]
        );
        assert!(back[5].loss.is_nan() && back[5].skipped);

        // A crash left half a line; resuming from step 3 drops it and steps 4..6.
        std::fs::write(&path, format!("{text}{{\"step\":7,\"lo")).unwrap();
        let mut log = MetricsLog::resume(&path, 3).unwrap();
        log.log(&m(4, 1.0)).unwrap();
        let steps: Vec<u64> = read(&path).unwrap().iter().map(|x| x.step).collect();
        assert_eq!(steps, [1, 2, 3, 4]);
        assert_eq!(read(&path).unwrap()[3].loss, 1.0);

        std::fs::write(&path, "{\"step\":1}\n").unwrap();
        let err = read(&path).unwrap_err().to_string();
        assert!(err.contains("metrics.jsonl:1:"), "{err}");
        assert!(MetricsLog::resume(&path, 0).is_err());
        // Resuming without a log starts one.
        let fresh = dir.path().join("new.jsonl");
        MetricsLog::resume(&fresh, 10)
            .unwrap()
            .log(&m(11, 2.0))
            .unwrap();
        assert_eq!(read(&fresh).unwrap().len(), 1);
    }
}
