//! `open` / `close` / `status` / `list`: serve an unlocked volume as a block device.
//!
//! A running volume has a run directory entry: NAME.pid, NAME.ctl (a unix control socket
//! answering `status` and `close`) and NAME.log (the daemon's stderr). The directory is
//! private (0700, ours, checked before use) and so are its files: see `rundir`.

use crate::commands::Ctx;
use crate::error::{CliError, CliResult, EXIT_BUSY, EXIT_NO_DEVICE, io_err};
use crate::rundir::{self, SocketAccess};
use crate::unlock::{OpenedVolume, VolumeArgs, open_volume};
use clap::Args;
use cryptblk_device::BlockDevice;
use cryptblk_fuse::{FuseExport, FuseMount, FuseStats};
use cryptblk_nbd::{NbdServer, ShutdownHandle};
use serde_json::{Value, json};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

#[derive(Args, Debug)]
pub struct OpenArgs {
    /// Image file, block device, or `mem:SIZE` (RAM, e.g. mem:1G; plain mode, for benchmarks).
    pub device: PathBuf,
    /// Name of the mapping (used by close/status).
    pub name: String,
    /// Serve over NBD: `unix:PATH` or `tcp:127.0.0.1:PORT`.
    #[arg(long, conflicts_with = "fuse")]
    pub nbd: Option<String>,
    /// Serve as the file DIR/NAME in a FUSE mount on DIR (loop-mount it, or use it directly).
    #[arg(long, value_name = "DIR")]
    pub fuse: Option<PathBuf>,
    /// With --fuse: let other users (root included) reach the file; its permissions
    /// (0600, the server's user) still apply, checked by the kernel.
    #[arg(long = "allow-other", requires = "fuse")]
    pub allow_other: bool,
    /// With --nbd unix:PATH: permissions of the socket (octal; default 600, owner only).
    /// Whoever can connect reads and writes the plaintext.
    #[arg(long = "socket-mode", value_name = "OCTAL", requires = "nbd")]
    pub socket_mode: Option<String>,
    /// With --nbd unix:PATH: group of the socket (name or number), to share it on purpose
    /// together with --socket-mode 660.
    #[arg(long = "socket-group", value_name = "GROUP", requires = "nbd")]
    pub socket_group: Option<String>,
    /// Detach and run in the background once ready.
    #[arg(long)]
    pub daemon: bool,
    /// Directory for pid, control socket and log (default: $XDG_RUNTIME_DIR/cryptblk,
    /// /run/cryptblk as root).
    #[arg(long = "run-dir")]
    pub run_dir: Option<PathBuf>,
    /// NBD: threads per connection (requests in flight per client); FUSE: worker threads.
    #[arg(long, default_value_t = 4)]
    pub threads: usize,
    /// NBD: microseconds a connection polls for its next request before sleeping
    /// (0 = never poll; polling saves a wake-up per request at low queue depth).
    #[arg(long = "busy-poll", value_name = "MICROS", default_value_t = 50)]
    pub busy_poll: u64,
    #[command(flatten)]
    pub ublk: crate::ublk::UblkArgs,
    /// Internal: set in the detached child of `--daemon`.
    #[arg(long = "daemon-child", hide = true)]
    pub daemon_child: bool,
    #[command(flatten)]
    pub vol: VolumeArgs,
}

#[derive(Args, Debug)]
pub struct NameArgs {
    pub name: String,
    #[arg(long = "run-dir")]
    pub run_dir: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub struct ListArgs {
    #[arg(long = "run-dir")]
    pub run_dir: Option<PathBuf>,
    #[arg(long)]
    pub json: bool,
}

pub fn default_run_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        return Path::new(&d).join("cryptblk");
    }
    let uid = crate::process::uid();
    if uid == 0 {
        PathBuf::from("/run/cryptblk")
    } else {
        std::env::temp_dir().join(format!("cryptblk-{uid}"))
    }
}

pub(crate) fn run_dir(d: &Option<PathBuf>) -> PathBuf {
    d.clone().unwrap_or_else(default_run_dir)
}

/// The run directory of a command that creates things in it: made 0700, or checked to be
/// private if it exists (see `rundir`).
pub(crate) fn private_run_dir(d: &Option<PathBuf>) -> CliResult<PathBuf> {
    rundir::ensure_private_dir(&run_dir(d))
}

