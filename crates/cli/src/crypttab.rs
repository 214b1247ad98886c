//! crypttab(5) files: `open --crypttab FILE NAME`, `attach-all` and `detach-all` read
//! them, from `/etc/cryptblktab` by default (never `/etc/crypttab`, which systemd's own
//! generator reads: the two would fight over every volume).
//!
//! A line is `NAME DEVICE [KEY-FILE [OPTIONS]]`, fields apart by blanks, `#` lines and
//! blank lines skipped, a field quoted with `"` or `'` or with `\` escapes where it holds
//! blanks; OPTIONS apart by commas (`\,` keeps one). DEVICE is a path or `UUID=`,
//! `LABEL=`, `PARTUUID=`, `PARTLABEL=`; KEY-FILE `none`, `-` or absent asks for a
//! passphrase. An entry is applied to `open`'s arguments: what the command line sets
//! itself stays (`-T` over `tries=` too), the line fills in the rest; `token-timeout=`
//! is the exception, as its option has a default that cannot be told from a value given. An option this file does not know is an
//! error naming its line, never ignored.

use crate::error::{CliError, CliResult};
use crate::frontend::OpenArgs;
use cryptblk_volume::VolumeType;
use std::path::{Path, PathBuf};

/// Where `attach-all`, `detach-all` and `open --crypttab` look by default.
pub(crate) const DEFAULT_CRYPTTAB: &str = "/etc/cryptblktab";

/// One line of a crypttab file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Entry {
    /// 1-based, for messages.
    pub line: usize,
    pub name: String,
    pub device: String,
    /// `None`: ask for a passphrase (`none`, `-` or no field).
    pub key_file: Option<String>,
    /// `(key, value)` in the line's order.
    pub options: Vec<(String, Option<String>)>,
}

impl Entry {
    /// `noauto`: `attach-all` leaves it alone.
    pub(crate) fn noauto(&self) -> bool {
        self.has("noauto")
    }

    /// `nofail`: `attach-all` reports its failure but does not fail for it.
    pub(crate) fn nofail(&self) -> bool {
        self.has("nofail")
    }

    fn has(&self, key: &str) -> bool {
        self.options.iter().any(|(k, _)| k == key)
    }
}

/// Reads and parses `path`.
pub(crate) fn read(path: &Path) -> CliResult<Vec<Entry>> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| CliError::usage(format!("{}: {e}", path.display())))?;
    parse(&text).map_err(|e| CliError::usage(format!("{}:{e}", path.display())))
}

/// The entry named `name` in `path`.
pub(crate) fn find(path: &Path, name: &str) -> CliResult<Entry> {
    read(path)?
        .into_iter()
        .find(|e| e.name == name)
        .ok_or_else(|| CliError::usage(format!("{}: no entry named {name}", path.display())))
}

