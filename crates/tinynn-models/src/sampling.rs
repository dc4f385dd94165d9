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
    /// Scratch: the history's tokens, sorted (to count each token's occurrences).
    seen: Vec<u32>,
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
            seen: Vec::new(),
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

    /// Whether a penalty changes any logit now.
    fn penalties_apply(&self) -> bool {
        let p = self.penalties;
        !self.history.is_empty() && (p.repeat != 1.0 || p.presence != 0.0 || p.frequency != 0.0)
    }

    /// Penalizes each distinct token of the history once, by its number of occurrences, in
    /// the candidates while they are still in token order (`cand[t]` is token t): the work is
    /// the history's length, not the vocabulary's times it.
    fn apply_penalties(&mut self) {
        if !self.penalties_apply() {
            return;
        }
        let p = self.penalties;
        self.seen.clear();
        self.seen.extend(self.history.iter().copied());
        self.seen.sort_unstable();
        for run in self.seen.chunk_by(|a, b| a == b) {
            let Some((_, logit)) = self.cand.get_mut(run[0] as usize) else {
                continue;
            };
            *logit = if *logit > 0.0 {
                *logit / p.repeat
            } else {
                *logit * p.repeat
            };
            *logit -= run.len() as f32 * p.frequency + p.presence;
        }
    }

    /// The next token for `logits`.
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        let greedy = match self.strategy {
            Strategy::Greedy => true,
            Strategy::Sample { temperature, .. } => temperature <= 0.0,
        };
        if greedy && !self.penalties_apply() {
            return argmax(logits);
        }
        self.cand.clear();
        self.cand
            .extend(logits.iter().enumerate().map(|(i, &l)| (i as u32, l)));
        self.apply_penalties();
        let by_logit = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
        let (temperature, top_k, top_p, min_p) = match self.strategy {
            Strategy::Sample {
                temperature,
                top_k,
                top_p,
                min_p,
                ..
            } if !greedy => (temperature, top_k, top_p, min_p),
            // Greedy after penalties (without them it returned above).
            _ => {
                return self
                    .cand
                    .iter()
                    .copied()
                    .min_by(by_logit)
                    .map_or(0, |c| c.0)
            }
        };
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

/// The index of the largest value in `f32::total_cmp`'s order, the first of equals: the pick
/// of the candidates' greedy order below, without building the candidates (a vocabulary of
/// (token, logit) pairs written and read again each token). One pass for the largest key,
/// which vectorizes, and one to find where it is.
fn argmax(v: &[f32]) -> u32 {
    // `total_cmp`'s key: the bits as i32, with a negative value's magnitude bits flipped.
    let key = |x: f32| {
        let b = x.to_bits() as i32;
        b ^ (((b >> 31) as u32) >> 1) as i32
    };
    let best = v.iter().fold(i32::MIN, |m, &x| m.max(key(x)));
    v.iter()
        .position(|&x| key(x) == best)
        .map_or(0, |i| i as u32)
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

    /// The greedy pick through the candidates, as `sample` made it for every input before the
    /// direct `argmax`.
    fn greedy_by_candidates(logits: &[f32]) -> u32 {
        let by_logit = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
        (0u32..)
            .zip(logits.iter().copied())
            .min_by(by_logit)
            .map_or(0, |c| c.0)
    }

    #[test]
    fn argmax_is_the_candidates_greedy_pick() {
        let mut rng = Rng::new(11);
        let specials = [
            0.0,
            -0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            -f32::NAN,
            f32::MIN_POSITIVE,
            -1e-45,
        ];
        assert_eq!(argmax(&[]), greedy_by_candidates(&[]));
        for case in 0..3000 {
            let n = 1 + rng.below(300) as usize;
            // Few distinct values, so ties are common; some cases with special values.
            let mut v: Vec<f32> = (0..n).map(|_| rng.below(7) as f32 - 3.0).collect();
            if case % 3 == 0 {
                for _ in 0..1 + rng.below(4) {
                    let at = rng.below(n as u64) as usize;
                    v[at] = specials[rng.below(specials.len() as u64) as usize];
                }
            }
            if case % 5 == 0 {
                v.iter_mut().for_each(|x| *x = -*x * 1e-3);
            }
            assert_eq!(argmax(&v), greedy_by_candidates(&v), "{v:?}");
        }
    }

    #[test]
    fn penalties_equal_the_scan_of_every_candidate() {
        let mut rng = Rng::new(5);
        for case in 0..300 {
            let vocab = 1 + rng.below(200) as usize;
            let p = Penalties {
                repeat: [1.0, 1.1, 1.5][case % 3],
                presence: [0.0, 0.3][case % 2],
                frequency: [0.0, 0.25, 0.1][(case / 2) % 3],
                last_n: 1 + rng.below(40) as usize,
            };
            let logits: Vec<f32> = (0..vocab).map(|_| rng.range_f32(-4.0, 4.0)).collect();
            let mut s = Sampler::new(Strategy::Greedy, p);
            for _ in 0..rng.below(60) {
                // Some tokens beyond the vocabulary, which no candidate is.
                s.accept(rng.below(vocab as u64 + 3) as u32);
            }
            // Every candidate against every history entry, as the penalties were applied.
            let mut want: Vec<(u32, f32)> = (0u32..).zip(logits.iter().copied()).collect();
            if !s.history.is_empty() && (p.repeat != 1.0 || p.presence != 0.0 || p.frequency != 0.0)
            {
                for (tok, logit) in want.iter_mut() {
                    let count = s.history.iter().filter(|&&h| h == *tok).count();
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
            s.cand.clear();
            s.cand.extend((0u32..).zip(logits.iter().copied()));
            s.apply_penalties();
            let bits =
                |c: &[(u32, f32)]| c.iter().map(|x| (x.0, x.1.to_bits())).collect::<Vec<_>>();
            assert_eq!(bits(&s.cand), bits(&want), "case {case}");
            let pick = greedy_by_candidates(&want.iter().map(|x| x.1).collect::<Vec<_>>());
            assert_eq!(s.sample(&logits), pick, "case {case}");
        }
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
