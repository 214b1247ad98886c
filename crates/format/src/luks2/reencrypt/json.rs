//! The JSON of reencryption metadata: segments, the `reencrypt` keyslot, the requirement,
//! the verification digest, and the layout while a step runs (the hot layouts).

use super::metadata::{REQUIREMENT_V2, REQUIREMENT_V3, Reencryption, ResilienceRequest};
use crate::luks2::model::{Model, ReencryptDirection, Segment};
use crate::luks2::{Luks2Error, bad, digest, keyslot, section_mut};
use crate::{Error, Result};
use cryptblk_crypto::KdfRequest;
use serde_json::{Map, Value, json};

pub(super) fn lowest_free<V>(m: &std::collections::BTreeMap<u32, V>) -> Result<u32> {
    (0..crate::luks2::MAX_OBJECTS)
        .find(|i| !m.contains_key(i))
        .ok_or(Error::NoFreeKeyslot)
}

pub(super) fn seg_json(
    seg: &Segment,
    offset: u64,
    iv_tweak: u64,
    size: Option<u64>,
    flag: Option<&str>,
) -> Value {
    let mut o = Map::new();
    o.insert("type".into(), json!(seg.kind));
    o.insert("offset".into(), json!(offset.to_string()));
    o.insert(
        "size".into(),
        json!(size.map_or("dynamic".to_string(), |s| s.to_string())),
    );
    if seg.kind != "linear" {
        o.insert("iv_tweak".into(), json!(iv_tweak.to_string()));
        o.insert("encryption".into(), json!(seg.encryption));
        o.insert("sector_size".into(), json!(seg.sector_size));
    }
    if let Some(f) = flag {
        o.insert("flags".into(), json!([f]));
    }
    Value::Object(o)
}

/// The `area` object of the reencrypt keyslot.
fn reencrypt_area(
    offset: u64,
    size: u64,
    resilience: ResilienceRequest,
    block: u64,
) -> Map<String, Value> {
    let mut area = Map::new();
    area.insert("offset".into(), json!(offset.to_string()));
    area.insert("size".into(), json!(size.to_string()));
    match resilience {
        ResilienceRequest::Checksum(h) => {
            area.insert("type".into(), json!("checksum"));
            area.insert("hash".into(), json!(h.name()));
            area.insert("sector_size".into(), json!(block));
        }
        ResilienceRequest::Journal => {
            area.insert("type".into(), json!("journal"));
        }
        ResilienceRequest::None => {
            area.insert("type".into(), json!("none"));
        }
    }
    area
}

/// Adds the reencryption requirement (`online-reencrypt-v2`, or `-v3` for a decryption
/// that moves its first segment, as cryptsetup versions them) to the config.
fn add_requirement(json: &mut Value, requirement: &str) -> Result<()> {
    let config = section_mut(json, "config")?;
    let reqs = config
        .entry("requirements")
        .or_insert_with(|| json!({}))
        .as_object_mut()
        .ok_or_else(|| bad("requirements is not an object"))?;
    reqs.entry("mandatory")
        .or_insert_with(|| json!([]))
        .as_array_mut()
        .ok_or_else(|| bad("mandatory requirements are not a list"))?
        .push(json!(requirement));
    Ok(())
}

/// A job's segments at its start: the data as it is (segment `seg_id` of `json`), then
/// the layouts before (a copy of it) and after (`final_json`) as backups.
pub(super) fn start_segments(json: &mut Value, seg_id: u32, final_json: Value) {
    let seg0 = json["segments"][seg_id.to_string()].clone();
    let mut previous = seg0.clone();
    previous["flags"] = json!(["backup-previous"]);
    json["segments"] = json!({"0": seg0, "1": previous, "2": final_json});
}

/// Assigns every token of keyslot `from` to keyslot `to` too.
pub(super) fn copy_token_assignments(json: &mut Value, from: u32, to: u32) -> Result<()> {
    let from = json!(from.to_string());
    for t in section_mut(json, "tokens")?.values_mut() {
        if let Some(a) = t.get_mut("keyslots").and_then(Value::as_array_mut)
            && a.contains(&from)
        {
            a.push(json!(to.to_string()));
        }
    }
    Ok(())
}

