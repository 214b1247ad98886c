//! Running the binary and the real tools from the CLI's integration tests.

#![allow(dead_code)] // each test file uses a different subset

use std::path::Path;
use std::process::{Command, Output, Stdio};

pub(crate) fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_cryptblk")
}

/// Path of a system tool; fails (never skips) naming the Debian package to install.
pub(crate) fn tool(name: &str, pkg: &str) -> String {
    for d in [
        "/usr/sbin",
        "/usr/bin",
        "/sbin",
        "/bin",
        "/usr/local/bin",
        "/usr/lib/systemd",
    ] {
        let p = format!("{d}/{name}");
        if Path::new(&p).exists() {
            return p;
        }
    }
    panic!("{name} not found: install the Debian package {pkg} (scripts/setup.sh does)");
}

/// Runs `cmd` with `stdin` fed to it.
pub(crate) fn run_in(cmd: &str, args: &[&str], stdin: &[u8]) -> Output {
    run_at(None, cmd, args, stdin)
}

/// [`run_in`] with the working directory set to `cwd` (for tools that leave files behind,
/// like fio's verify state: in the test's temporary directory, never in the repository).
pub(crate) fn run_at(
    cwd: Option<&std::path::Path>,
    cmd: &str,
    args: &[&str],
    stdin: &[u8],
) -> Output {
    let mut command = Command::new(cmd);
    if let Some(d) = cwd {
        command.current_dir(d);
    }
    command.args(args);
    fed(cmd, command, stdin)
}

/// [`run_in`] with environment variables set (`Some`) or removed (`None`) first.
pub(crate) fn run_env(
    cmd: &str,
    args: &[&str],
    env: &[(&str, Option<&str>)],
    stdin: &[u8],
) -> Output {
    let mut command = Command::new(cmd);
    command.args(args);
    for (k, v) in env {
        match v {
            Some(v) => command.env(k, v),
            None => command.env_remove(k),
        };
    }
    fed(cmd, command, stdin)
}

/// Runs `command` (`cmd`, for messages) with `stdin` fed to it.
fn fed(cmd: &str, mut command: Command, stdin: &[u8]) -> Output {
    use std::io::Write;
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{cmd}: {e}"));
    // A command that fails before reading its input closes the pipe: not an error here.
    if let Err(e) = child.stdin.take().unwrap().write_all(stdin) {
        assert_eq!(e.kind(), std::io::ErrorKind::BrokenPipe, "{cmd}: {e}");
    }
    child.wait_with_output().unwrap()
}

