//! Client connections: the accept loop, a timeout on each phase of a
//! connection, and a cap on how many are open, so that clients that stall
//! cannot hold the server's file descriptors until nobody else gets in.
//!
//! Who keeps each timeout:
//! - the request head (`header_read_timeout`) and the wait between requests
//!   (`idle_connection_timeout`): the connection's own task, which knows
//!   whether a request is in the service and whether a byte of the next one
//!   has arrived. hyper's `header_read_timeout` starts its clock when the
//!   previous response ends, so it cannot tell the two apart and would cut
//!   every kept-alive connection at the head's short limit;
//! - the body (`body_read_timeout`): tower-http's `TimeoutBody`, whose clock
//!   restarts with every frame, so a slow body passes and a stalled one fails;
//! - writing the response (`write_timeout`): tokio-io-timeout's write
//!   timeout on the socket, whose clock restarts with every byte written.

use crate::sync::Recover;
use std::collections::BTreeMap;
use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::Router;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_io_timeout::TimeoutStream;
use tower::ServiceExt;
use tower_http::timeout::{TimeoutBody, TimeoutError};

use crate::config::ServerConfig;

/// File descriptors kept back from client connections: the listener, logs,
/// runtime libraries, model and tokenizer files while a model loads, and three
/// pipes per engine process.
const RESERVED_FDS: u64 = 128;
/// More kept back per configured model (its files and its engine's pipes).
const RESERVED_FDS_PER_MODEL: u64 = 16;
/// Connections past the cap that may still be closing (inside the reserve).
const CLOSING_ROOM: usize = 32;

/// What bounds a connection, read from `[server]` for each new connection.
#[derive(Clone, Copy, Debug)]
pub struct ConnectionLimits {
    pub header_read: Option<Duration>,
    pub body_read: Option<Duration>,
    pub idle: Option<Duration>,
    pub write: Option<Duration>,
    /// Most connections open at once.
    pub max_connections: usize,
}

impl ConnectionLimits {
    pub fn new(server: &ServerConfig, open_file_limit: Option<u64>, models: usize) -> Self {
        Self {
            header_read: ServerConfig::timeout(server.header_read_timeout),
            body_read: ServerConfig::timeout(server.body_read_timeout),
            idle: ServerConfig::timeout(server.idle_connection_timeout),
            write: ServerConfig::timeout(server.write_timeout),
            max_connections: connection_cap(server.max_connections, open_file_limit, models),
        }
    }
}

/// The connection cap: `max_connections`, but never more than the open-file
/// limit less the reserve (a larger setting would let connections take the
/// descriptors a model load needs, and accept() would fail for everyone).
pub fn connection_cap(configured: Option<usize>, open_file_limit: Option<u64>, models: usize) -> usize {
    let room = open_file_limit.map(|limit| {
        let reserve = (RESERVED_FDS + RESERVED_FDS_PER_MODEL * models as u64).min(limit / 2);
        (limit - reserve).max(1) as usize
    });
    match (configured, room) {
        (Some(wanted), Some(room)) => wanted.min(room),
        (Some(wanted), None) => wanted,
        (None, Some(room)) => room,
        (None, None) => 10_000,
    }
}

/// Raises the soft open-file limit to the hard one (service managers often
/// start a process at 1,024) and logs both; the soft limit now in force.
pub fn raise_open_file_limit() -> Option<u64> {
    #[cfg(unix)]
    {
        let (soft, hard) = rlimit::Resource::NOFILE.get().ok()?;
        // increase_nofile_limit also respects macOS's per-process ceiling.
        let now = rlimit::increase_nofile_limit(hard).unwrap_or(soft);
        tracing::info!(soft_at_start = soft, hard, soft_now = now, "open-file limit");
        Some(now)
    }
    #[cfg(not(unix))]
    None
}

