//! A tiny identity provider for tests: RSA, EC P-256 and Ed25519 keys made at run time,
//! tokens signed with them, and a discovery + JWKS server on 127.0.0.1. Used by the
//! verifier's unit tests and the gateway's integration tests.

use std::sync::atomic::{AtomicBool, AtomicU16, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_lc_rs::rand::SystemRandom;
use aws_lc_rs::signature::{
    EcdsaKeyPair, Ed25519KeyPair, KeyPair as _, RsaKeyPair, RsaPublicKeyComponents,
    ECDSA_P256_SHA256_FIXED_SIGNING, RSA_PKCS1_SHA256,
};
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use base64::Engine as _;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

pub const AUD: &str = "portcullis";

pub fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

// ---- keys and tokens -------------------------------------------------------------------

pub enum Signer {
    Rsa(RsaKeyPair),
    Ec(EcdsaKeyPair),
    Ed(Ed25519KeyPair),
}

pub struct TestKey {
    pub kid: String,
    pub alg: &'static str,
    pub signer: Signer,
}

impl TestKey {
    pub fn rsa(kid: &str) -> TestKey {
        let kp = RsaKeyPair::generate(aws_lc_rs::rsa::KeySize::Rsa2048).unwrap();
        TestKey {
            kid: kid.into(),
            alg: "RS256",
            signer: Signer::Rsa(kp),
        }
    }

    pub fn ec(kid: &str) -> TestKey {
        let kp = EcdsaKeyPair::generate(&ECDSA_P256_SHA256_FIXED_SIGNING).unwrap();
        TestKey {
            kid: kid.into(),
            alg: "ES256",
            signer: Signer::Ec(kp),
        }
    }

    pub fn ed(kid: &str) -> TestKey {
        let kp = Ed25519KeyPair::generate().unwrap();
        TestKey {
            kid: kid.into(),
            alg: "EdDSA",
            signer: Signer::Ed(kp),
        }
    }

    /// The public JWK; EC and OKP keys without `alg`, to exercise the kty/crv match.
    pub fn jwk(&self) -> Value {
        match &self.signer {
            Signer::Rsa(kp) => {
                let c = RsaPublicKeyComponents::<Vec<u8>>::from(kp.public_key());
                json!({"kty": "RSA", "kid": self.kid, "use": "sig", "alg": "RS256",
                       "n": B64.encode(c.n), "e": B64.encode(c.e)})
            }
            Signer::Ec(kp) => {
                let point = kp.public_key().as_ref(); // 0x04 || x || y
                json!({"kty": "EC", "kid": self.kid, "crv": "P-256",
                       "x": B64.encode(&point[1..33]), "y": B64.encode(&point[33..])})
            }
            Signer::Ed(kp) => {
                json!({"kty": "OKP", "kid": self.kid, "crv": "Ed25519",
                       "x": B64.encode(kp.public_key().as_ref())})
            }
        }
    }

    pub fn sign(&self, msg: &[u8]) -> Vec<u8> {
        let rng = SystemRandom::new();
        match &self.signer {
            Signer::Rsa(kp) => {
                let mut sig = vec![0; kp.public_modulus_len()];
                kp.sign(&RSA_PKCS1_SHA256, &rng, msg, &mut sig).unwrap();
                sig
            }
            Signer::Ec(kp) => kp.sign(&rng, msg).unwrap().as_ref().to_vec(),
            Signer::Ed(kp) => kp.sign(msg).as_ref().to_vec(),
        }
    }

    pub fn header(&self) -> Value {
        json!({"alg": self.alg, "typ": "at+jwt", "kid": self.kid})
    }

    pub fn token(&self, header: &Value, claims: &Value) -> String {
        let msg = unsigned(header, claims);
        let sig = self.sign(msg.as_bytes());
        format!("{msg}.{}", B64.encode(sig))
    }

    /// A standard access token for `idp`, with `patch` applied to the claims.
    pub fn access_token(&self, idp: &Idp, patch: Value) -> String {
        self.token(&self.header(), &edit(&claims(&idp.issuer), patch))
    }
}

pub fn unsigned(header: &Value, claims: &Value) -> String {
    format!(
        "{}.{}",
        B64.encode(header.to_string()),
        B64.encode(claims.to_string())
    )
}

pub fn claims(issuer: &str) -> Value {
    let now = unix_now();
    json!({"iss": issuer, "aud": AUD, "sub": "user-1", "iat": now, "exp": now + 300,
           "jti": unique(), "scope": "infer chatx", "scp": ["embed"], "permissions": "chatx admin"})
}

/// A fresh value, so that two otherwise equal tokens differ (and miss the cache).
pub fn unique() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// `base` with the members of `patch` set; a `null` in `patch` removes the member.
pub fn edit(base: &Value, patch: Value) -> Value {
    let mut v = base.clone();
    let obj = v.as_object_mut().unwrap();
    for (k, val) in patch.as_object().unwrap() {
        if val.is_null() {
            obj.remove(k);
        } else {
            obj.insert(k.clone(), val.clone());
        }
    }
    v
}

// ---- a tiny identity provider -----------------------------------------------------------

#[derive(Default)]
pub struct Idp {
    pub issuer: String,
    /// The `issuer` the discovery document names, when not the real one.
    pub claimed_issuer: Mutex<Option<String>>,
    pub jwks: Mutex<String>,
    /// HTTP status of `/jwks`; 0 means 200.
    pub jwks_status: AtomicU16,
    /// Answer `/jwks` without Content-Length, delimited by the connection close.
    pub no_length: AtomicBool,
    /// Accept connections but never answer.
    pub hang: AtomicBool,
    pub jwks_hits: AtomicUsize,
    pub discovery_hits: AtomicUsize,
}

impl Idp {
    pub async fn start(keys: &[&TestKey]) -> Arc<Idp> {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let idp = Arc::new(Idp {
            issuer: format!("http://{}", listener.local_addr().unwrap()),
            ..Idp::default()
        });
        idp.set_keys(keys);
        let server = idp.clone();
        tokio::spawn(async move {
            while let Ok((sock, _)) = listener.accept().await {
                tokio::spawn(server.clone().answer(sock));
            }
        });
        idp
    }

    pub fn set_keys(&self, keys: &[&TestKey]) {
        let keys: Vec<Value> = keys.iter().map(|k| k.jwk()).collect();
        self.set_jwks(json!({ "keys": keys }).to_string());
    }

    pub fn set_jwks(&self, body: String) {
        *self.jwks.lock().unwrap() = body;
    }

    pub fn jwks_hits(&self) -> usize {
        self.jwks_hits.load(Ordering::SeqCst)
    }

    /// Serves requests on one connection, kept alive as real servers do (so that a client
    /// which pools connections would reuse it), except when the body is close-delimited.
    async fn answer(self: Arc<Self>, mut sock: TcpStream) {
        let mut buf = [0u8; 1024];
        loop {
            let mut head = Vec::new();
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                match sock.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => head.extend_from_slice(&buf[..n]),
                }
            }
            if self.hang.load(Ordering::SeqCst) {
                tokio::time::sleep(Duration::from_secs(60)).await;
                return;
            }
            let path = String::from_utf8_lossy(&head)
                .split_whitespace()
                .nth(1)
                .unwrap_or("")
                .to_owned();
            let (status, body) = self.route(&path);
            let close_delimited = path == "/jwks" && self.no_length.load(Ordering::SeqCst);
            let framing = if close_delimited {
                "connection: close\r\n".to_owned()
            } else {
                format!("content-length: {}\r\n", body.len())
            };
            let response = format!(
                "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\n{framing}\r\n{body}"
            );
            if sock.write_all(response.as_bytes()).await.is_err() || close_delimited {
                let _ = sock.shutdown().await;
                return;
            }
        }
    }

    fn route(&self, path: &str) -> (u16, String) {
        match path {
            "/.well-known/openid-configuration" => {
                self.discovery_hits.fetch_add(1, Ordering::SeqCst);
                let claimed = self.claimed_issuer.lock().unwrap().clone();
                let issuer = claimed.unwrap_or_else(|| self.issuer.clone());
                let jwks_uri = format!("{}/jwks", self.issuer);
                (
                    200,
                    json!({"issuer": issuer, "jwks_uri": jwks_uri}).to_string(),
                )
            }
            "/jwks" => {
                self.jwks_hits.fetch_add(1, Ordering::SeqCst);
                let status = match self.jwks_status.load(Ordering::SeqCst) {
                    0 => 200,
                    s => s,
                };
                (status, self.jwks.lock().unwrap().clone())
            }
            _ => (404, "{}".to_owned()),
        }
    }
}
