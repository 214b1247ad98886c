//! `close` / `status` / `list`: talk to served volumes through their control sockets in
//! the run directory (`open` is `frontend::open`).
//!
//! A running volume has a run directory entry: NAME.pid, NAME.ctl (a unix control socket
//! answering `status` and `close`) and NAME.log (the daemon's stderr). The directory is
//! private (0700, ours, checked before use) and so are its files: see `rundir`.

use crate::ctx::Ctx;
use crate::error::{CliError, CliResult, EXIT_BUSY, EXIT_NO_DEVICE, io_err};
use crate::frontend::ublk;
use crate::rundir::{self, check_name, existing_run_dir};
use clap::Args;
use serde_json::Value;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

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

pub(crate) fn ask(dir: &Path, name: &str, cmd: &str) -> CliResult<String> {
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
    use std::io::BufRead;
    use std::time::{Duration, Instant};
    check_name(&a.name)?;
    let name = &a.name;
    let dir = existing_run_dir(&a.run_dir)?.ok_or_else(|| not_active(name))?;
    let pid: Option<i32> = rundir::read_private_file(&dir.join(format!("{name}.pid")))
        .and_then(|s| s.trim().parse().ok());
    let ctl = dir.join(format!("{name}.ctl"));
    let Ok(mut conn) = UnixStream::connect(&ctl) else {
        // A ublk device whose server died is removed here.
        return ublk::close_stale(&dir, name).unwrap_or(Err(not_active(name)));
    };
    writeln!(conn, "close").map_err(|e| io_err(&ctl, e))?;
    // The answer comes once the stop is accepted (a reencryption step ends first).
    let _ = conn.set_read_timeout(Some(Duration::from_secs(300)));
    let mut conn = std::io::BufReader::new(conn);
    let mut reply = String::new();
    conn.read_line(&mut reply).map_err(|e| io_err(&ctl, e))?;
    if let Some(why) = reply.trim().strip_prefix("busy: ") {
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
    let limit = match reply.trim() {
        "closing" => None,
        "" => Some(0),
        r => match r.strip_prefix("closing ").map(|n| n.parse::<u64>()) {
            Some(Ok(n)) => Some(n),
            _ => return Err(CliError::usage(format!("{name}: unexpected answer '{r}'"))),
        },
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
    while pid_file_ours() || pid.is_some_and(|p| !has_exited(p)) {
        if Instant::now() > deadline {
            return Err(too_long());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    match last.as_deref() {
        None | Some("closed") => Ok(()),
        Some(other) => {
            // Not closed cleanly, and the server is gone: a ublk device it left goes now.
            let _ = ublk::close_stale(&dir, name);
            Err(
                match other
                    .strip_prefix("error ")
                    .and_then(|r| r.split_once(": "))
                {
                    Some((code, why)) => {
                        CliError::new(code.parse().unwrap_or(EXIT_NO_DEVICE), why.to_string())
                    }
                    None => CliError::new(
                        EXIT_NO_DEVICE,
                        format!("{name}: the server exited without closing cleanly (see its log)"),
                    ),
                },
            )
        }
    }
}

/// Whether process `pid` has exited for good: gone, or a zombie (not yet reaped) whose
/// other threads have ended too. The first thread to exit shows a zombie while the others
/// still run and hold the process's files (a data file's lock, a block device's O_EXCL
/// claim): a `close` that returned then would leave the device busy for the next opener.
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

pub fn status(_ctx: &Ctx, a: NameArgs) -> CliResult<()> {
    check_name(&a.name)?;
    let dir = existing_run_dir(&a.run_dir)?.ok_or_else(|| not_active(&a.name))?;
    let out =
        ask(&dir, &a.name, "status").map_err(|e| match ublk::stale_status(&dir, &a.name) {
            Some(msg) => CliError::new(e.code, msg),
            None => e,
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
    if let Some(u) = v["uuid"].as_str() {
        println!("  uuid:    {u}");
    }
    println!("  key location: process memory (pid {})", v["pid"]);
    println!("  device:  {}", v["device"].as_str().unwrap_or(""));
    println!("  storage: {}", v["storage"].as_str().unwrap_or(""));
    println!("  crypto:  {}", v["backend"].as_str().unwrap_or(""));
    println!("  sector size:  {}", v["sector_size"]);
    println!("  offset:  {} sectors", v["offset_sectors"]);
    println!("  size:    {} sectors", v["size_sectors"]);
    println!("  mode:    {}", v["mode"].as_str().unwrap_or(""));
    println!("  frontend: {}", v["frontend"].as_str().unwrap_or(""));
    if v["suspended"] == true {
        println!("  suspended: yes (keys wiped, I/O held until resume)");
    }
    if !v["clients"].is_null() {
        println!("  clients: {}", v["clients"]);
    }
    let r = &v["reencryption"];
    if let (Some(state), Some(done), Some(total)) = (
        r["state"].as_str(),
        r["done_bytes"].as_u64(),
        r["total_bytes"].as_u64(),
    ) {
        println!(
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

#[derive(Args, Debug)]
pub struct ResumeArgs {
    pub name: String,
    #[arg(long = "run-dir")]
    pub run_dir: Option<PathBuf>,
    #[command(flatten)]
    pub key: crate::KeyArgs,
    #[arg(short = 'S', long = "key-slot")]
    pub key_slot: Option<u32>,
}

/// A control-socket answer: the expected word, or `error CODE: message`.
fn answered(reply: &str, expect: &str) -> CliResult<()> {
    let reply = reply.trim();
    if reply == expect {
        return Ok(());
    }
    let rest = reply.strip_prefix("error ").unwrap_or(reply);
    let (code, msg) = rest.split_once(": ").unwrap_or(("1", rest));
    Err(CliError::new(code.parse().unwrap_or(1), msg))
}

#[derive(Args, Debug)]
pub struct ResizeArgs {
    pub name: String,
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
pub fn resize(ctx: &Ctx, a: ResizeArgs) -> CliResult<()> {
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
    let req = format!("resize {}", bytes.map_or("max".into(), |b| b.to_string()));
    let reply = ask(&dir, &a.name, &req)?;
    match reply.trim().strip_prefix("resized ") {
        Some(n) => {
            if ctx.verbose {
                eprintln!("{}: {n} bytes", a.name);
            }
            Ok(())
        }
        None => answered(&reply, "resized"),
    }
}

/// `suspend NAME` (cryptsetup luksSuspend): the served volume drops its keys and holds
/// its I/O until `resume`.
pub fn suspend(_ctx: &Ctx, a: NameArgs) -> CliResult<()> {
    check_name(&a.name)?;
    let dir = existing_run_dir(&a.run_dir)?.ok_or_else(|| not_active(&a.name))?;
    answered(&ask(&dir, &a.name, "suspend")?, "suspended")
}

/// `resume NAME` (cryptsetup luksResume): unlocks the suspended volume again with a
/// passphrase (sent over the private control socket, never on a command line).
pub fn resume(_ctx: &Ctx, a: ResumeArgs) -> CliResult<()> {
    check_name(&a.name)?;
    let dir = existing_run_dir(&a.run_dir)?.ok_or_else(|| not_active(&a.name))?;
    let pass = crate::passphrase::get_passphrase(
        &a.key.source(),
        &format!("Enter passphrase for {}: ", a.name),
        false,
    )?;
    let line = zeroize::Zeroizing::new(format!(
        "resume {}{}",
        zeroize::Zeroizing::new(hex::encode(&*pass)).as_str(),
        a.key_slot.map_or(String::new(), |s| format!(" {s}"))
    ));
    answered(&ask(&dir, &a.name, &line)?, "resumed")
}
