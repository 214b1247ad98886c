//! The mmap engine, as the default picks it for images on tmpfs: same bytes as pread/pwrite,
//! sparse images stay sparse, and what raises SIGBUS through a mapping (a file truncated
//! under the volume, a full tmpfs) is an error for that request, never a dead process.
//! The full-tmpfs test mounts a small tmpfs, as the NBD stress tests do: it needs root and
//! fails (it does not skip) without.

use cryptblk_crypto::{CipherSpec, IvOptions};
use cryptblk_device::BlockDevice;
use cryptblk_volume::{FileIo, FileStorage, IoEngine, Volume, VolumeParams, open_plain_with};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

const KEY: [u8; 64] = [0x5a; 64];

fn params() -> VolumeParams {
    params_for("aes-xts-plain64")
}

fn params_for(cipher: &str) -> VolumeParams {
    VolumeParams {
        cipher: CipherSpec::parse(cipher).unwrap(),
        sector_size: 4096,
        iv: IvOptions {
            large_sectors: true,
            offset: 0,
        },
        data_offset: 4096,
        data_length: None,
        read_only: false,
        allow_discards: true,
    }
}

fn on_tmpfs(p: &Path) -> bool {
    #[allow(clippy::unnecessary_cast)] // f_type's type differs between architectures
    rustix::fs::statfs(p).is_ok_and(|s| s.f_type as i64 == 0x0102_1994)
}

/// A temp dir on tmpfs (/dev/shm); fails loudly where there is none.
fn shm_dir() -> tempfile::TempDir {
    let d = tempfile::tempdir_in("/dev/shm").expect("these tests need /dev/shm");
    assert!(
        on_tmpfs(d.path()),
        "these tests need /dev/shm on tmpfs, and it is not here"
    );
    d
}

fn image(dir: &Path, len: u64) -> std::path::PathBuf {
    let p = dir.join("v.img");
    std::fs::File::create(&p).unwrap().set_len(len).unwrap();
    p
}

fn open(p: &Path, engine: IoEngine) -> Volume {
    let io = FileIo {
        engine,
        direct: false,
    };
    open_plain_with(p, &KEY, &params(), io).unwrap()
}

/// Opens `p` again right after it was closed. Other tests of this binary start processes:
/// a child between fork and exec holds a copy of every descriptor, and with it the lock of
/// a file closed meanwhile, for that moment; so `Busy` is retried briefly.
fn reopen(p: &Path, params: &VolumeParams, io: FileIo) -> Volume {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    loop {
        match open_plain_with(p, &KEY, params, io) {
            Err(cryptblk_volume::Error::Busy(_)) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(10))
            }
            r => return r.unwrap(),
        }
    }
}

fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

#[test]
fn auto_maps_an_image_on_tmpfs_and_preads_one_on_disk() {
    let shm = shm_dir();
    let disk = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    for (dir, tmpfs) in [(shm.path(), true), (disk.path(), on_tmpfs(disk.path()))] {
        let p = image(dir, 1 << 20);
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&p)
            .unwrap();
        let st = FileStorage::new(f)
            .unwrap()
            .with_engine(IoEngine::Auto)
            .unwrap();
        let want = if tmpfs {
            IoEngine::Mmap
        } else {
            IoEngine::Psync
        };
        assert_eq!(st.engine(), want, "{}", dir.display());
        let d = cryptblk_volume::Storage::describe(&st);
        assert!(d.contains(if tmpfs { "mmap" } else { "psync" }), "{d}");
    }
    // O_DIRECT never gets the mapping; asking for both is an error.
    let p = image(disk.path(), 1 << 20);
    let io = FileIo {
        engine: IoEngine::Mmap,
        direct: true,
    };
    assert!(open_plain_with(&p, &KEY, &params(), io).is_err());
}

