//! The arguments several commands share (clap `Args` groups): where the key comes from,
//! where the header is, the KDF's cost, the volume's type and how to map it.

use crate::error::{CliError, CliResult};
use crate::passphrase::{KeySource, read_key_file};
use clap::Args;
use cryptblk_format::tcrypt::TcryptOptions;
use cryptblk_volume::VolumeType;
use std::path::PathBuf;

/// A standalone integrity volume's checksum (`--type integrity`, integritysetup's options).
#[derive(Args, Debug, Clone, Default)]
pub(crate) struct IntegrityArgs {
    /// --type integrity: the HMAC's key (hmac-sha1, hmac-sha256, hmac-sha512).
    #[arg(long = "integrity-key-file", value_name = "FILE")]
    pub integrity_key_file: Option<PathBuf>,
    /// --type integrity: bytes of HMAC key to read (default: the whole file).
    #[arg(long = "integrity-key-size", value_name = "BYTES")]
    pub integrity_key_size: Option<usize>,
    /// --type integrity: the journal's MAC (integritysetup's option: hmac-sha256, ...),
    /// which makes a changed journal fail to replay; format and open both need it.
    #[arg(long = "journal-integrity", value_name = "ALG")]
    pub journal_integrity: Option<String>,
    /// --type integrity: the journal MAC's key.
    #[arg(long = "journal-integrity-key-file", value_name = "FILE")]
    pub journal_integrity_key_file: Option<PathBuf>,
    /// --type integrity: bytes of journal MAC key to read (default: the whole file).
    #[arg(long = "journal-integrity-key-size", value_name = "BYTES")]
    pub journal_integrity_key_size: Option<usize>,
    /// --type integrity: the journal's encryption, a stream cipher (chacha20, ctr-aes) or a
    /// block cipher (cbc-aes), as integritysetup's option; the superblock does not record
    /// it: format and open both need it.
    #[arg(long = "journal-crypt", value_name = "ALG")]
    pub journal_crypt: Option<String>,
    /// --type integrity: the journal encryption's key.
    #[arg(long = "journal-crypt-key-file", value_name = "FILE")]
    pub journal_crypt_key_file: Option<PathBuf>,
    /// --type integrity: bytes of journal encryption key to read (default: the whole file).
    #[arg(long = "journal-crypt-key-size", value_name = "BYTES")]
    pub journal_crypt_key_size: Option<usize>,
}

impl IntegrityArgs {
    /// The key `algorithm` takes: read from --integrity-key-file for the HMACs (which need
    /// one), none otherwise (a key for a checksum that takes none is refused).
    pub(crate) fn key(&self, algorithm: &str) -> CliResult<Option<cryptblk_crypto::SecretBytes>> {
        keyed_file(
            algorithm,
            self.integrity_key_file.as_deref(),
            self.integrity_key_size,
            "--integrity-key-file",
        )
    }

    /// The journal's encryption (--journal-crypt) and its key, when given.
    pub(crate) fn journal_crypt(
        &self,
    ) -> CliResult<Option<(String, cryptblk_crypto::SecretBytes)>> {
        match (&self.journal_crypt, &self.journal_crypt_key_file) {
            (Some(alg), Some(f)) => Ok(Some((
                alg.clone(),
                read_key_file(f, 0, self.journal_crypt_key_size)?,
            ))),
            (Some(_), None) => Err(CliError::usage(
                "--journal-crypt needs --journal-crypt-key-file.",
            )),
            (None, Some(_)) => Err(CliError::usage(
                "--journal-crypt-key-file needs --journal-crypt.",
            )),
            (None, None) => Ok(None),
        }
    }

    /// The journal's MAC (--journal-integrity) and its key, when given.
    pub(crate) fn journal_mac(
        &self,
    ) -> CliResult<Option<(String, Option<cryptblk_crypto::SecretBytes>)>> {
        let Some(alg) = &self.journal_integrity else {
            if self.journal_integrity_key_file.is_some() {
                return Err(CliError::usage(
                    "--journal-integrity-key-file needs --journal-integrity.",
                ));
            }
            return Ok(None);
        };
        let key = keyed_file(
            alg,
            self.journal_integrity_key_file.as_deref(),
            self.journal_integrity_key_size,
            "--journal-integrity-key-file",
        )?;
        Ok(Some((alg.clone(), key)))
    }
}

