//! Backend equivalence and splitter properties.
//!
//! * Every supported backend gives byte-for-byte what the generic backend gives, for random
//!   ciphers, key sizes, sector sizes, IV options, start sectors and run lengths (1..=80
//!   sectors, so runs spanning several 64-sector IV batches are covered), in both directions,
//!   in place and out of place (`encrypt_from`, `decrypt_from`); and splitting a run into two calls changes
//!   nothing.
//! * `af_split`/`af_merge` round trips, and damage to any stripe is detected.
//! * `CRYPTBLK_CRYPTO_BACKEND` is honoured by `SectorCipher::new` (checked in a child process,
//!   so no test has to mutate its own environment).

use crate::common::{Rng, assert_bytes_eq, backends};
use cryptblk_crypto::{
    BACKEND_ENV, Backend, CipherSpec, HashAlg, IvOptions, SectorCipher, af_merge, af_split,
};
use proptest::prelude::*;

const SPECS: &[&str] = &[
    "aes-xts-plain64",
    "aes-xts-plain",
    "aes-xts-plain64be",
    "aes-cbc-essiv:sha256",
    "aes-cbc-plain64",
    "aes-cbc-plain",
    "aes-cbc-null",
    "aes-ecb",
    "cipher_null-ecb",
];

fn key_lens(spec: &str) -> &'static [usize] {
    if spec.starts_with("cipher_null") {
        &[0, 16, 32]
    } else if spec.starts_with("aes-xts") {
        &[32, 48, 64]
    } else {
        &[16, 24, 32]
    }
}

#[derive(Debug, Clone)]
struct Case {
    spec: &'static str,
    key_len: usize,
    ss: u32,
    large: bool,
    offset: u64,
    start: u64,
    sectors: usize,
    split: usize,
    seed: u64,
}

fn case() -> impl Strategy<Value = Case> {
    (
        0..SPECS.len(),
        0usize..3,
        prop::sample::select(vec![512u32, 1024, 2048, 4096]),
        any::<bool>(),
        prop_oneof![Just(0u64), 0u64..1 << 40, any::<u64>()],
        prop_oneof![
            0u64..1 << 10,
            (1u64 << 32) - 100..(1u64 << 32) + 100,
            0u64..1 << 54
        ],
        1usize..=80,
        any::<prop::sample::Index>(),
        any::<u64>(),
    )
        .prop_map(|(si, ki, ss, large, offset, start, sectors, split, seed)| {
            let spec = SPECS[si];
            let lens = key_lens(spec);
            Case {
                spec,
                key_len: lens[ki % lens.len()],
                ss,
                large,
                offset,
                start,
                sectors,
                split: split.index(sectors + 1),
                seed,
            }
        })
}

