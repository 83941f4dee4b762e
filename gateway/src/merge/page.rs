//! A member's list page read in one pass and written out marked, without a tree of values.
//!
//! ```text
//!  member's bytes ─► read ─► Page { head (kind, apiVersion, columnDefinitions…: raw),
//!                                   resourceVersion, continue,
//!                                   entries: each item (a Table's row) copied as it came,
//!                                            its metadata.annotations + meridian.io/cluster }
//!  open(head, rv, continue) ++ entries of every page, comma-joined ++ CLOSE  =  the merged list
//! ```
//!
//! Each entry is scanned once: its fields are borrowed from the member's bytes and copied to
//! the output as they are, except `metadata`, whose fields are copied the same way but for
//! `annotations`, which gets the cluster's mark. Nothing of `spec` or `status` is parsed, so a
//! merged list costs about a copy of the member's bytes, not a JSON tree per object.

use std::borrow::Cow;
use std::fmt;

use bytes::Bytes;
use serde::Deserialize;
use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;

use super::CLUSTER_ANNOTATION;

/// Where a list keeps its entries: a list's `items`, a Table's `rows`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Field {
    #[default]
    Items,
    Rows,
}

impl Field {
    fn name(self) -> &'static str {
        match self {
            Field::Items => "items",
            Field::Rows => "rows",
        }
    }
}

/// What an entry is, for the caller's filter: its object's namespace and name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EntryKey<'a> {
    pub namespace: Option<Cow<'a, str>>,
    pub name: Option<Cow<'a, str>>,
}

/// One member's page, read.
#[derive(Debug, Default)]
pub struct Page {
    /// The list's own fields but `metadata` and the entries (kind, apiVersion, a Table's
    /// columnDefinitions), as the member wrote them: the merged list takes the first page's.
    pub head: Vec<(String, Box<RawValue>)>,
    pub field: Field,
    pub resource_version: Option<String>,
    /// The member's own continue token (None: its list ends here).
    pub continue_token: Option<String>,
    /// Entries the member sent, kept or not: what a `limit` counts.
    pub sent: usize,
    /// Entries kept.
    pub kept: usize,
    /// The kept entries, marked, each after a comma (no brackets): [`Joiner`] drops the first
    /// list's first comma without moving the rest.
    pub entries: Vec<u8>,
}

impl Page {
    /// The member's `kind` (a Table's entries are its rows).
    pub fn kind(&self) -> Option<String> {
        let (_, raw) = self.head.iter().find(|(k, _)| k == "kind")?;
        serde_json::from_str(raw.get()).ok()
    }
}

/// Reads a member's list page, marking each entry as `cluster`'s and keeping those `keep`
/// accepts. An answer that is not a JSON object is an error; one with no entries is empty.
pub fn read<K: FnMut(&EntryKey<'_>) -> bool>(
    bytes: &[u8],
    cluster: &str,
    keep: K,
) -> Result<Page, serde_json::Error> {
    let mark = mark_bytes(cluster);
    let mut de = serde_json::Deserializer::from_slice(bytes);
    // The entries are about the page's size, plus a mark each: sized once, so a page is not
    // copied as it grows (and the allocator is not left with the pieces).
    let entries = Vec::with_capacity(bytes.len() + bytes.len() / 8);
    let page = de.deserialize_map(PageVisitor {
        mark: &mark,
        keep,
        entries: Some(entries),
    })?;
    de.end()?;
    Ok(page)
}

