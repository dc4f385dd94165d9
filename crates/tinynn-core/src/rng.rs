//! The one random number generator of tinynn: SplitMix64 (from `rand_xoshiro`), seeded from a
//! `u64`, whose whole state is one `u64` — so a checkpoint stores it as a number and a resumed
//! run continues the same sequence. The distributions come from `rand` and `rand_distr`.
//! Everything random in the project draws from it: data shuffling, LoRA dropout, the initial
//! weights of a model trained from scratch, token sampling, and the tests' random inputs. (The
//! dropout *masks* of the training graph are a stateless hash of the element index, `ops.rs`,
//! so any thread computes any element's mask; they are not a generator.)

use rand::seq::SliceRandom;
use rand::{RngExt, SeedableRng};
use rand_distr::{Distribution, StandardNormal};
use rand_xoshiro::SplitMix64;

/// A seeded generator. The same seed (or state) gives the same draws on every machine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rng(SplitMix64);

impl Rng {
    /// A generator from `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(SplitMix64::seed_from_u64(seed))
    }

    /// The generator whose state [`Rng::state`] returned (SplitMix64's state is its seed).
    pub fn from_state(state: u64) -> Rng {
        Rng::new(state)
    }

    /// The whole state, for a checkpoint.
    pub fn state(&self) -> u64 {
        // rand_xoshiro exposes SplitMix64's one word only through serde; the round trip is
        // checked by the tests below.
        match serde_json::to_value(&self.0) {
            Ok(serde_json::Value::Object(m)) => m.get("x").and_then(|v| v.as_u64()),
            _ => None,
        }
        .expect("SplitMix64 serializes as its one-word state")
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        rand::Rng::next_u64(&mut self.0)
    }

    /// Uniform in `0..n`, without bias; `n` must be > 0.
    pub fn below(&mut self, n: u64) -> u64 {
        self.0.random_range(0..n)
    }

    /// Uniform in `[0, 1)`.
    pub fn uniform(&mut self) -> f64 {
        self.0.random()
    }

    /// Uniform in `[0, 1)`.
    pub fn next_f32(&mut self) -> f32 {
        self.0.random()
    }

    /// Uniform in `[lo, hi)`.
    pub fn range_f32(&mut self, lo: f32, hi: f32) -> f32 {
        self.0.random_range(lo..hi)
    }

    /// A standard normal draw.
    pub fn normal(&mut self) -> f32 {
        StandardNormal.sample(&mut self.0)
    }

    /// Shuffles `items` uniformly (Fisher–Yates).
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        items.shuffle(&mut self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeded_restorable_and_distributed_as_claimed() {
        // SplitMix64's published first output for seed 0.
        assert_eq!(Rng::new(0).next_u64(), 0xE220_A839_7B1D_CDAF);
        // The state taken mid-sequence continues the same sequence.
        let mut a = Rng::new(42);
        assert_eq!(a.state(), 42);
        for _ in 0..10 {
            a.next_u64();
            a.normal();
            a.below(7);
        }
        let mut b = Rng::from_state(a.state());
        let draws = |r: &mut Rng| (r.next_u64(), r.below(1000), r.uniform(), r.normal());
        for _ in 0..5 {
            assert_eq!(draws(&mut a), draws(&mut b));
        }
        let mut counts = [0u32; 6];
        let mut r = Rng::new(7);
        for _ in 0..60_000 {
            counts[r.below(6) as usize] += 1;
        }
        assert!(
            counts.iter().all(|&c| (9_000..11_000).contains(&c)),
            "{counts:?}"
        );
        let n = 40_000;
        let xs: Vec<f64> = (0..n).map(|_| f64::from(r.normal())).collect();
        let mean = xs.iter().sum::<f64>() / n as f64;
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n as f64;
        assert!(
            mean.abs() < 0.02 && (var - 1.0).abs() < 0.03,
            "{mean} {var}"
        );
        for _ in 0..1000 {
            let (f, u, s) = (r.next_f32(), r.uniform(), r.range_f32(-1.0, 1.0));
            assert!((0.0..1.0).contains(&f) && (0.0..1.0).contains(&u) && (-1.0..1.0).contains(&s));
        }
        let mut v: Vec<u32> = (0..100).collect();
        r.shuffle(&mut v);
        assert_ne!(v, (0..100).collect::<Vec<_>>());
        v.sort_unstable();
        assert_eq!(v, (0..100).collect::<Vec<_>>());
    }
}
