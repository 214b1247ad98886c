//! Shell completion for bash, zsh and fish through clap_complete's dynamic engine: the
//! shell asks this binary for each completion (`COMPLETE=bash cryptblk -- WORDS...`), so
//! commands, options and their values come from the clap definitions that parse them, and
//! what the definitions cannot know is looked up when asked: the volumes served now (the
//! NAME of `close`, `status`, `resize`, `suspend`, `resume`, from the run directory) and
//! the block devices (DEVICE arguments, besides files). `COMPLETE=bash cryptblk` (or zsh,
//! fish) prints the script that registers it; the package installs the three.

use clap::Command;
use clap_complete::engine::{
    ArgValueCompleter, CompletionCandidate, PathCompleter, ValueCompleter,
};
use std::ffi::OsStr;

/// Answers a completion request and exits, when the environment holds one.
pub(crate) fn complete_if_asked(factory: fn() -> Command) {
    clap_complete::CompleteEnv::with_factory(move || annotate(factory())).complete();
}

/// `cmd` with the completers of its DEVICE and NAME arguments, every subcommand down.
fn annotate(mut cmd: Command) -> Command {
    let served = ["close", "status", "resize", "suspend", "resume"].contains(&cmd.get_name());
    let positional: Vec<String> = cmd
        .get_arguments()
        .filter(|a| a.is_positional())
        .map(|a| a.get_id().to_string())
        .collect();
    for id in positional {
        if id == "device" {
            cmd = cmd.mut_arg(&id, |a| a.add(ArgValueCompleter::new(devices)));
        } else if id == "name" && served {
            cmd = cmd.mut_arg(&id, |a| a.add(ArgValueCompleter::new(volumes)));
        }
    }
    let subs: Vec<String> = cmd
        .get_subcommands()
        .map(|c| c.get_name().to_string())
        .collect();
    for s in subs {
        cmd = cmd.mut_subcommand(&s, annotate);
    }
    cmd
}

/// The volumes served now: a control socket NAME.ctl each in the default run directory.
fn volumes(current: &OsStr) -> Vec<CompletionCandidate> {
    let current = current.to_string_lossy();
    let mut names: Vec<String> = std::fs::read_dir(crate::rundir::default_run_dir())
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            e.file_name()
                .to_str()
                .and_then(|n| n.strip_suffix(".ctl"))
                .map(str::to_string)
        })
        .filter(|n| n.starts_with(current.as_ref()))
        .collect();
    names.sort();
    names
        .into_iter()
        .map(|n| CompletionCandidate::new(n).help(Some("served volume".into())))
        .collect()
}

/// Files and directories, and before anything is typed, the block devices.
fn devices(current: &OsStr) -> Vec<CompletionCandidate> {
    let mut out = Vec::new();
    if current.is_empty() {
        for d in crate::crypttab::block_devices() {
            out.push(CompletionCandidate::new(d).help(Some("block device".into())));
        }
    }
    out.extend(PathCompleter::any().complete(current));
    out
}
