//! Reaching the CQL database at a process's start. A database that does not answer yet
//! (restarting, still starting, its address not yet in DNS) heals, so a long-running
//! process (`fairway worker`, `fairway serve`) started meanwhile waits for it, up to
//! `scylla.connect_wait`, and says so on every try, instead of exiting and leaving its
//! supervisor to restart it with a growing back-off. A setting that is wrong (the
//! credentials, TLS, a missing keyspace) does not heal: it fails at once, as before.

use super::{Store, StoreError};
use crate::config::Config;
use crate::core::backoff::doubling;
use scylla::errors::{
    ConnectionError, ConnectionPoolError, ConnectionSetupRequestErrorKind, DbError, MetadataError,
    MetadataFetchErrorKind, NewSessionError, PrepareError, RequestAttemptError,
};
use std::future::Future;
use std::io::ErrorKind;
use std::time::Duration;

/// The first pause between tries; each next one doubles, up to [`MAX_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(250);
const MAX_PAUSE: Duration = Duration::from_secs(5);

/// Whether a failed session start is the database not answering (which heals) rather
/// than a setting that is wrong (which does not).
pub(super) fn heals(e: &NewSessionError) -> bool {
    match e {
        NewSessionError::FailedToResolveAnyHostname(_) => true,
        NewSessionError::MetadataError(MetadataError::ConnectionPoolError(p)) => pool_heals(p),
        NewSessionError::MetadataError(MetadataError::FetchError(f)) => {
            matches!(f.error, MetadataFetchErrorKind::PrepareError(_) | MetadataFetchErrorKind::NextRowError(_))
        }
        _ => false,
    }
}

/// Whether a statement failed to prepare because no node answered (the session opened,
/// then lost its connections, or its nodes' addresses do not answer yet) rather than
/// because the statement or the schema is wrong.
pub(super) fn prepare_heals(e: &PrepareError) -> bool {
    match e {
        PrepareError::ConnectionPoolError(p) => pool_heals(p),
        PrepareError::AllAttemptsFailed { first_attempt } => match first_attempt {
            RequestAttemptError::BrokenConnectionError(_) | RequestAttemptError::UnableToAllocStreamId => true,
            RequestAttemptError::DbError(db, _) => db_heals(db),
            _ => false,
        },
        _ => false,
    }
}

fn pool_heals(p: &ConnectionPoolError) -> bool {
    match p {
        ConnectionPoolError::Broken { last_connection_error } => connection_heals(last_connection_error),
        ConnectionPoolError::Initializing => true,
        _ => false,
    }
}

fn db_heals(db: &DbError) -> bool {
    matches!(db, DbError::Overloaded | DbError::IsBootstrapping | DbError::Unavailable { .. })
}

fn connection_heals(e: &ConnectionError) -> bool {
    match e {
        ConnectionError::ConnectTimeout | ConnectionError::BrokenConnection(_) => true,
        ConnectionError::IoError(io) => io_heals(io.kind()),
        ConnectionError::ConnectionSetupRequestError(s) => match &s.error {
            ConnectionSetupRequestErrorKind::BrokenConnection(_) => true,
            ConnectionSetupRequestErrorKind::DbError(db, _) => db_heals(db),
            _ => false,
        },
        _ => false,
    }
}

/// Socket errors of a peer that is not there (yet); a TLS handshake's failure is not one.
fn io_heals(kind: ErrorKind) -> bool {
    matches!(
        kind,
        ErrorKind::ConnectionRefused
            | ErrorKind::ConnectionReset
            | ErrorKind::ConnectionAborted
            | ErrorKind::NotConnected
            | ErrorKind::TimedOut
            | ErrorKind::BrokenPipe
            | ErrorKind::UnexpectedEof
            | ErrorKind::HostUnreachable
            | ErrorKind::NetworkUnreachable
            | ErrorKind::AddrNotAvailable
    )
}

/// One try that found the database unreachable, for the caller to report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Waiting {
    /// Tries so far (this one included).
    pub tries: u32,
    /// Since the first try.
    pub waited: Duration,
    /// The pause before the next try.
    pub next_in: Duration,
    pub error: String,
}

impl Waiting {
    /// One line for the log and the readiness probe.
    pub fn describe(&self) -> String {
        format!(
            "waiting for the CQL database (try {}, {} s so far, next in {} ms; scylla.connect_wait bounds the wait): {}",
            self.tries,
            self.waited.as_secs(),
            self.next_in.as_millis(),
            self.error
        )
    }
}

/// Opens the store, waiting up to `limit` while the database is unreachable; `waiting`
/// hears each failed try. A wrong setting fails at once; past `limit` the last
/// unreachable error is returned.
pub async fn open_waiting(cfg: &Config, limit: Duration, waiting: impl FnMut(&Waiting)) -> Result<Store, StoreError> {
    retry_unreachable(limit, || Store::open(cfg), waiting).await
}

