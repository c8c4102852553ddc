//! The admin socket: how a short-lived CLI process asks a running node to perform an operation
//! (the CLI owns no memory, so it cannot be a client itself). One Unix socket per node,
//! readable by its owner only; requests and replies are length-prefixed and bounded:
//!
//! ```text
//! request:  "NSA1" | op (u8) | key length (u32 LE) | value length (u32 LE) | key | value
//! reply:    status (u8) | payload length (u32 LE) | payload
//! ```
//! ops: [`AdminOp`] (EXTENSION carries its body in the value); statuses: [`ReplyStatus`] (STATUS carries
//! JSON, ERROR a UTF-8 message). A GET, PUT or DELETE that evicted keys to make room is
//! answered by an EVICTED reply before its own: its payload lists them, each as
//! `sure (u8: 1, or 0 if the eviction may not have taken effect) | key length (u32 LE) | key`
//! (histories record them; [`AdminClient::call`] passes them over, [`AdminClient::call_reporting`]
//! returns them). Anything malformed gets an ERROR reply and the connection is
//! closed; the server keeps serving.

use std::io::{Read, Write};
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use nessie_serve::accept::{wait_readable, Shedder};
use nessie_serve::pool::ClientPool;
use nessie_store::limits::{MAX_KEY_SIZE, MAX_VALUE_SIZE};

