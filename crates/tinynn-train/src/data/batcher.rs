//! Batches of `batch × seq` inputs and labels from a [`Sequences`] source: a deterministic
//! held-out eval split, per-epoch shuffling of the training sequences with a seeded [`Rng`], and
//! a [`DataPosition`] that restores exactly where a run was.

use serde::{Deserialize, Serialize};

use super::source::{Sequences, SourceStats, IGNORE, PAD_INPUT};
use super::DataError;
use crate::rng::Rng;

/// Which sequences are held out for evaluation.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum EvalSplit {
    None,
    /// The last `ceil(fraction × n)` sequences (0 < fraction < 1).
    Last {
        fraction: f64,
    },
    /// Every n-th sequence (indices n−1, 2n−1, ...; n ≥ 2).
    EveryNth {
        n: usize,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct BatchConfig {
    pub batch: usize,
    /// Shuffle the training sequences at the start of every epoch.
    pub shuffle: bool,
    pub seed: u64,
    pub eval: EvalSplit,
}

/// Where the next training batch starts: `index` into epoch `epoch`'s order, and the shuffle
/// RNG's state at the start of that epoch (the order is recomputed from it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DataPosition {
    pub epoch: u64,
    pub index: u64,
    pub rng: u64,
}

/// One batch, rows of `seq` positions, row-major.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Batch {
    pub inputs: Vec<i32>,
    pub labels: Vec<i32>,
    /// Rows holding data; the rest (only in the last eval batch) are padding with labels −1.
    pub rows: usize,
    /// Labels that carry loss.
    pub tokens: usize,
}

pub struct Batcher {
    source: Box<dyn Sequences>,
    cfg: BatchConfig,
    n_train: usize,
    n_eval: usize,
    /// The current epoch's order of training sequence numbers.
    order: Vec<usize>,
    /// The RNG state after this epoch's shuffle.
    next_rng: u64,
    pos: DataPosition,
}

impl Batcher {
    pub fn new(source: Box<dyn Sequences>, cfg: BatchConfig) -> Result<Batcher, DataError> {
        if cfg.batch == 0 {
            return Err(DataError::Config("batch size must be at least 1".into()));
        }
        let n = source.len();
        let n_eval = match cfg.eval {
            EvalSplit::None => 0,
            EvalSplit::Last { fraction } => {
                if !(fraction > 0.0 && fraction < 1.0) {
                    return Err(DataError::Config(format!(
                        "eval fraction {fraction} must be between 0 and 1"
                    )));
                }
                ((n as f64 * fraction).ceil() as usize).min(n)
            }
            EvalSplit::EveryNth { n: every } => {
                if every < 2 {
                    return Err(DataError::Config(format!(
                        "eval every n-th sequence needs n >= 2, got {every}"
                    )));
                }
                n / every
            }
        };
        if n_eval >= n {
            return Err(DataError::Config(format!(
                "{n} sequences: the eval split leaves none for training"
            )));
        }
        let mut b = Batcher {
            source,
            cfg,
            n_train: n - n_eval,
            n_eval,
            order: Vec::new(),
            next_rng: 0,
            pos: DataPosition {
                epoch: 0,
                index: 0,
                rng: Rng::new(cfg.seed).state(),
            },
        };
        b.make_order();
        Ok(b)
    }

    /// Recomputes the current epoch's order from `pos.rng`; remembers the RNG state after the
    /// shuffle, which starts the next epoch.
    fn make_order(&mut self) {
        let mut rng = Rng::from_state(self.pos.rng);
        self.order.clear();
        self.order.extend(0..self.n_train);
        if self.cfg.shuffle {
            rng.shuffle(&mut self.order);
        }
        self.next_rng = rng.state();
    }

    fn next_epoch(&mut self) {
        self.pos = DataPosition {
            epoch: self.pos.epoch + 1,
            index: 0,
            rng: self.next_rng,
        };
        self.make_order();
    }

