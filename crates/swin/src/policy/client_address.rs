//! Which address a request comes from, for limits keyed by client address — the one rule
//! of the daemon's `key_from = "client_address"` and the tower layer's `ClientAddr`. The
//! peer of the connection, unless it is a trusted proxy (`trusted_proxies`): then the
//! right-most `X-Forwarded-For` address that is not itself a trusted proxy, else
//! `X-Real-IP`. What a client writes into those headers is never believed from an
//! untrusted peer, and a value that is not an IP address is never a key.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use http::HeaderMap;
use ipnet::IpNet;

/// Why there is no address to key by.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum NoAddress {
    /// The connection's peer is unknown (a request not from a socket).
    #[error("no client address")]
    NoPeer,
    /// A trusted proxy passed a value that is not an IP address.
    #[error("the proxy passed {0:?} as a client address, not an IP address")]
    NotAnAddress(String),
}

/// A `trusted_proxies` entry that is neither an address nor a CIDR.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not an address or a CIDR like 10.0.0.0/8")]
pub struct NotAProxy(String);

/// A trusted proxy as a config names it: a CIDR (`10.0.0.0/8`, `::1/128`, its host bits
/// dropped) or a single address.
pub fn trusted_proxy(s: &str) -> Result<IpNet, NotAProxy> {
    s.parse::<IpNet>()
        .or_else(|_| s.parse::<IpAddr>().map(IpNet::from))
        .map(|n| canonical_net(n.trunc()))
        .map_err(|_| NotAProxy(s.to_owned()))
}

/// An IPv4-mapped network (`::ffff:127.0.0.1`, `::ffff:10.0.0.0/104`) as the IPv4 one it
/// maps: peers and forwarded addresses are compared in canonical form, where it would
/// match nothing.
fn canonical_net(n: IpNet) -> IpNet {
    match n {
        IpNet::V6(v6) if v6.prefix_len() >= 96 => match v6.addr().to_ipv4_mapped() {
            Some(v4) => ipnet::Ipv4Net::new(v4, v6.prefix_len() - 96).map_or(n, IpNet::V4),
            None => n,
        },
        _ => n,
    }
}

/// The client as a limit's key (and as one client of the per-client caps): its address,
/// as the module's note decides it, an IPv6 one as its /64 (`2001:db8:7:1::/64`). A host
/// or a site is given a whole /64: a client that moves from address to address inside it
/// is one client, not 2^64 of them.
pub(crate) fn client_key(
    peer: Option<SocketAddr>,
    headers: &HeaderMap,
    trusted: &[IpNet],
) -> Result<String, NoAddress> {
    client_address(peer, headers, trusted).map(key_of)
}

/// An address as a key: IPv4 as written; IPv6 as its /64, except where it carries an
/// IPv4 client (IPv4-mapped; NAT64's well-known `64:ff9b::/96`; 6to4 `2002::/16`; Teredo
/// `2001::/32`: keyed as that IPv4 address, as the client is when it comes natively) and
/// where a /64 is not one host's (the loopback, the unspecified and IPv4-compatible
/// `::/64`, link-local `fe80::/10`: keyed by the whole address).
pub(crate) fn key_of(ip: IpAddr) -> String {
    let v6 = match ip.to_canonical() {
        IpAddr::V4(v4) => return v4.to_string(),
        IpAddr::V6(v6) => v6,
    };
    let s = v6.segments();
    let low32 = (u32::from(s[6]) << 16) | u32::from(s[7]);
    if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        return Ipv4Addr::from(low32).to_string();
    }
    if s[0] == 0x2002 {
        return Ipv4Addr::from((u32::from(s[1]) << 16) | u32::from(s[2])).to_string();
    }
    if s[..2] == [0x2001, 0] {
        return Ipv4Addr::from(!low32).to_string();
    }
    if s[..4] == [0, 0, 0, 0] || s[0] & 0xffc0 == 0xfe80 {
        return v6.to_string();
    }
    format!("{}/64", Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
}

