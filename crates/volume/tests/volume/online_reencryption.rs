//! Online reencryption: `reencrypt_online` changes the volume key of a LUKS2 volume (made
//! by the real cryptsetup) while client threads read and write it. Every read must return
//! what the model says, during and after; the result must open in cryptsetup, hold the
//! model's data under a new volume key (checked by decrypting with the key cryptsetup
//! dumps), and a job stopped half-way must be one cryptsetup resumes.

use crate::common::*;
use cryptblk_crypto::{CipherSpec, HashAlg, KdfRequest};
use cryptblk_device::BlockDevice;
use cryptblk_format::LuksHeader;
use cryptblk_format::luks2::{Luks2Header, ReencryptOutcome, ReencryptRequest, ResilienceRequest};
use cryptblk_volume::{OpenOptions, VolumeParams, open_plain, reencrypt_online, unlock_luks};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

const MIB: u64 = 1 << 20;
const PASS: &[u8] = b"online rotation";
const HEADER: u64 = 16 * MIB;

fn kdf() -> KdfRequest {
    KdfRequest {
        forced_iterations: Some(1000),
        ..KdfRequest::luks1_default()
    }
}

/// A cryptsetup-made LUKS2 volume of `data` bytes of data (4096-byte sectors), filled
/// with a pattern through cryptblk; returns the image, the key file and the pattern.
fn volume(dir: &Path, data: u64) -> (PathBuf, PathBuf, Vec<u8>) {
    let img = image(dir, "v.img", HEADER + data);
    let key = key_file(dir, "pass", PASS);
    cryptsetup(&[
        "luksFormat",
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
        key.to_str().unwrap(),
        img.to_str().unwrap(),
    ]);
    let u = unlock(&img, &OpenOptions::default());
    let mut x = 0x1234_5678u32;
    let plain: Vec<u8> = (0..u.volume.size())
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect();
    u.volume.write_at(&plain, 0, false).unwrap();
    u.volume.flush().unwrap();
    (img, key, plain)
}

/// The client threads, the model they keep, the operations they did, and (with
/// `power_cut`) the ranges whose write was in flight when the storage failed.
type Clients = (
    Vec<std::thread::JoinHandle<()>>,
    Arc<Mutex<Vec<u8>>>,
    Arc<AtomicU64>,
    Arc<Mutex<Vec<(usize, usize)>>>,
);

