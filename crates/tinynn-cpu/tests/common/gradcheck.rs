//! Finite-difference gradient checker.
//!
//! The function under test maps parameters to a tensor `y`; the checker takes the scalar
//! `L = Σ y·r` with fixed random weights `r`, builds `backward(L, params)` on the same graph,
//! and compares the analytic gradients (strict mode: one thread, f64 sums) with central
//! differences `(L(x+h) − L(x−h)) / 2h` of every parameter element, where L is summed in f64
//! from the f32 `y` of strict runs. The error is `‖analytic − numeric‖ / ‖numeric‖` per
//! parameter. It also runs the same plan on 1, 2 and 3 threads (normal mode) and requires
//! identical gradients, close to the strict ones.

use tinynn_core::graph::{Graph, RuleOverride};
use tinynn_core::plan::Plan;
use tinynn_core::tensor::TensorId;
use tinynn_cpu::{ExecOptions, Executor, Memory};
use tinynn_format::GgmlType;

use super::{Input, Rng};

/// What a builder returns: the output y, inputs to write, weights to bind.
pub struct Built {
    pub y: TensorId,
    pub inputs: Vec<Input>,
    pub weights: Vec<(TensorId, Vec<u8>)>,
}

impl Built {
    pub fn y(y: TensorId) -> Built {
        Built {
            y,
            inputs: Vec::new(),
            weights: Vec::new(),
        }
    }

    pub fn with(y: TensorId, inputs: Vec<Input>) -> Built {
        Built {
            y,
            inputs,
            weights: Vec::new(),
        }
    }
}

pub struct Opts<'a> {
    /// Central-difference step (absolute; parameters are O(1)).
    pub h: f64,
    /// Largest accepted relative error.
    pub tol: f64,
    /// Replaces backward rules (to prove that a wrong rule is caught).
    pub rule_override: Option<RuleOverride<'a>>,
    /// Require identical gradients on 1, 2 and 3 threads.
    pub deterministic: bool,
}

impl Default for Opts<'_> {
    fn default() -> Self {
        Opts {
            h: 1e-3,
            tol: 1e-3,
            rule_override: None,
            deterministic: true,
        }
    }
}

/// A parameter: shape and initial values.
pub struct P {
    pub shape: Vec<usize>,
    pub values: Vec<f32>,
}

impl P {
    /// Uniform in [lo, hi).
    pub fn uniform(shape: &[usize], lo: f32, hi: f32, rng: &mut Rng) -> P {
        let n = shape.iter().product();
        P {
            shape: shape.to_vec(),
            values: rng
                .vec(n)
                .iter()
                .map(|v| lo + (v + 1.0) * 0.5 * (hi - lo))
                .collect(),
        }
    }

    pub fn rand(shape: &[usize], rng: &mut Rng) -> P {
        P::uniform(shape, -1.0, 1.0, rng)
    }
}

fn write_all(mem: &mut Memory<'_>, plan: &Plan, ps: &[TensorId], params: &[P], inputs: &[Input]) {
    for (t, p) in ps.iter().zip(params) {
        mem.write_f32(plan, *t, &p.values).unwrap();
    }
    for input in inputs {
        match input {
            // Inputs the output does not read are not in the plan.
            Input::F32(t, _) | Input::I32(t, _) if plan.location(*t).is_none() => {}
            Input::F32(t, v) => mem.write_f32(plan, *t, v).unwrap(),
            Input::I32(t, v) => mem.write_i32(plan, *t, v).unwrap(),
        }
    }
}

