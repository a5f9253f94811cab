//! Loopback addresses and socket tricks: free ports, resets instead of closes, and a host that
//! never answers a connect.

use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::os::fd::AsRawFd;
use std::time::Duration;

pub fn free_port() -> u16 {
    // The kernel may hand a port out again once its listener is closed: never give one twice
    // in a test process, or two servers of one test (three stopped replicas) could share it.
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        if !given.contains(&port) {
            given.push(port);
            return port;
        }
    }
}

/// 127.0.0.1 and a free port.
pub fn local_addr() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], free_port()))
}

/// Free port on every one of `ips` (e.g. 127.0.0.2 and 127.0.0.3), for replicas that share a
/// port behind one DNS name.
pub fn free_port_on(ips: &[Ipv4Addr]) -> u16 {
    for _ in 0..100 {
        let first = TcpListener::bind((ips[0], 0)).unwrap();
        let port = first.local_addr().unwrap().port();
        if ips[1..]
            .iter()
            .all(|ip| TcpListener::bind((*ip, port)).is_ok())
        {
            return port;
        }
    }
    panic!("no port free on all of {ips:?}");
}

/// A TCP connection to `to` from the local address `from` (e.g. 127.0.0.2, to be another
/// client than 127.0.0.1 on loopback). Blocking, like `TcpStream::connect`.
pub fn connect_from(from: Ipv4Addr, to: SocketAddr) -> std::io::Result<std::net::TcpStream> {
    use std::os::fd::FromRawFd;
    let SocketAddr::V4(to) = to else {
        return Err(std::io::Error::other("connect_from: IPv4 only"));
    };
    let sockaddr = |ip: Ipv4Addr, port: u16| libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(ip).to_be(),
        },
        sin_zero: [0; 8],
    };
    let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: a new socket, owned by the TcpStream (closed on every error path below), and
    // valid sockaddr_in structs of the length given.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let stream = std::net::TcpStream::from_raw_fd(fd);
        let local = sockaddr(from, 0);
        if libc::bind(fd, &local as *const _ as *const libc::sockaddr, len) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let remote = sockaddr(*to.ip(), to.port());
        if libc::connect(fd, &remote as *const _ as *const libc::sockaddr, len) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(stream)
    }
}

/// Bytes waiting unread in a socket's receive buffer.
pub(crate) fn unread_bytes(conn: &impl AsRawFd) -> usize {
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD writes one c_int through the pointer; the fd is open (we hold the stream).
    let rc = unsafe { libc::ioctl(conn.as_raw_fd(), libc::FIONREAD, &mut n) };
    if rc == 0 {
        n.max(0) as usize
    } else {
        0
    }
}

/// Closes with RST rather than FIN: SO_LINGER on, timeout 0.
pub(crate) fn set_reset_on_close(conn: &impl AsRawFd) {
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: a valid linger struct and its size; the fd is open.
    unsafe {
        libc::setsockopt(
            conn.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            &linger as *const libc::linger as *const libc::c_void,
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        );
    }
}

/// A TCP address that never completes a connection: a listener with a backlog of 0 whose one
/// queue slot is taken, so the kernel drops every further SYN and connects time out (the
/// shape of a host that vanished from the network, as opposed to a refused port).
pub struct Blackhole {
    pub addr: SocketAddr,
    _listener: TcpListener,
    _filler: Vec<std::net::TcpStream>,
}

impl Blackhole {
    pub fn start() -> Blackhole {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        // SAFETY: listen(2) on our own listening socket just lowers its backlog.
        let rc = unsafe { libc::listen(listener.as_raw_fd(), 0) };
        assert_eq!(rc, 0, "listen(0) failed");
        let addr = listener.local_addr().unwrap();
        let mut filler = Vec::new();
        // Fill the accept queue (one slot with backlog 0); later connects must time out.
        while let Ok(s) = std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(300)) {
            filler.push(s);
            assert!(
                filler.len() < 8,
                "the blackhole keeps accepting connections"
            );
        }
        Blackhole {
            addr,
            _listener: listener,
            _filler: filler,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn host_port(&self) -> String {
        self.addr.to_string()
    }
}
