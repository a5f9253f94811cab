//! Live DNS: a changed answer moves traffic, an outage keeps the last good address.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use testkit::dns::Dns;
use testkit::{free_port_on, Gateway, HitLog, Service, Upstream};

use super::{get_ok, DNS_NAME, P_IP, Q_IP};

/// P on 127.0.0.2:PORT and Q on 127.0.0.3:PORT; the DNS name points at P.
fn dns_setup(log: &HitLog) -> (Dns, Upstream, Upstream, u16) {
    let port = free_port_on(&[P_IP, Q_IP]);
    let p = Upstream::replica("P", SocketAddr::from((P_IP, port)), log);
    let q = Upstream::replica("Q", SocketAddr::from((Q_IP, port)), log);
    let dns = Dns::start();
    dns.set(DNS_NAME, &[P_IP]);
    (dns, p, q, port)
}

async fn wait_answered_by(gw: &Gateway, key: &str, want: &str, within: Duration) {
    let t = Instant::now();
    let mut i = 0;
    loop {
        let who = get_ok(gw, key, &format!("/v1/infer/move?i={i}")).await;
        if who == want {
            return;
        }
        assert!(
            t.elapsed() < within,
            "traffic still on {who} {within:?} after the DNS change:\n{}",
            gw.log()
        );
        i += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn a_changed_dns_answer_moves_traffic_to_the_new_address_without_a_restart() {
    let log = HitLog::new();
    let (dns, _p, _q, port) = dns_setup(&log);
    // The single-string form of `upstream`, a host name instead of an address.
    let gw = Gateway::builder()
        .service(Service::new("infer", format!("http://{DNS_NAME}:{port}")).dns_refresh(1))
        .extra(&format!("[dns]\nservers = [\"{}\"]\n", dns.addr()))
        .start();
    let (key, _) = gw.create_key("infer", &[]);
    for i in 0..3 {
        assert_eq!(get_ok(&gw, &key, &format!("/v1/infer/x?i={i}")).await, "P");
    }
    let asked = dns.queries_for(DNS_NAME);
    assert!(
        asked >= 1,
        "the gateway never asked the configured DNS server"
    );

    dns.set(DNS_NAME, &[Q_IP]);
    // P stays up: only a re-resolution can move the traffic.
    wait_answered_by(&gw, &key, "Q", Duration::from_secs(6)).await;
    for i in 0..5 {
        assert_eq!(
            get_ok(&gw, &key, &format!("/v1/infer/after?i={i}")).await,
            "Q"
        );
    }
    assert!(dns.queries_for(DNS_NAME) > asked);
}

#[tokio::test]
async fn dns_failures_keep_the_last_good_address_off_the_request_path_and_a_later_answer_still_counts(
) {
    let log = HitLog::new();
    let (dns, _p, _q, port) = dns_setup(&log);
    // The list form of `upstream`, one replica named by DNS.
    let gw = Gateway::builder()
        .service(Service::replicas("infer", &[format!("http://{DNS_NAME}:{port}")]).dns_refresh(1))
        .extra(&format!("[dns]\nservers = [\"{}\"]\n", dns.addr()))
        .start();
    let (key, _) = gw.create_key("infer", &[]);
    assert_eq!(get_ok(&gw, &key, "/v1/infer/first").await, "P");

    // NXDOMAIN, then a server that answers nothing: traffic stays on P, at full speed.
    for (what, fail) in [
        (
            "nxdomain",
            Box::new(|d: &Dns| d.remove(DNS_NAME)) as Box<dyn Fn(&Dns)>,
        ),
        ("silent", Box::new(|d: &Dns| d.set_silent(true))),
    ] {
        let asked = dns.queries_for(DNS_NAME);
        fail(&dns);
        let t = Instant::now();
        let mut i = 0;
        while t.elapsed() < Duration::from_secs(4) {
            let sent = Instant::now();
            let who = get_ok(&gw, &key, &format!("/v1/infer/{what}?i={i}")).await;
            assert_eq!(who, "P", "{what}: the last good address must be kept");
            assert!(
                sent.elapsed() < Duration::from_secs(1),
                "{what}: a request took {:?}: a resolver call on the request path?",
                sent.elapsed()
            );
            i += 1;
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        assert!(
            dns.queries_for(DNS_NAME) > asked,
            "{what}: the gateway stopped re-resolving"
        );
    }
    assert!(
        log.requests().iter().all(|h| h.replica == "P"),
        "nothing may have reached Q yet"
    );

    // The server recovers with a new address: the refresher is still alive and moves traffic.
    // (A lookup begun while the server was silent may take its resolver's full timeout, e.g.
    // hickory with 2 s x 2 attempts over UDP and TCP ~ 12 s, before the next one starts.)
    dns.set(DNS_NAME, &[Q_IP]);
    dns.set_silent(false);
    wait_answered_by(&gw, &key, "Q", Duration::from_secs(20)).await;
}
