//! The server's memory stays under its stated cap when many clients send maximum-size
//! requests at once, to a memory device and to a real encrypted `Volume` with unaligned
//! requests (whose read-modify-write must not grow per-thread buffers to the request
//! size). Alone in its test binary so the process's peak RSS is the server's (plus this
//! file's clients, which share one payload buffer); the two cases run one after the other
//! in one test, the peak reset between them.

mod common;

use std::io::Read;
use std::sync::Arc;
use std::thread;

use common::{Client, Serving};
use cryptblk_crypto::{CipherSpec, IvOptions};
use cryptblk_device::{BlockDevice, MemoryDevice};
use cryptblk_nbd::proto::*;
use cryptblk_nbd::{MIN_MAX_BUFFER_BYTES, NbdServer};
use cryptblk_volume::{MemStorage, VolumeParams, volume_from_key};

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

/// Resets this process's peak RSS (VmHWM) to its current RSS.
fn reset_peak() {
    std::fs::write("/proc/self/clear_refs", "5").unwrap();
}

const DEV_SIZE: u64 = 64 * MIB;

#[test]
fn many_clients_with_max_size_requests_stay_under_the_buffer_cap() {
    let dev = Arc::new(MemoryDevice::new(DEV_SIZE, 512));
    run(dev, 0, MAX_PAYLOAD as usize, 0);

    // A real volume (4096-byte sectors), requests one byte off the sector grid: every one
    // is a read-modify-write. Per-thread buffers of the volume are bounded (128 KiB).
    let params = VolumeParams {
        cipher: CipherSpec::parse("aes-xts-plain64").unwrap(),
        sector_size: 4096,
        iv: IvOptions {
            large_sectors: true,
            offset: 0,
        },
        data_offset: 0,
        data_length: None,
        read_only: false,
        allow_discards: false,
    };
    let key: Vec<u8> = (0..64u8).collect();
    let vol = volume_from_key(Box::new(MemStorage::new(DEV_SIZE)), &key, &params).unwrap();
    reset_peak();
    run(Arc::new(vol), 1, MAX_PAYLOAD as usize - 8192, 128 << 10);
}

/// CLIENTS clients pipeline THREADS writes of `max` bytes at `misalign` past 0 or half the
/// device, then read them back; `per_thread` is what the device may keep per thread.
fn run(dev: Arc<dyn BlockDevice>, misalign: u64, max: usize, per_thread: u64) {
    const CLIENTS: usize = 16;
    const THREADS: usize = 4;
    let limit = 3 * MIN_MAX_BUFFER_BYTES; // about 96 MiB: room for 3 requests at a time
    let dev_size = DEV_SIZE;
    // Touch the whole device now so its pages are in the baseline.
    dev.write_at(&vec![1u8; dev_size as usize], 0, false)
        .unwrap();
    let payload: Arc<Vec<u8>> = Arc::new((0..max).map(|i| (i / 4096) as u8 ^ 0xa5).collect());

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
                let off = |j: usize| ((k + j) % 2) as u64 * (dev_size / 2) + misalign;
                let cookies: Vec<u64> = (0..THREADS)
                    .map(|j| c.send(CMD_WRITE, off(j), max as u32, &payload))
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
                    c.send(CMD_READ, off(j), max as u32, &[]);
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
    // Process peak over the baseline: the pool, the small per-thread buffers and stacks,
    // and what the device keeps per thread.
    let fixed = CLIENTS as u64 * (THREADS as u64 + 1) * (128 << 10)
        + CLIENTS as u64 * THREADS as u64 * per_thread;
    let slack = 32 * MIB;
    let grew = peak_rss.saturating_sub(base_rss);
    eprintln!(
        "memory cap (misalign {misalign}): pool peak {} MiB (cap {} MiB), process RSS {} -> peak {} MiB (+{} MiB), \
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
