//! A librbd client for the RBD benchmark (`scripts/bench-rbd.sh`): random reads or writes
//! of one size at a fixed queue depth (one thread per request in flight, each waiting on
//! librbd's asynchronous I/O as cryptblk's own threads do) on a plain image, or on one
//! reached through librbd's own LUKS encryption, which fio's rbd engine cannot load and
//! Ceph 16's `rbd bench` has no option for. Needs only librbd: no Python.
//!
//! ```text
//! rbd_load [--conf CEPH_CONF] IMAGE [--luks2 PASSFILE] COMMAND
//!   format-luks2                 format IMAGE with librbd's LUKS2 (AES-256), PASSFILE's key
//!   fill BYTE [MIB]              write BYTE over the first MIB MiB (default: all) in 4 MiB
//!   check BYTE [MIB]             read them back: exit 3 if a byte differs
//!   run read|write BS QD SECS [MIB]   random I/O over the first MIB MiB; prints MiB/s
//! ```
//! IMAGE is `POOL/NAME`; BYTE decimal or 0x-hex. Errors exit 1 (after closing the image,
//! so that its lock goes with it), usage errors 2.

use cryptblk_device::Storage;
use cryptblk_rbd::{LibrbdLuks, RbdOptions, RbdSpec, RbdStorage};
use std::path::PathBuf;
use std::process::exit;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

fn usage() -> ! {
    eprintln!(
        "usage: rbd_load [--conf CEPH_CONF] POOL/IMAGE [--luks2 PASSFILE] \
         format-luks2 | fill BYTE [MIB] | check BYTE [MIB] | run read|write BS QD SECS [MIB]"
    );
    exit(2)
}

fn fail(e: impl std::fmt::Display) -> ! {
    eprintln!("rbd_load: {e}");
    exit(1)
}

fn num(s: Option<&String>) -> u64 {
    s.and_then(|s| s.parse().ok()).unwrap_or_else(|| usage())
}

/// A byte value, decimal or 0x-hex.
fn byte(s: Option<&String>) -> u8 {
    let s = s.map(String::as_str).unwrap_or_else(|| usage());
    match s.strip_prefix("0x") {
        Some(h) => u8::from_str_radix(h, 16).ok(),
        None => s.parse().ok(),
    }
    .unwrap_or_else(|| usage())
}

/// The first MIB MiB (argument `i` of `rest`), or all `size` bytes without it.
fn span(rest: &[String], i: usize, size: u64) -> u64 {
    rest.get(i).map_or(size, |_| {
        num(rest.get(i))
            .checked_mul(1 << 20)
            .unwrap_or_else(|| usage())
            .min(size)
    })
}

fn main() {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let mut take = |flag: &str| {
        let i = args.iter().position(|a| a == flag)?;
        let v = args.get(i + 1).cloned().unwrap_or_else(|| usage());
        args.drain(i..i + 2);
        Some(v)
    };
    let options = RbdOptions {
        conf: take("--conf").map(PathBuf::from),
        ..Default::default()
    };
    let pass = take("--luks2").map(|f| {
        zeroize::Zeroizing::new(std::fs::read(&f).unwrap_or_else(|e| fail(format!("{f}: {e}"))))
    });
    let (Some(image), Some(cmd)) = (args.first(), args.get(1)) else {
        usage()
    };
    let spec = RbdSpec::parse(&format!("rbd:{image}")).unwrap_or_else(|e| fail(e));
    let rest = &args[2..];
    if cmd == "format-luks2" {
        let pass = pass.unwrap_or_else(|| usage());
        RbdStorage::librbd_encryption_format(&spec, &options, LibrbdLuks::Luks2, &pass)
            .unwrap_or_else(|e| fail(e));
        return;
    }
    let st = match &pass {
        Some(p) => {
            RbdStorage::open_through_librbd_encryption(&spec, &options, LibrbdLuks::Luks2, p)
        }
        None => RbdStorage::open(&spec, &options),
    }
    .unwrap_or_else(|e| fail(e));
    let size = st.size().unwrap_or_else(|e| fail(e));
    // Errors past this point close the image before the process exits.
    let result = work(&st, cmd, rest, size);
    let closed = st.close();
    match result {
        Ok(()) => closed.unwrap_or_else(|e| fail(e)),
        Err(Failure::Mismatch(why)) => {
            eprintln!("rbd_load: {why}");
            exit(3)
        }
        Err(Failure::Io(e)) => fail(e),
    }
}

enum Failure {
    Io(std::io::Error),
    Mismatch(String),
}

impl From<std::io::Error> for Failure {
    fn from(e: std::io::Error) -> Self {
        Failure::Io(e)
    }
}

fn work(st: &RbdStorage, cmd: &str, rest: &[String], size: u64) -> Result<(), Failure> {
    match cmd {
        "fill" | "check" => {
            let byte = byte(rest.first());
            let end = span(rest, 1, size);
            let mut buf = vec![0u8; 4 << 20];
            let mut off = 0;
            while off < end {
                let n = (end - off).min(buf.len() as u64) as usize;
                if cmd == "fill" {
                    buf[..n].fill(byte);
                    st.write_at(&buf[..n], off)?;
                } else {
                    st.read_at(&mut buf[..n], off)?;
                    if let Some(i) = buf[..n].iter().position(|&b| b != byte) {
                        return Err(Failure::Mismatch(format!(
                            "byte {} is {:#x}, not {byte:#x}",
                            off + i as u64,
                            buf[i]
                        )));
                    }
                }
                off += n as u64;
            }
            st.sync()?;
        }
        "run" => {
            let write = match rest.first().map(String::as_str) {
                Some("read") => false,
                Some("write") => true,
                _ => usage(),
            };
            let (bs, qd, secs) = (num(rest.get(1)), num(rest.get(2)), num(rest.get(3)));
            if bs == 0 || bs > 1 << 30 || qd == 0 || qd > 4096 || secs > 86_400 {
                usage()
            }
            let blocks = span(rest, 4, size) / bs;
            if blocks == 0 {
                usage()
            }
            let done = AtomicU64::new(0);
            // The first error stops every thread; it is reported once all are back.
            let failed = std::sync::Mutex::new(None);
            let stop = AtomicBool::new(false);
            let t0 = Instant::now();
            let end = t0 + Duration::from_secs(secs);
            std::thread::scope(|s| {
                for t in 0..qd {
                    let (done, failed, stop) = (&done, &failed, &stop);
                    s.spawn(move || {
                        let mut buf = vec![0x5au8; bs as usize];
                        // xorshift64, a stream per thread.
                        let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ (t + 1).wrapping_mul(0x2545_f491);
                        while !stop.load(Relaxed) && Instant::now() < end {
                            x ^= x << 13;
                            x ^= x >> 7;
                            x ^= x << 17;
                            let off = (x % blocks) * bs;
                            let r = if write {
                                st.write_at(&buf, off)
                            } else {
                                st.read_at(&mut buf, off)
                            };
                            if let Err(e) = r {
                                stop.store(true, Relaxed);
                                failed
                                    .lock()
                                    .unwrap_or_else(|p| p.into_inner())
                                    .get_or_insert(e);
                                return;
                            }
                            done.fetch_add(1, Relaxed);
                        }
                    });
                }
            });
            let failed = failed.into_inner().unwrap_or_else(|p| p.into_inner());
            if let Some(e) = failed {
                return Err(e.into());
            }
            let mib = (done.load(Relaxed) * bs) as f64 / t0.elapsed().as_secs_f64() / 1048576.0;
            println!("{mib:.0}");
        }
        _ => usage(),
    }
    Ok(())
}
