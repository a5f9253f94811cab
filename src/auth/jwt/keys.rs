//! The JWKS as the verifier uses it: only asymmetric signing keys that carry a `kid`, each
//! turned into a `DecodingKey` once per fetch and matched against a token's `alg` before use.

use std::collections::HashMap;

use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk, KeyOperations, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey};
use serde::Deserialize;
use sha2::{Digest, Sha256};

/// Longest `kid` accepted, in a JWKS or a token header.
pub(crate) const MAX_KID_LEN: usize = 256;

/// What a key can verify, from its `kty` (and `crv`): the JWK's `alg` may narrow it further.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum KeyKind {
    Rsa,
    EcP256,
    EcP384,
    Ed25519,
}

impl KeyKind {
    fn fits(self, alg: Algorithm) -> bool {
        use Algorithm::*;
        match self {
            KeyKind::Rsa => matches!(alg, RS256 | RS384 | RS512 | PS256 | PS384 | PS512),
            KeyKind::EcP256 => alg == ES256,
            KeyKind::EcP384 => alg == ES384,
            KeyKind::Ed25519 => alg == EdDSA,
        }
    }
}

pub(crate) struct VerifyKey {
    pub key: DecodingKey,
    /// SHA-256 of the JWK's key parameters: tells a key replaced under the same `kid`.
    material: [u8; 32],
    kind: KeyKind,
    /// The JWK's own `alg`, when it names one: then a token's `alg` must be exactly it.
    alg: Option<Algorithm>,
}

impl VerifyKey {
    fn accepts(&self, alg: Algorithm) -> bool {
        self.kind.fits(alg) && self.alg.is_none_or(|own| own == alg)
    }
}

/// One fetched JWKS. Several keys may share a `kid` (e.g. one RSA and one EC key).
#[derive(Default)]
pub(crate) struct KeySet {
    by_kid: HashMap<String, Vec<VerifyKey>>,
}

impl KeySet {
    /// Parses a JWKS document, skipping every key the gateway must not or cannot use. A set
    /// left with no usable key is an error: it would refuse every token.
    pub(crate) fn parse(body: &[u8]) -> Result<KeySet, String> {
        // Keys are parsed one by one so that one exotic key does not void the whole set.
        #[derive(Deserialize)]
        struct Raw {
            keys: Vec<serde_json::Value>,
        }
        let raw: Raw = serde_json::from_slice(body).map_err(|e| format!("not a JWKS: {e}"))?;
        let mut set = KeySet::default();
        let mut skipped = 0;
        for value in raw.keys {
            let usable = serde_json::from_value::<Jwk>(value)
                .map_err(|_| "unparsable JWK")
                .and_then(|jwk| usable(&jwk));
            match usable {
                Ok((kid, key)) => set.by_kid.entry(kid).or_default().push(key),
                Err(why) => {
                    skipped += 1;
                    log::debug!("JWKS: key skipped: {why}");
                }
            }
        }
        if set.by_kid.is_empty() {
            return Err(format!(
                "JWKS holds no usable signing key ({skipped} skipped)"
            ));
        }
        Ok(set)
    }

    pub(crate) fn find(&self, kid: &str, alg: Algorithm) -> Option<&VerifyKey> {
        self.by_kid.get(kid)?.iter().find(|k| k.accepts(alg))
    }

    pub(crate) fn len(&self) -> usize {
        self.by_kid.values().map(Vec::len).sum()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.by_kid.is_empty()
    }

    /// True if some key of this set is not in `newer`: withdrawn, or replaced by other key
    /// material under the same `kid`. Tokens it verified must then be verified again.
    pub(crate) fn retired_in(&self, newer: &KeySet) -> bool {
        self.by_kid
            .iter()
            .any(|(kid, keys)| match newer.by_kid.get(kid) {
                None => true,
                Some(new) => keys
                    .iter()
                    .any(|old| !new.iter().any(|k| k.material == old.material)),
            })
    }
}

