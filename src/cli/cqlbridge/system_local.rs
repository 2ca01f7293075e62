//! Patch for the driver's topology query (pure, no I/O).
//!
//! The `scylla` crate learns the cluster from
//! `SELECT host_id, rpc_address, ... FROM system.local WHERE key='local'`, but Cassandra
//! 2.1.0's `system.local` has no `rpc_address` column, so the query fails, the driver
//! falls back to dummy topology and then fails every DDL statement
//! (`MetadataError(Peers(EmptyPeers))` from the refresh that follows a schema change).
//!
//! The bridge therefore drops `rpc_address` from such a selection on the way up and
//! re-inserts it, at its original position, into the Rows result on the way down, with
//! the address the client used to reach the bridge (so the driver keeps talking to the
//! bridge, never directly to Cassandra).

use std::net::IpAddr;

use bytes::{BufMut, BytesMut};

use super::frame::{self, read_i32, read_u16, set_body_len, FrameError, HEADER_LEN};

const COLUMN: &str = "rpc_address";
const TABLE: &str = "system.local";
/// `[option]` id of the `inet` type.
const TYPE_INET: u16 = 0x0010;

/// Rows metadata flags.
const GLOBAL_TABLES_SPEC: i32 = 0x0001;
const HAS_MORE_PAGES: i32 = 0x0002;
const NO_METADATA: i32 = 0x0004;

/// If `query` selects `rpc_address` from `system.local`, returns the query without
/// that column and the column's index in the selection.
pub fn strip_rpc_address(query: &str) -> Option<(String, usize)> {
    let trimmed = query.trim_start();
    let lower = trimmed.to_ascii_lowercase();
    let after_select = lower.strip_prefix("select")?;
    if !after_select.starts_with(char::is_whitespace) {
        return None;
    }
    let select_end = "select".len();
    let from = find_word(&lower, "from", select_end)?;
    let table = lower[from + 4..].trim_start().split(|c: char| c.is_whitespace() || c == ';').next()?;
    if table != TABLE {
        return None;
    }
    let mut columns: Vec<&str> = trimmed[select_end..from].split(',').map(str::trim).collect();
    let index = columns.iter().position(|c| c.eq_ignore_ascii_case(COLUMN))?;
    if columns.len() == 1 {
        return None; // nothing left to select; let the server report the error
    }
    columns.remove(index);
    Some((format!("SELECT {} {}", columns.join(", "), &trimmed[from..]), index))
}

/// First occurrence of `word` at or after `start`, delimited by whitespace.
fn find_word(haystack: &str, word: &str, start: usize) -> Option<usize> {
    let bytes = haystack.as_bytes();
    haystack[start..].match_indices(word).map(|(i, _)| start + i).find(|&i| {
        bytes[i - 1].is_ascii_whitespace() && bytes.get(i + word.len()).is_some_and(|b| b.is_ascii_whitespace())
    })
}

/// Rewrites a QUERY or PREPARE request frame (already v3) whose query string selects
/// `rpc_address` from `system.local`. Both bodies start with the query `[long string]`;
/// the rest (QUERY parameters) is kept. Returns the new frame and the column index.
pub fn rewrite_query(frame: &[u8]) -> Result<Option<(BytesMut, usize)>, FrameError> {
    const WHAT: &str = "QUERY/PREPARE";
    let len = read_i32(frame, HEADER_LEN, WHAT, "missing query string")?;
    let start = HEADER_LEN + 4;
    let Some(text) = usize::try_from(len).ok().and_then(|len| frame.get(start..start + len)) else {
        return Err(FrameError::Malformed { what: WHAT, detail: "truncated query string" });
    };
    let Ok(query) = std::str::from_utf8(text) else {
        return Ok(None);
    };
    let Some((new_query, index)) = strip_rpc_address(query) else {
        return Ok(None);
    };
    let rest = &frame[start + text.len()..];
    let mut out = BytesMut::with_capacity(HEADER_LEN + 4 + new_query.len() + rest.len());
    out.extend_from_slice(&frame[..HEADER_LEN]);
    out.put_i32(new_query.len() as i32);
    out.extend_from_slice(new_query.as_bytes());
    out.extend_from_slice(rest);
    let body = out.len() - HEADER_LEN;
    set_body_len(&mut out, body);
    Ok(Some((out, index)))
}

