//! The reference console (`console/`: one page, five scripts, no build step), embedded in the
//! binary and served under `/console/` when `[admin] console = true`, so no second web server
//! is needed. `config.json` tells the page where to sign in and which currency costs are in.

use super::reply::Reply;
use crate::config::{AdminSettings, Config};

const INDEX_HTML: &str = include_str!("../../console/index.html");
const CONSOLE_JS: &str = include_str!("../../console/console.js");
const OIDC_JS: &str = include_str!("../../console/oidc.js");
const USAGE_JS: &str = include_str!("../../console/usage.js");
const BUDGETS_JS: &str = include_str!("../../console/budgets.js");
const TEAMS_JS: &str = include_str!("../../console/teams.js");

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Asset {
    Index,
    Script,
    OidcScript,
    UsageScript,
    BudgetsScript,
    TeamsScript,
    Config,
}

impl Asset {
    pub(crate) fn at(path: &str) -> Option<Asset> {
        match path {
            "/console/" | "/console/index.html" => Some(Asset::Index),
            "/console/console.js" => Some(Asset::Script),
            "/console/oidc.js" => Some(Asset::OidcScript),
            "/console/usage.js" => Some(Asset::UsageScript),
            "/console/budgets.js" => Some(Asset::BudgetsScript),
            "/console/teams.js" => Some(Asset::TeamsScript),
            "/console/config.json" => Some(Asset::Config),
            _ => None,
        }
    }
}

pub(crate) struct Console {
    /// Built once at start-up: the issuer, client and scopes do not change while running.
    config_json: &'static [u8],
    /// The page may talk to itself and to the issuer (discovery, token endpoint), nothing else.
    csp: String,
}

impl Console {
    pub(crate) fn new(settings: &AdminSettings, config: &Config) -> Console {
        let jwt = config.jwt.as_ref();
        let issuer = jwt.map(|j| j.issuer.as_str()).unwrap_or("");
        let mut scopes = vec!["openid".to_string()];
        for s in &config.services {
            if !scopes.iter().any(|have| have == &*s.scope) {
                scopes.push(s.scope.to_string());
            }
        }
        let gateway = config
            .server
            .listen
            .first()
            .map(|a| {
                let local = a
                    .replace("0.0.0.0:", "127.0.0.1:")
                    .replace("[::]:", "[::1]:");
                format!("http://{local}")
            })
            .unwrap_or_default();
        let json = serde_json::json!({
            "issuer": issuer,
            "client_id": settings.console_client_id,
            "resource": jwt.map(|j| j.audience.as_str()).unwrap_or(""),
            "scopes": scopes,
            "gateway_url": gateway,
            "admin_scope": settings.admin_scope,
            // Whether the page offers to ask for `admin_scope` at all: off unless configured,
            // since an issuer that grants any scope asked for would otherwise hand it to anyone.
            "admin_sign_in": settings.console_admin_sign_in,
            // The label of every cost the page shows (`[pricing] currency`), never converted;
            // without a price table nothing is costed, and the page's labels say USD.
            "currency": config.pricing.as_ref().map_or("USD", |p| p.currency.as_str()),
        });
        let issuer_origin = origin_of(issuer);
        Console {
            config_json: Box::leak(json.to_string().into_bytes().into_boxed_slice()),
            csp: format!(
                "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; \
                 img-src 'self' data:; connect-src 'self' {issuer_origin}; base-uri 'none'; \
                 form-action 'self' {issuer_origin}; frame-ancestors 'none'"
            ),
        }
    }

    pub(crate) fn serve(&self, asset: Asset) -> Reply {
        let reply = match asset {
            Asset::Index => {
                Reply::static_body(200, "text/html; charset=utf-8", INDEX_HTML.as_bytes())
            }
            Asset::Script => {
                Reply::static_body(200, "text/javascript; charset=utf-8", CONSOLE_JS.as_bytes())
            }
            Asset::OidcScript => {
                Reply::static_body(200, "text/javascript; charset=utf-8", OIDC_JS.as_bytes())
            }
            Asset::UsageScript => {
                Reply::static_body(200, "text/javascript; charset=utf-8", USAGE_JS.as_bytes())
            }
            Asset::BudgetsScript => {
                Reply::static_body(200, "text/javascript; charset=utf-8", BUDGETS_JS.as_bytes())
            }
            Asset::TeamsScript => {
                Reply::static_body(200, "text/javascript; charset=utf-8", TEAMS_JS.as_bytes())
            }
            Asset::Config => Reply::static_body(200, "application/json", self.config_json),
        };
        reply
            .cache_control("no-cache")
            .header("content-security-policy", self.csp.clone())
            .header("x-content-type-options", "nosniff")
            // The page's URL holds the authorization code on return from the issuer.
            .header("referrer-policy", "no-referrer")
            .header("x-frame-options", "DENY")
    }
}

/// `scheme://host[:port]` of a URL, for the CSP; empty when it has none.
fn origin_of(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return String::new();
    };
    let host = rest.split(['/', '?', '#']).next().unwrap_or("");
    format!("{scheme}://{host}")
}