    /// Source sequence number of training sequence `j`.
    fn train_id(&self, j: usize) -> usize {
        match self.cfg.eval {
            EvalSplit::EveryNth { n } => j + j / (n - 1),
            _ => j,
        }
    }

    /// Source sequence number of eval sequence `k`.
    fn eval_id(&self, k: usize) -> usize {
        match self.cfg.eval {
            EvalSplit::EveryNth { n } => k * n + n - 1,
            _ => self.n_train + k,
        }
    }

    pub fn seq(&self) -> usize {
        self.source.seq_len()
    }

    pub fn batch_size(&self) -> usize {
        self.cfg.batch
    }

    pub fn n_train(&self) -> usize {
        self.n_train
    }

    pub fn n_eval(&self) -> usize {
        self.n_eval
    }

    pub fn stats(&self) -> SourceStats {
        self.source.stats()
    }

    pub fn position(&self) -> DataPosition {
        self.pos
    }

    /// Continues from a saved position: the following batches are those the saving run saw.
    pub fn set_position(&mut self, pos: DataPosition) -> Result<(), DataError> {
        if pos.index > self.n_train as u64 {
            return Err(DataError::Config(format!(
                "data position {} is past the {} training sequences",
                pos.index, self.n_train
            )));
        }
        self.pos = pos;
        self.make_order();
        Ok(())
    }

    /// Writes the next training batch into `inputs` and `labels` (`batch × seq` each), moving
    /// into the next epoch when this one runs out. On error the position is unchanged.
    pub fn next_into(
        &mut self,
        inputs: &mut [i32],
        labels: &mut [i32],
    ) -> Result<usize, DataError> {
        let seq = self.seq();
        let want = self.cfg.batch * seq;
        if inputs.len() != want || labels.len() != want {
            return Err(DataError::Config(format!(
                "batch buffers hold {} and {} ids, {want} are needed",
                inputs.len(),
                labels.len()
            )));
        }
        let saved = self.pos;
        for row in 0..self.cfg.batch {
            if self.pos.index as usize == self.n_train {
                self.next_epoch();
            }
            let id = self.train_id(self.order[self.pos.index as usize]);
            let r = row * seq..(row + 1) * seq;
            if let Err(e) = self.source.read(id, &mut inputs[r.clone()], &mut labels[r]) {
                let crossed = self.pos.epoch != saved.epoch;
                self.pos = saved;
                if crossed {
                    self.make_order();
                }
                return Err(e);
            }
            self.pos.index += 1;
        }
        Ok(labels.iter().filter(|&&l| l != IGNORE).count())
    }

    /// The next training batch.
    pub fn next_batch(&mut self) -> Result<Batch, DataError> {
        let n = self.cfg.batch * self.seq();
        let (mut inputs, mut labels) = (vec![0; n], vec![0; n]);
        let tokens = self.next_into(&mut inputs, &mut labels)?;
        Ok(Batch {
            inputs,
            labels,
            rows: self.cfg.batch,
            tokens,
        })
    }

    /// The eval sequences in order, `batch` rows at a time; the last batch's missing rows are
    /// padding (labels −1).
    pub fn eval_batches(&self) -> impl Iterator<Item = Result<Batch, DataError>> + '_ {
        let (b, seq) = (self.cfg.batch, self.seq());
        (0..self.n_eval.div_ceil(b)).map(move |i| {
            let rows = (self.n_eval - i * b).min(b);
            let mut inputs = vec![PAD_INPUT; b * seq];
            let mut labels = vec![IGNORE; b * seq];
            for row in 0..rows {
                let r = row * seq..(row + 1) * seq;
                self.source.read(
                    self.eval_id(i * b + row),
                    &mut inputs[r.clone()],
                    &mut labels[r],
                )?;
            }
            let tokens = labels.iter().filter(|&&l| l != IGNORE).count();
            Ok(Batch {
                inputs,
                labels,
                rows,
                tokens,
            })
        })
    }
}
