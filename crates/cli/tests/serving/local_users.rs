//! What another local user can and cannot do to a volume cryptblk serves, and how bad
//! input is refused. Each test reproduces one way in that a review found (issue 10) and
//! fails without its fix. Tests that act as another user need root to create one; without
//! it they say so loudly (NOT RUN) instead of passing silently.

use crate::common::{LocalUser, SharedDir, bin, is_root, ok, run_in, tool};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

fn cb(args: &[&str]) -> Output {
    run_in(bin(), args, b"")
}

fn mode(p: &Path) -> u32 {
    std::fs::symlink_metadata(p).unwrap().mode() & 0o7777
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The binary where every user can run it.
fn shared_bin(dir: &Path) -> String {
    let p = dir.join("cryptblk");
    if !p.exists() {
        std::fs::copy(bin(), &p).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    p.to_str().unwrap().to_string()
}

/// A LUKS2 image with a quick KDF, and its passphrase file, in `dir`.
fn luks_image(dir: &Path, size: u64) -> (String, String) {
    let (img, pw) = (dir.join("v.img"), dir.join("pw"));
    std::fs::write(&pw, b"local users passphrase").unwrap();
    std::fs::File::create(&img).unwrap().set_len(size).unwrap();
    let (img, pw) = (
        img.to_str().unwrap().to_string(),
        pw.to_str().unwrap().to_string(),
    );
    let mut args = vec!["format", "-q"];
    args.extend(QUICK_LUKS2);
    args.extend(["--key-file", &pw, &img]);
    ok(&cb(&args));
    (img, pw)
}

/// LUKS2 with a KDF that takes no time (cryptblk and cryptsetup take the same options).
const QUICK_LUKS2: [&str; 6] = [
    "--type",
    "luks2",
    "--pbkdf",
    "pbkdf2",
    "--pbkdf-force-iterations",
    "1000",
];

#[test]
fn run_dir_planted_by_another_user_is_refused() {
    let (Some(victim), Some(attacker)) = (
        LocalUser::get("cryptblk-victim"),
        LocalUser::get("cryptblk-attacker"),
    ) else {
        return;
    };
    let shared = SharedDir::new();
    let bin = shared_bin(shared.path());
    // A /tmp of our own: root's, world-writable, sticky.
    let tmp = shared.path().join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let home = victim.dir(shared.path(), "home");
    let precious = home.join("precious");
    std::fs::write(&precious, b"the victim's data").unwrap();
    std::os::unix::fs::chown(&precious, Some(victim.uid), Some(victim.gid)).unwrap();

    // The attacker plants the victim's fallback run directory, with a link where the
    // daemon's log would go.
    let planted = tmp.join(format!("cryptblk-{}", victim.uid));
    let p = planted.to_str().unwrap();
    ok(&attacker.run(&[], "/bin/mkdir", &["-m", "777", p], b""));
    ok(&attacker.run(
        &[],
        "/bin/ln",
        &["-s", precious.to_str().unwrap(), &format!("{p}/vol.log")],
        b"",
    ));

    let env = [("TMPDIR", tmp.to_str().unwrap())];
    let sock = home.join("v.sock");
    let nbd = format!("unix:{}", sock.display());
    let open = || {
        victim.run(
            &env,
            &bin,
            &["open", "mem:16M", "vol", "--nbd", &nbd, "--daemon"],
            b"",
        )
    };
    let o = open();
    assert!(!o.status.success(), "served from a planted run directory");
    assert!(
        stderr(&o).contains("refusing to use")
            && stderr(&o).contains(&planted.display().to_string()),
        "{}",
        stderr(&o)
    );
    assert_eq!(
        std::fs::read(&precious).unwrap(),
        b"the victim's data",
        "the planted link was followed"
    );
    assert!(!sock.exists());
    // Nor does close or status believe what answers there.
    for cmd in ["close", "status"] {
        let o = victim.run(&env, &bin, &[cmd, "vol"], b"");
        assert!(!o.status.success());
        assert!(
            stderr(&o).contains("refusing to use"),
            "{cmd}: {}",
            stderr(&o)
        );
    }

    // With the planted directory gone, the same command works, and makes it private.
    std::fs::remove_dir_all(&planted).unwrap();
    ok(&open());
    assert_eq!(mode(&planted), 0o700);
    assert_eq!(std::fs::metadata(&planted).unwrap().uid(), victim.uid);
    ok(&victim.run(&env, &bin, &["close", "vol"], b""));
}

#[test]
fn umask_000_still_gives_a_private_run_dir_and_sockets() {
    let shared = SharedDir::new();
    let bin = shared_bin(shared.path());
    let (run, sock) = (shared.path().join("run"), shared.path().join("v.sock"));
    let open = |extra: &str| {
        run_in(
            "/bin/sh",
            &[
                "-c",
                &format!(
                    "umask 000; exec {bin} open mem:16M vol --nbd unix:{} --run-dir {} --daemon {extra}",
                    sock.display(),
                    run.display()
                ),
            ],
            b"",
        )
    };
    ok(&open(""));
    assert_eq!(mode(&run), 0o700, "run directory");
    for f in ["vol.ctl", "vol.pid", "vol.log"] {
        assert_eq!(mode(&run.join(f)), 0o600, "{f}");
    }
    assert_eq!(mode(&sock), 0o600, "NBD socket");
    let attacker = LocalUser::get("cryptblk-attacker");
    let nbdinfo = tool("nbdinfo", "libnbd-bin");
    let uri = format!("nbd+unix:///vol?socket={}", sock.display());
    if let Some(a) = &attacker {
        let o = a.run(&[], &nbdinfo, &[&uri], b"");
        assert!(!o.status.success(), "another user read the export");
        let o = a.run(
            &[],
            &bin,
            &["close", "vol", "--run-dir", run.to_str().unwrap()],
            b"",
        );
        assert!(!o.status.success(), "another user closed the volume");
    }
    ok(&cb(&["close", "vol", "--run-dir", run.to_str().unwrap()]));

    // Shared on purpose: --socket-mode and --socket-group.
    if let Some(a) = &attacker {
        ok(&open(&format!(
            "--socket-mode 660 --socket-group {}",
            a.gid
        )));
        assert_eq!(mode(&sock), 0o660);
        assert_eq!(std::fs::metadata(&sock).unwrap().gid(), a.gid);
        // setpriv --clear-groups leaves only the primary group, which is the socket's.
        ok(&a.run(&[], &nbdinfo, &[&uri], b""));
        ok(&cb(&["close", "vol", "--run-dir", run.to_str().unwrap()]));
    }
    let bad = cb(&[
        "open",
        "mem:16M",
        "vol",
        "--nbd",
        &format!("unix:{}", sock.display()),
        "--socket-mode",
        "999",
    ]);
    assert!(
        !bad.status.success() && stderr(&bad).contains("octal"),
        "{}",
        stderr(&bad)
    );
}

#[test]
fn a_regular_file_at_the_socket_path_survives_and_a_stale_socket_is_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("notes.txt");
    std::fs::write(&target, b"not a socket").unwrap();
    let run = dir.path().join("run");
    let open = |name: &str, path: &Path| {
        cb(&[
            "open",
            "mem:16M",
            name,
            "--nbd",
            &format!("unix:{}", path.display()),
            "--run-dir",
            run.to_str().unwrap(),
            "--daemon",
        ])
    };
    let o = open("vol", &target);
    assert!(!o.status.success(), "served over a regular file");
    assert!(stderr(&o).contains("not a socket"), "{}", stderr(&o));
    assert_eq!(std::fs::read(&target).unwrap(), b"not a socket");

    // A socket nobody listens on any more (a killed server) is taken over.
    let stale = dir.path().join("stale.sock");
    drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
    assert!(stale.exists());
    ok(&open("vol", &stale));
    // A live one is not.
    let o = open("vol2", &stale);
    assert_eq!(o.status.code(), Some(5), "{}", stderr(&o));
    ok(&cb(&["close", "vol", "--run-dir", run.to_str().unwrap()]));
    assert!(!stale.exists(), "close removes its own socket");
}

#[test]
fn a_socket_path_too_long_for_a_unix_address_is_refused_before_unlocking() {
    let dir = tempfile::tempdir().unwrap();
    // 120 bytes and more: past the 107 a unix socket address holds.
    let deep = dir.path().join("d".repeat(60)).join("e".repeat(60));
    std::fs::create_dir_all(&deep).unwrap();
    let (img, _) = luks_image(dir.path(), 16 << 20);
    let short_run = dir.path().join("run");
    for (nbd, run) in [
        (deep.join("vol.sock"), short_run.clone()),
        (dir.path().join("vol.sock"), deep.join("run")),
    ] {
        // No passphrase on stdin: the refusal must come before one is asked for.
        let o = cb(&[
            "open",
            &img,
            "vol",
            "--nbd",
            &format!("unix:{}", nbd.display()),
            "--run-dir",
            run.to_str().unwrap(),
        ]);
        let err = stderr(&o);
        assert!(!o.status.success(), "served on {}", nbd.display());
        assert!(err.contains("holds at most 107 bytes"), "{err}");
        assert!(!err.contains("passphrase"), "asked before refusing: {err}");
        assert!(!nbd.exists());
    }
}

#[test]
fn a_served_device_is_refused_to_a_second_server_unless_shared() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("plain.img");
    std::fs::File::create(&img)
        .unwrap()
        .set_len(4 << 20)
        .unwrap();
    let run = dir.path().join("run");
    let open = |name: &str, offset: &str, shared: bool| {
        let mut args = vec![
            "open",
            "--type",
            "plain",
            "--hash",
            "sha256",
            "--offset",
            offset,
            "--size",
            "2048",
            img.to_str().unwrap(),
            name,
            "--nbd",
        ];
        let sock = format!("unix:{}", dir.path().join(format!("{name}.sock")).display());
        args.push(&sock);
        args.extend(["--run-dir", run.to_str().unwrap(), "--daemon"]);
        if shared {
            args.push("--shared");
        }
        run_in(bin(), &args, b"plain passphrase\n")
    };
    ok(&open("first", "0", false));
    let second = open("second", "4096", false);
    assert_eq!(second.status.code(), Some(5), "{}", stderr(&second));
    assert!(stderr(&second).contains("in use"), "{}", stderr(&second));
    // cryptsetup's --shared: another range of the same device, served beside it.
    ok(&open("second", "4096", true));
    for name in ["second", "first"] {
        ok(&cb(&["close", name, "--run-dir", run.to_str().unwrap()]));
    }
}

