//! Drives the server with real NBD clients: nbdinfo, nbdcopy (libnbd-bin), qemu-img and
//! qemu-io (qemu-utils), fio (fio). A missing tool fails the test, naming its package.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::common::{Serving, run, tool, xts_4096_params};
use cryptblk_device::{BlockDevice, MemoryDevice};
use cryptblk_nbd::{NbdServer, ShutdownHandle};
use cryptblk_volume::{FileStorage, Volume, volume_from_key};
use std::path::Path;

const MIB: u64 = 1 << 20;

struct Running {
    dir: tempfile::TempDir,
    sock: PathBuf,
    dev: Arc<MemoryDevice>,
    handle: ShutdownHandle,
    thread: Option<JoinHandle<std::io::Result<()>>>,
}

impl Running {
    fn start(
        size: u64,
        block_size: u32,
        configure: impl FnOnce(cryptblk_nbd::NbdServerBuilder) -> cryptblk_nbd::NbdServerBuilder,
    ) -> Running {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("nbd.sock");
        let dev = Arc::new(MemoryDevice::new(size, block_size));
        let server = configure(
            NbdServer::builder()
                .export("disk", dev.clone())
                .description("cryptblk test disk"),
        )
        .build()
        .unwrap();
        let handle = server.shutdown_handle();
        let s = sock.clone();
        let thread = std::thread::spawn(move || server.serve_unix(&s));
        let deadline = Instant::now() + Duration::from_secs(10);
        while !sock.exists() {
            assert!(Instant::now() < deadline, "server did not start");
            std::thread::sleep(Duration::from_millis(5));
        }
        Running {
            dir,
            sock,
            dev,
            handle,
            thread: Some(thread),
        }
    }

