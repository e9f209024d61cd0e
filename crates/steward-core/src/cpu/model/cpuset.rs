//! [`CpuSet`]: a sorted set of small integers (CPU ids or NUMA node ids) with
//! the Linux list syntax (`"0-3,8,10-11"`) as its text form.

use std::fmt;
use std::str::FromStr;

/// Largest id a [`CpuSet`] accepts. Linux kernels are built with at most
/// 8192 CPUs; the margin keeps absurd input (`"0-4294967295"`) from
/// allocating gigabytes.
pub const MAX_ID: u32 = 16_383;

const WORD: u32 = 64;

/// Why a cpuset string was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CpuSetError {
    /// An element is not a number or `a-b` range.
    #[error("invalid cpuset element {element:?} in {input:?}: expected N or N-M")]
    Syntax { input: String, element: String },
    /// A range whose end is below its start.
    #[error("invalid cpuset range {element:?} in {input:?}: end is below start")]
    ReversedRange { input: String, element: String },
    /// An id above [`MAX_ID`].
    #[error("cpuset id {id} in {input:?} exceeds the maximum {MAX_ID}")]
    TooLarge { input: String, id: u64 },
}

/// A sorted set of `u32` ids, stored as a bitmap.
///
/// Used for CPU sets and for NUMA node sets. The canonical text form
/// (`Display`) is the Linux list form: ascending, ranges collapsed, no
/// spaces, empty string for the empty set. Serialises as that string.
#[derive(Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CpuSet {
    // Invariant: no trailing zero words, so derived Eq/Hash/Ord are canonical.
    words: Words,
}

impl CpuSet {
    /// The empty set.
    pub fn new() -> CpuSet {
        CpuSet {
            words: Words::new(),
        }
    }

    /// Parses the Linux list form: `"0-3,8,10-11"`. Whitespace around
    /// elements and a trailing newline are tolerated (sysfs files end in
    /// one); `""` is the empty set.
    pub fn parse(s: &str) -> Result<CpuSet, CpuSetError> {
        let mut set = CpuSet::new();
        let trimmed = s.trim();
        if trimmed.is_empty() {
            return Ok(set);
        }
        for raw in trimmed.split(',') {
            let element = raw.trim();
            let syntax = || CpuSetError::Syntax {
                input: s.to_string(),
                element: element.to_string(),
            };
            let (lo, hi) = match element.split_once('-') {
                Some((a, b)) => (
                    parse_id(s, a.trim(), &syntax)?,
                    parse_id(s, b.trim(), &syntax)?,
                ),
                None => {
                    let v = parse_id(s, element, &syntax)?;
                    (v, v)
                }
            };
            if hi < lo {
                return Err(CpuSetError::ReversedRange {
                    input: s.to_string(),
                    element: element.to_string(),
                });
            }
            set.insert_range(lo, hi);
        }
        Ok(set)
    }

    /// Builds a set from ids; ids above [`MAX_ID`] are an error.
    pub fn from_ids<I: IntoIterator<Item = u32>>(ids: I) -> Result<CpuSet, CpuSetError> {
        let mut set = CpuSet::new();
        for id in ids {
            if id > MAX_ID {
                return Err(CpuSetError::TooLarge {
                    input: format!("{id}"),
                    id: u64::from(id),
                });
            }
            set.insert(id);
        }
        Ok(set)
    }

    /// `lo..=hi`, clamped to [`MAX_ID`].
    pub fn range(lo: u32, hi: u32) -> CpuSet {
        let mut set = CpuSet::new();
        if lo <= hi {
            set.insert_range(lo.min(MAX_ID), hi.min(MAX_ID));
        }
        set
    }

    /// Number of ids in the set.
    pub fn len(&self) -> usize {
        self.words.iter().map(|w| w.count_ones() as usize).sum()
    }

    /// True when the set holds nothing.
    pub fn is_empty(&self) -> bool {
        self.words.is_empty()
    }

