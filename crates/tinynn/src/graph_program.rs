//! A graph to build, compile once and run many times from a host language (the C ABI's and
//! the Python package's graph API): inputs, trainable parameters and a model's tensors as
//! leaves, any ops of [`Graph`], backward, an optimizer step whose hyperparameters are
//! written before each run, and tensor data written and read between runs.

use std::sync::Arc;

use tinynn_core::backend::{Backend, WeightRef, WeightStore};
use tinynn_core::graph::{Graph, GraphError};
use tinynn_core::plan::Plan;
use tinynn_core::tensor::{Layout, TensorId};
use tinynn_cpu::{ExecOptions, Executor, Memory};
use tinynn_format::GgmlType;
use tinynn_models::model::Model;

/// What went wrong.
#[derive(Debug, thiserror::Error)]
pub enum ProgramError {
    /// The graph refused an op or a leaf.
    #[error(transparent)]
    Graph(#[from] GraphError),
    /// The model's files.
    #[error(transparent)]
    Model(#[from] tinynn_models::ModelError),
    /// The backend (memory, a run, a read or write).
    #[error("{0}")]
    Backend(String),
    /// A call that does not fit the program's state or arguments.
    #[error("{0}")]
    Invalid(String),
}

type Result<T> = std::result::Result<T, ProgramError>;

/// Which optimizer a program's step uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OptimizerKind {
    /// AdamW (moments kept between runs).
    AdamW,
    /// SGD with momentum.
    Sgd,
}

/// The optimizer's settings.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OptimizerSettings {
    /// Learning rate.
    pub lr: f32,
    /// AdamW's first-moment decay.
    pub beta1: f32,
    /// AdamW's second-moment decay.
    pub beta2: f32,
    /// AdamW's ε.
    pub eps: f32,
    /// Decoupled weight decay.
    pub weight_decay: f32,
    /// SGD's momentum.
    pub momentum: f32,
}

impl Default for OptimizerSettings {
    /// lr 1e-3, betas 0.9 / 0.999, eps 1e-8, no weight decay, momentum 0.9.
    fn default() -> Self {
        OptimizerSettings {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.0,
            momentum: 0.9,
        }
    }
}

impl OptimizerSettings {
    fn check(&self) -> Result<()> {
        let v = [
            self.lr,
            self.beta1,
            self.beta2,
            self.eps,
            self.weight_decay,
            self.momentum,
        ];
        let ok = v.iter().all(|x| x.is_finite())
            && self.lr >= 0.0
            && (0.0..1.0).contains(&self.beta1)
            && (0.0..1.0).contains(&self.beta2)
            && self.eps >= 0.0
            && self.weight_decay >= 0.0
            && (0.0..1.0).contains(&self.momentum);
        if ok {
            Ok(())
        } else {
            Err(ProgramError::Invalid(format!(
                "optimizer settings out of range: {self:?}"
            )))
        }
    }
}

struct Step {
    kind: OptimizerKind,
    hp: TensorId,
    settings: OptimizerSettings,
    runs: u64,
}

struct Compiled {
    exec: Executor,
    plan: Plan,
    mem: Memory<'static>,
}

/// A graph program (see the module docs): built, then compiled, then run.
pub struct GraphProgram {
    graph: Option<Graph>,
    compiled: Option<Compiled>,
    weights: Vec<(TensorId, Arc<Model>, String)>,
    step: Option<Step>,
}

impl Default for GraphProgram {
    fn default() -> Self {
        GraphProgram::new()
    }
}

impl GraphProgram {
    /// An empty program.
    pub fn new() -> GraphProgram {
        GraphProgram {
            graph: Some(Graph::new()),
            compiled: None,
            weights: Vec::new(),
            step: None,
        }
    }

    /// The graph to build on; an error once compiled.
    pub fn graph(&mut self) -> Result<&mut Graph> {
        self.graph.as_mut().ok_or_else(|| {
            ProgramError::Invalid("the graph is compiled: no more tensors can be added".into())
        })
    }

    /// The model's tensor `name` (any type, read-only) as a leaf; the program keeps the model.
    pub fn model_tensor(&mut self, model: &Arc<Model>, name: &str) -> Result<TensorId> {
        let w = model
            .source()
            .get(name)?
            .ok_or_else(|| ProgramError::Invalid(format!("the model has no tensor '{name}'")))?;
        let ne: Vec<usize> = w.dims.iter().map(|&d| d as usize).collect();
        let dtype = w.dtype;
        let t = self.graph()?.weight(name, dtype, &ne)?;
        self.weights.push((t, model.clone(), name.to_string()));
        Ok(t)
    }

    /// Adds the in-place update of `params` by `grads` (one each) with `kind`; its settings
    /// are [`OptimizerSettings::default`] until [`GraphProgram::set_optimizer`].
    pub fn optimizer(
        &mut self,
        kind: OptimizerKind,
        params: &[TensorId],
        grads: &[TensorId],
    ) -> Result<()> {
        if self.step.is_some() {
            return Err(ProgramError::Invalid(
                "the graph has an optimizer step already".into(),
            ));
        }
        if params.len() != grads.len() {
            return Err(ProgramError::Invalid(format!(
                "{} parameters and {} gradients",
                params.len(),
                grads.len()
            )));
        }
        let g = self.graph()?;
        let n_hp = if kind == OptimizerKind::AdamW { 7 } else { 3 };
        let hp = g.input("optimizer.hp", GgmlType::F32, &[n_hp])?;
        for (&p, &gr) in params.iter().zip(grads) {
            let name = g.node(p).name.clone();
            let ne = g.layout(p).ne;
            match kind {
                OptimizerKind::AdamW => {
                    let m = g.persistent(&format!("adam_m.{name}"), GgmlType::F32, &ne)?;
                    let v = g.persistent(&format!("adam_v.{name}"), GgmlType::F32, &ne)?;
                    g.adamw_step(p, gr, m, v, hp)?;
                }
                OptimizerKind::Sgd => {
                    let vel = g.persistent(&format!("sgd_vel.{name}"), GgmlType::F32, &ne)?;
                    g.sgd_step(p, gr, vel, hp)?;
                }
            }
        }
        self.step = Some(Step {
            kind,
            hp,
            settings: OptimizerSettings::default(),
            runs: 0,
        });
        Ok(())
    }