/// Why a connection ended, a label of `eeane_http_connections_closed_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Closed {
    /// The client closed it, or the exchange ended as HTTP says (Connection: close, an error answer).
    Client,
    HeadTimeout,
    BodyTimeout,
    IdleTimeout,
    WriteTimeout,
    /// Closed at the cap to make room for a new connection.
    Evicted,
}

impl Closed {
    fn label(self) -> &'static str {
        match self {
            Closed::Client => "client",
            Closed::HeadTimeout => "head_timeout",
            Closed::BodyTimeout => "body_timeout",
            Closed::IdleTimeout => "idle_timeout",
            Closed::WriteTimeout => "write_timeout",
            Closed::Evicted => "evicted",
        }
    }
}

/// One connection's state, shared by its task, its socket reader, its
/// requests and the accept loop (for eviction). Times are milliseconds since
/// the table's epoch.
struct Connection {
    /// Requests in the service or still writing their response.
    in_service: AtomicUsize,
    /// True once a response has ended and no byte of the next request has come.
    idle: AtomicBool,
    idle_since: AtomicU64,
    /// When the first byte of the request head now being read arrived.
    head_since: AtomicU64,
    /// The last write to the socket could not finish (the client's receive
    /// window is full). hyper lets go of a response body once it holds all of
    /// it, before it is written, so this, not `in_service`, says a response is
    /// still going out; while it holds, only the write timeout applies.
    write_blocked: AtomicBool,
    /// A request's body is still arriving (the body is not yet read and dropped).
    receiving_body: AtomicBool,
    /// When the head of the request whose body is arriving was whole.
    body_since: AtomicU64,
    body_timed_out: AtomicBool,
    evicted: AtomicBool,
    /// Wakes the connection's task when its phase changes.
    changed: Notify,
    evict: Notify,
}

/// The open connections in the order they were accepted.
struct Table {
    epoch: Instant,
    open: Mutex<BTreeMap<u64, Arc<Connection>>>,
    /// Wakes the accept loop when it waits for closing connections to go.
    removed: Notify,
    /// Connections evicted whose task has not ended yet (kept as a count:
    /// the accept path must not walk the table to learn it).
    closing: AtomicUsize,
}

impl Table {
    fn now(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    fn at(&self, ms: u64) -> Instant {
        self.epoch + Duration::from_millis(ms)
    }

    /// Registers a new connection; at the cap, first evicts one that is doing
    /// no work: the oldest idle between requests, else the oldest still sending
    /// a head, else the oldest still sending a body. None: every connection
    /// has a request at work, refuse the new one.
    fn admit(&self, id: u64, cap: usize) -> Option<Arc<Connection>> {
        let mut open = self.open.locked();
        if open.len().saturating_sub(self.closing.load(Ordering::Relaxed)) >= cap {
            let victim = eviction_candidate(open.values())?;
            victim.evicted.store(true, Ordering::Relaxed);
            self.closing.fetch_add(1, Ordering::Relaxed);
            victim.evict.notify_one();
        }
        let now = self.now();
        let connection = Arc::new(Connection {
            in_service: AtomicUsize::new(0),
            idle: AtomicBool::new(false),
            idle_since: AtomicU64::new(now),
            head_since: AtomicU64::new(now),
            write_blocked: AtomicBool::new(false),
            receiving_body: AtomicBool::new(false),
            body_since: AtomicU64::new(now),
            body_timed_out: AtomicBool::new(false),
            evicted: AtomicBool::new(false),
            changed: Notify::new(),
            evict: Notify::new(),
        });
        open.insert(id, connection.clone());
        metrics::gauge!("eeane_http_connections_open").set(open.len() as f64);
        Some(connection)
    }

    fn remove(&self, id: u64) {
        let mut open = self.open.locked();
        if open.remove(&id).is_some_and(|c| c.evicted.load(Ordering::Relaxed)) {
            self.closing.fetch_sub(1, Ordering::Relaxed);
        }
        metrics::gauge!("eeane_http_connections_open").set(open.len() as f64);
        self.removed.notify_one();
    }

    fn len(&self) -> usize {
        self.open.locked().len()
    }

    /// When the connection's head or idle clock runs out, and which it is;
    /// None while a request is in the service.
    fn deadline(&self, connection: &Connection, limits: &ConnectionLimits) -> Option<(Instant, Closed)> {
        if connection.in_service.load(Ordering::Acquire) > 0 || connection.write_blocked.load(Ordering::Acquire) {
            return None;
        }
        if connection.idle.load(Ordering::Acquire) {
            let limit = limits.idle?;
            Some((self.at(connection.idle_since.load(Ordering::Acquire)) + limit, Closed::IdleTimeout))
        } else {
            let limit = limits.header_read?;
            Some((self.at(connection.head_since.load(Ordering::Acquire)) + limit, Closed::HeadTimeout))
        }
    }
}

/// The connection to close at the cap (see `Table::admit`): the one idle
/// longest between requests, else the one stuck longest in sending a head or
/// a body. A request at work (its body read whole) is never chosen.
fn eviction_candidate<'a>(open: impl Iterator<Item = &'a Arc<Connection>>) -> Option<&'a Arc<Connection>> {
    open.filter(|c| !c.evicted.load(Ordering::Relaxed))
        .filter_map(|c| {
            let key = match c.in_service.load(Ordering::Acquire) {
                0 if c.idle.load(Ordering::Acquire) => (0, c.idle_since.load(Ordering::Relaxed)),
                0 => (1, c.head_since.load(Ordering::Relaxed)),
                _ if c.receiving_body.load(Ordering::Acquire) => (1, c.body_since.load(Ordering::Relaxed)),
                _ => return None,
            };
            Some((key, c))
        })
        .min_by_key(|(key, _)| *key)
        .map(|(_, c)| c)
}

