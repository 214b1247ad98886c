//! `cryptblk`: cryptsetup's LUKS commands and dm-crypt's data path, in userspace.
//! The work is done by the library crates; this binary parses arguments and prints.

#[macro_use]
mod output;
mod args;
mod commands;
mod completion;
mod control;
mod crypttab;
mod ctx;
mod error;
mod frontend;
mod generator;
mod grammar;
mod man;
mod metrics;
mod notify;
mod passphrase;
mod process;
mod progress;
mod rundir;
mod tokens;
mod units;
mod unlock;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use std::path::PathBuf;

/// `--version`: the release and the commit it is built from (see build.rs).
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("CRYPTBLK_COMMIT"),
    ")"
);

#[derive(Parser, Debug)]
#[command(
    name = "cryptblk",
    version = VERSION,
    about = "Userspace LUKS1/LUKS2/plain disk encryption, compatible with cryptsetup",
    // -h is cryptsetup's --hash; help is --help only (a global flag, so every subcommand
    // has it and none gets the automatic -h).
    disable_help_flag = true,
    disable_help_subcommand = true
)]
struct Cli {
    /// Print help.
    #[arg(long, action = clap::ArgAction::Help, global = true)]
    help: Option<bool>,
    /// Never ask for confirmation (cryptsetup's -q/--batch-mode).
    #[arg(short = 'q', long = "batch-mode", global = true)]
    batch_mode: bool,
    /// Print more about what is done.
    #[arg(short, long, global = true)]
    verbose: bool,
    /// Ceph configuration file for `rbd:POOL/IMAGE` devices (default: $CEPH_CONF, then
    /// /etc/ceph/ceph.conf).
    #[arg(long = "ceph-conf", global = true, value_name = "FILE")]
    ceph_conf: Option<PathBuf>,
    /// Ceph client id for `rbd:` devices (default: admin).
    #[arg(long = "ceph-id", global = true, value_name = "ID")]
    ceph_id: Option<String>,
    #[command(flatten)]
    compat: args::CompatArgs,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Initialise a LUKS1 or LUKS2 volume (cryptsetup luksFormat).
    #[command(alias = "luksFormat")]
    Format(commands::format::FormatArgs),
    /// Show header information (cryptsetup luksDump).
    #[command(alias = "luksDump")]
    Dump(commands::dump::DumpArgs),
    /// Add a passphrase in a new keyslot (cryptsetup luksAddKey).
    #[command(alias = "luksAddKey")]
    AddKey(commands::keyslots::AddKeyArgs),
    /// Remove the keyslot a passphrase opens (cryptsetup luksRemoveKey).
    #[command(alias = "luksRemoveKey")]
    RemoveKey(commands::keyslots::RemoveKeyArgs),
    /// Replace a passphrase (cryptsetup luksChangeKey).
    #[command(alias = "luksChangeKey")]
    ChangeKey(commands::keyslots::AddKeyArgs),
    /// Wipe one keyslot (cryptsetup luksKillSlot).
    #[command(alias = "luksKillSlot")]
    KillSlot(commands::keyslots::KillSlotArgs),
    /// Re-protect a LUKS2 keyslot's key with another PBKDF or cost (cryptsetup
    /// luksConvertKey), e.g. PBKDF2 to argon2id.
    #[command(alias = "luksConvertKey")]
    ConvertKey(commands::keyslots::ConvertKeyArgs),
    /// Check a passphrase without opening (cryptsetup open --test-passphrase).
    TestPassphrase(commands::keyslots::TestArgs),
    /// Print or set (--uuid) the volume UUID (cryptsetup luksUUID).
    #[command(alias = "luksUUID")]
    Uuid(commands::header::UuidArgs),
    /// Exit 0 if the device holds a LUKS header (cryptsetup isLuks).
    #[command(alias = "isLuks")]
    IsLuks(commands::header::IsLuksArgs),
    /// Set a LUKS2 volume's label, subsystem or keyslot priority (cryptsetup config).
    Config(commands::header::ConfigArgs),
    /// Convert a volume between LUKS1 and LUKS2 in place (cryptsetup convert --type).
    #[command(alias = "luksConvert")]
    Convert(commands::convert::ConvertArgs),
    /// Wipe every keyslot: the data can never be decrypted again (cryptsetup erase).
    #[command(alias = "luksErase")]
    Erase(args::DeviceArgs),
    /// Manage LUKS2 tokens: add, remove, import, export, unassign (cryptsetup token).
    Token(commands::token::TokenArgs),
    /// Bind a LUKS2 volume to a TPM2 or a PKCS#11 security token as systemd-cryptenroll
    /// does: a new keyslot whose passphrase only that TPM (while the PCRs and a PIN hold)
    /// or that token's key can give.
    Enroll(commands::enroll::EnrollArgs),
    /// Change the volume key of a LUKS2 volume, resumably (cryptsetup reencrypt).
    Reencrypt(commands::reencrypt::ReencryptArgs),
    /// Save the header and keyslot areas to a file (cryptsetup luksHeaderBackup).
    #[command(alias = "luksHeaderBackup")]
    HeaderBackup(commands::header::BackupArgs),
    /// Write a saved header back (cryptsetup luksHeaderRestore).
    #[command(alias = "luksHeaderRestore")]
    HeaderRestore(commands::header::BackupArgs),
    /// Repair a header (cryptsetup repair): LUKS2's two copies made whole again, an
    /// interrupted reencryption step recovered (its passphrase asked), LUKS1's free
    /// keyslots put back on the standard layout.
    Repair(commands::header::RepairArgs),
    /// Measure cipher and KDF speed in-process (cryptsetup benchmark).
    Benchmark(commands::benchmark::BenchmarkArgs),
    /// Benchmark block I/O with fio over NBD (and a VM): report.md, raw JSON, charts.
    Bench(commands::bench::BenchArgs),
    /// Unlock a volume and serve it as a block device (NBD, FUSE or ublk).
    #[command(alias = "luksOpen")]
    Open(Box<frontend::OpenArgs>),
    /// Open every volume of a crypttab(5) file (default /etc/cryptblktab) but those
    /// marked `noauto` or open already, each served by a server of its own.
    AttachAll(commands::crypttab::CrypttabArgs),
    /// Close every open volume of a crypttab(5) file (default /etc/cryptblktab).
    DetachAll(commands::crypttab::CrypttabArgs),
    /// Stop serving a volume: drain in-flight requests, flush, exit.
    #[command(alias = "luksClose")]
    Close(commands::served::NameArgs),
    /// Change the size of a served volume, e.g. after its device grew (cryptsetup resize).
    Resize(commands::served::ResizeArgs),
    /// Wipe a served volume's keys from memory and hold its I/O (cryptsetup luksSuspend).
    #[command(alias = "luksSuspend")]
    Suspend(commands::served::NameArgs),
    /// Unlock a suspended volume again; its held I/O goes on (cryptsetup luksResume).
    #[command(alias = "luksResume")]
    Resume(commands::served::ResumeArgs),
    /// Show an open volume (cryptsetup status).
    Status(commands::served::NameArgs),
    /// List open volumes.
    List(commands::served::ListArgs),
    /// Decrypt the volume's plaintext to a file or stdout.
    Export(commands::transfer::TransferArgs),
    /// Encrypt a file or stdin into the volume at an offset.
    Import(commands::transfer::TransferArgs),
    /// Write the man pages (cryptblk.8, cryptblk-COMMAND.8) into DIR (`make man`).
    #[command(hide = true)]
    GenerateMan { dir: PathBuf },
}

