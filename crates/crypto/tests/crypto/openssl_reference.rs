//! Differential test against the real OpenSSL command line (`/usr/bin/openssl`).
//!
//! For every dm-crypt cipher we support, sector sizes 512 and 4096, with and without
//! `iv_large_sectors` (where it changes anything), random keys (every valid size), start
//! sectors (including IV sector numbers that cross and exceed 2^32, where `plain` truncates
//! and `plain64` does not), IV offsets and run lengths: the run is encrypted with
//! `SectorCipher` on every supported backend, and each sector is compared with
//! `openssl enc -nopad -K <key> -iv <dm-crypt IV of that sector>` (CBC), or, because
//! `openssl enc` refuses XTS, with XTS assembled from `openssl enc -aes-*-ecb` (see
//! `xts_reference`). The IVs are computed here
//! from dm-crypt's definitions, independently of the code under test; ESSIV's salt and IVs
//! come from `openssl dgst -sha256` and `openssl enc -aes-256-ecb`. Decryption must give the
//! plaintext back on every backend.

use crate::common::{Rng, assert_bytes_eq, backends};
use cryptblk_crypto::{CipherSpec, IvOptions, SectorCipher};
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

const OPENSSL: &str = "/usr/bin/openssl";

fn require_openssl() {
    assert!(
        Path::new(OPENSSL).exists(),
        "{OPENSSL} not found: this test needs the OpenSSL command line tool \
         (Debian/Ubuntu package `openssl`: apt-get install openssl)"
    );
}

/// Runs `openssl <args>` with `input` on stdin and returns its stdout.
fn openssl(args: &[&str], input: &[u8]) -> Vec<u8> {
    let mut child = Command::new(OPENSSL)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawning {OPENSSL}: {e}"));
    let mut stdin = child.stdin.take().expect("piped stdin");
    let input = input.to_vec();
    let writer = std::thread::spawn(move || stdin.write_all(&input));
    let out = child.wait_with_output().expect("waiting for openssl");
    writer
        .join()
        .expect("stdin writer thread")
        .expect("writing to openssl");
    assert!(
        out.status.success(),
        "openssl {} failed ({}): {}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Iv {
    Plain,
    Plain64,
    Plain64Be,
    Essiv,
    Absent,
}

struct Spec {
    name: &'static str,
    /// OpenSSL cipher for a key of the given length (`None`: `-none`, no encryption).
    ossl: fn(usize) -> Option<&'static str>,
    key_lens: &'static [usize],
    iv: Iv,
}

fn xts_name(len: usize) -> Option<&'static str> {
    Some(match len {
        32 => "aes-128-xts",
        48 => "aes-192-xts",
        64 => "aes-256-xts",
        _ => panic!("XTS key length {len}"),
    })
}

fn cbc_name(len: usize) -> Option<&'static str> {
    Some(match len {
        16 => "aes-128-cbc",
        24 => "aes-192-cbc",
        32 => "aes-256-cbc",
        _ => panic!("CBC key length {len}"),
    })
}

fn null_name(_: usize) -> Option<&'static str> {
    None
}

const SPECS: &[Spec] = &[
    Spec {
        name: "aes-xts-plain64",
        ossl: xts_name,
        key_lens: &[32, 64, 48],
        iv: Iv::Plain64,
    },
    Spec {
        name: "aes-xts-plain",
        ossl: xts_name,
        key_lens: &[64, 32],
        iv: Iv::Plain,
    },
    Spec {
        name: "aes-xts-plain64be",
        ossl: xts_name,
        key_lens: &[64, 32],
        iv: Iv::Plain64Be,
    },
    Spec {
        name: "aes-cbc-essiv:sha256",
        ossl: cbc_name,
        key_lens: &[32, 16, 24],
        iv: Iv::Essiv,
    },
    Spec {
        name: "aes-cbc-plain64",
        ossl: cbc_name,
        key_lens: &[32, 24, 16],
        iv: Iv::Plain64,
    },
    Spec {
        name: "aes-cbc-plain",
        ossl: cbc_name,
        key_lens: &[16, 32, 24],
        iv: Iv::Plain,
    },
    Spec {
        name: "cipher_null-ecb",
        ossl: null_name,
        key_lens: &[0],
        iv: Iv::Absent,
    },
];

