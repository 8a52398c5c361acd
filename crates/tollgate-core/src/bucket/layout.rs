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

use std::sync::{Arc, Mutex, PoisonError};

use super::{classify, Class, Gathered, LimitFields, Top, TopLevel, ABSENT};
use crate::item::Names;
use crate::value::{AttrName, Item};

/// The decoding plan of one item shape: what [`super::gather`] finds in an item of this
/// shape, by place — it is the same for every item with these names.
#[derive(Debug)]
pub struct Layout {
    /// The shape: the item's names in order (shared: an item found to have them keeps
    /// this reference, see [`Item::has_names`]).
    names: Arc<Names>,
    /// The top-level attributes decoding reads, with their places.
    tops: Box<[(Top, u32)]>,
    /// Each limit's fields as places in the item, limits sorted by name (as gathered).
    fields: Box<[(AttrName, LimitFields)]>,
}

impl Layout {
    /// The layout of `item`'s shape, from what [`super::gather`] took from it (the fields'
    /// places; the other attributes are classified again, which needs no field-name
    /// parsing); `None` for an item too long for a place to name (decoded in full every
    /// time).
    pub(super) fn of_gathered(item: &Item, fields: &Gathered<'_>) -> Option<Layout> {
        let mut tops = Vec::new();
        for (i, name) in item.keys().enumerate() {
            if !name.starts_with("b_") {
                if let Class::Top(t) = classify(name) {
                    tops.push((t, u32::try_from(i).ok().filter(|at| *at != ABSENT)?));
                }
            }
        }
        debug_assert!(fields.iter().all(|(_, fs)| fs
            .iter()
            .all(|at| *at == ABSENT || (*at as usize) < item.len())));
        Some(Layout {
            names: Arc::new(item.names()),
            tops: tops.into_boxed_slice(),
            fields: fields
                .iter()
                .map(|(n, fs)| (AttrName::from(*n), *fs))
                .collect(),
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
        Some(self.gather_fitted(item))
    }

    /// [`Layout::gather`] of an item known to have this layout's shape: the recorded places,
    /// no attribute visited but the top-level ones decoding reads.
    pub(super) fn gather_fitted<'a>(&'a self, item: &'a Item) -> (TopLevel<'a>, Gathered<'a>) {
        debug_assert!(
            item.has_names(&self.names),
            "the item has the layout's shape"
        );
        let mut top = TopLevel::default();
        for (t, at) in self.tops.iter() {
            top.set(*t, item.at(*at as usize).1);
        }
        let fields: Gathered<'a> = self
            .fields
            .iter()
            .map(|(n, fs)| (n.as_str(), *fs))
            .collect();
        (top, fields)
    }
}

/// How many shapes a [`Shapes`] keeps.
pub const SHAPES_KEPT: usize = 16;

/// The layouts a decoder recorded lately, most recently used first, at most
/// [`SHAPES_KEPT`]: an item of a shape seen before — another entity's bucket of the same
/// resource, a shard read for the first time, a bucket whose image was dropped — is
/// decoded by place too ([`BucketImage::decode_known`](super::BucketImage::decode_known)).
/// Finding a shape compares names only (a length first), so a miss costs little more than
/// the full decode it falls back to.
#[derive(Debug, Default)]
pub struct Shapes {
    recent: Mutex<Vec<Arc<Layout>>>,
}

impl Shapes {
    /// The recorded layout of `item`'s shape, moved to the front.
    pub(super) fn find(&self, item: &Item) -> Option<Arc<Layout>> {
        let mut recent = self.recent.lock().unwrap_or_else(PoisonError::into_inner);
        let at = recent.iter().position(|l| item.has_names(&l.names))?;
        recent[..=at].rotate_right(1);
        recent.first().cloned()
    }

    /// Record a layout at the front, dropping the least recently used one when full.
    pub(super) fn record(&self, layout: Arc<Layout>) {
        let mut recent = self.recent.lock().unwrap_or_else(PoisonError::into_inner);
        recent.truncate(SHAPES_KEPT - 1);
        recent.insert(0, layout);
        debug_assert!(recent.len() <= SHAPES_KEPT);
    }

    /// How many shapes are kept.
    pub fn len(&self) -> usize {
        self.recent
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// Whether no shape is kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
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
        let mut draw = |n: u64| crate::test_rng::step(&mut x) % n;
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
        let mut by_shape = 0;
        let shapes = Shapes::default();
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
            // By a shape recorded from another item (decoded or not): the same image, the
            // recorded layout shared.
            let _ = BucketImage::decode_known(&other, key.clone(), None, &shapes);
            let recorded = shapes.recent.lock().expect("not poisoned").first().cloned();
            let known = BucketImage::decode_known(&item, key.clone(), None, &shapes);
            assert_eq!(full, known, "{item:?}");
            if let (Some(l), Ok(k)) = (&recorded, &known) {
                by_shape += usize::from(k.layout.0.as_ref().is_some_and(|q| Arc::ptr_eq(l, q)));
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
            assert_eq!(
                BucketImage::decode_keyed(&fewer, key.clone()),
                BucketImage::decode_known(&fewer, key.clone(), Some(&like), &shapes),
            );
        }
        assert!(
            by_place > 40,
            "the by-place path decoded ({by_place} times)"
        );
        assert!(
            by_shape > 40,
            "the recorded shapes decoded ({by_shape} times)"
        );
        assert!(shapes.len() <= SHAPES_KEPT);
    }

    /// A shape found is moved to the front; a new one goes to the front and pushes the
    /// least recently used one out when [`SHAPES_KEPT`] are kept; an item of a shape not
    /// kept finds none.
    #[test]
    fn shapes_keep_the_most_recently_used() {
        let item = |i: usize| -> Item {
            [
                (AttrName::from(format!("b_l{i}_cp")), Value::N(1)),
                (AttrName::from(format!("b_l{i}_tk")), Value::N(1)),
                (AttrName::from("rf"), Value::N(1)),
            ]
            .into()
        };
        let shapes = Shapes::default();
        assert!(shapes.is_empty());
        let key = Key::new("e", "s");
        for i in 0..SHAPES_KEPT {
            BucketImage::decode_known(&item(i), key.clone(), None, &shapes).expect("decodes");
        }
        assert_eq!(shapes.len(), SHAPES_KEPT);
        // Shape 0, the oldest, is used again: shape 1 is now the one pushed out.
        let zero = shapes.find(&item(0)).expect("kept");
        assert!(Arc::ptr_eq(&zero, &shapes.find(&item(0)).expect("kept")));
        BucketImage::decode_known(&item(SHAPES_KEPT), key.clone(), None, &shapes).expect("decodes");
        assert_eq!(shapes.len(), SHAPES_KEPT);
        assert!(shapes.find(&item(1)).is_none());
        assert!(shapes.find(&item(0)).is_some());
        assert!(shapes.find(&item(SHAPES_KEPT)).is_some());
        assert!(shapes.find(&item(SHAPES_KEPT + 1)).is_none());
        // Decoded by a kept shape: the same image as decoded by name.
        let img = BucketImage::decode_known(&item(2), key.clone(), None, &shapes).expect("ok");
        assert_eq!(
            img,
            BucketImage::decode_keyed(&item(2), key).expect("decodes")
        );
        assert!(img.layout.0.is_some());
    }
}
