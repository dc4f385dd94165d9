//! Runs a command to completion and reads its exit code and peak RSS with `wait4(2)`.

use std::process::{Command, Stdio};

pub struct Outcome {
    /// Exit code, or `None` when killed by a signal (a panic=abort or a crash).
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    /// Peak resident set size of the process, in bytes.
    pub max_rss: u64,
}

// The child is reaped by `wait4` below, which clippy cannot see.
#[allow(clippy::zombie_processes)]
pub fn run_measured(cmd: &mut Command) -> Outcome {
    let dir = tempfile::tempdir().unwrap();
    let (out_path, err_path) = (dir.path().join("out"), dir.path().join("err"));
    let child = cmd
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out_path).unwrap())
        .stderr(std::fs::File::create(&err_path).unwrap())
        .spawn()
        .expect("spawn");
    let pid = child.id() as libc::pid_t;
    let mut status: libc::c_int = 0;
    // SAFETY: rusage is plain old data, all-zero is a valid value for it.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `pid` is our own child, not yet waited for (std's Child does not reap on drop);
    // `status` and `usage` are valid, exclusive pointers for the duration of the call.
    let r = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    assert_eq!(r, pid, "wait4 failed");
    let code = libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status));
    Outcome {
        code,
        stdout: std::fs::read_to_string(out_path).unwrap(),
        stderr: std::fs::read_to_string(err_path).unwrap(),
        max_rss: usage.ru_maxrss as u64 * 1024,
    }
}