/// The key `algorithm` takes, from `file` (given as `option`) for the HMACs, which need
/// one; none for the others, which refuse one.
fn keyed_file(
    algorithm: &str,
    file: Option<&std::path::Path>,
    size: Option<usize>,
    option: &str,
) -> CliResult<Option<cryptblk_crypto::SecretBytes>> {
    let keyed = cryptblk_crypto::IntegrityHash::is_keyed(algorithm)?;
    match (file, keyed) {
        (Some(f), true) => read_key_file(f, 0, size).map(Some),
        (None, true) => Err(CliError::usage(format!(
            "Integrity algorithm {algorithm} needs {option}."
        ))),
        (Some(_), false) => Err(CliError::usage(format!(
            "Integrity algorithm {algorithm} takes no key ({option})."
        ))),
        (None, false) => Ok(None),
    }
}

/// Options that say where the key or passphrase comes from.
#[derive(Args, Debug, Clone, Default)]
pub(crate) struct KeyArgs {
    /// Read the passphrase from this file ("-" for standard input) instead of asking.
    /// TrueCrypt/VeraCrypt (--type tcrypt): keyfiles, repeatable; the passphrase is asked.
    #[arg(short = 'd', long = "key-file", action = clap::ArgAction::Append)]
    pub key_files: Vec<PathBuf>,
    /// Bytes to read from the key file.
    #[arg(short = 'l', long = "keyfile-size")]
    pub keyfile_size: Option<usize>,
    /// Bytes to skip at the start of the key file.
    #[arg(long = "keyfile-offset", default_value_t = 0)]
    pub keyfile_offset: u64,
    /// Ask for a passphrase typed on the terminal twice (cryptsetup's -y; a key file or
    /// piped stdin is read once).
    #[arg(short = 'y', long = "verify-passphrase")]
    pub verify_passphrase: bool,
    /// Ask for the passphrase through systemd's password agents (systemd-ask-password:
    /// the console, Plymouth, `systemd-tty-ask-password-agent`), as systemd-cryptsetup
    /// does; for services, whose stdin is no terminal (cryptblk@.service uses it).
    #[arg(long = "ask-password")]
    pub ask_password: bool,
}

/// Where the LUKS header is.
#[derive(Args, Debug, Clone, Default)]
pub(crate) struct HeaderArgs {
    /// Detached header file (the device then holds only data).
    #[arg(long)]
    pub header: Option<PathBuf>,
}

/// KDF cost options (luksFormat / luksAddKey).
#[derive(Args, Debug, Clone, Default)]
pub(crate) struct KdfArgs {
    /// pbkdf2, argon2i or argon2id.
    #[arg(long)]
    pub pbkdf: Option<String>,
    /// Target unlock time in milliseconds.
    #[arg(short = 'i', long = "iter-time")]
    pub iter_time: Option<u32>,
    /// Fixed PBKDF2 iterations or Argon2 time cost (no benchmark).
    #[arg(long = "pbkdf-force-iterations")]
    pub pbkdf_force_iterations: Option<u32>,
    /// Argon2 memory cost in KiB.
    #[arg(long = "pbkdf-memory")]
    pub pbkdf_memory: Option<u32>,
    /// Argon2 parallel lanes.
    #[arg(long = "pbkdf-parallel")]
    pub pbkdf_parallel: Option<u32>,
    /// Hash for PBKDF2 and the anti-forensic splitter.
    #[arg(short = 'h', long)]
    pub hash: Option<String>,
    /// LUKS2: cipher of the keyslot area (default: the data cipher), with
    /// --keyslot-key-size.
    #[arg(long = "keyslot-cipher", requires = "keyslot_key_size")]
    pub keyslot_cipher: Option<String>,
    /// LUKS2: key size of the keyslot area cipher, in bits, with --keyslot-cipher.
    #[arg(long = "keyslot-key-size", requires = "keyslot_cipher")]
    pub keyslot_key_size: Option<usize>,
}

impl KdfArgs {
    /// `--keyslot-cipher` and `--keyslot-key-size` (in bytes), when given.
    pub(crate) fn keyslot_encryption(&self) -> CliResult<Option<(String, usize)>> {
        match (&self.keyslot_cipher, self.keyslot_key_size) {
            (Some(c), Some(bits)) if bits % 8 == 0 => Ok(Some((c.clone(), bits / 8))),
            (Some(_), Some(bits)) => Err(CliError::usage(format!(
                "--keyslot-key-size {bits} is not a whole number of bytes"
            ))),
            _ => Ok(None),
        }
    }

    /// Applies `--keyslot-cipher`/`--keyslot-key-size` to the keyslots `hdr` writes next.
    pub(crate) fn apply_keyslot_encryption(
        &self,
        hdr: &mut dyn cryptblk_format::LuksHeader,
    ) -> CliResult<()> {
        if let Some((c, bytes)) = self.keyslot_encryption()? {
            hdr.set_keyslot_encryption(&c, bytes)?;
        }
        Ok(())
    }
}

