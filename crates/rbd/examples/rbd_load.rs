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
//!   check BYTE [MIB]             read them back: exit 1 if any byte differs
//!   run read|write BS QD SECS [MIB]   random I/O over the first MIB MiB; prints MiB/s
//! ```
//! IMAGE is `POOL/NAME`.

use cryptblk_device::Storage;
use cryptblk_rbd::{LibrbdLuks, RbdOptions, RbdSpec, RbdStorage};
use std::path::PathBuf;
use std::process::exit;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
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
    let span = |i: usize| {
        rest.get(i)
            .map_or(size, |_| (num(rest.get(i)) << 20).min(size))
    };
    match cmd.as_str() {
        "fill" | "check" => {
            let byte = num(rest.first()) as u8;
            let end = span(1);
            let mut buf = vec![0u8; 4 << 20];
            let mut off = 0;
            while off < end {
                let n = (end - off).min(buf.len() as u64) as usize;
                if cmd == "fill" {
                    buf[..n].fill(byte);
                    st.write_at(&buf[..n], off).unwrap_or_else(|e| fail(e));
                } else {
                    st.read_at(&mut buf[..n], off).unwrap_or_else(|e| fail(e));
                    if let Some(i) = buf[..n].iter().position(|&b| b != byte) {
                        fail(format!(
                            "byte {} is {:#x}, not {byte:#x}",
                            off + i as u64,
                            buf[i]
                        ));
                    }
                }
                off += n as u64;
            }
            st.sync().unwrap_or_else(|e| fail(e));
        }
        "run" => {
            let write = match rest.first().map(String::as_str) {
                Some("read") => false,
                Some("write") => true,
                _ => usage(),
            };
            let (bs, qd, secs) = (num(rest.get(1)), num(rest.get(2)), num(rest.get(3)));
            let blocks = span(4) / bs.max(1);
            if bs == 0 || qd == 0 || blocks == 0 {
                usage()
            }
            let done = AtomicU64::new(0);
            let t0 = Instant::now();
            let end = t0 + Duration::from_secs(secs);
            std::thread::scope(|s| {
                for t in 0..qd {
                    let (st, done) = (&st, &done);
                    s.spawn(move || {
                        let mut buf = vec![0x5au8; bs as usize];
                        // xorshift64, a stream per thread.
                        let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ (t + 1).wrapping_mul(0x2545_f491);
                        while Instant::now() < end {
                            x ^= x << 13;
                            x ^= x >> 7;
                            x ^= x << 17;
                            let off = (x % blocks) * bs;
                            let r = if write {
                                st.write_at(&buf, off)
                            } else {
                                st.read_at(&mut buf, off)
                            };
                            r.unwrap_or_else(|e| fail(e));
                            done.fetch_add(1, Relaxed);
                        }
                    });
                }
            });
            let mib = (done.load(Relaxed) * bs) as f64 / t0.elapsed().as_secs_f64() / 1048576.0;
            println!("{mib:.0}");
        }
        _ => usage(),
    }
    st.close().unwrap_or_else(|e| fail(e));
}
