//! `tnn chat` as a person uses it: from a pipe (messages, multi-line input, `/` commands, Ctrl-C
//! during a reply), and at a real terminal (a pseudo-terminal: line editing, history, the `> `
//! marker, Ctrl-C at the prompt and during a reply, Ctrl-D).

#[allow(dead_code, unused_imports)]
mod common;

use std::io::{Read, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{real_model, tnn};

fn chat(model: &Path, cache: &Path, extra: &[&str]) -> Command {
    let mut cmd = tnn();
    cmd.env("TINYNN_CACHE", cache)
        .arg("chat")
        .arg("-m")
        .arg(model)
        .args(["--temp", "0", "-t", "1"])
        .args(extra);
    cmd
}

#[derive(serde::Deserialize, Debug, PartialEq)]
struct Saved {
    role: String,
    content: String,
}

fn saved(path: &Path) -> Vec<Saved> {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// Collects a child's output on a thread; `wait_for` polls it.
struct Output {
    rx: mpsc::Receiver<Vec<u8>>,
    text: Vec<u8>,
}

impl Output {
    fn new(mut from: impl Read + Send + 'static) -> Output {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = from.read(&mut buf) {
                if n == 0 || tx.send(buf[..n].to_vec()).is_err() {
                    break;
                }
            }
        });
        Output {
            rx,
            text: Vec::new(),
        }
    }

    fn text(&self) -> String {
        plain(&String::from_utf8_lossy(&self.text))
    }

    /// Waits (at most 60 s) until the output after byte `from` satisfies `done`.
    fn wait_for(&mut self, from: usize, what: &str, done: impl Fn(&str) -> bool) -> usize {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let tail = plain(&String::from_utf8_lossy(
                &self.text[from.min(self.text.len())..],
            ));
            if done(&tail) {
                return self.text.len();
            }
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(
                !left.is_zero(),
                "waited 60 s for {what}; output so far:\n{:?}",
                self.text()
            );
            if let Ok(chunk) = self.rx.recv_timeout(left.min(Duration::from_millis(200))) {
                self.text.extend(chunk);
            }
        }
    }

    fn drain(&mut self) {
        while let Ok(chunk) = self.rx.recv_timeout(Duration::from_millis(500)) {
            self.text.extend(chunk);
        }
    }
}

/// `s` without terminal control sequences (`ESC [ ... final`, `ESC x`) and carriage returns.
fn plain(s: &str) -> String {
    let mut out = String::new();
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        match c {
            '\x1b' => {
                if chars.next() == Some('[') {
                    for c in chars.by_ref() {
                        if ('\x40'..='\x7e').contains(&c) {
                            break;
                        }
                    }
                }
            }
            '\r' => {}
            c => out.push(c),
        }
    }
    out
}

fn wait_exit(child: &mut Child) -> Option<i32> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status.code();
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("tnn chat did not exit");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn interrupt(child: &Child) {
    // SAFETY: kill(2) with our own child's pid and a valid signal number.
    let r = unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGINT) };
    assert_eq!(r, 0);
}

#[test]
fn piped_messages_blocks_and_commands() {
    let model = real_model();
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a.json"), dir.path().join("b.json"));
    let input = format!(
        "\nWhat is the capital of France?\n\n/help\n/nope\n//etc is a folder\n\"\"\"\nLine one\n\nline two\n\"\"\"\n\
         first \\\nsecond\n/save {}\n/clear\n/save {}\n/exit\nnever sent\n",
        a.display(),
        b.display()
    );
    let mut child = chat(&model, dir.path(), &["-n", "6", "--sys", "Be brief."])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    // From a pipe: no prompt marker, no banner; the replies alone on stdout.
    assert!(
        !stdout.contains("> ") && !stderr.contains("type a message"),
        "{stdout}\n{stderr}"
    );
    assert!(
        stderr.contains("/save FILE") && stderr.contains("unknown command \"/nope\""),
        "{stderr}"
    );
    assert!(
        stderr.contains("(saved 9 messages") && stderr.contains("(saved 1 messages"),
        "{stderr}"
    );
    let conv = saved(&a);
    let users: Vec<&str> = conv
        .iter()
        .filter(|m| m.role == "user")
        .map(|m| m.content.as_str())
        .collect();
    assert_eq!(
        users,
        [
            "What is the capital of France?",
            "/etc is a folder",
            "Line one\n\nline two",
            "first \nsecond"
        ]
    );
    assert_eq!(
        conv[0],
        Saved {
            role: "system".into(),
            content: "Be brief.".into()
        }
    );
    assert!(
        conv[2].role == "assistant" && conv[2].content.contains("Paris"),
        "{conv:?}"
    );
    // What was saved of each reply is what was printed.
    let replies: String = conv
        .iter()
        .filter(|m| m.role == "assistant")
        .map(|m| format!("{}\n", m.content))
        .collect();
    assert_eq!(stdout, replies);
    // /clear keeps the system prompt only.
    assert_eq!(
        saved(&b),
        [Saved {
            role: "system".into(),
            content: "Be brief.".into()
        }]
    );
    // History is for terminals only.
    assert!(!dir.path().join("chat_history.txt").exists());
}

