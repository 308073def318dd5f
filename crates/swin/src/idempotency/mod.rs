//! Idempotent retries: a request sent again under the same idempotency key (a client
//! that lost the answer) is answered with its first answer, on any node, and counts
//! nothing more. What is kept, and where:
//!
//! - a record per (namespace, route key, idempotency key): the request's fingerprint
//!   ([`Fingerprint`]: SHA-256 of its method, route and body bytes) and, once it
//!   answered, its first [`Answer`] (status, the headers that matter, body), until the
//!   namespace's `idempotency_ttl` lapses;
//! - where the namespace keeps leases: its store (a claim is one atomic put-if-absent
//!   there, see [`swin_sync::store::IdempotencyStore`]), or this node's memory for a
//!   local-only namespace ([`swin_sync::store::MemoryStore`], under the same contract);
//! - at most `idempotency_max_keys` live records per namespace: a new key past them is
//!   refused (503 `idempotency_full`), keys already recorded still answer;
//! - at most `idempotency_max_keys_per_client` of them made by one client
//!   ([`Client`](crate::Client), when the caller names one): its new key past them is refused
//!   ([`Error::Exhausted`], 429), other clients' are not. Counted where the records are,
//!   in the claim's atomic step: across the cluster for a store's.
//!
//! The flow (`Limiter::once`) is one for every kind of request; this module holds what
//! it works with.

mod book;

use sha2::{Digest, Sha256};
use swin_sync::store::Fingerprint;

use crate::error::Error;

pub(crate) use self::book::RecordBook;

/// The longest idempotency key.
pub(crate) const MAX_IDEMPOTENCY_KEY_BYTES: usize = 255;

/// The header that carries an idempotency key over HTTP.
pub(crate) const IDEMPOTENCY_KEY_HEADER: &str = "Idempotency-Key";

/// An idempotency key as a client sent it: 1 to 255 visible ASCII characters
/// (`!` to `~`), or the error that says why not.
pub fn check_idempotency_key(key: &[u8]) -> Result<&str, Error> {
    let bad = |why: &str| {
        Error::BadRequest(format!(
            "{IDEMPOTENCY_KEY_HEADER}: {why} (1 to {MAX_IDEMPOTENCY_KEY_BYTES} visible ASCII characters)"
        ))
    };
    if key.is_empty() {
        return Err(bad("empty"));
    }
    if key.len() > MAX_IDEMPOTENCY_KEY_BYTES {
        return Err(bad(&format!("{} bytes long", key.len())));
    }
    if let Some(at) = key.iter().position(|b| !b.is_ascii_graphic()) {
        return Err(bad(&format!("byte {at} is not a visible ASCII character")));
    }
    std::str::from_utf8(key).map_err(|_| bad("not ASCII"))
}

/// Who sends idempotent requests, as their records are counted against a client's share
/// of a namespace's: a short id (24 hex digits) of what the caller knows the client by —
/// a token's name, an address. What it was made of is not kept.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct ClientId {
    id: String,
    /// Known by a token: its idempotency keys are its own (an address is not a client's
    /// own — a retry may come through another proxy — so its keys are the namespace's).
    token: bool,
}

impl ClientId {
    /// The client known as `identity` of the kind `kind` (`token`, `address`: two kinds
    /// never name one client).
    pub(crate) fn of(kind: &str, identity: &[u8]) -> ClientId {
        let mut h = Sha256::new();
        h.update((kind.len() as u64).to_be_bytes());
        h.update(kind.as_bytes());
        h.update(identity);
        let digest = h.finalize();
        ClientId {
            id: digest[..12].iter().map(|b| format!("{b:02x}")).collect(),
            token: kind == "token",
        }
    }

    /// Its id, as stores keep it.
    pub(crate) fn as_str(&self) -> &str {
        &self.id
    }
}

impl From<&crate::Client> for ClientId {
    /// A client as its records and reservations are counted: a token by its name; an
    /// address keyed as a limit keys a client address (an IPv6 one by its /64); an
    /// unknown client as the empty address.
    fn from(client: &crate::Client) -> ClientId {
        match client {
            crate::Client::Token(name) => ClientId::of("token", name.as_bytes()),
            crate::Client::Address(addr) => ClientId::of(
                "address",
                crate::policy::client_address::key_of(*addr).as_bytes(),
            ),
            crate::Client::Unknown => ClientId::of("address", b""),
        }
    }
}

/// What a request retried under an idempotency key must ask again, and where its record
/// is kept.
#[derive(Debug, Clone)]
pub struct Idempotent {
    /// The namespace whose store (and settings) keep the record.
    pub(crate) namespace: String,
    /// The record's key in the namespace: the route key and the idempotency key.
    pub(crate) record: String,
    /// What the request asked.
    pub(crate) fingerprint: Fingerprint,
    /// Who sent it (`None`: counted against the namespace's cap only).
    pub(crate) client: Option<ClientId>,
}

