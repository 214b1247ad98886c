//! The NBD client ([`NbdStorage`]) against real servers: this crate's own, qemu-nbd
//! (qemu-utils) and nbdkit (nbdkit). Many threads at once (pipelined requests, several
//! connections with multi-conn), flush, write-zeroes, errors from the server, a server
//! that goes away mid-request and comes back. A missing tool fails the test, naming its
//! package.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::{Serving, nbdkit, qemu_nbd};
use cryptblk_device::{MemoryDevice, Storage};
use cryptblk_nbd::NbdServer;
use cryptblk_storage::{NbdClientOptions, NbdStorage, NbdUri};

const MIB: usize = 1 << 20;

fn uri_of(sock: &Path, export: &str) -> NbdUri {
    NbdUri::parse(&format!("nbd+unix:///{export}?socket={}", sock.display())).unwrap()
}

/// A deterministic pattern for the write `seq` of `len` bytes.
fn pattern(seq: u64, len: usize) -> Vec<u8> {
    let mut x = seq.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Eight threads write and read back disjoint stretches at once (so requests overlap on
/// every connection), then everything is read back whole and compared with a model.
fn concurrent_io(st: &Arc<NbdStorage>, size: usize) -> Vec<u8> {
    let threads = 8;
    let per = size / threads;
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let st = st.clone();
            std::thread::spawn(move || {
                let base = t * per;
                let mut model = vec![0u8; per];
                st.read_at(&mut model, base as u64).unwrap();
                for i in 0..64u64 {
                    // Lengths from 512 bytes to 192 KiB, 512-aligned, inside the stretch.
                    let len = 512 * (1 + (i as usize * 37) % 384).min(per / 512);
                    let off = (i as usize * 4096 * 7) % (per - len + 1) / 512 * 512;
                    let data = pattern(t as u64 * 1000 + i, len);
                    st.write_at(&data, (base + off) as u64).unwrap();
                    model[off..off + len].copy_from_slice(&data);
                    let mut back = vec![0u8; len];
                    st.read_at(&mut back, (base + off) as u64).unwrap();
                    assert_eq!(back, data, "thread {t} write {i}: read back differs");
                }
                model
            })
        })
        .collect();
    let model: Vec<u8> = handles
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();
    st.sync().unwrap();
    let mut all = vec![0u8; size];
    st.read_at(&mut all, 0).unwrap();
    assert!(all == model, "the export differs from what was written");
    all
}

#[test]
fn against_this_crates_server_with_multi_conn() {
    let size = 8 * MIB;
    let dev = Arc::new(MemoryDevice::new(size as u64, 512));
    let server = NbdServer::builder()
        .export("disk", dev.clone())
        .build()
        .unwrap();
    let serving = Serving::start(server);
    let st = Arc::new(
        NbdStorage::connect(&uri_of(&serving.path, "disk"), NbdClientOptions::default()).unwrap(),
    );
    assert_eq!(st.size().unwrap(), size as u64);
    assert_eq!(st.connections(), 4, "multi-conn offered: four connections");
    let all = concurrent_io(&st, size);
    let mut direct = vec![0u8; size];
    cryptblk_device::BlockDevice::read_at(&*dev, &mut direct, 0).unwrap();
    assert!(
        direct == all,
        "the server's device differs from what the client read"
    );
    // Write-zeroes (punch_hole) reads back as zeros.
    st.punch_hole(4096, 65536).unwrap();
    let mut z = vec![1u8; 65536];
    st.read_at(&mut z, 4096).unwrap();
    assert!(z.iter().all(|&b| b == 0));
    // Past the end: refused before anything is sent.
    let mut b = [0u8; 512];
    let e = st.read_at(&mut b, size as u64 - 256).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof);
    // Closed (a server exiting while its threads still hold the store): every connection
    // ends, and a request after it fails instead of connecting again.
    assert_eq!(serving.handle.stats().connections_active, 4);
    st.close().unwrap();
    let t0 = Instant::now();
    while serving.handle.stats().connections_active > 0 && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(
        serving.handle.stats().connections_active,
        0,
        "close ends every connection"
    );
    let e = st.read_at(&mut b, 0).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::NotConnected, "{e}");
    assert_eq!(
        serving.handle.stats().connections_total,
        4,
        "nothing connected again"
    );
    drop(st);
    serving.stop();
}

