//! One proxy's entry in a bucket's division: what it asks, what it holds, its client —
//! and the numbers the store keeps it as, which every node reads back alike.

/// One proxy in a bucket's division.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Entry {
    /// Requests per unit it asks for; `None`: it went away, and only assigned.
    pub(crate) asks: Option<f64>,
    /// Whether its ask is shown by its own reports (a stream's second report of the
    /// bucket on): an ask only claimed (a first report's) takes only the room that shown
    /// asks leave.
    pub(crate) shown: bool,
    /// The share it is assigned now (what it was last told, until that lapses).
    pub(crate) assigned: f64,
    /// Its client's tag ([`super::Sharer`]); `None` as a node that posts none has it
    /// (each such entry a client of its own).
    pub(crate) client: Option<u64>,
}

impl Entry {
    /// As the store keeps it: two numbers, what it asks for and what it assigned, then
    /// its client as two more, `-1` and `-1 - tag`. The ask is `d ≥ 0` when shown,
    /// `-2 - d` when only claimed, `-1` when it went away. A node that reads pairs only
    /// takes the client's pair for a proxy gone that assigned nothing: it counts for
    /// nothing there.
    pub fn posted(self) -> Vec<f64> {
        let asks = match self.asks {
            None => -1.0,
            Some(d) if self.shown => d.max(0.0),
            Some(d) => -2.0 - d.max(0.0),
        };
        let mut out = vec![asks, self.assigned.max(0.0)];
        if let Some(c) = self.client {
            out.extend([-1.0, -1.0 - c as f64]);
        }
        out
    }

    /// Entries read back from a node's posted numbers (pairs; a stray last number is
    /// left out): a pair whose second number is below zero is the client of the entry
    /// before it.
    pub(super) fn read(posted: &[f64]) -> Vec<Entry> {
        let mut out: Vec<Entry> = Vec::with_capacity(posted.len() / 2);
        for p in posted.chunks_exact(2) {
            if p[1] < 0.0 {
                if let Some(last) = out.last_mut() {
                    last.client = Some((-1.0 - p[1]).max(0.0) as u64);
                }
                continue;
            }
            let (asks, shown) = match p[0] {
                a if a >= 0.0 => (Some(a), true),
                a if a <= -2.0 => (Some(-2.0 - a), false),
                _ => (None, false),
            };
            out.push(Entry {
                asks,
                shown,
                assigned: p[1],
                client: None,
            });
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn asks(d: f64, assigned: f64) -> Entry {
        Entry {
            asks: Some(d),
            shown: true,
            assigned,
            client: None,
        }
    }

    fn claims(d: f64, assigned: f64) -> Entry {
        Entry {
            asks: Some(d),
            shown: false,
            assigned,
            client: None,
        }
    }

    #[test]
    fn a_claimed_ask_reads_back_as_claimed_and_a_gone_one_as_gone() {
        let e = [
            claims(7.5, 3.0),
            asks(2.0, 1.0),
            Entry {
                asks: None,
                shown: false,
                assigned: 4.0,
                client: Some(7),
            },
        ];
        let posted: Vec<f64> = e.iter().flat_map(|e| e.posted()).collect();
        assert_eq!(Entry::read(&posted), e);
    }

    #[test]
    fn a_client_reads_back_with_its_entry_and_as_nothing_to_a_reader_of_pairs() {
        let tagged = Entry {
            client: Some((1 << 48) - 1),
            ..asks(30.0, 12.0)
        };
        let posted = [tagged.posted(), asks(5.0, 0.0).posted()].concat();
        assert_eq!(posted.len(), 6);
        assert_eq!(Entry::read(&posted), [tagged, asks(5.0, 0.0)]);
        // a reader of pairs only: the client's pair is a proxy gone, assigned nothing
        let (ask, assigned) = (posted[2], posted[3]);
        assert!(ask > -2.0 && ask < 0.0 && assigned.max(0.0) == 0.0);
    }
}