#[test]
fn ctrl_c_stops_the_reply_not_the_chat() {
    let model = real_model();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("c.json");
    let mut child = chat(&model, dir.path(), &["-n", "400"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut out = Output::new(child.stdout.take().unwrap());
    let mut err = Output::new(child.stderr.take().unwrap());
    stdin
        .write_all(b"Write a very long story about a dragon who learns to sing.\n")
        .unwrap();
    out.wait_for(0, "200 bytes of reply", |t| t.len() >= 200);
    interrupt(&child);
    err.wait_for(0, "(reply stopped)", |t| t.contains("(reply stopped)"));
    // The chat goes on: the next message gets a reply (read after the stopped one), and both
    // are saved (after the second reply).
    stdin.write_all(b"Thanks!\n").unwrap();
    writeln!(stdin, "/save {}", file.display()).unwrap();
    err.wait_for(0, "saved", |t| t.contains("(saved 4 messages"));
    let conv = saved(&file);
    assert_eq!(
        conv[0].content,
        "Write a very long story about a dragon who learns to sing."
    );
    assert!(conv[1].content.len() >= 200, "{conv:?}");
    // The reader of stdout may lag behind the saved file on a busy machine.
    let printed = conv[1].content.len() + conv[3].content.len();
    out.wait_for(0, "both replies", |t| t.len() >= printed);
    assert!(
        out.text().starts_with(&conv[1].content),
        "printed {:?}\nsaved {conv:?}",
        out.text()
    );
    assert_eq!(conv[2].content, "Thanks!");
    // Ctrl-C while waiting for input quits, as in any program.
    interrupt(&child);
    assert_eq!(wait_exit(&mut child), Some(130));
}

/// A pseudo-terminal pair: the child gets the slave side as its controlling terminal.
struct Pty {
    master: std::fs::File,
    slave: std::os::fd::OwnedFd,
}

fn pty() -> Pty {
    use std::os::fd::FromRawFd;
    let (mut m, mut s) = (0, 0);
    let size = libc::winsize {
        ws_row: 40,
        ws_col: 200,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: openpty writes two fds through valid pointers; name and termios may be null.
    let r = unsafe {
        libc::openpty(
            &mut m,
            &mut s,
            std::ptr::null_mut(),
            std::ptr::null(),
            &size,
        )
    };
    assert_eq!(r, 0, "openpty");
    // SAFETY: both fds were just opened by openpty and are owned by nobody else.
    unsafe {
        Pty {
            master: std::fs::File::from_raw_fd(m),
            slave: std::os::fd::OwnedFd::from_raw_fd(s),
        }
    }
}

#[test]
fn at_a_terminal_lines_are_edited_and_remembered() {
    use std::os::unix::process::CommandExt;
    let model = real_model();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("t.json");
    let p = pty();
    let mut cmd = chat(&model, dir.path(), &["-n", "400"]);
    cmd.env("TERM", "xterm")
        .stdin(p.slave.try_clone().unwrap())
        .stdout(p.slave.try_clone().unwrap())
        .stderr(p.slave.try_clone().unwrap());
    // SAFETY: setsid and ioctl are async-signal-safe; the child makes the pty its controlling
    // terminal (so Ctrl-C typed there is its SIGINT) before exec.
    unsafe {
        cmd.pre_exec(|| {
            if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().unwrap();
    drop(p.slave);
    let mut master = p.master.try_clone().unwrap();
    let mut out = Output::new(p.master);
    let mut at = out.wait_for(0, "the prompt", |t| {
        t.contains("/help lists") && t.ends_with("> ")
    });
    // Typed "Wht is 2+2" with a slip, mended with the arrow keys and backspace: ESC [ D is Left.
    master.write_all(b"Wht is 2+2x\x7f").unwrap();
    master.write_all(&b"\x1b[D".repeat(8)).unwrap();
    master.write_all(b"a\r").unwrap();
    at = out.wait_for(at, "a reply and the next prompt", |t| t.ends_with("> "));
    // Ctrl-C at the prompt drops the line and says how to quit.
    master.write_all(b"half a thought\x03").unwrap();
    at = out.wait_for(at, "the hint", |t| {
        t.contains("(Ctrl-D or /exit quits)") && t.ends_with("> ")
    });
    // Ctrl-C during a reply stops it; the prompt comes back.
    master
        .write_all(b"Tell me a very long story about a robot.\r")
        .unwrap();
    let start = at;
    out.wait_for(at, "some of the story", |t| t.len() > 300);
    master.write_all(b"\x03").unwrap();
    at = out.wait_for(start, "the stop", |t| {
        t.contains("(reply stopped)") && t.ends_with("> ")
    });
    // Up twice brings back the first question from the history.
    master.write_all(b"\x1b[A\x1b[A\r").unwrap();
    at = out.wait_for(at, "the repeated question's reply", |t| t.ends_with("> "));
    master
        .write_all(format!("/save {}\r", file.display()).as_bytes())
        .unwrap();
    out.wait_for(at, "saved", |t| {
        t.contains("(saved 6 messages") && t.ends_with("> ")
    });
    master.write_all(b"\x04").unwrap();
    assert_eq!(wait_exit(&mut child), Some(0), "{}", out.text());
    out.drain();
    let conv = saved(&file);
    let users: Vec<&str> = conv
        .iter()
        .filter(|m| m.role == "user")
        .map(|m| m.content.as_str())
        .collect();
    assert_eq!(
        users,
        [
            "What is 2+2",
            "Tell me a very long story about a robot.",
            "What is 2+2"
        ]
    );
    let history = std::fs::read_to_string(dir.path().join("chat_history.txt")).unwrap();
    assert!(
        history.contains("What is 2+2\n") && !history.contains("half a thought"),
        "{history}"
    );
}