#[derive(Args, Debug)]
pub(crate) struct DeviceArgs {
    /// Image file or block device.
    pub device: PathBuf,
    #[command(flatten)]
    pub header: HeaderArgs,
}

impl KeyArgs {
    /// The key file, for everything but TCRYPT (which takes several keyfiles).
    pub(crate) fn key_file(&self) -> Option<&PathBuf> {
        self.key_files.first()
    }

    /// Where the passphrase or key comes from, as the arguments say.
    pub(crate) fn source(&self) -> KeySource {
        KeySource {
            key_file: self.key_file().cloned(),
            extra_key_files: self.key_files.len().saturating_sub(1),
            keyfile_size: self.keyfile_size,
            keyfile_offset: self.keyfile_offset,
            verify: self.verify_passphrase,
            ask_password: self.ask_password,
        }
    }
}

/// `--type` and the TCRYPT search options of `test-passphrase` and `dump`.
#[derive(Args, Debug, Clone, Default)]
pub(crate) struct TypeSelect {
    /// luks (detected), tcrypt (TrueCrypt/VeraCrypt; cryptsetup's tcryptDump/open
    /// --test-passphrase --type tcrypt), bitlk (BitLocker; bitlkDump) or fvault2
    /// (FileVault 2; fvault2Dump).
    #[arg(long = "type", value_enum)]
    pub kind: Option<VolumeType>,
    #[command(flatten)]
    pub tcrypt: crate::args::TcryptArgs,
    /// TCRYPT: only cipher chains whose name contains this.
    #[arg(short = 'c', long)]
    pub cipher: Option<String>,
    /// TCRYPT: only this KDF: a PBKDF2 hash, or argon2id (VeraCrypt 1.26.29+).
    #[arg(short = 'h', long)]
    pub hash: Option<String>,
}

impl TypeSelect {
    /// Whether `--type tcrypt` was given; any other type but LUKS, BITLK and FVAULT2 is
    /// refused.
    pub(crate) fn is_tcrypt(&self) -> CliResult<bool> {
        match self.kind {
            Some(VolumeType::Tcrypt) => Ok(true),
            None
            | Some(
                VolumeType::Luks
                | VolumeType::Luks1
                | VolumeType::Luks2
                | VolumeType::Bitlk
                | VolumeType::Fvault2,
            ) => Ok(false),
            Some(k) => Err(CliError::usage(format!(
                "unsupported --type {k} here (luks, tcrypt, bitlk, fvault2)"
            ))),
        }
    }

    /// Whether `--type fvault2` was given.
    pub(crate) fn is_fvault2(&self) -> bool {
        self.kind == Some(VolumeType::Fvault2)
    }

    /// Whether `--type bitlk` was given.
    pub(crate) fn is_bitlk(&self) -> bool {
        self.kind == Some(VolumeType::Bitlk)
    }

    /// The volume arguments of a TCRYPT `test-passphrase`/`dump`: read-only, the filters.
    pub(crate) fn tcrypt_args(
        &self,
        header: &HeaderArgs,
        key: &KeyArgs,
    ) -> crate::args::VolumeArgs {
        crate::args::VolumeArgs {
            header: header.clone(),
            key: key.clone(),
            kind: VolumeType::Tcrypt,
            tcrypt: self.tcrypt.clone(),
            cipher: self.cipher.clone(),
            hash: self.hash.clone(),
            read_only: true,
            ..Default::default()
        }
    }
}

