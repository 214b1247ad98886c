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
    pub spec: String,
    pub key_bits: usize,
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

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HostKind {
    /// cryptblk's NBD server exporting the raw image: no volume layer, no crypto.
    Plain,
    /// `cryptblk open --type plain --cipher cipher_null` on the raw image.
    CryptblkNull,
    /// `cryptblk open` on a LUKS2 image.
    Cryptblk(CipherChoice),
    NbdkitRaw,
    NbdkitLuks,
    QemuNbdRaw,
    QemuNbdLuks,
}

#[derive(Clone, Debug)]
pub struct HostTarget {
    pub id: String,
    pub label: String,
    pub kind: HostKind,
    pub encrypted: bool,
    pub baseline: Option<String>,
}

/// Every host target, in report order.
pub fn host_targets(ciphers: &[CipherChoice]) -> Vec<HostTarget> {
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
pub fn which(name: &str) -> Option<PathBuf> {
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
pub struct HostEnv {
    /// The cryptblk binary (the running one).
    pub cryptblk: PathBuf,
    /// Images, sockets and run dirs go here (tmpfs by default).
    pub work: PathBuf,
    /// Server logs.
    pub logs: PathBuf,
    /// Data bytes per image.
    pub size: u64,
}

impl HostTarget {
    /// Why this target cannot run here, if it cannot.
    pub fn missing_tool(&self) -> Option<String> {
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
    pub fn start(&self, env: &HostEnv, setup: &mut Vec<String>) -> Result<Running, String> {
        let dir = env.work.join(&self.id);
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let sock = dir.join("nbd.sock");
        let pw = dir.join("passphrase");
        std::fs::write(&pw, "bench-passphrase").map_err(|e| format!("{}: {e}", pw.display()))?;
        let img = dir.join("disk.img");
        let luks_size = env.size + HEADER_ROOM;
        let cryptblk = env.cryptblk.to_string_lossy().into_owned();
        let s = |p: &Path| p.to_string_lossy().into_owned();
        let run_dir = dir.join("run");
        let mut running = Running {
            uri: format!("nbd+unix:///?socket={}", sock.display()),
            child: None,
            plain: None,
            close: None,
            dir: dir.clone(),
        };
        let log = env.logs.join(format!("{}.log", self.id));
        let cmd: Vec<String> = match &self.kind {
            HostKind::Plain => {
                fill_image(&img, env.size)?;
                setup.push(format!(
                    "in-process: cryptblk_nbd::NbdServer (4 threads per connection) exporting {} through cryptblk_volume::FileStorage, no volume layer",
                    img.display()
                ));
                running.plain = Some(serve_plain(&img, &sock)?);
                wait_socket(&sock, None, &log)?;
                return Ok(running);
            }
            HostKind::CryptblkNull => {
                fill_image(&img, env.size)?;
                let c = vec![
                    cryptblk.clone(),
                    "open".into(),
                    s(&img),
                    "bench-null".into(),
                    "--type".into(),
                    "plain".into(),
                    "--cipher".into(),
                    "cipher_null".into(),
                    "--key-size".into(),
                    "8".into(),
                    "--sector-size".into(),
                    "4096".into(),
                    "--key-file".into(),
                    s(&pw),
                    "--nbd".into(),
                    format!("unix:{}", sock.display()),
                    "--run-dir".into(),
                    s(&run_dir),
                ];
                running.close = Some(vec![
                    cryptblk.clone(),
                    "close".into(),
                    "bench-null".into(),
                    "--run-dir".into(),
                    s(&run_dir),
                ]);
                c
            }
            HostKind::Cryptblk(c) => {
                fill_image(&img, luks_size)?;
                let fmt = vec![
                    cryptblk.clone(),
                    "format".into(),
                    "-q".into(),
                    s(&img),
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
                    "--pbkdf-force-iterations".into(),
                    BENCH_ITERATIONS.into(),
                    "--key-file".into(),
                    s(&pw),
                ];
                run_tool(&fmt, setup)?;
                running.close = Some(vec![
                    cryptblk.clone(),
                    "close".into(),
                    "bench".into(),
                    "--run-dir".into(),
                    s(&run_dir),
                ]);
                vec![
                    cryptblk.clone(),
                    "open".into(),
                    s(&img),
                    "bench".into(),
                    "--key-file".into(),
                    s(&pw),
                    "--nbd".into(),
                    format!("unix:{}", sock.display()),
                    "--run-dir".into(),
                    s(&run_dir),
                ]
            }
            HostKind::NbdkitRaw | HostKind::QemuNbdRaw => {
                fill_image(&img, env.size)?;
                if self.kind == HostKind::NbdkitRaw {
                    vec![
                        "nbdkit".into(),
                        "-f".into(),
                        "-U".into(),
                        s(&sock),
                        "file".into(),
                        s(&img),
                    ]
                } else {
                    qemu_nbd(&sock, vec!["-f".into(), "raw".into(), s(&img)])
                }
            }
            HostKind::NbdkitLuks | HostKind::QemuNbdLuks => {
                fill_image(&img, luks_size)?;
                let fmt = vec![
                    cryptblk.clone(),
                    "format".into(),
                    "-q".into(),
                    s(&img),
                    "--type".into(),
                    "luks1".into(),
                    "--cipher".into(),
                    "aes-xts-plain64".into(),
                    "--key-size".into(),
                    "512".into(),
                    "--pbkdf-force-iterations".into(),
                    BENCH_ITERATIONS.into(),
                    "--key-file".into(),
                    s(&pw),
                ];
                run_tool(&fmt, setup)?;
                if self.kind == HostKind::NbdkitLuks {
                    vec![
                        "nbdkit".into(),
                        "-f".into(),
                        "-U".into(),
                        s(&sock),
                        "--filter=luks".into(),
                        "file".into(),
                        s(&img),
                        format!("passphrase=+{}", pw.display()),
                    ]
                } else {
                    qemu_nbd(
                        &sock,
                        vec![
                            "--object".into(),
                            format!("secret,id=s0,file={}", pw.display()),
                            "--image-opts".into(),
                            format!("driver=luks,key-secret=s0,file.filename={}", img.display()),
                        ],
                    )
                }
            }
        };
        setup.push(crate::fio::command_line(&cmd[0], &cmd[1..]));
        let logf = std::fs::File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
        let child = Command::new(&cmd[0])
            .args(&cmd[1..])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(logf)
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", cmd[0]))?;
        running.child = Some(child);
        if let Err(e) = wait_socket(&sock, running.child.as_mut(), &log) {
            running.stop();
            return Err(e);
        }
        Ok(running)
    }
}

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
pub struct Running {
    pub uri: String,
    child: Option<Child>,
    plain: Option<(ShutdownHandle, std::thread::JoinHandle<io::Result<()>>)>,
    close: Option<Vec<String>>,
    dir: PathBuf,
}

impl Running {
    /// Stops the server and removes the image.
    pub fn stop(mut self) {
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

type PlainServer = (ShutdownHandle, std::thread::JoinHandle<io::Result<()>>);

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
