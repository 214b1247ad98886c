//! `cryptblk`: cryptsetup's LUKS commands and dm-crypt's data path, in userspace.
//! The work is done by the library crates; this binary parses arguments and prints.

mod bench;
mod benchmark;
mod commands;
mod ctx;
mod dump;
mod error;
mod frontend;
mod luksdump;
mod online;
mod passphrase;
mod process;
mod reencrypt;
mod rundir;
mod serve;
mod token;
mod transfer;
mod units;
mod unlock;

use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;

#[derive(Parser, Debug)]
#[command(
    name = "cryptblk",
    version,
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
    #[command(subcommand)]
    command: Command,
}

/// Options that say where the key or passphrase comes from.
#[derive(Args, Debug, Clone, Default)]
pub struct KeyArgs {
    /// Read the passphrase from this file ("-" for standard input) instead of asking.
    /// TrueCrypt/VeraCrypt (--type tcrypt): keyfiles, repeatable; the passphrase is asked.
    #[arg(short = 'd', long = "key-file", action = clap::ArgAction::Append)]
    pub key_files: Vec<PathBuf>,
    /// Bytes to read from the key file.
    #[arg(short = 'l', long = "keyfile-size")]
    pub keyfile_size: Option<usize>,
    /// Bytes to skip at the start of the key file.
    #[arg(long = "keyfile-offset", default_value_t = 0)]
    pub keyfile_offset: u64,
}

/// Where the LUKS header is.
#[derive(Args, Debug, Clone, Default)]
pub struct HeaderArgs {
    /// Detached header file (the device then holds only data).
    #[arg(long)]
    pub header: Option<PathBuf>,
}

/// KDF cost options (luksFormat / luksAddKey).
#[derive(Args, Debug, Clone, Default)]
pub struct KdfArgs {
    /// pbkdf2, argon2i or argon2id.
    #[arg(long)]
    pub pbkdf: Option<String>,
    /// Target unlock time in milliseconds.
    #[arg(short = 'i', long = "iter-time")]
    pub iter_time: Option<u32>,
    /// Fixed PBKDF2 iterations or Argon2 time cost (no benchmark).
    #[arg(long = "pbkdf-force-iterations")]
    pub pbkdf_force_iterations: Option<u32>,
    /// Argon2 memory cost in KiB.
    #[arg(long = "pbkdf-memory")]
    pub pbkdf_memory: Option<u32>,
    /// Argon2 parallel lanes.
    #[arg(long = "pbkdf-parallel")]
    pub pbkdf_parallel: Option<u32>,
    /// Hash for PBKDF2 and the anti-forensic splitter.
    #[arg(short = 'h', long)]
    pub hash: Option<String>,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Initialise a LUKS1 or LUKS2 volume (cryptsetup luksFormat).
    #[command(alias = "luksFormat")]
    Format(commands::FormatArgs),
    /// Show header information (cryptsetup luksDump).
    #[command(alias = "luksDump")]
    Dump(commands::DumpArgs),
    /// Add a passphrase in a new keyslot (cryptsetup luksAddKey).
    #[command(alias = "luksAddKey")]
    AddKey(commands::AddKeyArgs),
    /// Remove the keyslot a passphrase opens (cryptsetup luksRemoveKey).
    #[command(alias = "luksRemoveKey")]
    RemoveKey(commands::RemoveKeyArgs),
    /// Replace a passphrase (cryptsetup luksChangeKey).
    #[command(alias = "luksChangeKey")]
    ChangeKey(commands::AddKeyArgs),
    /// Wipe one keyslot (cryptsetup luksKillSlot).
    #[command(alias = "luksKillSlot")]
    KillSlot(commands::KillSlotArgs),
    /// Re-protect a LUKS2 keyslot's key with another PBKDF or cost (cryptsetup
    /// luksConvertKey), e.g. PBKDF2 to argon2id.
    #[command(alias = "luksConvertKey")]
    ConvertKey(commands::ConvertKeyArgs),
    /// Check a passphrase without opening (cryptsetup open --test-passphrase).
    TestPassphrase(commands::TestArgs),
    /// Print or set (--uuid) the volume UUID (cryptsetup luksUUID).
    #[command(alias = "luksUUID")]
    Uuid(commands::UuidArgs),
    /// Exit 0 if the device holds a LUKS header (cryptsetup isLuks).
    #[command(alias = "isLuks")]
    IsLuks(commands::DeviceArgs),
    /// Set a LUKS2 volume's label, subsystem or keyslot priority (cryptsetup config).
    Config(commands::ConfigArgs),
    /// Convert a volume between LUKS1 and LUKS2 in place (cryptsetup convert --type).
    #[command(alias = "luksConvert")]
    Convert(commands::ConvertArgs),
    /// Wipe every keyslot: the data can never be decrypted again (cryptsetup erase).
    #[command(alias = "luksErase")]
    Erase(commands::DeviceArgs),
    /// Manage LUKS2 tokens: add, remove, import, export, unassign (cryptsetup token).
    Token(token::TokenArgs),
    /// Change the volume key of a LUKS2 volume, resumably (cryptsetup reencrypt).
    Reencrypt(reencrypt::ReencryptArgs),
    /// Save the header and keyslot areas to a file (cryptsetup luksHeaderBackup).
    #[command(alias = "luksHeaderBackup")]
    HeaderBackup(commands::BackupArgs),
    /// Write a saved header back (cryptsetup luksHeaderRestore).
    #[command(alias = "luksHeaderRestore")]
    HeaderRestore(commands::BackupArgs),
    /// Repair a header (cryptsetup repair): LUKS2's two copies made whole again, an
    /// interrupted reencryption step recovered (its passphrase asked), LUKS1's free
    /// keyslots put back on the standard layout.
    Repair(commands::RepairArgs),
    /// Measure cipher and KDF speed in-process (cryptsetup benchmark).
    Benchmark(benchmark::BenchmarkArgs),
    /// Benchmark block I/O with fio over NBD (and a VM): report.md, raw JSON, charts.
    Bench(bench::BenchArgs),
    /// Unlock a volume and serve it as a block device (NBD, FUSE or ublk).
    #[command(alias = "luksOpen")]
    Open(frontend::OpenArgs),
    /// Stop serving a volume: drain in-flight requests, flush, exit.
    #[command(alias = "luksClose")]
    Close(serve::NameArgs),
    /// Change the size of a served volume, e.g. after its device grew (cryptsetup resize).
    Resize(serve::ResizeArgs),
    /// Wipe a served volume's keys from memory and hold its I/O (cryptsetup luksSuspend).
    #[command(alias = "luksSuspend")]
    Suspend(serve::NameArgs),
    /// Unlock a suspended volume again; its held I/O goes on (cryptsetup luksResume).
    #[command(alias = "luksResume")]
    Resume(serve::ResumeArgs),
    /// Show an open volume (cryptsetup status).
    Status(serve::NameArgs),
    /// List open volumes.
    List(serve::ListArgs),
    /// Decrypt the volume's plaintext to a file or stdout.
    Export(transfer::TransferArgs),
    /// Encrypt a file or stdin into the volume at an offset.
    Import(transfer::TransferArgs),
}

