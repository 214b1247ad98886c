//! `dump`'s text: cryptsetup's `luksDump` layout, field for field (names, order, units,
//! tabs and hex wrapping as cryptsetup 2.6 prints them), so scripts that parse
//! cryptsetup's output work on cryptblk's. Tested byte for byte against the real
//! cryptsetup (`crates/cli/tests/formats/luksdump.rs`).

use base64::Engine;
use cryptblk_format::LuksHeader;
use cryptblk_format::luks1::Luks1Header;
use cryptblk_format::luks2::Luks2Header;
use serde_json::Value;
use std::fmt::Write;

/// cryptsetup's limits on object ids it prints (keyslots, tokens, segments, digests).
const MAX_IDS: u32 = 32;

/// Bytes as cryptsetup's `crypt_log_hex`: each byte in hex followed by `sep`, `wrap`
/// before every `every`-th byte (0: never).
fn hex(out: &mut String, bytes: &[u8], sep: &str, every: usize, wrap: &str) {
    for (i, b) in bytes.iter().enumerate() {
        if every > 0 && i > 0 && i % every == 0 {
            out.push_str(wrap);
        }
        let _ = write!(out, "{b:02x}{sep}");
    }
}

/// A base64 JSON field as cryptsetup's `hexprint_base64`: 16 bytes a line.
fn hex_b64(out: &mut String, v: &Value) {
    let bytes = v
        .as_str()
        .and_then(|s| base64::engine::general_purpose::STANDARD.decode(s).ok())
        .unwrap_or_default();
    hex(out, &bytes, " ", 16, "\n\t            ");
    out.push('\n');
}

/// `luksDump` of a LUKS1 header read from `path`.
pub(crate) fn luks1(h: &Luks1Header, path: &str) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "LUKS header information for {path}\n");
    let _ = writeln!(o, "Version:       \t1");
    let _ = writeln!(o, "Cipher name:   \t{}", h.cipher_name());
    let _ = writeln!(o, "Cipher mode:   \t{}", h.cipher_mode());
    let _ = writeln!(o, "Hash spec:     \t{}", h.hash_spec());
    let _ = writeln!(o, "Payload offset:\t{}", h.payload_offset_sectors());
    let _ = writeln!(o, "MK bits:       \t{}", h.key_bytes() * 8);
    o.push_str("MK digest:     \t");
    hex(&mut o, h.mk_digest(), " ", 0, "");
    o.push_str("\nMK salt:       \t");
    let salt = h.mk_digest_salt();
    hex(&mut o, &salt[..16], " ", 0, "");
    o.push_str("\n               \t");
    hex(&mut o, &salt[16..], " ", 0, "");
    let _ = writeln!(o, "\nMK iterations: \t{}", h.mk_digest_iterations());
    let _ = writeln!(o, "UUID:          \t{}\n", LuksHeader::uuid(h));
    for i in 0..8 {
        match h.slot(i).filter(|s| s.active) {
            Some(s) => {
                let _ = writeln!(o, "Key Slot {i}: ENABLED");
                let _ = writeln!(o, "\tIterations:         \t{}", s.iterations);
                o.push_str("\tSalt:               \t");
                hex(&mut o, &s.salt[..16], " ", 0, "");
                o.push_str("\n\t                      \t");
                hex(&mut o, &s.salt[16..], " ", 0, "");
                let _ = writeln!(o, "\n\tKey material offset:\t{}", s.key_material_offset);
                let _ = writeln!(o, "\tAF stripes:            \t{}", s.stripes);
            }
            None => {
                let _ = writeln!(o, "Key Slot {i}: DISABLED");
            }
        }
    }
    o
}

/// The object `id` of a JSON section (`keyslots`, `tokens`, ...), if present.
fn object<'a>(j: &'a Value, section: &str, id: u32) -> Option<&'a Value> {
    j[section].as_object()?.get(&id.to_string())
}

fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "(null)".into(),
        other => other.to_string(),
    }
}

