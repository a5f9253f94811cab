//! HTTPS upstreams: the certificate is verified against the upstream's host name, with the
//! platform roots or a service's own `ca_file`. A real TLS server (Python's ssl) on loopback,
//! with a throwaway CA made by the openssl CLI.

use std::path::Path;
use std::process::{Child, Command, Stdio};

use testkit::{Gateway, Service};

/// A CA, and a leaf for `san` signed by it, written into `dir`.
pub fn make_certs(dir: &Path, san: &str) {
    let run = |args: &[&str]| {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .expect("openssl CLI");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    run(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "1",
        "-subj",
        "/CN=Portcullis Test CA",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
    ]);
    run(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        "/CN=upstream",
        "-keyout",
        "leaf.key",
        "-out",
        "leaf.csr",
    ]);
    std::fs::write(dir.join("ext.cnf"), format!("subjectAltName={san}\n")).unwrap();
    run(&[
        "x509",
        "-req",
        "-in",
        "leaf.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "1",
        "-extfile",
        "ext.cnf",
        "-out",
        "leaf.pem",
    ]);
}

const TLS_SERVER: &str = r#"
import http.server, ssl, sys
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        body = b'{"tls":true}'
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a): pass
srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(sys.argv[1], sys.argv[2])
srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
print(srv.server_address[1], flush=True)
srv.serve_forever()
"#;

struct TlsUpstream {
    port: u16,
    child: Child,
}

impl TlsUpstream {
    fn start(dir: &Path) -> TlsUpstream {
        let mut child = Command::new("python3")
            .args(["-c", TLS_SERVER])
            .arg(dir.join("leaf.pem"))
            .arg(dir.join("leaf.key"))
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.take().unwrap()),
            &mut line,
        )
        .unwrap();
        TlsUpstream {
            port: line.trim().parse().expect("TLS server port"),
            child,
        }
    }
}

impl Drop for TlsUpstream {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An HTTPS client that trusts the throwaway CA `make_certs` wrote into `dir`.
pub fn client_trusting(dir: &Path) -> reqwest::Client {
    let pem = std::fs::read(dir.join("ca.pem")).unwrap();
    reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(&pem).unwrap())
        .build()
        .unwrap()
}

fn status(gw: &Gateway, key: &str, service: &str) -> (u16, Vec<u8>) {
    let req = format!("GET /v1/{service}/x HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {key}\r\nConnection: close\r\n\r\n");
    let (s, _, b) = gw.raw(req.as_bytes());
    (s, b)
}