/// Parses crypttab text; an error is `LINE: why`.
pub(crate) fn parse(text: &str) -> Result<Vec<Entry>, String> {
    let mut entries: Vec<Entry> = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        let trimmed = raw.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        let fields = split_fields(trimmed).map_err(|e| format!("{line}: {e}"))?;
        if fields.len() < 2 {
            return Err(format!("{line}: a line needs at least a name and a device"));
        }
        if fields.len() > 4 {
            return Err(format!(
                "{line}: more than four fields (NAME DEVICE KEY-FILE OPTIONS; quote blanks)"
            ));
        }
        // `\,` is kept escaped for the options' split only.
        let fields: Vec<String> = fields
            .into_iter()
            .enumerate()
            .map(|(i, f)| if i < 3 { f.replace("\\,", ",") } else { f })
            .collect();
        let name = fields[0].clone();
        if name.starts_with('-') {
            return Err(format!("{line}: a name may not start with '-' ({name})"));
        }
        if entries.iter().any(|e| e.name == name) {
            return Err(format!("{line}: a second entry named {name}"));
        }
        let key_file = match fields.get(2).map(String::as_str) {
            None | Some("none") | Some("-") | Some("") => None,
            Some(k) => {
                if let Some((_, dev)) = k.rsplit_once(':')
                    && is_device_spec(dev)
                {
                    return Err(format!(
                        "{line}: a key file on another device ({k}) is not supported: \
                         give the key file's path"
                    ));
                }
                Some(k.to_string())
            }
        };
        let options = match fields.get(3) {
            Some(o) => split_options(o)
                .into_iter()
                .map(|o| check_option(&o).map_err(|e| format!("{line}: {e}")))
                .collect::<Result<Vec<_>, _>>()?,
            None => Vec::new(),
        };
        let kinds = options
            .iter()
            .filter(|(k, _)| TYPES.contains(&k.as_str()))
            .count();
        let veracrypt = options.iter().any(|(k, _)| k == "tcrypt-veracrypt");
        let tcrypt = options.iter().any(|(k, _)| k == "tcrypt");
        if kinds > 1 || (veracrypt && kinds == 1 && !tcrypt) {
            return Err(format!(
                "{line}: more than one volume type (luks, plain, tcrypt, bitlk)"
            ));
        }
        entries.push(Entry {
            line,
            name,
            device: fields[1].clone(),
            key_file,
            options,
        });
    }
    Ok(entries)
}

fn is_device_spec(s: &str) -> bool {
    s.starts_with("/dev/")
        || ["UUID=", "LABEL=", "PARTUUID=", "PARTLABEL="]
            .iter()
            .any(|p| s.starts_with(p))
}

/// Blank-separated fields with `"..."`, `'...'` and `\` escapes.
fn split_fields(line: &str) -> Result<Vec<String>, String> {
    let mut fields = Vec::new();
    let mut cur = String::new();
    let mut in_field = false;
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            ' ' | '\t' => {
                if in_field {
                    fields.push(std::mem::take(&mut cur));
                    in_field = false;
                }
            }
            '"' | '\'' => {
                in_field = true;
                loop {
                    match chars.next() {
                        None => return Err(format!("an unterminated {c} quote")),
                        Some(q) if q == c => break,
                        Some('\\') if c == '"' => match chars.next() {
                            Some(e) => cur.push(e),
                            None => return Err("a \\ at the end of the line".into()),
                        },
                        Some(x) => cur.push(x),
                    }
                }
            }
            '\\' => {
                in_field = true;
                match chars.next() {
                    // `\,` stays escaped for the option split.
                    Some(',') => cur.push_str("\\,"),
                    Some(e) => cur.push(e),
                    None => return Err("a \\ at the end of the line".into()),
                }
            }
            _ => {
                in_field = true;
                cur.push(c);
            }
        }
    }
    if in_field {
        fields.push(cur);
    }
    Ok(fields)
}

/// Comma-separated options, `\,` a comma inside one; empty ones dropped.
fn split_options(field: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut chars = field.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some(e) => cur.push(e),
                None => cur.push('\\'),
            },
            ',' => {
                if !cur.is_empty() {
                    out.push(std::mem::take(&mut cur));
                }
            }
            _ => cur.push(c),
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

const TYPES: &[&str] = &["luks", "plain", "tcrypt", "bitlk"];
/// Options that take no value.
const FLAGS: &[&str] = &[
    "luks",
    "plain",
    "tcrypt",
    "tcrypt-veracrypt",
    "tcrypt-hidden",
    "tcrypt-system",
    "bitlk",
    "discard",
    "readonly",
    "read-only",
    "nofail",
    "noauto",
    "ublk",
    // Ordered after the network by cryptblk-generator.
    "_netdev",
    // dm-crypt's kernel work queues: nothing to do here (cryptblk encrypts on the thread
    // that received the I/O).
    "same-cpu-crypt",
    "submit-from-crypt-cpus",
    "no-read-workqueue",
    "no-write-workqueue",
];
/// Options that need a value.
const VALUED: &[&str] = &[
    "header",
    "keyfile-offset",
    "keyfile-size",
    "cipher",
    "size",
    "hash",
    "offset",
    "skip",
    "sector-size",
    "key-slot",
    "tries",
    "token-timeout",
    "tpm2-device",
    "veracrypt-pim",
    "nbd",
    "fuse",
    "vhost-user-blk",
    // Unit dependencies cryptblk-generator writes into the instance's drop-in.
    "x-systemd.after",
    "x-systemd.before",
    "x-systemd.requires",
    "x-systemd.wants",
];

