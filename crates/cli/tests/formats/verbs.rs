//! cryptsetup's remaining LUKS verbs, checked against the real cryptsetup: `config`
//! (label, subsystem, keyslot priority), `uuid --uuid` (LUKS1 and LUKS2), `erase`
//! (crypto-shred), `luksConvertKey` (a keyslot's PBKDF), `token` (add, import, export,
//! unassign, remove), and cryptsetup's command names as aliases.

use crate::common::*;

struct Lab {
    dir: tempfile::TempDir,
    cs: String,
}

impl Lab {
    fn new() -> Lab {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("pw"), b"verbs").unwrap();
        Lab {
            dir,
            cs: tool("cryptsetup", "cryptsetup-bin"),
        }
    }
    fn p(&self, name: &str) -> String {
        self.dir.path().join(name).to_str().unwrap().to_string()
    }
    fn image(&self, name: &str, kind: &str) -> String {
        let img = self.p(name);
        std::fs::File::create(&img)
            .unwrap()
            .set_len(20 << 20)
            .unwrap();
        ok(&run_in(
            &self.cs,
            &[
                "luksFormat",
                "-q",
                "--type",
                kind,
                "--pbkdf",
                "pbkdf2",
                "--pbkdf-force-iterations",
                "1000",
                "--key-file",
                &self.p("pw"),
                &img,
            ],
            b"",
        ));
        img
    }
    fn cb(&self, args: &[&str]) -> std::process::Output {
        run_in(bin(), args, b"")
    }
    fn dump(&self, img: &str) -> String {
        ok(&run_in(&self.cs, &["luksDump", img], b""))
    }
    fn opens(&self, img: &str) -> bool {
        run_in(
            &self.cs,
            &[
                "open",
                "--test-passphrase",
                "--key-file",
                &self.p("pw"),
                img,
            ],
            b"",
        )
        .status
        .success()
    }
}

fn field<'a>(dump: &'a str, name: &str) -> Option<&'a str> {
    dump.lines()
        .find_map(|l| l.trim().strip_prefix(name))
        .map(|v| v.trim_start_matches(':').trim())
}

#[test]
fn config_sets_label_subsystem_and_priority_as_cryptsetup_reads_them() {
    let lab = Lab::new();
    let img = lab.image("c.img", "luks2");
    ok(&lab.cb(&["config", &img, "--label", "data-01", "--subsystem", "ceph"]));
    ok(&lab.cb(&["config", &img, "--priority", "prefer", "--key-slot", "0"]));
    let d = lab.dump(&img);
    assert_eq!(field(&d, "Label"), Some("data-01"), "{d}");
    assert_eq!(field(&d, "Subsystem"), Some("ceph"), "{d}");
    assert_eq!(field(&d, "Priority"), Some("preferred"), "{d}");
    ok(&lab.cb(&[
        "config",
        &img,
        "--priority",
        "normal",
        "-S",
        "0",
        "--label",
        "",
    ]));
    let d = lab.dump(&img);
    assert_eq!(field(&d, "Priority"), Some("normal"), "{d}");
    assert_eq!(field(&d, "Label"), Some("(no label)"), "{d}");
    assert!(lab.opens(&img));
    assert!(
        !lab.cb(&["config", &img, "--priority", "first", "-S", "0"])
            .status
            .success()
    );
    assert!(
        !lab.cb(&["config", &img, "--priority", "ignore", "-S", "7"])
            .status
            .success()
    );
    assert!(
        !lab.cb(&["config", &img, "--label", &"x".repeat(48)])
            .status
            .success()
    );
    let l1 = lab.image("l1.img", "luks1");
    assert!(
        !lab.cb(&["config", &l1, "--label", "x"]).status.success(),
        "LUKS2 only"
    );
}