    fn uri(&self) -> String {
        format!("nbd+unix:///disk?socket={}", self.sock.display())
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn contents(&self) -> Vec<u8> {
        let mut v = vec![0; self.dev.size() as usize];
        self.dev.read_at(&mut v, 0).unwrap();
        v
    }

    fn stop(mut self) {
        self.handle.shutdown();
        self.thread.take().unwrap().join().unwrap().unwrap();
        assert_eq!(self.handle.stats().connections_active, 0);
    }
}

/// A deterministic test image with data, zero runs and a tail.
fn pattern(size: usize) -> Vec<u8> {
    let mut v = vec![0u8; size];
    let mut x: u32 = 0x1234_5678;
    for (i, chunk) in v.chunks_mut(64 << 10).enumerate() {
        if i % 3 == 1 {
            continue; // leave zero runs
        }
        for b in chunk.iter_mut() {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            *b = x as u8;
        }
    }
    v
}

#[test]
fn nbdinfo_reports_size_and_block_sizes() {
    let nbdinfo = tool("nbdinfo", "libnbd-bin");
    let srv = Running::start(24 * MIB, 4096, |b| b);
    let out = run(Command::new(&nbdinfo).arg("--json").arg(srv.uri()));
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(j["protocol"], "newstyle-fixed");
    assert_eq!(j["structured"], true);
    let e = &j["exports"][0];
    assert_eq!(e["export-name"], "disk");
    assert_eq!(e["export-size"], 24 * MIB);
    assert_eq!(e["block_size_minimum"], 4096);
    assert_eq!(e["block_size_preferred"], 4096);
    assert_eq!(e["block_size_maximum"], 32 * MIB);
    assert_eq!(e["description"], "cryptblk test disk");
    assert_eq!(e["is_read_only"], false);
    for cap in [
        "can_flush",
        "can_fua",
        "can_multi_conn",
        "can_trim",
        "can_zero",
        "can_df",
        "can_cache",
        "can_fast_zero",
    ] {
        assert_eq!(e[cap], true, "{cap} in {e}");
    }
    // NBD_OPT_LIST_META_CONTEXT: the one context offered.
    assert_eq!(e["contexts"], serde_json::json!(["base:allocation"]), "{e}");
    // --list goes through NBD_OPT_LIST.
    let out = run(Command::new(&nbdinfo)
        .arg("--list")
        .arg("--json")
        .arg(format!("nbd+unix://?socket={}", srv.sock.display())));
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(j["exports"][0]["export-name"], "disk");
    srv.stop();
}

#[test]
fn nbdinfo_read_only_and_connection_limit() {
    let nbdinfo = tool("nbdinfo", "libnbd-bin");
    let srv = Running::start(4 * MIB, 512, |b| b.read_only(true).max_connections(1));
    let out = run(Command::new(&nbdinfo).arg("--json").arg(srv.uri()));
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(j["exports"][0]["is_read_only"], true);
    assert_eq!(j["exports"][0]["block_size_minimum"], 512);

    // nbdinfo has hung up, but the server may not have noticed yet: until it has,
    // the slot is still taken and the held connection below would be the one refused.
    let deadline = Instant::now() + Duration::from_secs(30);
    while srv.handle.stats().connections_active != 0 {
        assert!(Instant::now() < deadline, "{:?}", srv.handle.stats());
        std::thread::sleep(Duration::from_millis(5));
    }

    // Hold the only slot with a raw connection, then nbdinfo is refused politely.
    let mut hold = UnixStream::connect(&srv.sock).unwrap();
    let mut greeting = [0u8; 18];
    hold.read_exact(&mut greeting).unwrap();
    hold.write_all(&3u32.to_be_bytes()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while srv.handle.stats().connections_active != 1 {
        assert!(Instant::now() < deadline, "{:?}", srv.handle.stats());
        std::thread::sleep(Duration::from_millis(5));
    }
    let out = Command::new(&nbdinfo).arg(srv.uri()).output().unwrap();
    assert!(!out.status.success());
    // libnbd 1.14 does not print the server's message ("too many connections"), only the error.
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("opt_go"), "nbdinfo said: {err}");
    assert_eq!(srv.handle.stats().connections_rejected, 1);
    assert_eq!(
        srv.handle.stats().connections_total,
        2,
        "first nbdinfo + the held connection"
    );
    drop(hold);
    srv.stop();
}

#[test]
fn qemu_img_convert_in_and_out_and_compare() {
    let qemu_img = tool("qemu-img", "qemu-utils");
    let srv = Running::start(8 * MIB, 512, |b| b);
    let data = pattern(8 * MIB as usize);
    let src = srv.path("src.img");
    std::fs::write(&src, &data).unwrap();
    run(Command::new(&qemu_img)
        .args(["convert", "-n", "-f", "raw", "-O", "raw"])
        .arg(&src)
        .arg(srv.uri()));
    assert!(
        srv.contents() == data,
        "device contents differ after qemu-img convert in"
    );
    run(Command::new(&qemu_img)
        .args(["compare", "-f", "raw", "-F", "raw"])
        .arg(&src)
        .arg(srv.uri()));

    let out_img = srv.path("out.img");
    run(Command::new(&qemu_img)
        .args(["convert", "-f", "raw", "-O", "raw"])
        .arg(srv.uri())
        .arg(&out_img));
    assert!(
        std::fs::read(&out_img).unwrap() == data,
        "qemu-img convert out differs"
    );

    // compare must notice a difference (the test can fail).
    let mut other = data.clone();
    other[5 * MIB as usize + 17] ^= 1;
    let other_path = srv.path("other.img");
    std::fs::write(&other_path, &other).unwrap();
    let out = Command::new(&qemu_img)
        .args(["compare", "-f", "raw", "-F", "raw"])
        .arg(&other_path)
        .arg(srv.uri())
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(1),
        "qemu-img compare should report a difference"
    );
    assert!(srv.handle.stats().write_bytes > 0 && srv.handle.stats().read_bytes > 0);
    srv.stop();
}

