//! [`Item`]: one stored item, a map from attribute name to [`Value`] kept as a flat vector
//! sorted by name.
//!
//! A bucket item holds about thirty attributes and every write reads and writes most of
//! them: one contiguous vector is searched in a handful of comparisons, copied in one
//! allocation and walked in order, where a `BTreeMap` chased nodes, compared names through
//! `memcmp` on every level and allocated one node per eleven attributes on every copy. The
//! API is `BTreeMap`'s (same names, same order of iteration, same serialised form), so an
//! item reads, prints and stores exactly as it did.

use std::cmp::Ordering;
use std::fmt;
use std::sync::{Arc, OnceLock};

use serde::de::{MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::value::{AttrName, Value};

/// An item: attribute name → value, in name order. Includes the key attributes `PK` and
/// `SK`.
#[derive(Clone, Default)]
pub struct Item {
    /// Sorted by name (byte order, as `str` orders), each name once.
    attrs: Vec<Attr>,
    /// Names known to be exactly this item's (see [`Item::has_names`]): set when a
    /// comparison found them equal, kept while values change in place and by copies,
    /// emptied by every change of a name. Not part of the item's value.
    shape: OnceLock<Arc<Names>>,
}

impl PartialEq for Item {
    fn eq(&self, other: &Self) -> bool {
        self.attrs == other.attrs
    }
}

impl Eq for Item {}

/// One attribute, with the first eight bytes of its name as a number ([`prefix_of`]): a
/// search compares that number first and reads the name only past it.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Attr {
    prefix: u64,
    name: AttrName,
    value: Value,
}

impl Attr {
    fn new(name: AttrName, value: Value) -> Self {
        Attr {
            prefix: prefix_of(name.as_bytes()),
            name,
            value,
        }
    }
}

/// The first eight bytes of a name as a big-endian number, zero-padded: names compare
/// as their prefixes do, and when the prefixes are equal the rest decides ([`cmp_after`]).
#[inline]
fn prefix_of(s: &[u8]) -> u64 {
    if s.len() >= 8 {
        return u64::from_be_bytes(chunk8(s, 0));
    }
    let mut p = 0u64;
    for (i, b) in s.iter().enumerate() {
        p |= u64::from(*b) << (56 - 8 * i);
    }
    p
}

/// The index of the first attribute whose prefix is at least `p` (`attrs.len()` if none):
/// a branch-free lower bound over the sorted prefixes.
#[inline]
fn lower_bound(attrs: &[Attr], p: u64) -> usize {
    let mut base = 0;
    let mut size = attrs.len();
    if size == 0 {
        return 0;
    }
    while size > 1 {
        let half = size / 2;
        let mid = base + half;
        // The halving keeps `base` the last index known below `p` (or 0).
        base = if attrs[mid].prefix < p { mid } else { base };
        size -= half;
    }
    base + usize::from(attrs[base].prefix < p)
}

/// Order two names whose prefixes ([`prefix_of`]) are equal. When the shorter one has at
/// most eight bytes it is a prefix of the other (what follows it in the other's padded
/// prefix are zero bytes): the lengths decide. Otherwise the bytes after the eighth do.
#[inline]
fn cmp_after(a: &[u8], b: &[u8]) -> Ordering {
    if a.len().min(b.len()) <= 8 {
        a.len().cmp(&b.len())
    } else {
        cmp_names_bytes(&a[8..], &b[8..])
    }
}

/// Compare two attribute names in byte order (`str`'s order). Names are short: their first
/// eight bytes decide almost every comparison, read as one big-endian integer instead of a
/// call to `memcmp`.
#[inline]
pub fn cmp_names(a: &str, b: &str) -> Ordering {
    cmp_names_bytes(a.as_bytes(), b.as_bytes())
}

#[inline]
fn cmp_names_bytes(a: &[u8], b: &[u8]) -> Ordering {
    let n = a.len().min(b.len());
    let mut i = 0;
    while i + 8 <= n {
        let x = u64::from_be_bytes(chunk8(a, i));
        let y = u64::from_be_bytes(chunk8(b, i));
        if x != y {
            return x.cmp(&y);
        }
        i += 8;
    }
    while i < n {
        if a[i] != b[i] {
            return a[i].cmp(&b[i]);
        }
        i += 1;
    }
    a.len().cmp(&b.len())
}

/// Whether two attribute names are the same (lengths first, then eight bytes at a time).
#[inline]
pub fn same_name(a: &str, b: &str) -> bool {
    a.len() == b.len() && cmp_names(a, b) == Ordering::Equal
}

