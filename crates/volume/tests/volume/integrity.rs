//! LUKS2 with integrity (issue 38) at the volume layer: dm-integrity's layout and journal
//! under dm-crypt's authenticated sectors, and under dm-integrity's own checksums
//! (standalone integritysetup volumes). Formatted, written and read back in every mode;
//! a tampered sector reads as EIO and nothing else does; the journal is replayed on open
//! (read-write and read-only); power cut at every write of the journal path loses no
//! flushed write and leaves no sector that fails verification. (The kernel's side of the
//! same volumes is checked in the test VM: tests/vm/integrity.sh.)

use cryptblk_crypto::{AeadSectorCipher, IntegrityHash, SecretBytes, SectorTags};
use cryptblk_device::BlockDevice;
use cryptblk_format::integrity::{Geometry, Journal, SUPERBLOCK_SECTORS, Superblock, flags};
use cryptblk_format::{CrashDevice, Tear};
use cryptblk_volume::{
    Integrity, IntegrityMode, JournalKeys, MemStorage, Storage, Volume, integrity_volume_on,
};
use std::sync::Arc;

/// Where the dm-integrity superblock goes (LUKS2's data offset would be 16 MiB).
const START: u64 = 1 << 20;
const DEV: u64 = 24 << 20;

/// (encryption, integrity, key bytes, sector size): the modes cryptsetup formats; and
/// (checksum, "", key bytes, sector size): integritysetup's, with fix_hmac's salt.
const MODES: [(&str, &str, usize, u32); 6] = [
    ("aes-gcm-random", "aead", 32, 512),
    ("chacha20-random", "poly1305", 32, 4096),
    ("aes-xts-plain64", "hmac(sha256)", 96, 4096),
    ("aes-xts-random", "hmac(sha256)", 96, 512),
    ("crc32c", "", 0, 512),
    ("hmac-sha256", "", 32, 4096),
];

const SALT: [u8; 16] = *b"salt of 16 bytes";

fn checksum(m: (&str, &str, usize, u32)) -> bool {
    m.1.is_empty()
}

fn cipher(m: (&str, &str, usize, u32)) -> Box<dyn SectorTags> {
    let key: Vec<u8> = (0..m.2).map(|i| i as u8 ^ 0x5c).collect();
    if checksum(m) {
        let tag = IntegrityHash::digest_size_of(m.0).unwrap();
        let key = (m.2 > 0).then_some(&key[..]);
        return Box::new(IntegrityHash::new(m.0, key, tag, m.3, Some(SALT)).unwrap());
    }
    Box::new(AeadSectorCipher::new(m.0, m.1, &key, m.3, 0).unwrap())
}

fn formatted(m: (&str, &str, usize, u32), wipe: bool) -> MemStorage {
    let dev = MemStorage::new(DEV);
    let salt = checksum(m).then_some(SALT);
    Integrity::format(&dev, START, cipher(m), salt, wipe, &mut |_, _| {}).unwrap();
    dev
}

fn open(dev: &Arc<dyn Storage>, m: (&str, &str, usize, u32), ro: bool) -> Volume {
    integrity_volume_on(
        Box::new(dev.clone()),
        START,
        cipher(m),
        ro,
        IntegrityMode::Journal,
    )
    .unwrap()
}

/// Opens read-write and closes: the journal is replayed and emptied, so what is on the
/// device at the blocks' homes is all there is (what tampering then changes stays).
fn settle(dev: &Arc<dyn Storage>, m: (&str, &str, usize, u32)) {
    drop(open(dev, m, false));
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect()
}

fn geometry(dev: &dyn Storage) -> Geometry {
    let mut sb = [0u8; 512];
    dev.read_at(&mut sb, START).unwrap();
    Geometry::of(&Superblock::parse(&sb).unwrap(), START / 512)
}

fn read(vol: &Volume, off: u64, len: usize) -> std::io::Result<Vec<u8>> {
    let mut b = vec![0u8; len];
    vol.read_at(&mut b, off).map(|_| b)
}

#[test]
fn every_mode_reads_zeros_then_what_was_written_across_areas_and_journal_wraps() {
    for m in MODES {
        let dev: Arc<dyn Storage> = Arc::new(formatted(m, true));
        let vol = open(&dev, m, false);
        let size = vol.size() as usize;
        assert!(size > 16 << 20, "{m:?}: two areas ({size})");
        let mut model = vec![0u8; size];
        assert_eq!(read(&vol, 0, size).unwrap(), model, "{m:?}: wiped to zeros");
        // An unaligned write; 3 MiB across the first area's end (the journal, 1/128 of
        // the device, wraps many times); a last block.
        for (off, len, seed) in [
            (1000u64, 5000usize, 1u8),
            ((15 << 20) + 4096, 3 << 20, 2),
            (size as u64 - 4096, 4096, 3),
        ] {
            let p = pattern(len, seed);
            vol.write_at(&p, off, false).unwrap();
            model[off as usize..][..len].copy_from_slice(&p);
        }
        assert!(
            read(&vol, 0, size).unwrap() == model,
            "{m:?}: before a flush"
        );
        vol.flush().unwrap();
        drop(vol);
        for ro in [true, false] {
            let vol = open(&dev, m, ro);
            assert!(
                read(&vol, 0, size).unwrap() == model,
                "{m:?}: reopened ro={ro}"
            );
        }
    }
}

/// One run of neighbouring blocks made of many writes goes home in parts: large writes'
/// blocks straight from their buffers, small ones (and a large write's blocks split by a
/// later rewrite of one of them) gathered; every byte lands where the model says.
#[test]
fn a_run_of_small_and_large_writes_goes_home_intact() {
    for m in MODES {
        let dev: Arc<dyn Storage> = Arc::new(formatted(m, true));
        let vol = open(&dev, m, false);
        let size = vol.size() as usize;
        let mut model = vec![0u8; size];
        let mut off = 8u64 << 20;
        for (i, len) in [
            4096usize, 4096, 65536, 8192, 40960, 4096, 131072, 12288, 32768,
        ]
        .into_iter()
        .enumerate()
        {
            let p = pattern(len, 20 + i as u8);
            vol.write_at(&p, off, false).unwrap();
            model[off as usize..][..len].copy_from_slice(&p);
            off += len as u64;
        }
        // One block inside the 128 KiB write (from +126976), and one inside the 64 KiB
        // write (from +8192), rewritten: each splits a part written straight in two.
        for (at, seed) in [
            ((8u64 << 20) + 126976 + 65536, 40u8),
            ((8 << 20) + 16384, 41),
        ] {
            let p = pattern(4096, seed);
            vol.write_at(&p, at, false).unwrap();
            model[at as usize..][..4096].copy_from_slice(&p);
        }
        assert!(
            read(&vol, 0, size).unwrap() == model,
            "{m:?}: before a flush"
        );
        vol.flush().unwrap();
        assert!(
            read(&vol, 0, size).unwrap() == model,
            "{m:?}: after a flush"
        );
        vol.close().unwrap();
        drop(vol);
        // What went home, without the journal's copies.
        forget_journal(&*dev);
        let vol = open(&dev, m, true);
        assert!(read(&vol, 0, size).unwrap() == model, "{m:?}: reopened");
    }
}