/// Held while a request is in the service and its response is being written
/// (it rides in the response body, dropped when the body is done).
struct InService {
    table: Arc<Table>,
    connection: Arc<Connection>,
}

impl InService {
    fn enter(table: &Arc<Table>, connection: &Arc<Connection>) -> Self {
        connection.in_service.fetch_add(1, Ordering::AcqRel);
        Self { table: table.clone(), connection: connection.clone() }
    }
}

impl Drop for InService {
    fn drop(&mut self) {
        if self.connection.in_service.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.connection.idle_since.store(self.table.now(), Ordering::Release);
            self.connection.idle.store(true, Ordering::Release);
            self.connection.changed.notify_one();
        }
    }
}

/// Held by a request's body: the connection is receiving a body until the
/// handler has read it whole (or given up) and dropped it.
struct ReceivingBody {
    connection: Arc<Connection>,
}

impl ReceivingBody {
    fn start(table: &Table, connection: &Arc<Connection>) -> Self {
        connection.body_since.store(table.now(), Ordering::Relaxed);
        connection.receiving_body.store(true, Ordering::Release);
        Self { connection: connection.clone() }
    }
}

impl Drop for ReceivingBody {
    fn drop(&mut self) {
        self.connection.receiving_body.store(false, Ordering::Relaxed);
    }
}

/// The socket, noting when the first byte of a request head arrives after an
/// idle spell (that starts the head's clock).
struct WatchedSocket {
    stream: TcpStream,
    table: Arc<Table>,
    connection: Arc<Connection>,
}

impl AsyncRead for WatchedSocket {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let result = Pin::new(&mut self.stream).poll_read(cx, buf);
        if buf.filled().len() > before && self.connection.idle.load(Ordering::Acquire) {
            self.connection.head_since.store(self.table.now(), Ordering::Release);
            self.connection.idle.store(false, Ordering::Release);
            self.connection.changed.notify_one();
        }
        result
    }
}

impl WatchedSocket {
    /// Notes whether a write is stuck; when one that was stuck goes through,
    /// a connection idle since is idle from now.
    fn note_write<T>(&self, result: &Poll<io::Result<T>>) {
        let blocked = result.is_pending();
        if self.connection.write_blocked.swap(blocked, Ordering::AcqRel) && !blocked {
            self.connection.idle_since.store(self.table.now(), Ordering::Release);
            self.connection.changed.notify_one();
        }
    }
}

