//! Pure frame handling for the CQL v4 -> v3 bridge: cutting a byte stream into frames
//! and rewriting single frames. No I/O here, so every rule is unit-tested below.
//!
//! Why these rewrites are enough: native protocol v3 and v4 share the 9-byte header
//! (version, flags, i16 stream, opcode, u32 length) and, for everything a v3 server can
//! send, the same body layouts, with three exceptions:
//! 1. the version byte itself (0x04/0x84 vs 0x03/0x83);
//! 2. STARTUP's CQL_VERSION: v4 drivers ask for "4.0.0"/"3.4.x", Cassandra 2.1 accepts
//!    only 3.x up to 3.2.0;
//! 3. RESULT kind=Prepared: the v4 prepared metadata carries `pk_count` (+ indexes) right
//!    after `columns_count`, before the optional global table spec. v3 has no such field.
//!
//! v4-only features a v3 server cannot honour (request custom payloads, compression
//! negotiated at STARTUP) are refused with an ERROR frame for the client, rather than
//! being forwarded and mis-parsed.

use bytes::{BufMut, BytesMut};

/// Size of a v3/v4 frame header.
pub const HEADER_LEN: usize = 9;
/// Cassandra's own default `native_transport_max_frame_size_in_mb` is 256.
pub const MAX_BODY_LEN: usize = 256 * 1024 * 1024;
/// The CQL language version Cassandra 2.1.0 announces (and accepts) in STARTUP.
pub const BRIDGE_CQL_VERSION: &str = "3.2.0";

/// Protocol version spoken by the client (drivers such as the `scylla` crate).
pub const CLIENT_VERSION: u8 = 4;
/// Protocol version spoken by the upstream server (Cassandra 2.1).
pub const SERVER_VERSION: u8 = 3;
const RESPONSE_BIT: u8 = 0x80;

/// Frame opcodes used by the rewriter.
pub mod opcode {
    pub const ERROR: u8 = 0x00;
    pub const STARTUP: u8 = 0x01;
    pub const QUERY: u8 = 0x07;
    pub const RESULT: u8 = 0x08;
    pub const PREPARE: u8 = 0x09;
    pub const EXECUTE: u8 = 0x0A;
}

/// Header flag bits.
pub mod flags {
    pub const COMPRESSION: u8 = 0x01;
    pub const TRACING: u8 = 0x02;
    /// v4 only.
    pub const CUSTOM_PAYLOAD: u8 = 0x04;
}

pub(super) const RESULT_KIND_ROWS: i32 = 0x0002;
pub(super) const RESULT_KIND_PREPARED: i32 = 0x0004;
/// ERROR code "Protocol error".
pub const ERR_PROTOCOL: i32 = 0x000A;
/// ERROR code "Server error".
pub const ERR_SERVER: i32 = 0x0000;

const OFF_VERSION: usize = 0;
const OFF_FLAGS: usize = 1;
const OFF_STREAM: usize = 2;
const OFF_OPCODE: usize = 4;
const OFF_LENGTH: usize = 5;

/// Why a frame could not be handled.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("frame body of {len} bytes exceeds the {MAX_BODY_LEN}-byte limit (corrupt stream?)")]
    TooLong { len: usize },
    #[error("malformed {what} frame: {detail}")]
    Malformed { what: &'static str, detail: &'static str },
    #[error("compressed {what} frame cannot be rewritten; turn driver compression off")]
    Compressed { what: &'static str },
}

/// What to do with one client request.
#[derive(Debug, PartialEq, Eq)]
pub enum Request {
    /// Send this (possibly rewritten) frame upstream.
    Forward(BytesMut),
    /// Do not forward; send this ERROR frame back to the client instead.
    Reject(BytesMut),
}

