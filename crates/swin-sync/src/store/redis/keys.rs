//! The Redis key layout (see the store's module comment) and how keys fall into
//! cluster slots.

use super::HASHES_PER_CALL;

/// The script calls for a batch of hashes: the hashes of each cluster slot (a script may
/// not cross slots), at most HASHES_PER_CALL per call. A pure function of the batch, so a
/// retried push makes the same calls and finds its seq records where it left them.
///
/// `by_slot = false` packs hashes of any slots into the calls, in order, on one server,
/// where a script may touch any key: for calls with no seq record to find again on a
/// retry, or with a record in every hash (counter pushes). Several keys then share one
/// call instead of one call each.
pub(super) fn slot_calls(hashes: &[&str], by_slot: bool) -> Vec<Vec<usize>> {
    if !by_slot {
        let all: Vec<usize> = (0..hashes.len()).collect();
        return all.chunks(HASHES_PER_CALL).map(<[usize]>::to_vec).collect();
    }
    let mut by_slot: std::collections::BTreeMap<u16, Vec<usize>> = Default::default();
    for (i, h) in hashes.iter().enumerate() {
        by_slot.entry(key_slot(h.as_bytes())).or_default().push(i);
    }
    by_slot
        .values()
        .flat_map(|g| g.chunks(HASHES_PER_CALL).map(<[usize]>::to_vec))
        .collect()
}

/// The Redis Cluster slot of a key: CRC16 (XMODEM) of its hash tag — the part between
/// the first `{` and the next `}` when that part is not empty — or of the whole key.
pub(super) fn key_slot(key: &[u8]) -> u16 {
    let tagged = key.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &key[open + 1..];
        rest.iter()
            .position(|&b| b == b'}')
            .filter(|&close| close > 0)
            .map(|close| &rest[..close])
    });
    crc16(tagged.unwrap_or(key)) % 16384
}

/// CRC16 (XMODEM), from the `crc16` crate: the one redis-rs routes cluster commands
/// with, so the slots this store groups by and the slots its client sends to cannot
/// disagree.
fn crc16(bytes: &[u8]) -> u16 {
    crc16::State::<crc16::XMODEM>::calculate(bytes)
}

/// `swin:{4:name:KEY}:60` → (`KEY`, 60), given the head `swin:{4:name:`.
pub(super) fn parse_hash_key<'a>(hash: &'a str, head: &str) -> Option<(&'a str, u32)> {
    let rest = hash.strip_prefix(head)?;
    let (key, size) = rest.rsplit_once("}:")?;
    Some((key, size.parse().ok()?))
}

pub(super) fn glob_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_match_redis() {
        // vectors from the Redis Cluster specification and CLUSTER KEYSLOT
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(key_slot(b"{user1000}.following"), key_slot(b"user1000"));
        // an empty tag hashes the whole key
        assert_eq!(key_slot(b"foo{}{bar}"), crc16(b"foo{}{bar}") % 16384);
        assert_eq!(key_slot(b"foo{{bar}}zap"), key_slot(b"{bar"));
    }

    #[test]
    fn hash_keys_parse_back_even_with_braces_and_colons() {
        let head = "swin:{3:a:b:";
        assert_eq!(
            parse_hash_key("swin:{3:a:b:k}:x}:60", head),
            Some(("k}:x", 60))
        );
        assert_eq!(parse_hash_key("swin:{3:a:b:}:1", head), Some(("", 1)));
        assert_eq!(glob_escape("a*b[c]"), "a\\*b\\[c\\]");
    }

    #[test]
    fn calls_keep_to_one_slot_unless_told_otherwise() {
        let names: Vec<String> = (0..100).map(|i| format!("swin:{{k{i}}}:60")).collect();
        let hashes: Vec<&str> = names.iter().map(String::as_str).collect();
        let slot = |i: usize| key_slot(hashes[i].as_bytes());
        let by_slot = slot_calls(&hashes, true);
        for call in &by_slot {
            assert!(call.len() <= HASHES_PER_CALL);
            assert!(call.iter().all(|&i| slot(i) == slot(call[0])), "{call:?}");
        }
        // 100 keys of (nearly) 100 slots: a call per slot, or 2 calls packed
        assert!(by_slot.len() > 90, "{}", by_slot.len());
        let packed = slot_calls(&hashes, false);
        assert_eq!(
            packed,
            vec![(0..64).collect::<Vec<_>>(), (64..100).collect()]
        );
    }
}
