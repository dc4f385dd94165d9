//! The project's one random number generator ([`tinynn_core::rng::Rng`], SplitMix64 with a
//! one-word state that checkpoints keep), re-exported where the trainer has always found it.

pub use tinynn_core::rng::Rng;
