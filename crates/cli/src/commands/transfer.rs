//! `export` / `import`: plaintext of a volume to or from a file, without root or a kernel
//! mapping (recovery, scripting, and the dm-crypt interop tests).

use crate::args::VolumeArgs;
use crate::ctx::Ctx;
use crate::error::{CliError, CliResult, io_err};
use crate::unlock::open_volume;
use clap::Args;
use cryptblk_device::BlockDevice;
use cryptblk_volume::Volume;
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, mpsc};

#[derive(Args, Debug)]
pub(crate) struct TransferArgs {
    pub device: PathBuf,
    /// File to write (export) or read (import); "-" for stdout/stdin.
    pub file: PathBuf,
    #[command(flatten)]
    pub vol: VolumeArgs,
    /// Byte offset within the plaintext volume.
    #[arg(long = "at", default_value_t = 0)]
    pub at: u64,
    /// Bytes to export (default: to the end of the volume).
    #[arg(long)]
    pub length: Option<u64>,
    /// Bytes per request to the volume, four requests in flight: a multiple of 4K from 4K
    /// to 64M, K/M suffixes (what a remote NBD server or RBD sees; their largest request
    /// may be smaller).
    #[arg(long = "request-size", default_value = "1M", value_parser = parse_request_size)]
    pub request_size: usize,
}

/// `--request-size`: a multiple of 4 KiB from 4 KiB to 64 MiB (so that, from an aligned
/// `--at`, requests meet at sector boundaries: neighbours sharing a sector would make each
/// boundary a read-modify-write under the volume's lock).
fn parse_request_size(s: &str) -> Result<usize, String> {
    let n = crate::units::parse_size(s)?;
    if !(MIN_REQUEST..=MAX_REQUEST).contains(&n) || !n.is_multiple_of(MIN_REQUEST) {
        return Err(format!(
            "request size {n} is not a multiple of 4K from 4K to 64M"
        ));
    }
    Ok(n as usize)
}

fn open(ctx: &Ctx, a: &TransferArgs, read_only: bool) -> CliResult<Volume> {
    let mut v = a.vol.clone();
    v.read_only |= read_only;
    let o = open_volume(ctx, &a.device, &v)?;
    if ctx.verbose {
        let slot = o
            .info
            .keyslot
            .map(|s| format!(", key slot {s}"))
            .unwrap_or_default();
        eprintln!(
            "{}: {} {}, {} bits{slot}",
            a.device.display(),
            o.info.kind,
            o.volume.cipher_summary().spec,
            o.info.key_bits
        );
    }
    Ok(o.volume)
}

/// Bounds of `--request-size` (default 1 MiB).
const MIN_REQUEST: u64 = 4 << 10;
const MAX_REQUEST: u64 = 64 << 20;
/// Requests in flight at once, each on a thread of its own. On a volume over NBD or RBD one
/// request at a time waits a round trip per MiB (and uses one of the connections
/// multi-conn gives); on a local one the cipher then runs on several cores.
const DEPTH: usize = 4;

pub(crate) fn export(ctx: &Ctx, a: TransferArgs) -> CliResult<()> {
    let vol = open(ctx, &a, true)?;
    let end = match a.length {
        Some(n) => {
            a.at.checked_add(n)
                .filter(|&e| e <= vol.size())
                .ok_or_else(|| CliError::usage("range past the end of the volume"))?
        }
        None if a.at <= vol.size() => vol.size(),
        None => return Err(CliError::usage("--at is past the end of the volume")),
    };
    let mut out: Box<dyn Write> = if a.file.as_os_str() == "-" {
        Box::new(std::io::stdout().lock())
    } else {
        Box::new(std::fs::File::create(&a.file).map_err(|e| io_err(&a.file, e))?)
    };
    let mut progress = crate::progress::Progress::new(ctx, "export", Some(end - a.at));
    read_in_order(&vol, a.at, end, a.request_size, |bytes| {
        out.write_all(bytes).map_err(|e| io_err(&a.file, e))?;
        progress.add(bytes.len() as u64);
        Ok(())
    })
    .map_err(|e| match e {
        Failure::Device(e) => io_err(&a.device, e),
        Failure::Sink(e) => e,
    })?;
    out.flush().map_err(|e| io_err(&a.file, e))?;
    progress.finish();
    Ok(())
}

/// Why a transfer stopped: the volume failed, or the other side (file, pipe) did.
enum Failure {
    Device(std::io::Error),
    Sink(CliError),
}