#[test]
fn unknown_export_and_read_only_are_clear_errors() {
    let dev = Arc::new(MemoryDevice::new(MIB as u64, 512));
    let server = NbdServer::builder()
        .export("ro", dev)
        .read_only(true)
        .build()
        .unwrap();
    let serving = Serving::start(server);
    let e = NbdStorage::connect(&uri_of(&serving.path, "nope"), NbdClientOptions::default())
        .err()
        .expect("an unknown export must fail");
    assert_eq!(e.kind(), std::io::ErrorKind::NotFound, "{e}");
    assert!(e.to_string().contains("no such export"), "{e}");
    let e = NbdStorage::connect(&uri_of(&serving.path, "ro"), NbdClientOptions::default())
        .err()
        .expect("writing to a read-only export must be refused at connect");
    assert_eq!(e.kind(), std::io::ErrorKind::PermissionDenied, "{e}");
    let ro = NbdStorage::connect(
        &uri_of(&serving.path, "ro"),
        NbdClientOptions {
            read_only: true,
            ..NbdClientOptions::default()
        },
    )
    .unwrap();
    let mut b = vec![0u8; 4096];
    ro.read_at(&mut b, 0).unwrap();
    assert!(ro.write_at(&b, 0).is_err());
    drop(ro);
    let gone = tempfile::tempdir().unwrap();
    let e = NbdStorage::connect(
        &uri_of(&gone.path().join("none.sock"), ""),
        NbdClientOptions::default(),
    )
    .err()
    .expect("no server: an error");
    assert_eq!(e.kind(), std::io::ErrorKind::NotFound, "{e}");
    serving.stop();
}

fn sparse_file(dir: &Path, size: usize) -> PathBuf {
    let p = dir.join("remote.img");
    std::fs::File::create(&p)
        .unwrap()
        .set_len(size as u64)
        .unwrap();
    p
}

/// What the client wrote is what the server's file holds, byte for byte.
fn check_file(st: &Arc<NbdStorage>, file: &Path, size: usize) {
    let all = concurrent_io(st, size);
    let on_disk = std::fs::read(file).unwrap();
    assert!(
        on_disk == all,
        "{} differs from what the client wrote",
        file.display()
    );
}

#[test]
fn against_qemu_nbd() {
    let dir = tempfile::tempdir().unwrap();
    let size = 16 * MIB;
    let file = sparse_file(dir.path(), size);
    let sock = dir.path().join("q.sock");
    let _q = qemu_nbd(&file, &sock);
    let st =
        Arc::new(NbdStorage::connect(&uri_of(&sock, ""), NbdClientOptions::default()).unwrap());
    eprintln!("qemu-nbd: {}", st.describe());
    check_file(&st, &file, size);
}

#[test]
fn against_nbdkit() {
    let dir = tempfile::tempdir().unwrap();
    let size = 16 * MIB;
    let file = sparse_file(dir.path(), size);
    let sock = dir.path().join("k.sock");
    let _k = nbdkit(&file, &sock);
    let st =
        Arc::new(NbdStorage::connect(&uri_of(&sock, ""), NbdClientOptions::default()).unwrap());
    eprintln!("nbdkit: {}", st.describe());
    assert!(
        st.connections() > 1,
        "nbdkit's file plugin offers multi-conn"
    );
    check_file(&st, &file, size);
    // Write-zeroes through nbdkit: zeros in the file.
    st.punch_hole(MIB as u64, MIB as u64).unwrap();
    st.sync().unwrap();
    let on_disk = std::fs::read(&file).unwrap();
    assert!(on_disk[MIB..2 * MIB].iter().all(|&b| b == 0));
}

