//! One training run per output directory: [`DirLock`] holds `DIR/.tinynn.lock` (the holder's
//! process id) for the run's lifetime. A second run on the same directory is refused with the
//! holder's pid; a lock left by a process that is gone (killed, crashed) is taken over.

use std::io::Write;
use std::path::{Path, PathBuf};

use crate::error::TrainError;

/// The lock file's name inside the output directory.
pub const LOCK_FILE: &str = ".tinynn.lock";

/// A held output-directory lock; dropping it removes the lock file.
#[derive(Debug)]
pub struct DirLock {
    path: PathBuf,
}

impl DirLock {
    /// Takes `dir`'s lock, or says which process holds it.
    pub fn acquire(dir: &Path) -> Result<DirLock, TrainError> {
        let path = dir.join(LOCK_FILE);
        // Two tries: the second after removing a stale lock.
        for _ in 0..2 {
            match std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&path)
            {
                Ok(mut f) => {
                    let written = write!(f, "{}", std::process::id()).and_then(|()| f.sync_all());
                    let lock = DirLock { path };
                    written.map_err(|cause| TrainError::Io {
                        action: "writing",
                        path: lock.path.clone(),
                        cause,
                    })?;
                    return Ok(lock);
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    let holder = std::fs::read_to_string(&path)
                        .ok()
                        .and_then(|s| s.trim().parse::<u32>().ok());
                    match holder {
                        Some(pid) if alive(pid) => {
                            return Err(TrainError::Locked {
                                dir: dir.to_path_buf(),
                                pid: Some(pid),
                            })
                        }
                        // Its process is gone (or it never got to write its pid): stale.
                        _ => {
                            let _ = std::fs::remove_file(&path);
                        }
                    }
                }
                Err(cause) => {
                    return Err(TrainError::Io {
                        action: "creating",
                        path,
                        cause,
                    })
                }
            }
        }
        Err(TrainError::Locked {
            dir: dir.to_path_buf(),
            pid: None,
        })
    }
}

impl Drop for DirLock {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Whether process `pid` exists and has not ended (a zombie, ended but not yet reaped by its
/// parent, holds nothing). Where that cannot be told (no `/proc`), every holder is taken to
/// be alive: refusing is safe, and the error names the file to remove.
fn alive(pid: u32) -> bool {
    let proc_root = Path::new("/proc");
    if !proc_root.join("self").exists() {
        return true;
    }
    let Ok(stat) = std::fs::read_to_string(proc_root.join(pid.to_string()).join("stat")) else {
        return false;
    };
    // "pid (comm) S ...": the state follows the last ')' (comm may hold one).
    let state = stat
        .rfind(')')
        .and_then(|i| stat[i + 1..].trim_start().chars().next());
    !matches!(state, Some('Z' | 'X'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_lock_refuses_a_second_run_and_a_stale_one_is_taken_over() {
        let dir = tempfile::tempdir().unwrap();
        let first = DirLock::acquire(dir.path()).unwrap();
        let held = std::fs::read_to_string(dir.path().join(LOCK_FILE)).unwrap();
        assert_eq!(held, std::process::id().to_string());
        match DirLock::acquire(dir.path()) {
            Err(TrainError::Locked { pid, .. }) => assert_eq!(pid, Some(std::process::id())),
            other => panic!("expected Locked, got {other:?}"),
        }
        drop(first);
        assert!(
            !dir.path().join(LOCK_FILE).exists(),
            "dropping removes the file"
        );

        // A lock left by a process that no longer exists (pids stay below 2^22 on Linux), or
        // an empty one left by a crash before the pid was written: taken over.
        for stale in ["4294967290", ""] {
            std::fs::write(dir.path().join(LOCK_FILE), stale).unwrap();
            let again = DirLock::acquire(dir.path()).unwrap();
            drop(again);
        }
    }

    #[test]
    fn a_lock_of_a_process_that_ended_but_was_not_reaped_is_stale() {
        if !Path::new("/proc/self").exists() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        // A child that has exited and that nobody has waited for yet: a zombie.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let stat = format!("/proc/{}/stat", child.id());
        let t = std::time::Instant::now();
        while !std::fs::read_to_string(&stat).is_ok_and(|s| s.contains(") Z")) {
            assert!(
                t.elapsed().as_secs() < 10,
                "the child never became a zombie"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(!alive(child.id()));
        assert!(alive(std::process::id()));
        std::fs::write(dir.path().join(LOCK_FILE), child.id().to_string()).unwrap();
        drop(DirLock::acquire(dir.path()).unwrap());
        child.wait().unwrap();
    }
}