/// Asserts success and returns stdout.
pub(crate) fn ok(o: &Output) -> String {
    assert!(
        o.status.success(),
        "failed: {}\n{}",
        String::from_utf8_lossy(&o.stderr),
        String::from_utf8_lossy(&o.stdout)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A LUKS2 image of `mib` MiB at `img`, formatted by cryptblk with the passphrase in the
/// file `key` (PBKDF2 at 1,000 iterations: fast, for tests that unlock it often).
pub(crate) fn quick_luks2(img: &str, key: &str, mib: u64) {
    quick_luks2_with(img, key, mib, &[]);
}

/// [`quick_luks2`] with more options for `format` (a cipher, `--integrity`...).
pub(crate) fn quick_luks2_with(img: &str, key: &str, mib: u64, extra: &[&str]) {
    std::fs::File::create(img)
        .unwrap()
        .set_len(mib << 20)
        .unwrap();
    let mut args = vec!["format", "-q", "--type", "luks2"];
    args.extend(["--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000"]);
    args.extend(extra);
    args.extend(["--key-file", key, img]);
    ok(&run_in(bin(), &args, b""));
}

/// A LUKS2 image for the token tests: 32 MiB, formatted by cryptsetup (PBKDF2, 1,000
/// iterations) with the passphrase in the file `pw` (keyslot 0), 1 MiB of data imported.
pub(crate) struct TokenVolume {
    pub img: String,
    pub pw: String,
    pub data: Vec<u8>,
}

impl TokenVolume {
    pub(crate) fn new(dir: &Path) -> TokenVolume {
        let p = |n: &str| dir.join(n).to_str().unwrap().to_string();
        let (img, pw) = (p("v.img"), p("pw"));
        std::fs::write(&pw, b"the recovery passphrase").unwrap();
        std::fs::File::create(&img)
            .unwrap()
            .set_len(32 << 20)
            .unwrap();
        let cs = tool("cryptsetup", "cryptsetup-bin");
        ok(&cryptsetup(
            &cs,
            &[
                "luksFormat",
                "-q",
                "--type",
                "luks2",
                "--pbkdf",
                "pbkdf2",
                "--pbkdf-force-iterations",
                "1000",
                "--key-file",
                &pw,
                &img,
            ],
        ));
        let data: Vec<u8> = (0..1usize << 20).map(|i| (i * 7 + i / 509) as u8).collect();
        std::fs::write(p("data"), &data).unwrap();
        ok(&run_in(
            bin(),
            &["import", &img, &p("data"), "--key-file", &pw],
            b"",
        ));
        TokenVolume { img, pw, data }
    }

    /// The passphrase.
    pub(crate) fn passphrase(&self) -> String {
        std::fs::read_to_string(&self.pw).unwrap()
    }
}

pub(crate) mod ceph;
pub(crate) mod nbd;

/// Whether the tests run as root (needed to create users, loop devices, mounts).
pub(crate) fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0"))
}

/// A local user other than the one running the tests, created if missing (`useradd`), for
/// tests of what another user can reach. `None` when the tests do not run as root: the
/// caller then says loudly that it did not run.
pub(crate) struct LocalUser {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
}

impl LocalUser {
    pub(crate) fn get(name: &str) -> Option<LocalUser> {
        if !is_root() {
            eprintln!(
                "NOT RUN: this test needs root to create the local user {name} and act as it \
                 (CI runs the tests as root)"
            );
            return None;
        }
        let id = |flag: &str| -> Option<u32> {
            let o = Command::new("id").args([flag, name]).output().ok()?;
            String::from_utf8_lossy(&o.stdout).trim().parse().ok()
        };
        if id("-u").is_none() {
            let o = Command::new(tool("useradd", "passwd"))
                .args([
                    "--system",
                    "--no-create-home",
                    "--shell",
                    "/usr/sbin/nologin",
                    name,
                ])
                .output()
                .unwrap();
            // Another test may have created it at the same moment.
            assert!(
                o.status.success() || id("-u").is_some(),
                "useradd {name}: {}",
                String::from_utf8_lossy(&o.stderr)
            );
        }
        Some(LocalUser {
            name: name.to_string(),
            uid: id("-u").unwrap(),
            gid: id("-g").unwrap(),
        })
    }

    /// Runs `cmd` as this user (setpriv: real and effective ids, no supplementary groups),
    /// with `env` added and XDG_RUNTIME_DIR removed.
    pub(crate) fn run(
        &self,
        env: &[(&str, &str)],
        cmd: &str,
        args: &[&str],
        stdin: &[u8],
    ) -> Output {
        use std::io::Write;
        let mut c = Command::new(tool("setpriv", "util-linux"));
        c.args([
            &format!("--reuid={}", self.uid),
            &format!("--regid={}", self.gid),
            "--clear-groups",
            "--",
            cmd,
        ])
        .args(args)
        .env_remove("XDG_RUNTIME_DIR")
        .env("HOME", "/")
        .current_dir("/");
        for (k, v) in env {
            c.env(k, v);
        }
        let mut child = c
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // A command that fails before reading its input closes the pipe: not an error here.
        if let Err(e) = child.stdin.take().unwrap().write_all(stdin) {
            assert_eq!(e.kind(), std::io::ErrorKind::BrokenPipe, "{cmd}: {e}");
        }
        child.wait_with_output().unwrap()
    }

    /// A directory of this user's (0700) inside `parent`.
    pub(crate) fn dir(&self, parent: &Path, name: &str) -> std::path::PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let d = parent.join(name);
        std::fs::create_dir(&d).unwrap();
        std::os::unix::fs::chown(&d, Some(self.uid), Some(self.gid)).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700)).unwrap();
        d
    }
}