impl AsyncWrite for WatchedSocket {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let result = Pin::new(&mut self.stream).poll_write(cx, buf);
        self.note_write(&result);
        result
    }

    fn poll_write_vectored(mut self: Pin<&mut Self>, cx: &mut Context<'_>, bufs: &[io::IoSlice<'_>]) -> Poll<io::Result<usize>> {
        let result = Pin::new(&mut self.stream).poll_write_vectored(cx, bufs);
        self.note_write(&result);
        result
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

/// Connections the kernel queues before they are accepted. tokio's default
/// (1,024) overflowed when a client opened 1,100 at once: the SYNs past it
/// were dropped, and an ordinary client's connect then waited 1 s for its
/// retransmission. Linux holds it to net.core.somaxconn (4,096 by default).
const LISTEN_BACKLOG: u32 = 4096;

/// Binds `address` (host:port; a name takes its first address that binds).
pub async fn bind(address: &str) -> io::Result<TcpListener> {
    let mut last = io::Error::new(io::ErrorKind::AddrNotAvailable, format!("{address} resolves to no address"));
    for candidate in tokio::net::lookup_host(address).await? {
        let socket = if candidate.is_ipv4() { tokio::net::TcpSocket::new_v4()? } else { tokio::net::TcpSocket::new_v6()? };
        // As std's and tokio's own bind: a restarted server may take the port
        // while the old one's connections sit in TIME_WAIT.
        #[cfg(unix)]
        socket.set_reuseaddr(true)?;
        match socket.bind(candidate).and_then(|()| socket.listen(LISTEN_BACKLOG)) {
            Ok(listener) => return Ok(listener),
            Err(e) => last = e,
        }
    }
    Err(last)
}

/// Serves `router` on `listener` until `shutdown` completes, then lets the
/// open connections finish (idle ones close at once). `limits` is read for
/// every new connection, so a config reload applies to the next ones.
pub async fn serve(listener: TcpListener, router: Router, limits: impl Fn() -> ConnectionLimits, shutdown: impl Future<Output = ()>) {
    let table = Arc::new(Table { epoch: Instant::now(), open: Mutex::new(BTreeMap::new()), removed: Notify::new(), closing: AtomicUsize::new(0) });
    let graceful = GracefulShutdown::new();
    let mut shutdown = pin!(shutdown);
    let mut next_id = 0u64;
    let mut cap_shown = None;
    loop {
        let limits = limits();
        // Connections closed at the cap hold their descriptor until their task
        // runs; a burst of new ones must not outrun them (measured: 1,100
        // connects at once reached 1,023 open files against a cap of 880).
        while table.len() >= limits.max_connections + CLOSING_ROOM {
            table.removed.notified().await;
        }
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    accept_failed(e).await;
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        next_id += 1;
        // Set when it changes (a reload), not per accept.
        if cap_shown.replace(limits.max_connections) != Some(limits.max_connections) {
            metrics::gauge!("eeane_http_connections_max").set(limits.max_connections as f64);
        }
        let Some(connection) = table.admit(next_id, limits.max_connections) else {
            refuse(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let admitted = Admitted { stream, peer, connection, id: next_id };
        let task = serve_connection(admitted, router.clone(), limits, table.clone(), &graceful);
        tokio::spawn(task);
    }
    drop(listener);
    graceful.shutdown().await;
}

/// accept() errors: one connection's (reset before it was taken) are
/// skipped; the rest (out of descriptors, despite the cap) are logged and
/// retried shortly, as the backlog holds the waiting clients meanwhile.
async fn accept_failed(e: io::Error) {
    if matches!(e.kind(), io::ErrorKind::ConnectionAborted | io::ErrorKind::ConnectionReset | io::ErrorKind::ConnectionRefused) {
        return;
    }
    metrics::counter!("eeane_http_accept_errors_total").increment(1);
    tracing::error!("accept error: {e}");
    tokio::time::sleep(Duration::from_millis(100)).await;
}

/// Past the cap with every connection busy: a 503 in the API's error shape if
/// the socket takes it at once (nothing is read or waited for), then close.
fn refuse(stream: TcpStream) {
    metrics::counter!("eeane_http_connections_refused_total").increment(1);
    const BODY: &str = r#"{"error":{"message":"The server has as many connections open as it allows (server.max_connections); retry shortly","type":"server_error","param":null,"code":"too_many_connections"}}"#;
    let response = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{BODY}",
        BODY.len()
    );
    let _ = stream.try_write(response.as_bytes());
}

/// A connection the table took: its socket, its peer, its entry and id.
struct Admitted {
    stream: TcpStream,
    peer: SocketAddr,
    connection: Arc<Connection>,
    id: u64,
}

fn serve_connection(
    admitted: Admitted,
    router: Router,
    limits: ConnectionLimits,
    table: Arc<Table>,
    graceful: &GracefulShutdown,
) -> impl Future<Output = ()> + Send + 'static {
    let Admitted { stream, peer, connection, id } = admitted;
    let mut socket = TimeoutStream::new(WatchedSocket { stream, table: table.clone(), connection: connection.clone() });
    socket.set_write_timeout(limits.write);
    let service = {
        let (table, connection) = (table.clone(), connection.clone());
        hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
            let in_service = InService::enter(&table, &connection);
            let receiving = ReceivingBody::start(&table, &connection);
            let mut request = request.map(|body| {
                // No limit: tokio takes a deadline past its range as "never".
                let timed = TimeoutBody::new(limits.body_read.unwrap_or(Duration::MAX), body);
                Body::new(timed.map_err(move |e| {
                    if e.is::<TimeoutError>() {
                        receiving.connection.body_timed_out.store(true, Ordering::Relaxed);
                    }
                    e
                }))
            });
            request.extensions_mut().insert(ConnectInfo(peer));
            let router = router.clone();
            async move {
                let response = router.oneshot(request).await.unwrap_or_else(|never| match never {});
                // The guard ends with the body, once the response is written (or dropped).
                Ok::<_, Infallible>(response.map(|body| {
                    Body::new(body.map_frame(move |frame| {
                        let _ = &in_service;
                        frame
                    }))
                }))
            }
        })
    };
    // hyper's own header_read_timeout stays off (no timer is given): the task
    // below keeps the head and idle clocks apart.
    let http = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(Box::pin(socket)), service);
    let http = graceful.watch(http);
    async move {
        let mut http = pin!(http);
        let closed = loop {
            let deadline = table.deadline(&connection, &limits);
            tokio::select! {
                result = http.as_mut() => break match result {
                    _ if connection.body_timed_out.load(Ordering::Relaxed) => Closed::BodyTimeout,
                    Err(e) if timed_out(&e) => Closed::WriteTimeout,
                    _ => Closed::Client,
                },
                _ = connection.evict.notified() => break Closed::Evicted,
                _ = connection.changed.notified() => {}
                _ = sleep_until(deadline) => {
                    // A request may have started since the deadline was computed.
                    if let Some((_, why)) = table.deadline(&connection, &limits).filter(|(at, _)| *at <= Instant::now()) {
                        break why;
                    }
                }
            }
        };
        table.remove(id);
        metrics::counter!("eeane_http_connections_closed_total", "reason" => closed.label()).increment(1);
    }
}