/// The prepared statement id an EXECUTE request frame refers to.
pub fn execute_id(frame: &[u8]) -> Result<&[u8], FrameError> {
    let malformed = FrameError::Malformed { what: "EXECUTE", detail: "truncated statement id" };
    let len = read_u16(frame, HEADER_LEN, "EXECUTE", "missing statement id")? as usize;
    frame.get(HEADER_LEN + 2..HEADER_LEN + 2 + len).ok_or(malformed)
}

/// Where things are in a `<metadata>` block.
struct Layout {
    /// Offset of `columns_count`.
    count_at: usize,
    columns: usize,
    /// Where a column spec for column `index` goes; `None` with the No_metadata flag.
    spec_insert_at: Option<usize>,
    /// Whether column specs carry their own keyspace/table.
    global: bool,
    /// End of the block.
    end: usize,
}

/// Parses the metadata block at `pos`. `with_pk` for a v4 prepared statement's bind
/// metadata (has `pk_count` + indexes after `columns_count`).
fn layout(buf: &[u8], pos: usize, index: usize, with_pk: bool) -> Result<Layout, FrameError> {
    const WHAT: &str = "result metadata";
    let malformed = |detail| FrameError::Malformed { what: WHAT, detail };
    let flags = read_i32(buf, pos, WHAT, "missing flags")?;
    let count_at = pos + 4;
    let columns = read_i32(buf, count_at, WHAT, "missing columns_count")?;
    let columns = usize::try_from(columns).map_err(|_| malformed("negative columns_count"))?;
    let mut pos = count_at + 4;
    if with_pk {
        let pks = read_i32(buf, pos, WHAT, "missing pk_count")?;
        pos += 4 + 2 * usize::try_from(pks).map_err(|_| malformed("negative pk_count"))?;
    }
    if flags & HAS_MORE_PAGES != 0 {
        pos = skip_bytes(buf, pos).ok_or(malformed("truncated paging state"))?;
    }
    let global = flags & GLOBAL_TABLES_SPEC != 0;
    if flags & NO_METADATA != 0 {
        return Ok(Layout { count_at, columns, spec_insert_at: None, global, end: pos });
    }
    if global {
        pos = skip_string(buf, pos).ok_or(malformed("truncated table spec"))?;
        pos = skip_string(buf, pos).ok_or(malformed("truncated table spec"))?;
    }
    let mut spec_insert_at = pos;
    for i in 0..columns {
        if i == index {
            spec_insert_at = pos;
        }
        if !global {
            pos = skip_string(buf, pos).ok_or(malformed("truncated column spec"))?;
            pos = skip_string(buf, pos).ok_or(malformed("truncated column spec"))?;
        }
        pos = skip_string(buf, pos).ok_or(malformed("truncated column spec"))?;
        pos = skip_type(buf, pos, 0).ok_or(malformed("bad column type"))?;
    }
    if index >= columns {
        spec_insert_at = pos;
    }
    Ok(Layout { count_at, columns, spec_insert_at: Some(spec_insert_at), global, end: pos })
}

/// Copies `buf[from..to]` to `out`, inserting the `rpc_address inet` column spec
/// described by `l` and bumping its `columns_count`.
fn copy_with_spec(out: &mut BytesMut, buf: &[u8], from: usize, l: &Layout) {
    let count_in_out = out.len() + (l.count_at - from);
    match l.spec_insert_at {
        Some(at) => {
            out.extend_from_slice(&buf[from..at]);
            if !l.global {
                put_string(out, "system");
                put_string(out, "local");
            }
            put_string(out, COLUMN);
            out.put_u16(TYPE_INET);
            out.extend_from_slice(&buf[at..l.end]);
        }
        None => out.extend_from_slice(&buf[from..l.end]),
    }
    out[count_in_out..count_in_out + 4].copy_from_slice(&((l.columns + 1) as i32).to_be_bytes());
}

