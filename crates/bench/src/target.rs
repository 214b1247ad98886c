//! Host targets: NBD servers on a unix socket in the work directory (tmpfs by default),
//! driven by fio's nbd engine.

use cryptblk_device::{BlockDevice, RawDevice};
use cryptblk_nbd::{NbdServer, ShutdownHandle};
use cryptblk_volume::FileStorage;
use std::io;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// PBKDF2 iterations for the benchmark images (unlock cost is not what is measured).
const BENCH_ITERATIONS: &str = "1000";
/// Room for a LUKS header in front of the data area of `size` bytes.
const HEADER_ROOM: u64 = 16 << 20;

/// One `--cipher` entry: `SPEC[:KEY_BITS[:SECTOR_SIZE]]`, e.g. `aes-xts-plain64:512:4096`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CipherChoice {
    /// The cipher in dm-crypt notation, e.g. `aes-xts-plain64` or `aes-cbc-essiv:sha256`.
    pub spec: String,
    /// Key size in bits (default 512 for XTS, else 256).
    pub key_bits: usize,
    /// Encryption sector size in bytes: 512, 1024, 2048 or 4096 (default 4096).
    pub sector: u32,
}

impl std::str::FromStr for CipherChoice {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        // The spec itself may contain ':' (aes-cbc-essiv:sha256): numbers come last.
        let mut parts: Vec<&str> = s.split(':').collect();
        let mut nums = Vec::new();
        while nums.len() < 2
            && parts.len() > 1
            && parts
                .last()
                .is_some_and(|p| p.chars().all(|c| c.is_ascii_digit()))
        {
            nums.insert(0, parts.pop().unwrap_or_default());
        }
        let spec = parts.join(":");
        if spec.is_empty()
            || !spec
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_:".contains(c))
            || spec.split(':').any(|p| p.is_empty())
            // Only an IV generator takes a ':' argument (aes-cbc-essiv:sha256).
            || (spec.contains(':') && !spec.split(':').next().is_some_and(|c| c.ends_with("essiv")))
        {
            return Err(format!(
                "bad cipher '{s}': SPEC[:KEY_BITS[:SECTOR_SIZE]], e.g. aes-xts-plain64:512:4096"
            ));
        }
        let default_bits = if spec.contains("xts") { 512 } else { 256 };
        let key_bits = match nums.first() {
            Some(k) => k
                .parse()
                .map_err(|_| format!("bad key size '{k}' in '{s}' (bits, e.g. 512)"))?,
            None => default_bits,
        };
        let sector = match nums.get(1) {
            Some(k) => k
                .parse()
                .ok()
                .filter(|n: &u32| [512, 1024, 2048, 4096].contains(n))
                .ok_or_else(|| format!("bad sector size '{k}' in '{s}' (512, 1024, 2048, 4096)"))?,
            None => 4096,
        };
        Ok(CipherChoice {
            spec,
            key_bits,
            sector,
        })
    }
}

impl std::fmt::Display for CipherChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}:{}", self.spec, self.key_bits, self.sector)
    }
}

/// What a host target runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum HostKind {
    /// cryptblk's NBD server exporting the raw image: no volume layer, no crypto.
    Plain,
    /// `cryptblk open --type plain --cipher cipher_null` on the raw image.
    CryptblkNull,
    /// `cryptblk open` on a LUKS2 image.
    Cryptblk(CipherChoice),
    /// nbdkit's file plugin on the raw image.
    NbdkitRaw,
    /// nbdkit's luks filter on a LUKS1 image.
    NbdkitLuks,
    /// qemu-nbd on the raw image.
    QemuNbdRaw,
    /// qemu-nbd's LUKS driver on a LUKS1 image.
    QemuNbdLuks,
}