/// The client's address, canonical (an IPv4-mapped IPv6 address as IPv4): `peer` is the
/// connection's, `trusted` the proxies whose forwarding headers are believed.
pub fn client_address(
    peer: Option<SocketAddr>,
    headers: &HeaderMap,
    trusted: &[IpNet],
) -> Result<IpAddr, NoAddress> {
    let peer = peer.ok_or(NoAddress::NoPeer)?.ip().to_canonical();
    let is_trusted = |ip: &IpAddr| trusted.iter().any(|n| n.contains(ip));
    if !is_trusted(&peer) {
        return Ok(peer);
    }
    // Every X-Forwarded-For line, in order, as one list, read as bytes: a line with a
    // byte that is not ASCII (the client wrote its left part) still has the addresses
    // the proxies appended on its right, and an entry that cannot be read is no address.
    let lines = headers.get_all("x-forwarded-for");
    let chain: Vec<&[u8]> = lines
        .iter()
        .flat_map(|v| v.as_bytes().split(|b| *b == b','))
        .map(<[u8]>::trim_ascii)
        .collect();
    if chain.iter().any(|v| !v.is_empty()) {
        let mut nearest = None;
        for entry in chain.iter().rev() {
            // an empty entry right of the client is no address (a proxy appended an
            // empty value): the client-written one left of it is never believed instead
            let ip = parse_bytes(entry)?;
            if !is_trusted(&ip) {
                return Ok(ip);
            }
            nearest = Some(ip);
        }
        // every hop a trusted proxy: the farthest one is as near the client as it gets
        return Ok(nearest.unwrap_or(peer));
    }
    if lines.iter().next().is_some() {
        // X-Forwarded-For lines with nothing in them: a weaker header is not believed
        // instead (the client may have written it)
        return Ok(peer);
    }
    // two X-Real-IP lines: one is the client's (a proxy that adds the header rather
    // than replacing it), and which is not known
    let mut real = headers.get_all("x-real-ip").iter();
    match (real.next().map(|v| v.as_bytes().trim_ascii()), real.next()) {
        (Some(_), Some(_)) => Err(NoAddress::NotAnAddress("several X-Real-IP headers".into())),
        (Some(v), None) if !v.is_empty() => parse_bytes(v),
        _ => Ok(peer),
    }
}

fn parse_bytes(v: &[u8]) -> Result<IpAddr, NoAddress> {
    match std::str::from_utf8(v) {
        Ok(s) => parse(s),
        Err(_) => Err(NoAddress::NotAnAddress(
            String::from_utf8_lossy(v).chars().take(64).collect(),
        )),
    }
}