/// Everything that says how to unlock and map a volume.
#[derive(Args, Debug, Clone, Default)]
pub(crate) struct VolumeArgs {
    #[command(flatten)]
    pub header: HeaderArgs,
    #[command(flatten)]
    pub key: KeyArgs,
    /// luks (LUKS1 or LUKS2, detected), luks1, luks2, plain, loopaes, tcrypt
    /// (TrueCrypt/VeraCrypt), bitlk (BitLocker) or fvault2 (FileVault 2).
    #[arg(long = "type", value_enum, default_value_t = VolumeType::Luks)]
    pub kind: VolumeType,
    /// Open with the volume key in this file (raw bytes, as `dump --dump-volume-key
    /// --volume-key-file` writes it) instead of a passphrase: LUKS (no keyslot used; the
    /// key is checked against the header's digest), BitLocker, FileVault 2.
    #[arg(long = "volume-key-file", alias = "master-key-file")]
    pub volume_key_file: Option<std::path::PathBuf>,
    /// With --test-passphrase, LUKS2: check against the unbound keys' keyslots.
    #[arg(long)]
    pub unbound: bool,
    #[command(flatten)]
    pub tokens: crate::tokens::TokenArgs,
    #[command(flatten)]
    pub tcrypt: TcryptArgs,
    #[arg(short = 'S', long = "key-slot")]
    pub key_slot: Option<u32>,
    /// Open read-only.
    #[arg(short = 'r', long = "readonly", alias = "read-only")]
    pub read_only: bool,
    /// Pass discards (TRIM) down to the storage (reveals unused blocks; off by default).
    #[arg(long = "allow-discards")]
    pub allow_discards: bool,
    /// LUKS2 with integrity: write without dm-integrity's journal (faster; a crash during
    /// a write can leave that sector failing verification, as with the kernel's mode D).
    #[arg(long = "integrity-no-journal", short = 'D')]
    pub integrity_no_journal: bool,
    /// --type integrity: dm-integrity's bitmap mode: writes go straight home, each region
    /// marked in a bitmap on the device first; after a crash the marked regions' tags are
    /// recalculated (faster writes than the journal; a torn write is not rolled back).
    #[arg(long = "integrity-bitmap-mode", short = 'B')]
    pub integrity_bitmap: bool,
    /// --type integrity: the checksum the volume was formatted with (crc32c, crc32,
    /// sha1, sha256, sha512, hmac-sha1, hmac-sha256, hmac-sha512; default crc32c). The
    /// superblock does not record it.
    #[arg(short = 'I', long = "integrity")]
    pub integrity: Option<String>,
    #[command(flatten)]
    pub integrity_key: IntegrityArgs,
    /// Plain mode: cipher specification.
    #[arg(short = 'c', long)]
    pub cipher: Option<String>,
    /// Plain mode: key size in bits.
    #[arg(short = 's', long = "key-size")]
    pub key_size: Option<usize>,
    /// Plain mode: passphrase hash (sha256, ripemd160, plain, sha256:LEN, ...); TCRYPT: only
    /// this header KDF (a PBKDF2 hash, or argon2id).
    #[arg(short = 'h', long)]
    pub hash: Option<String>,
    /// Plain mode: data start on the device, in 512-byte sectors.
    #[arg(short = 'o', long)]
    pub offset: Option<u64>,
    /// Plain mode: IV offset in 512-byte sectors.
    #[arg(short = 'p', long)]
    pub skip: Option<u64>,
    /// Plain mode: size in 512-byte sectors.
    #[arg(short = 'b', long)]
    pub size: Option<u64>,
    /// Plain mode: encryption sector size.
    #[arg(long = "sector-size")]
    pub sector_size: Option<u32>,
    /// Plain mode: IVs count encryption sectors, not 512-byte sectors.
    #[arg(long = "iv-large-sectors")]
    pub iv_large_sectors: bool,
    /// How the image is read and written: auto (mmap for an image on tmpfs/ramfs, psync
    /// otherwise), psync (pread/pwrite), io_uring or mmap (a shared mapping).
    #[arg(long = "io-engine", default_value = "auto")]
    pub io_engine: cryptblk_volume::IoEngine,
    /// Bypass the page cache (O_DIRECT) for the image.
    #[arg(long = "direct-io")]
    pub direct_io: bool,
}

impl VolumeArgs {
    pub(crate) fn file_io(&self) -> cryptblk_volume::FileIo {
        cryptblk_volume::FileIo {
            engine: self.io_engine,
            direct: self.direct_io,
        }
    }
}

/// TrueCrypt/VeraCrypt options (cryptsetup's names); `-c`/`-h` narrow the cipher chains
/// and header KDFs tried.
#[derive(Args, Debug, Clone, Default)]
pub(crate) struct TcryptArgs {
    /// TCRYPT: open the hidden volume.
    #[arg(long = "tcrypt-hidden")]
    pub hidden: bool,
    /// TCRYPT: a system-encrypted disk (header at sector 62).
    #[arg(long = "tcrypt-system")]
    pub system: bool,
    /// TCRYPT: use the backup header at the end of the device.
    #[arg(long = "tcrypt-backup")]
    pub backup: bool,
    /// TCRYPT: try VeraCrypt's formats too (the default; kept for cryptsetup's scripts).
    #[arg(long)]
    pub veracrypt: bool,
    /// TCRYPT: TrueCrypt formats only.
    #[arg(long = "disable-veracrypt", conflicts_with = "veracrypt")]
    pub disable_veracrypt: bool,
    /// TCRYPT: VeraCrypt's Personal Iterations Multiplier.
    #[arg(long = "veracrypt-pim")]
    pub pim: Option<u32>,
}

