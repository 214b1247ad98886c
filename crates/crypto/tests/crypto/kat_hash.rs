//! Hash known answers (data file `hash.txt`) for every hash beyond SHA-1/SHA-256/SHA-512/
//! RIPEMD-160 (whose vectors are in the unit tests and the PBKDF2 file): SHA-224/384,
//! SHA-3, Whirlpool, BLAKE2b/s, SM3, Streebog, each from an implementation other than
//! cryptblk's (see the file's header).

use crate::common::{assert_bytes_eq, load};
use cryptblk_crypto::HashAlg;
use std::collections::BTreeMap;

#[test]
fn hash_vectors() {
    let mut per_hash: BTreeMap<&str, usize> = BTreeMap::new();
    let recs = load("hash.txt");
    for r in &recs {
        let hash = HashAlg::from_name(r.get("hash")).unwrap();
        *per_hash.entry(hash.name()).or_default() += 1;
        let want = r.hex("digest");
        assert_eq!(want.len(), hash.output_len(), "{}", r.label());
        assert_bytes_eq(&hash.digest(&r.hex("msg")), &want, &r.label());
        // The same through the multi-part interface, split in the middle.
        let msg = r.hex("msg");
        let (a, b) = msg.split_at(msg.len() / 2);
        let mut out = vec![0u8; hash.output_len()];
        hash.digest_parts(&[a, b], &mut out);
        assert_bytes_eq(&out, &want, &format!("{} in two parts", r.label()));
    }
    for hash in HashAlg::all() {
        let n = per_hash.get(hash.name()).copied().unwrap_or(0);
        let covered_elsewhere = matches!(
            hash,
            HashAlg::Sha1 | HashAlg::Sha256 | HashAlg::Sha512 | HashAlg::Ripemd160
        );
        assert!(covered_elsewhere || n >= 4, "{hash}: {n} vectors");
    }
}
