//! Power loss at every write of whole LUKS2 jobs (init and every step): a key change, an
//! encryption and a decryption in place, a data move and a data shift; with
//! [`CrashDevice`]: for every N, the power fails during write N, unsynced writes are
//! dropped or kept, the interrupted write is lost or torn. After each crash the header
//! loads, a read-write open's recovery ([`LuksHeader::recover_interrupted_step`]) brings
//! back a consistent layout, every byte of the data reads back as it was (through the
//! segments' own keys), and resuming the job finishes it with the data intact.
//!
//! The `none` resilience is left out on purpose: without protection data a crash inside a
//! step loses that step (as cryptsetup documents).

use cryptblk_crypto::{CipherSpec, HashAlg, KdfRequest, SectorCipher};
use cryptblk_format::luks2::{Luks2Header, ReencryptOutcome, ReencryptRequest, ResilienceRequest};
use cryptblk_format::{CrashDevice, FormatOptions, LuksHeader, MemStorage, Storage, Tear};

const PASS: &[u8] = b"power-loss";
const KIB: u64 = 1024;
const DATA_OFFSET: u64 = 2048 * KIB;
const DATA_LEN: u64 = 1024 * KIB;
const HOTZONE: u64 = 256 * KIB;

fn kdf() -> KdfRequest {
    KdfRequest {
        // PBKDF2 (the LUKS1 default) at its minimum: the test is about writes, not KDFs.
        forced_iterations: Some(1000),
        ..KdfRequest::luks1_default()
    }
}

/// A LUKS2 volume (1 MiB of data after a 2 MiB header) holding `plain`.
fn volume(sector: u32, plain: &[u8]) -> MemStorage {
    let mut dev = MemStorage::new(DATA_OFFSET + DATA_LEN);
    let mut opts = FormatOptions::new(kdf());
    opts.sector_size = sector;
    opts.data_offset = Some(DATA_OFFSET);
    opts.luks2_keyslots_size = Some(DATA_OFFSET - 2 * 16 * KIB);
    let key = [0x5au8; 64];
    Luks2Header::format(&mut dev, &opts, &key, PASS).unwrap();
    let c = SectorCipher::new(opts.cipher, &key, sector, Default::default()).unwrap();
    let mut ct = plain.to_vec();
    c.encrypt(0, &mut ct).unwrap();
    dev.write_at(&ct, DATA_OFFSET).unwrap();
    dev
}

/// The plaintext as the header lays it out now (one key or two, whatever the state).
fn read_plain(dev: &MemStorage) -> Vec<u8> {
    let h = Luks2Header::read(&mut &*dev).unwrap();
    let (_, segs) = h
        .unlock_segments(&mut &*dev, PASS, None, DATA_OFFSET + DATA_LEN)
        .unwrap();
    let mut out = vec![0u8; DATA_LEN as usize];
    for s in segs {
        let c = SectorCipher::new(s.cipher, &s.key, s.sector_size, s.iv).unwrap();
        let piece = &mut out[s.start as usize..(s.start + s.len) as usize];
        dev.read_at(piece, s.storage_offset).unwrap();
        c.decrypt(0, piece).unwrap();
    }
    out
}

fn job(dev: &dyn Storage, req: &ReencryptRequest, resume_only: bool) -> std::io::Result<()> {
    let fail = |e: cryptblk_format::Error| std::io::Error::other(e.to_string());
    let mut h = Luks2Header::read(&mut &*dev).map_err(fail)?;
    if !resume_only {
        h.reencrypt_init(&mut &*dev, DATA_OFFSET + DATA_LEN, PASS, None, req)
            .map_err(fail)?;
    }
    let out = h
        .reencrypt_run(
            &mut &*dev,
            &dev,
            DATA_OFFSET + DATA_LEN,
            PASS,
            None,
            Some(HOTZONE),
            &|| false,
            &mut |_, _| {},
        )
        .map_err(fail)?;
    assert_eq!(out, ReencryptOutcome::Finished);
    Ok(())
}

