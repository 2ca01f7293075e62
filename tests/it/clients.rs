//! The Python and TypeScript clients against one server: one `fairway serve` API and one
//! `fairway worker` (short pool) on the real broker and CQL database, both clients'
//! suites at once, as two teams of one fleet would use it (`python_client`,
//! `typescript_client` hold each client's steps).

use crate::common;
use crate::{python_client, typescript_client};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_python_and_typescript_clients_pass_against_the_same_server() {
    // Kept whole to the end: it holds the API's stop signal and the config folder.
    let services = common::client_services(python_client::JOB_TYPES, "it_clients").await;
    // Each team its own key: an admin key's heavy reads (a replay's dry run holds one
    // while it scans) are counted per key, so one client's do not refuse the other's.
    let (_, ts_key) = common::create_key(&services.cfg, &fairway::core::auth::Caller::Admin, "it_clients_ts").await;
    tokio::join!(
        python_client::its_tests_pass(&services),
        typescript_client::installs_from_its_tarball_and_moves_2000_jobs(&services, ts_key),
    );
}
