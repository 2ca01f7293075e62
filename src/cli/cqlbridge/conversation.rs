//! Per-connection rewrite state (pure, no I/O): which protocol version the client
//! speaks, and which in-flight requests need their response patched.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use bytes::BytesMut;

use super::frame::{self, opcode, FrameError, Request};
use super::system_local;

/// Prepared statement ids whose results need `rpc_address` re-inserted (at the given
/// column index). Shared by all connections: drivers may prepare on one connection and
/// execute on another, and ids are server-wide.
pub type PatchedStatements = Arc<Mutex<HashMap<Vec<u8>, usize>>>;

/// What to do to the response of one in-flight request (keyed by stream id).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fixup {
    /// Rows result: re-insert the `rpc_address` column stripped from the query.
    Rows { index: usize },
    /// Prepared result: re-insert the column spec and remember the statement id.
    Prepared { index: usize },
}

/// State of one bridged connection. Feed it every request and every response frame.
#[derive(Debug)]
pub struct Conversation {
    /// Version of the client's requests (0 until the first one).
    client_version: u8,
    /// Address the client reached the bridge at; reported as the node's `rpc_address`.
    bridge_ip: IpAddr,
    pending: HashMap<i16, Fixup>,
    statements: PatchedStatements,
}

impl Conversation {
    pub fn new(bridge_ip: IpAddr, statements: PatchedStatements) -> Self {
        Self { client_version: 0, bridge_ip, pending: HashMap::new(), statements }
    }

    /// Client -> server.
    pub fn on_request(&mut self, f: BytesMut) -> Result<Request, FrameError> {
        self.client_version = frame::version(&f);
        let v4 = f[0] == frame::CLIENT_VERSION;
        let f = match frame::rewrite_request(f)? {
            Request::Forward(f) if v4 && !frame::is_compressed(&f) => f,
            other => return Ok(other),
        };
        let stream = frame::stream(&f);
        match frame::opcode_of(&f) {
            op @ (opcode::QUERY | opcode::PREPARE) => match system_local::rewrite_query(&f)? {
                Some((rewritten, index)) => {
                    let fixup = if op == opcode::QUERY { Fixup::Rows { index } } else { Fixup::Prepared { index } };
                    self.pending.insert(stream, fixup);
                    Ok(Request::Forward(rewritten))
                }
                None => Ok(Request::Forward(f)),
            },
            opcode::EXECUTE => {
                let index = lock(&self.statements).get(system_local::execute_id(&f)?).copied();
                if let Some(index) = index {
                    self.pending.insert(stream, Fixup::Rows { index });
                }
                Ok(Request::Forward(f))
            }
            _ => Ok(Request::Forward(f)),
        }
    }

    /// Server -> client.
    pub fn on_response(&mut self, f: BytesMut) -> Result<BytesMut, FrameError> {
        let fixup = match frame::stream(&f) {
            s if s >= 0 && !self.pending.is_empty() => self.pending.remove(&s),
            _ => None, // events (stream -1) never answer a request
        };
        let f = frame::rewrite_response(f, self.client_version)?;
        if frame::opcode_of(&f) != opcode::RESULT {
            return Ok(f);
        }
        match fixup {
            None => Ok(f),
            Some(Fixup::Rows { index }) => system_local::insert_rpc_address(f, index, self.bridge_ip),
            Some(Fixup::Prepared { index }) => {
                let (f, id) = system_local::patch_prepared(f, index)?;
                if let Some(id) = id {
                    lock(&self.statements).insert(id, index);
                }
                Ok(f)
            }
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Plain data; a panic elsewhere cannot leave it half-updated.
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BufMut;
    use std::net::Ipv4Addr;

    fn frame(version: u8, stream: i16, op: u8, body: &[u8]) -> BytesMut {
        let mut f = BytesMut::new();
        f.put_u8(version);
        f.put_u8(0);
        f.put_i16(stream);
        f.put_u8(op);
        f.put_u32(body.len() as u32);
        f.extend_from_slice(body);
        f
    }

    fn query(q: &str) -> Vec<u8> {
        let mut b = (q.len() as i32).to_be_bytes().to_vec();
        b.extend_from_slice(q.as_bytes());
        b.extend_from_slice(&[0, 1, 0]);
        b
    }

    /// Rows: one column `host_id uuid` (global spec), one row.
    fn rows_body() -> Vec<u8> {
        let mut b = BytesMut::new();
        b.put_i32(2);
        b.put_i32(1);
        b.put_i32(1);
        for s in ["system", "local", "host_id"] {
            b.put_u16(s.len() as u16);
            b.extend_from_slice(s.as_bytes());
        }
        b.put_u16(0x000C);
        b.put_i32(1);
        b.put_i32(16);
        b.extend_from_slice(&[7; 16]);
        b.to_vec()
    }

    fn forwarded(r: Request) -> BytesMut {
        match r {
            Request::Forward(f) => f,
            Request::Reject(e) => panic!("unexpected reject {e:?}"),
        }
    }

    #[test]
    fn system_local_query_round_trip() {
        let mut c = Conversation::new(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 9)), Default::default());
        let up = forwarded(
            c.on_request(frame(4, 11, 0x07, &query("SELECT rpc_address, host_id FROM system.local"))).unwrap(),
        );
        assert_eq!(up, frame(3, 11, 0x07, &query("SELECT host_id FROM system.local")));
        // An event and an unrelated response in between are not patched.
        let ev = c.on_response(frame(0x83, -1, 0x0C, b"")).unwrap();
        assert_eq!(ev, frame(0x84, -1, 0x0C, b""));
        let other = c.on_response(frame(0x83, 12, 0x08, &rows_body())).unwrap();
        assert_eq!(other, frame(0x84, 12, 0x08, &rows_body()));

        let down = c.on_response(frame(0x83, 11, 0x08, &rows_body())).unwrap();
        assert_eq!(down[0], 0x84);
        let body = &down[9..];
        assert_eq!(&body[8..12], &2i32.to_be_bytes(), "columns_count now 2");
        assert!(down.ends_with(&[0, 0, 0, 16, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7]));
        let inet = [0, 0, 0, 4, 127, 0, 0, 9];
        assert!(down.windows(inet.len()).any(|w| w == inet), "rpc_address value first");
        // Fixup consumed: the same stream id later is not patched again.
        let again = c.on_response(frame(0x83, 11, 0x08, &rows_body())).unwrap();
        assert_eq!(again, frame(0x84, 11, 0x08, &rows_body()));
    }