#[test]
fn qemu_io_unaligned_io_through_qemu_rmw() {
    let qemu_io = tool("qemu-io", "qemu-utils");
    let srv = Running::start(4 * MIB, 4096, |b| b);
    let out = run(Command::new(&qemu_io)
        .args(["-f", "raw"])
        .arg(srv.uri())
        .args([
            "-c",
            "write -P 0xab 1000 3000",
            "-c",
            "write -P 0xcd 8191 2",
            "-c",
            "read -P 0xab 1000 3000",
            "-c",
            "read -P 0 0 1000",
            "-c",
            "read -P 0xcd 8191 2",
            "-c",
            "read -P 0 4000 4191",
            "-c",
            "flush",
        ]));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        !text.contains("failed") && !text.contains("error"),
        "qemu-io reported:\n{text}"
    );
    assert_eq!(text.matches("read ").count(), 4, "qemu-io output:\n{text}");
    let c = srv.contents();
    assert!(c[..1000].iter().all(|&b| b == 0));
    assert!(c[1000..4000].iter().all(|&b| b == 0xab));
    assert!(c[4000..8191].iter().all(|&b| b == 0));
    assert_eq!(&c[8191..8193], &[0xcd, 0xcd]);
    assert!(c[8193..].iter().all(|&b| b == 0));
    assert_eq!(
        srv.handle.stats().errors,
        0,
        "qemu must only send aligned requests"
    );
    srv.stop();
}

#[test]
fn qemu_io_write_to_read_only_export_fails() {
    let qemu_io = tool("qemu-io", "qemu-utils");
    let srv = Running::start(MIB, 512, |b| b.read_only(true));
    let out = Command::new(&qemu_io)
        .args(["-f", "raw"])
        .arg(srv.uri())
        .args(["-c", "write -P 0x11 0 4096"])
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // qemu sees NBD_FLAG_READ_ONLY and refuses to open the image read-write.
    assert!(
        !out.status.success() || text.contains("failed"),
        "qemu-io said: {text}"
    );
    assert!(
        text.contains("Permission denied") || text.contains("not permitted"),
        "qemu-io said: {text}"
    );
    assert!(srv.contents().iter().all(|&b| b == 0));
    srv.stop();
}

#[test]
fn nbdcopy_in_and_out_with_multi_conn() {
    let nbdcopy = tool("nbdcopy", "libnbd-bin");
    let srv = Running::start(16 * MIB, 512, |b| b);
    let data = pattern(16 * MIB as usize);
    let src = srv.path("src.img");
    std::fs::write(&src, &data).unwrap();
    run(Command::new(&nbdcopy)
        .arg("--connections=4")
        .arg("--requests=16")
        .arg(&src)
        .arg(srv.uri()));
    assert!(
        srv.contents() == data,
        "device contents differ after nbdcopy in"
    );
    let out_img = srv.path("out.img");
    run(Command::new(&nbdcopy)
        .arg("--connections=4")
        .arg(srv.uri())
        .arg(&out_img));
    assert!(
        std::fs::read(&out_img).unwrap() == data,
        "nbdcopy out differs"
    );
    assert!(srv.handle.stats().connections_total >= 2);
    srv.stop();
}

fn fio(srv: &Running, args: &[&str]) {
    let fio = tool("fio", "fio");
    let out = run(Command::new(&fio)
        .current_dir(srv.dir.path()) // fio leaves verify state files in its cwd
        .arg("--name=verify")
        .arg("--ioengine=nbd")
        .arg(format!("--uri={}", srv.uri()))
        .args([
            "--verify=crc32c",
            "--do_verify=1",
            "--verify_fatal=1",
            "--output-format=terse",
            "--terse-version=3",
        ])
        .args(args));
    // Terse v3: field 5 is the error code.
    let text = String::from_utf8_lossy(&out.stdout);
    for line in text.lines().filter(|l| l.starts_with("3;")) {
        assert_eq!(line.split(';').nth(4), Some("0"), "fio error in {line}");
    }
    assert!(
        text.lines().any(|l| l.starts_with("3;")),
        "no fio result:\n{text}"
    );
}

#[test]
fn fio_verify_patterns() {
    let srv = Running::start(32 * MIB, 512, |b| b);
    fio(
        &srv,
        &["--rw=randwrite", "--bs=4k", "--iodepth=32", "--size=16M"],
    );
    fio(
        &srv,
        &["--rw=write", "--bs=128k", "--iodepth=8", "--size=32M"],
    );
    fio(
        &srv,
        &[
            "--rw=randwrite",
            "--bsrange=512-64k",
            "--iodepth=16",
            "--size=8M",
        ],
    );
    fio(
        &srv,
        &[
            "--rw=randwrite",
            "--bs=4k",
            "--iodepth=1",
            "--size=4M",
            "--offset=16M",
        ],
    );
    // Two connections at once, on disjoint halves.
    fio(
        &srv,
        &[
            "--rw=randwrite",
            "--bs=8k",
            "--iodepth=16",
            "--size=8M",
            "--numjobs=2",
            "--offset_increment=16M",
        ],
    );
    let st = srv.handle.stats();
    assert!(st.connections_total >= 6 && st.errors == 0, "{st:?}");
    srv.stop();
}