fn make(c: &Case, key: &[u8], b: Backend) -> SectorCipher {
    let iv = IvOptions {
        large_sectors: c.large,
        offset: c.offset,
    };
    SectorCipher::with_backend(CipherSpec::parse(c.spec).unwrap(), key, c.ss, iv, b)
        .unwrap_or_else(|e| panic!("{c:?} on {b}: {e}"))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn every_backend_matches_generic(c in case()) {
        let mut rng = Rng::new(c.seed);
        let key = rng.bytes(c.key_len);
        let data = rng.bytes(c.sectors * c.ss as usize);
        let generic = make(&c, &key, Backend::Generic);
        let mut want_ct = data.clone();
        generic.encrypt(c.start, &mut want_ct).unwrap();
        // `data` doubles as a ciphertext for the decrypt direction.
        let mut want_pt = data.clone();
        generic.decrypt(c.start, &mut want_pt).unwrap();
        let mut back = want_ct.clone();
        generic.decrypt(c.start, &mut back).unwrap();
        assert_bytes_eq(&back, &data, &format!("{c:?}: generic roundtrip"));

        let ss = c.ss as usize;
        for b in backends() {
            let cipher = make(&c, &key, b);
            prop_assert_eq!(cipher.backend(), b);
            let mut ct = data.clone();
            cipher.encrypt(c.start, &mut ct).unwrap();
            assert_bytes_eq(&ct, &want_ct, &format!("{c:?}: encrypt on {b}"));
            let mut pt = data.clone();
            cipher.decrypt(c.start, &mut pt).unwrap();
            assert_bytes_eq(&pt, &want_pt, &format!("{c:?}: decrypt on {b}"));
            // Out of place (the mmap engine's read path), from an odd address.
            let mut src = vec![0u8; data.len() + 1];
            src[1..].copy_from_slice(&data);
            let mut out = vec![0u8; data.len()];
            cipher.decrypt_from(c.start, &src[1..], &mut out).unwrap();
            assert_bytes_eq(&out, &want_pt, &format!("{c:?}: decrypt_from on {b}"));
            assert!(cipher.decrypt_from(c.start, &src, &mut out).is_err(), "lengths differ");
            // One pass (nothing but ciphertext ever in the destination) only where the
            // out-of-place loop exists: AES-128/256-XTS on the VAES paths (AES-192 has no
            // fast path).
            assert_eq!(
                cipher.transforms_in_one_pass(),
                matches!(b, Backend::Vaes512 | Backend::Vaes256)
                    && c.spec.starts_with("aes-xts")
                    && c.key_len != 48,
                "{c:?} on {b}"
            );
            cipher.encrypt_from(c.start, &src[1..], &mut out).unwrap();
            assert_bytes_eq(&out, &want_ct, &format!("{c:?}: encrypt_from on {b}"));

            // The same run in two calls, split at a sector boundary.
            let k = c.split * ss;
            let mut two = data.clone();
            let (head, tail) = two.split_at_mut(k);
            cipher.encrypt(c.start, head).unwrap();
            cipher.encrypt(c.start + c.split as u64, tail).unwrap();
            assert_bytes_eq(&two, &want_ct, &format!("{c:?}: encrypt split at sector {} on {b}", c.split));
            let (head, tail) = two.split_at_mut(k);
            cipher.decrypt(c.start, head).unwrap();
            cipher.decrypt(c.start + c.split as u64, tail).unwrap();
            assert_bytes_eq(&two, &data, &format!("{c:?}: decrypt split at sector {} on {b}", c.split));
        }
    }

    #[test]
    fn partial_sectors_are_rejected(c in case(), cut in 1usize..512) {
        let key = Rng::new(c.seed).bytes(c.key_len);
        for b in backends() {
            let cipher = make(&c, &key, b);
            let mut data = vec![0u8; c.sectors * c.ss as usize - cut];
            prop_assert!(cipher.encrypt(c.start, &mut data).is_err());
            prop_assert!(cipher.decrypt(c.start, &mut data).is_err());
        }
    }
}

