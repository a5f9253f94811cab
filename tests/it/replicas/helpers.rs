//! The test helpers themselves (no gateway): so a failure in the other modules is not the
//! harness's fault.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use testkit::dns::Dns;
use testkit::{free_port_on, Blackhole, HitLog, Upstream};

use super::{P_IP, Q_IP};

#[test]
fn helper_dns_server_answers_a_records_nxdomain_and_nodata_over_udp_and_tcp() {
    use std::io::{Read, Write};
    use testkit::dns::{a_query, parse_a_answer};
    let dns = Dns::start();
    dns.set("replica.test", &[P_IP, Q_IP]);
    let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    udp.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let ask = |id: u16, name: &str, qtype: u16| {
        udp.send_to(&a_query(id, name, qtype), dns.addr()).unwrap();
        let mut buf = [0u8; 1500];
        let (n, _) = udp.recv_from(&mut buf).unwrap();
        assert_eq!(&buf[..2], &id.to_be_bytes(), "the id is echoed");
        parse_a_answer(&buf[..n]).unwrap()
    };
    assert_eq!(ask(7, "Replica.Test.", 1), (0, vec![P_IP, Q_IP]));
    assert_eq!(ask(8, "replica.test", 28), (0, vec![]));
    assert_eq!(ask(9, "other.test", 1), (3, vec![]));
    dns.set("replica.test", &[Q_IP]);
    assert_eq!(ask(10, "replica.test", 1), (0, vec![Q_IP]));
    dns.remove("replica.test");
    assert_eq!(ask(11, "replica.test", 1), (3, vec![]));

    dns.set("replica.test", &[P_IP]);
    let mut tcp = std::net::TcpStream::connect(dns.addr()).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let q = a_query(12, "replica.test", 1);
    tcp.write_all(&(q.len() as u16).to_be_bytes()).unwrap();
    tcp.write_all(&q).unwrap();
    let mut len = [0u8; 2];
    tcp.read_exact(&mut len).unwrap();
    let mut msg = vec![0u8; u16::from_be_bytes(len) as usize];
    tcp.read_exact(&mut msg).unwrap();
    assert_eq!(parse_a_answer(&msg).unwrap(), (0, vec![P_IP]));

    dns.set_silent(true);
    let before = dns.queries();
    udp.send_to(&a_query(13, "replica.test", 1), dns.addr())
        .unwrap();
    let mut buf = [0u8; 1500];
    assert!(
        udp.recv_from(&mut buf).is_err(),
        "a silent server answers nothing"
    );
    assert_eq!(dns.queries(), before + 1);
    assert_eq!(dns.queries_for("replica.test"), 6);
}

#[test]
fn helper_blackhole_times_out_connects_instead_of_refusing_them() {
    let hole = Blackhole::start();
    let t = Instant::now();
    let r = std::net::TcpStream::connect_timeout(&hole.addr, Duration::from_millis(700));
    assert!(r.is_err(), "a blackhole connect should not succeed");
    assert!(
        t.elapsed() >= Duration::from_millis(600),
        "refused rather than timed out: {r:?} after {:?}",
        t.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helper_replica_kill_resets_open_streams_refuses_connects_and_restarts_on_the_same_address()
{
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let log = HitLog::new();
    let port = free_port_on(&[P_IP, Q_IP]);
    let p = Upstream::replica("P", SocketAddr::from((P_IP, port)), &log);
    let q = Upstream::replica("Q", SocketAddr::from((Q_IP, port)), &log);
    let ask = |addr: SocketAddr, req: &'static str| async move {
        let mut s = tokio::net::TcpStream::connect(addr).await?;
        s.write_all(req.as_bytes()).await?;
        let mut out = Vec::new();
        let r = s.read_to_end(&mut out).await;
        Ok::<_, std::io::Error>((String::from_utf8_lossy(&out).into_owned(), r.err()))
    };
    let get = "GET /x HTTP/1.1\r\nHost: r\r\nConnection: close\r\n\r\n";
    // Connection: close is not honoured by the replica (it keeps the connection): read with
    // a deadline instead of to the end.
    let first_response_to = |addr: SocketAddr, req: &'static str| async move {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(req.as_bytes()).await.unwrap();
        let mut buf = vec![0u8; 4096];
        let n = s.read(&mut buf).await.unwrap();
        String::from_utf8_lossy(&buf[..n]).into_owned()
    };
    let first_response = |addr: SocketAddr| first_response_to(addr, get);
    assert!(first_response(p.addr).await.contains("\"replica\":\"P\""));
    assert!(first_response(q.addr).await.contains("\"replica\":\"Q\""));

    // A stream in flight on P: the kill cuts it with a reset and counts it.
    let mut s = tokio::net::TcpStream::connect(p.addr).await.unwrap();
    s.write_all(b"GET /sse?n=100&gap_ms=100 HTTP/1.1\r\nHost: r\r\n\r\n")
        .await
        .unwrap();
    let mut buf = vec![0u8; 4096];
    let n = s.read(&mut buf).await.unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).contains("event-stream"));
    assert_eq!(p.in_flight(), 1);
    let cut = tokio::task::block_in_place(|| p.kill());
    assert_eq!(cut, 1);
    let ended = tokio::time::timeout(Duration::from_secs(3), async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) => return "eof",
                Ok(_) => continue,
                Err(_) => return "reset",
            }
        }
    })
    .await
    .expect("the stream hung after the kill");
    assert_eq!(ended, "reset");
    let refused = tokio::net::TcpStream::connect(p.addr).await;
    assert!(refused.is_err(), "a killed replica refuses connections");
    assert!(first_response(q.addr).await.contains("\"replica\":\"Q\""));

    p.restart();
    assert!(first_response(p.addr).await.contains("\"replica\":\"P\""));

    // Reset before answering: the request is logged, the client sees a reset and no response.
    p.set_reset_before_answer(true);
    let (got, err) = ask(
        p.addr,
        "POST /gen?id=r1& HTTP/1.1\r\nHost: r\r\ncontent-length: 2\r\n\r\n{}",
    )
    .await
    .unwrap();
    assert!(got.is_empty(), "{got}");
    assert!(err.is_some(), "a reset, not a clean close");
    assert_eq!(log.replicas_for("id=r1&"), ["P"]);
    assert_eq!(log.matching("id=r1&")[0].body, b"{}");
    // Health checks still answer; unhealthy is a 503.
    p.set_healthy(false);
    let health = "GET /health HTTP/1.1\r\nHost: r\r\n\r\n";
    assert!(first_response_to(p.addr, health)
        .await
        .starts_with("HTTP/1.1 503"));
    p.set_healthy(true);
    assert!(first_response_to(p.addr, health)
        .await
        .starts_with("HTTP/1.1 200"));
    assert_eq!(log.health_checks("P"), 2);
}
