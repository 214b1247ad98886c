//! LUKS1 interoperability with the real cryptsetup, on image files in a temporary directory.

use crate::common::*;
use cryptblk_crypto::{CipherSpec, HashAlg, KdfRequest};
use cryptblk_format::luks1::Luks1Header;
use cryptblk_format::{Error, FormatOptions, LuksHeader};
use std::path::{Path, PathBuf};

const IMAGE_SIZE: u64 = 8 << 20;
const HEADER_FILE_SIZE: u64 = 4 << 20;

fn fast_kdf() -> KdfRequest {
    KdfRequest {
        forced_iterations: Some(1000),
        ..KdfRequest::luks1_default()
    }
}

/// One volume: data image, optional detached header file, and the passphrase file.
struct Vol {
    _dir: tempfile::TempDir,
    dir: PathBuf,
    data: PathBuf,
    header: Option<PathBuf>,
    pass: PathBuf,
}

impl Vol {
    fn new(detached: bool) -> Vol {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().to_path_buf();
        Vol {
            data: image(&path, "data.img", IMAGE_SIZE),
            header: detached.then(|| image(&path, "header.img", HEADER_FILE_SIZE)),
            pass: key_file(&path, "pass", b"correct horse battery"),
            dir: path,
            _dir: dir,
        }
    }

    /// The device that holds the LUKS header.
    fn header_dev(&self) -> &Path {
        self.header.as_deref().unwrap_or(&self.data)
    }

    fn dump(&self) -> Luks1Dump {
        parse_luks1_dump(&luks_dump(&self.data, self.header.as_deref()))
    }

    fn read(&self) -> Luks1Header {
        Luks1Header::read(&mut open_rw(self.header_dev())).unwrap()
    }

    fn cs_format(&self, cipher: &str, key_bits: u32, hash: &str) {
        let bits = key_bits.to_string();
        let mut args: Vec<&std::ffi::OsStr> = vec![
            "luksFormat".as_ref(),
            "--type".as_ref(),
            "luks1".as_ref(),
            "--batch-mode".as_ref(),
            "--pbkdf-force-iterations".as_ref(),
            "1000".as_ref(),
            "--cipher".as_ref(),
            cipher.as_ref(),
            "--key-size".as_ref(),
            bits.as_ref(),
            "--hash".as_ref(),
            hash.as_ref(),
            "--key-file".as_ref(),
            self.pass.as_os_str(),
        ];
        if let Some(h) = &self.header {
            args.extend(["--header".as_ref(), h.as_os_str()]);
        }
        args.push(self.data.as_os_str());
        cryptsetup(&args);
    }
}

/// Our parsed header says exactly what cryptsetup's luksDump says.
fn assert_matches_dump(hdr: &Luks1Header, d: &Luks1Dump) {
    assert_eq!(d.version, 1);
    assert_eq!(hdr.uuid(), d.uuid);
    assert_eq!(hdr.cipher_name(), d.cipher_name);
    assert_eq!(hdr.cipher_mode(), d.cipher_mode);
    assert_eq!(
        hdr.cipher().to_string(),
        format!("{}-{}", d.cipher_name, d.cipher_mode)
    );
    assert_eq!(hdr.hash_spec(), d.hash_spec);
    assert_eq!(u64::from(hdr.payload_offset_sectors()), d.payload_offset);
    assert_eq!(hdr.data_offset(), d.payload_offset * 512);
    assert_eq!(hdr.key_len() * 8, d.mk_bits as usize);
    assert_eq!(&hdr.mk_digest()[..], &d.mk_digest[..]);
    assert_eq!(&hdr.mk_digest_salt()[..], &d.mk_salt[..]);
    assert_eq!(hdr.mk_digest_iterations(), d.mk_iterations);
    assert_eq!(d.slots.len(), 8);
    for (i, ds) in d.slots.iter().enumerate() {
        let s = hdr.slot(i as u32).unwrap();
        assert_eq!(s.active, ds.enabled, "slot {i}");
        if ds.enabled {
            assert_eq!(Some(s.iterations), ds.iterations, "slot {i}");
            assert_eq!(Some(&s.salt[..]), ds.salt.as_deref(), "slot {i}");
            assert_eq!(
                Some(s.key_material_offset),
                ds.key_material_offset,
                "slot {i}"
            );
            assert_eq!(Some(s.stripes), ds.stripes, "slot {i}");
        }
    }
}

