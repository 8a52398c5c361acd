//! [`CorruptItem`]: an item the engine cannot read, and the check of one item
//! ([`check_item`]) with the decoders the engine reads it with.

use serde::Serialize;
use tollgate_core::aggregate::stored_limits;
use tollgate_core::bucket::BucketImage;
use tollgate_core::value::{Item, Key};
use tollgate_core::RuleError;
use tollgate_store::Undecodable;

use super::ItemKind;
use crate::config;
use crate::error::Error;

/// An item the engine cannot read, with the attribute at fault and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CorruptItem {
    /// The item's key.
    #[serde(flatten)]
    pub key: Key,
    /// What the item is.
    pub item: ItemKind,
    /// The attribute at fault, when one is (`None`: the item as a whole).
    pub attribute: Option<String>,
    /// What is wrong with it.
    pub reason: String,
}

impl std::fmt::Display for CorruptItem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} / {}", self.key.pk, self.key.sk)?;
        match &self.attribute {
            Some(a) => write!(f, ": attribute {a:?}: {}", self.reason),
            None => write!(f, ": {}", self.reason),
        }
    }
}

impl CorruptItem {
    fn new(ns: &str, key: &Key, attribute: Option<String>, reason: String) -> Self {
        debug_assert!(!reason.is_empty(), "a corrupt item says why");
        CorruptItem {
            item: ItemKind::of(ns, key),
            key: key.clone(),
            attribute,
            reason,
        }
    }

    /// From an entry a scan could not decode.
    pub fn undecodable(ns: &str, u: &Undecodable) -> Self {
        Self::new(ns, &u.key, u.attribute.clone(), u.reason.clone())
    }

    /// From a store's or the engine's corrupt message about the item at `key`.
    pub fn from_message(ns: &str, key: &Key, message: &str) -> Self {
        let (attribute, reason) = split_attribute(message);
        Self::new(ns, key, attribute, reason)
    }

    fn from_error(ns: &str, key: &Key, e: &Error) -> Self {
        match e {
            Error::Corrupt(m) => Self::from_message(ns, key, m),
            Error::Invalid(RuleError::Corrupt {
                attribute, reason, ..
            }) => Self::new(ns, key, Some(attribute.clone()), reason.clone()),
            other => Self::new(ns, key, None, other.to_string()),
        }
    }
}

/// `(attribute, reason)` from a corrupt message. Every decoder says `attribute NAME: why`
/// (`RuleError::Corrupt`, the SQLite and DynamoDB stores), after the item's key when it
/// names one; a message without it is the item's as a whole.
pub fn split_attribute(message: &str) -> (Option<String>, String) {
    if let Some(at) = message.find("attribute ") {
        if let Some((name, why)) = message[at + "attribute ".len()..].split_once(": ") {
            if !name.is_empty() && !name.contains(char::is_whitespace) {
                return (Some(name.to_string()), why.to_string());
            }
        }
    }
    (None, message.to_string())
}

/// Check one stored item the way the engine reads it: `Some` when it cannot be read.
pub fn check_item(ns: &str, key: &Key, item: &Item) -> Option<CorruptItem> {
    let kind = ItemKind::of(ns, key);
    let failed: Option<Error> = match &kind {
        ItemKind::SystemLimits
        | ItemKind::ResourceLimits { .. }
        | ItemKind::EntityLimits { .. } => config::decode(item)
            .err()
            .or_else(|| config::decode_cascade(item).err())
            .or_else(|| config::decode_enforcement(item).err())
            .or_else(|| config::decode_merge(item).err()),
        ItemKind::Entity { .. } => config::decode_cascade(item).err(),
        ItemKind::Bucket { .. } => BucketImage::decode(item)
            .and_then(|img| stored_limits(&img).map(drop))
            .err()
            .map(Error::from),
        ItemKind::AuditRecord { .. } => tollgate_core::audit::decode(item).err().map(Error::from),
        ItemKind::Other => None,
    };
    failed.map(|e| CorruptItem::from_error(ns, key, &e))
}
