//! GGUF: the llama.cpp model file format (versions 2 and 3).

mod file;
mod file_type;
mod keys;
mod reader;
mod value;
mod writer;

pub use file::{GgufFile, TensorView};
pub use file_type::{file_type_id, file_type_name};
pub use keys::Key;
pub use reader::{
    Gguf, KeyValue, SplitInfo, TensorInfo, DEFAULT_ALIGNMENT, GGUF_MAGIC, MAX_ALIGNMENT,
    MAX_ARRAY_DEPTH, MAX_DIMS, MAX_NAME_LEN,
};
pub use value::{Array, GgufString, Value, ValueType};
pub use writer::GgufWriter;
