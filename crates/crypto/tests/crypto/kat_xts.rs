//! XTS-AES known answers through the public `SectorCipher` API, on every supported backend.
//!
//! * IEEE 1619-2007 vectors with 512-byte data units run as one `aes-xts-plain64` sector whose
//!   number is the data unit sequence number (plain64 *is* the IEEE tweak encoding), alone and
//!   embedded at various positions of longer runs (so batched fast paths see them too).
//! * Vectors with shorter data units (IEEE 1-3, NIST XTSVS "data unit seq no") use the fact that
//!   XTS without ciphertext stealing treats each 16-byte block independently: the vector is
//!   the prefix of a 512-byte sector with the same tweak.
//!
//! Vectors with arbitrary 128-bit tweaks go through `testing::xts_data_unit` (`kat_xtsvs.rs`).

use crate::common::{Record, Rng, assert_bytes_eq, backends, load};
use cryptblk_crypto::{Backend, CipherSpec, IvOptions, SectorCipher};

fn cipher(spec: &str, key: &[u8], ss: u32, b: Backend) -> SectorCipher {
    SectorCipher::with_backend(
        CipherSpec::parse(spec).unwrap(),
        key,
        ss,
        IvOptions::default(),
        b,
    )
    .unwrap_or_else(|e| panic!("{spec} on {b}: {e}"))
}

/// Runs a whole-sector (512-byte) vector alone and inside runs of other sectors.
fn check_full_sector(r: &Record, spec: &str, b: Backend, rng: &mut Rng) {
    let (key, seq, pt, ct) = (r.hex("key"), r.u64("seq"), r.hex("pt"), r.hex("ct"));
    let c = cipher(spec, &key, 512, b);
    let what = format!("{} [{spec}, backend {b}]", r.label());

    let mut buf = pt.clone();
    c.encrypt(seq, &mut buf).unwrap();
    assert_bytes_eq(&buf, &ct, &format!("{what}: encrypt"));
    c.decrypt(seq, &mut buf).unwrap();
    assert_bytes_eq(&buf, &pt, &format!("{what}: decrypt"));

    // Inside runs: as the first, a middle and the last sector, with runs that cross the
    // 64-sector IV batch and (for the vector) several vector-register widths.
    for run in [2usize, 7, 64, 65, 130] {
        for pos in [0, run / 2, run - 1] {
            let Some(start) = seq.checked_sub(pos as u64) else {
                continue;
            };
            let mut data = rng.bytes(run * 512);
            data[pos * 512..(pos + 1) * 512].copy_from_slice(&pt);
            let plain = data.clone();
            c.encrypt(start, &mut data).unwrap();
            let at = format!("{what}: sector {pos} of a {run}-sector run");
            assert_bytes_eq(
                &data[pos * 512..(pos + 1) * 512],
                &ct,
                &format!("{at}, encrypt"),
            );
            // The neighbours must be what single-sector calls give.
            for other in [0, run - 1] {
                let mut one = plain[other * 512..(other + 1) * 512].to_vec();
                c.encrypt(start + other as u64, &mut one).unwrap();
                assert_bytes_eq(
                    &data[other * 512..(other + 1) * 512],
                    &one,
                    &format!("{at}, neighbour {other}"),
                );
            }
            c.decrypt(start, &mut data).unwrap();
            assert_bytes_eq(&data, &plain, &format!("{at}, decrypt"));

            // And the decrypt direction starting from ciphertext in the run.
            let mut data = rng.bytes(run * 512);
            data[pos * 512..(pos + 1) * 512].copy_from_slice(&ct);
            c.decrypt(start, &mut data).unwrap();
            assert_bytes_eq(
                &data[pos * 512..(pos + 1) * 512],
                &pt,
                &format!("{at}, decrypt from ciphertext"),
            );
        }
    }
}