/// The journal area overwritten with zeros: no sector carries a commit id, so the replay
/// takes nothing (as the kernel's), and only what went home is read.
fn forget_journal(dev: &dyn Storage) {
    let (sb, g) = (superblock(dev), geometry(dev));
    let len = u64::from(sb.journal_sections) * g.journal_section_sectors * 512;
    dev.write_at(&vec![0u8; len as usize], START + SUPERBLOCK_SECTORS * 512)
        .unwrap();
}

/// A storage whose writes and syncs take a while, as a disk's do: long enough for other
/// threads to run in between (a writer writing the journal's oldest sections home, or
/// its section, while others fill the ring, wait, or flush).
struct Slow<S> {
    inner: S,
    write: std::time::Duration,
    sync: std::time::Duration,
}

impl<S: Storage> Storage for Slow<S> {
    fn size(&self) -> std::io::Result<u64> {
        self.inner.size()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        std::thread::sleep(self.write);
        self.inner.write_at(buf, offset)
    }
    fn sync(&self) -> std::io::Result<()> {
        std::thread::sleep(self.sync);
        self.inner.sync()
    }
}

/// A storage whose journal section writes panic once armed (a bug below, or a storage
/// that panics): the device is failed, not hung: later writes and flushes return an error.
#[test]
fn a_section_write_that_panics_fails_the_device_and_hangs_nothing() {
    use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
    struct Panicking {
        inner: MemStorage,
        armed: AtomicBool,
        journal: std::ops::Range<u64>,
    }
    impl Storage for Panicking {
        fn size(&self) -> std::io::Result<u64> {
            self.inner.size()
        }
        fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
            self.inner.read_at(buf, offset)
        }
        fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
            if self.armed.load(SeqCst) && self.journal.contains(&offset) {
                panic!("a section write panicked");
            }
            self.inner.write_at(buf, offset)
        }
        fn sync(&self) -> std::io::Result<()> {
            self.inner.sync()
        }
    }
    let m = MODES[0];
    let bs = m.3 as usize;
    let base = formatted(m, true);
    let (sb, g) = (superblock(&base), geometry(&base));
    let at = START + SUPERBLOCK_SECTORS * 512;
    let dev = Arc::new(Panicking {
        inner: base,
        armed: AtomicBool::new(false),
        journal: at..at + u64::from(sb.journal_sections) * g.journal_section_sectors * 512,
    });
    let vol = Arc::new(
        open_in(
            &(dev.clone() as Arc<dyn Storage>),
            m,
            false,
            IntegrityMode::Journal,
        )
        .unwrap(),
    );
    vol.write_at(&pattern(4 * bs, 1), 0, false).unwrap();
    vol.flush().unwrap();
    dev.armed.store(true, SeqCst);
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _ = vol.write_at(&pattern(4 * bs, 2), 0, false);
        vol.flush()
    }));
    assert!(panicked.is_err(), "the section write panicked");
    dev.armed.store(false, SeqCst);
    // On a thread of its own, so that a hang fails the test (the thread is left behind).
    let (tx, rx) = std::sync::mpsc::channel();
    let v = vol.clone();
    std::thread::spawn(move || {
        let w = v.write_at(&pattern(4 * bs, 3), 8 * bs as u64, false);
        let f = v.flush();
        let _ = tx.send((w.is_err(), f.map_err(|e| e.to_string())));
    });
    let (write_failed, flushed) = rx
        .recv_timeout(std::time::Duration::from_secs(20))
        .expect("a write and a flush after the panic returned");
    let e = flushed.expect_err("a flush after the panic fails");
    assert!(
        write_failed && e.contains("journal could not be written"),
        "{e}"
    );
}

/// Block `b`'s content in version `v`: its number and the version in its first bytes, so
/// that a reader can tell which version it got and that it belongs there.
fn versioned(bs: usize, b: u64, v: u32) -> Vec<u8> {
    let mut p = pattern(bs, (b as u8) ^ (v as u8));
    p[..8].copy_from_slice(&b.to_le_bytes());
    p[8..12].copy_from_slice(&v.to_le_bytes());
    p
}

/// Four writers (each its own blocks, writes of 1-8 blocks, a flush now and then) and two
/// readers at once, through many passes of a small ring while its sections are written
/// home by one writer and the others fill the rest or wait for it: every read holds a
/// version written there, never older than one that thread saw before (a writer sees its
/// own last write); after a close, the blocks' homes (the journal forgotten) hold each
/// block's last version.
#[test]
fn writers_and_readers_at_once_through_many_passes_of_the_ring() {
    use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
    for m in [MODES[0], MODES[2]] {
        let bs = m.3 as usize;
        let dev: Arc<dyn Storage> = Arc::new(Slow {
            inner: formatted(m, true),
            write: std::time::Duration::ZERO,
            sync: std::time::Duration::from_millis(2),
        });
        let vol = open(&dev, m, false);
        let (writers, per) = (4u64, 96u64);
        let span = writers * per;
        // Whose write of each block reached the volume last, as the versions say.
        let latest: Vec<std::sync::atomic::AtomicU32> =
            (0..span).map(|_| Default::default()).collect();
        let stop = AtomicBool::new(false);
        let check = |got: &[u8], first: u64, seen: &mut [u32], whose: &str| {
            for (i, g) in got.chunks(bs).enumerate() {
                let b = first + i as u64;
                let v = u32::from_le_bytes(g[8..12].try_into().unwrap());
                if v == 0 && g.iter().all(|&x| x == 0) {
                    assert_eq!(
                        seen[b as usize], 0,
                        "{m:?} {whose}: block {b} went back to zeros"
                    );
                    continue;
                }
                assert!(
                    g == versioned(bs, b, v),
                    "{m:?} {whose}: block {b} holds no version of its own"
                );
                assert!(
                    v >= seen[b as usize],
                    "{m:?} {whose}: block {b} went back from version {} to {v}",
                    seen[b as usize]
                );
                seen[b as usize] = v;
            }
        };
        std::thread::scope(|s| {
            let mut ws = Vec::new();
            for t in 0..writers {
                let (vol, latest, check) = (&vol, &latest, &check);
                ws.push(s.spawn(move || {
                    let mut seen = vec![0u32; span as usize];
                    for n in 1..=300u32 {
                        let k = 1 + (n as u64 * 7 + t) % 8;
                        let first = t * per + (n as u64 * 37 + t * 11) % (per - k);
                        let mut buf = Vec::with_capacity(k as usize * bs);
                        for b in first..first + k {
                            buf.extend(versioned(bs, b, n));
                        }
                        vol.write_at(&buf, first * bs as u64, false).unwrap();
                        for b in first..first + k {
                            latest[b as usize].store(n, SeqCst);
                        }
                        let got = read(vol, first * bs as u64, k as usize * bs).unwrap();
                        assert!(got == buf, "{m:?} writer {t}: its own write, read back");
                        check(&got, first, &mut seen, "writer");
                        if n % 16 == 0 {
                            vol.flush().unwrap();
                        }
                    }
                }));
            }
            for r in 0..2u64 {
                let (vol, stop, check) = (&vol, &stop, &check);
                s.spawn(move || {
                    let mut seen = vec![0u32; span as usize];
                    let mut n = 0u64;
                    while !stop.load(SeqCst) {
                        n += 1;
                        let first = (n * 53 + r * 101) % (span - 32);
                        let got = read(vol, first * bs as u64, 32 * bs).unwrap();
                        check(&got, first, &mut seen, "reader");
                    }
                });
            }
            for w in ws {
                w.join().unwrap();
            }
            stop.store(true, SeqCst);
        });
        let last: Vec<u8> = (0..span)
            .flat_map(|b| match latest[b as usize].load(SeqCst) {
                0 => vec![0u8; bs],
                v => versioned(bs, b, v),
            })
            .collect();
        assert!(
            read(&vol, 0, span as usize * bs).unwrap() == last,
            "{m:?}: before the close"
        );
        vol.close().unwrap();
        drop(vol);
        forget_journal(&*dev);
        let vol = open(&dev, m, true);
        assert!(
            read(&vol, 0, span as usize * bs).unwrap() == last,
            "{m:?}: at home"
        );
    }
}