/// Whether two names, each with its [`prefix_of`], are the same: the prefixes and lengths
/// equal, and past the eighth byte the rest (the prefix holds the first eight).
#[inline]
fn same_prefixed((p, a): (u64, &str), (q, b): (u64, &str)) -> bool {
    p == q && a.len() == b.len() && (a.len() <= 8 || a.as_bytes()[8..] == b.as_bytes()[8..])
}

#[inline]
fn chunk8(s: &[u8], at: usize) -> [u8; 8] {
    let mut c = [0u8; 8];
    c.copy_from_slice(&s[at..at + 8]);
    c
}

impl Item {
    /// An empty item.
    pub const fn new() -> Self {
        Item {
            attrs: Vec::new(),
            shape: OnceLock::new(),
        }
    }

    /// An item of these attributes (sorted, each name once), its shape not yet known.
    fn of_attrs(attrs: Vec<Attr>) -> Self {
        Item {
            attrs,
            shape: OnceLock::new(),
        }
    }

    /// A name was added or removed: the shape known before is no longer this item's.
    #[inline]
    fn renamed(&mut self) {
        self.shape.take();
    }

    /// An empty item with room for `n` attributes.
    pub fn with_capacity(n: usize) -> Self {
        Item::of_attrs(Vec::with_capacity(n))
    }

    /// Where `name` is (`Ok`), or where it would be inserted (`Err`).
    ///
    /// The first attribute whose prefix is not below `name`'s is found by a binary search
    /// over the prefixes alone, without a branch on the outcome of each comparison (a
    /// bucket item's ~30 names make five or six halvings, each a load, a compare and a
    /// conditional move); names sharing that prefix (rare: their first eight bytes equal)
    /// are then compared one by one. Every write, condition and decode looks names up here:
    /// it replaced `binary_search_by` with a three-way comparison per step, ~144
    /// instructions a look-up.
    #[inline]
    pub fn position(&self, name: &str) -> Result<usize, usize> {
        let name = name.as_bytes();
        let p = prefix_of(name);
        let a = &self.attrs;
        let mut at = lower_bound(a, p);
        while let Some(x) = a.get(at).filter(|x| x.prefix == p) {
            match cmp_after(x.name.as_bytes(), name) {
                Ordering::Less => at += 1,
                Ordering::Equal => return Ok(at),
                Ordering::Greater => break,
            }
        }
        debug_assert_eq!(
            a.binary_search_by(|x| x
                .prefix
                .cmp(&p)
                .then_with(|| cmp_after(x.name.as_bytes(), name))),
            Err(at),
            "an absent name goes where a three-way search puts it"
        );
        Err(at)
    }

    /// The value of `name`.
    #[inline]
    pub fn get<Q: AsRef<str> + ?Sized>(&self, name: &Q) -> Option<&Value> {
        self.position(name.as_ref())
            .ok()
            .map(|i| &self.attrs[i].value)
    }

    /// The value of `name`, to change it in place.
    #[inline]
    pub fn get_mut<Q: AsRef<str> + ?Sized>(&mut self, name: &Q) -> Option<&mut Value> {
        match self.position(name.as_ref()) {
            Ok(i) => Some(&mut self.attrs[i].value),
            Err(_) => None,
        }
    }

    /// The name and value of `name`.
    pub fn get_key_value<Q: AsRef<str> + ?Sized>(&self, name: &Q) -> Option<(&AttrName, &Value)> {
        self.position(name.as_ref())
            .ok()
            .map(|i| (&self.attrs[i].name, &self.attrs[i].value))
    }

    /// Whether the item holds `name`.
    #[inline]
    pub fn contains_key<Q: AsRef<str> + ?Sized>(&self, name: &Q) -> bool {
        self.position(name.as_ref()).is_ok()
    }

    /// Set `name` to `value`; the value it held before. An existing name keeps its place
    /// (and its memory).
    pub fn insert(&mut self, name: AttrName, value: Value) -> Option<Value> {
        match self.position(&name) {
            Ok(i) => Some(std::mem::replace(&mut self.attrs[i].value, value)),
            Err(i) => {
                self.attrs.insert(i, Attr::new(name, value));
                self.renamed();
                None
            }
        }
    }

    /// Remove `name`; the value it held.
    pub fn remove<Q: AsRef<str> + ?Sized>(&mut self, name: &Q) -> Option<Value> {
        match self.position(name.as_ref()) {
            Ok(i) => {
                self.renamed();
                Some(self.attrs.remove(i).value)
            }
            Err(_) => None,
        }
    }

    /// Remove `name`; its name and value.
    pub fn remove_entry<Q: AsRef<str> + ?Sized>(&mut self, name: &Q) -> Option<(AttrName, Value)> {
        match self.position(name.as_ref()) {
            Ok(i) => {
                self.renamed();
                let a = self.attrs.remove(i);
                Some((a.name, a.value))
            }
            Err(_) => None,
        }
    }

