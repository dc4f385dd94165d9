//! Replays the `model_gguf` fuzz target's corpus (fuzz/corpus/model_gguf: its seeds and what
//! `cargo fuzz` kept) through the same generator and steps (`fuzz/fuzz_targets/model_gguf_body.rs`):
//! well-formed GGUF models with hostile hyperparameters open and decode, or fail with an
//! error — never a panic — and the seeds (three per architecture of the registry) make models
//! that open and decode.

#[path = "../../../fuzz/fuzz_targets/model_gguf_body.rs"]
mod body;

#[test]
fn model_gguf_corpus_never_panics() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/model_gguf");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    assert!(files.len() >= 10, "{} seeds", files.len());
    let (mut opened, mut decoded) = (0, 0);
    for path in &files {
        let data = std::fs::read(path).unwrap();
        if std::panic::catch_unwind(|| body::run(&data))
            .unwrap_or_else(|_| panic!("{} panicked", path.display()))
        {
            decoded += 1;
        }
        if let Some(bytes) = body::model_file(&data) {
            let tmp = tempfile::tempdir().unwrap();
            let p = tmp.path().join("m.gguf");
            std::fs::write(&p, bytes).unwrap();
            if tinynn_models::model::Model::open(&p).is_ok() {
                opened += 1;
            }
        }
    }
    eprintln!(
        "{opened} of {} corpus files make a model that opens, {decoded} decode",
        files.len()
    );
    assert!(decoded >= 10, "only {decoded} seeds decode");
    assert!(
        opened >= 10,
        "only {opened} of {} seeds make a model that opens",
        files.len()
    );
}
