//! The planner: a graph becomes an execution order plus one arena in which every intermediate
//! buffer has an offset, chosen so that buffers whose lifetimes do not overlap share bytes.
//!
//! Lifetimes are in steps (indices into the execution order). A buffer lives from the step that
//! writes it to the last step that reads it (through any view), or to the end for outputs.
//! Element-wise ops may write over their first operand when it dies at that step.

use std::fmt::Write as _;

use crate::graph::{Graph, Mem};
use crate::tensor::TensorId;

/// Offsets in the arena are multiples of this (a cache line, and any SIMD load).
pub const ARENA_ALIGN: usize = 64;

/// Which memory a tensor's bytes are in at run time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Region {
    Arena,
    /// The n-th weight leaf (in [`Plan::weights`] order).
    Weight(u32),
    /// The n-th persistent leaf (in [`Plan::persistents`] order).
    Persistent(u32),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Location {
    pub region: Region,
    pub offset: usize,
}

/// One buffer placed in the arena.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArenaBuffer {
    /// The tensor it holds, or the step's node for a work buffer.
    pub tensor: TensorId,
    pub is_work: bool,
    pub offset: usize,
    pub bytes: usize,
    /// First and last step (inclusive) during which the buffer is live.
    pub first: usize,
    pub last: usize,
}

/// One computing node, in execution order, with its scratch space.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Step {
    pub node: TensorId,
    /// Work buffer `(offset, bytes)` in the arena, for ops that need one (mul_mat's converted
    /// activations).
    pub work: Option<(usize, usize)>,
}

/// A compiled graph.
#[derive(Clone, Debug)]
pub struct Plan {
    /// Unique to one compilation (clones share it: a plan never changes once compiled), so a
    /// backend can keep what it derives from a plan across runs.
    id: u64,
    graph: Graph,
    steps: Vec<Step>,
    locations: Vec<Option<Location>>,
    weights: Vec<TensorId>,
    persistents: Vec<TensorId>,
    buffers: Vec<ArenaBuffer>,
    arena_bytes: usize,
}

/// Steps a small buffer's bytes wait, once it died, before another buffer may take them.
/// Neighbouring steps then write disjoint bytes, so a backend may run them without a
/// barrier between (the CPU executor's step groups): a decode token's steps each take
/// microseconds, and its buffers are a few KiB.
pub const REUSE_DELAY_STEPS: usize = 8;

/// Buffers up to this size wait [`REUSE_DELAY_STEPS`]; larger ones (prefill and training
/// activations, whose steps are long) are reused at once, so the peak stays what it was.
pub const REUSE_DELAY_MAX_BYTES: usize = 64 << 10;

/// First-fit allocator over a free list; the arena grows when nothing fits.
struct Allocator {
    free: Vec<(usize, usize)>,
    top: usize,
}

impl Allocator {
    fn alloc(&mut self, bytes: usize) -> usize {
        let bytes = bytes.next_multiple_of(ARENA_ALIGN).max(ARENA_ALIGN);
        let best = (0..self.free.len())
            .filter(|&i| self.free[i].1 >= bytes)
            .min_by_key(|&i| self.free[i].1);
        if let Some(i) = best {
            let (off, size) = self.free[i];
            if size == bytes {
                self.free.remove(i);
            } else {
                self.free[i] = (off + bytes, size - bytes);
            }
            return off;
        }
        // Extend the last free block if it ends at the top, else grow.
        if let Some(last) = self
            .free
            .last()
            .copied()
            .filter(|&(o, s)| o + s == self.top)
        {
            self.free.pop();
            self.top = last.0 + bytes;
            return last.0;
        }
        let off = self.top;
        self.top += bytes;
        off
    }

    fn free(&mut self, offset: usize, bytes: usize) {
        let bytes = bytes.next_multiple_of(ARENA_ALIGN).max(ARENA_ALIGN);
        let i = self.free.partition_point(|&(o, _)| o < offset);
        self.free.insert(i, (offset, bytes));
        // Merge with the neighbours.
        if i + 1 < self.free.len() && self.free[i].0 + self.free[i].1 == self.free[i + 1].0 {
            self.free[i].1 += self.free.remove(i + 1).1;
        }
        if i > 0 && self.free[i - 1].0 + self.free[i - 1].1 == self.free[i].0 {
            self.free[i - 1].1 += self.free.remove(i).1;
        }
    }
}