/// `key[=value]`, checked against the options this file knows.
fn check_option(o: &str) -> Result<(String, Option<String>), String> {
    let (k, v) = match o.split_once('=') {
        Some((k, v)) => (k, Some(v.to_string())),
        None => (o, None),
    };
    if FLAGS.contains(&k) {
        if v.is_some() {
            return Err(format!("option {k} takes no value"));
        }
    } else if VALUED.contains(&k) {
        match &v {
            None => return Err(format!("option {k} needs a value ({k}=...)")),
            Some(v) if v.is_empty() => return Err(format!("option {k} needs a value ({k}=...)")),
            Some(_) => {}
        }
    } else if [
        "swap",
        "tmp",
        "verify",
        "keyfile-erase",
        "headless",
        "x-initrd.attach",
    ]
    .iter()
    .any(|x| *x == k || k.starts_with(&format!("{x}=")))
    {
        return Err(format!("option {k} is not supported by cryptblk"));
    } else {
        return Err(format!("unknown option {o:?}"));
    }
    Ok((k.to_string(), v))
}

/// `DEVICE` as a path: `UUID=` and the like through `/dev/disk/by-*` under `dev`, and
/// for `UUID=` where udev made no link, the block devices (`candidates`) whose LUKS
/// header has that UUID, as blkid finds them.
pub(crate) fn resolve_device(spec: &str, dev: &Path, candidates: &[PathBuf]) -> CliResult<PathBuf> {
    let Some((prefix, link)) = udev_link(spec, dev) else {
        return Ok(PathBuf::from(spec));
    };
    let link = link?;
    let value = spec[prefix.len()..].trim_matches('"');
    if link.exists() {
        return Ok(link);
    }
    if prefix == "UUID=" {
        let want = value.to_ascii_lowercase();
        let found: Vec<&PathBuf> = candidates
            .iter()
            .filter(|c| luks_uuid(c).is_some_and(|u| u.to_ascii_lowercase() == want))
            .collect();
        match found.as_slice() {
            [one] => return Ok((*one).clone()),
            [] => {}
            // RAID1 members or multipath paths carry the same header: never pick one.
            many => {
                return Err(CliError::new(
                    crate::error::EXIT_NO_DEVICE,
                    format!(
                        "{spec}: {} block devices have a LUKS header with that UUID ({}); name the device",
                        many.len(),
                        many.iter()
                            .map(|p| p.display().to_string())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                ));
            }
        }
    }
    Err(CliError::new(
        crate::error::EXIT_NO_DEVICE,
        format!(
            "{spec}: no such device ({} does not exist{})",
            link.display(),
            if prefix == "UUID=" {
                ", and no block device has a LUKS header with that UUID"
            } else {
                ""
            }
        ),
    ))
}

/// For `UUID=`, `LABEL=`, `PARTUUID=`, `PARTLABEL=`: the prefix and udev's link under
/// `dev` (`dev/disk/by-uuid/...`, UUIDs in lower case, as udev writes them); `None` for
/// a path.
pub(crate) fn udev_link(spec: &str, dev: &Path) -> Option<(&'static str, CliResult<PathBuf>)> {
    const BY: [(&str, &str); 4] = [
        ("UUID=", "by-uuid"),
        ("LABEL=", "by-label"),
        ("PARTUUID=", "by-partuuid"),
        ("PARTLABEL=", "by-partlabel"),
    ];
    let (prefix, dir, value) = BY
        .iter()
        .find_map(|(p, d)| spec.strip_prefix(p).map(|v| (*p, *d, v)))?;
    let value = value.trim_matches('"');
    if value.is_empty() || value.contains('/') {
        return Some((
            prefix,
            Err(CliError::usage(format!("{spec}: not a device name"))),
        ));
    }
    let name = if prefix.ends_with("UUID=") {
        value.to_ascii_lowercase()
    } else {
        value.to_string()
    };
    Some((prefix, Ok(dev.join("disk").join(dir).join(name))))
}

/// The block devices of this machine (`/dev/NAME` for each of /sys/class/block).
pub(crate) fn block_devices() -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir("/sys/class/block")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| Path::new("/dev").join(e.file_name()))
        .collect();
    out.sort();
    out
}

