//! The counter key a descriptor counts on: one key per descriptor, and a valid key for
//! any value Envoy can send.

/// The counter key of a descriptor: its entries in request order as `key=value` joined
/// by `|`, with `%`, `=`, `|` and U+0000 percent-encoded (so no two descriptors share a
/// key, and any value Envoy can send is a key). A key longer than a stored key may be
/// ([`crate::policy::input::MAX_KEY_BYTES`]) keeps its first bytes and ends in `%~` and the hex
/// SHA-256 of the whole: `%~` never occurs in an encoded key, so it is still one key per
/// descriptor, and a client cannot turn an answer into an error by sending a long value.
/// A descriptor with no entries counts on `%` (no encoded key is a lone `%`): all such
/// descriptors share it, as envoyproxy/ratelimit's share `domain.` (only a descriptor's
/// own `limit` can apply to one).
pub fn counter_key(entries: &[(&str, &str)]) -> String {
    if entries.is_empty() {
        return "%".to_owned();
    }
    fn push(out: &mut String, s: &str) {
        for c in s.chars() {
            match c {
                '%' => out.push_str("%25"),
                '=' => out.push_str("%3D"),
                '|' => out.push_str("%7C"),
                '\0' => out.push_str("%00"),
                c => out.push(c),
            }
        }
    }
    let mut out = String::new();
    for (i, (k, v)) in entries.iter().enumerate() {
        if i > 0 {
            out.push('|');
        }
        push(&mut out, k);
        out.push('=');
        push(&mut out, v);
    }
    if out.len() > crate::policy::input::MAX_KEY_BYTES {
        use sha2::{Digest, Sha256};
        let digest = Sha256::digest(out.as_bytes());
        let mut keep = crate::policy::input::MAX_KEY_BYTES - 2 - 2 * digest.len();
        while !out.is_char_boundary(keep) {
            keep -= 1;
        }
        out.truncate(keep);
        out.push_str("%~");
        for b in digest {
            out.push_str(&format!("{b:02x}"));
        }
    }
    out
}

/// The entries of a counter key [`counter_key`] wrote, or `None` for a key it cannot
/// have written in full (a lone `%`, a long key cut and hashed, a stray `%`).
pub(crate) fn entries_of(key: &str) -> Option<Vec<(String, String)>> {
    fn decode(s: &str) -> Option<String> {
        let mut out = String::with_capacity(s.len());
        let mut rest = s;
        while let Some(at) = rest.find('%') {
            out.push_str(&rest[..at]);
            let code = rest.get(at + 1..at + 3)?;
            out.push(match code {
                "25" => '%',
                "3D" => '=',
                "7C" => '|',
                "00" => '\0',
                _ => return None,
            });
            rest = &rest[at + 3..];
        }
        out.push_str(rest);
        Some(out)
    }
    if key.contains("%~") {
        return None;
    }
    key.split('|')
        .map(|e| {
            let (k, v) = e.split_once('=')?;
            Some((decode(k)?, decode(v)?))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counter_keys_keep_descriptors_apart() {
        assert_eq!(counter_key(&[("a", "b"), ("c", "d")]), "a=b|c=d");
        assert_ne!(
            counter_key(&[("a", "b|c=d")]),
            counter_key(&[("a", "b"), ("c", "d")])
        );
        assert_eq!(counter_key(&[("k%", "=|")]), "k%25=%3D%7C");
        assert_eq!(counter_key(&[("k", "a\0b")]), "k=a%00b");
        assert_eq!(counter_key(&[]), "%", "no entries: a key of its own");
        assert_ne!(counter_key(&[("", "")]), counter_key(&[]));
        crate::policy::input::check_key(&counter_key(&[])).expect("a valid key");
    }

    #[test]
    fn counter_keys_are_read_back_into_their_entries() {
        for entries in [
            vec![("a", "b"), ("c", "d")],
            vec![("k%", "=|")],
            vec![("k", "a\0b")],
            vec![("", "")],
        ] {
            let owned: Vec<(String, String)> = entries
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            assert_eq!(entries_of(&counter_key(&entries)), Some(owned));
        }
        assert_eq!(entries_of("%"), None);
        assert_eq!(entries_of("novalue"), None);
        assert_eq!(entries_of("k=a%4"), None);
        let long = counter_key(&[("k", &"x".repeat(2000))]);
        assert_eq!(entries_of(&long), None, "hashed: its values are gone");
    }

    #[test]
    fn long_values_are_keys_of_their_own() {
        let long = |c: char| "é".repeat(600) + &c.to_string();
        let (a, b) = (long('a'), long('b'));
        let (ka, kb) = (counter_key(&[("kk", &a)]), counter_key(&[("kk", &b)]));
        for k in [&ka, &kb] {
            crate::policy::input::check_key(k).expect("a valid key");
            assert_eq!(
                k.len(),
                crate::policy::input::MAX_KEY_BYTES - 1,
                "cut at a char boundary"
            );
            assert!(k.contains("%~"));
        }
        assert_ne!(ka, kb, "the digest tells them apart");
        assert_eq!(
            ka,
            counter_key(&[("kk", &a)]),
            "the same value, the same key"
        );
        let exact = "x".repeat(crate::policy::input::MAX_KEY_BYTES - 2);
        assert_eq!(
            counter_key(&[("k", &exact)]),
            format!("k={exact}"),
            "at the limit: as it is"
        );
    }
}