fn hash() -> impl Strategy<Value = HashAlg> {
    prop::sample::select(vec![HashAlg::Sha1, HashAlg::Sha256, HashAlg::Sha512])
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn af_split_merge_roundtrip(
        key in prop::collection::vec(any::<u8>(), 1..=96),
        stripes in prop_oneof![1u32..=4, 5u32..=600, Just(4000u32)],
        h in hash(),
        extra in 0usize..64,
    ) {
        let split = af_split(&key, stripes, h).unwrap();
        prop_assert_eq!(split.len(), key.len() * stripes as usize);
        let merged = af_merge(&split, key.len(), stripes, h).unwrap();
        prop_assert_eq!(&merged[..], &key[..]);
        // Trailing material (keyslot area padding) is ignored.
        let mut padded = split.to_vec();
        padded.extend(std::iter::repeat_n(0xa5u8, extra));
        prop_assert_eq!(&af_merge(&padded, key.len(), stripes, h).unwrap()[..], &key[..]);
        // Splitting is randomised: two splits of one key differ (except for one stripe). Only
        // asserted with at least 64 random bits, else equal splits happen by chance.
        let again = af_split(&key, stripes, h).unwrap();
        if key.len() * (stripes as usize - 1) >= 8 {
            prop_assert_ne!(&again[..], &split[..]);
        }
        prop_assert_eq!(&af_merge(&again, key.len(), stripes, h).unwrap()[..], &key[..]);
    }

    #[test]
    fn af_damage_to_any_stripe_changes_the_key(
        // At least 16 bytes: with a 1-byte key a damaged stripe still merges to the same key
        // with probability 2^-8, which is the construction, not a bug.
        key in prop::collection::vec(any::<u8>(), 16..=64),
        stripes in 1u32..=300,
        h in hash(),
        pos in any::<prop::sample::Index>(),
        bit in 0u8..8,
    ) {
        let split = af_split(&key, stripes, h).unwrap();
        let mut broken = split.to_vec();
        let i = pos.index(broken.len());
        // The diffusion hashes the key in digest-sized blocks, truncating a short last
        // block: a change there passes through a hash cut to that many bytes at each later
        // stripe and dies out with probability about stripes × 2^-(8 × block length). That
        // is the construction (cryptsetup's); only blocks of 8 bytes or more are asserted.
        let digest = match h { HashAlg::Sha1 => 20, HashAlg::Sha256 => 32, _ => 64 };
        let in_key = i % key.len();
        let block_start = in_key / digest * digest;
        let last_stripe = i / key.len() == stripes as usize - 1;
        prop_assume!(last_stripe || (key.len() - block_start).min(digest) >= 8);
        broken[i] ^= 1 << bit;
        let merged = af_merge(&broken, key.len(), stripes, h).unwrap();
        prop_assert_ne!(&merged[..], &key[..], "flip at byte {} of {}", i, broken.len());
    }

    #[test]
    fn af_merge_rejects_short_material(
        key_len in 1usize..=64,
        stripes in 1u32..=100,
        short in 1usize..=64,
        h in hash(),
    ) {
        let need = key_len * stripes as usize;
        let material = vec![0u8; need.saturating_sub(short)];
        prop_assert!(af_merge(&material, key_len, stripes, h).is_err());
    }
}

#[test]
fn af_zero_stripes_is_an_error() {
    assert!(af_split(&[1, 2, 3], 0, HashAlg::Sha256).is_err());
    assert!(af_merge(&[0; 64], 32, 0, HashAlg::Sha256).is_err());
}

// ---------------------------------------------------------------------------------------
// CRYPTBLK_CRYPTO_BACKEND
// ---------------------------------------------------------------------------------------

/// Set in the child processes `forced_backend_is_honoured` starts.
const PROBE: &str = "CRYPTBLK_TEST_BACKEND_PROBE";

/// Checks what `SectorCipher::new` picks under the `CRYPTBLK_CRYPTO_BACKEND` this process
/// inherited: in a normal run the environment CI gives it (unset: the detected backend;
/// set, as CI's soft-AES and forced-backend runs do: that one), and as a child of
/// `forced_backend_is_honoured` each value that test sets. Either way it asserts.
#[test]
fn backend_env_probe() {
    let forced = std::env::var(BACKEND_ENV).ok();
    let spec = CipherSpec::parse("aes-xts-plain64").unwrap();
    let key = [0x42u8; 64];
    let got = SectorCipher::new(spec, &key, 4096, IvOptions::default());
    let current = Backend::current();
    let expected: Option<Backend> = match forced.as_deref() {
        None | Some("") => Some(Backend::detect()),
        Some(name) => Backend::from_name(name).ok().filter(|b| b.is_supported()),
    };
    match expected {
        Some(b) => {
            let c = got.unwrap_or_else(|e| {
                panic!("{BACKEND_ENV}={forced:?}: SectorCipher::new failed: {e}")
            });
            assert_eq!(c.backend(), b, "{BACKEND_ENV}={forced:?}");
            assert_eq!(current, Ok(b));
            // And it computes what the generic backend computes.
            let generic = SectorCipher::with_backend(
                spec,
                &key,
                4096,
                IvOptions::default(),
                Backend::Generic,
            )
            .unwrap();
            let mut x = vec![0x17u8; 3 * 4096];
            let mut y = x.clone();
            c.encrypt(9, &mut x).unwrap();
            generic.encrypt(9, &mut y).unwrap();
            assert_eq!(x, y, "forced {b} differs from generic");
            println!("PROBE-RESULT backend={b}");
        }
        None => {
            let e = got.expect_err("an unknown or unsupported backend name must be an error");
            assert!(current.is_err());
            println!("PROBE-RESULT error={e}");
        }
    }
}