/// The digest a keyslot is bound to (the first that lists it), as cryptsetup finds it.
fn digest_of(j: &Value, list: &str, id: &str) -> Option<String> {
    j["digests"].as_object()?.iter().find_map(|(d, v)| {
        v[list]
            .as_array()?
            .iter()
            .any(|x| x.as_str() == Some(id))
            .then(|| d.clone())
    })
}

/// cryptsetup's "(unbound)": a keyslot whose digest no segment uses.
fn unbound(j: &Value, slot: u32) -> bool {
    let Some(d) = digest_of(j, "keyslots", &slot.to_string()) else {
        return true;
    };
    // cryptsetup looks at ids 0..n, n the number of segments that are not backups.
    let segments = j["segments"].as_object().map_or(0, |s| {
        s.values()
            .filter(|v| !list(&v["flags"]).iter().any(|f| f.starts_with("backup-")))
            .count()
    });
    !(0..segments).any(|s| digest_of(j, "segments", &s.to_string()).as_deref() == Some(&d))
}

/// `luksDump` of a LUKS2 header.
pub(crate) fn luks2(h: &Luks2Header) -> String {
    let j = h.json();
    let mut o = String::new();
    let or = |s: &str, none: &str| {
        if s.is_empty() {
            none.to_string()
        } else {
            s.to_string()
        }
    };
    let _ = writeln!(o, "LUKS header information");
    let _ = writeln!(o, "Version:       \t2");
    let _ = writeln!(o, "Epoch:         \t{}", h.seqid());
    let _ = writeln!(o, "Metadata area: \t{} [bytes]", h.hdr_size());
    let _ = writeln!(o, "Keyslots area: \t{} [bytes]", h.keyslots_size());
    let _ = writeln!(
        o,
        "UUID:          \t{}",
        or(LuksHeader::uuid(h), "(no UUID)")
    );
    let _ = writeln!(o, "Label:         \t{}", or(h.label(), "(no label)"));
    let _ = writeln!(
        o,
        "Subsystem:     \t{}",
        or(h.subsystem(), "(no subsystem)")
    );
    config(&mut o, j);
    segments(&mut o, j);
    keyslots(&mut o, j);
    tokens(&mut o, j);
    digests(&mut o, j);
    o
}

fn list(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| a.iter().map(text).collect())
        .unwrap_or_default()
}

fn config(o: &mut String, j: &Value) {
    let flags = list(&j["config"]["flags"]);
    let reqs = list(&j["config"]["requirements"]["mandatory"]);
    o.push_str("Flags:       \t");
    for f in &flags {
        let _ = write!(o, "{f} ");
    }
    let _ = write!(
        o,
        "{}\n{}",
        if flags.is_empty() { "(no flags)" } else { "" },
        if reqs.is_empty() { "\n" } else { "" }
    );
    if !reqs.is_empty() {
        o.push_str("Requirements:\t");
        for r in &reqs {
            let _ = write!(o, "{r} ");
        }
        o.push_str("\n\n");
    }
}

fn segments(o: &mut String, j: &Value) {
    o.push_str("Data segments:\n");
    for i in 0..MAX_IDS {
        let Some(s) = object(j, "segments", i) else {
            continue;
        };
        let _ = writeln!(o, "  {i}: {}", text(&s["type"]));
        let _ = writeln!(o, "\toffset: {} [bytes]", text(&s["offset"]));
        match s["size"].as_str() {
            Some("dynamic") => o.push_str("\tlength: (whole device)\n"),
            _ => {
                let _ = writeln!(o, "\tlength: {} [bytes]", text(&s["size"]));
            }
        }
        if let Some(c) = s.get("encryption") {
            let _ = writeln!(o, "\tcipher: {}", text(c));
        }
        if let Some(ss) = s.get("sector_size") {
            let _ = writeln!(o, "\tsector: {} [bytes]", text(ss));
        }
        if let Some(t) = s.get("integrity").and_then(|i| i.get("type")) {
            let _ = writeln!(o, "\tintegrity: {}", text(t));
        }
        let flags = list(&s["flags"]);
        if !flags.is_empty() {
            let _ = writeln!(o, "\tflags : {}", flags.join(", "));
        }
        o.push('\n');
    }
}