/// dm-crypt's IV sector number for encryption sector `sector` (crypt_convert_init /
/// crypt_iv_*_gen: the 512-byte sector plus iv_offset, shifted down with iv_large_sectors).
fn dm_iv_sector(sector: u64, ss: u32, iv: IvOptions) -> u64 {
    let shift = (ss / 512).trailing_zeros();
    let s512 = (sector << shift).wrapping_add(iv.offset);
    if iv.large_sectors {
        s512 >> shift
    } else {
        s512
    }
}

/// The IV block dm-crypt uses for IV sector `n` (ESSIV: before encryption with the salt).
fn dm_iv_block(mode: Iv, n: u64) -> [u8; 16] {
    let mut b = [0u8; 16];
    match mode {
        Iv::Plain => b[..4].copy_from_slice(&(n as u32).to_le_bytes()),
        Iv::Plain64 | Iv::Essiv => b[..8].copy_from_slice(&n.to_le_bytes()),
        Iv::Plain64Be => b[8..].copy_from_slice(&n.to_be_bytes()),
        Iv::Absent => {}
    }
    b
}

/// OpenSSL's encryption of a run of sectors, one `openssl enc` per sector (ESSIV IVs for the
/// whole run from one `openssl enc -aes-256-ecb`).
fn reference(spec: &Spec, key: &[u8], ss: u32, iv: IvOptions, start: u64, plain: &[u8]) -> Vec<u8> {
    let ss_us = ss as usize;
    let n = plain.len() / ss_us;
    let Some(cipher) = (spec.ossl)(key.len()) else {
        let out = openssl(&["enc", "-none"], plain);
        assert_eq!(out.len(), plain.len());
        return out;
    };
    let mut ivs: Vec<u8> = (0..n as u64)
        .flat_map(|i| dm_iv_block(spec.iv, dm_iv_sector(start + i, ss, iv)))
        .collect();
    if spec.iv == Iv::Essiv {
        let salt = openssl(&["dgst", "-sha256", "-binary"], key);
        assert_eq!(salt.len(), 32, "sha256 of the key");
        ivs = openssl(
            &["enc", "-aes-256-ecb", "-nopad", "-K", &hex::encode(&salt)],
            &ivs,
        );
        assert_eq!(ivs.len(), n * 16);
    }
    if cipher.ends_with("-xts") {
        return xts_reference(key, ss_us, &ivs, plain);
    }
    let key_hex = hex::encode(key);
    let mut out = Vec::with_capacity(plain.len());
    for (i, sector) in plain.chunks(ss_us).enumerate() {
        let iv_hex = hex::encode(&ivs[i * 16..(i + 1) * 16]);
        let ct = openssl(
            &[
                "enc",
                &format!("-{cipher}"),
                "-nopad",
                "-K",
                &key_hex,
                "-iv",
                &iv_hex,
            ],
            sector,
        );
        assert_eq!(ct.len(), ss_us, "openssl output length for {cipher}");
        out.extend_from_slice(&ct);
    }
    out
}

/// Multiplication by α in GF(2^128), IEEE 1619-2007 §5.2 (byte 0 least significant).
fn mul_alpha(t: [u8; 16]) -> [u8; 16] {
    let mut out = [0u8; 16];
    let mut carry = 0u8;
    for (o, b) in out.iter_mut().zip(t) {
        *o = (b << 1) | carry;
        carry = b >> 7;
    }
    if carry == 1 {
        out[0] ^= 0x87;
    }
    out
}

