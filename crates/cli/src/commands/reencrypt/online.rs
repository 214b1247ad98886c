//! `reencrypt` on a volume cryptblk serves: the job is handed to the serving process over
//! its control socket (the passphrase with it, never on a command line), and this command
//! shows the progress until the job ends. Ctrl-C stops the job after its current step;
//! either tool resumes it later.

use crate::commands::reencrypt::{Job, ReencryptArgs, show_progress, to_wire};
use crate::control::{Reply, Request, ask};
use crate::ctx::Ctx;
use crate::error::{CliError, CliResult, EXIT_USAGE};
use crate::rundir::{self, existing_run_dir};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use zeroize::Zeroizing;

/// The name under which this user serves `device` (the same file or block device), if
/// one of the run directory's volumes does.
pub(crate) fn served_name(device: &Path, run_dir: &Option<PathBuf>) -> CliResult<Option<String>> {
    let Some(id) = rundir::identity(device) else {
        return Ok(None);
    };
    let Some(dir) = existing_run_dir(run_dir)? else {
        return Ok(None);
    };
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Ok(None);
    };
    for e in entries.flatten() {
        let file = e.file_name().to_string_lossy().into_owned();
        if let Some(name) = file.strip_suffix(".ctl")
            && let Ok(Reply::Status(v)) = ask(&dir, name, &Request::Status)
            && v["device_id"] == serde_json::json!([id.0, id.1])
        {
            return Ok(Some(name.to_string()));
        }
    }
    Ok(None)
}

/// Hands the job to the volume served as `name` and follows it to its end.
pub(crate) fn reencrypt_served(
    ctx: &Ctx,
    a: &ReencryptArgs,
    job: &Job,
    name: &str,
) -> CliResult<()> {
    let dir = existing_run_dir(&a.run_dir)?.ok_or_else(|| not_served(name))?;
    if a.encrypt {
        return Err(CliError::usage(
            "--encrypt works on a device nobody holds open (this one is served)",
        ));
    }
    if a.header.header.is_some() {
        return Err(CliError::usage(
            "--header: a served volume reencrypts with the header it was opened with",
        ));
    }
    if job.reduce.is_some() {
        return Err(CliError::usage(
            "--reduce-device-size shrinks the volume: start the job with the volume closed \
             (--init-only), then open it and run `reencrypt --resume-only` online",
        ));
    }
    let pass = {
        // The header read here only for its tokens; the server unlocks with the result.
        let mut hdev = crate::commands::open_header(ctx, &a.device, &a.header, false)?;
        let hdr = crate::commands::load(&mut hdev, &a.device)?;
        crate::commands::passphrase_or_token(
            &*hdr,
            &mut hdev,
            &a.key,
            &a.tokens,
            "Enter passphrase for key slot: ",
        )?
    };
    let req = Request::Reencrypt {
        passphrase: Zeroizing::new(pass.to_vec()),
        job: to_wire(a),
    };
    ask(&dir, name, &req)
        .map_err(|_| not_served(name))?
        .expect(Reply::Started)?;
    if job.init_only {
        return Ok(());
    }
    follow(ctx, &dir, name)
}

fn not_served(name: &str) -> CliError {
    CliError::new(
        crate::error::EXIT_NO_DEVICE,
        format!("Device {name} is not active."),
    )
}

/// Shows the job's progress until it ends; the first Ctrl-C asks it to stop.
fn follow(ctx: &Ctx, dir: &Path, name: &str) -> CliResult<()> {
    let interrupted = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, interrupted.clone())
            .map_err(|e| CliError::usage(format!("signals: {e}")))?;
    }
    let (start, mut first, mut asked) = (Instant::now(), None, false);
    let show = crate::commands::reencrypt::progress_shown(ctx);
    loop {
        std::thread::sleep(Duration::from_millis(200));
        if interrupted.load(Ordering::Relaxed) && !asked {
            asked = ask(dir, name, &Request::ReencryptStop).is_ok();
        }
        let v = match ask(dir, name, &Request::Status) {
            Ok(Reply::Status(v)) => v,
            _ => {
                return Err(CliError::usage(format!(
                    "{name} stopped serving during the reencryption; resume it with \
                     `reencrypt --resume-only`"
                )));
            }
        };
        let r = &v["reencryption"];
        let (done, total) = (
            r["done_bytes"].as_u64().unwrap_or(0),
            r["total_bytes"].as_u64().unwrap_or(0),
        );
        if show && total > 0 {
            show_progress(start, *first.get_or_insert(done), done, total);
        }
        match r["state"].as_str() {
            Some("running") => continue,
            Some("finished") => {
                if show {
                    eprintln!();
                }
                return Ok(());
            }
            Some("stopped") => {
                if show {
                    eprintln!();
                }
                return Err(CliError::new(
                    EXIT_USAGE,
                    "Reencryption interrupted; resume it with `reencrypt --resume-only`.",
                ));
            }
            _ => {
                return Err(CliError::usage(format!(
                    "reencryption failed: {}",
                    r["error"].as_str().unwrap_or("unknown error")
                )));
            }
        }
    }
}