#[test]
fn power_loss_at_every_write_of_a_reencryption() {
    let plain: Vec<u8> = (0..DATA_LEN as usize)
        .map(|i| (i * 7 + i / 509) as u8)
        .collect();
    for (sector, resilience) in [
        (4096, ResilienceRequest::Checksum(HashAlg::Sha256)),
        (512, ResilienceRequest::Journal),
    ] {
        let req = ReencryptRequest {
            cipher: Some(CipherSpec::parse("aes-xts-plain64").unwrap()),
            key_len: None,
            sector_size: None,
            resilience,
            kdf: kdf(),
            keyslot_encryption: None,
        };
        let base = volume(sector, &plain);
        // How many writes the whole job issues.
        let dry = CrashDevice::new(base.clone(), None, Tear::Lost, true);
        job(&dry, &req, false).unwrap();
        let writes = dry.writes();
        let done = dry.after_power_loss();
        assert!(
            read_plain(&done) == plain,
            "{resilience:?}: uninterrupted job"
        );
        assert!(writes > 20, "{resilience:?}: {writes} writes");
        for n in 1..=writes {
            for tear in [Tear::Lost, Tear::Prefix, Tear::Suffix] {
                for keep in [false, true] {
                    let what =
                        format!("{resilience:?} crash in write {n}/{writes} {tear:?} keep={keep}");
                    let dev = CrashDevice::new(base.clone(), Some(n), tear, keep);
                    assert!(job(&dev, &req, false).is_err(), "{what}: the job must stop");
                    let img = dev.after_power_loss();
                    let mut h =
                        Luks2Header::read(&mut &img).unwrap_or_else(|e| panic!("{what}: {e}"));
                    h.recover_interrupted_step(
                        &mut &img,
                        &&img,
                        PASS,
                        None,
                        DATA_OFFSET + DATA_LEN,
                    )
                    .unwrap_or_else(|e| panic!("{what}: recovery: {e}"));
                    assert!(read_plain(&img) == plain, "{what}: data after recovery");
                    let h = Luks2Header::read(&mut &img).unwrap();
                    if h.in_reencryption() {
                        job(&img, &req, true).unwrap_or_else(|e| panic!("{what}: resume: {e}"));
                    }
                    let h = Luks2Header::read(&mut &img).unwrap();
                    assert!(!h.in_reencryption(), "{what}");
                    assert!(read_plain(&img) == plain, "{what}: data after resuming");
                }
            }
        }
    }
}

/// Part of one storage as a storage of its own: the detached header and the data device
/// of an encryption on one [`CrashDevice`], so that one power cut hits both.
struct Window<'a, S: Storage> {
    dev: &'a S,
    base: u64,
    len: u64,
}

impl<S: Storage> Storage for Window<'_, S> {
    fn size(&self) -> std::io::Result<u64> {
        Ok(self.len)
    }
    fn read_at(&self, buf: &mut [u8], off: u64) -> std::io::Result<()> {
        assert!(off + buf.len() as u64 <= self.len, "read past the window");
        self.dev.read_at(buf, self.base + off)
    }
    fn write_at(&self, buf: &[u8], off: u64) -> std::io::Result<()> {
        assert!(off + buf.len() as u64 <= self.len, "write past the window");
        self.dev.write_at(buf, self.base + off)
    }
    fn sync(&self) -> std::io::Result<()> {
        self.dev.sync()
    }
}

const HDR: u64 = 16 << 20;

fn views<S: Storage>(dev: &S) -> (Window<'_, S>, Window<'_, S>) {
    (
        Window {
            dev,
            base: 0,
            len: HDR,
        },
        Window {
            dev,
            base: HDR,
            len: DATA_LEN,
        },
    )
}

/// `reencrypt --encrypt --header`: init (unless resuming), then every step.
fn encrypt_job<S: Storage>(dev: &S, req: &ReencryptRequest, resume: bool) -> std::io::Result<()> {
    let fail = |e: cryptblk_format::Error| std::io::Error::other(e.to_string());
    let (h, d) = views(dev);
    let mut hdr = if resume {
        Luks2Header::read(&mut &h).map_err(fail)?
    } else {
        Luks2Header::encrypt_init(&mut &h, DATA_LEN, PASS, req).map_err(fail)?
    };
    let out = hdr
        .reencrypt_run(
            &mut &h,
            &d,
            DATA_LEN,
            PASS,
            None,
            Some(HOTZONE),
            &|| false,
            &mut |_, _| {},
        )
        .map_err(fail)?;
    assert_eq!(out, ReencryptOutcome::Finished);
    Ok(())
}

/// The data device read through the detached header's layout now.
fn read_detached(img: &MemStorage) -> Vec<u8> {
    let (h, d) = views(img);
    let hdr = Luks2Header::read(&mut &h).unwrap();
    let (_, segs) = hdr.unlock_segments(&mut &h, PASS, None, DATA_LEN).unwrap();
    let mut out = vec![0u8; DATA_LEN as usize];
    for s in segs {
        let c = SectorCipher::new(s.cipher, &s.key, s.sector_size, s.iv).unwrap();
        let piece = &mut out[s.start as usize..(s.start + s.len) as usize];
        d.read_at(piece, s.storage_offset).unwrap();
        c.decrypt(0, piece).unwrap();
    }
    out
}