/// `openssl enc` refuses XTS ("enc XTS ciphers not supported"), so XTS is assembled here
/// from OpenSSL's AES-ECB, per IEEE 1619: T_0 = E_K2(IV), T_j+1 = T_j * α,
/// C_j = E_K1(P_j ^ T_j) ^ T_j. Two `openssl enc` calls per run, whatever its length.
/// (The composition itself is pinned independently by the IEEE 1619 / NIST KATs.)
fn xts_reference(key: &[u8], ss: usize, ivs: &[u8], plain: &[u8]) -> Vec<u8> {
    let (k1, k2) = key.split_at(key.len() / 2);
    let ecb = |k: &[u8], data: &[u8]| {
        let name = format!("-aes-{}-ecb", k.len() * 8);
        let out = openssl(&["enc", &name, "-nopad", "-K", &hex::encode(k)], data);
        assert_eq!(out.len(), data.len(), "openssl {name} output length");
        out
    };
    let first_tweaks = ecb(k2, ivs);
    let mut masks = Vec::with_capacity(plain.len());
    for t0 in first_tweaks.chunks(16) {
        let mut t: [u8; 16] = t0.try_into().unwrap();
        for _ in 0..ss / 16 {
            masks.extend_from_slice(&t);
            t = mul_alpha(t);
        }
    }
    assert_eq!(masks.len(), plain.len());
    let xor = |a: &[u8], b: &[u8]| a.iter().zip(b).map(|(x, y)| x ^ y).collect::<Vec<u8>>();
    xor(&ecb(k1, &xor(plain, &masks)), &masks)
}

struct Run {
    start: u64,
    sectors: usize,
    offset: u64,
}

/// The runs checked for one (spec, sector size, iv_large_sectors) configuration.
fn runs(rng: &mut Rng, ss: u32, large: bool, long: bool) -> Vec<Run> {
    let ratio = (ss / 512) as u64;
    let iv_step = if large { 1 } else { ratio };
    // Offsets keep IV numbering aligned to the sector when IVs count large sectors.
    let offset = |rng: &mut Rng| {
        if large {
            rng.below(1 << 20) * ratio
        } else {
            rng.below(1 << 20)
        }
    };
    let mut v = vec![
        // Small sector numbers.
        Run {
            start: rng.below(1 << 20),
            sectors: 1,
            offset: 0,
        },
        // IV sector numbers straddling 2^32 (plain wraps to 0 here, plain64 carries on).
        Run {
            start: (1u64 << 32) / iv_step - 2,
            sectors: 4,
            offset: 0,
        },
        // Far beyond 2^32, with an IV offset (plain mode's --skip).
        Run {
            start: (1u64 << 33) / iv_step + rng.below(1 << 36),
            sectors: 3,
            offset: offset(rng),
        },
        // A random run length and a random position.
        Run {
            start: rng.below(1 << 44),
            sectors: 2 + rng.below(5) as usize,
            offset: offset(rng),
        },
    ];
    if long {
        // More than one 64-sector IV batch in a single call.
        v.push(Run {
            start: rng.below(1 << 40),
            sectors: 67,
            offset: 0,
        });
    }
    v
}

