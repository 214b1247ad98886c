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
    let mut raw = Vec::new();
    let limit = size.unwrap_or(KEYFILE_MAX) as u64 + offset;
    let res = if path == Path::new("-") {
        std::io::stdin()
            .lock()
            .take(limit + 1)
            .read_to_end(&mut raw)
    } else {
        std::fs::File::open(path)
            .map_err(|e| io_err(path, e))?
            .take(limit + 1)
            .read_to_end(&mut raw)
    };
    let mut raw = SecretBytes::from_vec(raw);
    res.map_err(|e| io_err(path, e))?;
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
    let mut line = Vec::new();
    let stdin = std::io::stdin();
    let mut lock = stdin.lock();
    let mut byte = [0u8; 1];
    loop {
        match lock.read(&mut byte) {
            Ok(0) => break,
            Ok(_) if byte[0] == b'\n' => break,
            Ok(_) => line.push(byte[0]),
            Err(e) => {
                return Err(CliError::usage(format!(
                    "reading passphrase from stdin: {e}"
                )));
            }
        }
        if line.len() > PASSPHRASE_MAX {
            return Err(CliError::usage("passphrase on stdin is too long"));
        }
    }
    Ok(SecretBytes::from_vec(line))
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
