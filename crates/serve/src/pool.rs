//! A node's pool of store clients (its client workers), shared by its front ends and its
//! admin socket: a front-end connection leases one for each batch of requests it serves
//! ([`nessie_frontend::serve::Backend`]), an admin request for itself.

use std::sync::{Condvar, Mutex};

use nessie_frontend::serve::{Backend, Lease};
use nessie_protocols::KvClient;

/// A node's client workers, lent out one request (admin socket) or one batch of requests
/// (front-end connection) at a time.
pub struct ClientPool {
    clients: Mutex<Idle>,
    available: Condvar,
}

/// The clients not lent out, and how many callers wait for one: a client coming back wakes
/// a waiter only if there is one (a futex wake is a system call, and with one event loop
/// nobody ever waits: it was a fifth of a pipelining front end's time).
struct Idle {
    clients: Vec<Box<dyn KvClient>>,
    waiting: usize,
}

impl ClientPool {
    pub fn new(clients: Vec<Box<dyn KvClient>>) -> Self {
        assert!(
            !clients.is_empty(),
            "a client pool needs at least one client"
        );
        Self {
            clients: Mutex::new(Idle {
                clients,
                waiting: 0,
            }),
            available: Condvar::new(),
        }
    }

    /// A client, waiting for one to be free; it goes back to the pool when the lease is
    /// dropped, unwinding included, so later callers are not left waiting for it.
    pub fn lease(&self) -> Lent<'_> {
        let c = {
            let mut g = self.lock();
            loop {
                if let Some(c) = g.clients.pop() {
                    break c;
                }
                g.waiting += 1;
                g = self
                    .available
                    .wait(g)
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                g.waiting -= 1;
            }
        };
        Lent {
            pool: self,
            client: Some(c),
        }
    }

    /// Run `f` with a client, waiting for one to be free. The client goes back to the pool
    /// even if `f` panics.
    pub fn with<T>(&self, f: impl FnOnce(&mut dyn KvClient) -> T) -> T {
        f(self.lease().client())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Idle> {
        // The list is consistent whenever the lock is released, so a poisoned lock is usable.
        self.clients
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// A client lent out by [`ClientPool::lease`]; returned to the pool on drop, unwinding included.
pub struct Lent<'a> {
    pool: &'a ClientPool,
    client: Option<Box<dyn KvClient>>,
}

impl Drop for Lent<'_> {
    fn drop(&mut self) {
        if let Some(c) = self.client.take() {
            let mut g = self.pool.lock();
            g.clients.push(c);
            let wake = g.waiting > 0;
            drop(g);
            if wake {
                self.pool.available.notify_one();
            }
        }
    }
}

impl Lease for Lent<'_> {
    fn client(&mut self) -> &mut dyn KvClient {
        self.client.as_mut().expect("lent client").as_mut()
    }
}

impl Backend for ClientPool {
    fn lease(&self) -> Box<dyn Lease + '_> {
        Box::new(ClientPool::lease(self))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;

    /// A client that panics on every operation.
    struct Panicky;
    impl KvClient for Panicky {
        fn get(&mut self, _: &[u8]) -> Result<Option<Vec<u8>>, nessie_protocols::Error> {
            panic!("client failure")
        }
        fn put(&mut self, _: &[u8], _: &[u8]) -> Result<(), nessie_protocols::Error> {
            Ok(())
        }
        fn delete(&mut self, _: &[u8]) -> Result<(), nessie_protocols::Error> {
            Ok(())
        }
    }

    #[test]
    fn client_pool_gets_its_client_back_when_the_closure_panics() {
        let pool = Arc::new(ClientPool::new(vec![Box::new(Panicky)]));
        let p = pool.clone();
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            p.with(|c| c.get(b"k").map(|_| ()))
        }));
        assert!(r.is_err(), "the closure panicked");
        // The only client must be back: a later caller gets it instead of waiting forever.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || tx.send(pool.with(|c| c.put(b"k", b"v").is_ok())));
        assert_eq!(rx.recv_timeout(Duration::from_secs(5)), Ok(true));
    }
}