/// Power cuts while three writers (each its own blocks, a flush after every eighth write)
/// fill a small ring, write their sections and write sections home at once, at writes
/// spread over the whole run, each cut every way: every block holds what its writer had
/// flushed or a later version, and verifies.
#[test]
fn power_cuts_under_concurrent_writers_lose_no_flushed_write() {
    let m = MODES[0];
    let bs = m.3 as usize;
    let base = formatted(m, true);
    let (writers, per) = (3usize, 256usize);
    let run = |dev: Arc<CrashDevice>| -> Vec<Durable> {
        // Slow writes: a writer's section is written while another writer flushes (which
        // waits for it when it holds that writer's blocks).
        let dev: Arc<dyn Storage> = Arc::new(Slow {
            inner: dev,
            write: std::time::Duration::from_micros(100),
            sync: std::time::Duration::ZERO,
        });
        let Ok(vol) = open_in(&dev, m, false, IntegrityMode::Journal) else {
            return vec![Durable::new(per, bs); writers];
        };
        std::thread::scope(|s| {
            let ws: Vec<_> = (0..writers)
                .map(|t| {
                    let vol = &vol;
                    s.spawn(move || {
                        // This writer's blocks.
                        let mut model = Durable::new(per, bs);
                        for n in 0..60usize {
                            // Up to 24 blocks: writes fill sections, not only flushes.
                            let k = 1 + (n * 5 + t) % 24;
                            let b = (n * 389 + t * 97) % (per - 24);
                            let p = pattern(k * bs, (n * writers + t) as u8);
                            model.writing(b, &p);
                            let at = ((t * per + b) * bs) as u64;
                            if vol.write_at(&p, at, false).is_err() {
                                break;
                            }
                            if n % 8 == 7 {
                                if vol.flush().is_err() {
                                    break;
                                }
                                model.flushed();
                            }
                        }
                        model
                    })
                })
                .collect();
            ws.into_iter().map(|w| w.join().unwrap()).collect()
        })
    };
    let dry = Arc::new(CrashDevice::new(base.clone(), None, Tear::Lost, true));
    run(dry.clone());
    let writes = dry.writes();
    assert!(writes > 150, "the workload writes {writes} times");
    let cuts = 150;
    for (i, tear) in [Tear::Lost, Tear::Prefix, Tear::Suffix]
        .iter()
        .cycle()
        .take(cuts)
        .enumerate()
    {
        let (what, dev) = cut(&base, 1 + i * writes / cuts, *tear, i / 3);
        let what = format!("{what} of about {writes}");
        let models = run(dev.clone());
        let got = after_the_cut(dev, m, writers * per * bs, &what);
        for (t, model) in models.iter().enumerate() {
            model.check(
                &got[t * per * bs..][..per * bs],
                &format!("{what}: writer {t}"),
            );
        }
    }
}

/// What blocks a power cut may leave: per block, its value at the last completed flush,
/// and the values written since.
#[derive(Clone)]
struct Durable {
    bs: usize,
    flushed: Vec<Vec<u8>>,
    since: Vec<Vec<Vec<u8>>>,
}

impl Durable {
    /// `blocks` blocks of `bs` bytes, zeros.
    fn new(blocks: usize, bs: usize) -> Durable {
        Durable {
            bs,
            flushed: vec![vec![0u8; bs]; blocks],
            since: vec![Vec::new(); blocks],
        }
    }

    /// A write of `data` from block `b` on is about to go out.
    fn writing(&mut self, b: usize, data: &[u8]) {
        for (i, v) in data.chunks(self.bs).enumerate() {
            self.since[b + i].push(v.to_vec());
        }
    }

    /// A flush returned: each block's last value is stable.
    fn flushed(&mut self) {
        for (f, s) in self.flushed.iter_mut().zip(self.since.iter_mut()) {
            if let Some(last) = s.pop() {
                *f = last;
            }
            s.clear();
        }
    }

    /// Every block of `got` holds its flushed value or a later one.
    fn check(&self, got: &[u8], what: &str) {
        for (b, g) in got.chunks(self.bs).enumerate() {
            assert!(
                g == self.flushed[b].as_slice() || self.since[b].iter().any(|v| v == g),
                "{what}: block {b} holds neither its flushed value nor a later one"
            );
        }
    }
}

/// The first `len` bytes of the volume on what `dev` left after its power cut, opened
/// read-write (the journal replayed).
fn after_the_cut(
    dev: Arc<CrashDevice>,
    m: (&str, &str, usize, u32),
    len: usize,
    what: &str,
) -> Vec<u8> {
    let img: Arc<dyn Storage> = Arc::new(
        Arc::try_unwrap(dev)
            .expect("every user is gone")
            .after_power_loss(),
    );
    read(&open(&img, m, false), 0, len).unwrap_or_else(|e| panic!("{what}: {e}"))
}

