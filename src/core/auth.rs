//! API keys and who a caller is: the pure part of the HTTP API's authentication.
//!
//! A key is `fwk_<id>_<secret>`: `id` (16 hex digits) names the key in listings and
//! revocations, `secret` (64 hex digits, 32 random bytes) is only ever shown once, at
//! creation. The store keeps the SHA-256 of the secret, never the secret; a presented key
//! is checked by hashing its secret and comparing in constant time. An unknown id is
//! compared against a dummy hash with the same work, so unknown and wrong keys cost the
//! same. (A fast hash is right here: the secret has 256 random bits, nothing to brute
//! force, unlike a password.)

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// Who is calling: what the API's handlers authorize against.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Caller {
    /// An admin key (or `api.auth = "off"`): every tenant, every endpoint.
    Admin,
    /// A tenant key: that tenant's jobs only.
    Tenant(String),
}

impl Caller {
    pub fn is_admin(&self) -> bool {
        matches!(self, Caller::Admin)
    }
    /// May this caller submit jobs for `tenant`?
    pub fn may_act_for(&self, tenant: &str) -> bool {
        match self {
            Caller::Admin => true,
            Caller::Tenant(t) => t == tenant,
        }
    }
    /// May this caller see (read, cancel) a job owned by `owner` (None: owner unknown)?
    pub fn may_see(&self, owner: Option<&str>) -> bool {
        match (self, owner) {
            (Caller::Admin, _) => true,
            (Caller::Tenant(t), Some(o)) => t == o,
            (Caller::Tenant(_), None) => false,
        }
    }
    /// The tenant a tenant key is bound to.
    pub fn tenant(&self) -> Option<&str> {
        match self {
            Caller::Admin => None,
            Caller::Tenant(t) => Some(t),
        }
    }
    /// Role column value: "admin" or "tenant".
    pub fn role(&self) -> &'static str {
        match self {
            Caller::Admin => "admin",
            Caller::Tenant(_) => "tenant",
        }
    }
    /// From the stored role and tenant columns (None: a row this version cannot read).
    pub fn from_role(role: &str, tenant: Option<&str>) -> Option<Caller> {
        match (role, tenant) {
            ("admin", _) => Some(Caller::Admin),
            ("tenant", Some(t)) if !t.is_empty() => Some(Caller::Tenant(t.to_string())),
            _ => None,
        }
    }
}

impl std::fmt::Display for Caller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Caller::Admin => f.write_str("admin"),
            Caller::Tenant(t) => write!(f, "tenant {t}"),
        }
    }
}

pub const KEY_PREFIX: &str = "fwk_";
const ID_HEX: usize = 16;
const SECRET_HEX: usize = 64;

/// A freshly made key: `token` is shown to the user once, `hash` is stored.
#[derive(Debug)]
pub struct NewKey {
    pub id: String,
    pub token: String,
    pub hash: [u8; 32],
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A key from 40 random bytes (8 for the id, 32 for the secret).
pub fn new_key(random: [u8; 40]) -> NewKey {
    let id = hex(&random[..8]);
    let secret = hex(&random[8..]);
    let hash = hash_secret(&secret);
    NewKey { token: format!("{KEY_PREFIX}{id}_{secret}"), id, hash }
}

pub fn hash_secret(secret: &str) -> [u8; 32] {
    Sha256::digest(secret.as_bytes()).into()
}

/// Splits a presented key into (id, secret); None if it is not shaped like a key.
pub fn parse_token(token: &str) -> Option<(&str, &str)> {
    let rest = token.strip_prefix(KEY_PREFIX)?;
    let (id, secret) = rest.split_once('_')?;
    let ok = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_hexdigit());
    (ok(id, ID_HEX) && ok(secret, SECRET_HEX)).then_some((id, secret))
}

/// What the store knows about a key, as far as checking it goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyRecord {
    pub id: String,
    pub hash: Vec<u8>,
    pub caller: Option<Caller>,
    pub revoked: bool,
}

const DUMMY_HASH: [u8; 32] = [0x5a; 32];

/// Checks `secret` against `record` (None: the id is unknown). Same work either way:
/// always one SHA-256 and one constant-time comparison of 32 bytes.
pub fn verify(secret: &str, record: Option<&KeyRecord>) -> Option<Caller> {
    let presented = hash_secret(secret);
    let stored: &[u8] = match record {
        Some(r) if r.hash.len() == 32 => &r.hash,
        _ => &DUMMY_HASH,
    };
    let equal: bool = presented.ct_eq(stored).into();
    let r = record?;
    if !equal || r.revoked || r.hash.len() != 32 {
        return None;
    }
    r.caller.clone()
}

/// The bearer token of an `Authorization` header value (scheme case-insensitive).
pub fn bearer(header: &str) -> Option<&str> {
    let (scheme, token) = header.trim().split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim()).filter(|t| !t.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(k: &NewKey, caller: Caller) -> KeyRecord {
        KeyRecord { id: k.id.clone(), hash: k.hash.to_vec(), caller: Some(caller), revoked: false }
    }

    #[test]
    fn a_key_verifies_and_only_it() {
        let k = new_key([7; 40]);
        let (id, secret) = parse_token(&k.token).expect("well formed");
        assert_eq!(id, k.id);
        let r = record(&k, Caller::Tenant("acme".into()));
        assert_eq!(verify(secret, Some(&r)), Some(Caller::Tenant("acme".into())));
        let other = new_key([8; 40]);
        let (_, wrong) = parse_token(&other.token).unwrap();
        assert_eq!(verify(wrong, Some(&r)), None, "wrong secret");
        assert_eq!(verify(secret, None), None, "unknown id");
        assert_eq!(verify(secret, Some(&KeyRecord { revoked: true, ..r.clone() })), None, "revoked");
        assert_eq!(verify(secret, Some(&KeyRecord { caller: None, ..r })), None, "unreadable role");
        assert!(!k.token.contains(&hex(&k.hash)), "the stored hash is not the key");
    }

    #[test]
    fn tokens_and_headers_parse_strictly() {
        let k = new_key([1; 40]);
        assert!(parse_token(&k.token).is_some());
        assert!(parse_token(&k.token[1..]).is_none());
        assert!(parse_token(&format!("{}x", k.token)).is_none());
        assert!(parse_token("fwk_zz_zz").is_none());
        assert_eq!(bearer(&format!("Bearer {}", k.token)), Some(k.token.as_str()));
        assert_eq!(bearer(&format!("bearer  {} ", k.token)), Some(k.token.as_str()));
        assert_eq!(bearer("Basic abc"), None);
        assert_eq!(bearer("Bearer "), None);
    }

    #[test]
    fn scoping() {
        let a = Caller::Tenant("a".into());
        assert!(a.may_act_for("a") && !a.may_act_for("b"));
        assert!(a.may_see(Some("a")) && !a.may_see(Some("b")) && !a.may_see(None));
        assert!(Caller::Admin.may_act_for("b") && Caller::Admin.may_see(None));
        assert_eq!(Caller::from_role("tenant", Some("a")), Some(a));
        assert_eq!(Caller::from_role("tenant", None), None);
        assert_eq!(Caller::from_role("admin", None), Some(Caller::Admin));
        assert_eq!(Caller::from_role("root", None), None);
    }
}
