//! `cryptblk reencrypt`: cryptsetup's LUKS2 reencryption. Offline on an image file or a
//! block device nobody holds open; online when the volume is served by cryptblk (the job
//! is handed to the serving process over its control socket, and clients go on reading
//! and writing). Metadata and resilience data are cryptsetup's, so either tool resumes
//! (or recovers) what the other started.

pub(crate) mod online;

use crate::args::{HeaderArgs, KdfArgs, KeyArgs};
use crate::commands::open_header;
use crate::ctx::Ctx;
use crate::error::{CliError, CliResult, EXIT_PERMISSION, io_err};
use crate::passphrase::get_passphrase;
use clap::Args;
use cryptblk_crypto::{CipherSpec, HashAlg};
use cryptblk_format::LuksHeader;
use cryptblk_format::luks2::{Luks2Header, ReencryptOutcome, ReencryptRequest, ResilienceRequest};
use cryptblk_volume::DataDevice;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

#[derive(Args, Debug)]
pub(crate) struct ReencryptArgs {
    /// The LUKS2 device or image file.
    pub device: PathBuf,
    #[command(flatten)]
    pub key: KeyArgs,
    /// Reencrypting a LUKS2 volume: its passphrase from a token (--token-id,
    /// --token-type, --token-only); the token follows the new keyslot.
    #[command(flatten)]
    pub tokens: crate::tokens::TokenArgs,
    #[command(flatten)]
    pub header: HeaderArgs,
    #[command(flatten)]
    pub kdf: KdfArgs,
    /// Keyslot whose passphrase is used (the new key gets a keyslot under it too).
    #[arg(short = 'S', long = "key-slot")]
    pub key_slot: Option<u32>,
    /// New data cipher (default: keep the current one).
    #[arg(short = 'c', long)]
    pub cipher: Option<String>,
    /// New volume key size in bits (default: keep the current one).
    #[arg(short = 's', long = "key-size")]
    pub key_size: Option<usize>,
    /// New encryption sector size (default: keep the current one).
    #[arg(long = "sector-size")]
    pub sector_size: Option<u32>,
    /// How a step survives a crash: checksum, journal or none.
    #[arg(long, default_value = "checksum")]
    pub resilience: String,
    /// Hash of the checksum resilience.
    #[arg(long = "resilience-hash", default_value = "sha256")]
    pub resilience_hash: String,
    /// Largest stretch rewritten per step (e.g. 8M).
    #[arg(long = "hotzone-size")]
    pub hotzone_size: Option<String>,
    /// Only write the reencryption metadata; the data is rewritten by a later run.
    #[arg(long = "init-only")]
    pub init_only: bool,
    /// Only continue a reencryption already started.
    #[arg(long = "resume-only")]
    pub resume_only: bool,
    /// Accepted for cryptsetup scripts: cryptblk always works on the device directly.
    #[arg(long = "force-offline-reencrypt")]
    pub force_offline: bool,
    /// Encrypt a plaintext device in place: with a detached `--header FILE`, or with the
    /// header at the head of the device (`--reduce-device-size`).
    #[arg(long)]
    pub encrypt: bool,
    /// Decrypt the device to plaintext (detached header).
    #[arg(long)]
    pub decrypt: bool,
    /// With `--encrypt`: the device loses this much (the filesystem on it must be shrunk
    /// first); half holds the header, half a copy of the data's start while the job runs
    /// (cryptsetup's data shift; e.g. 32M).
    #[arg(long = "reduce-device-size")]
    pub reduce_device_size: Option<String>,
    /// luks2 (or luks): the only type reencrypt writes; cryptsetup's scripts say so
    /// with `--encrypt --type luks2`. LUKS1 reencryption is refused.
    #[arg(long = "type", value_enum)]
    pub kind: Option<cryptblk_volume::VolumeType>,
    /// The served volume to reencrypt online (default: the one serving DEVICE, if any).
    #[arg(long = "active-name")]
    pub active_name: Option<String>,
    /// Run directory of the served volume (as given to `open`).
    #[arg(long = "run-dir")]
    pub run_dir: Option<PathBuf>,
}

/// A reencrypt command's request, checked: what the offline run and a serving process's
/// online run both start from.
pub(crate) struct Job {
    /// `--decrypt`: the final layout is plaintext.
    pub decrypt: bool,
    /// `--reduce-device-size`: bytes the data moves up (a key change) or the header takes
    /// with a copy of the data's start (`--encrypt`).
    pub reduce: Option<u64>,
    pub req: ReencryptRequest,
    pub hotzone: Option<u64>,
    pub slot: Option<u32>,
    pub init_only: bool,
    pub resume_only: bool,
}