/// The run directory of a command that only talks to what runs there: `None` when it
/// does not exist; an error when it is not private (what answers there may not be ours).
fn existing_run_dir(d: &Option<PathBuf>) -> CliResult<Option<PathBuf>> {
    let dir = run_dir(d);
    Ok(rundir::check_existing(&dir)?.then_some(dir))
}

pub(crate) fn check_name(name: &str) -> CliResult<()> {
    if name.is_empty()
        || name.len() > 64
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        || name.starts_with('.')
    {
        return Err(CliError::usage(format!(
            "invalid name '{name}' (letters, digits, - _ . ; up to 64)"
        )));
    }
    Ok(())
}

enum Listen {
    Unix(PathBuf),
    Tcp(String),
}

fn parse_nbd(spec: &str) -> CliResult<Listen> {
    if let Some(p) = spec.strip_prefix("unix:") {
        return Ok(Listen::Unix(PathBuf::from(p)));
    }
    if let Some(a) = spec.strip_prefix("tcp:") {
        return Ok(Listen::Tcp(a.to_string()));
    }
    Err(CliError::usage(format!(
        "--nbd takes unix:PATH or tcp:HOST:PORT, not '{spec}'"
    )))
}

/// Everything `status` reports, fixed at open time.
pub(crate) struct Served {
    pub(crate) name: String,
    pub(crate) device: String,
    pub(crate) kind: String,
    pub(crate) key_bits: usize,
    pub(crate) keyslot: Option<u32>,
    pub(crate) frontend: String,
}

/// The frontend a volume is served through, as `close` and `status` see it.
enum Frontend {
    Nbd(ShutdownHandle),
    Fuse {
        mountpoint: PathBuf,
        stats: Arc<FuseStats>,
    },
}

impl Frontend {
    /// Starts a clean stop: drain, then the main thread flushes and exits. A FUSE file
    /// that is still in use (open, loop device attached) is not pulled away: busy error.
    fn stop(&self) -> Result<(), String> {
        match self {
            Frontend::Nbd(h) => {
                h.shutdown();
                Ok(())
            }
            Frontend::Fuse { mountpoint, .. } => {
                FuseMount::request_unmount(mountpoint).map_err(|e| e.to_string())
            }
        }
    }

    /// (clients now, clients ever, requests failed)
    fn counters(&self) -> (u64, u64, u64) {
        match self {
            Frontend::Nbd(h) => {
                let n = h.stats();
                (n.connections_active, n.connections_total, n.errors)
            }
            Frontend::Fuse { stats, .. } => (
                stats.open_handles.load(Relaxed),
                stats.opens_total.load(Relaxed),
                stats.errors.load(Relaxed),
            ),
        }
    }
}

/// `status` of a volume served over NBD or FUSE.
fn frontend_status(s: &Served, vol: &cryptblk_volume::Volume, fe: &Frontend) -> Value {
    let (clients, clients_total, errors) = fe.counters();
    status_json(
        s,
        vol,
        json!({"clients": clients, "clients_total": clients_total, "errors": errors}),
    )
}

/// The volume's part of `status`, with the frontend's fields (`extra`, an object) added.
pub(crate) fn status_json(s: &Served, vol: &cryptblk_volume::Volume, extra: Value) -> Value {
    let st = vol.stats();
    let c = vol.cipher();
    let mut v = json!({
        "name": s.name, "device": s.device, "type": s.kind,
        "cipher": c.spec().to_string(), "key_bits": s.key_bits, "keyslot": s.keyslot,
        "sector_size": c.sector_size(), "backend": c.backend().name(),
        "storage": vol.storage_description(),
        "offset_sectors": vol.data_offset() / 512, "size_sectors": vol.size() / 512, "size_bytes": vol.size(),
        "mode": if vol.read_only() { "readonly" } else { "read/write" },
        "discards": vol.can_discard(),
        "frontend": s.frontend, "pid": std::process::id(),
        "reads": st.reads.load(Relaxed), "writes": st.writes.load(Relaxed),
        "read_bytes": st.read_bytes.load(Relaxed), "written_bytes": st.written_bytes.load(Relaxed),
        "flushes": st.flushes.load(Relaxed), "discards_done": st.discards.load(Relaxed),
        "unaligned": st.unaligned.load(Relaxed), "crypto_calls": st.crypto_calls.load(Relaxed),
        "dumpable": crate::process::is_dumpable(),
    });
    if let (Some(o), Value::Object(e)) = (v.as_object_mut(), extra) {
        o.extend(e);
    }
    v
}

