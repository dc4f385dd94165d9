//! Checkpoints: round trip, pruning, typed errors, fallback, and a process killed mid-write.

use std::path::{Path, PathBuf};
use std::process::Command;

use tinynn_format::gguf::{GgufWriter, Value};
use tinynn_format::GgmlType;
use tinynn_train::checkpoint::*;
use tinynn_train::data::DataPosition;
use tinynn_train::schedule::Schedule;

struct Owned {
    names: Vec<String>,
    dims: Vec<Vec<u64>>,
    params: Vec<Vec<f32>>,
    m: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
}

/// Deterministic test tensors for `step` (values differ per step).
fn tensors(step: u64) -> Owned {
    let shapes: [(&str, &[u64]); 3] = [
        ("tok_embd.weight", &[64, 32]),
        ("blk.0.attn_q.weight.lora_a", &[16, 4]),
        ("output_norm.weight", &[16]),
    ];
    let val = |k: usize, i: usize| ((k * 1000 + i) as f32 * 0.37 + step as f32).sin();
    let mut o = Owned {
        names: vec![],
        dims: vec![],
        params: vec![],
        m: vec![],
        v: vec![],
    };
    for (k, (name, dims)) in shapes.iter().enumerate() {
        let n = dims.iter().product::<u64>() as usize;
        o.names.push(name.to_string());
        o.dims.push(dims.to_vec());
        o.params.push((0..n).map(|i| val(k, i)).collect());
        o.m.push((0..n).map(|i| val(k + 10, i) * 1e-3).collect());
        o.v.push((0..n).map(|i| val(k + 20, i).abs() * 1e-6).collect());
    }
    o
}

fn meta(step: u64) -> CheckpointMeta {
    CheckpointMeta {
        step,
        architecture: Some("llama".into()),
        schedule: Some(Schedule::WarmupCosine {
            lr: 1e-4,
            min_lr: 1e-5,
            warmup_steps: 10,
            total_steps: 100,
        }),
        data: Some(DataPosition {
            epoch: 1,
            index: step * 4,
            rng: 0xDEAD_BEEF ^ step,
        }),
        rngs: vec![("dropout".into(), step.wrapping_mul(0x9E37_79B9_7F4A_7C15))],
        config_json: r#"{"lr":1e-4,"lora":{"rank":8}}"#.into(),
    }
}

fn checkpoint(o: &Owned, step: u64) -> Checkpoint<'_> {
    Checkpoint {
        meta: meta(step),
        params: (0..o.names.len())
            .map(|k| TensorRef {
                name: &o.names[k],
                dims: &o.dims[k],
                data: &o.params[k],
            })
            .collect(),
        groups: vec![
            ("opt.m.".into(), o.m.iter().map(Vec::as_slice).collect()),
            ("opt.v.".into(), o.v.iter().map(Vec::as_slice).collect()),
        ],
    }
}

fn save_step(dir: &Path, step: u64, keep: usize) -> PathBuf {
    let o = tensors(step);
    let opts = SaveOptions {
        keep_last: keep,
        ..SaveOptions::default()
    };
    save(dir, &checkpoint(&o, step), &opts).unwrap()
}

fn assert_is_step(c: &LoadedCheckpoint, step: u64) {
    let o = tensors(step);
    assert_eq!(c.meta, meta(step));
    assert_eq!(c.params, o.names);
    assert_eq!(c.groups, ["opt.m.", "opt.v."]);
    for k in 0..o.names.len() {
        let t = c.tensor(&o.names[k]).unwrap();
        assert_eq!(t.dims, &o.dims[k][..]);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(t.data), bits(&o.params[k]), "{}", o.names[k]);
        assert_eq!(bits(c.group("opt.m.", &o.names[k]).unwrap()), bits(&o.m[k]));
        assert_eq!(bits(c.group("opt.v.", &o.names[k]).unwrap()), bits(&o.v[k]));
    }
    assert_eq!(
        c.rng("dropout"),
        Some(step.wrapping_mul(0x9E37_79B9_7F4A_7C15))
    );
}

