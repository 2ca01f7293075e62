//! The TCP sockets of this process's Kafka producers, and how long data on them may stay
//! unacknowledged.
//!
//! A producer reports a record failed once its delivery timeout (`message.timeout.ms`)
//! passed, but a produce request already written to the socket is the kernel's: cut off
//! from the broker, the kernel retransmits it for minutes, also after librdkafka closed
//! the socket or the process exited, and delivers it once the link is back. A worker's
//! result would then land long after another worker took its partition and ran the job.
//! So every TCP socket a Kafka producer of this process opens carries `TCP_USER_TIMEOUT`
//! = the shortest delivery timeout among the process's producers: data the broker has not
//! acknowledged within that long is dropped with the connection (librdkafka reconnects,
//! within a second of the link's return, and retries what is still within its own
//! timeout). Consumers' sockets are left as librdkafka makes them: a late request of
//! theirs (a commit, a heartbeat) is fenced by the group's generation, and a connection
//! that outlives a cut lets the member rejoin at once when the link is back (with the
//! bound on them too, the partition lab's
//! `a_worker_cut_off_from_the_broker_past_its_session_serves_again_or_exits` failed: after
//! a 32 s cut the member waited out librdkafka's 10 s reconnect backoff).
//!
//! librdkafka takes a socket callback in its native configuration only, which
//! rust-rdkafka builds inside its client constructors. `build.rs` links with
//! `--wrap=rd_kafka_new`, so every client this process creates passes through
//! [`__wrap_rd_kafka_new`], which installs [`open_socket`] on producers and then creates
//! the client.

use rdkafka::bindings as rd;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// The process's bound on unacknowledged data, in ms (`u32::MAX`: no producer yet).
static UNACKED_LIMIT_MS: AtomicU32 = AtomicU32::new(u32::MAX);
/// Clients created through the hook.
static CLIENTS: AtomicU64 = AtomicU64::new(0);

/// Whether this build's clients pass through the hook: it has run for some client.
pub fn hooked() -> bool {
    CLIENTS.load(Ordering::SeqCst) > 0
}

/// The bound the process's Kafka sockets get now, if a producer set one.
pub fn unacked_limit_ms() -> Option<u32> {
    Some(UNACKED_LIMIT_MS.load(Ordering::SeqCst)).filter(|&ms| ms != u32::MAX)
}

extern "C" {
    fn __real_rd_kafka_new(
        kind: rd::rd_kafka_type_t,
        conf: *mut rd::rd_kafka_conf_t,
        errstr: *mut c_char,
        errstr_size: usize,
    ) -> *mut rd::rd_kafka_t;
}

/// Every `rd_kafka_new` of the process (the linker sends the calls here): a producer's
/// delivery timeout lowers the process's bound and its sockets come from [`open_socket`];
/// then librdkafka creates the client as asked.
///
/// # Safety
/// The arguments of `rd_kafka_new`: `conf` a valid configuration (or null), `errstr`
/// writable for `errstr_size` bytes.
#[no_mangle]
pub unsafe extern "C" fn __wrap_rd_kafka_new(
    kind: rd::rd_kafka_type_t,
    conf: *mut rd::rd_kafka_conf_t,
    errstr: *mut c_char,
    errstr_size: usize,
) -> *mut rd::rd_kafka_t {
    if !conf.is_null() {
        if kind == rd::rd_kafka_type_t::RD_KAFKA_PRODUCER {
            if let Some(ms) = message_timeout_ms(conf) {
                UNACKED_LIMIT_MS.fetch_min(ms, Ordering::SeqCst);
            }
            rd::rd_kafka_conf_set_socket_cb(conf, Some(open_socket));
        }
        CLIENTS.fetch_add(1, Ordering::SeqCst);
    }
    __real_rd_kafka_new(kind, conf, errstr, errstr_size)
}

