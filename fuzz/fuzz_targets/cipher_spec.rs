//! The string parsers behind plain mode and headers: cipher specs (joined and LUKS1's split
//! form), hash names, PBKDF names, plain mode's `--hash name[:len]`. The input is split at
//! NUL bytes into the strings fed to each parser.
#![no_main]

use cryptblk_crypto::{CipherSpec, HashAlg, KdfKind};
use cryptblk_format::plain::{PlainHash, PlainParams};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut parts = data.split(|&b| b == 0).map(String::from_utf8_lossy);
    let spec = parts.next().unwrap_or_default();
    let name = parts.next().unwrap_or_default();
    let mode = parts.next().unwrap_or_default();
    let hash = parts.next().unwrap_or_default();
    let key_len = parts.next().map_or(32, |s| s.len() * 8 % 1100);

    let parsed = [
        CipherSpec::parse(&spec),
        CipherSpec::from_parts(&name, &mode),
    ];
    for c in parsed.into_iter().flatten() {
        // What we print parses back to the same spec, and the LUKS1 fields too.
        let printed = c.to_string();
        assert_eq!(CipherSpec::parse(&printed).ok(), Some(c), "{printed}");
        assert_eq!(
            CipherSpec::from_parts(&c.cipher_name(), &c.cipher_mode()).ok(),
            Some(c)
        );
        let _ = (c.valid_key_len(key_len), c.default_key_len(), c.iv_len());
    }
    if let Ok(h) = HashAlg::from_name(&hash) {
        assert_eq!(HashAlg::from_name(h.name()).ok(), Some(h));
    }
    let _ = KdfKind::from_name(&hash);
    if let Ok(h) = PlainHash::from_name(&hash) {
        assert!(h.output_len() > 0);
    }

    let mut p = PlainParams::default();
    if let Ok(c) = CipherSpec::parse(&spec) {
        p.cipher = c;
    }
    p.key_len = key_len;
    if p.set_hash_spec(&hash).is_ok() {
        let printed = p.hash_spec();
        let mut q = PlainParams::default();
        q.set_hash_spec(&printed).expect("printed hash spec parses");
        assert_eq!((q.hash, q.hash_len), (p.hash, p.hash_len));
        if let Ok(k) = p.derive_key(mode.as_bytes()) {
            assert_eq!(k.len(), p.key_len);
        }
        let _ = p.key_from_keyfile(data, u64::from(data.first().copied().unwrap_or(0)));
    }
});