const MAGIC: &[u8; 4] = b"NSA1";
/// Concurrent admin connections a node serves; more are refused with an error reply.
pub const MAX_ADMIN_CONNECTIONS: usize = 32;
/// An idle connection is closed after this long.
const IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// A one-byte wire enum: each number is written once, here, and decoded by `from_u8`.
macro_rules! wire_enum {
    ($(#[$doc:meta])* $name:ident { $($variant:ident = $value:literal),+ $(,)? }) => {
        $(#[$doc])*
        #[derive(Copy, Clone, Debug, PartialEq, Eq)]
        #[repr(u8)]
        pub enum $name {
            $($variant = $value),+
        }

        impl $name {
            const ALL: &'static [$name] = &[$($name::$variant),+];

            fn from_u8(b: u8) -> Option<$name> {
                $name::ALL.iter().copied().find(|&v| v as u8 == b)
            }
        }
    };
}

wire_enum! {
    /// Request opcodes on the wire.
    AdminOp { Ping = 1, Get = 2, Put = 3, Delete = 4, Status = 5, Extension = 6, PutExpiring = 7, Migrate = 8, StepDown = 9 }
}

wire_enum! {
    /// Reply statuses on the wire.
    ReplyStatus { Ok = 0, Value = 1, NotFound = 2, Status = 3, Error = 4, Evicted = 5 }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    Ping,
    Get(Vec<u8>),
    Put(Vec<u8>, Vec<u8>),
    /// A PUT of an item that expires at the given time (ns since the Unix epoch, by the
    /// node's clock; 0 = never). On the wire the time leads the value, 8 bytes LE.
    PutExpiring(Vec<u8>, Vec<u8>, u64),
    Delete(Vec<u8>),
    Status,
    /// A request for the node's extension (e.g. the benchmark agent), carried in the value.
    Extension(Vec<u8>),
    /// Start migrating an index partition (`nessie migrate`): a [`MigrateRequest`] as JSON in
    /// the value; the reply is a status with the [`MigrateReply`] as JSON.
    Migrate(Vec<u8>),
    /// Leave membership now (`nessie leave`, once the node holds no index partition): stop
    /// writing, revoke the lease, so that the others declare it failed at once instead of a
    /// lease TTL after it stops.
    StepDown,
}

/// What `nessie migrate` asks a node: move index partition `partition` to a new chain on
/// `to` (distinct nodes, as many as the cluster keeps copies, primary first), in slots the
/// node picks.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct MigrateRequest {
    pub partition: u16,
    pub to: Vec<u16>,
}

/// What the node did: the epoch that starts the migration and the slots it chose.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct MigrateReply {
    pub epoch: u64,
    pub copies: Vec<nessie_membership::SlotCopy>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Response {
    Ok,
    Value(Vec<u8>),
    NotFound,
    Status(String),
    Error(String),
}

/// Keys a data request evicted to make room: each with whether the eviction surely took
/// effect (`KvClient::evicted`) or may not have (`KvClient::evicted_unsure`).
pub type Evictions = Vec<(Vec<u8>, bool)>;

/// Most evictions one EVICTED reply lists (one operation evicts a few dozen at most).
pub const MAX_EVICTIONS_REPORTED: usize = 4096;

/// The EVICTED reply for `evicted` (empty: none).
fn encode_evictions(evicted: &Evictions) -> Vec<u8> {
    if evicted.is_empty() {
        return Vec::new();
    }
    let mut p = Vec::new();
    for (key, sure) in evicted.iter().take(MAX_EVICTIONS_REPORTED) {
        p.push(u8::from(*sure));
        p.extend_from_slice(&(key.len() as u32).to_le_bytes());
        p.extend_from_slice(key);
    }
    let mut b = Vec::with_capacity(5 + p.len());
    b.push(ReplyStatus::Evicted as u8);
    b.extend_from_slice(&(p.len() as u32).to_le_bytes());
    b.extend_from_slice(&p);
    b
}

/// The keys of an EVICTED reply's payload.
fn decode_evictions(mut p: &[u8], out: &mut Evictions) -> Result<(), AdminError> {
    let bad = || AdminError::Malformed("a truncated EVICTED reply".into());
    while !p.is_empty() {
        if p.len() < 5 || out.len() >= MAX_EVICTIONS_REPORTED {
            return Err(bad());
        }
        let sure = match p[0] {
            0 => false,
            1 => true,
            b => return Err(AdminError::Malformed(format!("EVICTED flag {b}"))),
        };
        let len = u32::from_le_bytes(p[1..5].try_into().unwrap()) as usize;
        if len == 0 || len > MAX_KEY_SIZE as usize || p.len() < 5 + len {
            return Err(bad());
        }
        out.push((p[5..5 + len].to_vec(), sure));
        p = &p[5 + len..];
    }
    Ok(())
}

#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    #[error("cannot connect to {path}: {err} (is the node running? try `nessie status`)")]
    Connect { path: PathBuf, err: std::io::Error },
    #[error("admin socket I/O: {0}")]
    Io(#[from] std::io::Error),
    #[error("malformed admin message: {0}")]
    Malformed(String),
}

impl Request {
    fn encode(&self) -> Vec<u8> {
        let timed;
        let (op, k, v): (AdminOp, &[u8], &[u8]) = match self {
            Request::Ping => (AdminOp::Ping, &[], &[]),
            Request::Get(k) => (AdminOp::Get, k, &[]),
            Request::Put(k, v) => (AdminOp::Put, k, v),
            Request::PutExpiring(k, v, at) => {
                timed = [&at.to_le_bytes()[..], v].concat();
                (AdminOp::PutExpiring, k, &timed[..])
            }
            Request::Delete(k) => (AdminOp::Delete, k, &[]),
            Request::Status => (AdminOp::Status, &[], &[]),
            Request::Extension(v) => (AdminOp::Extension, &[], v),
            Request::Migrate(v) => (AdminOp::Migrate, &[], v),
            Request::StepDown => (AdminOp::StepDown, &[], &[]),
        };
        let mut b = Vec::with_capacity(13 + k.len() + v.len());
        b.extend_from_slice(MAGIC);
        b.push(op as u8);
        b.extend_from_slice(&(k.len() as u32).to_le_bytes());
        b.extend_from_slice(&(v.len() as u32).to_le_bytes());
        b.extend_from_slice(k);
        b.extend_from_slice(v);
        b
    }

    /// Read one request; `Ok(None)` on a clean end of stream.
    fn read(s: &mut impl Read) -> Result<Option<Request>, AdminError> {
        let mut head = [0u8; 13];
        match s.read_exact(&mut head[..1]) {
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
            r => r?,
        }
        // Check the magic as soon as it is in, so junk gets its answer without waiting.
        s.read_exact(&mut head[1..4])?;
        if &head[..4] != MAGIC {
            return Err(AdminError::Malformed(
                "bad magic (not a nessie admin request)".into(),
            ));
        }
        s.read_exact(&mut head[4..])?;
        let op = head[4];
        let klen = u32::from_le_bytes(head[5..9].try_into().unwrap());
        let vlen = u32::from_le_bytes(head[9..13].try_into().unwrap());
        if klen > MAX_KEY_SIZE {
            return Err(AdminError::Malformed(format!(
                "key of {klen} bytes exceeds {MAX_KEY_SIZE}"
            )));
        }
        if vlen > MAX_VALUE_SIZE {
            return Err(AdminError::Malformed(format!(
                "value of {vlen} bytes exceeds {MAX_VALUE_SIZE}"
            )));
        }
        let mut key = vec![0u8; klen as usize];
        s.read_exact(&mut key)?;
        let mut value = vec![0u8; vlen as usize];
        s.read_exact(&mut value)?;
        let no_payload = |r: Request| {
            if klen == 0 && vlen == 0 {
                Ok(Some(r))
            } else {
                Err(AdminError::Malformed(format!(
                    "op {op} takes no key or value"
                )))
            }
        };
        let no_value = |r: Request| {
            if vlen == 0 {
                Ok(Some(r))
            } else {
                Err(AdminError::Malformed(format!("op {op} takes no value")))
            }
        };
        match AdminOp::from_u8(op) {
            Some(AdminOp::Ping) => no_payload(Request::Ping),
            Some(AdminOp::Get) => no_value(Request::Get(key)),
            Some(AdminOp::Put) => Ok(Some(Request::Put(key, value))),
            Some(AdminOp::PutExpiring) if value.len() >= 8 => {
                let at = u64::from_le_bytes(value[..8].try_into().unwrap());
                Ok(Some(Request::PutExpiring(key, value[8..].to_vec(), at)))
            }
            Some(AdminOp::PutExpiring) => Err(AdminError::Malformed(
                "PUT_EXPIRING's value starts with its 8-byte expiry time".into(),
            )),
            Some(AdminOp::Delete) => no_value(Request::Delete(key)),
            Some(AdminOp::Status) => no_payload(Request::Status),
            Some(AdminOp::Extension) if klen == 0 => Ok(Some(Request::Extension(value))),
            Some(AdminOp::Migrate) if klen == 0 => Ok(Some(Request::Migrate(value))),
            Some(AdminOp::StepDown) => no_payload(Request::StepDown),
            _ => Err(AdminError::Malformed(format!("unknown op {op}"))),
        }
    }
}

impl Response {
    fn encode(&self) -> Vec<u8> {
        let (st, p): (ReplyStatus, &[u8]) = match self {
            Response::Ok => (ReplyStatus::Ok, &[]),
            Response::Value(v) => (ReplyStatus::Value, v),
            Response::NotFound => (ReplyStatus::NotFound, &[]),
            Response::Status(s) => (ReplyStatus::Status, s.as_bytes()),
            Response::Error(e) => (ReplyStatus::Error, e.as_bytes()),
        };
        let mut b = Vec::with_capacity(5 + p.len());
        b.push(st as u8);
        b.extend_from_slice(&(p.len() as u32).to_le_bytes());
        b.extend_from_slice(p);
        b
    }

    /// Read one reply, the EVICTED ones before it into `evicted`.
    fn read(s: &mut impl Read, evicted: &mut Evictions) -> Result<Response, AdminError> {
        loop {
            match Self::read_one(s)? {
                Ok(r) => return Ok(r),
                Err(p) => decode_evictions(&p, evicted)?,
            }
        }
    }

    /// One reply, or an EVICTED reply's payload.
    fn read_one(s: &mut impl Read) -> Result<Result<Response, Vec<u8>>, AdminError> {
        let mut head = [0u8; 5];
        s.read_exact(&mut head)?;
        let len = u32::from_le_bytes(head[1..5].try_into().unwrap());
        if len > MAX_VALUE_SIZE {
            return Err(AdminError::Malformed(format!("reply of {len} bytes")));
        }
        let mut p = vec![0u8; len as usize];
        s.read_exact(&mut p)?;
        let text = |p: Vec<u8>| String::from_utf8_lossy(&p).into_owned();
        Ok(Ok(match ReplyStatus::from_u8(head[0]) {
            Some(ReplyStatus::Evicted) => return Ok(Err(p)),
            Some(ReplyStatus::Ok) => Response::Ok,
            Some(ReplyStatus::Value) => Response::Value(p),
            Some(ReplyStatus::NotFound) => Response::NotFound,
            Some(ReplyStatus::Status) => Response::Status(text(p)),
            Some(ReplyStatus::Error) => Response::Error(text(p)),
            None => {
                let s = head[0];
                return Err(AdminError::Malformed(format!("unknown reply status {s}")));
            }
        }))
    }
}

/// Encode an operation error for an ERROR reply: JSON of the typed error, so the caller can
/// reconstruct it (see [`decode_error`]).
pub fn encode_error(e: &nessie_protocols::Error) -> String {
    serde_json::to_string(e).unwrap_or_else(|_| e.to_string())
}

/// The typed error in an ERROR reply; plain-text replies (malformed requests) become
/// `Error::Node`.
pub fn decode_error(text: &str) -> nessie_protocols::Error {
    serde_json::from_str(text).unwrap_or_else(|_| nessie_protocols::Error::Node(text.to_string()))
}

/// What serves admin requests.
pub trait Handler: Send + Sync + 'static {
    fn handle(&self, req: Request) -> Response {
        self.handle_evicting(req).0
    }

    /// [`Handler::handle`], with the keys a data request evicted to make room.
    fn handle_evicting(&self, req: Request) -> (Response, Evictions) {
        (self.handle(req), Evictions::new())
    }
}

