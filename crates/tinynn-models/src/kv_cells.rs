//! Which sequence owns which row ("cell") of the KV cache. The cache has `n_cells` rows per
//! layer and KV head; any sequence may take any free cell, and a cell may belong to several
//! sequences at once (a shared prefix, [`KvCells::copy_prefix`]), as in llama.cpp's unified
//! cache. A token of sequence `s` at position `p` attends to exactly the cells that `s` owns at
//! positions `≤ p`; the attention mask is built from that rule.
//!
//! New cells are taken lowest-first, so without frees a sequence's cells ascend with its
//! positions and attention visits its rows in position order, as a one-sequence cache would:
//! a sequence decoded alongside others gets the same arithmetic as decoded alone.

#![warn(missing_docs)]

/// Most sequences one cache holds (a cell's owners are a 64-bit set).
pub const MAX_SEQUENCES: usize = 64;

#[derive(Clone, Copy, Debug, Default)]
struct Cell {
    /// Position of the token whose K/V the cell holds (meaningful when `owners != 0`).
    pos: u32,
    /// Bit s: sequence s owns the cell.
    owners: u64,
}

/// The ownership map of a KV cache.
#[derive(Clone, Debug)]
pub struct KvCells {
    cells: Vec<Cell>,
    /// Per sequence: its cells in position order (`seq_cells[s][p]` holds position `p`).
    seqs: Vec<Vec<u32>>,
    /// No cell below this index is free.
    free_hint: usize,
    /// One past the highest cell in use.
    used_end: usize,
    /// Cells some sequence owns.
    n_used: usize,
}

/// Why cells could not be taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CellError {
    /// Every cell is in use.
    Full,
    /// The sequence id is not below the cache's sequence count.
    NoSuchSequence(usize),
}

impl KvCells {
    /// `n_cells` free cells shared by `n_seq` sequences (at most [`MAX_SEQUENCES`]).
    pub fn new(n_cells: usize, n_seq: usize) -> KvCells {
        KvCells {
            cells: vec![Cell::default(); n_cells],
            seqs: vec![Vec::new(); n_seq.clamp(1, MAX_SEQUENCES)],
            free_hint: 0,
            used_end: 0,
            n_used: 0,
        }
    }

    /// Rows of the cache.
    pub fn n_cells(&self) -> usize {
        self.cells.len()
    }

    /// Sequences the cache holds.
    pub fn n_seq(&self) -> usize {
        self.seqs.len()
    }

    /// Tokens sequence `seq` holds (its next position).
    pub fn len(&self, seq: usize) -> usize {
        self.seqs.get(seq).map_or(0, Vec::len)
    }

    /// True when no sequence holds a token.
    pub fn is_empty(&self) -> bool {
        self.used_end == 0
    }

    /// Cells not owned by any sequence.
    pub fn n_free(&self) -> usize {
        self.cells.len() - self.n_used
    }

    /// One past the highest cell in use: attention reads cells `0..used_end()`.
    pub fn used_end(&self) -> usize {
        self.used_end
    }

    /// The cells of sequence `seq` in position order.
    pub fn cells_of(&self, seq: usize) -> &[u32] {
        self.seqs.get(seq).map_or(&[], Vec::as_slice)
    }

    /// Takes a free cell for the next position of `seq` and returns it.
    pub fn push(&mut self, seq: usize) -> Result<u32, CellError> {
        if seq >= self.seqs.len() {
            return Err(CellError::NoSuchSequence(seq));
        }
        let Some(i) = (self.free_hint..self.cells.len()).find(|&i| self.cells[i].owners == 0)
        else {
            return Err(CellError::Full);
        };
        let pos = self.seqs[seq].len() as u32;
        self.cells[i] = Cell {
            pos,
            owners: 1 << seq,
        };
        self.seqs[seq].push(i as u32);
        self.n_used += 1;
        self.free_hint = i + 1;
        self.used_end = self.used_end.max(i + 1);
        Ok(i as u32)
    }