#[test]
fn mmap_and_pread_see_the_same_volume_and_a_sparse_image_stays_sparse() {
    let dir = shm_dir();
    let p = image(dir.path(), 64 << 20);
    let data = pattern(1 << 20, 1);
    {
        let vol = open(&p, IoEngine::Auto);
        vol.write_at(&data, 8 << 20, false).unwrap();
        vol.write_at(&data[..1000], 20_000_001, true).unwrap();
        vol.flush().unwrap();
    }
    let used = std::fs::metadata(&p).unwrap().blocks() * 512;
    let mut whole_mmap = vec![0u8; 64 << 20];
    let vol = open(&p, IoEngine::Auto);
    vol.read_at(&mut whole_mmap[..vol.size() as usize], 0)
        .unwrap();
    drop(vol);
    assert_eq!(
        std::fs::metadata(&p).unwrap().blocks() * 512,
        used,
        "reading the holes allocated memory"
    );
    assert!(used < 2 << 20, "{used} bytes used for 1 MiB written");
    let mut whole_pread = vec![0u8; 64 << 20];
    let vol = open(&p, IoEngine::Psync);
    vol.read_at(&mut whole_pread[..vol.size() as usize], 0)
        .unwrap();
    assert!(whole_mmap == whole_pread);
    assert!(whole_mmap[8 << 20..9 << 20] == data[..]);
    assert!(whole_mmap[20_000_001..20_001_001] == data[..1000]);
}

#[test]
fn a_file_truncated_under_the_volume_is_an_error_not_a_crash() {
    let dir = shm_dir();
    let p = image(dir.path(), 16 << 20);
    let vol = open(&p, IoEngine::Mmap);
    let data = pattern(4 << 20, 2);
    vol.write_at(&data, 0, false).unwrap();
    vol.write_at(&data, 8 << 20, false).unwrap();
    let other = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
    other.set_len(4 << 20).unwrap();
    let mut back = vec![0u8; 1 << 20];
    let e = vol.read_at(&mut back, 9 << 20).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof, "{e}");
    // Before the cut, still readable through the mapping.
    vol.read_at(&mut back, 1 << 20).unwrap();
    assert!(back[..] == data[1 << 20..2 << 20]);
    // A write past the end goes to pwrite, which extends the file as a write would.
    vol.write_at(&data[..1 << 20], 12 << 20, false).unwrap();
    vol.read_at(&mut back, 12 << 20).unwrap();
    assert!(back[..] == data[..1 << 20]);
    other.set_len(16 << 20).unwrap();
    vol.write_at(&data, 8 << 20, false).unwrap();
    let mut all = vec![0u8; 4 << 20];
    vol.read_at(&mut all, 8 << 20).unwrap();
    assert!(all == data);
}

