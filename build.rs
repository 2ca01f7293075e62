//! Link settings: every `rd_kafka_new` of a fairway binary or test goes through
//! `kafka::socket::__wrap_rd_kafka_new`, which gives the client's sockets their bound on
//! unacknowledged data (see that module).

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux") {
        println!("cargo:rustc-link-arg=-Wl,--wrap=rd_kafka_new");
    }
}
