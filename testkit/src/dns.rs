//! A tiny authoritative DNS server on 127.0.0.1 (UDP and TCP on the same port) whose answers a
//! test changes while the gateway runs.
//!
//!   a name in the map, type A     NOERROR, one A record per address, TTL 1
//!   a name in the map, other type NOERROR, no answer (NODATA), SOA in authority (minimum 1)
//!   a name not in the map         NXDOMAIN, SOA in authority (minimum 1)
//!   `set_silent(true)`            every query counted and left unanswered (a dead server)
//!
//! Names match case-insensitively, with or without the trailing dot. Hand-written on std
//! sockets and threads: no DNS crate, no runtime.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const TYPE_A: u16 = 1;
const TYPE_SOA: u16 = 6;
const CLASS_IN: u16 = 1;
const NOERROR: u8 = 0;
const FORMERR: u8 = 1;
const NXDOMAIN: u8 = 3;
const NOTIMP: u8 = 4;

#[derive(Default)]
struct State {
    records: Mutex<HashMap<String, Vec<Ipv4Addr>>>,
    /// (name, qtype) of every query received, answered or not.
    log: Mutex<Vec<(String, u16)>>,
    queries: AtomicUsize,
    silent: AtomicBool,
    stop: AtomicBool,
}

pub struct Dns {
    pub port: u16,
    state: Arc<State>,
}

impl Dns {
    pub fn start() -> Dns {
        // UDP first on an ephemeral port, then TCP on the same number (retrying on a clash).
        let (udp, tcp) = loop {
            let udp = UdpSocket::bind("127.0.0.1:0").unwrap();
            let port = udp.local_addr().unwrap().port();
            if let Ok(tcp) = TcpListener::bind(("127.0.0.1", port)) {
                break (udp, tcp);
            }
        };
        let port = udp.local_addr().unwrap().port();
        let state = Arc::new(State::default());
        udp.set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        let s = state.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while !s.stop.load(Ordering::Relaxed) {
                let Ok((n, from)) = udp.recv_from(&mut buf) else {
                    continue;
                };
                if let Some(answer) = s.answer(&buf[..n]) {
                    let _ = udp.send_to(&answer, from);
                }
            }
        });
        let s = state.clone();
        std::thread::spawn(move || {
            for conn in tcp.incoming() {
                if s.stop.load(Ordering::Relaxed) {
                    return;
                }
                let Ok(conn) = conn else { continue };
                let s = s.clone();
                std::thread::spawn(move || serve_tcp(conn, &s));
            }
        });
        Dns { port, state }
    }

    /// `127.0.0.1:PORT`, for `[dns] servers`.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Answers `name` with these A records from now on (an empty slice: NODATA).
    pub fn set(&self, name: &str, ips: &[Ipv4Addr]) {
        self.state
            .records
            .lock()
            .unwrap()
            .insert(normalise(name), ips.to_vec());
    }

    /// `name` is NXDOMAIN from now on.
    pub fn remove(&self, name: &str) {
        self.state.records.lock().unwrap().remove(&normalise(name));
    }

    /// A silent server counts queries and answers none of them.
    pub fn set_silent(&self, silent: bool) {
        self.state.silent.store(silent, Ordering::Relaxed);
    }

    /// Queries received so far (UDP and TCP, answered or not).
    pub fn queries(&self) -> usize {
        self.state.queries.load(Ordering::Relaxed)
    }

    /// Queries received so far for `name` (any type).
    pub fn queries_for(&self, name: &str) -> usize {
        let name = normalise(name);
        self.state
            .log
            .lock()
            .unwrap()
            .iter()
            .filter(|(n, _)| *n == name)
            .count()
    }
}

