//! Random IVs for the authenticated sector modes (`*-random`), at the speed of the sectors
//! they go with. A getrandom(2) call per request had the kernel's ChaCha20, one block at a
//! time, take ~20 % of AEGIS-128 sealing; dm-crypt itself draws them from the kernel's
//! in-kernel generator. This is the same construction in userspace: a ChaCha20 keystream
//! per thread, keyed from getrandom, rekeyed after [`REKEY_AFTER`] bytes and whenever the
//! process id changes (a forked child never continues its parent's stream), so no two
//! threads or processes ever share one. IVs are not secret; they must not repeat, which a
//! 96- or 128-bit draw from an unpredictable stream ensures as getrandom's own would.

use crate::Result;
use chacha20::ChaCha20;
use chacha20::cipher::{KeyIvInit, StreamCipher};
use std::cell::RefCell;
use zeroize::Zeroizing;

/// Keystream bytes one key gives before a fresh one is drawn (65,536 16-byte IVs).
const REKEY_AFTER: usize = 1 << 20;

struct Stream {
    cipher: ChaCha20,
    pid: u32,
    left: usize,
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
    STREAM.with(|cell| {
        let mut slot = cell.borrow_mut();
        let pid = std::process::id();
        let fresh = match &*slot {
            Some(s) => s.pid != pid || s.left < buf.len(),
            None => true,
        };
        if fresh {
            let mut key = Zeroizing::new([0u8; 32]);
            crate::random_bytes(&mut key[..])?;
            *slot = Some(Stream {
                cipher: ChaCha20::new(&(*key).into(), &[0u8; 12].into()),
                pid,
                left: REKEY_AFTER,
            });
        }
        let s = slot.as_mut().expect("set above");
        buf.fill(0);
        s.cipher.apply_keystream(buf);
        s.left -= buf.len();
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
}