/// The start of a merged list, up to where its first entry goes: the first page's head (or a
/// plain `List`), the fleet's metadata, and its entries' field opened.
pub fn open(head: Option<&Page>, resource_version: &str, continue_token: Option<&str>) -> Vec<u8> {
    let mut out = Vec::with_capacity(256);
    out.push(b'{');
    match head {
        Some(page) if !page.head.is_empty() => {
            for (key, value) in &page.head {
                write_str(&mut out, key);
                out.push(b':');
                out.extend_from_slice(value.get().as_bytes());
                out.push(b',');
            }
        }
        _ => out.extend_from_slice(br#""kind":"List","apiVersion":"v1","#),
    }
    out.extend_from_slice(br#""metadata":{"resourceVersion":"#);
    write_str(&mut out, resource_version);
    if let Some(token) = continue_token {
        out.extend_from_slice(br#","continue":"#);
        write_str(&mut out, token);
    }
    out.extend_from_slice(b"},");
    write_str(&mut out, head.map_or(Field::Items, |p| p.field).name());
    out.extend_from_slice(b":[");
    out
}

/// The end of a merged list.
pub const CLOSE: &[u8] = b"]}";

/// Joins pages' entries into one array, a comma between two entries.
#[derive(Debug, Default)]
pub struct Joiner {
    any: bool,
}

impl Joiner {
    /// `page`'s entries, with the comma that separates them from the ones before (empty when
    /// it kept none).
    pub fn next(&mut self, page: Page) -> Bytes {
        if page.kept == 0 {
            return Bytes::new();
        }
        let entries = Bytes::from(page.entries);
        if std::mem::replace(&mut self.any, true) {
            entries
        } else {
            entries.slice(1..)
        }
    }
}

/// `"meridian.io/cluster":"<cluster>"`, written once a page.
fn mark_bytes(cluster: &str) -> Vec<u8> {
    let mut out = Vec::new();
    write_str(&mut out, CLUSTER_ANNOTATION);
    out.push(b':');
    write_str(&mut out, cluster);
    out
}

fn write_str(out: &mut Vec<u8>, text: &str) {
    // Writing to a Vec cannot fail, and a str always serializes.
    let _ = serde_json::to_writer(&mut *out, text);
}

/// A key or string value, borrowed from the input where it has no escapes.
struct Text<'de>(Cow<'de, str>);

impl<'de> Deserialize<'de> for Text<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Text<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Text<'de>, E> {
                Ok(Text(Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Text<'de>, E> {
                Ok(Text(Cow::Owned(v.to_string())))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Text<'de>, E> {
                Ok(Text(Cow::Owned(v)))
            }
        }
        d.deserialize_str(V)
    }
}

/// A list's metadata: what the merge needs of it.
#[derive(Deserialize)]
struct ListMeta {
    #[serde(rename = "resourceVersion")]
    resource_version: Option<String>,
    #[serde(rename = "continue")]
    continue_token: Option<String>,
}

struct PageVisitor<'a, K> {
    mark: &'a [u8],
    keep: K,
    /// The buffer the entries are written to.
    entries: Option<Vec<u8>>,
}

impl<'de, K: FnMut(&EntryKey<'_>) -> bool> Visitor<'de> for PageVisitor<'_, K> {
    type Value = Page;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list")
    }

    fn visit_map<A: MapAccess<'de>>(mut self, mut map: A) -> Result<Page, A::Error> {
        let mut page = Page {
            entries: self.entries.take().unwrap_or_default(),
            ..Page::default()
        };
        while let Some(Text(key)) = map.next_key()? {
            match &*key {
                "metadata" => {
                    if let Some(meta) = map.next_value::<Option<ListMeta>>()? {
                        page.resource_version = meta.resource_version;
                        page.continue_token = meta.continue_token.filter(|c| !c.is_empty());
                    }
                }
                "items" | "rows" => {
                    page.field = if key == "rows" {
                        Field::Rows
                    } else {
                        Field::Items
                    };
                    map.next_value_seed(Entries {
                        page: &mut page,
                        mark: self.mark,
                        keep: &mut self.keep,
                    })?;
                }
                _ => page.head.push((key.into_owned(), map.next_value()?)),
            }
        }
        Ok(page)
    }
}

/// The entries array: each entry written, then dropped again if `keep` refuses it.
struct Entries<'p, 'a, K> {
    page: &'p mut Page,
    mark: &'a [u8],
    keep: &'p mut K,
}

impl<'de, K: FnMut(&EntryKey<'_>) -> bool> DeserializeSeed<'de> for Entries<'_, '_, K> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de, K: FnMut(&EntryKey<'_>) -> bool> Visitor<'de> for Entries<'_, '_, K> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an array of entries")
    }

    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let row = self.page.field == Field::Rows;
        loop {
            let start = self.page.entries.len();
            self.page.entries.push(b',');
            let seed = Entry {
                out: &mut self.page.entries,
                mark: self.mark,
                row,
            };
            let Some(key) = seq.next_element_seed(seed)? else {
                self.page.entries.truncate(start);
                return Ok(());
            };
            self.page.sent += 1;
            if (self.keep)(&key) {
                self.page.kept += 1;
            } else {
                self.page.entries.truncate(start);
            }
        }
    }
}

