//! A small blocking client for etcd's v3 HTTP/JSON gateway.
//!
//! We talk to the gateway rather than to gRPC so that membership needs no protobuf or
//! async stack: a handful of unary calls is all the cluster uses etcd for (leases, puts, gets,
//! prefix listings and a compare-and-swap).
//!
//! Gateway quirks this client deals with (etcd 3.4):
//! - keys and values travel as standard base64;
//! - int64 fields come back as JSON strings, and fields equal to zero, false or empty are
//!   omitted, so every response field is optional and zero by default;
//! - errors of unary calls come as non-2xx answers with a JSON body, but the streaming
//!   `lease/keepalive` answers HTTP 200 with an `{"error": ..}` object instead of a result.
//!
//! **Authentication.** With etcd's auth enabled (`etcdctl auth enable`), a client made
//! [`Etcd::with_credentials`] authenticates as its user (`/v3/auth/authenticate`) and sends the
//! token etcd gives in the `Authorization` header of every request; when etcd refuses a token
//! (it expired: `--auth-token-ttl`, 300 s by default), it authenticates again and retries once.
//! Over `http://` the password travels in clear, so etcd must then be reached over a private
//! network (`docs/cluster.md`, "Trust boundary").
//!
//! **TLS.** An `https://` URL is spoken over TLS (rustls, through ureq): etcd's certificate is
//! checked against the public roots, or against the CA of [`Etcd::with_tls`], which also
//! presents a client certificate when etcd asks for one (`--client-cert-auth`).

use std::io::Read as _;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use serde::de::{self, DeserializeOwned, Deserializer, Visitor};
use serde::Deserialize;
use serde_json::{json, Value};

/// An etcd lease id.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct LeaseId(pub i64);

/// A key and its value as stored in etcd, with the revisions that compare-and-swap needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyValue {
    pub key: String,
    pub value: Vec<u8>,
    pub create_revision: i64,
    pub mod_revision: i64,
    /// The lease the key is attached to, 0 if none.
    pub lease: i64,
}

#[derive(Debug, thiserror::Error)]
pub enum EtcdError {
    #[error("etcd URL {url:?} is not usable: {why}")]
    BadUrl { url: String, why: String },
    #[error("etcd at {url} is unreachable: {reason}")]
    Unreachable { url: String, reason: String },
    #[error("etcd at {url} answered {path} with HTTP {status}: {body}")]
    Http {
        url: String,
        path: String,
        status: u16,
        body: String,
    },
    #[error("etcd at {url} sent an unexpected answer to {path}: {why}")]
    BadResponse {
        url: String,
        path: String,
        why: String,
    },
    /// etcd refused this client's credentials, or wants some and it has none.
    #[error("etcd at {url} refused to authenticate {who}: {why}")]
    Auth {
        url: String,
        who: String,
        why: String,
    },
    /// The TLS files cannot be used (missing, unreadable, not PEM, a key others can read), or
    /// are given for a URL that is not `https://`.
    #[error("TLS for etcd at {url}: {why}")]
    Tls { url: String, why: String },
}

/// How much of an error body we keep: enough for etcd's one-line JSON errors, bounded in case
/// something else (a proxy, a wrong service) answers with a page of HTML.
const MAX_ERROR_BODY: usize = 500;

/// gRPC status code NOT_FOUND, which the gateway puts in `"code"` for a missing lease.
const GRPC_NOT_FOUND: i64 = 5;

/// Longest etcd user name and password this client sends (etcd itself sets no limit; these
/// bound what a configuration file can make it send).
pub const MAX_USER_BYTES: usize = 256;
pub const MAX_PASSWORD_BYTES: usize = 1024;

/// A blocking etcd client. Clones are cheap and share one connection pool (and one auth
/// token), so a thread (a lease keeper, say) can have its own.
#[derive(Clone)]
pub struct Etcd {
    /// `http://host:port` or `https://host:port`, without a trailing slash.
    url: String,
    agent: ureq::Agent,
    /// Connect, read and write timeout of each request (watches read for their span).
    timeout: Duration,
    /// Our CA and client certificate for `https://`; `None`: ureq's (the public roots).
    tls: Option<Arc<rustls::ClientConfig>>,
    /// The user this client authenticates as, if etcd's auth is enabled.
    auth: Option<Arc<Auth>>,
}

struct Auth {
    user: String,
    password: String,
    /// The token `/v3/auth/authenticate` gave, until etcd refuses it.
    token: Mutex<Option<String>>,
}

impl Etcd {
    /// `url` must be `http://HOST:PORT` or `https://HOST:PORT` (no path); a trailing slash is
    /// accepted. Validate and return BadUrl naming the problem otherwise.
    pub fn new(url: &str) -> Result<Etcd, EtcdError> {
        Etcd::with_timeout(url, Duration::from_secs(2))
    }

    /// Same, with the per-request timeout (default 2 s in `new`).
    pub fn with_timeout(url: &str, timeout: Duration) -> Result<Etcd, EtcdError> {
        let url = validate_url(url).map_err(|why| EtcdError::BadUrl {
            url: url.to_string(),
            why,
        })?;
        Ok(Etcd {
            agent: agent(timeout, timeout, None),
            url,
            timeout,
            tls: None,
            auth: None,
        })
    }

    /// Speak TLS with `files`: trust their CA for etcd's certificate, and present their client
    /// certificate. The URL must be `https://`; a file that cannot be used is refused here,
    /// naming the setting and the file, before any request.
    pub fn with_tls(mut self, files: &crate::tls::TlsFiles) -> Result<Etcd, EtcdError> {
        if !files.any() {
            return Ok(self);
        }
        let config = files.client_config(&self.url).map_err(|p| EtcdError::Tls {
            url: self.url.clone(),
            why: p.to_string(),
        })?;
        self.agent = agent(self.timeout, self.timeout, Some(config.clone()));
        self.tls = Some(config);
        Ok(self)
    }

