//! LUKS1 phdr parser and header loader: any bytes as a header device.
#![no_main]

use cryptblk_format::luks1::Luks1Header;
use cryptblk_format::{LuksHeader, MemStorage, load_header};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(h) = Luks1Header::from_bytes(data) {
        // What we parse, we serialize to the same bytes.
        let again = Luks1Header::from_bytes(&h.to_bytes()).expect("our own phdr parses");
        assert_eq!(again.to_bytes(), h.to_bytes());
    }
    let mut input = data.to_vec();
    // The seeds carry only keyslot 0's material; stand in zeros for the other slots (up
    // to 2 MiB) so that a header whose areas end past the input still loads and unlocks.
    if let Ok(h) = Luks1Header::from_bytes(data)
        && let Ok(need) = usize::try_from(h.header_size())
        && need <= 2 << 20
        && need > input.len()
    {
        input.resize(need, 0);
    }
    let mut dev = MemStorage::from_vec(input.clone());
    let _ = load_header(&mut dev).map_err(|e| e.to_string());
    match Luks1Header::read(&mut dev) {
        Ok(h) => {
            let _ = (h.hash_spec(), h.payload_offset_sectors());
            cryptblk_fuzz::exercise(&h, &mut dev, Some(h.mk_digest_iterations()));
            // Killing a slot writes a phdr that must read back without the slot.
            if let Some(k) = h.keyslots().iter().find(|k| k.active) {
                let mut d = dev.clone();
                let mut h2 = h.clone();
                if h2.kill_keyslot(&mut d, k.id).is_ok() {
                    let r = Luks1Header::read(&mut d).expect("phdr we wrote must read back");
                    assert!(!r.keyslots()[k.id as usize].active);
                }
            }
        }
        Err(e) => {
            let _ = e.to_string();
        }
    }
    assert_eq!(dev.to_vec(), input, "reading a header wrote to it");
});