impl Job {
    pub(crate) fn of(a: &ReencryptArgs) -> CliResult<Job> {
        let reduce = a
            .reduce_device_size
            .as_deref()
            .map(parse_bytes)
            .transpose()?;
        let detached = a.header.header.is_some();
        if reduce.is_some() && (a.decrypt || (a.encrypt && detached)) {
            return Err(CliError::usage(
                "--reduce-device-size goes with a key change or with --encrypt and the \
                 header on the device (a data shift with --decrypt, or with --encrypt and a \
                 detached --header, is not supported; cryptsetup's jobs of that kind open \
                 in cryptblk, and cryptblk recovers their interrupted steps)",
            ));
        }
        if reduce.is_some_and(|r| r > cryptblk_format::luks2::MAX_REDUCE) {
            return Err(CliError::usage("Maximum device reduce size is 1 GiB."));
        }
        if a.encrypt && !detached && reduce.is_none() {
            return Err(CliError::usage(
                "Encryption without detached header (--header) is not possible without data \
                 device size reduction (--reduce-device-size).",
            ));
        }
        if a.decrypt && !detached {
            return Err(CliError::usage(
                "LUKS2 decryption needs --header: the header file of a detached header, or a \
                 new file to move the header on the device to (its data then moves to the \
                 head of the device).",
            ));
        }
        if a.encrypt && a.decrypt {
            return Err(CliError::usage(
                "--encrypt and --decrypt exclude each other",
            ));
        }
        if a.init_only && a.resume_only {
            return Err(CliError::usage(
                "--init-only and --resume-only exclude each other",
            ));
        }
        Ok(Job {
            decrypt: a.decrypt,
            reduce,
            req: request(a)?,
            hotzone: a.hotzone_size.as_deref().map(parse_bytes).transpose()?,
            slot: a.key_slot,
            init_only: a.init_only,
            resume_only: a.resume_only,
        })
    }

    /// Writes the reencryption metadata unless a job is in progress, as --init-only and
    /// --resume-only say. Returns whether steps are to run.
    pub(crate) fn init(
        &self,
        hdr: &mut Luks2Header,
        hdev: &mut dyn cryptblk_format::Storage,
        data_size: u64,
        pass: &[u8],
        verbose: bool,
    ) -> CliResult<bool> {
        let started = hdr.in_reencryption();
        if self.resume_only && !started {
            return Err(CliError::usage("Device reencryption not in progress."));
        }
        if started && self.init_only {
            return Err(CliError::usage(
                "a reencryption is already in progress (resume it with --resume-only)",
            ));
        }
        if !started && self.decrypt {
            hdr.decrypt_init(hdev, data_size, pass, self.slot, &self.req)
                .map_err(wrong_passphrase)?;
        } else if !started {
            let slot = match self.reduce {
                Some(shift) => {
                    hdr.reencrypt_shift_init(hdev, data_size, pass, self.slot, &self.req, shift)
                }
                None => hdr.reencrypt_init(hdev, data_size, pass, self.slot, &self.req),
            }
            .map_err(wrong_passphrase)?;
            if verbose {
                eprintln!("New volume key in key slot {slot}.");
            }
        }
        Ok(!self.init_only)
    }
}

/// The options a served volume needs to run the job, as sent over its control socket
/// (with the passphrase, hex, added by the caller).
pub(crate) fn to_wire(a: &ReencryptArgs) -> serde_json::Value {
    serde_json::json!({
        "key_slot": a.key_slot, "cipher": a.cipher, "key_size": a.key_size,
        "sector_size": a.sector_size, "resilience": a.resilience,
        "resilience_hash": a.resilience_hash, "hotzone_size": a.hotzone_size,
        "init_only": a.init_only, "resume_only": a.resume_only,
        "pbkdf": a.kdf.pbkdf, "iter_time": a.kdf.iter_time,
        "pbkdf_force_iterations": a.kdf.pbkdf_force_iterations,
        "pbkdf_memory": a.kdf.pbkdf_memory, "pbkdf_parallel": a.kdf.pbkdf_parallel,
        "hash": a.kdf.hash,
    })
}

