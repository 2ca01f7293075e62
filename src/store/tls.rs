//! TLS to the CQL nodes (the system's OpenSSL, which librdkafka uses too). The driver
//! checks each node's certificate against the node's IP address; `verify_hostname =
//! false` keeps the chain check and accepts a certificate for another name.

use super::StoreError;
use crate::config::{Config, ScyllaTls};
use openssl::ssl::{SslConnector, SslFiletype, SslMethod, SslVerifyMode};
use scylla::client::session::OpenSsl010Config;

/// CA bundles of common Linux distributions (Debian/Ubuntu, RHEL/Fedora, Alpine, SUSE).
const SYSTEM_BUNDLES: &[&str] = &[
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/cert.pem",
    "/etc/ssl/ca-bundle.pem",
];

/// X509_V_ERR_HOSTNAME_MISMATCH, X509_V_ERR_IP_ADDRESS_MISMATCH (openssl/x509_vfy.h).
const NAME_MISMATCH: [i32; 2] = [62, 64];

fn bad(what: &str, file: &str, e: impl std::fmt::Display) -> StoreError {
    StoreError::Connect {
        contact_points: String::new(),
        message: format!("scylla.tls.{what} {file:?} cannot be used: {e}; give a readable PEM file"),
    }
}

pub(super) fn context(t: &ScyllaTls) -> Result<OpenSsl010Config, StoreError> {
    let mut b = SslConnector::builder(SslMethod::tls_client()).map_err(|e| bad("context", "", e))?;
    match &t.ca_file {
        Some(ca) => b.set_ca_file(ca).map_err(|e| bad("ca_file", ca, e))?,
        // The OpenSSL built from source knows no system CA store: use the system bundle.
        None => {
            if let Some(bundle) = SYSTEM_BUNDLES.iter().find(|p| std::path::Path::new(p).exists()) {
                b.set_ca_file(bundle).map_err(|e| bad("ca_file (system bundle)", bundle, e))?;
            }
        }
    }
    if let (Some(cert), Some(key)) = (&t.cert_file, &t.key_file) {
        b.set_certificate_chain_file(cert).map_err(|e| bad("cert_file", cert, e))?;
        b.set_private_key_file(key, SslFiletype::PEM).map_err(|e| bad("key_file", key, e))?;
        b.check_private_key().map_err(|e| bad("key_file", key, e))?;
    }
    if !t.verify_hostname {
        b.set_verify_callback(SslVerifyMode::PEER, |ok, ctx| ok || NAME_MISMATCH.contains(&ctx.error().as_raw()));
    }
    Ok(OpenSsl010Config::new(b))
}

/// What to check when a session cannot be built, from the driver's message.
pub(super) fn connect_hint(message: &str, cfg: &Config) -> &'static str {
    let m = message.to_ascii_lowercase();
    if m.contains("authenticat") || m.contains("credentials") || m.contains("password") {
        if cfg.scylla.username.is_none() {
            "; the cluster requires authentication: set scylla.username and scylla.password (or FAIRWAY_SCYLLA_PASSWORD)"
        } else {
            "; check scylla.username and scylla.password / FAIRWAY_SCYLLA_PASSWORD"
        }
    } else if m.contains("certificate") || m.contains("ssl") || m.contains("tls") {
        "; check [scylla.tls] (ca_file must hold the CA that signed the nodes' certificates)"
    } else {
        ""
    }
}
