//! Dequantization of the real SmolLM2-135M-Instruct tensors (Q4_1 weights, Q8_0 embedding)
//! against a decoder written independently here, straight from the byte layout.

use tinynn_core::quant::dequantize_row;
use tinynn_format::gguf::GgufFile;
use tinynn_format::model_cache::require_default_model;
use tinynn_format::GgmlType;

fn f16(b: &[u8]) -> f32 {
    half::f16::from_le_bytes([b[0], b[1]]).to_f32()
}

/// Q4_1 block (20 bytes): f16 d, f16 m, 16 bytes; element j < 16 = low nibble of byte j,
/// element j ≥ 16 = high nibble of byte j − 16; value = d·q + m.
fn independent_q4_1(bytes: &[u8]) -> Vec<f32> {
    let mut out = Vec::new();
    for block in bytes.chunks_exact(20) {
        let (d, m) = (f16(&block[0..2]), f16(&block[2..4]));
        let nibbles = &block[4..];
        out.extend(nibbles.iter().map(|b| d * (b & 15) as f32 + m));
        out.extend(nibbles.iter().map(|b| d * (b >> 4) as f32 + m));
    }
    out
}

/// Q8_0 block (34 bytes): f16 d, 32 signed bytes; value = d·q.
fn independent_q8_0(bytes: &[u8]) -> Vec<f32> {
    let mut out = Vec::new();
    for block in bytes.chunks_exact(34) {
        let d = f16(&block[0..2]);
        out.extend(block[2..].iter().map(|&b| d * (b as i8) as f32));
    }
    out
}

#[test]
fn smollm2_tensors_dequantize_bit_exactly() {
    let file = GgufFile::open(require_default_model().unwrap()).unwrap();
    let names = [
        "blk.0.attn_q.weight",
        "blk.0.ffn_down.weight",
        "blk.29.ffn_gate.weight",
        "token_embd.weight",
    ];
    for name in names {
        let t = file.tensor(name).unwrap();
        let row_len = t.info.dims[0] as usize;
        let rows = 4;
        let row_bytes = t.data.len() / (t.info.n_elements as usize / row_len);
        let bytes = &t.data[..rows * row_bytes];
        let want = match t.ggml_type() {
            GgmlType::Q4_1 => independent_q4_1(bytes),
            GgmlType::Q8_0 => independent_q8_0(bytes),
            other => panic!("{name} is {other}, expected Q4_1 or Q8_0"),
        };
        let mut got = vec![0f32; rows * row_len];
        dequantize_row(t.ggml_type(), bytes, &mut got).unwrap();
        for (i, (a, b)) in got.iter().zip(&want).enumerate() {
            assert_eq!(a.to_bits(), b.to_bits(), "{name}[{i}]: {a} vs {b}");
        }
        let mean_abs = got.iter().map(|v| v.abs()).sum::<f32>() / got.len() as f32;
        assert!(
            mean_abs > 1e-4 && mean_abs < 1.0,
            "{name}: implausible weights (mean |w| {mean_abs})"
        );
    }
}
