//! `tnn quantize` end to end: every target on a small synthetic Llama model (types, shapes,
//! metadata, errors within each format's bounds, bytes equal to the reference quantizer's), the
//! refusals, and a Q8_0 file made from the real model that `tnn run` and `tnn inspect` accept.

mod common;

use std::path::Path;

use common::{real_model, run_measured, tnn};
use tinynn_core::quant::{dequantize_row, quantize_row};
use tinynn_format::gguf::{file_type_name, Array, GgufFile, GgufString, GgufWriter, Value};
use tinynn_format::GgmlType;

const N_EMBD: u64 = 256;
const N_FF: u64 = 96; // a multiple of 32, not of 256: ffn_down cannot be a K type
const N_VOCAB: u64 = 64;

/// Gaussian values (σ = 0.05), reproducible.
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = tinynn_core::rng::Rng::new(seed);
    (0..n).map(|_| rng.normal() * 0.05).collect()
}

fn encode(ty: GgmlType, x: &[f32]) -> Vec<u8> {
    let mut out = vec![0u8; (ty.bytes_for(x.len() as u64, x.len() as u64)).unwrap() as usize];
    quantize_row(ty, x, &mut out).unwrap();
    out
}

/// A two-layer Llama (or another `arch`) with tied embeddings: F32 matrices, one F16 matrix
/// (attn_k), F32 norms.
fn write_model(path: &Path, arch: &str) {
    let mut tensors: Vec<(String, Vec<u64>, GgmlType)> = vec![
        (
            "token_embd.weight".into(),
            vec![N_EMBD, N_VOCAB],
            GgmlType::F32,
        ),
        ("output_norm.weight".into(), vec![N_EMBD], GgmlType::F32),
    ];
    for i in 0..2 {
        for (s, dims, ty) in [
            ("attn_norm", vec![N_EMBD], GgmlType::F32),
            ("attn_q", vec![N_EMBD, N_EMBD], GgmlType::F32),
            ("attn_k", vec![N_EMBD, 128], GgmlType::F16),
            ("attn_v", vec![N_EMBD, 128], GgmlType::F32),
            ("attn_output", vec![N_EMBD, N_EMBD], GgmlType::F32),
            ("ffn_norm", vec![N_EMBD], GgmlType::F32),
            ("ffn_gate", vec![N_EMBD, N_FF], GgmlType::F32),
            ("ffn_up", vec![N_EMBD, N_FF], GgmlType::F32),
            ("ffn_down", vec![N_FF, N_EMBD], GgmlType::F32),
        ] {
            tensors.push((format!("blk.{i}.{s}.weight"), dims, ty));
        }
    }
    let data: Vec<Vec<u8>> = tensors
        .iter()
        .enumerate()
        .map(|(i, (_, dims, ty))| {
            encode(
                *ty,
                &values(dims.iter().product::<u64>() as usize, i as u64),
            )
        })
        .collect();
    let mut w = GgufWriter::new();
    w.set_str("general.architecture", arch);
    w.set_str("general.name", "synthetic");
    w.set("general.file_type", Value::U32(0));
    for (k, v) in [
        ("block_count", 2),
        ("context_length", 128),
        ("embedding_length", N_EMBD as u32),
        ("feed_forward_length", N_FF as u32),
        ("attention.head_count", 4),
        ("attention.head_count_kv", 2),
    ] {
        w.set(&format!("{arch}.{k}"), Value::U32(v));
    }
    w.set(
        &format!("{arch}.attention.layer_norm_rms_epsilon"),
        Value::F32(1e-5),
    );
    w.set(
        "tokenizer.ggml.tokens",
        Value::Array(Array::String(
            (0..N_VOCAB)
                .map(|i| GgufString::from(format!("t{i}").as_str()))
                .collect(),
        )),
    );
    w.set(
        "tokenizer.ggml.scores",
        Value::Array(Array::F32((0..N_VOCAB).map(|i| -(i as f32)).collect())),
    );
    for ((name, dims, ty), bytes) in tensors.iter().zip(&data) {
        w.add_tensor(name, *ty, dims, bytes).unwrap();
    }
    w.write_atomic(path).unwrap();
}

