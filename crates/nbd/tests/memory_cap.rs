//! The server's memory stays under its stated cap when many clients send maximum-size
//! requests at once. Alone in its test binary so the process's peak RSS is the server's
//! (plus this file's clients, which share one payload buffer).

mod common;

use std::io::Read;
use std::sync::Arc;
use std::thread;

use common::{Client, Serving};
use cryptblk_device::{BlockDevice, MemoryDevice};
use cryptblk_nbd::proto::*;
use cryptblk_nbd::{MIN_MAX_BUFFER_BYTES, NbdServer};

const MIB: u64 = 1 << 20;

/// (VmRSS, VmHWM) of this process in bytes.
fn rss() -> (u64, u64) {
    let st = std::fs::read_to_string("/proc/self/status").unwrap();
    let field = |name: &str| {
        let line = st.lines().find(|l| l.starts_with(name)).unwrap();
        line.split_whitespace()
            .nth(1)
            .unwrap()
            .parse::<u64>()
            .unwrap()
            * 1024
    };
    (field("VmRSS:"), field("VmHWM:"))
}

#[test]
fn many_clients_with_max_size_requests_stay_under_the_buffer_cap() {
    const CLIENTS: usize = 16;
    const THREADS: usize = 4;
    const MAX: usize = MAX_PAYLOAD as usize;
    let limit = 3 * MIN_MAX_BUFFER_BYTES; // about 96 MiB: room for 3 requests at a time
    let dev_size = 64 * MIB;
    let dev = Arc::new(MemoryDevice::new(dev_size, 512));
    // Touch the whole device now so its pages are in the baseline.
    dev.write_at(&vec![1u8; dev_size as usize], 0, false)
        .unwrap();
    let payload: Arc<Vec<u8>> = Arc::new((0..MAX).map(|i| (i / 4096) as u8 ^ 0xa5).collect());

    let srv = Serving::start(
        NbdServer::builder()
            .export("disk", dev.clone())
            .threads_per_connection(THREADS)
            .max_buffer_bytes(limit)
            .build()
            .unwrap(),
    );
    let path = srv.path.clone();
    let (base_rss, _) = rss();

    // Every client pipelines THREADS maximum-size writes, then THREADS maximum-size reads:
    // without a cap the server would hold CLIENTS × THREADS × 32 MiB = 2 GiB of buffers.
    let clients: Vec<_> = (0..CLIENTS)
        .map(|k| {
            let (path, payload) = (path.clone(), payload.clone());
            thread::spawn(move || {
                let mut c = Client::connect(&path);
                let off = |j: usize| ((k + j) % 2) as u64 * (dev_size / 2);
                let cookies: Vec<u64> = (0..THREADS)
                    .map(|j| c.send(CMD_WRITE, off(j), MAX as u32, &payload))
                    .collect();
                let mut got: Vec<u64> = (0..THREADS)
                    .map(|_| {
                        let (err, cookie) = c.reply();
                        assert_eq!(err, 0);
                        cookie
                    })
                    .collect();
                got.sort();
                assert_eq!(got, cookies);
                for j in 0..THREADS {
                    c.send(CMD_READ, off(j), MAX as u32, &[]);
                }
                // Read the data through a small buffer and compare as it comes.
                let mut scratch = vec![0u8; 1 << 20];
                for _ in 0..THREADS {
                    let (err, _) = c.reply();
                    assert_eq!(err, 0);
                    for chunk in payload.chunks(scratch.len()) {
                        c.s.read_exact(&mut scratch[..chunk.len()]).unwrap();
                        assert!(scratch[..chunk.len()] == *chunk);
                    }
                }
                c.disconnect();
            })
        })
        .collect();
    for c in clients {
        c.join().unwrap();
    }
    let (_, peak_rss) = rss();
    let st = srv.handle.stats();
    let handle = srv.stop();
    assert_eq!(
        handle.stats().buffer_bytes,
        0,
        "pooled buffers are freed once no client is connected"
    );

    assert_eq!(st.writes, (CLIENTS * THREADS) as u64);
    assert_eq!(st.reads, (CLIENTS * THREADS) as u64);
    assert!(
        st.buffer_bytes_peak as usize <= limit,
        "pool peak {} over the cap {limit}",
        st.buffer_bytes_peak
    );
    assert!(
        st.buffer_waits > 0,
        "the load never hit the cap, so it proved nothing: {st:?}"
    );
    // Process peak over the baseline: the pool, the small per-thread buffers and stacks.
    let fixed = CLIENTS as u64 * (THREADS as u64 + 1) * (128 << 10);
    let slack = 32 * MIB;
    let grew = peak_rss.saturating_sub(base_rss);
    eprintln!(
        "memory cap: pool peak {} MiB (cap {} MiB), process RSS {} -> peak {} MiB (+{} MiB), \
         {} requests waited for buffers",
        st.buffer_bytes_peak >> 20,
        limit >> 20,
        base_rss >> 20,
        peak_rss >> 20,
        grew >> 20,
        st.buffer_waits
    );
    assert!(
        grew <= limit as u64 + fixed + slack,
        "RSS grew by {} MiB, more than the cap {} MiB + {} MiB",
        grew >> 20,
        limit >> 20,
        (fixed + slack) >> 20
    );
}
