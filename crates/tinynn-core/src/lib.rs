//! tinynn-core: the numeric core of the engine.
//!
//! - [`quant`]: the ggml block formats (F32, F16, BF16, Q4_0 … Q8_1, Q2_K … Q8_K), bit-exact with
//!   GGUF files: block structs, scalar reference dequantize / quantize / vec_dot.
//! - [`measure`]: error measures against references that a NaN cannot slip past.

pub mod backend;
pub mod graph;
pub mod measure;
pub mod ops;
pub mod plan;
pub mod quant;
pub mod rng;
pub mod tensor;
