//! `cryptblk resize NAME` on a served volume (cryptsetup resize): after the image grows,
//! NBD clients that connect next (libnbd's `nbdinfo`, `nbdcopy`) and the FUSE file see the
//! new size, and data written past the old end reads back, also after a reopen; an
//! explicit smaller size shrinks it and I/O past it fails; bad requests change nothing.

use crate::common::*;
use std::process::Output;

const MIB: u64 = 1 << 20;

struct Lab {
    dir: tempfile::TempDir,
}

impl Lab {
    /// A LUKS2 volume: 16 MiB header + 24 MiB of data.
    fn new() -> Lab {
        Lab::formatted(&[])
    }
    /// [`Lab::new`] with more options for `format`.
    fn formatted(extra: &[&str]) -> Lab {
        let lab = Lab {
            dir: tempfile::tempdir().unwrap(),
        };
        std::fs::write(lab.p("pw"), b"grow me").unwrap();
        quick_luks2_with(&lab.p("v.img"), &lab.p("pw"), 40, extra);
        lab
    }
    fn p(&self, f: &str) -> String {
        self.dir.path().join(f).to_str().unwrap().to_string()
    }
    fn open(&self, frontend: &[&str]) {
        let (img, pw, run) = (self.p("v.img"), self.p("pw"), self.p("run"));
        let mut args = vec!["open", &img, "vol", "--daemon", "--run-dir", &run];
        args.extend(["--key-file", &pw]);
        args.extend(frontend);
        ok(&run_in(bin(), &args, b""));
    }
    fn close(&self) {
        ok(&run_in(
            bin(),
            &["close", "vol", "--run-dir", &self.p("run")],
            b"",
        ));
    }
    fn resize(&self, extra: &[&str]) -> Output {
        let run = self.p("run");
        let mut args = vec!["resize", "vol", "--run-dir", &run];
        args.extend(extra);
        run_in(bin(), &args, b"")
    }
    fn grow_image(&self, to: u64) {
        std::fs::OpenOptions::new()
            .write(true)
            .open(self.p("v.img"))
            .unwrap()
            .set_len(to)
            .unwrap();
    }
    fn uri(&self) -> String {
        format!("nbd+unix:///vol?socket={}", self.p("s.sock"))
    }
    fn nbd_size(&self) -> u64 {
        let out = ok(&run_in(
            &tool("nbdinfo", "libnbd-bin"),
            &["--size", &self.uri()],
            b"",
        ));
        out.trim().parse().unwrap()
    }
    /// qemu-io commands over a new NBD connection (e.g. `write -P 0x5a 20M 8M`; `read -P`
    /// checks the pattern).
    fn qemu_io(&self, cmds: &[&str]) -> Output {
        let mut args = vec!["-f", "raw"];
        for c in cmds {
            args.extend(["-c", c]);
        }
        let uri = self.uri();
        args.push(&uri);
        let out = run_in(&tool("qemu-io", "qemu-utils"), &args, b"");
        let text = String::from_utf8_lossy(&out.stdout);
        if text.contains("Pattern verification failed") {
            panic!("qemu-io: {text}");
        }
        out
    }
    fn status_size(&self) -> u64 {
        let out = ok(&run_in(
            bin(),
            &["list", "--json", "--run-dir", &self.p("run")],
            b"",
        ));
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        v[0]["size_bytes"].as_u64().unwrap()
    }
}