fn keyslots(o: &mut String, j: &Value) {
    o.push_str("Keyslots:\n");
    for i in 0..MAX_IDS {
        let Some(k) = object(j, "keyslots", i) else {
            continue;
        };
        let kind = text(&k["type"]);
        let _ = writeln!(
            o,
            "  {i}: {kind}{}",
            if unbound(j, i) { " (unbound)" } else { "" }
        );
        if let Some(ks) = k["key_size"].as_u64() {
            let _ = writeln!(o, "\tKey:        {} bits", ks * 8);
        }
        let priority = match k["priority"].as_i64().unwrap_or(1) {
            0 => "ignored",
            1 => "normal",
            2 => "preferred",
            _ => "invalid",
        };
        let _ = writeln!(o, "\tPriority:   {priority}");
        match kind.as_str() {
            "luks2" => luks2_keyslot(o, k),
            "reencrypt" => reencrypt_keyslot(o, k),
            _ => {}
        }
        for (d, v) in j["digests"].as_object().into_iter().flatten() {
            for _ in list(&v["keyslots"]).iter().filter(|s| **s == i.to_string()) {
                let _ = writeln!(o, "\tDigest ID:  {d}");
            }
        }
    }
}

fn luks2_keyslot(o: &mut String, k: &Value) {
    let (kdf, area) = (&k["kdf"], &k["area"]);
    let _ = writeln!(o, "\tCipher:     {}", text(&area["encryption"]));
    let _ = writeln!(
        o,
        "\tCipher key: {} bits",
        area["key_size"].as_u64().unwrap_or(0) * 8
    );
    let kind = text(&kdf["type"]);
    let _ = writeln!(o, "\tPBKDF:      {kind}");
    if kind == "pbkdf2" {
        let _ = writeln!(o, "\tHash:       {}", text(&kdf["hash"]));
        let _ = writeln!(o, "\tIterations: {}", text(&kdf["iterations"]));
    } else {
        let _ = writeln!(o, "\tTime cost:  {}", text(&kdf["time"]));
        let _ = writeln!(o, "\tMemory:     {}", text(&kdf["memory"]));
        let _ = writeln!(o, "\tThreads:    {}", text(&kdf["cpus"]));
    }
    o.push_str("\tSalt:       ");
    hex_b64(o, &kdf["salt"]);
    let _ = writeln!(o, "\tAF stripes: {}", text(&k["af"]["stripes"]));
    let _ = writeln!(o, "\tAF hash:    {}", text(&k["af"]["hash"]));
    area_lines(o, area);
}

fn area_lines(o: &mut String, area: &Value) {
    let _ = writeln!(o, "\tArea offset:{} [bytes]", text(&area["offset"]));
    let _ = writeln!(o, "\tArea length:{} [bytes]", text(&area["size"]));
}

fn reencrypt_keyslot(o: &mut String, k: &Value) {
    let area = &k["area"];
    let resilience = text(&area["type"]);
    let _ = writeln!(o, "\t{:<12}{}", "Mode:", text(&k["mode"]));
    let _ = writeln!(o, "\t{:<12}{}", "Direction:", text(&k["direction"]));
    let _ = writeln!(o, "\t{:<12}{resilience}", "Resilience:");
    if resilience == "checksum" {
        let _ = writeln!(o, "\t{:<12}{}", "Hash:", text(&area["hash"]));
        let _ = writeln!(
            o,
            "\t{:<12}{} [bytes]",
            "Hash data:",
            text(&area["sector_size"])
        );
    } else if resilience == "datashift" {
        let _ = writeln!(
            o,
            "\t{:<12}{}[bytes]",
            "Shift size:",
            text(&area["shift_size"])
        );
    }
    area_lines(o, area);
}