#[test]
fn a_tampered_sector_reads_as_eio_and_only_it() {
    for m in MODES {
        let dev: Arc<dyn Storage> = Arc::new(formatted(m, true));
        let vol = open(&dev, m, false);
        let bs = m.3 as u64;
        vol.write_at(&pattern(64 * bs as usize, 9), 0, false)
            .unwrap();
        vol.flush().unwrap();
        drop(vol);
        settle(&dev, m);
        let g = geometry(&*dev);
        let data_at = |b: u64| g.data_sector(b * bs / 512) * 512;
        let tag_at = |b: u64| g.tag_offset(b * bs / 512);
        let flip = |at: u64| {
            let mut x = [0u8];
            dev.read_at(&mut x, at).unwrap();
            x[0] ^= 0x20;
            dev.write_at(&x, at).unwrap();
        };
        // Ciphertext of block 5 and the tag of block 7.
        flip(data_at(5) + 100);
        flip(tag_at(7) + 1);
        // Block 9's ciphertext from before a rewrite, under its new tag.
        let mut old = vec![0u8; bs as usize];
        dev.read_at(&mut old, data_at(9)).unwrap();
        let vol = open(&dev, m, false);
        vol.write_at(&pattern(bs as usize, 77), 9 * bs, false)
            .unwrap();
        vol.flush().unwrap();
        drop(vol);
        settle(&dev, m);
        dev.write_at(&old, data_at(9)).unwrap();
        let vol = open(&dev, m, false);
        for b in 0..64u64 {
            let r = read(&vol, b * bs, bs as usize);
            if [5, 7, 9].contains(&b) {
                let e = r.expect_err(&format!("{m:?}: block {b} tampered"));
                assert_eq!(cryptblk_device::errno_of(&e), 5, "{m:?}: EIO ({e})");
            } else {
                assert_eq!(
                    r.unwrap(),
                    pattern(64 * bs as usize, 9)[(b * bs) as usize..][..bs as usize],
                    "{m:?}: block {b}"
                );
            }
        }
        assert!(
            read(&vol, 0, 64 * bs as usize).is_err(),
            "{m:?}: a range over them"
        );
        // A partial write into a tampered block fails too (its read-modify-write).
        assert!(vol.write_at(&[1, 2, 3], 5 * bs + 7, false).is_err());
        let errors = vol
            .stats()
            .integrity_errors
            .load(std::sync::atomic::Ordering::Relaxed);
        assert!(errors >= 4, "{m:?}: {errors} counted");
        // A whole-block write replaces it: it reads again.
        vol.write_at(&pattern(bs as usize, 5), 5 * bs, false)
            .unwrap();
        assert_eq!(
            read(&vol, 5 * bs, bs as usize).unwrap(),
            pattern(bs as usize, 5)
        );
    }
}

/// Not detected, by design of the format (the kernel's too; docs/security.md): a block's
/// ciphertext and tag both rolled back to an older version of that block at the same place.
#[test]
fn a_whole_block_rolled_back_with_its_tag_is_not_detected() {
    let m = MODES[0];
    let dev: Arc<dyn Storage> = Arc::new(formatted(m, true));
    let g = geometry(&*dev);
    let vol = open(&dev, m, false);
    vol.write_at(&pattern(512, 1), 0, false).unwrap();
    vol.flush().unwrap();
    drop(vol);
    settle(&dev, m);
    let (mut d, mut t) = (vec![0u8; 512], vec![0u8; 28]);
    dev.read_at(&mut d, g.data_sector(0) * 512).unwrap();
    dev.read_at(&mut t, g.tag_offset(0)).unwrap();
    let vol = open(&dev, m, false);
    vol.write_at(&pattern(512, 2), 0, false).unwrap();
    vol.flush().unwrap();
    drop(vol);
    settle(&dev, m);
    dev.write_at(&d, g.data_sector(0) * 512).unwrap();
    dev.write_at(&t, g.tag_offset(0)).unwrap();
    assert_eq!(
        read(&open(&dev, m, false), 0, 512).unwrap(),
        pattern(512, 1)
    );
}

#[test]
fn blocks_whose_home_write_was_lost_come_back_from_the_journal() {
    for m in MODES {
        let dev: Arc<dyn Storage> = Arc::new(formatted(m, true));
        let bs = m.3 as usize;
        let vol = open(&dev, m, false);
        vol.write_at(&pattern(3 * bs, 4), 2 * bs as u64, false)
            .unwrap();
        vol.flush().unwrap();
        drop(vol);
        // The blocks' home copies never made it (power lost after the journal's flush).
        let g = geometry(&*dev);
        dev.write_at(
            &vec![0xee; 3 * bs],
            g.data_sector((2 * bs / 512) as u64) * 512,
        )
        .unwrap();
        for ro in [true, false, false] {
            let vol = open(&dev, m, ro);
            assert_eq!(
                read(&vol, 2 * bs as u64, 3 * bs).unwrap(),
                pattern(3 * bs, 4),
                "{m:?}: ro={ro}"
            );
            // A read-only volume's flush and close write nothing (the replayed blocks stay
            // in memory).
            vol.close().unwrap();
        }
    }
}

#[test]
fn never_written_blocks_of_an_unwiped_volume_fail_and_written_ones_read() {
    let m = MODES[2];
    let dev: Arc<dyn Storage> = Arc::new(formatted(m, false));
    let vol = open(&dev, m, false);
    assert!(read(&vol, 0, 4096).is_err());
    vol.write_at(&pattern(8192, 3), 0, false).unwrap();
    assert_eq!(read(&vol, 0, 8192).unwrap(), pattern(8192, 3));
    assert!(read(&vol, 8192, 4096).is_err());
}

/// `--integrity-no-journal` (the kernel's mode 'D'): blocks and tags go straight home, the
/// journal is not touched after the open, and the volume reads the same in either mode.
#[test]
fn without_the_journal_writes_go_straight_home() {
    for m in [MODES[0], MODES[2], MODES[4]] {
        let dev: Arc<dyn Storage> = Arc::new(formatted(m, true));
        let vol = integrity_volume_on(
            Box::new(dev.clone()),
            START,
            cipher(m),
            false,
            IntegrityMode::Direct,
        )
        .unwrap();
        // As the open left it (emptied, as every read-write open does).
        let journal_at = START + 4096;
        let mut before = vec![0u8; 64 << 10];
        dev.read_at(&mut before, journal_at).unwrap();
        let p = pattern(3 << 20, 6);
        vol.write_at(&p, (15 << 20) + 4096, false).unwrap();
        vol.flush().unwrap();
        drop(vol);
        let mut after = vec![0u8; 64 << 10];
        dev.read_at(&mut after, journal_at).unwrap();
        assert!(before == after, "{m:?}: the journal was written");
        let vol = open(&dev, m, false);
        assert!(
            read(&vol, (15 << 20) + 4096, 3 << 20).unwrap() == p,
            "{m:?}"
        );
    }
}

#[test]
fn read_only_volumes_refuse_writes() {
    let m = MODES[0];
    let dev: Arc<dyn Storage> = Arc::new(formatted(m, true));
    let vol = open(&dev, m, true);
    assert!(vol.write_at(&[0u8; 512], 0, false).is_err());
}

/// Power cut at every write of a workload of writes and flushes (torn three ways, unsynced
/// writes lost or kept in order): afterwards every block verifies, and holds its value at
/// the last flush that completed or one written after it.
#[test]
fn power_cuts_lose_no_flushed_write_and_tear_no_block() {
    power_cuts(MODES[0], IntegrityMode::Journal);
}

/// The same in bitmap mode (a checksum, 512-byte blocks: a torn write never splits a
/// block): the regions marked when the power went have their tags recalculated on open,
/// so no block fails verification.
#[test]
fn power_cuts_in_bitmap_mode_leave_every_block_verifying() {
    power_cuts(MODES[4], IntegrityMode::Bitmap);
}