    /// Authenticate as `user` with `password` (etcd's auth enabled). Nothing is sent yet: the
    /// first request authenticates. A user or password that is empty, too long or holds a
    /// control character is refused here, naming which.
    pub fn with_credentials(mut self, user: &str, password: &str) -> Result<Etcd, EtcdError> {
        let bad = |why: String| EtcdError::Auth {
            url: self.url.clone(),
            who: format!("user {user:?}"),
            why,
        };
        for (what, v, max) in [
            ("user name", user, MAX_USER_BYTES),
            ("password", password, MAX_PASSWORD_BYTES),
        ] {
            if v.is_empty() {
                return Err(bad(format!("the {what} is empty")));
            }
            if v.len() > max {
                return Err(bad(format!("the {what} is longer than {max} bytes")));
            }
            if v.chars().any(char::is_control) {
                return Err(bad(format!("the {what} holds a control character")));
            }
        }
        self.auth = Some(Arc::new(Auth {
            user: user.to_string(),
            password: password.to_string(),
            token: Mutex::new(None),
        }));
        Ok(self)
    }

    /// The token to send, authenticating first if there is none yet; `None` without auth.
    fn token(&self) -> Result<Option<String>, EtcdError> {
        let Some(a) = &self.auth else {
            return Ok(None);
        };
        let mut token = a.token.lock().expect("token lock");
        if let Some(t) = &*token {
            return Ok(Some(t.clone()));
        }
        #[derive(Deserialize)]
        struct Authenticated {
            #[serde(default)]
            token: String,
        }
        let path = "/v3/auth/authenticate";
        let answer = self
            .agent
            .post(&format!("{}{path}", self.url))
            .send_json(json!({ "name": a.user, "password": a.password }));
        let refused = |why: String| EtcdError::Auth {
            url: self.url.clone(),
            who: format!("user {:?}", a.user),
            why,
        };
        let text = match self.read_answer(path, answer) {
            Ok(text) => text,
            Err(EtcdError::Http { body, .. }) => return Err(refused(body)),
            Err(e) => return Err(e),
        };
        let got: Authenticated = self.decode(path, &text)?;
        if got.token.is_empty() {
            return Err(refused(
                "no token in the answer: is auth enabled in etcd (`etcdctl auth enable`)?".into(),
            ));
        }
        *token = Some(got.token.clone());
        Ok(Some(got.token))
    }

    /// A request to `path` with the auth token, if any.
    fn request(&self, agent: &ureq::Agent, path: &str) -> Result<ureq::Request, EtcdError> {
        let req = agent.post(&format!("{}{path}", self.url));
        Ok(match self.token()? {
            Some(t) => req.set("Authorization", &t),
            None => req,
        })
    }

    /// Whether `e` is etcd refusing the token (expired, or from before a restart): then a
    /// new one is asked for. Anything else about auth is the caller's to see.
    fn token_refused(&self, e: &EtcdError) -> bool {
        let refused =
            matches!(e, EtcdError::Http { body, .. } if body.contains("invalid auth token"));
        if refused {
            if let Some(a) = &self.auth {
                *a.token.lock().expect("token lock") = None;
            }
        }
        refused && self.auth.is_some()
    }

    /// An answer saying etcd wants credentials this client has none of, made plain.
    fn explain(&self, e: EtcdError) -> EtcdError {
        match e {
            EtcdError::Http { ref body, .. }
                if self.auth.is_none() && body.contains("user name is empty") =>
            {
                EtcdError::Auth {
                    url: self.url.clone(),
                    who: "this client".into(),
                    why: "etcd's auth is enabled and no user is configured: set [membership] \
                          etcd_user and etcd_password_file (nessie up --etcd-user, \
                          --etcd-password-file)"
                        .into(),
                }
            }
            e => e,
        }
    }

    /// The base URL, `http(s)://host:port`, without a trailing slash.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// GET /health; Ok only if it reports {"health":"true"}.
    pub fn health(&self) -> Result<(), EtcdError> {
        #[derive(Deserialize)]
        struct Health {
            #[serde(default)]
            health: String,
        }
        let path = "/health";
        let answer = self.agent.get(&format!("{}{path}", self.url)).call();
        let text = self.read_answer(path, answer)?;
        let health: Health = self.decode(path, &text)?;
        if health.health == "true" {
            Ok(())
        } else {
            Err(self.bad(
                path,
                format!("etcd reports itself unhealthy: {}", truncate(&text)),
            ))
        }
    }

    /// Grant a lease of `ttl_s` seconds. etcd may round the TTL up to its minimum.
    pub fn grant(&self, ttl_s: u64) -> Result<LeaseId, EtcdError> {
        #[derive(Deserialize, Default)]
        #[serde(default)]
        struct Grant {
            #[serde(rename = "ID", deserialize_with = "int64")]
            id: i64,
        }
        let path = "/v3/lease/grant";
        let grant: Grant = self.post(path, json!({ "TTL": ttl_s.to_string() }))?;
        if grant.id == 0 {
            return Err(self.bad(path, "no lease ID in the answer".to_string()));
        }
        Ok(LeaseId(grant.id))
    }

    /// Refresh a lease; returns the TTL left in seconds, 0 if the lease has expired or does
    /// not exist.
    pub fn keep_alive(&self, lease: LeaseId) -> Result<i64, EtcdError> {
        #[derive(Deserialize, Default)]
        #[serde(default)]
        struct KeepAlive {
            #[serde(rename = "TTL", deserialize_with = "int64")]
            ttl: i64,
        }
        #[derive(Deserialize)]
        struct Frame {
            result: Option<KeepAlive>,
        }
        let path = "/v3/lease/keepalive";
        let text = self.post_text(path, json!({ "ID": lease.0.to_string() }))?;
        // A streaming call: one JSON object per line, one line per request object we sent.
        let line = text.lines().map(str::trim).find(|l| !l.is_empty());
        let line = line.ok_or_else(|| self.bad(path, "empty answer".to_string()))?;
        let frame: Frame = self.decode(path, line)?;
        let result = frame
            .result
            .ok_or_else(|| self.bad(path, format!("no result in {}", truncate(line))))?;
        Ok(result.ttl)
    }