/// One entry: an object (items, a row's `object`) or a Table's row.
struct Entry<'o, 'a> {
    out: &'o mut Vec<u8>,
    mark: &'a [u8],
    row: bool,
}

impl<'de> DeserializeSeed<'de> for Entry<'_, '_> {
    type Value = EntryKey<'de>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<EntryKey<'de>, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Entry<'_, '_> {
    type Value = EntryKey<'de>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object")
    }

    /// A row without an object (`includeObject=None`).
    fn visit_unit<E: de::Error>(self) -> Result<EntryKey<'de>, E> {
        self.out.extend_from_slice(b"null");
        Ok(EntryKey::default())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<EntryKey<'de>, A::Error> {
        let mut key = EntryKey::default();
        self.out.push(b'{');
        let mut first = true;
        while let Some(Text(field)) = map.next_key()? {
            if !std::mem::take(&mut first) {
                self.out.push(b',');
            }
            write_str(self.out, &field);
            self.out.push(b':');
            match (&*field, self.row) {
                ("object", true) => {
                    key = map.next_value_seed(Entry {
                        out: &mut *self.out,
                        mark: self.mark,
                        row: false,
                    })?;
                }
                ("metadata", false) => {
                    key = map.next_value_seed(Metadata {
                        out: &mut *self.out,
                        mark: self.mark,
                    })?;
                }
                _ => {
                    let raw: &'de RawValue = map.next_value()?;
                    self.out.extend_from_slice(raw.get().as_bytes());
                }
            }
        }
        self.out.push(b'}');
        Ok(key)
    }
}

/// An object's metadata: copied, its annotations marked (added when it has none).
struct Metadata<'o, 'a> {
    out: &'o mut Vec<u8>,
    mark: &'a [u8],
}

impl<'de> DeserializeSeed<'de> for Metadata<'_, '_> {
    type Value = EntryKey<'de>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<EntryKey<'de>, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for Metadata<'_, '_> {
    type Value = EntryKey<'de>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object's metadata")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<EntryKey<'de>, A::Error> {
        let mut key = EntryKey::default();
        let mut annotated = false;
        self.out.push(b'{');
        let mut first = true;
        while let Some(Text(field)) = map.next_key()? {
            if !std::mem::take(&mut first) {
                self.out.push(b',');
            }
            write_str(self.out, &field);
            self.out.push(b':');
            match &*field {
                "annotations" => {
                    annotated = true;
                    map.next_value_seed(Annotations {
                        out: &mut *self.out,
                        mark: self.mark,
                    })?;
                }
                "namespace" | "name" => {
                    let value: Option<Text<'de>> = map.next_value()?;
                    match &value {
                        Some(Text(text)) => write_str(self.out, text),
                        None => self.out.extend_from_slice(b"null"),
                    }
                    let value = value.map(|t| t.0);
                    if field == "name" {
                        key.name = value;
                    } else {
                        key.namespace = value;
                    }
                }
                _ => {
                    let raw: &'de RawValue = map.next_value()?;
                    self.out.extend_from_slice(raw.get().as_bytes());
                }
            }
        }
        if !annotated {
            if !first {
                self.out.push(b',');
            }
            self.out.extend_from_slice(br#""annotations":{"#);
            self.out.extend_from_slice(self.mark);
            self.out.push(b'}');
        }
        self.out.push(b'}');
        Ok(key)
    }
}

/// An object's annotations with the cluster's mark last (replacing one it carried).
struct Annotations<'o, 'a> {
    out: &'o mut Vec<u8>,
    mark: &'a [u8],
}

impl<'de> DeserializeSeed<'de> for Annotations<'_, '_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Annotations<'_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("annotations")
    }

    /// `annotations: null`: the mark alone.
    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        self.out.push(b'{');
        self.out.extend_from_slice(self.mark);
        self.out.push(b'}');
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        self.out.push(b'{');
        while let Some(Text(name)) = map.next_key()? {
            if name == CLUSTER_ANNOTATION {
                map.next_value::<IgnoredAny>()?;
                continue;
            }
            write_str(self.out, &name);
            self.out.push(b':');
            let raw: &'de RawValue = map.next_value()?;
            self.out.extend_from_slice(raw.get().as_bytes());
            self.out.push(b',');
        }
        self.out.extend_from_slice(self.mark);
        self.out.push(b'}');
        Ok(())
    }
}

#[cfg(test)]
mod tests;
