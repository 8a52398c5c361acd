//! The item model ([`Value`], [`Item`]) to and from DynamoDB's `AttributeValue`.
//!
//! Numbers are `i64` written as decimal strings. A stored number that does not parse as an
//! `i64`, or a type the item model does not know (binary, number sets), is
//! [`StoreError::Corrupt`] naming the attribute.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::AttributeValue;
use tollgate_core::value::{Item, Key, Value, PK, SK};
use tollgate_store::StoreError;

/// An item as the SDK carries it.
pub type AvMap = HashMap<String, AttributeValue>;

/// Encode one value. DynamoDB refuses empty sets, so an empty `Ss` is a
/// [`StoreError::Validation`] naming `attr`.
pub fn to_av(attr: &str, v: &Value) -> Result<AttributeValue, StoreError> {
    Ok(match v {
        Value::N(n) => AttributeValue::N(n.to_string()),
        Value::S(s) => AttributeValue::S(s.clone()),
        Value::Bool(b) => AttributeValue::Bool(*b),
        Value::Ss(set) => {
            if set.is_empty() {
                return Err(StoreError::Validation(format!(
                    "an empty string set cannot be stored (attribute {attr})"
                )));
            }
            AttributeValue::Ss(set.iter().cloned().collect())
        }
        Value::M(m) => AttributeValue::M(
            m.iter()
                .map(|(k, v)| Ok((k.clone(), to_av(&format!("{attr}.{k}"), v)?)))
                .collect::<Result<_, StoreError>>()?,
        ),
        Value::L(l) => AttributeValue::L(
            l.iter()
                .enumerate()
                .map(|(i, v)| to_av(&format!("{attr}[{i}]"), v))
                .collect::<Result<_, _>>()?,
        ),
        Value::Null => AttributeValue::Null(true),
    })
}

/// Decode one value; `attr` names it in a [`StoreError::Corrupt`].
pub fn from_av(attr: &str, av: &AttributeValue) -> Result<Value, StoreError> {
    Ok(match av {
        AttributeValue::N(n) => Value::N(n.trim().parse::<i64>().map_err(|e| {
            StoreError::Corrupt(format!(
                "attribute {attr}: number {n:?} is not an i64 ({e})"
            ))
        })?),
        AttributeValue::S(s) => Value::S(s.clone()),
        AttributeValue::Bool(b) => Value::Bool(*b),
        AttributeValue::Ss(ss) => Value::Ss(Box::new(ss.iter().cloned().collect())),
        AttributeValue::M(m) => Value::M(Box::new(
            m.iter()
                .map(|(k, v)| Ok((k.clone(), from_av(&format!("{attr}.{k}"), v)?)))
                .collect::<Result<_, StoreError>>()?,
        )),
        AttributeValue::L(l) => Value::L(Box::new(
            l.iter()
                .enumerate()
                .map(|(i, v)| from_av(&format!("{attr}[{i}]"), v))
                .collect::<Result<_, _>>()?,
        )),
        AttributeValue::Null(_) => Value::Null,
        other => {
            return Err(StoreError::Corrupt(format!(
                "attribute {attr}: unsupported DynamoDB type {}",
                av_type_name(other)
            )))
        }
    })
}

/// Decode one value the SDK handed over, moving its strings instead of copying them.
pub fn from_av_owned(attr: &str, av: AttributeValue) -> Result<Value, StoreError> {
    Ok(match av {
        AttributeValue::S(s) => Value::S(s),
        AttributeValue::Ss(ss) => Value::Ss(Box::new(ss.into_iter().collect())),
        AttributeValue::M(m) => Value::M(Box::new(
            m.into_iter()
                .map(|(k, v)| {
                    let v = from_av_owned(&format!("{attr}.{k}"), v)?;
                    Ok((k, v))
                })
                .collect::<Result<_, StoreError>>()?,
        )),
        AttributeValue::L(l) => Value::L(Box::new(
            l.into_iter()
                .enumerate()
                .map(|(i, v)| from_av_owned(&format!("{attr}[{i}]"), v))
                .collect::<Result<_, _>>()?,
        )),
        // Numbers parse either way; the rest holds no heap data worth moving.
        other => from_av(attr, &other)?,
    })
}

fn av_type_name(av: &AttributeValue) -> &'static str {
    match av {
        AttributeValue::B(_) => "B",
        AttributeValue::Bs(_) => "BS",
        AttributeValue::Ns(_) => "NS",
        AttributeValue::N(_) => "N",
        AttributeValue::S(_) => "S",
        AttributeValue::Bool(_) => "BOOL",
        AttributeValue::Ss(_) => "SS",
        AttributeValue::M(_) => "M",
        AttributeValue::L(_) => "L",
        AttributeValue::Null(_) => "NULL",
        _ => "unknown",
    }
}

