//! Bearer tokens and roles.
//!
//! Tokens come from a file (`tollgate serve --auth-file PATH`, reloaded on SIGHUP) or from
//! the environment (`TOLLGATE_AUTH_TOKENS`), one `name:token:role` entry per line:
//!
//! ```text
//! # name      token                              role
//! gateway-eu:3f9c1e7a0b8d4c2e9f1a6b5d7c3e8f20:client
//! ops:9d2b7c4e1f0a8b3c6d5e2f1a0b9c8d7e:admin
//! ```
//!
//! - `name` is the **principal**: it is recorded in the access log of every request the token
//!   makes (and is what administration is attributed to); letters, digits, `_ . -`, at most
//!   64 characters, unique in the file.
//! - `token` is the secret a client sends as `Authorization: Bearer TOKEN`: at least
//!   [`MIN_TOKEN_LEN`] visible ASCII characters without `:`, `,` or `#`, unique in the file.
//! - `role` is `client` (acquire, leases, availability) or `admin` (everything a client may do,
//!   plus limits and entities, and per-call limit overrides).
//!
//! Blank lines and lines starting with `#` are ignored. In the environment variable, entries
//! may also be separated by commas or spaces.
//!
//! Presented tokens are compared in constant time ([`subtle`]) against SHA-256 digests of
//! the configured ones, so neither the comparison nor the token's length leaks through
//! timing, and the plaintext tokens are not kept in memory.

use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock, RwLock};

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// Shortest token accepted (characters).
pub const MIN_TOKEN_LEN: usize = 16;

/// Longest principal name accepted (characters).
pub const MAX_NAME_LEN: usize = 64;

/// What a token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Role {
    /// Acquire, leases, availability.
    Client,
    /// Everything: limits, entities, and what a client may do; may send per-call limits.
    Admin,
}

impl Role {
    /// The role's name in the token file.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Client => "client",
            Role::Admin => "admin",
        }
    }

    /// Whether this role may use a route that needs `needed`.
    pub fn allows(self, needed: Role) -> bool {
        self >= needed
    }
}

impl std::str::FromStr for Role {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "client" => Ok(Role::Client),
            "admin" => Ok(Role::Admin),
            other => Err(format!("unknown role {other:?} (client or admin)")),
        }
    }
}

/// Who made a request; in the request's extensions for every handler.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// The token's name, or `anonymous` when authentication is off.
    pub name: Arc<str>,
    /// The token's role (`Admin` when authentication is off: every route is open).
    pub role: Role,
    /// Whether a token proved this identity (false when authentication is off).
    pub authenticated: bool,
}

impl Principal {
    /// The principal of every request when authentication is off.
    pub fn anonymous() -> Self {
        static ANONYMOUS: LazyLock<Arc<str>> = LazyLock::new(|| Arc::from("anonymous"));
        Principal {
            name: Arc::clone(&ANONYMOUS),
            role: Role::Admin,
            authenticated: false,
        }
    }

    /// A caller without a (known) token on a public route.
    pub fn unauthenticated() -> Self {
        static UNAUTHENTICATED: LazyLock<Arc<str>> = LazyLock::new(|| Arc::from("-"));
        Principal {
            name: Arc::clone(&UNAUTHENTICATED),
            role: Role::Client,
            authenticated: false,
        }
    }

    /// Whether this caller may send per-call limits in an acquire: an authenticated admin,
    /// or anyone when `allowed` (`--allow-limit-overrides`).
    pub fn may_override_limits(&self, allowed: bool) -> bool {
        allowed || (self.authenticated && self.role == Role::Admin)
    }
}

/// A token file that could not be read or parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// The file could not be read.
    #[error("cannot read the auth file {path}: {reason}")]
    Read {
        /// The path.
        path: String,
        /// Why.
        reason: String,
    },
    /// An entry is malformed.
    #[error("{origin}, entry {entry}: {reason}")]
    Entry {
        /// The file (`path:line`) or `TOLLGATE_AUTH_TOKENS`.
        origin: String,
        /// The entry as written, with the token masked.
        entry: String,
        /// What is wrong.
        reason: String,
    },
    /// No entry at all.
    #[error("{0}: no tokens (expected name:token:role entries)")]
    Empty(String),
}

#[derive(Debug, Clone)]
struct Entry {
    name: Arc<str>,
    digest: [u8; 32],
    role: Role,
}