/// [`to_wire`] read back by the serving process (for its own device).
pub(crate) fn from_wire(v: &serde_json::Value, device: &std::path::Path) -> ReencryptArgs {
    let s = |k: &str| v[k].as_str().map(String::from);
    let n = |k: &str| v[k].as_u64().and_then(|x| u32::try_from(x).ok());
    ReencryptArgs {
        device: device.to_path_buf(),
        key: KeyArgs::default(),
        tokens: crate::tokens::TokenArgs::default(),
        header: HeaderArgs::default(),
        kdf: KdfArgs {
            pbkdf: s("pbkdf"),
            iter_time: n("iter_time"),
            pbkdf_force_iterations: n("pbkdf_force_iterations"),
            pbkdf_memory: n("pbkdf_memory"),
            pbkdf_parallel: n("pbkdf_parallel"),
            hash: s("hash"),
            keyslot_cipher: None,
            keyslot_key_size: None,
        },
        key_slot: n("key_slot"),
        cipher: s("cipher"),
        key_size: v["key_size"].as_u64().map(|x| x as usize),
        sector_size: n("sector_size"),
        resilience: s("resilience").unwrap_or_else(|| "checksum".into()),
        resilience_hash: s("resilience_hash").unwrap_or_else(|| "sha256".into()),
        hotzone_size: s("hotzone_size"),
        init_only: v["init_only"].as_bool().unwrap_or(false),
        resume_only: v["resume_only"].as_bool().unwrap_or(false),
        force_offline: false,
        encrypt: false,
        decrypt: false,
        reduce_device_size: None,
        kind: None,
        active_name: None,
        run_dir: None,
    }
}

fn parse_bytes(s: &str) -> CliResult<u64> {
    Some(crate::units::parse_size(s).map_err(CliError::usage)?)
        .filter(|&n| n > 0 && n.is_multiple_of(512))
        .ok_or_else(|| {
            CliError::usage(format!("bad size '{s}' (a multiple of 512 bytes, e.g. 8M)"))
        })
}

fn request(a: &ReencryptArgs) -> CliResult<ReencryptRequest> {
    let resilience = match a.resilience.as_str() {
        "checksum" => ResilienceRequest::Checksum(HashAlg::from_name(&a.resilience_hash)?),
        "journal" => ResilienceRequest::Journal,
        "none" => ResilienceRequest::None,
        "datashift" if a.reduce_device_size.is_some() => ResilienceRequest::None,
        "datashift" => {
            return Err(CliError::usage(
                "--resilience datashift goes with --reduce-device-size",
            ));
        }
        other => {
            return Err(CliError::usage(format!(
                "unknown --resilience {other} (checksum, journal, none)"
            )));
        }
    };
    let key_len = match a.key_size {
        Some(bits) if bits % 8 != 0 || bits == 0 => {
            return Err(CliError::usage(format!("bad --key-size {bits}")));
        }
        Some(bits) => Some(bits / 8),
        None => None,
    };
    Ok(ReencryptRequest {
        cipher: a.cipher.as_deref().map(CipherSpec::parse).transpose()?,
        key_len,
        sector_size: a.sector_size,
        resilience,
        kdf: crate::commands::kdf_request(&a.kdf, false)?,
        keyslot_encryption: a.kdf.keyslot_encryption()?,
    })
}

pub(crate) fn wrong_passphrase(e: cryptblk_format::Error) -> CliError {
    match e {
        cryptblk_format::Error::WrongPassphrase => {
            CliError::new(EXIT_PERMISSION, "No key available with this passphrase.")
        }
        e => e.into(),
    }
}

/// Whether the progress line is printed: with -v always; else not with --batch-mode, and as
/// cryptblk only where stderr is a terminal (as the other commands' progress); as the
/// cryptsetup drop-in wherever cryptsetup prints it, for the scripts that read it.
pub(crate) fn progress_shown(ctx: &Ctx) -> bool {
    use std::io::IsTerminal;
    ctx.verbose || (!ctx.batch && (ctx.dropin || std::io::stderr().is_terminal()))
}

/// cryptsetup's progress line: percent, ETA, bytes written, speed.
pub(crate) fn show_progress(start: Instant, first: u64, done: u64, total: u64) {
    let secs = start.elapsed().as_secs_f64().max(1e-3);
    let rate = (done - first) as f64 / secs;
    let eta = if rate > 0.0 {
        ((total - done) as f64 / rate) as u64
    } else {
        0
    };
    eprint!(
        "\rProgress: {:5.1}%, ETA {:02}:{:02}, {} MiB written, speed {:.1} MiB/s",
        done as f64 * 100.0 / total.max(1) as f64,
        eta / 60,
        eta % 60,
        (done - first) >> 20,
        rate / (1 << 20) as f64
    );
}

