//! [`Layout`]: where each attribute of one bucket item shape goes when it is decoded.
//!
//! A bucket is written again and again with the same attribute names, so its next version
//! has the same shape as the one before it. Decoding reads every name to learn what it
//! holds (a top-level attribute, limit `n`'s field `f`, or nothing decoding reads); the
//! layout records those answers by place once, and the next version of the same shape is
//! decoded by place: its names are only compared with the recorded ones (a prefix integer
//! and a length each, see [`Names`]). What decoding makes of the values — types checked,
//! pairs complete, errors naming the attribute — is the same code either way
//! ([`BucketImage::assemble`](super::BucketImage)).

use std::sync::Arc;

use super::{classify, Class, Gathered, LimitFields, Top, TopLevel, ABSENT, FIELDS};
use crate::item::Names;
use crate::value::{AttrName, Item};

/// The decoding plan of one item shape.
#[derive(Debug)]
pub struct Layout {
    /// The shape: the item's names in order.
    names: Names,
    /// What each attribute (by place) is.
    slots: Box<[Slot]>,
    /// The limits with at least one field, sorted by name; a [`Slot::Field`] indexes them.
    limits: Box<[AttrName]>,
}

/// What one attribute of the shape is to decoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    Skip,
    Top(Top),
    /// Field `FIELDS[field]` of `limits[limit]`.
    Field {
        limit: u16,
        field: u8,
    },
}

impl Layout {
    /// The layout of `item`'s shape, from what [`super::gather`] took from it (the fields'
    /// places; the other attributes are classified again, which needs no field-name
    /// parsing); `None` for a shape with more limits than a slot can name (decoded in full
    /// every time).
    pub(super) fn of_gathered(item: &Item, fields: &Gathered<'_>) -> Option<Layout> {
        let mut slots = vec![Slot::Skip; item.len()];
        for (l, (_, fs)) in fields.iter().enumerate() {
            let limit = u16::try_from(l).ok()?;
            for (f, at) in fs.iter().enumerate() {
                if *at != ABSENT {
                    let field = u8::try_from(f).ok()?;
                    *slots.get_mut(*at as usize)? = Slot::Field { limit, field };
                }
            }
        }
        for (slot, name) in slots.iter_mut().zip(item.keys()) {
            if *slot == Slot::Skip && !name.starts_with("b_") {
                if let Class::Top(t) = classify(name) {
                    *slot = Slot::Top(t);
                }
            }
        }
        Some(Layout {
            names: item.names(),
            slots: slots.into_boxed_slice(),
            limits: fields.iter().map(|(n, _)| AttrName::from(*n)).collect(),
        })
    }

    /// The layout of `item`'s shape (see [`Layout::of_gathered`]).
    pub fn of(item: &Item) -> Option<Layout> {
        Self::of_gathered(item, &super::gather(item).1)
    }

    /// What [`super::gather`] takes from `item`, taken by place; `None` when `item` does
    /// not have this layout's shape.
    pub(super) fn gather<'a>(&'a self, item: &'a Item) -> Option<(TopLevel<'a>, Gathered<'a>)> {
        if !item.has_names(&self.names) {
            return None;
        }
        debug_assert_eq!(item.len(), self.slots.len());
        let mut top = TopLevel::default();
        let mut fields: Gathered<'a> = self
            .limits
            .iter()
            .map(|n| (n.as_str(), [ABSENT; FIELDS.len()] as LimitFields))
            .collect();
        for (i, ((_, v), slot)) in item.iter().zip(self.slots.iter()).enumerate() {
            match *slot {
                Slot::Skip => {}
                Slot::Top(t) => top.set(t, v),
                Slot::Field { limit, field } => {
                    fields[usize::from(limit)].1[usize::from(field)] =
                        u32::try_from(i).unwrap_or(ABSENT);
                }
            }
        }
        Some((top, fields))
    }
}

/// The layout an image was decoded with, shared by every later version decoded like it.
/// Equal for every two values: an image's value does not depend on how it was decoded.
#[derive(Debug, Clone, Default)]
pub struct LayoutRef(pub(super) Option<Arc<Layout>>);

impl PartialEq for LayoutRef {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for LayoutRef {}

#[cfg(test)]
mod tests {
    use super::super::BucketImage;
    use super::*;
    use crate::value::{Key, Value};