/// Serve a data request with a client of `pool` (PING and STATUS are the caller's), with the
/// keys it evicted.
pub fn serve_pooled(pool: &ClientPool, req: Request) -> (Response, Evictions) {
    pool.with(|c| {
        let r = serve_with(c, req);
        let sure = c.evicted().iter().map(|k| (k.clone(), true));
        let unsure = c.evicted_unsure().iter().map(|k| (k.clone(), false));
        (r, sure.chain(unsure).collect())
    })
}

fn serve_with(c: &mut (impl nessie_protocols::KvClient + ?Sized), req: Request) -> Response {
    match req {
        Request::Get(k) => match c.get(&k) {
            Ok(Some(v)) => Response::Value(v),
            Ok(None) => Response::NotFound,
            Err(e) => Response::Error(encode_error(&e)),
        },
        Request::Put(k, v) => c
            .put(&k, &v)
            .map_or_else(|e| Response::Error(encode_error(&e)), |_| Response::Ok),
        Request::PutExpiring(k, v, at) => c
            .put_parts_expiring(&k, &[&v], at)
            .map_or_else(|e| Response::Error(encode_error(&e)), |_| Response::Ok),
        Request::Delete(k) => c
            .delete(&k)
            .map_or_else(|e| Response::Error(encode_error(&e)), |_| Response::Ok),
        Request::Ping => Response::Ok,
        Request::Status | Request::Extension(_) | Request::Migrate(_) | Request::StepDown => {
            Response::Error("not served by the client pool".into())
        }
    }
}