impl Idempotent {
    /// The request `method` `route` with `body`, sent under the idempotency key `key`;
    /// its record is kept in `namespace`. `route` names what the request acts on (a door's
    /// route with its key: `keys/user:42/hit`): the same idempotency key on another route
    /// is another record.
    pub fn new(
        namespace: &str,
        route: &str,
        key: &[u8],
        method: &str,
        body: &[u8],
    ) -> Result<Idempotent, Error> {
        let key = check_idempotency_key(key)?;
        let mut h = Sha256::new();
        for part in [method.as_bytes(), route.as_bytes()] {
            h.update((part.len() as u64).to_be_bytes());
            h.update(part);
        }
        h.update(body);
        Ok(Idempotent {
            namespace: namespace.to_owned(),
            record: format!("{}:{route}:{key}", route.len()),
            fingerprint: Fingerprint(h.finalize().into()),
            client: None,
        })
    }

    /// The same request, sent by `client`: its record counts against the client's share
    /// of the namespace's records (`idempotency_max_keys_per_client`). A client known by
    /// a token has idempotency keys of its own: another token's request under the same key
    /// is another record (it neither gets the first's answer nor goes uncounted).
    pub fn by(self, client: &crate::Client) -> Idempotent {
        let client = ClientId::from(client);
        let record = match client.token {
            true => format!("{}/{}", client.id, self.record),
            false => self.record,
        };
        Idempotent {
            client: Some(client),
            record,
            ..self
        }
    }

    /// What the request asked.
    #[cfg(test)]
    pub(crate) fn fingerprint(&self) -> &Fingerprint {
        &self.fingerprint
    }
}

tokio::task_local! {
    /// The record (namespace and record key) of the idempotent request this task runs
    /// ([`crate::Limiter::once`]).
    pub(crate) static RUNNING_ONCE: String;
}

/// The identity of the operation `what` on `on` made by the idempotent request this task
/// runs (an operation id, [`swin_sync::store::OP_LEN`] hex digits): the same for each
/// retry of that request, on any node, so that the store applies the operation once
/// across them; `None` when the task runs no idempotent request.
pub(crate) fn identity_in_once(what: &str, on: &str) -> Option<String> {
    RUNNING_ONCE
        .try_with(|record| {
            let mut h = Sha256::new();
            for part in [what, record.as_str(), on] {
                h.update((part.len() as u64).to_be_bytes());
                h.update(part.as_bytes());
            }
            let digest = h.finalize();
            digest[..swin_sync::store::OP_LEN / 2]
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect()
        })
        .ok()
}

/// A request's answer as a record keeps it: its status, the headers that matter (the
/// caller picks them) and its body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub(crate) status: u16,
    pub(crate) headers: Vec<(String, Vec<u8>)>,
    pub(crate) body: Vec<u8>,
}

impl Answer {
    /// An answer of `status` with `headers` (name, value) and `body`.
    pub fn new(status: u16, headers: Vec<(String, Vec<u8>)>, body: Vec<u8>) -> Answer {
        Answer {
            status,
            headers,
            body,
        }
    }

    /// Its status.
    pub fn status(&self) -> u16 {
        self.status
    }

    /// The headers kept, as (name, value).
    pub fn headers(&self) -> &[(String, Vec<u8>)] {
        &self.headers
    }

    /// Its body.
    pub fn body(&self) -> &[u8] {
        &self.body
    }

    /// Whether a retry gets it again: every answer but the node's or store's failures
    /// (5xx), after which a retry runs the request again.
    pub(crate) fn is_kept(&self) -> bool {
        self.status < 500
    }

    /// The answer as a record holds it: status (2 bytes), header count (2), then each
    /// header as name length (2), name, value length (4), value, then the body.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let size: usize = self
            .headers
            .iter()
            .map(|(n, v)| 6 + n.len() + v.len())
            .sum();
        let mut out = Vec::with_capacity(4 + size + self.body.len());
        out.extend_from_slice(&self.status.to_be_bytes());
        out.extend_from_slice(
            &(self.headers.len().min(usize::from(u16::MAX)) as u16).to_be_bytes(),
        );
        for (name, value) in self.headers.iter().take(usize::from(u16::MAX)) {
            out.extend_from_slice(&(name.len() as u16).to_be_bytes());
            out.extend_from_slice(name.as_bytes());
            out.extend_from_slice(&(value.len() as u32).to_be_bytes());
            out.extend_from_slice(value);
        }
        out.extend_from_slice(&self.body);
        out
    }

    /// An answer read back from [`Answer::encode`]'s bytes; `None` when they are not one.
    pub(crate) fn decode(bytes: &[u8]) -> Option<Answer> {
        let mut r = Reader(bytes);
        let status = u16::from_be_bytes(r.take(2)?.try_into().ok()?);
        let count = u16::from_be_bytes(r.take(2)?.try_into().ok()?);
        let mut headers = Vec::with_capacity(usize::from(count));
        for _ in 0..count {
            let n = u16::from_be_bytes(r.take(2)?.try_into().ok()?);
            let name = std::str::from_utf8(r.take(usize::from(n))?)
                .ok()?
                .to_owned();
            let v = u32::from_be_bytes(r.take(4)?.try_into().ok()?);
            headers.push((name, r.take(usize::try_from(v).ok()?)?.to_vec()));
        }
        Some(Answer {
            status,
            headers,
            body: r.0.to_vec(),
        })
    }
}