/// The type each tensor must get, from llama.cpp's rules for this two-layer model: the tied
/// embedding is the output (Q6_K, Q8_0 stays Q8_0); use_more_bits(i, 2) picks layer 1 only;
/// Q4_K_S lifts attn_v of the first four layers; 96-wide ffn_down rows fall back from K types.
fn expected(target: &str, name: &str, n_dims: usize) -> GgmlType {
    use GgmlType::*;
    if n_dims == 1 {
        return F32;
    }
    let layer1 = name.starts_with("blk.1.");
    let (base, fallback) = match target {
        "F32" => return F32,
        "F16" => return F16,
        "BF16" => return Bf16,
        "Q8_0" => return Q8_0,
        "Q4_0" => (Q4_0, Q4_0),
        "Q4_1" => (Q4_1, Q4_1),
        "Q5_0" => (Q5_0, Q5_0),
        "Q5_1" => (Q5_1, Q5_1),
        "Q4_K" | "Q4_K_S" | "Q4_K_M" => (Q4K, Q5_0),
        "Q5_K" | "Q5_K_S" | "Q5_K_M" => (Q5K, Q5_1),
        "Q6_K" => (Q6K, Q8_0),
        _ => unreachable!("{target}"),
    };
    // llama-quantize's aliases: the plain K names are the _M mixes.
    let mix_m = target.ends_with("_M") || matches!(target, "Q4_K" | "Q5_K");
    let attn_v = name.ends_with("attn_v.weight");
    if name == "token_embd.weight" || (attn_v && mix_m && layer1) {
        Q6K
    } else if attn_v && target == "Q4_K_S" {
        Q5K
    } else if name.ends_with("ffn_down.weight") {
        // 96-wide rows: a K type is impossible.
        if mix_m && layer1 {
            Q8_0
        } else {
            fallback
        }
    } else {
        base
    }
}

/// Largest normalized mean squared error a format may leave on these values: about twice what
/// its step size implies (step² / 12 over the signal's variance), so each bound also catches a
/// format doing markedly worse than the next coarser one should.
fn nmse_bound(ty: GgmlType) -> f64 {
    use GgmlType::*;
    match ty {
        F32 => 0.0,
        F16 => 2e-7,
        Bf16 => 1e-5,
        Q8_0 => 6e-5,
        Q6K => 6e-4,
        Q5_0 | Q5_1 | Q5K => 3.5e-3,
        Q4_0 | Q4_1 | Q4K => 1.4e-2,
        other => panic!("no bound for {other}"),
    }
}

fn to_f32(ty: GgmlType, bytes: &[u8], n: usize) -> Vec<f32> {
    let mut out = vec![0f32; n];
    dequantize_row(ty, bytes, &mut out).unwrap();
    out
}