/// The UUID of a LUKS1 or LUKS2 header at the start of `path` (both keep it at byte 168).
fn luks_uuid(path: &Path) -> Option<String> {
    use std::io::Read;
    let mut head = [0u8; 208];
    std::fs::File::open(path).ok()?.read_exact(&mut head).ok()?;
    if &head[..6] != b"LUKS\xba\xbe" {
        return None;
    }
    let raw = &head[168..208];
    let end = raw.iter().position(|&b| b == 0).unwrap_or(raw.len());
    std::str::from_utf8(&raw[..end]).ok().map(str::to_string)
}

/// Applies `entry` to `a` (the command line's own settings stay) and returns the
/// `tries=` it sets, if any.
pub(crate) fn apply(entry: &Entry, file: &Path, a: &mut OpenArgs) -> CliResult<Option<u32>> {
    let at = |why: String| CliError::usage(format!("{}:{}: {why}", file.display(), entry.line));
    a.name = entry.name.clone();
    a.device = resolve_device(&entry.device, Path::new("/dev"), &block_devices()).map_err(|e| {
        CliError::new(
            e.code,
            format!("{}:{}: {}", file.display(), entry.line, e.message),
        )
    })?;
    if let Some(k) = &entry.key_file
        && a.vol.key.key_files.is_empty()
    {
        a.vol.key.key_files.push(PathBuf::from(k));
    }
    let num = |k: &str, v: &str| -> CliResult<u64> {
        v.parse::<u64>()
            .map_err(|_| at(format!("option {k}={v}: not a number")))
    };
    let num32 = |k: &str, v: &str| -> CliResult<u32> {
        u32::try_from(num(k, v)?).map_err(|_| at(format!("option {k}={v}: too large")))
    };
    let mut tries = None;
    let mut frontends = 0;
    for (k, v) in &entry.options {
        let v = v.as_deref().unwrap_or("");
        match k.as_str() {
            "luks" => a.vol.kind = VolumeType::Luks,
            "plain" => a.vol.kind = VolumeType::Plain,
            // VeraCrypt is tried with TrueCrypt unless --disable-veracrypt.
            "tcrypt" | "tcrypt-veracrypt" => a.vol.kind = VolumeType::Tcrypt,
            "bitlk" => a.vol.kind = VolumeType::Bitlk,
            "tcrypt-hidden" => a.vol.tcrypt.hidden = true,
            "tcrypt-system" => a.vol.tcrypt.system = true,
            "veracrypt-pim" => {
                a.vol.tcrypt.pim.get_or_insert(num32(k, v)?);
            }
            "header" => {
                a.vol.header.header.get_or_insert_with(|| PathBuf::from(v));
            }
            "keyfile-offset" if a.vol.key.keyfile_offset == 0 => {
                a.vol.key.keyfile_offset = num(k, v)?;
            }
            "keyfile-size" => {
                a.vol.key.keyfile_size.get_or_insert(num(k, v)? as usize);
            }
            "cipher" => {
                a.vol.cipher.get_or_insert_with(|| v.to_string());
            }
            "size" => {
                a.vol.key_size.get_or_insert(num(k, v)? as usize);
            }
            "hash" => {
                a.vol.hash.get_or_insert_with(|| v.to_string());
            }
            "offset" => {
                a.vol.offset.get_or_insert(num(k, v)?);
            }
            "skip" => {
                a.vol.skip.get_or_insert(num(k, v)?);
            }
            "sector-size" => {
                a.vol.sector_size.get_or_insert(num32(k, v)?);
            }
            "key-slot" => {
                a.vol.key_slot.get_or_insert(num32(k, v)?);
            }
            "discard" => a.vol.allow_discards = true,
            "readonly" | "read-only" => a.vol.read_only = true,
            // systemd: 0 asks without end.
            "tries" => tries = Some(u32::try_from(num(k, v)?).unwrap_or(u32::MAX)),
            "token-timeout" => {
                let secs = v.strip_suffix('s').unwrap_or(v);
                a.vol.tokens.token_timeout = num(k, secs)?;
            }
            "tpm2-device" => {
                a.vol
                    .tokens
                    .tpm2_device
                    .get_or_insert_with(|| v.to_string());
            }
            "nbd" => {
                frontends += 1;
                a.nbd.get_or_insert_with(|| v.to_string());
            }
            "fuse" => {
                frontends += 1;
                a.fuse.get_or_insert_with(|| PathBuf::from(v));
            }
            "vhost-user-blk" => {
                frontends += 1;
                a.vhost_user_blk.get_or_insert_with(|| PathBuf::from(v));
            }
            "ublk" => {
                frontends += 1;
                a.ublk.ublk = true;
            }
            // attach-all's, systemd's, dm-crypt's (see FLAGS).
            _ => {}
        }
    }
    if frontends > 1 {
        return Err(at(
            "more than one frontend (nbd=, fuse=, ublk, vhost-user-blk=)".into(),
        ));
    }
    Ok(tries.map(|t| if t == 0 { u32::MAX } else { t }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_comments_quotes_and_escapes() {
        let text = "# a comment\n\n  \t\n\
                    home UUID=ABC-1 /etc/keys/home luks,discard,nofail\n\
                    swapish /dev/sdb2 none plain,cipher=aes-xts-plain64,size=512,hash=sha256,offset=2048,skip=16\n\
                    \"my vol\" '/srv/a b.img' - luks,header=/etc/h\\,1,tries=0\n\
                    bare /dev/sdc\n";
        let e = parse(text).unwrap();
        assert_eq!(e.len(), 4);
        assert_eq!(e[0].line, 4);
        assert_eq!(e[0].name, "home");
        assert_eq!(e[0].device, "UUID=ABC-1");
        assert_eq!(e[0].key_file.as_deref(), Some("/etc/keys/home"));
        assert!(e[0].nofail() && !e[0].noauto());
        assert_eq!(e[1].key_file, None);
        assert_eq!(e[1].options[4], ("offset".into(), Some("2048".into())));
        assert_eq!(e[2].name, "my vol");
        assert_eq!(e[2].device, "/srv/a b.img");
        assert_eq!(e[2].key_file, None);
        assert_eq!(e[2].options[1], ("header".into(), Some("/etc/h,1".into())));
        assert_eq!(e[3].key_file, None);
        assert!(e[3].options.is_empty());
    }

    #[test]
    fn bad_lines_are_refused_with_their_number() {
        for (text, want) in [
            (
                "a /dev/x none luks,frobnicate\n",
                "1: unknown option \"frobnicate\"",
            ),
            (
                "# c\na /dev/x none luks,plain\n",
                "2: more than one volume type",
            ),
            ("a\n", "1: a line needs at least a name and a device"),
            ("a b c d e\n", "1: more than four fields"),
            ("a /dev/x none cipher\n", "1: option cipher needs a value"),
            (
                "a /dev/x none discard=1\n",
                "1: option discard takes no value",
            ),
            ("a \"/dev/x none\n", "1: an unterminated \" quote"),
            ("a /dev/x none swap\n", "1: option swap is not supported"),
            (
                "a /dev/x /k:UUID=12 luks\n",
                "1: a key file on another device",
            ),
            ("a /dev/x\n\na /dev/y\n", "3: a second entry named a"),
            ("-a /dev/x\n", "1: a name may not start with '-'"),
            (
                "a /dev/x none luks,tcrypt-veracrypt\n",
                "1: more than one volume type",
            ),
            (
                "a /dev/x none x-systemd.device-timeout=3\n",
                "1: unknown option",
            ),
            (
                "a /dev/x none x-initrd.attach\n",
                "1: option x-initrd.attach is not supported",
            ),
        ] {
            let err = parse(text).unwrap_err();
            assert!(err.starts_with(want), "{text:?}: {err}");
        }
    }

    /// `open`'s arguments as the command line `args` (after `open`) gives them.
    fn open_args(args: &[&str]) -> OpenArgs {
        #[derive(clap::Parser)]
        struct T {
            #[command(flatten)]
            a: OpenArgs,
        }
        let argv = std::iter::once("open").chain(args.iter().copied());
        <T as clap::Parser>::try_parse_from(argv).unwrap().a
    }

    #[test]
    fn every_option_lands_in_open_arguments_and_the_command_line_wins() {
        let tab = "a /srv/a.img /k luks,header=/h,keyfile-offset=4,keyfile-size=32,key-slot=2,discard,readonly,tries=5,token-timeout=30s,tpm2-device=auto,nbd=unix:/run/a.sock,sector-size=4096\n\
                   b /srv/b.img none plain,cipher=aes-cbc-essiv:sha256,size=256,hash=sha512,offset=8,skip=16,fuse=/mnt/b\n\
                   c /srv/c.img - tcrypt-veracrypt,tcrypt-hidden,tcrypt-system,veracrypt-pim=7,vhost-user-blk=/run/c.sock\n\
                   d /srv/d.img none bitlk,ublk,tries=0,noauto,nofail,_netdev,x-systemd.after=network.target,same-cpu-crypt\n\
                   e /srv/e.img none luks,nbd=unix:/x,ublk\n";
        let e = parse(tab).unwrap();
        let file = Path::new("/etc/cryptblktab");
        let mut a = open_args(&["--crypttab", "f", "a"]);
        let tries = apply(&e[0], file, &mut a).unwrap();
        assert_eq!(
            (a.name.as_str(), a.device.as_path()),
            ("a", Path::new("/srv/a.img"))
        );
        assert_eq!(a.vol.kind, VolumeType::Luks);
        assert_eq!(a.vol.header.header.as_deref(), Some(Path::new("/h")));
        assert_eq!(a.vol.key.key_files, [PathBuf::from("/k")]);
        assert_eq!(a.vol.key.keyfile_offset, 4);
        assert_eq!(a.vol.key.keyfile_size, Some(32));
        assert_eq!(a.vol.key_slot, Some(2));
        assert!(a.vol.allow_discards && a.vol.read_only);
        assert_eq!(tries, Some(5));
        assert_eq!(a.vol.tokens.token_timeout, 30);
        assert_eq!(a.vol.tokens.tpm2_device.as_deref(), Some("auto"));
        assert_eq!(a.nbd.as_deref(), Some("unix:/run/a.sock"));
        assert_eq!(a.vol.sector_size, Some(4096));

        // The command line's own settings stay.
        let mut a = open_args(&["--crypttab", "f", "b", "--cipher", "serpent-xts-plain64"]);
        apply(&e[1], file, &mut a).unwrap();
        assert_eq!(a.vol.kind, VolumeType::Plain);
        assert_eq!(a.vol.cipher.as_deref(), Some("serpent-xts-plain64"));
        assert!(
            a.vol.key.key_files.is_empty(),
            "none: a passphrase is asked for"
        );
        assert_eq!(
            (a.vol.key_size, a.vol.hash.as_deref()),
            (Some(256), Some("sha512"))
        );
        assert_eq!((a.vol.offset, a.vol.skip), (Some(8), Some(16)));
        assert_eq!(a.fuse.as_deref(), Some(Path::new("/mnt/b")));

        let mut a = open_args(&["--crypttab", "f", "c"]);
        apply(&e[2], file, &mut a).unwrap();
        assert_eq!(a.vol.kind, VolumeType::Tcrypt);
        assert!(a.vol.tcrypt.hidden && a.vol.tcrypt.system);
        assert_eq!(a.vol.tcrypt.pim, Some(7));
        assert_eq!(a.vhost_user_blk.as_deref(), Some(Path::new("/run/c.sock")));

        let mut a = open_args(&["--crypttab", "f", "d"]);
        assert_eq!(
            apply(&e[3], file, &mut a).unwrap(),
            Some(u32::MAX),
            "tries=0: no end"
        );
        assert_eq!(a.vol.kind, VolumeType::Bitlk);
        assert!(a.ublk.ublk);
        assert!(e[3].noauto() && e[3].nofail());

        // tcrypt with tcrypt-veracrypt (systemd's pairing) is one type; a slot past u32 is
        // refused, not cut.
        assert!(parse("v /srv/v.img none tcrypt,tcrypt-veracrypt\n").is_ok());
        let big = parse("k /srv/k.img none luks,key-slot=4294967296\n").unwrap();
        let mut a = open_args(&["--crypttab", "f", "k"]);
        assert!(
            apply(&big[0], file, &mut a)
                .unwrap_err()
                .message
                .contains("too large")
        );

        let mut a = open_args(&["--crypttab", "f", "e"]);
        let err = apply(&e[4], file, &mut a).unwrap_err();
        assert!(
            err.message
                .starts_with("/etc/cryptblktab:5: more than one frontend"),
            "{}",
            err.message
        );
    }

    #[test]
    fn uuid_label_and_luks_header_resolution() {
        let dir = tempfile::tempdir().unwrap();
        let dev = dir.path();
        std::fs::create_dir_all(dev.join("disk/by-uuid")).unwrap();
        std::fs::create_dir_all(dev.join("disk/by-label")).unwrap();
        let target = dev.join("sda1");
        std::fs::write(&target, b"x").unwrap();
        std::os::unix::fs::symlink(&target, dev.join("disk/by-uuid/abcd-ef")).unwrap();
        std::os::unix::fs::symlink(&target, dev.join("disk/by-label/Data")).unwrap();
        assert_eq!(
            resolve_device("UUID=ABCD-EF", dev, &[]).unwrap(),
            dev.join("disk/by-uuid/abcd-ef")
        );
        assert_eq!(
            resolve_device("LABEL=Data", dev, &[]).unwrap(),
            dev.join("disk/by-label/Data")
        );
        assert_eq!(
            resolve_device("/srv/x.img", dev, &[]).unwrap(),
            PathBuf::from("/srv/x.img")
        );
        // No udev link: a block device whose LUKS header has the UUID.
        let mut hdr = vec![0u8; 4096];
        hdr[..6].copy_from_slice(b"LUKS\xba\xbe");
        let uuid = "0d5bd1c5-3bb4-4e6c-9e63-7bd6e64e9f5a";
        hdr[168..168 + uuid.len()].copy_from_slice(uuid.as_bytes());
        let luks = dev.join("loop7");
        std::fs::write(&luks, &hdr).unwrap();
        let cands = [target.clone(), luks.clone()];
        assert_eq!(
            resolve_device(&format!("UUID={}", uuid.to_uppercase()), dev, &cands).unwrap(),
            luks
        );
        // The same header on two devices (RAID1 members, multipath): neither is picked.
        let twin = dev.join("loop8");
        std::fs::write(&twin, &hdr).unwrap();
        let e = resolve_device(&format!("UUID={uuid}"), dev, &[luks.clone(), twin]).unwrap_err();
        assert!(e.message.contains("2 block devices"), "{}", e.message);
        let e = resolve_device("UUID=ffff", dev, &cands).unwrap_err();
        assert!(e.message.contains("no such device"), "{}", e.message);
        assert!(resolve_device("LABEL=Other", dev, &cands).is_err());
        assert!(resolve_device("LABEL=../x", dev, &cands).is_err());
    }
}
