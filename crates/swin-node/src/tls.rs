//! TLS for both listeners (HTTPS and Envoy's gRPC): the `[tls]` section's certificate
//! chain and private key (PEM files), served with rustls (HTTP/2 and HTTP/1.1 by ALPN);
//! with `client_ca`, every client must present a certificate that CA signed (mutual
//! TLS). SIGHUP reads the files again; files that do not load leave the running ones in
//! place.

use std::sync::Arc;

use anyhow::Context;
use arc_swap::ArcSwap;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::server::WebPkiClientVerifier;
use tokio_rustls::rustls::{RootCertStore, ServerConfig};
use tokio_rustls::TlsAcceptor;

use crate::config::TlsConfig;

/// The acceptor in use, swapped when the files are read again.
#[derive(Clone)]
pub struct Acceptor(Arc<ArcSwap<TlsAcceptor>>);

impl std::fmt::Debug for Acceptor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Acceptor")
    }
}

impl Acceptor {
    /// Reads `cfg`'s files.
    pub fn load(cfg: &TlsConfig) -> anyhow::Result<Acceptor> {
        Ok(Acceptor(Arc::new(ArcSwap::from_pointee(acceptor(cfg)?))))
    }

    /// Reads `cfg`'s files again; on an error the running pair stays.
    pub fn reload(&self, cfg: &TlsConfig) -> anyhow::Result<()> {
        self.0.store(Arc::new(acceptor(cfg)?));
        Ok(())
    }

    /// What a new connection's handshake uses.
    pub fn current(&self) -> Arc<TlsAcceptor> {
        self.0.load_full()
    }
}

/// An acceptor for `cfg`'s certificate chain and key.
fn acceptor(cfg: &TlsConfig) -> anyhow::Result<TlsAcceptor> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&cfg.cert)
        .and_then(|it| it.collect::<Result<_, _>>())
        .with_context(|| format!("tls.cert: read {}", cfg.cert.display()))?;
    if certs.is_empty() {
        anyhow::bail!("tls.cert: {} holds no certificate", cfg.cert.display());
    }
    let key = PrivateKeyDer::from_pem_file(&cfg.key)
        .with_context(|| format!("tls.key: read {}", cfg.key.display()))?;
    let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .context("tls: protocol versions")?;
    let builder = match &cfg.client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = RootCertStore::empty();
            for c in CertificateDer::pem_file_iter(ca)
                .with_context(|| format!("tls.client_ca: read {}", ca.display()))?
            {
                let c = c.with_context(|| format!("tls.client_ca: read {}", ca.display()))?;
                roots
                    .add(c)
                    .with_context(|| format!("tls.client_ca: {}", ca.display()))?;
            }
            if roots.is_empty() {
                anyhow::bail!("tls.client_ca: {} holds no certificate", ca.display());
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .with_context(|| format!("tls.client_ca: {}", ca.display()))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder
        .with_single_cert(certs, key)
        .context("tls: the key does not match the certificate")?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}
