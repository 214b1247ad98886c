//! loop-AES volumes (`--type loopaes`): key files of 1, 64 and 65 keys read and written
//! through cryptblk, ciphertext on disk, and the key files cryptsetup refuses refused the
//! same way. Interop with the kernel (cryptsetup's loopaesOpen, both ways) runs in the VM
//! suite (tests/vm/dmcrypt-interop.sh); the lmk cipher's known answers come from dm-crypt
//! (crates/crypto/tests/data/dmcrypt.txt).

use crate::common::*;

fn key_file(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .flat_map(|i| {
            let mut l: Vec<u8> = (0..32)
                .map(|j| b'a' + ((i * 7 + j * 3 + seed as usize) % 26) as u8)
                .collect();
            l.push(b'\n');
            l
        })
        .collect()
}

#[test]
fn key_files_of_1_64_and_65_keys_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let p = |n: &str| dir.path().join(n).to_str().unwrap().to_string();
    let data: Vec<u8> = (0..(256u32 << 10)).map(|i| (i * 29 % 255) as u8).collect();
    std::fs::write(p("data"), &data).unwrap();
    let (data_f, back_f, wrong_f) = (p("data"), p("back"), p("wrong"));
    let mut images = Vec::new();
    for (n, extra) in [
        (1usize, vec![]),
        (64, vec!["--key-size", "256"]),
        (65, vec!["--offset", "8"]),
        (
            65,
            vec!["--key-size", "192", "--hash", "sha256", "--skip", "3"],
        ),
        (64, vec!["--cipher", "twofish"]),
    ] {
        let kf = p(&format!("k{n}"));
        std::fs::write(&kf, key_file(n, 1)).unwrap();
        let img = p("img");
        std::fs::File::create(&img)
            .unwrap()
            .set_len(1 << 20)
            .unwrap();
        let mut a = vec!["import", "--type", "loopaes", "--key-file", &kf];
        a.extend(&extra);
        a.extend([img.as_str(), &data_f]);
        ok(&run_in(bin(), &a, b""));
        let raw = std::fs::read(&img).unwrap();
        assert!(
            !raw.windows(64).any(|w| w == &data[512..576]),
            "{n} {extra:?}: plaintext"
        );
        let mut a = vec![
            "export",
            "--type",
            "loopaes",
            "--key-file",
            &kf,
            "--length",
            "262144",
        ];
        a.extend(&extra);
        a.extend([img.as_str(), &back_f]);
        ok(&run_in(bin(), &a, b""));
        assert!(
            std::fs::read(p("back")).unwrap() == data,
            "{n} {extra:?}: read back"
        );
        // Another key file reads something else: the keys matter.
        let other = p("other");
        std::fs::write(&other, key_file(n, 2)).unwrap();
        let mut a = vec![
            "export",
            "--type",
            "loopaes",
            "--key-file",
            &other,
            "--length",
            "4096",
        ];
        a.extend(&extra);
        a.extend([img.as_str(), &wrong_f]);
        ok(&run_in(bin(), &a, b""));
        assert_ne!(std::fs::read(p("wrong")).unwrap(), data[..4096]);
        images.push(raw);
    }
    // Each key count and option set gives its own ciphertext.
    for i in 0..images.len() {
        for j in i + 1..images.len() {
            assert_ne!(images[i][8192..12288], images[j][8192..12288], "{i} vs {j}");
        }
    }
}

#[test]
fn bad_key_files_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("img");
    std::fs::File::create(&img)
        .unwrap()
        .set_len(1 << 20)
        .unwrap();
    let img = img.to_str().unwrap();
    let out = run_in(bin(), &["export", "--type", "loopaes", img, "-"], b"");
    assert_eq!(out.status.code(), Some(1), "no key file: {out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("--key-file is required"));
    let mut unterminated = key_file(1, 0);
    unterminated.pop();
    for (what, content) in [
        ("two keys", key_file(2, 0)),
        ("unterminated", unterminated),
        ("gpg", b"-----BEGIN PGP MESSAGE-----\nhQEMA\n".to_vec()),
    ] {
        let kf = dir.path().join("kf");
        std::fs::write(&kf, &content).unwrap();
        let out = run_in(
            bin(),
            &[
                "export",
                "--type",
                "loopaes",
                "--key-file",
                kf.to_str().unwrap(),
                img,
                "-",
            ],
            b"",
        );
        assert_eq!(out.status.code(), Some(1), "{what}: {out:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("loop-AES") || err.contains("gpg"),
            "{what}: {err}"
        );
    }
}
