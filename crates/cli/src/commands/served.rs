//! `close` / `status` / `list`: talk to served volumes through their control sockets in
//! the run directory (`open` is `frontend::open`).
//!
//! A running volume has a run directory entry: NAME.pid, NAME.ctl (a unix control socket
//! answering `status` and `close`) and NAME.log (the daemon's stderr). The directory is
//! private (0700, ours, checked before use) and so are its files: see `rundir`.

use crate::control::{Reply, Request, ask, not_active};
use crate::ctx::Ctx;
use crate::error::{CliError, CliResult, EXIT_BUSY, EXIT_NO_DEVICE, io_err};
use crate::rundir::{self, check_name, existing_run_dir};
use clap::Args;
use serde_json::Value;
use std::io::Write;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;

#[derive(Args, Debug)]
pub(crate) struct NameArgs {
    pub name: String,
    /// Accepted for cryptsetup's scripts: the serving process holds the header already.
    #[arg(long = "header", value_name = "HEADER", hide = true)]
    pub header: Option<PathBuf>,
    #[arg(long = "run-dir")]
    pub run_dir: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub(crate) struct ListArgs {
    #[arg(long = "run-dir")]
    pub run_dir: Option<PathBuf>,
    #[arg(long)]
    pub json: bool,
}

pub(crate) fn close(_ctx: &Ctx, a: NameArgs) -> CliResult<()> {
    use std::io::BufRead;
    use std::time::{Duration, Instant};
    check_name(&a.name)?;
    let name = &a.name;
    let dir = existing_run_dir(&a.run_dir)?.ok_or_else(|| not_active(name))?;
    let pid: Option<i32> = rundir::read_private_file(&dir.join(format!("{name}.pid")))
        .and_then(|s| s.trim().parse().ok());
    let ctl = dir.join(format!("{name}.ctl"));
    let Ok(mut conn) = UnixStream::connect(&ctl) else {
        // A kernel device whose server died (ublk) is removed here.
        return crate::frontend::close_stale(&dir, name).unwrap_or(Err(not_active(name)));
    };
    writeln!(conn, "{}", Request::Close.line().as_str()).map_err(|e| io_err(&ctl, e))?;
    // The answer comes once the stop is accepted (a reencryption step ends first).
    let _ = conn.set_read_timeout(Some(Duration::from_secs(300)));
    let mut conn = std::io::BufReader::new(conn);
    let mut reply = String::new();
    conn.read_line(&mut reply).map_err(|e| io_err(&ctl, e))?;
    if let Reply::Busy(why) = Reply::parse(&reply) {
        return Err(CliError::new(
            EXIT_BUSY,
            format!("Device {name} is still in use: {why}"),
        ));
    }
    // "closing SECONDS": the time the server may take (its --close-timeout), then its
    // last line on this connection: `closed`, or `error CODE: why` (a bare "closing" is
    // an older server, which says nothing more). Past its limit it exits all the same,
    // so a little more than that is waited for.
    // No answer at all: the server exited first (say, its stop ran out of time).
    let limit = match Reply::parse(&reply) {
        _ if reply.trim().is_empty() => Some(0),
        Reply::Closing(n) => n,
        r => {
            return Err(CliError::usage(format!("{name}: unexpected answer '{r}'")));
        }
    };
    let wait = Duration::from_secs(limit.unwrap_or(60).min(86_400) + 10);
    let deadline = Instant::now() + wait;
    let too_long = || {
        CliError::new(
            EXIT_BUSY,
            format!("{name} did not close within {} s", wait.as_secs()),
        )
    };
    let last = match limit {
        _ if reply.is_empty() => Some(String::new()),
        Some(_) => {
            let _ = conn.get_ref().set_read_timeout(Some(wait));
            let mut last = String::new();
            match conn.read_line(&mut last) {
                Ok(_) => Some(last.trim().to_string()),
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    return Err(too_long());
                }
                Err(_) => Some(String::new()),
            }
        }
        None => None,
    };
    // The server is gone once its pid file is (it goes last; a file naming another pid
    // is a newer server's) and the process too.
    let pid_file = dir.join(format!("{name}.pid"));
    let pid_file_ours = || match rundir::read_private_file(&pid_file) {
        Some(s) => pid.is_none() || s.trim().parse::<i32>().ok() == pid,
        None => false,
    };
    while pid_file_ours() || pid.is_some_and(|p| !crate::process::has_exited(p)) {
        if Instant::now() > deadline {
            return Err(too_long());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    match last.as_deref().map(Reply::parse) {
        None | Some(Reply::Closed) => Ok(()),
        Some(other) => {
            // Not closed cleanly, and the server is gone: a kernel device it left goes now.
            let _ = crate::frontend::close_stale(&dir, name);
            Err(match other {
                Reply::Error { code, message } => CliError::new(code, message),
                _ => CliError::new(
                    EXIT_NO_DEVICE,
                    format!("{name}: the server exited without closing cleanly (see its log)"),
                ),
            })
        }
    }
}

/// Whether a server for `name` answers on its control socket in the run directory.
pub(crate) fn is_active(run_dir: &Option<PathBuf>, name: &str) -> bool {
    check_name(name).is_ok()
        && matches!(existing_run_dir(run_dir), Ok(Some(dir))
            if matches!(ask(&dir, name, &Request::Status), Ok(Reply::Status(_))))
}

pub(crate) fn status(ctx: &Ctx, a: NameArgs) -> CliResult<()> {
    check_name(&a.name)?;
    let dir = existing_run_dir(&a.run_dir)?.ok_or_else(|| not_active(&a.name))?;
    let v = match ask(&dir, &a.name, &Request::Status) {
        Ok(Reply::Status(v)) => v,
        Ok(r) => return Err(r.into_error()),
        Err(e) => {
            return Err(match crate::frontend::stale_status(&dir, &a.name) {
                Some(msg) => CliError::new(e.code, msg),
                None => e,
            });
        }
    };
    outln!(
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
    // cryptsetup finds a volume's type by reading its header again, from the device
    // unless --header names it: with a detached header it says "n/a", and scripts
    // written for it check that. cryptblk knows the type; the drop-in answers as
    // cryptsetup does.
    let kind = if ctx.dropin && a.header.is_none() && v["detached_header"] == true {
        "n/a"
    } else {
        v["type"].as_str().unwrap_or("")
    };
    outln!("  type:    {kind}");
    outln!("  cipher:  {}", v["cipher"].as_str().unwrap_or(""));
    outln!("  keysize: {} bits", v["key_bits"]);
    if let Some(u) = v["uuid"].as_str() {
        outln!("  uuid:    {u}");
    }
    outln!("  key location: process memory (pid {})", v["pid"]);
    if let (Some(id), Some(kind)) = (v["token"]["id"].as_u64(), v["token"]["type"].as_str()) {
        outln!(
            "  unlocked by: token {id} ({kind}), keyslot {}",
            v["keyslot"]
        );
    }
    outln!("  device:  {}", v["device"].as_str().unwrap_or(""));
    outln!("  storage: {}", v["storage"].as_str().unwrap_or(""));
    outln!("  crypto:  {}", v["backend"].as_str().unwrap_or(""));
    outln!("  sector size:  {}", v["sector_size"]);
    outln!("  offset:  {} sectors", v["offset_sectors"]);
    outln!("  size:    {} sectors", v["size_sectors"]);
    if let Some(n) = v["skipped_sectors"].as_u64().filter(|&n| n > 0) {
        outln!("  skipped: {n} sectors");
    }
    // cryptsetup marks a suspended mapping on this line; scripts grep for it.
    outln!(
        "  mode:    {}{}",
        v["mode"].as_str().unwrap_or(""),
        if v["suspended"] == true {
            " (suspended)"
        } else {
            ""
        }
    );
    outln!("  frontend: {}", v["frontend"].as_str().unwrap_or(""));
    if v["suspended"] == true {
        outln!("  suspended: yes (keys wiped, I/O held until resume)");
    }
    if !v["clients"].is_null() {
        outln!("  clients: {}", v["clients"]);
    }
    let r = &v["reencryption"];
    if let (Some(state), Some(done), Some(total)) = (
        r["state"].as_str(),
        r["done_bytes"].as_u64(),
        r["total_bytes"].as_u64(),
    ) {
        outln!(
            "  reencryption: {state}, {:.1}% of {} MiB ({} resilience, {:.1} MiB/s){}",
            done as f64 * 100.0 / total.max(1) as f64,
            total >> 20,
            r["resilience"].as_str().unwrap_or("?"),
            r["bytes_per_second"].as_u64().unwrap_or(0) as f64 / (1 << 20) as f64,
            r["error"]
                .as_str()
                .map_or(String::new(), |e| format!(": {e}"))
        );
    }
    if v["integrity"] == true {
        outln!(
            "  integrity: {} sectors failed verification",
            v["integrity_errors"]
        );
    }
    outln!(
        "  I/O:     {} reads ({} bytes), {} writes ({} bytes), {} flushes",
        v["reads"],
        v["read_bytes"],
        v["writes"],
        v["written_bytes"],
        v["flushes"]
    );
    Ok(())
}

pub(crate) fn list(_ctx: &Ctx, a: ListArgs) -> CliResult<()> {
    let dir = existing_run_dir(&a.run_dir)?;
    let mut rows = Vec::new();
    if let Some(rd) = dir.as_ref().and_then(|d| std::fs::read_dir(d).ok()) {
        let dir = dir.as_deref().expect("read above");
        for e in rd.flatten() {
            let file = e.file_name().to_string_lossy().into_owned();
            if let Some(name) = file.strip_suffix(".ctl")
                && let Ok(Reply::Status(v)) = ask(dir, name, &Request::Status)
            {
                rows.push(v);
            }
        }
    }
    rows.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
    if a.json {
        outln!("{}", Value::Array(rows));
    } else {
        for v in rows {
            outln!(
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

#[derive(Args, Debug)]
pub(crate) struct ResumeArgs {
    pub name: String,
    /// The serving process holds the header already; as `cryptsetup` (the drop-in), a
    /// volume opened with a detached header needs it named, as cryptsetup does.
    #[arg(long = "header", value_name = "HEADER", hide = true)]
    pub header: Option<PathBuf>,
    #[arg(long = "run-dir")]
    pub run_dir: Option<PathBuf>,
    #[command(flatten)]
    pub key: crate::args::KeyArgs,
    #[arg(short = 'S', long = "key-slot")]
    pub key_slot: Option<u32>,
}

#[derive(Args, Debug)]
pub(crate) struct ResizeArgs {
    pub name: String,
    /// Accepted for cryptsetup's scripts: the serving process holds the header already.
    #[arg(long = "header", value_name = "HEADER", hide = true)]
    pub header: Option<PathBuf>,
    /// New size in 512-byte sectors (default: all the device holds after the data offset).
    #[arg(long, short = 'b')]
    pub size: Option<u64>,
    /// New size in bytes, with units (e.g. 64M).
    #[arg(long = "device-size")]
    pub device_size: Option<String>,
    #[arg(long = "run-dir")]
    pub run_dir: Option<PathBuf>,
}

/// `resize NAME` (cryptsetup resize): the served volume takes the size given, or all the
/// device now holds (a file or device that grew). NBD clients connecting from now on and
/// the FUSE file see the new size; a ublk device is refused (close and reopen).
pub(crate) fn resize(ctx: &Ctx, a: ResizeArgs) -> CliResult<()> {
    check_name(&a.name)?;
    let bytes = match (a.size, &a.device_size) {
        (Some(_), Some(_)) => {
            return Err(CliError::usage(
                "--size and --device-size exclude each other",
            ));
        }
        (Some(s), None) => Some(
            s.checked_mul(512)
                .ok_or_else(|| CliError::usage(format!("--size {s} is too large")))?,
        ),
        (None, Some(d)) => Some(crate::units::parse_size(d).map_err(CliError::usage)?),
        (None, None) => None,
    };
    let dir = existing_run_dir(&a.run_dir)?.ok_or_else(|| not_active(&a.name))?;
    match ask(&dir, &a.name, &Request::Resize(bytes))? {
        Reply::Resized(n) => {
            if ctx.verbose {
                eprintln!("{}: {n} bytes", a.name);
            }
            Ok(())
        }
        r => Err(r.into_error()),
    }
}

/// `suspend NAME` (cryptsetup luksSuspend): the served volume drops its keys and holds
/// its I/O until `resume`.
pub(crate) fn suspend(_ctx: &Ctx, a: NameArgs) -> CliResult<()> {
    check_name(&a.name)?;
    let dir = existing_run_dir(&a.run_dir)?.ok_or_else(|| not_active(&a.name))?;
    ask(&dir, &a.name, &Request::Suspend)?.expect(Reply::Suspended)
}

/// `resume NAME` (cryptsetup luksResume): unlocks the suspended volume again with a
/// passphrase (sent over the private control socket, never on a command line).
pub(crate) fn resume(ctx: &Ctx, a: ResumeArgs) -> CliResult<()> {
    check_name(&a.name)?;
    let dir = existing_run_dir(&a.run_dir)?.ok_or_else(|| not_active(&a.name))?;
    if ctx.dropin && a.header.is_none() {
        // cryptsetup reads the header again to resume, from the device unless --header
        // names it; scripts written for it expect a volume with a detached header to
        // need --header. cryptblk itself holds the header already.
        if let Ok(Reply::Status(v)) = ask(&dir, &a.name, &Request::Status)
            && v["detached_header"] == true
        {
            return Err(CliError::usage(format!(
                "{} has a detached header: give it with --header",
                a.name
            )));
        }
    }
    // The prompt names the device, as cryptsetup's does (the server knows it).
    let device = match ask(&dir, &a.name, &Request::Status) {
        Ok(Reply::Status(v)) => v["device"].as_str().map(str::to_owned),
        _ => None,
    }
    .unwrap_or_else(|| a.name.clone());
    let src = a.key.source();
    let interactive = src.key_file.is_none() && std::io::IsTerminal::is_terminal(&std::io::stdin());
    let tries = ctx.tries_for(interactive);
    let mut attempt = 1;
    loop {
        let pass = crate::passphrase::get_passphrase(
            &src,
            &format!("Enter passphrase for {device}: "),
            false,
        )?;
        let req = Request::Resume {
            passphrase: zeroize::Zeroizing::new(pass.to_vec()),
            key_slot: a.key_slot,
        };
        match ask(&dir, &a.name, &req).and_then(|r| r.expect(Reply::Resumed)) {
            Err(e) if e.code == crate::error::EXIT_PERMISSION && attempt < tries => {
                eprintln!("{}", e.message);
                attempt += 1;
            }
            r => return r,
        }
    }
}