/// Power loss at every write of an encryption in place with a detached header (the
/// header written, then every step): each crash leaves either no valid header and the
/// plaintext untouched, or a header whose recovery and resumption give back the
/// plaintext, encrypted at the end.
#[test]
fn power_loss_at_every_write_of_an_encryption() {
    let plain: Vec<u8> = (0..DATA_LEN as usize)
        .map(|i| (i * 5 + i / 511) as u8)
        .collect();
    for resilience in [
        ResilienceRequest::Checksum(HashAlg::Sha256),
        ResilienceRequest::Journal,
    ] {
        let req = ReencryptRequest {
            cipher: None,
            key_len: None,
            sector_size: None,
            resilience,
            kdf: kdf(),
            keyslot_encryption: None,
        };
        let base = MemStorage::new(HDR + DATA_LEN);
        base.write_at(&plain, HDR).unwrap();
        let dry = CrashDevice::new(base.clone(), None, Tear::Lost, true);
        encrypt_job(&dry, &req, false).unwrap();
        let writes = dry.writes();
        let done = dry.after_power_loss();
        assert!(
            read_detached(&done) == plain,
            "{resilience:?}: uninterrupted job"
        );
        let mut raw = vec![0u8; plain.len()];
        done.read_at(&mut raw, HDR).unwrap();
        assert!(raw != plain, "{resilience:?}: nothing was encrypted");
        for n in 1..=writes {
            for (tear, keep) in [
                (Tear::Lost, false),
                (Tear::Prefix, true),
                (Tear::Suffix, false),
            ] {
                let what =
                    format!("{resilience:?} crash in write {n}/{writes} {tear:?} keep={keep}");
                let dev = CrashDevice::new(base.clone(), Some(n), tear, keep);
                assert!(
                    encrypt_job(&dev, &req, false).is_err(),
                    "{what}: the job must stop"
                );
                let img = dev.after_power_loss();
                let (h, d) = views(&img);
                let Ok(mut hdr) = Luks2Header::read(&mut &h) else {
                    let mut raw = vec![0u8; plain.len()];
                    d.read_at(&mut raw, 0).unwrap();
                    assert!(raw == plain, "{what}: no header, yet the plaintext changed");
                    continue;
                };
                hdr.recover_interrupted_step(&mut &h, &d, PASS, None, DATA_LEN)
                    .unwrap_or_else(|e| panic!("{what}: recovery: {e}"));
                assert!(read_detached(&img) == plain, "{what}: data after recovery");
                if Luks2Header::read(&mut &h).unwrap().in_reencryption() {
                    encrypt_job(&img, &req, true).unwrap_or_else(|e| panic!("{what}: resume: {e}"));
                }
                assert!(
                    !Luks2Header::read(&mut &h).unwrap().in_reencryption(),
                    "{what}"
                );
                assert!(read_detached(&img) == plain, "{what}: data after resuming");
            }
        }
    }
}

/// A data-move encryption's geometry: 512 KiB shift (`--reduce-device-size 1M`), 1.25 MiB
/// of data (so one step is a remainder shorter than the shift), 2.25 MiB in all.
const SHIFT: u64 = 512 * KIB;
const MOVE_DATA: u64 = 1280 * KIB;
const MOVE_DEV: u64 = 2 * SHIFT + MOVE_DATA;

/// `reencrypt --encrypt --reduce-device-size`: init (unless resuming), then every step.
fn encrypt_shift_job<S: Storage>(
    dev: &S,
    req: &ReencryptRequest,
    resume: bool,
) -> std::io::Result<()> {
    let fail = |e: cryptblk_format::Error| std::io::Error::other(e.to_string());
    let mut hdr = if resume {
        Luks2Header::read(&mut &*dev).map_err(fail)?
    } else {
        Luks2Header::encrypt_shift_init(&mut &*dev, 2 * SHIFT, PASS, req).map_err(fail)?
    };
    let out = hdr
        .reencrypt_run(
            &mut &*dev,
            dev,
            MOVE_DEV,
            PASS,
            None,
            None,
            &|| false,
            &mut |_, _| {},
        )
        .map_err(fail)?;
    assert_eq!(out, ReencryptOutcome::Finished);
    Ok(())
}

