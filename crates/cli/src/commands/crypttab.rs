//! `attach-all` / `detach-all`: every volume of a crypttab file (see `crate::crypttab`),
//! as systemd's cryptsetup generator does at boot for /etc/crypttab.
//!
//! `attach-all` opens each entry without `noauto` that is not open already, one after
//! another, each as `open --crypttab FILE NAME --daemon` in a process of its own (so each
//! is served by its own server, as a single `open` would be), and asks for passphrases
//! where an entry has no key file. A failed entry does not stop the others; it fails the
//! command unless it has `nofail`. `detach-all` closes the entries that are open, last
//! first.

use crate::crypttab::{self, DEFAULT_CRYPTTAB};
use crate::ctx::Ctx;
use crate::error::{CliError, CliResult, EXIT_USAGE};
use clap::Args;
use std::path::PathBuf;

#[derive(Args, Debug)]
pub(crate) struct CrypttabArgs {
    /// The crypttab(5) file.
    #[arg(long, value_name = "FILE", default_value = DEFAULT_CRYPTTAB)]
    pub crypttab: PathBuf,
    /// The run directory of the servers (as `open --run-dir`).
    #[arg(long = "run-dir")]
    pub run_dir: Option<PathBuf>,
}

pub(crate) fn attach_all(ctx: &Ctx, a: CrypttabArgs) -> CliResult<()> {
    let entries = crypttab::read(&a.crypttab)?;
    let exe = std::env::current_exe().map_err(|e| CliError::usage(e.to_string()))?;
    let mut failed: Option<i32> = None;
    for e in entries.iter().filter(|e| !e.noauto()) {
        if crate::commands::served::is_active(&a.run_dir, &e.name) {
            if ctx.verbose {
                eprintln!("{}: already open", e.name);
            }
            continue;
        }
        let mut child = std::process::Command::new(&exe);
        child
            .arg("open")
            .arg("--crypttab")
            .arg(&a.crypttab)
            .arg(&e.name)
            .arg("--daemon");
        if let Some(d) = &a.run_dir {
            child.arg("--run-dir").arg(d);
        }
        if ctx.batch {
            child.arg("--batch-mode");
        }
        let status = child
            .status()
            .map_err(|err| CliError::usage(format!("cannot run {}: {err}", exe.display())))?;
        if status.success() {
            continue;
        }
        let code = status.code().unwrap_or(EXIT_USAGE);
        if e.nofail() {
            eprintln!(
                "{}: not opened (line {}, nofail: attach-all goes on)",
                e.name, e.line
            );
        } else {
            eprintln!("{}: not opened (line {})", e.name, e.line);
            failed.get_or_insert(code);
        }
    }
    match failed {
        Some(code) => Err(CliError::new(code, "")),
        None => Ok(()),
    }
}

pub(crate) fn detach_all(ctx: &Ctx, a: CrypttabArgs) -> CliResult<()> {
    let entries = crypttab::read(&a.crypttab)?;
    let mut failed: Option<CliError> = None;
    for e in entries.iter().rev() {
        if !crate::commands::served::is_active(&a.run_dir, &e.name) {
            continue;
        }
        let r = crate::commands::served::close(
            ctx,
            crate::commands::served::NameArgs {
                name: e.name.clone(),
                header: None,
                run_dir: a.run_dir.clone(),
            },
        );
        if let Err(err) = r {
            eprintln!("{}: {}", e.name, err.message);
            failed.get_or_insert(CliError::new(err.code, ""));
        }
    }
    failed.map_or(Ok(()), Err)
}
