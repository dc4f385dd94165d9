//! Data sources and the batcher: packing, chat masking (toy template and SmolLM2's ChatML with
//! its real tokenizer), streamed `.bin` files, splits, shuffling and exact resume.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use tinynn_models::chat::{ChatTemplate, Message};
use tinynn_train::data::*;

/// One token per byte: easy to reason about.
fn bytes_encoder() -> FnEncoder<impl Fn(&str) -> Vec<u32>> {
    FnEncoder(|s: &str| s.bytes().map(u32::from).collect())
}

fn docs(texts: &[&str]) -> Vec<(&'static Path, String)> {
    texts
        .iter()
        .map(|t| (Path::new("mem.txt"), t.to_string()))
        .collect()
}

#[test]
fn text_is_packed_with_eos_and_next_token_labels() {
    let enc = bytes_encoder();
    let p = PackedText::from_documents(docs(&["abc", "de"]), &enc, 0, 3).unwrap();
    assert_eq!(p.tokens(), &[97, 98, 99, 0, 100, 101, 0]);
    assert_eq!(p.len(), 2);
    let (mut x, mut y) = ([0i32; 3], [0i32; 3]);
    p.read(0, &mut x, &mut y).unwrap();
    assert_eq!((x, y), ([97, 98, 99], [98, 99, 0]));
    p.read(1, &mut x, &mut y).unwrap();
    assert_eq!((x, y), ([0, 100, 101], [100, 101, 0]));

    let p = PackedText::from_documents(docs(&["abc", "de"]), &enc, 0, 4).unwrap();
    let (mut x, mut y) = ([9i32; 4], [9i32; 4]);
    p.read(1, &mut x, &mut y).unwrap();
    assert_eq!(
        (x, y),
        ([100, 101, PAD_INPUT, PAD_INPUT], [101, 0, IGNORE, IGNORE])
    );
    assert_eq!(p.stats().padded, 2);
    assert!(p.read(2, &mut x, &mut y).is_err());

    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty.txt");
    std::fs::write(&empty, "  \n").unwrap();
    let err = PackedText::from_files(std::slice::from_ref(&empty), &enc, 0, 4).unwrap_err();
    assert!(
        matches!(&err, DataError::File { path, .. } if *path == empty),
        "{err}"
    );
    let bad = dir.path().join("latin1.txt");
    std::fs::write(&bad, b"caf\xe9").unwrap();
    let err = PackedText::from_files(&[bad], &enc, 0, 4)
        .unwrap_err()
        .to_string();
    assert!(err.contains("latin1.txt") && err.contains("UTF-8"), "{err}");
}

fn numbered_text(n_seq: usize, seq: usize) -> PackedText {
    // Token t is t (+1 so nothing collides with EOS 0): the first input of sequence i is i*seq+1.
    let n = n_seq * seq;
    let enc = FnEncoder(move |_: &str| (1..=n as u32).collect());
    PackedText::from_documents(docs(&["x"]), &enc, 0, seq).unwrap()
}

fn first_ids(b: &Batch, seq: usize) -> Vec<i32> {
    b.inputs.chunks(seq).map(|r| r[0]).collect()
}

