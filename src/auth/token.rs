//! Telling a bearer token's kind from its shape, strictly, before anything is looked up.

use http::header::{HeaderMap, AUTHORIZATION};

/// Longest token accepted at all; a JWT with an RSA-4096 signature and rich claims fits easily.
pub(crate) const MAX_TOKEN_LEN: usize = 8 * 1024;
/// `ak_` + 16 hex characters of key id + `.` + 43 base64url characters (32 random bytes).
pub(crate) const KEY_ID_LEN: usize = 16;
pub(crate) const SECRET_LEN: usize = 43;
pub(crate) const API_KEY_PREFIX: &str = "ak_";

#[derive(Debug, PartialEq, Eq)]
pub enum Bearer<'a> {
    ApiKey { key_id: KeyId, secret: &'a str },
    Jwt(&'a str),
}

/// A key id, kept inline so cache lookups need no allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KeyId(pub [u8; KEY_ID_LEN]);

impl KeyId {
    pub fn parse(s: &str) -> Option<KeyId> {
        let bytes: [u8; KEY_ID_LEN] = s.as_bytes().try_into().ok()?;
        bytes
            .iter()
            .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
            .then_some(KeyId(bytes))
    }

    pub fn as_str(&self) -> &str {
        // Only ever built from lowercase hex by `parse`.
        std::str::from_utf8(&self.0).unwrap_or_default()
    }
}

/// Why a request carried no usable token; feeds the `missing`/`malformed` failure kinds.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum ShapeError {
    Missing,
    Malformed,
}

/// Finds the one `Authorization: Bearer <token>` and tells its kind.
pub(crate) fn bearer(headers: &HeaderMap) -> Result<Bearer<'_>, ShapeError> {
    let mut values = headers.get_all(AUTHORIZATION).iter();
    let value = values.next().ok_or(ShapeError::Missing)?;
    if values.next().is_some() {
        return Err(ShapeError::Malformed);
    }
    let value = value.to_str().map_err(|_| ShapeError::Malformed)?;
    let (scheme, token) = value.split_once(' ').ok_or(ShapeError::Malformed)?;
    if !scheme.eq_ignore_ascii_case("bearer") || token.is_empty() || token.len() > MAX_TOKEN_LEN {
        return Err(ShapeError::Malformed);
    }
    classify(token).ok_or(ShapeError::Malformed)
}

pub fn classify(token: &str) -> Option<Bearer<'_>> {
    if let Some(rest) = token.strip_prefix(API_KEY_PREFIX) {
        let (id, secret) = rest.split_once('.')?;
        let key_id = KeyId::parse(id)?;
        return (secret.len() == SECRET_LEN && secret.bytes().all(is_base64url))
            .then_some(Bearer::ApiKey { key_id, secret });
    }
    let mut segments = token.split('.');
    let shaped = (0..3).all(|_| {
        segments
            .next()
            .is_some_and(|s| !s.is_empty() && s.bytes().all(is_base64url))
    }) && segments.next().is_none();
    shaped.then_some(Bearer::Jwt(token))
}

fn is_base64url(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'-' || b == b'_'
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn headers(values: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(AUTHORIZATION, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    const KEY: &str = "ak_0123456789abcdef.abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNO_-";

    #[test]
    fn tells_api_keys_and_jwts_apart() {
        let h = headers(&[&format!("Bearer {KEY}")]);
        assert!(matches!(bearer(&h), Ok(Bearer::ApiKey { .. })));
        let h = headers(&["bearer aaa.bbb.ccc"]);
        assert_eq!(bearer(&h), Ok(Bearer::Jwt("aaa.bbb.ccc")));
    }

    #[test]
    fn refuses_everything_else() {
        assert_eq!(bearer(&headers(&[])), Err(ShapeError::Missing));
        let long = "a".repeat(MAX_TOKEN_LEN) + ".b.c";
        for v in [
            "Basic dXNlcjpwYXNz",
            "Bearer",
            "Bearer ",
            "Bearer  aaa.bbb.ccc",
            "Bearer aaa.bbb",
            "Bearer aaa.bbb.ccc.ddd",
            "Bearer aaa..ccc",
            "Bearer aaa.bbb.c=c",
            "Bearer ak_0123456789abcdef.short",
            "Bearer ak_0123456789ABCDEF.abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNO_-",
            "Bearer ak_0123456789abcde.abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNO_-x",
            "Bearer ak_0123456789abcdef.abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMN+_-",
            &format!("Bearer {long}"),
        ] {
            assert_eq!(bearer(&headers(&[v])), Err(ShapeError::Malformed), "{v}");
        }
        let two = headers(&[&format!("Bearer {KEY}"), &format!("Bearer {KEY}")]);
        assert_eq!(bearer(&two), Err(ShapeError::Malformed));
    }
}