#[test]
fn round_trip_pointer_and_pruning() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().join("run");
    assert!(matches!(
        load_latest(&d),
        Err(CheckpointError::NoCheckpoint { .. })
    ));
    for step in [10, 20, 30, 40] {
        let p = save_step(&d, step, 2);
        assert_eq!(p, d.join(format!("checkpoint-{step}.gguf")));
        let c = load_latest(&d).unwrap();
        assert!(c.fallback.is_none());
        assert_is_step(&c, step);
    }
    assert_eq!(
        std::fs::read_to_string(d.join("latest")).unwrap(),
        "checkpoint-40.gguf\n"
    );
    let steps: Vec<u64> = list(&d).unwrap().into_iter().map(|(s, _)| s).collect();
    assert_eq!(steps, [30, 40], "only the newest 2 are kept");
    let names: Vec<String> = std::fs::read_dir(&d)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert!(names.iter().all(|n| !n.contains(".tmp-")), "{names:?}");
    assert_is_step(&load(&d.join("checkpoint-30.gguf")).unwrap(), 30);

    // keep_last 0 keeps everything.
    save_step(&d, 50, 0);
    save_step(&d, 60, 0);
    assert_eq!(list(&d).unwrap().len(), 4);
}

#[test]
fn bad_pointer_and_corrupt_files_fall_back() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    save_step(d, 1, 0);
    save_step(d, 2, 0);
    save_step(d, 3, 0);
    // The pointer names a file that is gone: the newest loadable one, with the reason.
    std::fs::remove_file(d.join("checkpoint-3.gguf")).unwrap();
    let c = load_latest(d).unwrap();
    assert_is_step(&c, 2);
    let why = c.fallback.unwrap();
    assert!(
        why.contains("checkpoint-3.gguf") && why.contains("checkpoint-2.gguf"),
        "{why}"
    );

    // The newest file is truncated: a format error, then the one before.
    let p2 = d.join("checkpoint-2.gguf");
    let bytes = std::fs::read(&p2).unwrap();
    std::fs::write(&p2, &bytes[..bytes.len() / 2]).unwrap();
    assert!(matches!(load(&p2), Err(CheckpointError::Format(_))));
    std::fs::write(d.join("latest"), "checkpoint-2.gguf\n").unwrap();
    let c = load_latest(d).unwrap();
    assert_is_step(&c, 1);
    assert!(c.fallback.unwrap().contains("checkpoint-2.gguf"));

    // One flipped bit in tensor data: the checksum names the tensor.
    let mut flipped = bytes.clone();
    let last = flipped.len() - 40;
    flipped[last] ^= 0x10;
    std::fs::write(&p2, &flipped).unwrap();
    match load(&p2) {
        Err(CheckpointError::Corrupt { name, .. }) => assert!(name.starts_with("opt.v."), "{name}"),
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("corruption not detected"),
    }

    // Edited metadata (data position, random state, schedule, step, names) with the tensors
    // intact: the metadata checksum refuses it, and --resume falls back to the one before.
    std::fs::write(&p2, &bytes).unwrap();
    std::fs::write(d.join("latest"), "checkpoint-2.gguf\n").unwrap();
    let edits: [(&str, Value); 5] = [
        ("checkpoint.data.index", Value::U64(999)),
        (
            "checkpoint.rng.states",
            Value::Array(tinynn_format::gguf::Array::U64(vec![7])),
        ),
        ("checkpoint.data.rng", Value::U64(1)),
        (
            "checkpoint.schedule",
            Value::String(r#"{"kind":"constant","lr":0.5}"#.into()),
        ),
        ("checkpoint.step", Value::U64(3)),
    ];
    for (key, value) in edits {
        let g = tinynn_format::gguf::Gguf::parse(&bytes).unwrap();
        let mut w = GgufWriter::from_gguf(&g, &bytes).unwrap();
        w.set(key, value);
        let mut out = Vec::new();
        w.write_to(&mut out).unwrap();
        std::fs::write(&p2, &out).unwrap();
        let err = match load(&p2) {
            Err(e) => e.to_string(),
            Ok(_) => panic!("edited {key} not detected"),
        };
        assert!(
            err.contains("checkpoint.meta_checksum") || err.contains(key),
            "{key}: {err}"
        );
        let c = load_latest(d).unwrap();
        assert_is_step(&c, 1);
    }
    let err = load(&p2).err().unwrap().to_string();
    assert!(err.contains("corrupted or edited"), "{err}");

    // A pointer with garbage in it.
    std::fs::write(d.join("latest"), "../../etc/passwd").unwrap();
    let c = load_latest(d).unwrap();
    assert_is_step(&c, 1);
    assert!(c.fallback.unwrap().contains("does not name a checkpoint"));

    // Nothing loads: every reason is listed.
    std::fs::remove_file(d.join("checkpoint-1.gguf")).unwrap();
    let err = load_latest(d).unwrap_err().to_string();
    assert!(
        err.contains("no loadable checkpoint") && err.contains("checksum"),
        "{err}"
    );
}

