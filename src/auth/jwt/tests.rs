//! End-to-end tests of the verifier against a tiny identity provider on 127.0.0.1, with
//! RSA, EC P-256 and Ed25519 keys generated at run time.

use testkit::idp;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use aws_lc_rs::signature::KeyPair as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use base64::Engine as _;
use jsonwebtoken::Algorithm;
use serde_json::{json, Value};
use tokio::net::TcpListener;

use super::JwtVerifier;
use crate::auth::PrincipalKind;
use crate::config::JwtSettings;
use crate::time::unix_now;
use idp::*;

fn settings(idp: &Idp) -> JwtSettings {
    JwtSettings {
        issuer: idp.issuer.clone(),
        audience: AUD.into(),
        jwks_uri: None,
        algorithms: vec![Algorithm::RS256, Algorithm::ES256, Algorithm::EdDSA],
        leeway_seconds: 30,
        token_types: vec!["at+jwt".into(), "application/at+jwt".into()],
        jwks_refresh: Duration::from_secs(300),
    }
}

/// The verifier as `serve` builds it: constructed, then its keys loaded once.
async fn loaded(s: JwtSettings) -> Result<JwtVerifier, String> {
    let v = JwtVerifier::new(s)?;
    v.load_keys().await?;
    Ok(v)
}

async fn verifier(idp: &Idp) -> JwtVerifier {
    loaded(settings(idp)).await.unwrap()
}

// ---- tests ------------------------------------------------------------------------------

#[tokio::test]
async fn accepts_rs256_es256_and_eddsa_with_united_scopes() {
    let (rsa, ec, ed) = (TestKey::rsa("r1"), TestKey::ec("e1"), TestKey::ed("d1"));
    let idp = Idp::start(&[&rsa, &ec, &ed]).await;
    let v = verifier(&idp).await;
    for key in [&rsa, &ec, &ed] {
        let p = v.verify(&key.access_token(&idp, json!({}))).await;
        let p = p.unwrap_or_else(|| panic!("{} refused", key.alg));
        assert_eq!(p.kind, PrincipalKind::Jwt);
        assert_eq!(&*p.id, "user-1");
        let scopes: Vec<&str> = p.scopes.iter().map(|s| &**s).collect();
        assert_eq!(scopes, ["admin", "chatx", "embed", "infer"]);
        assert!(p.has_scope("infer") && !p.has_scope("openid"));
    }
    assert_eq!(idp.discovery_hits.load(Ordering::SeqCst), 1);
    assert_eq!(idp.jwks_hits(), 1);
}

#[tokio::test]
async fn accepts_the_allowed_variants() {
    let rsa = TestKey::rsa("r1");
    let idp = Idp::start(&[&rsa]).await;
    let v = verifier(&idp).await;
    let header = |typ: &str| edit(&rsa.header(), json!({ "typ": typ }));
    let now = unix_now();
    let cases = [
        (
            "aud array",
            rsa.access_token(&idp, json!({"aud": ["other", AUD]})),
        ),
        (
            "typ upper case",
            rsa.token(&header("AT+JWT"), &claims(&idp.issuer)),
        ),
        (
            "typ media type",
            rsa.token(&header("application/at+jwt"), &claims(&idp.issuer)),
        ),
        (
            "exp within leeway",
            rsa.access_token(&idp, json!({"exp": now - 10})),
        ),
        (
            "nbf within leeway",
            rsa.access_token(&idp, json!({"nbf": now + 10})),
        ),
        (
            "no scopes",
            rsa.access_token(
                &idp,
                json!({"scope": null, "scp": null, "permissions": null}),
            ),
        ),
    ];
    for (name, token) in cases {
        assert!(v.verify(&token).await.is_some(), "{name} refused");
    }
}

