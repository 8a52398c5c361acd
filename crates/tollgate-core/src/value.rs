//! The item model shared by every backend: an item is a map from attribute name to [`Value`].

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// One attribute value. Numbers are `i64` (milli-tokens, epoch milliseconds, counters).
///
/// The collections are boxed: they are rare (metadata, audit), and held in place they made
/// every value 32 bytes where 24 hold a number or a string — a bucket item's ~30 attributes
/// are then ~4 cache lines fewer for every acquire that reads it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Value {
    /// A number (DynamoDB `N`, restricted to integers).
    N(i64),
    /// A string (DynamoDB `S`).
    S(String),
    /// A boolean (DynamoDB `BOOL`).
    Bool(bool),
    /// A string set (DynamoDB `SS`); never empty when stored.
    Ss(Box<BTreeSet<String>>),
    /// A map (DynamoDB `M`), used only where needed (metadata).
    M(Box<BTreeMap<String, Value>>),
    /// A list (DynamoDB `L`).
    L(Box<Vec<Value>>),
    /// DynamoDB `NULL`.
    Null,
}

// The boxed collections keep a value at 24 bytes (a string's size; see the enum's docs).
#[cfg(target_pointer_width = "64")]
const _: () = assert!(std::mem::size_of::<Value>() == 24);

impl Value {
    /// Short type tag, as DynamoDB names it.
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::N(_) => "N",
            Value::S(_) => "S",
            Value::Bool(_) => "BOOL",
            Value::Ss(_) => "SS",
            Value::M(_) => "M",
            Value::L(_) => "L",
            Value::Null => "NULL",
        }
    }

    /// The number, if this is one.
    pub fn as_n(&self) -> Option<i64> {
        match self {
            Value::N(n) => Some(*n),
            _ => None,
        }
    }

    /// The string, if this is one.
    pub fn as_s(&self) -> Option<&str> {
        match self {
            Value::S(s) => Some(s),
            _ => None,
        }
    }

    /// The boolean, if this is one.
    pub fn as_bool(&self) -> Option<bool> {
        match self {
            Value::Bool(b) => Some(*b),
            _ => None,
        }
    }
}

impl From<i64> for Value {
    fn from(n: i64) -> Self {
        Value::N(n)
    }
}

impl From<&str> for Value {
    fn from(s: &str) -> Self {
        Value::S(s.to_string())
    }
}

impl From<String> for Value {
    fn from(s: String) -> Self {
        Value::S(s)
    }
}

impl From<bool> for Value {
    fn from(b: bool) -> Self {
        Value::Bool(b)
    }
}

pub use crate::item::Item;

/// An attribute name: inline up to 24 bytes, so copying an item copies no name.
pub type AttrName = compact_str::CompactString;

/// Name of the partition-key attribute.
pub const PK: &str = "PK";
/// Name of the sort-key attribute.
pub const SK: &str = "SK";

/// The primary key of an item. Both parts are shared text: a key is built once per
/// operation and then copied into the write, the lease and the caches that name the item,
/// and a copy copies no text.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Key {
    /// Partition key.
    pub pk: Arc<str>,
    /// Sort key.
    pub sk: Arc<str>,
}

impl Key {
    /// Build a key.
    pub fn new(pk: impl Into<Arc<str>>, sk: impl Into<Arc<str>>) -> Self {
        Key {
            pk: pk.into(),
            sk: sk.into(),
        }
    }

    /// The key of a stored item, if it carries string `PK` and `SK` (a bucket's `#STATE`
    /// sort key shared, not copied).
    pub fn of(item: &Item) -> Option<Key> {
        let (pk, sk) = (item.get(PK)?.as_s()?, item.get(SK)?.as_s()?);
        let sk = if sk == crate::keys::STATE {
            crate::keys::state_sk()
        } else {
            Arc::from(sk)
        };
        Some(Key { pk: pk.into(), sk })
    }

    /// Write the key attributes into an item.
    pub fn stamp(&self, item: &mut Item) {
        item.insert(PK.into(), Value::S(self.pk.to_string()));
        item.insert(SK.into(), Value::S(self.sk.to_string()));
    }
}

impl std::fmt::Display for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}|{}", self.pk, self.sk)
    }
}
