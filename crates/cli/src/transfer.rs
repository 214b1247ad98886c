//! `export` / `import`: plaintext of a volume to or from a file, without root or a kernel
//! mapping (recovery, scripting, and the dm-crypt interop tests).

use crate::commands::Ctx;
use crate::error::{CliError, CliResult, EXIT_BUSY, EXIT_PERMISSION, io_err};
use crate::passphrase::get_passphrase;
use crate::{HeaderArgs, KeyArgs};
use clap::Args;
use cryptblk_device::BlockDevice;
use cryptblk_volume::{OpenOptions, Volume, unlock_luks};
use std::io::{Read, Write};
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct TransferArgs {
    pub device: PathBuf,
    /// File to write (export) or read (import); "-" for stdout/stdin.
    pub file: PathBuf,
    #[command(flatten)]
    pub header: HeaderArgs,
    #[command(flatten)]
    pub key: KeyArgs,
    #[arg(short = 'S', long = "key-slot")]
    pub key_slot: Option<u32>,
    /// Byte offset within the plaintext volume.
    #[arg(long = "at", default_value_t = 0)]
    pub at: u64,
    /// Bytes to export (default: to the end of the volume).
    #[arg(long)]
    pub length: Option<u64>,
}

fn open(a: &TransferArgs, read_only: bool) -> CliResult<Volume> {
    let pass = get_passphrase(&a.key.source(), &format!("Enter passphrase for {}: ", a.device.display()), false)?;
    let opts = OpenOptions { header: a.header.header.clone(), read_only, allow_discards: false, key_slot: a.key_slot };
    unlock_luks(&a.device, &opts, &pass).map(|u| u.volume).map_err(|e| match e {
        cryptblk_volume::Error::Format(cryptblk_format::Error::WrongPassphrase) => {
            CliError::new(EXIT_PERMISSION, "No key available with this passphrase.")
        }
        cryptblk_volume::Error::Busy(s) => CliError::new(EXIT_BUSY, format!("{s} is in use by another process")),
        cryptblk_volume::Error::Io(e) => io_err(&a.device, e),
        e => CliError::usage(e.to_string()),
    })
}

const CHUNK: usize = 1 << 20;

pub fn export(_ctx: &Ctx, a: TransferArgs) -> CliResult<()> {
    let vol = open(&a, true)?;
    let end = match a.length {
        Some(n) => a.at.checked_add(n).filter(|&e| e <= vol.size()).ok_or_else(|| CliError::usage("range past the end of the volume"))?,
        None => vol.size(),
    };
    let mut out: Box<dyn Write> = if a.file.as_os_str() == "-" {
        Box::new(std::io::stdout().lock())
    } else {
        Box::new(std::fs::File::create(&a.file).map_err(|e| io_err(&a.file, e))?)
    };
    let mut buf = vec![0u8; CHUNK];
    let mut pos = a.at;
    while pos < end {
        let n = ((end - pos) as usize).min(CHUNK);
        vol.read_at(&mut buf[..n], pos).map_err(|e| io_err(&a.device, e))?;
        out.write_all(&buf[..n]).map_err(|e| io_err(&a.file, e))?;
        pos += n as u64;
    }
    out.flush().map_err(|e| io_err(&a.file, e))
}

pub fn import(_ctx: &Ctx, a: TransferArgs) -> CliResult<()> {
    let vol = open(&a, false)?;
    let mut input: Box<dyn Read> = if a.file.as_os_str() == "-" {
        Box::new(std::io::stdin().lock())
    } else {
        Box::new(std::fs::File::open(&a.file).map_err(|e| io_err(&a.file, e))?)
    };
    let mut buf = vec![0u8; CHUNK];
    let mut pos = a.at;
    loop {
        let mut n = 0;
        while n < CHUNK {
            match input.read(&mut buf[n..]) {
                Ok(0) => break,
                Ok(k) => n += k,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(io_err(&a.file, e)),
            }
        }
        if n == 0 {
            break;
        }
        if pos + n as u64 > vol.size() {
            return Err(CliError::usage(format!("input does not fit: the volume has {} bytes", vol.size())));
        }
        vol.write_at_mut(&mut buf[..n], pos, false).map_err(|e| io_err(&a.device, e))?;
        pos += n as u64;
    }
    vol.flush().map_err(|e| io_err(&a.device, e))
}
