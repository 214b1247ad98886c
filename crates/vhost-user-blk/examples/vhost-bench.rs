//! A vhost-user-blk load generator in the VM's place (the crate's client: shared memfd
//! memory, virtqueues, eventfds), for comparing backends without a VM:
//!
//! ```text
//! vhost-bench SOCKET [SECONDS [QUEUES]]
//! ```
//!
//! Runs the five workloads of scripts/peer-bench.sh on the disk at SOCKET, each for SECONDS
//! (default 3), and prints one line each: `name iops MiB/s`. With QUEUES (default 1) above
//! one, each workload's queue depth is spread over that many virtqueues, driven by this one
//! thread (the total in flight stays the workload's depth). Data written is random and not
//! checked (the tests check data; this measures).

use cryptblk_vhost_user_blk::client::{Client, ClientOptions, Request, kind, status};
use std::path::Path;
use std::time::{Duration, Instant};

/// fio's workloads of scripts/peer-bench.sh (the NBD benchmark), so the figures line up.
struct Workload {
    name: &'static str,
    /// Writes; with `mixed`, each request a read or a write at random (fio's `readwrite`).
    write: bool,
    mixed: bool,
    random: bool,
    bs: u32,
    depth: u16,
}

const WORKLOADS: &[Workload] = &[
    Workload {
        name: "4k-rw-qd1",
        write: false,
        mixed: true,
        random: false,
        bs: 4096,
        depth: 1,
    },
    Workload {
        name: "4k-randread-qd16",
        write: false,
        mixed: false,
        random: true,
        bs: 4096,
        depth: 16,
    },
    Workload {
        name: "4k-randwrite-qd16",
        write: true,
        mixed: false,
        random: true,
        bs: 4096,
        depth: 16,
    },
    Workload {
        name: "128k-read-qd8",
        write: false,
        mixed: false,
        random: false,
        bs: 128 << 10,
        depth: 8,
    },
    Workload {
        name: "128k-write-qd8",
        write: true,
        mixed: false,
        random: false,
        bs: 128 << 10,
        depth: 8,
    },
];

fn main() -> std::io::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let Some(socket) = args.get(1) else {
        eprintln!("usage: vhost-bench SOCKET [SECONDS [QUEUES]]");
        std::process::exit(2);
    };
    let secs: f64 = args
        .get(2)
        .map(|s| s.parse().expect("SECONDS"))
        .unwrap_or(3.0);
    let queues: u16 = args.get(3).map(|s| s.parse().expect("QUEUES")).unwrap_or(1);
    let qs: Vec<usize> = (0..usize::from(queues)).collect();
    // Slot `s` of a workload is slot `s / queues` of queue `s % queues`.
    let at = |s: u16| (usize::from(s % queues), s / queues);
    let opt = ClientOptions {
        queues,
        depth: 16,
        max_io: 128 << 10,
        event_idx: true,
    };
    let mut c = Client::connect(Path::new(socket), opt)?;
    let cap = c.capacity()?;
    // Random data in every slot, once.
    let mut x = 0x2545_f491_4f6c_dd1du64;
    for s in 0..16 {
        let (q, slot) = at(s);
        let buf: Vec<u8> = (0..128 << 10)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        c.write_mem(c.slot_data(q, slot), &buf)?;
    }
    for w in WORKLOADS {
        let blocks = cap / u64::from(w.bs);
        let mut seq = 0u64;
        let mut next = |x: &mut u64| {
            *x ^= *x << 13;
            *x ^= *x >> 7;
            *x ^= *x << 17;
            let b = if w.random {
                *x % blocks
            } else {
                seq = (seq + 1) % blocks;
                seq
            };
            let write = if w.mixed { *x >> 63 == 1 } else { w.write };
            (b * u64::from(w.bs) / 512, write)
        };
        let req = |(sector, write): (u64, bool)| Request {
            kind: if write { kind::OUT } else { kind::IN },
            sector,
            len: w.bs,
        };
        for q in &qs {
            let first: Vec<(u16, Request)> = (0..w.depth)
                .filter(|&s| at(s).0 == *q)
                .map(|s| (at(s).1, req(next(&mut x))))
                .collect();
            c.submit(*q, &first)?;
        }
        let (start, limit) = (Instant::now(), Duration::from_secs_f64(secs));
        let mut done = 0u64;
        let mut in_flight = usize::from(w.depth);
        while in_flight > 0 {
            for (q, comps) in c.wait_any(&qs)? {
                in_flight -= comps.len();
                let mut again = Vec::new();
                for comp in comps {
                    if comp.status != status::OK {
                        return Err(std::io::Error::other(format!(
                            "{}: status {}",
                            w.name, comp.status
                        )));
                    }
                    done += 1;
                    if start.elapsed() < limit {
                        again.push((comp.slot, req(next(&mut x))));
                    }
                }
                in_flight += again.len();
                if !again.is_empty() {
                    c.submit(q, &again)?;
                }
            }
        }
        let t = start.elapsed().as_secs_f64();
        let iops = done as f64 / t;
        println!(
            "{} {:.0} {:.1}",
            w.name,
            iops,
            iops * f64::from(w.bs) / (1 << 20) as f64
        );
    }
    Ok(())
}
