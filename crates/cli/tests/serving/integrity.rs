//! LUKS2 with integrity, and standalone integritysetup volumes, served over NBD (issue 38):
//! what a client writes reads back after a restart; a sector whose ciphertext was changed on the disk reads as EIO over NBD and
//! only that one, the server carries on, and `status` counts it; `--integrity-no-journal`
//! writes what the journal mode reads. (Kill -9 under load:
//! durability.rs; the kernel's side: tests/vm/integrity.sh.)

use crate::common::nbd::NbdClient;
use crate::common::{bin, ok, run_in};
use cryptblk_format::integrity::{Geometry, Superblock};
use std::io::{Read, Seek, SeekFrom, Write};

const BS: usize = 4096;

#[test]
fn a_changed_sector_reads_as_eio_over_nbd_and_status_counts_it() {
    changed_sector_over_nbd(false);
}

/// The same for a standalone integrity volume (HMAC-SHA256, its key from a file).
#[test]
fn a_changed_block_of_a_standalone_volume_reads_as_eio_over_nbd() {
    changed_sector_over_nbd(true);
}

fn changed_sector_over_nbd(standalone: bool) {
    let dir = tempfile::tempdir().unwrap();
    let p = |f: &str| dir.path().join(f).to_str().unwrap().to_string();
    let (img, pw, sock, run_dir) = (p("v.img"), p("pw"), p("s.sock"), p("run"));
    std::fs::File::create(&img)
        .unwrap()
        .set_len(24 << 20)
        .unwrap();
    std::fs::write(&pw, b"integrity passphrase").unwrap();
    let run = |args: &[&str]| ok(&run_in(bin(), args, b""));
    // What opens the volume: the passphrase, or the checksum and its key.
    let unlock: Vec<&str> = if standalone {
        vec![
            "--type",
            "integrity",
            "-I",
            "hmac-sha256",
            "--integrity-key-file",
            &pw,
        ]
    } else {
        vec!["--key-file", &pw]
    };
    let mut format = vec!["format", "-q", "--sector-size", "4096"];
    if standalone {
        format.extend(&unlock);
    } else {
        format.extend([
            "--type",
            "luks2",
            "--cipher",
            "aes-xts-plain64",
            "--integrity",
            "hmac-sha256",
            "--pbkdf",
            "pbkdf2",
            "--pbkdf-force-iterations",
            "1000",
            "--key-file",
            &pw,
        ]);
    }
    format.push(&img);
    run(&format);
    let nbd = format!("unix:{sock}");
    let open_with = |extra: &[&str]| {
        let mut args = vec![
            "open",
            &img,
            "vol",
            "--nbd",
            &nbd,
            "--daemon",
            "--run-dir",
            &run_dir,
        ];
        args.extend(&unlock);
        args.extend(extra);
        run(&args)
    };
    let open = || open_with(&[]);
    let close = || run(&["close", "vol", "--run-dir", &run_dir]);
    // A server with `extra` options writes `d` at `off`, flushes and closes.
    let write_then_close = |extra: &[&str], off: u64, d: &[u8]| {
        open_with(extra);
        let mut c = NbdClient::connect(&sock, "vol").unwrap();
        c.write(off, d).unwrap().unwrap();
        c.flush().unwrap().unwrap();
        c.disconnect();
        close();
    };
    // A server reads `d` back at `off`, and closes.
    let read_back = |off: u64, d: &[u8]| {
        open();
        let mut c = NbdClient::connect(&sock, "vol").unwrap();
        assert_eq!(c.read(off, d.len()).unwrap().unwrap(), d, "at {off}");
        c.disconnect();
        close();
    };
    let data: Vec<u8> = (0..16 * BS).map(|i| (i * 7 % 251) as u8).collect();
    write_then_close(&[], 0, &data);
    // Reopened (the journal replayed and emptied), then closed: the homes are all there is.
    read_back(0, &data);

    // One byte of block 5's ciphertext changed on the disk.
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&img)
        .unwrap();
    let start = if standalone { 0 } else { 16 << 20 };
    let mut sb = [0u8; 512];
    f.seek(SeekFrom::Start(start)).unwrap();
    f.read_exact(&mut sb).unwrap();
    let g = Geometry::of(&Superblock::parse(&sb).unwrap(), start / 512);
    let at = g.data_sector(5 * BS as u64 / 512) * 512 + 9;
    let mut b = [0u8];
    f.seek(SeekFrom::Start(at)).unwrap();
    f.read_exact(&mut b).unwrap();
    f.seek(SeekFrom::Start(at)).unwrap();
    f.write_all(&[b[0] ^ 4]).unwrap();
    drop(f);

    open();
    let mut c = NbdClient::connect(&sock, "vol").unwrap();
    assert_eq!(
        c.read(5 * BS as u64, BS).unwrap(),
        Err(5),
        "EIO for block 5"
    );
    assert_eq!(
        c.read(0, 16 * BS).unwrap(),
        Err(5),
        "EIO for a read over it"
    );
    for blk in [0usize, 4, 6, 15] {
        assert_eq!(
            c.read((blk * BS) as u64, BS).unwrap().unwrap(),
            data[blk * BS..][..BS],
            "block {blk}"
        );
    }
    // Rewritten whole, it reads again.
    c.write(5 * BS as u64, &data[..BS]).unwrap().unwrap();
    assert_eq!(c.read(5 * BS as u64, BS).unwrap().unwrap(), data[..BS]);
    c.disconnect();
    let st = run(&["status", "vol", "--run-dir", &run_dir]);
    assert!(
        st.contains("integrity: 2 sectors failed verification"),
        "{st}"
    );
    let spec = if standalone {
        "hmac-sha256"
    } else {
        "aes-xts-plain64 + hmac(sha256)"
    };
    assert!(st.contains(spec), "{st}");
    close();

    // --integrity-no-journal (mode D) writes what the journal mode then reads.
    write_then_close(&["--integrity-no-journal"], 20 * BS as u64, &data[..2 * BS]);
    read_back(20 * BS as u64, &data[..2 * BS]);
}

