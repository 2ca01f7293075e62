//! TLS for real, on 127.0.0.1 only: the HTTP executor against a local https server
//! (self-signed CA made in the test, trusted through `job_types.<j>.ca_file`), and the
//! store over TLS through a TLS terminator in front of the local Cassandra (CA check,
//! certificate-for-the-address check on by default).

use crate::common;

use fairway::config::{Config, ScyllaTls};
use fairway::handlers::{JobContext, JobLive, Registry};
use fairway::model::JobSubmitted;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use std::io::Write;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

/// A CA-less self-signed server certificate for `names` (DNS names or IP addresses).
struct Cert {
    pem: String,
    acceptor: TlsAcceptor,
}

fn cert(names: &[&str]) -> Cert {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let ck = rcgen::generate_simple_self_signed(names.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap();
    let der = CertificateDer::from(ck.cert.der().to_vec());
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(ck.key_pair.serialize_der()));
    let server = rustls::ServerConfig::builder().with_no_client_auth().with_single_cert(vec![der], key).unwrap();
    Cert { pem: ck.cert.pem(), acceptor: TlsAcceptor::from(Arc::new(server)) }
}

fn pem_file(pem: &str) -> tempfile::NamedTempFile {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    f.write_all(pem.as_bytes()).unwrap();
    f
}

/// A tiny https server: answers every POST with 200 and `ok <x-fairway-job-id>`.
async fn https_server(c: &Cert) -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    let acceptor = c.acceptor.clone();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = l.accept().await else { return };
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(mut s) = acceptor.accept(tcp).await else { return };
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                let head_end = loop {
                    let Ok(n) = s.read(&mut chunk).await else { return };
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        break i + 4;
                    }
                };
                let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
                let header = |name: &str| {
                    head.lines().find_map(|l| l.strip_prefix(&format!("{name}:")).map(|v| v.trim().to_string()))
                };
                let len: usize = header("content-length").and_then(|v| v.parse().ok()).unwrap_or(0);
                while buf.len() < head_end + len {
                    let Ok(n) = s.read(&mut chunk).await else { return };
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                }
                let body = format!("ok {}", header("x-fairway-job-id").unwrap_or_default());
                let resp =
                    format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}", body.len());
                let _ = s.write_all(resp.as_bytes()).await;
                let _ = s.shutdown().await;
            });
        }
    });
    port
}

fn http_job_types(url: &str, ca: &str) -> Config {
    let text = format!(
        "[job_types.trusted]\npool = \"short\"\nhandler = \"http\"\nurl = \"{url}\"\nca_file = \"{ca}\"\n\
         [job_types.untrusted]\npool = \"short\"\nhandler = \"http\"\nurl = \"{url}\"\n"
    );
    Config::parse(&text, "test").unwrap()
}

async fn run(reg: &Registry, job_type: &str) -> Result<Vec<u8>, fairway::handlers::HandlerError> {
    let mut job = JobSubmitted::original("job-tls-1".into(), "acme".into(), job_type.into(), b"{}".to_vec(), 0);
    job.attempt = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let ctx = JobContext::new(Arc::new(job), deadline, Arc::new(JobLive::default()), None);
    tokio::time::timeout(Duration::from_secs(15), reg.get(job_type).unwrap().run(ctx)).await.expect("bounded")
}

#[tokio::test]
async fn https_executor_verifies_the_server_and_trusts_a_custom_ca() {
    let c = cert(&["localhost", "127.0.0.1"]);
    let port = https_server(&c).await;
    let ca = pem_file(&c.pem);
    let cfg = http_job_types(&format!("https://127.0.0.1:{port}/run"), ca.path().to_str().unwrap());
    let reg = Registry::from_config(&cfg, Default::default()).unwrap();
    let out = run(&reg, "trusted").await.expect("https with the custom CA succeeds");
    assert_eq!(String::from_utf8_lossy(&out), "ok job-tls-1");
    // Without the CA the server's certificate is not trusted: a dependency failure.
    let err = run(&reg, "untrusted").await.expect_err("an unknown CA is refused");
    assert_eq!(err.class, fairway::model::FailureClass::Dependency, "{}", err.message);
    // A CA file that is not PEM is a config error naming the key.
    let junk = pem_file("not a certificate");
    let bad = http_job_types("https://127.0.0.1:1/x", junk.path().to_str().unwrap());
    let err = Registry::from_config(&bad, Default::default()).err().expect("refused");
    assert!(err.contains("job_types.trusted.ca_file"), "{err}");
}

/// A TLS terminator on 127.0.0.1:<free port> in front of `upstream` (plain TCP).
async fn tls_terminator(c: &Cert, upstream: String) -> String {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let acceptor = c.acceptor.clone();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = l.accept().await else { return };
            let (acceptor, upstream) = (acceptor.clone(), upstream.clone());
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else { return };
                let Ok(mut plain) = tokio::net::TcpStream::connect(&upstream).await else { return };
                let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
            });
        }
    });
    addr
}

fn store_cfg(contact: &str, tls: Option<ScyllaTls>) -> Config {
    let mut cfg = common::config("");
    cfg.scylla.contact_points = vec![contact.to_string()];
    cfg.scylla.tls = tls;
    cfg
}

fn tls(ca: Option<&tempfile::NamedTempFile>, verify_hostname: bool) -> Option<ScyllaTls> {
    Some(ScyllaTls {
        ca_file: ca.map(|f| f.path().to_str().unwrap().to_string()),
        cert_file: None,
        key_file: None,
        verify_hostname,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_connects_over_tls_and_checks_the_certificate() {
    let for_ip = cert(&["127.0.0.1"]);
    let proxy = tls_terminator(&for_ip, common::cql()).await;
    let ca = pem_file(&for_ip.pem);
    let opened = |cfg: Config| async move {
        tokio::time::timeout(Duration::from_secs(30), fairway::store::ensure_schema(&cfg)).await.expect("bounded")
    };
    // Trusted CA, certificate for 127.0.0.1: the schema check runs over TLS.
    opened(store_cfg(&proxy, tls(Some(&ca), true))).await.expect("TLS to the CQL database with the CA");
    // Unknown CA: refused, and the error points at [scylla.tls].
    let err = opened(store_cfg(&proxy, tls(None, true))).await.expect_err("unknown CA refused").to_string();
    assert!(err.contains("scylla.tls"), "{err}");
    // Plain CQL against the TLS port fails too (no silent downgrade either way).
    assert!(opened(store_cfg(&proxy, None)).await.is_err());

    // A certificate for another name: refused by default, accepted with
    // verify_hostname = false (the chain is still checked).
    let for_name = cert(&["db.example.internal"]);
    let proxy = tls_terminator(&for_name, common::cql()).await;
    let ca = pem_file(&for_name.pem);
    let err = opened(store_cfg(&proxy, tls(Some(&ca), true))).await.expect_err("name mismatch refused").to_string();
    assert!(err.contains("scylla.tls"), "{err}");
    opened(store_cfg(&proxy, tls(Some(&ca), false))).await.expect("verify_hostname = false accepts the chain");
}