/// The volume's plaintext as its header lays it out now (its first `MOVE_DATA` bytes).
fn read_moved(img: &MemStorage) -> Vec<u8> {
    let hdr = Luks2Header::read(&mut &*img).unwrap();
    let (_, segs) = hdr
        .unlock_segments(&mut &*img, PASS, None, MOVE_DEV)
        .unwrap();
    let mut out = vec![0u8; MOVE_DATA as usize];
    for s in segs {
        let c = SectorCipher::new(s.cipher, &s.key, s.sector_size, s.iv).unwrap();
        let end = (s.start + s.len).min(MOVE_DATA);
        if s.start >= end {
            continue;
        }
        let piece = &mut out[s.start as usize..end as usize];
        img.read_at(piece, s.storage_offset).unwrap();
        c.decrypt(0, piece).unwrap();
    }
    out
}

/// Power loss at every write of an encryption with the header at the head of the device
/// (the data's start copied to the end, the header written, every step, the copy wiped):
/// each crash leaves either no valid header, the data in place and its first bytes safe
/// in the copy, or a header whose recovery and resumption give back the data, encrypted
/// and the copy wiped at the end.
#[test]
fn power_loss_at_every_write_of_a_data_move_encryption() {
    let plain: Vec<u8> = (0..MOVE_DATA as usize)
        .map(|i| (i * 3 + i / 513) as u8)
        .collect();
    let req = ReencryptRequest {
        cipher: None,
        key_len: None,
        sector_size: None,
        resilience: ResilienceRequest::None,
        kdf: kdf(),
        keyslot_encryption: None,
    };
    let base = MemStorage::new(MOVE_DEV);
    base.write_at(&plain, 0).unwrap();
    let dry = CrashDevice::new(base.clone(), None, Tear::Lost, true);
    encrypt_shift_job(&dry, &req, false).unwrap();
    let writes = dry.writes();
    let done = dry.after_power_loss();
    assert!(read_moved(&done) == plain, "uninterrupted job");
    let raw = |img: &MemStorage, off: u64, len: u64| {
        let mut b = vec![0u8; len as usize];
        img.read_at(&mut b, off).unwrap();
        b
    };
    let head = &plain[..SHIFT as usize];
    assert!(raw(&done, SHIFT, SHIFT) != head, "nothing was encrypted");
    assert!(
        raw(&done, MOVE_DEV - SHIFT, SHIFT) != head,
        "the copy was not wiped"
    );
    assert!(writes > 10, "{writes} writes");
    for n in 1..=writes {
        for (tear, keep) in [
            (Tear::Lost, false),
            (Tear::Prefix, true),
            (Tear::Suffix, false),
        ] {
            let what = format!("crash in write {n}/{writes} {tear:?} keep={keep}");
            let dev = CrashDevice::new(base.clone(), Some(n), tear, keep);
            assert!(
                encrypt_shift_job(&dev, &req, false).is_err(),
                "{what}: the job must stop"
            );
            let img = dev.after_power_loss();
            let Ok(mut hdr) = Luks2Header::read(&mut &img) else {
                assert!(
                    raw(&img, SHIFT, MOVE_DATA - SHIFT) == plain[SHIFT as usize..],
                    "{what}: no header, yet the data in place changed"
                );
                assert!(
                    raw(&img, 0, SHIFT) == head || raw(&img, MOVE_DEV - SHIFT, SHIFT) == head,
                    "{what}: no header, and the data's start is neither in place nor copied"
                );
                continue;
            };
            hdr.recover_interrupted_step(&mut &img, &&img, PASS, None, MOVE_DEV)
                .unwrap_or_else(|e| panic!("{what}: recovery: {e}"));
            assert!(read_moved(&img) == plain, "{what}: data after recovery");
            if Luks2Header::read(&mut &img).unwrap().in_reencryption() {
                encrypt_shift_job(&img, &req, true)
                    .unwrap_or_else(|e| panic!("{what}: resume: {e}"));
            }
            assert!(
                !Luks2Header::read(&mut &img).unwrap().in_reencryption(),
                "{what}"
            );
            assert!(read_moved(&img) == plain, "{what}: data after resuming");
            assert!(
                raw(&img, MOVE_DEV - SHIFT, SHIFT) != head,
                "{what}: copy left"
            );
        }
    }
}

/// A key change moving the data 256 KiB up (`reencrypt --reduce-device-size`).
const SHIFT_UP: u64 = 256 * KIB;