#[test]
fn uuid_is_set_on_both_versions_and_bad_ones_are_refused() {
    let lab = Lab::new();
    for kind in ["luks1", "luks2"] {
        let img = lab.image(&format!("{kind}.img"), kind);
        let u = "0b5e6d4c-8a71-4f0e-9d3a-2c1b0a998877";
        ok(&lab.cb(&["uuid", "-q", &img, "--uuid", u]));
        let cs = ok(&run_in(&lab.cs, &["luksUUID", &img], b""));
        assert_eq!(cs.trim(), u, "{kind}");
        assert_eq!(ok(&lab.cb(&["luksUUID", &img])).trim(), u, "{kind}: alias");
        assert!(lab.opens(&img), "{kind}");
        for bad in ["nope", "0b5e6d4c8a714f0e9d3a2c1b0a998877"] {
            assert!(
                !lab.cb(&["uuid", "-q", &img, "--uuid", bad])
                    .status
                    .success(),
                "{kind} {bad}"
            );
        }
        assert_eq!(ok(&lab.cb(&["uuid", &img])).trim(), u, "{kind}: unchanged");
    }
}

#[test]
fn erase_wipes_every_keyslot_on_both_versions() {
    let lab = Lab::new();
    for kind in ["luks1", "luks2"] {
        let img = lab.image(&format!("e-{kind}.img"), kind);
        let before = std::fs::read(&img).unwrap();
        assert!(lab.opens(&img));
        ok(&lab.cb(&["luksErase", "-q", &img]));
        assert!(!lab.opens(&img), "{kind}: no passphrase opens it any more");
        let after = std::fs::read(&img).unwrap();
        // The first keyslot's material (LUKS1: sector 8 on; LUKS2: after the two 16 KiB
        // header copies) is overwritten.
        let at = if kind == "luks1" { 4096 } else { 32768 };
        assert_ne!(
            before[at..at + 4096],
            after[at..at + 4096],
            "{kind}: material wiped"
        );
        let o = lab.cb(&["test-passphrase", &img, "--key-file", &lab.p("pw")]);
        assert!(!o.status.success(), "{kind}");
    }
}

#[test]
fn open_test_passphrase_checks_without_serving() {
    let lab = Lab::new();
    let img = lab.image("o.img", "luks2");
    let pw = lab.p("pw");
    let o = lab.cb(&[
        "open",
        "--test-passphrase",
        "--type",
        "luks2",
        &img,
        "--key-file",
        &pw,
    ]);
    ok(&o);
    assert!(String::from_utf8_lossy(&o.stderr).contains("Key slot 0 unlocked"));
    let bad = lab.p("bad");
    std::fs::write(&bad, b"wrong").unwrap();
    let o = lab.cb(&["luksOpen", "--test-passphrase", &img, "--key-file", &bad]);
    assert_eq!(
        o.status.code(),
        Some(2),
        "cryptsetup's exit code for a wrong passphrase"
    );
    let o = lab.cb(&["open", &img, "--key-file", &pw]);
    assert!(!o.status.success(), "serving still needs a name");
}

