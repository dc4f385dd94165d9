//! A bounds-checked little-endian reader over an untrusted byte slice.
//!
//! Every read checks the bytes that are actually left before touching them, so no count or
//! length read from the file can make us read out of bounds or allocate blindly.

use crate::error::{GgufError, GgufErrorKind};

pub(crate) struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Cursor { buf, pos: 0 }
    }

    /// Current byte offset from the start of the buffer.
    pub(crate) fn pos(&self) -> u64 {
        self.pos as u64
    }

    pub(crate) fn remaining(&self) -> u64 {
        (self.buf.len() - self.pos) as u64
    }

    /// Takes `n` bytes, or fails naming `field` at the current offset.
    pub(crate) fn take(
        &mut self,
        n: u64,
        field: impl FnOnce() -> String,
    ) -> Result<&'a [u8], GgufError> {
        let available = self.remaining();
        if n > available {
            return Err(GgufError::new(
                self.pos(),
                field(),
                GgufErrorKind::UnexpectedEof {
                    needed: n,
                    available,
                },
            ));
        }
        // `n <= available <= usize::MAX`, so the cast is lossless.
        let start = self.pos;
        self.pos += n as usize;
        Ok(&self.buf[start..self.pos])
    }

    pub(crate) fn array<const N: usize>(
        &mut self,
        field: impl FnOnce() -> String,
    ) -> Result<[u8; N], GgufError> {
        let bytes = self.take(N as u64, field)?;
        let mut out = [0u8; N];
        out.copy_from_slice(bytes);
        Ok(out)
    }

    pub(crate) fn u32(&mut self, field: impl FnOnce() -> String) -> Result<u32, GgufError> {
        self.array(field).map(u32::from_le_bytes)
    }

    pub(crate) fn u64(&mut self, field: impl FnOnce() -> String) -> Result<u64, GgufError> {
        self.array(field).map(u64::from_le_bytes)
    }

    /// Reads a GGUF string (u64 length + bytes) and returns its raw bytes.
    pub(crate) fn string(&mut self, field: impl Fn() -> String) -> Result<&'a [u8], GgufError> {
        let at = self.pos();
        let len = self.u64(&field)?;
        let available = self.remaining();
        if len > available {
            return Err(GgufError::new(
                at,
                field(),
                GgufErrorKind::LengthTooLarge { len, available },
            ));
        }
        self.take(len, field)
    }

    /// Reads a count of items that each take at least `min_item_bytes` bytes on disk, and checks
    /// that the bytes left can hold that many before anyone allocates for them.
    pub(crate) fn count(
        &mut self,
        min_item_bytes: u64,
        field: impl Fn() -> String,
    ) -> Result<u64, GgufError> {
        let at = self.pos();
        let count = self.u64(&field)?;
        let available = self.remaining();
        let fits = count
            .checked_mul(min_item_bytes)
            .is_some_and(|need| need <= available);
        if !fits {
            return Err(GgufError::new(
                at,
                field(),
                GgufErrorKind::CountTooLarge {
                    count,
                    available,
                    min_item_bytes,
                },
            ));
        }
        Ok(count)
    }
}