    /// Ids in ascending order.
    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.words.iter().enumerate().flat_map(|(wi, &w)| {
            let base = wi as u32 * WORD;
            BitIter(w).map(move |b| base + b)
        })
    }

    /// True when `id` is in the set.
    pub fn contains(&self, id: u32) -> bool {
        let (w, b) = split(id);
        self.words.get(w).is_some_and(|x| x & (1u64 << b) != 0)
    }

    /// Adds `id` (ids above [`MAX_ID`] are ignored; use [`CpuSet::from_ids`]
    /// for checked construction). Returns whether it was newly added.
    pub fn insert(&mut self, id: u32) -> bool {
        if id > MAX_ID {
            return false;
        }
        let (w, b) = split(id);
        if self.words.len() <= w {
            self.words.resize(w + 1, 0);
        }
        let was = self.words[w] & (1u64 << b) != 0;
        self.words[w] |= 1u64 << b;
        !was
    }

    /// Removes `id`; returns whether it was present.
    pub fn remove(&mut self, id: u32) -> bool {
        let (w, b) = split(id);
        let Some(word) = self.words.get_mut(w) else {
            return false;
        };
        let was = *word & (1u64 << b) != 0;
        *word &= !(1u64 << b);
        self.trim();
        was
    }

    /// Smallest id.
    pub fn first(&self) -> Option<u32> {
        self.iter().next()
    }

    /// `self ∪ other`.
    pub fn union(&self, other: &CpuSet) -> CpuSet {
        let (long, short) = if self.words.len() >= other.words.len() {
            (self, other)
        } else {
            (other, self)
        };
        let mut words = long.words.clone();
        for (w, o) in words.iter_mut().zip(short.words.iter()) {
            *w |= o;
        }
        CpuSet { words }
    }

    /// `self ∩ other`.
    pub fn intersection(&self, other: &CpuSet) -> CpuSet {
        let words = self
            .words
            .iter()
            .zip(other.words.iter())
            .map(|(a, b)| a & b)
            .collect();
        let mut s = CpuSet { words };
        s.trim();
        s
    }

    /// `self \ other`.
    pub fn difference(&self, other: &CpuSet) -> CpuSet {
        let mut words = self.words.clone();
        for (w, o) in words.iter_mut().zip(other.words.iter()) {
            *w &= !o;
        }
        let mut s = CpuSet { words };
        s.trim();
        s
    }

    /// In-place `self ∪= other`.
    pub fn union_with(&mut self, other: &CpuSet) {
        if self.words.len() < other.words.len() {
            self.words.resize(other.words.len(), 0);
        }
        for (w, o) in self.words.iter_mut().zip(other.words.iter()) {
            *w |= o;
        }
    }

    /// In-place `self \= other`.
    pub fn difference_with(&mut self, other: &CpuSet) {
        for (w, o) in self.words.iter_mut().zip(other.words.iter()) {
            *w &= !o;
        }
        self.trim();
    }

    /// Number of ids in `self ∩ other`, without allocating.
    pub fn intersection_len(&self, other: &CpuSet) -> usize {
        self.words
            .iter()
            .zip(other.words.iter())
            .map(|(a, b)| (a & b).count_ones() as usize)
            .sum()
    }

    /// True when every id of `self` is in `other`.
    pub fn is_subset(&self, other: &CpuSet) -> bool {
        self.words.iter().enumerate().all(|(i, w)| {
            let o = other.words.get(i).copied().unwrap_or(0);
            w & !o == 0
        })
    }

    /// True when the sets share no id.
    pub fn is_disjoint(&self, other: &CpuSet) -> bool {
        self.intersection_len(other) == 0
    }

    fn insert_range(&mut self, lo: u32, hi: u32) {
        let (hw, _) = split(hi);
        if self.words.len() <= hw {
            self.words.resize(hw + 1, 0);
        }
        for id in lo..=hi {
            let (w, b) = split(id);
            self.words[w] |= 1u64 << b;
        }
    }

    fn trim(&mut self) {
        while self.words.last() == Some(&0) {
            self.words.pop();
        }
    }
}

fn split(id: u32) -> (usize, u32) {
    ((id / WORD) as usize, id % WORD)
}

