use super::*;
use GgmlType::*;

fn t(name: &str, dims: &[u64], ty: GgmlType) -> TensorDesc {
    TensorDesc {
        name: name.into(),
        dims: dims.to_vec(),
        ty,
    }
}

/// A Llama-family model's tensors: `n_layer` blocks of `n_embd` wide layers, F16 matrices and
/// F32 norms, with or without an output matrix.
fn llama(n_layer: u64, n_embd: u64, n_kv: u64, n_ff: u64, tied: bool) -> Vec<TensorDesc> {
    let mut v = vec![
        t("token_embd.weight", &[n_embd, 1000], F16),
        t("output_norm.weight", &[n_embd], F32),
    ];
    if !tied {
        v.push(t("output.weight", &[n_embd, 1000], F16));
    }
    for i in 0..n_layer {
        let b = |s: &str| format!("blk.{i}.{s}.weight");
        v.extend([
            t(&b("attn_norm"), &[n_embd], F32),
            t(&b("attn_q"), &[n_embd, n_embd], F16),
            t(&b("attn_k"), &[n_embd, n_kv], F16),
            t(&b("attn_v"), &[n_embd, n_kv], F16),
            t(&b("attn_output"), &[n_embd, n_embd], F16),
            t(&b("ffn_norm"), &[n_embd], F32),
            t(&b("ffn_gate"), &[n_embd, n_ff], F16),
            t(&b("ffn_up"), &[n_embd, n_ff], F16),
            t(&b("ffn_down"), &[n_ff, n_embd], F16),
        ]);
    }
    v
}

fn shape(arch: &str, n_layer: u64, n_head: u64, n_head_kv: u64) -> ModelShape {
    ModelShape {
        arch: arch.into(),
        n_layer,
        n_head,
        n_head_kv,
        n_expert: 0,
    }
}

/// The chosen type of the tensor named `name`.
fn of(tensors: &[TensorDesc], choices: &[Choice], name: &str) -> Choice {
    let i = tensors.iter().position(|t| t.name == name).expect(name);
    choices[i]
}

fn plain(ty: GgmlType) -> Choice {
    Choice { ty, fallback: None }
}

fn fell(ty: GgmlType, wanted: GgmlType, row_len: u64) -> Choice {
    Choice {
        ty,
        fallback: Some(Fallback { wanted, row_len }),
    }
}

// use_more_bits(i, 30): i < 3, i >= 26, or (i - 3) % 3 == 2.
const MORE_OF_30: [u64; 14] = [0, 1, 2, 5, 8, 11, 14, 17, 20, 23, 26, 27, 28, 29];

// use_more_bits(i, 32): i < 4, i >= 28, or (i - 4) % 3 == 2.
const MORE_OF_32: [u64; 16] = [0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31];

#[test]
fn use_more_bits_picks_ends_and_every_third_layer() {
    let got: Vec<u64> = (0..30).filter(|&i| use_more_bits(i, 30)).collect();
    assert_eq!(got, MORE_OF_30);
    let got: Vec<u64> = (0..32).filter(|&i| use_more_bits(i, 32)).collect();
    assert_eq!(got, MORE_OF_32);
}

