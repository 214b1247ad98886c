//! Man pages from the clap definitions that parse the command line (clap_mangen):
//! cryptblk(8), and cryptblk-COMMAND(8) for each command, with the parts clap cannot know
//! written here (frontends, examples, exit status, security, files, environment).
//! `cryptblk generate-man DIR` (hidden) writes them; `make man` and the package call it.

use clap::Command;
use roff::{Roff, bold, italic, roman};
use std::path::Path;

/// Writes cryptblk.8 and cryptblk-COMMAND.8 (every command not hidden) into `dir`.
pub(crate) fn write_all(cmd: Command, dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let mut cmd = cmd.long_about(DESCRIPTION).version(crate::VERSION);
    cmd.build();
    let mut out = Vec::new();
    let man = clap_mangen::Man::new(cmd.clone())
        .section("8")
        .manual("System Administration");
    man.render_title(&mut out)?;
    man.render_name_section(&mut out)?;
    man.render_synopsis_section(&mut out)?;
    man.render_description_section(&mut out)?;
    man.render_options_section(&mut out)?;
    man.render_subcommands_section(&mut out)?;
    let mut extra = Roff::new();
    frontends(&mut extra);
    examples(&mut extra, "cryptblk");
    exit_status(&mut extra);
    security(&mut extra);
    files(&mut extra);
    environment(&mut extra);
    see_also(&mut extra, None);
    extra.to_writer(&mut out)?;
    man.render_version_section(&mut out)?;
    std::fs::write(dir.join("cryptblk.8"), out)?;
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        let name = format!("cryptblk-{}", sub.get_name());
        let sub = sub
            .clone()
            .name(&name)
            .bin_name(format!("cryptblk {}", sub.get_name()))
            .version(crate::VERSION);
        let man = clap_mangen::Man::new(sub.clone())
            .section("8")
            .manual("System Administration");
        let mut out = Vec::new();
        man.render_title(&mut out)?;
        man.render_name_section(&mut out)?;
        man.render_synopsis_section(&mut out)?;
        man.render_description_section(&mut out)?;
        man.render_options_section(&mut out)?;
        if sub.has_subcommands() {
            man.render_subcommands_section(&mut out)?;
        }
        let mut extra = Roff::new();
        examples(&mut extra, &name);
        see_also(&mut extra, Some(&name));
        extra.to_writer(&mut out)?;
        std::fs::write(dir.join(format!("{name}.8")), out)?;
    }
    Ok(())
}

const DESCRIPTION: &str = "cryptblk does the work of cryptsetup and the kernel's dm-crypt in \
userspace, without root where the device allows it: it formats and manages LUKS1 and LUKS2 \
headers bit for bit as cryptsetup does, opens LUKS1/LUKS2, plain, loop-AES, TrueCrypt/VeraCrypt, \
BitLocker and FileVault 2 volumes and LUKS2 volumes with integrity, and serves the decrypted \
volume as a block device through a frontend (NBD, FUSE, ublk, vhost-user-blk) until it is \
closed. Every I/O is encrypted on the thread that received it. Devices may be local files, \
block devices, NBD exports on other hosts and Ceph RBD images. Run as cryptsetup (a link of \
that name), it takes cryptsetup's grammar, for scripts written for it.";

fn section(r: &mut Roff, title: &str) {
    r.control("SH", [title]);
}

fn para(r: &mut Roff, text: &str) {
    r.control("PP", []).text([roman(text)]);
}

fn item(r: &mut Roff, term: &str, text: &str) {
    r.control("TP", []).text([bold(term)]).text([roman(text)]);
}

fn code(r: &mut Roff, lines: &str) {
    r.control("PP", []).control("nf", []).control("RS", ["4"]);
    for l in lines.lines() {
        r.text([roman(l)]);
    }
    r.control("RE", []).control("fi", []);
}

fn frontends(r: &mut Roff) {
    section(r, "FRONTENDS");
    para(r, "open serves the plaintext through exactly one frontend:");
    item(
        r,
        "--nbd unix:PATH | tcp:HOST:PORT",
        "NBD (the network block device protocol): nbd-client, qemu, nbdkit, libnbd connect \
         to it. A unix socket is 0600 unless --socket-mode; TCP is loopback only unless \
         --insecure-listen or TLS with client certificates (--tls-cert, --tls-key, --tls-ca).",
    );
    item(
        r,
        "--fuse DIR",
        "a file DIR/NAME in a FUSE mount, to loop-mount or use as it is.",
    );
    item(
        r,
        "--ublk",
        "a real block device /dev/ublkbN through the kernel's ublk driver (ublk_drv).",
    );
    item(
        r,
        "--vhost-user-blk SOCKET",
        "a virtio-blk disk for a virtual machine (QEMU's vhost-user-blk-pci), with guest \
         memory shared.",
    );
}

