//! A plain TCP forwarder (threads, no protocol): the lab's way to put the suite's CQL
//! database, which listens on 127.0.0.1 only, on the host end of the store link. Every
//! byte is passed through unchanged; dropping the forwarder stops accepting and shuts
//! every connection it carries.

use std::io;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// A running forwarder: `addr()` -> upstream.
pub struct Forwarder {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    /// Both ends of every connection, shut down on drop.
    open: Arc<Mutex<Vec<TcpStream>>>,
}

impl Forwarder {
    /// Listens on `listen` (port 0: any free port) and forwards each connection to `upstream`.
    pub fn start(listen: SocketAddr, upstream: SocketAddr) -> io::Result<Forwarder> {
        let listener = TcpListener::bind(listen)?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let open = Arc::new(Mutex::new(Vec::new()));
        let (stop2, open2) = (stop.clone(), open.clone());
        std::thread::Builder::new().name("lab-forward".into()).spawn(move || {
            for conn in listener.incoming() {
                if stop2.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(client) = conn else { continue };
                let Ok(server) = TcpStream::connect(upstream) else { continue };
                let _ = (client.set_nodelay(true), server.set_nodelay(true));
                if let (Ok(c), Ok(s)) = (client.try_clone(), server.try_clone()) {
                    open2.lock().unwrap_or_else(|e| e.into_inner()).extend([c, s]);
                }
                pipe(&client, &server);
                pipe(&server, &client);
            }
        })?;
        Ok(Forwarder { addr, stop, open })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

/// Copies `from` to `to` on a thread of its own until either side closes.
fn pipe(from: &TcpStream, to: &TcpStream) {
    let (Ok(mut from), Ok(mut to)) = (from.try_clone(), to.try_clone()) else { return };
    let _ = std::thread::Builder::new().name("lab-forward-pipe".into()).spawn(move || {
        let _ = io::copy(&mut from, &mut to);
        let _ = to.shutdown(Shutdown::Write);
    });
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(self.addr); // wakes the accept loop, which sees `stop`
        for s in self.open.lock().unwrap_or_else(|e| e.into_inner()).drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}
