//! `open --vhost-user-blk` end to end: the CLI serves a LUKS2 volume on a vhost-user
//! socket, the crate's client plays the VM (shared memory, virtqueues), and what it wrote
//! is what `cryptblk export` reads back; `status`, read-only, the socket's mode, a VM that
//! reconnects, suspend/resume and online reencryption under it, `close`; the volume on a
//! file, an NBD export and a block device (on Ceph RBD: `rbd.rs`).

use crate::common::{bin, ok, run_in, tool};
use cryptblk_vhost_user_blk::client::{Client, ClientOptions, status};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

fn run(args: &[&str]) -> std::process::Output {
    run_in(bin(), args, b"")
}

fn p(dir: &Path, f: &str) -> String {
    dir.join(f).to_str().unwrap().to_string()
}

fn format(dir: &Path) {
    std::fs::write(dir.join("pw"), b"vhost passphrase").unwrap();
    std::fs::File::create(dir.join("v.img"))
        .unwrap()
        .set_len(48 << 20)
        .unwrap();
    ok(&run(&[
        "format",
        "-q",
        "--type",
        "luks2",
        "--pbkdf",
        "pbkdf2",
        "--pbkdf-force-iterations",
        "1000",
        "--key-file",
        &p(dir, "pw"),
        &p(dir, "v.img"),
    ]));
}

fn open(dir: &Path, extra: &[&str]) -> std::process::Output {
    let (img, pw, sock, rd) = (
        p(dir, "v.img"),
        p(dir, "pw"),
        p(dir, "vub.sock"),
        p(dir, "run"),
    );
    let mut args = vec![
        "open",
        &img,
        "vm0",
        "--vhost-user-blk",
        &sock,
        "--queues",
        "2",
        "--daemon",
        "--run-dir",
        &rd,
        "--key-file",
        &pw,
    ];
    args.extend_from_slice(extra);
    run(&args)
}

fn status_text(dir: &Path) -> String {
    ok(&run(&["status", "vm0", "--run-dir", &p(dir, "run")]))
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect()
}

#[test]
fn a_vm_writes_through_vhost_user_blk_and_export_reads_the_same_plaintext() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    format(dir);
    ok(&open(dir, &[]));
    let sock = dir.join("vub.sock");
    let mode = std::fs::metadata(&sock).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the socket is the owner's only");
    let opt = ClientOptions {
        queues: 2,
        ..ClientOptions::default()
    };
    let mut c = Client::connect(&sock, opt).unwrap();
    assert_eq!(
        c.capacity().unwrap(),
        (48 << 20) - (16 << 20),
        "LUKS2 data area"
    );
    let data = pattern(1 << 20, 7);
    assert_eq!(c.write(0, 4 << 20, &data).unwrap(), status::OK);
    let mut back = vec![0u8; 1 << 20];
    assert_eq!(c.read(1, 4 << 20, &mut back).unwrap(), status::OK);
    assert!(back == data);
    let text = status_text(dir);
    assert!(text.contains("frontend: vhost-user-blk"), "{text}");
    assert!(text.contains("clients: 1"), "{text}");
    assert!(text.contains("1 writes (1048576 bytes)"), "{text}");
    // The VM goes away and comes back: served again on the same socket.
    drop(c);
    let mut c = Client::connect(&sock, opt).unwrap();
    assert_eq!(c.read(0, 4 << 20, &mut back).unwrap(), status::OK);
    assert!(back == data, "after a reconnect");
    // Suspended: the VM's read waits, and completes with the data once resumed.
    let rd = p(dir, "run");
    ok(&run(&["luksSuspend", "vm0", "--run-dir", &rd]));
    let reader = std::thread::spawn(move || {
        let mut back = vec![0u8; 1 << 20];
        let st = c.read(0, 4 << 20, &mut back).unwrap();
        (c, st, back)
    });
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert!(!reader.is_finished(), "a read is held while suspended");
    ok(&run(&[
        "luksResume",
        "vm0",
        "--run-dir",
        &rd,
        "--key-file",
        &p(dir, "pw"),
    ]));
    let (mut c, st, mut back) = reader.join().unwrap();
    assert_eq!(st, status::OK);
    assert!(back == data, "the held read, after resume");
    // Online reencryption under the served disk: the VM reads the same plaintext after.
    ok(&run(&[
        "reencrypt",
        "-q",
        &p(dir, "v.img"),
        "--key-file",
        &p(dir, "pw"),
        "--run-dir",
        &rd,
        "--pbkdf",
        "pbkdf2",
        "--pbkdf-force-iterations",
        "1000",
    ]));
    let mut again = vec![0u8; 1 << 20];
    assert_eq!(c.read(0, 4 << 20, &mut again).unwrap(), status::OK);
    assert!(again == data, "after online reencryption");
    drop(c);
    ok(&run(&["close", "vm0", "--run-dir", &p(dir, "run")]));
    assert!(!sock.exists(), "close removes the socket");
    // What the guest wrote is the volume's plaintext.
    let out = p(dir, "plain.img");
    ok(&run(&[
        "export",
        &p(dir, "v.img"),
        &out,
        "--key-file",
        &p(dir, "pw"),
    ]));
    let plain = std::fs::read(&out).unwrap();
    assert!(plain[4 << 20..5 << 20] == data[..]);

    // Read-only: the VM sees VIRTIO_BLK_F_RO and writes fail.
    ok(&open(dir, &["--readonly"]));
    let mut c = Client::connect(&sock, ClientOptions::default()).unwrap();
    assert!(c.features & (1 << 5) != 0);
    assert_eq!(c.write(0, 0, &[0u8; 4096]).unwrap(), status::IOERR);
    assert_eq!(c.read(0, 4 << 20, &mut back).unwrap(), status::OK);
    assert!(back == data);
    drop(c);
    ok(&run(&["close", "vm0", "--run-dir", &p(dir, "run")]));
}