fn power_cuts(m: (&str, &str, usize, u32), mode: IntegrityMode) {
    let bs = m.3 as usize;
    let base = formatted(m, true);
    let blocks = 2048usize; // the part of the volume the workload writes
    // The workload: 120 writes of 1..=8 blocks, a flush after every fifth.
    let ops: Vec<(usize, usize, u8)> = (0..120)
        .map(|i| ((i * 389) % (blocks - 8), 1 + i % 8, i as u8))
        .collect();
    let run = |dev: Arc<CrashDevice>| -> Durable {
        let mut model = Durable::new(blocks, bs);
        let Ok(vol) = integrity_volume_on(Box::new(dev), START, cipher(m), false, mode) else {
            return model;
        };
        for (n, &(b, k, seed)) in ops.iter().enumerate() {
            let p = pattern(k * bs, seed);
            model.writing(b, &p);
            if vol.write_at(&p, (b * bs) as u64, false).is_err() {
                return model;
            }
            if n % 5 == 4 {
                if vol.flush().is_err() {
                    return model;
                }
                model.flushed();
            }
        }
        model
    };
    let dry = Arc::new(CrashDevice::new(base.clone(), None, Tear::Lost, true));
    run(dry.clone());
    let writes = dry.writes();
    assert!(writes > 40, "the workload writes {writes} times");
    // Every write of the workload, each cut one of three ways, the writes since the last
    // sync lost, kept, or every other one kept.
    for (i, tear) in [Tear::Lost, Tear::Prefix, Tear::Suffix]
        .iter()
        .cycle()
        .take(writes)
        .enumerate()
    {
        let (what, dev) = cut(&base, i + 1, *tear, i / 3);
        let what = format!("{what} of {writes}");
        let model = run(dev.clone());
        model.check(&after_the_cut(dev, m, blocks * bs, &what), &what);
    }
}

/// A section of the ring is reused only once what it held is home and stable: a flush
/// that commits the ring's second section writes the first two home (half the ring);
/// then writes with no flush fill the other half and reuse the first section. Cut at
/// every write of it, torn every way, the flushed blocks survive however the device kept
/// its unsynced writes (a home write lost while the new section that replaced the
/// block's old one was kept would lose them).
#[test]
fn a_section_is_reused_only_once_what_it_held_is_home_and_stable() {
    let m = MODES[0];
    let bs = m.3 as usize;
    let base = formatted(m, true);
    let (sb, g) = (superblock(&base), geometry(&base));
    let per = Journal::of(&sb, &g).unwrap().entries_per_section;
    assert_eq!(sb.journal_sections, 4, "the ring this test is written for");
    // A section and a half, flushed: sections 0 and 1, half the ring, which the flush
    // writes home. Then three sections in one request (2, 3, and 0 again: no sync between
    // them).
    let flushed = pattern((per + per / 2) * bs, 7);
    let later = pattern(3 * per * bs, 8);
    let at = (4 * per * bs) as u64;
    // Whether the flush returned.
    let run = |dev: Arc<CrashDevice>| -> bool {
        let Ok(vol) = open_in(&(dev as Arc<dyn Storage>), m, false, IntegrityMode::Journal) else {
            return false;
        };
        if vol.write_at(&flushed, 0, false).is_err() || vol.flush().is_err() {
            return false;
        }
        let _ = vol.write_at(&later, at, false);
        true
    };
    let dry = Arc::new(CrashDevice::new(base.clone(), None, Tear::Lost, true));
    assert!(run(dry.clone()));
    let writes = dry.writes();
    for n in 1..=writes {
        for (tear, unsynced) in [Tear::Lost, Tear::Prefix, Tear::Suffix]
            .into_iter()
            .flat_map(|t| (0..4).map(move |u| (t, u)))
        {
            let (what, dev) = cut(&base, n, tear, unsynced);
            let done = run(dev.clone());
            let got = after_the_cut(dev, m, flushed.len(), &what);
            for (b, (g, f)) in got.chunks(bs).zip(flushed.chunks(bs)).enumerate() {
                // Flushed once the flush returned; before, the old zeros or the new data.
                assert!(
                    g == f || (!done && g.iter().all(|&x| x == 0)),
                    "{what} of {writes}: flushed block {b}"
                );
            }
        }
    }
}

/// A device whose power fails in its write `n`, torn as `tear`, the writes since the
/// last sync lost, kept, or every other one kept (from the first or the second) as
/// `unsynced` (modulo 4) says; and what to call the cut.
fn cut(base: &MemStorage, n: usize, tear: Tear, unsynced: usize) -> (String, Arc<CrashDevice>) {
    let dev = CrashDevice::new(base.clone(), Some(n), tear, unsynced % 4 == 1);
    let (dev, unsynced) = match unsynced % 4 {
        0 => (dev, "lost"),
        1 => (dev, "kept"),
        2 => (dev.reordering(false), "every other kept from the first"),
        _ => (dev.reordering(true), "every other kept from the second"),
    };
    let what = format!("cut at write {n}, {tear:?}, unsynced writes {unsynced}");
    (what, Arc::new(dev))
}

/// A write with FUA is durable when it returns: in journal mode the journal's open section
/// is committed (a bare sync of the storage left the write in memory), so a power cut right
/// after it loses nothing it acknowledged; likewise straight home and in bitmap mode.
#[test]
fn a_fua_write_survives_a_power_cut_right_after_it() {
    for (m, mode) in [
        (MODES[0], IntegrityMode::Journal),
        (MODES[2], IntegrityMode::Journal),
        (MODES[0], IntegrityMode::Direct),
        (MODES[4], IntegrityMode::Bitmap),
    ] {
        let bs = m.3 as usize;
        let dev = Arc::new(CrashDevice::new(
            formatted(m, true),
            None,
            Tear::Lost,
            false,
        ));
        let vol =
            integrity_volume_on(Box::new(dev.clone()), START, cipher(m), false, mode).unwrap();
        let p = pattern(3 * bs, 42);
        vol.write_at(&p, 5 * bs as u64, true).unwrap();
        drop(vol);
        let img: Arc<dyn Storage> = Arc::new(
            Arc::try_unwrap(dev)
                .expect("every user is gone")
                .after_power_loss(),
        );
        let vol = open(&img, m, false);
        assert!(
            read(&vol, 5 * bs as u64, 3 * bs).unwrap() == p,
            "{m:?} {mode:?}: the FUA write was lost"
        );
    }
}

fn superblock(dev: &dyn Storage) -> Superblock {
    let mut sb = [0u8; 512];
    dev.read_at(&mut sb, START).unwrap();
    Superblock::parse(&sb).unwrap()
}

fn open_in(
    dev: &Arc<dyn Storage>,
    m: (&str, &str, usize, u32),
    ro: bool,
    mode: IntegrityMode,
) -> cryptblk_volume::Result<Volume> {
    integrity_volume_on(Box::new(dev.clone()), START, cipher(m), ro, mode)
}

