//! What porting the Python demo model takes: Python's semantics where its answers depend on
//! them (white space, truth values, `str()` of a JSON value) and CPython's `random.Random`,
//! whose numbers the embeddings are made of.

use aws_lc_rs::digest::{digest, SHA512};
use serde_json::{json, Value};

/// Python's `str.isspace`: Unicode white space plus the four ASCII separators U+001C..U+001F.
pub(super) fn is_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// Python's truth value of a JSON value.
pub(super) fn py_truthy(v: Option<&Value>) -> bool {
    match v {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(Value::Number(n)) => n.as_f64() != Some(0.0),
        Some(Value::String(s)) => !s.is_empty(),
        Some(Value::Array(a)) => !a.is_empty(),
        Some(Value::Object(o)) => !o.is_empty(),
    }
}

/// A JSON integer or boolean as Python's `isinstance(x, int)` sees it.
pub(super) fn py_int(v: Option<&Value>) -> Option<i64> {
    match v? {
        Value::Bool(b) => Some(*b as i64),
        Value::Number(n) => n.as_i64(),
        _ => None,
    }
}

/// Python's `str()` of a JSON value (a text part's `text` that is not a string). Nested strings
/// are quoted as Python's repr does, but only control characters up to U+00A0 are escaped, and
/// object keys come out sorted (serde_json's map) where Python kept the order received.
pub(super) fn py_str(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "None".into(),
        Value::Bool(b) => (if *b { "True" } else { "False" }).into(),
        Value::Number(n) if n.is_f64() => py_float(n.as_f64().unwrap_or_default()),
        Value::Number(n) => n.to_string(),
        Value::Array(a) => format!("[{}]", a.iter().map(py_repr).collect::<Vec<_>>().join(", ")),
        Value::Object(o) => {
            let items: Vec<String> = o
                .iter()
                .map(|(k, v)| format!("{}: {}", py_repr(&json!(k)), py_repr(v)))
                .collect();
            format!("{{{}}}", items.join(", "))
        }
    }
}

fn py_repr(v: &Value) -> String {
    let Value::String(s) = v else {
        return py_str(v);
    };
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    let mut out = String::from(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => out.extend(['\\', c]),
            c if (c as u32) < 0x20 || (0x7f..=0xa0).contains(&(c as u32)) => {
                out.push_str(&format!("\\x{:02x}", c as u32))
            }
            c => out.push(c),
        }
    }
    out.push(quote);
    out
}

/// Python's float repr: the shortest digits, in exponent form below 1e-4 and from 1e16.
fn py_float(x: f64) -> String {
    let sci = format!("{x:e}"); // shortest digits: "-1.5e-7", "1e16"
    let (mantissa, exp) = sci.split_once('e').unwrap();
    let exp: i32 = exp.parse().unwrap();
    if !(-4..16).contains(&exp) {
        let sign = if exp < 0 { '-' } else { '+' };
        return format!("{mantissa}e{sign}{:02}", exp.abs());
    }
    let s = format!("{x}");
    if s.contains('.') {
        s
    } else {
        format!("{s}.0")
    }
}

/// CPython's `random.Random`: MT19937, seeded from bytes the way `random.seed(bytes)` does.
pub(super) struct PyRandom {
    mt: [u32; 624],
    index: usize,
}

impl PyRandom {
    pub(super) fn from_bytes(seed: &[u8]) -> PyRandom {
        // The seed is the integer whose big-endian bytes are seed + SHA-512(seed), taken as
        // 32-bit words from the least significant, without leading zero words.
        let mut bytes = seed.to_vec();
        bytes.extend_from_slice(digest(&SHA512, seed).as_ref());
        let mut key: Vec<u32> = bytes
            .rchunks(4)
            .map(|w| w.iter().fold(0u32, |acc, b| (acc << 8) | u32::from(*b)))
            .collect();
        while key.len() > 1 && key.last() == Some(&0) {
            key.pop();
        }
        let mut r = PyRandom::genrand(19650218);
        let mt = &mut r.mt;
        let (mut i, mut j) = (1usize, 0usize);
        for _ in 0..624.max(key.len()) {
            let prev = mt[i - 1] ^ (mt[i - 1] >> 30);
            mt[i] = (mt[i] ^ prev.wrapping_mul(1664525))
                .wrapping_add(key[j])
                .wrapping_add(j as u32);
            i += 1;
            j += 1;
            if i >= 624 {
                mt[0] = mt[623];
                i = 1;
            }
            if j >= key.len() {
                j = 0;
            }
        }
        for _ in 0..623 {
            let prev = mt[i - 1] ^ (mt[i - 1] >> 30);
            mt[i] = (mt[i] ^ prev.wrapping_mul(1566083941)).wrapping_sub(i as u32);
            i += 1;
            if i >= 624 {
                mt[0] = mt[623];
                i = 1;
            }
        }
        mt[0] = 0x8000_0000;
        r
    }

    fn genrand(s: u32) -> PyRandom {
        let mut mt = [0u32; 624];
        mt[0] = s;
        for i in 1..624 {
            mt[i] = 1812433253u32
                .wrapping_mul(mt[i - 1] ^ (mt[i - 1] >> 30))
                .wrapping_add(i as u32);
        }
        PyRandom { mt, index: 624 }
    }

    fn next_u32(&mut self) -> u32 {
        if self.index >= 624 {
            for k in 0..624 {
                let y = (self.mt[k] & 0x8000_0000) | (self.mt[(k + 1) % 624] & 0x7fff_ffff);
                let mag = if y & 1 == 1 { 0x9908_b0df } else { 0 };
                self.mt[k] = self.mt[(k + 397) % 624] ^ (y >> 1) ^ mag;
            }
            self.index = 0;
        }
        let mut y = self.mt[self.index];
        self.index += 1;
        y ^= y >> 11;
        y ^= (y << 7) & 0x9d2c_5680;
        y ^= (y << 15) & 0xefc6_0000;
        y ^ (y >> 18)
    }

    /// `random.random()`: 53 random bits in [0, 1).
    pub(super) fn random(&mut self) -> f64 {
        let a = f64::from(self.next_u32() >> 5);
        let b = f64::from(self.next_u32() >> 6);
        (a * 67108864.0 + b) * (1.0 / 9007199254740992.0)
    }
}