fn tokens(o: &mut String, j: &Value) {
    o.push_str("Tokens:\n");
    for i in 0..MAX_IDS {
        let Some(t) = object(j, "tokens", i) else {
            continue;
        };
        let kind = text(&t["type"]);
        let _ = writeln!(o, "  {i}: {kind}");
        // The one token type whose handler is built into libcryptsetup.
        if kind == "luks2-keyring"
            && let Some(d) = t.get("key_description")
        {
            let _ = writeln!(o, "\tKey description: {}", text(d));
        }
        systemd_token_lines(o, kind.as_str(), t);
        for k in list(&t["keyslots"]) {
            let _ = writeln!(o, "\tKeyslot:    {k}");
        }
    }
}

/// What systemd's token plugins add to cryptsetup's luksDump (Debian installs them with
/// cryptsetup): systemd-tpm2, systemd-pkcs11 and systemd-fido2 tokens' fields, as systemd
/// 252 prints them.
fn systemd_token_lines(o: &mut String, kind: &str, t: &Value) {
    let pcrs = |v: &Value| {
        let p: Vec<String> = v
            .as_array()
            .into_iter()
            .flatten()
            .map(|p| p.to_string())
            .collect();
        if p.is_empty() {
            "n/a".to_owned()
        } else {
            p.join("+")
        }
    };
    // systemd's hex dumps: 16 bytes a line, no space after the last byte of a line.
    let hex_lines = |o: &mut String, b: &[u8]| {
        for (i, line) in b.chunks(16).enumerate() {
            if i > 0 {
                o.push_str("\n\t            ");
            }
            let bytes: Vec<String> = line.iter().map(|b| format!("{b:02x}")).collect();
            o.push_str(&bytes.join(" "));
        }
        o.push('\n');
    };
    let b64 = |v: &Value| {
        v.as_str()
            .and_then(|s| base64::engine::general_purpose::STANDARD.decode(s).ok())
            .unwrap_or_default()
    };
    match kind {
        "systemd-tpm2" => {
            let _ = writeln!(o, "\ttpm2-hash-pcrs:   {}", pcrs(&t["tpm2-pcrs"]));
            let _ = writeln!(o, "\ttpm2-pcr-bank:    {}", text(&t["tpm2-pcr-bank"]));
            o.push_str("\ttpm2-pubkey:\n\t            ");
            if t["tpm2_pubkey"].is_string() {
                hex_lines(o, &b64(&t["tpm2_pubkey"]));
            } else {
                o.push_str("(null)\n");
            }
            let _ = writeln!(o, "\ttpm2-pubkey-pcrs: {}", pcrs(&t["tpm2_pubkey_pcrs"]));
            let _ = writeln!(o, "\ttpm2-primary-alg: {}", text(&t["tpm2-primary-alg"]));
            o.push_str("\ttpm2-blob:        ");
            hex_lines(o, &b64(&t["tpm2-blob"]));
            o.push_str("\ttpm2-policy-hash:\n\t            ");
            let digest =
                hex::decode(t["tpm2-policy-hash"].as_str().unwrap_or("")).unwrap_or_default();
            hex_lines(o, &digest);
            let _ = writeln!(o, "\ttpm2-pin:         {}", t["tpm2-pin"] == true);
        }
        "systemd-pkcs11" => {
            let _ = writeln!(o, "\tpkcs11-uri: {}", text(&t["pkcs11-uri"]));
            o.push_str("\tpkcs11-key: ");
            hex_lines(o, &b64(&t["pkcs11-key"]));
        }
        "systemd-fido2" => {
            o.push_str("\tfido2-credential:\n\t            ");
            hex_lines(o, &b64(&t["fido2-credential"]));
            o.push_str("\tfido2-salt: ");
            hex_lines(o, &b64(&t["fido2-salt"]));
            if let Some(rp) = t["fido2-rp"].as_str() {
                let _ = writeln!(o, "\tfido2-rp:   {rp}");
            }
            // A flag the token leaves out (systemd 248's tokens) is not printed.
            for flag in [
                "fido2-clientPin-required",
                "fido2-up-required",
                "fido2-uv-required",
            ] {
                if let Some(b) = t[flag].as_bool() {
                    let _ = writeln!(o, "\t{flag}:\n\t            {b}");
                }
            }
        }
        _ => {}
    }
}