#[test]
fn convert_key_changes_a_keyslots_pbkdf_as_cryptsetup_reads_it() {
    let lab = Lab::new();
    let img = lab.image("v.img", "luks2");
    let pw = lab.p("pw");
    let kdf_of = |slot: &str| -> serde_json::Value {
        let out = ok(&run_in(
            &lab.cs,
            &["luksDump", "--dump-json-metadata", &img],
            b"",
        ));
        let j: serde_json::Value = serde_json::from_str(&out).unwrap();
        j["keyslots"][slot]["kdf"].clone()
    };
    assert_eq!(kdf_of("0")["type"], "pbkdf2");
    // A wrong passphrase: cryptsetup's exit code, nothing changed.
    std::fs::write(lab.p("bad"), b"nope").unwrap();
    let before = lab.dump(&img);
    let out = lab.cb(&[
        "luksConvertKey",
        "--key-file",
        &lab.p("bad"),
        &img,
        "--pbkdf",
        "argon2id",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(lab.dump(&img), before);
    // In place (--key-slot): PBKDF2 to argon2id with the costs asked for.
    let mut args = vec!["luksConvertKey", "--key-slot", "0", "--key-file", &pw, &img];
    args.extend(["--pbkdf", "argon2id", "--pbkdf-force-iterations", "4"]);
    args.extend(["--pbkdf-memory", "32768", "--pbkdf-parallel", "1"]);
    ok(&lab.cb(&args));
    let k = kdf_of("0");
    assert_eq!(k["type"], "argon2id", "{k}");
    assert_eq!(k["time"], 4);
    assert_eq!(k["memory"], 32768);
    assert_eq!(k["cpus"], 1);
    assert!(lab.opens(&img), "cryptsetup no longer opens it");
    // Without --key-slot the key moves to the first free slot, as with cryptsetup.
    let mut args = vec!["convert-key", "--key-file", &pw, &img];
    args.extend(["--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "2000"]);
    ok(&lab.cb(&args));
    assert!(kdf_of("0").is_null(), "slot 0 still there");
    assert_eq!(kdf_of("1")["iterations"], 2000);
    assert!(lab.opens(&img));
    // LUKS1 has no PBKDF choice to convert.
    let l1 = lab.image("l1.img", "luks1");
    let out = lab.cb(&["luksConvertKey", "--key-file", &pw, &l1]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a valid LUKS2 device"));
}

#[test]
fn tokens_are_added_imported_exported_unassigned_and_removed_as_cryptsetup_does() {
    let lab = Lab::new();
    let (a, b) = (lab.image("a.img", "luks2"), lab.image("b.img", "luks2"));
    let cs = |args: &[&str]| run_in(&lab.cs, args, b"");
    let export = |img: &str, id: &str| ok(&cs(&["token", "export", "--token-id", id, img]));
    // The same luks2-keyring token, one made by each tool: the same JSON.
    ok(&cs(&["token", "add", "--key-description", "vault:db", &a]));
    ok(&lab.cb(&["token", "add", "--key-description", "vault:db", &b]));
    assert_eq!(export(&b, "0"), export(&a, "0"));
    // A token of a type cryptsetup has no handler for (as an enrolment tool writes) imported by
    // cryptsetup, exported by cryptblk, imported by cryptblk into the other volume at a
    // chosen id: cryptsetup reads back the same JSON.
    let foreign = r#"{"type":"x-enroll","keyslots":["0"],"pcrs":[7],"blob":"AAE/+w=="}"#;
    std::fs::write(lab.p("t.json"), foreign).unwrap();
    ok(&cs(&[
        "token",
        "import",
        "--json-file",
        &lab.p("t.json"),
        &a,
    ]));
    let mine = ok(&lab.cb(&["token", "export", "--token-id", "1", &a]));
    assert_eq!(mine, export(&a, "1"));
    let out = run_in(
        bin(),
        &["token", "import", "--token-id", "3", &b],
        mine.as_bytes(),
    );
    ok(&out);
    assert_eq!(export(&b, "3"), mine);
    // --json-file export: a private file.
    let f = lab.p("out.json");
    ok(&lab.cb(&["token", "export", "--token-id", "3", "--json-file", &f, &b]));
    assert_eq!(std::fs::read_to_string(&f).unwrap(), mine);
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&f).unwrap().permissions().mode() & 0o777,
        0o600
    );
    // Unassign, then remove.
    ok(&lab.cb(&[
        "token",
        "unassign",
        "--token-id",
        "3",
        "--key-slot",
        "0",
        &b,
    ]));
    assert!(export(&b, "3").contains(r#""keyslots":[]"#));
    ok(&lab.cb(&["token", "remove", "--token-id", "3", &b]));
    assert!(
        !cs(&["token", "export", "--token-id", "3", &b])
            .status
            .success()
    );
    // Refused, nothing changed: an inactive keyslot, an id in use, not JSON, no type.
    let before = std::fs::read(&b).unwrap();
    for (json, extra) in [
        (r#"{"type":"x","keyslots":["5"]}"#, vec![]),
        (r#"{"type":"x","keyslots":[]}"#, vec!["--token-id", "0"]),
        ("not json", vec![]),
        (r#"{"keyslots":[]}"#, vec![]),
    ] {
        let mut args = vec!["token", "import", b.as_str()];
        args.extend(extra);
        let out = run_in(bin(), &args, json.as_bytes());
        assert!(!out.status.success(), "{json} was imported");
        assert!(
            std::fs::read(&b).unwrap() == before,
            "{json} changed the header"
        );
    }
    // --token-replace replaces.
    let out = run_in(
        bin(),
        &["token", "import", "--token-id", "0", "--token-replace", &b],
        br#"{"type":"x","keyslots":[]}"#,
    );
    ok(&out);
    assert_eq!(export(&b, "0"), r#"{"type":"x","keyslots":[]}"#);
    let l1 = lab.image("l1.img", "luks1");
    let out = lab.cb(&["token", "add", "--key-description", "k", &l1]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a valid LUKS2 device"));
}