impl Plan {
    /// Orders, sizes and places everything the graph's outputs (and its writes into persistent
    /// memory) need; `work_bytes(graph, node)` is the scratch a backend's kernel for `node`
    /// needs besides its output (a backend's `compile` passes its own).
    pub fn compile_with(graph: Graph, work_bytes: &dyn Fn(&Graph, TensorId) -> usize) -> Plan {
        let n = graph.nodes().len();
        // 1. What is needed: outputs, and writes into persistent memory (their side effect is the point).
        let mut needed = vec![false; n];
        let mut stack: Vec<TensorId> = graph.outputs().to_vec();
        for (i, node) in graph.nodes().iter().enumerate() {
            let id = TensorId(i as u32);
            // Computed into another tensor's memory (cpy, set_rows, optimizer steps): when that
            // memory is persistent, the write is the point.
            let writes_persistent = node.op.computes()
                && matches!(node.mem, Mem::Alias { .. })
                && graph.node(graph.root(id).0).mem == Mem::Persistent;
            if writes_persistent {
                stack.push(id);
            }
        }
        while let Some(t) = stack.pop() {
            if std::mem::replace(&mut needed[t.index()], true) {
                continue;
            }
            let node = graph.node(t);
            stack.extend(node.src.iter().copied());
            if let Mem::Alias { base, .. } = node.mem {
                stack.push(base);
            }
        }

        // 2. Execution order: needed computing nodes in creation (= topological) order.
        let order: Vec<TensorId> = (0..n)
            .map(|i| TensorId(i as u32))
            .filter(|&t| needed[t.index()] && graph.node(t).op.computes())
            .collect();

        // 3. Lifetimes of arena roots: last step reading them.
        let end = order.len();
        let mut last_use = vec![0usize; n];
        for (step, &t) in order.iter().enumerate() {
            for &s in &graph.node(t).src {
                let r = graph.root(s).0;
                last_use[r.index()] = last_use[r.index()].max(step);
            }
            let r = graph.root(t).0;
            last_use[r.index()] = last_use[r.index()].max(step);
        }
        for &o in graph.outputs() {
            last_use[graph.root(o).0.index()] = end;
        }

        // 4. Leaves get slots, arena roots get offsets.
        let mut locations: Vec<Option<Location>> = vec![None; n];
        let (mut weights, mut persistents) = (Vec::new(), Vec::new());
        for (i, node) in graph.nodes().iter().enumerate() {
            let id = TensorId(i as u32);
            if !needed[i] {
                continue;
            }
            let region = match node.mem {
                Mem::Weight => {
                    weights.push(id);
                    Region::Weight(weights.len() as u32 - 1)
                }
                Mem::Persistent => {
                    persistents.push(id);
                    Region::Persistent(persistents.len() as u32 - 1)
                }
                _ => continue,
            };
            locations[i] = Some(Location { region, offset: 0 });
        }

        let mut alloc = Allocator {
            free: Vec::new(),
            top: 0,
        };
        let mut buffers: Vec<ArenaBuffer> = Vec::new();
        let mut buffer_of: Vec<Option<usize>> = vec![None; n];
        let mut steps = Vec::with_capacity(order.len());
        // Small dead buffers waiting for their delay: (first step that may reuse, offset, bytes).
        let mut waiting: Vec<(usize, usize, usize)> = Vec::new();
        for (step, &t) in order.iter().enumerate() {
            waiting.retain(|&(from, offset, bytes)| {
                let ready = from <= step;
                if ready {
                    alloc.free(offset, bytes);
                }
                !ready
            });
            let node = graph.node(t);
            if node.mem == Mem::Arena {
                let bytes = node.layout.contiguous_bytes();
                let reuse =
                    in_place_source(&graph, t, step, &last_use, &buffer_of, &buffers, bytes);
                let b = match reuse {
                    Some(b) => {
                        buffers[b].last = last_use[t.index()];
                        b
                    }
                    None => {
                        let offset = alloc.alloc(bytes);
                        buffers.push(ArenaBuffer {
                            tensor: t,
                            is_work: false,
                            offset,
                            bytes,
                            first: step,
                            last: last_use[t.index()].max(step),
                        });
                        buffers.len() - 1
                    }
                };
                buffer_of[t.index()] = Some(b);
            }
            let wb = work_bytes(&graph, t);
            let work = (wb > 0).then(|| {
                let offset = alloc.alloc(wb);
                buffers.push(ArenaBuffer {
                    tensor: t,
                    is_work: true,
                    offset,
                    bytes: wb,
                    first: step,
                    last: step,
                });
                (offset, wb)
            });
            steps.push(Step { node: t, work });
            // Free what dies at this step (after it ran).
            for (i, b) in buffers.iter().enumerate() {
                let dies_here =
                    b.last == step && (b.is_work || buffer_of[b.tensor.index()] == Some(i));
                if dies_here && b.bytes <= REUSE_DELAY_MAX_BYTES {
                    waiting.push((step + 1 + REUSE_DELAY_STEPS, b.offset, b.bytes));
                } else if dies_here {
                    alloc.free(b.offset, b.bytes);
                }
            }
        }
        for (i, b) in buffer_of.iter().enumerate() {
            if let Some(b) = b {
                locations[i] = Some(Location {
                    region: Region::Arena,
                    offset: buffers[*b].offset,
                });
            }
        }
        // Aliases: their root's location plus the offset.
        for i in 0..n {
            if needed[i] {
                if let Mem::Alias { .. } = graph.nodes()[i].mem {
                    let (root, off) = graph.root(TensorId(i as u32));
                    locations[i] = locations[root.index()].map(|l| Location {
                        region: l.region,
                        offset: l.offset + off,
                    });
                }
            }
        }
        static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let plan = Plan {
            id: NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            graph,
            steps,
            locations,
            weights,
            persistents,
            buffers,
            arena_bytes: alloc.top,
        };
        debug_assert_eq!(plan.verify(), Ok(()));
        plan
    }