#[tokio::test]
async fn refuses_forged_expired_misaddressed_and_id_tokens() {
    let _ = env_logger::builder().is_test(true).try_init();
    let (rsa, ec) = (TestKey::rsa("r1"), TestKey::ec("e1"));
    let idp = Idp::start(&[&rsa, &ec]).await;
    // A shared-secret key in the JWKS must never become an HMAC key.
    let mut jwks: Value = serde_json::from_str(&idp.jwks.lock().unwrap()).unwrap();
    let oct = json!({"kty": "oct", "kid": "shared", "k": B64.encode("secret")});
    jwks["keys"].as_array_mut().unwrap().push(oct);
    idp.set_jwks(jwks.to_string());
    let v = verifier(&idp).await;

    let now = unix_now();
    let good = claims(&idp.issuer);
    let hs256 = |kid: &str, secret: &[u8]| {
        let msg = unsigned(&json!({"alg": "HS256", "typ": "at+jwt", "kid": kid}), &good);
        let tag = aws_lc_rs::hmac::sign(
            &aws_lc_rs::hmac::Key::new(aws_lc_rs::hmac::HMAC_SHA256, secret),
            msg.as_bytes(),
        );
        format!("{msg}.{}", B64.encode(tag.as_ref()))
    };
    let Signer::Rsa(rsa_kp) = &rsa.signer else {
        unreachable!()
    };
    let rsa_public_der = rsa_kp.public_key().as_ref().to_vec();
    let impostor = TestKey::rsa("r1"); // same kid, other key
    let attacker = TestKey::ec("attacker");
    let valid = rsa.access_token(&idp, json!({}));
    let mut tampered: Vec<&str> = valid.split('.').collect();
    let forged_claims = B64.encode(edit(&good, json!({"sub": "admin"})).to_string());
    tampered[1] = &forged_claims;

    let cases: Vec<(&str, String)> = vec![
        ("bad signature", impostor.access_token(&idp, json!({}))),
        ("tampered claims", tampered.join(".")),
        ("signature by another key type", {
            let es256 = ec.access_token(&idp, json!({}));
            let sig = es256.rsplit_once('.').unwrap().1;
            format!("{}.{sig}", unsigned(&rsa.header(), &good))
        }),
        (
            "expired",
            rsa.access_token(&idp, json!({"exp": now - 3600})),
        ),
        (
            "nbf in the future",
            rsa.access_token(&idp, json!({"nbf": now + 3600})),
        ),
        (
            "wrong iss",
            rsa.access_token(&idp, json!({"iss": "https://evil.example"})),
        ),
        (
            "wrong aud",
            rsa.access_token(&idp, json!({"aud": "console-client"})),
        ),
        (
            "aud array without us",
            rsa.access_token(&idp, json!({"aud": ["a", "b"]})),
        ),
        ("no iss", rsa.access_token(&idp, json!({"iss": null}))),
        ("no aud", rsa.access_token(&idp, json!({"aud": null}))),
        ("no exp", rsa.access_token(&idp, json!({"exp": null}))),
        ("no sub", rsa.access_token(&idp, json!({"sub": null}))),
        ("empty sub", rsa.access_token(&idp, json!({"sub": ""}))),
        (
            "malformed scp",
            rsa.access_token(&idp, json!({"scp": {"a": 1}})),
        ),
        ("ID token (no typ)", {
            let h = edit(&rsa.header(), json!({"typ": null}));
            rsa.token(&h, &edit(&good, json!({"aud": AUD, "nonce": "n"})))
        }),
        (
            "typ JWT",
            rsa.token(&edit(&rsa.header(), json!({"typ": "JWT"})), &good),
        ),
        (
            "alg none",
            format!(
                "{}.",
                unsigned(&json!({"alg": "none", "typ": "at+jwt", "kid": "r1"}), &good)
            ),
        ),
        (
            "alg none with signature",
            format!(
                "{}.AAAA",
                unsigned(&json!({"alg": "none", "typ": "at+jwt", "kid": "r1"}), &good)
            ),
        ),
        (
            "HS256 with the RSA public key",
            hs256("r1", &rsa_public_der),
        ),
        ("HS256 with a JWKS oct key", hs256("shared", b"secret")),
        (
            "no kid",
            rsa.token(&edit(&rsa.header(), json!({"kid": null})), &good),
        ),
        (
            "overlong kid",
            rsa.token(&edit(&rsa.header(), json!({"kid": "k".repeat(300)})), &good),
        ),
        (
            "crit header",
            rsa.token(&edit(&rsa.header(), json!({"crit": ["exp"]})), &good),
        ),
        (
            "RS256 naming an EC key",
            rsa.token(&edit(&rsa.header(), json!({"kid": "e1"})), &good),
        ),
        (
            "embedded jwk",
            attacker.token(
                &edit(
                    &attacker.header(),
                    json!({"jwk": attacker.jwk(), "jku": format!("{}/jwks", idp.issuer)}),
                ),
                &good,
            ),
        ),
        ("empty", String::new()),
        ("garbage", "a.b.c".into()),
        ("not base64", "!!.??.**".into()),
        ("too long", format!("{valid}{}", "A".repeat(9000))),
    ];
    for (name, token) in cases {
        assert!(v.verify(&token).await.is_none(), "{name} accepted");
    }
    // The genuine token still passes after all that.
    assert!(v.verify(&valid).await.is_some());
}