#[test]
fn nbd_clients_see_a_grown_volume_and_data_past_the_old_end_survives() {
    let lab = Lab::new();
    let sock = format!("unix:{}", lab.p("s.sock"));
    lab.open(&["--nbd", &sock]);
    assert_eq!(lab.nbd_size(), 24 * MIB);
    lab.grow_image(56 * MIB);
    ok(&lab.resize(&[]));
    assert_eq!(
        lab.nbd_size(),
        40 * MIB,
        "a new NBD connection sees the new size"
    );
    assert_eq!(lab.status_size(), 40 * MIB);
    // 8 MiB across the old end (20-28 MiB), written and read back over NBD by qemu-io.
    ok(&lab.qemu_io(&["write -P 0x5a 20M 8M", "read -P 0x5a 20M 8M"]));
    lab.close();
    lab.open(&["--nbd", &sock]);
    assert_eq!(
        lab.nbd_size(),
        40 * MIB,
        "the reopened volume has the new size"
    );
    ok(&lab.qemu_io(&["read -P 0x5a 20M 8M"]));
    // An explicit smaller size: I/O past it fails, before it works.
    ok(&lab.resize(&["--device-size", "16M"]));
    assert_eq!(lab.nbd_size(), 16 * MIB);
    ok(&lab.qemu_io(&["write -P 0x33 15M 1M", "read -P 0x33 15M 1M"]));
    let out = lab.qemu_io(&["read 16M 4k"]);
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() || text.contains("rror"),
        "a read past the new end worked: {text}"
    );
    // Bad requests change nothing: larger than the device, not whole sectors, both options.
    for (extra, why) in [
        (vec!["--device-size", "1G"], "larger than the device"),
        (vec!["--device-size", "1000"], "not whole sectors"),
        (vec!["--size", "8", "--device-size", "4M"], "both options"),
    ] {
        let out = lab.resize(&extra);
        assert!(!out.status.success(), "{why}: accepted");
        assert_eq!(lab.status_size(), 16 * MIB, "{why}: the size changed");
    }
    ok(&lab.resize(&["--size", &(32 * MIB / 512).to_string()]));
    assert_eq!(lab.nbd_size(), 32 * MIB);
    lab.close();
}

#[test]
fn the_fuse_file_takes_the_new_size() {
    let lab = Lab::new();
    let mnt = lab.p("mnt");
    std::fs::create_dir(&mnt).unwrap();
    lab.open(&["--fuse", &mnt]);
    let file = lab.dir.path().join("mnt/vol");
    assert_eq!(std::fs::metadata(&file).unwrap().len(), 24 * MIB);
    lab.grow_image(48 * MIB);
    ok(&lab.resize(&[]));
    // The kernel keeps the file's attributes for one second.
    std::thread::sleep(std::time::Duration::from_millis(1100));
    assert_eq!(std::fs::metadata(&file).unwrap().len(), 32 * MIB);
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&file)
        .unwrap();
    let block = vec![0x5au8; 4096];
    f.write_all_at(&block, 30 * MIB).unwrap();
    f.sync_all().unwrap();
    let mut back = vec![0u8; 4096];
    f.read_exact_at(&mut back, 30 * MIB).unwrap();
    assert!(back == block);
    drop(f);
    lab.close();
}

/// LUKS2 with integrity (cryptsetup refuses to resize it): after the image grows, resize
/// grows the dm-integrity device (the new sectors sealed as zeros: they read as zeros over
/// NBD, not EIO), data written across the old end reads back after a reopen at the new
/// size, and no sector failed verification.
#[test]
fn a_volume_with_integrity_grows_and_its_new_sectors_verify() {
    let lab = Lab::formatted(&["--integrity", "aead", "--cipher", "aes-gcm-random"]);
    let sock = format!("unix:{}", lab.p("s.sock"));
    lab.open(&["--nbd", &sock]);
    let old = lab.nbd_size();
    assert!(
        old > 20 * MIB && old < 24 * MIB,
        "the tags take room: {old}"
    );
    lab.grow_image(56 * MIB);
    ok(&lab.resize(&[]));
    let new = lab.nbd_size();
    assert!(new > old + 15 * MIB, "grew from {old} to {new}");
    assert_eq!(lab.status_size(), new);
    let (o, n) = (old.to_string(), (new - old).to_string());
    ok(&lab.qemu_io(&[&format!("read -P 0 {o} {n}")]));
    let at = (old - MIB).to_string();
    ok(&lab.qemu_io(&[
        &format!("write -P 0x5a {at} 4M"),
        &format!("read -P 0x5a {at} 4M"),
    ]));
    lab.close();
    lab.open(&["--nbd", &sock]);
    assert_eq!(lab.nbd_size(), new, "the reopened volume has the new size");
    ok(&lab.qemu_io(&[&format!("read -P 0x5a {at} 4M")]));
    let out = ok(&run_in(
        bin(),
        &["status", "vol", "--run-dir", &lab.p("run")],
        b"",
    ));
    assert!(
        out.contains("integrity: 0 sectors failed verification"),
        "{out}"
    );
    lab.close();
}