/// One NBD server measured on this machine.
#[derive(Clone, Debug)]
pub(crate) struct HostTarget {
    /// Unique and file-name safe, e.g. `cryptblk-aes-xts-plain64-512-4096`.
    pub(crate) id: String,
    /// Its name in tables and charts.
    pub(crate) label: String,
    /// What it runs.
    pub(crate) kind: HostKind,
    /// Whether data is encrypted (cipher_null counts as not).
    pub(crate) encrypted: bool,
    /// The id of the no-crypto target it is compared with ("% of plain").
    pub(crate) baseline: Option<String>,
}

/// Every host target, in report order.
pub(crate) fn host_targets(ciphers: &[CipherChoice]) -> Vec<HostTarget> {
    let t = |id: &str, label: &str, kind, encrypted, baseline: Option<&str>| HostTarget {
        id: id.into(),
        label: label.into(),
        kind,
        encrypted,
        baseline: baseline.map(str::to_string),
    };
    let mut v = vec![
        t(
            "plain",
            "cryptblk NBD, no crypto (plain)",
            HostKind::Plain,
            false,
            None,
        ),
        t(
            "cryptblk-null",
            "cryptblk cipher_null",
            HostKind::CryptblkNull,
            false,
            Some("plain"),
        ),
    ];
    for c in ciphers {
        v.push(HostTarget {
            id: format!(
                "cryptblk-{}-{}-{}",
                c.spec.replace(':', "_"),
                c.key_bits,
                c.sector
            ),
            label: format!("cryptblk {} {}b {}B sectors", c.spec, c.key_bits, c.sector),
            kind: HostKind::Cryptblk(c.clone()),
            encrypted: true,
            baseline: Some("plain".into()),
        });
    }
    v.push(t(
        "nbdkit-raw",
        "nbdkit file (raw)",
        HostKind::NbdkitRaw,
        false,
        None,
    ));
    v.push(t(
        "nbdkit-luks",
        "nbdkit luks filter (LUKS1)",
        HostKind::NbdkitLuks,
        true,
        Some("nbdkit-raw"),
    ));
    v.push(t(
        "qemu-nbd-raw",
        "qemu-nbd raw",
        HostKind::QemuNbdRaw,
        false,
        None,
    ));
    v.push(t(
        "qemu-nbd-luks",
        "qemu-nbd LUKS driver (LUKS1)",
        HostKind::QemuNbdLuks,
        true,
        Some("qemu-nbd-raw"),
    ));
    v
}

