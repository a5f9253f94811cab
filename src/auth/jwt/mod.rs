//! JWT access tokens (RFC 9068) from the console's OIDC login, verified against the issuer's
//! JWKS. Keys are fetched at start-up, refreshed periodically and refetched on an unknown
//! `kid`; verified tokens are cached by their SHA-256 until their `exp`.

pub(crate) mod claims;
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

use super::thread_copies::ThreadCopies;
use super::token::MAX_TOKEN_LEN;
use super::{Principal, PrincipalKind};
use crate::config::JwtSettings;
use crate::time::unix_now;
use claims::Claims;
use keys::KeySet;
pub(crate) use keys::MAX_KID_LEN;

/// Least time between two refetches caused by unknown `kid`s, so random kids cannot hammer
/// the issuer. A genuinely new key may thus wait this long after a burst of bogus ones.
const UNKNOWN_KID_COOLDOWN: Duration = Duration::from_secs(10);
/// A failed fetch is retried after 1 s, then twice as long each time up to this.
const RETRY_AFTER_FAILURE: Duration = Duration::from_secs(30);
const FIRST_RETRY: Duration = Duration::from_secs(1);
const CACHE_CAPACITY: u64 = 100_000;
/// Upper bound on a cache entry's life even for a far-off `exp`: the signature is re-checked.
const MAX_CACHE_TTL: Duration = Duration::from_secs(600);
/// Clock skew beyond this is a configuration mistake (and jsonwebtoken does plain u64 sums).
const MAX_LEEWAY_SECONDS: u64 = 3600;

pub struct JwtVerifier {
    settings: JwtSettings,
    /// Configured, or discovered from the issuer by the first fetch that reaches it.
    jwks_uri: RwLock<Option<String>>,
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
    /// Each worker thread's copies of the principals it verified lately, in front of `cache`.
    copies: ThreadCopies<Verified>,
    /// `portcullis_jwks_fetches_total{result}`, when metrics are on.
    fetches: Option<prometheus::IntCounterVec>,
}

#[derive(Clone)]
struct Verified {
    principal: Arc<Principal>,
    exp: i64,
    /// Before it went into the cache, whose entry lives at most `MAX_CACHE_TTL` from then.
    checked: Instant,
}

impl Verified {
    /// A copy for one thread, sharing nothing written per request with the original.
    fn copy(&self) -> Verified {
        Verified {
            principal: Arc::new(Principal::clone(&self.principal)),
            ..*self
        }
    }
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
    /// Builds the verifier; only a configuration problem is an error. The issuer's keys are
    /// fetched by `load_keys` (and the refresh loop): an identity provider that is down at
    /// start-up must not stop the gateway, API keys and all; JWTs get 401 until it answers.
    pub fn new(settings: JwtSettings) -> Result<JwtVerifier, String> {
        if settings.leeway_seconds > MAX_LEEWAY_SECONDS {
            return Err(format!(
                "auth.jwt.leeway_seconds: at most {MAX_LEEWAY_SECONDS} is accepted"
            ));
        }
        let http = fetch::client()?;
        let validations = settings
            .algorithms
            .iter()
            .map(|&alg| (alg, validation(&settings, alg)))
            .collect();
        Ok(JwtVerifier {
            jwks_uri: RwLock::new(settings.jwks_uri.clone()),
            settings,
            http,
            validations,
            keys: RwLock::new(Arc::new(KeySet::default())),
            refetch: tokio::sync::Mutex::new(None),
            cache: Cache::builder()
                .max_capacity(CACHE_CAPACITY)
                .expire_after(UntilExp)
                .build(),
            copies: ThreadCopies::new(),
            fetches: None,
        })
    }

    pub fn with_fetch_counter(mut self, fetches: prometheus::IntCounterVec) -> Self {
        self.fetches = Some(fetches);
        self
    }

    /// Fetches and installs the key set once, at start-up: the one-line reason if it failed.
    pub async fn load_keys(&self) -> Result<usize, String> {
        let _one_fetch_at_a_time = self.refetch.lock().await;
        let set = self.fetch_keys().await?;
        let n = set.len();
        self.install(set);
        Ok(n)
    }

    /// Whether any signing key is installed yet.
    pub fn has_keys(&self) -> bool {
        !self.current_keys().is_empty()
    }

    /// One JWKS fetch (discovering its URI first if still unknown), counted by result.
    async fn fetch_keys(&self) -> Result<KeySet, String> {
        let result = self.discover_and_fetch().await;
        if let Some(fetches) = &self.fetches {
            let label = if result.is_ok() { "ok" } else { "error" };
            fetches.with_label_values(&[label]).inc();
        }
        result
    }

    async fn discover_and_fetch(&self) -> Result<KeySet, String> {
        let known = self
            .jwks_uri
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let uri = match known {
            Some(uri) => uri,
            None => {
                let uri = fetch::discover_jwks_uri(&self.http, &self.settings.issuer)
                    .await
                    .map_err(|e| format!("issuer discovery failed: {e}"))?;
                log::info!("JWT: the issuer's JWKS is at {uri}");
                *self
                    .jwks_uri
                    .write()
                    .unwrap_or_else(PoisonError::into_inner) = Some(uri.clone());
                uri
            }
        };
        fetch::jwks(&self.http, &uri)
            .await
            .map_err(|e| format!("JWKS fetch failed: {e}"))
    }