    /// How many attributes.
    #[inline]
    pub fn len(&self) -> usize {
        self.attrs.len()
    }

    /// Whether there is none.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.attrs.is_empty()
    }

    /// Remove every attribute (the memory is kept).
    pub fn clear(&mut self) {
        self.renamed();
        self.attrs.clear();
    }

    /// Keep only the attributes `keep` says yes to.
    pub fn retain(&mut self, mut keep: impl FnMut(&AttrName, &mut Value) -> bool) {
        let before = self.attrs.len();
        self.attrs.retain_mut(|a| keep(&a.name, &mut a.value));
        if self.attrs.len() != before {
            self.renamed();
        }
    }

    /// The attributes in name order.
    pub fn iter(&self) -> Iter<'_> {
        Iter {
            inner: self.attrs.iter(),
        }
    }

    /// The attributes in name order, values writable.
    pub fn iter_mut(&mut self) -> IterMut<'_> {
        IterMut {
            inner: self.attrs.iter_mut(),
        }
    }

    /// The attributes whose names are at or after `name`, in order (`BTreeMap::range` from
    /// an included bound).
    pub fn range_from(&self, name: &str) -> Iter<'_> {
        let at = self.position(name).unwrap_or_else(|i| i);
        Iter {
            inner: self.attrs[at..].iter(),
        }
    }

    /// The names in order.
    pub fn keys(&self) -> impl DoubleEndedIterator<Item = &AttrName> + ExactSizeIterator + Clone {
        self.attrs.iter().map(|a| &a.name)
    }

    /// The values in name order.
    pub fn values(&self) -> impl DoubleEndedIterator<Item = &Value> + ExactSizeIterator + Clone {
        self.attrs.iter().map(|a| &a.value)
    }

    /// The values in name order, writable.
    pub fn values_mut(
        &mut self,
    ) -> impl DoubleEndedIterator<Item = &mut Value> + ExactSizeIterator {
        self.attrs.iter_mut().map(|a| &mut a.value)
    }

    /// The attribute at `index` of the name order (see [`Item::position`]).
    #[inline]
    pub fn at(&self, index: usize) -> (&AttrName, &Value) {
        let a = &self.attrs[index];
        (&a.name, &a.value)
    }

    /// The value at `index` of the name order, writable.
    #[inline]
    pub fn value_at_mut(&mut self, index: usize) -> &mut Value {
        &mut self.attrs[index].value
    }

    /// Become a copy of `src`, reusing this item's memory: where the attribute at the same
    /// place has the same name, only the value is written (a string value into its own
    /// buffer).
    pub fn clone_from_item(&mut self, src: &Item) {
        let known_same = matches!(
            (self.shape.get(), src.shape.get()),
            (Some(a), Some(b)) if Arc::ptr_eq(a, b)
        );
        let same_shape = known_same
            || self.attrs.len() == src.attrs.len()
                && self
                    .attrs
                    .iter()
                    .zip(&src.attrs)
                    .all(|(a, b)| a.prefix == b.prefix && same_name(&a.name, &b.name));
        if !same_shape {
            self.attrs.clone_from(&src.attrs);
            self.shape = src.shape.clone();
            return;
        }
        // The same names: a shape either knows is both's.
        if let (None, Some(s)) = (self.shape.get(), src.shape.get()) {
            let _ = self.shape.set(Arc::clone(s));
        }
        for (d, s) in self.attrs.iter_mut().zip(&src.attrs) {
            match (&mut d.value, &s.value) {
                (Value::N(d), Value::N(s)) => *d = *s,
                (Value::S(d), Value::S(s)) => d.clone_from(s),
                (Value::Bool(d), Value::Bool(s)) => *d = *s,
                (d, s) => *d = s.clone(),
            }
        }
        debug_assert!(self == src, "a copy equals its source");
    }

    fn debug_sorted(&self) -> bool {
        self.attrs.windows(2).all(|w| {
            cmp_names(&w[0].name, &w[1].name) == Ordering::Less
                && w.iter().all(|a| a.prefix == prefix_of(a.name.as_bytes()))
        })
    }
}

/// The names of an item, in order, kept to tell whether another item has the same ones
/// ([`Item::has_names`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Names(Box<[(u64, AttrName)]>);

impl Item {
    /// This item's names.
    pub fn names(&self) -> Names {
        Names(
            self.attrs
                .iter()
                .map(|a| (a.prefix, a.name.clone()))
                .collect(),
        )
    }

