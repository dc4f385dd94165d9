//! Learning-rate schedules. A schedule is a pure function of the step and its configuration, so
//! its "state" in a checkpoint is the configuration itself (serialized as JSON).
//!
//! Steps count optimizer updates from 0. During warmup (`step < warmup_steps`) the rate rises
//! linearly to `lr`, reaching it at step `warmup_steps - 1` (never 0 at the first step); then it
//! decays over the remaining steps to `min_lr`, which it keeps from `total_steps` on.

use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Schedule {
    /// `lr` at every step.
    Constant { lr: f32 },
    /// Linear warmup, then half a cosine from `lr` down to `min_lr` at `total_steps`.
    WarmupCosine {
        lr: f32,
        min_lr: f32,
        warmup_steps: u64,
        total_steps: u64,
    },
    /// Linear warmup, then a straight line from `lr` down to `min_lr` at `total_steps`.
    WarmupLinear {
        lr: f32,
        min_lr: f32,
        warmup_steps: u64,
        total_steps: u64,
    },
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("learning-rate schedule: {0}")]
pub struct ScheduleError(pub String);

impl Schedule {
    /// Checks the rates are finite and non-negative, `min_lr <= lr` and
    /// `warmup_steps <= total_steps`.
    pub fn validate(&self) -> Result<(), ScheduleError> {
        let (lr, min_lr, warmup, total) = match *self {
            Schedule::Constant { lr } => (lr, 0.0, 0, 0),
            Schedule::WarmupCosine {
                lr,
                min_lr,
                warmup_steps,
                total_steps,
            }
            | Schedule::WarmupLinear {
                lr,
                min_lr,
                warmup_steps,
                total_steps,
            } => (lr, min_lr, warmup_steps, total_steps),
        };
        let bad = |m: String| Err(ScheduleError(m));
        if !(lr.is_finite() && lr >= 0.0) {
            return bad(format!("lr {lr} must be finite and >= 0"));
        }
        if !(min_lr.is_finite() && min_lr >= 0.0 && min_lr <= lr) {
            return bad(format!(
                "min_lr {min_lr} must be finite, >= 0 and <= lr {lr}"
            ));
        }
        if warmup > total {
            return bad(format!(
                "warmup_steps {warmup} is more than total_steps {total}"
            ));
        }
        Ok(())
    }

    /// The learning rate of the update number `step` (0-based).
    pub fn lr(&self, step: u64) -> f32 {
        let (lr, min_lr, warmup, total, cosine) = match *self {
            Schedule::Constant { lr } => return lr,
            Schedule::WarmupCosine {
                lr,
                min_lr,
                warmup_steps,
                total_steps,
            } => (lr, min_lr, warmup_steps, total_steps, true),
            Schedule::WarmupLinear {
                lr,
                min_lr,
                warmup_steps,
                total_steps,
            } => (lr, min_lr, warmup_steps, total_steps, false),
        };
        let (lr, min_lr) = (f64::from(lr), f64::from(min_lr));
        if step < warmup {
            return (lr * (step + 1) as f64 / warmup as f64) as f32;
        }
        if step >= total {
            return min_lr as f32;
        }
        let progress = (step - warmup) as f64 / (total - warmup) as f64;
        let factor = if cosine {
            0.5 * (1.0 + (std::f64::consts::PI * progress).cos())
        } else {
            1.0 - progress
        };
        (min_lr + (lr - min_lr) * factor) as f32
    }

    /// The configuration as JSON (what a checkpoint stores).
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a schedule always serializes")
    }

    pub fn from_json(s: &str) -> Result<Schedule, ScheduleError> {
        let s: Schedule =
            serde_json::from_str(s).map_err(|e| ScheduleError(format!("bad JSON: {e}")))?;
        s.validate()?;
        Ok(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f32, b: f32) -> bool {
        (a - b).abs() <= 1e-7 * b.abs().max(1e-3)
    }

    #[test]
    fn constant_warmup_cosine_and_linear() {
        assert_eq!(Schedule::Constant { lr: 3e-4 }.lr(12345), 3e-4);
        let cos = Schedule::WarmupCosine {
            lr: 1e-3,
            min_lr: 1e-4,
            warmup_steps: 10,
            total_steps: 110,
        };
        cos.validate().unwrap();
        assert!(close(cos.lr(0), 1e-4), "{}", cos.lr(0));
        assert!(close(cos.lr(4), 5e-4));
        assert!(close(cos.lr(9), 1e-3));
        assert!(close(cos.lr(10), 1e-3));
        assert!(close(cos.lr(60), 5.5e-4), "half way: {}", cos.lr(60));
        // A quarter of the way: cos(pi/4).
        let quarter = 1e-4 + 9e-4 * 0.5 * (1.0 + std::f32::consts::FRAC_PI_4.cos());
        assert!(close(cos.lr(35), quarter), "{}", cos.lr(35));
        assert!(close(cos.lr(110), 1e-4));
        assert!(close(cos.lr(10_000), 1e-4));
        // Monotone after warmup.
        assert!((10..110).all(|s| cos.lr(s + 1) <= cos.lr(s)));

        let lin = Schedule::WarmupLinear {
            lr: 2e-3,
            min_lr: 0.0,
            warmup_steps: 0,
            total_steps: 100,
        };
        assert!(close(lin.lr(0), 2e-3));
        assert!(close(lin.lr(25), 1.5e-3));
        assert!(close(lin.lr(75), 5e-4));
        assert_eq!(lin.lr(100), 0.0);
    }

    #[test]
    fn json_round_trip_and_validation() {
        let s = Schedule::WarmupLinear {
            lr: 1e-4,
            min_lr: 1e-5,
            warmup_steps: 5,
            total_steps: 50,
        };
        let json = s.to_json();
        assert!(json.contains("\"kind\":\"warmup_linear\""), "{json}");
        let back = Schedule::from_json(&json).unwrap();
        assert_eq!(back, s);
        assert!((0..60).all(|i| back.lr(i).to_bits() == s.lr(i).to_bits()));

        let bad = Schedule::WarmupCosine {
            lr: 1e-4,
            min_lr: 1e-3,
            warmup_steps: 5,
            total_steps: 50,
        };
        assert!(bad.validate().unwrap_err().0.contains("min_lr"));
        let bad = Schedule::WarmupCosine {
            lr: 1e-4,
            min_lr: 0.0,
            warmup_steps: 60,
            total_steps: 50,
        };
        assert!(bad.validate().unwrap_err().0.contains("warmup_steps"));
        assert!(Schedule::Constant { lr: f32::NAN }.validate().is_err());
        assert!(Schedule::from_json("{\"kind\":\"exponential\"}").is_err());
        assert!(Schedule::from_json(&bad.to_json()).is_err());
    }
}