/// Cuts the next complete frame off the front of `buf`, or returns `None` when more
/// bytes are needed (a frame may arrive split over many reads, or many frames in one).
pub fn split_frame(buf: &mut BytesMut) -> Result<Option<BytesMut>, FrameError> {
    if buf.len() < HEADER_LEN {
        return Ok(None);
    }
    let len = body_len(buf);
    if len > MAX_BODY_LEN {
        return Err(FrameError::TooLong { len });
    }
    let total = HEADER_LEN + len;
    if buf.len() < total {
        buf.reserve(total - buf.len());
        return Ok(None);
    }
    Ok(Some(buf.split_to(total)))
}

/// Protocol version of a frame (direction bit stripped).
pub fn version(frame: &[u8]) -> u8 {
    frame[OFF_VERSION] & !RESPONSE_BIT
}

/// Stream id of a frame.
pub fn stream(frame: &[u8]) -> i16 {
    i16::from_be_bytes([frame[OFF_STREAM], frame[OFF_STREAM + 1]])
}

/// Opcode of a frame.
pub fn opcode_of(frame: &[u8]) -> u8 {
    frame[OFF_OPCODE]
}

/// Offset of a response's message body: a traced response starts with the 16-byte
/// tracing session id.
pub fn response_body_start(frame: &[u8]) -> usize {
    if frame[OFF_FLAGS] & flags::TRACING != 0 {
        HEADER_LEN + 16
    } else {
        HEADER_LEN
    }
}

/// Whether the body is compressed (and so cannot be inspected).
pub fn is_compressed(frame: &[u8]) -> bool {
    frame[OFF_FLAGS] & flags::COMPRESSION != 0
}

pub(super) fn body_len(frame: &[u8]) -> usize {
    u32::from_be_bytes([frame[OFF_LENGTH], frame[OFF_LENGTH + 1], frame[OFF_LENGTH + 2], frame[OFF_LENGTH + 3]])
        as usize
}

pub(super) fn set_body_len(frame: &mut [u8], len: usize) {
    frame[OFF_LENGTH..HEADER_LEN].copy_from_slice(&(len as u32).to_be_bytes());
}

/// Rewrites one client -> server frame. Frames that are not v4 requests pass through
/// untouched, so a v3 driver can use the bridge too.
pub fn rewrite_request(mut frame: BytesMut) -> Result<Request, FrameError> {
    if frame[OFF_VERSION] != CLIENT_VERSION {
        return Ok(Request::Forward(frame));
    }
    let frame_flags = frame[OFF_FLAGS];
    if frame_flags & flags::CUSTOM_PAYLOAD != 0 {
        // A v3 server would read the payload map as the start of the body.
        return Ok(Request::Reject(error_frame(
            CLIENT_VERSION,
            stream(&frame),
            ERR_PROTOCOL,
            "fairway cql-bridge: custom payloads are not supported by the v3 upstream",
        )));
    }
    frame[OFF_VERSION] = SERVER_VERSION;
    if frame[OFF_OPCODE] != opcode::STARTUP {
        return Ok(Request::Forward(frame));
    }
    if frame_flags & flags::COMPRESSION != 0 {
        return Err(FrameError::Compressed { what: "STARTUP" });
    }
    let mut options = decode_string_map(&frame[HEADER_LEN..])?;
    if options.iter().any(|(k, _)| k == "COMPRESSION") {
        // The bridge must read RESULT bodies (Prepared), which it cannot do compressed.
        return Ok(Request::Reject(error_frame(
            CLIENT_VERSION,
            stream(&frame),
            ERR_PROTOCOL,
            "fairway cql-bridge: compression is not supported; turn driver compression off",
        )));
    }
    match options.iter_mut().find(|(k, _)| k == "CQL_VERSION") {
        Some((_, v)) => *v = BRIDGE_CQL_VERSION.to_owned(),
        None => options.push(("CQL_VERSION".to_owned(), BRIDGE_CQL_VERSION.to_owned())),
    }
    let mut out = BytesMut::with_capacity(frame.len() + 8);
    out.extend_from_slice(&frame[..HEADER_LEN]);
    encode_string_map(&mut out, &options);
    let len = out.len() - HEADER_LEN;
    set_body_len(&mut out, len);
    Ok(Request::Forward(out))
}

