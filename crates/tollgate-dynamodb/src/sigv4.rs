//! SigV4 for the one request shape [`crate::wire`] sends (`POST /`, four signed headers and
//! the session token), with the signing key kept for the day.
//!
//! `aws_sigv4::http_request::sign` derives the signing key (four HMACs) and builds the
//! canonical request as a string on every call; per acquire that was most of the signing
//! cost. Here the key is derived with `aws_sigv4`'s own [`v4::generate_signing_key`] once
//! per UTC day and set of credentials, the canonical request is fed to the hash in pieces,
//! and the signature is the HMAC of the string to sign (the `hmac` crate `aws_sigv4` uses,
//! written as hex by a table: `v4::calculate_signature` collects its hex a `char` at a
//! time, ~2 k instructions a request). A test checks that the
//! `Authorization` header equals the one `aws_sigv4::http_request::sign` makes for the
//! same request, with and without a session token.

use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use aws_credential_types::Credentials;
use aws_sigv4::sign::v4;
use aws_smithy_types::date_time::{DateTime, Format};
use sha2::{Digest, Sha256};

/// The algorithm, in the string to sign and the `Authorization` header.
const ALGORITHM: &str = "AWS4-HMAC-SHA256";

/// The headers of one signed request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Signed {
    /// `X-Amz-Date`: `YYYYMMDDTHHMMSSZ`.
    pub(crate) amz_date: String,
    /// `Authorization`.
    pub(crate) authorization: String,
}

/// What one second and one day of signing share.
#[derive(Debug, Default)]
struct Cached {
    /// The Unix second `amz_date` is for.
    second: u64,
    amz_date: String,
    /// The credentials and day the key is for: access key ID, secret, `YYYYMMDD`.
    key_for: (String, String, String),
    /// The day's scope and key, shared with the signatures that use them (not copied).
    day: Arc<DayKey>,
}

/// What one day of signing shares.
#[derive(Debug, Default)]
struct DayKey {
    /// `YYYYMMDD/region/service/aws4_request`.
    scope: String,
    key: Vec<u8>,
}

/// Signs requests for one region and service.
#[derive(Debug)]
pub(crate) struct Signer {
    region: String,
    service: &'static str,
    cached: Mutex<Cached>,
}

impl Signer {
    /// A signer for `service` in `region`.
    pub(crate) fn new(region: String, service: &'static str) -> Self {
        Signer {
            region,
            service,
            cached: Mutex::default(),
        }
    }

    /// Sign `POST /` with the headers `content-type`, `host`, `x-amz-date`, the session
    /// token if `creds` has one, and `x-amz-target`, and with `body`, at `now`.
    pub(crate) fn sign(
        &self,
        creds: &Credentials,
        now: SystemTime,
        content_type: &str,
        host: &str,
        target: &str,
        body: &[u8],
    ) -> Signed {
        let second = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let (amz_date, day) = {
            let mut c = self.cached.lock().unwrap_or_else(|e| e.into_inner());
            if c.amz_date.is_empty() || c.second != second {
                c.second = second;
                c.amz_date = amz_date(now);
            }
            let day = &c.amz_date[..8];
            let (id, secret, key_day) = &c.key_for;
            if key_day != day || id != creds.access_key_id() || secret != creds.secret_access_key()
            {
                let key = v4::generate_signing_key(
                    creds.secret_access_key(),
                    now,
                    &self.region,
                    self.service,
                );
                let day = day.to_string();
                c.day = Arc::new(DayKey {
                    scope: format!("{day}/{}/{}/aws4_request", self.region, self.service),
                    key: key.as_ref().to_vec(),
                });
                c.key_for = (
                    creds.access_key_id().to_string(),
                    creds.secret_access_key().to_string(),
                    day,
                );
            }
            (c.amz_date.clone(), Arc::clone(&c.day))
        };
        let (scope, key) = (&day.scope, &day.key);
        let token = creds.session_token();
        let signed_headers = if token.is_some() {
            "content-type;host;x-amz-date;x-amz-security-token;x-amz-target"
        } else {
            "content-type;host;x-amz-date;x-amz-target"
        };
        // The canonical request, hashed as it is written.
        let mut h = Sha256::new();
        h.update(b"POST\n/\n\ncontent-type:");
        h.update(content_type.trim().as_bytes());
        h.update(b"\nhost:");
        h.update(host.trim().as_bytes());
        h.update(b"\nx-amz-date:");
        h.update(amz_date.as_bytes());
        if let Some(t) = token {
            h.update(b"\nx-amz-security-token:");
            h.update(t.trim().as_bytes());
        }
        h.update(b"\nx-amz-target:");
        h.update(target.trim().as_bytes());
        h.update(b"\n\n");
        h.update(signed_headers.as_bytes());
        h.update(b"\n");
        h.update(hex32(&Sha256::digest(body)));
        let creq_hash = hex32(&h.finalize());
        let mut sts = Vec::with_capacity(160);
        for part in [ALGORITHM, "\n", &amz_date, "\n", scope, "\n"] {
            sts.extend_from_slice(part.as_bytes());
        }
        sts.extend_from_slice(&creq_hash);
        let signature = hmac_hex(key, &sts);
        // Hex digits are ASCII.
        let signature = std::str::from_utf8(&signature).unwrap_or_default();
        let mut authorization = String::with_capacity(220);
        for part in [
            ALGORITHM,
            " Credential=",
            creds.access_key_id(),
            "/",
            scope,
            ", SignedHeaders=",
            signed_headers,
            ", Signature=",
            signature,
        ] {
            authorization.push_str(part);
        }
        Signed {
            amz_date,
            authorization,
        }
    }
}