enum Bound {
    /// The listener, its path, and the socket's identity (removed at exit only if it is
    /// still ours).
    Unix(UnixListener, PathBuf, Option<(u64, u64)>),
    Tcp(std::net::TcpListener),
}

/// Binds the NBD listener before readiness is announced, so "ready" means clients can connect.
fn bind_nbd(listen: &Listen, access: SocketAccess) -> CliResult<Bound> {
    Ok(match listen {
        Listen::Unix(p) => {
            rundir::clear_stale_socket(p)?;
            let l = rundir::bind_socket(p, access)?;
            Bound::Unix(l, p.clone(), rundir::identity(p))
        }
        Listen::Tcp(addr) => {
            let l = std::net::TcpListener::bind(addr)
                .map_err(|e| CliError::usage(format!("{addr}: {e}")))?;
            let ip = l
                .local_addr()
                .map_err(|e| CliError::usage(e.to_string()))?
                .ip();
            if !ip.is_loopback() {
                return Err(CliError::usage(format!(
                    "refusing to serve on non-loopback address {ip}"
                )));
            }
            Bound::Tcp(l)
        }
    })
}

/// What the main thread waits on until the volume is closed.
enum Running {
    Nbd(NbdServer, Bound),
    Fuse(FuseMount),
}

pub fn open(ctx: &Ctx, a: OpenArgs) -> CliResult<()> {
    // From here on this process holds the passphrase and the volume key: no core dumps,
    // no ptrace attach and no /proc/PID/mem for other (non-root) users. execve resets the
    // flag, so the `--daemon` child, which runs this function too, sets it again itself.
    crate::process::set_not_dumpable();
    check_name(&a.name)?;
    if a.ublk.ublk {
        if a.nbd.is_some() || a.fuse.is_some() {
            return Err(CliError::usage(
                "choose one frontend: --nbd, --fuse or --ublk",
            ));
        }
        return crate::ublk::open(ctx, a);
    }
    crate::ublk::check_unused(&a.ublk)?;
    let listen = match (&a.nbd, &a.fuse) {
        (Some(nbd), None) => Some(parse_nbd(nbd)?),
        (None, Some(_)) => None,
        _ => {
            return Err(CliError::usage(
                "open needs one frontend: --nbd unix:PATH, --nbd tcp:127.0.0.1:PORT, --fuse DIR or --ublk",
            ));
        }
    };
    let access = rundir::socket_access(a.socket_mode.as_deref(), a.socket_group.as_deref())?;
    let dir = private_run_dir(&a.run_dir)?;
    if a.daemon && !a.daemon_child {
        return spawn_daemon(&a, &dir);
    }
    let ctl_path = check_not_open(&dir, &a.name)?;
    let OpenedVolume {
        volume,
        kind,
        key_bits,
        keyslot,
        ..
    } = open_volume(&a.device, &a.vol)?;
    let vol = Arc::new(volume);
    let device = vol.clone() as Arc<dyn BlockDevice>;

    let (running, frontend, desc) = match (&listen, &a.fuse) {
        (Some(listen), _) => {
            let server = NbdServer::builder()
                .export(a.name.clone(), device)
                .read_only(a.vol.read_only)
                .threads_per_connection(a.threads)
                .busy_poll(std::time::Duration::from_micros(a.busy_poll))
                .build()
                .map_err(|e| CliError::usage(format!("NBD server: {e}")))?;
            let fe = Frontend::Nbd(server.shutdown_handle());
            let desc = match listen {
                Listen::Unix(p) => format!("nbd unix:{}", p.display()),
                Listen::Tcp(t) => format!("nbd tcp:{t}"),
            };
            (Running::Nbd(server, bind_nbd(listen, access)?), fe, desc)
        }
        (None, Some(mnt)) => {
            std::fs::create_dir_all(mnt).map_err(|e| io_err(mnt, e))?;
            let mount = FuseExport::builder(mnt, device)
                .file_name(a.name.clone())
                .threads(a.threads)
                .read_only(a.vol.read_only)
                .allow_other(a.allow_other)
                .mount()
                .map_err(|e| CliError::usage(format!("FUSE mount on {}: {e}", mnt.display())))?;
            let fe = Frontend::Fuse {
                mountpoint: mnt.clone(),
                stats: mount.stats().clone(),
            };
            let desc = format!("fuse {}", mount.file().display());
            (Running::Fuse(mount), fe, desc)
        }
        (None, None) => unreachable!("checked above"),
    };
    let frontend = Arc::new(frontend);
    let served = Arc::new(Served {
        name: a.name.clone(),
        device: a.device.display().to_string(),
        kind,
        key_bits,
        keyslot,
        frontend: desc,
    });

    // SIGTERM / SIGINT: stop accepting, drain, flush, exit 0 (a busy FUSE file stays up).
    let (ctl, pid_path) = {
        let fe = frontend.clone();
        announce(&ctl_path, &dir, &a.name, move || fe.stop())?
    };
    {
        let (fe, served, vol) = (frontend.clone(), served.clone(), vol.clone());
        std::thread::spawn(move || {
            control_loop(ctl, || frontend_status(&served, &vol, &fe), || fe.stop())
        });
    }
    if ctx.verbose || !a.daemon_child {
        eprintln!(
            "{}: {} {} served at {}",
            a.name,
            served.kind,
            vol.cipher().spec(),
            served.frontend
        );
    }
    if a.daemon_child {
        // Tell the parent we are ready; it closes its end and exits.
        let mut out = std::io::stdout();
        let _ = out.write_all(b"READY\n").and_then(|_| out.flush());
    }
    let result = match running {
        Running::Nbd(server, Bound::Unix(l, p, id)) => {
            let r = server.serve_unix_listener(l);
            rundir::remove_if_same(&p, id);
            r.map_err(|e| CliError::usage(format!("NBD server: {e}")))
        }
        Running::Nbd(server, Bound::Tcp(l)) => server
            .serve_tcp_listener(l)
            .map_err(|e| CliError::usage(format!("NBD server: {e}"))),
        Running::Fuse(mut mount) => mount
            .join()
            .map_err(|e| CliError::usage(format!("FUSE session: {e}"))),
    };
    let _ = std::fs::remove_file(&ctl_path);
    let _ = std::fs::remove_file(&pid_path);
    vol.flush().map_err(|e| io_err(&a.device, e))?;
    result
}