fn shift_job(dev: &dyn Storage, req: &ReencryptRequest, resume_only: bool) -> std::io::Result<()> {
    let fail = |e: cryptblk_format::Error| std::io::Error::other(e.to_string());
    let mut h = Luks2Header::read(&mut &*dev).map_err(fail)?;
    if !resume_only {
        h.reencrypt_shift_init(
            &mut &*dev,
            DATA_OFFSET + DATA_LEN,
            PASS,
            None,
            req,
            SHIFT_UP,
        )
        .map_err(fail)?;
    }
    let out = h
        .reencrypt_run(
            &mut &*dev,
            &dev,
            DATA_OFFSET + DATA_LEN,
            PASS,
            None,
            None,
            &|| false,
            &mut |_, _| {},
        )
        .map_err(fail)?;
    assert_eq!(out, ReencryptOutcome::Finished);
    Ok(())
}

/// The first `len` bytes of the volume as its header lays them out now.
fn read_prefix(dev: &MemStorage, len: u64) -> Vec<u8> {
    let h = Luks2Header::read(&mut &*dev).unwrap();
    let (_, segs) = h
        .unlock_segments(&mut &*dev, PASS, None, DATA_OFFSET + DATA_LEN)
        .unwrap();
    let mut out = vec![0u8; len as usize];
    for s in segs.iter().filter(|s| s.start < len) {
        let c = SectorCipher::new(s.cipher, &s.key, s.sector_size, s.iv).unwrap();
        let end = (s.start + s.len).min(len);
        let piece = &mut out[s.start as usize..end as usize];
        dev.read_at(piece, s.storage_offset).unwrap();
        c.decrypt(0, piece).unwrap();
    }
    out
}

/// Power loss at every write of a key change with a backward data shift: after each
/// crash the volume's data (all but the last `SHIFT_UP` bytes, which the shift gives up)
/// reads back through a recovery, and resuming finishes with it intact.
#[test]
fn power_loss_at_every_write_of_a_data_shift() {
    let plain: Vec<u8> = (0..DATA_LEN as usize)
        .map(|i| (i * 11 + i / 517) as u8)
        .collect();
    let kept = DATA_LEN - SHIFT_UP;
    let req = ReencryptRequest {
        cipher: None,
        key_len: None,
        sector_size: None,
        resilience: ResilienceRequest::None,
        kdf: kdf(),
        keyslot_encryption: None,
    };
    let base = volume(4096, &plain);
    let dry = CrashDevice::new(base.clone(), None, Tear::Lost, true);
    shift_job(&dry, &req, false).unwrap();
    let writes = dry.writes();
    let done = dry.after_power_loss();
    assert!(
        read_prefix(&done, kept) == plain[..kept as usize],
        "uninterrupted job"
    );
    assert!(writes > 8, "{writes} writes");
    for n in 1..=writes {
        for (tear, keep) in [
            (Tear::Lost, false),
            (Tear::Prefix, true),
            (Tear::Suffix, false),
        ] {
            let what = format!("crash in write {n}/{writes} {tear:?} keep={keep}");
            let dev = CrashDevice::new(base.clone(), Some(n), tear, keep);
            assert!(
                shift_job(&dev, &req, false).is_err(),
                "{what}: the job must stop"
            );
            let img = dev.after_power_loss();
            let mut h = Luks2Header::read(&mut &img).unwrap_or_else(|e| panic!("{what}: {e}"));
            h.recover_interrupted_step(&mut &img, &&img, PASS, None, DATA_OFFSET + DATA_LEN)
                .unwrap_or_else(|e| panic!("{what}: recovery: {e}"));
            assert!(
                read_prefix(&img, kept) == plain[..kept as usize],
                "{what}: after recovery"
            );
            if Luks2Header::read(&mut &img).unwrap().in_reencryption() {
                shift_job(&img, &req, true).unwrap_or_else(|e| panic!("{what}: resume: {e}"));
            }
            assert!(
                !Luks2Header::read(&mut &img).unwrap().in_reencryption(),
                "{what}"
            );
            assert!(
                read_prefix(&img, kept) == plain[..kept as usize],
                "{what}: after resuming"
            );
        }
    }
}

