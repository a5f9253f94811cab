//! Bounded HTTP fetches of the OIDC discovery document and of the JWKS.

use std::time::Duration;

use reqwest::header::ACCEPT;
use reqwest::{redirect, Client, Url};
use serde::Deserialize;

use super::keys::KeySet;

/// Whole-fetch bound: connect, answer and body.
pub(crate) const FETCH_TIMEOUT: Duration = Duration::from_secs(5);
pub(crate) const MAX_BODY: usize = 1024 * 1024;
const MAX_REDIRECTS: usize = 3;

pub(crate) fn client() -> Result<Client, String> {
    Client::builder()
        // `JwtVerifier::new` runs in a start-up runtime that is then dropped: a pooled
        // connection would stay bound to it, so every fetch opens a fresh one.
        .pool_max_idle_per_host(0)
        .connect_timeout(FETCH_TIMEOUT)
        .timeout(FETCH_TIMEOUT)
        .redirect(redirect::Policy::custom(|attempt| {
            let downgrade = attempt.url().scheme() != "https"
                && attempt.previous().iter().any(|u| u.scheme() == "https");
            if attempt.previous().len() > MAX_REDIRECTS {
                attempt.error("too many redirects")
            } else if downgrade {
                attempt.error("redirect from https to http")
            } else {
                attempt.follow()
            }
        }))
        .user_agent(concat!("portcullis/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|e| format!("cannot build the HTTP client: {}", chain(&e)))
}

/// `{issuer}/.well-known/openid-configuration` → `jwks_uri`, refusing a document that names
/// another issuer (OpenID Connect Discovery §4.3).
pub(crate) async fn discover_jwks_uri(client: &Client, issuer: &str) -> Result<String, String> {
    #[derive(Deserialize)]
    struct Discovery {
        issuer: String,
        jwks_uri: String,
    }
    let url = format!(
        "{}/.well-known/openid-configuration",
        issuer.trim_end_matches('/')
    );
    let body = get(client, &url).await?;
    let doc: Discovery = serde_json::from_slice(&body)
        .map_err(|e| format!("{url}: not an OpenID discovery document: {e}"))?;
    if doc.issuer != issuer {
        return Err(format!(
            "{url}: names the issuer {}, not the configured {issuer:?}",
            short(&doc.issuer)
        ));
    }
    let scheme = Url::parse(&doc.jwks_uri).map(|u| u.scheme().to_owned());
    let fits = match scheme.as_deref() {
        // The keys must come over TLS whenever the issuer itself does.
        Ok("https") => true,
        Ok("http") => !issuer.starts_with("https:"),
        _ => false,
    };
    if !fits {
        return Err(format!("{url}: unusable jwks_uri {}", short(&doc.jwks_uri)));
    }
    Ok(doc.jwks_uri)
}

pub(crate) async fn jwks(client: &Client, uri: &str) -> Result<KeySet, String> {
    let body = get(client, uri).await?;
    KeySet::parse(&body).map_err(|e| format!("{uri}: {e}"))
}

async fn get(client: &Client, url: &str) -> Result<Vec<u8>, String> {
    tokio::time::timeout(FETCH_TIMEOUT, get_unbounded(client, url))
        .await
        .unwrap_or_else(|_| {
            Err(format!(
                "{url}: no complete answer within {FETCH_TIMEOUT:?}"
            ))
        })
}

async fn get_unbounded(client: &Client, url: &str) -> Result<Vec<u8>, String> {
    let failed = |e: reqwest::Error| format!("{url}: {}", chain(&e.without_url()));
    let mut resp = client
        .get(url)
        .header(ACCEPT, "application/json")
        .send()
        .await
        .map_err(failed)?;
    if !resp.status().is_success() {
        return Err(format!("{url}: HTTP {}", resp.status()));
    }
    let too_big = || format!("{url}: answer larger than {MAX_BODY} bytes");
    if resp.content_length().is_some_and(|n| n > MAX_BODY as u64) {
        return Err(too_big());
    }
    let mut body = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(failed)? {
        if body.len() + chunk.len() > MAX_BODY {
            return Err(too_big());
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// An error with its causes on one line: reqwest's own message alone says little.
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cause = c.source();
    }
    s
}

/// A remote-supplied string, quoted and cut short for a one-line message.
fn short(s: &str) -> String {
    let cut: String = s.chars().take(200).collect();
    format!("{cut:?}")
}