/// Listens on a Unix socket until dropped.
pub struct AdminServer {
    path: PathBuf,
    /// Device and inode of our socket file, so drop removes it only if it is still ours.
    inode: (u64, u64),
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// How often the accept loop looks at its stop flag: the bound on how long dropping an
/// [`AdminServer`] (and so stopping a node) waits for it.
const ACCEPT_POLL: Duration = Duration::from_millis(100);

/// A listening Unix socket at `path` that is its owner's only from the moment it exists:
/// Linux gives the socket file the mode of the socket's inode (less the umask), set with
/// `fchmod` before `bind`.
fn bind_private(path: &Path) -> std::io::Result<UnixListener> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    use std::os::unix::ffi::OsStrExt;
    let check = |r: libc::c_int| {
        if r < 0 {
            Err(std::io::Error::last_os_error())
        } else {
            Ok(r)
        }
    };
    // SAFETY: socket(2); the fd is owned by `fd` from here on.
    let fd = unsafe {
        OwnedFd::from_raw_fd(check(libc::socket(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_CLOEXEC,
            0,
        ))?)
    };
    // SAFETY: sockaddr_un is plain data; zeroed is a valid value.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = path.as_os_str().as_bytes();
    if bytes.len() >= addr.sun_path.len() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("socket path {} is too long", path.display()),
        ));
    }
    for (d, s) in addr.sun_path.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    let len = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
    // SAFETY: plain syscalls on our fd with a valid address of the given length.
    unsafe {
        check(libc::fchmod(fd.as_raw_fd(), 0o600))?;
        check(libc::bind(
            fd.as_raw_fd(),
            &addr as *const libc::sockaddr_un as *const libc::sockaddr,
            len,
        ))?;
        check(libc::listen(fd.as_raw_fd(), 128))?;
    }
    Ok(UnixListener::from(fd))
}