#[test]
fn daemon_takes_its_key_file_from_stdin() {
    let dir = tempfile::tempdir().unwrap();
    let (img, pw) = luks_image(dir.path(), 32 << 20);
    let run = dir.path().join("run");
    let sock = dir.path().join("v.sock");
    let pass = std::fs::read(&pw).unwrap();
    // Four bytes of noise first: --keyfile-offset skips them on a pipe too.
    let mut input = b"XXXX".to_vec();
    input.extend_from_slice(&pass);
    let open = |offset: &str, stdin: &[u8]| {
        run_in(
            bin(),
            &[
                "open",
                &img,
                "vol",
                "--nbd",
                &format!("unix:{}", sock.display()),
                "--run-dir",
                run.to_str().unwrap(),
                "--daemon",
                "--key-file",
                "-",
                "--keyfile-offset",
                offset,
            ],
            stdin,
        )
    };
    ok(&open("0", &pass));
    ok(&cb(&["status", "vol", "--run-dir", run.to_str().unwrap()]));
    ok(&cb(&["close", "vol", "--run-dir", run.to_str().unwrap()]));
    ok(&open("4", &input));
    ok(&cb(&["close", "vol", "--run-dir", run.to_str().unwrap()]));
    let wrong = open("0", b"wrong");
    assert_eq!(wrong.status.code(), Some(2), "{}", stderr(&wrong));
}