#[test]
fn every_target_on_a_synthetic_model() {
    let dir = tempfile::tempdir().unwrap();
    let src_path = dir.path().join("src.gguf");
    write_model(&src_path, "llama");
    let src = GgufFile::open(&src_path).unwrap();
    let targets = [
        ("F32", "F32"),
        ("F16", "F16"),
        ("bf16", "BF16"),
        ("Q8_0", "Q8_0"),
        ("Q4_0", "Q4_0"),
        ("Q4_1", "Q4_1"),
        ("Q5_0", "Q5_0"),
        ("Q5_1", "Q5_1"),
        ("Q4_K", "Q4_K_M"),
        ("Q5_K", "Q5_K_M"),
        ("Q4_K_S", "Q4_K_S"),
        ("Q5_K_S", "Q5_K_S"),
        ("Q6_K", "Q6_K"),
        ("Q4_K_M", "Q4_K_M"),
        ("Q5_K_M", "Q5_K_M"),
    ];
    for (arg, file_type) in targets {
        let out_path = dir.path().join(format!("{arg}.gguf"));
        let out = run_measured(
            tnn()
                .arg("quantize")
                .arg(&src_path)
                .arg(&out_path)
                .args([arg, "-t", "2"]),
        );
        assert_eq!(out.code, Some(0), "{arg}: {}", out.stderr);
        let q = GgufFile::open(&out_path).unwrap();

        // Metadata: the same keys in the same order, file type and quantization version set.
        let g = q.gguf();
        let id = g.get_raw("general.file_type").and_then(Value::as_u64);
        assert_eq!(id.and_then(file_type_name), Some(file_type), "{arg}");
        assert_eq!(
            g.get_raw("general.quantization_version"),
            Some(&Value::U32(2))
        );
        let keys = |f: &GgufFile| -> Vec<String> {
            f.gguf()
                .metadata()
                .iter()
                .map(|kv| kv.key.clone())
                .collect()
        };
        let mut want_keys = keys(&src);
        want_keys.push("general.quantization_version".into());
        assert_eq!(keys(&q), want_keys, "{arg}");
        for kv in src.gguf().metadata() {
            if kv.key != "general.file_type" {
                assert_eq!(g.get_raw(&kv.key), Some(&kv.value), "{arg} {}", kv.key);
            }
        }

        // Tensors: same names, shapes and order; the rules' types; values within bounds and
        // bytes equal to the reference quantizer's.
        let (a, b): (Vec<_>, Vec<_>) = (src.tensors().collect(), q.tensors().collect());
        assert_eq!(a.len(), b.len());
        let mut fallbacks = 0;
        for (s, t) in a.iter().zip(&b) {
            assert_eq!((s.name(), &s.info.dims), (t.name(), &t.info.dims), "{arg}");
            let want = expected(&arg.to_ascii_uppercase(), s.name(), s.info.dims.len());
            assert_eq!(t.ggml_type(), want, "{arg} {}", s.name());
            fallbacks += usize::from(s.name().ends_with("ffn_down.weight") && arg.contains("_K"));
            let n = s.n_elements() as usize;
            let x = to_f32(s.ggml_type(), s.data, n);
            let y = to_f32(t.ggml_type(), t.data, n);
            let err: f64 = x
                .iter()
                .zip(&y)
                .map(|(a, b)| f64::from(a - b).powi(2))
                .sum();
            let norm: f64 = x.iter().map(|a| f64::from(*a).powi(2)).sum();
            let nmse = err / norm;
            assert!(
                nmse <= nmse_bound(want),
                "{arg} {}: NMSE {nmse:.3e} over {want}'s {:.1e}",
                s.name(),
                nmse_bound(want)
            );
            assert_eq!(t.data, encode(want, &x).as_slice(), "{arg} {}", s.name());
        }
        // The summary reports the fallbacks (96-wide ffn_down rows of K targets) and the counts.
        let reported = out
            .stderr
            .lines()
            .find_map(|l| l.strip_prefix("fallbacks: "))
            .map_or(0, |l| {
                l.split(' ').next().unwrap().parse::<usize>().unwrap()
            });
        assert_eq!(reported, fallbacks, "{arg}: {}", out.stderr);
        assert!(out.stderr.contains("tensors: F32 "), "{}", out.stderr);
    }
}

