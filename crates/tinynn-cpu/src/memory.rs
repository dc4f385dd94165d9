//! The memory a plan runs against: bound weights (borrowed, or held through an `Arc`'d
//! [`WeightStore`]; read-only), persistent tensors (owned, read-write), and 64-byte aligned
//! buffers for both persistent tensors and the arena.

use std::sync::Arc;

use tinynn_core::backend::WeightRef;

use tinynn_core::ops::Op;
use tinynn_core::plan::{Plan, Region};
use tinynn_core::tensor::TensorId;
use tinynn_format::GgmlType;

use crate::packed::PackedWeight;

/// A cache-line of bytes; buffers are vectors of these so they are 64-byte aligned.
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C, align(64))]
struct Line([u8; 64]);

/// A zero-initialized, 64-byte aligned byte buffer.
pub struct AlignedBuf {
    storage: Storage,
    len: usize,
}

enum Storage {
    Lines(Vec<Line>),
    /// Large buffers are anonymous maps: zero pages the kernel hands out on first write, so
    /// bytes no one writes (a dropped frozen tensor, an unused part of the arena) take no
    /// resident memory. A heap allocation this aligned would be zeroed by writing it.
    Map(memmap2::MmapMut),
}

/// Buffers from this size on are anonymous maps.
const MAP_FROM: usize = 64 << 10;

impl AlignedBuf {
    /// A zeroed buffer of `len` bytes. Panics when the memory cannot be had: sizes that come
    /// from a file or a user go through [`AlignedBuf::try_zeroed`].
    pub fn zeroed(len: usize) -> AlignedBuf {
        match AlignedBuf::try_zeroed(len) {
            Ok(b) => b,
            Err(e) => panic!("{e}"),
        }
    }

    /// A zeroed buffer of `len` bytes, or an error when the system will not give them (no
    /// heap fallback for a refused map: a heap of the same size would abort the process).
    pub fn try_zeroed(len: usize) -> Result<AlignedBuf, MemoryError> {
        let refused = || MemoryError::OutOfMemory { bytes: len };
        let storage = match len {
            // (Asking for huge pages made QLoRA steps no faster: 525-550 vs 536-604 t/s.)
            MAP_FROM.. => Storage::Map(memmap2::MmapMut::map_anon(len).map_err(|_| refused())?),
            _ => {
                let mut lines = Vec::new();
                lines
                    .try_reserve_exact(len.div_ceil(64))
                    .map_err(|_| refused())?;
                lines.resize(len.div_ceil(64), Line([0; 64]));
                Storage::Lines(lines)
            }
        };
        Ok(AlignedBuf { storage, len })
    }

    pub fn as_bytes(&self) -> &[u8] {
        match &self.storage {
            Storage::Lines(l) => &bytemuck::cast_slice(l)[..self.len],
            Storage::Map(m) => &m[..self.len],
        }
    }

    pub fn as_bytes_mut(&mut self) -> &mut [u8] {
        match &mut self.storage {
            Storage::Lines(l) => &mut bytemuck::cast_slice_mut(l)[..self.len],
            Storage::Map(m) => &mut m[..self.len],
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MemoryError {
    #[error("cannot allocate {bytes} bytes (the system refused them)")]
    OutOfMemory { bytes: usize },
    #[error("'{0}' is not a weight used by this plan")]
    NotAWeight(String),
    #[error("'{0}' is not a persistent tensor used by this plan")]
    NotPersistent(String),
    #[error("weight '{name}' needs {need} bytes, {got} were given")]
    WrongSize {
        name: String,
        need: usize,
        got: usize,
    },
    #[error("weight '{name}' ({dtype}) data is not {align}-byte aligned")]
    Misaligned {
        name: String,
        dtype: GgmlType,
        align: usize,
    },
    #[error("packed copy does not match weight '{name}' ({dtype} {ne:?})")]
    PackMismatch {
        name: String,
        dtype: GgmlType,
        ne: [usize; 4],
    },
    #[error("'{0}' keeps only its packed copy, which strict mode does not read")]
    PackedOnly(String),
    #[error("weight '{0}' is not bound")]
    Unbound(String),
    #[error("persistent tensor '{0}' is lent to another memory")]
    NotPresent(String),
    #[error("'{name}' is {dtype}, not {want}")]
    WrongType {
        name: String,
        dtype: GgmlType,
        want: GgmlType,
    },
}

/// A bound weight's bytes.
#[derive(Clone)]
pub(crate) enum WeightBytes<'w> {
    Borrowed(&'w [u8]),
    Shared(WeightRef),
}

impl WeightBytes<'_> {
    pub(crate) fn bytes(&self) -> &[u8] {
        match self {
            WeightBytes::Borrowed(b) => b,
            // In bounds: checked when bound, and the store's regions never change.
            WeightBytes::Shared(w) => w.bytes(),
        }
    }
}

/// Weights and persistent tensors of one plan.
pub struct Memory<'w> {
    pub(crate) weights: Vec<Option<WeightBytes<'w>>>,
    /// Packed copies of weights for the matrix-product kernels (see `packed`), per weight slot.
    pub(crate) packed: Vec<Option<Arc<PackedWeight>>>,
    /// The same for persistent tensors no step writes (a frozen training base), per slot.
    pub(crate) packed_persistent: Vec<Option<Arc<PackedWeight>>>,
    /// Per persistent slot: its bytes were dropped, the packed copy stands in for them
    /// ([`Memory::drop_packed_source`]).
    pub(crate) packed_only: Vec<bool>,
    pub(crate) persistent: Vec<AlignedBuf>,
}

impl<'w> Memory<'w> {
    /// Unbound weights and zeroed persistent tensors for `plan` (panics when the system
    /// refuses the memory; see [`Memory::try_new_sharing`]).
    pub fn new(plan: &Plan) -> Memory<'w> {
        Memory::new_sharing(plan, &[])
    }