    /// The optimizer's settings for the next runs.
    pub fn set_optimizer(&mut self, settings: OptimizerSettings) -> Result<()> {
        settings.check()?;
        let step = self
            .step
            .as_mut()
            .ok_or_else(|| ProgramError::Invalid("the graph has no optimizer step".into()))?;
        step.settings = settings;
        Ok(())
    }

    /// The optimizer's current settings.
    pub fn optimizer_settings(&self) -> Result<OptimizerSettings> {
        self.step
            .as_ref()
            .map(|s| s.settings)
            .ok_or_else(|| ProgramError::Invalid("the graph has no optimizer step".into()))
    }

    /// Compiles the graph into one plan and memory on `threads` threads and binds the model
    /// tensors; parameters start at zero.
    pub fn compile(&mut self, threads: usize) -> Result<()> {
        if threads == 0 {
            return Err(ProgramError::Invalid("threads must be at least 1".into()));
        }
        let g = self
            .graph
            .take()
            .ok_or_else(|| ProgramError::Invalid("the graph is compiled already".into()))?;
        let exec = Executor::cpu(ExecOptions {
            threads,
            ..ExecOptions::default()
        });
        let plan = exec.compile(g);
        let backend = |e: tinynn_cpu::ExecError| ProgramError::Backend(e.to_string());
        let mut mem = exec.new_memory(&plan, &[]).map_err(backend)?;
        for (t, model, name) in &self.weights {
            let src = model.source();
            let w = src.get(name)?.ok_or_else(|| {
                ProgramError::Invalid(format!("the model has no tensor '{name}'"))
            })?;
            let (region, range) = model.locate(w.data).ok_or_else(|| {
                ProgramError::Invalid(format!("'{name}' lies outside the model's files"))
            })?;
            let store: Arc<dyn WeightStore> = model.clone();
            exec.bind_weight(
                &mut mem,
                &plan,
                *t,
                WeightRef {
                    store,
                    region,
                    range,
                },
            )
            .map_err(backend)?;
        }
        self.compiled = Some(Compiled { exec, plan, mem });
        Ok(())
    }

    fn compiled(&mut self) -> Result<&mut Compiled> {
        self.compiled
            .as_mut()
            .ok_or_else(|| ProgramError::Invalid("the graph is not compiled yet".into()))
    }

    /// The layout of tensor `t`.
    pub fn layout(&self, t: TensorId) -> Result<Layout> {
        let g = match (&self.graph, &self.compiled) {
            (Some(g), _) => g,
            (None, Some(c)) => c.plan.graph(),
            (None, None) => return Err(ProgramError::Invalid("no graph".into())),
        };
        g.nodes()
            .get(t.index())
            .map(|n| n.layout)
            .ok_or_else(|| ProgramError::Invalid(format!("tensor {} does not exist", t.0)))
    }

    /// Writes the whole of input or parameter `t` (its bytes, in its type).
    pub fn write(&mut self, t: TensorId, bytes: &[u8]) -> Result<()> {
        let c = self.compiled()?;
        let want = c.exec.persistent_len(&c.mem, &c.plan, t);
        if want != bytes.len() {
            return Err(ProgramError::Invalid(format!(
                "tensor {} takes {want} bytes (an input or parameter), not {}",
                t.0,
                bytes.len()
            )));
        }
        c.exec
            .write(&mut c.mem, &c.plan, t, 0, bytes)
            .map_err(|e| ProgramError::Invalid(e.to_string()))
    }

    /// The F32 values of `t` (an output, a gradient or a parameter) after the last run.
    pub fn read_f32(&mut self, t: TensorId) -> Result<Vec<f32>> {
        let c = self.compiled()?;
        let mut v = Vec::new();
        Backend::read_f32(&c.exec, &c.plan, &c.mem, t, &mut v)
            .map_err(|e| ProgramError::Invalid(e.to_string()))?;
        Ok(v)
    }

    /// Runs the program once (with an optimizer step: one training step).
    pub fn run(&mut self) -> Result<()> {
        let hp = match &mut self.step {
            None => None,
            Some(s) => {
                s.runs += 1;
                let o = s.settings;
                let t = s.runs.min(i32::MAX as u64) as i32;
                let v: Vec<f32> = match s.kind {
                    OptimizerKind::AdamW => {
                        let c1 = 1.0 / (1.0 - f64::from(o.beta1).powi(t));
                        let c2 = 1.0 / (1.0 - f64::from(o.beta2).powi(t));
                        vec![
                            o.lr,
                            o.beta1,
                            o.beta2,
                            o.eps,
                            o.weight_decay,
                            c1 as f32,
                            c2 as f32,
                        ]
                    }
                    OptimizerKind::Sgd => vec![o.lr, o.momentum, o.weight_decay],
                };
                Some((s.hp, v))
            }
        };
        let c = self.compiled()?;
        if let Some((t, v)) = hp {
            let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
            c.exec
                .write(&mut c.mem, &c.plan, t, 0, &bytes)
                .map_err(|e| ProgramError::Invalid(e.to_string()))?;
        }
        c.exec
            .run(&c.plan, &mut c.mem)
            .map_err(|e| ProgramError::Backend(e.to_string()))
    }
}