/// Bitmap mode (the kernel's mode 'B'): the superblock says DIRTY_BITMAP while the device
/// is open; a clean close clears it and leaves an empty journal; a device left open keeps
/// its marks, and the next read-write open recalculates the tags of the marked regions
/// only (a block whose data changed under an unmarked region still fails). A read-only
/// open of such a device is refused, and so is bitmap mode under encryption.
#[test]
fn bitmap_mode_marks_regions_and_a_crash_recalculates_only_them() {
    let m = MODES[4];
    let bs = m.3 as u64;
    let dev: Arc<dyn Storage> = Arc::new(formatted(m, true));
    let vol = open_in(&dev, m, false, IntegrityMode::Bitmap).unwrap();
    assert_ne!(
        superblock(&*dev).flags & flags::DIRTY_BITMAP,
        0,
        "marked in use"
    );
    vol.write_at(&pattern(8 * bs as usize, 1), 0, false)
        .unwrap();
    vol.close().unwrap();
    let sb = superblock(&*dev);
    assert_eq!(sb.flags & flags::DIRTY_BITMAP, 0, "a clean close clears it");
    assert_eq!(sb.version, 5);
    let vol = open_in(&dev, m, false, IntegrityMode::Journal).unwrap();
    assert_eq!(
        read(&vol, 0, 8 * bs as usize).unwrap(),
        pattern(8 * bs as usize, 1)
    );
    drop(vol);

    // Left open (a crash): blocks 0..8 written, their region marked.
    let vol = open_in(&dev, m, false, IntegrityMode::Bitmap).unwrap();
    let size = vol.size();
    vol.write_at(&pattern(8 * bs as usize, 2), 0, false)
        .unwrap();
    vol.flush().unwrap();
    drop(vol);
    assert_ne!(superblock(&*dev).flags & flags::DIRTY_BITMAP, 0);
    // What a torn write leaves: block 3's data written, its tag not; and the same under
    // the last block, whose region (16 MiB further) was never marked.
    let g = geometry(&*dev);
    let last = size / bs - 1;
    for b in [3, last] {
        dev.write_at(&pattern(bs as usize, 9), g.data_sector(b * bs / 512) * 512)
            .unwrap();
    }
    let Err(e) = open_in(&dev, m, true, IntegrityMode::Journal) else {
        panic!("a read-only open of a marked device")
    };
    assert!(e.to_string().contains("read-write once"), "{e}");
    let aead = MODES[0];
    let enc: Arc<dyn Storage> = Arc::new(formatted(aead, false));
    assert!(
        open_in(&enc, aead, false, IntegrityMode::Bitmap).is_err(),
        "bitmap mode under encryption"
    );
    let vol = open_in(&dev, m, false, IntegrityMode::Journal).unwrap();
    assert_eq!(superblock(&*dev).flags & flags::DIRTY_BITMAP, 0);
    let mut want = pattern(8 * bs as usize, 2);
    want[3 * bs as usize..][..bs as usize].copy_from_slice(&pattern(bs as usize, 9));
    assert_eq!(
        read(&vol, 0, 8 * bs as usize).unwrap(),
        want,
        "recalculated"
    );
    assert!(
        read(&vol, last * bs, bs as usize).is_err(),
        "an unmarked region is not"
    );
}

/// A volume whose recalculation had not finished (`RECALCULATING`, integritysetup's
/// `--integrity-recalculate`): a read-write open recalculates from its position to the
/// end and leaves the position at the end, as the kernel does; before the position,
/// nothing changes.
#[test]
fn a_recalculating_volume_is_finished_on_open() {
    let m = MODES[5];
    let bs = m.3 as u64;
    let dev: Arc<dyn Storage> = Arc::new(formatted(m, false));
    let mut sb = superblock(&*dev);
    sb.flags |= flags::RECALCULATING;
    sb.recalc_sector = 16 * bs / 512;
    let mut area = vec![0u8; 4096];
    area[..64].copy_from_slice(&sb.to_bytes());
    dev.write_at(&area, START).unwrap();
    assert!(
        open_in(&dev, m, true, IntegrityMode::Journal).is_err(),
        "read-only"
    );
    let vol = open_in(&dev, m, false, IntegrityMode::Journal).unwrap();
    let size = vol.size();
    assert!(
        read(&vol, 15 * bs, bs as usize).is_err(),
        "before the position"
    );
    assert_eq!(
        read(&vol, 16 * bs, (size - 16 * bs) as usize).unwrap(),
        vec![0u8; (size - 16 * bs) as usize]
    );
    let sb = superblock(&*dev);
    assert_eq!(sb.recalc_sector, sb.provided_data_sectors);
    assert_ne!(
        sb.flags & flags::RECALCULATING,
        0,
        "the flag kept, as the kernel keeps it"
    );
}

/// A journal MAC (integritysetup's `--journal-integrity`): the superblock and every
/// section carry one; a journal left with entries replays with it; an entry's place
/// changed in the journal, or another key, is refused before anything is written.
#[test]
fn a_journal_mac_is_checked_on_every_replay() {
    let m = MODES[5];
    let bs = m.3 as u64;
    let mac = |key: u8| IntegrityHash::new("hmac-sha256", Some(&[key; 32]), 32, 512, None).unwrap();
    let keys = |key: u8| JournalKeys {
        mac: Some(mac(key)),
        crypt: None,
    };
    let dev = MemStorage::new(DEV);
    Integrity::format_with(
        &dev,
        START,
        cipher(m),
        keys(1),
        Some(SALT),
        true,
        &mut |_, _| {},
    )
    .unwrap();
    let dev: Arc<dyn Storage> = Arc::new(dev);
    let sb = superblock(&*dev);
    assert_ne!(sb.flags & flags::HAVE_JOURNAL_MAC, 0);
    let open_mac = |key: u8| {
        cryptblk_volume::integrity_volume_with(
            Box::new(dev.clone()),
            START,
            cipher(m),
            keys(key),
            false,
            IntegrityMode::Journal,
        )
    };
    assert!(
        open_in(&dev, m, false, IntegrityMode::Journal).is_err(),
        "no MAC given"
    );
    // Written through the journal and flushed; the home copies then lost (only the
    // journal has the blocks).
    let vol = open_mac(1).unwrap();
    vol.write_at(&pattern(4 * bs as usize, 3), 0, false)
        .unwrap();
    vol.flush().unwrap();
    drop(vol);
    let g = geometry(&*dev);
    dev.write_at(&vec![0u8; 4 * bs as usize], g.data_sector(0) * 512)
        .unwrap();
    let before = {
        let mut b = vec![0u8; DEV as usize];
        dev.read_at(&mut b, 0).unwrap();
        b
    };
    assert!(open_mac(2).is_err(), "another key");
    // The first entry's sector field (entry sector 0, offset 0 of section 0) changed.
    let j = START + 4096;
    let mut x = [0u8; 1];
    dev.read_at(&mut x, j).unwrap();
    dev.write_at(&[x[0] ^ 8], j).unwrap();
    let Err(e) = open_mac(1) else {
        panic!("a changed journal replayed")
    };
    assert!(e.to_string().contains("MAC does not verify"), "{e}");
    dev.write_at(&x, j).unwrap();
    let mut after = vec![0u8; DEV as usize];
    dev.read_at(&mut after, 0).unwrap();
    assert!(before == after, "the refused opens wrote nothing");
    let vol = open_mac(1).unwrap();
    assert_eq!(
        read(&vol, 0, 4 * bs as usize).unwrap(),
        pattern(4 * bs as usize, 3)
    );
}