/// Client threads, each owning one stretch of the volume: random reads (checked against
/// the model) and writes (aligned, and unaligned through read-modify-write) until told
/// to stop. With `power_cut`, writes are FUA (acknowledged = durable) and a failing
/// storage ends a thread, its write in flight recorded as of unknown content.
fn clients(
    vol: Arc<dyn BlockDevice>,
    model: Vec<u8>,
    threads: u64,
    stop: Arc<AtomicBool>,
    power_cut: bool,
) -> Clients {
    let model = Arc::new(Mutex::new(model));
    let ops = Arc::new(AtomicU64::new(0));
    let unknown = Arc::new(Mutex::new(Vec::new()));
    let size = vol.size();
    let region = size / threads / 4096 * 4096;
    let handles = (0..threads)
        .map(|t| {
            let (vol, model, ops, stop, unknown) = (
                vol.clone(),
                model.clone(),
                ops.clone(),
                stop.clone(),
                unknown.clone(),
            );
            std::thread::spawn(move || {
                let mut x = 0x9e37_79b9u64 ^ (t + 1);
                let mut rnd = move |n: u64| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x % n
                };
                let base = t * region;
                let mut buf = vec![0u8; 256 << 10];
                while !stop.load(Ordering::Relaxed) {
                    let unaligned = rnd(4) == 0;
                    let len = if unaligned {
                        1 + rnd(9000)
                    } else {
                        4096 * (1 + rnd(64))
                    };
                    let off = base
                        + if unaligned {
                            rnd(region - len)
                        } else {
                            rnd((region - len) / 4096) * 4096
                        };
                    let (o, l) = (off as usize, len as usize);
                    if rnd(2) == 0 {
                        if let Err(e) = vol.read_at(&mut buf[..l], off) {
                            assert!(power_cut, "read at {off}: {e}");
                            return;
                        }
                        let m = model.lock().unwrap();
                        assert!(
                            buf[..l] == m[o..o + l],
                            "read of {len} bytes at {off} differs from what was written"
                        );
                    } else {
                        let fill = rnd(256) as u8;
                        buf[..l]
                            .iter_mut()
                            .enumerate()
                            .for_each(|(i, b)| *b = fill ^ i as u8);
                        if let Err(e) = vol.write_at(&buf[..l], off, power_cut) {
                            assert!(power_cut, "write at {off}: {e}");
                            unknown.lock().unwrap().push((o, l));
                            return;
                        }
                        // Only this thread touches its stretch.
                        model.lock().unwrap()[o..o + l].copy_from_slice(&buf[..l]);
                    }
                    ops.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    (handles, model, ops, unknown)
}

fn request(resilience: ResilienceRequest) -> ReencryptRequest {
    ReencryptRequest {
        cipher: Some(CipherSpec::parse("aes-xts-plain64").unwrap()),
        key_len: Some(32),
        sector_size: None,
        resilience,
        kdf: kdf(),
        keyslot_encryption: None,
    }
}

/// Reads the whole data area decrypted with `key` as a plain mapping.
fn decrypt_with(img: &Path, key: &[u8]) -> Vec<u8> {
    let params = VolumeParams {
        cipher: CipherSpec::parse("aes-xts-plain64").unwrap(),
        sector_size: 4096,
        iv: cryptblk_crypto::IvOptions::default(),
        data_offset: HEADER,
        data_length: None,
        read_only: true,
        allow_discards: false,
    };
    let v = open_plain(img, key, &params).unwrap();
    let mut out = vec![0u8; v.size() as usize];
    v.read_at(&mut out, 0).unwrap();
    out
}

/// `unlock_luks` with PASS, retried while the image is busy. Its lock is an flock on the
/// open file: another test of this binary starting a tool (cryptsetup) forks, and until the
/// child execs it holds a copy of every descriptor, our closed one included, so a lock just
/// released can be seen held for that moment. Anything else fails at once.
fn unlock(img: &Path, opts: &OpenOptions) -> cryptblk_volume::UnlockedLuks {
    for _ in 0..100 {
        match unlock_luks(img, opts, PASS) {
            Err(cryptblk_volume::Error::Busy(_)) => {
                std::thread::sleep(std::time::Duration::from_millis(20))
            }
            r => return r.unwrap(),
        }
    }
    panic!("{} stayed busy for 2 s", img.display())
}

/// Runs the job on a served volume under client load; `stop_after` steps, or to the end.
fn run_online(
    img: &Path,
    plain: Vec<u8>,
    resilience: ResilienceRequest,
    stop_after: Option<u32>,
) -> (ReencryptOutcome, Vec<u8>, u32, [u64; 2]) {
    let u = unlock(img, &OpenOptions::default());
    let mut hfile = u.header_file;
    let vol: Arc<cryptblk_volume::Volume> = Arc::new(u.volume);
    let mut hdr = Luks2Header::read(&mut hfile).unwrap();
    let data_size = std::fs::metadata(img).unwrap().len();
    hdr.reencrypt_init(&mut hfile, data_size, PASS, None, &request(resilience))
        .unwrap();
    let stop_clients = Arc::new(AtomicBool::new(false));
    let (handles, model, ops, _) = clients(vol.clone(), plain, 3, stop_clients.clone(), false);
    let steps = std::cell::Cell::new(0u32);
    let mut last = 0;
    let outcome = reencrypt_online(
        &vol,
        &mut hdr,
        &mut hfile,
        PASS,
        None,
        Some(4 * MIB),
        &|| stop_after.is_some_and(|n| steps.get() >= n),
        &mut |done, total| {
            assert!(
                done > last && done <= total,
                "progress {done}/{total} after {last}"
            );
            last = done;
            steps.set(steps.get() + 1);
        },
    )
    .unwrap();
    // Clients go on a little under the layout after the job, then stop.
    std::thread::sleep(std::time::Duration::from_millis(200));
    stop_clients.store(true, Ordering::Relaxed);
    for h in handles {
        h.join().expect("a client thread failed");
    }
    assert!(ops.load(Ordering::Relaxed) > 100, "the clients hardly ran");
    let model = model.lock().unwrap().clone();
    let mut all = vec![0u8; vol.size() as usize];
    vol.read_at(&mut all, 0).unwrap();
    assert!(all == model, "the served volume differs from the model");
    vol.flush().unwrap();
    let st = vol.stats();
    let hot = [
        st.hot_zone_reads.load(Ordering::Relaxed),
        st.hot_zone_waits.load(Ordering::Relaxed),
    ];
    (outcome, model, steps.get(), hot)
}

#[test]
fn a_served_volume_is_reencrypted_under_client_load_with_each_resilience() {
    let mut hot = [0; 2];
    for resilience in [
        ResilienceRequest::Checksum(HashAlg::Sha256),
        ResilienceRequest::Journal,
        ResilienceRequest::None,
    ] {
        let dir = tempfile::tempdir().unwrap();
        let (img, key, plain) = volume(dir.path(), 48 * MIB);
        let old_key = dump_volume_key(&img, None, &key);
        let (outcome, model, steps, h) = run_online(&img, plain, resilience, None);
        hot = [hot[0] + h[0], hot[1] + h[1]];
        assert_eq!(outcome, ReencryptOutcome::Finished, "{resilience:?}");
        assert!(
            steps >= 12,
            "{resilience:?}: {steps} steps of 4 MiB for 48 MiB"
        );
        // cryptsetup sees a finished LUKS2 volume under a new key holding the model.
        assert_eq!(
            test_passphrase(&img, None, &key, None),
            0,
            "cryptsetup refuses the passphrase after {resilience:?}"
        );
        let dump = luks_dump(&img, None);
        assert!(
            !dump.contains("reencrypt"),
            "{resilience:?} left metadata:\n{dump}"
        );
        let new_key = dump_volume_key(&img, None, &key);
        assert_ne!(
            new_key, old_key,
            "{resilience:?}: the volume key did not change"
        );
        assert_eq!(new_key.len(), 32);
        assert!(
            decrypt_with(&img, &new_key) == model,
            "{resilience:?}: the data under the new key is not what the clients wrote"
        );
    }
    // The clients met the steps' zones: reads across them, writes that waited.
    assert!(
        hot[0] > 0 && hot[1] > 0,
        "hot-zone reads and waits: {hot:?}"
    );
}

#[test]
fn a_job_stopped_while_serving_is_resumed_by_cryptsetup() {
    let dir = tempfile::tempdir().unwrap();
    let (img, key, plain) = volume(dir.path(), 32 * MIB);
    let (outcome, model, steps, _) = run_online(
        &img,
        plain,
        ResilienceRequest::Checksum(HashAlg::Sha256),
        Some(3),
    );
    assert_eq!(outcome, ReencryptOutcome::Stopped);
    // Asked after the 3rd step's progress, the stop is seen at the end of the 4th.
    assert_eq!(steps, 4);
    // Half done: cryptblk reads the model through both keys, cryptsetup finishes the job.
    let u = unlock(&img, &OpenOptions::default());
    assert_eq!(u.volume.segment_spans().len(), 2, "new key, then old key");
    let mut all = vec![0u8; u.volume.size() as usize];
    u.volume.read_at(&mut all, 0).unwrap();
    assert!(all == model);
    drop(u);
    cryptsetup(&[
        "reencrypt",
        "-q",
        "--resume-only",
        "--force-offline-reencrypt",
        "--key-file",
        key.to_str().unwrap(),
        img.to_str().unwrap(),
    ]);
    let new_key = dump_volume_key(&img, None, &key);
    assert!(decrypt_with(&img, &new_key) == model);
}

#[test]
fn a_read_only_volume_refuses_an_online_job_and_nothing_changes() {
    let dir = tempfile::tempdir().unwrap();
    let (img, key, _) = volume(dir.path(), 8 * MIB);
    let before = std::fs::read(&img).unwrap();
    let opts = OpenOptions {
        read_only: true,
        ..OpenOptions::default()
    };
    let u = unlock(&img, &opts);
    let mut rw = open_rw(&img);
    let mut hdr = Luks2Header::read(&mut rw).unwrap();
    assert!(!hdr.in_reencryption());
    let err = reencrypt_online(
        &u.volume,
        &mut hdr,
        &mut rw,
        PASS,
        None,
        None,
        &|| false,
        &mut |_, _| {},
    )
    .unwrap_err();
    assert!(err.to_string().contains("read-only"), "{err}");
    assert!(std::fs::read(&img).unwrap() == before, "the image changed");
    assert_eq!(test_passphrase(&img, None, &key, None), 0);
}

/// Power cuts at points spread over an online job under client load: the storage (header
/// and data, one [`CrashDevice`]) loses its unsynced writes and tears the one in flight.
/// After each cut the header loads, a read-write open's recovery brings back a consistent
/// layout, every byte the clients had written (FUA) reads back, and resuming the job
/// offline finishes it with the data intact. Checksum resilience lets writes into the
/// rewritten part of a step's zone go ahead, which the recovery must keep; a journal's
/// recovery rewrites the whole zone, so its writes wait for the step.
#[test]
fn power_cuts_during_an_online_job_under_client_load_lose_no_acknowledged_write() {
    use cryptblk_crypto::SectorCipher;
    use cryptblk_format::{CrashDevice, FormatOptions, MemStorage, Tear};
    const DATA_OFFSET: u64 = 2 * MIB;
    const DATA_LEN: u64 = 16 * MIB;
    const SIZE: u64 = DATA_OFFSET + DATA_LEN;
    let base = {
        let mut dev = MemStorage::new(SIZE);
        let mut opts = FormatOptions::new(kdf());
        opts.sector_size = 4096;
        opts.data_offset = Some(DATA_OFFSET);
        opts.luks2_keyslots_size = Some(DATA_OFFSET - 2 * 16 * 1024);
        Luks2Header::format(&mut dev, &opts, &[0x5au8; 64], PASS).unwrap();
        dev
    };
    // The volume as the layout now says, over `dev`.
    let open = |dev: Arc<CrashDevice>| {
        let h = Luks2Header::read(&mut &*dev).unwrap();
        let (_, segs) = h.unlock_segments(&mut &*dev, PASS, None, SIZE).unwrap();
        let segs = segs
            .into_iter()
            .map(|s| cryptblk_volume::DataSegment {
                start: s.start,
                len: s.len,
                storage_offset: s.storage_offset,
                cipher: SectorCipher::new(s.cipher, &s.key, s.sector_size, s.iv).unwrap(),
                zero: false,
                integrity: None,
            })
            .collect();
        Arc::new(cryptblk_volume::Volume::with_segments(Box::new(dev), segs, false, false).unwrap())
    };
    let run = |dev: Arc<CrashDevice>, resilience, model: Vec<u8>| {
        let vol = open(dev.clone());
        let mut hdr = Luks2Header::read(&mut &*dev).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let (handles, model, _, unknown) = clients(vol.clone(), model, 2, stop.clone(), true);
        let r = hdr
            .reencrypt_init(&mut &*dev, SIZE, PASS, None, &request(resilience))
            .and_then(|_| {
                reencrypt_online(
                    &vol,
                    &mut hdr,
                    &mut &*dev,
                    PASS,
                    None,
                    Some(4 * MIB),
                    &|| false,
                    &mut |_, _| {},
                )
                .map_err(|e| cryptblk_format::Error::Io(std::io::Error::other(e.to_string())))
            });
        stop.store(true, Ordering::Relaxed);
        for h in handles {
            h.join().expect("a client thread failed");
        }
        let model = model.lock().unwrap().clone();
        let unknown = unknown.lock().unwrap().clone();
        (r.is_ok(), model, unknown)
    };
    let plain = {
        let vol = open(Arc::new(CrashDevice::new(
            base.clone(),
            None,
            Tear::Lost,
            true,
        )));
        let mut p = vec![0u8; vol.size() as usize];
        vol.read_at(&mut p, 0).unwrap();
        p
    };
    for resilience in [
        ResilienceRequest::Checksum(HashAlg::Sha256),
        ResilienceRequest::Journal,
    ] {
        // Roughly how many writes a job under load issues.
        let dry = Arc::new(CrashDevice::new(base.clone(), None, Tear::Lost, true));
        let (ok, _, _) = run(dry.clone(), resilience, plain.clone());
        assert!(ok, "{resilience:?}: the uninterrupted job");
        let writes = dry.writes();
        for (i, tear) in [Tear::Lost, Tear::Prefix, Tear::Suffix]
            .iter()
            .cycle()
            .take(24)
            .enumerate()
        {
            let n = 1 + writes * (i + 1) / 25;
            let keep = i % 2 == 1;
            let what = format!("{resilience:?} cut at write {n}/{writes} {tear:?} keep={keep}");
            let dev = Arc::new(CrashDevice::new(base.clone(), Some(n), *tear, keep));
            let (_, model, unknown) = run(dev.clone(), resilience, plain.clone());
            let img = Arc::try_unwrap(dev)
                .expect("every user is gone")
                .after_power_loss();
            let mut h = Luks2Header::read(&mut &img).unwrap_or_else(|e| panic!("{what}: {e}"));
            h.recover_interrupted_step(&mut &img, &&img, PASS, None, SIZE)
                .unwrap_or_else(|e| panic!("{what}: recovery: {e}"));
            let check = |when: &str| {
                let vol = open(Arc::new(CrashDevice::new(
                    img.clone(),
                    None,
                    Tear::Lost,
                    true,
                )));
                let mut got = vec![0u8; vol.size() as usize];
                vol.read_at(&mut got, 0).unwrap();
                let mut want = model.clone();
                for &(o, l) in &unknown {
                    want[o..o + l].copy_from_slice(&got[o..o + l]);
                }
                if let Some(b) = (0..got.len() / 4096)
                    .find(|b| got[b * 4096..][..4096] != want[b * 4096..][..4096])
                {
                    panic!("{what}: block {b} differs {when}");
                }
            };
            check("after recovery");
            let mut h = Luks2Header::read(&mut &img).unwrap();
            if h.in_reencryption() {
                let out = h
                    .reencrypt_run(
                        &mut &img,
                        &&img,
                        SIZE,
                        PASS,
                        None,
                        Some(4 * MIB),
                        &|| false,
                        &mut |_, _| {},
                    )
                    .unwrap_or_else(|e| panic!("{what}: resume: {e}"));
                assert_eq!(out, ReencryptOutcome::Finished, "{what}");
            }
            check("after resuming");
        }
    }
}

/// Power cuts during online jobs that move the data (a key change with
/// `--reduce-device-size`, a data-move encryption `--encrypt --reduce-device-size`) under
/// client load, every write FUA. A data shift's crash recovery copies the whole hot zone
/// again from the old shifted bytes, so a client's write into a rewritten piece before
/// the step is committed would be overwritten by it: such writes must wait for the step.
/// After each cut the recovery keeps every acknowledged write, and so does the resumed job.
#[test]
fn power_cuts_during_an_online_data_shift_under_client_load_lose_no_acknowledged_write() {
    use cryptblk_crypto::SectorCipher;
    use cryptblk_format::{CrashDevice, FormatOptions, MemStorage, Tear};
    const DATA_OFFSET: u64 = 2 * MIB;
    const SIZE: u64 = DATA_OFFSET + 16 * MIB;
    const SHIFT: u64 = 4 * MIB;
    let open = |dev: Arc<CrashDevice>| {
        let h = Luks2Header::read(&mut &*dev).unwrap();
        let (_, segs) = h.unlock_segments(&mut &*dev, PASS, None, SIZE).unwrap();
        let segs = segs
            .into_iter()
            .map(|s| cryptblk_volume::DataSegment {
                start: s.start,
                len: s.len,
                storage_offset: s.storage_offset,
                cipher: SectorCipher::new(s.cipher, &s.key, s.sector_size, s.iv).unwrap(),
                zero: false,
                integrity: None,
            })
            .collect();
        Arc::new(cryptblk_volume::Volume::with_segments(Box::new(dev), segs, false, false).unwrap())
    };
    // A key change moving the data SHIFT bytes up, initialised (not started).
    let key_change = {
        let mut dev = MemStorage::new(SIZE);
        let mut opts = FormatOptions::new(kdf());
        opts.sector_size = 4096;
        opts.data_offset = Some(DATA_OFFSET);
        opts.luks2_keyslots_size = Some(DATA_OFFSET - 2 * 16 * 1024);
        let mut h = Luks2Header::format(&mut dev, &opts, &[0x5au8; 64], PASS).unwrap();
        let req = request(ResilienceRequest::Checksum(HashAlg::Sha256));
        h.reencrypt_shift_init(&mut dev, SIZE, PASS, None, &req, SHIFT)
            .unwrap();
        dev
    };
    // A plaintext device encrypted in place with its header at its head (2 MiB).
    let data_move = {
        let mut dev = MemStorage::new(SIZE);
        let mut x = 0x2545_f491u32;
        let pattern: Vec<u8> = (0..SIZE)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                x as u8
            })
            .collect();
        cryptblk_format::Storage::write_at(&dev, &pattern, 0).unwrap();
        // 512-byte sectors: the served plaintext's blocks (a volume's block size is fixed
        // when it opens).
        let req = request(ResilienceRequest::Checksum(HashAlg::Sha256));
        Luks2Header::encrypt_shift_init(&mut dev, 2 * DATA_OFFSET, PASS, &req).unwrap();
        dev
    };
    let run = |dev: Arc<CrashDevice>, model: Vec<u8>| {
        let vol = open(dev.clone());
        let mut hdr = Luks2Header::read(&mut &*dev).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let (handles, model, ops, unknown) = clients(vol.clone(), model, 2, stop.clone(), true);
        let r = reencrypt_online(
            &vol,
            &mut hdr,
            &mut &*dev,
            PASS,
            None,
            None,
            &|| false,
            &mut |_, _| {},
        );
        stop.store(true, Ordering::Relaxed);
        for h in handles {
            h.join().expect("a client thread failed");
        }
        let model = model.lock().unwrap().clone();
        let unknown = unknown.lock().unwrap().clone();
        (r.is_ok(), model, ops.load(Ordering::Relaxed), unknown)
    };
    for (job, base) in [
        ("key change with a data shift", key_change),
        ("data-move encryption", data_move),
    ] {
        let start = {
            let vol = open(Arc::new(CrashDevice::new(
                base.clone(),
                None,
                Tear::Lost,
                true,
            )));
            let mut p = vec![0u8; vol.size() as usize];
            vol.read_at(&mut p, 0).unwrap();
            p
        };
        let dry = Arc::new(CrashDevice::new(base.clone(), None, Tear::Lost, true));
        let (ok, _, ops, _) = run(dry.clone(), start.clone());
        assert!(ok && ops > 0, "{job}: the uninterrupted job");
        let writes = dry.writes();
        for (i, tear) in [Tear::Lost, Tear::Prefix, Tear::Suffix]
            .iter()
            .cycle()
            .take(15)
            .enumerate()
        {
            let n = 1 + writes * (i + 1) / 16;
            let keep = i % 2 == 1;
            let what = format!("{job}: cut at write {n}/{writes} {tear:?} keep={keep}");
            let dev = Arc::new(CrashDevice::new(base.clone(), Some(n), *tear, keep));
            let (_, model, _, unknown) = run(dev.clone(), start.clone());
            let img = Arc::try_unwrap(dev)
                .expect("every user is gone")
                .after_power_loss();
            let mut h = Luks2Header::read(&mut &img).unwrap_or_else(|e| panic!("{what}: {e}"));
            h.recover_interrupted_step(&mut &img, &&img, PASS, None, SIZE)
                .unwrap_or_else(|e| panic!("{what}: recovery: {e}"));
            let check = |when: &str| {
                let vol = open(Arc::new(CrashDevice::new(
                    img.clone(),
                    None,
                    Tear::Lost,
                    true,
                )));
                // A data move hands the moved copy's space back when it finishes: the
                // volume grows then, and the model covers what it was.
                assert!(
                    vol.size() >= model.len() as u64,
                    "{what}: the volume shrank"
                );
                let mut got = vec![0u8; model.len()];
                vol.read_at(&mut got, 0).unwrap();
                let mut want = model.clone();
                for &(o, l) in &unknown {
                    want[o..o + l].copy_from_slice(&got[o..o + l]);
                }
                if let Some(b) = (0..got.len() / 4096)
                    .find(|b| got[b * 4096..][..4096] != want[b * 4096..][..4096])
                {
                    panic!("{what}: block {b} differs {when}");
                }
            };
            check("after recovery");
            let mut h = Luks2Header::read(&mut &img).unwrap();
            if h.in_reencryption() {
                let out = h
                    .reencrypt_run(
                        &mut &img,
                        &&img,
                        SIZE,
                        PASS,
                        None,
                        None,
                        &|| false,
                        &mut |_, _| {},
                    )
                    .unwrap_or_else(|e| panic!("{what}: resume: {e}"));
                assert_eq!(out, ReencryptOutcome::Finished, "{what}");
            }
            check("after resuming");
        }
    }
}

/// A key change that moves the data 4 MiB up (cryptsetup's backward data shift), started
/// offline and run while client threads read (checked against the model) and write: a
/// read of a piece not yet rewritten must come from the data's old place, a rewritten one
/// from its new place. cryptsetup accepts the result and the model reads back.
#[test]
fn a_data_shift_under_client_load_reads_every_piece_from_where_it_is() {
    let dir = tempfile::tempdir().unwrap();
    let (img, key, plain) = volume(dir.path(), 36 * MIB);
    {
        let mut rw = open_rw(&img);
        let mut hdr = Luks2Header::read(&mut rw).unwrap();
        let size = std::fs::metadata(&img).unwrap().len();
        let req = request(ResilienceRequest::Checksum(HashAlg::Sha256));
        hdr.reencrypt_shift_init(&mut rw, size, PASS, None, &req, 4 * MIB)
            .unwrap();
    }
    let u = unlock(&img, &OpenOptions::default());
    let mut hfile = u.header_file;
    let vol: Arc<cryptblk_volume::Volume> = Arc::new(u.volume);
    assert_eq!(vol.size(), 32 * MIB, "the shift gives up 4 MiB");
    let mut hdr = Luks2Header::read(&mut hfile).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let start = plain[..32 * MIB as usize].to_vec();
    let (handles, model, ops, _) = clients(vol.clone(), start, 3, stop.clone(), false);
    let outcome = reencrypt_online(
        &vol,
        &mut hdr,
        &mut hfile,
        PASS,
        None,
        None,
        &|| false,
        &mut |_, _| {},
    )
    .unwrap();
    assert_eq!(outcome, ReencryptOutcome::Finished);
    std::thread::sleep(std::time::Duration::from_millis(200));
    stop.store(true, Ordering::Relaxed);
    for h in handles {
        h.join().expect("a client thread failed");
    }
    assert!(ops.load(Ordering::Relaxed) > 100, "the clients hardly ran");
    assert!(
        vol.stats().hot_zone_reads.load(Ordering::Relaxed) > 0,
        "no read went into a zone being rewritten"
    );
    let model = model.lock().unwrap().clone();
    let mut all = vec![0u8; vol.size() as usize];
    vol.read_at(&mut all, 0).unwrap();
    assert!(all == model, "the served volume differs from the model");
    vol.flush().unwrap();
    // The volume and its header file go (their locks with them) before cryptsetup looks.
    drop((vol, hfile));
    cryptsetup(&[
        "open",
        "--test-passphrase",
        "--key-file",
        key.to_str().unwrap(),
        img.to_str().unwrap(),
    ]);
    let u = unlock(&img, &OpenOptions::default());
    let mut again = vec![0u8; u.volume.size() as usize];
    u.volume.read_at(&mut again, 0).unwrap();
    assert!(again == model, "after a reopen");
}