#[tokio::test]
async fn unknown_kid_refetches_once_then_cools_down() {
    let rsa = TestKey::rsa("r1");
    let idp = Idp::start(&[&rsa]).await;
    let v = verifier(&idp).await;
    assert_eq!(idp.jwks_hits(), 1);
    let stranger = TestKey::ed("nobody");
    assert!(v
        .verify(&stranger.access_token(&idp, json!({})))
        .await
        .is_none());
    assert_eq!(idp.jwks_hits(), 2, "one refetch for the unknown kid");
    for i in 0..5 {
        let t = TestKey::ed(&format!("random-{i}")).access_token(&idp, json!({}));
        assert!(v.verify(&t).await.is_none());
    }
    assert_eq!(idp.jwks_hits(), 2, "no refetch during the cooldown");
}

#[tokio::test]
async fn a_key_added_at_the_issuer_is_accepted_without_restart() {
    let (old, new) = (TestKey::rsa("2024"), TestKey::ed("2025"));
    let idp = Idp::start(&[&old]).await;
    let v = Arc::new(verifier(&idp).await);
    idp.set_keys(&[&old, &new]);
    // Many callers meet the new kid at once: one fetch serves them all.
    let tasks: Vec<_> = (0..20)
        .map(|_| {
            let (v, t) = (v.clone(), new.access_token(&idp, json!({})));
            tokio::spawn(async move { v.verify(&t).await.is_some() })
        })
        .collect();
    for t in tasks {
        assert!(t.await.unwrap());
    }
    assert_eq!(idp.jwks_hits(), 2);
    assert!(v.verify(&old.access_token(&idp, json!({}))).await.is_some());
}

#[tokio::test]
async fn cached_token_returns_the_same_principal() {
    let ec = TestKey::ec("e1");
    let idp = Idp::start(&[&ec]).await;
    let v = verifier(&idp).await;
    let token = ec.access_token(&idp, json!({}));
    let first = v.verify(&token).await.unwrap();
    let second = v.verify(&token).await.unwrap();
    assert!(
        Arc::ptr_eq(&first, &second),
        "second call served from the cache"
    );
}