/// An encrypted journal (integritysetup's `--journal-crypt`, a stream cipher): what a
/// write leaves in the journal is not its plaintext, and it replays with the key.
#[test]
fn an_encrypted_journal_replays_with_its_key_and_hides_the_data() {
    let m = MODES[4];
    let bs = m.3 as u64;
    for cipher_name in ["chacha20", "ctr-aes", "cbc-aes"] {
        let keys = || JournalKeys {
            mac: None,
            crypt: Some((cipher_name.into(), SecretBytes::from_slice(&[7u8; 32]))),
        };
        let dev = MemStorage::new(DEV);
        Integrity::format_with(
            &dev,
            START,
            cipher(m),
            keys(),
            Some(SALT),
            true,
            &mut |_, _| {},
        )
        .unwrap();
        let dev: Arc<dyn Storage> = Arc::new(dev);
        let open = || {
            cryptblk_volume::integrity_volume_with(
                Box::new(dev.clone()),
                START,
                cipher(m),
                keys(),
                false,
                IntegrityMode::Journal,
            )
            .unwrap()
        };
        let data = pattern(4 * bs as usize, 5);
        let vol = open();
        vol.write_at(&data, 0, false).unwrap();
        vol.flush().unwrap();
        drop(vol);
        // The home copies lost: only the journal has the blocks.
        let g = geometry(&*dev);
        dev.write_at(&vec![0u8; 4 * bs as usize], g.data_sector(0) * 512)
            .unwrap();
        let mut journal = vec![0u8; (g.initial_sectors - 8) as usize * 512];
        dev.read_at(&mut journal, START + 4096).unwrap();
        assert!(
            !journal.windows(64).any(|w| w == &data[..64]),
            "{cipher_name}: plaintext in the journal"
        );
        let vol = open();
        assert_eq!(
            read(&vol, 0, 4 * bs as usize).unwrap(),
            data,
            "{cipher_name}"
        );
    }
}

/// `base` with `more` zero bytes appended (a file or device that grew).
fn grown(mut base: MemStorage, more: u64) -> MemStorage {
    base.edit(|v| v.resize(v.len() + more as usize, 0));
    base
}

/// Resize over dm-integrity (cryptsetup refuses it): shrinking serves less and touches
/// nothing; growing into a larger device seals the new blocks as zeros, so they read as
/// zeros (not EIO), and the superblock then provides them, so the next open serves the
/// new size; existing data stays where it was; more than the device holds is refused.
#[test]
fn a_volume_grows_into_a_larger_device_and_shrinks_back() {
    for (m, mode) in MODES
        .iter()
        .map(|&m| (m, IntegrityMode::Journal))
        .chain([(MODES[0], IntegrityMode::Direct)])
    {
        let what = format!("{m:?} {mode:?}");
        let bs = m.3 as u64;
        let base = formatted(m, true);
        let old = geometry(&base).provided_data_sectors * 512;
        let dev: Arc<dyn Storage> = Arc::new(grown(base, (9 << 20) + 4096));
        let vol = open_in(&dev, m, false, mode).unwrap();
        assert_eq!(vol.size(), old, "{what}: opens at the superblock's size");
        let tail = pattern(64 << 10, 3);
        vol.write_at(&tail, old - (64 << 10), false).unwrap();

        let less = old - (1 << 20);
        assert_eq!(vol.resize(Some(less)).unwrap(), less, "{what}");
        assert!(
            read(&vol, less, 4096).is_err(),
            "{what}: read past the new end"
        );
        assert_eq!(superblock(&*dev).provided_data_sectors * 512, old, "{what}");
        assert!(
            vol.resize(Some(old + (64 << 20))).is_err(),
            "{what}: past the device"
        );
        assert_eq!(
            superblock(&*dev).provided_data_sectors * 512,
            old,
            "{what}: a refused growth grew nothing"
        );
        assert_eq!(vol.size(), less, "{what}");

        let new = vol.resize(None).unwrap();
        assert!(new > old + (8 << 20), "{what}: grew to {new} from {old}");
        assert_eq!(new % bs, 0, "{what}");
        assert_eq!(superblock(&*dev).provided_data_sectors * 512, new, "{what}");
        let fresh = read(&vol, old, (new - old) as usize)
            .unwrap_or_else(|e| panic!("{what}: the new blocks: {e}"));
        assert!(
            fresh.iter().all(|&b| b == 0),
            "{what}: the new blocks read zeros"
        );
        assert!(
            read(&vol, old - (64 << 10), 64 << 10).unwrap() == tail,
            "{what}"
        );
        assert!(
            vol.resize(Some(new + bs)).is_err(),
            "{what}: past the device"
        );

        // Writes across the old end and at the new one survive a close and an open.
        let across = pattern(16 << 10, 4);
        vol.write_at(&across, old - (8 << 10), false).unwrap();
        let end = pattern(bs as usize, 5);
        vol.write_at(&end, new - bs, false).unwrap();
        vol.flush().unwrap();
        drop(vol);
        let vol = open(&dev, m, false);
        assert_eq!(vol.size(), new, "{what}: reopened");
        assert!(
            read(&vol, old - (8 << 10), 16 << 10).unwrap() == across,
            "{what}"
        );
        assert!(read(&vol, new - bs, bs as usize).unwrap() == end, "{what}");
        assert!(
            read(&vol, old - (64 << 10), 56 << 10).unwrap() == tail[..56 << 10],
            "{what}"
        );
        // What is already provided grows back without another wipe.
        vol.resize(Some(less)).unwrap();
        assert_eq!(vol.resize(None).unwrap(), new, "{what}");
        assert!(read(&vol, new - bs, bs as usize).unwrap() == end, "{what}");
    }
}

/// Bitmap mode's bitmap is sized for the device it was opened with: growing it is
/// refused (shrinking still works); and so is any growth read-only.
#[test]
fn growth_is_refused_in_bitmap_mode_and_read_only() {
    let m = MODES[4];
    let base = formatted(m, true);
    let old = geometry(&base).provided_data_sectors * 512;
    let dev: Arc<dyn Storage> = Arc::new(grown(base, 4 << 20));
    let vol = open_in(&dev, m, true, IntegrityMode::Journal).unwrap();
    assert!(vol.resize(None).is_err());
    drop(vol);
    let vol = open_in(&dev, m, false, IntegrityMode::Bitmap).unwrap();
    let e = vol.resize(None).unwrap_err().to_string();
    assert!(e.contains("bitmap mode"), "{e}");
    assert_eq!(vol.resize(Some(old - 4096)).unwrap(), old - 4096);
    assert_eq!(superblock(&*dev).provided_data_sectors * 512, old);
}

