//! The keys of a config's top level: the library's own, and a key that neither it nor
//! the program embedding it takes, refused where it stands as serde refuses an unknown
//! field.

use std::collections::BTreeMap;

use serde::de::IgnoredAny;

use super::{line_and_column, ConfigError, Parser};

/// The top-level keys the library reads ([`super::RawConfig`]'s fields).
pub(super) const KEYS: &[&str] = &[
    "migrate",
    "shutdown_grace",
    "store_timeout",
    "answer_timeout",
    "max_clock_offset",
    "max_counters",
    "data_dir",
    "stores",
    "namespaces",
    "quota",
];

impl Parser<'_> {
    /// Refuses the first key of `text`'s top level (in file order) that is neither the
    /// library's nor one of `others`, at its line and column.
    pub(super) fn known_keys_of(&self, text: &str, others: &[&str]) -> Result<(), ConfigError> {
        let keys: BTreeMap<toml::Spanned<String>, IgnoredAny> = self.toml(text)?;
        let mut keys: Vec<_> = keys.into_keys().collect();
        keys.sort_by_key(|k| k.span().start);
        self.known_keys(
            keys.iter().map(|k| {
                let (line, column) = line_and_column(text, k.span().start);
                (
                    k.get_ref().as_str(),
                    format!("(toml, line {line}, column {column})"),
                )
            }),
            others,
        )
    }

    /// Refuses the first of `keys` (each with the field that places it) that is neither
    /// the library's nor one of `others`.
    pub(super) fn known_keys<'k>(
        &self,
        keys: impl Iterator<Item = (&'k str, String)>,
        others: &[&str],
    ) -> Result<(), ConfigError> {
        for (key, field) in keys {
            if KEYS.contains(&key) || others.contains(&key) {
                continue;
            }
            let expected: Vec<&str> = others.iter().chain(KEYS).copied().collect();
            return Err(self.err(&field, unknown_field(key, &expected)));
        }
        Ok(())
    }
}

/// serde's words for an unknown field (`serde::de::Error::unknown_field`), so a key no
/// one takes reads as it did when one struct held every key.
fn unknown_field(key: &str, expected: &[&str]) -> String {
    let quoted: Vec<String> = expected.iter().map(|k| format!("`{k}`")).collect();
    match quoted.as_slice() {
        [] => format!("unknown field `{key}`, there are no fields"),
        [one] => format!("unknown field `{key}`, expected {one}"),
        [a, b] => format!("unknown field `{key}`, expected {a} or {b}"),
        all => format!("unknown field `{key}`, expected one of {}", all.join(", ")),
    }
}