/// `reencrypt --decrypt --header`: init (unless resuming), then every step.
fn decrypt_job<S: Storage>(dev: &S, req: &ReencryptRequest, resume: bool) -> std::io::Result<()> {
    let fail = |e: cryptblk_format::Error| std::io::Error::other(e.to_string());
    let (h, d) = views(dev);
    let mut hdr = Luks2Header::read(&mut &h).map_err(fail)?;
    if !resume {
        hdr.decrypt_init(&mut &h, DATA_LEN, PASS, None, req)
            .map_err(fail)?;
    }
    let out = hdr
        .reencrypt_run(
            &mut &h,
            &d,
            DATA_LEN,
            PASS,
            None,
            Some(HOTZONE),
            &|| false,
            &mut |_, _| {},
        )
        .map_err(fail)?;
    assert_eq!(out, ReencryptOutcome::Finished);
    Ok(())
}

/// Power loss at every write of a decryption in place (detached header, backward steps,
/// as cryptsetup decrypts) with each resilience mode that can recover: after each crash
/// the header's recovery gives back the plaintext, and resuming leaves it in place on the
/// device, the header saying it is plaintext.
#[test]
fn power_loss_at_every_write_of_a_decryption() {
    let plain: Vec<u8> = (0..DATA_LEN as usize)
        .map(|i| (i * 13 + i / 509) as u8)
        .collect();
    for resilience in [
        ResilienceRequest::Checksum(HashAlg::Sha256),
        ResilienceRequest::Journal,
    ] {
        let req = ReencryptRequest {
            cipher: None,
            key_len: None,
            sector_size: None,
            resilience,
            kdf: kdf(),
            keyslot_encryption: None,
        };
        // The starting point: the plaintext encrypted in place under a detached header.
        let plain_dev = MemStorage::new(HDR + DATA_LEN);
        plain_dev.write_at(&plain, HDR).unwrap();
        let enc = CrashDevice::new(plain_dev, None, Tear::Lost, true);
        encrypt_job(&enc, &req, false).unwrap();
        let base = enc.after_power_loss();
        assert!(
            read_detached(&base) == plain,
            "{resilience:?}: encrypted start"
        );
        let dry = CrashDevice::new(base.clone(), None, Tear::Lost, true);
        decrypt_job(&dry, &req, false).unwrap();
        let writes = dry.writes();
        let raw = |img: &MemStorage| {
            let mut b = vec![0u8; DATA_LEN as usize];
            img.read_at(&mut b, HDR).unwrap();
            b
        };
        assert!(
            raw(&dry.after_power_loss()) == plain,
            "{resilience:?}: uninterrupted"
        );
        // The data as the header lays it out; once decrypted, the device itself.
        let readable = |img: &MemStorage| {
            let (h, _) = views(img);
            let hdr = Luks2Header::read(&mut &h).unwrap();
            let plain_now = matches!(
                hdr.unlock_segments(&mut &h, PASS, None, DATA_LEN),
                Err(cryptblk_format::Error::Luks2(
                    cryptblk_format::luks2::Luks2Error::PlainData(_)
                ))
            );
            if plain_now {
                raw(img)
            } else {
                read_detached(img)
            }
        };
        assert!(writes > 10, "{resilience:?}: {writes} writes");
        for n in 1..=writes {
            for (tear, keep) in [
                (Tear::Lost, false),
                (Tear::Prefix, true),
                (Tear::Suffix, false),
            ] {
                let what =
                    format!("{resilience:?} crash in write {n}/{writes} {tear:?} keep={keep}");
                let dev = CrashDevice::new(base.clone(), Some(n), tear, keep);
                assert!(
                    decrypt_job(&dev, &req, false).is_err(),
                    "{what}: the job must stop"
                );
                let img = dev.after_power_loss();
                let (h, d) = views(&img);
                let mut hdr = Luks2Header::read(&mut &h).unwrap_or_else(|e| panic!("{what}: {e}"));
                hdr.recover_interrupted_step(&mut &h, &d, PASS, None, DATA_LEN)
                    .unwrap_or_else(|e| panic!("{what}: recovery: {e}"));
                assert!(readable(&img) == plain, "{what}: data after recovery");
                if Luks2Header::read(&mut &h).unwrap().in_reencryption() {
                    decrypt_job(&img, &req, true).unwrap_or_else(|e| panic!("{what}: resume: {e}"));
                } else if raw(&img) != plain {
                    // Cut before the job's first commit: still the encrypted volume; the
                    // decryption starts again.
                    decrypt_job(&img, &req, false).unwrap_or_else(|e| panic!("{what}: again: {e}"));
                }
                assert!(
                    !Luks2Header::read(&mut &h).unwrap().in_reencryption(),
                    "{what}"
                );
                assert!(
                    raw(&img) == plain,
                    "{what}: plaintext in place after resuming"
                );
            }
        }
    }
}
