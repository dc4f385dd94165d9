//! Choosing the next token: greedy, or a chain of filters then a seeded random draw, in
//! llama.cpp's default order: repetition / presence / frequency penalties over the last N
//! tokens → top-k → top-p → min-p → temperature → draw.

#![warn(missing_docs)]

use std::collections::VecDeque;

/// How to pick tokens.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Strategy {
    /// Always the most likely token (after penalties).
    Greedy,
    /// Sample from the filtered, temperature-scaled distribution.
    Sample {
        /// Divides the logits (lower: more deterministic).
        temperature: f32,
        /// Keep the k most likely tokens (0 keeps all).
        top_k: usize,
        /// Keep the smallest set whose probability reaches p (1 keeps all).
        top_p: f32,
        /// Drop tokens less likely than `min_p` times the most likely one (0 keeps all).
        min_p: f32,
        /// Seed of the random draw.
        seed: u64,
    },
}

/// Penalties on tokens seen in the last `last_n` tokens.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Penalties {
    /// Divides positive logits and multiplies negative ones (1 is off).
    pub repeat: f32,
    /// Subtracted once from any seen token's logit (0 is off).
    pub presence: f32,
    /// Subtracted per occurrence (0 is off).
    pub frequency: f32,
    /// How many recent tokens the penalties look at.
    pub last_n: usize,
}

impl Default for Penalties {
    fn default() -> Self {
        Penalties {
            repeat: 1.0,
            presence: 0.0,
            frequency: 0.0,
            last_n: 64,
        }
    }
}

/// The project's one generator: a seed gives the same text everywhere.
pub use tinynn_core::rng::Rng;

/// Penalties, filters and a seeded draw over logits (see the module docs).
pub struct Sampler {
    strategy: Strategy,
    penalties: Penalties,
    rng: Rng,
    history: VecDeque<u32>,
    /// Scratch: (token, logit) candidates and their probabilities, reused between calls.
    cand: Vec<(u32, f32)>,
    probs: Vec<f64>,
}

impl Sampler {
    /// A sampler for `strategy` with `penalties`.
    pub fn new(strategy: Strategy, penalties: Penalties) -> Sampler {
        let seed = match strategy {
            Strategy::Sample { seed, .. } => seed,
            Strategy::Greedy => 0,
        };
        Sampler {
            strategy,
            penalties,
            rng: Rng::new(seed),
            history: VecDeque::with_capacity(penalties.last_n + 1),
            cand: Vec::new(),
            probs: Vec::new(),
        }
    }

    /// Records a token (prompt or generated) for the penalties.
    pub fn accept(&mut self, token: u32) {
        if self.penalties.last_n == 0 {
            return;
        }
        if self.history.len() == self.penalties.last_n {
            self.history.pop_front();
        }
        self.history.push_back(token);
    }

    fn apply_penalties(&mut self) {
        let p = self.penalties;
        if self.history.is_empty() || (p.repeat == 1.0 && p.presence == 0.0 && p.frequency == 0.0) {
            return;
        }
        for (tok, logit) in self.cand.iter_mut() {
            let count = self.history.iter().filter(|&&h| h == *tok).count();
            if count == 0 {
                continue;
            }
            *logit = if *logit > 0.0 {
                *logit / p.repeat
            } else {
                *logit * p.repeat
            };
            *logit -= count as f32 * p.frequency + p.presence;
        }
    }

