//! An endpoint with a hook in front of every operation, for tests that need one operation to
//! fail, stall or lose its answer at a chosen moment (a fenced node, a death one endpoint
//! noticed and another did not, a slow READ). The hook sees each operation before it is
//! issued and may refuse it; for a CAS it also sees the answer and may lose it (the CAS took
//! place, the caller gets an error), the case a caller cannot tell from a CAS never issued.

use crate::{Endpoint, FabricError, RegionId, RemoteAddr};

/// One operation, as an [`Interposer`] sees it before it is issued. Local operations name this
/// endpoint's node.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Op {
    Read(RemoteAddr),
    Write(RemoteAddr),
    Cas(RemoteAddr),
    LocalRead(RemoteAddr),
    LocalWrite(RemoteAddr),
}

impl Op {
    pub fn addr(&self) -> RemoteAddr {
        match *self {
            Op::Read(a) | Op::Write(a) | Op::Cas(a) | Op::LocalRead(a) | Op::LocalWrite(a) => a,
        }
    }
}

/// What runs in front of an [`Interposed`] endpoint's operations.
pub trait Interposer: Send {
    /// Before `op` is issued: an error refuses it (it never reaches memory).
    fn before(&mut self, op: Op) -> Result<(), FabricError>;

    /// After a CAS at `addr` took place: an error loses its answer.
    fn after_cas(&mut self, _addr: RemoteAddr) -> Result<(), FabricError> {
        Ok(())
    }

    /// After a write at `addr` took place: an error loses its answer.
    fn after_write(&mut self, _addr: RemoteAddr) -> Result<(), FabricError> {
        Ok(())
    }
}

/// `inner` with `hook` in front of every operation.
pub struct Interposed<E, I> {
    pub inner: E,
    pub hook: I,
}

impl<E, I> Interposed<E, I> {
    pub fn new(inner: E, hook: I) -> Self {
        Self { inner, hook }
    }
}

impl<E: Endpoint, I: Interposer> Interposed<E, I> {
    fn local(&self, region: RegionId, offset: u64) -> RemoteAddr {
        RemoteAddr::new(self.inner.node(), region, offset)
    }
}

/// Batches run one operation after another (the default `run_batch`), each through the hook
/// as a single operation is: the hook decides per operation.
impl<E: Endpoint, I: Interposer> Endpoint for Interposed<E, I> {
    fn read(&mut self, addr: RemoteAddr, buf: &mut [u8]) -> Result<(), FabricError> {
        self.hook.before(Op::Read(addr))?;
        self.inner.read(addr, buf)
    }

    fn write(&mut self, addr: RemoteAddr, buf: &[u8]) -> Result<(), FabricError> {
        self.hook.before(Op::Write(addr))?;
        self.inner.write(addr, buf)?;
        self.hook.after_write(addr)
    }

    fn compare_and_swap(
        &mut self,
        addr: RemoteAddr,
        expected: u64,
        desired: u64,
    ) -> Result<u64, FabricError> {
        self.hook.before(Op::Cas(addr))?;
        let was = self.inner.compare_and_swap(addr, expected, desired)?;
        self.hook.after_cas(addr)?;
        Ok(was)
    }

    fn local_read(
        &mut self,
        region: RegionId,
        offset: u64,
        buf: &mut [u8],
    ) -> Result<(), FabricError> {
        self.hook
            .before(Op::LocalRead(self.local(region, offset)))?;
        self.inner.local_read(region, offset, buf)
    }

    fn local_write(
        &mut self,
        region: RegionId,
        offset: u64,
        buf: &[u8],
    ) -> Result<(), FabricError> {
        let at = self.local(region, offset);
        self.hook.before(Op::LocalWrite(at))?;
        self.inner.local_write(region, offset, buf)?;
        self.hook.after_write(at)
    }

    crate::forward_endpoint!(field inner);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inproc::InProcFabric;

    /// Refuses writes to node 1, loses the answer of every CAS.
    struct Hook;

    impl Interposer for Hook {
        fn before(&mut self, op: Op) -> Result<(), FabricError> {
            match op {
                Op::Write(a) if a.node == 1 => Err(FabricError::Fenced { node: 0 }),
                _ => Ok(()),
            }
        }
        fn after_cas(&mut self, addr: RemoteAddr) -> Result<(), FabricError> {
            Err(FabricError::Unreachable {
                node: addr.node,
                reason: "answer lost".into(),
            })
        }
    }

    #[test]
    fn refused_operations_never_land_and_lost_answers_did() {
        let f = InProcFabric::new(&[vec![64], vec![64]], None).unwrap();
        let mut ep = Interposed::new(f.endpoint(0), Hook);
        let (a0, a1) = (RemoteAddr::new(0, 0, 0), RemoteAddr::new(1, 0, 0));
        assert!(ep.write(a1, &[7; 8]).is_err());
        assert_eq!(
            f.endpoint(1).read_u64(a1).unwrap(),
            0,
            "refused: not written"
        );
        ep.write(a0, &[1; 8]).unwrap();
        assert!(ep.compare_and_swap(a1, 0, 5).is_err());
        assert_eq!(f.endpoint(1).read_u64(a1).unwrap(), 5, "the CAS took place");
    }

    /// A batch goes through the hook op by op: a refused operation fails alone.
    #[test]
    fn batches_are_hooked_per_operation() {
        let f = InProcFabric::new(&[vec![64], vec![64]], None).unwrap();
        let mut ep = Interposed::new(f.endpoint(0), Hook);
        let (a0, a1) = (RemoteAddr::new(0, 0, 8), RemoteAddr::new(1, 0, 8));
        let mut back = [0u8; 8];
        let mut b = crate::Batch::new();
        let refused = b.write(a1, &[7; 8]);
        let written = b.write(a0, &[9; 8]);
        let read = b.read(a0, &mut back);
        ep.run_batch(&mut b);
        assert_eq!(b.result(refused), Err(FabricError::Fenced { node: 0 }));
        assert_eq!((b.result(written), b.result(read)), (Ok(0), Ok(0)));
        assert_eq!(back, [9; 8]);
        assert_eq!(
            f.endpoint(1).read_u64(a1).unwrap(),
            0,
            "refused: not written"
        );
    }
}
