//! `[admin]`: the key-management API the console calls, and the reference console page.

use std::time::Duration;

use super::validate::Validator;
use super::{file, Config, TlsListenSettings};
use crate::scope::Scope;

#[derive(Debug, Clone)]
pub struct AdminSettings {
    /// The plain-HTTP address; `None` when the key API is served over `tls` only.
    pub listen: Option<String>,
    /// HTTPS listeners, as `[server.tls]`: tokens and new keys cross the wire encrypted.
    pub tls: Option<TlsListenSettings>,
    /// A JWT carrying this scope manages every key, with any scopes.
    pub admin_scope: String,
    /// When set, `admin_scope` makes an administrator only of these `sub`s: an issuer that
    /// grants any scope asked for cannot make everyone one.
    pub admin_subjects: Option<Vec<String>>,
    /// Browser origins (`scheme://host[:port]`, lower case) the API answers CORS requests of.
    pub allowed_origins: Vec<String>,
    /// Active (neither revoked nor expired) keys one owner may hold.
    pub max_keys_per_owner: u32,
    /// Authenticated key-API requests one `sub` may make per minute, per gateway process.
    pub requests_per_minute: u32,
    /// How long a revoked key stays listed before its row is deleted.
    pub revoked_retention: Duration,
    /// Serve the reference console under `/console/`.
    pub console: bool,
    /// The console's OAuth client id at the issuer (a public client using PKCE).
    pub console_client_id: String,
    /// The console offers "Request administrator access" (asks the issuer for `admin_scope`).
    pub console_admin_sign_in: bool,
}

/// A cap that keeps one owner from filling the store, far above any real use.
const MAX_KEYS_PER_OWNER_LIMIT: u32 = 100_000;
/// A hundred years: "keep them", without an overflow in the arithmetic of dates.
const MAX_RETENTION_DAYS: u32 = 36_500;