/// A parsed set of tokens.
#[derive(Debug, Clone, Default)]
pub struct TokenSet {
    entries: Vec<Entry>,
}

fn digest(token: &[u8]) -> [u8; 32] {
    let d = Sha256::digest(token);
    let mut out = [0u8; 32];
    out.copy_from_slice(&d);
    out
}

fn mask(entry: &str) -> String {
    let mut parts = entry.splitn(3, ':');
    let name = parts.next().unwrap_or_default();
    match (parts.next(), parts.next()) {
        (Some(_), Some(role)) => format!("{name}:***:{role}"),
        (Some(_), None) => format!("{name}:***"),
        _ => name.chars().take(MAX_NAME_LEN).collect(),
    }
}

fn valid_name(n: &str) -> bool {
    !n.is_empty()
        && n.chars().count() <= MAX_NAME_LEN
        && n.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
}

fn valid_token_char(c: char) -> bool {
    c.is_ascii_graphic() && !matches!(c, ':' | ',' | '#')
}

impl TokenSet {
    /// Parse entries from `text`; `origin` names the source in errors (a path or the
    /// variable), `lenient_separators` also splits on commas and whitespace (environment).
    pub fn parse(text: &str, origin: &str, lenient_separators: bool) -> Result<Self, AuthError> {
        let mut set = TokenSet::default();
        let mut names = std::collections::BTreeSet::new();
        let mut items: Vec<(String, &str)> = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let where_ = format!("{origin}:{}", i + 1);
            if lenient_separators {
                for part in line.split([',', ' ', '\t']).filter(|p| !p.is_empty()) {
                    items.push((where_.clone(), part));
                }
            } else {
                items.push((where_, line));
            }
        }
        for (where_, raw) in items {
            let bad = |reason: String| AuthError::Entry {
                origin: where_.clone(),
                entry: mask(raw),
                reason,
            };
            let parts: Vec<&str> = raw.split(':').collect();
            let [name, token, role] = parts.as_slice() else {
                return Err(bad(format!(
                    "expected name:token:role (3 fields separated by ':'), found {} field(s)",
                    parts.len()
                )));
            };
            let (name, token, role) = (name.trim(), token.trim(), role.trim());
            if !valid_name(name) {
                return Err(bad(format!(
                    "name {name:?}: letters, digits, '_', '.', '-', 1 to {MAX_NAME_LEN} characters"
                )));
            }
            if token.chars().count() < MIN_TOKEN_LEN || !token.chars().all(valid_token_char) {
                return Err(bad(format!(
                    "the token of {name:?} must be at least {MIN_TOKEN_LEN} visible ASCII characters without ':', ',' or '#'"
                )));
            }
            let role: Role = role.parse().map_err(bad)?;
            if !names.insert(name.to_string()) {
                return Err(bad(format!("name {name:?} appears twice")));
            }
            let d = digest(token.as_bytes());
            if set.entries.iter().any(|e| bool::from(e.digest.ct_eq(&d))) {
                return Err(bad(format!(
                    "the token of {name:?} is also another entry's token"
                )));
            }
            set.entries.push(Entry {
                name: Arc::from(name),
                digest: d,
                role,
            });
        }
        if set.entries.is_empty() {
            return Err(AuthError::Empty(origin.to_string()));
        }
        Ok(set)
    }

    /// Read and parse a token file.
    pub fn load(path: &Path) -> Result<Self, AuthError> {
        let text = std::fs::read_to_string(path).map_err(|e| AuthError::Read {
            path: path.display().to_string(),
            reason: e.to_string(),
        })?;
        Self::parse(&text, &path.display().to_string(), false)
    }

    /// Merge another set's entries (names and tokens must stay unique).
    pub fn merge(mut self, other: TokenSet, origin: &str) -> Result<Self, AuthError> {
        for e in other.entries {
            if self.entries.iter().any(|x| x.name == e.name) {
                return Err(AuthError::Entry {
                    origin: origin.to_string(),
                    entry: e.name.to_string(),
                    reason: format!("name {:?} is defined twice", e.name),
                });
            }
            if self
                .entries
                .iter()
                .any(|x| bool::from(x.digest.ct_eq(&e.digest)))
            {
                return Err(AuthError::Entry {
                    origin: origin.to_string(),
                    entry: e.name.to_string(),
                    reason: format!("the token of {:?} is also another entry's token", e.name),
                });
            }
            self.entries.push(e);
        }
        Ok(self)
    }

    /// How many tokens are configured.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no token is configured.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The principal a presented token proves, if any. Every configured digest is compared
    /// (in constant time), whichever matches.
    pub fn authenticate(&self, presented: &[u8]) -> Option<Principal> {
        let d = digest(presented);
        let mut found: Option<&Entry> = None;
        for e in &self.entries {
            if bool::from(e.digest.ct_eq(&d)) {
                found = Some(e);
            }
        }
        found.map(|e| Principal {
            name: e.name.clone(),
            role: e.role,
            authenticated: true,
        })
    }
}