fn probe(value: Option<&str>) -> String {
    let exe = std::env::current_exe().expect("test binary path");
    let mut cmd = std::process::Command::new(exe);
    // The probe's test name: its module's path in this test binary, without the crate.
    let name = match module_path!().split_once("::") {
        Some((_, m)) => format!("{m}::backend_env_probe"),
        None => "backend_env_probe".to_string(),
    };
    cmd.args(["--exact", &name, "--nocapture", "--test-threads=1"])
        .env(PROBE, "1");
    match value {
        Some(v) => cmd.env(BACKEND_ENV, v),
        None => cmd.env_remove(BACKEND_ENV),
    };
    let out = cmd.output().expect("running the probe");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "probe with {BACKEND_ENV}={value:?} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = stdout
        .lines()
        .find_map(|l| l.split_once("PROBE-RESULT ").map(|(_, r)| r))
        .unwrap_or_else(|| panic!("probe with {BACKEND_ENV}={value:?} did not run:\n{stdout}"));
    line.to_string()
}

#[test]
fn forced_backend_is_honoured() {
    for b in Backend::ALL {
        let r = probe(Some(b.name()));
        if b.is_supported() {
            assert_eq!(r, format!("backend={b}"));
        } else {
            assert!(r.starts_with("error="), "{b} is unsupported here, got {r}");
        }
    }
    assert_eq!(probe(None), format!("backend={}", Backend::detect()));
    assert_eq!(probe(Some("")), format!("backend={}", Backend::detect()));
    for bogus in ["bogus", "AESNI", "generic "] {
        let r = probe(Some(bogus));
        assert!(
            r.starts_with("error="),
            "{BACKEND_ENV}={bogus:?} must be rejected, got {r}"
        );
    }
    assert!(Backend::from_name("bogus").is_err());
}

/// The backend chosen on this CPU is the fastest one it can run: never the AES-NI path on
/// a CPU with VAES, never VAES-256 where the AVX-512 path runs.
#[test]
fn chosen_backend_is_the_fastest_here() {
    let chosen = Backend::detect();
    let supported = backends();
    assert!(supported.contains(&chosen));
    for b in &supported {
        assert!(
            b.speed_class() <= chosen.speed_class(),
            "{chosen} chosen although {b} (faster) runs here"
        );
    }
    // Independently of the speed classes, from the CPU's features.
    #[cfg(target_arch = "x86_64")]
    {
        let has = |f: &str| match f {
            "avx512" => {
                std::arch::is_x86_feature_detected!("avx512f")
                    && std::arch::is_x86_feature_detected!("avx512bw")
                    && std::arch::is_x86_feature_detected!("avx512vl")
            }
            "vaes" => {
                std::arch::is_x86_feature_detected!("vaes")
                    && std::arch::is_x86_feature_detected!("vpclmulqdq")
                    && std::arch::is_x86_feature_detected!("avx2")
            }
            _ => std::arch::is_x86_feature_detected!("aes"),
        };
        let expected = if has("vaes") && has("avx512") {
            Backend::Vaes512
        } else if has("vaes") {
            Backend::Vaes256
        } else if has("aes") {
            Backend::AesNi
        } else {
            Backend::Generic
        };
        assert_eq!(chosen, expected, "backend chosen for this CPU");
        println!("chosen backend on this CPU: {chosen}");
    }
}
