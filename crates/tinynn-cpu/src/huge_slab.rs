//! Long-lived buffers (the packed weight copies) carved out of 2 MiB-aligned anonymous maps that
//! ask the kernel for transparent huge pages (`MADV_HUGEPAGE`).
//!
//! Decode streams every weight from DRAM once per token, and how fast one core streams depends
//! on the pages behind the bytes. Measured on this project's 2-core AMD EPYC (one thread, 256 MiB
//! read with AVX-512 loads, three rounds): 4 KiB anonymous pages 22.9-23.3 GB/s, the same bytes
//! as a file's page-cache pages (what llama.cpp reads its weights from) 28.4-29.4 GB/s, huge
//! pages 32.1-33.0 GB/s. Most weight matrices are far below 2 MiB (SmolLM2's are 70 KiB-1.8 MiB),
//! so a map per matrix cannot have huge pages: they share 32 MiB chunks instead. A chunk is
//! freed when the last buffer cut from it is dropped. Where the kernel offers no huge pages
//! (`/sys/kernel/mm/transparent_hugepage/enabled` = never), the advice is refused and the
//! chunks are ordinary anonymous maps.

use std::sync::{Arc, Mutex, Weak};

use crate::memory::MemoryError;

/// Huge-page size and the alignment of every chunk.
const HUGE: usize = 2 << 20;
/// Bytes of a shared chunk; a buffer above a quarter of it gets a chunk of its own.
const CHUNK: usize = 32 << 20;
/// Alignment of every buffer inside a chunk (a cache line: the kernels' loads never split).
const ALIGN: usize = 64;

/// One anonymous map, `HUGE`-aligned from `lead` bytes in, `cap` bytes usable.
struct Chunk {
    /// A raw map: buffers write through its pointer, never through a shared slice of it.
    map: memmap2::MmapRaw,
    lead: usize,
    cap: usize,
}

impl Chunk {
    fn new(cap: usize) -> Result<Chunk, MemoryError> {
        let refused = || MemoryError::OutOfMemory { bytes: cap };
        let map: memmap2::MmapRaw =
            memmap2::MmapMut::map_anon(cap.checked_add(HUGE).ok_or_else(refused)?)
                .map_err(|_| refused())?
                .into();
        let lead = (HUGE - map.as_ptr() as usize % HUGE) % HUGE;
        // A hint: refused where transparent huge pages are off, and then 4 KiB pages serve.
        let _ = map.advise_range(memmap2::Advice::HugePage, lead, cap);
        Ok(Chunk { map, lead, cap })
    }
}

/// The chunk small buffers are cut from now, and the first free byte in it.
static CURRENT: Mutex<Option<(Weak<Chunk>, usize)>> = Mutex::new(None);

/// A zeroed buffer in huge-page-backed memory. Its bytes are its own: no two buffers overlap.
pub struct SlabBuf {
    chunk: Arc<Chunk>,
    offset: usize,
    len: usize,
}

impl SlabBuf {
    /// `len` zeroed bytes, 64-byte aligned, or an error when the system refuses the memory.
    pub fn try_zeroed(len: usize) -> Result<SlabBuf, MemoryError> {
        let need = len
            .checked_next_multiple_of(ALIGN)
            .ok_or(MemoryError::OutOfMemory { bytes: len })?
            .max(ALIGN);
        if need > CHUNK / 4 {
            let cap = need
                .checked_next_multiple_of(HUGE)
                .ok_or(MemoryError::OutOfMemory { bytes: len })?;
            let chunk = Arc::new(Chunk::new(cap)?);
            return Ok(SlabBuf {
                chunk,
                offset: 0,
                len,
            });
        }
        let mut current = CURRENT.lock().unwrap_or_else(|e| e.into_inner());
        let live = current
            .as_ref()
            .and_then(|(weak, next)| Some((weak.upgrade()?, *next)))
            .filter(|(chunk, next)| next + need <= chunk.cap);
        let (chunk, offset) = match live {
            Some(found) => found,
            None => (Arc::new(Chunk::new(CHUNK)?), 0),
        };
        *current = Some((Arc::downgrade(&chunk), offset + need));
        Ok(SlabBuf { chunk, offset, len })
    }

