//! XTS-AES data units of any whole-block length with arbitrary 128-bit tweaks, through
//! `cryptblk_crypto::testing::xts_data_unit` on every supported backend:
//! the NIST CAVP XTSVS subset (`data/xtsvs.txt`, both tweak formats) and all IEEE 1619-2007
//! whole-block vectors (`data/ieee1619_xts.txt`, including the 32-byte ones).

use crate::common::{Record, assert_bytes_eq, backends, load};
use cryptblk_crypto::Backend;
use cryptblk_crypto::testing::xts_data_unit;

fn tweak_of(r: &Record) -> [u8; 16] {
    if r.has("seq") {
        (r.u64("seq") as u128).to_le_bytes()
    } else {
        r.hex("tweak")
            .try_into()
            .unwrap_or_else(|_| panic!("{}: tweak is not 16 bytes", r.label()))
    }
}

/// Runs one vector in its stated direction first, then back.
fn run(r: &Record, b: Backend, decrypt_first: bool) {
    let (key, pt, ct, iv) = (r.hex("key"), r.hex("pt"), r.hex("ct"), tweak_of(r));
    assert_eq!(pt.len(), ct.len(), "{}", r.label());
    let what = format!("{} [backend {b}]", r.label());
    let xts = |data: &mut [u8], enc: bool| {
        xts_data_unit(b, &key, iv, data, enc).unwrap_or_else(|e| {
            panic!(
                "{what}: xts_data_unit({} bytes, encrypt={enc}): {e}",
                data.len()
            )
        })
    };
    if decrypt_first {
        let mut buf = ct.clone();
        xts(&mut buf, false);
        assert_bytes_eq(&buf, &pt, &format!("{what}: decrypt"));
        xts(&mut buf, true);
        assert_bytes_eq(&buf, &ct, &format!("{what}: re-encrypt"));
    } else {
        let mut buf = pt.clone();
        xts(&mut buf, true);
        assert_bytes_eq(&buf, &ct, &format!("{what}: encrypt"));
        xts(&mut buf, false);
        assert_bytes_eq(&buf, &pt, &format!("{what}: decrypt"));
    }
}

#[test]
fn nist_cavp_xtsvs_subset() {
    let recs = load("xtsvs.txt");
    let count = |f: &dyn Fn(&Record) -> bool| recs.iter().filter(|r| f(r)).count();
    // Coverage the subset promises: both key sizes, both directions, both tweak formats,
    // 1-, 2- and 3-block data units.
    assert!(count(&|r| r.hex("key").len() == 32) >= 20);
    assert!(count(&|r| r.hex("key").len() == 64) >= 2);
    assert!(count(&|r| r.get("dir") == "dec") >= 8);
    assert!(count(&|r| r.has("seq")) >= 3);
    for blocks in 1..=3 {
        assert!(
            count(&|r| r.hex("pt").len() == 16 * blocks) >= 1,
            "{blocks}-block vectors"
        );
    }
    for b in backends() {
        for r in &recs {
            let dir = r.get("dir");
            assert!(dir == "enc" || dir == "dec", "{}: dir = {dir}", r.label());
            run(r, b, dir == "dec");
        }
    }
}

#[test]
fn ieee1619_2007_vectors_as_data_units() {
    let recs = load("ieee1619_xts.txt");
    for b in backends() {
        for r in &recs {
            run(r, b, false);
            run(r, b, true);
        }
    }
}

/// Data units that are not whole blocks are rejected, not silently truncated.
#[test]
fn partial_blocks_are_rejected() {
    for b in backends() {
        let key = [7u8; 32];
        let mut data = [0u8; 17];
        assert!(
            xts_data_unit(b, &key, [0; 16], &mut data, true).is_err(),
            "17 bytes on {b}"
        );
        let mut data = [0u8; 32];
        assert!(
            xts_data_unit(b, &key[..31], [0; 16], &mut data, true).is_err(),
            "31-byte key on {b}"
        );
    }
}