#[test]
fn smollm2_shaped_q4_k_m_falls_back_on_576_wide_rows() {
    // SmolLM2-135M: 30 layers, 576 wide (not a multiple of 256), ffn 1536 (= 6 × 256), tied.
    let mut tensors = llama(30, 576, 192, 1536, true);
    // Given in reverse: the layer counters must follow llama.cpp's sorted order, not the file's.
    tensors.reverse();
    let c = choose_types(&shape("llama", 30, 9, 3), Target::Q4KM, &tensors);
    // The tied embedding is the output: Q6_K wanted, but 576 is not whole Q4_K blocks → Q8_0
    // directly (llama.cpp does not count this one as a fallback).
    assert_eq!(of(&tensors, &c, "token_embd.weight"), plain(Q8_0));
    assert_eq!(of(&tensors, &c, "output_norm.weight"), plain(F32));
    for i in 0..30u64 {
        let get = |s: &str| of(&tensors, &c, &format!("blk.{i}.{s}.weight"));
        let more = MORE_OF_30.contains(&i);
        assert_eq!(get("attn_norm"), plain(F32));
        assert_eq!(get("ffn_norm"), plain(F32));
        for s in ["attn_q", "attn_k", "attn_output", "ffn_gate", "ffn_up"] {
            assert_eq!(get(s), fell(Q5_0, Q4K, 576), "blk.{i}.{s}");
        }
        let v = if more {
            fell(Q8_0, Q6K, 576)
        } else {
            fell(Q5_0, Q4K, 576)
        };
        assert_eq!(get("attn_v"), v, "blk.{i}.attn_v");
        assert_eq!(
            get("ffn_down"),
            plain(if more { Q6K } else { Q4K }),
            "blk.{i}.ffn_down"
        );
    }
    let fallbacks = c.iter().filter(|c| c.fallback.is_some()).count();
    assert_eq!(fallbacks, 30 * 6);
}

#[test]
fn q5_k_m_gives_q6_k_to_the_same_layers_and_falls_back_to_q5_1() {
    let tensors = llama(30, 576, 192, 1536, true);
    let c = choose_types(&shape("llama", 30, 9, 3), Target::Q5KM, &tensors);
    assert_eq!(
        of(&tensors, &c, "blk.3.attn_q.weight"),
        fell(Q5_1, Q5K, 576)
    );
    assert_eq!(
        of(&tensors, &c, "blk.5.attn_v.weight"),
        fell(Q8_0, Q6K, 576)
    );
    assert_eq!(
        of(&tensors, &c, "blk.6.attn_v.weight"),
        fell(Q5_1, Q5K, 576)
    );
    assert_eq!(of(&tensors, &c, "blk.5.ffn_down.weight"), plain(Q6K));
    assert_eq!(of(&tensors, &c, "blk.6.ffn_down.weight"), plain(Q5K));
}

#[test]
fn untied_output_gets_q6_k_and_the_embedding_the_default() {
    let tensors = llama(32, 4096, 1024, 11008, false);
    let m = shape("llama", 32, 32, 8);
    let c = choose_types(&m, Target::Q4KM, &tensors);
    assert_eq!(of(&tensors, &c, "output.weight"), plain(Q6K));
    assert_eq!(of(&tensors, &c, "token_embd.weight"), plain(Q4K));
    // 11008 is 43 × 256: ffn_down keeps K types.
    for i in 0..32 {
        let want = plain(if MORE_OF_32.contains(&i) { Q6K } else { Q4K });
        for s in ["attn_v", "ffn_down"] {
            assert_eq!(of(&tensors, &c, &format!("blk.{i}.{s}.weight")), want);
        }
    }
    assert!(c.iter().all(|c| c.fallback.is_none()));

    // Q4_K_S: Q5_K for the first four attn_v and the first 32/8 = 4 ffn_down.
    let c = choose_types(&m, Target::Q4KS, &tensors);
    for i in 0..32 {
        let want = if i < 4 { Q5K } else { Q4K };
        for s in ["attn_v", "ffn_down"] {
            assert_eq!(of(&tensors, &c, &format!("blk.{i}.{s}.weight")).ty, want);
        }
        assert_eq!(of(&tensors, &c, &format!("blk.{i}.attn_q.weight")).ty, Q4K);
    }
    assert_eq!(of(&tensors, &c, "output.weight"), plain(Q6K));

    // Q5_K_S and Q6_K have no layer rules.
    for (target, ty) in [(Target::Q5KS, Q5K), (Target::Q6K, Q6K)] {
        let c = choose_types(&m, target, &tensors);
        assert_eq!(of(&tensors, &c, "blk.0.attn_v.weight"), plain(ty));
        assert_eq!(of(&tensors, &c, "blk.0.ffn_down.weight"), plain(ty));
        assert_eq!(of(&tensors, &c, "output.weight"), plain(Q6K));
    }
}