    /// Identifies this compilation: equal ids mean equal plans.
    pub fn id(&self) -> u64 {
        self.id
    }

    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    pub fn steps(&self) -> &[Step] {
        &self.steps
    }

    pub fn location(&self, t: TensorId) -> Option<Location> {
        self.locations.get(t.index()).copied().flatten()
    }

    /// Weight leaves, in slot order.
    pub fn weights(&self) -> &[TensorId] {
        &self.weights
    }

    /// Persistent leaves, in slot order.
    pub fn persistents(&self) -> &[TensorId] {
        &self.persistents
    }

    /// For each of `roots` (tensors that own their memory, e.g. persistent leaves): the index
    /// of the last step that writes into its memory (its own node, or a node computed into
    /// it or into a view of it), `None` when no step does. After that step's end the tensor's
    /// bytes are final for the run: later steps can only read them.
    pub fn last_writes(&self, roots: &[TensorId]) -> Vec<Option<usize>> {
        let mut slot = std::collections::HashMap::with_capacity(roots.len());
        for (i, &r) in roots.iter().enumerate() {
            slot.insert(r, i);
        }
        let mut last = vec![None; roots.len()];
        for (step, s) in self.steps.iter().enumerate() {
            if let Some(&i) = slot.get(&self.graph.root(s.node).0) {
                last[i] = Some(step);
            }
        }
        last
    }

    pub fn buffers(&self) -> &[ArenaBuffer] {
        &self.buffers
    }

    /// Bytes of the one arena allocation this plan needs.
    pub fn arena_bytes(&self) -> usize {
        self.arena_bytes
    }

    /// What the arena would take if no buffers shared bytes.
    pub fn sum_of_buffers(&self) -> usize {
        self.buffers
            .iter()
            .map(|b| b.bytes.next_multiple_of(ARENA_ALIGN))
            .sum()
    }

    /// Checks the placement: every buffer inside the arena and aligned, and no two buffers live
    /// at the same step sharing a byte.
    pub fn verify(&self) -> Result<(), String> {
        for b in &self.buffers {
            if b.offset % ARENA_ALIGN != 0 || b.offset + b.bytes > self.arena_bytes {
                return Err(format!(
                    "buffer of '{}' at {}+{} is misplaced",
                    self.name(b.tensor),
                    b.offset,
                    b.bytes
                ));
            }
        }
        for (i, a) in self.buffers.iter().enumerate() {
            for b in &self.buffers[i + 1..] {
                let live_together = a.first <= b.last && b.first <= a.last;
                let share_bytes = a.offset < b.offset + b.bytes && b.offset < a.offset + a.bytes;
                if live_together && share_bytes {
                    return Err(format!(
                        "'{}' [{}..{}] and '{}' [{}..{}] overlap in the arena",
                        self.name(a.tensor),
                        a.first,
                        a.last,
                        self.name(b.tensor),
                        b.first,
                        b.last
                    ));
                }
            }
        }
        if self.arena_bytes > self.sum_of_buffers() {
            return Err("the arena is larger than all buffers together".into());
        }
        Ok(())
    }