pub(crate) fn reencrypt(ctx: &Ctx, a: ReencryptArgs) -> CliResult<()> {
    use cryptblk_volume::VolumeType;
    if let Some(k) = a.kind
        && !matches!(k, VolumeType::Luks | VolumeType::Luks2)
    {
        return Err(CliError::usage(format!(
            "reencrypt writes LUKS2 only, not --type {k} (cryptsetup's LUKS1 reencryption is not supported)"
        )));
    }
    let job = Job::of(&a)?;
    if let Some(name) = &a.active_name {
        return crate::commands::reencrypt::online::reencrypt_served(ctx, &a, &job, name);
    }
    // The data device is locked exclusively: a volume being served is reencrypted by the
    // process serving it, never behind its back.
    let data = match ctx.volume_devices().open(&a.device, false) {
        Ok(f) => f,
        Err(cryptblk_volume::Error::Busy(what)) => {
            return match crate::commands::reencrypt::online::served_name(&a.device, &a.run_dir)? {
                Some(name) => {
                    crate::commands::reencrypt::online::reencrypt_served(ctx, &a, &job, &name)
                }
                None => Err(CliError::new(
                    crate::error::EXIT_BUSY,
                    format!(
                        "{what} is in use by another process (no volume this user serves with \
                         cryptblk; with --active-name NAME it is reencrypted online)"
                    ),
                )),
            };
        }
        Err(e) => return Err(CliError::new(crate::error::EXIT_BUSY, e.to_string())),
    };
    let header_path = a.header.header.clone().unwrap_or_else(|| a.device.clone());
    let new_encryption = a.encrypt
        && !job.resume_only
        && !header_path.exists()
        && !cryptblk_storage::is_remote(&header_path);
    let new_shift = a.encrypt && job.reduce.is_some() && !job.resume_only && !holds_luks(&data)?;
    // --decrypt --header NEWFILE of a device holding its header: the header moves to the
    // file, the data to the head of the device (cryptsetup's decryption with datashift).
    let header_moves = a.decrypt
        && !job.resume_only
        && a.header.header.as_ref().is_some_and(|h| !h.exists())
        && holds_luks(&data)?;
    let storage: Box<dyn cryptblk_format::Storage> = match &data {
        DataDevice::File(f) => Box::new(
            cryptblk_volume::FileStorage::new(f.try_clone().map_err(|e| io_err(&a.device, e))?)
                .map_err(|e| io_err(&a.device, e))?,
        ),
        DataDevice::Remote(_) => Box::new(data.clone()),
    };
    let data_size = storage.size().map_err(|e| io_err(&a.device, e))?;
    let (mut hdev, mut hdr, pass) = if header_moves {
        let path = a.header.header.as_deref().expect("checked above");
        let pass = get_passphrase(&a.key.source(), "Enter passphrase for key slot: ", false)?;
        let (f, h) = decrypt_shift_init(&data, data_size, path, &pass, &job, ctx.batch)?;
        (DataDevice::File(Arc::new(f)), h, pass)
    } else if new_shift {
        let pass = get_passphrase(&a.key.source(), "Enter passphrase: ", true)?;
        let mut f = data.clone();
        let reduce = job.reduce.unwrap_or_default();
        let h = Luks2Header::encrypt_shift_init(&mut f, reduce, &pass, &job.req)?;
        (f, h, pass)
    } else if new_encryption {
        let pass = get_passphrase(&a.key.source(), "Enter passphrase: ", true)?;
        let (f, h) = encrypt_init(&header_path, data_size, &pass, &job)?;
        (DataDevice::File(Arc::new(f)), h, pass)
    } else {
        let mut hdev = match &a.header.header {
            Some(_) => open_header(ctx, &a.device, &a.header, true)?,
            None => data.clone(),
        };
        let mut hdr = read_luks2(&mut hdev, &header_path)?;
        if (job.resume_only || a.encrypt) && !hdr.in_reencryption() {
            return Err(CliError::usage(if job.reduce.is_some() {
                "the device already holds a LUKS header and no encryption in progress: it is \
                 encrypted already"
            } else if a.encrypt {
                "the --header file exists and holds no encryption in progress: give a new \
                 file name"
            } else {
                "Device reencryption not in progress."
            }));
        }
        let pass = super::passphrase_or_token(
            &hdr,
            &mut hdev,
            &a.key,
            &a.tokens,
            "Enter passphrase for key slot: ",
        )?;
        if !job.init(&mut hdr, &mut hdev, data_size, &pass, ctx.verbose)? {
            return Ok(());
        }
        (hdev, hdr, pass)
    };
    if job.init_only {
        return Ok(());
    }
    let hotzone = job.hotzone;
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, stop.clone()).map_err(|e| io_err(&a.device, e))?;
    }
    let start = Instant::now();
    let mut first = None;
    let outcome = hdr
        .reencrypt_run(
            &mut hdev,
            &*storage,
            data_size,
            &pass,
            job.slot,
            hotzone,
            &|| stop.load(Ordering::Relaxed),
            &mut |done, total| {
                let f = *first.get_or_insert(0);
                if progress_shown(ctx) {
                    show_progress(start, f, done, total);
                }
            },
        )
        .map_err(wrong_passphrase)?;
    if progress_shown(ctx) {
        eprintln!();
    }
    finished(ctx, outcome, &hdr)
}