/// The server's authentication: the tokens in force, and where to reload them from.
#[derive(Debug)]
pub struct Auth {
    file: Option<PathBuf>,
    env: Option<TokenSet>,
    tokens: RwLock<Arc<TokenSet>>,
}

impl Auth {
    /// Authentication from an optional file and optional environment entries (at least one
    /// must give a token).
    pub fn new(file: Option<PathBuf>, env: Option<TokenSet>) -> Result<Self, AuthError> {
        let tokens = Self::read(file.as_deref(), env.as_ref())?;
        Ok(Auth {
            file,
            env,
            tokens: RwLock::new(Arc::new(tokens)),
        })
    }

    /// Authentication from a fixed set (tests, embedding).
    pub fn from_tokens(tokens: TokenSet) -> Self {
        Auth {
            file: None,
            env: Some(tokens.clone()),
            tokens: RwLock::new(Arc::new(tokens)),
        }
    }

    fn read(file: Option<&Path>, env: Option<&TokenSet>) -> Result<TokenSet, AuthError> {
        match (file, env) {
            (Some(f), None) => TokenSet::load(f),
            (Some(f), Some(e)) => TokenSet::load(f)?.merge(e.clone(), "TOLLGATE_AUTH_TOKENS"),
            (None, Some(e)) => Ok(e.clone()),
            (None, None) => Err(AuthError::Empty("authentication".into())),
        }
    }

    /// The auth file, if any.
    pub fn file(&self) -> Option<&Path> {
        self.file.as_deref()
    }

