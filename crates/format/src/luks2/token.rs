//! LUKS2 tokens (`cryptsetup token add|remove|import|export|unassign`): JSON objects in
//! the header's `tokens` section that name a way to get a passphrase (a kernel keyring
//! key, a TPM, a FIDO2 device...) and the keyslots it unlocks. cryptblk stores and edits
//! them as cryptsetup does; every change is one metadata commit, validated first.

use super::{Luks2Header, MAX_OBJECTS, section_mut};
use crate::{Error, Result, Storage};
use serde_json::{Value, json};

/// The token type whose handler is built into libcryptsetup.
pub const KEYRING_TOKEN: &str = "luks2-keyring";

impl Luks2Header {
    /// The token `id` as stored (its JSON object), if there is one.
    pub fn token(&self, id: u32) -> Option<&Value> {
        self.json["tokens"].as_object()?.get(&id.to_string())
    }

    /// Stores `token` (a JSON object with a string `type` and a `keyslots` array of
    /// active keyslot ids) as token `id`, else as the lowest free one; a token already
    /// there is replaced only with `replace`. Returns the id.
    pub fn set_token(
        &mut self,
        dev: &mut dyn Storage,
        id: Option<u32>,
        token: Value,
        replace: bool,
    ) -> Result<u32> {
        self.check_changeable()?;
        let bad = |s: &str| Error::InvalidOption(format!("token: {s}"));
        let obj = token.as_object().ok_or_else(|| bad("not a JSON object"))?;
        if !obj.get("type").is_some_and(Value::is_string) {
            return Err(bad("no \"type\" string"));
        }
        let slots = obj
            .get("keyslots")
            .and_then(Value::as_array)
            .ok_or_else(|| bad("no \"keyslots\" array"))?;
        for s in slots {
            let active = s
                .as_str()
                .and_then(|s| s.parse::<u32>().ok())
                .is_some_and(|n| self.model.keyslots.contains_key(&n));
            if !active {
                return Err(bad(&format!("keyslot {s} is not active")));
            }
        }
        if obj["type"] == KEYRING_TOKEN && !obj.get("key_description").is_some_and(Value::is_string)
        {
            return Err(bad(
                "a luks2-keyring token needs a \"key_description\" string",
            ));
        }
        let id = match id {
            Some(i) if i >= MAX_OBJECTS => return Err(bad(&format!("{i} is invalid"))),
            Some(i) if self.token(i).is_some() && !replace => {
                return Err(bad(&format!("{i} in use")));
            }
            Some(i) => i,
            None => (0..MAX_OBJECTS)
                .find(|i| self.token(*i).is_none())
                .ok_or_else(|| bad("no free token id"))?,
        };
        let mut json = self.json.clone();
        section_mut(&mut json, "tokens")?.insert(id.to_string(), token);
        self.commit(dev, json)?;
        Ok(id)
    }

    /// `token add --key-description D`: a luks2-keyring token for `slots`.
    pub fn add_keyring_token(
        &mut self,
        dev: &mut dyn Storage,
        id: Option<u32>,
        description: &str,
        slots: &[u32],
    ) -> Result<u32> {
        let slots: Vec<String> = slots.iter().map(u32::to_string).collect();
        let token =
            json!({"type": KEYRING_TOKEN, "keyslots": slots, "key_description": description});
        self.set_token(dev, id, token, false)
    }

    /// `token remove`.
    pub fn remove_token(&mut self, dev: &mut dyn Storage, id: u32) -> Result<()> {
        self.check_changeable()?;
        if self.token(id).is_none() {
            return Err(Error::InvalidOption(format!("token {id} is not in use")));
        }
        let mut json = self.json.clone();
        section_mut(&mut json, "tokens")?.shift_remove(&id.to_string());
        self.commit(dev, json)
    }

    /// Assigns token `id` to keyslot `slot`, or (`assign` false, `token unassign`) takes
    /// it away.
    pub fn assign_token(
        &mut self,
        dev: &mut dyn Storage,
        id: u32,
        slot: u32,
        assign: bool,
    ) -> Result<()> {
        let mut token = self
            .token(id)
            .cloned()
            .ok_or_else(|| Error::InvalidOption(format!("token {id} is not in use")))?;
        let name = Value::String(slot.to_string());
        let slots = token["keyslots"]
            .as_array_mut()
            .ok_or_else(|| Error::InvalidOption(format!("token {id} has no keyslots array")))?;
        let has = slots.contains(&name);
        match (assign, has) {
            (true, true) => return Ok(()),
            (true, false) => slots.push(name),
            (false, true) => slots.retain(|s| *s != name),
            (false, false) => {
                return Err(Error::InvalidOption(format!(
                    "token {id} is not assigned to keyslot {slot}"
                )));
            }
        }
        self.set_token(dev, Some(id), token, true).map(|_| ())
    }
}