fn main() {
    let cli = Cli::parse();
    let ctx = ctx::Ctx {
        batch: cli.batch_mode,
        verbose: cli.verbose,
        devices: cryptblk_storage::Devices {
            rbd: cryptblk_storage::RbdOptions {
                conf: cli.ceph_conf.clone(),
                id: cli.ceph_id.clone(),
                read_only: false,
            },
        },
    };
    // Every command that can hold a passphrase or a volume key (all but the benchmark
    // harness, which must be able to trace its peers) is neither dumpable nor ptraceable
    // by other processes of the same user. execve resets the flag, so a `--daemon` child
    // sets it again itself.
    if !matches!(cli.command, Command::Bench(_)) {
        process::set_not_dumpable();
    }
    let result = match cli.command {
        Command::Format(a) => commands::format(&ctx, a),
        Command::Dump(a) => dump::dump(&ctx, a),
        Command::AddKey(a) => commands::add_key(&ctx, a),
        Command::RemoveKey(a) => commands::remove_key(&ctx, a),
        Command::ChangeKey(a) => commands::change_key(&ctx, a),
        Command::KillSlot(a) => commands::kill_slot(&ctx, a),
        Command::ConvertKey(a) => commands::convert_key(&ctx, a),
        Command::TestPassphrase(a) => commands::test_passphrase(&ctx, a),
        Command::Uuid(a) => commands::uuid(&ctx, a),
        Command::IsLuks(a) => commands::is_luks(&ctx, a),
        Command::Reencrypt(a) => reencrypt::reencrypt(&ctx, a),
        Command::Config(a) => commands::config(&ctx, a),
        Command::Convert(a) => commands::convert(&ctx, a),
        Command::Erase(a) => commands::erase(&ctx, a),
        Command::Repair(a) => commands::repair(&ctx, a),
        Command::Token(a) => token::token(&ctx, a),
        Command::HeaderBackup(a) => commands::header_backup(&ctx, a),
        Command::HeaderRestore(a) => commands::header_restore(&ctx, a),
        Command::Benchmark(a) => benchmark::run(a),
        Command::Bench(a) => bench::run(a),
        Command::Open(a) => frontend::open(&ctx, a),
        Command::Close(a) => serve::close(&ctx, a),
        Command::Suspend(a) => serve::suspend(&ctx, a),
        Command::Resize(a) => serve::resize(&ctx, a),
        Command::Resume(a) => serve::resume(&ctx, a),
        Command::Status(a) => serve::status(&ctx, a),
        Command::List(a) => serve::list(&ctx, a),
        Command::Export(a) => transfer::export(&ctx, a),
        Command::Import(a) => transfer::import(&ctx, a),
    };
    match result {
        Ok(()) => std::process::exit(error::EXIT_OK),
        Err(e) => {
            if !e.message.is_empty() {
                eprintln!("{}", e.message);
            }
            std::process::exit(e.code);
        }
    }
}