/// The server dies while requests are in flight: they fail (no hang, no wrong data); while
/// it is gone, requests fail at once; once it is back on the same socket, requests
/// succeed again on new connections and see the data written before.
#[test]
fn server_gone_mid_request_then_back() {
    let dir = tempfile::tempdir().unwrap();
    let size = 64 * MIB;
    let file = sparse_file(dir.path(), size);
    let sock = dir.path().join("k.sock");
    let server = nbdkit(&file, &sock);
    let st =
        Arc::new(NbdStorage::connect(&uri_of(&sock, ""), NbdClientOptions::default()).unwrap());
    let before = pattern(7, MIB);
    st.write_at(&before, 0).unwrap();
    st.sync().unwrap();
    // Readers in a loop, until the server is killed under them.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let workers: Vec<_> = (0..6)
        .map(|t| {
            let (st, stop, before) = (st.clone(), stop.clone(), before.clone());
            std::thread::spawn(move || {
                let mut failures = 0;
                let mut b = vec![0u8; MIB];
                let deadline = Instant::now() + Duration::from_secs(30);
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    assert!(Instant::now() < deadline, "thread {t}: a request hung");
                    match st.read_at(&mut b, 0) {
                        Ok(()) => assert!(b == before, "thread {t}: wrong data"),
                        Err(_) => failures += 1,
                    }
                }
                failures
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    drop(server); // kill -9
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let failures: usize = workers.into_iter().map(|w| w.join().unwrap()).sum();
    assert!(failures > 0, "requests after the server died must fail");
    // Gone: an error, at once.
    let t0 = Instant::now();
    let mut b = vec![0u8; 4096];
    assert!(st.read_at(&mut b, 0).is_err());
    assert!(
        t0.elapsed() < Duration::from_secs(5),
        "a request to a dead server must fail fast"
    );
    // Back on the same socket: the next requests connect again.
    let _ = std::fs::remove_file(&sock);
    let _server = nbdkit(&file, &sock);
    let mut back = vec![0u8; MIB];
    let mut ok = false;
    for _ in 0..8 {
        // Each request may meet one connection that still has to notice it broke.
        if st.read_at(&mut back, 0).is_ok() {
            ok = true;
            break;
        }
    }
    assert!(ok, "no request succeeded after the server came back");
    assert!(back == before);
    let after = pattern(8, 4096);
    for _ in 0..8 {
        if st.write_at(&after, 8192).is_ok() {
            break;
        }
    }
    st.sync().unwrap();
    assert_eq!(&std::fs::read(&file).unwrap()[8192..12288], &after[..]);
}

/// A hostile server's negotiation: the greeting, the client's flags read, its NBD_OPT_GO
/// read, then `rest(socket)` decides what comes.
fn hostile_server(
    dir: &Path,
    greeting_drip: Option<Duration>,
    rest: impl FnOnce(&mut std::os::unix::net::UnixStream) + Send + 'static,
) -> PathBuf {
    use std::io::{Read, Write};
    let sock = dir.join("hostile.sock");
    let l = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    std::thread::spawn(move || {
        let Ok((mut s, _)) = l.accept() else { return };
        let mut hello = b"NBDMAGIC".to_vec();
        hello.extend_from_slice(&0x4948_4156_454F_5054u64.to_be_bytes()); // IHAVEOPT
        hello.extend_from_slice(&3u16.to_be_bytes()); // FIXED_NEWSTYLE | NO_ZEROES
        match greeting_drip {
            // One byte at a time, each in time for a per-read timeout.
            Some(every) => {
                for b in hello.iter().cycle() {
                    if s.write_all(&[*b]).is_err() {
                        return;
                    }
                    std::thread::sleep(every);
                }
            }
            None => s.write_all(&hello).unwrap(),
        }
        let mut flags = [0u8; 4];
        let mut opt = [0u8; 16];
        if s.read_exact(&mut flags).is_err() || s.read_exact(&mut opt).is_err() {
            return;
        }
        let len = u32::from_be_bytes(opt[12..16].try_into().unwrap());
        let mut data = vec![0u8; len as usize];
        if s.read_exact(&mut data).is_ok() {
            rest(&mut s);
        }
    });
    sock
}

/// What a hostile server does once it has read the client's NBD_OPT_GO.
type Rest = Box<dyn FnOnce(&mut std::os::unix::net::UnixStream) + Send>;

/// One NBD_REP_INFO reply to NBD_OPT_GO of an information type nobody knows.
fn unknown_info_reply() -> Vec<u8> {
    let mut r = 0x0003_e889_0455_65a9u64.to_be_bytes().to_vec(); // option reply magic
    r.extend_from_slice(&7u32.to_be_bytes()); // NBD_OPT_GO
    r.extend_from_slice(&3u32.to_be_bytes()); // NBD_REP_INFO
    r.extend_from_slice(&2u32.to_be_bytes());
    r.extend_from_slice(&0x7777u16.to_be_bytes());
    r
}

/// A server that keeps the client in negotiation (endless information replies, in a
/// stream or each in time for a per-read timeout; a greeting dripped a byte at a time)
/// is given up within the connect timeout, not after it renews for every read.
#[test]
fn a_server_that_never_ends_the_negotiation_is_given_up_within_the_timeout() {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let options = NbdClientOptions {
        connect_timeout: Duration::from_millis(800),
        ..Default::default()
    };
    let cases: Vec<(&str, Option<Duration>, Rest)> = vec![
        (
            "replies as fast as the socket takes them",
            None,
            Box::new(|s| while s.write_all(&unknown_info_reply()).is_ok() {}),
        ),
        (
            "one reply every 200 ms",
            None,
            Box::new(|s| {
                while s.write_all(&unknown_info_reply()).is_ok() {
                    std::thread::sleep(Duration::from_millis(200));
                }
            }),
        ),
        (
            "the greeting a byte every 100 ms",
            Some(Duration::from_millis(100)),
            Box::new(|_| {}),
        ),
    ];
    for (i, (what, drip, rest)) in cases.into_iter().enumerate() {
        let sub = dir.path().join(i.to_string());
        std::fs::create_dir(&sub).unwrap();
        let sock = hostile_server(&sub, drip, rest);
        let start = Instant::now();
        let err = NbdStorage::connect(&uri_of(&sock, "x"), options.clone())
            .err()
            .unwrap_or_else(|| panic!("{what}: connected"));
        let took = start.elapsed();
        assert!(
            took < Duration::from_millis(2500),
            "{what}: gave up after {took:?} ({err})"
        );
        eprintln!("{what}: {err} after {took:?}");
    }
}