#[test]
fn keyfile_offset_seeks_instead_of_reading_and_is_overflow_checked() {
    let dir = tempfile::tempdir().unwrap();
    let (img, pw) = luks_image(dir.path(), 32 << 20);
    let pass = std::fs::read(&pw).unwrap();
    // The passphrase 64 GiB into a sparse key file: read, it would take minutes and more
    // memory than the machine has; seeked, it is instant.
    let far = dir.path().join("far");
    let at: u64 = 64 << 30;
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::File::create(&far).unwrap();
        f.write_all_at(&pass, at).unwrap();
    }
    let len = pass.len().to_string();
    let t = std::time::Instant::now();
    ok(&cb(&[
        "test-passphrase",
        "--key-file",
        far.to_str().unwrap(),
        "--keyfile-offset",
        &at.to_string(),
        "--keyfile-size",
        &len,
        &img,
    ]));
    eprintln!("64 GiB key file offset: {:?}", t.elapsed());
    for (offset, size) in [
        (u64::MAX.to_string(), len.clone()),
        ((u64::MAX - 3).to_string(), usize::MAX.to_string()),
    ] {
        let o = cb(&[
            "test-passphrase",
            "--key-file",
            far.to_str().unwrap(),
            "--keyfile-offset",
            &offset,
            "--keyfile-size",
            &size,
            &img,
        ]);
        assert_eq!(o.status.code(), Some(1), "{offset}/{size}: {}", stderr(&o));
        assert!(!stderr(&o).contains("panicked"), "{}", stderr(&o));
    }
}

