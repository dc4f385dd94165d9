//! Status codes, the thread-local error message, and the guard every exported function runs
//! its body in (no Rust panic crosses the boundary).

use std::cell::RefCell;
use std::ffi::{c_char, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// What a `tnn_*` function returns. Anything but `TNN_OK` leaves a message for
/// `tnn_last_error` on the calling thread.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TnnStatus {
    /// Success.
    TNN_OK = 0,
    /// A required pointer argument was null.
    TNN_ERR_NULL = 1,
    /// A handle that is not a live handle of the expected kind (freed, of another kind, or
    /// not made by this library).
    TNN_ERR_HANDLE = 2,
    /// An argument is out of range or malformed (a message says which).
    TNN_ERR_INVALID = 3,
    /// A file could not be read or written.
    TNN_ERR_IO = 4,
    /// The model, its files or the engine failed (a message says what and where).
    TNN_ERR_MODEL = 5,
    /// The session's context (KV cache) has no room for the tokens.
    TNN_ERR_CONTEXT_FULL = 6,
    /// The caller's buffer is too small; the needed size was written where the function says.
    TNN_ERR_BUFFER_TOO_SMALL = 7,
    /// A training step or setting failed.
    TNN_ERR_TRAIN = 8,
    /// The library panicked (a bug); the message says where. The handle involved may be in a
    /// half-updated state and should be freed.
    TNN_ERR_PANIC = 9,
}

/// A failed call: its status and message.
#[derive(Debug)]
pub(crate) struct Failure {
    pub status: TnnStatus,
    pub message: String,
}

impl Failure {
    pub fn new(status: TnnStatus, message: impl Into<String>) -> Failure {
        Failure {
            status,
            message: message.into(),
        }
    }

    pub fn invalid(message: impl Into<String>) -> Failure {
        Failure::new(TnnStatus::TNN_ERR_INVALID, message)
    }

    pub fn null(what: &str) -> Failure {
        Failure::new(TnnStatus::TNN_ERR_NULL, format!("{what} is null"))
    }
}

impl From<tinynn::ModelError> for Failure {
    fn from(e: tinynn::ModelError) -> Failure {
        let status = match &e {
            tinynn::ModelError::ContextFull(_) => TnnStatus::TNN_ERR_CONTEXT_FULL,
            tinynn::ModelError::Invalid(_) => TnnStatus::TNN_ERR_INVALID,
            tinynn::ModelError::Format(tinynn::format::Error::Io { .. }) => TnnStatus::TNN_ERR_IO,
            _ => TnnStatus::TNN_ERR_MODEL,
        };
        Failure::new(status, error_chain(&e))
    }
}

impl From<tinynn::TrainError> for Failure {
    fn from(e: tinynn::TrainError) -> Failure {
        Failure::new(TnnStatus::TNN_ERR_TRAIN, error_chain(&e))
    }
}

/// An error and its sources, `: `-separated (each once).
pub(crate) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}

pub(crate) type Outcome<T = ()> = Result<T, Failure>;

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn set_last_error(message: &str) {
    // Interior NULs cannot be in a C string: they become spaces.
    let clean = CString::new(message.replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = clean);
}

/// Runs `body`, turning its error or panic into a status and this thread's message.
pub(crate) fn guard(body: impl FnOnce() -> Outcome) -> TnnStatus {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => {
            set_last_error("");
            TnnStatus::TNN_OK
        }
        Ok(Err(f)) => {
            set_last_error(&f.message);
            f.status
        }
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            set_last_error(&format!("internal error (panic): {what}"));
            TnnStatus::TNN_ERR_PANIC
        }
    }
}

/// The message of the last failed `tnn_*` call on this thread ("" after a success). The
/// pointer stays valid until the next `tnn_*` call on this thread.
#[no_mangle]
pub extern "C" fn tnn_last_error() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}