    /// Whether this item has exactly `names`, in order. Each name is compared by its
    /// prefix integer and its length, and past its eighth byte only when it is longer.
    ///
    /// An item found to have them remembers which `names` they were (its shape), and a
    /// later question about the same `names` is answered from that alone: an item updated
    /// in place keeps its names, so a bucket decoded after every write (each of its ~30
    /// attributes on its own cache line) is not walked again — only the attributes the
    /// decoder reads are. Every change of a name forgets the shape ([`Item::renamed`]).
    pub fn has_names(&self, names: &Arc<Names>) -> bool {
        if let Some(known) = self.shape.get() {
            if Arc::ptr_eq(known, names) {
                debug_assert!(self.compare_names(names), "a known shape is the item's");
                return true;
            }
        }
        if !self.compare_names(names) {
            return false;
        }
        // Already set (to an equal shape another decoder recorded): keep that one.
        let _ = self.shape.set(Arc::clone(names));
        true
    }

    /// The names this item is known to have ([`Item::has_names`]), when it remembers them:
    /// every item that shares this `Arc` has them, in the same order, at the same indices.
    pub fn shape(&self) -> Option<&Arc<Names>> {
        self.shape.get()
    }

    /// Whether this item and `other` are known to have the same names in the same order:
    /// both remember the same shape ([`Item::has_names`]). Then the attribute at an index of
    /// one has the same name at that index of the other, and a name found in one need not
    /// be searched for in the other.
    pub fn shares_shape(&self, other: &Item) -> bool {
        let same = matches!(
            (self.shape.get(), other.shape.get()),
            (Some(a), Some(b)) if Arc::ptr_eq(a, b)
        );
        debug_assert!(
            !same
                || self
                    .attrs
                    .iter()
                    .map(|a| &a.name)
                    .eq(other.attrs.iter().map(|a| &a.name)),
            "a shared shape is both items' names"
        );
        same
    }

    /// Whether this item and `other` have the same names in the same order: at once when
    /// they share a shape ([`Item::shares_shape`]), otherwise compared name by name, each by
    /// its prefix integer and length, and past its eighth byte only when it is longer.
    pub fn same_names(&self, other: &Item) -> bool {
        self.shares_shape(other)
            || (self.attrs.len() == other.attrs.len()
                && self
                    .attrs
                    .iter()
                    .zip(other.attrs.iter())
                    .all(|(a, b)| same_prefixed((a.prefix, &a.name), (b.prefix, &b.name))))
    }

    /// [`Item::has_names`] by comparing every name.
    fn compare_names(&self, names: &Names) -> bool {
        self.attrs.len() == names.0.len()
            && self
                .attrs
                .iter()
                .zip(names.0.iter())
                .all(|(a, (p, n))| same_prefixed((a.prefix, &a.name), (*p, n)))
    }
}

/// The attributes of an item in name order.
#[derive(Clone, Debug)]
pub struct Iter<'a> {
    inner: std::slice::Iter<'a, Attr>,
}

impl<'a> Iterator for Iter<'a> {
    type Item = (&'a AttrName, &'a Value);
    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        self.inner.next().map(|a| (&a.name, &a.value))
    }
    #[inline]
    fn size_hint(&self) -> (usize, Option<usize>) {
        self.inner.size_hint()
    }
}

impl DoubleEndedIterator for Iter<'_> {
    fn next_back(&mut self) -> Option<Self::Item> {
        self.inner.next_back().map(|a| (&a.name, &a.value))
    }
}

impl ExactSizeIterator for Iter<'_> {}

/// The attributes of an item in name order, values writable.
#[derive(Debug)]
pub struct IterMut<'a> {
    inner: std::slice::IterMut<'a, Attr>,
}

impl<'a> Iterator for IterMut<'a> {
    type Item = (&'a AttrName, &'a mut Value);
    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        self.inner.next().map(|a| (&a.name, &mut a.value))
    }
    #[inline]
    fn size_hint(&self) -> (usize, Option<usize>) {
        self.inner.size_hint()
    }
}

impl ExactSizeIterator for IterMut<'_> {}

/// The attributes of an item in name order, owned.
#[derive(Debug)]
pub struct IntoIter {
    inner: std::vec::IntoIter<Attr>,
}

impl Iterator for IntoIter {
    type Item = (AttrName, Value);
    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        self.inner.next().map(|a| (a.name, a.value))
    }
    #[inline]
    fn size_hint(&self) -> (usize, Option<usize>) {
        self.inner.size_hint()
    }
}

impl DoubleEndedIterator for IntoIter {
    fn next_back(&mut self) -> Option<Self::Item> {
        self.inner.next_back().map(|a| (a.name, a.value))
    }
}

impl ExactSizeIterator for IntoIter {}

impl IntoIterator for Item {
    type Item = (AttrName, Value);
    type IntoIter = IntoIter;
    fn into_iter(self) -> IntoIter {
        IntoIter {
            inner: self.attrs.into_iter(),
        }
    }
}