#[test]
fn fio_verify_with_one_thread_per_connection() {
    let srv = Running::start(16 * MIB, 4096, |b| b.threads_per_connection(1));
    fio(
        &srv,
        &["--rw=randwrite", "--bs=4k", "--iodepth=32", "--size=8M"],
    );
    srv.stop();
}

// `base:allocation` through real clients: an encrypted volume on a sparse file reports the
// storage's holes only when discards are allowed, never as zeros (a hole decrypts to
// garbage), and clients that skip holes still copy every byte right.

/// Where the volume's data starts in its file, and its size.
const DATA_OFFSET: u64 = MIB;
const SIZE: u64 = 16 * MIB;

/// An encrypted volume on a sparse file of `DATA_OFFSET + SIZE` bytes (nothing written).
fn sparse_volume(path: &Path, allow_discards: bool) -> Arc<Volume> {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .unwrap();
    f.set_len(DATA_OFFSET + SIZE).unwrap();
    let mut params = xts_4096_params(DATA_OFFSET);
    params.allow_discards = allow_discards;
    let key: Vec<u8> = (0..64u8).collect();
    Arc::new(volume_from_key(Box::new(FileStorage::new(f).unwrap()), &key, &params).unwrap())
}

fn serve(vol: Arc<Volume>) -> Serving {
    Serving::start(
        NbdServer::builder()
            .export("disk", vol as Arc<dyn BlockDevice>)
            .build()
            .unwrap(),
    )
}

fn uri(s: &Serving) -> String {
    format!("nbd+unix:///disk?socket={}", s.path.display())
}

/// `nbdinfo --map`: (offset, length, type) runs.
fn map(s: &Serving) -> Vec<(u64, u64, u64)> {
    let out = run(Command::new(tool("nbdinfo", "libnbd-bin"))
        .args(["--map", "--json"])
        .arg(uri(s)));
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    j.as_array()
        .expect("a JSON array")
        .iter()
        .map(|e| {
            (
                e["offset"].as_u64().unwrap(),
                e["length"].as_u64().unwrap(),
                e["type"].as_u64().unwrap(),
            )
        })
        .collect()
}

/// Whether the file system under `dir` reports holes (SEEK_HOLE before the end).
fn reports_holes(dir: &Path) -> bool {
    let p = dir.join("probe");
    let f = std::fs::File::create(&p).unwrap();
    f.set_len(MIB).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, &[1; 4096], 0).unwrap();
    let hole = cryptblk_device::file_seek_hole(&f, 0).unwrap();
    hole < MIB
}

