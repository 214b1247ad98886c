//! `open --fuse` end to end: the volume as a file, under a loop device, ext4 and the real
//! tools (losetup, mkfs.ext4, mount, qemu-img's LUKS driver as an independent reader).

use crate::common::{bin, tool};
use std::path::{Path, PathBuf};
use std::process::Output;

fn run(cmd: &str, args: &[&str]) -> Output {
    crate::common::run_in(cmd, args, b"")
}

fn ok(o: Output) -> String {
    crate::common::ok(&o)
}

/// A formatted image in a temp dir; undoes mounts, loop devices and FUSE mounts on drop so
/// a failing test leaves nothing behind.
struct Vol {
    dir: tempfile::TempDir,
    loops: Vec<String>,
}

impl Vol {
    fn new(kind: &str, extra: &[&str]) -> Vol {
        let v = Vol {
            dir: tempfile::tempdir().unwrap(),
            loops: Vec::new(),
        };
        std::fs::write(v.p("pw"), b"fuse passphrase").unwrap();
        std::fs::File::create(v.p("v.img"))
            .unwrap()
            .set_len(80 << 20)
            .unwrap();
        let (pw, img) = (v.p("pw"), v.p("v.img"));
        let mut args = vec![
            "format",
            "-q",
            "--type",
            kind,
            "--pbkdf",
            "pbkdf2",
            "--pbkdf-force-iterations",
            "1000",
            "--key-file",
            &pw,
        ];
        args.extend_from_slice(extra);
        args.push(&img);
        ok(run(bin(), &args));
        v
    }
    fn p(&self, f: &str) -> String {
        self.dir.path().join(f).to_str().unwrap().to_string()
    }
    fn file(&self) -> PathBuf {
        self.dir.path().join("mnt/vol")
    }
    fn open(&self, extra: &[&str]) -> Output {
        let (img, pw, mnt, run_dir) = (self.p("v.img"), self.p("pw"), self.p("mnt"), self.p("run"));
        let mut args = vec![
            "open",
            &img,
            "vol",
            "--fuse",
            &mnt,
            "--daemon",
            "--run-dir",
            &run_dir,
            "--key-file",
            &pw,
        ];
        args.extend_from_slice(extra);
        run(bin(), &args)
    }
    fn close(&self) -> Output {
        run(bin(), &["close", "vol", "--run-dir", &self.p("run")])
    }
    fn attach_loop(&mut self) -> String {
        let file = self.file();
        let dev = ok(run(
            &tool("losetup", "mount"),
            &["-f", "--show", file.to_str().unwrap()],
        ))
        .trim()
        .to_string();
        assert!(dev.starts_with("/dev/loop"), "{dev}");
        self.loops.push(dev.clone());
        dev
    }
    /// Detaches `dev` and waits until the kernel lets go of the FUSE file: `losetup -d`
    /// returns before the device's last opener (udev's probe, say) closes it, and until
    /// then the file stays open and the mount busy.
    fn detach_loop(&mut self, dev: &str) {
        ok(run(&tool("losetup", "mount"), &["-d", dev]));
        self.loops.retain(|d| d != dev);
        let backing = format!(
            "/sys/block/{}/loop/backing_file",
            dev.trim_start_matches("/dev/")
        );
        let t = std::time::Instant::now();
        while Path::new(&backing).exists() {
            assert!(
                t.elapsed() < std::time::Duration::from_secs(10),
                "{dev} still holds the FUSE file 10 s after losetup -d"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}

impl Drop for Vol {
    fn drop(&mut self) {
        let _ = run("/bin/umount", &[&self.p("fs")]);
        for d in self.loops.clone() {
            let _ = run("/sbin/losetup", &["-d", &d]);
        }
        let _ = self.close();
        let _ = run("/bin/fusermount3", &["-u", "-z", &self.p("mnt")]);
    }
}

/// sha256 of every file under `root`, sorted by path.
fn tree_sums(root: &Path) -> String {
    let o = run(
        "/bin/sh",
        &[
            "-c",
            &format!(
                "cd '{}' && find . -type f -print0 | sort -z | xargs -0 sha256sum",
                root.display()
            ),
        ],
    );
    ok(o)
}

#[test]
fn loop_ext4_tree_survives_close_and_reopen() {
    let mut v = Vol::new("luks2", &["--sector-size", "4096"]);
    ok(v.open(&[]));
    assert_eq!(
        std::fs::metadata(v.file()).unwrap().len(),
        (80 << 20) - (16 << 20),
        "the file is the data segment (80 MiB image, 16 MiB LUKS2 header)"
    );
    let dev = v.attach_loop();
    ok(run(
        &tool("mkfs.ext4", "e2fsprogs"),
        &["-q", "-b", "4096", &dev],
    ));
    let fs = v.p("fs");
    std::fs::create_dir(&fs).unwrap();
    ok(run(&tool("mount", "mount"), &[&dev, &fs]));
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    ok(run(
        "/bin/cp",
        &["-r", src.to_str().unwrap(), &format!("{fs}/tree")],
    ));
    let before = tree_sums(Path::new(&fs));
    assert!(
        before.lines().count() > 20,
        "copied tree too small: {before}"
    );
    ok(run(&tool("umount", "mount"), &[&fs]));

    // While the loop device holds the file, close refuses (exit 5) and keeps serving.
    let busy = v.close();
    assert_eq!(
        busy.status.code(),
        Some(5),
        "{}",
        String::from_utf8_lossy(&busy.stderr)
    );
    assert!(String::from_utf8_lossy(&busy.stderr).contains("in use"));
    let st = ok(run(bin(), &["status", "vol", "--run-dir", &v.p("run")]));
    assert!(
        st.contains("frontend: fuse") && st.contains("in use"),
        "{st}"
    );
    v.detach_loop(&dev);
    ok(v.close());
    assert!(!v.file().exists(), "close unmounts");

    ok(v.open(&[]));
    let dev = v.attach_loop();
    ok(run(&tool("fsck.ext4", "e2fsprogs"), &["-fn", &dev]));
    ok(run(&tool("mount", "mount"), &[&dev, &fs]));
    assert_eq!(tree_sums(Path::new(&fs)), before);
    ok(run(&tool("umount", "mount"), &[&fs]));
    v.detach_loop(&dev);
    ok(v.close());
}

#[test]
fn unaligned_writes_land_where_qemu_luks_reads_them() {
    use std::io::{Seek, SeekFrom, Write};
    use std::os::unix::fs::FileExt;
    let v = Vol::new(
        "luks1",
        &["--cipher", "aes-xts-plain64", "--key-size", "512"],
    );
    ok(v.open(&[]));
    let size = std::fs::metadata(v.file()).unwrap().len() as usize;
    // Never-written sectors decrypt to noise: the model starts from what the file reads.
    let mut model = std::fs::read(v.file()).unwrap();
    assert_eq!(model.len(), size);
    {
        let mut f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(v.file())
            .unwrap();
        // Aligned, unaligned (read-modify-write inside one sector and across several),
        // and the very last bytes.
        let writes: [(usize, usize, u8); 5] = [
            (0, 1 << 20, 0x11),
            (777, 1000, 0x22),
            (4095, 9000, 0x33),
            (5 << 20, 3 << 20, 0x44),
            (size - 100, 100, 0x55),
        ];
        for (off, len, b) in writes {
            let data: Vec<u8> = (0..len).map(|i| b ^ (i as u8)).collect();
            f.write_all_at(&data, off as u64).unwrap();
            model[off..off + len].copy_from_slice(&data);
        }
        // Past the end: a block device's ENOSPC, not a grown file.
        f.seek(SeekFrom::Start(size as u64)).unwrap();
        let e = f.write(&[1]).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc_enospc()), "{e}");
        f.sync_all().unwrap();
        let mut back = vec![0u8; 12000];
        f.read_exact_at(&mut back, 700).unwrap();
        assert!(back == model[700..12700]);
        let st = ok(run(bin(), &["status", "vol", "--run-dir", &v.p("run")]));
        assert!(
            st.contains("clients: 1"),
            "an open handle is a client: {st}"
        );
    }
    ok(v.close());
    // qemu's LUKS driver, an independent implementation, decrypts what we wrote.
    let raw = v.p("plain.raw");
    ok(run(
        &tool("qemu-img", "qemu-utils"),
        &[
            "convert",
            "--object",
            &format!("secret,id=s0,file={}", v.p("pw")),
            "--image-opts",
            &format!("driver=luks,key-secret=s0,file.filename={}", v.p("v.img")),
            "-O",
            "raw",
            &raw,
        ],
    ));
    let got = std::fs::read(&raw).unwrap();
    assert_eq!(got.len(), model.len());
    let diff = got.iter().zip(&model).position(|(a, b)| a != b);
    assert_eq!(diff, None, "qemu reads something else at that offset");

    // Read-only: the file opens for reading only, and writes are refused.
    ok(v.open(&["--readonly"]));
    let mut back = vec![0u8; 1000];
    std::fs::File::open(v.file())
        .unwrap()
        .read_exact_at(&mut back, 777)
        .unwrap();
    assert!(back == model[777..1777]);
    assert!(
        std::fs::OpenOptions::new()
            .write(true)
            .open(v.file())
            .is_err(),
        "read-only volume opened for writing"
    );
    ok(v.close());
}

fn libc_enospc() -> i32 {
    28
}

/// Punching a hole reads back as zeros (fallocate(2)'s promise), on the file itself and
/// through a loop device, where the kernel turns discard and write-zeroes into punch-hole:
/// a hole in the ciphertext would read back as noise.
#[test]
fn punched_holes_read_back_as_zeros_through_fuse_and_a_loop_device() {
    use std::os::unix::fs::FileExt;
    let mut v = Vol::new("luks2", &["--sector-size", "4096"]);
    ok(v.open(&[]));
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(v.file())
        .unwrap();
    let data = vec![0x5au8; 4 << 20];
    f.write_all_at(&data, 0).unwrap();
    let fallocate = tool("fallocate", "util-linux");
    let file = v.file();
    ok(run(
        &fallocate,
        &["-p", "-o", "65536", "-l", "131072", file.to_str().unwrap()],
    ));
    let mut back = vec![0u8; 4 << 20];
    f.read_exact_at(&mut back, 0).unwrap();
    assert!(back[..65536].iter().all(|&b| b == 0x5a), "before the hole");
    assert!(
        back[65536..196608].iter().all(|&b| b == 0),
        "the punched range is not zeros"
    );
    assert!(back[196608..].iter().all(|&b| b == 0x5a), "after the hole");
    drop(f);

    let dev = v.attach_loop();
    let dd = |skip_mib: u32| -> Vec<u8> {
        let o = run(
            "/bin/dd",
            &[
                &format!("if={dev}"),
                "bs=1M",
                "count=1",
                &format!("skip={skip_mib}"),
                "iflag=direct",
                "status=none",
            ],
        );
        assert!(o.status.success());
        o.stdout
    };
    let blkdiscard = tool("blkdiscard", "util-linux");
    // Write-zeroes (BLKZEROOUT), then a plain discard: both must read as zeros.
    ok(run(
        &blkdiscard,
        &["-z", "-o", "1048576", "-l", "1048576", &dev],
    ));
    assert!(
        dd(1).iter().all(|&b| b == 0),
        "zeroout through the loop device"
    );
    assert!(dd(2).iter().all(|&b| b == 0x5a), "neighbour untouched");
    let discard = run(&blkdiscard, &["-o", "2097152", "-l", "1048576", &dev]);
    if discard.status.success() {
        assert!(
            dd(2).iter().all(|&b| b == 0),
            "discard through the loop device"
        );
    } else {
        eprintln!(
            "note: this kernel's loop device refused a plain discard: {}",
            String::from_utf8_lossy(&discard.stderr)
        );
    }
    assert!(dd(3).iter().all(|&b| b == 0x5a), "neighbour untouched");
    v.detach_loop(&dev);
    ok(v.close());
}

/// `--allow-other` lets other users reach the mount, not the file: its permissions (0600,
/// the server's user) are enforced by the kernel (`default_permissions`).
#[test]
fn allow_other_still_enforces_the_file_permissions() {
    let Some(other) = crate::common::LocalUser::get("cryptblk-attacker") else {
        return;
    };
    let shared = crate::common::SharedDir::new();
    let mnt = shared.path().join("mnt");
    let v = Vol::new("luks2", &[]);
    // Mounted where the other user can reach the mount point (the test's own directory
    // is 0700).
    let (img, pw, run_dir) = (v.p("v.img"), v.p("pw"), v.p("run"));
    ok(run(
        bin(),
        &[
            "open",
            &img,
            "vol",
            "--fuse",
            mnt.to_str().unwrap(),
            "--allow-other",
            "--daemon",
            "--run-dir",
            &run_dir,
            "--key-file",
            &pw,
        ],
    ));
    let file = mnt.join("vol");
    let file = file.to_str().unwrap();
    let cat = other.run(
        &[],
        "/bin/dd",
        &[&format!("if={file}"), "bs=4k", "count=1", "status=none"],
        b"",
    );
    let denied = !cat.status.success();
    let write = other.run(
        &[],
        "/bin/dd",
        &[
            "if=/dev/zero",
            &format!("of={file}"),
            "bs=4k",
            "count=1",
            "conv=notrunc",
            "status=none",
        ],
        b"",
    );
    let denied_write = !write.status.success();
    // The owner still reads it.
    let mine = run(
        "/bin/dd",
        &[&format!("if={file}"), "bs=4k", "count=1", "status=none"],
    );
    let _ = run(bin(), &["close", "vol", "--run-dir", &run_dir]);
    assert!(
        denied,
        "another user read the 0600 file: {:?}",
        cat.stdout.len()
    );
    assert!(denied_write, "another user wrote the 0600 file");
    assert!(mine.status.success() && mine.stdout.len() == 4096);
    assert!(
        String::from_utf8_lossy(&cat.stderr).contains("Permission denied"),
        "{}",
        String::from_utf8_lossy(&cat.stderr)
    );
}