const CS_CASES: &[(&str, u32, &str, bool)] = &[
    ("aes-xts-plain64", 256, "sha256", false),
    ("aes-xts-plain64", 512, "sha1", false),
    ("aes-xts-plain64", 512, "sha512", true),
    ("aes-cbc-essiv:sha256", 256, "sha256", false),
    ("aes-cbc-essiv:sha256", 128, "sha512", true),
    ("aes-xts-plain", 512, "sha256", false),
    ("aes-xts-plain", 256, "sha1", true),
    // RIPEMD-160 (RustCrypto's `ripemd`) for PBKDF2 and the AF splitter.
    ("aes-xts-plain64", 256, "ripemd160", false),
    ("aes-cbc-essiv:sha256", 256, "ripemd160", true),
];

#[test]
fn cryptsetup_volumes_read_and_unlock() {
    for &(cipher, bits, hash, detached) in CS_CASES {
        let ctx = format!("{cipher} {bits} {hash} detached={detached}");
        let v = Vol::new(detached);
        v.cs_format(cipher, bits, hash);
        let dump = v.dump();
        let hdr = v.read();
        assert_matches_dump(&hdr, &dump);
        assert_eq!(
            hdr.payload_offset_sectors(),
            if detached { 0 } else { 4096 },
            "{ctx}"
        );

        let vk = dump_volume_key(&v.data, v.header.as_deref(), &v.pass);
        assert_eq!(vk.len(), bits as usize / 8, "{ctx}");
        let mut dev = open_rw(v.header_dev());
        let (slot, key) = hdr
            .unlock(&mut dev, b"correct horse battery", None)
            .unwrap();
        assert_eq!((slot, &key[..]), (0, &vk[..]), "{ctx}");
        assert!(hdr.verify_volume_key(&vk).unwrap(), "{ctx}");
        assert!(
            matches!(
                hdr.unlock(&mut dev, b"correct horse batterY", None),
                Err(Error::WrongPassphrase)
            ),
            "{ctx}"
        );
    }
}

/// Our layout is cryptsetup's: same slot offsets and payload offset for the same options.
#[test]
fn layout_equals_cryptsetup() {
    for &(cipher, bits, hash, detached) in CS_CASES {
        let theirs = Vol::new(detached);
        theirs.cs_format(cipher, bits, hash);
        let theirs = theirs.read();

        let ours = Vol::new(detached);
        let o = options(cipher, bits, hash, detached);
        let vk = vec![0x42u8; o.key_len];
        let ours = Luks1Header::format(&mut open_rw(ours.header_dev()), &o, &vk, b"x").unwrap();
        assert_eq!(
            ours.payload_offset_sectors(),
            theirs.payload_offset_sectors(),
            "{cipher} {bits}"
        );
        assert_eq!(ours.header_size(), theirs.header_size(), "{cipher} {bits}");
        for i in 0..8 {
            assert_eq!(
                ours.slot(i).unwrap().key_material_offset,
                theirs.slot(i).unwrap().key_material_offset,
                "{cipher} {bits} slot {i}"
            );
            assert_eq!(
                ours.slot(i).unwrap().stripes,
                theirs.slot(i).unwrap().stripes
            );
        }
        // --pbkdf-force-iterations: cryptsetup gives the digest the 1000-iteration minimum.
        assert_eq!(theirs.mk_digest_iterations(), 1000);
        assert_eq!(ours.mk_digest_iterations(), 1000);
    }
}

fn options(cipher: &str, bits: u32, hash: &str, detached: bool) -> FormatOptions {
    let mut o = FormatOptions::new(fast_kdf());
    o.cipher = CipherSpec::parse(cipher).unwrap();
    o.key_len = bits as usize / 8;
    o.hash = HashAlg::from_name(hash).unwrap();
    o.detached_header = detached;
    o
}

