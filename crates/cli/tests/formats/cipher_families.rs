//! LUKS volumes with every cipher family cryptsetup's LUKS1 test set and dm-crypt use
//! (Serpent, Twofish, Camellia, Kuznyechik, Blowfish, CAST5, 3DES; XTS, CBC, LRW; ESSIV,
//! benbi...).
//!
//! * cryptsetup's own LUKS1 test images (`tests/luks1-images.tar.xz`, fetched by
//!   scripts/fetch-cryptsetup-images.sh): all twelve open with their key file and hold the
//!   filesystem cryptsetup's test expects (blkid UUID DEAD-BABE). cryptsetup itself, on
//!   this host without the kernel's AF_ALG ciphers, opens only the AES-XTS/CBC ones.
//! * cryptblk formats each family, LUKS1 and LUKS2, takes a second keyslot, and reads back
//!   what it wrote. Both-way interop with the kernel's dm-crypt for the same families runs
//!   in the VM suite (tests/vm/dmcrypt-interop.sh).

use crate::common::*;

#[test]
fn cryptsetups_luks1_test_set_opens_with_the_expected_filesystem() {
    let src = cryptsetup_images("luks1-images");
    let blkid = tool("blkid", "util-linux");
    let dir = tempfile::tempdir().unwrap();
    let mut images: Vec<_> = std::fs::read_dir(&src)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "img"))
        .collect();
    images.sort();
    assert_eq!(
        images.len(),
        12,
        "cryptsetup's LUKS1 set has 12 images: {images:?}"
    );
    let key = src.join("keyfile1");
    let key = key.to_str().unwrap();
    let wrong = dir.path().join("wrong");
    std::fs::write(&wrong, b"not the key file").unwrap();
    for img in &images {
        let name = img.file_name().unwrap().to_str().unwrap();
        // A copy: the fetched set stays as cryptsetup ships it.
        let copy = dir.path().join(name);
        std::fs::copy(img, &copy).unwrap();
        let copy = copy.to_str().unwrap();
        let out = run_in(bin(), &["test-passphrase", "--key-file", key, copy], b"");
        assert!(out.status.success(), "{name}: {out:?}");
        let out = run_in(
            bin(),
            &[
                "test-passphrase",
                "--key-file",
                wrong.to_str().unwrap(),
                copy,
            ],
            b"",
        );
        assert_eq!(
            out.status.code(),
            Some(2),
            "{name}: wrong key file: {out:?}"
        );
        let plain = dir.path().join("plain");
        ok(&run_in(
            bin(),
            &["export", "--key-file", key, copy, plain.to_str().unwrap()],
            b"",
        ));
        let uuid = ok(&run_in(
            &blkid,
            &["-p", "-o", "value", "-s", "UUID", plain.to_str().unwrap()],
            b"",
        ));
        assert_eq!(uuid.trim(), "DEAD-BABE", "{name}: filesystem inside");
        // The cipher the name promises is the one in the header.
        let dump = ok(&run_in(bin(), &["dump", copy], b""));
        let family = name.trim_start_matches("luks1_").split('-').next().unwrap();
        assert!(dump.contains(family), "{name}: dump names {family}: {dump}");
        std::fs::remove_file(&plain).unwrap();
    }
}

#[test]
fn cryptblk_formats_every_family_and_reads_back() {
    let dir = tempfile::tempdir().unwrap();
    let p = |n: &str| dir.path().join(n).to_str().unwrap().to_string();
    std::fs::write(p("pw"), b"families").unwrap();
    std::fs::write(p("pw2"), b"second").unwrap();
    let data: Vec<u8> = (0..(512u32 << 10)).map(|i| (i * 131 % 251) as u8).collect();
    std::fs::write(p("data"), &data).unwrap();
    for (cipher, bits) in [
        ("serpent-xts-plain64", "512"),
        ("twofish-xts-plain64", "256"),
        ("camellia-xts-plain64", "512"),
        ("kuznyechik-xts-plain64", "512"),
        ("serpent-cbc-essiv:sha256", "256"),
        ("twofish-cbc-plain64", "256"),
        ("camellia-cbc-essiv:sha256", "128"),
        ("kuznyechik-cbc-essiv:sha256", "256"),
        ("aes-lrw-benbi", "384"),
        ("serpent-lrw-plain64", "256"),
        ("blowfish-cbc-essiv:sha256", "256"),
        ("cast5-cbc-plain64", "128"),
        ("des3_ede-cbc-plain64", "192"),
        ("aes-xts-essiv:sha256", "512"),
    ] {
        for kind in ["luks1", "luks2"] {
            let what = format!("{kind} {cipher}/{bits}");
            let img = p("v.img");
            let _ = std::fs::remove_file(&img);
            std::fs::File::create(&img)
                .unwrap()
                .set_len(20 << 20)
                .unwrap();
            let mut args = vec![
                "format",
                "-q",
                "--type",
                kind,
                "--cipher",
                cipher,
                "--key-size",
                bits,
            ];
            args.extend(["--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000"]);
            let pw = p("pw");
            args.extend(["--key-file", &pw, &img]);
            let out = run_in(bin(), &args, b"");
            assert!(out.status.success(), "{what}: format: {out:?}");
            let dump = ok(&run_in(bin(), &["dump", &img], b""));
            let (family, mode) = cipher.split_once('-').unwrap();
            assert!(
                dump.contains(family) && dump.contains(mode),
                "{what}: dump: {dump}"
            );
            let pw2 = p("pw2");
            ok(&run_in(
                bin(),
                &[
                    "add-key",
                    "--key-file",
                    &pw,
                    "--pbkdf",
                    "pbkdf2",
                    "--pbkdf-force-iterations",
                    "1000",
                    &img,
                    &pw2,
                ],
                b"",
            ));
            ok(&run_in(
                bin(),
                &["import", "--key-file", &pw, &img, &p("data")],
                b"",
            ));
            let back = p("back");
            ok(&run_in(
                bin(),
                &[
                    "export",
                    "--key-file",
                    &pw2,
                    "--length",
                    "524288",
                    &img,
                    &back,
                ],
                b"",
            ));
            assert!(
                std::fs::read(&back).unwrap() == data,
                "{what}: data read back"
            );
            // What is on disk is ciphertext.
            let raw = std::fs::read(&img).unwrap();
            assert!(
                !raw.windows(64).any(|w| w == &data[4096..4160]),
                "{what}: plaintext on disk"
            );
        }
    }
}