/// A data unit shorter than a sector: it is the prefix of a sector with the same tweak.
fn check_prefix(r: &Record, spec: &str, b: Backend, rng: &mut Rng) {
    let (label, key, seq, pt, ct) = (
        r.label(),
        r.hex("key"),
        r.u64("seq"),
        r.hex("pt"),
        r.hex("ct"),
    );
    assert!(
        pt.len() < 512 && pt.len().is_multiple_of(16),
        "{label}: unusable length {}",
        pt.len()
    );
    let c = cipher(spec, &key, 512, b);
    let what = format!("{label} [{spec}, backend {b}, as sector prefix]");
    let mut sector = rng.bytes(512);
    sector[..pt.len()].copy_from_slice(&pt);
    c.encrypt(seq, &mut sector).unwrap();
    assert_bytes_eq(&sector[..ct.len()], &ct, &format!("{what}: encrypt"));
    let mut sector2 = rng.bytes(512);
    sector2[..ct.len()].copy_from_slice(&ct);
    c.decrypt(seq, &mut sector2).unwrap();
    assert_bytes_eq(&sector2[..pt.len()], &pt, &format!("{what}: decrypt"));
}

#[test]
fn ieee1619_2007_vectors() {
    let recs = load("ieee1619_xts.txt");
    assert_eq!(recs.len(), 15, "vectors 1-14 and 19");
    let mut rng = Rng::new(1619);
    let (mut full, mut short) = (0, 0);
    for b in backends() {
        for r in &recs {
            let (seq, pt, ct) = (r.u64("seq"), r.hex("pt"), r.hex("ct"));
            assert_eq!(pt.len(), ct.len(), "{}", r.label());
            // aes-xts-plain truncates the sector number to 32 bits: same IV below 2^32.
            let mut specs = vec!["aes-xts-plain64"];
            if seq <= u32::MAX as u64 {
                specs.push("aes-xts-plain");
            }
            for spec in specs {
                if pt.len() == 512 {
                    check_full_sector(r, spec, b, &mut rng);
                    full += 1;
                } else {
                    check_prefix(r, spec, b, &mut rng);
                    short += 1;
                }
            }
        }
    }
    assert!(full > 0 && short > 0);
}

/// Vectors with a sequence number above 2^32 must not pass through aes-xts-plain at that
/// sector (it truncates), but must at the truncated sector number.
#[test]
fn ieee1619_plain_truncates_to_32_bits() {
    let mut rng = Rng::new(32);
    let mut seen = 0;
    for r in load("ieee1619_xts.txt") {
        let (key, seq, pt, ct) = (r.hex("key"), r.u64("seq"), r.hex("pt"), r.hex("ct"));
        if seq <= u32::MAX as u64 {
            continue;
        }
        seen += 1;
        for b in backends() {
            let c = cipher("aes-xts-plain", &key, 512, b);
            let mut sector = rng.bytes(512);
            sector[..pt.len()].copy_from_slice(&pt);
            let mut again = sector.clone();
            c.encrypt(seq, &mut sector).unwrap();
            assert_ne!(
                &sector[..ct.len()],
                &ct[..],
                "{}: plain must not use the high bits",
                r.label()
            );
            c.encrypt(seq & 0xffff_ffff, &mut again).unwrap();
            assert_eq!(
                sector,
                again,
                "{}: plain IV of {seq:#x} is that of {:#x}",
                r.label(),
                seq & 0xffff_ffff
            );
        }
    }
    assert!(
        seen >= 3,
        "IEEE vectors 2, 3, 14 and 19 have sequence numbers above 2^32"
    );
}

/// NIST XTSVS "data unit seq no" vectors: the tweak is le128(seq), i.e. plain64.
#[test]
fn nist_xtsvs_sequence_number_vectors_as_sectors() {
    let mut rng = Rng::new(38);
    let recs: Vec<Record> = load("xtsvs.txt")
        .into_iter()
        .filter(|r| r.has("seq"))
        .collect();
    assert!(recs.len() >= 3);
    for b in backends() {
        for r in &recs {
            check_prefix(r, "aes-xts-plain64", b, &mut rng);
        }
    }
}