/// A directory under /tmp that every user can traverse (0755, root's), removed on drop:
/// the tests' usual temporary directories are 0700 and other users could not reach in.
pub(crate) struct SharedDir(pub tempfile::TempDir);

impl SharedDir {
    pub(crate) fn new() -> SharedDir {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::Builder::new()
            .prefix("cryptblk-test-")
            .tempdir_in("/tmp")
            .unwrap();
        std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        SharedDir(d)
    }
    pub(crate) fn path(&self) -> &Path {
        self.0.path()
    }
}

/// cryptsetup (`cs`, its path) with `args`. Where its LUKS2 header auto-recovery refuses
/// because blkid found something besides LUKS on the image ("Device contains ambiguous
/// signatures": random key material or ciphertext can match a short magic), this says
/// loudly what blkid found and runs it again with `--disable-blkid`: that check is about
/// other signatures on the device, not about the LUKS2 metadata under test.
pub(crate) fn cryptsetup(cs: &str, args: &[&str]) -> Output {
    let out = run_in(cs, args, b"");
    if out.status.success()
        || !String::from_utf8_lossy(&out.stderr).contains("ambiguous signatures")
    {
        return out;
    }
    let img = args
        .iter()
        .rev()
        .find(|a| a.ends_with(".img"))
        .copied()
        .unwrap_or_default();
    let blkid = run_in("blkid", &["-p", "-o", "export", img], b"");
    eprintln!(
        "WARNING: cryptsetup {args:?}: ambiguous signatures; blkid -p says: {}{}; again with \
         --disable-blkid",
        String::from_utf8_lossy(&blkid.stdout),
        String::from_utf8_lossy(&blkid.stderr)
    );
    let mut again = args.to_vec();
    again.insert(1, "--disable-blkid");
    run_in(cs, &again, b"")
}

/// The volume key in `luksDump --dump-volume-key` output (the hex after "MK dump:").
pub(crate) fn dumped_volume_key(dump: &str) -> Vec<u8> {
    dump.split("MK dump:")
        .nth(1)
        .expect("a volume key dump")
        .split_whitespace()
        .map_while(|w| {
            (w.len() == 2)
                .then(|| u8::from_str_radix(w, 16).ok())
                .flatten()
        })
        .collect()
}

/// A folder of cryptsetup's own test images (`luks1-images`, `tcrypt-images`, ...), which
/// scripts/fetch-cryptsetup-images.sh takes from Debian's cryptsetup source package; fails
/// (never skips) saying so when they are missing.
pub(crate) fn cryptsetup_images(set: &str) -> std::path::PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/cryptsetup-tests");
    let dir = root.join(set);
    assert!(
        dir.is_dir(),
        "{} missing: run scripts/fetch-cryptsetup-images.sh (scripts/setup.sh does)",
        dir.display()
    );
    dir
}