fn finish(mut out: BytesMut) -> BytesMut {
    let body = out.len() - HEADER_LEN;
    set_body_len(&mut out, body);
    out
}

/// Inserts an `rpc_address inet` column holding `addr` at `index` into a RESULT Rows
/// frame (spec only if the result carries metadata). Other results pass unchanged.
pub fn insert_rpc_address(frame: BytesMut, index: usize, addr: IpAddr) -> Result<BytesMut, FrameError> {
    const WHAT: &str = "RESULT Rows";
    let malformed = |detail| FrameError::Malformed { what: WHAT, detail };
    if frame::is_compressed(&frame) {
        return Err(FrameError::Compressed { what: WHAT });
    }
    let pos = frame::response_body_start(&frame);
    if read_i32(&frame, pos, WHAT, "missing kind")? != frame::RESULT_KIND_ROWS {
        return Ok(frame);
    }
    let l = layout(&frame, pos + 4, index, false)?;
    if index > l.columns {
        return Ok(frame); // not the shape we rewrote; leave it alone
    }
    let rows = read_i32(&frame, l.end, WHAT, "missing rows_count")?;
    let rows = usize::try_from(rows).map_err(|_| malformed("negative rows_count"))?;
    let value: Vec<u8> = match addr {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    };
    let mut out = BytesMut::with_capacity(frame.len() + 64 + rows * (4 + value.len()));
    copy_with_spec(&mut out, &frame, 0, &l);
    out.extend_from_slice(&frame[l.end..l.end + 4]);
    let mut pos = l.end + 4;
    for _ in 0..rows {
        for i in 0..=l.columns {
            if i == index {
                out.put_i32(value.len() as i32);
                out.extend_from_slice(&value);
            }
            if i < l.columns {
                let end = skip_bytes(&frame, pos).ok_or(malformed("truncated row"))?;
                out.extend_from_slice(&frame[pos..end]);
                pos = end;
            }
        }
    }
    out.extend_from_slice(&frame[pos..]);
    Ok(finish(out))
}

/// For a RESULT Prepared frame (already in v4 layout, i.e. with `pk_count`) of a query
/// whose `rpc_address` was stripped: inserts the column into the result metadata and
/// returns the statement id, so EXECUTEs of it can be patched. Other results: `None`.
pub fn patch_prepared(frame: BytesMut, index: usize) -> Result<(BytesMut, Option<Vec<u8>>), FrameError> {
    const WHAT: &str = "RESULT Prepared";
    if frame::is_compressed(&frame) {
        return Err(FrameError::Compressed { what: WHAT });
    }
    let pos = frame::response_body_start(&frame);
    if read_i32(&frame, pos, WHAT, "missing kind")? != frame::RESULT_KIND_PREPARED {
        return Ok((frame, None));
    }
    let id_len = read_u16(&frame, pos + 4, WHAT, "missing id")? as usize;
    let id_start = pos + 6;
    let id = frame
        .get(id_start..id_start + id_len)
        .ok_or(FrameError::Malformed { what: WHAT, detail: "truncated id" })?
        .to_vec();
    let bind = layout(&frame, id_start + id_len, usize::MAX, true)?;
    let result = layout(&frame, bind.end, index, false)?;
    if index > result.columns {
        return Ok((frame, None));
    }
    let mut out = BytesMut::with_capacity(frame.len() + 32);
    out.extend_from_slice(&frame[..bind.end]);
    copy_with_spec(&mut out, &frame, bind.end, &result);
    out.extend_from_slice(&frame[result.end..]);
    Ok((finish(out), Some(id)))
}

fn put_string(out: &mut BytesMut, s: &str) {
    out.put_u16(s.len() as u16);
    out.extend_from_slice(s.as_bytes());
}

/// End of a `[string]` starting at `pos`.
fn skip_string(buf: &[u8], pos: usize) -> Option<usize> {
    let len = read_u16(buf, pos, "", "").ok()? as usize;
    let end = pos + 2 + len;
    (end <= buf.len()).then_some(end)
}

