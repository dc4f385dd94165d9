//! Tensors a checkpoint stores as many and a model reads as one: a mixture of experts'
//! per-expert matrices (Mixtral's `block_sparse_moe.experts.{i}.w1.weight`, ...) stacked on a
//! new outermost dimension, as llama.cpp's `ffn_*_exps` tensors hold them.

use std::collections::HashMap;
use std::ops::Range;

use super::HfModelDir;
use crate::error::{Error, Result};
use crate::safetensors::Dtype;

/// The stacked copies, back to back in one anonymous map.
#[derive(Default)]
pub(super) struct StackedCopies {
    map: Option<memmap2::MmapMut>,
    /// Stacked name → its byte range, dtype and PyTorch shape (outermost first).
    at: HashMap<String, (Range<usize>, Dtype, Vec<usize>)>,
}

/// A stacked copy made by [`HfModelDir::stack`].
#[derive(Clone, Debug)]
pub struct Stacked<'a> {
    /// Little-endian bytes: part 0, then part 1, ...
    pub bytes: &'a [u8],
    pub dtype: Dtype,
    /// PyTorch shape, outermost first: `[parts, ...the shape of each part]`.
    pub shape: Vec<usize>,
}

/// The parts of one stacked tensor found so far: (index, tensor name).
type Parts = Vec<(usize, String)>;

impl HfModelDir {
    /// Stacks the tensors `plan` maps to a (stacked name, index) pair: every index from 0 up
    /// must be present once, and the parts must share one dtype and shape. Only the first
    /// successful call makes copies (later ones return at once); they take as much memory as
    /// their parts. A gap, a repeated index or parts that differ is an error naming the
    /// stacked tensor.
    pub fn stack(&self, plan: impl Fn(&str) -> Option<(String, usize)>) -> Result<()> {
        if self.stacked.get().is_some() {
            return Ok(());
        }
        let mut groups: HashMap<String, Parts> = HashMap::new();
        for shard in &self.shards {
            for t in shard.tensors() {
                if let Some((to, i)) = plan(&t.name) {
                    groups.entry(to).or_default().push((i, t.name.clone()));
                }
            }
        }
        let mut names: Vec<&String> = groups.keys().collect();
        names.sort();
        let mut copies = StackedCopies::default();
        let mut selected = Vec::new();
        let mut len = 0usize;
        for to in names {
            let mut parts = groups[to].clone();
            parts.sort();
            let bad = |why: String| Error::invalid(&self.dir, format!("{to}: {why}"));
            let mut first: Option<(Dtype, Vec<usize>)> = None;
            let start = len.next_multiple_of(64);
            let mut at = start;
            for (want, (i, name)) in parts.iter().enumerate() {
                if *i != want {
                    return Err(bad(format!(
                        "its parts must be numbered 0 to {} without gaps or repeats, found {i} at place {want} ({name})",
                        parts.len() - 1
                    )));
                }
                let (file, t) = self
                    .tensor(name)
                    .ok_or_else(|| bad(format!("{name} is not in the weight files")))?;
                match &first {
                    None => first = Some((t.dtype, t.shape.clone())),
                    Some((dtype, shape)) if *dtype != t.dtype || *shape != t.shape => {
                        return Err(bad(format!(
                            "{name} is {:?} {:?}, the first part {dtype:?} {shape:?}",
                            t.dtype, t.shape
                        )));
                    }
                    Some(_) => {}
                }
                let data = file.tensor_data(t);
                selected.push((data, at));
                at += data.len();
            }
            let Some((dtype, shape)) = first else {
                continue;
            };
            let mut full = vec![parts.len()];
            full.extend(shape);
            copies.at.insert(to.clone(), (start..at, dtype, full));
            len = at;
        }
        if len > 0 {
            let mut map = memmap2::MmapMut::map_anon(len).map_err(|e| Error::io(&self.dir, e))?;
            for (data, at) in selected {
                map[at..at + data.len()].copy_from_slice(data);
            }
            copies.map = Some(map);
        }
        // Another thread may have made them meanwhile: the same copies.
        let _ = self.stacked.set(copies);
        Ok(())
    }

    /// Whether [`HfModelDir::stack`] has made its copies.
    pub fn is_stacked(&self) -> bool {
        self.stacked.get().is_some()
    }

    /// Every stacked copy, back to back (empty before [`HfModelDir::stack`]).
    pub fn stacked_bytes(&self) -> &[u8] {
        match self.stacked.get().and_then(|c| c.map.as_ref()) {
            Some(m) => m,
            None => &[],
        }
    }

    /// The stacked tensor `name` made by [`HfModelDir::stack`], when there is one.
    pub fn stacked(&self, name: &str) -> Option<Stacked<'_>> {
        let copies = self.stacked.get()?;
        let (range, dtype, shape) = copies.at.get(name)?;
        let map = copies.map.as_ref()?;
        Some(Stacked {
            bytes: &map[range.clone()],
            dtype: *dtype,
            shape: shape.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use crate::model_dir::HfModelDir;
    use crate::safetensors::Dtype;
    use crate::safetensors_writer::{write_safetensors, SafetensorsEntry};

    /// A directory holding F32 tensors `names` of shape [2, 3] (values: tensor index × 10 +
    /// element index).
    fn dir(names: &[&str]) -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("config.json"), r#"{"model_type": "llama"}"#).unwrap();
        let entries: Vec<SafetensorsEntry> = names
            .iter()
            .map(|n| SafetensorsEntry {
                name: n.to_string(),
                dtype: Dtype::F32,
                shape: vec![2, 3],
            })
            .collect();
        write_safetensors(&d.path().join("model.safetensors"), &entries, &[], |i| {
            Ok((0..6)
                .flat_map(|j| ((i * 10 + j) as f32).to_le_bytes())
                .collect())
        })
        .unwrap();
        d
    }

    fn plan(name: &str) -> Option<(String, usize)> {
        let rest = name.strip_prefix("e.")?;
        let (i, tail) = rest.split_once('.')?;
        Some((format!("stack.{tail}"), i.parse().ok()?))
    }

    #[test]
    fn parts_stack_in_index_order_and_gaps_are_refused() {
        let d = dir(&["e.1.w", "other", "e.0.w", "e.2.w"]);
        let m = HfModelDir::open(d.path()).unwrap();
        assert!(m.stacked("stack.w").is_none());
        m.stack(plan).unwrap();
        let s = m.stacked("stack.w").unwrap();
        assert_eq!(s.shape, [3, 2, 3]);
        assert_eq!(s.dtype, Dtype::F32);
        let v: Vec<f32> = s
            .bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        // Written in order e.1, other, e.0, e.2: tensor indices 0, 1, 2, 3.
        let want: Vec<f32> = [2, 0, 3]
            .iter()
            .flat_map(|&t| (0..6).map(move |j| (t * 10 + j) as f32))
            .collect();
        assert_eq!(v, want);
        assert!(m.stacked("other").is_none());

        let d = dir(&["e.0.w", "e.2.w"]);
        let e = HfModelDir::open(d.path())
            .unwrap()
            .stack(plan)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("stack.w") && e.contains("found 2 at place 1"),
            "{e}"
        );
    }
}