/// Starts `cryptblk open ARGS... --nbd unix:SOCK` in the foreground with `stdin` as its
/// passphrase input and waits (up to 60 s) for the socket; fails with the server's output
/// if it exits first.
pub(crate) fn serve_nbd_unix(args: &[&str], sock: &Path, stdin: &[u8]) -> std::process::Child {
    use std::io::Write as _;
    let mut child = std::process::Command::new(bin())
        .args(args)
        .args(["--nbd", &format!("unix:{}", sock.display())])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(stdin).unwrap();
    let t0 = std::time::Instant::now();
    while !sock.exists() {
        if t0.elapsed().as_secs() >= 60 || child.try_wait().unwrap().is_some() {
            let _ = child.kill();
            panic!("server did not come up: {:?}", child.wait_with_output());
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    child
}

/// fio's nbd engine against `uri`: each `(rw, bs, iodepth)` writes 8 MiB per job (two jobs,
/// apart) and verifies it (`verify=crc32c`, fatal); state files go to `cwd`.
pub(crate) fn fio_verify(cwd: &Path, uri: &str, runs: &[(&str, &str, &str)]) {
    let fio = tool("fio", "fio");
    for (rw, bs, qd) in runs {
        let out = ok(&run_at(
            Some(cwd),
            &fio,
            &[
                "--name=v",
                "--ioengine=nbd",
                &format!("--uri={uri}"),
                &format!("--rw={rw}"),
                &format!("--bs={bs}"),
                &format!("--iodepth={qd}"),
                "--size=8M",
                "--offset_increment=8M",
                "--numjobs=2",
                "--verify=crc32c",
                "--do_verify=1",
                "--verify_fatal=1",
                "--output-format=json",
            ],
            b"",
        ));
        let j: serde_json::Value = serde_json::from_str(&out[out.find('{').unwrap()..]).unwrap();
        for job in j["jobs"].as_array().unwrap() {
            assert_eq!(job["error"], 0, "fio {rw} {bs} QD{qd} on {uri}");
        }
    }
}

/// A free TCP port on this machine (bound and released: another process could take it in
/// between, which would fail the test loudly, not pass it).
pub(crate) fn free_port() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port().to_string()
}

/// A CA, a server certificate for localhost/127.0.0.1 and a client certificate, made with
/// the openssl tool, in `dir` under the names libnbd expects.
pub(crate) fn make_pki(dir: &Path) {
    let openssl = tool("openssl", "openssl");
    let p = |f: &str| dir.join(f).to_str().unwrap().to_string();
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
    ];
    let mut a = vec![
        "req",
        "-x509",
        "-days",
        "2",
        "-subj",
        "/CN=cryptblk test CA",
    ];
    a.extend(ec);
    let (ca_key, ca_cert) = (p("ca-key.pem"), p("ca-cert.pem"));
    a.extend(["-keyout", &ca_key, "-out", &ca_cert]);
    a.extend([
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
    ]);
    ok(&run_in(&openssl, &a, b""));
    for (who, ext) in [
        (
            "server",
            "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
        ),
        ("client", "extendedKeyUsage=clientAuth\n"),
    ] {
        let (key, csr, cert, extf) = (
            p(&format!("{who}-key.pem")),
            p(&format!("{who}.csr")),
            p(&format!("{who}-cert.pem")),
            p(&format!("{who}.ext")),
        );
        std::fs::write(&extf, ext).unwrap();
        let subj = format!("/CN={who}");
        let mut a = vec!["req", "-subj", &subj, "-keyout", &key, "-out", &csr];
        a.extend(ec);
        ok(&run_in(&openssl, &a, b""));
        ok(&run_in(
            &openssl,
            &[
                "x509",
                "-req",
                "-days",
                "2",
                "-in",
                &csr,
                "-CA",
                &ca_cert,
                "-CAkey",
                &ca_key,
                "-CAcreateserial",
                "-extfile",
                &extf,
                "-out",
                &cert,
            ],
            b"",
        ));
    }
}

/// Whether process `pid` has exited for good: gone, or a zombie whose other threads have
/// ended too (until then they hold its files: a data file's lock, a device's claim).
pub(crate) fn has_exited(pid: i32) -> bool {
    let zombie = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            s.rsplit(')')
                .next()
                .is_some_and(|r| r.trim_start().starts_with('Z'))
        })
        .unwrap_or(true);
    zombie
        && std::fs::read_dir(format!("/proc/{pid}/task"))
            .map(|d| d.count() <= 1)
            .unwrap_or(true)
}

/// Waits (up to 10 s) for process `pid`, killed, to have exited for good.
pub(crate) fn wait_exited(pid: i32) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !has_exited(pid) {
        assert!(
            std::time::Instant::now() < deadline,
            "process {pid} is still there"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}
