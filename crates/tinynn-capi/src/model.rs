//! Models: open, free, describe, tokenize and detokenize. A model handle may be used from any
//! number of threads at once (sessions share it).

use std::ffi::{c_char, CString};
use std::sync::Arc;

use tinynn::Model;

use crate::args::{copy_out, put, slice_arg, str_arg};
use crate::handles::{free, get, register};
use crate::status::{guard, Failure, Outcome, TnnStatus};

/// An opened model (GGUF file or Hugging Face directory). Thread-safe.
pub struct TnnModel {
    _private: [u8; 0],
}

/// The object behind a `TnnModel*`.
pub(crate) struct ModelObject {
    pub model: Arc<Model>,
    architecture: CString,
}

pub(crate) fn model_of(handle: *const TnnModel) -> Outcome<Arc<ModelObject>> {
    get::<ModelObject, TnnModel>(handle, "model")
}

/// What a model is.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct TnnModelInfo {
    /// Vocabulary size (token ids are below it).
    pub n_vocab: u64,
    /// The context the model was trained with (0 when the file does not say).
    pub n_ctx_train: u64,
    /// Width of the residual stream.
    pub n_embd: u64,
    /// Blocks.
    pub n_layer: u64,
    /// Attention heads (0 for a state-space model such as Mamba).
    pub n_head: u64,
    /// Key/value heads.
    pub n_head_kv: u64,
    /// Parameters (weights of every tensor the model reads).
    pub n_params: u64,
}

/// Opens the model at `path` (a GGUF file or a Hugging Face directory) into `*out`.
///
/// # Safety
/// `path` is a NUL-terminated string; `out` a writable `TnnModel*`.
#[no_mangle]
pub unsafe extern "C" fn tnn_model_open(path: *const c_char, out: *mut *mut TnnModel) -> TnnStatus {
    guard(|| {
        let path = str_arg(path, "path")?;
        if out.is_null() {
            return Err(Failure::null("out"));
        }
        let model = Model::open(path)?;
        let architecture = CString::new(model.config().architecture.name()).unwrap_or_default();
        put(
            out,
            register(ModelObject {
                model,
                architecture,
            }),
            "out",
        )
    })
}

/// Frees a model handle (null: nothing). Sessions made from it keep the model alive until
/// they are freed.
///
/// # Safety
/// `model` is null or a handle from `tnn_model_open` (a stale one is an error, not a crash).
#[no_mangle]
pub unsafe extern "C" fn tnn_model_free(model: *mut TnnModel) -> TnnStatus {
    guard(|| free::<ModelObject, TnnModel>(model, "model"))
}

/// Fills `*info` with the model's sizes.
///
/// # Safety
/// `info` is a writable `TnnModelInfo`.
#[no_mangle]
pub unsafe extern "C" fn tnn_model_info(
    model: *const TnnModel,
    info: *mut TnnModelInfo,
) -> TnnStatus {
    guard(|| {
        let m = model_of(model)?;
        let c = m.model.config();
        let n_params = parameter_count(&m.model)?;
        let value = TnnModelInfo {
            n_vocab: c.n_vocab.unwrap_or(0),
            n_ctx_train: c.n_ctx_train.unwrap_or(0),
            n_embd: c.n_embd,
            n_layer: c.n_layer,
            n_head: c.n_head,
            n_head_kv: c.n_head_kv,
            n_params,
        };
        put(info, value, "info")
    })
}

fn parameter_count(model: &Model) -> Outcome<u64> {
    use tinynn::models::arch::{declare, of_config, Hparams};
    let src = model.source();
    let hp = Hparams::from_config(model.config(), src.is_hf())?;
    let has = |name: &str| Ok(src.get(name)?.is_some());
    let decls = declare(of_config(model.config())?.decoder, &hp, &has)?;
    Ok(decls
        .iter()
        .map(|d| d.dims.iter().product::<usize>() as u64)
        .sum())
}