    /// v3 Prepared result for `SELECT host_id FROM system.local`: id "ID", no bind
    /// variables, result metadata (global spec) with one column.
    fn prepared_body() -> Vec<u8> {
        let mut b = BytesMut::new();
        b.put_i32(4);
        b.put_u16(2);
        b.extend_from_slice(b"ID");
        b.put_i32(0);
        b.put_i32(0);
        b.put_i32(1);
        b.put_i32(1);
        for s in ["system", "local", "host_id"] {
            b.put_u16(s.len() as u16);
            b.extend_from_slice(s.as_bytes());
        }
        b.put_u16(0x000C);
        b.to_vec()
    }

    #[test]
    fn prepared_system_local_query_is_patched_on_every_connection() {
        let shared = PatchedStatements::default();
        let ip = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let mut a = Conversation::new(ip, shared.clone());
        let prepare = frame(4, 3, 0x09, &query("SELECT rpc_address, host_id FROM system.local")[..]);
        let up = forwarded(a.on_request(prepare).unwrap());
        let q = "SELECT host_id FROM system.local";
        assert_eq!(&up[13..13 + q.len()], q.as_bytes());
        let prepared = a.on_response(frame(0x83, 3, 0x08, &prepared_body())).unwrap();
        // v4 pk_count added, and result metadata now has 2 columns incl. rpc_address inet.
        assert!(prepared.windows(11).any(|w| w == b"rpc_address"));
        assert_eq!(frame::body_len(&prepared), prepared.len() - 9);

        // EXECUTE of that id on another connection gets its rows patched.
        let mut b = Conversation::new(ip, shared);
        let exec = frame(4, 8, 0x0A, b"\x00\x02ID\x00\x01\x00");
        assert_eq!(forwarded(b.on_request(exec).unwrap())[0], 3);
        let rows = b.on_response(frame(0x83, 8, 0x08, &rows_body())).unwrap();
        assert!(rows.windows(8).any(|w| w == [0, 0, 0, 4, 127, 0, 0, 1]));
        // Other EXECUTEs are left alone.
        b.on_request(frame(4, 9, 0x0A, b"\x00\x02XY\x00\x01\x00")).unwrap();
        let plain = b.on_response(frame(0x83, 9, 0x08, &rows_body())).unwrap();
        assert_eq!(plain, frame(0x84, 9, 0x08, &rows_body()));
    }

    #[test]
    fn error_answer_to_patched_query_passes_through() {
        let mut c = Conversation::new(IpAddr::V4(Ipv4Addr::LOCALHOST), Default::default());
        c.on_request(frame(4, 1, 0x07, &query("SELECT rpc_address, host_id FROM system.local"))).unwrap();
        let err = frame::error_frame(3, 1, 0x2200, "nope");
        let out = c.on_response(err.clone()).unwrap();
        assert_eq!(&out[1..], &err[1..]);
        assert_eq!(out[0], 0x84);
    }

    #[test]
    fn v3_client_is_passed_through_untouched() {
        let mut c = Conversation::new(IpAddr::V4(Ipv4Addr::LOCALHOST), Default::default());
        let q = frame(3, 1, 0x07, &query("SELECT rpc_address, host_id FROM system.local"));
        assert_eq!(forwarded(c.on_request(q.clone()).unwrap()), q);
        let r = frame(0x83, 1, 0x08, &rows_body());
        assert_eq!(c.on_response(r.clone()).unwrap(), r);
    }
}
