//! `cryptblk-generator` (cryptblk run under that name, from
//! /usr/lib/systemd/system-generators): systemd calls it at boot and at each
//! `daemon-reload` with the directory for generated units. For each entry of
//! /etc/cryptblktab (`$CRYPTBLK_CRYPTTAB` elsewhere, as `$SYSTEMD_CRYPTTAB` for systemd's
//! own generator) it pulls in `cryptblk@NAME.service` from `cryptblk.target` (a want with
//! `nofail`, a requirement without; nothing with `noauto`), which multi-user.target then
//! wants, and writes a drop-in for the instance with what the hardened template cannot
//! know: the device's unit or mount, the paths the server writes (an image file, a
//! socket's directory), the network for remote storage or an NBD TCP listener, and the
//! capability its frontend needs (ublk, FUSE: CAP_SYS_ADMIN). A FUSE volume's service
//! runs without the template's mount namespace: its mount must be seen by the rest of the
//! system.

use crate::crypttab::{self, DEFAULT_CRYPTTAB, Entry};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// Where the package installs the template.
const TEMPLATE: &str = "/usr/lib/systemd/system/cryptblk@.service";
const TARGET: &str = "/usr/lib/systemd/system/cryptblk.target";

/// The generator's main: `args` as systemd passes them (the normal, early and late
/// directories; only the first is used). Returns the exit status.
pub(crate) fn main(args: &[std::ffi::OsString]) -> i32 {
    let Some(dir) = args.get(1).map(PathBuf::from) else {
        eprintln!("cryptblk-generator: usage: cryptblk-generator NORMAL_DIR [EARLY_DIR LATE_DIR]");
        return 1;
    };
    let tab = std::env::var_os("CRYPTBLK_CRYPTTAB")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_CRYPTTAB));
    if !tab.exists() {
        return 0;
    }
    match generate(&tab, &dir) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("cryptblk-generator: {e}");
            1
        }
    }
}

/// Writes the links and drop-ins for `tab` into `dir`.
pub(crate) fn generate(tab: &Path, dir: &Path) -> Result<(), String> {
    let text = std::fs::read_to_string(tab).map_err(|e| format!("{}: {e}", tab.display()))?;
    // As systemd's own generator: a bad line is reported and skipped, the others are
    // still pulled in.
    let mut entries = Vec::new();
    let mut bad = Vec::new();
    for (i, line) in text.lines().enumerate() {
        match crypttab::parse(line) {
            Ok(found) => entries.extend(found.into_iter().map(|mut e| {
                e.line = i + 1;
                e
            })),
            Err(why) => bad.push(format!(
                "{}:{}{}",
                tab.display(),
                i + 1,
                why.strip_prefix('1').unwrap_or(&why)
            )),
        }
    }
    let mut any = false;
    for e in &entries {
        if let Err(err) = crate::rundir::check_name(&e.name) {
            bad.push(format!("{}:{}: {}", tab.display(), e.line, err.message));
            continue;
        }
        let unit = format!("cryptblk@{}.service", e.name);
        let dropin = dir.join(format!("{unit}.d"));
        std::fs::create_dir_all(&dropin).map_err(|err| format!("{}: {err}", dropin.display()))?;
        let conf = dropin.join("50-cryptblktab.conf");
        std::fs::write(&conf, dropin_text(tab, e))
            .map_err(|err| format!("{}: {err}", conf.display()))?;
        if e.noauto() {
            continue;
        }
        let kind = if e.nofail() { "wants" } else { "requires" };
        link(
            TEMPLATE,
            &dir.join(format!("cryptblk.target.{kind}")).join(&unit),
        )?;
        any = true;
    }
    if any {
        link(
            TARGET,
            &dir.join("multi-user.target.wants").join("cryptblk.target"),
        )?;
    }
    if bad.is_empty() {
        Ok(())
    } else {
        Err(format!("skipped: {}", bad.join("; ")))
    }
}

fn link(target: &str, at: &Path) -> Result<(), String> {
    if let Some(parent) = at.parent() {
        std::fs::create_dir_all(parent).map_err(|e| format!("{}: {e}", parent.display()))?;
    }
    let _ = std::fs::remove_file(at);
    std::os::unix::fs::symlink(target, at).map_err(|e| format!("{}: {e}", at.display()))
}

