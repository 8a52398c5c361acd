//! [`Name`]: an attribute name in a condition or an update. Most names are known before
//! the write is planned — the item model's own (`rf`, `ph`, ...), or a limit's fields,
//! built once per limit ([`crate::Limit::attr`]) — so a name is a `&'static str` or a
//! shared string, and putting one in a write copies nothing; a name made for one write
//! is owned.

use std::borrow::Borrow;
use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// An attribute name (compared, hashed and printed as the text it holds).
#[derive(Clone)]
pub enum Name {
    /// A name of the item model.
    Static(&'static str),
    /// A name shared with where it was built (a limit's field).
    Shared(Arc<str>),
    /// A name made for this write.
    Owned(String),
}

impl Name {
    /// The text.
    pub fn as_str(&self) -> &str {
        match self {
            Name::Static(s) => s,
            Name::Shared(s) => s,
            Name::Owned(s) => s,
        }
    }
}

impl Deref for Name {
    type Target = str;
    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl AsRef<str> for Name {
    fn as_ref(&self) -> &str {
        self.as_str()
    }
}

impl Borrow<str> for Name {
    fn borrow(&self) -> &str {
        self.as_str()
    }
}

impl From<&'static str> for Name {
    fn from(s: &'static str) -> Self {
        Name::Static(s)
    }
}

impl From<String> for Name {
    fn from(s: String) -> Self {
        Name::Owned(s)
    }
}

impl From<&String> for Name {
    fn from(s: &String) -> Self {
        Name::Owned(s.clone())
    }
}

impl From<Arc<str>> for Name {
    fn from(s: Arc<str>) -> Self {
        Name::Shared(s)
    }
}

impl From<&Name> for Name {
    fn from(n: &Name) -> Self {
        n.clone()
    }
}

impl From<Name> for String {
    fn from(n: Name) -> Self {
        match n {
            Name::Owned(s) => s,
            n => n.as_str().to_string(),
        }
    }
}

impl PartialEq for Name {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for Name {}

impl PartialEq<str> for Name {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for Name {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl PartialEq<String> for Name {
    fn eq(&self, other: &String) -> bool {
        self.as_str() == other.as_str()
    }
}

impl PartialOrd for Name {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Name {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.as_str().cmp(other.as_str())
    }
}

impl std::hash::Hash for Name {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.as_str().hash(state)
    }
}

impl fmt::Debug for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl fmt::Display for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for Name {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for Name {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(Name::Owned)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_is_its_text() {
        let a = Name::from("b_rpm_tk");
        let b = Name::from(Arc::<str>::from("b_rpm_tk"));
        let c = Name::from("b_rpm_tk".to_string());
        assert!(a == b && b == c);
        assert_eq!(format!("{a:?}"), format!("{:?}", "b_rpm_tk"));
        assert_eq!(
            serde_json::to_string(&b).ok().as_deref(),
            Some("\"b_rpm_tk\"")
        );
        assert_eq!(&*c, "b_rpm_tk");
    }
}