#[test]
fn https_upstreams_are_verified_against_the_host_name() {
    let certs = tempfile::tempdir().unwrap();
    make_certs(certs.path(), "IP:127.0.0.1");
    let wrong = tempfile::tempdir().unwrap();
    make_certs(wrong.path(), "DNS:other.example");
    let good = TlsUpstream::start(certs.path());
    let misnamed = TlsUpstream::start(wrong.path());
    let ca = certs.path().join("ca.pem");
    let wrong_ca = wrong.path().join("ca.pem");
    let gw = Gateway::builder()
        // Trusted CA, right name: served over TLS.
        .service(Service::new("good", format!("https://127.0.0.1:{}", good.port)).ca_file(&ca))
        // Platform roots only: the private CA is not trusted.
        .service(Service::new(
            "untrusted",
            format!("https://127.0.0.1:{}", good.port),
        ))
        // Trusted CA, but the certificate names another host.
        .service(
            Service::new("misnamed", format!("https://127.0.0.1:{}", misnamed.port))
                .ca_file(&wrong_ca),
        )
        .start();
    let (key, _) = gw.create_key("good,untrusted,misnamed", &[]);
    assert_eq!(
        status(&gw, &key, "good"),
        (200, br#"{"tls":true}"#.to_vec())
    );
    for service in ["untrusted", "misnamed"] {
        let (code, body) = status(&gw, &key, service);
        assert_eq!(code, 502, "{service}: an unverifiable upstream was used");
        assert_eq!(
            serde_json::from_slice::<serde_json::Value>(&body).unwrap()["error"],
            "bad_gateway"
        );
    }
}

#[test]
fn a_bad_ca_file_is_refused_at_start_up() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("junk.pem"), "not a certificate").unwrap();
    let (ok, err) = testkit::check_config(
        dir.path(),
        &format!(
            "[services.x]\nupstream = \"https://127.0.0.1:1\"\nscope = \"x\"\nca_file = \"{0}/junk.pem\"\n\
             [services.y]\nupstream = \"https://127.0.0.1:1\"\nscope = \"y\"\nca_file = \"{0}/missing.pem\"\n",
            dir.path().display()
        ),
    );
    assert!(!ok);
    assert!(
        err.contains("services.x.ca_file") && err.contains("services.y.ca_file"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_terminates_tls_on_its_tls_listeners() {
    let certs = tempfile::tempdir().unwrap();
    make_certs(certs.path(), "IP:127.0.0.1");
    let up = testkit::Upstream::start();
    let tls_port = testkit::free_port();
    let tls = format!(
        "[server.tls]\nlisten = [\"127.0.0.1:{tls_port}\"]\ncert_file = \"{0}/leaf.pem\"\nkey_file = \"{0}/leaf.key\"\n",
        certs.path().display()
    );
    let builder = Gateway::builder()
        .service(Service::new("infer", up.url("")))
        .extra(&tls);
    let gw = tokio::task::block_in_place(|| builder.start());
    let (key, _) = gw.create_key("infer", &[]);
    let client = crate::tls::client_trusting(certs.path());
    let base = format!("https://127.0.0.1:{tls_port}");
    let health = client.get(format!("{base}/healthz")).send().await.unwrap();
    assert_eq!(health.status(), 200);
    let resp = client
        .get(format!("{base}/v1/infer/x?q=1"))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let got = up.last();
    assert_eq!(got.target, "/x?q=1");
    assert_eq!(got.header("x-forwarded-proto"), Some("https"));
    // Streams stay unbuffered through TLS: the first event long before the last is sent.
    let started = std::time::Instant::now();
    let mut stream = client
        .get(format!("{base}/v1/infer/sse?n=4&gap_ms=300"))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    stream.chunk().await.unwrap().unwrap();
    let first = started.elapsed();
    let mut rest = String::new();
    while let Some(c) = stream.chunk().await.unwrap() {
        rest.push_str(std::str::from_utf8(&c).unwrap());
    }
    assert!(rest.ends_with("data: [DONE]\n\n"));
    assert!(
        first + std::time::Duration::from_millis(600) < started.elapsed(),
        "TLS buffered the stream"
    );
    // The plaintext listener still serves, and says so.
    let plain = client
        .get(gw.url("/v1/infer/x"))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    assert_eq!(plain.status(), 200);
    assert_eq!(up.last().header("x-forwarded-proto"), Some("http"));
    // A client that does not trust the CA cannot talk to it.
    let strict = reqwest::Client::new();
    assert!(strict.get(format!("{base}/healthz")).send().await.is_err());
}

#[test]
fn unreadable_tls_material_is_refused_at_start_up() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("cert.pem"), "nope").unwrap();
    let (ok, err) = testkit::check_config(
        dir.path(),
        &format!(
            "[server]\nlisten = []\n[server.tls]\nlisten = [\"127.0.0.1:1\"]\n\
             cert_file = \"{0}/cert.pem\"\nkey_file = \"{0}/missing.key\"\n\
             [services.x]\nupstream = \"http://127.0.0.1:1\"\nscope = \"x\"\n",
            dir.path().display()
        ),
    );
    assert!(!ok);
    assert!(
        err.contains("server.tls.cert_file") && err.contains("server.tls.key_file"),
        "{err}"
    );
    assert!(
        !err.contains("server.listen"),
        "TLS listeners count as listeners: {err}"
    );
}
