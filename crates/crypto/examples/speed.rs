//! Quick speed check of every backend: `cargo run --release -p cryptblk-crypto --example speed`.
use cryptblk_crypto::{Backend, CipherSpec, bench::cipher_speed};
use std::time::Duration;

fn main() {
    for spec in ["aes-xts-plain64", "aes-cbc-essiv:sha256"] {
        let spec = CipherSpec::parse(spec).unwrap();
        for (ss, req) in [(512u32, 512usize), (512, 4096), (4096, 4096), (4096, 65536)] {
            for b in Backend::supported() {
                let s = cipher_speed(
                    spec,
                    spec.default_key_len(),
                    ss,
                    req,
                    b,
                    Duration::from_millis(300),
                )
                .unwrap();
                println!(
                    "{:24} {:>4} req {:>6} {:8} enc {:8.0} dec {:8.0}",
                    s.cipher,
                    ss,
                    req,
                    b.name(),
                    s.encrypt_mb_s,
                    s.decrypt_mb_s
                );
            }
        }
    }
}