/// Reads `[start, end)` of `vol` in chunks of `chunk` bytes, up to `DEPTH` at once on
/// worker threads, and hands each to `sink` in order, on this thread.
fn read_in_order(
    vol: &Volume,
    start: u64,
    end: u64,
    chunk: usize,
    mut sink: impl FnMut(&[u8]) -> CliResult<()>,
) -> Result<(), Failure> {
    let count = (end - start).div_ceil(chunk as u64);
    let next = AtomicU64::new(0);
    // Filled buffers (chunk number, buffer, result) to this thread; empty ones back.
    let (done_tx, done_rx) = mpsc::sync_channel::<(u64, Vec<u8>, std::io::Result<()>)>(DEPTH);
    let (free_tx, free_rx) = mpsc::channel::<Vec<u8>>();
    let free_rx = Mutex::new(free_rx);
    std::thread::scope(|s| {
        // Owned here, so that returning (early too) drops them and stops the workers.
        let (done_tx, done_rx, free_tx) = (done_tx, done_rx, free_tx);
        let workers = DEPTH.min(count as usize);
        for _ in 0..workers {
            free_tx.send(vec![0u8; chunk]).expect("receiver alive");
            let (done_tx, free_rx, next) = (done_tx.clone(), &free_rx, &next);
            s.spawn(move || {
                loop {
                    // Ends when this thread stops waiting (it dropped the sender).
                    let Ok(mut buf) = lock(free_rx).recv() else {
                        return;
                    };
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= count {
                        return;
                    }
                    let pos = start + i * chunk as u64;
                    let n = (end - pos).min(chunk as u64) as usize;
                    // A panic must still answer for the chunk claimed: this thread waits
                    // for it, and the other workers for buffers it would hand back.
                    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        vol.read_at(&mut buf[..n], pos)
                    }));
                    let (r, panic) = match r {
                        Ok(r) => (r, None),
                        Err(p) => (Err(std::io::Error::other("read failed (panic)")), Some(p)),
                    };
                    let sent = done_tx.send((i, buf, r));
                    if let Some(p) = panic {
                        // Re-raised when the scope ends.
                        std::panic::resume_unwind(p);
                    }
                    if sent.is_err() {
                        return;
                    }
                }
            });
        }
        drop(done_tx);
        // Chunks that came back before the one to write next, with their results: an
        // error stops the export only in its turn, after every good chunk before it is out.
        let mut early: BTreeMap<u64, (Vec<u8>, std::io::Result<()>)> = BTreeMap::new();
        for want in 0..count {
            let buf = loop {
                if let Some((buf, r)) = early.remove(&want) {
                    r.map_err(Failure::Device)?;
                    break buf;
                }
                let (i, buf, r) = done_rx
                    .recv()
                    .expect("a worker stops before chunk `count` only when told to");
                early.insert(i, (buf, r));
            };
            let n = (end - start - want * chunk as u64).min(chunk as u64) as usize;
            sink(&buf[..n]).map_err(Failure::Sink)?;
            // The worker that gets it may find nothing left to read: then it stops.
            let _ = free_tx.send(buf);
        }
        Ok(())
        // Returning drops `free_tx` and `done_rx`: a worker still waiting stops.
    })
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

pub(crate) fn import(ctx: &Ctx, a: TransferArgs) -> CliResult<()> {
    let vol = open(ctx, &a, false)?;
    let chunk = a.request_size;
    let (mut input, size): (Box<dyn Read>, Option<u64>) = if a.file.as_os_str() == "-" {
        (Box::new(std::io::stdin().lock()), None)
    } else {
        let f = std::fs::File::open(&a.file).map_err(|e| io_err(&a.file, e))?;
        let size = f.metadata().ok().filter(|m| m.is_file()).map(|m| m.len());
        (Box::new(f), size)
    };
    let mut progress = crate::progress::Progress::new(ctx, "import", size);
    // Filled buffers to the workers; empty ones (or the write's error) back.
    let (work_tx, work_rx) = mpsc::sync_channel::<(u64, Vec<u8>, usize)>(DEPTH);
    let (free_tx, free_rx) = mpsc::channel::<std::io::Result<Vec<u8>>>();
    let work_rx = Mutex::new(work_rx);
    std::thread::scope(|s| -> CliResult<()> {
        // Owned here, so that returning (early too) drops them and stops the workers.
        let (work_tx, free_rx, free_tx) = (work_tx, free_rx, free_tx);
        for _ in 0..DEPTH {
            let (free_tx, work_rx, vol) = (free_tx.clone(), &work_rx, &vol);
            s.spawn(move || {
                loop {
                    // The lock only for the receive (a `while let` would hold it through
                    // the write). Ends when this thread has no more to write.
                    let Ok((pos, mut buf, n)) = lock(work_rx).recv() else {
                        return;
                    };
                    let r = vol.write_at_mut(&mut buf[..n], pos, false);
                    if free_tx.send(r.map(|()| buf)).is_err() {
                        return;
                    }
                }
            });
        }
        drop(free_tx);
        let device_err = |e| io_err(&a.device, e);
        let mut unallocated = DEPTH;
        let mut pos = a.at;
        loop {
            let mut buf = if unallocated > 0 {
                unallocated -= 1;
                vec![0u8; chunk]
            } else {
                free_rx
                    .recv()
                    .expect("workers run until the work channel closes")
                    .map_err(device_err)?
            };
            let mut n = 0;
            while n < chunk {
                match input.read(&mut buf[n..]) {
                    Ok(0) => break,
                    Ok(k) => n += k,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(io_err(&a.file, e)),
                }
            }
            if n == 0 {
                break;
            }
            if pos.checked_add(n as u64).is_none_or(|e| e > vol.size()) {
                return Err(CliError::usage(format!(
                    "input does not fit: the volume has {} bytes",
                    vol.size()
                )));
            }
            work_tx
                .send((pos, buf, n))
                .expect("workers run until the work channel closes");
            pos += n as u64;
            progress.add(n as u64);
        }
        // Every write done (the workers stop once the channel is closed and drained).
        drop(work_tx);
        for r in free_rx {
            r.map_err(device_err)?;
        }
        Ok(())
    })?;
    // Flushed and closed: a dm-integrity device in bitmap mode is left clean.
    vol.close().map_err(|e| io_err(&a.device, e))?;
    progress.finish();
    Ok(())
}