/// A file shrunk under the volume to a size that is not a multiple of the page size: the
/// page holding its new end stays mapped and raises no SIGBUS past the end. A write
/// there must not be acknowledged unless it is in the file (it goes to pwrite, which
/// extends the file, as the psync engine does), a read past the end is an error as with
/// pread (never the bytes the page happens to hold), and under a writer racing the
/// shrinks no write acknowledged after the last one is lost across a reopen.
#[test]
fn a_file_shrunk_to_part_of_a_page_loses_no_acknowledged_write_and_reads_no_garbage() {
    const SIZE: u64 = 32 << 20;
    let dir = shm_dir();
    let p = image(dir.path(), SIZE);
    let mut sectors_512 = params();
    sectors_512.sector_size = 512;
    sectors_512.iv.large_sectors = false;
    let io = |engine| FileIo {
        engine,
        direct: false,
    };
    let vol = open_plain_with(&p, &KEY, &sectors_512, io(IoEngine::Mmap)).unwrap();
    let data_offset = sectors_512.data_offset;
    let all = pattern(vol.size() as usize, 3);
    vol.write_at(&all, 0, false).unwrap();
    let other = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
    let cut = SIZE - 8192 + 512;
    other.set_len(cut).unwrap();
    // The last sector still in the file reads; the one after it (in the same page) is
    // past the end: an error, never what the page holds.
    let last = cut - data_offset - 512;
    let mut back = vec![0u8; 512];
    vol.read_at(&mut back, last).unwrap();
    assert!(back[..] == all[last as usize..][..512]);
    let e = vol.read_at(&mut back, last + 512).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof, "{e}");
    // A FUA write and a flush past the end: acknowledged only as part of the file.
    let w = pattern(512, 4);
    vol.write_at(&w, last + 512, true).unwrap();
    vol.flush().unwrap();
    assert!(std::fs::metadata(&p).unwrap().len() >= cut + 512);
    drop(vol);
    let again = reopen(&p, &sectors_512, io(IoEngine::Psync));
    again.read_at(&mut back, last + 512).unwrap();
    assert!(
        back == w,
        "the acknowledged write past the end is not in the file"
    );
    drop(again);

    // A writer over the last 64 KiB of the volume while the file is shrunk again and
    // again to sizes inside a page; every write it started after the last shrink ended
    // must be in the file after a reopen.
    other.set_len(SIZE).unwrap();
    let vol = Arc::new(open_plain_with(&p, &KEY, &sectors_512, io(IoEngine::Mmap)).unwrap());
    let epoch = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (vol, epoch, stop) = (vol.clone(), epoch.clone(), stop.clone());
        std::thread::spawn(move || {
            let base = vol.size() - (64 << 10);
            let mut acked = Vec::new();
            for seq in 0u64.. {
                if stop.load(Relaxed) {
                    return acked;
                }
                let off = base + (seq * 7 % 128) * 512;
                let started = epoch.load(Relaxed);
                let data = pattern(512, seq + 10);
                if vol.write_at(&data, off, seq % 3 == 0).is_ok() {
                    acked.push((off, data, started));
                }
            }
            unreachable!()
        })
    };
    for i in 1..=20u64 {
        std::thread::sleep(std::time::Duration::from_millis(5));
        other
            .set_len(SIZE - (i % 16 + 1) * 4096 + 512 * (i % 7 + 1))
            .unwrap();
        epoch.store(i, Relaxed);
    }
    std::thread::sleep(std::time::Duration::from_millis(20));
    stop.store(true, Relaxed);
    let acked = writer.join().unwrap();
    vol.flush().unwrap();
    drop(vol);
    let mut last_write = std::collections::HashMap::new();
    for (off, data, started) in acked {
        last_write.insert(off, (data, started));
    }
    let after: Vec<_> = last_write.iter().filter(|(_, (_, e))| *e == 20).collect();
    assert!(!after.is_empty(), "no write after the last shrink");
    let again = reopen(&p, &sectors_512, io(IoEngine::Psync));
    for (off, (data, _)) in after {
        let mut back = vec![0u8; 512];
        again
            .read_at(&mut back, *off)
            .unwrap_or_else(|e| panic!("acknowledged write at {off} is past the end: {e}"));
        assert!(back == *data, "acknowledged write at {off} lost");
    }
}

#[test]
fn truncations_racing_many_threads_never_kill_the_process() {
    let dir = shm_dir();
    let len = 16u64 << 20;
    let p = image(dir.path(), len + 4096);
    let vol = Arc::new(open(&p, IoEngine::Mmap));
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..3u64)
        .map(|t| {
            let (vol, stop) = (vol.clone(), stop.clone());
            std::thread::spawn(move || {
                let (mut ok, mut err) = (0u64, 0u64);
                let chunk = pattern(128 << 10, t);
                let mut back = vec![0u8; 128 << 10];
                let mut i = t;
                while !stop.load(Relaxed) {
                    i = (i * 7 + 3) % (len / (128 << 10));
                    let at = i * (128 << 10);
                    let r = if i % 2 == 0 {
                        vol.write_at(&chunk, at, false)
                    } else {
                        vol.read_at(&mut back, at)
                    };
                    if r.is_ok() { ok += 1 } else { err += 1 }
                }
                (ok, err)
            })
        })
        .collect();
    let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
    for round in 0..200u64 {
        f.set_len(4096 + (round % 4) * (4 << 20)).unwrap();
        std::thread::sleep(std::time::Duration::from_micros(500));
        f.set_len(len + 4096).unwrap();
        std::thread::sleep(std::time::Duration::from_micros(500));
    }
    stop.store(true, Relaxed);
    let counts: Vec<(u64, u64)> = workers.into_iter().map(|w| w.join().unwrap()).collect();
    eprintln!("(requests done, requests failed) per thread: {counts:?}");
    assert!(counts.iter().all(|&(ok, _)| ok > 0));
    // Afterwards everything works as before: write all, read all back.
    let data = pattern(len as usize, 9);
    vol.write_at(&data, 0, false).unwrap();
    let mut back = vec![0u8; len as usize];
    vol.read_at(&mut back, 0).unwrap();
    assert!(back == data);
}

