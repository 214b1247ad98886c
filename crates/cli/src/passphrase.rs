//! Where passphrases come from: a key file, standard input, or the terminal (no echo).
//! Never from the command line.

use crate::error::{CliError, CliResult, EXIT_USAGE, io_err};
use cryptblk_crypto::SecretBytes;
use std::io::{IsTerminal, Read};
use std::path::{Path, PathBuf};

/// cryptsetup's default maximum key file size (8 MiB).
pub(crate) const KEYFILE_MAX: usize = 8 << 20;
/// cryptsetup's maximum interactive passphrase length.
pub(crate) const PASSPHRASE_MAX: usize = 512;

/// `--key-file`, `--keyfile-size`, `--keyfile-offset`.
#[derive(Debug, Clone, Default)]
pub(crate) struct KeySource {
    pub key_file: Option<PathBuf>,
    /// `--key-file` given more than once (only TCRYPT takes several): refused here.
    pub extra_key_files: usize,
    pub keyfile_size: Option<usize>,
    pub keyfile_offset: u64,
    /// `-y`: a passphrase typed on the terminal is asked twice (ignored for key files and
    /// stdin that is not a terminal, as cryptsetup ignores it).
    pub verify: bool,
    /// `--ask-password`: asked through systemd's password agents rather than stdin.
    pub ask_password: bool,
}

/// Reads a key file (`-` = standard input): `size` bytes after `offset`, or all of it.
/// The skipped bytes are seeked over (a regular file) or read and wiped in small pieces
/// (a pipe), never held whole.
pub(crate) fn read_key_file(
    path: &Path,
    offset: u64,
    size: Option<usize>,
) -> CliResult<SecretBytes> {
    if size.is_some_and(|n| n > KEYFILE_MAX) {
        return Err(CliError::usage(format!(
            "--keyfile-size is larger than the maximum of {KEYFILE_MAX} bytes"
        )));
    }
    // `-l 0` is no limit, as in cryptsetup.
    let size = size.filter(|&n| n > 0);
    let limit = size.unwrap_or(KEYFILE_MAX);
    let mut file = if path == Path::new("-") {
        unbuffered_stdin().map_err(|e| io_err(path, e))?
    } else {
        std::fs::File::open(path).map_err(|e| io_err(path, e))?
    };
    skip_bytes(&mut file, offset).map_err(|e| io_err(path, e))?;
    let raw = read_secret(&mut file, limit + 1).map_err(|e| io_err(path, e))?;
    let key = match size {
        Some(n) if raw.len() < n => {
            return Err(CliError::usage(format!(
                "key file {} is shorter than the requested {n} bytes after offset {offset}",
                path.display()
            )));
        }
        Some(n) => SecretBytes::from_slice(&raw[..n]),
        None if raw.len() > KEYFILE_MAX => {
            return Err(CliError::usage(format!(
                "key file {} is larger than {KEYFILE_MAX} bytes (use --keyfile-size)",
                path.display()
            )));
        }
        None => raw,
    };
    if key.is_empty() {
        return Err(CliError::usage(format!(
            "key file {} is empty{}",
            path.display(),
            if offset > 0 {
                format!(" after offset {offset}")
            } else {
                String::new()
            }
        )));
    }
    Ok(key)
}

