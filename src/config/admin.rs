//! `[admin]`: the key-management API the console calls, and the reference console page.

use super::validate::Validator;
use super::{file, Config};
use crate::scope::Scope;

#[derive(Debug, Clone)]
pub struct AdminSettings {
    pub listen: String,
    /// A JWT carrying this scope manages every key, with any scopes.
    pub admin_scope: String,
    /// Browser origins (`scheme://host[:port]`, lower case) the API answers CORS requests of.
    pub allowed_origins: Vec<String>,
    /// Active (neither revoked nor expired) keys one owner may hold.
    pub max_keys_per_owner: u32,
    /// Serve the reference console under `/console/`.
    pub console: bool,
    /// The console's OAuth client id at the issuer (a public client using PKCE).
    pub console_client_id: String,
}

/// A cap that keeps one owner from filling the store, far above any real use.
const MAX_KEYS_PER_OWNER_LIMIT: u32 = 100_000;

impl Validator<'_> {
    pub(super) fn admin(&mut self, a: file::Admin, config: &Config) -> AdminSettings {
        self.listen_address("admin.listen", &a.listen);
        if config.jwt.is_none() {
            self.problem(
                "admin",
                "needs [auth.jwt]: the key API accepts only the console's login tokens",
            );
        }
        if config.api_keys.is_none() {
            self.problem("admin", "needs [auth.api_keys]: there is no key store");
        }
        let admin_scope = a.admin_scope.unwrap_or_else(|| "portcullis:admin".into());
        if let Err(e) = admin_scope.parse::<Scope>() {
            self.problem("admin.admin_scope", e);
        }
        let mut allowed_origins = Vec::new();
        for origin in a.allowed_origins.unwrap_or_default() {
            match normalise_origin(&origin) {
                Ok(o) => allowed_origins.push(o),
                Err(why) => self.problem("admin.allowed_origins", format!("`{origin}` {why}")),
            }
        }
        let max_keys_per_owner = a.max_keys_per_owner.unwrap_or(100);
        if !(1..=MAX_KEYS_PER_OWNER_LIMIT).contains(&max_keys_per_owner) {
            self.problem(
                "admin.max_keys_per_owner",
                format!("must be between 1 and {MAX_KEYS_PER_OWNER_LIMIT}"),
            );
        }
        let console_client_id = a
            .console_client_id
            .unwrap_or_else(|| "portcullis-console".into());
        if console_client_id.is_empty() || console_client_id.chars().any(|c| c.is_control()) {
            self.problem(
                "admin.console_client_id",
                "must be non-empty printable text",
            );
        }
        AdminSettings {
            listen: a.listen,
            admin_scope,
            allowed_origins,
            max_keys_per_owner,
            console: a.console.unwrap_or(false),
            console_client_id,
        }
    }
}

/// An origin as browsers send it in `Origin`: `http(s)://host[:port]`, no path, no `*`
/// (a wildcard would let any page use a signed-in user's token).
pub(crate) fn normalise_origin(origin: &str) -> Result<String, &'static str> {
    let lower = origin.to_ascii_lowercase();
    let rest = lower
        .strip_prefix("https://")
        .or_else(|| lower.strip_prefix("http://"))
        .ok_or("is not an http:// or https:// origin")?;
    if rest.is_empty()
        || !rest
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b':' | b'[' | b']'))
    {
        return Err("is not an origin: scheme://host[:port], without path, `*` or trailing `/`");
    }
    Ok(lower)
}
