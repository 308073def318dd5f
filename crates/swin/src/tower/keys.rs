//! What the tower layer counts a request under: the [`KeyExtractor`] a layer is built
//! with — a closure, or a ready one that a client cannot slip past: a header's bytes
//! ([`HeaderKey`]), the connection's peer ([`PeerAddr`]), the client behind trusted
//! proxies ([`ClientAddr`]).

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::ConnectInfo;
use http::{HeaderName, Request};
use ipnet::IpNet;

use crate::policy::client_address::{client_key, trusted_proxy, NoAddress, NotAProxy};
use crate::policy::input::MAX_KEY_BYTES;

/// Names the key a request is a hit on.
///
/// `Ok(Some(key))` counts the request under `key` (a key the limiter refuses, empty or
/// longer than 1024 bytes, is answered 400, never let
/// through); `Ok(None)` lets it pass unlimited — the service's explicit choice, so an
/// extractor returns it only for requests its service means to leave unlimited;
/// `Err` refuses it. A closure `Fn(&Request<B>) -> Option<String>` is one: its `None`
/// passes.
pub trait KeyExtractor<B> {
    /// The key `request` is counted under, `None` to let it pass, or why it is refused.
    fn key(&self, request: &Request<B>) -> Result<Option<String>, NoKey>;
}

impl<B, F> KeyExtractor<B> for F
where
    F: Fn(&Request<B>) -> Option<String>,
{
    fn key(&self, request: &Request<B>) -> Result<Option<String>, NoKey> {
        Ok(self(request))
    }
}

/// What a request costs: a hit of that much on its key. A number is one (every request
/// the same), and so is a closure `Fn(&Request<B>) -> f64`. A cost the limiter refuses
/// (negative, not finite, more than a limit takes) is answered 400, never let through.
pub trait Cost<B> {
    /// The cost of `request`.
    fn cost(&self, request: &Request<B>) -> f64;
}

impl<B> Cost<B> for f64 {
    fn cost(&self, _: &Request<B>) -> f64 {
        *self
    }
}

impl<B, F> Cost<B> for F
where
    F: Fn(&Request<B>) -> f64,
{
    fn cost(&self, request: &Request<B>) -> f64 {
        self(request)
    }
}

/// Why a request has no key: it is refused, never let through.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NoKey {
    /// What the request carries cannot name a key (a trusted proxy passed something that
    /// is not an address, a header that makes a key too long): 400 (gRPC:
    /// INVALID_ARGUMENT).
    #[error("{0}")]
    Invalid(String),
    /// The request lacks what its key is read from (the header of a [`HeaderKey`]): 400
    /// (gRPC: INVALID_ARGUMENT). Leaving it out must not be a way past the limit.
    #[error("{0}")]
    Missing(String),
    /// The server does not give the extractor what it reads (no `ConnectInfo`): 500
    /// (gRPC: INTERNAL). Every request is refused until the server is set up to give it.
    #[error("{0}")]
    NotServed(String),
}

impl From<NoAddress> for NoKey {
    fn from(e: NoAddress) -> NoKey {
        match e {
            NoAddress::NoPeer => NoKey::NotServed(
                "no peer address: the server puts no ConnectInfo<SocketAddr> in the \
                 request's extensions (axum: into_make_service_with_connect_info)"
                    .into(),
            ),
            NoAddress::NotAnAddress(_) => NoKey::Invalid(e.to_string()),
        }
    }
}

/// The key is the value of a header, all of its bytes: printable ASCII as it is, any
/// other byte and `%` as `%XX`, so two values are never one key and a value that is not
/// UTF-8 is counted like any other. A request without the header is answered 400
/// ([`NoKey::Missing`]): leaving the header out would otherwise pass unlimited (a
/// closure answering `None` lets a request through where that is meant); one whose value
/// makes a key too long, or an empty one, is answered 400 too.
///
/// The value is what the client wrote: key by a header a layer in front has
/// authenticated (an API key), or by [`ClientAddr`], when clients are not to choose
/// their key.
#[derive(Clone, Debug)]
pub struct HeaderKey {
    name: HeaderName,
}

impl HeaderKey {
    /// Keys by the header `name` (its first line, as `HeaderMap::get` reads it).
    ///
    /// # Panics
    ///
    /// When `name` is not a header name, as [`HeaderName::from_static`] does.
    pub fn new(name: &str) -> HeaderKey {
        HeaderKey {
            name: HeaderName::try_from(name).expect("HeaderKey::new takes a header name"),
        }
    }
}