/// Finds an executable in `$PATH`.
pub(crate) fn which(name: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| {
            std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

/// What the host targets need from the caller.
#[derive(Clone, Debug)]
pub(crate) struct HostEnv {
    /// The cryptblk binary (the running one).
    pub(crate) cryptblk: PathBuf,
    /// Images, sockets and run dirs go here (tmpfs by default).
    pub(crate) work: PathBuf,
    /// Server logs.
    pub(crate) logs: PathBuf,
    /// Data bytes per image.
    pub(crate) size: u64,
}

impl HostTarget {
    /// Why this target cannot run here, if it cannot.
    pub(crate) fn missing_tool(&self) -> Option<String> {
        let need = match self.kind {
            HostKind::NbdkitRaw | HostKind::NbdkitLuks => ("nbdkit", "nbdkit"),
            HostKind::QemuNbdRaw | HostKind::QemuNbdLuks => ("qemu-nbd", "qemu-utils"),
            _ => return None,
        };
        if which(need.0).is_none() {
            return Some(format!(
                "{} not found in PATH (apt-get install {})",
                need.0, need.1
            ));
        }
        if self.kind == HostKind::NbdkitLuks {
            let ok = Command::new("nbdkit")
                .args(["--filter=luks", "null", "--dump-plugin"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if !ok {
                return Some(
                    "nbdkit has no luks filter (needs nbdkit >= 1.32 with nbdkit-luks-filter)"
                        .into(),
                );
            }
        }
        None
    }

    /// Creates the image, starts the server and waits until it accepts connections.
    /// `setup` receives the command lines used.
    pub(crate) fn start(&self, env: &HostEnv, setup: &mut Vec<String>) -> Result<Running, String> {
        let files = TargetFiles::create(&env.work, &self.id)?;
        let log = env.logs.join(format!("{}.log", self.id));
        let cryptblk = env.cryptblk.to_string_lossy().into_owned();
        let luks_size = env.size + HEADER_ROOM;
        let server = match &self.kind {
            HostKind::Plain => return start_in_process(files, env.size, &log, setup),
            HostKind::CryptblkNull => {
                fill_image(&files.img, env.size)?;
                cryptblk_null_server(&cryptblk, &files)
            }
            HostKind::Cryptblk(c) => {
                fill_image(&files.img, luks_size)?;
                run_tool(&luks2_format_command(&cryptblk, c, &files), setup)?;
                cryptblk_luks2_server(&cryptblk, &files)
            }
            HostKind::NbdkitRaw => {
                fill_image(&files.img, env.size)?;
                ServerCommand::killed(nbdkit_command(&files, false))
            }
            HostKind::QemuNbdRaw => {
                fill_image(&files.img, env.size)?;
                ServerCommand::killed(qemu_nbd(
                    &files.sock,
                    vec!["-f".into(), "raw".into(), arg(&files.img)],
                ))
            }
            HostKind::NbdkitLuks => {
                fill_image(&files.img, luks_size)?;
                run_tool(&luks1_format_command(&cryptblk, &files), setup)?;
                ServerCommand::killed(nbdkit_command(&files, true))
            }
            HostKind::QemuNbdLuks => {
                fill_image(&files.img, luks_size)?;
                run_tool(&luks1_format_command(&cryptblk, &files), setup)?;
                ServerCommand::killed(qemu_nbd_luks_command(&files))
            }
        };
        spawn_server(server, files, &log, setup)
    }
}

/// A target's files, all in its own directory under the work directory (removed again by
/// [`Running::stop`]).
struct TargetFiles {
    /// `work/id`.
    dir: PathBuf,
    /// The server's unix socket.
    sock: PathBuf,
    /// The passphrase (key file) of the encrypted targets.
    passphrase: PathBuf,
    /// The disk image.
    img: PathBuf,
    /// cryptblk's `--run-dir`.
    run_dir: PathBuf,
}

impl TargetFiles {
    /// Makes a fresh `work/id` with the passphrase file in it.
    fn create(work: &Path, id: &str) -> Result<Self, String> {
        let dir = work.join(id);
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let passphrase = dir.join("passphrase");
        std::fs::write(&passphrase, "bench-passphrase")
            .map_err(|e| format!("{}: {e}", passphrase.display()))?;
        Ok(TargetFiles {
            sock: dir.join("nbd.sock"),
            img: dir.join("disk.img"),
            run_dir: dir.join("run"),
            passphrase,
            dir,
        })
    }

    /// A started target serving from these files; the server is still to be attached.
    fn running(self) -> Running {
        Running {
            uri: format!("nbd+unix:///?socket={}", self.sock.display()),
            child: None,
            plain: None,
            close: None,
            dir: self.dir,
        }
    }
}

/// A path as a command-line argument.
fn arg(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

/// An external server: its command line, and the command that stops it cleanly (without
/// one, the server is killed).
struct ServerCommand {
    /// The server's command line.
    start: Vec<String>,
    /// `cryptblk close ...` for cryptblk's servers.
    close: Option<Vec<String>>,
}

impl ServerCommand {
    /// A server that is stopped by killing it.
    fn killed(start: Vec<String>) -> Self {
        ServerCommand { start, close: None }
    }
}

/// cryptblk's own NBD server in this process, on the raw image (the `plain` baseline).
fn start_in_process(
    files: TargetFiles,
    size: u64,
    log: &Path,
    setup: &mut Vec<String>,
) -> Result<Running, String> {
    fill_image(&files.img, size)?;
    setup.push(format!(
        "in-process: cryptblk_nbd::NbdServer (4 threads per connection) exporting {} through cryptblk_volume::FileStorage, no volume layer",
        files.img.display()
    ));
    let plain = serve_plain(&files.img, &files.sock)?;
    let sock = files.sock.clone();
    let mut running = files.running();
    running.plain = Some(plain);
    wait_socket(&sock, None, log)?;
    Ok(running)
}

/// `cryptblk open IMG NAME OPTIONS... --key-file ... --nbd unix:SOCK --run-dir ...`.
fn cryptblk_open_command(
    cryptblk: &str,
    name: &str,
    options: &[&str],
    f: &TargetFiles,
) -> Vec<String> {
    let mut cmd = vec![
        cryptblk.to_string(),
        "open".into(),
        arg(&f.img),
        name.into(),
    ];
    cmd.extend(options.iter().map(|o| o.to_string()));
    cmd.extend([
        "--key-file".into(),
        arg(&f.passphrase),
        "--nbd".into(),
        format!("unix:{}", f.sock.display()),
        "--run-dir".into(),
        arg(&f.run_dir),
    ]);
    cmd
}

/// `cryptblk close NAME --run-dir ...`: stops a server `cryptblk open` started.
fn cryptblk_close_command(cryptblk: &str, name: &str, f: &TargetFiles) -> Vec<String> {
    vec![
        cryptblk.to_string(),
        "close".into(),
        name.into(),
        "--run-dir".into(),
        arg(&f.run_dir),
    ]
}

/// `cryptblk open --type plain --cipher cipher_null` on the raw image.
fn cryptblk_null_server(cryptblk: &str, f: &TargetFiles) -> ServerCommand {
    let options = [
        "--type",
        "plain",
        "--cipher",
        "cipher_null",
        "--key-size",
        "8",
        "--sector-size",
        "4096",
    ];
    ServerCommand {
        start: cryptblk_open_command(cryptblk, "bench-null", &options, f),
        close: Some(cryptblk_close_command(cryptblk, "bench-null", f)),
    }
}

/// `cryptblk open` on the LUKS2 image.
fn cryptblk_luks2_server(cryptblk: &str, f: &TargetFiles) -> ServerCommand {
    ServerCommand {
        start: cryptblk_open_command(cryptblk, "bench", &[], f),
        close: Some(cryptblk_close_command(cryptblk, "bench", f)),
    }
}

/// `cryptblk format -q IMG OPTIONS...` with the cheap benchmark PBKDF and the passphrase.
fn format_command(cryptblk: &str, options: Vec<String>, f: &TargetFiles) -> Vec<String> {
    let mut cmd = vec![
        cryptblk.to_string(),
        "format".into(),
        "-q".into(),
        arg(&f.img),
    ];
    cmd.extend(options);
    cmd.extend([
        "--pbkdf-force-iterations".into(),
        BENCH_ITERATIONS.into(),
        "--key-file".into(),
        arg(&f.passphrase),
    ]);
    cmd
}

/// Formats the image as LUKS2 with cipher `c` (for cryptblk's own targets).
fn luks2_format_command(cryptblk: &str, c: &CipherChoice, f: &TargetFiles) -> Vec<String> {
    let options = vec![
        "--type".into(),
        "luks2".into(),
        "--cipher".into(),
        c.spec.clone(),
        "--key-size".into(),
        c.key_bits.to_string(),
        "--sector-size".into(),
        c.sector.to_string(),
        "--pbkdf".into(),
        "pbkdf2".into(),
    ];
    format_command(cryptblk, options, f)
}

/// Formats the image as LUKS1 aes-xts-plain64 (what nbdkit's and qemu-nbd's LUKS
/// support reads).
fn luks1_format_command(cryptblk: &str, f: &TargetFiles) -> Vec<String> {
    let options = [
        "--type",
        "luks1",
        "--cipher",
        "aes-xts-plain64",
        "--key-size",
        "512",
    ];
    format_command(cryptblk, Vec::from(options.map(String::from)), f)
}

/// nbdkit's file plugin on the image, through its luks filter if `luks`.
fn nbdkit_command(f: &TargetFiles, luks: bool) -> Vec<String> {
    let mut cmd: Vec<String> = vec!["nbdkit".into(), "-f".into(), "-U".into(), arg(&f.sock)];
    if luks {
        cmd.push("--filter=luks".into());
    }
    cmd.extend(["file".into(), arg(&f.img)]);
    if luks {
        cmd.push(format!("passphrase=+{}", f.passphrase.display()));
    }
    cmd
}

/// qemu-nbd with its LUKS driver on the image.
fn qemu_nbd_luks_command(f: &TargetFiles) -> Vec<String> {
    qemu_nbd(
        &f.sock,
        vec![
            "--object".into(),
            format!("secret,id=s0,file={}", f.passphrase.display()),
            "--image-opts".into(),
            format!(
                "driver=luks,key-secret=s0,file.filename={}",
                f.img.display()
            ),
        ],
    )
}

/// Starts an external server (its stderr goes to `log`) and waits until it listens.
fn spawn_server(
    server: ServerCommand,
    files: TargetFiles,
    log: &Path,
    setup: &mut Vec<String>,
) -> Result<Running, String> {
    let cmd = &server.start;
    setup.push(crate::fio::command_line(&cmd[0], &cmd[1..]));
    let logf = std::fs::File::create(log).map_err(|e| format!("{}: {e}", log.display()))?;
    let child = Command::new(&cmd[0])
        .args(&cmd[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(logf)
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", cmd[0]))?;
    let sock = files.sock.clone();
    let mut running = files.running();
    running.child = Some(child);
    running.close = server.close;
    if let Err(e) = wait_socket(&sock, running.child.as_mut(), log) {
        running.stop();
        return Err(e);
    }
    Ok(running)
}

/// qemu-nbd serving on `sock`, with `tail` naming the image.
fn qemu_nbd(sock: &Path, tail: Vec<String>) -> Vec<String> {
    let mut v: Vec<String> = vec![
        "qemu-nbd".into(),
        "-k".into(),
        sock.to_string_lossy().into_owned(),
        "-t".into(),
        // One connection per fio job: qemu-nbd serves one client at a time by default.
        "--shared=64".into(),
        "--cache=writeback".into(),
        "--aio=threads".into(),
    ];
    v.extend(tail);
    v
}

/// Runs a setup tool (formatting an image) to completion; its command line goes to `setup`.
fn run_tool(cmd: &[String], setup: &mut Vec<String>) -> Result<(), String> {
    setup.push(crate::fio::command_line(&cmd[0], &cmd[1..]));
    let out = Command::new(&cmd[0])
        .args(&cmd[1..])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {}: {e}", cmd[0]))?;
    if !out.status.success() {
        return Err(format!(
            "{} failed: {}",
            crate::fio::command_line(&cmd[0], &cmd[1..]),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(())
}

/// Writes the whole image so every tmpfs page exists (reads of holes would be free).
fn fill_image(path: &Path, size: u64) -> Result<(), String> {
    use std::io::Write;
    let err = |e: io::Error| format!("{}: {e}", path.display());
    let mut f = std::fs::File::create(path).map_err(err)?;
    let chunk = vec![0u8; 1 << 20];
    let mut left = size;
    while left > 0 {
        let n = left.min(chunk.len() as u64) as usize;
        f.write_all(&chunk[..n]).map_err(err)?;
        left -= n as u64;
    }
    f.sync_all().map_err(err)
}

/// Waits up to 20 s until something listens on `sock`; fails early if `child` (the server)
/// exits, with its log.
fn wait_socket(sock: &Path, mut child: Option<&mut Child>, log: &Path) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if UnixStream::connect(sock).is_ok() {
            return Ok(());
        }
        if let Some(c) = child.as_deref_mut()
            && let Ok(Some(st)) = c.try_wait()
        {
            let msg = std::fs::read_to_string(log).unwrap_or_default();
            return Err(format!("server exited ({st}): {}", msg.trim()));
        }
        if Instant::now() > deadline {
            return Err(format!(
                "server did not listen on {} within 20 s",
                sock.display()
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A started target.
pub(crate) struct Running {
    /// Where fio connects: `nbd+unix:///?socket=...`.
    pub(crate) uri: String,
    /// An external server.
    child: Option<Child>,
    /// The in-process server of the `plain` target.
    plain: Option<PlainServer>,
    /// The command that stops `child` cleanly (else it is killed).
    close: Option<Vec<String>>,
    /// The target's directory in the work directory.
    dir: PathBuf,
}

impl Running {
    /// Stops the server and removes the image.
    pub(crate) fn stop(mut self) {
        if let Some((h, t)) = self.plain.take() {
            h.shutdown();
            let _ = t.join();
        }
        if let Some(mut child) = self.child.take() {
            let mut closed = false;
            if let Some(c) = &self.close {
                closed = Command::new(&c[0])
                    .args(&c[1..])
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status()
                    .is_ok_and(|s| s.success());
            }
            if !closed {
                let _ = child.kill();
            }
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// An in-process NBD server: how to stop it, and the thread serving.
type PlainServer = (ShutdownHandle, std::thread::JoinHandle<io::Result<()>>);

/// Serves the raw image on `sock` from a thread of this process.
fn serve_plain(img: &Path, sock: &Path) -> Result<PlainServer, String> {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(img)
        .map_err(|e| format!("{}: {e}", img.display()))?;
    // The raw image through the same storage code the volume uses, without the volume
    // (no sector transform, no crypto).
    let dev = FileStorage::new(f)
        .and_then(|s| RawDevice::with_storage(s, 512))
        .map_err(|e| format!("{}: {e}", img.display()))?;
    let server = NbdServer::builder()
        .export("plain", Arc::new(dev) as Arc<dyn BlockDevice>)
        .threads_per_connection(4)
        .build()
        .map_err(|e| format!("NBD server: {e}"))?;
    let h = server.shutdown_handle();
    let sock = sock.to_path_buf();
    let t = std::thread::spawn(move || server.serve_unix(&sock));
    Ok((h, t))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cipher_choice_parses() {
        let c: CipherChoice = "aes-xts-plain64:256:512".parse().unwrap();
        assert_eq!(
            (c.spec.as_str(), c.key_bits, c.sector),
            ("aes-xts-plain64", 256, 512)
        );
        let d: CipherChoice = "aes-xts-plain64".parse().unwrap();
        assert_eq!((d.key_bits, d.sector), (512, 4096));
        let e: CipherChoice = "aes-cbc-essiv".parse().unwrap();
        assert_eq!(e.key_bits, 256);
        assert!("aes-xts-plain64:512:1000".parse::<CipherChoice>().is_err());
        assert!("aes-xts-plain64:x".parse::<CipherChoice>().is_err());
        let f: CipherChoice = "aes-cbc-essiv:sha256:256:512".parse().unwrap();
        assert_eq!(
            (f.spec.as_str(), f.key_bits, f.sector),
            ("aes-cbc-essiv:sha256", 256, 512)
        );
        assert!("".parse::<CipherChoice>().is_err());
        assert_eq!(c.to_string(), "aes-xts-plain64:256:512");
    }

    #[test]
    fn every_encrypted_target_has_a_baseline() {
        let ts = host_targets(&["aes-xts-plain64".parse().unwrap()]);
        for t in &ts {
            if t.encrypted {
                let b = t.baseline.as_deref().expect("baseline");
                assert!(ts.iter().any(|x| x.id == b && !x.encrypted), "{}", t.id);
            }
        }
        assert!(
            ts.iter()
                .any(|t| t.id == "cryptblk-aes-xts-plain64-512-4096")
        );
    }
}
