//! Reencryption end to end, offline and online, against cryptsetup 2.6: key changes,
//! encryption and decryption in place, data shifts, kills at every sync and mid-step.
//! One test binary of modules (one link, `common` compiled once), as rustls groups its
//! tests.

#[path = "../common/mod.rs"]
mod common;
#[path = "../common/xts.rs"]
mod xts;

mod decrypt_shift;
mod encrypt;
mod encrypt_shift;
mod online_reencrypt;
mod reencrypt;

/// LUKS2 metadata with its random parts (salts, digests, KDF costs) taken out, to compare
/// what two tools wrote.
fn metadata_shape(mut j: serde_json::Value) -> serde_json::Value {
    for k in j["keyslots"].as_object_mut().unwrap().values_mut() {
        k.as_object_mut().unwrap().remove("kdf");
    }
    for d in j["digests"].as_object_mut().unwrap().values_mut() {
        let d = d.as_object_mut().unwrap();
        d.remove("salt");
        d.remove("digest");
        d.remove("iterations");
    }
    j
}