/// A detached header (`--header`): the dm-integrity superblock starts the data device (the
/// data offset is 0 there), and what `import` writes, `export` reads back through it.
#[test]
fn integrity_with_a_detached_header() {
    let dir = tempfile::tempdir().unwrap();
    let p = |f: &str| dir.path().join(f).to_str().unwrap().to_string();
    let (img, hdr, pw) = (p("data.img"), p("hdr.img"), p("pw"));
    std::fs::File::create(&img)
        .unwrap()
        .set_len(8 << 20)
        .unwrap();
    std::fs::write(&pw, b"integrity passphrase").unwrap();
    let run = |args: &[&str]| ok(&run_in(bin(), args, b""));
    run(&[
        "format",
        "-q",
        "--type",
        "luks2",
        "--cipher",
        "aes-gcm-random",
        "--integrity",
        "aead",
        "--header",
        &hdr,
        "--pbkdf",
        "pbkdf2",
        "--pbkdf-force-iterations",
        "1000",
        "--key-file",
        &pw,
        &img,
    ]);
    let mut sb = [0u8; 512];
    std::fs::File::open(&img)
        .unwrap()
        .read_exact(&mut sb)
        .unwrap();
    let sb = Superblock::parse(&sb).expect("the superblock at byte 0 of the data device");
    assert_eq!(sb.tag_size, 28);
    let data: Vec<u8> = (0..(1 << 20)).map(|i| (i % 253) as u8).collect();
    std::fs::write(p("in.bin"), &data).unwrap();
    run(&[
        "import",
        "--header",
        &hdr,
        "--key-file",
        &pw,
        &img,
        &p("in.bin"),
    ]);
    run(&[
        "export",
        "--header",
        &hdr,
        "--key-file",
        &pw,
        "--length",
        "1048576",
        &img,
        &p("out.bin"),
    ]);
    assert_eq!(std::fs::read(p("out.bin")).unwrap(), data);
}
