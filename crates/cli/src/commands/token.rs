//! `token add|remove|import|export|unassign`: LUKS2 tokens with cryptsetup's options and
//! messages (`cryptsetup token`), e.g. to move a systemd-cryptenroll or clevis token
//! between volumes, or add a kernel-keyring token.

use crate::args::HeaderArgs;
use crate::commands::{header_path, open_header};
use crate::ctx::Ctx;
use crate::error::{CliError, CliResult, io_err};
use clap::Args;
use cryptblk_format::luks2::Luks2Header;
use serde_json::Value;
use std::io::{Read, Write};
use std::path::PathBuf;

#[derive(Args, Debug)]
pub(crate) struct TokenArgs {
    /// add, remove, import, export or unassign.
    pub action: String,
    /// The LUKS2 device or image file.
    pub device: PathBuf,
    #[command(flatten)]
    pub header: HeaderArgs,
    /// Token number (default: the lowest free one for add and import).
    #[arg(long = "token-id")]
    pub token_id: Option<u32>,
    /// Keyslot to assign (add: default every keyslot; import: in addition to the JSON's).
    #[arg(short = 'S', long = "key-slot")]
    pub key_slot: Option<u32>,
    /// add: the kernel keyring key holding the passphrase (a luks2-keyring token).
    #[arg(long = "key-description")]
    pub key_description: Option<String>,
    /// import: read the token's JSON from this file (default stdin); export: write it here
    /// (default stdout).
    #[arg(long = "json-file")]
    pub json_file: Option<PathBuf>,
    /// add, import: replace the token already at --token-id.
    #[arg(long = "token-replace")]
    pub token_replace: bool,
}

fn need<T: Copy>(v: Option<T>, what: &str, action: &str) -> CliResult<T> {
    v.ok_or_else(|| CliError::usage(format!("Option {what} is required for token {action}.")))
}

pub(crate) fn token(ctx: &Ctx, a: TokenArgs) -> CliResult<()> {
    let path = header_path(&a.device, &a.header).to_path_buf();
    let write = a.action != "export";
    let mut dev = open_header(ctx, &a.device, &a.header, write)?;
    // Loaded with unknown requirements too: `token export` works on such a header, the
    // changes are refused when written (as in cryptsetup).
    let mut hdr = crate::commands::luks2_header(&mut dev, &path)?;
    let slot_ok = |hdr: &Luks2Header, s: u32| -> CliResult<u32> {
        if hdr.json()["keyslots"].get(s.to_string()).is_none() {
            return Err(CliError::usage(format!("Keyslot {s} is not active.")));
        }
        Ok(s)
    };
    let created = match a.action.as_str() {
        "add" => {
            let desc = a.key_description.as_deref().ok_or_else(|| {
                CliError::usage("--key-description parameter is mandatory for token add action.")
            })?;
            let slots: Vec<u32> = match a.key_slot {
                Some(s) => vec![slot_ok(&hdr, s)?],
                None => hdr.json()["keyslots"]
                    .as_object()
                    .map(|m| m.keys().filter_map(|k| k.parse().ok()).collect())
                    .unwrap_or_default(),
            };
            let token = serde_json::json!({
                "type": cryptblk_format::luks2::KEYRING_TOKEN,
                "keyslots": slots.iter().map(u32::to_string).collect::<Vec<_>>(),
                "key_description": desc,
            });
            Some(hdr.set_token(&mut dev, a.token_id, token, a.token_replace)?)
        }
        "import" => {
            let mut token: Value = serde_json::from_slice(&read_json(&a)?)
                .map_err(|e| CliError::usage(format!("Failed to import token from file: {e}")))?;
            if let Some(s) = a.key_slot {
                let s = Value::String(slot_ok(&hdr, s)?.to_string());
                if let Some(arr) = token["keyslots"].as_array_mut()
                    && !arr.contains(&s)
                {
                    arr.push(s);
                }
            }
            Some(hdr.set_token(&mut dev, a.token_id, token, a.token_replace)?)
        }
        "remove" => {
            hdr.remove_token(&mut dev, need(a.token_id, "--token-id", "remove")?)?;
            if ctx.verbose {
                eprintln!("Token {} removed.", a.token_id.unwrap_or_default());
            }
            None
        }
        "unassign" => {
            let id = need(a.token_id, "--token-id", "unassign")?;
            let slot = need(a.key_slot, "--key-slot", "unassign")?;
            hdr.assign_token(&mut dev, id, slot, false)?;
            None
        }
        "export" => {
            let id = need(a.token_id, "--token-id", "export")?;
            let t = hdr
                .token(id)
                .ok_or_else(|| CliError::usage(format!("Failed to get token {id} for export.")))?;
            write_json(&a, &serde_json::to_string(t).expect("JSON serializes"))?;
            None
        }
        other => {
            return Err(CliError::usage(format!(
                "unknown token action {other} (add, remove, import, export, unassign)"
            )));
        }
    };
    if let Some(id) = created
        && ctx.verbose
    {
        eprintln!("Token {id} created.");
    }
    Ok(())
}

/// The token JSON to import, from --json-file or stdin (at most the largest JSON area).
fn read_json(a: &TokenArgs) -> CliResult<Vec<u8>> {
    const MAX: u64 = 4 << 20;
    let mut buf = Vec::new();
    match &a.json_file {
        Some(p) if p.as_os_str() != "-" => std::fs::File::open(p)
            .and_then(|f| f.take(MAX).read_to_end(&mut buf))
            .map_err(|e| io_err(p, e))?,
        _ => std::io::stdin()
            .take(MAX)
            .read_to_end(&mut buf)
            .map_err(|e| CliError::usage(format!("stdin: {e}")))?,
    };
    Ok(buf)
}

/// Writes the exported JSON as cryptsetup does (no newline after it), to --json-file
/// (created 0600, never through a symbolic link) or stdout.
fn write_json(a: &TokenArgs, json: &str) -> CliResult<()> {
    match &a.json_file {
        Some(p) if p.as_os_str() != "-" => {
            use std::os::unix::fs::OpenOptionsExt;
            std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW)
                .open(p)
                .and_then(|mut f| f.write_all(json.as_bytes()))
                .map_err(|e| io_err(p, e))
        }
        _ => {
            let mut out = std::io::stdout();
            out.write_all(json.as_bytes())
                .and_then(|_| out.flush())
                .map_err(|e| CliError::usage(format!("stdout: {e}")))
        }
    }
}