impl VolumeArgs {
    /// The TCRYPT options with the keyfiles read (`--key-file`, each at most 1 MiB used).
    pub(crate) fn tcrypt_options(&self) -> CliResult<TcryptOptions> {
        let t = &self.tcrypt;
        if (t.hidden || t.system || t.backup || t.pim.is_some() || t.disable_veracrypt)
            && self.kind != VolumeType::Tcrypt
        {
            return Err(CliError::usage(
                "Options --tcrypt-hidden, --tcrypt-system, --tcrypt-backup, --veracrypt-pim and --disable-veracrypt are supported only for TCRYPT devices.",
            ));
        }
        if t.hidden && t.system {
            return Err(CliError::usage(
                "--tcrypt-hidden and --tcrypt-system cannot be combined.",
            ));
        }
        if t.hidden && self.allow_discards {
            return Err(CliError::usage(
                "Option --tcrypt-hidden cannot be combined with --allow-discards.",
            ));
        }
        let keyfiles = self
            .key
            .key_files
            .iter()
            .map(|f| read_key_file(f, 0, None).map(trim_keyfile))
            .collect::<CliResult<Vec<_>>>()?;
        Ok(TcryptOptions {
            hidden: t.hidden,
            system: t.system,
            backup: t.backup,
            no_veracrypt: t.disable_veracrypt,
            pim: t.pim,
            kdf: self
                .hash
                .as_deref()
                .map(cryptblk_format::tcrypt::TcryptKdf::from_name)
                .transpose()?,
            cipher: self.cipher.clone(),
            keyfiles,
            partition_start: None,
        })
    }
}

/// A keyfile's first MiB (all TrueCrypt reads).
fn trim_keyfile(k: cryptblk_crypto::SecretBytes) -> cryptblk_crypto::SecretBytes {
    if k.len() > cryptblk_format::tcrypt::KEYFILE_MAX {
        cryptblk_crypto::SecretBytes::from_slice(&k[..cryptblk_format::tcrypt::KEYFILE_MAX])
    } else {
        k
    }
}

/// cryptsetup's options that every action takes, and what each means here. A script
/// written for cryptsetup passes them; cryptblk honours what applies to it.
#[derive(Args, Debug, Clone, Default)]
pub(crate) struct CompatArgs {
    /// Print more about what is done (as -v: cryptblk has no separate debug log).
    #[arg(long, global = true)]
    pub debug: bool,
    /// As --debug (cryptsetup: JSON metadata in the debug log too).
    #[arg(long = "debug-json", global = true)]
    pub debug_json: bool,
    /// Accepted for cryptsetup's scripts: cryptblk's locks are flock(2) on the device
    /// itself and need no lock directory, so they are kept.
    #[arg(long = "disable-locks", global = true)]
    pub disable_locks: bool,
    /// Accepted (cryptsetup 2.7's option): the one signature check cryptblk makes still
    /// applies (a LUKS2 header with a damaged copy is refused while another format's
    /// signature is on the device; `repair` overrides it).
    #[arg(long = "disable-blkid", global = true)]
    pub disable_blkid: bool,
    /// Accepted: cryptblk never puts keys in the kernel keyring.
    #[arg(long = "disable-keyring", global = true)]
    pub disable_keyring: bool,
    /// Accepted: cryptblk loads no external token plugins.
    #[arg(long = "disable-external-tokens", global = true)]
    pub disable_external_tokens: bool,
    /// Accepted: cryptblk checks no password quality rules.
    #[arg(long = "force-password", global = true)]
    pub force_password: bool,
    /// Accepted: one cryptblk process derives one memory-hard key at a time; processes
    /// are not serialized against each other (not yet honoured).
    #[arg(long = "serialize-memory-hard-pbkdf", global = true)]
    pub serialize_memory_hard_pbkdf: bool,
    /// Accepted: seconds to wait for a passphrase typed at a terminal (not yet honoured:
    /// cryptblk waits).
    #[arg(short = 't', long = "timeout", global = true, value_name = "SECONDS")]
    pub timeout: Option<u64>,
    /// How many times a passphrase typed at a terminal is asked for when it is wrong
    /// (default 3, as cryptsetup; LUKS open/test-passphrase and luksResume).
    #[arg(short = 'T', long = "tries", global = true, value_name = "N")]
    pub tries: Option<u32>,
}