#[test]
fn seventy_b_llama_lifts_q4_k_attn_v_to_q5_k() {
    let tensors = llama(80, 8192, 1024, 28672, false);
    let c = choose_types(&shape("llama", 80, 64, 8), Target::Q4KM, &tensors);
    assert_eq!(of(&tensors, &c, "blk.0.attn_v.weight"), plain(Q6K));
    assert_eq!(of(&tensors, &c, "blk.11.attn_v.weight"), plain(Q5K));
    assert_eq!(of(&tensors, &c, "blk.11.attn_q.weight"), plain(Q4K));
    // Without grouped KV heads (65B) or in Qwen3, the rule does not apply.
    let c = choose_types(&shape("llama", 80, 64, 64), Target::Q4KM, &tensors);
    assert_eq!(of(&tensors, &c, "blk.11.attn_v.weight"), plain(Q4K));
    let c = choose_types(&shape("qwen3", 80, 64, 8), Target::Q4KM, &tensors);
    assert_eq!(of(&tensors, &c, "blk.11.attn_v.weight"), plain(Q4K));
    let c = choose_types(&shape("qwen2", 80, 64, 8), Target::Q4KM, &tensors);
    assert_eq!(of(&tensors, &c, "blk.11.attn_v.weight"), plain(Q5K));
}

#[test]
fn legacy_targets_give_the_output_q6_k_or_its_fallback() {
    let tensors = llama(2, 576, 192, 1536, true);
    let m = shape("llama", 2, 9, 3);
    for (target, ty) in [
        (Target::Q4_0, Q4_0),
        (Target::Q4_1, Q4_1),
        (Target::Q5_0, Q5_0),
        (Target::Q5_1, Q5_1),
    ] {
        let c = choose_types(&m, target, &tensors);
        assert_eq!(
            of(&tensors, &c, "token_embd.weight"),
            fell(Q8_0, Q6K, 576),
            "{target}"
        );
        assert_eq!(of(&tensors, &c, "blk.1.attn_v.weight"), plain(ty));
        assert_eq!(of(&tensors, &c, "blk.1.ffn_down.weight"), plain(ty));
    }
    // Q8_0 keeps Q8_0 for the output too.
    let c = choose_types(&m, Target::Q8_0, &tensors);
    assert!(tensors
        .iter()
        .zip(&c)
        .all(|(t, c)| *c == plain(if t.dims.len() == 2 { Q8_0 } else { F32 })));
    // An untied 1024-wide output is whole Q6_K blocks.
    let tensors = llama(2, 1024, 256, 2048, false);
    let c = choose_types(&m, Target::Q4_0, &tensors);
    assert_eq!(of(&tensors, &c, "output.weight"), plain(Q6K));
    assert_eq!(of(&tensors, &c, "token_embd.weight"), plain(Q4_0));
}

#[test]
fn float_targets_convert_every_matrix_and_keep_the_rest() {
    let mut tensors = llama(2, 576, 192, 1536, true);
    tensors.push(t("blk.0.attn_q.bias", &[576], F16));
    tensors.push(t("rope_freqs.weight", &[32], F32));
    let m = shape("llama", 2, 9, 3);
    for target in [Target::F32, Target::F16, Target::Bf16] {
        let c = choose_types(&m, target, &tensors);
        for (t, c) in tensors.iter().zip(&c) {
            let want = if t.dims.len() == 2 {
                target.default_type()
            } else {
                t.ty
            };
            assert_eq!(*c, plain(want), "{target} {}", t.name);
        }
    }
}