impl<'a> IntoIterator for &'a Item {
    type Item = (&'a AttrName, &'a Value);
    type IntoIter = Iter<'a>;
    fn into_iter(self) -> Iter<'a> {
        self.iter()
    }
}

impl<'a> IntoIterator for &'a mut Item {
    type Item = (&'a AttrName, &'a mut Value);
    type IntoIter = IterMut<'a>;
    fn into_iter(self) -> IterMut<'a> {
        self.iter_mut()
    }
}

impl FromIterator<(AttrName, Value)> for Item {
    /// As a `BTreeMap` collects: a name given twice keeps the last value.
    fn from_iter<I: IntoIterator<Item = (AttrName, Value)>>(iter: I) -> Self {
        let mut attrs: Vec<Attr> = iter.into_iter().map(|(n, v)| Attr::new(n, v)).collect();
        // Stable: of equal names, the later stays later; keep its value (in place: of a
        // run of equal names the first is kept, holding the last one's value). Compared
        // as `position` compares: the prefixes, and only past them the names (the order
        // of `cmp_names`).
        attrs.sort_by(|a, b| {
            a.prefix
                .cmp(&b.prefix)
                .then_with(|| cmp_after(a.name.as_bytes(), b.name.as_bytes()))
        });
        attrs.dedup_by(|later, kept| {
            let same = same_prefixed((later.prefix, &later.name), (kept.prefix, &kept.name));
            if same {
                std::mem::swap(&mut later.value, &mut kept.value);
            }
            same
        });
        let item = Item::of_attrs(attrs);
        debug_assert!(
            item.debug_sorted(),
            "an item is sorted by name, each name once"
        );
        item
    }
}

/// The order a source lists an item's names in, remembered with the order of those names
/// in an item, so that the next item listed the same way is built without sorting.
///
/// DynamoDB lists a returned item's attributes in an order of its own (not by name), the
/// same order for the same names: a bucket's ~30 names came back alike on every write, and
/// sorting them was ~3 k of the ~6 k instructions of building the item
/// ([`Item::from_listed`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listing {
    /// The names as listed, each with its [`prefix_of`].
    listed: Box<[(u64, AttrName)]>,
    /// The item's attributes in name order, each as the index of its name in `listed`.
    sorted: Box<[u32]>,
}

impl Listing {
    /// The listing of `names` (as a source listed them); `None` when a name is listed
    /// twice (the last value wins there, which collecting decides).
    pub fn of<'a>(names: impl IntoIterator<Item = &'a str>) -> Option<Listing> {
        let listed: Box<[(u64, AttrName)]> = names
            .into_iter()
            .map(|n| (prefix_of(n.as_bytes()), AttrName::from(n)))
            .collect();
        let mut sorted: Vec<u32> = (0..u32::try_from(listed.len()).ok()?).collect();
        sorted.sort_unstable_by(|&a, &b| cmp_names(&listed[a as usize].1, &listed[b as usize].1));
        if sorted
            .windows(2)
            .any(|w| listed[w[0] as usize].1 == listed[w[1] as usize].1)
        {
            return None;
        }
        Some(Listing {
            listed,
            sorted: sorted.into(),
        })
    }

    /// Whether `names` are this listing's, in its order: each compared by its prefix integer
    /// and length, and past its eighth byte only when it is longer (most names are not).
    pub fn lists(&self, names: &[&str]) -> bool {
        self.listed.len() == names.len()
            && self
                .listed
                .iter()
                .zip(names)
                .all(|((p, a), b)| same_prefixed((*p, a), (prefix_of(b.as_bytes()), b)))
    }

    /// How many names it lists.
    pub fn len(&self) -> usize {
        self.listed.len()
    }

    /// Whether it lists no name.
    pub fn is_empty(&self) -> bool {
        self.listed.is_empty()
    }
}

impl Item {
    /// The item whose attributes a source listed in `listing`'s order, `values[i]` the value
    /// of the `i`-th listed name: placed in name order from the listing, not sorted (the
    /// same item [`FromIterator`] collects from those pairs). The values back, untouched,
    /// when they are not one per listed name.
    pub fn from_listed(listing: &Listing, mut values: Vec<Value>) -> Result<Item, Vec<Value>> {
        if values.len() != listing.listed.len() {
            return Err(values);
        }
        let attrs = listing
            .sorted
            .iter()
            .map(|&i| {
                let i = i as usize;
                let (prefix, name) = &listing.listed[i];
                Attr {
                    prefix: *prefix,
                    name: name.clone(),
                    value: std::mem::replace(&mut values[i], Value::Null),
                }
            })
            .collect();
        let item = Item::of_attrs(attrs);
        debug_assert!(
            item.debug_sorted(),
            "an item is sorted by name, each name once"
        );
        Ok(item)
    }
}