/// A tmpfs of `size` mounted on a temp dir, unmounted on drop.
struct SmallTmpfs(tempfile::TempDir);

impl SmallTmpfs {
    fn mount(size: &str) -> SmallTmpfs {
        let d = tempfile::tempdir().unwrap();
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(d.path())
            .output()
            .expect("cannot run mount");
        assert!(
            out.status.success(),
            "this test mounts a small tmpfs and needs root for it: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        SmallTmpfs(d)
    }
}

impl Drop for SmallTmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(self.0.path())
            .status();
    }
}

#[test]
fn a_full_tmpfs_is_enospc_and_what_was_written_stays() {
    let fs = SmallTmpfs::mount("4m");
    let p = image(fs.0.path(), 16 << 20);
    let vol = open(&p, IoEngine::Auto);
    let data = pattern(16 << 20, 3);
    let mut written = 0usize;
    let err = loop {
        match vol.write_at(&data[written..written + (256 << 10)], written as u64, false) {
            Ok(()) => written += 256 << 10,
            Err(e) => break e,
        }
        assert!(written < (16 << 20) - 4096, "a 4 MiB tmpfs took 16 MiB");
    };
    assert_eq!(err.raw_os_error(), Some(libc::ENOSPC), "{err}");
    assert!(written >= 2 << 20, "only {written} bytes went in");
    let mut back = vec![0u8; written];
    vol.read_at(&mut back, 0).unwrap();
    assert!(back[..] == data[..written]);
    vol.flush().unwrap();
}

/// A cipher without the one-pass path (CBC-ESSIV; XTS on CPUs without VAES) writes through
/// the mapping by copy, never by putting plaintext there first: same bytes as pread/pwrite.
#[test]
fn every_cipher_stores_the_same_ciphertext_through_the_mapping() {
    let dir = shm_dir();
    for cipher in ["aes-cbc-essiv:sha256", "aes-xts-plain64"] {
        let mut images = Vec::new();
        for engine in [IoEngine::Mmap, IoEngine::Psync] {
            let p = dir.path().join(format!("{}-{engine:?}.img", &cipher[..7]));
            std::fs::File::create(&p).unwrap().set_len(4 << 20).unwrap();
            let io = FileIo {
                engine,
                direct: false,
            };
            let key = if cipher.contains("xts") {
                &KEY[..]
            } else {
                &KEY[..32]
            };
            let vol = open_plain_with(&p, key, &params_for(cipher), io).unwrap();
            let data = pattern(1 << 20, 4);
            vol.write_at(&data, 4096, false).unwrap();
            vol.write_at(&data[..5000], 2_000_000, false).unwrap();
            let mut back = vec![0u8; 1 << 20];
            vol.read_at(&mut back, 4096).unwrap();
            assert!(back == data, "{cipher} {engine:?}");
            drop(vol);
            images.push(std::fs::read(&p).unwrap());
        }
        assert!(
            images[0] == images[1],
            "{cipher}: mmap and psync stored different bytes"
        );
    }
}