#[test]
fn header_backup_is_owner_read_only_under_any_umask() {
    let dir = tempfile::tempdir().unwrap();
    let (img, _) = luks_image(dir.path(), 32 << 20);
    let backup = dir.path().join("hdr.bak");
    ok(&run_in(
        "/bin/sh",
        &[
            "-c",
            &format!(
                "umask 000; exec {} header-backup --header-backup-file {} {img}",
                bin(),
                backup.display()
            ),
        ],
        b"",
    ));
    assert_eq!(mode(&backup), 0o400, "cryptsetup writes it 0400");
    // Never through a link planted where the backup goes.
    let link = dir.path().join("link.bak");
    let victim = dir.path().join("victim");
    std::fs::write(&victim, b"keep").unwrap();
    std::os::unix::fs::symlink(&victim, &link).unwrap();
    let o = cb(&[
        "header-backup",
        "--header-backup-file",
        link.to_str().unwrap(),
        &img,
    ]);
    assert!(!o.status.success());
    assert_eq!(std::fs::read(&victim).unwrap(), b"keep");
}

#[test]
fn header_backup_of_a_hostile_luks1_header_fails_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let (img, pw) = (dir.path().join("l1.img"), dir.path().join("pw"));
    std::fs::write(&pw, b"pw").unwrap();
    std::fs::File::create(&img)
        .unwrap()
        .set_len(8 << 20)
        .unwrap();
    let (img, pw) = (img.to_str().unwrap(), pw.to_str().unwrap());
    ok(&cb(&[
        "format",
        "-q",
        "--type",
        "luks1",
        "--pbkdf-force-iterations",
        "1000",
        "--key-file",
        pw,
        img,
    ]));
    // Payload offset 0 (as with a detached header, which bounds nothing) and the last
    // keyslot's material near 2^31 sectors (1 TiB), on a sparse device large enough for
    // it: a backup would allocate 1 TiB.
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new().write(true).open(img).unwrap();
        f.write_all_at(&0u32.to_be_bytes(), 104).unwrap();
        f.write_all_at(&0x7fff_0000u32.to_be_bytes(), 208 + 7 * 48 + 40)
            .unwrap();
        f.set_len(3 << 40).unwrap();
    }
    let backup = dir.path().join("b");
    let o = cb(&[
        "header-backup",
        "--header-backup-file",
        backup.to_str().unwrap(),
        img,
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("refusing"), "{}", stderr(&o));
    assert!(!backup.exists());
}

