//! `cryptblk convert --type luks1|luks2`, checked against the real cryptsetup converting a
//! copy of the same image: LUKS1 to LUKS2 gives the same metadata (JSON, `luksDump`) and
//! the same bytes from the keyslots area on; LUKS2 to LUKS1 gives the same image byte for
//! byte; passphrases and data survive both ways; what LUKS1 cannot hold is refused, by
//! both tools, with the image unchanged.

use crate::common::*;

const KDF: [&str; 4] = ["--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000"];

struct Lab {
    dir: tempfile::TempDir,
    cs: String,
    data: Vec<u8>,
}

impl Lab {
    fn new() -> Lab {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("pw"), b"first passphrase").unwrap();
        std::fs::write(dir.path().join("pw2"), b"second passphrase").unwrap();
        let data = (0..1usize << 20)
            .map(|i| (i * 37 + i / 1021) as u8)
            .collect();
        std::fs::write(dir.path().join("data"), &data).unwrap();
        Lab {
            dir,
            cs: tool("cryptsetup", "cryptsetup-bin"),
            data,
        }
    }
    fn p(&self, name: &str) -> String {
        self.dir.path().join(name).to_str().unwrap().to_string()
    }
    fn cs(&self, args: &[&str]) -> std::process::Output {
        run_in(&self.cs, args, b"")
    }
    /// A 20 MiB volume made by cryptsetup (`extra` options), passphrases in slots 1 and 3
    /// (slot 0 killed: the free slots between must convert too), 1 MiB of data written.
    fn volume(&self, name: &str, extra: &[&str]) -> String {
        let (img, pw, pw2) = (self.p(name), self.p("pw"), self.p("pw2"));
        std::fs::File::create(&img)
            .unwrap()
            .set_len(20 << 20)
            .unwrap();
        let mut a = vec!["luksFormat", "-q", "--key-file", &pw, &img];
        a.extend(KDF);
        a.extend(extra);
        ok(&self.cs(&a));
        let mut a = vec![
            "luksAddKey",
            "-q",
            "--key-file",
            &pw,
            "--key-slot",
            "1",
            &img,
            &pw2,
        ];
        a.extend(KDF);
        ok(&self.cs(&a));
        ok(&self.cs(&["luksKillSlot", "-q", "--key-file", &pw2, &img, "0"]));
        let mut a = vec![
            "luksAddKey",
            "-q",
            "--key-file",
            &pw2,
            "--key-slot",
            "3",
            &img,
            &pw,
        ];
        a.extend(KDF);
        ok(&self.cs(&a));
        let data = self.p("data");
        ok(&run_in(
            bin(),
            &["import", &img, &data, "--key-file", &pw],
            b"",
        ));
        img
    }
    /// Converts `img` with cryptblk and a copy with cryptsetup; returns the copy's path.
    fn both(&self, img: &str, to: &str) -> String {
        let copy = format!("{img}.cs");
        std::fs::copy(img, &copy).unwrap();
        ok(&run_in(bin(), &["convert", "-q", "--type", to, img], b""));
        ok(&self.cs(&["convert", "-q", "--type", to, &copy]));
        copy
    }
    /// Both passphrases open the volume in cryptsetup and the data reads back in cryptblk.
    fn check(&self, img: &str, what: &str) {
        for pw in ["pw", "pw2"] {
            let pw = self.p(pw);
            ok(&self.cs(&["open", "--test-passphrase", "--key-file", &pw, img]));
        }
        let out = self.p("out");
        let _ = std::fs::remove_file(&out);
        let pw2 = self.p("pw2");
        ok(&run_in(
            bin(),
            &["export", img, &out, "--key-file", &pw2],
            b"",
        ));
        assert!(
            std::fs::read(&out).unwrap()[..self.data.len()] == self.data[..],
            "{what}: data"
        );
    }
    fn json(&self, img: &str) -> serde_json::Value {
        serde_json::from_str(&ok(&self.cs(&["luksDump", "--dump-json-metadata", img]))).unwrap()
    }
}