    /// The first byte of this buffer inside its chunk's map.
    fn start(&self) -> *mut u8 {
        self.chunk
            .map
            .as_mut_ptr()
            .wrapping_add(self.chunk.lead + self.offset)
    }

    pub fn as_bytes(&self) -> &[u8] {
        // SAFETY: `lead + offset .. + len` lies inside the chunk's map (`offset + len ≤ cap`,
        // the map holds `lead + cap` bytes), which lives as long as `self.chunk`; no other
        // buffer covers these bytes, and writes to them need `&mut self`.
        unsafe { std::slice::from_raw_parts(self.start(), self.len) }
    }

    pub fn as_bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_bytes`, and `&mut self` makes this the only live reference to
        // these bytes (the map is writable; other buffers of the chunk hold disjoint ranges).
        unsafe { std::slice::from_raw_parts_mut(self.start(), self.len) }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_zeroed_aligned_and_disjoint() {
        let sizes = [
            1usize,
            63,
            64,
            65,
            4096,
            100_000,
            3 << 20,
            9 << 20,
            40 << 20,
        ];
        let mut bufs: Vec<SlabBuf> = sizes
            .iter()
            .map(|&n| SlabBuf::try_zeroed(n).unwrap())
            .collect();
        for (i, b) in bufs.iter_mut().enumerate() {
            assert_eq!(b.len(), sizes[i]);
            assert_eq!(b.as_bytes().as_ptr() as usize % ALIGN, 0);
            assert!(
                b.as_bytes().iter().all(|&x| x == 0),
                "buffer {i} not zeroed"
            );
            b.as_bytes_mut().fill(i as u8 + 1);
        }
        // Each buffer still holds its own value: no write reached another.
        for (i, b) in bufs.iter().enumerate() {
            assert!(b.as_bytes().iter().all(|&x| x == i as u8 + 1), "buffer {i}");
        }
        let mut spans: Vec<(usize, usize)> = bufs
            .iter()
            .map(|b| (b.as_bytes().as_ptr() as usize, b.len()))
            .collect();
        spans.sort();
        for w in spans.windows(2) {
            assert!(w[0].0 + w[0].1 <= w[1].0, "overlap: {w:?}");
        }
    }

    #[test]
    fn big_buffers_start_on_a_huge_page_boundary() {
        let b = SlabBuf::try_zeroed(CHUNK).unwrap();
        assert_eq!(b.as_bytes().as_ptr() as usize % HUGE, 0);
    }

    #[test]
    fn a_big_buffer_s_chunk_is_freed_with_it() {
        let big = SlabBuf::try_zeroed(CHUNK / 2).unwrap();
        let weak = Arc::downgrade(&big.chunk);
        assert!(weak.upgrade().is_some());
        drop(big);
        assert!(
            weak.upgrade().is_none(),
            "the chunk outlived its only buffer"
        );
    }

    #[test]
    fn small_buffers_share_a_chunk() {
        let a = SlabBuf::try_zeroed(1000).unwrap();
        let b = SlabBuf::try_zeroed(1000).unwrap();
        // Tests running beside this one may start a new chunk between the two; a third try
        // then lands beside the second.
        let c = SlabBuf::try_zeroed(1000).unwrap();
        assert!(Arc::ptr_eq(&a.chunk, &b.chunk) || Arc::ptr_eq(&b.chunk, &c.chunk));
    }

    #[test]
    fn absurd_sizes_are_errors() {
        assert!(SlabBuf::try_zeroed(usize::MAX).is_err());
        assert!(SlabBuf::try_zeroed(usize::MAX - 100).is_err());
    }
}