fn examples(r: &mut Roff, page: &str) {
    let text = match page {
        "cryptblk" => {
            "cryptblk format --type luks2 disk.img\n\
             cryptblk open disk.img vol --nbd unix:/run/vol.sock --daemon\n\
             nbd-client -unix /run/vol.sock /dev/nbd0 -N vol\n\
             cryptblk close vol\n\
             sudo cryptblk open /dev/sdb1 data --ublk --daemon   # /dev/ublkb0\n\
             cryptblk export disk.img plain.raw                  # the plaintext, to a file\n\
             sudo cryptblk attach-all                            # /etc/cryptblktab"
        }
        "cryptblk-open" => {
            "cryptblk open disk.img vol --nbd unix:/run/vol.sock --daemon\n\
             cryptblk open /dev/sdb1 data --ublk --key-file /etc/keys/data\n\
             cryptblk open vm1.img vm1 --vhost-user-blk /run/vm1.sock --daemon\n\
             cryptblk open nbd://storage.example/disk1 vol --fuse /mnt/crypt\n\
             cryptblk open --crypttab /etc/cryptblktab home"
        }
        "cryptblk-format" => {
            "cryptblk format --type luks2 disk.img\n\
             cryptblk format --type luks2 --integrity hmac-sha256 disk.img\n\
             cryptblk format --type luks1 --cipher aes-xts-plain64 --key-size 512 /dev/sdb1"
        }
        "cryptblk-attach-all" | "cryptblk-detach-all" => {
            "# /etc/cryptblktab: NAME DEVICE KEY-FILE OPTIONS\n\
             home UUID=0d5bd1c5-3bb4-4e6c-9e63-7bd6e64e9f5a /etc/keys/home luks,nbd=unix:/run/home.nbd\n\
             backup LABEL=bk none luks,noauto\n\
             \n\
             sudo cryptblk attach-all\n\
             sudo cryptblk detach-all"
        }
        _ => return,
    };
    section(r, "EXAMPLES");
    code(r, text);
}

fn exit_status(r: &mut Roff) {
    section(r, "EXIT STATUS");
    para(r, "As cryptsetup's:");
    for (code, what) in [
        ("0", "success"),
        ("1", "wrong parameters, or an invalid or corrupt header"),
        ("2", "no permission, or a wrong passphrase"),
        ("3", "out of memory"),
        (
            "4",
            "wrong device: missing, unreadable, or unreachable storage",
        ),
        ("5", "device busy: held by another cryptblk"),
    ] {
        item(r, code, what);
    }
}

fn security(r: &mut Roff) {
    section(r, "SECURITY");
    para(
        r,
        "Passphrases and keys are held in locked memory (never swapped), wiped when no longer \
         needed, never written to logs and never taken in argv: key files, standard input, the \
         terminal, systemd's password agents (--ask-password) or tokens give them. A process \
         holding a key is neither dumpable nor traceable by other processes of its user.",
    );
    para(
        r,
        "Whoever can connect to a frontend reads and writes the plaintext: sockets are created \
         0600 and the run directory 0700, both checked before use; TCP listens on loopback \
         only unless told otherwise.",
    );
    para(
        r,
        "XTS and the other length-preserving modes hide data but do not protect it: whoever \
         can write the ciphertext can replace sectors undetected. LUKS2 with --integrity \
         detects that; a sector that fails its check reads as an I/O error.",
    );
}

fn files(r: &mut Roff) {
    section(r, "FILES");
    item(
        r,
        "/etc/cryptblktab",
        "volumes for attach-all, detach-all and open --crypttab, in crypttab(5) syntax.",
    );
    item(
        r,
        "$XDG_RUNTIME_DIR/cryptblk, /run/cryptblk (root)",
        "the run directory: each served volume's pid file, control socket and log.",
    );
    item(
        r,
        "/usr/lib/systemd/system/cryptblk@.service, cryptblk.target",
        "a service per volume (Type=notify), pulled in by cryptblk-generator for each \
         entry of /etc/cryptblktab.",
    );
}

fn environment(r: &mut Roff) {
    section(r, "ENVIRONMENT");
    item(
        r,
        "XDG_RUNTIME_DIR",
        "where the run directory is (--run-dir overrides it).",
    );
    item(
        r,
        "CRYPTBLK_CRYPTTAB",
        "the crypttab file cryptblk-generator reads.",
    );
    item(
        r,
        "NOTIFY_SOCKET",
        "set by systemd: readiness, status and stopping are told there.",
    );
    item(
        r,
        "COMPLETE",
        "bash, zsh or fish: print the shell completion script (COMPLETE=bash cryptblk).",
    );
    item(r, "CEPH_CONF", "the Ceph configuration for rbd: devices.");
}

fn see_also(r: &mut Roff, page: Option<&str>) {
    section(r, "SEE ALSO");
    let mut refs: Vec<(String, &str)> = Vec::new();
    if page.is_some() {
        refs.push(("cryptblk".into(), "8"));
    }
    for (p, s) in [
        ("cryptsetup", "8"),
        ("crypttab", "5"),
        ("integritysetup", "8"),
        ("systemd-cryptsetup", "8"),
        ("nbd-client", "8"),
    ] {
        refs.push((p.into(), s));
    }
    let mut line = Vec::new();
    for (i, (p, s)) in refs.iter().enumerate() {
        line.push(italic(p.as_str()));
        line.push(roman(if i + 1 < refs.len() {
            format!("({s}), ")
        } else {
            format!("({s})")
        }));
    }
    r.text(line);
}
