//! Where passphrases come from: a key file, standard input, or the terminal (no echo).
//! Never from the command line.

use crate::error::{CliError, CliResult, EXIT_USAGE, io_err};
use cryptblk_crypto::SecretBytes;
use std::io::{IsTerminal, Read};
use std::path::{Path, PathBuf};

/// cryptsetup's default maximum key file size (8 MiB).
pub const KEYFILE_MAX: usize = 8 << 20;
/// cryptsetup's maximum interactive passphrase length.
pub const PASSPHRASE_MAX: usize = 512;

/// `--key-file`, `--keyfile-size`, `--keyfile-offset`.
#[derive(Debug, Clone, Default)]
pub struct KeySource {
    pub key_file: Option<PathBuf>,
    pub keyfile_size: Option<usize>,
    pub keyfile_offset: u64,
}

/// Reads a key file (`-` = standard input): `size` bytes after `offset`, or all of it.
pub fn read_key_file(path: &Path, offset: u64, size: Option<usize>) -> CliResult<SecretBytes> {
    let limit = size.unwrap_or(KEYFILE_MAX) as u64 + offset;
    let mut file = if path == Path::new("-") {
        unbuffered_stdin().map_err(|e| io_err(path, e))?
    } else {
        std::fs::File::open(path).map_err(|e| io_err(path, e))?
    };
    let mut raw = read_secret(&mut file, (limit + 1) as usize).map_err(|e| io_err(path, e))?;
    let start = (offset as usize).min(raw.len());
    let avail = &mut raw[start..];
    let key = match size {
        Some(n) if avail.len() < n => {
            return Err(CliError::usage(format!(
                "key file {} is shorter than the requested {n} bytes",
                path.display()
            )));
        }
        Some(n) => SecretBytes::from_slice(&avail[..n]),
        None if avail.len() as u64 > KEYFILE_MAX as u64 => {
            return Err(CliError::usage(format!(
                "key file {} is larger than {KEYFILE_MAX} bytes (use --keyfile-size)",
                path.display()
            )));
        }
        None => SecretBytes::from_slice(avail),
    };
    if key.is_empty() {
        return Err(CliError::usage(format!(
            "key file {} is empty",
            path.display()
        )));
    }
    Ok(key)
}

/// One line of standard input without its newline (how cryptsetup reads a piped passphrase).
fn read_stdin_line() -> CliResult<SecretBytes> {
    let err = |e: std::io::Error| CliError::usage(format!("reading passphrase from stdin: {e}"));
    // Unbuffered, one byte at a time, straight into locked memory: no copy of the
    // passphrase is left in a stdin buffer or in a grown-and-freed vector.
    let mut stdin = unbuffered_stdin().map_err(err)?;
    let mut line = SecretBytes::zeroed(PASSPHRASE_MAX + 1);
    let mut n = 0;
    loop {
        match stdin.read(&mut line[n..n + 1]) {
            Ok(0) => break,
            Ok(_) if line[n] == b'\n' => {
                line[n] = 0;
                break;
            }
            Ok(_) => n += 1,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(err(e)),
        }
        if n > PASSPHRASE_MAX {
            return Err(CliError::usage("passphrase on stdin is too long"));
        }
    }
    Ok(SecretBytes::from_slice(&line[..n]))
}

/// Standard input without the process-wide buffer of `std::io::stdin()` (which would keep
/// a copy of whatever secret went through it).
fn unbuffered_stdin() -> std::io::Result<std::fs::File> {
    use std::os::fd::AsFd;
    Ok(std::fs::File::from(
        std::io::stdin().as_fd().try_clone_to_owned()?,
    ))
}

/// Reads until EOF or `limit` bytes into locked memory; when the buffer must grow, the
/// old one is wiped (a `Vec` would leave copies behind in freed memory).
fn read_secret(r: &mut impl Read, limit: usize) -> std::io::Result<SecretBytes> {
    let mut buf = SecretBytes::zeroed(limit.min(4096));
    let mut n = 0;
    loop {
        if n == buf.len() {
            if n == limit {
                break;
            }
            let mut bigger = SecretBytes::zeroed((n * 2).min(limit));
            bigger[..n].copy_from_slice(&buf[..n]);
            buf = bigger;
        }
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(SecretBytes::from_slice(&buf[..n]))
}

fn prompt_tty(prompt: &str) -> CliResult<SecretBytes> {
    let s = rpassword::prompt_password(prompt)
        .map_err(|e| CliError::usage(format!("cannot read passphrase from the terminal: {e}")))?;
    Ok(SecretBytes::from_vec(s.into_bytes()))
}

/// A passphrase: from the key file if given, else a line of stdin when stdin is not a
/// terminal, else the terminal (asked twice when `verify`).
pub fn get_passphrase(src: &KeySource, prompt: &str, verify: bool) -> CliResult<SecretBytes> {
    if let Some(path) = &src.key_file {
        return read_key_file(path, src.keyfile_offset, src.keyfile_size);
    }
    let pass = if !std::io::stdin().is_terminal() {
        read_stdin_line()?
    } else {
        let p = prompt_tty(prompt)?;
        if verify {
            let again = prompt_tty("Verify passphrase: ")?;
            if p != again {
                return Err(CliError::usage("Passphrases do not match."));
            }
        }
        p
    };
    if pass.is_empty() {
        return Err(CliError::new(EXIT_USAGE, "empty passphrase"));
    }
    Ok(pass)
}

/// Asks for "YES" on the terminal before a destructive action, unless `batch`.
pub fn confirm(batch: bool, question: &str) -> CliResult<()> {
    if batch {
        return Ok(());
    }
    use std::io::{BufRead, Write};
    let tty = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/tty")
        .map_err(|_| {
            CliError::usage(format!(
                "{question}\nNo terminal to confirm on: pass --batch-mode to proceed."
            ))
        })?;
    let mut w = &tty;
    write!(
        w,
        "\nWARNING!\n========\n{question}\n\nAre you sure? (Type 'yes' in capital letters): "
    )
    .and_then(|_| w.flush())
    .map_err(|e| CliError::usage(e.to_string()))?;
    let mut answer = String::new();
    std::io::BufReader::new(&tty)
        .read_line(&mut answer)
        .map_err(|e| CliError::usage(e.to_string()))?;
    if answer.trim_end() == "YES" {
        Ok(())
    } else {
        Err(CliError::usage("Operation aborted."))
    }
}