/// Adds the `reencrypt` keyslot (`mode`, `direction`; its area the largest free gap of
/// `json`'s keyslots area) to `json`. Returns its id.
pub(super) fn add_reencrypt_keyslot(
    json: &mut Value,
    hdr_size: u64,
    mode: &str,
    direction: &str,
    resilience: ResilienceRequest,
    block: u64,
) -> Result<u32> {
    let model = Model::from_json(json, hdr_size)?;
    let slot = lowest_free(&model.keyslots)?;
    let (gap_off, gap_len) = keyslot::largest_area_gap(&model, hdr_size)
        .filter(|g| g.1 >= 4096)
        .ok_or(Luks2Error::NoKeyslotSpace)?;
    let area = reencrypt_area(gap_off, gap_len / 4096 * 4096, resilience, block);
    section_mut(json, "keyslots")?.insert(
        slot.to_string(),
        json!({"type": "reencrypt", "key_size": 1, "mode": mode, "direction": direction,
               "priority": 0, "area": Value::Object(area)}),
    );
    Ok(slot)
}

/// Completes the reencryption metadata in `json`: the requirement, then the verification
/// digest over the keys (`old`, `new`; none for a plaintext side) and the metadata.
pub(super) fn seal_reencryption(
    json: &mut Value,
    hdr_size: u64,
    reenc_slot: u32,
    old: Option<&[u8]>,
    new: Option<&[u8]>,
    kdf: &KdfRequest,
) -> Result<()> {
    let model = Model::from_json(json, hdr_size)?;
    let decrypt_moves = model
        .segments
        .values()
        .any(|s| s.flags.iter().any(|f| f == "backup-moved-segment"))
        && json["keyslots"][reenc_slot.to_string()]["mode"] == "decrypt";
    add_requirement(
        json,
        if decrypt_moves {
            REQUIREMENT_V3
        } else {
            REQUIREMENT_V2
        },
    )?;
    let model = Model::from_json(json, hdr_size)?;
    let r = model
        .reencryption()?
        .ok_or_else(|| bad("reencryption metadata not recognised"))?;
    let data = r.verification_data(old, new)?;
    let key_len = new.or(old).map_or(32, <[u8]>::len);
    let iterations = digest::iterations(kdf.hash, key_len, kdf.forced_iterations.is_some())?;
    let vd = digest::create(&data, kdf.hash, iterations, &[reenc_slot], &[])?;
    section_mut(json, "digests")?.insert(lowest_free(&model.digests)?.to_string(), vd);
    Ok(())
}

/// The metadata while the step `[off, off+len)` runs: the part done under the new key, the
/// hot zone (new layout, flagged), the rest under the old key; backups after; the hot
/// zone bound to both keys (cryptsetup's "hot" layout, forward, no data shift).
pub(super) fn hot_layout(
    r: &Reencryption<'_>,
    json: &Value,
    off: u64,
    len: u64,
    total: u64,
) -> Result<Value> {
    let (prev, fin) = (r.previous.1, r.final_.1);
    let d = fin.offset;
    let backward = r.params.direction == ReencryptDirection::Backward;
    // Forward: done (new), hot, to do (old); backward: to do (old), hot, done (new). Each
    // side at its own layout's place (they differ by a data shift).
    let (before, after) = if backward { (prev, fin) } else { (fin, prev) };
    let mut segs: Vec<Value> = Vec::new();
    if off > 0 {
        segs.push(seg_json(before, before.offset, 0, Some(off), None));
    }
    let hot = segs.len();
    segs.push(seg_json(
        fin,
        d + off,
        off / 512,
        Some(len),
        Some("in-reencryption"),
    ));
    if off + len < total {
        segs.push(seg_json(
            after,
            after.offset + off + len,
            (off + len) / 512,
            None,
            None,
        ));
    }
    let n = segs.len();
    // Only encrypted stretches are bound to a key (a plaintext hot zone, decrypting, to
    // none), as cryptsetup binds them.
    let encrypted: Vec<bool> = segs.iter().map(|s| s["type"] == "crypt").collect();
    let mut out = json.clone();
    let mut m = Map::new();
    for (i, s) in segs.into_iter().enumerate() {
        m.insert(i.to_string(), s);
    }
    m.insert(
        n.to_string(),
        json["segments"][r.previous.0.to_string()].clone(),
    );
    m.insert(
        (n + 1).to_string(),
        json["segments"][r.final_.0.to_string()].clone(),
    );
    out["segments"] = Value::Object(m);
    let digest_of = |seg: u32| {
        json["digests"]
            .as_object()
            .and_then(|ds| {
                ds.iter().find(|(_, d)| {
                    d["segments"]
                        .as_array()
                        .is_some_and(|a| a.iter().any(|s| s == &json!(seg.to_string())))
                })
            })
            .map(|(id, _)| id.clone())
    };
    // A plaintext (linear) side has no digest (encryption, decryption).
    let key_side = |seg: u32, what: &str| -> Result<Option<String>> {
        if r.previous.0 == seg && r.previous.1.kind == "linear"
            || r.final_.0 == seg && r.final_.1.kind == "linear"
        {
            return Ok(None);
        }
        digest_of(seg)
            .map(Some)
            .ok_or_else(|| bad(format!("no {what} key digest")))
    };
    let (old_d, new_d) = (key_side(r.previous.0, "old")?, key_side(r.final_.0, "new")?);
    let mut assign: std::collections::BTreeMap<String, Vec<Value>> = Default::default();
    let mut bind = |d: &Option<String>, seg: usize| {
        if let Some(d) = d {
            assign
                .entry(d.clone())
                .or_default()
                .push(json!(seg.to_string()));
        }
    };
    for i in (0..n).filter(|&i| encrypted[i]) {
        let (new_side, old_side) = if backward {
            (i >= hot, i <= hot)
        } else {
            (i <= hot, i >= hot)
        };
        if new_side {
            bind(&new_d, i);
        }
        if old_side {
            bind(&old_d, i);
        }
    }
    bind(&old_d, n);
    bind(&new_d, n + 1);
    for (id, d) in section_mut(&mut out, "digests")?.iter_mut() {
        d["segments"] = Value::Array(assign.remove(id).unwrap_or_default());
    }
    Ok(out)
}