impl AdminServer {
    pub fn start(path: &Path, handler: Arc<dyn Handler>) -> std::io::Result<Self> {
        if path.exists() {
            // A socket nobody answers on is a leftover of a dead node; a live one is an error.
            if UnixStream::connect(path).is_ok() {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::AddrInUse,
                    format!("{} is in use by a running node", path.display()),
                ));
            }
            std::fs::remove_file(path)?;
        }
        let listener = bind_private(path)?;
        listener.set_nonblocking(true)?;
        let meta = std::fs::symlink_metadata(path)?;
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let thread = std::thread::Builder::new()
            .name("nessie-admin".into())
            .spawn(move || accept_loop(&listener, handler, &stop2))?;
        Ok(Self {
            path: path.to_path_buf(),
            inode: (meta.dev(), meta.ino()),
            stop,
            thread: Some(thread),
        })
    }
}

/// Serve connections on `listener` until `stop` is set. The listener is non-blocking and
/// polled with a timeout, so the loop notices `stop` even if nobody ever connects again (its
/// socket file may have been removed or replaced).
fn accept_loop(listener: &UnixListener, handler: Arc<dyn Handler>, stop: &AtomicBool) {
    use std::os::fd::AsRawFd;
    let active = Arc::new(AtomicUsize::new(0));
    let mut shedder = Shedder::new("admin");
    while !stop.load(Ordering::SeqCst) {
        wait_readable(listener.as_raw_fd(), ACCEPT_POLL);
        let mut s = match listener.accept() {
            Ok((s, _)) => s,
            Err(e) => {
                let refuse = |(mut s, _): (UnixStream, _)| {
                    let _ = s.set_nonblocking(false);
                    let busy = Response::Error("node busy: out of file descriptors".into());
                    let _ = s.write_all(&busy.encode());
                };
                shedder.failed(&e, || listener.accept(), refuse);
                continue;
            }
        };
        if s.set_nonblocking(false).is_err() {
            continue;
        }
        if active.fetch_add(1, Ordering::SeqCst) >= MAX_ADMIN_CONNECTIONS {
            active.fetch_sub(1, Ordering::SeqCst);
            let _ = s.write_all(
                &Response::Error("node busy: too many admin connections".into()).encode(),
            );
            continue;
        }
        let (handler, active) = (handler.clone(), active.clone());
        let _ = std::thread::Builder::new()
            .name("nessie-admin-conn".into())
            .spawn(move || {
                serve_connection(&mut s, handler.as_ref());
                active.fetch_sub(1, Ordering::SeqCst);
            });
    }
}

fn serve_connection(s: &mut UnixStream, handler: &dyn Handler) {
    let _ = s.set_read_timeout(Some(IDLE_TIMEOUT));
    loop {
        let reply = match Request::read(s) {
            Ok(None) => return,
            Ok(Some(req)) => handler.handle_evicting(req),
            Err(AdminError::Malformed(m)) => {
                let _ = s.write_all(&Response::Error(format!("malformed request: {m}")).encode());
                return;
            }
            Err(_) => return,
        };
        let (reply, evicted) = reply;
        let mut out = encode_evictions(&evicted);
        out.extend_from_slice(&reply.encode());
        if s.write_all(&out).is_err() {
            return;
        }
    }
}