/// Rewrites one server -> client frame for a client that speaks `client_version`.
/// Only v3 responses to a v4 client are changed: every frame, including EVENT pushes
/// on stream -1 and ERRORs, gets the v4 version byte; Prepared results get `pk_count`.
pub fn rewrite_response(mut frame: BytesMut, client_version: u8) -> Result<BytesMut, FrameError> {
    if client_version != CLIENT_VERSION || frame[OFF_VERSION] != (RESPONSE_BIT | SERVER_VERSION) {
        return Ok(frame);
    }
    frame[OFF_VERSION] = RESPONSE_BIT | CLIENT_VERSION;
    if frame[OFF_OPCODE] != opcode::RESULT {
        return Ok(frame);
    }
    if is_compressed(&frame) {
        return Err(FrameError::Compressed { what: "RESULT" });
    }
    let mut pos = response_body_start(&frame);
    let kind = read_i32(&frame, pos, "RESULT", "missing result kind")?;
    if kind != RESULT_KIND_PREPARED {
        return Ok(frame);
    }
    pos += 4;
    // <id: short bytes>
    let id_len = read_u16(&frame, pos, "Prepared", "missing statement id")? as usize;
    pos += 2 + id_len;
    // <metadata>: <flags int><columns_count int> -- v4's <pk_count int> goes here,
    // *before* the global table spec / column specs that v3 writes next.
    read_i32(&frame, pos, "Prepared", "missing metadata flags")?;
    pos += 4;
    read_i32(&frame, pos, "Prepared", "missing columns_count")?;
    pos += 4;
    let mut out = BytesMut::with_capacity(frame.len() + 4);
    out.extend_from_slice(&frame[..pos]);
    // pk_count = 0: no partition-key indexes known, so drivers skip token-aware routing
    // (irrelevant for the single local node behind this bridge).
    out.put_i32(0);
    out.extend_from_slice(&frame[pos..]);
    let len = out.len() - HEADER_LEN;
    set_body_len(&mut out, len);
    Ok(out)
}

/// Builds an ERROR response frame (`code`, message) in the given protocol version.
pub fn error_frame(version: u8, stream: i16, code: i32, message: &str) -> BytesMut {
    let msg = &message.as_bytes()[..message.len().min(u16::MAX as usize)];
    let mut out = BytesMut::with_capacity(HEADER_LEN + 6 + msg.len());
    out.put_u8(RESPONSE_BIT | version);
    out.put_u8(0);
    out.put_i16(stream);
    out.put_u8(opcode::ERROR);
    out.put_u32((6 + msg.len()) as u32);
    out.put_i32(code);
    out.put_u16(msg.len() as u16);
    out.extend_from_slice(msg);
    out
}

pub(super) fn read_u16(frame: &[u8], pos: usize, what: &'static str, detail: &'static str) -> Result<u16, FrameError> {
    frame.get(pos..pos + 2).map(|b| u16::from_be_bytes([b[0], b[1]])).ok_or(FrameError::Malformed { what, detail })
}