#[test]
fn what_is_never_quantized() {
    assert!(is_quantizable("blk.0.attn_q.weight", &[64, 64]));
    assert!(is_quantizable("blk.0.ffn_down_exps.weight", &[64, 64, 8]));
    assert!(!is_quantizable("blk.0.attn_norm.weight", &[64]));
    // ggml counts [64, 1] as one dimension.
    assert!(!is_quantizable("blk.0.attn_q.weight", &[64, 1]));
    assert!(!is_quantizable("blk.0.attn_q_norm.weight", &[64, 64]));
    assert!(!is_quantizable("blk.0.ffn_gate_inp.weight", &[64, 8]));
    assert!(!is_quantizable("blk.0.attn_q.bias", &[64, 64]));
}

#[test]
fn rows_that_fit_no_block_become_f16() {
    let tensors = vec![
        t("blk.0.attn_q.weight", &[100, 64], F32),
        t("blk.0.ffn_up.weight", &[96, 64], F32),
    ];
    let m = shape("llama", 1, 1, 1);
    let c = choose_types(&m, Target::Q4KM, &tensors);
    assert_eq!(c[0], fell(F16, Q4K, 100));
    assert_eq!(c[1], fell(Q5_0, Q4K, 96));
    // A legacy type on a row of 100: no smaller block to demote to → F16.
    let c = choose_types(&m, Target::Q8_0, &tensors);
    assert_eq!(c[0], fell(F16, Q8_0, 100));
    assert_eq!(c[1], plain(Q8_0));
}

/// A Mixtral-shaped model (8 experts): the routers stay F32, the stacked experts follow the
/// ffn rules by layer, attn_k / attn_v get Q8_0, and attn_output Q5_K for Q4_K_M (not for
/// Q3_K_L, which llama.cpp leaves at its default there); 4 experts change nothing.
#[test]
fn eight_experts_get_llama_cpp_s_moe_rules() {
    let (n_layer, e, ff) = (8u64, 256u64, 512u64);
    let mut v = llama(n_layer, e, e / 4, ff, false);
    v.retain(|t| {
        !t.name.contains("ffn_gate.")
            && !t.name.contains("ffn_up.")
            && !t.name.contains("ffn_down.")
    });
    for i in 0..n_layer {
        let b = |s: &str| format!("blk.{i}.{s}.weight");
        v.extend([
            t(&b("ffn_gate_inp"), &[e, 8], F32),
            t(&b("ffn_gate_exps"), &[e, ff, 8], F16),
            t(&b("ffn_up_exps"), &[e, ff, 8], F16),
            t(&b("ffn_down_exps"), &[ff, e, 8], F16),
        ]);
    }
    let mut model = shape("llama", n_layer, 32, 8);
    model.n_expert = 8;
    let c = choose_types(&model, Target::Q4KM, &v);
    for i in 0..n_layer {
        let at = |s: &str| of(&v, &c, &format!("blk.{i}.{s}.weight"));
        assert_eq!(at("ffn_gate_inp"), plain(F32));
        assert_eq!(at("attn_k"), plain(Q8_0));
        assert_eq!(at("attn_v"), plain(Q8_0));
        assert_eq!(at("attn_output"), plain(Q5K));
        assert_eq!(at("attn_q"), plain(Q4K));
        assert_eq!(at("ffn_gate_exps"), plain(Q4K));
        let down = if use_more_bits(i, n_layer) { Q6K } else { Q4K };
        assert_eq!(at("ffn_down_exps"), plain(down), "layer {i}");
    }
    let c = choose_types(&model, Target::Q3KL, &v);
    assert_eq!(of(&v, &c, "blk.0.attn_output.weight"), plain(Q3K));
    assert_eq!(of(&v, &c, "blk.0.ffn_down_exps.weight"), plain(Q5K));
    model.n_expert = 4;
    let c = choose_types(&model, Target::Q4KM, &v);
    assert_eq!(of(&v, &c, "blk.0.attn_k.weight"), plain(Q4K));
    assert_eq!(of(&v, &c, "blk.0.attn_output.weight"), plain(Q4K));
}