    /// The next token for `logits`.
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        self.cand.clear();
        self.cand
            .extend(logits.iter().enumerate().map(|(i, &l)| (i as u32, l)));
        self.apply_penalties();
        let by_logit = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
        let Strategy::Sample {
            temperature,
            top_k,
            top_p,
            min_p,
            ..
        } = self.strategy
        else {
            return self
                .cand
                .iter()
                .copied()
                .min_by(by_logit)
                .map_or(0, |c| c.0);
        };
        if temperature <= 0.0 {
            return self
                .cand
                .iter()
                .copied()
                .min_by(by_logit)
                .map_or(0, |c| c.0);
        }
        // top-k (select, then sort what is left).
        let k = if top_k == 0 {
            self.cand.len()
        } else {
            top_k.min(self.cand.len())
        };
        if k < self.cand.len() {
            self.cand.select_nth_unstable_by(k - 1, by_logit);
            self.cand.truncate(k);
        }
        self.cand.sort_unstable_by(by_logit);
        // top-p on the untempered distribution.
        if top_p < 1.0 {
            softmax(&self.cand, &mut self.probs);
            let mut cum = 0.0;
            let mut keep = self.cand.len();
            for (i, p) in self.probs.iter().enumerate() {
                cum += p;
                if cum >= f64::from(top_p) {
                    keep = i + 1;
                    break;
                }
            }
            self.cand.truncate(keep.max(1));
        }
        // min-p relative to the most likely token.
        if min_p > 0.0 {
            let threshold = self.cand[0].1 + min_p.ln();
            let keep = self.cand.iter().take_while(|c| c.1 >= threshold).count();
            self.cand.truncate(keep.max(1));
        }
        for c in self.cand.iter_mut() {
            c.1 /= temperature;
        }
        softmax(&self.cand, &mut self.probs);
        let mut r = self.rng.uniform();
        for (c, p) in self.cand.iter().zip(&self.probs) {
            if r < *p {
                return c.0;
            }
            r -= p;
        }
        self.cand.last().map_or(0, |c| c.0)
    }
}

/// Probabilities of the candidates' logits, into `out` (reused, so sampling allocates nothing).
fn softmax(c: &[(u32, f32)], out: &mut Vec<f64>) {
    let max = c.iter().map(|x| x.1).fold(f32::NEG_INFINITY, f32::max);
    out.clear();
    out.extend(c.iter().map(|x| f64::from(x.1 - max).exp()));
    let sum: f64 = out.iter().sum();
    out.iter_mut().for_each(|v| *v /= sum);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample_many(strategy: Strategy, logits: &[f32], n: usize) -> Vec<u32> {
        let mut s = Sampler::new(strategy, Penalties::default());
        (0..n).map(|_| s.sample(logits)).collect()
    }

    #[test]
    fn greedy_and_zero_temperature_pick_the_max() {
        let logits = [0.1, 2.0, -1.0, 2.0];
        assert_eq!(sample_many(Strategy::Greedy, &logits, 1), [1]);
        let cold = Strategy::Sample {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed: 1,
        };
        assert_eq!(sample_many(cold, &logits, 1), [1]);
    }

    #[test]
    fn same_seed_same_draws_and_filters_hold() {
        let logits: Vec<f32> = (0..50).map(|i| (i as f32 * 0.37).sin() * 3.0).collect();
        let s = |seed| Strategy::Sample {
            temperature: 1.0,
            top_k: 5,
            top_p: 0.9,
            min_p: 0.05,
            seed,
        };
        let (a, b, c) = (
            sample_many(s(7), &logits, 200),
            sample_many(s(7), &logits, 200),
            sample_many(s(8), &logits, 200),
        );
        assert_eq!(a, b);
        assert_ne!(a, c);
        // Only the top 5 can ever come out.
        let mut order: Vec<usize> = (0..50).collect();
        order.sort_by(|&x, &y| logits[y].total_cmp(&logits[x]));
        assert!(a.iter().all(|t| order[..5].contains(&(*t as usize))));
        // More than one of them does.
        assert!(a.iter().any(|&t| t != a[0]));
    }

    #[test]
    fn penalties_push_repeats_down() {
        let logits = [3.0, 2.9, 0.0];
        let p = Penalties {
            repeat: 1.5,
            presence: 0.0,
            frequency: 0.0,
            last_n: 4,
        };
        let mut s = Sampler::new(Strategy::Greedy, p);
        s.accept(0);
        assert_eq!(s.sample(&logits), 1);
        let p = Penalties {
            repeat: 1.0,
            presence: 0.5,
            frequency: 0.0,
            last_n: 4,
        };
        let mut s = Sampler::new(Strategy::Greedy, p);
        s.accept(0);
        assert_eq!(s.sample(&logits), 1);
    }
}