/// NAME.ctl, where a running volume answers; an error if one of that name already does.
pub(crate) fn check_not_open(dir: &Path, name: &str) -> CliResult<PathBuf> {
    let ctl_path = dir.join(format!("{name}.ctl"));
    if UnixStream::connect(&ctl_path).is_ok() {
        return Err(CliError::new(
            EXIT_BUSY,
            format!("a volume named {name} is already open"),
        ));
    }
    Ok(ctl_path)
}

/// Makes a volume visible once its frontend is up: binds the control socket `ctl_path`,
/// writes NAME.pid, and on SIGTERM/SIGINT calls `stop` (again at the next signal while it
/// says the volume is busy). Returns the control listener and the pid file's path.
pub(crate) fn announce(
    ctl_path: &Path,
    dir: &Path,
    name: &str,
    stop: impl Fn() -> Result<(), String> + Send + 'static,
) -> CliResult<(UnixListener, PathBuf)> {
    rundir::clear_stale_socket(ctl_path)?;
    let ctl = rundir::bind_socket(ctl_path, SocketAccess::default())?;
    let pid_path = dir.join(format!("{name}.pid"));
    rundir::write_private_file(&pid_path, format!("{}\n", std::process::id()).as_bytes())?;
    let mut signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGINT,
    ])
    .map_err(|e| CliError::usage(format!("signals: {e}")))?;
    let name = name.to_string();
    std::thread::spawn(move || {
        for _ in signals.forever() {
            match stop() {
                Ok(()) => return,
                Err(e) => eprintln!("{name}: cannot close yet: {e}"),
            }
        }
    });
    Ok((ctl, pid_path))
}

/// Answers `status` and `close` on the control socket until a `close` succeeds (`close`
/// may refuse, e.g. while a FUSE file is in use: the client gets `busy: WHY`).
pub(crate) fn control_loop(
    ctl: UnixListener,
    status: impl Fn() -> Value,
    close: impl Fn() -> Result<(), String>,
) {
    for conn in ctl.incoming() {
        let Ok(mut conn) = conn else { continue };
        let mut line = String::new();
        let _ = conn.set_read_timeout(Some(std::time::Duration::from_secs(5)));
        if BufReader::new(&mut conn)
            .take(256)
            .read_line(&mut line)
            .is_err()
        {
            continue;
        }
        match line.trim() {
            "status" => {
                let _ = writeln!(conn, "{}", status());
            }
            "close" => match close() {
                Ok(()) => {
                    let _ = writeln!(conn, "closing");
                    return;
                }
                Err(e) => {
                    let _ = writeln!(conn, "busy: {e}");
                }
            },
            _ => {
                let _ = writeln!(conn, "error: unknown command");
            }
        }
    }
}

