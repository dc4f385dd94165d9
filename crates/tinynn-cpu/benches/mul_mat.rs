//! mul_mat through the executor for each weight format, at SmolLM2's decode shapes
//! (1 token: K=576 against N=1536 and N=49152 rows) and a prefill shape (512 tokens),
//! on 1 and 2 threads. K-quants need rows of whole 256-element super-blocks, so they run with
//! K=512 (their throughput per byte is what compares). Throughput is weight bytes per second (decode is bound by them) and,
//! as a second counter, multiply-adds ×2 per second (FLOP/s).
//!
//! `cargo bench -p tinynn-cpu --bench mul_mat`

use divan::counter::{BytesCount, ItemsCount};
use divan::Bencher;
use tinynn_core::graph::Graph;
use tinynn_core::quant;
use tinynn_cpu::{Executor, Memory};
use tinynn_format::GgmlType;

fn main() {
    divan::main();
}

const FORMATS: [GgmlType; 13] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::Bf16,
    GgmlType::Q8_0,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q2K,
    GgmlType::Q3K,
    GgmlType::Q4K,
    GgmlType::Q5K,
    GgmlType::Q6K,
];

/// Weight bytes with plausible values: quantized noise, or noise blocks with small scales.
fn weights(ty: GgmlType, n: usize) -> Vec<u8> {
    let mut rng = tinynn_core::rng::Rng::new(0x2545_F491_4F6C_DD1D);
    let mut next = move || rng.next_u64();
    if quant::has_quantizer(ty) {
        let x: Vec<f32> = (0..n)
            .map(|_| (next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0)
            .collect();
        let mut out = vec![0u8; quant::row_bytes(ty, n).unwrap()];
        quant::quantize_row(ty, &x, &mut out).unwrap();
        return out;
    }
    let mut out: Vec<u8> = (0..quant::row_bytes(ty, n).unwrap())
        .map(|_| next() as u8)
        .collect();
    let l = ty.layout();
    let scales: &[usize] = match ty {
        GgmlType::Q2K => &[80, 82],
        GgmlType::Q3K => &[108],
        GgmlType::Q4K | GgmlType::Q5K => &[0, 2],
        GgmlType::Q6K => &[208],
        _ => &[],
    };
    for b in out.chunks_exact_mut(l.block_bytes as usize) {
        for &o in scales {
            b[o..o + 2].copy_from_slice(&0x2000u16.to_le_bytes());
        }
    }
    out
}

fn run(bencher: Bencher, ty: GgmlType, k: usize, n: usize, m: usize, threads: usize) {
    run_with(bencher, ty, k, n, m, threads, false);
}

/// Formats with a packed (interleaved-row) layout, benched through it.
const PACKED: [GgmlType; 7] = [
    GgmlType::F16,
    GgmlType::Bf16,
    GgmlType::Q8_0,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
];

fn run_with(
    bencher: Bencher,
    ty: GgmlType,
    k: usize,
    n: usize,
    m: usize,
    threads: usize,
    packed: bool,
) {
    let k = if k.is_multiple_of(ty.layout().block_elems as usize) {
        k
    } else {
        512
    };
    let w_bytes = weights(ty, k * n);
    let mut g = Graph::new();
    let w = g.weight("w", ty, &[k, n]).unwrap();
    let x = g.input("x", GgmlType::F32, &[k, m]).unwrap();
    let y = g.mul_mat(w, x).unwrap();
    g.set_output(y).unwrap();
    let plan = tinynn_cpu::compile(g);
    let mut mem = Memory::new(&plan);
    mem.bind_weight(&plan, w, &w_bytes).unwrap();
    if packed {
        match tinynn_cpu::packed::pack(ty, [k, n, 1, 1], &w_bytes) {
            Some(p) => mem.bind_packed(&plan, w, std::sync::Arc::new(p)).unwrap(),
            None => eprintln!("{ty}: no packed kernel on this machine; plain layout"),
        }
    }
    mem.write_f32(&plan, x, &vec![0.5; k * m]).unwrap();
    let mut exec = Executor::new(&plan, threads);
    bencher
        .counter(BytesCount::new(w_bytes.len()))
        .counter(ItemsCount::new(2 * k * n * m))
        .bench_local(|| exec.run(&plan, &mut mem).unwrap());
}

#[divan::bench(args = FORMATS, consts = [1, 2])]
fn decode_k576_n1536<const T: usize>(bencher: Bencher, ty: GgmlType) {
    run(bencher, ty, 576, 1536, 1, T);
}

#[divan::bench(args = FORMATS, consts = [1, 2])]
fn decode_k576_n49152<const T: usize>(bencher: Bencher, ty: GgmlType) {
    run(bencher, ty, 576, 49152, 1, T);
}

#[divan::bench(args = FORMATS, consts = [1, 2], sample_count = 3, sample_size = 1)]
fn prefill_k576_n1536_m512<const T: usize>(bencher: Bencher, ty: GgmlType) {
    run(bencher, ty, 576, 1536, 512, T);
}

#[divan::bench(args = PACKED, consts = [1, 2])]
fn packed_decode_k576_n1536<const T: usize>(bencher: Bencher, ty: GgmlType) {
    run_with(bencher, ty, 576, 1536, 1, T, true);
}

#[divan::bench(args = PACKED, consts = [1, 2])]
fn packed_decode_k576_n49152<const T: usize>(bencher: Bencher, ty: GgmlType) {
    run_with(bencher, ty, 576, 49152, 1, T, true);
}

#[divan::bench(args = PACKED, consts = [1, 2], sample_count = 3, sample_size = 1)]
fn packed_prefill_k576_n1536_m512<const T: usize>(bencher: Bencher, ty: GgmlType) {
    run_with(bencher, ty, 576, 1536, 512, T, true);
}

/// A 1536-wide input over 1024 tokens: the down projection of a training step, and the shape
/// of QLoRA's int8 gradient product through the up projection (a Q8_0 transpose).
#[divan::bench(args = PACKED, consts = [1, 2], sample_count = 5, sample_size = 1)]
fn packed_prefill_k1536_n576_m1024<const T: usize>(bencher: Bencher, ty: GgmlType) {
    run_with(bencher, ty, 1536, 576, 1024, T, true);
}

/// The backward product of a frozen weight, `dx = Wᵀ · dy` (`mul_mat_t`), at a QLoRA step's
/// shapes: dequantized panels of W through the f32 GEMM. Throughput is multiply-adds ×2 per
/// second.
fn run_t(bencher: Bencher, ty: GgmlType, [k, n, m]: [usize; 3], threads: usize) {
    let w_bytes = weights(ty, k * n);
    let mut g = Graph::new();
    let w = g.weight("w", ty, &[k, n]).unwrap();
    let dy = g.input("dy", GgmlType::F32, &[n, m]).unwrap();
    let dx = g.mul_mat_t(w, dy).unwrap();
    g.set_output(dx).unwrap();
    let plan = tinynn_cpu::compile(g);
    let mut mem = Memory::new(&plan);
    mem.bind_weight(&plan, w, &w_bytes).unwrap();
    let dys: Vec<f32> = (0..n * m).map(|i| ((i % 17) as f32 - 8.0) / 64.0).collect();
    mem.write_f32(&plan, dy, &dys).unwrap();
    let mut exec = Executor::new(&plan, threads);
    bencher
        .counter(ItemsCount::new(2 * k * n * m))
        .bench_local(|| exec.run(&plan, &mut mem).unwrap());
}

/// SmolLM2's up projection, seq 256 × batch 4 = 1024 tokens.
#[divan::bench(args = [GgmlType::F32, GgmlType::Q4_1], consts = [1, 2], sample_count = 20, sample_size = 1)]
fn backward_t_k576_n1536_m1024<const T: usize>(bencher: Bencher, ty: GgmlType) {
    run_t(bencher, ty, [576, 1536, 1024], T);
}

/// SmolLM2's tied head (Q8_0 in the Q4_1 file) for one 128-token chunk of the loss.
#[divan::bench(consts = [1, 2], sample_count = 10, sample_size = 1)]
fn backward_t_head_k576_n49152_m128<const T: usize>(bencher: Bencher) {
    run_t(bencher, GgmlType::Q8_0, [576, 49152, 128], T);
}