/// The metadata while the data-move step `[off, off+len)` runs (cryptsetup's
/// `reencrypt_make_hot_segments_encrypt_shift`): the regular segments before the last
/// plaintext one, that one shrunk by `len` (gone if `len` is all of it), the hot zone
/// (new layout, flagged), the encrypted part done; then the backups (previous, final,
/// moved); every encrypted segment bound to the new key.
pub(crate) fn hot_layout_shift(
    r: &Reencryption<'_>,
    json: &Value,
    hdr_size: u64,
    off: u64,
    len: u64,
) -> Result<Value> {
    let model = Model::from_json(json, hdr_size)?;
    let fin = r.final_.1;
    let mut regular: Vec<(Value, Segment)> = model
        .segments
        .iter()
        .filter(|(_, s)| !s.is_backup())
        .map(|(id, s)| (json["segments"][id.to_string()].clone(), s.clone()))
        .collect();
    let last_linear = regular
        .iter()
        .rposition(|(_, s)| s.kind == "linear")
        .ok_or_else(|| bad("no plaintext left to encrypt"))?;
    let size = regular[last_linear]
        .1
        .size
        .ok_or_else(|| bad("plaintext segment of dynamic size"))?;
    let mut at = last_linear + 1;
    if size > len {
        regular[last_linear].0["size"] = json!((size - len).to_string());
    } else {
        regular.remove(last_linear);
        at -= 1;
    }
    let hot = seg_json(
        fin,
        fin.offset + off,
        off / 512,
        Some(len),
        Some("in-reencryption"),
    );
    regular.insert(at, (hot, fin.clone()));
    let mut segs: Vec<Value> = regular.into_iter().map(|(j, _)| j).collect();
    let first_backup = segs.len();
    for (id, _) in [Some(r.previous), Some(r.final_), r.moved]
        .into_iter()
        .flatten()
    {
        segs.push(json["segments"][id.to_string()].clone());
    }
    let new_digest = model
        .segment_digest(r.final_.0)
        .map(|(d, _)| d)
        .ok_or_else(|| bad("no new key digest"))?;
    // Encrypting, the new key is the only one bound to data.
    with_segments(json, segs, new_digest, |i, s| {
        s["type"] == "crypt" && (i < first_backup || i == first_backup + 1)
    })
}

/// `json` with `segs` as its segments, numbered in order, and the digest `digest` bound
/// to those `bind` picks; every other digest bound to none (the verification digest never
/// is; the other key's is not in this layout).
pub(super) fn with_segments(
    json: &Value,
    segs: Vec<Value>,
    digest: u32,
    bind: impl Fn(usize, &Value) -> bool,
) -> Result<Value> {
    let bound: Vec<Value> = segs
        .iter()
        .enumerate()
        .filter(|(i, s)| bind(*i, s))
        .map(|(i, _)| json!(i.to_string()))
        .collect();
    let mut out = json.clone();
    out["segments"] = Value::Object(
        segs.into_iter()
            .enumerate()
            .map(|(i, s)| (i.to_string(), s))
            .collect(),
    );
    for (id, d) in section_mut(&mut out, "digests")?.iter_mut() {
        d["segments"] = if *id == digest.to_string() {
            Value::Array(bound.clone())
        } else {
            json!([])
        };
    }
    Ok(out)
}