#[test]
fn refusals_are_one_line_errors() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src.gguf");
    write_model(&src, "llama");
    let q8 = dir.path().join("q8.gguf");
    let quantize = |args: &[&std::ffi::OsStr]| run_measured(tnn().arg("quantize").args(args));
    let ok = quantize(&[src.as_ref(), q8.as_ref(), "Q8_0".as_ref()]);
    assert_eq!(ok.code, Some(0), "{}", ok.stderr);

    let again = dir.path().join("again.gguf");
    let truncated = dir.path().join("truncated.gguf");
    let bytes = std::fs::read(&src).unwrap();
    std::fs::write(&truncated, &bytes[..bytes.len() / 2]).unwrap();
    let other_arch = dir.path().join("rwkv6.gguf");
    write_model(&other_arch, "rwkv6");
    let unwritable = dir.path().join("no/such/dir/out.gguf");
    // Running an architecture tinynn lacks says which ones it has.
    let run = run_measured(tnn().args(["run", "-p", "hi", "-m"]).arg(&other_arch));
    assert_eq!(run.code, Some(1), "{}", run.stderr);
    let err = run.stderr.trim_end().lines().last().unwrap_or("");
    assert!(
        err.contains("architecture 'rwkv6' is not supported yet (supported: llama,")
            && err.contains("gemma3")
            && err.contains("mamba"),
        "{err}"
    );
    let cases: [(&[&std::ffi::OsStr], &str); 6] = [
        (
            &[other_arch.as_ref(), again.as_ref(), "Q4_0".as_ref()],
            "architecture 'rwkv6'",
        ),
        (
            &[src.as_ref(), again.as_ref(), "Q2_K_S".as_ref()],
            "valid types: F32, F16",
        ),
        (
            &[q8.as_ref(), again.as_ref(), "Q4_0".as_ref()],
            "already quantized (Q8_0)",
        ),
        (
            &[truncated.as_ref(), again.as_ref(), "Q4_0".as_ref()],
            "truncated.gguf",
        ),
        (
            &[src.as_ref(), unwritable.as_ref(), "Q4_0".as_ref()],
            "dir is not a directory",
        ),
        (
            &[dir.path().as_ref(), again.as_ref(), "Q4_0".as_ref()],
            "GGUF files only",
        ),
    ];
    for (args, needle) in cases {
        let out = quantize(args);
        let err = out.stderr.trim_end();
        assert_eq!(out.code, Some(1), "{args:?}: {err}");
        assert!(
            err.starts_with("error: ") && !err.contains('\n') && err.contains(needle),
            "{args:?}: {err}"
        );
        assert!(!again.exists(), "{args:?} wrote a file");
    }
    // Dequantizing to F32 adds no error, so it needs no flag.
    let f32_out = dir.path().join("f32.gguf");
    let out = quantize(&[q8.as_ref(), f32_out.as_ref(), "F32".as_ref()]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(f32_out.exists());
    // With the flag, requantizing works.
    let out = quantize(&[
        q8.as_ref(),
        again.as_ref(),
        "Q4_0".as_ref(),
        "--allow-requantize".as_ref(),
    ]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(again.exists());
}

#[test]
fn q8_0_of_the_real_model_runs_and_inspects() {
    let dir = tempfile::tempdir().unwrap();
    let q8 = dir.path().join("smol-q8_0.gguf");
    // The default model is Q4_1, so this is a requantization.
    let out = run_measured(tnn().arg("quantize").arg(real_model()).arg(&q8).args([
        "Q8_0",
        "--allow-requantize",
        "-t",
        "2",
    ]));
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(
        out.stderr.contains("tensors: F32 61, Q8_0 211"),
        "{}",
        out.stderr
    );
    // Tensor by tensor: the 94 MiB input stays mapped, the 138 MiB output is held, the model is
    // never all in f32 (540 MB).
    assert!(
        out.max_rss < 400 << 20,
        "peak RSS {} MiB",
        out.max_rss >> 20
    );

    let run = run_measured(
        tnn()
            .args([
                "run",
                "-p",
                "The capital of France is",
                "-n",
                "8",
                "--temp",
                "0",
            ])
            .args(["-t", "2", "-m"])
            .arg(&q8),
    );
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert!(
        run.stdout.starts_with("The capital of France is Paris"),
        "{}",
        run.stdout
    );
    let inspect = run_measured(tnn().arg("inspect").arg("--no-tensors").arg(&q8));
    assert_eq!(inspect.code, Some(0), "{}", inspect.stderr);
    assert!(inspect.stdout.contains("Q8_0"), "{}", inspect.stdout);
}

/// The 2- and 3-bit K mixes from the command line: `Q3_K` is read as `Q3_K_M` (as
/// llama-quantize reads it), and each mix gives the default model's tensors the types
/// llama-quantize gives them (its choices are in the models crate's fixture).
#[test]
fn low_bit_k_mixes_match_llama_quantize() {
    let fx: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../tinynn-models/tests/fixtures/llama-quantize-types.json"),
        )
        .unwrap(),
    )
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    for (arg, file_type) in [
        ("Q2_K", "Q2_K"),
        ("q3_k_s", "Q3_K_S"),
        ("Q3_K", "Q3_K_M"),
        ("Q3_K_L", "Q3_K_L"),
    ] {
        let out_path = dir.path().join(format!("{arg}.gguf"));
        let out = run_measured(tnn().arg("quantize").arg("smollm2").arg(&out_path).args([
            arg,
            "--allow-requantize",
            "-t",
            "2",
        ]));
        assert_eq!(out.code, Some(0), "{arg}: {}", out.stderr);
        let q = GgufFile::open(&out_path).unwrap();
        let id = q
            .gguf()
            .get_raw("general.file_type")
            .and_then(Value::as_u64);
        assert_eq!(id.and_then(file_type_name), Some(file_type), "{arg}");
        let want = &fx["smollm2"][file_type];
        for t in q.tensors() {
            assert_eq!(
                Some(t.ggml_type().name()),
                want[t.name()]["type"].as_str(),
                "{arg} {}",
                t.name()
            );
        }
        std::fs::remove_file(&out_path).unwrap();
    }
}
