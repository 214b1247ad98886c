//! Random IVs for the authenticated sector modes (`*-random`), at the speed of the sectors
//! they go with. A getrandom(2) call per request had the kernel's ChaCha20, one block at a
//! time, take ~20 % of AEGIS-128 sealing; dm-crypt itself draws them from the kernel's
//! in-kernel generator. This is the same construction in userspace: a ChaCha keystream per
//! thread, keyed from getrandom, rekeyed after [`REKEY_AFTER`] bytes and after a fork (a
//! forked child never continues its parent's stream), so no two threads or processes ever
//! share one. IVs are not secret; they must not repeat, which a 96- or 128-bit draw from an
//! unpredictable stream ensures as getrandom's own would. ChaCha12, as rand's `StdRng`:
//! ChaCha20's eight more rounds cost ~7 % of AEGIS-128 sealing and buy no margin an IV
//! needs.
//!
//! A fork is told by [`crate::secret::fork_generation`] (a `MADV_WIPEONFORK` page): a load
//! per draw, where asking getpid(2) each time (the first version) cost a system call, a
//! fifth of sealing a one-sector request. The keystream is made a few blocks at a time and
//! handed out from a buffer, so a sector's IV is a copy, not a cipher call.

use crate::Result;
use chacha20::ChaCha12;
use chacha20::cipher::{KeyIvInit, StreamCipher};
use std::cell::RefCell;
use zeroize::Zeroizing;

/// Keystream bytes one key gives before a fresh one is drawn (65,536 16-byte IVs).
const REKEY_AFTER: usize = 1 << 20;

/// Keystream made at once: four ChaCha blocks (what its AVX2 code makes in one go).
const BUFFERED: usize = 256;

struct Stream {
    cipher: ChaCha12,
    /// The fork generation (or, on the fallback, the process id) it was keyed in.
    generation: u64,
    /// Keystream bytes left under this key, the buffer's included.
    left: usize,
    buf: [u8; BUFFERED],
    /// Where the unused part of `buf` starts.
    at: usize,
}

thread_local! {
    static STREAM: RefCell<Option<Stream>> = const { RefCell::new(None) };
}

/// Fills `buf` with unpredictable bytes for IVs (from getrandom directly when it is larger
/// than a key's share).
pub(crate) fn fill(buf: &mut [u8]) -> Result<()> {
    if buf.len() > REKEY_AFTER {
        return crate::random_bytes(buf);
    }
    let len = buf.len();
    fill_slots(buf, len.max(1), 0, len)
}

/// Fills the `len` bytes at `at` of every `stride`-byte record of `buf` (a request's
/// sector tags, each with its IV at the same place), in one visit to this thread's stream.
pub(crate) fn fill_slots(buf: &mut [u8], stride: usize, at: usize, len: usize) -> Result<()> {
    debug_assert!(at + len <= stride);
    let total = buf.len() / stride * len;
    if total > REKEY_AFTER {
        for record in buf.chunks_exact_mut(stride) {
            fill(&mut record[at..][..len])?;
        }
        return Ok(());
    }
    STREAM.with(|cell| {
        let mut slot = cell.borrow_mut();
        let generation = crate::secret::fork_generation();
        let fresh = match &*slot {
            Some(s) => s.generation != generation || s.left < total,
            None => true,
        };
        if fresh {
            let mut key = Zeroizing::new([0u8; 32]);
            crate::random_bytes(&mut key[..])?;
            *slot = Some(Stream {
                cipher: ChaCha12::new(&(*key).into(), &[0u8; 12].into()),
                generation,
                left: REKEY_AFTER,
                buf: [0; BUFFERED],
                at: BUFFERED,
            });
        }
        let s = slot.as_mut().expect("set above");
        s.left -= total;
        for record in buf.chunks_exact_mut(stride) {
            let mut out = &mut record[at..][..len];
            while !out.is_empty() {
                if s.at == BUFFERED {
                    s.buf = [0; BUFFERED];
                    s.cipher.apply_keystream(&mut s.buf);
                    s.at = 0;
                }
                let n = out.len().min(BUFFERED - s.at);
                out[..n].copy_from_slice(&s.buf[s.at..][..n]);
                // Handed out once only.
                s.buf[s.at..][..n].fill(0);
                s.at += n;
                out = &mut out[n..];
            }
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_differ_and_rekey_keeps_going() {
        let mut seen = std::collections::HashSet::new();
        // More than a key's share, in IV-sized draws: every draw is new.
        for _ in 0..(REKEY_AFTER / 16 + 100) {
            let mut iv = [0u8; 16];
            fill(&mut iv).unwrap();
            assert!(seen.insert(iv), "an IV repeated");
        }
        let mut big = vec![0u8; REKEY_AFTER + 1];
        fill(&mut big).unwrap();
        assert!(big.iter().any(|&b| b != 0));
    }

    #[test]
    fn threads_get_their_own_streams() {
        let draw = || {
            let mut b = [0u8; 32];
            fill(&mut b).unwrap();
            b
        };
        let a = std::thread::spawn(draw).join().unwrap();
        let b = std::thread::spawn(draw).join().unwrap();
        assert_ne!(a, b);
    }

    #[test]
    fn slots_get_fresh_bytes_and_the_rest_is_left_alone() {
        let mut tags = vec![0xeeu8; 28 * 40];
        fill_slots(&mut tags, 28, 16, 12).unwrap();
        let mut seen = std::collections::HashSet::new();
        for record in tags.chunks_exact(28) {
            assert!(
                record[..16].iter().all(|&b| b == 0xee),
                "a tag byte was touched"
            );
            assert!(seen.insert(record[16..].to_vec()), "an IV repeated");
        }
    }
}