    /// Keeps the first `n` tokens of `seq` and frees the rest of its cells.
    pub fn truncate(&mut self, seq: usize, n: usize) {
        let Some(cells) = self.seqs.get_mut(seq) else {
            return;
        };
        for &c in cells.iter().skip(n) {
            let cell = &mut self.cells[c as usize];
            cell.owners &= !(1 << seq);
            if cell.owners == 0 {
                self.n_used -= 1;
                self.free_hint = self.free_hint.min(c as usize);
            }
        }
        cells.truncate(n);
        self.refresh_end();
    }

    /// Forgets every token of `seq`.
    pub fn clear(&mut self, seq: usize) {
        self.truncate(seq, 0);
    }

    /// Makes the first `n` tokens of `src` the first `n` of `dst` too (shared cells, no copy);
    /// whatever `dst` held is dropped first.
    pub fn copy_prefix(&mut self, src: usize, dst: usize, n: usize) -> Result<(), CellError> {
        let n_seq = self.seqs.len();
        for s in [src, dst] {
            if s >= n_seq {
                return Err(CellError::NoSuchSequence(s));
            }
        }
        if src == dst {
            return Ok(());
        }
        self.clear(dst);
        let shared: Vec<u32> = self.seqs[src].iter().take(n).copied().collect();
        for &c in &shared {
            self.cells[c as usize].owners |= 1 << dst;
        }
        self.seqs[dst] = shared;
        Ok(())
    }

    /// Whether a token of `seq` at position `pos` attends to cell `cell`.
    pub fn visible(&self, cell: usize, seq: usize, pos: usize) -> bool {
        let c = self.cells[cell];
        c.owners & (1 << seq) != 0 && c.pos as usize <= pos
    }

    /// [`KvCells::visible`], and with a `window` the cell also holds one of the `window`
    /// positions ending at `pos` (a sliding-window layer's rule: `pos − cell_pos < window`).
    pub fn visible_within(
        &self,
        cell: usize,
        seq: usize,
        pos: usize,
        window: Option<usize>,
    ) -> bool {
        self.visible(cell, seq, pos)
            && window.is_none_or(|w| pos - (self.cells[cell].pos as usize) < w)
    }

    fn refresh_end(&mut self) {
        while self.used_end > 0 && self.cells[self.used_end - 1].owners == 0 {
            self.used_end -= 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequences_take_cells_lowest_first_and_see_only_their_own() {
        let mut kv = KvCells::new(8, 2);
        assert_eq!(kv.push(0), Ok(0));
        assert_eq!(kv.push(1), Ok(1));
        assert_eq!(kv.push(0), Ok(2));
        assert_eq!(kv.cells_of(0), &[0, 2]);
        assert!(kv.visible(0, 0, 1) && kv.visible(2, 0, 1));
        assert!(!kv.visible(2, 0, 0), "a later position is not visible");
        assert!(
            !kv.visible(1, 0, 5),
            "another sequence's cell is not visible"
        );
        assert_eq!(kv.used_end(), 3);
        kv.clear(0);
        assert_eq!(kv.used_end(), 2);
        assert_eq!(kv.push(1), Ok(0), "freed cells are reused");
        assert_eq!(kv.push(5), Err(CellError::NoSuchSequence(5)));
    }

    #[test]
    fn shared_prefixes_stay_until_every_owner_lets_go() {
        let mut kv = KvCells::new(4, 3);
        for _ in 0..3 {
            kv.push(0).unwrap();
        }
        kv.copy_prefix(0, 2, 2).unwrap();
        assert_eq!(kv.len(2), 2);
        assert!(kv.visible(1, 2, 1) && !kv.visible(2, 2, 9));
        kv.clear(0);
        assert_eq!(kv.n_free(), 2, "cells 0 and 1 still belong to sequence 2");
        assert_eq!(kv.push(2), Ok(2));
        assert_eq!(kv.push(1), Ok(3));
        assert_eq!(kv.push(1), Err(CellError::Full));
        kv.truncate(2, 1);
        assert_eq!(kv.n_free(), 2);
        assert_eq!(kv.used_end(), 4);
    }
}
