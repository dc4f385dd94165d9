//! Our block formats against gguf-py's (fixture from scripts/make-quant-fixtures.py), bit for bit.

use tinynn_core::quant::{dequantize_row, quantize_row, row_bytes};
use tinynn_format::gguf::Gguf;
use tinynn_format::GgmlType;

const FIXTURE: &[u8] = include_bytes!("fixtures/quant_reference.gguf");

fn tensor<'a>(g: &Gguf, name: &str) -> (&'a [u8], GgmlType, usize) {
    let t = g
        .tensor_info(name)
        .unwrap_or_else(|| panic!("fixture lacks {name}"));
    let bytes = g.tensor_data(FIXTURE, t).unwrap();
    (bytes, t.ggml_type, t.n_elements as usize)
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn assert_bits_eq(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len());
    for (i, (a, b)) in got.iter().zip(want).enumerate() {
        assert_eq!(
            a.to_bits(),
            b.to_bits(),
            "{what}[{i}]: got {a}, gguf-py {b}"
        );
    }
}

#[test]
fn quantize_and_dequantize_match_gguf_py_exactly() {
    let g = Gguf::parse(FIXTURE).unwrap();
    let (input, _, n) = tensor(&g, "input");
    let x = f32s(input);
    for name in ["F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"] {
        let (want_q, ty, _) = tensor(&g, &format!("q.{name}"));
        let mut q = vec![0u8; row_bytes(ty, n).unwrap()];
        quantize_row(ty, &x, &mut q).unwrap();
        if let Some(i) = q.iter().zip(want_q).position(|(a, b)| a != b) {
            panic!(
                "{name}: quantized byte {i} is {}, gguf-py wrote {}",
                q[i], want_q[i]
            );
        }
        let mut dq = vec![0f32; n];
        dequantize_row(ty, want_q, &mut dq).unwrap();
        assert_bits_eq(name, &dq, &f32s(tensor(&g, &format!("dq.{name}")).0));
    }
}

#[test]
fn k_quant_dequantization_matches_gguf_py_exactly() {
    let g = Gguf::parse(FIXTURE).unwrap();
    for name in ["Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"] {
        let (blocks, ty, n) = tensor(&g, &format!("kq.{name}"));
        let mut dq = vec![0f32; n];
        dequantize_row(ty, blocks, &mut dq).unwrap();
        assert_bits_eq(name, &dq, &f32s(tensor(&g, &format!("kdq.{name}")).0));
    }
}
