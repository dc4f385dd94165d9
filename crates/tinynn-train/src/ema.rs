//! Exponential moving average of weights: `ema = decay * ema + (1 - decay) * param`, per named
//! f32 tensor.

/// One tensor's update, in place.
pub fn update(ema: &mut [f32], params: &[f32], decay: f32) {
    debug_assert_eq!(ema.len(), params.len());
    let keep = 1.0 - decay;
    for (e, &p) in ema.iter_mut().zip(params) {
        *e = decay * *e + keep * p;
    }
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum EmaError {
    #[error("EMA: decay {0} must be in [0, 1]")]
    Decay(f32),
    #[error("EMA: tensor '{0}' is not tracked")]
    Unknown(String),
    #[error("EMA: tensor '{name}' has {got} elements, the average has {want}")]
    Length {
        name: String,
        got: usize,
        want: usize,
    },
}

/// Averages of a set of named tensors (e.g. stored in a checkpoint as `ema.<name>`).
#[derive(Debug, Clone, PartialEq)]
pub struct Ema {
    pub decay: f32,
    pub tensors: Vec<(String, Vec<f32>)>,
}

impl Ema {
    /// Starts the averages at the current values of `params`.
    pub fn new<'a>(
        decay: f32,
        params: impl IntoIterator<Item = (&'a str, &'a [f32])>,
    ) -> Result<Ema, EmaError> {
        if !(0.0..=1.0).contains(&decay) {
            return Err(EmaError::Decay(decay));
        }
        let tensors = params
            .into_iter()
            .map(|(n, p)| (n.to_string(), p.to_vec()))
            .collect();
        Ok(Ema { decay, tensors })
    }

    /// Moves every average towards the named tensor's current value; unknown names or length
    /// changes are errors and leave the average of that tensor untouched.
    pub fn update<'a>(
        &mut self,
        params: impl IntoIterator<Item = (&'a str, &'a [f32])>,
    ) -> Result<(), EmaError> {
        for (name, p) in params {
            let (_, e) = self
                .tensors
                .iter_mut()
                .find(|(n, _)| n == name)
                .ok_or_else(|| EmaError::Unknown(name.to_string()))?;
            if e.len() != p.len() {
                return Err(EmaError::Length {
                    name: name.to_string(),
                    got: p.len(),
                    want: e.len(),
                });
            }
            update(e, p, self.decay);
        }
        Ok(())
    }

    pub fn get(&self, name: &str) -> Option<&[f32]> {
        self.tensors
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_slice())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn averages_converge_and_errors_are_typed() {
        let w = vec![0.0f32, 1.0];
        let mut ema = Ema::new(0.5, [("w", w.as_slice())]).unwrap();
        let target = [4.0f32, -2.0];
        ema.update([("w", &target[..])]).unwrap();
        assert_eq!(ema.get("w").unwrap(), &[2.0, -0.5]);
        for _ in 0..40 {
            ema.update([("w", &target[..])]).unwrap();
        }
        let got = ema.get("w").unwrap();
        assert!((got[0] - 4.0).abs() < 1e-6 && (got[1] + 2.0).abs() < 1e-6);
        assert_eq!(
            ema.update([("x", &target[..])]),
            Err(EmaError::Unknown("x".into()))
        );
        assert!(matches!(
            ema.update([("w", &target[..1])]),
            Err(EmaError::Length {
                got: 1,
                want: 2,
                ..
            })
        ));
        assert_eq!(Ema::new(1.5, []).unwrap_err(), EmaError::Decay(1.5));
        // decay 1 keeps the average, decay 0 copies.
        let mut a = [1.0f32];
        update(&mut a, &[9.0], 1.0);
        assert_eq!(a, [1.0]);
        update(&mut a, &[9.0], 0.0);
        assert_eq!(a, [9.0]);
    }
}