    /// Items drawn from bucket-like names (top-level ones, limit fields, fields of limits
    /// whose names hold `_`, unknown ones) and values of every type: decoded in full, and
    /// decoded like an image of the same shape (a layout recorded from another item with
    /// the same names and other values), they give the same image or the same error; an
    /// item of another shape is decoded in full.
    #[test]
    fn decoding_by_place_is_decoding_by_name() {
        let names = [
            "PK",
            "SK",
            "rf",
            "vu",
            "ttl",
            "ph",
            "op",
            "cascade",
            "disabled",
            "bypass",
            "shard_count",
            "entity_id",
            "rq",
            "b_rps_tk",
            "b_rps_cp",
            "b_rps_ra",
            "b_rps_rp",
            "b_rps_tc",
            "b_rps_rc",
            "b_rps_fu",
            "b_rps_ws",
            "b_rps_rsa",
            "b_rps_wa",
            "b_rps_wtc",
            "b_rps_gc",
            "b_rps_pe",
            "b_rps_tz",
            "b_rps_rsched",
            "b_rps_sched",
            "b_rps_bcp",
            "b_rps_bra",
            "b_rps_tu",
            "b_wcu_tk",
            "b_wcu_cp",
            "b_wcu_ra",
            "b_wcu_rp",
            "b_wcu_tc",
            "b_rps_a_tk",
            "b_rps_a_cp",
            "b_tokens_per_min_tk",
            "b_tokens_per_min_cp",
            "b_x_unknown",
            "b_",
            "b_tk",
        ];
        // Names that make an item undecodable (a limit with a balance and no capacity),
        // each in an eighth of the items.
        let edges = ["b__tk", "b_odd_cp"];
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut draw = |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        // Mostly the type the name stores (so most items decode), sometimes another.
        let value = |name: &str, draw: &mut dyn FnMut(u64) -> u64| {
            let text = ["PK", "SK", "ph", "op", "entity_id"].contains(&name)
                || ["_tz", "_rsched", "_sched"]
                    .iter()
                    .any(|t| name.ends_with(t));
            if name == "PK" {
                // The item is the one stored under the key decoding is given.
                return Value::S("ns/BUCKET#e#r#0".into());
            }
            match (draw(40), text) {
                (0, _) => Value::Bool(draw(2) == 0),
                (1, _) => Value::Null,
                (2, true) => Value::N(3),
                (2, false) => Value::S("x".into()),
                (_, true) if name.ends_with("_tz") => Value::S("UTC".into()),
                (_, true) if name.ends_with("sched") => Value::S("-".into()),
                (_, true) => Value::S(format!("s{}", draw(3))),
                (_, false) if name == "cascade" => Value::Bool(draw(2) == 0),
                (_, false) if name == "shard_count" => Value::N(1 + draw(3) as i64),
                (_, false) => Value::N(draw(5_000) as i64 - 100),
            }
        };
        let key = Key::new("ns/BUCKET#e#r#0", "#STATE");
        let base = BucketImage::decode_keyed(
            &[
                (AttrName::from("rf"), Value::N(1)),
                (AttrName::from("b_x_tk"), Value::N(1)),
                (AttrName::from("b_x_cp"), Value::N(1)),
            ]
            .into(),
            key.clone(),
        )
        .expect("a valid image");
        let mut by_place = 0;
        for _ in 0..3_000 {
            // Half the items hold every name but at most one, the rest a random half.
            let drop = draw(names.len() as u64 * 2) as usize;
            let whole = draw(2) == 0;
            let mut chosen: Vec<&str> = (0..names.len())
                .filter(|i| if whole { *i != drop } else { draw(2) == 0 })
                .map(|i| names[i])
                .collect();
            chosen.extend(edges.iter().filter(|_| draw(8) == 0));
            let item: Item = chosen
                .iter()
                .map(|n| (AttrName::from(*n), value(n, &mut draw)))
                .collect();
            let other: Item = chosen
                .iter()
                .map(|n| (AttrName::from(*n), value(n, &mut draw)))
                .collect();
            // An image of the same shape (whatever its values decode to) to decode like.
            let mut like = base.clone();
            like.layout = LayoutRef(Layout::of(&other).map(Arc::new));
            let full = BucketImage::decode_keyed(&item, key.clone());
            let placed = BucketImage::decode_like(&item, key.clone(), Some(&like));
            assert_eq!(full, placed, "{item:?}");
            if let (Some(l), Ok(p)) = (&like.layout.0, &placed) {
                by_place += usize::from(p.layout.0.as_ref().is_some_and(|q| Arc::ptr_eq(l, q)));
            }
            // Another shape: one name fewer.
            let mut fewer = item.clone();
            if let Some(n) = chosen.first() {
                fewer.remove(*n);
            }
            assert_eq!(
                BucketImage::decode_keyed(&fewer, key.clone()),
                BucketImage::decode_like(&fewer, key.clone(), Some(&like)),
            );
        }
        assert!(
            by_place > 40,
            "the by-place path decoded ({by_place} times)"
        );
    }
}
