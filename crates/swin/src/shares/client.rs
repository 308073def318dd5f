//! Who opened a quota stream: the client the limit is first divided among (then among
//! its streams), and whose streams and buckets the caps count.

use std::fmt;
use std::net::IpAddr;

use sha2::{Digest, Sha256};

/// The client of a quota stream: the name of the token it presented (with `[auth]`),
/// else its peer address. Its streams on every node count as one client: a bucket's
/// limit is divided max-min fair among clients first, then among each one's streams, so
/// a client opening more streams gets no more of it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Sharer {
    /// As logs and errors name it.
    name: String,
    /// As the store's entries carry it (see [`Sharer::tag`]).
    tag: u64,
}

impl Sharer {
    /// The client presenting the token configured as `name` (its name, never the token).
    pub(crate) fn token(name: &str) -> Sharer {
        Sharer::named(format!("token {name:?}"))
    }

    /// The client at `addr` (a client without a token), keyed as a limit keys a client
    /// address: an IPv6 one by its /64, so that one moving inside it stays one client.
    pub(crate) fn peer(addr: IpAddr) -> Sharer {
        Sharer::named(format!(
            "peer {}",
            crate::policy::client_address::key_of(addr)
        ))
    }

    /// A client nothing is known of (no token, no address): all such are one client.
    pub(crate) fn unknown() -> Sharer {
        Sharer::named("an unknown peer".to_owned())
    }

    /// The quota's view of `client`.
    pub(crate) fn of(client: &crate::Client) -> Sharer {
        match client {
            crate::Client::Token(name) => Sharer::token(name),
            crate::Client::Address(addr) => Sharer::peer(*addr),
            crate::Client::Unknown => Sharer::unknown(),
        }
    }

    fn named(name: String) -> Sharer {
        let hash = Sha256::digest(name.as_bytes());
        let mut bytes = [0u8; 8];
        bytes[2..].copy_from_slice(&hash[..6]);
        Sharer {
            name,
            tag: u64::from_be_bytes(bytes),
        }
    }

    /// The client as every node posts it beside its streams' demands: a number of 48
    /// bits (exact in the store's numbers) from the hash of its name, the same on every
    /// node.
    pub(crate) fn tag(&self) -> u64 {
        self.tag
    }
}

impl fmt::Display for Sharer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_is_named_by_its_token_or_its_address_and_tagged_alike_everywhere() {
        let a = Sharer::token("edge");
        assert_eq!(a.to_string(), "token \"edge\"");
        assert_eq!(a.tag(), Sharer::token("edge").tag());
        assert_ne!(a.tag(), Sharer::token("edge2").tag());
        let p = Sharer::peer("10.0.0.1".parse().expect("an address"));
        assert_eq!(p.to_string(), "peer 10.0.0.1");
        assert_ne!(p.tag(), a.tag());
        assert!(p.tag() < 1 << 48 && Sharer::unknown().tag() < 1 << 48);
    }

    /// A client without a token that opens its streams from many addresses of its IPv6
    /// /64 is one client (its streams' and buckets' caps, its share), as its limits' keys
    /// are.
    #[test]
    fn an_ipv6_peer_is_one_client_across_its_64() {
        let peer = |s: &str| Sharer::peer(s.parse().expect("an address"));
        assert_eq!(peer("2001:db8:7:1::1"), peer("2001:db8:7:1:ffff::9"));
        assert_eq!(
            peer("2001:db8:7:1::1").to_string(),
            "peer 2001:db8:7:1::/64"
        );
        assert_ne!(peer("2001:db8:7:1::1"), peer("2001:db8:7:2::1"));
        assert_eq!(peer("::ffff:10.0.0.1"), peer("10.0.0.1"));
    }
}