#[test]
fn our_volumes_open_with_cryptsetup() {
    for (i, &(cipher, bits, hash, detached)) in CS_CASES.iter().enumerate() {
        let ctx = format!("{cipher} {bits} {hash} detached={detached}");
        let v = Vol::new(detached);
        let mut o = options(cipher, bits, hash, detached);
        o.uuid = Some(format!("12345678-9abc-4def-8123-{i:012}"));
        let vk: Vec<u8> = (0..o.key_len).map(|b| (b * 13 + i) as u8).collect();
        let hdr = Luks1Header::format(
            &mut open_rw(v.header_dev()),
            &o,
            &vk,
            b"correct horse battery",
        )
        .unwrap();
        let dump = v.dump();
        assert_matches_dump(&hdr, &dump);
        assert_eq!(
            dump.uuid,
            format!("12345678-9abc-4def-8123-{i:012}"),
            "{ctx}"
        );
        assert_eq!(
            test_passphrase(&v.data, v.header.as_deref(), &v.pass, None),
            0,
            "{ctx}"
        );
        let wrong = key_file(&v.dir, "wrong", b"correct horse batterY");
        assert_eq!(
            test_passphrase(&v.data, v.header.as_deref(), &wrong, None),
            2,
            "{ctx}"
        );
        assert_eq!(
            dump_volume_key(&v.data, v.header.as_deref(), &v.pass),
            vk,
            "{ctx}"
        );
    }
}

#[test]
fn keyslots_cross_tools() {
    let v = Vol::new(false);
    v.cs_format("aes-xts-plain64", 512, "sha256");
    let vk = dump_volume_key(&v.data, None, &v.pass);
    let second = key_file(&v.dir, "second", b"second passphrase");
    let third = key_file(&v.dir, "third", b"third");

    // cryptsetup adds slot 1; we unlock with it.
    let slot1 = "1".to_string();
    cryptsetup(&[
        "luksAddKey".as_ref(),
        "--batch-mode".as_ref(),
        "--pbkdf-force-iterations".as_ref(),
        "1000".as_ref(),
        "--key-slot".as_ref(),
        std::ffi::OsStr::new(&slot1),
        "--key-file".as_ref(),
        v.pass.as_os_str(),
        v.data.as_os_str(),
        second.as_os_str(),
    ]);
    let mut hdr = v.read();
    let mut dev = open_rw(&v.data);
    let (slot, key) = hdr.unlock(&mut dev, b"second passphrase", None).unwrap();
    assert_eq!((slot, &key[..]), (1, &vk[..]));

    // We add slot 6; cryptsetup unlocks with it, and sees it in luksDump.
    assert_eq!(
        hdr.add_keyslot(&mut dev, &vk, b"third", Some(6), &fast_kdf())
            .unwrap(),
        6
    );
    drop(dev);
    assert_eq!(test_passphrase(&v.data, None, &third, Some(6)), 0);
    assert_matches_dump(&hdr, &v.dump());

    // We kill slot 0: cryptsetup sees it disabled and the passphrase no longer opens.
    let mut dev = open_rw(&v.data);
    hdr.kill_keyslot(&mut dev, 0).unwrap();
    drop(dev);
    let dump = v.dump();
    assert!(!dump.slots[0].enabled && dump.slots[1].enabled && dump.slots[6].enabled);
    assert_eq!(test_passphrase(&v.data, None, &v.pass, None), 2);
    assert_eq!(test_passphrase(&v.data, None, &second, None), 0);

    // cryptsetup kills slot 1: we see it inactive and cannot unlock with it.
    cryptsetup(&[
        "luksKillSlot".as_ref(),
        "--batch-mode".as_ref(),
        "--key-file".as_ref(),
        third.as_os_str(),
        v.data.as_os_str(),
        std::ffi::OsStr::new(&slot1),
    ]);
    let hdr = v.read();
    assert!(!hdr.slot(1).unwrap().active && hdr.slot(6).unwrap().active);
    let mut dev = open_rw(&v.data);
    assert!(matches!(
        hdr.unlock(&mut dev, b"second passphrase", None),
        Err(Error::WrongPassphrase)
    ));
    assert!(matches!(
        hdr.unlock(&mut dev, b"second passphrase", Some(1)),
        Err(Error::Keyslot(_))
    ));
    assert_eq!(
        &hdr.unlock(&mut dev, b"third", None).unwrap().1[..],
        &vk[..]
    );
    assert_matches_dump(&hdr, &v.dump());
}

/// `load_header` dispatches a cryptsetup LUKS1 volume to the LUKS1 code.
#[test]
fn load_header_finds_luks1() {
    let v = Vol::new(false);
    v.cs_format("aes-cbc-essiv:sha256", 256, "sha256");
    let h = cryptblk_format::load_header(&mut open_rw(&v.data)).unwrap();
    assert_eq!(h.version(), 1);
    assert_eq!(h.uuid(), v.dump().uuid);
}
