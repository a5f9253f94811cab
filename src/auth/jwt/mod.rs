//! JWT access tokens (RFC 9068) from the console's OIDC login, verified against the issuer's
//! JWKS. Keys are fetched at start-up, refreshed periodically and refetched on an unknown
//! `kid`; verified tokens are cached by their SHA-256 until their `exp`.

mod claims;
mod fetch;
mod keys;
#[cfg(test)]
mod tests;

use std::sync::{Arc, PoisonError, RwLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use jsonwebtoken::{decode, decode_header, Algorithm, Validation};
use moka::future::Cache;
use moka::Expiry;
use sha2::{Digest, Sha256};

use super::token::MAX_TOKEN_LEN;
use super::{unix_now, Principal, PrincipalKind};
use crate::config::JwtSettings;
use claims::Claims;
use keys::{KeySet, MAX_KID_LEN};

/// Least time between two refetches caused by unknown `kid`s, so random kids cannot hammer
/// the issuer. A genuinely new key may thus wait this long after a burst of bogus ones.
const UNKNOWN_KID_COOLDOWN: Duration = Duration::from_secs(10);
/// How soon a failed periodic refresh is retried (when sooner than the refresh period).
const RETRY_AFTER_FAILURE: Duration = Duration::from_secs(30);
const CACHE_CAPACITY: u64 = 100_000;
/// Upper bound on a cache entry's life even for a far-off `exp`: the signature is re-checked.
const MAX_CACHE_TTL: Duration = Duration::from_secs(600);
/// Clock skew beyond this is a configuration mistake (and jsonwebtoken does plain u64 sums).
const MAX_LEEWAY_SECONDS: u64 = 3600;

pub struct JwtVerifier {
    settings: JwtSettings,
    jwks_uri: String,
    http: reqwest::Client,
    /// One `Validation` per allowed algorithm: one never mixes algorithm families.
    validations: Vec<(Algorithm, Validation)>,
    /// The current key set, replaced whole. Read briefly, never held across an await.
    keys: RwLock<Arc<KeySet>>,
    /// Held during every JWKS refetch, so one fetch serves all waiters; holds the start of
    /// the last unknown-`kid` refetch, for the cooldown.
    refetch: tokio::sync::Mutex<Option<Instant>>,
    /// Keyed by SHA-256 of the whole token: the token itself is never kept.
    cache: Cache<[u8; 32], Verified>,
    /// `portcullis_jwks_fetches_total{result}`, when metrics are on.
    fetches: Option<prometheus::IntCounterVec>,
}

#[derive(Clone)]
struct Verified {
    principal: Arc<Principal>,
    exp: i64,
}

struct UntilExp;

impl Expiry<[u8; 32], Verified> for UntilExp {
    fn expire_after_create(&self, _: &[u8; 32], v: &Verified, _: Instant) -> Option<Duration> {
        Some(time_left(v.exp).min(MAX_CACHE_TTL))
    }
}

/// Time until `exp`, never rounded up.
fn time_left(exp: i64) -> Duration {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    Duration::from_secs(exp.max(0) as u64).saturating_sub(now)
}

impl JwtVerifier {
    /// Discovers the JWKS (unless `jwks_uri` is configured) and fetches it once. Every
    /// fetch is bounded in time and size; the error is one line, for the start-up failure.
    pub async fn new(settings: JwtSettings) -> Result<JwtVerifier, String> {
        if settings.leeway_seconds > MAX_LEEWAY_SECONDS {
            return Err(format!(
                "auth.jwt.leeway_seconds: at most {MAX_LEEWAY_SECONDS} is accepted"
            ));
        }
        let http = fetch::client()?;
        let jwks_uri = match &settings.jwks_uri {
            Some(uri) => uri.clone(),
            None => fetch::discover_jwks_uri(&http, &settings.issuer)
                .await
                .map_err(|e| format!("JWT issuer discovery failed: {e}"))?,
        };
        let keys = fetch::jwks(&http, &jwks_uri)
            .await
            .map_err(|e| format!("JWKS fetch failed: {e}"))?;
        log::info!("JWT: {} signing key(s) from {jwks_uri}", keys.len());
        let validations = settings
            .algorithms
            .iter()
            .map(|&alg| (alg, validation(&settings, alg)))
            .collect();
        Ok(JwtVerifier {
            settings,
            jwks_uri,
            http,
            validations,
            keys: RwLock::new(Arc::new(keys)),
            refetch: tokio::sync::Mutex::new(None),
            cache: Cache::builder()
                .max_capacity(CACHE_CAPACITY)
                .expire_after(UntilExp)
                .build(),
            fetches: None,
        })
    }

    pub fn with_fetch_counter(mut self, fetches: prometheus::IntCounterVec) -> Self {
        self.fetches = Some(fetches);
        self
    }

    /// One JWKS fetch after start-up, counted by result.
    async fn fetch_keys(&self) -> Result<KeySet, String> {
        let result = fetch::jwks(&self.http, &self.jwks_uri).await;
        if let Some(fetches) = &self.fetches {
            let label = if result.is_ok() { "ok" } else { "error" };
            fetches.with_label_values(&[label]).inc();
        }
        result
    }

    /// The caller's principal, or None for any failure at all. The token is never logged.
    pub async fn verify(&self, token: &str) -> Option<Arc<Principal>> {
        if token.len() > MAX_TOKEN_LEN {
            log::debug!("JWT refused: longer than {MAX_TOKEN_LEN} bytes");
            return None;
        }
        let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        if let Some(hit) = self.cache.get(&digest).await {
            // The entry expires at `exp`, but eviction is lazy: check again.
            if unix_now() < hit.exp {
                return Some(hit.principal);
            }
            self.cache.invalidate(&digest).await;
        }
        match self.check(token).await {
            Ok(verified) => {
                let principal = verified.principal.clone();
                if !time_left(verified.exp).is_zero() {
                    self.cache.insert(digest, verified).await;
                }
                Some(principal)
            }
            Err(reason) => {
                log::debug!("JWT refused: {reason}");
                None
            }
        }
    }

    /// Refreshes the JWKS every `jwks_refresh`, keeping the last good set when a fetch fails.
    pub async fn refresh_loop(self: Arc<Self>) {
        let mut wait = self.settings.jwks_refresh;
        loop {
            tokio::time::sleep(wait).await;
            let _one_fetch_at_a_time = self.refetch.lock().await;
            wait = match self.fetch_keys().await {
                Ok(set) => {
                    log::debug!("JWT: JWKS refreshed, {} signing key(s)", set.len());
                    self.install(set);
                    self.settings.jwks_refresh
                }
                Err(e) => {
                    log::warn!("JWKS refresh failed, keeping the last good key set: {e}");
                    self.settings.jwks_refresh.min(RETRY_AFTER_FAILURE)
                }
            };
        }
    }

    async fn check(&self, token: &str) -> Result<Verified, String> {
        let header = decode_header(token).map_err(|e| format!("header: {e}"))?;
        let alg = header.alg;
        let (_, validation) = self
            .validations
            .iter()
            .find(|(allowed, _)| *allowed == alg)
            .ok_or_else(|| format!("alg {alg:?} is not allowed"))?;
        // RFC 7515 §4.1.11: extensions we do not understand must void the token; we know none.
        if header.crit.is_some() {
            return Err("`crit` header".into());
        }
        // RFC 9068 §4: an ID token or other JWT must not pass as an access token.
        let typ_ok = header.typ.as_deref().is_some_and(|typ| {
            self.settings
                .token_types
                .iter()
                .any(|t| t.eq_ignore_ascii_case(typ))
        });
        if !typ_ok {
            return Err("`typ` missing or not an access-token type".into());
        }
        // Only keys we fetched ourselves: `jku`, `x5u`, `x5c` and `jwk` headers are ignored.
        let kid = match header.kid.as_deref() {
            Some(kid) if !kid.is_empty() && kid.len() <= MAX_KID_LEN => kid,
            _ => return Err("`kid` missing or too long".into()),
        };
        let mut keys = self.current_keys();
        if keys.find(kid, alg).is_none() {
            keys = self.refetch_for_unknown_kid(&keys).await;
        }
        let key = keys
            .find(kid, alg)
            .ok_or_else(|| format!("no key {kid:?} for {alg:?}"))?;
        let claims = decode::<Claims>(token, &key.key, validation)
            .map_err(|e| format!("{alg:?} token with key {kid:?}: {e}"))?
            .claims;
        if claims.sub.is_empty() {
            return Err("empty `sub`".into());
        }
        let exp = claims.exp().ok_or("unreadable `exp`")?;
        let principal = Principal {
            kind: PrincipalKind::Jwt,
            scopes: claims.scopes(),
            id: claims.sub.into(),
        };
        Ok(Verified {
            principal: Arc::new(principal),
            exp,
        })
    }

    fn current_keys(&self) -> Arc<KeySet> {
        self.keys
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Refetches the JWKS for a `kid` not in `seen`, unless someone else did while we waited
    /// for the lock or the cooldown is running. Returns the set to retry the lookup in.
    async fn refetch_for_unknown_kid(&self, seen: &Arc<KeySet>) -> Arc<KeySet> {
        let mut last = self.refetch.lock().await;
        let current = self.current_keys();
        if !Arc::ptr_eq(&current, seen) {
            return current;
        }
        if last.is_some_and(|at| at.elapsed() < UNKNOWN_KID_COOLDOWN) {
            return current;
        }
        *last = Some(Instant::now());
        match self.fetch_keys().await {
            Ok(set) => {
                log::info!(
                    "JWT: JWKS refetched for an unknown kid, {} key(s)",
                    set.len()
                );
                self.install(set)
            }
            Err(e) => {
                log::warn!(
                    "JWKS refetch for an unknown kid failed, keeping the last good set: {e}"
                );
                current
            }
        }
    }

    fn install(&self, set: KeySet) -> Arc<KeySet> {
        let set = Arc::new(set);
        let old = {
            let mut keys = self.keys.write().unwrap_or_else(PoisonError::into_inner);
            std::mem::replace(&mut *keys, set.clone())
        };
        if old.withdrawn_in(&set) {
            // A withdrawn key may be a compromised one: re-check every token it signed.
            self.cache.invalidate_all();
        }
        set
    }
}

fn validation(settings: &JwtSettings, alg: Algorithm) -> Validation {
    let mut v = Validation::new(alg);
    // jsonwebtoken checks `iss` and `aud` only when present unless they are required.
    v.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
    v.set_issuer(&[&settings.issuer]);
    v.set_audience(&[&settings.audience]);
    v.leeway = settings.leeway_seconds;
    v.validate_nbf = true;
    v
}
