//! Converting one tensor's rows from any readable type to another, in parallel.
//!
//! Each thread owns a contiguous run of rows and one f32 row buffer: a row is dequantized with
//! the reference dequantizer, then quantized with the reference quantizer, so no more than one
//! row per thread is ever held in f32.

use tinynn_core::quant::{dequantize_row, quantize_row, row_bytes, QuantError};
use tinynn_format::GgmlType;

/// Converts `n_rows` rows of `row_len` elements from `src` (type `from`) to type `to`, on up to
/// `threads` threads. Returns the converted bytes.
pub fn convert_rows(
    from: GgmlType,
    src: &[u8],
    row_len: usize,
    n_rows: usize,
    to: GgmlType,
    threads: usize,
) -> Result<Vec<u8>, QuantError> {
    let src_row = row_bytes(from, row_len)?;
    let dst_row = row_bytes(to, row_len)?;
    let need = src_row * n_rows;
    if src.len() != need {
        return Err(QuantError::WrongLength {
            ty: from,
            what: "source tensor",
            n: row_len * n_rows,
            got: src.len(),
            need,
        });
    }
    let mut dst = vec![0u8; dst_row * n_rows];
    if n_rows == 0 || row_len == 0 {
        return Ok(dst);
    }
    // Small tensors are not worth a thread each.
    let min_rows = (1 << 14) / row_len + 1;
    let threads = threads.clamp(1, n_rows.div_ceil(min_rows).max(1));
    let rows_per = n_rows.div_ceil(threads);
    let run = |src: &[u8], dst: &mut [u8]| -> Result<(), QuantError> {
        let mut row = vec![0f32; row_len];
        for (s, d) in src.chunks_exact(src_row).zip(dst.chunks_exact_mut(dst_row)) {
            dequantize_row(from, s, &mut row)?;
            quantize_row(to, &row, d)?;
        }
        Ok(())
    };
    if threads == 1 {
        run(src, &mut dst)?;
        return Ok(dst);
    }
    std::thread::scope(|scope| {
        let handles: Vec<_> = src
            .chunks(rows_per * src_row)
            .zip(dst.chunks_mut(rows_per * dst_row))
            .map(|(s, d)| scope.spawn(move || run(s, d)))
            .collect();
        handles
            .into_iter()
            .try_for_each(|h| h.join().expect("a conversion thread panicked"))
    })?;
    Ok(dst)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threads_split_rows_without_changing_bytes() {
        // 300 rows of 256: any split must give the single-threaded bytes.
        let (row_len, n_rows) = (256, 300);
        let x: Vec<f32> = (0..row_len * n_rows)
            .map(|i| ((i * 7919 % 1000) as f32 - 500.0) / 97.0)
            .collect();
        let src: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
        for to in [GgmlType::Q4K, GgmlType::Q8_0, GgmlType::F16] {
            let one = convert_rows(GgmlType::F32, &src, row_len, n_rows, to, 1).unwrap();
            for threads in [2, 3, 7] {
                let many = convert_rows(GgmlType::F32, &src, row_len, n_rows, to, threads).unwrap();
                assert_eq!(one, many, "{to} with {threads} threads");
            }
            let mut direct = vec![0u8; one.len()];
            quantize_row(to, &x, &mut direct).unwrap();
            assert_eq!(one, direct, "{to}");
        }
    }

    #[test]
    fn wrong_sizes_are_errors() {
        assert!(convert_rows(GgmlType::F32, &[0; 12], 4, 1, GgmlType::F16, 2).is_err());
        assert!(convert_rows(GgmlType::F32, &[0; 16], 4, 1, GgmlType::Q8_0, 2).is_err());
    }
}
