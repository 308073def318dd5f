//! The `hostile` category: what a hostile client or an operator having a bad day can do
//! to a node, each case against the real binary and real stores, each asserting exact
//! totals (hits lost, clients admitted past a limit, seconds off the air) and not merely
//! that the node answered. A new door or mode runs all of these.
//!
//! - `answers`: costs against a key's effective, enforced limits, a limit below 1, runtime
//!   limits that would change nothing, ttls under a millisecond, the status page's headers;
//! - `clock`: nodes 40 s off the store's clock (libfaketime) decide in the store's time;
//! - `integrity`: reloads, outages and stops under load keep every acknowledged hit;
//! - `shutdown`: a stop pushes every namespace at once and spools what is unconfirmed
//!   before the grace ends, whatever the stores do;
//! - `readiness`: the manifests' probe keeps a node that reached its store ready through
//!   an outage, and a node that never reached it out;
//! - `reload`: a reload to a store that does not answer is refused;
//! - `spool`: private, checked at start, and checked like a request on replay;
//! - `strict`: strict admission answers within `store_timeout` while its store hangs;
//! - `connections`: silent, slow and half-sent sockets never keep a client out;
//! - `inputs`: what must be refused whole, naming the item and the problem (counts past
//!   2^53 in synchronous namespaces, batch items, calls that could change nothing);
//! - `http`: forwarding headers, keys and refunds as a hostile client sends them, and
//!   counts as an operator reads them;
//! - `limits`: runtime limits through a store outage, written by hand, changed by two
//!   nodes at once;
//! - `late`: synchronous namespaces whose store answers past `answer_timeout` count
//!   what each request answered, once;
//! - `keyspace`: 300,000 counters in the store hold up no start, scrape or reload;
//! - `leases`: concurrency leases (HTTP and Envoy's negative hits) through a store that
//!   goes away or hangs, and lease ids that belong to another key;
//! - `refunds`: Envoy's negative hits on a namespace of hits through a store that goes
//!   away give back nothing, then exactly;
//! - `reservations`: reserve and commit through a store that goes away or hangs;
//! - `lost_replies`: a reserve, an extend and a commit whose store reply is lost after
//!   the store applied it (a relay drops it) apply once, and say so;
//! - `lost_replies_leases`: the same for an acquire, a renewal and a release of a lease
//!   (a release sent again answers `replayed`, not "not live") and for runtime limits
//!   set or removed (never "nothing was changed" after the store changed them);
//! - `give_back_owed`: a commit whose give-back finds takes not in the store yet (counted
//!   on another node before its sync) says what it owes and gives it back as they land;
//! - `budgets`: token budgets — a commit raced on two nodes, an extend after the ttl,
//!   a reservation over several keys through a store outage, debt and its Retry-After,
//!   a reserve denied by one key, bad input;
//! - `quota_cluster`: Envoy's quota service across two nodes through a node cut off
//!   from its store, a hung or emptied store, silent and cycling streams that claim the
//!   limit, a client past its stream cap and a flood of new buckets;
//! - `idempotency`: retries under an `Idempotency-Key` on another node answer the first
//!   answer and count nothing more; keys reused across namespaces or with another body,
//!   racing duplicates, bad headers, and a million distinct keys against the cap;
//! - `idempotency_bytes`: every byte in an `Idempotency-Key` value, sent raw: a key, a
//!   JSON 400 naming the header, or the HTTP parser's bare 400, nothing refused counted;
//! - `idempotency_share`: a batch led by a local-only namespace runs once across nodes
//!   (all local-only with the header: 400), a client past its share of records (a token,
//!   else an address) leaves room for the others, and dry runs keep no record;
//! - `idempotency_stalls`: a claim the store takes after its request was answered 503
//!   (the store stalled) is released once the store answers: a retry runs at once, once;
//! - `grpc`: Envoy's door takes the same tokens, and no value a client sends turns an
//!   over-limit answer into an error.

mod answers;
mod budgets;
mod clock;
mod connections;
mod give_back_owed;
mod grpc;
mod histories;
mod http;
mod idempotency;
mod idempotency_bytes;
mod idempotency_share;
mod idempotency_stalls;
mod inputs;
mod integrity;
mod keyspace;
mod late;
mod leases;
mod limits;
mod lost_replies;
mod lost_replies_admin;
mod lost_replies_leases;
mod lost_replies_reload;
mod quota;
mod quota_cluster;
mod readiness;
mod refunds;
mod reload;
mod reservation_caps;
mod reservations;
mod settle;
mod shadow;
mod shutdown;
mod spool;
mod strict;
mod support;