fn usable(jwk: &Jwk) -> Result<(String, VerifyKey), &'static str> {
    let common = &jwk.common;
    if !matches!(common.public_key_use, None | Some(PublicKeyUse::Signature)) {
        return Err("`use` is not `sig`");
    }
    if let Some(ops) = &common.key_operations {
        if !ops.contains(&KeyOperations::Verify) {
            return Err("`key_ops` lacks `verify`");
        }
    }
    let kid = match &common.key_id {
        Some(kid) if !kid.is_empty() && kid.len() <= MAX_KID_LEN => kid.clone(),
        _ => return Err("no `kid`, or one too long"),
    };
    let kind = match &jwk.algorithm {
        AlgorithmParameters::RSA(_) => KeyKind::Rsa,
        AlgorithmParameters::EllipticCurve(p) => match p.curve {
            EllipticCurve::P256 => KeyKind::EcP256,
            EllipticCurve::P384 => KeyKind::EcP384,
            _ => return Err("unsupported EC curve"),
        },
        AlgorithmParameters::OctetKeyPair(p) => match p.curve {
            EllipticCurve::Ed25519 => KeyKind::Ed25519,
            _ => return Err("unsupported OKP curve"),
        },
        // `from_jwk` would make an HMAC key of it: a public JWKS never holds a shared secret.
        AlgorithmParameters::OctetKey(_) => return Err("symmetric (`oct`) key"),
        _ => return Err("unsupported `kty`"),
    };
    let alg = match common.key_algorithm {
        None => None,
        // An `alg` we do not know (or an encryption one) means the key is not for us.
        Some(a) => match Algorithm::try_from(a) {
            Ok(a) if kind.fits(a) => Some(a),
            _ => return Err("`alg` does not fit the key or is not a signature algorithm"),
        },
    };
    let key = DecodingKey::from_jwk(jwk).map_err(|_| "malformed key parameters")?;
    let params = serde_json::to_vec(&jwk.algorithm).map_err(|_| "malformed key parameters")?;
    let material = Sha256::digest(&params).into();
    Ok((
        kid,
        VerifyKey {
            key,
            material,
            kind,
            alg,
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    // Base64url of arbitrary bytes: enough for parsing and matching, never for a signature.
    const N: &str = "sXchDaQebHnPiGvyDOAT4saGEUetSyo9MKLOoWFsueri23bOdgWp4Dy1WlUzewbgBHod5pcM9H95GQRV3JDXboIRROSBigeC5yjU1hGzHHyXss8UDprecbAYxknTcQkhslANGRUZmdTOQ5qTRsLAt6BTYuyvVRdhS8exSZEy_c4gs_7svlJJQ4H9_NxsiIoLwAEk7-Q3UXERGYw_75IDrGA84-lA_-Ct4eTlXHBIY2EaV7t7LjJaynVJCpkv4LKjTTAumiGUIuQhrNhZLuF_RJLqHpM2kgWFLU7-VTdL1VbC2tejvcI2BlMkEpk1BzBZI0KQB0GaDWFLN-aEAw3vRw";
    const XY: &str = "f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU";

    fn set(keys: serde_json::Value) -> Result<KeySet, String> {
        KeySet::parse(json!({ "keys": keys }).to_string().as_bytes())
    }

    #[test]
    fn skips_keys_the_gateway_must_not_use() {
        let s = set(json!([
            {"kty": "oct", "kid": "h", "k": "c2VjcmV0"},
            {"kty": "RSA", "kid": "enc", "use": "enc", "n": N, "e": "AQAB"},
            {"kty": "RSA", "kid": "ops", "key_ops": ["encrypt"], "n": N, "e": "AQAB"},
            {"kty": "RSA", "n": N, "e": "AQAB"},
            {"kty": "RSA", "kid": "oaep", "alg": "RSA-OAEP", "n": N, "e": "AQAB"},
            {"kty": "RSA", "kid": "mismatch", "alg": "ES256", "n": N, "e": "AQAB"},
            {"kty": "EC", "kid": "p521", "crv": "P-521", "x": XY, "y": XY},
            {"kty": "RSA", "kid": "broken"},
            {"kty": "RSA", "kid": "ok", "use": "sig", "n": N, "e": "AQAB"},
        ]))
        .unwrap();
        assert_eq!(s.len(), 1);
        assert!(s.find("h", Algorithm::HS256).is_none());
        assert!(s.find("ok", Algorithm::RS256).is_some());
    }

    #[test]
    fn a_set_without_usable_keys_is_an_error() {
        assert!(set(json!([{"kty": "oct", "kid": "h", "k": "c2VjcmV0"}])).is_err());
        assert!(set(json!([])).is_err());
        assert!(KeySet::parse(b"{\"keys\": 3}").is_err());
        assert!(KeySet::parse(b"<html>").is_err());
    }

    #[test]
    fn key_type_and_alg_must_fit_the_token_alg() {
        use Algorithm::*;
        let s = set(json!([
            {"kty": "RSA", "kid": "rsa", "n": N, "e": "AQAB"},
            {"kty": "RSA", "kid": "rs384", "alg": "RS384", "n": N, "e": "AQAB"},
            {"kty": "EC", "kid": "p256", "crv": "P-256", "x": XY, "y": XY},
            {"kty": "EC", "kid": "p384", "crv": "P-384", "x": XY, "y": XY},
            {"kty": "OKP", "kid": "ed", "crv": "Ed25519", "x": XY},
            {"kty": "OKP", "kid": "x", "crv": "X25519", "x": XY},
        ]))
        .unwrap();
        assert!(s.find("rsa", RS256).is_some() && s.find("rsa", PS512).is_some());
        assert!(s.find("rsa", ES256).is_none() && s.find("rsa", HS256).is_none());
        assert!(s.find("rs384", RS384).is_some() && s.find("rs384", RS256).is_none());
        assert!(s.find("p256", ES256).is_some() && s.find("p256", ES384).is_none());
        assert!(s.find("p384", ES384).is_some() && s.find("p384", ES256).is_none());
        assert!(s.find("ed", EdDSA).is_some() && s.find("ed", ES256).is_none());
        assert!(s.find("x", EdDSA).is_none());
        assert!(s.find("nope", RS256).is_none());
    }

    #[test]
    fn withdrawn_and_replaced_keys_are_noticed() {
        let old = set(json!([{"kty": "RSA", "kid": "a", "n": N, "e": "AQAB"}])).unwrap();
        let same =
            set(json!([{"kty": "RSA", "kid": "a", "use": "sig", "n": N, "e": "AQAB"}])).unwrap();
        let other = set(json!([{"kty": "RSA", "kid": "b", "n": N, "e": "AQAB"}])).unwrap();
        // Same kid, other key material: the key was replaced.
        let replaced = set(json!([{"kty": "RSA", "kid": "a", "n": N, "e": "AQAD"}])).unwrap();
        let added = set(json!([
            {"kty": "RSA", "kid": "a", "n": N, "e": "AQAB"},
            {"kty": "EC", "kid": "a", "crv": "P-256", "x": XY, "y": XY},
        ]))
        .unwrap();
        assert!(!old.retired_in(&same));
        assert!(!old.retired_in(&added), "only an added key");
        assert!(old.retired_in(&other));
        assert!(old.retired_in(&replaced));
        assert!(added.retired_in(&old));
    }
}