    /// Like [`Memory::new`], but the persistent tensors in `shared` get no buffer of their own:
    /// another memory owns them and lends them with [`Memory::swap_persistent`] before a run
    /// (a run without them is an error).
    pub fn new_sharing(plan: &Plan, shared: &[TensorId]) -> Memory<'w> {
        match Memory::try_new_sharing(plan, shared) {
            Ok(m) => m,
            Err(e) => panic!("{e}"),
        }
    }

    /// [`Memory::new_sharing`], with an error when the system refuses the memory.
    pub fn try_new_sharing(plan: &Plan, shared: &[TensorId]) -> Result<Memory<'w>, MemoryError> {
        let persistent = plan
            .persistents()
            .iter()
            .map(|t| {
                AlignedBuf::try_zeroed(if shared.contains(t) {
                    0
                } else {
                    plan.graph().layout(*t).contiguous_bytes()
                })
            })
            .collect::<Result<_, _>>()?;
        Ok(Memory {
            weights: vec![None; plan.weights().len()],
            packed: vec![None; plan.weights().len()],
            packed_persistent: vec![None; plan.persistents().len()],
            packed_only: vec![false; plan.persistents().len()],
            persistent,
        })
    }

    fn name(plan: &Plan, t: TensorId) -> String {
        plan.graph().node(t).name.clone()
    }

    /// Binds `bytes` (e.g. a tensor of an mmap'd GGUF file) as weight `t`.
    pub fn bind_weight(
        &mut self,
        plan: &Plan,
        t: TensorId,
        bytes: &'w [u8],
    ) -> Result<(), MemoryError> {
        let slot = Memory::check_weight(plan, t, bytes)?;
        self.weights[slot] = Some(WeightBytes::Borrowed(bytes));
        Ok(())
    }

    /// Binds a weight's bytes in a store as weight `t`; the memory keeps the store alive (an
    /// owned model's files), so it borrows nothing.
    pub fn bind_weight_shared(
        &mut self,
        plan: &Plan,
        t: TensorId,
        weight: WeightRef,
    ) -> Result<(), MemoryError> {
        let region = weight.store.region(weight.region);
        let bytes = region
            .get(weight.range.clone())
            .ok_or_else(|| MemoryError::WrongSize {
                name: Memory::name(plan, t),
                need: weight.range.len(),
                got: region.len(),
            })?;
        let slot = Memory::check_weight(plan, t, bytes)?;
        self.weights[slot] = Some(WeightBytes::Shared(weight));
        Ok(())
    }

    /// The weight slot of `t`, after checking that `bytes` fit it (size and alignment).
    fn check_weight(plan: &Plan, t: TensorId, bytes: &[u8]) -> Result<usize, MemoryError> {
        let Some(Region::Weight(slot)) = plan.location(t).map(|l| l.region) else {
            return Err(MemoryError::NotAWeight(Memory::name(plan, t)));
        };
        let layout = plan.graph().layout(t);
        let need = layout.contiguous_bytes();
        if bytes.len() != need {
            return Err(MemoryError::WrongSize {
                name: Memory::name(plan, t),
                need,
                got: bytes.len(),
            });
        }
        // Kernels read elements as slices of their scalar type.
        let align = match layout.dtype {
            GgmlType::F32 | GgmlType::I32 => 4,
            GgmlType::F16 | GgmlType::Bf16 => 2,
            _ => 1,
        };
        if !(bytes.as_ptr() as usize).is_multiple_of(align) {
            return Err(MemoryError::Misaligned {
                name: Memory::name(plan, t),
                dtype: layout.dtype,
                align,
            });
        }
        Ok(slot as usize)
    }

    /// Gives weight `t` a packed copy (made by [`crate::packed::pack`] from the same bytes, and
    /// shareable between the memories of several plans); matrix products then read it instead of
    /// the bound bytes, except in strict mode. The bound bytes stay for other uses (e.g. an
    /// embedding lookup of the same tensor). `t` may also be a persistent tensor that no step of
    /// the plan writes (a frozen base in training); if the caller changes its bytes, the packed
    /// copy must be bound anew.
    pub fn bind_packed(
        &mut self,
        plan: &Plan,
        t: TensorId,
        packed: Arc<PackedWeight>,
    ) -> Result<(), MemoryError> {
        let region = plan.location(t).map(|l| l.region);
        if !matches!(region, Some(Region::Weight(_) | Region::Persistent(_))) {
            return Err(MemoryError::NotAWeight(Memory::name(plan, t)));
        }
        let layout = plan.graph().layout(t);
        let [k, n] = packed.shape();
        if layout.dtype != packed.source_type() || layout.ne != [k, n, 1, 1] {
            return Err(MemoryError::PackMismatch {
                name: Memory::name(plan, t),
                dtype: layout.dtype,
                ne: layout.ne,
            });
        }
        match region {
            Some(Region::Weight(slot)) => self.packed[slot as usize] = Some(packed),
            Some(Region::Persistent(slot)) => self.packed_persistent[slot as usize] = Some(packed),
            _ => {}
        }
        Ok(())
    }

    /// Bytes of the packed copies bound to persistent tensors (`bind_packed`).
    pub fn packed_persistent_bytes(&self) -> usize {
        self.packed_persistent
            .iter()
            .flatten()
            .map(|p| p.bytes())
            .sum()
    }

    /// The packed copy bound to persistent tensor `t`, if any.
    pub fn packed_persistent(&self, plan: &Plan, t: TensorId) -> Option<&Arc<PackedWeight>> {
        match plan.location(t).map(|l| l.region) {
            Some(Region::Persistent(slot)) => self.packed_persistent[slot as usize].as_ref(),
            _ => None,
        }
    }

    /// Frees the bytes of persistent tensor `t` when its packed copy can stand in for them:
    /// a copy is bound and every step of `plan` reads `t` only as the weight of a matrix
    /// product (`mul_mat` of F32 activations into a contiguous result, or `mul_mat_t`) or as
    /// the table of `get_rows`, which read the packed copy (`PackedWeight::unpack_row` gives the
    /// bytes back). Returns whether it did; a tensor read any other way keeps its bytes. The
    /// memory then only runs on a non-strict executor.
    pub fn drop_packed_source(&mut self, plan: &Plan, t: TensorId) -> Result<bool, MemoryError> {
        let Some(Region::Persistent(slot)) = plan.location(t).map(|l| l.region) else {
            return Err(MemoryError::NotPersistent(Memory::name(plan, t)));
        };
        if !self.can_drop_packed_source(plan, t) {
            return Ok(false);
        }
        self.persistent[slot as usize] = AlignedBuf::zeroed(0);
        self.packed_only[slot as usize] = true;
        Ok(true)
    }

    /// Whether [`Memory::drop_packed_source`] would drop `t`'s bytes.
    pub fn can_drop_packed_source(&self, plan: &Plan, t: TensorId) -> bool {
        let Some(Region::Persistent(slot)) = plan.location(t).map(|l| l.region) else {
            return false;
        };
        if self.packed_persistent[slot as usize].is_none() {
            return false;
        }
        let g = plan.graph();
        g.nodes().iter().enumerate().all(|(i, n)| {
            let reads = n.src.iter().position(|&s| s == t);
            let aliases = matches!(n.mem, tinynn_core::graph::Mem::Alias { base, .. } if base == t);
            if reads.is_none() && !aliases {
                return true;
            }
            // A node the plan never runs (not needed for its outputs) reads nothing.
            if plan.location(TensorId(i as u32)).is_none() {
                return true;
            }
            match (aliases, reads, n.op) {
                (false, Some(0), Op::GetRows) => !n.src[1..].contains(&t),
                // The dequantizing path of `mul_mat_t` (2-D, contiguous result).
                (false, Some(0), Op::MulMatT) => {
                    let ld = g.layout(n.src[1]);
                    !n.src[1..].contains(&t)
                        && ld.ne[2] == 1
                        && ld.ne[3] == 1
                        && n.layout.is_contiguous()
                }
                (false, Some(0), Op::MulMat) => {
                    !n.src[1..].contains(&t)
                        && g.layout(n.src[1]).dtype == GgmlType::F32
                        && n.layout.is_contiguous()
                }
                _ => false,
            }
        })
    }

    pub fn persistent_mut(&mut self, plan: &Plan, t: TensorId) -> Result<&mut [u8], MemoryError> {
        match plan.location(t).map(|l| l.region) {
            Some(Region::Persistent(slot)) => Ok(self.persistent[slot as usize].as_bytes_mut()),
            _ => Err(MemoryError::NotPersistent(Memory::name(plan, t))),
        }
    }

    pub fn persistent(&self, plan: &Plan, t: TensorId) -> Result<&[u8], MemoryError> {
        match plan.location(t).map(|l| l.region) {
            Some(Region::Persistent(slot)) => Ok(self.persistent[slot as usize].as_bytes()),
            _ => Err(MemoryError::NotPersistent(Memory::name(plan, t))),
        }
    }

    /// Sets persistent tensor `t` to zeros without allocating (gradient buffers between
    /// optimizer steps; optimizer moments are separate tensors and keep their values).
    pub fn zero_persistent(&mut self, plan: &Plan, t: TensorId) -> Result<(), MemoryError> {
        self.persistent_mut(plan, t)?.fill(0);
        Ok(())
    }

    fn typed_mut(
        &mut self,
        plan: &Plan,
        t: TensorId,
        want: GgmlType,
    ) -> Result<&mut [u8], MemoryError> {
        let dtype = plan.graph().layout(t).dtype;
        if dtype != want {
            return Err(MemoryError::WrongType {
                name: Memory::name(plan, t),
                dtype,
                want,
            });
        }
        self.persistent_mut(plan, t)
    }

    /// Writes f32 values into the start of persistent tensor `t`.
    pub fn write_f32(
        &mut self,
        plan: &Plan,
        t: TensorId,
        values: &[f32],
    ) -> Result<(), MemoryError> {
        let bytes = self.typed_mut(plan, t, GgmlType::F32)?;
        for (dst, v) in bytes.chunks_exact_mut(4).zip(values) {
            dst.copy_from_slice(&v.to_le_bytes());
        }
        Ok(())
    }

    /// Writes i32 values (token ids, positions) into the start of persistent tensor `t`.
    pub fn write_i32(
        &mut self,
        plan: &Plan,
        t: TensorId,
        values: &[i32],
    ) -> Result<(), MemoryError> {
        let bytes = self.typed_mut(plan, t, GgmlType::I32)?;
        for (dst, v) in bytes.chunks_exact_mut(4).zip(values) {
            dst.copy_from_slice(&v.to_le_bytes());
        }
        Ok(())
    }

    /// Exchanges persistent tensor `t` of this memory with persistent tensor `other_t` of
    /// `other` (two plans sharing state, e.g. a KV cache used by a prefill plan and a decode
    /// plan). Both must have the same size; nothing is copied.
    pub fn swap_persistent(
        &mut self,
        plan: &Plan,
        t: TensorId,
        other: &mut Memory<'_>,
        other_plan: &Plan,
        other_t: TensorId,
    ) -> Result<(), MemoryError> {
        let slot = |p: &Plan, t: TensorId| match p.location(t).map(|l| l.region) {
            Some(Region::Persistent(s)) => Ok(s as usize),
            _ => Err(MemoryError::NotPersistent(Memory::name(p, t))),
        };
        let (a, b) = (slot(plan, t)?, slot(other_plan, other_t)?);
        match (self.packed_only[a], other.packed_only[b]) {
            // Both read the one packed copy; there are no bytes to lend.
            (true, true) => return Ok(()),
            (false, false) => {}
            // One side would receive no bytes for a tensor it reads as bytes.
            _ => return Err(MemoryError::PackedOnly(Memory::name(plan, t))),
        }
        // Each side must receive a buffer of its tensor's size (or give away a placeholder).
        let need_a = plan.graph().layout(t).contiguous_bytes();
        let need_b = other_plan.graph().layout(other_t).contiguous_bytes();
        let (has_a, has_b) = (self.persistent[a].len(), other.persistent[b].len());
        if need_a != need_b || (has_b != need_a && has_a != need_b) {
            return Err(MemoryError::WrongSize {
                name: Memory::name(plan, t),
                need: need_a,
                got: has_b,
            });
        }
        std::mem::swap(&mut self.persistent[a], &mut other.persistent[b]);
        Ok(())
    }

    pub(crate) fn check_bound(&self, plan: &Plan) -> Result<(), MemoryError> {
        for ((buf, &t), &packed_only) in self
            .persistent
            .iter()
            .zip(plan.persistents())
            .zip(&self.packed_only)
        {
            if buf.len() != plan.graph().layout(t).contiguous_bytes() && !packed_only {
                return Err(MemoryError::NotPresent(Memory::name(plan, t)));
            }
        }
        match self.weights.iter().position(Option::is_none) {
            Some(slot) => Err(MemoryError::Unbound(Memory::name(
                plan,
                plan.weights()[slot],
            ))),
            None => Ok(()),
        }
    }
}