#[test]
fn converts_both_ways_as_cryptsetup_does() {
    let lab = Lab::new();
    // LUKS1 -> LUKS2.
    let img = lab.volume("v1.img", &["--type", "luks1"]);
    let copy = lab.both(&img, "luks2");
    assert_eq!(
        lab.json(&img),
        lab.json(&copy),
        "metadata differs from cryptsetup's"
    );
    assert_eq!(
        ok(&lab.cs(&["luksDump", &img])),
        ok(&lab.cs(&["luksDump", &copy]))
    );
    let (mine, theirs) = (std::fs::read(&img).unwrap(), std::fs::read(&copy).unwrap());
    assert!(
        mine[32 << 10..] == theirs[32 << 10..],
        "keyslots or data differ"
    );
    lab.check(&img, "LUKS1 -> LUKS2");
    ok(&lab.cs(&["repair", "-q", &img]));
    assert!(
        std::fs::read(&img).unwrap() == mine,
        "cryptsetup repaired the converted header"
    );
    // LUKS2 -> LUKS1, back again: byte for byte cryptsetup's image.
    let copy = lab.both(&img, "luks1");
    assert!(
        std::fs::read(&img).unwrap() == std::fs::read(&copy).unwrap(),
        "LUKS1 images differ"
    );
    lab.check(&img, "LUKS2 -> LUKS1");
    // A LUKS2 volume cryptsetup made (PBKDF2 keyslots) to LUKS1.
    let img = lab.volume("v2.img", &["--type", "luks2", "--sector-size", "512"]);
    let copy = lab.both(&img, "luks1");
    assert!(
        std::fs::read(&img).unwrap() == std::fs::read(&copy).unwrap(),
        "LUKS1 images differ"
    );
    lab.check(&img, "cryptsetup's LUKS2 -> LUKS1");
}

#[test]
fn what_luks1_cannot_hold_is_refused_by_both_tools_and_changes_nothing() {
    let lab = Lab::new();
    let pw = lab.p("pw");
    let refused = |img: &str, to: &str, why: &str| {
        let before = std::fs::read(img).unwrap();
        let out = run_in(bin(), &["convert", "-q", "--type", to, img], b"");
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(!out.status.success(), "{why}: cryptblk converted it");
        assert!(
            std::fs::read(img).unwrap() == before,
            "{why}: the image changed"
        );
        let out = lab.cs(&["convert", "-q", "--type", to, img]);
        assert!(!out.status.success(), "{why}: cryptsetup converts it");
        assert!(
            std::fs::read(img).unwrap() == before,
            "{why}: cryptsetup changed it"
        );
        err
    };
    let img = lab.volume("argon.img", &["--type", "luks2", "--sector-size", "512"]);
    let mut a = vec![
        "luksConvertKey",
        "-q",
        "--key-file",
        &pw,
        "--key-slot",
        "3",
        &img,
    ];
    a.extend([
        "--pbkdf",
        "argon2id",
        "--pbkdf-force-iterations",
        "4",
        "--pbkdf-memory",
        "32",
    ]);
    ok(&lab.cs(&a));
    let err = refused(&img, "luks1", "argon2id keyslot");
    assert!(err.contains("keyslot 3 is not LUKS1 compatible"), "{err}");
    let img = lab.volume("token.img", &["--type", "luks2", "--sector-size", "512"]);
    let tok = lab.p("tok.json");
    std::fs::write(&tok, br#"{"type":"x-test","keyslots":["1"]}"#).unwrap();
    ok(&lab.cs(&["token", "import", "--json-file", &tok, &img]));
    let err = refused(&img, "luks1", "token");
    assert!(err.contains("token"), "{err}");
    let img = lab.volume("4k.img", &["--type", "luks2", "--sector-size", "4096"]);
    let err = refused(&img, "luks1", "4096-byte sectors");
    assert!(err.contains("sector size"), "{err}");
    let err = refused(&img, "luks2", "already LUKS2");
    assert!(err.contains("already"), "{err}");
    // LUKS1 data right behind its keyslots: no room to move them up by 28 KiB.
    let img = lab.volume(
        "tight.img",
        &[
            "--type",
            "luks1",
            "--key-size",
            "256",
            "--align-payload",
            "2056",
        ],
    );
    let err = refused(&img, "luks2", "no room");
    assert!(err.contains("Not enough space"), "{err}");
}