/// `--encrypt --header FILE`: creates the header file (0600, never over an existing file
/// or through a link) and writes a new LUKS2 header whose metadata starts the encryption.
fn encrypt_init(
    path: &std::path::Path,
    data_size: u64,
    pass: &[u8],
    job: &Job,
) -> CliResult<(std::fs::File, Luks2Header)> {
    let mut f = create_header_file(path)?;
    // cryptsetup's detached header: 16 MiB (metadata and keyslots area).
    let made = f
        .set_len(16 << 20)
        .map_err(|e| io_err(path, e))
        .and_then(|()| {
            Luks2Header::encrypt_init(&mut f, data_size, pass, &job.req).map_err(CliError::from)
        });
    match made {
        Ok(h) => Ok((f, h)),
        Err(e) => {
            let _ = std::fs::remove_file(path);
            Err(e)
        }
    }
}

/// `--decrypt --header FILE` of a device with its header on it: after cryptsetup's
/// question, the header is moved to FILE (created 0600, never over an existing file or
/// through a link) and the decryption's metadata written there. On a failure before that
/// metadata is committed the file holds the untouched header and is kept, as cryptsetup
/// keeps it, and the message says so.
fn decrypt_shift_init(
    data: &DataDevice,
    data_size: u64,
    path: &std::path::Path,
    pass: &[u8],
    job: &Job,
    batch: bool,
) -> CliResult<(std::fs::File, Luks2Header)> {
    crate::passphrase::confirm(
        batch,
        &format!(
            "Header file {} does not exist. Do you want to initialize LUKS2 decryption of \
             this device and export LUKS2 header to file {}?",
            path.display(),
            path.display()
        ),
    )?;
    let mut dev = data.clone();
    let hdr = Luks2Header::read(&mut dev)?;
    let mut f = create_header_file(path)?;
    match hdr.decrypt_shift_init(
        &mut dev,
        data_size,
        &mut f,
        pass,
        job.slot,
        job.hotzone,
        &job.req,
    ) {
        Ok(h) => Ok((f, h)),
        Err(e) => {
            // Nothing but the copy was written unless the device's header is gone: then
            // the file is the only header left.
            let mut probe = data.clone();
            if cryptblk_format::load_header(&mut probe).is_ok() {
                let _ = std::fs::remove_file(path);
                Err(wrong_passphrase(e))
            } else {
                Err(CliError::usage(format!(
                    "{}\nReencryption initialization failed. Header backup is available in {}.",
                    wrong_passphrase(e),
                    path.display()
                )))
            }
        }
    }
}

/// A new header file: 0600, never over an existing file or through a link.
fn create_header_file(path: &std::path::Path) -> CliResult<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(|e| io_err(path, e))
}

/// Whether `data` starts with a LUKS header (either version, either copy).
fn holds_luks(data: &DataDevice) -> CliResult<bool> {
    let mut f = data.clone();
    match cryptblk_format::load_header(&mut f) {
        Ok(_) => Ok(true),
        Err(cryptblk_format::Error::NotLuks) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// The header of `path` as LUKS2, or cryptsetup's message.
pub(crate) fn read_luks2(
    hdev: &mut dyn cryptblk_format::Storage,
    path: &std::path::Path,
) -> CliResult<Luks2Header> {
    match Luks2Header::read(hdev) {
        Ok(h) => Ok(h),
        Err(cryptblk_format::Error::NotLuks) => Err(CliError::usage(format!(
            "Device {} is not a valid LUKS device.",
            path.display()
        ))),
        Err(e) => Err(e.into()),
    }
}

/// How a run ended, as the command's result.
pub(crate) fn finished(ctx: &Ctx, outcome: ReencryptOutcome, hdr: &Luks2Header) -> CliResult<()> {
    match outcome {
        ReencryptOutcome::Finished => {
            if ctx.verbose {
                eprintln!(
                    "Reencryption finished: {} bits {}.",
                    hdr.key_len() * 8,
                    hdr.cipher()
                );
            }
            Ok(())
        }
        ReencryptOutcome::Stopped => Err(CliError::new(
            crate::error::EXIT_USAGE,
            "Reencryption interrupted; resume it with `reencrypt --resume-only`.",
        )),
    }
}