/// An address as proxies write it: `203.0.113.7`, `2001:db8::1`, with or without a port
/// (`203.0.113.7:4711`, `[2001:db8::1]:4711`).
fn parse(v: &str) -> Result<IpAddr, NoAddress> {
    v.parse::<IpAddr>()
        .or_else(|_| v.parse::<SocketAddr>().map(|s| s.ip()))
        .map(|ip| ip.to_canonical())
        .map_err(|_| NoAddress::NotAnAddress(v.chars().take(64).collect()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, v.parse().expect("value"));
        }
        h
    }

    fn nets(v: &[&str]) -> Vec<IpNet> {
        v.iter().map(|s| s.parse().expect("cidr")).collect()
    }

    fn peer(s: &str) -> Option<SocketAddr> {
        Some(s.parse().expect("socket address"))
    }

    fn ip(s: &str) -> Result<IpAddr, NoAddress> {
        Ok(s.parse().expect("ip"))
    }

    #[test]
    fn an_untrusted_peer_is_the_client_whatever_it_writes() {
        let h = headers(&[("x-forwarded-for", "1.1.1.1"), ("x-real-ip", "2.2.2.2")]);
        assert_eq!(client_address(peer("9.9.9.9:1"), &h, &[]), ip("9.9.9.9"));
        let lo = nets(&["127.0.0.1/32"]);
        assert_eq!(client_address(peer("9.9.9.9:1"), &h, &lo), ip("9.9.9.9"));
        // an IPv4-mapped peer is the IPv4 address
        assert_eq!(
            client_address(peer("[::ffff:9.9.9.9]:1"), &h, &[]),
            ip("9.9.9.9")
        );
    }

    #[test]
    fn behind_trusted_proxies_the_right_most_untrusted_hop_is_the_client() {
        let trusted = nets(&["127.0.0.1/32", "10.0.0.0/8"]);
        let p = peer("127.0.0.1:5000");
        // a client that forges the left part of the chain does not choose its key
        let h = headers(&[("x-forwarded-for", "6.6.6.6, 203.0.113.7, 10.1.2.3")]);
        assert_eq!(client_address(p, &h, &trusted), ip("203.0.113.7"));
        // several lines are one list, in order; ports are dropped
        let h = headers(&[
            ("x-forwarded-for", "6.6.6.6"),
            ("x-forwarded-for", "[2001:db8::7]:4711, 10.0.0.2"),
        ]);
        assert_eq!(client_address(p, &h, &trusted), ip("2001:db8::7"));
        // X-Real-IP when there is no X-Forwarded-For; the peer when there is neither
        let h = headers(&[("x-real-ip", "203.0.113.9")]);
        assert_eq!(client_address(p, &h, &trusted), ip("203.0.113.9"));
        assert_eq!(
            client_address(p, &HeaderMap::new(), &trusted),
            ip("127.0.0.1")
        );
        // every hop trusted: the farthest
        let h = headers(&[("x-forwarded-for", "10.0.0.5, 10.0.0.6")]);
        assert_eq!(client_address(p, &h, &trusted), ip("10.0.0.5"));
    }

    #[test]
    fn a_line_with_bytes_that_are_not_ascii_is_read_and_no_weaker_header_believed() {
        let trusted = nets(&["127.0.0.1/32"]);
        let p = peer("127.0.0.1:5000");
        // what nginx's $proxy_add_x_forwarded_for makes of a client's own line
        let mut h = HeaderMap::new();
        h.append(
            "x-forwarded-for",
            http::HeaderValue::from_bytes(b"\xff\xfe, 203.0.113.7").expect("bytes"),
        );
        h.append("x-real-ip", "6.6.6.6".parse().expect("value"));
        assert_eq!(client_address(p, &h, &trusted), ip("203.0.113.7"));
        // the unreadable entry is the one reached: no address, never X-Real-IP's
        let mut h = HeaderMap::new();
        h.append(
            "x-forwarded-for",
            http::HeaderValue::from_bytes(b"203.0.113.7\xff").expect("bytes"),
        );
        h.append("x-real-ip", "6.6.6.6".parse().expect("value"));
        assert!(matches!(
            client_address(p, &h, &trusted),
            Err(NoAddress::NotAnAddress(_))
        ));
        // an empty X-Forwarded-For line: the peer, not X-Real-IP
        let h = headers(&[("x-forwarded-for", " , "), ("x-real-ip", "6.6.6.6")]);
        assert_eq!(client_address(p, &h, &trusted), ip("127.0.0.1"));
    }

    /// An IPv6 client is its /64: addresses inside one /64 are one key, another /64 is
    /// another; IPv4 (and IPv4-mapped IPv6) keys by the address.
    #[test]
    fn an_ipv6_client_is_keyed_by_its_64() {
        let key = |s: &str| client_key(peer(s), &HeaderMap::new(), &[]).expect("key");
        assert_eq!(key("[2001:db8:7:1::1]:1"), "2001:db8:7:1::/64");
        assert_eq!(key("[2001:db8:7:1:ffff:1:2:3]:1"), "2001:db8:7:1::/64");
        assert_eq!(key("[2001:db8:7:2::1]:1"), "2001:db8:7:2::/64");
        assert_eq!(key("203.0.113.7:1"), "203.0.113.7");
        assert_eq!(key("[::ffff:203.0.113.7]:1"), "203.0.113.7");
        let fwd = headers(&[("x-forwarded-for", "2001:db8:9:9:1::5")]);
        let via = client_key(peer("127.0.0.1:1"), &fwd, &nets(&["127.0.0.1/32"]));
        assert_eq!(via.expect("key"), "2001:db8:9:9::/64");
        let real = headers(&[("x-real-ip", "[2001:db8:9:8::7]:443")]);
        let via = client_key(peer("127.0.0.1:1"), &real, &nets(&["127.0.0.1/32"]));
        assert_eq!(via.expect("key"), "2001:db8:9:8::/64");
        // a /63 is two clients
        assert_ne!(key("[2001:db8:7:0::1]:1"), key("[2001:db8:7:1::1]:1"));
    }

    /// An IPv6 address that carries an IPv4 client is that client (as it is when it
    /// comes natively), and one whose /64 is not one host's is keyed whole.
    #[test]
    fn an_ipv6_address_carrying_an_ipv4_client_is_that_client() {
        let key = |s: &str| key_of(s.parse().expect("address"));
        // NAT64's well-known prefix, 6to4, Teredo (the client's address, inverted)
        assert_eq!(key("64:ff9b::cb00:7107"), "203.0.113.7");
        assert_eq!(key("64:ff9b::203.0.113.8"), "203.0.113.8");
        assert_eq!(key("2002:cb00:7107:1:2::3"), "203.0.113.7");
        assert_eq!(key("2001:0:4136:e378:8000:63bf:34ff:8ef8"), "203.0.113.7");
        assert_eq!(key("::ffff:198.51.100.1"), "198.51.100.1");
        // not one host's /64: the whole address
        assert_eq!(key("::1"), "::1");
        assert_eq!(key("::"), "::");
        assert_eq!(key("::198.51.100.1"), "::c633:6401");
        assert_eq!(key("fe80::1:2"), "fe80::1:2");
        assert_ne!(key("fe80::1"), key("fe80::2"));
        // another address of NAT64's /64 that carries no client is a /64 as any
        assert_eq!(key("64:ff9b:0:0:1::1"), "64:ff9b::/64");
    }

    /// What a client could write to pick its key is never believed: an empty last
    /// X-Forwarded-For entry (a proxy appended an empty value) is no address, not a pass
    /// to the client-written one left of it; two X-Real-IP lines are no address.
    #[test]
    fn an_empty_last_hop_or_two_real_ips_name_no_client() {
        let t = nets(&["127.0.0.1/32"]);
        let from = |h: &[(&'static str, &'static str)]| {
            client_address(peer("127.0.0.1:1"), &headers(h), &t)
        };
        for xff in ["198.51.100.41,", "198.51.100.41, , ", "6.6.6.2, "] {
            let got = from(&[("x-forwarded-for", xff)]);
            assert!(
                matches!(got, Err(NoAddress::NotAnAddress(_))),
                "{xff:?}: {got:?}"
            );
        }
        // empty entries left of the client are the client's own business
        assert_eq!(
            from(&[("x-forwarded-for", ", 198.51.100.9")]),
            ip("198.51.100.9")
        );
        // lines with nothing at all: the peer, as before
        assert_eq!(from(&[("x-forwarded-for", " ")]), ip("127.0.0.1"));
        let two = from(&[
            ("x-real-ip", "198.51.100.44"),
            ("x-real-ip", "198.51.100.45"),
        ]);
        assert!(matches!(two, Err(NoAddress::NotAnAddress(_))), "{two:?}");
        assert_eq!(from(&[("x-real-ip", "198.51.100.44")]), ip("198.51.100.44"));
    }

    /// An IPv4-mapped trusted proxy is the IPv4 one: it matches the peer it names.
    #[test]
    fn an_ipv4_mapped_trusted_proxy_matches_its_ipv4_peer() {
        for entry in ["::ffff:127.0.0.1", "::ffff:127.0.0.0/120"] {
            let t = vec![trusted_proxy(entry).expect("a proxy")];
            let fwd = headers(&[("x-forwarded-for", "198.51.100.7")]);
            let got = client_address(peer("127.0.0.1:1"), &fwd, &t);
            assert_eq!(got, ip("198.51.100.7"), "{entry}");
        }
        assert_eq!(
            trusted_proxy("::ffff:10.0.0.0/104").expect("a proxy"),
            "10.0.0.0/8".parse::<IpNet>().expect("net")
        );
    }

    #[test]
    fn a_trusted_proxy_is_a_cidr_or_an_address() {
        assert_eq!(trusted_proxy("10.1.2.3/8"), Ok(nets(&["10.0.0.0/8"])[0]));
        assert_eq!(trusted_proxy("::1"), Ok(nets(&["::1/128"])[0]));
        assert_eq!(
            trusted_proxy("proxy.local"),
            Err(NotAProxy("proxy.local".into()))
        );
    }

    #[test]
    fn a_value_that_is_not_an_address_is_never_a_key() {
        let trusted = nets(&["127.0.0.1/32"]);
        let p = peer("127.0.0.1:5000");
        for (name, value) in [
            ("x-forwarded-for", "alice"),
            ("x-forwarded-for", "203.0.113.7, unknown"),
            ("x-real-ip", "not-an-ip"),
            ("x-forwarded-for", "1.2.3"),
        ] {
            let h = headers(&[(name, value)]);
            assert!(
                matches!(
                    client_address(p, &h, &trusted),
                    Err(NoAddress::NotAnAddress(_))
                ),
                "{name}: {value}"
            );
        }
        // an untrusted hop to the right of the garbage is found first
        let h = headers(&[("x-forwarded-for", "alice, 203.0.113.7")]);
        assert_eq!(client_address(p, &h, &trusted), ip("203.0.113.7"));
        assert_eq!(
            client_address(None, &HeaderMap::new(), &trusted),
            Err(NoAddress::NoPeer)
        );
    }
}