impl Extend<(AttrName, Value)> for Item {
    fn extend<I: IntoIterator<Item = (AttrName, Value)>>(&mut self, iter: I) {
        for (k, v) in iter {
            self.insert(k, v);
        }
    }
}

impl<const N: usize> From<[(AttrName, Value); N]> for Item {
    fn from(a: [(AttrName, Value); N]) -> Self {
        a.into_iter().collect()
    }
}

impl<Q: AsRef<str> + ?Sized> std::ops::Index<&Q> for Item {
    type Output = Value;
    /// The value of `name`; panics when the item does not hold it (as `BTreeMap`'s index
    /// does: for tests and for names the caller just checked).
    fn index(&self, name: &Q) -> &Value {
        match self.get(name) {
            Some(v) => v,
            None => panic!("no attribute {} in the item", name.as_ref()),
        }
    }
}

impl fmt::Debug for Item {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

impl Serialize for Item {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(self.attrs.len()))?;
        for a in &self.attrs {
            m.serialize_entry(a.name.as_str(), &a.value)?;
        }
        m.end()
    }
}

impl<'de> Deserialize<'de> for Item {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct ItemVisitor;
        impl<'de> Visitor<'de> for ItemVisitor {
            type Value = Item;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a map of attribute names to values")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Item, A::Error> {
                let mut item = Item::with_capacity(map.size_hint().unwrap_or(0));
                while let Some((n, v)) = map.next_entry::<AttrName, Value>()? {
                    // Stored items come sorted: appending is the common case.
                    match item.attrs.last() {
                        Some(last) if cmp_names(&last.name, &n) == Ordering::Less => {
                            item.attrs.push(Attr::new(n, v))
                        }
                        None => item.attrs.push(Attr::new(n, v)),
                        Some(_) => {
                            item.insert(n, v);
                        }
                    }
                }
                Ok(item)
            }
        }
        d.deserialize_map(ItemVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// `position` (a branch-free lower bound over the prefixes, then the names sharing
    /// one) answers as a three-way binary search over (prefix, rest of the name) does, for
    /// present and absent names, on items of every size drawn from names that share their
    /// first eight bytes or are prefixes of each other.
    #[test]
    fn position_is_the_three_way_search() {
        let names = [
            "",
            "\u{0}",
            "a",
            "ab",
            "abcdefg",
            "abcdefg\u{0}",
            "abcdefgh",
            "abcdefgh\u{0}",
            "abcdefgha",
            "abcdefghb",
            "abcdefghab",
            "abcdefgi",
            "b_rps_t",
            "b_rps_tc",
            "b_rps_tk",
            "b_rps_tkk",
            "b_rps_tk_tc",
            "entity_id",
            "entity_i",
            "PK",
            "SK",
            "rf",
            "rq",
            "z",
            "é",
            "éééé",
            "zzzzzzzzzzzz",
        ];
        let oracle = |item: &Item, name: &str| {
            let p = prefix_of(name.as_bytes());
            item.attrs.binary_search_by(|x| {
                x.prefix
                    .cmp(&p)
                    .then_with(|| cmp_after(x.name.as_bytes(), name.as_bytes()))
            })
        };
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut next = move || crate::test_rng::step(&mut x);
        for _ in 0..2_000 {
            let mut item = Item::new();
            let keep = next();
            for (i, n) in names.iter().enumerate() {
                if keep >> i & 1 == 1 {
                    item.insert((*n).into(), Value::N(i as i64));
                }
            }
            for n in names {
                assert_eq!(item.position(n), oracle(&item, n), "{n:?} in {item:?}");
            }
        }
        assert_eq!(Item::new().position("a"), Err(0));
    }

    /// A few thousand drawn operations on an `Item` and on a `BTreeMap` (the type it
    /// replaced) give the same answers and the same contents.
    #[test]
    fn behaves_as_a_btreemap() {
        let names = [
            "",
            "a",
            "b",
            "ab",
            "b_rps_tk",
            "b_rps_tc",
            "b_rps_t",
            "b_rps_tkk",
            "PK",
            "SK",
            "GSI1PK",
            "rf",
            "b_tpm_long_limit_name_tk",
            "b_tpm_long_limit_name_tc",
            "é",
            "z\u{0}",
            "abcdefg",
            "abcdefg\u{0}",
            "abcdefgh",
            "abcdefgh\u{0}",
            "abcdefg\u{0}\u{0}x",
            "abcdefghi",
            "\u{0}",
        ];
        let mut x: u64 = 0x2545_F491_4F6C_DD1D;
        let mut draw = |n: u64| (crate::test_rng::step(&mut x) % n) as usize;
        let mut item = Item::new();
        let mut map: BTreeMap<AttrName, Value> = BTreeMap::new();
        for step in 0..5_000 {
            let name = names[draw(names.len() as u64)];
            match draw(4) {
                0 | 1 => {
                    let v = Value::N(step);
                    assert_eq!(
                        item.insert(name.into(), v.clone()),
                        map.insert(name.into(), v)
                    );
                }
                2 => assert_eq!(item.remove(name), map.remove(name)),
                _ => {
                    if let (Some(a), Some(b)) = (item.get_mut(name), map.get_mut(name)) {
                        *a = Value::S(format!("{step}"));
                        *b = Value::S(format!("{step}"));
                    }
                }
            }
            assert_eq!(item.get(name), map.get(name));
            assert_eq!(item.contains_key(name), map.contains_key(name));
            assert_eq!(item.len(), map.len());
            assert!(
                item.iter().eq(map.iter()),
                "same contents in the same order"
            );
        }
        assert!(item.debug_sorted());
        assert_eq!(format!("{item:?}"), format!("{map:?}"));
        assert_eq!(
            serde_json::to_string(&item).ok(),
            serde_json::to_string(&map).ok()
        );
    }

    #[test]
    fn name_order_is_byte_order() {
        let names = [
            "",
            "a",
            "aa",
            "ab",
            "abcdefgh",
            "abcdefghi",
            "abcdefgi",
            "abcdefgh\u{0}",
            "B",
            "b_x_tk",
            "b_x_tc",
            "é",
            "\u{7f}",
            "abcdefghijklmnopq",
            "abcdefghijklmnopr",
        ];
        for a in names {
            for b in names {
                assert_eq!(cmp_names(a, b), a.cmp(b), "{a:?} vs {b:?}");
            }
        }
    }

    #[test]
    fn collect_keeps_the_last_of_a_repeated_name_and_serde_round_trips() {
        let item: Item = [("b", Value::N(1)), ("a", Value::N(2)), ("b", Value::N(3))]
            .into_iter()
            .map(|(n, v)| (n.into(), v))
            .collect();
        assert_eq!(item.len(), 2);
        assert_eq!(item.get("b"), Some(&Value::N(3)));
        let text = serde_json::to_string(&item).unwrap_or_default();
        assert_eq!(text, r#"{"a":{"n":2},"b":{"n":3}}"#);
        let back: Item = serde_json::from_str(r#"{"b":{"n":3},"a":{"n":2}}"#).unwrap_or_default();
        assert_eq!(back, item);
    }

    /// A shape found by [`Item::has_names`] answers for the item while only values
    /// change, travels with copies, and is forgotten by every change of a name — after
    /// which the same question compares the names again (and answers no).
    #[test]
    fn a_known_shape_lasts_until_a_name_changes() {
        let item = |names: &[&str]| -> Item {
            names
                .iter()
                .map(|n| (AttrName::from(*n), Value::N(1)))
                .collect()
        };
        let shape = Arc::new(item(&["PK", "SK", "b_rpm_tk", "rf"]).names());
        let mut it = item(&["PK", "SK", "b_rpm_tk", "rf"]);
        assert!(it.shape.get().is_none(), "a new item knows no shape");
        assert!(it.has_names(&shape));
        assert!(Arc::ptr_eq(it.shape.get().expect("remembered"), &shape));
        // Values change in place: the shape stays.
        *it.get_mut("rf").expect("present") = Value::N(7);
        it.insert("b_rpm_tk".into(), Value::N(9));
        assert!(it.shape.get().is_some() && it.has_names(&shape));
        let copy = it.clone();
        assert!(copy.shape.get().is_some() && copy.has_names(&shape));
        // The shape is not part of the value.
        assert_eq!(
            copy,
            item(&["PK", "SK", "b_rpm_tk", "rf"]).tap(|i| {
                *i.get_mut("rf").expect("present") = Value::N(7);
                i.insert("b_rpm_tk".into(), Value::N(9));
            })
        );
        // Every change of a name forgets it.
        let renames: [fn(&mut Item); 5] = [
            |i| drop(i.insert("vu".into(), Value::N(1))),
            |i| drop(i.remove("rf")),
            |i| drop(i.remove_entry("SK")),
            |i| i.retain(|n, _| n != "PK"),
            |i| i.clear(),
        ];
        for (k, rename) in renames.iter().enumerate() {
            let mut i = it.clone();
            rename(&mut i);
            assert!(i.shape.get().is_none(), "change {k} forgets the shape");
            assert!(!i.has_names(&shape), "change {k}: the names differ");
        }
        // A copy into an item of other names takes the source's shape; one into the same
        // names keeps or learns it.
        let mut other = item(&["a", "b"]);
        other.clone_from_item(&it);
        assert!(other.shape.get().is_some() && other.has_names(&shape) && other == it);
        let mut same = item(&["PK", "SK", "b_rpm_tk", "rf"]);
        same.clone_from_item(&it);
        assert!(Arc::ptr_eq(same.shape.get().expect("learnt"), &shape));
        // A retain that keeps everything renames nothing.
        let mut kept = it.clone();
        kept.retain(|_, _| true);
        assert!(kept.shape.get().is_some());
    }

    /// `same_names` answers as comparing the name lists would, shared shape or not:
    /// names equal in their first eight bytes are told apart by their length and the rest.
    #[test]
    fn same_names_is_the_names_compared() {
        let item = |names: &[&str]| -> Item {
            names
                .iter()
                .enumerate()
                .map(|(i, n)| (AttrName::from(*n), Value::N(i as i64)))
                .collect()
        };
        let lists: [&[&str]; 7] = [
            &[],
            &["PK"],
            &["PK", "SK", "b_rpm_tk_long", "rf"],
            &["PK", "SK", "b_rpm_tk_lone", "rf"],
            &["PK", "SK", "b_rpm_tk_longer", "rf"],
            &["PK", "SK", "b_rpm_tk", "rf"],
            &["PK", "SK", "b_rpm_tk", "rf", "wt"],
        ];
        for a in lists {
            for b in lists {
                let (x, mut y) = (item(a), item(b));
                // Other values, the same names.
                y.iter_mut().for_each(|(_, v)| *v = Value::S("x".into()));
                assert_eq!(x.same_names(&y), a == b, "{a:?} and {b:?}");
            }
        }
        let shape = Arc::new(item(lists[2]).names());
        let (x, y) = (item(lists[2]), item(lists[2]));
        assert!(x.has_names(&shape) && y.has_names(&shape) && x.same_names(&y));
    }

    trait Tap: Sized {
        fn tap(mut self, f: impl FnOnce(&mut Self)) -> Self {
            f(&mut self);
            self
        }
    }
    impl Tap for Item {}

    #[test]
    fn clone_from_item_reuses_a_same_shaped_copy() {
        let of = |a: &[(&str, Value)]| -> Item {
            a.iter().map(|(n, v)| ((*n).into(), v.clone())).collect()
        };
        let a = of(&[
            ("x", Value::S("long enough to live on the heap".into())),
            ("y", Value::N(1)),
        ]);
        let b = of(&[("x", Value::S("other".into())), ("y", Value::N(2))]);
        let mut c = a.clone();
        c.clone_from_item(&b);
        assert_eq!(c, b);
        let d = of(&[("z", Value::N(3))]);
        c.clone_from_item(&d);
        assert_eq!(c, d);
    }

    /// An item placed from a listing is the item collecting the same pairs gives, for
    /// names in every order (shared first eight bytes, non-ASCII, prefixes of each other);
    /// a name listed twice makes no listing; values not one per name are given back.
    #[test]
    fn an_item_placed_from_its_listing_is_the_collected_item() {
        let pool = [
            "b_rps_tk",
            "b_rps_tc",
            "b_rps_t",
            "b_rps_tk_",
            "PK",
            "SK",
            "a",
            "é",
            "ü🦀",
            "GSI1PK",
            "GSI1SK",
            "",
            "rf",
            "b_rpm-x.y_tk",
        ];
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        let mut next = move || crate::test_rng::step(&mut x);
        for round in 0..2000 {
            // A random subset of the pool in a random order.
            let mut names: Vec<&str> = pool.iter().copied().filter(|_| next() % 2 == 0).collect();
            for i in (1..names.len()).rev() {
                names.swap(i, (next() % (i as u64 + 1)) as usize);
            }
            let values: Vec<Value> = names.iter().map(|_| Value::N(next() as i64)).collect();
            let collected: Item = names
                .iter()
                .zip(values.clone())
                .map(|(n, v)| (AttrName::from(*n), v))
                .collect();
            let listing = Listing::of(names.iter().copied()).expect("no name twice");
            assert!(listing.lists(&names));
            assert_eq!(listing.len(), names.len());
            assert_eq!(
                Item::from_listed(&listing, values.clone()).ok(),
                Some(collected.clone()),
                "round {round}: {names:?}"
            );
            // Another order of the same names is not this listing.
            if names.len() > 1 {
                let mut other = names.clone();
                other.swap(0, 1);
                assert!(!listing.lists(&other));
            }
            // One value short: given back.
            if let Some((_, fewer)) = values.split_last() {
                assert_eq!(
                    Item::from_listed(&listing, fewer.to_vec()),
                    Err(fewer.to_vec())
                );
            }
        }
        assert_eq!(Listing::of(["a", "b", "a"]), None);
        let empty = Listing::of([]).expect("an empty listing");
        assert!(empty.is_empty());
        assert_eq!(Item::from_listed(&empty, vec![]).ok(), Some(Item::new()));
    }
}