fn check_spec(spec: &Spec, seed: u64) {
    require_openssl();
    let mut rng = Rng::new(seed);
    let parsed = CipherSpec::parse(spec.name).unwrap();
    let mut checked = 0usize;
    for (ss, large) in [(512u32, false), (4096, false), (4096, true)] {
        if large && spec.iv == Iv::Absent {
            continue; // no IV, nothing for iv_large_sectors to change
        }
        // One configuration per spec also gets a run longer than an IV batch.
        let long = ss == 512 && matches!(spec.name, "aes-xts-plain64" | "aes-cbc-essiv:sha256");
        for (ri, run) in runs(&mut rng, ss, large, long).into_iter().enumerate() {
            let key_len = spec.key_lens[(checked + ri) % spec.key_lens.len()];
            let key = rng.bytes(key_len);
            let iv = IvOptions {
                large_sectors: large,
                offset: run.offset,
            };
            let plain = rng.bytes(run.sectors * ss as usize);
            let want = reference(spec, &key, ss, iv, run.start, &plain);
            for b in backends() {
                let what = format!(
                    "{} key {} bits, {ss}-byte sectors, iv_large_sectors={large}, offset {}, \
                     sectors {:#x}+{} [backend {b}, seed {seed:#x}]",
                    spec.name,
                    key_len * 8,
                    run.offset,
                    run.start,
                    run.sectors
                );
                let c = SectorCipher::with_backend(parsed, &key, ss, iv, b)
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
                let mut buf = plain.clone();
                c.encrypt(run.start, &mut buf)
                    .unwrap_or_else(|e| panic!("{what}: encrypt: {e}"));
                for (i, (got, exp)) in buf
                    .chunks(ss as usize)
                    .zip(want.chunks(ss as usize))
                    .enumerate()
                {
                    assert_bytes_eq(got, exp, &format!("{what}: sector {i} vs openssl"));
                }
                c.decrypt(run.start, &mut buf)
                    .unwrap_or_else(|e| panic!("{what}: decrypt: {e}"));
                assert_bytes_eq(&buf, &plain, &format!("{what}: decrypt roundtrip"));
                // Decrypting OpenSSL's ciphertext directly, too.
                let mut buf = want.clone();
                c.decrypt(run.start, &mut buf).unwrap();
                assert_bytes_eq(&buf, &plain, &format!("{what}: decrypt openssl ciphertext"));
            }
            checked += 1;
        }
    }
    assert!(checked >= 8);
}

#[test]
fn xts_plain64_vs_openssl() {
    check_spec(&SPECS[0], 0x0001);
}

#[test]
fn xts_plain_vs_openssl() {
    check_spec(&SPECS[1], 0x0002);
}

#[test]
fn xts_plain64be_vs_openssl() {
    check_spec(&SPECS[2], 0x0003);
}

#[test]
fn cbc_essiv_sha256_vs_openssl() {
    check_spec(&SPECS[3], 0x0004);
}

#[test]
fn cbc_plain64_vs_openssl() {
    check_spec(&SPECS[4], 0x0005);
}

#[test]
fn cbc_plain_vs_openssl() {
    check_spec(&SPECS[5], 0x0006);
}

#[test]
fn cipher_null_vs_openssl() {
    check_spec(&SPECS[6], 0x0007);
}

/// The reference IV computation itself, pinned to hand-checked values so a mistake here
/// cannot make both sides agree on something wrong.
#[test]
fn reference_iv_numbering() {
    let none = IvOptions::default();
    assert_eq!(dm_iv_sector(3, 512, none), 3);
    assert_eq!(dm_iv_sector(3, 4096, none), 24);
    assert_eq!(
        dm_iv_sector(
            3,
            4096,
            IvOptions {
                large_sectors: true,
                offset: 0
            }
        ),
        3
    );
    assert_eq!(
        dm_iv_sector(
            3,
            4096,
            IvOptions {
                large_sectors: true,
                offset: 16
            }
        ),
        5
    );
    assert_eq!(
        dm_iv_sector(
            3,
            512,
            IvOptions {
                large_sectors: false,
                offset: 7
            }
        ),
        10
    );
    assert_eq!(
        hex::encode(dm_iv_block(Iv::Plain, 0x1_0000_0002)),
        "02000000000000000000000000000000"
    );
    assert_eq!(
        hex::encode(dm_iv_block(Iv::Plain64, 0x1_0000_0002)),
        "02000000010000000000000000000000"
    );
    assert_eq!(
        hex::encode(dm_iv_block(Iv::Plain64Be, 0x1_0000_0002)),
        "00000000000000000000000100000002"
    );
    let mut one = [0u8; 16];
    one[0] = 1;
    assert_eq!(
        hex::encode(mul_alpha(one)),
        "02000000000000000000000000000000"
    );
    let mut top = [0u8; 16];
    top[15] = 0x80;
    assert_eq!(
        hex::encode(mul_alpha(top)),
        "87000000000000000000000000000000"
    );
    top[0] = 0x80;
    assert_eq!(
        hex::encode(mul_alpha(top)),
        "87010000000000000000000000000000"
    );
}
