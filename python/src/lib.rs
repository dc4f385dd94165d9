//! The `tinynn` Python package's native module (`tinynn._tinynn`), on PyO3 (abi3, Python ≥
//! 3.9): `model` (models, streaming generation and chat, tokens, embeddings, logits,
//! perplexity), `train` (a step-by-step `Trainer` and `finetune` with a progress callback),
//! `graph` (the graph API with numpy in and out). Engine errors are `tinynn.TinynnError`
//! with the engine's message; long computations release the GIL.

use pyo3::prelude::*;

mod graph;
mod model;
mod train;

pyo3::create_exception!(
    _tinynn,
    TinynnError,
    pyo3::exceptions::PyException,
    "An error of the engine (the message says what and where)."
);

/// The engine's error as a Python exception.
pub(crate) fn err(e: impl std::fmt::Display) -> PyErr {
    TinynnError::new_err(e.to_string())
}

/// The path of the default model (SmolLM2-135M-Instruct Q4_1) in the model cache; an error
/// when it is missing (`tnn pull smollm2` fetches it).
#[pyfunction]
fn default_model() -> PyResult<String> {
    Ok(tinynn::default_model().map_err(err)?.display().to_string())
}

#[pymodule]
fn _tinynn(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("TinynnError", m.py().get_type::<TinynnError>())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_function(wrap_pyfunction!(default_model, m)?)?;
    m.add_class::<model::Model>()?;
    m.add_class::<model::Generation>()?;
    m.add_class::<train::Trainer>()?;
    m.add_function(wrap_pyfunction!(train::finetune, m)?)?;
    m.add_class::<graph::Graph>()?;
    Ok(())
}