    /// The tokens in force.
    pub fn tokens(&self) -> Arc<TokenSet> {
        self.tokens
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Re-read the file. On error the tokens in force stay; returns how many tokens are in
    /// force after a successful reload.
    pub fn reload(&self) -> Result<usize, AuthError> {
        let fresh = Self::read(self.file.as_deref(), self.env.as_ref())?;
        let n = fresh.len();
        *self.tokens.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(fresh);
        Ok(n)
    }
}

/// Who is calling, and may they use this route? The principal's name when they may (the
/// principal is then in the request's extensions, for handlers); otherwise the error that
/// refuses the request, and the name of the token it presented when that token is known.
///
/// The route's role comes from the route table ([`crate::routes::needs`]). Without
/// authentication every request is [`Principal::anonymous`]. With it, a route that needs a
/// role answers `401 unauthorized` without a known bearer token and `403 forbidden` when the
/// token's role is not enough; public routes (health, readiness) take no token.
pub(crate) fn authorize(
    app: &crate::AppState,
    req: &mut axum::extract::Request,
) -> Result<Arc<str>, (crate::error::ApiError, Option<Arc<str>>)> {
    use axum::http::StatusCode;

    use crate::error::ApiError;

    let principal = match &app.auth {
        None => Principal::anonymous(),
        Some(auth) => {
            let needed = req
                .extensions()
                .get::<axum::extract::MatchedPath>()
                .and_then(|m| crate::routes::needs(req.method(), m.as_str()));
            let presented = req
                .headers()
                .get(axum::http::header::AUTHORIZATION)
                .map(|v| bearer(v.as_bytes()));
            let known = match presented {
                Some(Some(t)) => auth.tokens().authenticate(t),
                _ => None,
            };
            let unauthorized = |message| {
                Err((
                    ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", message),
                    None,
                ))
            };
            match (needed, presented, known) {
                (None, _, Some(p)) => p,
                (None, _, None) => Principal::unauthenticated(),
                (Some(_), None, _) => {
                    return unauthorized(
                        "this route needs a bearer token: Authorization: Bearer TOKEN",
                    )
                }
                (Some(_), Some(None), _) => {
                    return unauthorized(
                        "the Authorization header is not of the form: Bearer TOKEN",
                    )
                }
                (Some(_), Some(Some(_)), None) => {
                    return unauthorized("the bearer token is not known to this server")
                }
                (Some(role), _, Some(p)) if !p.role.allows(role) => {
                    let e = ApiError::new(
                        StatusCode::FORBIDDEN,
                        "forbidden",
                        format!(
                            "token {:?} has role {}; this route needs role {}",
                            p.name,
                            p.role.as_str(),
                            role.as_str()
                        ),
                    );
                    return Err((e, Some(p.name)));
                }
                (Some(_), _, Some(p)) => p,
            }
        }
    };
    let name = Arc::clone(&principal.name);
    req.extensions_mut().insert(principal);
    Ok(name)
}

/// The bearer token of an `Authorization` header value (`Bearer TOKEN`, scheme
/// case-insensitive), if it has that shape.
pub fn bearer(value: &[u8]) -> Option<&[u8]> {
    let (scheme, rest) = split_once(value, b' ')?;
    if !scheme.eq_ignore_ascii_case(b"bearer") {
        return None;
    }
    let token = trim(rest);
    (!token.is_empty()).then_some(token)
}

fn split_once(v: &[u8], sep: u8) -> Option<(&[u8], &[u8])> {
    let i = v.iter().position(|&b| b == sep)?;
    Some((&v[..i], &v[i + 1..]))
}

fn trim(v: &[u8]) -> &[u8] {
    let start = v
        .iter()
        .position(|b| !b.is_ascii_whitespace())
        .unwrap_or(v.len());
    let end = v
        .iter()
        .rposition(|b| !b.is_ascii_whitespace())
        .map_or(start, |i| i + 1);
    &v[start..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "aaaaaaaaaaaaaaaaaaaaaaaa";
    const C: &str = "cccccccccccccccccccccccc";

    #[test]
    fn parses_and_authenticates() {
        let text = format!("# comment\n\nops:{A}:admin\n gw : {C} : client \n");
        let set = TokenSet::parse(&text, "t", false).unwrap();
        assert_eq!(set.len(), 2);
        let p = set.authenticate(A.as_bytes()).unwrap();
        assert_eq!(
            (&*p.name, p.role, p.authenticated),
            ("ops", Role::Admin, true)
        );
        assert_eq!(set.authenticate(C.as_bytes()).unwrap().role, Role::Client);
        assert!(set.authenticate(b"cccccccccccccccccccccccd").is_none());
        assert!(set.authenticate(b"").is_none());
        assert!(Role::Admin.allows(Role::Client));
        assert!(!Role::Client.allows(Role::Admin));
    }

    #[test]
    fn refuses_bad_entries_naming_the_line_and_masking_the_token() {
        for (text, want) in [
            (
                format!("ops:{A}"),
                "t:1, entry ops:***: expected name:token:role",
            ),
            ("ops:short:admin".to_string(), "at least 16"),
            (format!("ops:{A}:root"), "unknown role \"root\""),
            (format!("o p:{A}:admin"), "name \"o p\""),
            (
                format!("ops:{A}:admin\nops:{C}:client"),
                "t:2, entry ops:***:client: name \"ops\" appears twice",
            ),
            (
                format!("a:{A}:admin\nb:{A}:client"),
                "also another entry's token",
            ),
            ("# nothing\n".to_string(), "no tokens"),
        ] {
            let e = TokenSet::parse(&text, "t", false).unwrap_err().to_string();
            assert!(e.contains(want), "{text:?}: {e}");
            assert!(!e.contains(A) && !e.contains(C), "token leaked: {e}");
        }
    }

    #[test]
    fn env_entries_may_be_separated_by_commas() {
        let set = TokenSet::parse(&format!("a:{A}:admin, b:{C}:client"), "env", true).unwrap();
        assert_eq!(set.len(), 2);
    }

    #[test]
    fn bearer_header() {
        assert_eq!(bearer(b"Bearer abc"), Some(&b"abc"[..]));
        assert_eq!(bearer(b"bearer   abc  "), Some(&b"abc"[..]));
        assert_eq!(bearer(b"Basic abc"), None);
        assert_eq!(bearer(b"Bearer "), None);
        assert_eq!(bearer(b"Bearer"), None);
    }
}