fn parse_id(input: &str, s: &str, syntax: &dyn Fn() -> CpuSetError) -> Result<u32, CpuSetError> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(syntax());
    }
    let v: u64 = s.parse().unwrap_or(u64::MAX);
    if v > u64::from(MAX_ID) {
        return Err(CpuSetError::TooLarge {
            input: input.to_string(),
            id: v,
        });
    }
    Ok(v as u32)
}

struct BitIter(u64);

impl Iterator for BitIter {
    type Item = u32;
    fn next(&mut self) -> Option<u32> {
        if self.0 == 0 {
            return None;
        }
        let b = self.0.trailing_zeros();
        self.0 &= self.0 - 1;
        Some(b)
    }
}

impl fmt::Display for CpuSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        let mut it = self.iter().peekable();
        while let Some(lo) = it.next() {
            let mut hi = lo;
            while it.peek() == Some(&(hi + 1)) {
                hi += 1;
                it.next();
            }
            if !first {
                f.write_str(",")?;
            }
            first = false;
            if lo == hi {
                write!(f, "{lo}")?;
            } else {
                write!(f, "{lo}-{hi}")?;
            }
        }
        Ok(())
    }
}

impl fmt::Debug for CpuSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CpuSet({self})")
    }
}

impl FromStr for CpuSet {
    type Err = CpuSetError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        CpuSet::parse(s)
    }
}

impl FromIterator<u32> for CpuSet {
    /// Collects ids; ids above [`MAX_ID`] are dropped.
    fn from_iter<T: IntoIterator<Item = u32>>(iter: T) -> Self {
        let mut s = CpuSet::new();
        for id in iter {
            s.insert(id);
        }
        s
    }
}

impl serde::Serialize for CpuSet {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for CpuSet {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        CpuSet::parse(&s).map_err(serde::de::Error::custom)
    }
}

/// Bitmap words, stored inline up to 256 ids so that cloning the cpusets of
/// ordinary machines does not allocate.
#[derive(Clone)]
struct Words {
    len: usize,
    inline: [u64; INLINE],
    /// All words when `len > INLINE`.
    heap: Vec<u64>,
}

const INLINE: usize = 4;

impl Words {
    fn new() -> Words {
        Words {
            len: 0,
            inline: [0; INLINE],
            heap: Vec::new(),
        }
    }

    fn resize(&mut self, n: usize, fill: u64) {
        if n <= INLINE {
            if self.len > INLINE {
                self.inline.copy_from_slice(&self.heap[..INLINE]);
                self.heap.clear();
            }
            for w in self.inline.iter_mut().take(INLINE).skip(self.len.min(n)) {
                *w = fill;
            }
            // words past n must read as zero when the set grows again
            for w in self.inline.iter_mut().skip(n) {
                *w = 0;
            }
        } else {
            if self.len <= INLINE {
                self.heap.clear();
                self.heap.extend_from_slice(&self.inline[..self.len]);
                self.inline = [0; INLINE];
            }
            self.heap.resize(n, fill);
        }
        self.len = n;
    }

    fn pop(&mut self) -> Option<u64> {
        if self.len == 0 {
            return None;
        }
        let last = self[self.len - 1];
        self.resize(self.len - 1, 0);
        Some(last)
    }
}

impl Default for Words {
    fn default() -> Self {
        Words::new()
    }
}

impl std::ops::Deref for Words {
    type Target = [u64];
    fn deref(&self) -> &[u64] {
        if self.len <= INLINE {
            &self.inline[..self.len]
        } else {
            &self.heap
        }
    }
}

impl std::ops::DerefMut for Words {
    fn deref_mut(&mut self) -> &mut [u64] {
        if self.len <= INLINE {
            &mut self.inline[..self.len]
        } else {
            &mut self.heap
        }
    }
}

impl FromIterator<u64> for Words {
    fn from_iter<T: IntoIterator<Item = u64>>(iter: T) -> Self {
        let mut w = Words::new();
        for (i, v) in iter.into_iter().enumerate() {
            w.resize(i + 1, 0);
            w[i] = v;
        }
        w
    }
}

impl PartialEq for Words {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl Eq for Words {}

impl std::hash::Hash for Words {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        (**self).hash(state)
    }
}

impl PartialOrd for Words {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Words {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (**self).cmp(&**other)
    }
}