/// A GGUF file with checkpoint metadata and the given tensors, for error cases.
fn forged(path: &Path, tensors: &[(&str, GgmlType, &[u64], &[u8])], params: &[&str]) {
    let mut w = GgufWriter::new();
    w.set_str("general.type", "checkpoint");
    w.set("checkpoint.version", Value::U32(2));
    w.set("checkpoint.step", Value::U64(5));
    let strs = |v: &[&str]| {
        Value::Array(tinynn_format::gguf::Array::String(
            v.iter().map(|s| (*s).into()).collect(),
        ))
    };
    w.set("checkpoint.rng.names", strs(&[]));
    w.set(
        "checkpoint.rng.states",
        Value::Array(tinynn_format::gguf::Array::U64(vec![])),
    );
    w.set("checkpoint.params", strs(params));
    w.set("checkpoint.groups", strs(&["opt.m."]));
    w.set(
        "checkpoint.checksums",
        Value::Array(tinynn_format::gguf::Array::U64(vec![0; 2])),
    );
    for (name, ty, dims, data) in tensors {
        w.add_tensor(name, *ty, dims, data).unwrap();
    }
    w.write_atomic(path).unwrap();
}

#[test]
fn typed_errors() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("x.gguf");
    let f32s = [0u8; 16];
    forged(&p, &[("w", GgmlType::F32, &[4], &f32s)], &["w"]);
    assert!(
        matches!(load(&p), Err(CheckpointError::MissingTensor { ref name, .. }) if name == "opt.m.w"),
        "{:?}",
        load(&p).err()
    );
    forged(
        &p,
        &[
            ("w", GgmlType::F16, &[4], &[0u8; 8]),
            ("opt.m.w", GgmlType::F32, &[4], &f32s),
        ],
        &["w"],
    );
    assert!(matches!(
        load(&p),
        Err(CheckpointError::WrongType {
            found: GgmlType::F16,
            ..
        })
    ));
    forged(
        &p,
        &[
            ("w", GgmlType::F32, &[4], &f32s),
            ("opt.m.w", GgmlType::F32, &[2, 2], &f32s),
        ],
        &["w"],
    );
    assert!(
        matches!(load(&p), Err(CheckpointError::Shape { .. })),
        "{:?}",
        load(&p).err()
    );
    forged(
        &p,
        &[
            ("w", GgmlType::F32, &[4], &f32s),
            ("opt.m.w", GgmlType::F32, &[4], &f32s),
        ],
        &["w"],
    );
    assert!(
        matches!(load(&p), Err(CheckpointError::Corrupt { .. })),
        "forged checksums"
    );

    let mut w = GgufWriter::new();
    w.set_str("general.type", "model");
    w.write_atomic(&p).unwrap();
    assert!(matches!(
        load(&p),
        Err(CheckpointError::NotACheckpoint { .. })
    ));
    let mut w = GgufWriter::new();
    w.set_str("general.type", "checkpoint");
    w.set("checkpoint.version", Value::U32(99));
    w.write_atomic(&p).unwrap();
    let err = load(&p).err().unwrap().to_string();
    assert!(err.contains("checkpoint.version"), "{err}");
    std::fs::write(&p, b"not a gguf").unwrap();
    assert!(matches!(load(&p), Err(CheckpointError::Format(_))));

    // Bad input to save.
    let o = tensors(1);
    let mut c = checkpoint(&o, 1);
    c.groups[0].1.pop();
    assert!(matches!(
        save(dir.path(), &c, &SaveOptions::default()),
        Err(CheckpointError::Invalid(_))
    ));
    let mut c = checkpoint(&o, 1);
    c.meta.config_json = "{oops".into();
    assert!(matches!(
        save(dir.path(), &c, &SaveOptions::default()),
        Err(CheckpointError::Invalid(_))
    ));
    let mut c = checkpoint(&o, 1);
    c.params[0].dims = &[3];
    assert!(matches!(
        save(dir.path(), &c, &SaveOptions::default()),
        Err(CheckpointError::Invalid(_))
    ));
    assert!(
        list(dir.path()).unwrap().is_empty(),
        "failed saves leave nothing"
    );
}