#[test]
fn shuffled_epochs_cover_every_sequence_and_resume_exactly() {
    let seq = 4;
    let cfg = BatchConfig {
        batch: 4,
        shuffle: true,
        seed: 1234,
        eval: EvalSplit::EveryNth { n: 10 },
    };
    let mut b = Batcher::new(Box::new(numbered_text(50, seq)), cfg).unwrap();
    assert_eq!((b.n_train(), b.n_eval()), (45, 5));
    let all: Vec<Batch> = (0..30).map(|_| b.next_batch().unwrap()).collect();
    let firsts: Vec<i32> = all.iter().flat_map(|x| first_ids(x, seq)).collect();
    // Epoch 1 and 2: each training sequence exactly once per epoch, never an eval one.
    let eval: HashSet<i32> = (0..5).map(|k| ((k * 10 + 9) * seq + 1) as i32).collect();
    for epoch in firsts[..90].chunks(45) {
        let set: HashSet<i32> = epoch.iter().copied().collect();
        assert_eq!(set.len(), 45);
        assert!(set.is_disjoint(&eval));
    }
    assert_ne!(firsts[..45], firsts[45..90], "each epoch is shuffled anew");
    assert_ne!(
        firsts[..45].to_vec(),
        (0..50)
            .filter(|i| i % 10 != 9)
            .map(|i| (i * seq + 1) as i32)
            .collect::<Vec<_>>()
    );
    assert_eq!(b.position().epoch, 2);

    // Resume after 13 batches (mid-epoch) with a fresh batcher: the same batches follow.
    let mut first = Batcher::new(Box::new(numbered_text(50, seq)), cfg).unwrap();
    for _ in 0..13 {
        first.next_batch().unwrap();
    }
    let saved = first.position();
    let json = serde_json::to_string(&saved).unwrap();
    let mut resumed = Batcher::new(Box::new(numbered_text(50, seq)), cfg).unwrap();
    resumed
        .set_position(serde_json::from_str(&json).unwrap())
        .unwrap();
    for expected in &all[13..] {
        assert_eq!(&resumed.next_batch().unwrap(), expected);
    }

    // Another seed, another order; no shuffling, the natural order.
    let mut other = Batcher::new(
        Box::new(numbered_text(50, seq)),
        BatchConfig { seed: 99, ..cfg },
    )
    .unwrap();
    assert_ne!(other.next_batch().unwrap(), all[0]);
    let mut plain = Batcher::new(
        Box::new(numbered_text(50, seq)),
        BatchConfig {
            shuffle: false,
            eval: EvalSplit::Last { fraction: 0.1 },
            ..cfg
        },
    )
    .unwrap();
    assert_eq!((plain.n_train(), plain.n_eval()), (45, 5));
    assert_eq!(
        first_ids(&plain.next_batch().unwrap(), seq),
        vec![1, 5, 9, 13]
    );
    // Eval: the last 5 sequences in order, the second batch padded.
    let ev: Vec<Batch> = plain.eval_batches().map(Result::unwrap).collect();
    assert_eq!(ev.len(), 2);
    assert_eq!(first_ids(&ev[0], seq), vec![181, 185, 189, 193]);
    assert_eq!(ev[1].rows, 1);
    assert_eq!(ev[1].labels[seq..], vec![IGNORE; 3 * seq][..]);
    assert_eq!(ev[1].tokens, seq);
}

#[test]
fn bad_settings_are_errors() {
    let cfg = BatchConfig {
        batch: 0,
        shuffle: false,
        seed: 0,
        eval: EvalSplit::None,
    };
    let src = || Box::new(numbered_text(3, 2));
    assert!(matches!(
        Batcher::new(src(), cfg),
        Err(DataError::Config(_))
    ));
    let cfg = BatchConfig { batch: 2, ..cfg };
    for eval in [
        EvalSplit::Last { fraction: 1.0 },
        EvalSplit::Last { fraction: 0.0 },
        EvalSplit::Last { fraction: 0.9 },
        EvalSplit::EveryNth { n: 1 },
    ] {
        assert!(
            Batcher::new(src(), BatchConfig { eval, ..cfg }).is_err(),
            "{eval:?}"
        );
    }
    let mut b = Batcher::new(src(), cfg).unwrap();
    let pos = DataPosition {
        epoch: 0,
        index: 4,
        rng: 0,
    };
    assert!(b.set_position(pos).is_err());
    assert!(b.next_into(&mut [0; 3], &mut [0; 4]).is_err());
}

const TOY_CHATML: &str = "{% for m in messages %}<s>{{ m.role }}\n{{ m.content }}</s>\n{% endfor %}{% if add_generation_prompt %}<s>assistant\n{% endif %}";

/// The bytes that carry loss (labels are the next tokens).
fn labelled_text(y: &[i32]) -> String {
    y.iter()
        .filter(|&&l| l != IGNORE)
        .map(|&l| l as u8 as char)
        .collect()
}

#[test]
fn chat_loss_only_on_assistant_turns() {
    let t = ChatTemplate::new(TOY_CHATML.into(), "", "");
    let enc = bytes_encoder();
    let lines = [
        r#"{"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"yo"},{"role":"user","content":"q"},{"role":"assistant","content":"ok!"}]}"#,
        "",
        r#"{"messages":[{"role":"system","content":"be nice"},{"role":"user","content":"only a question"}]}"#,
    ];
    let lines: Vec<(usize, String)> = lines
        .iter()
        .enumerate()
        .map(|(i, l)| (i + 1, l.to_string()))
        .collect();
    let s = ChatSamples::from_lines(Path::new("c.jsonl"), lines.clone(), &t, &enc, 96).unwrap();
    assert_eq!(s.len(), 1);
    assert_eq!(s.stats().skipped, 1, "the sample without an assistant turn");
    assert_eq!(s.stats().truncated, 0);
    let (mut x, mut y) = ([0i32; 96], [0i32; 96]);
    s.read(0, &mut x, &mut y).unwrap();
    assert_eq!(labelled_text(&y), "yo</s>\nok!</s>\n");
    // Inputs are the rendered conversation.
    let rendered = t.render(&[Message::new("user", "hi")], false).unwrap();
    assert!(x
        .iter()
        .map(|&c| c as u8 as char)
        .collect::<String>()
        .starts_with(&rendered));

    // Truncated to 32 positions (33 tokens, 28 before the first answer): the sample is counted.
    let s = ChatSamples::from_lines(Path::new("c.jsonl"), lines.clone(), &t, &enc, 32).unwrap();
    assert_eq!(s.stats().truncated, 1);
    let (mut x, mut y) = ([0i32; 32], [0i32; 32]);
    s.read(0, &mut x, &mut y).unwrap();
    assert_eq!(labelled_text(&y), "yo</s");
    // Cut before any answer: nothing to learn from, so no sample at all.
    let err = ChatSamples::from_lines(Path::new("c.jsonl"), lines, &t, &enc, 20).unwrap_err();
    assert!(err.to_string().contains("no usable chat samples"), "{err}");
}