impl<B> KeyExtractor<B> for HeaderKey {
    fn key(&self, request: &Request<B>) -> Result<Option<String>, NoKey> {
        let Some(value) = request.headers().get(&self.name) else {
            return Err(NoKey::Missing(format!(
                "the request has no {} header (the rate limit key)",
                self.name
            )));
        };
        // escaped no further than a key can be long: a header of 8 KiB of bytes that
        // each escape to three is refused before it is all written out
        match escaped_within(value.as_bytes(), MAX_KEY_BYTES) {
            Some(key) => Ok(Some(key)),
            None => Err(NoKey::Invalid(format!(
                "the {} header makes a key of more than {MAX_KEY_BYTES} bytes",
                self.name
            ))),
        }
    }
}

/// The key is the address of the connection's peer (no port: a client opens as many
/// connections as it likes), canonical: `::ffff:203.0.113.7` is `203.0.113.7`, and an
/// IPv6 address is its /64 (`2001:db8:7:1::/64`: a host is given a whole /64, and an
/// address it moves to inside it is the same client; one that carries an IPv4 client —
/// NAT64, 6to4, Teredo — is that IPv4 client). It is
/// read from axum's `ConnectInfo<SocketAddr>` in the request's extensions (serve with
/// `into_make_service_with_connect_info::<SocketAddr>()`; another server inserts it
/// itself — tonic keeps the address in its `TcpConnectInfo`, which a `map_request` in
/// front of the layer copies into a `ConnectInfo`). A request without it is refused 500 ([`NoKey::NotServed`]), never keyed as
/// one shared "unknown" client: that would limit all clients as one, and a server that
/// does not give the address is a mistake to show at its first request.
#[derive(Clone, Copy, Debug, Default)]
pub struct PeerAddr;

impl<B> KeyExtractor<B> for PeerAddr {
    fn key(&self, request: &Request<B>) -> Result<Option<String>, NoKey> {
        Ok(Some(client_key(peer(request), request.headers(), &[])?))
    }
}

/// The key is the client's address as the daemon decides it for `key_from =
/// "client_address"` (one implementation: [`crate::policy::client_address`]; IPv6 as its
/// /64, as [`PeerAddr`]): the peer,
/// unless it is a trusted proxy; then the right-most `X-Forwarded-For` address that is
/// not itself a trusted proxy, else `X-Real-IP`. Forwarding headers from any other peer
/// are ignored. A value from a trusted proxy that is not an address is refused 400; a
/// request without a peer address, 500 (as [`PeerAddr`]).
#[derive(Clone, Debug)]
pub struct ClientAddr {
    trusted: Arc<[IpNet]>,
}

impl ClientAddr {
    /// Believes the forwarding headers of the peers in `trusted_proxies`, written as the
    /// daemon's `trusted_proxies`: CIDRs (`10.0.0.0/8`) or addresses (`127.0.0.1`).
    pub fn new<I, S>(trusted_proxies: I) -> Result<ClientAddr, NotAProxy>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let trusted = trusted_proxies
            .into_iter()
            .map(|s| trusted_proxy(s.as_ref()))
            .collect::<Result<_, _>>()?;
        Ok(ClientAddr { trusted })
    }
}

impl<B> KeyExtractor<B> for ClientAddr {
    fn key(&self, request: &Request<B>) -> Result<Option<String>, NoKey> {
        Ok(Some(client_key(
            peer(request),
            request.headers(),
            &self.trusted,
        )?))
    }
}

/// The peer's address: axum's `ConnectInfo<SocketAddr>`, or a plain `SocketAddr` a
/// server (or a `map_request` in front of the layer) put in the extensions.
fn peer<B>(request: &Request<B>) -> Option<SocketAddr> {
    let extensions = request.extensions();
    match extensions.get::<ConnectInfo<SocketAddr>>() {
        Some(ConnectInfo(a)) => Some(*a),
        None => extensions.get::<SocketAddr>().copied(),
    }
}

/// `bytes` as text, losslessly: printable ASCII but `%` as it is, every other byte
/// `%XX` (gRPC's percent-encoding of `grpc-message`, too).
pub(super) fn percent_escaped(bytes: &[u8]) -> String {
    escaped_within(bytes, usize::MAX).unwrap_or_default()
}

/// [`percent_escaped`], or `None` once the text would pass `max` bytes.
fn escaped_within(bytes: &[u8], max: usize) -> Option<String> {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let mut out = String::with_capacity(bytes.len().min(max));
    for &b in bytes {
        match b {
            b' '..=b'~' if b != b'%' => out.push(b as char),
            _ => {
                out.push('%');
                out.push(HEX[usize::from(b >> 4)] as char);
                out.push(HEX[usize::from(b & 0xF)] as char);
            }
        }
        if out.len() > max {
            return None;
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaped_bytes_are_text_and_never_two_values_one_key() {
        assert_eq!(percent_escaped(b"client a"), "client a");
        assert_eq!(percent_escaped(b"\xff\x00%\t"), "%FF%00%25%09");
        // `%` is escaped, so a value that looks escaped is not the value it spells
        assert_ne!(percent_escaped(b"%FF"), percent_escaped(b"\xff"));
    }
}