#[tokio::test]
async fn cached_token_does_not_outlive_exp() {
    let ed = TestKey::ed("d1");
    let idp = Idp::start(&[&ed]).await;
    let mut s = settings(&idp);
    s.leeway_seconds = 0;
    let v = loaded(s).await.unwrap();
    let exp = unix_now() + 2;
    let token = ed.access_token(&idp, json!({ "exp": exp }));
    assert!(v.verify(&token).await.is_some());
    while unix_now() <= exp {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(v.verify(&token).await.is_none());
}

/// An IdP serving `key`, a verifier refreshing every 100 ms (loop not started), and a token
/// of `key` it has verified and cached.
async fn cached_token_with_fast_refresh(key: &TestKey) -> (Arc<Idp>, Arc<JwtVerifier>, String) {
    let idp = Idp::start(&[key]).await;
    let mut s = settings(&idp);
    s.jwks_refresh = Duration::from_millis(100);
    let v = Arc::new(loaded(s).await.unwrap());
    let token = key.access_token(&idp, json!({}));
    assert!(v.verify(&token).await.is_some());
    (idp, v, token)
}

#[tokio::test]
async fn refresh_loop_swaps_keys_and_keeps_the_last_good_set() {
    let (old, new) = (TestKey::rsa("old"), TestKey::ec("new"));
    let (idp, v, old_token) = cached_token_with_fast_refresh(&old).await;
    let refresher = tokio::spawn(v.clone().refresh_loop());

    let wait_for_hits = |n: usize| {
        let idp = idp.clone();
        async move {
            for _ in 0..100 {
                if idp.jwks_hits() >= n {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            panic!("the JWKS was not refreshed");
        }
    };
    idp.set_keys(&[&new]);
    wait_for_hits(3).await; // surely installed once the next fetch starts
    assert!(v.verify(&new.access_token(&idp, json!({}))).await.is_some());
    // The old key was withdrawn: its cached token must not survive.
    assert!(v.verify(&old_token).await.is_none());

    idp.jwks_status.store(500, Ordering::SeqCst);
    let hits = idp.jwks_hits();
    wait_for_hits(hits + 2).await;
    assert!(v.verify(&new.access_token(&idp, json!({}))).await.is_some());
    refresher.abort();
}

#[tokio::test]
async fn start_up_fails_with_a_clear_reason() {
    let rsa = TestKey::rsa("r1");

    let idp = Idp::start(&[&rsa]).await;
    let mut s = settings(&idp);
    s.jwks_uri = Some(format!("{}/jwks", idp.issuer));
    assert!(loaded(s).await.is_ok());
    assert_eq!(
        idp.discovery_hits.load(Ordering::SeqCst),
        0,
        "configured jwks_uri: no discovery"
    );

    *idp.claimed_issuer.lock().unwrap() = Some(format!("{}/", idp.issuer));
    let e = loaded(settings(&idp)).await.err().unwrap();
    assert!(e.contains("not the configured"), "{e}");
    *idp.claimed_issuer.lock().unwrap() = None;

    idp.set_jwks(json!({"keys": [{"kty": "oct", "kid": "h", "k": "c2VjcmV0"}]}).to_string());
    let e = loaded(settings(&idp)).await.err().unwrap();
    assert!(e.contains("no usable signing key"), "{e}");

    idp.set_jwks(format!(
        "{{\"keys\": [], \"pad\": \"{}\"}}",
        "x".repeat(2 << 20)
    ));
    let e = loaded(settings(&idp)).await.err().unwrap();
    assert!(e.contains("larger than"), "{e}");
    idp.no_length.store(true, Ordering::SeqCst);
    let e = loaded(settings(&idp)).await.err().unwrap();
    assert!(e.contains("larger than"), "{e}");
    idp.no_length.store(false, Ordering::SeqCst);

    idp.jwks_status.store(503, Ordering::SeqCst);
    let e = loaded(settings(&idp)).await.err().unwrap();
    assert!(e.contains("HTTP 503"), "{e}");

    let mut s = settings(&idp);
    s.leeway_seconds = u64::MAX;
    assert!(loaded(s).await.is_err());

    // Nothing listening.
    let closed = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mut s = settings(&idp);
    s.issuer = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let e = loaded(s.clone()).await.err().unwrap();
    assert!(e.contains("discovery failed"), "{e}");
    // ...which does not stop the verifier from being built: only configuration errors do.
    assert!(JwtVerifier::new(s).is_ok());

    // An issuer that never answers: bounded by the fetch timeout.
    idp.hang.store(true, Ordering::SeqCst);
    let started = std::time::Instant::now();
    let e = loaded(settings(&idp)).await.err().unwrap();
    assert!(started.elapsed() < Duration::from_secs(7), "{e}");
}

#[tokio::test]
async fn a_key_replaced_under_the_same_kid_voids_tokens_it_verified() {
    let (old, replacement) = (TestKey::rsa("k1"), TestKey::rsa("k1"));
    let (idp, v, old_token) = cached_token_with_fast_refresh(&old).await;
    idp.set_keys(&[&replacement]);
    let hits = idp.jwks_hits();
    let refresher = tokio::spawn(v.clone().refresh_loop());
    while idp.jwks_hits() < hits + 2 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        v.verify(&old_token).await.is_none(),
        "a token verified by the replaced key material was still served from the cache"
    );
    assert!(v
        .verify(&replacement.access_token(&idp, json!({})))
        .await
        .is_some());
    refresher.abort();
}

#[tokio::test]
async fn an_issuer_down_at_start_up_is_retried_with_backoff_until_it_answers() {
    let rsa = TestKey::rsa("r1");
    let idp = Idp::start(&[&rsa]).await;
    idp.jwks_status.store(503, Ordering::SeqCst);
    let v = Arc::new(JwtVerifier::new(settings(&idp)).unwrap());
    assert!(v.load_keys().await.unwrap_err().contains("HTTP 503"));
    assert!(!v.has_keys());
    let token = rsa.access_token(&idp, json!({}));
    assert!(v.verify(&token).await.is_none(), "no keys yet: refused");
    // The refresh period is 300 s: only the start-up backoff (1 s, 2 s, ...) can fetch soon.
    let refresher = tokio::spawn(v.clone().refresh_loop());
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let failed_retries = idp.jwks_hits();
    assert!(
        failed_retries >= 3,
        "retried after 1 s: {failed_retries} fetches"
    );
    idp.jwks_status.store(0, Ordering::SeqCst);
    let deadline = std::time::Instant::now() + Duration::from_secs(8);
    while !v.has_keys() {
        assert!(std::time::Instant::now() < deadline, "never recovered");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(v.verify(&token).await.is_some());
    refresher.abort();
}

/// `new` runs in a start-up runtime that is dropped before `verify` runs in another one.
#[test]
fn fetches_still_work_after_the_start_up_runtime_is_gone() {
    let (old, new) = (TestKey::rsa("old"), TestKey::ed("new"));
    let server = tokio::runtime::Runtime::new().unwrap();
    let idp = server.block_on(Idp::start(&[&old]));
    let start_up = tokio::runtime::Runtime::new().unwrap();
    let v = start_up.block_on(loaded(settings(&idp))).unwrap();
    drop(start_up);
    idp.set_keys(&[&old, &new]);
    let serving = tokio::runtime::Runtime::new().unwrap();
    let accepted = serving.block_on(v.verify(&new.access_token(&idp, json!({}))));
    assert!(accepted.is_some());
    assert_eq!(idp.jwks_hits(), 2);
}

/// Verifies `token` on a thread of its own (its own copy), twice.
fn verify_twice_on_a_thread(
    v: &Arc<JwtVerifier>,
    token: &str,
) -> [Option<Arc<crate::auth::Principal>>; 2] {
    let (v, token) = (v.clone(), token.to_string());
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        [(); 2].map(|()| runtime.block_on(v.verify(&token)))
    })
    .join()
    .unwrap()
}

#[tokio::test]
async fn each_thread_verifies_from_its_own_copy_and_a_replaced_key_voids_every_copy() {
    let (old, replacement) = (TestKey::rsa("k1"), TestKey::rsa("k1"));
    let (idp, v, token) = cached_token_with_fast_refresh(&old).await;
    let here = v.verify(&token).await.unwrap();
    let [a, b] = verify_twice_on_a_thread(&v, &token).map(Option::unwrap);
    assert!(Arc::ptr_eq(&a, &b) && !Arc::ptr_eq(&a, &here) && *a == *here);
    idp.set_keys(&[&replacement]);
    let hits = idp.jwks_hits();
    let refresher = tokio::spawn(v.clone().refresh_loop());
    while idp.jwks_hits() < hits + 2 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(verify_twice_on_a_thread(&v, &token), [None, None]);
    refresher.abort();
}
