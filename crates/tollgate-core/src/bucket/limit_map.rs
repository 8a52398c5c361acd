//! [`LimitMap`]: a decoded bucket's limit states by name.
//!
//! A bucket holds a handful of limits, and an image is decoded from every write's answer:
//! a vector sorted by name, allocated to the size of what it holds, where a `BTreeMap`
//! allocated an eleven-entry node (3,360 bytes for one limit) per image. The API is the
//! subset of `BTreeMap`'s the images use (same names, name order of iteration, the same
//! `Debug` form), so an image reads and prints as it did.

use std::fmt;

use super::LimitState;
use crate::item::cmp_names;
use crate::value::AttrName;

/// Limit name → state, in name order (byte order, as `str` orders), each name once.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct LimitMap(Vec<(AttrName, LimitState)>);

impl LimitMap {
    /// An empty map.
    pub const fn new() -> Self {
        LimitMap(Vec::new())
    }

    /// An empty map with room for `n` limits.
    pub fn with_capacity(n: usize) -> Self {
        LimitMap(Vec::with_capacity(n))
    }

    /// Where `name` is (`Ok`), or where it would go (`Err`).
    fn search(&self, name: &str) -> Result<usize, usize> {
        self.0.binary_search_by(|(n, _)| cmp_names(n, name))
    }

    /// The state of the limit named `name`.
    pub fn get<Q: AsRef<str> + ?Sized>(&self, name: &Q) -> Option<&LimitState> {
        self.search(name.as_ref()).ok().map(|i| &self.0[i].1)
    }

    /// The state of the limit named `name`, writable.
    pub fn get_mut<Q: AsRef<str> + ?Sized>(&mut self, name: &Q) -> Option<&mut LimitState> {
        match self.search(name.as_ref()) {
            Ok(i) => Some(&mut self.0[i].1),
            Err(_) => None,
        }
    }

    /// Whether a limit named `name` is held.
    pub fn contains_key<Q: AsRef<str> + ?Sized>(&self, name: &Q) -> bool {
        self.search(name.as_ref()).is_ok()
    }

    /// Hold `state` under `name`; the state it replaces, if any.
    pub fn insert(&mut self, name: AttrName, state: LimitState) -> Option<LimitState> {
        // Decoders insert in name order: the end is the usual place.
        let at = match self.0.last() {
            Some((last, _)) if cmp_names(last, &name).is_lt() => Err(self.0.len()),
            None => Err(0),
            _ => self.search(&name),
        };
        let old = match at {
            Ok(i) => Some(std::mem::replace(&mut self.0[i].1, state)),
            Err(i) => {
                self.0.insert(i, (name, state));
                None
            }
        };
        debug_assert!(
            self.0
                .windows(2)
                .all(|w| cmp_names(&w[0].0, &w[1].0).is_lt()),
            "limit names stay sorted and unique"
        );
        old
    }

    /// Remove the limit named `name`; its state, if it was held.
    pub fn remove<Q: AsRef<str> + ?Sized>(&mut self, name: &Q) -> Option<LimitState> {
        let i = self.search(name.as_ref()).ok()?;
        Some(self.0.remove(i).1)
    }

    /// How many limits are held.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether no limit is held.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The limits in name order.
    pub fn iter(
        &self,
    ) -> impl DoubleEndedIterator<Item = (&AttrName, &LimitState)> + ExactSizeIterator + Clone {
        self.0.iter().map(|(n, s)| (n, s))
    }

    /// The names in order.
    pub fn keys(&self) -> impl DoubleEndedIterator<Item = &AttrName> + ExactSizeIterator + Clone {
        self.0.iter().map(|(n, _)| n)
    }

    /// The states in name order.
    pub fn values(
        &self,
    ) -> impl DoubleEndedIterator<Item = &LimitState> + ExactSizeIterator + Clone {
        self.0.iter().map(|(_, s)| s)
    }
}

impl fmt::Debug for LimitMap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

impl<Q: AsRef<str> + ?Sized> std::ops::Index<&Q> for LimitMap {
    type Output = LimitState;

    /// As `BTreeMap`'s index: the state of `name`, which must be held.
    fn index(&self, name: &Q) -> &LimitState {
        match self.get(name) {
            Some(s) => s,
            None => panic!("no limit named {:?} in the image", name.as_ref()),
        }
    }
}

impl FromIterator<(AttrName, LimitState)> for LimitMap {
    /// As `BTreeMap` collects: in name order, the last of a repeated name kept.
    fn from_iter<I: IntoIterator<Item = (AttrName, LimitState)>>(iter: I) -> Self {
        let iter = iter.into_iter();
        let mut m = LimitMap::with_capacity(iter.size_hint().0);
        for (n, s) in iter {
            m.insert(n, s);
        }
        m
    }
}

impl<'a> IntoIterator for &'a LimitMap {
    type Item = (&'a AttrName, &'a LimitState);
    type IntoIter = std::iter::Map<
        std::slice::Iter<'a, (AttrName, LimitState)>,
        fn(&'a (AttrName, LimitState)) -> (&'a AttrName, &'a LimitState),
    >;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter().map(|(n, s)| (n, s))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn st(balance: i64) -> LimitState {
        LimitState {
            balance,
            ..LimitState::default()
        }
    }

    /// Every operation answers as `BTreeMap` does, over names that share prefixes, differ
    /// in case, and arrive out of order and repeated.
    #[test]
    fn behaves_as_a_btreemap() {
        let names = ["tpm", "rpm", "rpm2", "RPM", "a", "tpm", "b_x", "rpd", "a"];
        let mut ours = LimitMap::new();
        let mut theirs = BTreeMap::new();
        for (i, n) in names.iter().enumerate() {
            let b = i as i64;
            assert_eq!(
                ours.insert(AttrName::from(*n), st(b)),
                theirs.insert(AttrName::from(*n), st(b)),
                "insert {n}"
            );
            assert_eq!(ours.len(), theirs.len());
            assert!(ours.iter().eq(theirs.iter()), "order after {n}");
        }
        for n in ["tpm", "rpm", "zzz", "", "RPM", "rp"] {
            assert_eq!(ours.get(n), theirs.get(n), "get {n}");
            assert_eq!(ours.contains_key(n), theirs.contains_key(n), "contains {n}");
        }
        assert_eq!(
            format!("{ours:?}"),
            format!("{theirs:?}"),
            "the same Debug form"
        );
        assert_eq!(ours.remove("rpm"), theirs.remove("rpm"));
        assert_eq!(ours.remove("rpm"), None);
        assert!(ours.keys().eq(theirs.keys()));
        let collected: LimitMap = names
            .iter()
            .enumerate()
            .map(|(i, n)| (AttrName::from(*n), st(i as i64)))
            .collect();
        let btree: BTreeMap<_, _> = names
            .iter()
            .enumerate()
            .map(|(i, n)| (AttrName::from(*n), st(i as i64)))
            .collect();
        assert!(collected.iter().eq(btree.iter()), "collect keeps the last");
        assert!(LimitMap::default().is_empty());
    }
}