    /// Revoke a lease, deleting the keys attached to it. A lease that is already gone is not
    /// an error: revoking is how we clean up, and expiry has done the job already.
    pub fn revoke(&self, lease: LeaseId) -> Result<(), EtcdError> {
        let path = "/v3/lease/revoke";
        match self.post::<Value>(path, json!({ "ID": lease.0.to_string() })) {
            Ok(_) => Ok(()),
            Err(EtcdError::Http {
                status: 404, body, ..
            }) if is_grpc_not_found(&body) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Put `value` at `key`, attached to `lease` if given. Returns the revision of the put.
    pub fn put(&self, key: &str, value: &[u8], lease: Option<LeaseId>) -> Result<i64, EtcdError> {
        #[derive(Deserialize, Default)]
        #[serde(default)]
        struct Put {
            header: Header,
        }
        let path = "/v3/kv/put";
        let mut body = json!({ "key": B64.encode(key), "value": B64.encode(value) });
        if let Some(lease) = lease {
            body["lease"] = json!(lease.0.to_string());
        }
        let put: Put = self.post(path, body)?;
        if put.header.revision == 0 {
            return Err(self.bad(path, "no revision in the answer".to_string()));
        }
        Ok(put.header.revision)
    }

    /// The key-value at `key`, None if the key does not exist.
    pub fn get(&self, key: &str) -> Result<Option<KeyValue>, EtcdError> {
        let mut kvs = self.range(json!({ "key": B64.encode(key) }))?;
        Ok(kvs.pop())
    }

    /// The revision at which `key` was last changed, without its value (`keys_only`); None
    /// if the key does not exist. Lets a reader that holds a value keep it while unchanged.
    pub fn get_revision(&self, key: &str) -> Result<Option<i64>, EtcdError> {
        let mut kvs = self.range(json!({ "key": B64.encode(key), "keys_only": true }))?;
        Ok(kvs.pop().map(|kv| kv.mod_revision))
    }

    /// Every key starting with `prefix`, in key order (range_end = prefix with its last byte
    /// + 1, the usual etcd prefix rule).
    pub fn get_prefix(&self, prefix: &str) -> Result<Vec<KeyValue>, EtcdError> {
        let (key, end) = prefix_range(prefix.as_bytes());
        self.range(json!({ "key": B64.encode(key), "range_end": B64.encode(end) }))
    }

    /// Watch every key starting with `prefix` for at most `span` (one streaming request):
    /// `on_change(revision)` is called for each batch of changes, with the revision of the
    /// last, and the watch ends early when it returns false. Starts after revision `after`
    /// (0: from now), so that watching again from the last revision seen misses nothing.
    /// Returns the revision to resume after. A quiet watch ends with the read timeout, which
    /// is not an error.
    pub fn watch_prefix(
        &self,
        prefix: &str,
        after: i64,
        span: Duration,
        mut on_change: impl FnMut(i64) -> bool,
    ) -> Result<i64, EtcdError> {
        let path = "/v3/watch";
        let (key, end) = prefix_range(prefix.as_bytes());
        let mut create = json!({ "key": B64.encode(key), "range_end": B64.encode(end) });
        if after > 0 {
            create["start_revision"] = json!((after + 1).to_string());
        }
        let agent = agent(self.timeout, span, self.tls.clone());
        let watch = json!({ "create_request": create });
        let mut again = true;
        let response = loop {
            let answer = self.request(&agent, path)?.send_json(watch.clone());
            match answer {
                Ok(r) => break r,
                Err(e) => match self.read_answer(path, Err(e)) {
                    Err(e) if again && self.token_refused(&e) => again = false,
                    r => return r.map(|_| after).map_err(|e| self.explain(e)),
                },
            }
        };
        let mut last = after;
        let stream = serde_json::Deserializer::from_reader(response.into_reader());
        for message in stream.into_iter::<Value>() {
            let message = match message {
                Ok(m) => m,
                // The read timeout (or the stream's end): the watch is over.
                Err(e) if e.is_io() || e.is_eof() => return Ok(last),
                Err(e) => return Err(self.bad(path, e.to_string())),
            };
            if let Some(error) = message.get("error") {
                return Err(self.bad(
                    path,
                    format!("etcd reported an error: {}", truncate(&error.to_string())),
                ));
            }
            let result = &message["result"];
            let events = result["events"].as_array().map_or(0, Vec::len);
            if events == 0 {
                // The "created" message (or progress): a watch from now starts after its
                // revision, where the next one must resume.
                if last == 0 {
                    last = int64(&result["header"]["revision"]).ok().unwrap_or(0);
                }
                continue;
            }
            last = int64(&result["header"]["revision"]).ok().unwrap_or(last);
            if !on_change(last) {
                break;
            }
        }
        Ok(last)
    }

    /// Delete `key`; deleting a key that does not exist is not an error.
    pub fn delete(&self, key: &str) -> Result<(), EtcdError> {
        self.post::<Value>("/v3/kv/deleterange", json!({ "key": B64.encode(key) }))?;
        Ok(())
    }

    /// Atomically put `value` at `key` if the key's mod_revision is `expected` (0: the key must
    /// not exist). Ok(true) if applied, Ok(false) if the comparison failed.
    ///
    /// etcd compares a missing key as one whose revisions are all 0, so `MOD == 0` means
    /// "absent" and one comparison covers both cases (checked against etcd 3.4 in the tests).
    pub fn put_if_mod_revision(
        &self,
        key: &str,
        expected: i64,
        value: &[u8],
    ) -> Result<bool, EtcdError> {
        #[derive(Deserialize, Default)]
        #[serde(default)]
        struct Txn {
            succeeded: bool,
        }
        let key = B64.encode(key);
        let body = json!({
            "compare": [{
                "key": key,
                "target": "MOD",
                "result": "EQUAL",
                "mod_revision": expected.to_string(),
            }],
            "success": [{ "request_put": { "key": key, "value": B64.encode(value) } }],
        });
        let txn: Txn = self.post("/v3/kv/txn", body)?;
        Ok(txn.succeeded)
    }

    /// POST /v3/kv/range with `body` and decode the key-values, in the order etcd sent them
    /// (key order).
    fn range(&self, body: Value) -> Result<Vec<KeyValue>, EtcdError> {
        #[derive(Deserialize, Default)]
        #[serde(default)]
        struct Range {
            kvs: Vec<RawKeyValue>,
        }
        let path = "/v3/kv/range";
        let range: Range = self.post(path, body)?;
        range
            .kvs
            .into_iter()
            .map(|kv| kv.decode().map_err(|why| self.bad(path, why)))
            .collect()
    }

    /// POST `body` as JSON to `path` and decode the answer as `T`.
    fn post<T: DeserializeOwned>(&self, path: &str, body: Value) -> Result<T, EtcdError> {
        let text = self.post_text(path, body)?;
        self.decode(path, &text)
    }

    /// POST `body` as JSON to `path` and return the body of a 2xx answer (authenticating
    /// again once if etcd refused the token).
    fn post_text(&self, path: &str, body: Value) -> Result<String, EtcdError> {
        let mut again = true;
        loop {
            let answer = self.request(&self.agent, path)?.send_json(body.clone());
            match self.read_answer(path, answer) {
                Err(e) if again && self.token_refused(&e) => again = false,
                r => return r.map_err(|e| self.explain(e)),
            }
        }
    }

    /// Turn a ureq outcome into the answer's body, or the error that says what went wrong.
    fn read_answer(
        &self,
        path: &str,
        answer: Result<ureq::Response, ureq::Error>,
    ) -> Result<String, EtcdError> {
        match answer {
            Ok(response) => read_body(response).map_err(|e| EtcdError::Unreachable {
                url: self.url.clone(),
                reason: format!("reading the answer to {path}: {e}"),
            }),
            Err(ureq::Error::Status(status, response)) => {
                let body =
                    read_body(response).unwrap_or_else(|e| format!("(unreadable body: {e})"));
                Err(EtcdError::Http {
                    url: self.url.clone(),
                    path: path.to_string(),
                    status,
                    body: truncate(&body),
                })
            }
            Err(ureq::Error::Transport(t)) => Err(self.transport_error(t)),
        }
    }

    /// A failed connection, told apart from a TLS handshake that failed (with what to set).
    fn transport_error(&self, t: ureq::Transport) -> EtcdError {
        use rustls::CertificateError as C;
        let reason = t.to_string();
        let hint = match rustls_error(&t) {
            Some(rustls::Error::InvalidCertificate(c)) => match c {
                C::NotValidForName | C::NotValidForNameContext { .. } => {
                    "etcd's certificate is not made out to the host in the URL: use the name or \
                     address it was issued for"
                }
                C::Expired
                | C::ExpiredContext { .. }
                | C::NotValidYet
                | C::NotValidYetContext { .. } => {
                    "etcd's certificate has expired or is not valid yet (or this host's clock is \
                     wrong)"
                }
                _ => {
                    "etcd's certificate is not one this client trusts: give the CA that signed \
                     it (membership.etcd_ca, nessie up --etcd-ca)"
                }
            },
            Some(rustls::Error::AlertReceived(_)) => {
                "etcd refused the TLS handshake; if it requires client certificates \
                 (--client-cert-auth), give one it trusts (membership.etcd_cert and etcd_key, \
                 nessie up --etcd-cert --etcd-key)"
            }
            Some(rustls::Error::InvalidMessage(_)) => NOT_TLS,
            // A connection lost in or right after the handshake, with no TLS error to read: a
            // plain-HTTP server closing on a ClientHello, or etcd closing on a client without
            // the certificate it wants before its alert is read (ureq's words; EPIPE, reset).
            None if self.url.starts_with("https://")
                && [
                    "tls connection init failed",
                    "Broken pipe",
                    "Connection reset",
                ]
                .iter()
                .any(|w| reason.contains(w)) =>
            {
                HANDSHAKE_LOST
            }
            _ => {
                return EtcdError::Unreachable {
                    url: self.url.clone(),
                    reason,
                }
            }
        };
        EtcdError::Tls {
            url: self.url.clone(),
            why: format!("{reason}: {hint}"),
        }
    }

    /// Parse `text` as `T`, first rejecting the `{"error": ..}` objects the gateway may send
    /// with HTTP 200 (no successful etcd answer has a top-level `error` field).
    fn decode<T: DeserializeOwned>(&self, path: &str, text: &str) -> Result<T, EtcdError> {
        let value: Value = serde_json::from_str(text)
            .map_err(|e| self.bad(path, format!("{e} in {}", truncate(text))))?;
        if let Some(error) = value.get("error") {
            return Err(self.bad(
                path,
                format!("etcd reported an error: {}", truncate(&error.to_string())),
            ));
        }
        serde_json::from_value(value)
            .map_err(|e| self.bad(path, format!("{e} in {}", truncate(text))))
    }

    fn bad(&self, path: &str, why: String) -> EtcdError {
        EtcdError::BadResponse {
            url: self.url.clone(),
            path: path.to_string(),
            why,
        }
    }
}

/// The response header; only the revision is of use to us.
#[derive(Deserialize, Default)]
#[serde(default)]
struct Header {
    #[serde(deserialize_with = "int64")]
    revision: i64,
}

/// A key-value as the gateway sends it: base64 strings, int64 as strings, zeros omitted.
#[derive(Deserialize, Default)]
#[serde(default)]
struct RawKeyValue {
    key: String,
    value: String,
    #[serde(deserialize_with = "int64")]
    create_revision: i64,
    #[serde(deserialize_with = "int64")]
    mod_revision: i64,
    #[serde(deserialize_with = "int64")]
    lease: i64,
}

impl RawKeyValue {
    fn decode(self) -> Result<KeyValue, String> {
        let key = B64
            .decode(&self.key)
            .map_err(|e| format!("key {:?} is not base64: {e}", self.key))?;
        let key =
            String::from_utf8(key).map_err(|e| format!("key {:?} is not UTF-8: {e}", self.key))?;
        let value = B64
            .decode(&self.value)
            .map_err(|e| format!("value of key {key:?} is not base64: {e}"))?;
        Ok(KeyValue {
            key,
            value,
            create_revision: self.create_revision,
            mod_revision: self.mod_revision,
            lease: self.lease,
        })
    }
}

/// The hint for an `https://` URL whose server does not complete a TLS handshake.
const NOT_TLS: &str = "the TLS handshake did not complete: is etcd at this address serving \
                       https:// (TLS) and not http://?";

/// The hint for an `https://` connection lost with no TLS error to tell why.
const HANDSHAKE_LOST: &str = "the connection ended in or right after the TLS handshake: etcd \
                              may require a client certificate it trusts (membership.etcd_cert \
                              and etcd_key, nessie up --etcd-cert --etcd-key), or may not serve \
                              https:// (TLS) at this address";

/// The TLS error under a failed request, if a TLS handshake is what failed: ureq wraps it
/// in an `io::Error`, somewhere down the chain of sources.
fn rustls_error(t: &ureq::Transport) -> Option<rustls::Error> {
    let mut e: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(t);
    while let Some(err) = e {
        if let Some(r) = err.downcast_ref::<rustls::Error>() {
            return Some(r.clone());
        }
        if let Some(r) = err
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        {
            return Some(r.clone());
        }
        e = err.source();
    }
    None
}

/// An agent with these timeouts (connect and write: `timeout`), speaking TLS with `tls` when
/// given, and ureq's defaults (the public roots) otherwise.
fn agent(timeout: Duration, read: Duration, tls: Option<Arc<rustls::ClientConfig>>) -> ureq::Agent {
    let b = ureq::AgentBuilder::new()
        .timeout_connect(timeout)
        .timeout_read(read)
        .timeout_write(timeout)
        // etcd is local or on a trusted network: an HTTP proxy from the environment would
        // only get in the way (and could not reach loopback), and etcd never redirects.
        .try_proxy_from_env(false)
        .redirects(0);
    match tls {
        Some(config) => b.tls_config(config),
        None => b,
    }
    .build()
}

/// Check `url` is `http://HOST:PORT` or `https://HOST:PORT` with an optional trailing slash;
/// return it without the slash, or why not.
fn validate_url(url: &str) -> Result<String, String> {
    let trimmed = url.strip_suffix('/').unwrap_or(url);
    let Some(authority) = trimmed
        .strip_prefix("http://")
        .or_else(|| trimmed.strip_prefix("https://"))
    else {
        return Err(if url.contains("://") {
            "the scheme must be http:// or https://".to_string()
        } else {
            "no scheme; expected http://HOST:PORT or https://HOST:PORT".to_string()
        });
    };
    if authority.contains(['/', '?', '#']) {
        return Err(
            "a path, query or fragment is not allowed; expected http(s)://HOST:PORT".into(),
        );
    }
    if authority.contains('@') || authority.chars().any(char::is_whitespace) {
        return Err("expected just HOST:PORT after the scheme".to_string());
    }
    // The port follows the last colon; an IPv6 host is bracketed, so its colons come before.
    let (host, port) = match authority.rsplit_once(':') {
        Some((host, port)) if !port.contains(']') => (host, port),
        _ => return Err("no port; expected http(s)://HOST:PORT".to_string()),
    };
    if host.is_empty() || host == "[]" {
        return Err("no host; expected http(s)://HOST:PORT".to_string());
    }
    if host.contains(':') && !(host.starts_with('[') && host.ends_with(']')) {
        return Err("an IPv6 host must be in brackets, e.g. http://[::1]:2379".to_string());
    }
    match port.parse::<u16>() {
        Ok(p) if p > 0 => Ok(trimmed.to_string()),
        _ => Err(format!("port {port:?} is not a number from 1 to 65535")),
    }
}

/// The `[key, range_end)` that selects every key starting with `prefix`: the prefix with its
/// last byte incremented, after dropping trailing 0xff bytes, which cannot be incremented. An
/// empty prefix (or one of only 0xff bytes) has no upper bound; etcd spells "every key from
/// `key` on" as range_end "\0", and "every key" as key "\0" too, since a key must be set.
fn prefix_range(prefix: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return (prefix.to_vec(), end);
        }
    }
    let key = if prefix.is_empty() {
        vec![0]
    } else {
        prefix.to_vec()
    };
    (key, vec![0])
}