#[test]
fn vhost_user_blk_options_are_checked_before_the_passphrase() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    format(dir);
    let o = run(&[
        "open",
        &p(dir, "v.img"),
        "x",
        "--vhost-user-blk",
        &p(dir, "s"),
        "--nbd",
        "unix:/tmp/x",
    ]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("choose one frontend"));
    let o = run(&[
        "open",
        &p(dir, "v.img"),
        "x",
        "--fuse",
        &p(dir, "m"),
        "--socket-mode",
        "660",
    ]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("--socket-mode and --socket-group need"));
    let o = run(&[
        "open",
        &p(dir, "v.img"),
        "x",
        "--vhost-user-blk",
        &p(dir, "s"),
        "--recover",
    ]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("need --ublk"));
}

/// Serves `device` (the LUKS2 volume `format` made in `dir`, reached another way) to a VM
/// over vhost-user-blk; the VM writes 1 MiB, reads it back, and goes away; `close`; then
/// `v.img` holds the VM's data, encrypted.
fn a_vm_disk_on(dir: &Path, device: &str) {
    let (sock, rd, pw) = (p(dir, "vub.sock"), p(dir, "run"), p(dir, "pw"));
    ok(&run(&[
        "open",
        device,
        "vm1",
        "--vhost-user-blk",
        &sock,
        "--queues",
        "1",
        "--daemon",
        "--run-dir",
        &rd,
        "--key-file",
        &pw,
    ]));
    let mut c = Client::connect(Path::new(&sock), ClientOptions::default()).unwrap();
    assert_eq!(c.capacity().unwrap(), (48 << 20) - (16 << 20), "{device}");
    let data = pattern(1 << 20, 3);
    assert_eq!(c.write(0, 1 << 20, &data).unwrap(), status::OK);
    let mut back = vec![0u8; 1 << 20];
    assert_eq!(c.read(0, 1 << 20, &mut back).unwrap(), status::OK);
    assert!(back == data, "{device}: read back");
    drop(c);
    ok(&run(&["close", "vm1", "--run-dir", &rd]));
    let out = p(dir, "plain.img");
    ok(&run(&["export", &p(dir, "v.img"), &out, "--key-file", &pw]));
    let plain = std::fs::read(&out).unwrap();
    assert!(
        plain[1 << 20..2 << 20] == data[..],
        "{device}: the file behind it holds the VM's data"
    );
    let raw = std::fs::read(dir.join("v.img")).unwrap();
    assert!(
        !raw.chunks_exact(4096).any(|w| *w == data[..4096]),
        "{device}: and only encrypted"
    );
}

/// The ciphertext on an NBD export (qemu-nbd serving the LUKS2 file): the VM's writes go
/// through cryptblk's NBD client.
#[test]
fn a_volume_on_an_nbd_export_is_a_vms_disk() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    format(dir);
    let remote_sock = dir.join("remote.sock");
    let mut remote = std::process::Command::new(crate::common::tool("qemu-nbd", "qemu-utils"))
        .args([
            "--format",
            "raw",
            "--persistent",
            "--shared",
            "4",
            "--socket",
        ])
        .arg(&remote_sock)
        .arg(dir.join("v.img"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let t0 = std::time::Instant::now();
    while std::os::unix::net::UnixStream::connect(&remote_sock).is_err() {
        assert!(t0.elapsed().as_secs() < 30, "qemu-nbd did not come up");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let uri = format!("nbd+unix:///?socket={}", remote_sock.display());
    a_vm_disk_on(dir, &uri);
    let _ = remote.kill();
    let _ = remote.wait();
}

/// Detaches a loop device when dropped, test failed or not.
struct LoopDevice(String);

impl Drop for LoopDevice {
    fn drop(&mut self) {
        let _ = run_in(&tool("losetup", "mount"), &["-d", &self.0], b"");
    }
}

/// The ciphertext on a block device (a loop device over the LUKS2 file; root, as CI is).
#[test]
fn a_volume_on_a_block_device_is_a_vms_disk() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    format(dir);
    let dev = ok(&run_in(
        &tool("losetup", "mount"),
        &["-f", "--show", &p(dir, "v.img")],
        b"",
    ))
    .trim()
    .to_string();
    assert!(dev.starts_with("/dev/loop"), "{dev}");
    let dev = LoopDevice(dev);
    a_vm_disk_on(dir, &dev.0);
}