/// Checks the gradients of `build`'s output with respect to every parameter. Returns the
/// largest relative error, or a message naming the parameter that failed.
pub fn grad_check(
    name: &str,
    params: &[P],
    build: &dyn Fn(&mut Graph, &[TensorId]) -> Built,
    opts: &Opts<'_>,
) -> Result<f64, String> {
    let mut g = Graph::new();
    let ps: Vec<TensorId> = params
        .iter()
        .enumerate()
        .map(|(i, p)| g.input(&format!("p{i}"), GgmlType::F32, &p.shape).unwrap())
        .collect();
    let mut built = build(&mut g, &ps);
    let ly = *g.layout(built.y);
    let mut rng = Rng::new(0x5eed);
    let rv = rng.vec(ly.n_elements());
    let r = g.input("r", GgmlType::F32, &ly.ne).unwrap();
    built.inputs.push(Input::F32(r, rv.clone()));
    let prod = g.mul(built.y, r).unwrap();
    let loss = g.sum(prod).unwrap();
    let grads = g
        .backward_with(loss, &ps, 1.0, opts.rule_override)
        .map_err(|e| format!("{name}: backward: {e}"))?;
    let y_read = if ly.is_contiguous() {
        built.y
    } else {
        g.cont(built.y).unwrap()
    };
    g.set_output(y_read).unwrap();
    for &gr in &grads {
        g.set_output(gr).unwrap();
    }
    let plan = tinynn_cpu::compile(g);
    plan.verify().unwrap();
    let mut mem = Memory::new(&plan);
    for (t, bytes) in &built.weights {
        mem.bind_weight(&plan, *t, bytes).unwrap();
    }
    write_all(&mut mem, &plan, &ps, params, &built.inputs);
    let strict = ExecOptions {
        threads: 1,
        strict: true,
        ..ExecOptions::default()
    };
    let mut exec = Executor::with_options(&plan, strict);
    exec.run(&plan, &mut mem)
        .map_err(|e| format!("{name}: {e}"))?;
    let analytic: Vec<Vec<f32>> = grads
        .iter()
        .map(|&gr| exec.read_f32(&plan, &mem, gr).unwrap())
        .collect();

    // Normal mode on 1, 2, 3 threads: identical, and close to strict.
    if opts.deterministic {
        let mut first: Option<Vec<Vec<f32>>> = None;
        for threads in [1, 2, 3] {
            let mut e = Executor::new(&plan, threads);
            e.run(&plan, &mut mem).unwrap();
            let got: Vec<Vec<f32>> = grads
                .iter()
                .map(|&gr| e.read_f32(&plan, &mem, gr).unwrap())
                .collect();
            for (i, (a, b)) in got.iter().zip(&analytic).enumerate() {
                let e = rel_err(a, &b.iter().map(|&v| f64::from(v)).collect::<Vec<_>>());
                if e > 1e-4 {
                    return Err(format!(
                        "{name}: p{i} on {threads} threads is {e:e} from strict mode"
                    ));
                }
            }
            match &first {
                None => first = Some(got),
                Some(f) => {
                    if *f != got {
                        return Err(format!("{name}: gradients differ on {threads} threads"));
                    }
                }
            }
        }
    }

    let loss_at = |exec: &mut Executor, mem: &mut Memory<'_>| -> f64 {
        exec.run(&plan, mem).unwrap();
        let y = exec.read_f32(&plan, mem, y_read).unwrap();
        y.iter()
            .zip(&rv)
            .map(|(&a, &b)| f64::from(a) * f64::from(b))
            .sum()
    };
    let mut worst = 0f64;
    for (pi, p) in params.iter().enumerate() {
        let mut numeric = vec![0f64; p.values.len()];
        let mut vals = p.values.clone();
        for e in 0..vals.len() {
            let x = p.values[e];
            let (xp, xm) = (
                (f64::from(x) + opts.h) as f32,
                (f64::from(x) - opts.h) as f32,
            );
            vals[e] = xp;
            mem.write_f32(&plan, ps[pi], &vals).unwrap();
            let lp = loss_at(&mut exec, &mut mem);
            vals[e] = xm;
            mem.write_f32(&plan, ps[pi], &vals).unwrap();
            let lm = loss_at(&mut exec, &mut mem);
            vals[e] = x;
            numeric[e] = (lp - lm) / (f64::from(xp) - f64::from(xm));
        }
        mem.write_f32(&plan, ps[pi], &vals).unwrap();
        let err = rel_err(&analytic[pi], &numeric);
        if err > opts.tol || !err.is_finite() {
            return Err(format!(
                "{name}: gradient of p{pi} {:?} is off by {err:e} (tolerance {:e}); analytic {:?}… numeric {:?}…",
                p.shape,
                opts.tol,
                &analytic[pi][..analytic[pi].len().min(4)],
                &numeric[..numeric.len().min(4)]
            ));
        }
        worst = worst.max(err);
    }
    Ok(worst)
}

/// `‖a − b‖ / max(‖b‖, ‖a‖)` (0 when both are zero).
pub fn rel_err(a: &[f32], b: &[f64]) -> f64 {
    let diff: f64 = a
        .iter()
        .zip(b)
        .map(|(&x, &y)| (f64::from(x) - y).powi(2))
        .sum::<f64>()
        .sqrt();
    let na = a.iter().map(|&x| f64::from(x).powi(2)).sum::<f64>().sqrt();
    let nb = b.iter().map(|y| y * y).sum::<f64>().sqrt();
    let denom = na.max(nb);
    if denom == 0.0 {
        0.0
    } else {
        diff / denom
    }
}

/// [`grad_check`] that must pass; prints the error.
pub fn assert_grads(name: &str, params: &[P], build: &dyn Fn(&mut Graph, &[TensorId]) -> Built) {
    assert_grads_with(name, params, build, &Opts::default());
}

pub fn assert_grads_with(
    name: &str,
    params: &[P],
    build: &dyn Fn(&mut Graph, &[TensorId]) -> Built,
    opts: &Opts<'_>,
) {
    match grad_check(name, params, build, opts) {
        Ok(e) => eprintln!("{name}: max relative error {e:.2e}"),
        Err(msg) => panic!("{msg}"),
    }
}