impl Validator<'_> {
    pub(super) fn admin(&mut self, a: file::Admin, config: &Config) -> AdminSettings {
        let tls = a.tls.map(|t| self.tls("admin.tls", t));
        match &a.listen {
            Some(addr) => self.listen_address("admin.listen", addr),
            None if tls.as_ref().is_some_and(|t| !t.listen.is_empty()) => {}
            None => self.problem(
                "admin.listen",
                "needs an address (here or in admin.tls.listen)",
            ),
        }
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
        if let Some(subjects) = &a.admin_subjects {
            for sub in subjects {
                if sub.is_empty() || sub.chars().any(char::is_control) {
                    self.problem(
                        "admin.admin_subjects",
                        format!("`{sub}` is not a subject: non-empty printable text"),
                    );
                }
            }
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
        let requests_per_minute = a.requests_per_minute.unwrap_or(60);
        if requests_per_minute == 0 {
            self.problem("admin.requests_per_minute", "must be at least 1");
        }
        let retention_days = a.revoked_retention_days.unwrap_or(90);
        if !(1..=MAX_RETENTION_DAYS).contains(&retention_days) {
            self.problem(
                "admin.revoked_retention_days",
                format!("must be between 1 and {MAX_RETENTION_DAYS}"),
            );
        }
        let console = a.console.unwrap_or(false);
        let console_client_id = a
            .console_client_id
            .unwrap_or_else(|| "portcullis-console".into());
        if console_client_id.is_empty() || console_client_id.chars().any(|c| c.is_control()) {
            self.problem(
                "admin.console_client_id",
                "must be non-empty printable text",
            );
        }
        let console_admin_sign_in = a.console_admin_sign_in.unwrap_or(false);
        if console_admin_sign_in && !console {
            self.problem(
                "admin.console_admin_sign_in",
                "applies only when console = true",
            );
        }
        AdminSettings {
            listen: a.listen,
            tls,
            admin_scope,
            admin_subjects: a.admin_subjects,
            allowed_origins,
            max_keys_per_owner,
            requests_per_minute,
            revoked_retention: Duration::from_secs(u64::from(retention_days) * 86_400),
            console,
            console_client_id,
            console_admin_sign_in,
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

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::time::Duration;

    use crate::config::{Config, ConfigError};

    /// A file with a service, the sections `[admin]` needs, and `admin` as the `[admin]` body.
    fn parse(admin: &str) -> Result<Config, ConfigError> {
        let text = format!(
            "[services.infer]\nupstream = \"http://127.0.0.1:8000\"\nscope = \"infer\"\n\
             [auth.api_keys]\ndatabase = \"sqlite://keys.db\"\n\
             [auth.jwt]\nissuer = \"https://idp.example\"\naudience = \"portcullis\"\n\
             [admin]\n{admin}\n"
        );
        Config::parse(Path::new("test.toml"), &text, |_| None)
    }

    #[test]
    fn defaults() {
        let a = parse("listen = \"127.0.0.1:9200\"").unwrap().admin.unwrap();
        assert_eq!(a.listen.as_deref(), Some("127.0.0.1:9200"));
        assert!(a.tls.is_none() && a.admin_subjects.is_none());
        assert_eq!(a.requests_per_minute, 60);
        assert_eq!(a.revoked_retention, Duration::from_secs(90 * 86_400));
        assert!(!a.console && !a.console_admin_sign_in);
    }

    #[test]
    fn the_new_keys_are_read() {
        let a = parse(
            "listen = \"127.0.0.1:9200\"\nrequests_per_minute = 5\nrevoked_retention_days = 1\n\
             admin_subjects = [\"alice\", \"ops@example.com\"]\nconsole = true\n\
             console_admin_sign_in = true\n",
        )
        .unwrap()
        .admin
        .unwrap();
        assert_eq!(a.requests_per_minute, 5);
        assert_eq!(a.revoked_retention, Duration::from_secs(86_400));
        assert_eq!(a.admin_subjects.unwrap(), ["alice", "ops@example.com"]);
        assert!(a.console_admin_sign_in);
    }

    #[test]
    fn bad_values_are_refused_naming_file_and_key() {
        for (admin, key, why) in [
            (
                "requests_per_minute = 0",
                "admin.requests_per_minute",
                "at least 1",
            ),
            (
                "revoked_retention_days = 0",
                "admin.revoked_retention_days",
                "between 1",
            ),
            (
                "revoked_retention_days = 36501",
                "admin.revoked_retention_days",
                "36500",
            ),
            (
                "admin_subjects = [\"\"]",
                "admin.admin_subjects",
                "not a subject",
            ),
            (
                "admin_subjects = [\"a\\u0007\"]",
                "admin.admin_subjects",
                "not a subject",
            ),
            (
                "console_admin_sign_in = true",
                "admin.console_admin_sign_in",
                "console = true",
            ),
            ("requests_per_minute = -1", "line", "expected u32"),
        ] {
            let text = format!("listen = \"127.0.0.1:9200\"\n{admin}");
            let problems = parse(&text).unwrap_err().to_string();
            assert!(problems.starts_with("test.toml: "), "{admin}: {problems}");
            assert!(
                problems.contains(key) && problems.contains(why),
                "{admin}: {problems}"
            );
        }
    }

    #[test]
    fn tls_listeners_may_replace_the_plain_one() {
        let p = parse("").unwrap_err().to_string();
        assert!(
            p.contains("test.toml: admin.listen: needs an address"),
            "{p}"
        );
        let p = parse("[admin.tls]\nlisten = [\"nowhere\"]\ncert_file = \"/nonexistent.pem\"\nkey_file = \"/nonexistent.key\"")
            .unwrap_err()
            .to_string();
        for key in [
            "admin.tls.listen",
            "admin.tls.cert_file",
            "admin.tls.key_file",
        ] {
            assert!(p.contains(&format!("test.toml: {key}: ")), "{key}: {p}");
        }
        assert!(!p.contains("admin.listen:"), "TLS addresses count: {p}");
    }
}
