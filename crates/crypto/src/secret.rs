//! Key material that is zeroized on drop, locked in RAM where the kernel allows, and never printed.

use std::fmt;
use std::ops::{Deref, DerefMut};
use zeroize::Zeroize;

/// A heap buffer for keys and passphrases.
///
/// The allocation never moves (it is a boxed slice that is never resized), so the
/// `mlock` taken on creation covers the key for its whole life. Locking is best-effort:
/// an unprivileged process with a small `RLIMIT_MEMLOCK` still works, just without it.
pub struct SecretBytes {
    buf: Box<[u8]>,
    locked: bool,
}

impl SecretBytes {
    /// A zero-filled secret of `len` bytes.
    pub fn zeroed(len: usize) -> Self {
        let buf = vec![0u8; len].into_boxed_slice();
        let locked = lock(&buf);
        SecretBytes { buf, locked }
    }

    /// Copies `data` into a new secret. The caller stays responsible for wiping `data`.
    pub fn from_slice(data: &[u8]) -> Self {
        let mut s = Self::zeroed(data.len());
        s.buf.copy_from_slice(data);
        s
    }

    /// Takes a vector, wiping the vector's own buffer after the copy.
    pub fn from_vec(mut data: Vec<u8>) -> Self {
        let s = Self::from_slice(&data);
        data.zeroize();
        s
    }

    /// A secret filled from the operating system's random source.
    pub fn random(len: usize) -> crate::Result<Self> {
        let mut s = Self::zeroed(len);
        crate::random_bytes(&mut s.buf)?;
        Ok(s)
    }

    /// Whether `mlock` succeeded for this buffer.
    pub fn is_locked(&self) -> bool {
        self.locked
    }
}

fn lock(buf: &[u8]) -> bool {
    if buf.is_empty() {
        return false;
    }
    // SAFETY: mlock only reads the address range, which is a live allocation owned by the caller.
    unsafe { libc::mlock(buf.as_ptr().cast(), buf.len()) == 0 }
}

impl Drop for SecretBytes {
    fn drop(&mut self) {
        self.buf.zeroize();
        if self.locked {
            // SAFETY: the range was locked by `lock` on this same allocation, still alive here.
            unsafe {
                libc::munlock(self.buf.as_ptr().cast(), self.buf.len());
            }
        }
    }
}

impl Clone for SecretBytes {
    fn clone(&self) -> Self {
        Self::from_slice(&self.buf)
    }
}

impl Deref for SecretBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.buf
    }
}

impl DerefMut for SecretBytes {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.buf
    }
}

impl PartialEq for SecretBytes {
    /// Constant-time in the contents (length is not secret).
    fn eq(&self, other: &Self) -> bool {
        constant_time_eq(&self.buf, &other.buf)
    }
}

impl fmt::Debug for SecretBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SecretBytes([REDACTED; {}])", self.buf.len())
    }
}

/// Compares two byte strings without an early exit on the first difference.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_never_shows_bytes() {
        let s = SecretBytes::from_slice(b"hunter2");
        let d = format!("{s:?}");
        assert!(!d.contains("hunter2") && !d.contains("104"), "{d}");
        assert_eq!(&s[..], b"hunter2");
    }

    #[test]
    fn random_differs() {
        let a = SecretBytes::random(32).unwrap();
        let b = SecretBytes::random(32).unwrap();
        assert_ne!(a, b);
        assert!(constant_time_eq(&a, &a.clone()));
    }
}