/// End of a `[bytes]` starting at `pos` (negative length = null, no content).
fn skip_bytes(buf: &[u8], pos: usize) -> Option<usize> {
    let len = read_i32(buf, pos, "", "").ok()?;
    let end = pos + 4 + usize::try_from(len).unwrap_or(0);
    (end <= buf.len()).then_some(end)
}

/// End of an `[option]` (column type) starting at `pos`.
fn skip_type(buf: &[u8], pos: usize, depth: u8) -> Option<usize> {
    if depth > 32 {
        return None;
    }
    let id = read_u16(buf, pos, "", "").ok()?;
    let pos = pos + 2;
    match id {
        0x0000 => skip_string(buf, pos),                   // custom: class name
        0x0020 | 0x0022 => skip_type(buf, pos, depth + 1), // list, set
        0x0021 => skip_type(buf, skip_type(buf, pos, depth + 1)?, depth + 1), // map
        0x0030 => {
            // UDT: keyspace, name, n fields of (name, type)
            let mut p = skip_string(buf, skip_string(buf, pos)?)?;
            let n = read_u16(buf, p, "", "").ok()?;
            p += 2;
            for _ in 0..n {
                p = skip_type(buf, skip_string(buf, p)?, depth + 1)?;
            }
            Some(p)
        }
        0x0031 => {
            // tuple: n types
            let n = read_u16(buf, pos, "", "").ok()?;
            let mut p = pos + 2;
            for _ in 0..n {
                p = skip_type(buf, p, depth + 1)?;
            }
            Some(p)
        }
        _ => (pos <= buf.len()).then_some(pos),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    const DRIVER_QUERY: &str =
        "SELECT host_id, rpc_address, data_center, rack, tokens, cluster_name FROM system.local WHERE key='local'";

    #[test]
    fn strips_rpc_address_from_driver_query() {
        let (q, i) = strip_rpc_address(DRIVER_QUERY).unwrap();
        assert_eq!(q, "SELECT host_id, data_center, rack, tokens, cluster_name FROM system.local WHERE key='local'");
        assert_eq!(i, 1);
    }

    #[test]
    fn leaves_other_queries_alone() {
        for q in [
            "SELECT host_id, rpc_address, data_center, rack, tokens FROM system.peers",
            "SELECT schema_version FROM system.local WHERE key='local'",
            "SELECT rpc_address FROM system.local",
            "SELECT * FROM system.local",
            "INSERT INTO ks.t (rpc_address) VALUES (?)",
            "SELECT rpc_address, x FROM system.localx",
            "selectrpc_address from system.local",
        ] {
            assert_eq!(strip_rpc_address(q), None, "{q}");
        }
        let (q, i) = strip_rpc_address("select RPC_ADDRESS,host_id\tfrom  system.local;").unwrap();
        assert_eq!((q.as_str(), i), ("SELECT host_id from  system.local;", 0));
    }

    fn query_frame(q: &str, tail: &[u8]) -> BytesMut {
        let mut f = BytesMut::new();
        f.extend_from_slice(&[0x03, 0, 0, 5, 0x07, 0, 0, 0, 0]);
        f.put_i32(q.len() as i32);
        f.extend_from_slice(q.as_bytes());
        f.extend_from_slice(tail);
        let n = f.len() - HEADER_LEN;
        set_body_len(&mut f, n);
        f
    }

    #[test]
    fn query_frame_is_rewritten_keeping_parameters() {
        let tail = b"\x00\x01\x04\x00\x00\x13\x88"; // consistency ONE, flags page_size, 5000
        let out = rewrite_query(&query_frame(DRIVER_QUERY, tail)).unwrap().unwrap();
        let (expected, _) = strip_rpc_address(DRIVER_QUERY).unwrap();
        assert_eq!(out.0, query_frame(&expected, tail));
        assert_eq!(out.1, 1);
        assert_eq!(rewrite_query(&query_frame("SELECT 1 FROM x", tail)).unwrap(), None);
    }

    /// Rows result for columns (host_id uuid, tokens set<text>) and `rows` rows.
    fn rows_frame(global: bool, rows: usize, paging: bool) -> BytesMut {
        let mut b = BytesMut::new();
        b.put_i32(frame::RESULT_KIND_ROWS);
        b.put_i32(if global { GLOBAL_TABLES_SPEC } else { 0 } | if paging { HAS_MORE_PAGES } else { 0 });
        b.put_i32(2);
        if paging {
            b.put_i32(3);
            b.extend_from_slice(b"pgs");
        }
        let spec = |b: &mut BytesMut, name: &str| {
            if !global {
                put_string(b, "system");
                put_string(b, "local");
            }
            put_string(b, name);
        };
        if global {
            put_string(&mut b, "system");
            put_string(&mut b, "local");
        }
        spec(&mut b, "host_id");
        b.put_u16(0x000C);
        spec(&mut b, "tokens");
        b.put_u16(0x0022);
        b.put_u16(0x000D);
        b.put_i32(rows as i32);
        for r in 0..rows {
            b.put_i32(16);
            b.extend_from_slice(&[r as u8; 16]);
            b.put_i32(-1); // null tokens
        }
        let mut f = BytesMut::new();
        f.extend_from_slice(&[0x83, 0, 0, 5, 0x08]);
        f.put_u32(b.len() as u32);
        f.extend_from_slice(&b);
        f
    }

    #[test]
    fn rows_get_rpc_address_at_index() {
        let addr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1));
        for global in [true, false] {
            for paging in [true, false] {
                for index in 0..=2 {
                    let f = rows_frame(global, 2, paging);
                    let out = insert_rpc_address(f.clone(), index, addr).unwrap();
                    assert_eq!(frame::body_len(&out), out.len() - HEADER_LEN);
                    // Expected: build the same result with three columns by hand.
                    let mut cols: Vec<(&str, Vec<u8>)> =
                        vec![("host_id", vec![0x00, 0x0C]), ("tokens", vec![0x00, 0x22, 0x00, 0x0D])];
                    cols.insert(index, (COLUMN, vec![0x00, 0x10]));
                    let mut b = BytesMut::new();
                    b.put_i32(frame::RESULT_KIND_ROWS);
                    b.put_i32(if global { GLOBAL_TABLES_SPEC } else { 0 } | if paging { HAS_MORE_PAGES } else { 0 });
                    b.put_i32(3);
                    if paging {
                        b.put_i32(3);
                        b.extend_from_slice(b"pgs");
                    }
                    if global {
                        put_string(&mut b, "system");
                        put_string(&mut b, "local");
                    }
                    for (name, typ) in &cols {
                        if !global {
                            put_string(&mut b, "system");
                            put_string(&mut b, "local");
                        }
                        put_string(&mut b, name);
                        b.extend_from_slice(typ);
                    }
                    b.put_i32(2);
                    for r in 0..2u8 {
                        let mut cells: Vec<Vec<u8>> =
                            vec![[&16i32.to_be_bytes()[..], &[r; 16]].concat(), (-1i32).to_be_bytes().to_vec()];
                        cells.insert(index, vec![0, 0, 0, 4, 127, 0, 0, 1]);
                        for c in cells {
                            b.extend_from_slice(&c);
                        }
                    }
                    assert_eq!(&out[HEADER_LEN..], &b[..], "global={global} paging={paging} index={index}");
                }
            }
        }
    }

    #[test]
    fn non_rows_results_and_bad_index_pass_through() {
        let addr = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let void = BytesMut::from(&[0x83, 0, 0, 5, 0x08, 0, 0, 0, 4, 0, 0, 0, 1][..]);
        assert_eq!(insert_rpc_address(void.clone(), 0, addr).unwrap(), void);
        let f = rows_frame(true, 1, false);
        assert_eq!(insert_rpc_address(f.clone(), 7, addr).unwrap(), f);
    }

    #[test]
    fn truncated_rows_are_an_error() {
        let f = rows_frame(true, 2, false);
        let cut = BytesMut::from(&f[..f.len() - 6]);
        assert!(insert_rpc_address(cut, 1, IpAddr::V4(Ipv4Addr::LOCALHOST)).is_err());
    }

    #[test]
    fn rows_without_metadata_get_value_and_count_only() {
        let mut b = BytesMut::new();
        b.put_i32(frame::RESULT_KIND_ROWS);
        b.put_i32(NO_METADATA);
        b.put_i32(1);
        b.put_i32(1);
        b.put_i32(2);
        b.extend_from_slice(b"ab");
        let mut f = BytesMut::from(&[0x84, 0, 0, 1, 0x08][..]);
        f.put_u32(b.len() as u32);
        f.extend_from_slice(&b);
        let out = insert_rpc_address(f, 1, IpAddr::V4(Ipv4Addr::LOCALHOST)).unwrap();
        assert_eq!(
            &out[HEADER_LEN..],
            b"\x00\x00\x00\x02\x00\x00\x00\x04\x00\x00\x00\x02\x00\x00\x00\x01\x00\x00\x00\x02ab\x00\x00\x00\x04\x7f\x00\x00\x01"
        );
        assert_eq!(frame::body_len(&out), out.len() - HEADER_LEN);
    }

    /// v4 Prepared body: id "ID", bind metadata with one pk (`key`), result metadata
    /// (global spec) with `host_id`; `extra` adds rpc_address to the result columns.
    fn prepared_frame(extra: bool) -> BytesMut {
        let mut b = BytesMut::new();
        b.put_i32(0x0004);
        put_string(&mut b, "ID");
        b.put_i32(GLOBAL_TABLES_SPEC);
        b.put_i32(1);
        b.put_i32(1); // pk_count
        b.put_u16(0); // pk index
        put_string(&mut b, "system");
        put_string(&mut b, "local");
        put_string(&mut b, "key");
        b.put_u16(0x000D);
        b.put_i32(GLOBAL_TABLES_SPEC);
        b.put_i32(if extra { 2 } else { 1 });
        put_string(&mut b, "system");
        put_string(&mut b, "local");
        if extra {
            put_string(&mut b, COLUMN);
            b.put_u16(TYPE_INET);
        }
        put_string(&mut b, "host_id");
        b.put_u16(0x000C);
        let mut f = BytesMut::from(&[0x84, 0, 0, 1, 0x08][..]);
        f.put_u32(b.len() as u32);
        f.extend_from_slice(&b);
        f
    }

    #[test]
    fn prepared_result_metadata_gets_the_column_and_id_is_returned() {
        let (out, id) = patch_prepared(prepared_frame(false), 0).unwrap();
        assert_eq!(id.as_deref(), Some(&b"ID"[..]));
        assert_eq!(out, prepared_frame(true));
        let rows = rows_frame(true, 1, false);
        assert_eq!(patch_prepared(rows.clone(), 0).unwrap(), (rows, None));
    }

    #[test]
    fn execute_id_reads_short_bytes() {
        let f = BytesMut::from(&b"\x03\x00\x00\x01\x0a\x00\x00\x00\x06\x00\x02IDxx"[..]);
        assert_eq!(execute_id(&f).unwrap(), b"ID");
        assert!(execute_id(&f[..11]).is_err());
    }

    #[test]
    fn skips_nested_types() {
        // map<text, frozen<tuple<int, list<udt{a: int}>>>>
        let mut b = BytesMut::new();
        b.put_u16(0x0021);
        b.put_u16(0x000D);
        b.put_u16(0x0031);
        b.put_u16(2);
        b.put_u16(0x0009);
        b.put_u16(0x0020);
        b.put_u16(0x0030);
        put_string(&mut b, "ks");
        put_string(&mut b, "u");
        b.put_u16(1);
        put_string(&mut b, "a");
        b.put_u16(0x0009);
        let end = b.len();
        b.put_u16(0xFFFF);
        assert_eq!(skip_type(&b, 0, 0), Some(end));
        assert_eq!(skip_type(&b[..end - 1], 0, 0), None);
    }
}