/// Tries `attempt` until it answers anything but [`StoreError::Unreachable`], or `limit`
/// has passed since the first try (then the last error is returned).
pub(crate) async fn retry_unreachable<T, F, Fut>(
    limit: Duration,
    mut attempt: F,
    mut waiting: impl FnMut(&Waiting),
) -> Result<T, StoreError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, StoreError>>,
{
    let started = tokio::time::Instant::now();
    let mut tries: u32 = 0;
    loop {
        let e = match attempt().await {
            Err(e @ StoreError::Unreachable { .. }) => e,
            other => return other,
        };
        tries = tries.saturating_add(1);
        let waited = started.elapsed();
        let Some(left) = limit.checked_sub(waited).filter(|l| !l.is_zero()) else { return Err(e) };
        let next_in = doubling(FIRST_PAUSE, MAX_PAUSE, tries).min(left);
        waiting(&Waiting { tries, waited, next_in, error: e.to_string() });
        tokio::time::sleep(next_in).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn unreachable() -> StoreError {
        StoreError::Unreachable { contact_points: "127.0.0.1:1".into(), message: "Connection refused".into() }
    }

    #[test]
    fn a_database_that_is_not_there_heals_and_a_wrong_setting_does_not() {
        let broken = |e: ConnectionError| {
            NewSessionError::MetadataError(MetadataError::ConnectionPoolError(ConnectionPoolError::Broken {
                last_connection_error: e,
            }))
        };
        let io = |k: ErrorKind| broken(ConnectionError::IoError(Arc::new(std::io::Error::from(k))));
        assert!(heals(&io(ErrorKind::ConnectionRefused)));
        assert!(heals(&io(ErrorKind::ConnectionReset)));
        assert!(heals(&broken(ConnectionError::ConnectTimeout)));
        assert!(heals(&NewSessionError::FailedToResolveAnyHostname(vec!["cassandra-0".into()])));
        // A TLS handshake's failure surfaces as another I/O error: a setting to fix.
        assert!(!heals(&io(ErrorKind::Other)));
        assert!(!heals(&io(ErrorKind::InvalidData)));
        assert!(!heals(&NewSessionError::EmptyKnownNodesList));
        assert!(!heals(&NewSessionError::IllegalConfig("x".into())));
    }

    #[test]
    fn a_statement_that_no_node_answered_heals_and_a_wrong_one_does_not() {
        let refused = ConnectionError::IoError(Arc::new(std::io::Error::from(ErrorKind::ConnectionRefused)));
        let pool = |p: ConnectionPoolError| PrepareError::ConnectionPoolError(p);
        let attempt = |a: RequestAttemptError| PrepareError::AllAttemptsFailed { first_attempt: a };
        assert!(prepare_heals(&pool(ConnectionPoolError::Broken { last_connection_error: refused })));
        assert!(prepare_heals(&pool(ConnectionPoolError::Initializing)));
        assert!(prepare_heals(&attempt(RequestAttemptError::UnableToAllocStreamId)));
        assert!(prepare_heals(&attempt(RequestAttemptError::DbError(DbError::Overloaded, "busy".into()))));
        // The statement or the schema is wrong: `fairway init`, or a fix, not a wait.
        assert!(!prepare_heals(&attempt(RequestAttemptError::DbError(DbError::SyntaxError, "line 1".into()))));
        assert!(!prepare_heals(&attempt(RequestAttemptError::DbError(DbError::Invalid, "unconfigured table".into()))));
        assert!(!prepare_heals(&PrepareError::PreparedStatementIdsMismatch));
        let tls = ConnectionError::IoError(Arc::new(std::io::Error::from(ErrorKind::InvalidData)));
        assert!(!prepare_heals(&pool(ConnectionPoolError::Broken { last_connection_error: tls })));
    }

    #[tokio::test(start_paused = true)]
    async fn an_unreachable_database_is_tried_again_until_it_answers() {
        let mut tries = 0;
        let mut heard = Vec::new();
        let got = retry_unreachable(
            Duration::from_secs(60),
            || {
                tries += 1;
                let t = tries;
                async move {
                    if t < 5 {
                        Err(unreachable())
                    } else {
                        Ok(t)
                    }
                }
            },
            |w| heard.push((w.tries, w.waited.as_millis(), w.next_in.as_millis())),
        )
        .await;
        assert_eq!(got.unwrap(), 5);
        assert_eq!(heard, [(1, 0, 250), (2, 250, 500), (3, 750, 1000), (4, 1750, 2000)]);
    }

    #[tokio::test(start_paused = true)]
    async fn the_wait_ends_at_its_limit_with_the_last_error() {
        let start = tokio::time::Instant::now();
        let mut heard = 0;
        let got: Result<(), _> =
            retry_unreachable(Duration::from_secs(12), || async { Err(unreachable()) }, |_| heard += 1).await;
        assert!(matches!(got, Err(StoreError::Unreachable { .. })), "{got:?}");
        // 0.25 + 0.5 + 1 + 2 + 4 = 7.75 s, then the 4.25 s left, then the last try.
        assert_eq!(start.elapsed(), Duration::from_secs(12));
        assert_eq!(heard, 6);
    }

    #[tokio::test(start_paused = true)]
    async fn a_wrong_setting_and_a_zero_limit_fail_at_once() {
        let start = tokio::time::Instant::now();
        let mut heard = 0;
        let wrong: Result<(), _> = retry_unreachable(
            Duration::from_secs(60),
            || async { Err(StoreError::Connect { contact_points: "x".into(), message: "bad password".into() }) },
            |_| heard += 1,
        )
        .await;
        assert!(matches!(wrong, Err(StoreError::Connect { .. })), "{wrong:?}");
        let zero: Result<(), _> =
            retry_unreachable(Duration::ZERO, || async { Err(unreachable()) }, |_| heard += 1).await;
        assert!(matches!(zero, Err(StoreError::Unreachable { .. })), "{zero:?}");
        assert_eq!((heard, start.elapsed()), (0, Duration::ZERO));
    }
}