/// The body of `response`. Not `into_string`: ureq 2's chunked decoder fails on HTTP
/// trailers, and the gateway ends every error answer with a `Grpc-Trailer-Content-Type`
/// trailer, after a body that has arrived whole. So a decoding error (`InvalidInput`) once
/// bytes have arrived keeps them; were the body really cut short, parsing it fails instead.
fn read_body(response: ureq::Response) -> std::io::Result<String> {
    let mut body = Vec::new();
    match response.into_reader().read_to_end(&mut body) {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::InvalidInput && !body.is_empty() => {}
        Err(e) => return Err(e),
    }
    Ok(String::from_utf8_lossy(&body).into_owned())
}

/// Whether an error body from the gateway carries gRPC code NOT_FOUND.
fn is_grpc_not_found(body: &str) -> bool {
    serde_json::from_str::<Value>(body)
        .ok()
        .and_then(|v| v.get("code").and_then(Value::as_i64))
        == Some(GRPC_NOT_FOUND)
}

/// At most MAX_ERROR_BODY characters of `text`, marked if cut.
fn truncate(text: &str) -> String {
    match text.char_indices().nth(MAX_ERROR_BODY) {
        Some((cut, _)) => format!("{}...", &text[..cut]),
        None => text.to_string(),
    }
}