pub(super) fn read_i32(frame: &[u8], pos: usize, what: &'static str, detail: &'static str) -> Result<i32, FrameError> {
    frame
        .get(pos..pos + 4)
        .map(|b| i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
        .ok_or(FrameError::Malformed { what, detail })
}

/// Decodes a `[string map]`: `<n: short>` then n times `<key: string><value: string>`.
fn decode_string_map(body: &[u8]) -> Result<Vec<(String, String)>, FrameError> {
    const WHAT: &str = "STARTUP";
    let n = read_u16(body, 0, WHAT, "missing option count")? as usize;
    let mut pos = 2;
    let read_string = |pos: &mut usize| -> Result<String, FrameError> {
        let len = read_u16(body, *pos, WHAT, "truncated option")? as usize;
        let bytes = body
            .get(*pos + 2..*pos + 2 + len)
            .ok_or(FrameError::Malformed { what: WHAT, detail: "truncated option" })?;
        *pos += 2 + len;
        String::from_utf8(bytes.to_vec())
            .map_err(|_| FrameError::Malformed { what: WHAT, detail: "option is not UTF-8" })
    };
    let mut map = Vec::with_capacity(n);
    for _ in 0..n {
        let k = read_string(&mut pos)?;
        let v = read_string(&mut pos)?;
        map.push((k, v));
    }
    Ok(map)
}

fn encode_string_map(out: &mut BytesMut, map: &[(String, String)]) {
    out.put_u16(map.len() as u16);
    for (k, v) in map {
        out.put_u16(k.len() as u16);
        out.extend_from_slice(k.as_bytes());
        out.put_u16(v.len() as u16);
        out.extend_from_slice(v.as_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(version: u8, fl: u8, stream: i16, op: u8, body: &[u8]) -> BytesMut {
        let mut f = BytesMut::new();
        f.put_u8(version);
        f.put_u8(fl);
        f.put_i16(stream);
        f.put_u8(op);
        f.put_u32(body.len() as u32);
        f.extend_from_slice(body);
        f
    }

    fn startup_body(opts: &[(&str, &str)]) -> Vec<u8> {
        let owned: Vec<(String, String)> = opts.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let mut b = BytesMut::new();
        encode_string_map(&mut b, &owned);
        b.to_vec()
    }

    fn forwarded(r: Request) -> BytesMut {
        match r {
            Request::Forward(f) => f,
            Request::Reject(e) => panic!("unexpected reject: {e:?}"),
        }
    }

    fn rejected(r: Request) -> BytesMut {
        match r {
            Request::Reject(e) => e,
            Request::Forward(f) => panic!("unexpected forward: {f:?}"),
        }
    }

    /// RESULT Prepared body (v3 layout): kind, id, metadata, result metadata.
    fn prepared_body_v3(global_spec: bool) -> (Vec<u8>, usize) {
        let mut b = BytesMut::new();
        b.put_i32(RESULT_KIND_PREPARED);
        b.put_u16(3);
        b.extend_from_slice(b"\xAA\xBB\xCC");
        b.put_i32(if global_spec { 1 } else { 0 }); // flags: Global_tables_spec
        b.put_i32(1); // columns_count
        let insert_at = b.len();
        let put_str = |b: &mut BytesMut, s: &str| {
            b.put_u16(s.len() as u16);
            b.extend_from_slice(s.as_bytes());
        };
        // With one column, "global spec + column" and "per-column spec" are the same bytes.
        put_str(&mut b, "ks");
        put_str(&mut b, "tbl");
        put_str(&mut b, "id");
        b.put_u16(0x0009); // type int

        // Result metadata: flags=No_metadata(0x0004), columns_count=0.
        b.put_i32(4);
        b.put_i32(0);
        (b.to_vec(), insert_at)
    }

    #[test]
    fn split_waits_for_complete_header_and_body() {
        let f = frame(0x04, 0, 7, 0x07, b"hello");
        for cut in 0..f.len() {
            let mut buf = BytesMut::from(&f[..cut]);
            assert_eq!(split_frame(&mut buf).unwrap(), None, "cut at {cut}");
            buf.extend_from_slice(&f[cut..]);
            assert_eq!(split_frame(&mut buf).unwrap().unwrap(), f);
            assert!(buf.is_empty());
        }
    }

    #[test]
    fn split_yields_back_to_back_frames_one_by_one() {
        let a = frame(0x04, 0, 1, 0x05, b"");
        let b = frame(0x04, 0, 2, 0x07, b"xyz");
        let mut buf = BytesMut::new();
        buf.extend_from_slice(&a);
        buf.extend_from_slice(&b);
        buf.extend_from_slice(&b[..4]);
        assert_eq!(split_frame(&mut buf).unwrap().unwrap(), a);
        assert_eq!(split_frame(&mut buf).unwrap().unwrap(), b);
        assert_eq!(split_frame(&mut buf).unwrap(), None);
        assert_eq!(&buf[..], &b[..4]);
    }

    #[test]
    fn split_rejects_absurd_lengths() {
        let mut buf = BytesMut::from(&[0x04, 0, 0, 1, 7, 0xFF, 0xFF, 0xFF, 0xFF][..]);
        assert!(matches!(split_frame(&mut buf), Err(FrameError::TooLong { .. })));
    }

    #[test]
    fn request_version_is_lowered_and_body_kept() {
        let f = frame(0x04, 0, 300, 0x07, b"\x00\x00\x00\x01Q\x00\x01\x00");
        let out = forwarded(rewrite_request(f.clone()).unwrap());
        assert_eq!(out[0], 0x03);
        assert_eq!(&out[1..], &f[1..]);
    }

    #[test]
    fn startup_cql_version_is_rewritten_and_length_fixed() {
        let body = startup_body(&[("CQL_VERSION", "4.0.0"), ("DRIVER_NAME", "scylla-rust-driver")]);
        let out = forwarded(rewrite_request(frame(0x04, 0, 0, opcode::STARTUP, &body)).unwrap());
        assert_eq!(out[0], 0x03);
        assert_eq!(body_len(&out), out.len() - HEADER_LEN);
        let map = decode_string_map(&out[HEADER_LEN..]).unwrap();
        assert_eq!(
            map,
            vec![
                ("CQL_VERSION".into(), BRIDGE_CQL_VERSION.into()),
                ("DRIVER_NAME".into(), "scylla-rust-driver".into()),
            ]
        );
    }

    #[test]
    fn startup_without_cql_version_gets_one() {
        let body = startup_body(&[]);
        let out = forwarded(rewrite_request(frame(0x04, 0, 0, opcode::STARTUP, &body)).unwrap());
        let map = decode_string_map(&out[HEADER_LEN..]).unwrap();
        assert_eq!(map, vec![("CQL_VERSION".into(), BRIDGE_CQL_VERSION.into())]);
        assert_eq!(body_len(&out), out.len() - HEADER_LEN);
    }

    #[test]
    fn startup_with_compression_is_refused_with_v4_error() {
        let body = startup_body(&[("CQL_VERSION", "4.0.0"), ("COMPRESSION", "lz4")]);
        let err = rejected(rewrite_request(frame(0x04, 0, 5, opcode::STARTUP, &body)).unwrap());
        assert_eq!(err[0], 0x84);
        assert_eq!(stream(&err), 5);
        assert_eq!(err[OFF_OPCODE], opcode::ERROR);
        assert_eq!(read_i32(&err, HEADER_LEN, "", "").unwrap(), ERR_PROTOCOL);
        assert_eq!(body_len(&err), err.len() - HEADER_LEN);
    }

    #[test]
    fn custom_payload_requests_are_refused() {
        let err = rejected(rewrite_request(frame(0x04, flags::CUSTOM_PAYLOAD, 9, 0x07, b"x")).unwrap());
        assert_eq!(stream(&err), 9);
        assert_eq!(err[OFF_OPCODE], opcode::ERROR);
    }

    #[test]
    fn truncated_startup_is_an_error() {
        let f = frame(0x04, 0, 0, opcode::STARTUP, b"\x00\x01\x00\x05CQL");
        assert!(matches!(rewrite_request(f), Err(FrameError::Malformed { .. })));
    }

    #[test]
    fn non_v4_requests_pass_through() {
        let body = startup_body(&[("CQL_VERSION", "3.0.0")]);
        let f = frame(0x03, 0, 0, opcode::STARTUP, &body);
        assert_eq!(forwarded(rewrite_request(f.clone()).unwrap()), f);
    }

    #[test]
    fn responses_get_v4_version_including_events_and_errors() {
        for (stream_id, op) in [(-1i16, 0x0C), (3, opcode::ERROR), (4, 0x02), (5, 0x06)] {
            let f = frame(0x83, 0, stream_id, op, b"\x00\x00\x00\x01");
            let out = rewrite_response(f.clone(), CLIENT_VERSION).unwrap();
            assert_eq!(out[0], 0x84);
            assert_eq!(&out[1..], &f[1..]);
        }
    }

    #[test]
    fn responses_to_v3_clients_are_untouched() {
        let (body, _) = prepared_body_v3(true);
        let f = frame(0x83, 0, 1, opcode::RESULT, &body);
        assert_eq!(rewrite_response(f.clone(), 3).unwrap(), f);
    }

    #[test]
    fn non_prepared_results_only_change_version() {
        let mut body = BytesMut::new();
        body.put_i32(0x0002); // Rows
        body.put_i32(0x0004);
        body.put_i32(0);
        body.put_i32(0);
        let f = frame(0x83, 0, 1, opcode::RESULT, &body);
        let out = rewrite_response(f.clone(), CLIENT_VERSION).unwrap();
        assert_eq!(out[0], 0x84);
        assert_eq!(&out[1..], &f[1..]);
    }

    #[test]
    fn prepared_result_gets_pk_count_after_columns_count() {
        for global in [true, false] {
            let (body, insert_at) = prepared_body_v3(global);
            let f = frame(0x83, 0, 17, opcode::RESULT, &body);
            let out = rewrite_response(f, CLIENT_VERSION).unwrap();
            assert_eq!(out[0], 0x84);
            assert_eq!(stream(&out), 17);
            assert_eq!(body_len(&out), body.len() + 4);
            let at = HEADER_LEN + insert_at;
            assert_eq!(&out[HEADER_LEN..at], &body[..insert_at]);
            assert_eq!(&out[at..at + 4], &[0, 0, 0, 0]);
            assert_eq!(&out[at + 4..], &body[insert_at..]);
        }
    }

    #[test]
    fn traced_prepared_result_skips_tracing_id() {
        let (body, insert_at) = prepared_body_v3(true);
        let mut traced = vec![0x5A; 16];
        traced.extend_from_slice(&body);
        let f = frame(0x83, flags::TRACING, 2, opcode::RESULT, &traced);
        let out = rewrite_response(f, CLIENT_VERSION).unwrap();
        let at = HEADER_LEN + 16 + insert_at;
        assert_eq!(&out[HEADER_LEN..HEADER_LEN + 16], &[0x5A; 16]);
        assert_eq!(&out[at..at + 4], &[0, 0, 0, 0]);
        assert_eq!(body_len(&out), traced.len() + 4);
    }

    #[test]
    fn truncated_prepared_result_is_an_error() {
        let (body, insert_at) = prepared_body_v3(false);
        let f = frame(0x83, 0, 1, opcode::RESULT, &body[..insert_at - 2]);
        assert!(matches!(rewrite_response(f, CLIENT_VERSION), Err(FrameError::Malformed { .. })));
    }

    #[test]
    fn compressed_result_is_an_error() {
        let f = frame(0x83, flags::COMPRESSION, 1, opcode::RESULT, b"\x00\x00\x00\x04");
        assert!(matches!(rewrite_response(f, CLIENT_VERSION), Err(FrameError::Compressed { .. })));
    }

    #[test]
    fn error_frame_layout() {
        let e = error_frame(4, -7, ERR_SERVER, "boom");
        assert_eq!(&e[..], b"\x84\x00\xff\xf9\x00\x00\x00\x00\x0a\x00\x00\x00\x00\x00\x04boom");
    }
}