/// Lowercase hex of HMAC-SHA256 of `msg` under `key`: the signature.
fn hmac_hex(key: &[u8], msg: &[u8]) -> [u8; 64] {
    use hmac::{KeyInit, Mac};
    // HMAC takes a key of any length.
    let Ok(mut mac) = hmac::Hmac::<Sha256>::new_from_slice(key) else {
        unreachable!("HMAC accepts every key length")
    };
    mac.update(msg);
    hex32(&mac.finalize().into_bytes())
}

/// Lowercase hex of a 32-byte digest.
fn hex32(d: &[u8]) -> [u8; 64] {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = [0u8; 64];
    for (pair, b) in out.chunks_exact_mut(2).zip(d) {
        pair[0] = DIGITS[usize::from(b >> 4)];
        pair[1] = DIGITS[usize::from(b & 15)];
    }
    out
}

/// `YYYYMMDDTHHMMSSZ` of `t` (UTC, whole seconds).
fn amz_date(t: SystemTime) -> String {
    let iso = DateTime::from(t)
        .fmt(Format::DateTime)
        .unwrap_or_else(|_| "1970-01-01T00:00:00Z".into());
    // `2026-12-06T02:30:00Z` (maybe with fractional seconds): keep digits, `T` and `Z`.
    let mut out = String::with_capacity(16);
    for c in iso.chars() {
        match c {
            '0'..='9' | 'T' => out.push(c),
            '.' | 'Z' => break,
            _ => {}
        }
    }
    out.push('Z');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_sigv4::http_request::{sign, SignableBody, SignableRequest, SigningSettings};
    use aws_smithy_runtime_api::client::identity::Identity;
    use std::time::Duration;

    fn reference(creds: &Credentials, now: SystemTime, host: &str, body: &[u8]) -> Signed {
        let identity = Identity::from(creds.clone());
        let params = v4::SigningParams::builder()
            .identity(&identity)
            .region("eu-west-3")
            .name("dynamodb")
            .time(now)
            .settings(SigningSettings::default())
            .build()
            .expect("params")
            .into();
        let headers = [
            ("content-type", "application/x-amz-json-1.0"),
            ("host", host),
            ("x-amz-target", "DynamoDB_20120810.UpdateItem"),
        ];
        let uri = format!("http://{host}/");
        let req = SignableRequest::new(
            "POST",
            uri.as_str(),
            headers.iter().copied(),
            SignableBody::Bytes(body),
        )
        .expect("signable");
        let (instr, _) = sign(req, &params).expect("signs").into_parts();
        let find = |n: &str| {
            instr
                .headers()
                .find(|(k, _)| k.eq_ignore_ascii_case(n))
                .map(|(_, v)| v.to_string())
                .expect("header")
        };
        Signed {
            amz_date: find("x-amz-date"),
            authorization: find("authorization"),
        }
    }

    #[test]
    fn signatures_match_aws_sigv4() {
        let s = Signer::new("eu-west-3".into(), "dynamodb");
        let body = br#"{"TableName":"t","Key":{"PK":{"S":"p"},"SK":{"S":"s"}}}"#;
        let t0 = UNIX_EPOCH + Duration::from_secs(1_796_523_777);
        for (creds, host) in [
            (
                Credentials::new("AKIDEXAMPLE", "secret/1", None, None, "t"),
                "127.0.0.1:8765",
            ),
            (
                Credentials::new(
                    "ASIAEXAMPLE",
                    "secret/2",
                    Some("tok+en/=".into()),
                    None,
                    "t",
                ),
                "dynamodb.eu-west-3.amazonaws.com",
            ),
        ] {
            // The same second twice (cached date and key), a later second, the next day.
            for t in [
                t0,
                t0 + Duration::from_millis(300),
                t0 + Duration::from_secs(1),
                t0 + Duration::from_secs(86_400),
            ] {
                let got = s.sign(
                    &creds,
                    t,
                    "application/x-amz-json-1.0",
                    host,
                    "DynamoDB_20120810.UpdateItem",
                    body,
                );
                assert_eq!(got, reference(&creds, t, host, body), "{t:?}");
            }
        }
    }

    #[test]
    fn hex_is_lowercase_and_complete() {
        let d: Vec<u8> = (0u8..32).map(|i| i.wrapping_mul(37)).collect();
        assert_eq!(&hex32(&d)[..], hex::encode(&d).as_bytes());
    }

    #[test]
    fn amz_dates_are_compact_utc() {
        let t = UNIX_EPOCH + Duration::from_millis(1_796_523_777_250);
        assert_eq!(amz_date(t), "20261206T022257Z");
        assert_eq!(amz_date(UNIX_EPOCH), "19700101T000000Z");
    }
}