/// The configuration's `message.timeout.ms` (0, no timeout, gives none).
unsafe fn message_timeout_ms(conf: *const rd::rd_kafka_conf_t) -> Option<u32> {
    let mut buf = [0 as c_char; 32];
    let mut len = buf.len();
    let res = rd::rd_kafka_conf_get(conf, c"message.timeout.ms".as_ptr(), buf.as_mut_ptr(), &mut len);
    if res != rd::rd_kafka_conf_res_t::RD_KAFKA_CONF_OK {
        return None;
    }
    let text = CStr::from_ptr(buf.as_ptr()).to_str().ok()?;
    text.parse::<u32>().ok().filter(|&ms| ms > 0)
}

/// librdkafka's socket callback: its own default (`socket` with close-on-exec) plus the
/// process's bound on unacknowledged data for TCP. A socket that cannot take the bound is
/// closed and refused (librdkafka reports the connection failed and retries), never
/// handed out without it.
unsafe extern "C" fn open_socket(domain: c_int, kind: c_int, protocol: c_int, _opaque: *mut c_void) -> c_int {
    let fd = libc::socket(domain, kind | libc::SOCK_CLOEXEC, protocol);
    if fd < 0 {
        return fd;
    }
    let tcp = (domain == libc::AF_INET || domain == libc::AF_INET6) && kind == libc::SOCK_STREAM;
    if let (true, Some(ms)) = (tcp, unacked_limit_ms()) {
        let value: libc::c_uint = ms;
        let set = libc::setsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_USER_TIMEOUT,
            (&value as *const libc::c_uint).cast(),
            std::mem::size_of::<libc::c_uint>() as libc::socklen_t,
        );
        if set != 0 {
            let errno = *libc::__errno_location();
            libc::close(fd);
            *libc::__errno_location() = errno;
            return -1;
        }
    }
    fd
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdkafka::producer::BaseProducer;
    use rdkafka::ClientConfig;
    use std::net::TcpListener;

    /// The `TCP_USER_TIMEOUT` of the process's socket whose local address is `local`.
    fn user_timeout_of_socket_at(local: std::net::SocketAddr) -> Option<u32> {
        for entry in std::fs::read_dir("/proc/self/fd").ok()?.flatten() {
            let Ok(fd) = entry.file_name().to_string_lossy().parse::<c_int>() else { continue };
            let mut addr: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
            let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            if unsafe { libc::getsockname(fd, (&mut addr as *mut libc::sockaddr_storage).cast(), &mut len) } != 0 {
                continue;
            }
            if addr.ss_family as c_int != libc::AF_INET {
                continue;
            }
            let sin: libc::sockaddr_in = unsafe { std::ptr::read((&addr as *const libc::sockaddr_storage).cast()) };
            let port = u16::from_be(sin.sin_port);
            if port != local.port() {
                continue;
            }
            let mut value: libc::c_uint = 0;
            let mut vlen = std::mem::size_of::<libc::c_uint>() as libc::socklen_t;
            let got = unsafe {
                libc::getsockopt(
                    fd,
                    libc::IPPROTO_TCP,
                    libc::TCP_USER_TIMEOUT,
                    (&mut value as *mut libc::c_uint).cast(),
                    &mut vlen,
                )
            };
            if got == 0 {
                return Some(value);
            }
        }
        None
    }

    #[test]
    fn a_producers_socket_drops_data_unacknowledged_past_its_delivery_timeout() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let broker = listener.local_addr().unwrap();
        let producer: BaseProducer = ClientConfig::new()
            .set("bootstrap.servers", broker.to_string())
            .set("message.timeout.ms", "2345")
            .create()
            .unwrap();
        assert!(hooked(), "clients are created through the hook (build.rs links --wrap=rd_kafka_new)");
        assert!(unacked_limit_ms().is_some_and(|ms| ms <= 2345));
        // librdkafka connects to its bootstrap broker on its own thread.
        let (conn, client_addr) = listener.accept().unwrap();
        let got = user_timeout_of_socket_at(client_addr);
        // Other tests' producers may have lowered the process's bound since.
        assert!(got.is_some_and(|ms| ms > 0 && ms <= 2345), "the client's socket {client_addr} carries {got:?}");
        drop(conn);
        drop(producer);
    }
}
