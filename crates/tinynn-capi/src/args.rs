//! Reading C arguments: strings, slices and output pointers, each checked.

use std::ffi::{c_char, CStr};

use crate::status::{Failure, Outcome, TnnStatus};

/// A NUL-terminated UTF-8 string argument.
pub(crate) fn str_arg<'a>(p: *const c_char, what: &str) -> Outcome<&'a str> {
    if p.is_null() {
        return Err(Failure::null(what));
    }
    // SAFETY: the caller passes a NUL-terminated string that lives for the call (the API's
    // contract for every `const char*` argument).
    let c = unsafe { CStr::from_ptr(p) };
    c.to_str()
        .map_err(|e| Failure::invalid(format!("{what} is not UTF-8: {e}")))
}

/// `n` values at `p` (null is allowed when `n` is 0).
pub(crate) fn slice_arg<'a, T>(p: *const T, n: usize, what: &str) -> Outcome<&'a [T]> {
    if n == 0 {
        return Ok(&[]);
    }
    if p.is_null() {
        return Err(Failure::null(what));
    }
    // SAFETY: the caller passes `n` readable values at `p` that live for the call.
    Ok(unsafe { std::slice::from_raw_parts(p, n) })
}

/// Writes `value` through the output pointer `p`.
pub(crate) fn put<T>(p: *mut T, value: T, what: &str) -> Outcome {
    if p.is_null() {
        return Err(Failure::null(what));
    }
    // SAFETY: the caller passes a writable pointer to a `T`.
    unsafe { p.write(value) };
    Ok(())
}

/// Copies `data` into the caller's buffer `out` of `cap` values and writes the length to
/// `n_out` (when not null); a buffer too small is `TNN_ERR_BUFFER_TOO_SMALL` with the needed
/// length written.
pub(crate) fn copy_out<T: Copy>(
    data: &[T],
    out: *mut T,
    cap: usize,
    n_out: *mut usize,
    what: &str,
) -> Outcome {
    if !n_out.is_null() {
        // SAFETY: a non-null `n_out` is a writable `size_t` (the API's contract).
        unsafe { n_out.write(data.len()) };
    }
    if data.len() > cap {
        return Err(Failure::new(
            TnnStatus::TNN_ERR_BUFFER_TOO_SMALL,
            format!("{what} needs {} values, the buffer holds {cap}", data.len()),
        ));
    }
    if data.is_empty() {
        return Ok(());
    }
    if out.is_null() {
        return Err(Failure::null(what));
    }
    // SAFETY: `out` has room for `cap ≥ data.len()` values (the API's contract).
    unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), out, data.len()) };
    Ok(())
}