fn main() {
    // The TPM2 software stack logs its errors (a wrong PIN, a changed PCR) to stderr
    // itself; the token code says what failed, once. Its own TSS2_LOG setting wins.
    if std::env::var_os("TSS2_LOG").is_none() {
        // SAFETY: first thing in main, before any other thread exists.
        #[allow(unsafe_code)]
        unsafe {
            std::env::set_var("TSS2_LOG", "all+none")
        };
    }
    // Shell completion (COMPLETE=bash|zsh|fish): answered before anything else runs.
    completion::complete_if_asked(|| grammar::command(Cli::command(), "cryptblk"));
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    // Run as `cryptsetup` (a link of that name), cryptblk is its drop-in: messages name
    // it so, and `open` returns once the volume is served, as cryptsetup returns once the
    // mapping exists. Run as `integritysetup`, the same for standalone integrity volumes.
    let name = match argv
        .first()
        .and_then(|a| std::path::Path::new(a).file_name())
        .and_then(|n| n.to_str())
    {
        Some("cryptsetup") => "cryptsetup",
        Some("integritysetup") => "integritysetup",
        _ => "cryptblk",
    };
    if argv
        .first()
        .and_then(|a| std::path::Path::new(a).file_name())
        .is_some_and(|n| n == "cryptblk-generator")
    {
        // systemd's generator for /etc/cryptblktab (see `generator`).
        std::process::exit(generator::main(&argv));
    }
    let dropin = name != "cryptblk";
    let cmd = grammar::command(Cli::command(), name);
    let argv = if name == "integritysetup" {
        grammar::integritysetup_action(grammar::normalize(
            &cmd,
            grammar::integritysetup_spelling(argv),
        ))
    } else {
        grammar::normalize(&cmd, argv)
    };
    let matches = cmd.clone().get_matches_from(argv);
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    let ctx = ctx::Ctx {
        batch: cli.batch_mode,
        verbose: cli.verbose || cli.compat.debug,
        dropin,
        program: name,
        devices: cryptblk_storage::Devices {
            rbd: cryptblk_storage::RbdOptions {
                conf: cli.ceph_conf.clone(),
                id: cli.ceph_id.clone(),
                read_only: false,
            },
            shared_local: false,
        },
        tries: cli.compat.tries.unwrap_or(3),
        tries_given: cli.compat.tries.is_some(),
    };
    // Every command that can hold a passphrase or a volume key (all but the benchmark
    // harness, which must be able to trace its peers) is neither dumpable nor ptraceable
    // by other processes of the same user. execve resets the flag, so a `--daemon` child
    // sets it again itself.
    if !matches!(cli.command, Command::Bench(_)) {
        process::set_not_dumpable();
    }
    // cryptsetup's last word with --verbose, "Command successful." or the failure's code
    // and kind; not where standard output carries data or a daemon's readiness.
    let last_word = ctx.verbose
        && !matches!(
            &cli.command,
            Command::Export(_) | Command::Bench(_) | Command::Benchmark(_)
        )
        && !matches!(&cli.command, Command::Open(a) if a.daemon_child);
    let result = match cli.command {
        Command::Format(a) => commands::format::format(&ctx, a),
        Command::Dump(a) => commands::dump::dump(&ctx, a),
        Command::AddKey(a) => commands::keyslots::add_key(&ctx, a),
        Command::RemoveKey(a) => commands::keyslots::remove_key(&ctx, a),
        Command::ChangeKey(a) => commands::keyslots::change_key(&ctx, a),
        Command::KillSlot(a) => commands::keyslots::kill_slot(&ctx, a),
        Command::ConvertKey(a) => commands::keyslots::convert_key(&ctx, a),
        Command::TestPassphrase(a) => commands::keyslots::test_passphrase(&ctx, a),
        Command::Uuid(a) => commands::header::uuid(&ctx, a),
        Command::IsLuks(a) => commands::header::is_luks(&ctx, a),
        Command::Reencrypt(a) => commands::reencrypt::reencrypt(&ctx, a),
        Command::Config(a) => commands::header::config(&ctx, a),
        Command::Convert(a) => commands::convert::convert(&ctx, a),
        Command::Erase(a) => commands::header::erase(&ctx, a),
        Command::Repair(a) => commands::header::repair(&ctx, a),
        Command::Token(a) => commands::token::token(&ctx, a),
        Command::Enroll(a) => commands::enroll::enroll(&ctx, a),
        Command::HeaderBackup(a) => commands::header::header_backup(&ctx, a),
        Command::HeaderRestore(a) => commands::header::header_restore(&ctx, a),
        Command::Benchmark(a) => commands::benchmark::run(&ctx, a),
        Command::Bench(a) => commands::bench::run(a),
        Command::Open(a) => frontend::open(&ctx, *a),
        Command::Close(a) => commands::served::close(&ctx, a),
        Command::AttachAll(a) => commands::crypttab::attach_all(&ctx, a),
        Command::DetachAll(a) => commands::crypttab::detach_all(&ctx, a),
        Command::Suspend(a) => commands::served::suspend(&ctx, a),
        Command::Resize(a) => commands::served::resize(&ctx, a),
        Command::Resume(a) => commands::served::resume(&ctx, a),
        Command::Status(a) => commands::served::status(&ctx, a),
        Command::List(a) => commands::served::list(&ctx, a),
        Command::Export(a) => commands::transfer::export(&ctx, a),
        Command::Import(a) => commands::transfer::import(&ctx, a),
        Command::GenerateMan { dir } => {
            man::write_all(grammar::command(Cli::command(), "cryptblk"), &dir)
                .map_err(|e| error::io_err(&dir, e))
        }
    };
    match result {
        Ok(()) => {
            if last_word {
                outln!("Command successful.");
            }
            std::process::exit(error::EXIT_OK)
        }
        Err(e) => {
            if !e.message.is_empty() {
                eprintln!("{}", e.message);
            }
            if last_word {
                let kind = match e.code {
                    error::EXIT_USAGE => "wrong or missing parameters",
                    error::EXIT_PERMISSION => "no permission or bad passphrase",
                    error::EXIT_NO_MEMORY => "out of memory",
                    error::EXIT_NO_DEVICE => "wrong device or file specified",
                    error::EXIT_BUSY => "device already exists or device is busy",
                    _ => "unknown error",
                };
                eprintln!("Command failed with code {} ({kind}).", -e.code);
            }
            std::process::exit(e.code);
        }
    }
}