fn ask(dir: &Path, name: &str, cmd: &str) -> CliResult<String> {
    check_name(name)?;
    let p = dir.join(format!("{name}.ctl"));
    let mut s = UnixStream::connect(&p).map_err(|_| not_active(name))?;
    writeln!(s, "{cmd}").map_err(|e| io_err(&p, e))?;
    let mut out = String::new();
    s.read_to_string(&mut out).map_err(|e| io_err(&p, e))?;
    Ok(out)
}

fn not_active(name: &str) -> CliError {
    CliError::new(EXIT_NO_DEVICE, format!("Device {name} is not active."))
}

pub fn close(_ctx: &Ctx, a: NameArgs) -> CliResult<()> {
    check_name(&a.name)?;
    let dir = existing_run_dir(&a.run_dir)?.ok_or_else(|| not_active(&a.name))?;
    let pid: Option<i32> = rundir::read_private_file(&dir.join(format!("{}.pid", a.name)))
        .and_then(|s| s.trim().parse().ok());
    let reply = match ask(&dir, &a.name, "close") {
        Ok(r) => r,
        // A ublk device whose server died is removed here.
        Err(e) => return crate::ublk::close_stale(&dir, &a.name).unwrap_or(Err(e)),
    };
    if let Some(why) = reply.trim().strip_prefix("busy: ") {
        return Err(CliError::new(
            EXIT_BUSY,
            format!("Device {} is still in use: {why}", a.name),
        ));
    }
    // Wait for the server to drain, flush and exit (its pid file goes last).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while dir.join(format!("{}.pid", a.name)).exists()
        || pid.is_some_and(|p| Path::new(&format!("/proc/{p}")).exists() && !is_zombie(p))
    {
        if std::time::Instant::now() > deadline {
            return Err(CliError::new(
                EXIT_BUSY,
                format!("{} did not close within 60 s", a.name),
            ));
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    Ok(())
}

fn is_zombie(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            s.rsplit(')')
                .next()
                .is_some_and(|r| r.trim_start().starts_with('Z'))
        })
        .unwrap_or(true)
}

pub fn status(_ctx: &Ctx, a: NameArgs) -> CliResult<()> {
    check_name(&a.name)?;
    let dir = existing_run_dir(&a.run_dir)?.ok_or_else(|| not_active(&a.name))?;
    let out = ask(&dir, &a.name, "status").map_err(|e| {
        match crate::ublk::stale_status(&dir, &a.name) {
            Some(msg) => CliError::new(e.code, msg),
            None => e,
        }
    })?;
    let v: Value = serde_json::from_str(out.trim())
        .map_err(|e| CliError::usage(format!("bad status reply: {e}")))?;
    println!(
        "{} is active{}.",
        v["path"]
            .as_str()
            .map_or_else(|| format!("/dev/cryptblk/{}", a.name), String::from),
        if v["clients"].as_u64().unwrap_or(0) > 0 {
            " and is in use"
        } else {
            ""
        }
    );
    println!("  type:    {}", v["type"].as_str().unwrap_or(""));
    println!("  cipher:  {}", v["cipher"].as_str().unwrap_or(""));
    println!("  keysize: {} bits", v["key_bits"]);
    println!("  key location: process memory (pid {})", v["pid"]);
    println!("  device:  {}", v["device"].as_str().unwrap_or(""));
    println!("  storage: {}", v["storage"].as_str().unwrap_or(""));
    println!("  crypto:  {}", v["backend"].as_str().unwrap_or(""));
    println!("  sector size:  {}", v["sector_size"]);
    println!("  offset:  {} sectors", v["offset_sectors"]);
    println!("  size:    {} sectors", v["size_sectors"]);
    println!("  mode:    {}", v["mode"].as_str().unwrap_or(""));
    println!("  frontend: {}", v["frontend"].as_str().unwrap_or(""));
    if !v["clients"].is_null() {
        println!("  clients: {}", v["clients"]);
    }
    println!(
        "  I/O:     {} reads ({} bytes), {} writes ({} bytes), {} flushes",
        v["reads"], v["read_bytes"], v["writes"], v["written_bytes"], v["flushes"]
    );
    Ok(())
}

