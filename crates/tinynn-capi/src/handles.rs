//! Handles: what the C side holds is an opaque pointer that this library never dereferences.
//! Each live handle is an entry of a registry (id → `Arc` of the object); ids are never
//! reused, so a null, freed (even after its memory went to a new object), foreign or
//! wrong-kind pointer is an error (`TNN_ERR_NULL` / `TNN_ERR_HANDLE`), not a crash, and freeing
//! a handle while another thread is inside a call on it only drops the object when that call
//! ends.

use std::any::Any;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use crate::status::{Failure, Outcome, TnnStatus};

type Object = Arc<dyn Any + Send + Sync>;

fn registry() -> &'static Mutex<HashMap<usize, Object>> {
    static R: OnceLock<Mutex<HashMap<usize, Object>>> = OnceLock::new();
    R.get_or_init(|| Mutex::new(HashMap::new()))
}

fn lock() -> std::sync::MutexGuard<'static, HashMap<usize, Object>> {
    // A panic while the registry was locked cannot leave it inconsistent (inserts and removes
    // are single operations), so a poisoned lock is taken as is.
    registry().lock().unwrap_or_else(|p| p.into_inner())
}

/// The next handle id: a counter that never repeats (in steps of 16, so handles look like
/// aligned pointers to debuggers; 2^60 of them before it would wrap).
static NEXT_ID: AtomicUsize = AtomicUsize::new(0x7a00_0000);

/// Registers `object` and returns its handle (an id never used before).
pub(crate) fn register<T: Any + Send + Sync, H>(object: T) -> *mut H {
    let arc: Arc<T> = Arc::new(object);
    let id = NEXT_ID.fetch_add(16, Ordering::Relaxed);
    lock().insert(id, arc);
    id as *mut H
}

/// The object behind `handle`, when it is a live handle of type `T`.
pub(crate) fn get<T: Any + Send + Sync, H>(handle: *const H, what: &str) -> Outcome<Arc<T>> {
    if handle.is_null() {
        return Err(Failure::null(what));
    }
    let object = lock().get(&(handle as usize)).cloned();
    object.and_then(|o| o.downcast::<T>().ok()).ok_or_else(|| {
        Failure::new(
            TnnStatus::TNN_ERR_HANDLE,
            format!("{what} is not a live {what} handle (freed, or of another kind)"),
        )
    })
}

/// Unregisters `handle` (a live handle of type `T`); the object is dropped when no call is
/// using it. A null handle is a no-op.
pub(crate) fn free<T: Any + Send + Sync, H>(handle: *mut H, what: &str) -> Outcome {
    if handle.is_null() {
        return Ok(());
    }
    get::<T, H>(handle, what)?;
    lock().remove(&(handle as usize));
    Ok(())
}
