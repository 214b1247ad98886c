//! `kill -9` of the NBD server in the middle of a write + flush load, with the ciphertext
//! in a file, on a remote NBD export and on a Ceph RBD image: after reopening, every write
//! acknowledged before the last completed flush reads back, and nothing outside the writes
//! that were still unflushed changed. Also: the killed server's stale pid and control
//! socket files, its NBD socket and its image lock do not block reopening.

use crate::common::ceph::Cluster;
use crate::common::nbd::NbdClient;
use crate::common::{bin, ok, run_in, tool, wait_exited};
use std::collections::BTreeSet;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const SECTOR: usize = 4096;
/// Each write covers this many sectors (so a write cut short could tear across them).
const PER_WRITE: usize = 4;
const WRITE_LEN: usize = SECTOR * PER_WRITE;
/// Blocks (of WRITE_LEN) the load writes to, chosen pseudo-randomly.
const BLOCKS: usize = 256;
/// After the load region: a region nobody writes during the load.
const TAIL: usize = 64;
const BATCH: usize = 8;

/// A sector's content: one tag repeated; the tag names the write and the sector.
fn tag(seq: u64, sector: usize) -> u64 {
    (seq << 8) | sector as u64 | 0x5a5a_0000_0000_0000
}

fn block_data(seq: u64) -> Vec<u8> {
    let mut v = Vec::with_capacity(WRITE_LEN);
    for s in 0..PER_WRITE {
        for _ in 0..SECTOR / 8 {
            v.extend_from_slice(&tag(seq, s).to_le_bytes());
        }
    }
    v
}

fn block_of(seq: u64) -> usize {
    (seq.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40) as usize % BLOCKS
}

#[derive(Default)]
struct Log {
    /// Writes sent, in order: (seq, block). The last one may be unacknowledged.
    sent: Vec<(u64, usize)>,
    /// How many of `sent` were covered by the last flush that completed.
    flushed: usize,
    acked: usize,
}

fn run(args: &[&str]) -> std::process::Output {
    run_in(bin(), args, b"")
}

/// `extra`: options for the device (`--ceph-conf` for an RBD image).
fn open(img: &str, sock: &str, run_dir: &str, pw: &str, extra: &[&str]) {
    let nbd = format!("unix:{sock}");
    let mut args = vec![
        "open",
        img,
        "vol",
        "--nbd",
        &nbd,
        "--daemon",
        "--run-dir",
        run_dir,
        "--key-file",
        pw,
    ];
    args.extend(extra);
    ok(&run(&args));
}