/// Deserialize an int64 that the gateway sends as a JSON string, or one sent as a number.
fn int64<'de, D: Deserializer<'de>>(d: D) -> Result<i64, D::Error> {
    struct Int64;
    impl Visitor<'_> for Int64 {
        type Value = i64;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("an int64 as a number or a string")
        }
        fn visit_i64<E: de::Error>(self, v: i64) -> Result<i64, E> {
            Ok(v)
        }
        fn visit_u64<E: de::Error>(self, v: u64) -> Result<i64, E> {
            i64::try_from(v).map_err(|_| E::custom(format!("{v} does not fit an int64")))
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<i64, E> {
            v.parse()
                .map_err(|_| E::custom(format!("{v:?} is not an int64")))
        }
    }
    d.deserialize_any(Int64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;
    use std::path::{Path, PathBuf};
    use std::process::{Child, Command, Stdio};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Instant;

    const ETCD_BIN: &str = "/usr/bin/etcd";

    /// A real etcd on loopback ports in its own temp dir; killed and removed on drop, so a
    /// failing test leaves nothing behind.
    struct TestEtcd {
        child: Child,
        dir: PathBuf,
        client: Etcd,
    }

    impl Drop for TestEtcd {
        fn drop(&mut self) {
            let _ = self.child.kill();
            let _ = self.child.wait();
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    fn free_port() -> u16 {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind a free port");
        listener.local_addr().expect("local addr").port()
    }

    fn log_of(dir: &Path) -> String {
        std::fs::read_to_string(dir.join("etcd.log")).unwrap_or_default()
    }

    fn start_etcd() -> TestEtcd {
        start_etcd_with(&[])
    }

    fn start_etcd_with(extra: &[&str]) -> TestEtcd {
        start_etcd_at("http", extra, |url| Etcd::new(url).expect("client"))
    }

    /// An etcd whose client URL has `scheme`, reached by the client `connect` makes.
    fn start_etcd_at(scheme: &str, extra: &[&str], connect: impl Fn(&str) -> Etcd) -> TestEtcd {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        // CI installs etcd: a missing binary is a broken environment, not a reason to skip.
        assert!(
            Path::new(ETCD_BIN).exists(),
            "{ETCD_BIN} not found: these tests need etcd 3.4 installed (apt-get install etcd-server)"
        );
        let n = COUNTER.fetch_add(1, Ordering::SeqCst);
        let dir = std::env::temp_dir().join(format!("nessie-etcd-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create temp dir");
        let log = std::fs::File::create(dir.join("etcd.log")).expect("create log");
        let (client_port, peer_port) = (free_port(), free_port());
        let client_url = format!("{scheme}://127.0.0.1:{client_port}");
        let peer_url = format!("http://127.0.0.1:{peer_port}");
        let child = Command::new(ETCD_BIN)
            .args(["--name", "t", "--data-dir"])
            .arg(dir.join("data"))
            .args(["--listen-client-urls", &client_url])
            .args(["--advertise-client-urls", &client_url])
            .args(["--listen-peer-urls", &peer_url])
            .args(["--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &format!("t={peer_url}")])
            .args(["--log-level", "error"])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("clone log"))
            .stderr(log)
            .spawn()
            .expect("spawn etcd");
        let client = connect(&client_url);
        let mut etcd = TestEtcd { child, dir, client };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if etcd.client.health().is_ok() {
                return etcd;
            }
            if let Ok(Some(status)) = etcd.child.try_wait() {
                panic!("etcd exited with {status}:\n{}", log_of(&etcd.dir));
            }
            assert!(
                Instant::now() < deadline,
                "etcd not healthy after 20 s:\n{}",
                log_of(&etcd.dir)
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// With etcd's auth enabled (simple tokens living 1 s): a client without credentials is
    /// told what to configure, a wrong password is refused naming the user, the right one
    /// works, a watch too, and a token etcd no longer accepts is renewed unseen.
    #[test]
    fn auth_is_used_refused_and_renewed() {
        let etcd = start_etcd_with(&["--auth-token", "simple", "--auth-token-ttl", "1"]);
        let c = &etcd.client;
        c.post::<Value>("/v3/auth/role/add", json!({ "name": "root" }))
            .unwrap();
        c.post::<Value>(
            "/v3/auth/user/add",
            json!({ "name": "root", "password": "s3cret" }),
        )
        .unwrap();
        c.post::<Value>(
            "/v3/auth/user/grant",
            json!({ "user": "root", "role": "root" }),
        )
        .unwrap();
        c.post::<Value>("/v3/auth/enable", json!({})).unwrap();

        let e = c.put("k", b"v", None).unwrap_err();
        assert!(
            matches!(e, EtcdError::Auth { .. }) && e.to_string().contains("etcd_user"),
            "{e}"
        );
        let wrong = Etcd::new(c.url())
            .unwrap()
            .with_credentials("root", "nope")
            .unwrap();
        let e = wrong.put("k", b"v", None).unwrap_err();
        assert!(
            matches!(e, EtcdError::Auth { .. }) && e.to_string().contains("\"root\""),
            "{e}"
        );
        let good = Etcd::new(c.url())
            .unwrap()
            .with_credentials("root", "s3cret")
            .unwrap();
        good.put("k", b"v", None).unwrap();
        let lease = good.grant(5).unwrap();
        assert!(good.keep_alive(lease).unwrap() > 0);
        // The token lives 1 s: etcd refuses it later, and the client asks for another.
        std::thread::sleep(Duration::from_secs(3));
        assert_eq!(good.get("k").unwrap().unwrap().value, b"v");
        std::thread::sleep(Duration::from_secs(3));
        let rev = good.get("k").unwrap().unwrap().mod_revision;
        let watcher = good.clone();
        let seen = std::thread::spawn(move || {
            watcher.watch_prefix("k", rev, Duration::from_secs(5), |_| false)
        });
        std::thread::sleep(Duration::from_millis(300));
        good.put("k", b"w", None).unwrap();
        assert!(seen.join().unwrap().unwrap() > rev, "the watch saw the put");
        for (user, password, what) in [
            ("", "x", "user name is empty"),
            ("u", "", "password is empty"),
            ("u\n", "x", "control character"),
        ] {
            let e = Etcd::new(c.url())
                .unwrap()
                .with_credentials(user, password)
                .err()
                .unwrap();
            assert!(e.to_string().contains(what), "{e}");
        }
    }

    /// Poll `cond` every 50 ms until it holds or `limit` passes; whether it held.
    fn eventually(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if cond() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        cond()
    }

    fn keys(kvs: &[KeyValue]) -> Vec<&str> {
        kvs.iter().map(|kv| kv.key.as_str()).collect()
    }

    #[test]
    fn etcd_kv_round_trips_prefixes_and_compare_and_swap() {
        let etcd = start_etcd();
        let c = &etcd.client;

        // Binary values, including bytes that are not UTF-8, and an empty value.
        let binary: Vec<u8> = (0..=255u8).rev().collect();
        let rev = c.put("/bin", &binary, None).unwrap();
        let kv = c.get("/bin").unwrap().expect("key just put");
        assert_eq!(kv.key, "/bin");
        assert_eq!(kv.value, binary);
        assert_eq!(kv.mod_revision, rev);
        assert_eq!(kv.create_revision, rev);
        assert_eq!(kv.lease, 0);
        c.put("/empty", b"", None).unwrap();
        assert_eq!(c.get("/empty").unwrap().expect("empty value").value, b"");
        assert_eq!(c.get("/missing").unwrap(), None);

        // Prefix listings: exactly the keys under the prefix, in key order.
        for key in ["/a/2", "/a0", "/a/1", "/a", "/a/10", "/b/1"] {
            c.put(key, key.as_bytes(), None).unwrap();
        }
        let under = c.get_prefix("/a/").unwrap();
        assert_eq!(keys(&under), ["/a/1", "/a/10", "/a/2"]);
        assert_eq!(under[0].value, b"/a/1");
        assert_eq!(
            keys(&c.get_prefix("/a").unwrap()),
            ["/a", "/a/1", "/a/10", "/a/2", "/a0"]
        );
        assert!(c.get_prefix("/zzz/").unwrap().is_empty());
        assert_eq!(c.get_prefix("").unwrap().len(), 8);

        // Delete, including a key that does not exist.
        c.delete("/a/10").unwrap();
        c.delete("/a/10").unwrap();
        assert_eq!(c.get("/a/10").unwrap(), None);
        assert_eq!(keys(&c.get_prefix("/a/").unwrap()), ["/a/1", "/a/2"]);

        // Compare-and-swap on mod_revision.
        assert!(
            c.put_if_mod_revision("/cas", 0, b"one").unwrap(),
            "0 on an absent key"
        );
        let first = c.get("/cas").unwrap().expect("created by cas");
        assert_eq!(first.value, b"one");
        assert!(
            !c.put_if_mod_revision("/cas", 0, b"two").unwrap(),
            "0 on a present key"
        );
        assert!(c
            .put_if_mod_revision("/cas", first.mod_revision, b"two")
            .unwrap());
        let second = c.get("/cas").unwrap().expect("still there");
        assert_eq!(second.value, b"two");
        assert!(second.mod_revision > first.mod_revision);
        assert_eq!(second.create_revision, first.create_revision);
        assert!(
            !c.put_if_mod_revision("/cas", first.mod_revision, b"three")
                .unwrap(),
            "stale"
        );
        assert_eq!(c.get("/cas").unwrap().expect("still there").value, b"two");
        c.delete("/cas").unwrap();
        assert!(
            c.put_if_mod_revision("/cas", 0, b"again").unwrap(),
            "0 after delete"
        );

        // A key's revision alone.
        let now = c.get("/cas").unwrap().expect("there").mod_revision;
        assert_eq!(c.get_revision("/cas").unwrap(), Some(now));
        let later = c.put("/cas", b"later", None).unwrap();
        assert_eq!(c.get_revision("/cas").unwrap(), Some(later));
        assert_eq!(c.get_revision("/missing").unwrap(), None);
    }

    #[test]
    fn etcd_leases_keep_alive_revoke_and_expire() {
        let etcd = start_etcd();
        let c = &etcd.client;

        let lease = c.grant(30).unwrap();
        c.put("/leased", b"v", Some(lease)).unwrap();
        assert_eq!(
            c.get("/leased").unwrap().expect("leased key").lease,
            lease.0
        );
        let ttl = c.keep_alive(lease).unwrap();
        assert!(ttl > 0 && ttl <= 30, "ttl {ttl}");
        c.revoke(lease).unwrap();
        assert_eq!(
            c.get("/leased").unwrap(),
            None,
            "revoke deletes attached keys"
        );
        assert_eq!(
            c.keep_alive(lease).unwrap(),
            0,
            "keep_alive of a revoked lease"
        );
        c.revoke(lease).unwrap(); // Already gone: not an error.
                                  // The gateway's error bodies end with an HTTP trailer; the body must still be read.
        match c.put("/x", b"v", Some(lease)) {
            Err(EtcdError::Http { status, body, .. }) => {
                assert_eq!(status, 404);
                assert!(body.contains("lease not found"), "{body}");
            }
            other => panic!("put with a revoked lease: {other:?}"),
        }

        // A short lease without keep-alives expires and takes its key with it. etcd raises
        // TTLs to its minimum (1.5 election timeouts: 2 s by default), so a 1 s lease is gone
        // after 2 to 2.5 s here; 5 s leaves room for a slow CI machine.
        let short = c.grant(1).unwrap();
        let granted = Instant::now();
        c.put("/short", b"v", Some(short)).unwrap();
        let gone = eventually(Duration::from_secs(5), || {
            c.get("/short").unwrap().is_none()
        });
        assert!(gone, "key of a 1 s lease still there after 5 s");
        assert!(
            granted.elapsed() >= Duration::from_millis(900),
            "expired too soon"
        );
        assert_eq!(
            c.keep_alive(short).unwrap(),
            0,
            "keep_alive of an expired lease"
        );
    }

    #[test]
    fn etcd_watch_sees_changes_under_its_prefix_only_and_resumes_without_missing_any() {
        let etcd = start_etcd();
        let c = etcd.client.clone();
        let writer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            c.put("/other/x", b"1", None).unwrap();
            c.put("/w/a", b"1", None).unwrap();
        });
        let mut seen = Vec::new();
        let last = etcd
            .client
            .watch_prefix("/w/", 0, Duration::from_secs(5), |rev| {
                seen.push(rev);
                false
            })
            .unwrap();
        writer.join().unwrap();
        assert_eq!(
            seen.len(),
            1,
            "one change under /w/ (the other prefix is not watched)"
        );
        assert_eq!(last, seen[0]);
        // Changes made between two watches are seen by the next one, from `last` on.
        etcd.client.put("/w/b", b"2", None).unwrap();
        let mut again = Vec::new();
        etcd.client
            .watch_prefix("/w/", last, Duration::from_secs(5), |rev| {
                again.push(rev);
                false
            })
            .unwrap();
        assert_eq!(again.len(), 1);
        assert!(again[0] > last);
        // A quiet watch ends with its span, without an error.
        let t0 = std::time::Instant::now();
        let quiet = etcd
            .client
            .watch_prefix("/quiet/", 0, Duration::from_millis(300), |_| true)
            .unwrap();
        assert!(
            quiet >= again[0],
            "a watch from now resumes after the current revision"
        );
        assert!(t0.elapsed() < Duration::from_secs(3));
    }

    /// etcd over TLS with client certificates required: a client with our CA and its
    /// certificate works (puts, gets, leases, watches); one without a certificate, one that
    /// does not trust the CA, one trusting another CA, a key others can read and TLS files
    /// for an `http://` URL are all refused, each saying why.
    #[test]
    fn tls_with_client_certificates_is_used_and_checked() {
        let certs = std::env::temp_dir().join(format!("nessie-etcd-tls-{}", std::process::id()));
        let pki = crate::tls::testing::Pki::make(&certs);
        let files = pki.client.clone();
        let stranger_ca = pki.stranger_ca().unwrap();
        let args = pki.etcd_args();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let etcd = start_etcd_at("https", &args, |url| {
            Etcd::new(url).unwrap().with_tls(&files).unwrap()
        });
        let c = &etcd.client;
        assert!(c.url().starts_with("https://"));
        let lease = c.grant(5).unwrap();
        c.put("tls/k", b"v", Some(lease)).unwrap();
        assert_eq!(c.get("tls/k").unwrap().unwrap().value, b"v");
        // A watch over TLS sees a put made while it runs.
        let writer = c.clone();
        let put_later = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            writer.put("tls/w", b"w", None).unwrap();
        });
        let mut seen = 0;
        c.watch_prefix("tls/", 0, Duration::from_millis(1500), |_| {
            seen += 1;
            false
        })
        .unwrap();
        put_later.join().unwrap();
        assert_eq!(seen, 1, "the watch saw the put");

        let refused = |client: Etcd, what: &str, needle: &str| {
            let e = client.get("tls/k").expect_err(what).to_string();
            assert!(e.to_lowercase().contains(needle), "{what}: {e}");
        };
        let ca_only = crate::tls::TlsFiles {
            ca: files.ca.clone(),
            ..Default::default()
        };
        refused(
            Etcd::new(c.url()).unwrap().with_tls(&ca_only).unwrap(),
            "no client certificate",
            "etcd_cert",
        );
        refused(Etcd::new(c.url()).unwrap(), "public roots only", "etcd_ca");
        let stranger = crate::tls::TlsFiles {
            ca: Some(stranger_ca),
            ..files.clone()
        };
        refused(
            Etcd::new(c.url()).unwrap().with_tls(&stranger).unwrap(),
            "another CA",
            "etcd_ca",
        );

        let http = Etcd::new("http://127.0.0.1:1").unwrap().with_tls(&files);
        assert!(
            matches!(&http, Err(EtcdError::Tls { why, .. }) if why.contains("https")),
            "{:?}",
            http.err()
        );
        std::fs::set_permissions(
            files.key.as_ref().unwrap(),
            std::os::unix::fs::PermissionsExt::from_mode(0o644),
        )
        .unwrap();
        let open_key = Etcd::new(c.url()).unwrap().with_tls(&files);
        assert!(
            matches!(&open_key, Err(EtcdError::Tls { why, .. }) if why.contains("chmod 600")),
            "{:?}",
            open_key.err()
        );
        let no_ca = crate::tls::TlsFiles {
            ca: None,
            ..files.clone()
        };
        let e = Etcd::new(c.url()).unwrap().with_tls(&no_ca).err().unwrap();
        assert!(e.to_string().contains("membership.etcd_ca"), "{e}");
        let lone_key = crate::tls::TlsFiles {
            key: files.key.clone(),
            ..Default::default()
        };
        let e = Etcd::new(c.url())
            .unwrap()
            .with_tls(&lone_key)
            .err()
            .unwrap();
        assert!(e.to_string().contains("membership.etcd_cert"), "{e}");

        // https:// to an etcd serving plain http: told it is not TLS that answers.
        let plain = start_etcd();
        let url = plain.client.url().replace("http://", "https://");
        let e = Etcd::new(&url).unwrap().get("k").unwrap_err().to_string();
        assert!(e.contains("serve https://"), "{e}");
    }

    #[test]
    fn etcd_new_validates_urls() {
        for bad in [
            "https://x",
            "https://u@h:1",
            "localhost:2379",
            "http://h",
            "http://h:1/path",
            "http://h:1/path/",
            "http://:1",
            "http://h:0",
            "http://h:99999",
            "http://h:x",
            "http://u@h:1",
            "http://::1:2379",
            "ftp://h:1",
            "",
        ] {
            match Etcd::new(bad) {
                Err(EtcdError::BadUrl { url, why }) => {
                    assert_eq!(url, bad);
                    assert!(!why.is_empty());
                }
                Err(e) => panic!("{bad:?}: wrong error {e}"),
                Ok(_) => panic!("{bad:?} accepted"),
            }
        }
        assert_eq!(Etcd::new("https://h:1/").unwrap().url(), "https://h:1");
        assert_eq!(Etcd::new("http://h:1/").unwrap().url(), "http://h:1");
        assert_eq!(
            Etcd::new("http://127.0.0.1:2379").unwrap().url(),
            "http://127.0.0.1:2379"
        );
        assert_eq!(
            Etcd::new("http://[::1]:2379").unwrap().url(),
            "http://[::1]:2379"
        );
    }

    #[test]
    fn etcd_closed_port_is_unreachable_quickly() {
        let port = free_port();
        let c = Etcd::with_timeout(
            &format!("http://127.0.0.1:{port}"),
            Duration::from_millis(500),
        )
        .unwrap();
        let start = Instant::now();
        match c.health() {
            Err(EtcdError::Unreachable { url, .. }) => assert_eq!(url, c.url()),
            other => panic!("expected Unreachable, got {other:?}"),
        }
        assert!(
            start.elapsed() < Duration::from_secs(2),
            "{:?}",
            start.elapsed()
        );
        assert!(matches!(c.get("/k"), Err(EtcdError::Unreachable { .. })));
    }

    #[test]
    fn etcd_prefix_range_and_int64_parsing() {
        assert_eq!(prefix_range(b"/a/"), (b"/a/".to_vec(), b"/a0".to_vec()));
        assert_eq!(prefix_range(b"a\xff"), (b"a\xff".to_vec(), b"b".to_vec()));
        assert_eq!(prefix_range(b""), (vec![0], vec![0]));
        assert_eq!(prefix_range(b"\xff"), (b"\xff".to_vec(), vec![0]));
        let h: Header = serde_json::from_str(r#"{"revision":"42"}"#).unwrap();
        assert_eq!(h.revision, 42);
        let h: Header = serde_json::from_str(r#"{"revision":7}"#).unwrap();
        assert_eq!(h.revision, 7);
        let h: Header = serde_json::from_str("{}").unwrap();
        assert_eq!(h.revision, 0);
        assert!(serde_json::from_str::<Header>(r#"{"revision":"x"}"#).is_err());
        assert_eq!(
            truncate(&"é".repeat(600)).chars().count(),
            MAX_ERROR_BODY + 3
        );
    }
}