/// The instance's drop-in.
fn dropin_text(tab: &Path, e: &Entry) -> String {
    let opt = |k: &str| {
        e.options
            .iter()
            .find(|(key, _)| key == k)
            .and_then(|(_, v)| v.clone())
    };
    let has = |k: &str| e.options.iter().any(|(key, _)| key == k);
    let mut unit = String::new();
    let mut service = format!(
        "Environment={}\n",
        quote(&format!("CRYPTBLK_CRYPTTAB={}", tab.display()))
    );
    if !e.nofail() {
        // cryptblk.target (and the boot) waits for it; a nofail one is only wanted.
        unit.push_str("Before=cryptblk.target\n");
    }
    for (opt, setting) in [
        ("x-systemd.after", "After"),
        ("x-systemd.before", "Before"),
        ("x-systemd.requires", "Requires"),
        ("x-systemd.wants", "Wants"),
    ] {
        for (_, v) in e.options.iter().filter(|(k, _)| k == opt) {
            let _ = writeln!(unit, "{setting}={}", quote(v.as_deref().unwrap_or("")));
        }
    }
    let mut writable: Vec<String> = Vec::new();
    let mut mounts: Vec<String> = Vec::new();
    let mut network = false;
    // The device: a device unit to wait for and stop with, a file on a mount, or storage
    // on the network.
    let device = match crypttab::udev_link(&e.device, Path::new("/dev")) {
        Some((_, Ok(link))) => link.display().to_string(),
        _ => e.device.clone(),
    };
    let remote = ["nbd://", "nbds://", "nbd+tcp://", "nbds+tcp://", "rbd:"];
    if remote.iter().any(|p| device.starts_with(p)) {
        network = true;
    } else if device.starts_with("/dev/") {
        let dev = format!("{}.device", escape_path(&device));
        let _ = writeln!(unit, "BindsTo={dev}\nAfter={dev}");
    } else if device.starts_with('/') {
        mounts.push(device.clone());
        if !has("readonly") && !has("read-only") {
            writable.push(device);
        }
    }
    for path in [e.key_file.clone(), opt("header")].into_iter().flatten() {
        if path.starts_with('/') && !path.starts_with("/dev/") {
            mounts.push(path);
        }
    }
    if let Some(h) = opt("header")
        && h.starts_with('/')
        && !h.starts_with("/dev/")
    {
        writable.push(h);
    }
    // The frontend: a socket's directory to write, a listener on the network, a mount or
    // a kernel device to make.
    let socket = opt("vhost-user-blk")
        .or_else(|| opt("nbd").and_then(|n| n.strip_prefix("unix:").map(str::to_string)));
    if let Some(s) = socket
        && let Some(parent) = Path::new(&s).parent()
    {
        // `-`: a directory that does not exist yet fails the bind with cryptblk's own
        // message, not the unit's namespace set-up.
        writable.push(format!("-{}", parent.display()));
    }
    if opt("nbd").is_some_and(|n| n.starts_with("tcp:")) || has("_netdev") {
        network = true;
    }
    if has("ublk") || opt("fuse").is_some() {
        service.push_str("CapabilityBoundingSet=CAP_SYS_ADMIN\n");
    }
    if opt("fuse").is_some() {
        // The mount is made in the service's mount namespace: none, so that it is seen.
        service.push_str(
            "ProtectSystem=no\nProtectHome=no\nPrivateTmp=no\nReadWritePaths=\n\
             ProtectKernelTunables=no\nProtectControlGroups=no\nProtectKernelLogs=no\n\
             MountFlags=shared\n",
        );
        writable.clear();
    }
    if network {
        unit.push_str("Wants=network-online.target\nAfter=network-online.target\n");
    }
    for m in mounts {
        let _ = writeln!(unit, "RequiresMountsFor={}", quote(&m));
    }
    for w in writable {
        let _ = writeln!(service, "ReadWritePaths={}", quote(&w));
    }
    format!(
        "# Generated by cryptblk-generator from {tab} line {line}.\n\
         [Unit]\nSourcePath={tab}\n{unit}\n[Service]\n{service}",
        tab = tab.display(),
        line = e.line,
    )
}

/// A value as a unit setting takes it: `%` doubled (no specifier expansion), quoted
/// where it holds blanks, quotes or backslashes.
fn quote(p: &str) -> String {
    let p = p.replace('%', "%%");
    if p.chars()
        .any(|c| c.is_whitespace() || c == '"' || c == '\\')
    {
        format!("\"{}\"", p.replace('\\', "\\\\").replace('"', "\\\""))
    } else {
        p
    }
}

/// systemd's path escaping (`systemd-escape --path`): slashes to dashes, the rest of
/// what a unit name cannot hold as `\xNN`.
pub(crate) fn escape_path(path: &str) -> String {
    let parts: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    if parts.is_empty() {
        return "-".into();
    }
    let joined = parts.join("/");
    let mut out = String::new();
    for (i, b) in joined.bytes().enumerate() {
        match b {
            b'/' => out.push('-'),
            b'.' if i == 0 => out.push_str("\\x2e"),
            b if b.is_ascii_alphanumeric() || b == b':' || b == b'_' || b == b'.' => {
                out.push(b as char)
            }
            b => {
                let _ = write!(out, "\\x{b:02x}");
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_escape_as_systemd_escapes_them() {
        for path in [
            "/dev/sdb2",
            "/dev/disk/by-uuid/0d5bd1c5-3bb4",
            "/srv/my vol.img",
            "/dev/disk/by-label/a.b",
            "/.hidden//x/",
        ] {
            let o = std::process::Command::new("systemd-escape")
                .args(["--path", path])
                .output()
                .expect("systemd-escape (apt-get install systemd) checks the escaping");
            assert!(o.status.success());
            assert_eq!(
                escape_path(path),
                String::from_utf8_lossy(&o.stdout).trim(),
                "{path}"
            );
        }
    }
}