/// The model's architecture name as GGUF files spell it (`llama`, `gemma3`, `mamba`, ...),
/// or null for a handle that is not a live model. Valid while the model handle lives.
///
/// # Safety
/// `model` is a handle from `tnn_model_open` (a stale one gives null).
#[no_mangle]
pub unsafe extern "C" fn tnn_model_architecture(model: *const TnnModel) -> *const c_char {
    let mut out = std::ptr::null();
    let status = guard(|| {
        let m = model_of(model)?;
        out = m.architecture.as_ptr();
        Ok(())
    });
    if status == TnnStatus::TNN_OK {
        out
    } else {
        std::ptr::null()
    }
}

/// Tokenizes `text` into `ids` (room for `cap` ids); `*n_ids` gets the count. `add_special`:
/// add the model's BOS token and parse special tokens, as a prompt is tokenized. A buffer too
/// small gives `TNN_ERR_BUFFER_TOO_SMALL` with the needed count in `*n_ids`.
///
/// # Safety
/// `text` is NUL-terminated; `ids` has room for `cap` values; `n_ids` is writable or null.
#[no_mangle]
pub unsafe extern "C" fn tnn_tokenize(
    model: *const TnnModel,
    text: *const c_char,
    add_special: bool,
    ids: *mut i32,
    cap: usize,
    n_ids: *mut usize,
) -> TnnStatus {
    guard(|| {
        let m = model_of(model)?;
        let text = str_arg(text, "text")?;
        let tokens = m.model.tokenizer()?.encode(text, add_special)?;
        let tokens: Vec<i32> = tokens.iter().map(|&t| t as i32).collect();
        copy_out(&tokens, ids, cap, n_ids, "ids")
    })
}

/// Writes the text of `n` token ids into `text` (room for `cap` bytes, NUL included);
/// `*n_bytes` gets the text's length without the NUL. A buffer too small gives
/// `TNN_ERR_BUFFER_TOO_SMALL` with the length needed (NUL included) in `*n_bytes`.
///
/// # Safety
/// `ids` holds `n` values; `text` has room for `cap` bytes; `n_bytes` is writable or null.
#[no_mangle]
pub unsafe extern "C" fn tnn_detokenize(
    model: *const TnnModel,
    ids: *const i32,
    n: usize,
    text: *mut c_char,
    cap: usize,
    n_bytes: *mut usize,
) -> TnnStatus {
    guard(|| {
        let m = model_of(model)?;
        let ids = slice_arg(ids, n, "ids")?;
        let vocab = m.model.tokenizer()?.vocab_size();
        let mut tokens = Vec::with_capacity(ids.len());
        for &id in ids {
            if id < 0 || id as usize >= vocab {
                return Err(Failure::invalid(format!(
                    "token id {id} is outside the vocabulary of {vocab}"
                )));
            }
            tokens.push(id as u32);
        }
        let s = m.model.tokenizer()?.decode(&tokens)?;
        write_c_string(&s, text, cap, n_bytes)
    })
}

/// Copies `s` and a NUL into the caller's buffer; `*n_bytes` gets `s`'s length (or, when the
/// buffer is too small, the length needed with the NUL).
pub(crate) fn write_c_string(
    s: &str,
    out: *mut c_char,
    cap: usize,
    n_bytes: *mut usize,
) -> Outcome {
    let need = s.len() + 1;
    if need > cap {
        if !n_bytes.is_null() {
            // SAFETY: a non-null `n_bytes` is writable (the API's contract).
            unsafe { n_bytes.write(need) };
        }
        return Err(Failure::new(
            TnnStatus::TNN_ERR_BUFFER_TOO_SMALL,
            format!("the text needs {need} bytes with its NUL, the buffer holds {cap}"),
        ));
    }
    if out.is_null() {
        return Err(Failure::null("text"));
    }
    // SAFETY: `out` has room for `cap ≥ need` bytes.
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr(), out as *mut u8, s.len());
        out.add(s.len()).write(0);
    }
    if !n_bytes.is_null() {
        // SAFETY: as above.
        unsafe { n_bytes.write(s.len()) };
    }
    Ok(())
}
