//! `tnn completions SHELL`: scripts that the shells accept and that complete `tnn`'s commands
//! and flags (bash is run for real).

use std::process::Command;

fn tnn() -> Command {
    Command::new(env!("CARGO_BIN_EXE_tnn"))
}

/// What bash completes for `words` (the last one being completed) with `tnn`'s script loaded.
fn bash_complete(script: &str, words: &[&str]) -> Vec<String> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tnn.bash");
    std::fs::write(&path, script).unwrap();
    let quoted: Vec<String> = words.iter().map(|w| format!("'{w}'")).collect();
    let program = format!(
        "source '{}'; COMP_WORDS=({}); COMP_CWORD={}; COMP_LINE='{}'; COMP_POINT=${{#COMP_LINE}}; \
         _tnn tnn '{}' '{}'; printf '%s\\n' \"${{COMPREPLY[@]}}\"",
        path.display(),
        quoted.join(" "),
        words.len() - 1,
        words.join(" "),
        words[words.len() - 1],
        words[words.len() - 2],
    );
    let out = Command::new("bash")
        .args(["-c", &program])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

#[test]
fn bash_completes_commands_and_flags() {
    let out = tnn().args(["completions", "bash"]).output().unwrap();
    assert!(out.status.success());
    let script = String::from_utf8(out.stdout).unwrap();
    let syntax = Command::new("bash")
        .args(["-n", "-c", &script])
        .output()
        .unwrap();
    assert!(
        syntax.status.success(),
        "{}",
        String::from_utf8_lossy(&syntax.stderr)
    );
    assert_eq!(bash_complete(&script, &["tnn", "pu"]), ["pull"]);
    let run_flags = bash_complete(&script, &["tnn", "run", "--no-d"]);
    assert_eq!(run_flags, ["--no-display-prompt"]);
    let chat_flags = bash_complete(&script, &["tnn", "chat", "--chat-template-"]);
    assert_eq!(chat_flags, ["--chat-template-file"]);
}

#[test]
fn every_shell_gets_a_script_and_a_bad_one_is_refused() {
    for (shell, marker) in [
        ("bash", "complete -F _tnn"),
        ("zsh", "#compdef tnn"),
        ("fish", "complete -c tnn"),
        ("elvish", "edit:completion:arg-completer[tnn]"),
        ("powershell", "Register-ArgumentCompleter"),
    ] {
        let out = tnn().args(["completions", shell]).output().unwrap();
        assert!(out.status.success(), "{shell}");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains(marker),
            "{shell}: {}",
            &text[..text.len().min(300)]
        );
        assert!(
            text.contains("pull") && text.contains("quantize"),
            "{shell}"
        );
    }
    let out = tnn().args(["completions", "tcsh"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("possible values: bash"));
}