async fn sleep_until(deadline: Option<(Instant, Closed)>) {
    match deadline {
        Some((at, _)) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Whether hyper's error came from the socket's write timeout.
fn timed_out(error: &hyper::Error) -> bool {
    super::error::caused_by(error, |e| e.downcast_ref::<io::Error>().is_some_and(|e| e.kind() == io::ErrorKind::TimedOut))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cap_keeps_a_reserve_below_the_open_file_limit() {
        // 1,024 (systemd's default soft limit), one model: 1,024 - 128 - 16.
        assert_eq!(connection_cap(None, Some(1024), 1), 880);
        assert_eq!(connection_cap(Some(100), Some(1024), 1), 100);
        // A setting above what the limit allows is held to it.
        assert_eq!(connection_cap(Some(5000), Some(1024), 1), 880);
        // A tiny limit keeps half for the rest.
        assert_eq!(connection_cap(None, Some(200), 4), 100);
        assert_eq!(connection_cap(None, None, 1), 10_000);
    }

    fn table() -> Table {
        Table { epoch: Instant::now(), open: Mutex::new(BTreeMap::new()), removed: Notify::new(), closing: AtomicUsize::new(0) }
    }

    #[tokio::test]
    async fn at_the_cap_the_oldest_connection_not_in_service_makes_room() {
        let table = Arc::new(table());
        let first = table.admit(1, 2).unwrap();
        let second = table.admit(2, 2).unwrap();
        let _busy = InService::enter(&table, &first);
        // First is busy: the second (oldest not in service) is evicted.
        let _third = table.admit(3, 2).unwrap();
        assert!(!first.evicted.load(Ordering::Relaxed));
        assert!(second.evicted.load(Ordering::Relaxed));
        table.remove(2);
        // Now first and third are open, first busy: third goes.
        let _fourth = table.admit(4, 2).unwrap();
        table.remove(3);
        // First and fourth open; make fourth busy too: nothing to evict.
        let fourth = table.open.locked().get(&4).cloned().unwrap();
        let _busy_too = InService::enter(&table, &fourth);
        assert!(table.admit(5, 2).is_none());
    }

    #[tokio::test]
    async fn idle_goes_first_then_the_longest_stuck() {
        let table = Arc::new(table());
        let receiving = table.admit(1, 10).unwrap();
        let _request = InService::enter(&table, &receiving);
        let _body = ReceivingBody::start(&table, &receiving);
        tokio::time::sleep(Duration::from_millis(5)).await;
        // A head that began after the body stalled: the body goes first.
        let head = table.admit(2, 10).unwrap();
        let idle = table.admit(3, 10).unwrap();
        drop(InService::enter(&table, &idle));
        let open = table.open.locked();
        assert!(Arc::ptr_eq(eviction_candidate(open.values()).unwrap(), &idle));
        idle.evicted.store(true, Ordering::Relaxed);
        assert!(Arc::ptr_eq(eviction_candidate(open.values()).unwrap(), &receiving));
        receiving.evicted.store(true, Ordering::Relaxed);
        assert!(Arc::ptr_eq(eviction_candidate(open.values()).unwrap(), &head));
        head.evicted.store(true, Ordering::Relaxed);
        receiving.evicted.store(false, Ordering::Relaxed);
        drop(_body);
        assert!(eviction_candidate(open.values()).is_none(), "a request at work is never evicted");
    }

    #[tokio::test]
    async fn clocks_follow_the_phase() {
        let table = Arc::new(table());
        let connection = table.admit(1, 10).unwrap();
        let limits = ConnectionLimits {
            header_read: Some(Duration::from_secs(10)),
            body_read: None,
            idle: Some(Duration::from_secs(75)),
            write: None,
            max_connections: 10,
        };
        // New: the head's clock runs from the accept.
        assert_eq!(table.deadline(&connection, &limits).unwrap().1, Closed::HeadTimeout);
        let request = InService::enter(&table, &connection);
        assert!(table.deadline(&connection, &limits).is_none());
        drop(request);
        // Between requests: the idle clock, until a byte of the next head.
        assert_eq!(table.deadline(&connection, &limits).unwrap().1, Closed::IdleTimeout);
        connection.idle.store(false, Ordering::Relaxed);
        assert_eq!(table.deadline(&connection, &limits).unwrap().1, Closed::HeadTimeout);
        let no_limits = ConnectionLimits { header_read: None, idle: None, ..limits };
        assert!(table.deadline(&connection, &no_limits).is_none());
    }
}