pub fn list(_ctx: &Ctx, a: ListArgs) -> CliResult<()> {
    let dir = existing_run_dir(&a.run_dir)?;
    let mut rows = Vec::new();
    if let Some(rd) = dir.as_ref().and_then(|d| std::fs::read_dir(d).ok()) {
        let dir = dir.as_deref().expect("read above");
        for e in rd.flatten() {
            let file = e.file_name().to_string_lossy().into_owned();
            if let Some(name) = file.strip_suffix(".ctl")
                && let Ok(out) = ask(dir, name, "status")
                && let Ok(v) = serde_json::from_str::<Value>(out.trim())
            {
                rows.push(v);
            }
        }
    }
    rows.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
    if a.json {
        println!("{}", Value::Array(rows));
    } else {
        for v in rows {
            println!(
                "{}\t{}\t{}\t{}{}",
                v["name"].as_str().unwrap_or(""),
                v["type"].as_str().unwrap_or(""),
                v["device"].as_str().unwrap_or(""),
                v["frontend"].as_str().unwrap_or(""),
                v["path"]
                    .as_str()
                    .map_or(String::new(), |p| format!("\t{p}"))
            );
        }
    }
    Ok(())
}

/// Re-runs this command detached; the child signals readiness on its stdout.
pub(crate) fn spawn_daemon(a: &OpenArgs, dir: &Path) -> CliResult<()> {
    use std::os::unix::process::CommandExt;
    use std::process::{Command, Stdio};
    let log_path = dir.join(format!("{}.log", a.name));
    let log = rundir::create_private_file(&log_path)?;
    // The passphrase is read here (terminal or stdin) and handed over a pipe, never argv.
    let needs_pass =
        a.vol.key.key_file.is_none() && !a.device.to_string_lossy().starts_with("mem:");
    let pass = if needs_pass {
        Some(crate::passphrase::get_passphrase(
            &a.vol.key.source(),
            &format!("Enter passphrase for {}: ", a.device.display()),
            false,
        )?)
    } else if a.vol.key.key_file.as_deref() == Some(Path::new("-")) {
        // The key file is our stdin: hand all of it over (the child applies
        // --keyfile-offset/--keyfile-size itself, as for any key file). One byte more than
        // the child accepts, so that it still sees a key file that is too large.
        let limit = (a.vol.key.keyfile_offset as usize)
            .checked_add(
                a.vol
                    .key
                    .keyfile_size
                    .unwrap_or(crate::passphrase::KEYFILE_MAX),
            )
            .and_then(|n| n.checked_add(1))
            .ok_or_else(|| CliError::usage("--keyfile-offset is too large"))?;
        Some(crate::passphrase::read_stdin_raw(limit)?)
    } else {
        None
    };
    let exe = std::env::current_exe().map_err(|e| CliError::usage(e.to_string()))?;
    let mut args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    args.retain(|x| x != "--daemon");
    args.push("--daemon-child".into());
    let mut child = Command::new(exe)
        .args(&args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(log)
        .process_group(0)
        .spawn()
        .map_err(|e| CliError::usage(format!("cannot start daemon: {e}")))?;
    {
        let mut stdin = child.stdin.take().expect("piped");
        match &pass {
            Some(p) if needs_pass => {
                let _ = stdin.write_all(p).and_then(|_| stdin.write_all(b"\n"));
            }
            Some(raw) => {
                let _ = stdin.write_all(raw);
            }
            None => {}
        }
    }
    let mut line = String::new();
    let _ = BufReader::new(child.stdout.take().expect("piped")).read_line(&mut line);
    // "READY" or "READY /dev/ublkbN": print the device node if there is one.
    if let Some(rest) = line.trim().strip_prefix("READY") {
        let rest = rest.trim();
        println!("{}", if rest.is_empty() { &a.name } else { rest });
        return Ok(());
    }
    let status = child.wait().map_err(|e| CliError::usage(e.to_string()))?;
    let log = rundir::read_private_file(&log_path).unwrap_or_default();
    Err(CliError::new(
        status.code().unwrap_or(1).max(1),
        log.trim_end().to_string(),
    ))
}