fn pid_of(run_dir: &str) -> i32 {
    std::fs::read_to_string(format!("{run_dir}/vol.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// A 24 MiB image file in `dir`.
fn image(dir: &Path, name: &str) -> String {
    let img = dir.join(name);
    std::fs::File::create(&img)
        .unwrap()
        .set_len(24 << 20)
        .unwrap();
    img.to_str().unwrap().to_string()
}

#[test]
fn kill_9_under_write_and_flush_load_loses_nothing_flushed() {
    let dir = tempfile::tempdir().unwrap();
    kill_9_rounds(dir.path(), &image(dir.path(), "v.img"), &[], &[]);
}

/// The same on LUKS2 with integrity (issue 38: AES-GCM sectors over dm-integrity's layout,
/// written through its journal): nothing flushed is lost, and no sector fails its tag
/// afterwards (a torn block would read as EIO and fail the check).
#[test]
fn kill_9_with_integrity_loses_nothing_flushed_and_tears_no_sector() {
    let dir = tempfile::tempdir().unwrap();
    kill_9_rounds(
        dir.path(),
        &image(dir.path(), "v.img"),
        &[],
        &["--cipher", "aes-gcm-random", "--integrity", "aead"],
    );
}

/// The same on a standalone integrity volume in bitmap mode (`--type integrity -B`):
/// writes go straight home under the bitmap's marks, and the reopen after each kill
/// recalculates the marked regions' tags, so nothing flushed is lost and no block fails.
#[test]
fn kill_9_in_integrity_bitmap_mode_loses_nothing_flushed_and_fails_no_block() {
    let dir = tempfile::tempdir().unwrap();
    kill_9_rounds(
        dir.path(),
        &image(dir.path(), "v.img"),
        &["--type", "integrity", "-B"],
        &["--type", "integrity", "--sector-size", "4096"],
    );
}

/// The same with the volume's ciphertext on a remote NBD export (qemu-nbd serving a file):
/// what cryptblk acknowledged before a completed flush was flushed on the remote too.
#[test]
fn kill_9_over_a_remote_nbd_export_loses_nothing_flushed() {
    let dir = tempfile::tempdir().unwrap();
    let img = image(dir.path(), "remote.img");
    let rsock = dir.path().join("remote.sock");
    let mut remote = std::process::Command::new(tool("qemu-nbd", "qemu-utils"))
        .args([
            "--format",
            "raw",
            "--persistent",
            "--shared",
            "8",
            "--socket",
        ])
        .arg(&rsock)
        .arg(&img)
        // It reports every connection the killed server dropped.
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while !rsock.exists() {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "qemu-nbd did not come up"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    kill_9_rounds(
        dir.path(),
        &format!("nbd+unix:///?socket={}", rsock.display()),
        &[],
        &[],
    );
    let _ = remote.kill();
    let _ = remote.wait();
}

/// The same with the ciphertext on a Ceph RBD image (a throwaway single-node cluster):
/// what cryptblk acknowledged before a completed flush (`rbd_flush`, past librbd's
/// write-around cache) is on the OSD, and the killed server's exclusive lock does not keep
/// the new one out (librbd breaks a dead owner's lock once its watch has expired).
#[test]
fn kill_9_over_an_rbd_image_loses_nothing_flushed() {
    let dir = tempfile::tempdir().unwrap();
    let rbd = tool("rbd", "ceph-common");
    let cluster = Cluster::start(dir.path());
    ok(&run_in(
        &rbd,
        &["-c", &cluster.conf, "create", "--size", "24M", "rbd/v"],
        b"",
    ));
    kill_9_rounds(
        dir.path(),
        "rbd:rbd/v",
        &["--ceph-conf", &cluster.conf],
        &[],
    );
}

/// Formats `img` (a file, a remote export or an RBD image; `extra`: options the device
/// needs; `format_extra`: options for `format` only) and runs the kill -9 rounds on it.
fn kill_9_rounds(dir: &Path, img: &str, extra: &[&str], format_extra: &[&str]) {
    let p = |f: &str| dir.join(f).to_str().unwrap().to_string();
    let (pw, sock, run_dir) = (p("pw"), p("s.sock"), p("run"));
    std::fs::write(&pw, b"durability passphrase").unwrap();
    let img = img.to_string();
    if format_extra.starts_with(&["--type", "integrity"]) {
        // A standalone integrity volume: no passphrase, no KDF.
        let mut format = vec!["format", "-q"];
        format.extend(format_extra);
        format.push(&img);
        ok(&run(&format));
    } else {
        ok(&run(&[
            "format",
            "-q",
            "--type",
            "luks2",
            "--sector-size",
            "4096",
            "--pbkdf",
            "pbkdf2",
            "--pbkdf-force-iterations",
            "1000",
            "--key-file",
            &pw,
            &img,
        ]
        .into_iter()
        .chain(extra.iter().copied())
        .chain(format_extra.iter().copied())
        .collect::<Vec<_>>()));
    }
    open(&img, &sock, &run_dir, &pw, extra);

    // Known starting content everywhere the test looks: seq 0 in the load region, seq 1 in
    // the tail; flushed.
    let mut c = NbdClient::connect(&sock, "vol").unwrap();
    assert!(c.size as usize >= (BLOCKS + TAIL) * WRITE_LEN);
    let zero = block_data(0);
    for b in 0..BLOCKS {
        c.write((b * WRITE_LEN) as u64, &zero).unwrap().unwrap();
    }
    let tail = block_data(1);
    for b in BLOCKS..BLOCKS + TAIL {
        c.write((b * WRITE_LEN) as u64, &tail).unwrap().unwrap();
    }
    c.flush().unwrap().unwrap();
    c.disconnect();

    // Per sector of the load region: the tag it holds as of the last completed flush.
    let mut base: Vec<u64> = (0..BLOCKS * PER_WRITE)
        .map(|i| tag(0, i % PER_WRITE))
        .collect();
    let mut next_seq = 2u64;
    // Kill at different points of the write/flush cycle.
    for (round, delay_us) in [0u64, 700, 2300, 5100].into_iter().enumerate() {
        let log = Arc::new(Mutex::new(Log::default()));
        let flushes = Arc::new(AtomicU64::new(0));
        let load = {
            let (log, flushes, sock) = (log.clone(), flushes.clone(), sock.clone());
            std::thread::spawn(move || {
                let mut c = NbdClient::connect(&sock, "vol").unwrap();
                let mut seq = next_seq;
                loop {
                    for _ in 0..BATCH {
                        let b = block_of(seq);
                        log.lock().unwrap().sent.push((seq, b));
                        match c.write((b * WRITE_LEN) as u64, &block_data(seq)) {
                            Ok(Ok(())) => log.lock().unwrap().acked += 1,
                            Ok(Err(e)) => panic!("write error {e} while the server was alive"),
                            Err(_) => return,
                        }
                        seq += 1;
                    }
                    let n = log.lock().unwrap().sent.len();
                    match c.flush() {
                        Ok(Ok(())) => {
                            log.lock().unwrap().flushed = n;
                            flushes.fetch_add(1, Relaxed);
                        }
                        Ok(Err(e)) => panic!("flush error {e} while the server was alive"),
                        Err(_) => return,
                    }
                }
            })
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while flushes.load(Relaxed) < 50 {
            assert!(Instant::now() < deadline, "the load made no progress");
            std::thread::sleep(Duration::from_millis(2));
        }
        std::thread::sleep(Duration::from_micros(delay_us));
        let pid = pid_of(&run_dir);
        ok(&run_in(
            &tool("kill", "procps"),
            &["-9", &pid.to_string()],
            b"",
        ));
        load.join().unwrap();
        wait_exited(pid);
        // The dead server left its files behind; they must not stop a new one.
        assert!(Path::new(&format!("{run_dir}/vol.pid")).exists());
        assert!(Path::new(&format!("{run_dir}/vol.ctl")).exists());
        assert!(Path::new(&sock).exists());
        let st = run(&["status", "vol", "--run-dir", &run_dir]);
        assert!(!st.status.success(), "status of a dead server must fail");
        let t0 = Instant::now();
        open(&img, &sock, &run_dir, &pw, extra);
        eprintln!("round {round}: reopened in {:?}", t0.elapsed());
        assert_ne!(pid_of(&run_dir), pid, "a new server wrote its pid");

        let log = log.lock().unwrap();
        assert!(log.flushed >= 50 * BATCH, "{} flushed", log.flushed);
        assert!(log.acked >= log.flushed && log.sent.len() <= log.acked + 1);
        // What each sector held at the last completed flush, and what may have landed since.
        for &(seq, b) in &log.sent[..log.flushed] {
            for s in 0..PER_WRITE {
                base[b * PER_WRITE + s] = tag(seq, s);
            }
        }
        let mut later: Vec<BTreeSet<u64>> = vec![BTreeSet::new(); BLOCKS];
        for &(seq, b) in &log.sent[log.flushed..] {
            later[b].insert(seq);
        }
        next_seq = log.sent.last().map_or(next_seq, |&(seq, _)| seq + 1);
        let mut c = NbdClient::connect(&sock, "vol").unwrap();
        let all = c.read(0, (BLOCKS + TAIL) * WRITE_LEN).unwrap().unwrap();
        c.disconnect();
        let mut newer = 0;
        for (b, block) in all.chunks(WRITE_LEN).enumerate() {
            for (s, sector) in block.chunks(SECTOR).enumerate() {
                let t = u64::from_le_bytes(sector[..8].try_into().unwrap());
                assert!(
                    sector
                        .chunks(8)
                        .all(|w| u64::from_le_bytes(w.try_into().unwrap()) == t),
                    "round {round}: block {b} sector {s}: torn or garbage"
                );
                if b >= BLOCKS {
                    assert_eq!(t, tag(1, s), "round {round}: tail block {b} changed");
                    continue;
                }
                let i = b * PER_WRITE + s;
                if t != base[i] {
                    assert!(
                        later[b].iter().any(|&seq| t == tag(seq, s)),
                        "round {round}: block {b} sector {s}: lost the flushed {:#x} (holds {t:#x})",
                        base[i]
                    );
                    // An unflushed write that did land is the new baseline.
                    base[i] = t;
                    newer += 1;
                }
            }
        }
        eprintln!(
            "round {round}: kill -9 after {} writes ({} acknowledged, {} flushed); \
             {newer} sectors hold unflushed writes",
            log.sent.len(),
            log.acked,
            log.flushed,
        );
    }
    ok(&run(&["close", "vol", "--run-dir", &run_dir]));
    assert!(!Path::new(&format!("{run_dir}/vol.pid")).exists());
}
