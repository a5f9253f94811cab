//! Authentication: who is calling, from the one bearer token, and what they may use.
//! Every failure collapses into one 401 for the client; the reason is kept for the log
//! and the `portcullis_auth_failures_total{kind}` counter only.

pub(crate) mod api_keys;
pub(crate) mod jwt;
mod thread_copies;
pub(crate) mod token;

use std::sync::Arc;

use http::HeaderMap;

use api_keys::ApiKeyVerifier;
use jwt::JwtVerifier;
use token::{Bearer, ShapeError};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrincipalKind {
    ApiKey,
    Jwt,
}

impl PrincipalKind {
    pub fn as_str(self) -> &'static str {
        match self {
            PrincipalKind::ApiKey => "api_key",
            PrincipalKind::Jwt => "jwt",
        }
    }
}

/// An authenticated caller: the key id or the JWT `sub`, and the scopes granted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    pub kind: PrincipalKind,
    pub id: Box<str>,
    pub scopes: Box<[Box<str>]>,
    /// Whom usage is billed to: a key's owner (none for keys made without one), a JWT's `sub`.
    pub owner: Option<Box<str>>,
    /// A key's budget as the store had it when the key was looked up: what a key made with a
    /// budget is held to before the budget poller has seen it. Empty for JWTs.
    pub budget: crate::store::Budget,
}

impl Principal {
    /// The key id of an API key caller; none for a JWT caller.
    pub fn key_id(&self) -> Option<&str> {
        (self.kind == PrincipalKind::ApiKey).then_some(&*self.id)
    }

    /// Whom rate limits count against: the owner when there is one (so minting more keys
    /// does not multiply a limit), else the key; as (kind, id).
    pub fn rate_subject(&self) -> (&'static str, &str) {
        match &self.owner {
            Some(owner) => ("owner", owner),
            None => (self.kind.as_str(), &self.id),
        }
    }

    pub fn has_scope(&self, scope: &str) -> bool {
        self.scopes.iter().any(|s| &**s == scope)
    }
}

/// Why authentication failed: the label of `portcullis_auth_failures_total`, never sent out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthFailure {
    Missing,
    Malformed,
    ApiKey,
    Jwt,
}

impl AuthFailure {
    pub fn as_str(self) -> &'static str {
        match self {
            AuthFailure::Missing => "missing",
            AuthFailure::Malformed => "malformed",
            AuthFailure::ApiKey => "api_key",
            AuthFailure::Jwt => "jwt",
        }
    }
}

/// The gateway's one authentication step. A kind that is not configured fails closed.
#[derive(Default)]
pub(crate) struct Authenticator {
    pub api_keys: Option<ApiKeyVerifier>,
    pub jwt: Option<Arc<JwtVerifier>>,
}

impl Authenticator {
    pub(crate) async fn authenticate(
        &self,
        headers: &HeaderMap,
    ) -> Result<Arc<Principal>, AuthFailure> {
        match token::bearer(headers) {
            Err(ShapeError::Missing) => Err(AuthFailure::Missing),
            Err(ShapeError::Malformed) => Err(AuthFailure::Malformed),
            Ok(Bearer::ApiKey { key_id, secret }) => match &self.api_keys {
                Some(keys) => keys.verify(key_id, secret).await,
                None => None,
            }
            .ok_or(AuthFailure::ApiKey),
            Ok(Bearer::Jwt(token)) => match &self.jwt {
                Some(jwt) => jwt.verify(token).await,
                None => None,
            }
            .ok_or(AuthFailure::Jwt),
        }
    }
}
