//! Writes a safetensors file one tensor at a time: the header (sizes known up front), then
//! each tensor's bytes as the caller produces them, so a model is never held whole in memory.
//! The file appears only when complete ([`crate::atomic_file`]).

use std::path::Path;

use crate::error::{Error, Result};
use crate::safetensors::Dtype;

/// One tensor to write: its name, type and PyTorch shape (outermost first).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SafetensorsEntry {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<usize>,
}

impl SafetensorsEntry {
    /// Bytes of the tensor's data; `None` on overflow or a size that is not whole bytes.
    fn n_bytes(&self) -> Option<usize> {
        let bits = self
            .shape
            .iter()
            .try_fold(self.dtype.bitsize(), |a, &d| a.checked_mul(d))?;
        (bits % 8 == 0).then_some(bits / 8)
    }
}

/// Writes `entries` to `path` in that order, with the `__metadata__` map `metadata`; `data(i)`
/// gives entry `i`'s little-endian bytes, which must be exactly its shape × dtype. Returns the
/// file's size. On any error the file is not created (nor an older one replaced).
pub fn write_safetensors(
    path: &Path,
    entries: &[SafetensorsEntry],
    metadata: &[(&str, &str)],
    mut data: impl FnMut(usize) -> Result<Vec<u8>>,
) -> Result<u64> {
    let mut header = serde_json::Map::new();
    if !metadata.is_empty() {
        let meta = metadata
            .iter()
            .map(|(k, v)| (k.to_string(), serde_json::Value::from(*v)))
            .collect();
        header.insert("__metadata__".into(), serde_json::Value::Object(meta));
    }
    let mut offset = 0usize;
    let mut sizes = Vec::with_capacity(entries.len());
    for e in entries {
        if e.name == "__metadata__" || header.contains_key(&e.name) {
            return Err(Error::invalid(
                path,
                format!("tensor name '{}' is reserved or repeated", e.name),
            ));
        }
        let n = e.n_bytes().ok_or_else(|| {
            Error::invalid(
                path,
                format!(
                    "{}: shape {:?} of {:?} is not a whole number of bytes below 2^64",
                    e.name, e.shape, e.dtype
                ),
            )
        })?;
        let end = offset
            .checked_add(n)
            .ok_or_else(|| Error::invalid(path, "the tensors' total size overflows"))?;
        header.insert(
            e.name.clone(),
            serde_json::json!({
                "dtype": crate::safetensors::dtype_name(e.dtype),
                "shape": e.shape,
                "data_offsets": [offset, end],
            }),
        );
        sizes.push(n);
        offset = end;
    }
    let mut json = serde_json::to_vec(&serde_json::Value::Object(header))
        .map_err(|e| Error::invalid(path, e.to_string()))?;
    // The data starts on an 8-byte boundary (padded with spaces, as the format allows).
    while json.len() % 8 != 0 {
        json.push(b' ');
    }

    crate::atomic_file::write_atomic(path, |out, tmp| {
        let io = |e| Error::io(tmp, e);
        out.write_all(&(json.len() as u64).to_le_bytes())
            .map_err(io)?;
        out.write_all(&json).map_err(io)?;
        for (i, (e, &n)) in entries.iter().zip(&sizes).enumerate() {
            let bytes = data(i)?;
            if bytes.len() != n {
                return Err(Error::invalid(
                    path,
                    format!(
                        "{}: {} bytes given for {} (shape {:?} of {:?})",
                        e.name,
                        bytes.len(),
                        n,
                        e.shape,
                        e.dtype
                    ),
                ));
            }
            out.write_all(&bytes).map_err(io)?;
        }
        Ok(8 + json.len() as u64 + offset as u64)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::safetensors::SafetensorsFile;

    #[test]
    fn written_files_read_back_and_failures_leave_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.safetensors");
        let entries = vec![
            SafetensorsEntry {
                name: "a".into(),
                dtype: Dtype::F32,
                shape: vec![2, 3],
            },
            SafetensorsEntry {
                name: "b".into(),
                dtype: Dtype::BF16,
                shape: vec![3],
            },
        ];
        let bytes = |i: usize| -> Vec<u8> {
            match i {
                0 => (0..6).flat_map(|v| (v as f32).to_le_bytes()).collect(),
                _ => vec![1, 2, 3, 4, 5, 6],
            }
        };
        let size =
            write_safetensors(&path, &entries, &[("format", "pt")], |i| Ok(bytes(i))).unwrap();
        assert_eq!(size, std::fs::metadata(&path).unwrap().len());
        let f = SafetensorsFile::open(&path).unwrap();
        assert_eq!(f.header().metadata.get("format").unwrap(), "pt");
        for (i, e) in entries.iter().enumerate() {
            let t = f.tensor(&e.name).unwrap();
            assert_eq!((t.dtype, &t.shape), (e.dtype, &e.shape));
            assert_eq!(f.tensor_data(t), bytes(i));
        }

        // A wrong size: an error naming the tensor, the earlier file kept, no temporary left.
        let e = write_safetensors(&path, &entries, &[], |i| Ok(vec![0; i + 1])).unwrap_err();
        assert!(e.to_string().contains("a: 1 bytes given for 24"), "{e}");
        assert!(SafetensorsFile::open(&path).is_ok());
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
        let twice = vec![entries[0].clone(), entries[0].clone()];
        assert!(write_safetensors(&path, &twice, &[], |_| Ok(vec![]))
            .unwrap_err()
            .to_string()
            .contains("repeated"));
    }
}