/// What is left of an encoded answer.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }
}

/// How an idempotent request was answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Once {
    /// It ran now: its answer (kept for retries unless it is a 5xx).
    First(Answer),
    /// It ran before: the first answer, again; nothing ran or counted now.
    Again(Answer),
}

impl Once {
    /// The answer, first or again.
    pub fn answer(&self) -> &Answer {
        match self {
            Once::First(a) | Once::Again(a) => a,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_one_to_255_visible_ascii_characters() {
        assert!(check_idempotency_key(b"a").is_ok());
        assert!(check_idempotency_key(&[b'~'; 255]).is_ok());
        for bad in [
            &b""[..],
            &[b'a'; 256],
            b"a b",
            b"a\tb",
            b"caf\xc3\xa9",
            b"\x7f",
        ] {
            let e = check_idempotency_key(bad).expect_err("refused");
            assert!(e.to_string().starts_with("Idempotency-Key: "), "{e}");
        }
    }

    #[test]
    fn answers_round_trip_and_refuse_what_is_cut() {
        let a = Answer::new(
            429,
            vec![("retry-after".into(), b"3".to_vec()), ("x".into(), vec![])],
            b"{\"allowed\":false}".to_vec(),
        );
        let bytes = a.encode();
        assert_eq!(Answer::decode(&bytes), Some(a.clone()));
        assert_eq!(Answer::decode(&bytes[..7]), None);
        let empty = Answer::new(200, vec![], vec![]);
        assert_eq!(Answer::decode(&empty.encode()), Some(empty));
    }

    #[test]
    fn fingerprints_tell_method_route_and_body_apart() {
        let f = |m: &str, r: &str, b: &[u8]| {
            *Idempotent::new("ns", r, b"k", m, b)
                .expect("key")
                .fingerprint()
        };
        let base = f("POST", "keys/a/hit", b"{}");
        assert_eq!(base, f("POST", "keys/a/hit", b"{}"));
        assert_ne!(base, f("PUT", "keys/a/hit", b"{}"));
        assert_ne!(base, f("POST", "keys/b/hit", b"{}"));
        assert_ne!(base, f("POST", "keys/a/hit", b"{ }"));
        // the lengths keep a route's end and a body's start apart
        assert_ne!(f("POST", "ab", b"c"), f("POST", "a", b"bc"));
    }

    #[test]
    fn a_tokens_keys_are_its_own_an_address_shares_the_namespaces() {
        let asked = || Idempotent::new("ns", "keys/k/hit", b"same", "POST", b"{}").expect("key");
        let by = |client: crate::Client| asked().by(&client).record;
        let token = |name: &str| crate::Client::Token(name.into());
        let address = |a: &str| crate::Client::Address(a.parse().expect("an address"));
        assert_ne!(by(token("a")), by(token("b")));
        assert_eq!(by(token("a")), by(token("a")));
        assert_eq!(by(address("10.0.0.1")), by(address("10.0.0.2")));
        assert_eq!(by(address("10.0.0.1")), asked().record);
        assert_eq!(by(crate::Client::Unknown), asked().record);
    }

    #[test]
    fn client_ids_are_short_and_keep_kinds_apart() {
        let t = ClientId::of("token", b"ops");
        assert_eq!(t.as_str().len(), 24);
        assert!(t.as_str().bytes().all(|b| b.is_ascii_hexdigit()));
        assert_eq!(t, ClientId::of("token", b"ops"));
        assert_ne!(t, ClientId::of("address", b"ops"));
        assert_ne!(t, ClientId::of("token", b"ops2"));
        // a client as a door names it is the id its records were kept under before:
        // an address as a limit keys it (an IPv6 one by its /64), an unknown one as
        // the empty address
        let of = |c: crate::Client| ClientId::from(&c);
        assert_eq!(of(crate::Client::Token("ops".into())), t);
        let v6 = |a: &str| crate::Client::Address(a.parse().expect("an address"));
        assert_eq!(
            of(v6("2001:db8:7:1::1")),
            ClientId::of("address", b"2001:db8:7:1::/64")
        );
        assert_eq!(of(v6("2001:db8:7:1::1")), of(v6("2001:db8:7:1:ffff::9")));
        assert_eq!(
            of(v6("::ffff:10.0.0.1")),
            ClientId::of("address", b"10.0.0.1")
        );
        assert_eq!(of(crate::Client::Unknown), ClientId::of("address", b""));
    }
}