/// A power cut at every write of a growth (the new blocks' data and tags, the
/// superblock), torn three ways: the device opens at the old size or the new, every block
/// of it verifies, and the data written before is intact; uncut, at the new size.
#[test]
fn a_power_cut_while_growing_leaves_the_old_size_or_the_new() {
    for m in [MODES[0], MODES[5]] {
        let base = formatted(m, true);
        let old = geometry(&base).provided_data_sectors * 512;
        let base = grown(base, 5 << 20);
        let before = pattern(256 << 10, 9);
        let prepared: Arc<dyn Storage> = Arc::new(base.clone());
        let vol = open(&prepared, m, false);
        vol.write_at(&before, old - (256 << 10), false).unwrap();
        vol.flush().unwrap();
        drop(vol);
        let base = MemStorage::from_vec({
            let mut v = vec![0u8; prepared.size().unwrap() as usize];
            prepared.read_at(&mut v, 0).unwrap();
            v
        });
        let grow = |dev: Arc<CrashDevice>| {
            if let Ok(vol) = integrity_volume_on(
                Box::new(dev),
                START,
                cipher(m),
                false,
                IntegrityMode::Journal,
            ) {
                let _ = vol.resize(None);
            }
        };
        let dry = Arc::new(CrashDevice::new(base.clone(), None, Tear::Lost, false));
        grow(dry.clone());
        let writes = dry.writes();
        assert!(writes > 8, "{m:?}: growing writes {writes} times");
        let img: Arc<dyn Storage> = Arc::new(
            Arc::try_unwrap(dry)
                .expect("every user is gone")
                .after_power_loss(),
        );
        let new = open(&img, m, false).size();
        assert!(
            new > old + (4 << 20),
            "{m:?}: uncut, grew from {old} to {new}"
        );
        for (i, tear) in [Tear::Lost, Tear::Prefix, Tear::Suffix]
            .iter()
            .cycle()
            .take(writes)
            .enumerate()
        {
            let what = format!("{m:?}: cut at write {}/{writes} {tear:?}", i + 1);
            let dev = Arc::new(CrashDevice::new(
                base.clone(),
                Some(i + 1),
                *tear,
                i % 2 == 1,
            ));
            grow(dev.clone());
            let img: Arc<dyn Storage> = Arc::new(
                Arc::try_unwrap(dev)
                    .expect("every user is gone")
                    .after_power_loss(),
            );
            let vol = open(&img, m, false);
            let size = vol.size();
            assert!(size == old || size == new, "{what}: opens at {size} bytes");
            let all = read(&vol, 0, size as usize).unwrap_or_else(|e| panic!("{what}: {e}"));
            assert!(
                all[(old - (256 << 10)) as usize..old as usize] == before,
                "{what}"
            );
            assert!(
                all[old as usize..].iter().all(|&b| b == 0),
                "{what}: the new blocks"
            );
        }
    }
}

/// A device that writes whole 4 KiB sectors only, as direct I/O does: a write of part of a
/// sector reads the sector, changes it and writes it back, not atomically (a pause of
/// 0.3 ms in between), so two such writes to one sector can lose one of them unless the caller
/// keeps them apart.
struct SectorRmw(MemStorage);

impl Storage for SectorRmw {
    fn size(&self) -> std::io::Result<u64> {
        self.0.size()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        self.0.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        const S: u64 = 4096;
        let (lo, hi) = (offset / S * S, (offset + buf.len() as u64).div_ceil(S) * S);
        if lo == offset && hi == offset + buf.len() as u64 {
            return self.0.write_at(buf, offset);
        }
        let mut whole = vec![0u8; (hi - lo) as usize];
        self.0.read_at(&mut whole, lo)?;
        std::thread::sleep(std::time::Duration::from_micros(300));
        let at = (offset - lo) as usize;
        whole[at..at + buf.len()].copy_from_slice(buf);
        self.0.write_at(&whole, lo)
    }
    fn sync(&self) -> std::io::Result<()> {
        self.0.sync()
    }
}

/// A growth runs while writes go on in the last area, whose metadata sectors hold both
/// their tags and the new blocks': on a device that rewrites whole sectors, every block
/// written meanwhile still verifies after a close and an open, holds what was written
/// last, and the new blocks read as zeros. (Straight home, every write rewrites its tags'
/// sector; without the lock the growth takes there, a tag was lost. Through the journal,
/// the writer writing sections home does, outside that lock: the growth waits for it.)
#[test]
fn a_volume_grows_while_writes_go_on_next_to_the_new_blocks() {
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering::SeqCst};
    for (m, mode) in [MODES[0], MODES[2]]
        .into_iter()
        .flat_map(|m| [IntegrityMode::Direct, IntegrityMode::Journal].map(|i| (m, i)))
    {
        let what = format!("{m:?} {mode:?}");
        let bs = m.3 as u64;
        let base = formatted(m, true);
        let old = geometry(&base).provided_data_sectors * 512;
        let dev: Arc<dyn Storage> = Arc::new(SectorRmw(grown(base, 6 << 20)));
        let vol = Arc::new(open_in(&dev, m, false, mode).unwrap());
        // The blocks just before the old end: the last area's, next to the new ones.
        let span = 64 * bs;
        let first = old - span;
        let (stop, rounds) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicU32::new(0)),
        );
        let writer = {
            let (vol, stop, rounds) = (vol.clone(), stop.clone(), rounds.clone());
            std::thread::spawn(move || {
                let mut last = vec![0u8; span as usize];
                let mut round = 0u8;
                while !stop.load(SeqCst) {
                    for i in (0..span / bs).rev() {
                        let p = pattern(bs as usize, round ^ i as u8);
                        vol.write_at(&p, first + i * bs, false).unwrap();
                        last[(i * bs) as usize..][..bs as usize].copy_from_slice(&p);
                    }
                    round = round.wrapping_add(1);
                    rounds.fetch_add(1, SeqCst);
                }
                vol.flush().unwrap();
                last
            })
        };
        while rounds.load(SeqCst) < 2 {
            std::thread::yield_now();
        }
        let new = vol.resize(None).unwrap();
        let during = rounds.load(SeqCst);
        stop.store(true, SeqCst);
        let last = writer.join().unwrap();
        assert!(new > old, "{what}");
        vol.close().unwrap();
        drop(vol);
        if mode == IntegrityMode::Journal {
            // What went home (a replay would write the last blocks' tags again).
            forget_journal(&*dev);
        }
        let vol = open(&dev, m, false);
        assert_eq!(vol.size(), new, "{what}");
        let got = read(&vol, first, span as usize)
            .unwrap_or_else(|e| panic!("{what}: after {during} rounds: {e}"));
        assert!(
            got == last,
            "{what}: the last area holds what was written last"
        );
        let fresh = read(&vol, old, (new - old) as usize)
            .unwrap_or_else(|e| panic!("{what}: the new blocks: {e}"));
        assert!(
            fresh.iter().all(|&b| b == 0),
            "{what}: the new blocks read zeros"
        );
    }
}