    /// The caller's principal, or None for any failure at all. The token is never logged.
    pub async fn verify(&self, token: &str) -> Option<Arc<Principal>> {
        if token.len() > MAX_TOKEN_LEN {
            log::debug!("JWT refused: longer than {MAX_TOKEN_LEN} bytes");
            return None;
        }
        let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        if let Some(mine) = self.copies.get(&digest) {
            if unix_now() < mine.exp {
                return Some(mine.principal);
            }
        }
        let epoch = self.copies.epoch();
        if let Some(hit) = self.cache.get(&digest).await {
            // The entry expires at `exp`, but eviction is lazy: check again.
            if unix_now() < hit.exp {
                return Some(self.keep_copy(digest, &hit, epoch));
            }
            self.cache.invalidate(&digest).await;
        }
        match self.check(token).await {
            Ok(verified) => {
                if time_left(verified.exp).is_zero() {
                    return Some(verified.principal);
                }
                let principal = self.keep_copy(digest, &verified, epoch);
                self.cache.insert(digest, verified).await;
                Some(principal)
            }
            Err(reason) => {
                log::debug!("JWT refused: {reason}");
                None
            }
        }
    }

    /// This thread's copy of a verified token, until the shared entry's end at the latest;
    /// its principal.
    fn keep_copy(&self, digest: [u8; 32], verified: &Verified, epoch: u64) -> Arc<Principal> {
        let mine = verified.copy();
        let principal = mine.principal.clone();
        let until = verified.checked + MAX_CACHE_TTL;
        self.copies.keep(digest, mine, epoch, until);
        principal
    }

    /// Refreshes the JWKS every `jwks_refresh`, keeping the last good set when a fetch fails;
    /// a failed fetch is retried sooner, with backoff (from the start when the first failed).
    pub async fn refresh_loop(self: Arc<Self>) {
        let mut retry = FIRST_RETRY;
        let mut wait = if self.has_keys() {
            self.settings.jwks_refresh
        } else {
            retry
        };
        loop {
            tokio::time::sleep(wait).await;
            let _one_fetch_at_a_time = self.refetch.lock().await;
            wait = match self.fetch_keys().await {
                Ok(set) => {
                    if self.has_keys() {
                        log::debug!("JWT: JWKS refreshed, {} signing key(s)", set.len());
                    } else {
                        log::info!(
                            "JWT: {} signing key(s) fetched; JWTs are accepted",
                            set.len()
                        );
                    }
                    self.install(set);
                    retry = FIRST_RETRY;
                    self.settings.jwks_refresh
                }
                Err(e) => {
                    let next = retry.min(self.settings.jwks_refresh);
                    if self.has_keys() {
                        log::warn!("{e}; keeping the last good key set, retrying in {next:?}");
                    } else {
                        log::warn!("{e}; JWTs get 401 until it succeeds, retrying in {next:?}");
                    }
                    retry = (retry * 2).min(RETRY_AFTER_FAILURE);
                    next
                }
            };
        }
    }

    async fn check(&self, token: &str) -> Result<Verified, String> {
        let (alg, kid) = check_header(token, &self.settings.token_types, |alg| {
            self.validations.iter().any(|(allowed, _)| *allowed == alg)
        })?;
        let kid = kid.as_str();
        let validation = self
            .validations
            .iter()
            .find_map(|(allowed, v)| (*allowed == alg).then_some(v))
            .ok_or("alg not allowed")?;
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
        let scopes = claims.scopes();
        let sub: Box<str> = claims.sub.into();
        let principal = Principal {
            kind: PrincipalKind::Jwt,
            scopes,
            owner: Some(sub.clone()),
            id: sub,
            budget: Default::default(),
        };
        Ok(Verified {
            principal: Arc::new(principal),
            exp,
            checked: Instant::now(),
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
        if old.retired_in(&set) {
            // A withdrawn or replaced key may be a compromised one: re-check every token.
            self.copies.invalidate();
            self.cache.invalidate_all();
            self.copies.invalidate();
        }
        set
    }
}

/// What a token's header must say before any key is looked up or any signature checked: an
/// allowed `alg`, no `crit`, an access-token `typ` and a `kid` of sane length. The `alg` and
/// `kid` to look the key up by, or why the token is refused.
pub(crate) fn check_header(
    token: &str,
    token_types: &[String],
    allowed: impl Fn(Algorithm) -> bool,
) -> Result<(Algorithm, String), String> {
    let header = decode_header(token).map_err(|e| format!("header: {e}"))?;
    let alg = header.alg;
    if !allowed(alg) {
        return Err(format!("alg {alg:?} is not allowed"));
    }
    // RFC 7515 §4.1.11: extensions we do not understand must void the token; we know none.
    if header.crit.is_some() {
        return Err("`crit` header".into());
    }
    // RFC 9068 §4: an ID token or other JWT must not pass as an access token.
    let typ_ok = header
        .typ
        .as_deref()
        .is_some_and(|typ| token_types.iter().any(|t| t.eq_ignore_ascii_case(typ)));
    if !typ_ok {
        return Err("`typ` missing or not an access-token type".into());
    }
    // Only keys we fetched ourselves: `jku`, `x5u`, `x5c` and `jwk` headers are ignored.
    match header.kid {
        Some(kid) if !kid.is_empty() && kid.len() <= MAX_KID_LEN => Ok((alg, kid)),
        _ => Err("`kid` missing or too long".into()),
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
