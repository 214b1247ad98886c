//! `export` / `import`: plaintext of a volume to or from a file, without root or a kernel
//! mapping (recovery, scripting, and the dm-crypt interop tests).

use crate::commands::Ctx;
use crate::error::{CliError, CliResult, io_err};
use crate::unlock::{VolumeArgs, open_volume};
use clap::Args;
use cryptblk_device::BlockDevice;
use cryptblk_volume::Volume;
use std::io::{Read, Write};
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct TransferArgs {
    pub device: PathBuf,
    /// File to write (export) or read (import); "-" for stdout/stdin.
    pub file: PathBuf,
    #[command(flatten)]
    pub vol: VolumeArgs,
    /// Byte offset within the plaintext volume.
    #[arg(long = "at", default_value_t = 0)]
    pub at: u64,
    /// Bytes to export (default: to the end of the volume).
    #[arg(long)]
    pub length: Option<u64>,
}

fn open(ctx: &Ctx, a: &TransferArgs, read_only: bool) -> CliResult<Volume> {
    let mut v = a.vol.clone();
    v.read_only |= read_only;
    let o = open_volume(&a.device, &v)?;
    if ctx.verbose {
        let slot = o
            .info
            .keyslot
            .map(|s| format!(", key slot {s}"))
            .unwrap_or_default();
        eprintln!(
            "{}: {} {}, {} bits{slot}",
            a.device.display(),
            o.info.kind,
            o.volume.with_cipher(|c| c.description()),
            o.info.key_bits
        );
    }
    Ok(o.volume)
}

const CHUNK: usize = 1 << 20;

pub fn export(ctx: &Ctx, a: TransferArgs) -> CliResult<()> {
    let vol = open(ctx, &a, true)?;
    let end = match a.length {
        Some(n) => {
            a.at.checked_add(n)
                .filter(|&e| e <= vol.size())
                .ok_or_else(|| CliError::usage("range past the end of the volume"))?
        }
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
        vol.read_at(&mut buf[..n], pos)
            .map_err(|e| io_err(&a.device, e))?;
        out.write_all(&buf[..n]).map_err(|e| io_err(&a.file, e))?;
        pos += n as u64;
    }
    out.flush().map_err(|e| io_err(&a.file, e))
}

pub fn import(ctx: &Ctx, a: TransferArgs) -> CliResult<()> {
    let vol = open(ctx, &a, false)?;
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
            return Err(CliError::usage(format!(
                "input does not fit: the volume has {} bytes",
                vol.size()
            )));
        }
        vol.write_at_mut(&mut buf[..n], pos, false)
            .map_err(|e| io_err(&a.device, e))?;
        pos += n as u64;
    }
    vol.flush().map_err(|e| io_err(&a.device, e))
}