fn digests(o: &mut String, j: &Value) {
    o.push_str("Digests:\n");
    for i in 0..MAX_IDS {
        let Some(d) = object(j, "digests", i) else {
            continue;
        };
        let kind = text(&d["type"]);
        let _ = writeln!(o, "  {i}: {kind}");
        if kind == "pbkdf2" {
            let _ = writeln!(o, "\tHash:       {}", text(&d["hash"]));
            let _ = writeln!(o, "\tIterations: {}", text(&d["iterations"]));
            o.push_str("\tSalt:       ");
            hex_b64(o, &d["salt"]);
            o.push_str("\tDigest:     ");
            hex_b64(o, &d["digest"]);
        }
    }
}

/// `luksDump --dump-volume-key`'s text (cryptsetup's, after the header questions).
pub(crate) fn volume_key(
    path: &str,
    cipher: &str,
    payload_sectors: u64,
    uuid: &str,
    key: &[u8],
) -> String {
    let (name, mode) = cipher.split_once('-').unwrap_or((cipher, ""));
    let mut o = String::new();
    let _ = writeln!(o, "LUKS header information for {path}");
    let _ = writeln!(o, "Cipher name:   \t{name}");
    let _ = writeln!(o, "Cipher mode:   \t{mode}");
    let _ = writeln!(o, "Payload offset:\t{payload_sectors}");
    let _ = writeln!(o, "UUID:          \t{uuid}");
    let _ = writeln!(o, "MK bits:       \t{}", key.len() * 8);
    o.push_str(&key_lines("MK dump:", key));
    o
}

/// `luksDump --unbound`'s key line: "Unbound Key:" and the key in cryptsetup's hex.
pub(crate) fn unbound_key(key: &[u8]) -> String {
    key_lines("Unbound Key:", key)
}

/// A key as cryptsetup's dumps show one: `label`, a tab, 16 hex bytes a line.
pub(crate) fn key_lines(label: &str, key: &[u8]) -> String {
    let mut o = format!("{label}\t");
    hex(&mut o, key, " ", 16, "\n\t\t");
    o.push('\n');
    o
}

/// JSON as json-c prints it pretty (what `luksDump --dump-json-metadata` shows): two
/// spaces an indent level, no space after a colon, empty containers split over two lines,
/// keys in their on-disk order.
pub(crate) fn json_c_pretty(v: &Value) -> String {
    fn go(v: &Value, level: usize, o: &mut String) {
        let pad = |o: &mut String, n: usize| o.push_str(&"  ".repeat(n));
        let items: Vec<(Option<&String>, &Value)> = match v {
            Value::Object(m) => m.iter().map(|(k, v)| (Some(k), v)).collect(),
            Value::Array(a) => a.iter().map(|v| (None, v)).collect(),
            other => {
                o.push_str(&other.to_string());
                return;
            }
        };
        let (open, close) = if v.is_object() {
            ('{', '}')
        } else {
            ('[', ']')
        };
        o.push(open);
        for (i, (k, item)) in items.iter().enumerate() {
            o.push_str(if i > 0 { ",\n" } else { "\n" });
            pad(o, level + 1);
            if let Some(k) = k {
                let _ = write!(o, "{}:", Value::String((*k).clone()));
            }
            go(item, level + 1, o);
        }
        o.push('\n');
        pad(o, level);
        o.push(close);
    }
    let mut o = String::new();
    go(v, 0, &mut o);
    o
}
