//! A handled signal (what SIGTERM/SIGINT handlers, profilers and debuggers deliver) landing
//! on the I/O threads at any moment must never cost an error or a wrong byte: every read
//! returns exactly what was last written there, on every engine, buffered and O_DIRECT.

#![allow(unsafe_code)]

use cryptblk_crypto::{CipherSpec, IvOptions};
use cryptblk_device::BlockDevice;
use cryptblk_volume::{FileIo, IoEngine, VolumeParams, open_plain_with};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, mpsc};

thread_local! {
    /// Signals handled on this thread (const-initialised, no destructor: safe to touch in
    /// a signal handler).
    static HANDLED: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

extern "C" fn on_signal(_: libc::c_int) {
    HANDLED.with(|h| h.set(h.get() + 1));
}

/// SIGUSR1 handled, without SA_RESTART: blocking calls see EINTR, as with a handler that
/// a host program or a profiler installs.
fn install_handler() {
    // SAFETY: a zeroed sigaction is valid; the handler only does an atomic add, which is
    // async-signal-safe; sa_mask is emptied before use.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_signal as *const () as usize;
        libc::sigemptyset(&mut sa.sa_mask);
        sa.sa_flags = 0;
        assert_eq!(libc::sigaction(libc::SIGUSR1, &sa, std::ptr::null_mut()), 0);
    }
}

const REGION: u64 = 8 << 20;
const BLOCK: usize = 64 << 10;
const THREADS: usize = 3;
/// Each I/O thread runs until it has done this many operations and handled this many
/// signals (or for `LIMIT` at most, which then fails the test: it proved nothing).
const OPS: u64 = 1500;
const SIGNALS: u64 = 200;
const LIMIT: std::time::Duration = std::time::Duration::from_secs(20);

fn pattern(thread: usize, block: u64, generation: u64) -> Vec<u8> {
    let mut v = vec![0u8; BLOCK];
    for (i, c) in v.chunks_mut(8).enumerate() {
        let w = (thread as u64) << 56 ^ block << 40 ^ generation << 20 ^ i as u64;
        c.copy_from_slice(&w.to_le_bytes());
    }
    v
}

fn run(engine: IoEngine, direct: bool) {
    install_handler();
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let path = dir.path().join("img");
    std::fs::File::create(&path)
        .unwrap()
        .set_len(REGION * THREADS as u64 + 4096)
        .unwrap();
    let params = VolumeParams {
        cipher: CipherSpec::parse("aes-xts-plain64").unwrap(),
        sector_size: 4096,
        iv: IvOptions {
            large_sectors: true,
            offset: 0,
        },
        data_offset: 4096,
        data_length: None,
        read_only: false,
        allow_discards: false,
    };
    let key: Vec<u8> = (100..164u8).collect();
    let io = FileIo { engine, direct };
    let vol = match open_plain_with(&path, &key, &params, io) {
        Ok(v) => Arc::new(v),
        Err(e) if direct => {
            eprintln!(
                "NOT RUN: {engine:?} with O_DIRECT: the file system under {} refuses it ({e})",
                dir.path().display()
            );
            return;
        }
        Err(e) => panic!("{engine:?}: {e}"),
    };
    let stop = Arc::new(AtomicBool::new(false));
    let (tid_tx, tid_rx) = mpsc::channel();
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let (vol, tid_tx) = (vol.clone(), tid_tx.clone());
            std::thread::spawn(move || -> Result<(u64, u64), String> {
                // SAFETY: gettid has no preconditions.
                tid_tx.send(unsafe { libc::gettid() }).unwrap();
                let started = std::time::Instant::now();
                let blocks = REGION / BLOCK as u64;
                let mut generation = vec![0u64; blocks as usize];
                let mut rng = 0x9e37_79b9_7f4a_7c15u64 ^ t as u64;
                let mut back = vec![0u8; BLOCK];
                for b in 0..blocks {
                    vol.write_at(
                        &pattern(t, b, 0),
                        t as u64 * REGION + b * BLOCK as u64,
                        false,
                    )
                    .map_err(|e| format!("fill: {e}"))?;
                }
                let mut checked = 0;
                let mut op = 0u64;
                while (op < OPS || HANDLED.with(|h| h.get()) < SIGNALS) && started.elapsed() < LIMIT
                {
                    op += 1;
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    let b = rng % blocks;
                    let at = t as u64 * REGION + b * BLOCK as u64;
                    if op.is_multiple_of(2) {
                        generation[b as usize] = op;
                        vol.write_at(&pattern(t, b, op), at, false)
                            .map_err(|e| format!("write {at}: {e}"))?;
                    } else {
                        vol.read_at(&mut back, at)
                            .map_err(|e| format!("read {at}: {e}"))?;
                        if back != pattern(t, b, generation[b as usize]) {
                            return Err(format!(
                                "thread {t}, op {op}: block {b} is not what was written there"
                            ));
                        }
                        checked += 1;
                    }
                }
                Ok((checked, HANDLED.with(|h| h.get())))
            })
        })
        .collect();
    drop(tid_tx);
    let tids: Vec<i32> = tid_rx.iter().take(THREADS).collect();
    let sender = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut sent = 0u64;
            while !stop.load(Relaxed) {
                for &tid in &tids {
                    // SAFETY: tgkill with our own pid and a thread of ours (it may have
                    // exited: ESRCH is harmless).
                    unsafe { libc::syscall(libc::SYS_tgkill, libc::getpid(), tid, libc::SIGUSR1) };
                    sent += 1;
                }
                std::thread::sleep(std::time::Duration::from_micros(30));
            }
            sent
        })
    };
    let results: Vec<_> = workers.into_iter().map(|w| w.join().unwrap()).collect();
    stop.store(true, Relaxed);
    let sent = sender.join().unwrap();
    for r in &results {
        if let Err(e) = r {
            panic!("{engine:?} direct={direct}: {e}");
        }
    }
    let done: Vec<(u64, u64)> = results.into_iter().map(Result::unwrap).collect();
    eprintln!(
        "{engine:?} direct={direct}: {sent} signals sent; (reads checked, signals handled) per I/O thread: {done:?}"
    );
    for (checked, handled) in done {
        assert!(checked >= OPS / 2);
        assert!(
            handled >= SIGNALS,
            "only {handled} signals reached an I/O thread in {LIMIT:?}: the test proved nothing"
        );
    }
}

#[test]
fn io_uring_survives_signals_buffered() {
    run(IoEngine::Uring, false);
}

#[test]
fn io_uring_survives_signals_direct() {
    run(IoEngine::Uring, true);
}

#[test]
fn psync_survives_signals_buffered() {
    run(IoEngine::Psync, false);
}

#[test]
fn psync_survives_signals_direct() {
    run(IoEngine::Psync, true);
}

#[test]
fn mmap_survives_signals() {
    run(IoEngine::Mmap, false);
}