#[test]
fn holes_are_reported_only_with_discards_and_never_as_zeros() {
    let qemu_io = tool("qemu-io", "qemu-utils");
    let qemu_img = tool("qemu-img", "qemu-utils");
    let dir = tempfile::tempdir().unwrap();
    assert!(
        reports_holes(dir.path()),
        "the temp dir's file system reports no holes (SEEK_HOLE): this test cannot run here; \
         set TMPDIR to a tmpfs, ext4 or xfs directory"
    );
    let img = dir.path().join("vol.img");

    // Discards allowed: write 8 MiB, discard 2 MiB of it.
    let vol = sparse_volume(&img, true);
    let srv = serve(vol.clone());
    run(Command::new(&qemu_io)
        .args([
            "-f",
            "raw",
            "-c",
            "write -P 0x5a 0 8M",
            "-c",
            "discard 2M 2M",
        ])
        .arg(uri(&srv)));
    let runs = map(&srv);
    assert_eq!(
        runs,
        vec![
            (0, 2 * MIB, 0),
            (2 * MIB, 2 * MIB, 1),
            (4 * MIB, 4 * MIB, 0),
            (8 * MIB, 8 * MIB, 1),
        ],
        "hole (type 1) where discarded and never written, data (type 0) elsewhere, never zero (type 2)"
    );
    // qemu-img sees the holes as neither data nor zero, and still copies every byte: what
    // the client reads from a hole is what the volume reads there (not zeros).
    let out = run(Command::new(&qemu_img)
        .args(["map", "--output=json", "-f", "raw"])
        .arg(uri(&srv)));
    let qmap: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for e in qmap.as_array().unwrap() {
        let (start, len) = (e["start"].as_u64().unwrap(), e["length"].as_u64().unwrap());
        assert_eq!(
            e["zero"], false,
            "qemu-img map says zero at {start}+{len}: {qmap}"
        );
        let data = (start + len <= 2 * MIB) || (start >= 4 * MIB && start + len <= 8 * MIB);
        assert_eq!(e["data"], data, "qemu-img map at {start}+{len}: {qmap}");
    }
    let copy = dir.path().join("copy.raw");
    run(Command::new(&qemu_img)
        .args(["convert", "-f", "raw", "-O", "raw"])
        .arg(uri(&srv))
        .arg(&copy));
    let mut want = vec![0u8; SIZE as usize];
    vol.read_at(&mut want, 0).unwrap();
    assert!(want[..2 * MIB as usize].iter().all(|&b| b == 0x5a));
    assert!(
        want[2 * MIB as usize..4 * MIB as usize]
            .iter()
            .any(|&b| b != 0),
        "a discarded range of an encrypted volume reads as garbage, not zeros"
    );
    assert!(
        std::fs::read(&copy).unwrap() == want,
        "qemu-img convert copied every byte"
    );
    let stats = srv.stop().stats();
    assert!(stats.block_status >= 2, "{stats:?}");
    drop(vol);

    // The same image without discards allowed: all data, nothing revealed.
    let vol = sparse_volume(&img, false);
    let srv = serve(vol);
    assert_eq!(map(&srv), vec![(0, SIZE, 0)]);
    srv.stop();
}

/// Bytes of `path` in the page cache (`fincore` from util-linux).
fn resident(path: &Path) -> u64 {
    let out = run(Command::new(tool("fincore", "util-linux"))
        .args(["--bytes", "--noheadings", "--output", "RES"])
        .arg(path));
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
}

#[test]
fn cache_reads_the_ciphertext_ahead() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("vol.img");
    let vol = sparse_volume(&img, false);
    // 8 MiB written, made durable, then dropped from the page cache (clean pages go).
    vol.write_at(&vec![0x33; 8 * MIB as usize], 0, false)
        .unwrap();
    vol.flush().unwrap();
    let f = std::fs::File::open(&img).unwrap();
    rustix::fs::fadvise(&f, 0, None, rustix::fs::Advice::DontNeed).unwrap();
    let droppable = resident(&img) == 0;
    if !droppable {
        eprintln!(
            "NOTE: this file system keeps the image in memory ({} bytes resident after \
             DONTNEED, e.g. tmpfs): CACHE is checked to succeed, not to read ahead",
            resident(&img)
        );
    }
    let srv = serve(vol);
    let mut c = crate::common::Client::connect(&srv.path);
    let k = c.send(cryptblk_nbd::proto::CMD_CACHE, 2 * MIB, 4 << 20, &[]);
    assert_eq!(c.reply(), (0, k));
    // Past the end: refused.
    let k = c.send(cryptblk_nbd::proto::CMD_CACHE, SIZE - 4096, 8192, &[]);
    assert_eq!(c.reply(), (cryptblk_nbd::proto::EINVAL, k));
    if droppable {
        // Readahead runs in the background: the 4 MiB under the range (at DATA_OFFSET + 2
        // MiB in the file) arrive soon.
        let deadline = Instant::now() + Duration::from_secs(10);
        while resident(&img) < 4 * MIB {
            assert!(Instant::now() < deadline, "CACHE read nothing ahead");
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(
            resident(&img) < 8 * MIB,
            "only the range asked for (and readahead)"
        );
    }
    c.disconnect();
    assert_eq!(srv.stop().stats().caches, 1);
}