/// A ~0.3 MB file naming 20,000 parameters and 20,000 state groups once built 4·10^8 tensor
/// names (gigabytes) before it compared them with its one checksum; now the counts are
/// compared first.
#[test]
fn forged_counts_are_refused_before_names_are_built() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("x.gguf");
    let many: Vec<String> = (0..20_000).map(|i| format!("p{i}")).collect();
    let strs = |v: &[String]| {
        Value::Array(tinynn_format::gguf::Array::String(
            v.iter().map(|s| s.as_str().into()).collect(),
        ))
    };
    let mut w = GgufWriter::new();
    w.set_str("general.type", "checkpoint");
    w.set("checkpoint.version", Value::U32(2));
    w.set("checkpoint.step", Value::U64(5));
    w.set("checkpoint.rng.names", strs(&[]));
    w.set(
        "checkpoint.rng.states",
        Value::Array(tinynn_format::gguf::Array::U64(vec![])),
    );
    w.set("checkpoint.params", strs(&many));
    w.set("checkpoint.groups", strs(&many));
    w.set(
        "checkpoint.checksums",
        Value::Array(tinynn_format::gguf::Array::U64(vec![0])),
    );
    w.write_atomic(&p).unwrap();
    let err = load(&p).err().unwrap().to_string();
    assert!(
        err.contains("1 checksums for 20000 parameters × 20001 state groups"),
        "{err}"
    );
}

const CHILD_ENV: &str = "TINYNN_TEST_CHECKPOINT_CRASH_DIR";

/// The child writes checkpoint 1, then aborts half way through writing checkpoint 2; the parent
/// finds checkpoint 1 current and intact and the partial file ignored.
#[test]
fn crash_mid_write_keeps_the_previous_checkpoint() {
    if let Ok(dir) = std::env::var(CHILD_ENV) {
        let dir = PathBuf::from(dir);
        save_step(&dir, 1, 2);
        let o = tensors(2);
        let opts = SaveOptions {
            keep_last: 2,
            abort_after_bytes: Some(6000),
        };
        let _ = save(&dir, &checkpoint(&o, 2), &opts);
        unreachable!("the save must have aborted the process");
    }
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "crash_mid_write_keeps_the_previous_checkpoint",
            "--test-threads=1",
            "--nocapture",
        ])
        .env(CHILD_ENV, dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success(), "the child should have died: {out:?}");
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(out.status.signal(), Some(6), "SIGABRT: {out:?}");
    }
    let names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    let partial: Vec<&String> = names
        .iter()
        .filter(|n| n.starts_with(".checkpoint-2.gguf.tmp-"))
        .collect();
    assert_eq!(partial.len(), 1, "{names:?}");
    assert_eq!(
        std::fs::metadata(dir.path().join(partial[0]))
            .unwrap()
            .len(),
        6000
    );
    assert!(
        !names.contains(&"checkpoint-2.gguf".to_string()),
        "{names:?}"
    );

    let c = load_latest(dir.path()).unwrap();
    assert!(c.fallback.is_none());
    assert_is_step(&c, 1);
    assert_eq!(
        list(dir.path()).unwrap().len(),
        1,
        "the partial file is not a checkpoint"
    );

    // The next save clears the leftover and becomes current.
    save_step(dir.path(), 2, 2);
    assert_is_step(&load_latest(dir.path()).unwrap(), 2);
    let leftovers = std::fs::read_dir(dir.path())
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .contains(".tmp-")
        })
        .count();
    assert_eq!(leftovers, 0);
}