#[test]
fn bad_chat_lines_are_errors_naming_the_line() {
    let t = ChatTemplate::new(TOY_CHATML.into(), "", "");
    let enc = bytes_encoder();
    let good = r#"{"messages":[{"role":"user","content":"a"},{"role":"assistant","content":"b"}]}"#;
    let cases = [
        ("{not json", "bad JSON"),
        (r#"{"msgs":[]}"#, "no \"messages\""),
        (r#"{"messages":[]}"#, "empty"),
        (r#"{"messages":[{"content":"x"}]}"#, "no \"role\""),
        (r#"{"messages":[{"role":"user"}]}"#, "no \"content\""),
        (
            r#"{"messages":[{"role":"user","content":7}]}"#,
            "no \"content\"",
        ),
    ];
    for (bad, what) in cases {
        let lines = vec![(1, good.to_string()), (2, bad.to_string())];
        let err = ChatSamples::from_lines(Path::new("d.jsonl"), lines, &t, &enc, 32).unwrap_err();
        match &err {
            DataError::Line { line, message, .. } => {
                assert_eq!(*line, 2, "{err}");
                assert!(message.contains(what), "{bad}: {err}");
            }
            e => panic!("{bad}: {e}"),
        }
        assert!(err.to_string().starts_with("d.jsonl:2: "), "{err}");
    }
    // A template that does not render prefixes as prefixes is refused, not guessed.
    let reversed = ChatTemplate::new(
        "{% for m in messages|reverse %}{{ m.role }}:{{ m.content }};{% endfor %}".into(),
        "",
        "",
    );
    let lines = vec![(1, r#"{"messages":[{"role":"user","content":"a"},{"role":"assistant","content":"b"},{"role":"user","content":"c"}]}"#.to_string())];
    let err =
        ChatSamples::from_lines(Path::new("r.jsonl"), lines, &reversed, &enc, 32).unwrap_err();
    assert!(err.to_string().contains("prefix"), "{err}");
    // Template errors (raise_exception) name the line too.
    let strict = ChatTemplate::new(
        "{{ raise_exception('roles must alternate') }}".into(),
        "",
        "",
    );
    let err = ChatSamples::from_lines(
        Path::new("s.jsonl"),
        vec![(3, good.into())],
        &strict,
        &enc,
        32,
    )
    .unwrap_err();
    assert!(
        err.to_string().starts_with("s.jsonl:3:") && err.to_string().contains("alternate"),
        "{err}"
    );
    // A file of nothing usable.
    let err = ChatSamples::from_lines(Path::new("e.jsonl"), vec![(1, String::new())], &t, &enc, 32)
        .unwrap_err();
    assert!(matches!(err, DataError::File { .. }), "{err}");
    let err = ChatSamples::from_jsonl(Path::new("/nonexistent/x.jsonl"), &t, &enc, 32).unwrap_err();
    assert!(matches!(err, DataError::Io { .. }), "{err}");
    // From a file: CRLF lines read as lines, a line past the length cap is refused by number
    // (reading at most one byte past the cap), a line that is not UTF-8 too.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.jsonl");
    std::fs::write(&path, format!("{good}\r\n\r\n{good}")).unwrap();
    let ok = ChatSamples::from_jsonl(&path, &t, &enc, 32).unwrap();
    assert_eq!(ok.len(), 2);
    let long = format!(
        "{good}\n{}\n",
        "x".repeat(tinynn_train::data::MAX_LINE_BYTES + 1)
    );
    std::fs::write(&path, long).unwrap();
    let err = ChatSamples::from_jsonl(&path, &t, &enc, 32).unwrap_err();
    assert!(
        err.to_string()
            .contains("c.jsonl:2: longer than 16777216 bytes"),
        "{err}"
    );
    std::fs::write(&path, [good.as_bytes(), b"\n\xff\xfe\n"].concat()).unwrap();
    let err = ChatSamples::from_jsonl(&path, &t, &enc, 32).unwrap_err();
    assert!(err.to_string().contains("c.jsonl:2: not UTF-8"), "{err}");
}

#[test]
fn smollm2_chatml_assistant_spans() {
    use tinynn_format::gguf::GgufFile;
    use tinynn_models::tokenizer::Tokenizer;
    use tinynn_models::vocab::Vocab;
    let file =
        GgufFile::open(tinynn_format::model_cache::require_default_model().unwrap()).unwrap();
    let tok = Tokenizer::from_gguf(file.gguf()).unwrap();
    let vocab = Vocab::from_gguf(file.gguf()).unwrap();
    let text =
        |id: Option<u32>| String::from_utf8_lossy(&vocab.token_bytes(id.unwrap())).into_owned();
    let t = ChatTemplate::from_gguf(file.gguf(), &text(tok.bos()), &text(tok.eos()))
        .unwrap()
        .unwrap();
    let messages = vec![
        Message::new("system", "You are terse."),
        Message::new("user", "What is 2+2?"),
        Message::new("assistant", "4."),
        Message::new("user", "And in words?"),
        Message::new("assistant", "Four, of course."),
    ];
    let (ids, target) = tokenize_conversation(&messages, &t, &tok).unwrap();
    // Piece-wise tokenization equals tokenizing the whole rendering.
    let whole = tok
        .encode(&t.render(&messages, false).unwrap(), false)
        .unwrap();
    assert_eq!(ids, whole);
    let picked: Vec<u32> = ids
        .iter()
        .zip(&target)
        .filter(|(_, &t)| t)
        .map(|(&i, _)| i)
        .collect();
    assert_eq!(
        tok.decode(&picked).unwrap(),
        "4.<|im_end|>\nFour, of course.<|im_end|>\n"
    );
    // Runs of targets start right after "<|im_start|>assistant\n".
    let mut runs = 0;
    for k in 1..ids.len() {
        if target[k] && !target[k - 1] {
            assert!(tok
                .decode(&ids[..k])
                .unwrap()
                .ends_with("<|im_start|>assistant\n"));
            runs += 1;
        }
    }
    assert_eq!(runs, 2);
    // Through the JSONL path: labels equal the next token exactly where it is a target.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("chat.jsonl");
    let json = serde_json::json!({"messages": messages.iter().map(|m| serde_json::json!({"role": m.role, "content": m.content})).collect::<Vec<_>>()});
    std::fs::write(&path, format!("{json}\n")).unwrap();
    let s = ChatSamples::from_jsonl(&path, &t, &tok, 128).unwrap();
    let (mut x, mut y) = (vec![0i32; 128], vec![0i32; 128]);
    s.read(0, &mut x, &mut y).unwrap();
    for j in 0..ids.len() - 1 {
        assert_eq!(x[j], ids[j] as i32);
        assert_eq!(
            y[j],
            if target[j + 1] {
                ids[j + 1] as i32
            } else {
                IGNORE
            }
        );
    }
    assert!(y[ids.len() - 1..].iter().all(|&l| l == IGNORE));
}

fn write_ids(path: &PathBuf, ids: &[i32]) {
    let bytes: Vec<u8> = ids.iter().flat_map(|i| i.to_le_bytes()).collect();
    std::fs::write(path, bytes).unwrap();
}

#[test]
fn bin_files_are_streamed_and_checked() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a.bin");
    let b = dir.path().join("b.bin");
    write_ids(&a, &(0..10).collect::<Vec<_>>());
    write_ids(&b, &[7, 8, 9]);
    let src = BinTokens::open(&[a.clone(), b.clone()], 4, 100).unwrap();
    // a: 9 positions → 3 sequences (last padded); b: 2 positions → 1.
    assert_eq!(src.len(), 4);
    src.check_all().unwrap();
    let (mut x, mut y) = ([0i32; 4], [0i32; 4]);
    src.read(1, &mut x, &mut y).unwrap();
    assert_eq!((x, y), ([4, 5, 6, 7], [5, 6, 7, 8]));
    src.read(2, &mut x, &mut y).unwrap();
    assert_eq!(
        (x, y),
        (
            [8, PAD_INPUT, PAD_INPUT, PAD_INPUT],
            [9, IGNORE, IGNORE, IGNORE]
        )
    );
    src.read(3, &mut x, &mut y).unwrap();
    assert_eq!(
        (x, y),
        ([7, 8, PAD_INPUT, PAD_INPUT], [8, 9, IGNORE, IGNORE]),
        "files are not joined"
    );
    assert_eq!(src.stats().tokens, 13);

    // Ids outside the vocabulary: the error names the file and byte offset, at read time and in
    // a full check.
    let src = BinTokens::open(std::slice::from_ref(&a), 4, 7).unwrap();
    src.read(0, &mut x, &mut y).unwrap();
    let err = src.read(1, &mut x, &mut y).unwrap_err();
    assert!(
        matches!(&err, DataError::TokenOutOfRange { path, offset: 28, id: 7, vocab: 7 } if *path == a),
        "{err}"
    );
    assert!(err.to_string().contains("a.bin: byte 28"), "{err}");
    assert!(matches!(
        src.check_all(),
        Err(DataError::TokenOutOfRange { offset: 28, .. })
    ));
    let neg = dir.path().join("neg.bin");
    write_ids(&neg, &[1, 2, -5, 3]);
    let err = BinTokens::open(&[neg], 2, 10)
        .unwrap()
        .check_all()
        .unwrap_err();
    assert!(
        matches!(
            err,
            DataError::TokenOutOfRange {
                offset: 8,
                id: -5,
                ..
            }
        ),
        "{err}"
    );

    // The batcher keeps its position when a read fails.
    let mut batcher = Batcher::new(
        Box::new(BinTokens::open(std::slice::from_ref(&a), 4, 7).unwrap()),
        BatchConfig {
            batch: 2,
            shuffle: false,
            seed: 0,
            eval: EvalSplit::None,
        },
    )
    .unwrap();
    let before = batcher.position();
    assert!(batcher.next_batch().is_err());
    assert_eq!(batcher.position(), before);

    // Bad files.
    let odd = dir.path().join("odd.bin");
    std::fs::write(&odd, [0u8; 10]).unwrap();
    let err = BinTokens::open(&[odd], 4, 10).err().unwrap().to_string();
    assert!(
        err.contains("odd.bin") && err.contains("multiple of 4"),
        "{err}"
    );
    let empty = dir.path().join("empty.bin");
    std::fs::write(&empty, []).unwrap();
    let err = BinTokens::open(&[empty], 4, 10).err().unwrap().to_string();
    assert!(err.contains("empty.bin") && err.contains("empty"), "{err}");
    let err = BinTokens::open(&[dir.path().join("missing.bin")], 4, 10)
        .err()
        .unwrap();
    assert!(matches!(err, DataError::Io { .. }), "{err}");
    assert!(BinTokens::open(&[], 4, 10).is_err());
}

/// A line of many short turns costs what its first sequence costs: turns past the sequence are
/// neither rendered nor tokenized (before, each of the 5000 turns rendered the conversation up
/// to it twice and every span was tokenized).
#[test]
fn chat_turns_past_the_sequence_are_not_processed() {
    let t = ChatTemplate::new(TOY_CHATML.into(), "", "");
    let calls = std::cell::Cell::new(0usize);
    let enc = FnEncoder(|s: &str| {
        calls.set(calls.get() + 1);
        s.bytes().map(u32::from).collect()
    });
    let turns: Vec<String> = (0..5000)
        .map(|i| {
            format!(r#"{{"role":"user","content":"q{i}"}},{{"role":"assistant","content":"a{i}"}}"#)
        })
        .collect();
    let line = format!(r#"{{"messages":[{}]}}"#, turns.join(","));
    let seq = 64; // a user-assistant pair is 35 tokens of bytes
    let samples =
        ChatSamples::from_lines(Path::new("many.jsonl"), vec![(1, line)], &t, &enc, seq).unwrap();
    assert_eq!(samples.len(), 1);
    assert_eq!(samples.stats().truncated, 1);
    assert!(
        calls.get() <= 2 * (seq + 2) + 1,
        "{} encoder calls",
        calls.get()
    );
    // The tokens kept are those of the whole conversation's first sequence.
    let messages: Vec<Message> = (0..3)
        .flat_map(|i| {
            [
                Message::new("user", &format!("q{i}")),
                Message::new("assistant", &format!("a{i}")),
            ]
        })
        .collect();
    let (full, _) = tokenize_conversation(&messages, &t, &bytes_encoder()).unwrap();
    let (cut, _) =
        tinynn_train::data::tokenize_conversation_upto(&messages, &t, &bytes_encoder(), seq + 2)
            .unwrap();
    assert!(cut.len() >= seq + 2 && full.starts_with(&cut));
}