impl Drop for AdminServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        // Remove the socket file only if it is ours, not a later server's at the same path.
        if std::fs::symlink_metadata(&self.path).is_ok_and(|m| (m.dev(), m.ino()) == self.inode) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// A connection to a node's admin socket.
pub struct AdminClient {
    s: UnixStream,
}

impl AdminClient {
    pub fn connect(path: &Path, timeout: Duration) -> Result<Self, AdminError> {
        let s = UnixStream::connect(path).map_err(|err| AdminError::Connect {
            path: path.into(),
            err,
        })?;
        s.set_read_timeout(Some(timeout))?;
        s.set_write_timeout(Some(timeout))?;
        Ok(Self { s })
    }

    /// Bound every later read and write on this connection by `timeout` (not zero).
    pub fn set_timeout(&mut self, timeout: Duration) -> std::io::Result<()> {
        self.s.set_read_timeout(Some(timeout))?;
        self.s.set_write_timeout(Some(timeout))
    }

    /// Send `req` and read its reply (passing over the keys it evicted).
    pub fn call(&mut self, req: &Request) -> Result<Response, AdminError> {
        self.call_reporting(req, &mut Evictions::new())
    }

    /// [`Self::call`], the keys the request evicted to make room added to `evicted`.
    pub fn call_reporting(
        &mut self,
        req: &Request,
        evicted: &mut Evictions,
    ) -> Result<Response, AdminError> {
        if let Err(e) = self.s.write_all(&req.encode()) {
            // A node that refuses the connection (e.g. "node busy") replies and closes before
            // reading the request: its reply, when there is one, says more than EPIPE.
            return Response::read(&mut self.s, evicted).map_err(|_| AdminError::Io(e));
        }
        Response::read(&mut self.s, evicted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::LocalCluster;
    use nessie_protocols::KvClient;
    use nessie_protocols::ProtocolConfig;
    use nessie_store::Geometry;

    struct Node {
        pool: ClientPool,
        _cluster: LocalCluster,
    }

    impl Handler for Node {
        fn handle_evicting(&self, req: Request) -> (Response, Evictions) {
            match req {
                Request::Ping => (Response::Ok, Evictions::new()),
                Request::Status => (Response::Status("{\"ok\":true}".into()), Evictions::new()),
                r => serve_pooled(&self.pool, r),
            }
        }
    }

    fn server(name: &str) -> (AdminServer, PathBuf) {
        server_with(name, Geometry::default(), ProtocolConfig::default())
    }

    fn server_with(name: &str, g: Geometry, cfg: ProtocolConfig) -> (AdminServer, PathBuf) {
        let cluster = LocalCluster::new(g, cfg, None).unwrap();
        let clients: Vec<Box<dyn KvClient>> = (0..2)
            .map(|_| Box::new(cluster.client(1).unwrap()) as Box<dyn KvClient>)
            .collect();
        let node = Arc::new(Node {
            pool: ClientPool::new(clients),
            _cluster: cluster,
        });
        let path =
            std::env::temp_dir().join(format!("nessie-admin-{name}-{}.sock", std::process::id()));
        (AdminServer::start(&path, node).unwrap(), path)
    }

    /// A node whose writers evict tells its admin clients what each request evicted (an
    /// EVICTED reply before the request's own): every key named is gone, and a client that
    /// does not ask reads the same replies as before.
    #[test]
    fn evictions_come_back_with_the_request_that_made_them() {
        let g = Geometry {
            ites_per_node: 4096,
            dtes_per_node: 64,
            ..Geometry::default()
        };
        let cfg = ProtocolConfig {
            eviction: nessie_protocols::Eviction::AllkeysRandom,
            expiry_ns: 2_000_000,
            clock_margin_ns: 0,
            ..ProtocolConfig::default()
        };
        let (_srv, path) = server_with("evict", g, cfg);
        let mut c = AdminClient::connect(&path, Duration::from_secs(5)).unwrap();
        let mut all = Evictions::new();
        for i in 0..2_000u32 {
            let put = Request::Put(format!("k{i}").into_bytes(), vec![7; 100]);
            let mut evicted = Evictions::new();
            let r = if i % 2 == 0 {
                c.call_reporting(&put, &mut evicted).unwrap()
            } else {
                c.call(&put).unwrap()
            };
            assert_eq!(r, Response::Ok, "put {i}");
            all.extend(evicted);
        }
        assert!(!all.is_empty(), "nothing evicted");
        // Each key named was evicted, and none of the run's keys is written twice: absent.
        for (key, sure) in all.iter().take(50) {
            assert!(sure, "{key:?}: no failure in this run");
            let got = c.call(&Request::Get(key.clone())).unwrap();
            assert_eq!(
                got,
                Response::NotFound,
                "{:?}",
                String::from_utf8_lossy(key)
            );
        }
    }

    #[test]
    fn an_evicted_reply_is_checked() {
        let mut out = Evictions::new();
        decode_evictions(&[1, 2, 0, 0, 0, b'a', b'b', 0, 1, 0, 0, 0, b'c'], &mut out).unwrap();
        assert_eq!(out, vec![(b"ab".to_vec(), true), (b"c".to_vec(), false)]);
        for bad in [
            &[1, 5, 0, 0, 0, b'a'][..], // shorter than it says
            &[2, 1, 0, 0, 0, b'a'][..], // no such flag
            &[1, 0, 0, 0, 0][..],       // an empty key
            &[1, 0xff, 0xff, 0, 0][..], // longer than any key
        ] {
            assert!(
                decode_evictions(bad, &mut Evictions::new()).is_err(),
                "{bad:?}"
            );
        }
        let frame = encode_evictions(&vec![(b"key".to_vec(), true)]);
        let mut reply = frame.clone();
        reply.extend_from_slice(&Response::NotFound.encode());
        let mut got = Evictions::new();
        let r = Response::read(&mut &reply[..], &mut got).unwrap();
        assert_eq!(
            (r, got),
            (Response::NotFound, vec![(b"key".to_vec(), true)])
        );
        assert!(encode_evictions(&Evictions::new()).is_empty());
    }

    #[test]
    fn requests_round_trip() {
        let (_srv, path) = server("rt");
        let mut c = AdminClient::connect(&path, Duration::from_secs(5)).unwrap();
        assert_eq!(c.call(&Request::Ping).unwrap(), Response::Ok);
        assert_eq!(
            c.call(&Request::Get(b"k".to_vec())).unwrap(),
            Response::NotFound
        );
        assert_eq!(
            c.call(&Request::Put(b"k".to_vec(), vec![1, 2, 3])).unwrap(),
            Response::Ok
        );
        assert_eq!(
            c.call(&Request::Get(b"k".to_vec())).unwrap(),
            Response::Value(vec![1, 2, 3])
        );
        assert_eq!(
            c.call(&Request::Delete(b"k".to_vec())).unwrap(),
            Response::Ok
        );
        assert_eq!(
            c.call(&Request::Get(b"k".to_vec())).unwrap(),
            Response::NotFound
        );
        // An item with an expiry: present until then, absent from then on. A second either
        // way: the node judges expiry by its endpoint's clock, which may be coarse (a tick
        // behind this one: an item expiring 1 ns ago once read as present in CI).
        let now = nessie_fabric::wall_clock_ns();
        for (at, read) in [
            (now + 60_000_000_000, Response::Value(vec![4, 5])),
            (now - 1_000_000_000, Response::NotFound),
        ] {
            let put = Request::PutExpiring(b"t".to_vec(), vec![4, 5], at);
            assert_eq!(c.call(&put).unwrap(), Response::Ok);
            assert_eq!(c.call(&Request::Get(b"t".to_vec())).unwrap(), read);
        }
        let mut s = UnixStream::connect(&path).unwrap();
        s.write_all(b"NSA1\x07\x01\0\0\0\x03\0\0\0kabc").unwrap();
        let r = Response::read(&mut s, &mut Evictions::new()).unwrap();
        assert!(
            matches!(&r, Response::Error(e) if e.contains("8-byte expiry")),
            "{r:?}"
        );
        let r = c.call(&Request::Put(vec![0; 500], vec![])).unwrap();
        let Response::Error(text) = r else {
            panic!("{r:?}")
        };
        assert_eq!(
            decode_error(&text),
            nessie_protocols::Error::KeyTooLarge { len: 500, max: 128 },
            "typed errors survive the socket"
        );
        assert!(matches!(
            c.call(&Request::Status).unwrap(),
            Response::Status(_)
        ));
    }

    #[test]
    fn junk_gets_an_error_reply_and_the_server_survives() {
        let (_srv, path) = server("junk");
        for junk in [
            &b"GET key\n"[..],
            b"NSA1\x0a\0\0\0\0\0\0\0\0",
            b"NSA1\x02\xff\xff\xff\xff\0\0\0\0",
            b"NSA1\x01\x01\0\0\0\0\0\0\0x",
        ] {
            let mut s = UnixStream::connect(&path).unwrap();
            s.write_all(junk).unwrap();
            let r = Response::read(&mut s, &mut Evictions::new()).unwrap();
            assert!(
                matches!(&r, Response::Error(e) if e.contains("malformed")),
                "{junk:?} -> {r:?}"
            );
        }
        let mut c = AdminClient::connect(&path, Duration::from_secs(5)).unwrap();
        assert_eq!(c.call(&Request::Ping).unwrap(), Response::Ok);
    }

    #[test]
    fn second_server_on_a_live_socket_is_refused_and_stale_sockets_are_replaced() {
        let (srv, path) = server("dup");
        struct Pong;
        impl Handler for Pong {
            fn handle(&self, _: Request) -> Response {
                Response::Ok
            }
        }
        let e = AdminServer::start(&path, Arc::new(Pong)).err().unwrap();
        assert!(e.to_string().contains("in use by a running node"), "{e}");
        drop(srv);
        assert!(!path.exists(), "socket removed on shutdown");
        let err = AdminClient::connect(&path, Duration::from_secs(1))
            .err()
            .unwrap();
        assert!(err.to_string().contains("is the node running"), "{err}");
    }

    #[test]
    fn dropping_the_server_stops_it_even_when_its_socket_file_is_gone() {
        let (srv, path) = server("gone");
        // e.g. a `down` removed it, or another node replaced it
        std::fs::remove_file(&path).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            drop(srv);
            tx.send(()).unwrap();
        });
        rx.recv_timeout(Duration::from_secs(2))
            .expect("the accept loop stopped");
    }

