//! AES-GCM on TLS-record-sized messages (16 KiB, 5 bytes of additional data): this crate's
//! vaes512 code against ring's (what the NBD TLS record layer uses on other CPUs), seal and
//! open, AES-128 and AES-256, one core, ROUNDS alternating rounds, medians in MB/s.
//! `cargo run --release -p cryptblk-crypto --example gcm_speed [ROUNDS] [RECORD BYTES]`
use cryptblk_crypto::AesGcm;
use ring::aead;
use std::time::{Duration, Instant};

const TIME: Duration = Duration::from_millis(300);

/// MB/s of `f` run on one record at a time for TIME.
fn rate(record: usize, mut f: impl FnMut(u64)) -> f64 {
    let (start, mut n) = (Instant::now(), 0u64);
    while start.elapsed() < TIME {
        for _ in 0..64 {
            f(n);
            n += 1;
        }
    }
    (n as f64 * record as f64) / start.elapsed().as_secs_f64() / 1e6
}

fn nonce(i: u64) -> [u8; 12] {
    let mut n = [0u8; 12];
    n[4..].copy_from_slice(&i.to_be_bytes());
    n
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let rounds: usize = std::env::args()
        .nth(1)
        .map_or(5, |s| s.parse().expect("ROUNDS"));
    let record: usize = std::env::args()
        .nth(2)
        .map_or(16 << 10, |s| s.parse().expect("RECORD BYTES"));
    if !AesGcm::is_available() {
        println!("this CPU has no vaes512 path: only ring's figures");
    }
    let aad = [23u8, 3, 3, 0x40, 0x11];
    println!(
        "| AES-GCM, {record}-byte records, MB/s | ring seal | ring open | cryptblk seal | cryptblk open |"
    );
    println!("|---|---|---|---|---|");
    for (alg, key_len) in [(&aead::AES_128_GCM, 16), (&aead::AES_256_GCM, 32)] {
        let key = vec![0x5a; key_len];
        let ring_key = aead::LessSafeKey::new(aead::UnboundKey::new(alg, &key).unwrap());
        let ours = AesGcm::new(&key).ok();
        let src = vec![0x17u8; record];
        let mut buf = src.clone();
        let mut dst = vec![0u8; record];
        let mut figures = vec![Vec::new(); 4];
        for _ in 0..rounds {
            figures[0].push(rate(record, |i| {
                let t = ring_key
                    .seal_in_place_separate_tag(
                        aead::Nonce::assume_unique_for_key(nonce(i)),
                        aead::Aad::from(aad),
                        &mut buf,
                    )
                    .unwrap();
                let _ = std::hint::black_box(t);
            }));
            // Opening needs a genuine tag: seal once, open the same record again and again.
            let mut sealed = src.clone();
            let tag = ring_key
                .seal_in_place_separate_tag(
                    aead::Nonce::assume_unique_for_key(nonce(0)),
                    aead::Aad::from(aad),
                    &mut sealed,
                )
                .unwrap();
            figures[1].push(rate(record, |_| {
                buf.copy_from_slice(&sealed);
                ring_key
                    .open_in_place_separate_tag(
                        aead::Nonce::assume_unique_for_key(nonce(0)),
                        aead::Aad::from(aad),
                        tag,
                        &mut buf,
                        0..,
                    )
                    .unwrap();
            }));
            if let Some(g) = &ours {
                figures[2].push(rate(record, |i| {
                    let mut m = g.begin(&nonce(i), &aad);
                    m.encrypt(&src, &mut dst);
                    std::hint::black_box(m.tag());
                }));
                figures[3].push(rate(record, |_| {
                    let mut m = g.begin(&nonce(0), &aad);
                    m.decrypt(&sealed, &mut dst);
                    m.verify(tag.as_ref()).unwrap();
                }));
            }
        }
        let cell = |v: &Vec<f64>| {
            if v.is_empty() {
                "-".to_string()
            } else {
                format!("{:.0}", median(v.clone()))
            }
        };
        println!(
            "| AES-{} | {} | {} | {} | {} |",
            key_len * 8,
            cell(&figures[0]),
            cell(&figures[1]),
            cell(&figures[2]),
            cell(&figures[3])
        );
    }
    println!("(ring's open includes copying the record into place first: it opens in place)");
}
