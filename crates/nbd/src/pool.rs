//! The server-wide pool of large-request buffers (see the crate docs, "Memory").

use std::sync::{Condvar, Mutex, MutexGuard};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The server-wide pool of large-request buffers: at most `limit` bytes allocated (in use or
/// kept free for reuse); a request that does not fit waits for one to come back.
pub(crate) struct BufferPool {
    limit: usize,
    state: Mutex<PoolState>,
    returned: Condvar,
}

#[derive(Default)]
struct PoolState {
    /// Bytes of all buffers, free or in use.
    allocated: usize,
    peak: usize,
    waits: u64,
    /// Threads blocked in `take` right now (a return wakes them only if there are any).
    waiting: usize,
    free: Vec<Vec<u8>>,
}

impl BufferPool {
    pub(crate) fn new(limit: usize) -> BufferPool {
        BufferPool {
            limit,
            state: Mutex::new(PoolState::default()),
            returned: Condvar::new(),
        }
    }

    /// A buffer of at least `len` bytes (`len` ≤ `limit`, checked at build time); blocks
    /// while the pool is exhausted. Give it back with [`BufferPool::give`].
    pub(crate) fn take(&self, len: usize) -> Vec<u8> {
        debug_assert!(len <= self.limit);
        let mut st = lock(&self.state);
        let mut waited = false;
        loop {
            // Best fit among the free buffers.
            let best = st
                .free
                .iter()
                .enumerate()
                .filter(|(_, b)| b.len() >= len)
                .min_by_key(|(_, b)| b.len())
                .map(|(i, _)| i);
            if let Some(i) = best {
                return st.free.swap_remove(i);
            }
            // Make room by dropping free buffers that are too small.
            while st.allocated + len > self.limit {
                let Some(b) = st.free.pop() else { break };
                st.allocated -= b.len();
            }
            if st.allocated + len <= self.limit {
                st.allocated += len;
                st.peak = st.peak.max(st.allocated);
                drop(st);
                return vec![0; len];
            }
            if !waited {
                waited = true;
                st.waits += 1;
            }
            st.waiting += 1;
            st = self.returned.wait(st).unwrap_or_else(|e| e.into_inner());
            st.waiting -= 1;
        }
    }

    /// Frees the pooled buffers not in use (when the server goes idle).
    pub(crate) fn trim(&self) {
        let free = {
            let mut st = lock(&self.state);
            let free = std::mem::take(&mut st.free);
            st.allocated -= free.iter().map(Vec::len).sum::<usize>();
            free
        };
        drop(free);
    }

    /// (bytes allocated now, peak bytes, requests that waited) for `stats`.
    pub(crate) fn usage(&self) -> (u64, u64, u64) {
        let st = lock(&self.state);
        (st.allocated as u64, st.peak as u64, st.waits)
    }

    pub(crate) fn give(&self, buf: Vec<u8>) {
        let mut st = lock(&self.state);
        st.free.push(buf);
        // Skips the futex call of every large request when nobody waits.
        if st.waiting > 0 {
            self.returned.notify_all();
        }
    }
}