    #[test]
    fn admin_sockets_are_private_from_the_moment_they_exist() {
        let path =
            std::env::temp_dir().join(format!("nessie-admin-mode-{}.sock", std::process::id()));
        let _ = std::fs::remove_file(&path);
        // With no umask to help, the socket file must still be created 0600.
        // SAFETY: umask cannot fail; restored right after.
        let old = unsafe { libc::umask(0) };
        let l = bind_private(&path);
        unsafe { libc::umask(old) };
        let _l = l.unwrap();
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::symlink_metadata(&path)
            .unwrap()
            .permissions()
            .mode();
        std::fs::remove_file(&path).unwrap();
        assert_eq!(mode & 0o777, 0o600, "mode {mode:o}");
    }

    #[test]
    fn wire_codes_are_pinned_and_round_trip() {
        let ops: Vec<u8> = AdminOp::ALL.iter().map(|&o| o as u8).collect();
        assert_eq!(ops, [1, 2, 3, 4, 5, 6, 7, 8, 9]);
        let statuses: Vec<u8> = ReplyStatus::ALL.iter().map(|&s| s as u8).collect();
        assert_eq!(statuses, [0, 1, 2, 3, 4, 5]);
        for &o in AdminOp::ALL {
            assert_eq!(AdminOp::from_u8(o as u8), Some(o));
        }
        for &s in ReplyStatus::ALL {
            assert_eq!(ReplyStatus::from_u8(s as u8), Some(s));
        }
        assert_eq!(AdminOp::from_u8(0), None);
        assert_eq!(ReplyStatus::from_u8(6), None);
    }
}