    fn name(&self, t: TensorId) -> &str {
        &self.graph.node(t).name
    }

    /// The step at which the most arena bytes are live, and those bytes grouped by the op
    /// that made each buffer (work buffers as `<op> work`), largest group first: what to
    /// shrink to lower the arena.
    pub fn peak_report(&self) -> String {
        let mut live = vec![0usize; self.steps.len() + 1];
        for b in &self.buffers {
            for l in &mut live[b.first..=b.last.min(self.steps.len())] {
                *l += b.bytes;
            }
        }
        let Some((peak, &bytes)) = live.iter().enumerate().max_by_key(|(_, &b)| b) else {
            return String::from("no steps\n");
        };
        let mut groups: Vec<(String, usize, usize)> = Vec::new();
        for b in self
            .buffers
            .iter()
            .filter(|b| b.first <= peak && peak <= b.last)
        {
            let op = self.graph.node(b.tensor).op.name();
            let key = if b.is_work {
                format!("{op} work")
            } else {
                op.to_string()
            };
            match groups.iter_mut().find(|g| g.0 == key) {
                Some(g) => {
                    g.1 += 1;
                    g.2 += b.bytes;
                }
                None => groups.push((key, 1, b.bytes)),
            }
        }
        groups.sort_by_key(|g| std::cmp::Reverse(g.2));
        let mut s = String::new();
        let at = self.steps.get(peak).map_or("end", |st| self.name(st.node));
        let _ = writeln!(s, "peak: {bytes} live bytes at step {peak} ({at})");
        for (op, n, b) in groups {
            let _ = writeln!(s, "{b:>12}  {n:>5} x {op}");
        }
        s
    }

    /// The arena layout, one buffer per line, for people (`tnn plan`).
    pub fn layout_report(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "{:>5}  {:<32} {:<10} {:>12} {:>12}  life",
            "step", "buffer", "op", "offset", "bytes"
        );
        for b in &self.buffers {
            let node = self.graph.node(b.tensor);
            let name = if b.is_work {
                format!("{} (work)", node.name)
            } else {
                node.name.clone()
            };
            let life = if b.last >= self.steps.len() {
                format!("{}..end", b.first)
            } else {
                format!("{}..{}", b.first, b.last)
            };
            let _ = writeln!(
                s,
                "{:>5}  {:<32} {:<10} {:>12} {:>12}  {life}",
                b.first,
                name,
                node.op.name(),
                b.offset,
                b.bytes
            );
        }
        let _ = writeln!(
            s,
            "arena: {} bytes for {} buffers totalling {} bytes ({:.1}x reuse); {} steps",
            self.arena_bytes,
            self.buffers.len(),
            self.sum_of_buffers(),
            self.sum_of_buffers() as f64 / self.arena_bytes.max(1) as f64,
            self.steps.len()
        );
        s
    }
}

/// The buffer of `t`'s first operand, if `t` may overwrite it in place: an element-wise op whose
/// first operand is a whole arena buffer of the same size that dies at this step, is not an
/// output, and is not read through any other operand.
fn in_place_source(
    graph: &Graph,
    t: TensorId,
    step: usize,
    last_use: &[usize],
    buffer_of: &[Option<usize>],
    buffers: &[ArenaBuffer],
    bytes: usize,
) -> Option<usize> {
    let node = graph.node(t);
    if !node.op.can_run_in_place() {
        return None;
    }
    let s0 = *node.src.first()?;
    let src = graph.node(s0);
    let ok = src.mem == Mem::Arena
        && src.layout.is_contiguous()
        && src.layout.dtype == node.layout.dtype
        && last_use[s0.index()] == step
        && !graph.outputs().contains(&s0)
        && node.src[1..].iter().all(|&o| graph.root(o).0 != s0);
    let b = buffer_of[s0.index()]?;
    (ok && buffers[b].bytes == bytes).then_some(b)
}