#[test]
fn export_holds_the_key_in_a_process_no_one_else_can_trace() {
    let Some(user) = LocalUser::get("cryptblk-victim") else {
        return;
    };
    let shared = SharedDir::new();
    let bin = shared_bin(shared.path());
    let home = user.dir(shared.path(), "home");
    let (img, pw) = luks_image(&home, 32 << 20);
    for f in [&img, &pw] {
        std::os::unix::fs::chown(f, Some(user.uid), Some(user.gid)).unwrap();
    }
    // The export blocks on a full pipe (nobody reads it) with the key loaded.
    let mut child = Command::new(tool("setpriv", "util-linux"))
        .args([
            &format!("--reuid={}", user.uid),
            &format!("--regid={}", user.gid),
            "--clear-groups",
            "--",
            &bin,
            "export",
            "--key-file",
            &pw,
            &img,
            "-",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let proc_dir = PathBuf::from(format!("/proc/{}", child.id()));
    // Wait until it is cryptblk (setpriv has exec'd) and holds the key (stat: sleeping
    // on the pipe).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let comm = std::fs::read_to_string(proc_dir.join("comm")).unwrap_or_default();
        let wchan = std::fs::read_to_string(proc_dir.join("wchan")).unwrap_or_default();
        if comm.trim() == "cryptblk" && wchan.contains("pipe") {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "export never blocked: {comm} {wchan}"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // A non-dumpable process's /proc entries belong to root: the user's other processes
    // can neither ptrace it nor read /proc/PID/mem.
    let owner = std::fs::metadata(proc_dir.join("mem")).unwrap().uid();
    child.kill().unwrap();
    let _ = child.wait();
    assert_eq!(
        owner, 0,
        "export runs dumpable: its memory is readable by uid {}",
        user.uid
    );
}

#[test]
fn a_block_device_cryptblk_serves_is_held_exclusively() {
    if !is_root() {
        eprintln!("NOT RUN: loop devices need root (CI runs the tests as root)");
        return;
    }
    if !Path::new("/dev/loop-control").exists() {
        eprintln!(
            "NOT RUN here: no loop devices on this host; tests/vm/frontends.sh checks the same in the VM"
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (img, pw) = luks_image(dir.path(), 48 << 20);
    let losetup = tool("losetup", "mount");
    let dev = ok(&run_in(&losetup, &["-f", "--show", &img], b""))
        .trim()
        .to_string();
    struct Detach(String, String);
    impl Drop for Detach {
        fn drop(&mut self) {
            let _ = run_in(&self.1, &["-d", &self.0], b"");
        }
    }
    let _detach = Detach(dev.clone(), losetup.clone());
    let run = dir.path().join("run");
    let sock = dir.path().join("v.sock");
    let open = |name: &str| {
        cb(&[
            "open",
            &dev,
            name,
            "--nbd",
            &format!("unix:{}", sock.display()),
            "--run-dir",
            run.to_str().unwrap(),
            "--daemon",
            "--key-file",
            &pw,
        ])
    };
    ok(&open("vol"));
    let other = dir.path().join("other-pw");
    std::fs::write(&other, b"another passphrase").unwrap();
    let mut args = vec!["luksFormat", "-q"];
    args.extend(QUICK_LUKS2);
    args.extend(["--key-file", other.to_str().unwrap(), &dev]);
    let cs = run_in(&tool("cryptsetup", "cryptsetup-bin"), &args, b"");
    assert!(
        !cs.status.success(),
        "cryptsetup reformatted a device cryptblk serves"
    );
    // A second cryptblk is refused too.
    let again = cb(&[
        "open",
        &dev,
        "vol2",
        "--nbd",
        &format!("unix:{}2", sock.display()),
        "--run-dir",
        run.to_str().unwrap(),
        "--key-file",
        &pw,
    ]);
    assert_eq!(again.status.code(), Some(5), "{}", stderr(&again));
    ok(&cb(&["close", "vol", "--run-dir", run.to_str().unwrap()]));
    // And the header is still ours: the passphrase opens it.
    ok(&cb(&["test-passphrase", "--key-file", &pw, &dev]));
}
