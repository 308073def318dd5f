//! A Redis Cluster's slot map: which primary serves a slot, asked for again (by one
//! caller, the others waiting) when a redirect says it is out of date.

use super::*;

impl Topology {
    pub(super) fn primary(&self, slot: u16) -> Option<Arc<Server>> {
        let i = *self.slots.get(usize::from(slot))?;
        self.primaries.get(usize::from(i)).cloned()
    }
}

impl Cluster {
    /// The slot map, asked for again when it is out of date (one caller asks; the
    /// others wait for its answer).
    pub(super) async fn topology(&self) -> Result<Arc<Topology>, StoreError> {
        let current = || self.topology.read().expect("topology lock").clone();
        if !self.stale.load(Ordering::Acquire) {
            if let Some(t) = current() {
                return Ok(t);
            }
        }
        let _one = self.refreshing.lock().await;
        if !self.stale.load(Ordering::Acquire) {
            if let Some(t) = current() {
                return Ok(t);
            }
        }
        // clear first: a redirect seen while asking marks it again
        self.stale.store(false, Ordering::Release);
        match self.ask_topology(current()).await {
            Ok(t) => {
                let t = Arc::new(t);
                *self.topology.write().expect("topology lock") = Some(t.clone());
                Ok(t)
            }
            Err(e) => {
                self.stale.store(true, Ordering::Release);
                Err(e)
            }
        }
    }

    /// `CLUSTER SLOTS` from the first node that answers: the primaries known, then the
    /// seeds.
    async fn ask_topology(&self, known: Option<Arc<Topology>>) -> Result<Topology, StoreError> {
        let mut candidates: Vec<Arc<Server>> =
            known.map(|t| t.primaries.clone()).unwrap_or_default();
        for (host, port) in &self.seeds {
            candidates.push(self.server(host, *port)?);
        }
        let mut last = None;
        for server in candidates {
            let reply = async {
                let mut conn = server.conn().await?;
                let slots: Value = redis::cmd("CLUSTER")
                    .arg("SLOTS")
                    .query_async(&mut conn)
                    .await?;
                self.parse_slots(slots, &server)
            };
            match reply.await {
                Ok(t) => return Ok(t),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| StoreError::Protocol("a cluster needs at least one URL".into())))
    }

    /// `[[start, end, [host, port, id, …], replicas…], …]`; a host of `""` or `"?"`
    /// is the node that answered.
    fn parse_slots(&self, reply: Value, asked: &Arc<Server>) -> Result<Topology, StoreError> {
        let bad = || StoreError::Protocol("CLUSTER SLOTS answered an unexpected shape".into());
        let ranges: Vec<Value> = redis::from_owned_redis_value(reply)?;
        let mut primaries: Vec<Arc<Server>> = Vec::new();
        let mut slots = vec![u16::MAX; 16384];
        for range in ranges {
            let mut parts = match range {
                Value::Array(parts) => parts.into_iter(),
                _ => return Err(bad()),
            };
            let start: usize = redis::from_owned_redis_value(parts.next().ok_or_else(bad)?)?;
            let end: usize = redis::from_owned_redis_value(parts.next().ok_or_else(bad)?)?;
            let node: Vec<Value> = redis::from_owned_redis_value(parts.next().ok_or_else(bad)?)?;
            let mut node = node.into_iter();
            let host: String = redis::from_owned_redis_value(node.next().ok_or_else(bad)?)?;
            let port: u16 = redis::from_owned_redis_value(node.next().ok_or_else(bad)?)?;
            let server = if host.is_empty() || host == "?" {
                asked.clone()
            } else {
                self.server(&host, port)?
            };
            let index = match primaries.iter().position(|p| Arc::ptr_eq(p, &server)) {
                Some(i) => i,
                None => {
                    primaries.push(server);
                    primaries.len() - 1
                }
            };
            if start > end || end >= slots.len() {
                return Err(bad());
            }
            for s in &mut slots[start..=end] {
                *s = index as u16;
            }
        }
        Ok(Topology { primaries, slots })
    }

    /// The server at `host:port`, connected (on first use) as the seeds are.
    pub(super) fn server(&self, host: &str, port: u16) -> Result<Arc<Server>, StoreError> {
        let mut servers = self.servers.lock().expect("servers lock");
        if let Some(s) = servers.get(&(host.to_owned(), port)) {
            return Ok(s.clone());
        }
        let mut info = self.template.clone();
        info.addr = match &info.addr {
            ConnectionAddr::TcpTls { insecure, .. } => ConnectionAddr::TcpTls {
                host: host.to_owned(),
                port,
                insecure: *insecure,
                tls_params: None,
            },
            _ => ConnectionAddr::Tcp(host.to_owned(), port),
        };
        let client = match &self.root_cert {
            Some(root_cert) => redis::Client::build_with_tls(
                info,
                redis::TlsCertificates {
                    client_tls: None,
                    root_cert: Some(root_cert.clone()),
                },
            )?,
            None => redis::Client::open(info)?,
        };
        let server = Arc::new(Server::new(client));
        servers.insert((host.to_owned(), port), server.clone());
        Ok(server)
    }
}