impl Drop for Dns {
    fn drop(&mut self) {
        self.state.stop.store(true, Ordering::Relaxed);
        // Wake the TCP accept loop; the UDP loop notices within its read timeout.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

fn normalise(name: &str) -> String {
    name.trim_end_matches('.').to_ascii_lowercase()
}

fn serve_tcp(mut conn: TcpStream, state: &State) {
    let _ = conn.set_read_timeout(Some(Duration::from_secs(10)));
    loop {
        let mut len = [0u8; 2];
        if conn.read_exact(&mut len).is_err() || state.stop.load(Ordering::Relaxed) {
            return;
        }
        let mut msg = vec![0u8; u16::from_be_bytes(len) as usize];
        if conn.read_exact(&mut msg).is_err() {
            return;
        }
        let Some(answer) = state.answer(&msg) else {
            continue;
        };
        let mut out = (answer.len() as u16).to_be_bytes().to_vec();
        out.extend_from_slice(&answer);
        if conn.write_all(&out).is_err() {
            return;
        }
    }
}

impl State {
    /// The response to one query message; None to stay silent (or for garbage without an id).
    fn answer(&self, query: &[u8]) -> Option<Vec<u8>> {
        if query.len() < 12 {
            return None;
        }
        self.queries.fetch_add(1, Ordering::Relaxed);
        let question = parse_question(query);
        if let Some((name, qtype, _)) = &question {
            self.log.lock().unwrap().push((name.clone(), *qtype));
        }
        if self.silent.load(Ordering::Relaxed) {
            return None;
        }
        let opcode = (query[2] >> 3) & 0x0f;
        let Some((name, qtype, question_end)) = question else {
            return Some(header(query, FORMERR, 0, 0, 0));
        };
        if opcode != 0 || query[2] & 0x80 != 0 {
            return Some(header(query, NOTIMP, 0, 0, 0));
        }
        let ips = self.records.lock().unwrap().get(&name).cloned();
        let (rcode, answers) = match ips {
            None => (NXDOMAIN, Vec::new()),
            Some(ips) if qtype == TYPE_A => (NOERROR, ips),
            Some(_) => (NOERROR, Vec::new()),
        };
        let soa = answers.is_empty();
        let mut out = header(query, rcode, 1, answers.len() as u16, soa as u16);
        out.extend_from_slice(&query[12..question_end]);
        for ip in &answers {
            // The owner is the question's name: a pointer to offset 12.
            out.extend_from_slice(&[0xc0, 0x0c]);
            out.extend_from_slice(&TYPE_A.to_be_bytes());
            out.extend_from_slice(&CLASS_IN.to_be_bytes());
            out.extend_from_slice(&1u32.to_be_bytes());
            out.extend_from_slice(&4u16.to_be_bytes());
            out.extend_from_slice(&ip.octets());
        }
        if soa {
            // Negative answers carry an SOA so resolvers cache them for its minimum (1 s).
            let mut rdata = Vec::new();
            for label in ["ns", "test"] {
                rdata.push(label.len() as u8);
                rdata.extend_from_slice(label.as_bytes());
            }
            rdata.push(0);
            for label in ["hostmaster", "test"] {
                rdata.push(label.len() as u8);
                rdata.extend_from_slice(label.as_bytes());
            }
            rdata.push(0);
            for v in [1u32, 60, 60, 60, 1] {
                rdata.extend_from_slice(&v.to_be_bytes());
            }
            out.extend_from_slice(&[0xc0, 0x0c]);
            out.extend_from_slice(&TYPE_SOA.to_be_bytes());
            out.extend_from_slice(&CLASS_IN.to_be_bytes());
            out.extend_from_slice(&1u32.to_be_bytes());
            out.extend_from_slice(&(rdata.len() as u16).to_be_bytes());
            out.extend_from_slice(&rdata);
        }
        Some(out)
    }
}

/// A response header for `query`: same id, opcode and RD; QR, AA and RA set.
fn header(query: &[u8], rcode: u8, qd: u16, an: u16, ns: u16) -> Vec<u8> {
    let mut out = Vec::with_capacity(512);
    out.extend_from_slice(&query[0..2]);
    out.push(0x80 | (query[2] & 0x78) | 0x04 | (query[2] & 0x01));
    out.push(0x80 | (rcode & 0x0f));
    for count in [qd, an, ns, 0] {
        out.extend_from_slice(&count.to_be_bytes());
    }
    out
}

/// (lower-cased name without the trailing dot, qtype, end offset of the question) of a
/// message with exactly one question.
fn parse_question(msg: &[u8]) -> Option<(String, u16, usize)> {
    if u16::from_be_bytes([msg[4], msg[5]]) != 1 {
        return None;
    }
    let mut labels = Vec::new();
    let mut i = 12;
    loop {
        let len = *msg.get(i)? as usize;
        i += 1;
        if len == 0 {
            break;
        }
        if len & 0xc0 != 0 {
            // No compression pointers in a question we accept.
            return None;
        }
        labels.push(String::from_utf8_lossy(msg.get(i..i + len)?).to_ascii_lowercase());
        i += len;
    }
    let qtype = u16::from_be_bytes([*msg.get(i)?, *msg.get(i + 1)?]);
    msg.get(i + 3)?;
    Some((labels.join("."), qtype, i + 4))
}

/// A minimal A query for `name` with id `id`, e.g. for checking the server itself.
pub fn a_query(id: u16, name: &str, qtype: u16) -> Vec<u8> {
    let mut q = id.to_be_bytes().to_vec();
    q.extend_from_slice(&[0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]);
    for label in name.trim_end_matches('.').split('.') {
        q.push(label.len() as u8);
        q.extend_from_slice(label.as_bytes());
    }
    q.push(0);
    q.extend_from_slice(&qtype.to_be_bytes());
    q.extend_from_slice(&CLASS_IN.to_be_bytes());
    q
}

/// (rcode, A addresses in the answer section) of a response to `a_query`.
pub fn parse_a_answer(msg: &[u8]) -> Option<(u8, Vec<Ipv4Addr>)> {
    let rcode = msg.get(3)? & 0x0f;
    let an = u16::from_be_bytes([*msg.get(6)?, *msg.get(7)?]);
    let (_, _, mut i) = parse_question(msg)?;
    let mut ips = Vec::new();
    for _ in 0..an {
        // Owner: a pointer (2 bytes) in what this server writes.
        i += 2;
        let rtype = u16::from_be_bytes([*msg.get(i)?, *msg.get(i + 1)?]);
        let rdlen = u16::from_be_bytes([*msg.get(i + 8)?, *msg.get(i + 9)?]) as usize;
        let rdata = msg.get(i + 10..i + 10 + rdlen)?;
        if rtype == TYPE_A && rdlen == 4 {
            ips.push(Ipv4Addr::new(rdata[0], rdata[1], rdata[2], rdata[3]));
        }
        i += 10 + rdlen;
    }
    Some((rcode, ips))
}