/// Moves past the first `n` bytes: a seek where the file allows it, else reads into a
/// small locked buffer that is wiped when dropped.
fn skip_bytes(f: &mut std::fs::File, n: u64) -> std::io::Result<()> {
    use std::io::{Seek, SeekFrom};
    if n == 0 {
        return Ok(());
    }
    let kind = f.metadata()?.file_type();
    if kind.is_file() || std::os::unix::fs::FileTypeExt::is_block_device(&kind) {
        // From where the file is now: stdin redirected from a file may not be at 0. A
        // block device is seeked too, as cryptsetup does: what lies before the key (a
        // disk's unreadable start) is never read.
        let n = i64::try_from(n).map_err(|_| {
            std::io::Error::new(std::io::ErrorKind::InvalidInput, "offset too large")
        })?;
        f.seek(SeekFrom::Current(n))?;
        return Ok(());
    }
    let mut scratch = SecretBytes::zeroed(4096);
    let mut left = n;
    while left > 0 {
        let want = left.min(scratch.len() as u64) as usize;
        match f.read(&mut scratch[..want]) {
            Ok(0) => break, // shorter than the offset: the caller finds nothing after it
            Ok(k) => left -= k as u64,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Standard input after its first `offset` bytes (skipped, never held), up to `limit`
/// bytes, into locked memory: what `--daemon` hands its child when the key file is `-`.
pub(crate) fn read_stdin_key(offset: u64, limit: usize) -> CliResult<SecretBytes> {
    let err = |e| io_err(Path::new("-"), e);
    let mut stdin = unbuffered_stdin().map_err(err)?;
    skip_bytes(&mut stdin, offset).map_err(err)?;
    read_secret(&mut stdin, limit).map_err(err)
}

/// A passphrase piped on standard input, as cryptsetup reads one: up to the first newline
/// (not included) or end of input; with `-l N` (`limit`), exactly N bytes unless a
/// newline comes first, which, as in cryptsetup, is an error then ("Cannot read requested
/// amount of data"). Without a limit, more than 8 MiB is refused.
fn read_stdin_line(limit: Option<usize>) -> CliResult<SecretBytes> {
    let err = |e: std::io::Error| CliError::usage(format!("reading passphrase from stdin: {e}"));
    let (cap, limited) = match limit {
        Some(n) if n > 0 => (n, true),
        _ => (KEYFILE_MAX + 1, false),
    };
    // Unbuffered, one byte at a time (nothing after the newline is consumed), straight
    // into locked memory that is wiped whenever it grows.
    let mut stdin = unbuffered_stdin().map_err(err)?;
    let mut line = SecretBytes::zeroed(cap.min(PASSPHRASE_MAX + 1));
    let mut n = 0;
    while n < cap {
        if n == line.len() {
            let mut bigger = SecretBytes::zeroed((n * 2).min(cap));
            bigger[..n].copy_from_slice(&line[..n]);
            line = bigger;
        }
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
    }
    if !limited && n == cap {
        return Err(CliError::usage(
            "passphrase on stdin is larger than the 8 MiB maximum (use --keyfile-size)",
        ));
    }
    if limited && n != cap {
        return Err(CliError::usage(format!(
            "Cannot read the requested {cap} bytes of passphrase from stdin (--keyfile-size)."
        )));
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

/// A passphrase through systemd's password agents, as systemd-cryptsetup asks for one:
/// `systemd-ask-password` (the console, Plymouth, a `systemd-tty-ask-password-agent` on
/// a terminal, whichever agent answers) prints it on a pipe to us, never in argv.
fn ask_agent(prompt: &str) -> CliResult<SecretBytes> {
    use std::process::{Command, Stdio};
    let mut child = Command::new("systemd-ask-password")
        .args([
            "--timeout=0",
            "--icon=drive-harddisk",
            "--id=cryptblk",
            "--",
        ])
        .arg(prompt.trim_end())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| {
            CliError::usage(format!(
                "--ask-password needs systemd-ask-password (systemd): {e}"
            ))
        })?;
    let mut out = child.stdout.take().expect("piped");
    let read = read_secret(&mut out, PASSPHRASE_MAX + 2);
    drop(out);
    let status = child
        .wait()
        .map_err(|e| CliError::usage(format!("systemd-ask-password: {e}")))?;
    let pass = read.map_err(|e| CliError::usage(format!("systemd-ask-password: {e}")))?;
    if !status.success() {
        return Err(CliError::new(
            EXIT_USAGE,
            "systemd-ask-password gave no passphrase (cancelled, or timed out)",
        ));
    }
    // One line: the passphrase and its newline.
    let n = pass.iter().position(|&b| b == b'\n').unwrap_or(pass.len());
    if n > PASSPHRASE_MAX {
        return Err(CliError::usage("the passphrase is too long"));
    }
    Ok(SecretBytes::from_slice(&pass[..n]))
}

fn prompt_tty(prompt: &str) -> CliResult<SecretBytes> {
    let s = rpassword::prompt_password(prompt)
        .map_err(|e| CliError::usage(format!("cannot read passphrase from the terminal: {e}")))?;
    Ok(SecretBytes::from_vec(s.into_bytes()))
}

/// A passphrase: from the key file if given, else a line of stdin when stdin is not a
/// terminal, else the terminal (asked twice when `verify`).
pub(crate) fn get_passphrase(
    src: &KeySource,
    prompt: &str,
    verify: bool,
) -> CliResult<SecretBytes> {
    let pass = read_passphrase(src, prompt, verify)?;
    if pass.is_empty() {
        return Err(CliError::new(EXIT_USAGE, "empty passphrase"));
    }
    Ok(pass)
}

/// As [`get_passphrase`], an empty one (nothing on stdin) included.
pub(crate) fn read_passphrase(
    src: &KeySource,
    prompt: &str,
    verify: bool,
) -> CliResult<SecretBytes> {
    if src.extra_key_files > 0 {
        return Err(CliError::usage("Only one --key-file argument is allowed."));
    }
    if let Some(path) = &src.key_file {
        return read_key_file(path, src.keyfile_offset, src.keyfile_size);
    }
    if src.ask_password {
        return ask_agent(prompt);
    }
    if !std::io::stdin().is_terminal() {
        return read_stdin_line(src.keyfile_size);
    }
    let pass = prompt_tty(prompt)?;
    if verify || src.verify {
        let again = prompt_tty("Verify passphrase: ")?;
        if pass != again {
            return Err(CliError::usage("Passphrases do not match."));
        }
    }
    // -l limits a typed passphrase too, as cryptsetup reads it (0: no limit).
    Ok(match src.keyfile_size {
        Some(n) if n > 0 && pass.len() > n => SecretBytes::from_slice(&pass[..n]),
        _ => pass,
    })
}

/// A TrueCrypt/VeraCrypt passphrase: a line of stdin when stdin is not a terminal, else
/// the terminal; empty is allowed when keyfiles carry the secret (`may_be_empty`).
pub(crate) fn get_tcrypt_passphrase(
    prompt: &str,
    may_be_empty: bool,
    ask_agent_for_it: bool,
) -> CliResult<SecretBytes> {
    let pass = if ask_agent_for_it {
        ask_agent(prompt)?
    } else if !std::io::stdin().is_terminal() {
        read_stdin_line(None)?
    } else {
        prompt_tty(prompt)?
    };
    if pass.is_empty() && !may_be_empty {
        return Err(CliError::new(EXIT_USAGE, "empty passphrase"));
    }
    Ok(pass)
}

/// Asks for "YES" on the terminal before a destructive action, unless `batch` or
/// standard input is not a terminal: cryptsetup asks only when it can (`echo PW |
/// cryptsetup luksFormat DEV` formats without asking), and scripts written for it rely on
/// that.
pub(crate) fn confirm(batch: bool, question: &str) -> CliResult<()> {
    use std::io::IsTerminal;
    if batch || !std::io::stdin().is_terminal() {
        return Ok(());
    }
    use std::io::{BufRead, Write};
    let tty = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/tty")
        .map_err(|e| CliError::usage(format!("{question}\ncannot open the terminal: {e}")))?;
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