/// Encode a whole item.
pub fn item_to_av(item: &Item) -> Result<AvMap, StoreError> {
    item.iter()
        .map(|(k, v)| Ok((k.to_string(), to_av(k, v)?)))
        .collect()
}

/// Encode a whole item the caller gives up, moving its strings.
pub fn item_into_av(item: Item) -> Result<AvMap, StoreError> {
    let mut out = AvMap::with_capacity(item.len() + 2);
    for (k, v) in item {
        let av = match v {
            Value::S(s) => AttributeValue::S(s),
            other => to_av(&k, &other)?,
        };
        out.insert(k.into_string(), av);
    }
    Ok(out)
}

/// Decode a whole item.
pub fn item_from_av(map: &AvMap) -> Result<Item, StoreError> {
    map.iter()
        .map(|(k, v)| Ok((k.as_str().into(), from_av(k, v)?)))
        .collect()
}

/// Decode a whole item the SDK handed over, moving its names and strings.
pub fn item_from_av_owned(map: AvMap) -> Result<Item, StoreError> {
    map.into_iter()
        .map(|(k, v)| {
            let v = from_av_owned(&k, v)?;
            Ok((k.into(), v))
        })
        .collect()
}

/// The primary key as the SDK carries it.
pub fn key_to_av(key: &Key) -> AvMap {
    HashMap::from([
        (PK.to_string(), AttributeValue::S(key.pk.to_string())),
        (SK.to_string(), AttributeValue::S(key.sk.to_string())),
    ])
}

/// The primary key as the SDK carries it, from a key the caller gives up.
pub fn key_into_av(key: Key) -> AvMap {
    HashMap::from([
        (PK.to_string(), AttributeValue::S(key.pk.to_string())),
        (SK.to_string(), AttributeValue::S(key.sk.to_string())),
    ])
}

/// The primary key of a returned item, if it carries string `PK` and `SK`.
pub fn key_from_av(map: &AvMap) -> Option<Key> {
    let pk = map.get(PK)?.as_s().ok()?;
    let sk = map.get(SK)?.as_s().ok()?;
    Some(Key::new(pk.clone(), sk.clone()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{BTreeMap, BTreeSet};

    #[test]
    fn round_trip_every_type() {
        let mut item = Item::new();
        item.insert("n".into(), Value::N(-42));
        item.insert("big".into(), Value::N(i64::MAX));
        item.insert("s".into(), Value::S("x".into()));
        item.insert("b".into(), Value::Bool(true));
        item.insert(
            "ss".into(),
            Value::Ss(Box::new(BTreeSet::from(["a".to_string(), "b".to_string()]))),
        );
        item.insert(
            "m".into(),
            Value::M(Box::new(BTreeMap::from([("k".to_string(), Value::N(1))]))),
        );
        item.insert(
            "l".into(),
            Value::L(Box::new(vec![Value::N(1), Value::S("y".into())])),
        );
        item.insert("z".into(), Value::Null);
        let av = item_to_av(&item).expect("encodes");
        assert_eq!(av.get("n"), Some(&AttributeValue::N("-42".into())));
        assert_eq!(item_from_av(&av).expect("decodes"), item);
        // The moving variants agree with the copying ones.
        assert_eq!(item_into_av(item.clone()).expect("encodes"), av);
        assert_eq!(item_from_av_owned(av).expect("decodes"), item);
    }

    #[test]
    fn bad_number_is_corrupt_and_names_the_attribute() {
        let map = HashMap::from([("b_rpm.v1_tk".to_string(), AttributeValue::N("1.5".into()))]);
        match item_from_av(&map) {
            Err(StoreError::Corrupt(m)) => assert!(m.contains("b_rpm.v1_tk"), "{m}"),
            other => panic!("expected Corrupt, got {other:?}"),
        }
    }

    #[test]
    fn a_bad_nested_number_is_corrupt_when_moved_too() {
        let map = HashMap::from([(
            "m".to_string(),
            AttributeValue::M(HashMap::from([(
                "k".to_string(),
                AttributeValue::N("x".into()),
            )])),
        )]);
        match item_from_av_owned(map) {
            Err(StoreError::Corrupt(m)) => assert!(m.contains("m.k"), "{m}"),
            other => panic!("expected Corrupt, got {other:?}"),
        }
        let bin = HashMap::from([(
            "b".to_string(),
            AttributeValue::B(aws_sdk_dynamodb::primitives::Blob::new(vec![1])),
        )]);
        assert!(matches!(
            item_from_av_owned(bin),
            Err(StoreError::Corrupt(_))
        ));
        assert!(matches!(
            item_into_av(Item::from([("e".into(), Value::Ss(Default::default()))])),
            Err(StoreError::Validation(_))
        ));
    }

    #[test]
    fn empty_set_is_refused() {
        assert!(matches!(
            to_av("tags", &Value::Ss(Box::default())),
            Err(StoreError::Validation(_))
        ));
    }
}
