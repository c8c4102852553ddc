//! [`forward_endpoint!`](crate::forward_endpoint): the [`Endpoint`](crate::Endpoint) methods a
//! wrapper passes on unchanged, written once.
//!
//! Every wrapper (`Delayed`, `MaybeDelayed`, `Interposed`, `Replicated`) changes a few of the
//! memory operations and passes the rest — the node's identity, its clocks, sleeping, idle
//! polling, the counters — straight to the endpoint it wraps. Written out, that is about 35
//! lines per wrapper, and a wrapper that forgets one is wrong silently: `Endpoint` has a
//! default for most of those methods (`mono_ns`, `virtual_time`, `idle_poll`, …), so a
//! missing forward compiles and e.g. runs the simulator's threads on the wall clock.
//!
//! Why a macro and not a trait:
//! - splitting those methods into a supertrait forwarded by a blanket impl would make every
//!   caller that names a concrete endpoint import the new trait (crates outside this one), and
//!   a blanket impl cannot be overridden method by method;
//! - a `Wrapper` trait with `inner()`/`inner_mut()` plus default methods that forward still
//!   needs each wrapper's `impl Endpoint` to call them one by one — the repetition moves,
//!   it does not go.
//!
//! The macro expands, inside a wrapper's `impl Endpoint`, to the forwarding methods. Without a
//! list it forwards [the environment](crate::forward_endpoint) (every method that is not a
//! memory operation, listed once, here); with a list, exactly the methods named. Adding a
//! method to `Endpoint` that wrappers should pass on means adding it to that one list.

/// Forwarding methods for a wrapper's `impl Endpoint` (see the `forward` module for why a
/// macro). Forms, `$f` being the field that holds the wrapped endpoint:
///
/// - `forward_endpoint!(field $f);` — the environment: `node`, `node_count`,
///   `local_prefetch`, `now_ns`, `mono_ns`, `mono_coarse_ns`, `coarse_lag_ns`, `sleep_ns`,
///   `virtual_time`, `shares_thread`, `reads_are_local_copies`, `idle_poll` and `stats`;
/// - `forward_endpoint!(field $f: read, write, …);` — the methods named (any `Endpoint`
///   method but `read_u64`, which every endpoint derives from `read`);
/// - `forward_endpoint!(match Enum { A, B }: …);` (or without the list, the environment)
///   — for an enum each of whose variants `Enum::A(e)` holds an endpoint.
///
/// The memory operations (`read`, `write`, `compare_and_swap`, `local_read`, `local_write`,
/// `run_batch`, `overlaps_batches`) are never forwarded implicitly: each wrapper decides about
/// them.
#[macro_export]
macro_rules! forward_endpoint {
    (field $f:ident) => {
        $crate::forward_endpoint!(@env [field $f]);
    };
    (field $f:ident : $($m:ident),+ $(,)?) => {
        $crate::forward_endpoint!(@list [field $f] $($m)+);
    };
    (match $t:ident { $($v:ident),+ $(,)? }) => {
        $crate::forward_endpoint!(@env [match $t $($v)+]);
    };
    (match $t:ident { $($v:ident),+ $(,)? } : $($m:ident),+ $(,)?) => {
        $crate::forward_endpoint!(@list [match $t $($v)+] $($m)+);
    };

    (@list $how:tt $($m:ident)+) => {
        $( $crate::forward_endpoint!(@one $how $m); )+
    };

    (@env $how:tt) => {
        $crate::forward_endpoint!(@one $how node);
        $crate::forward_endpoint!(@one $how node_count);
        $crate::forward_endpoint!(@one $how local_prefetch);
        $crate::forward_endpoint!(@one $how now_ns);
        $crate::forward_endpoint!(@one $how mono_ns);
        $crate::forward_endpoint!(@one $how mono_coarse_ns);
        $crate::forward_endpoint!(@one $how coarse_lag_ns);
        $crate::forward_endpoint!(@one $how sleep_ns);
        $crate::forward_endpoint!(@one $how virtual_time);
        $crate::forward_endpoint!(@one $how shares_thread);
        $crate::forward_endpoint!(@one $how reads_are_local_copies);
        $crate::forward_endpoint!(@one $how idle_poll);
        $crate::forward_endpoint!(@one $how stats);
    };

    // `$body` with `$e` bound to the wrapped endpoint (`ref`: shared, `mut`: exclusive).
    (@to [field $f:ident] ref $s:tt, $e:ident => $body:expr) => {{
        let $e = &$s.$f;
        $body
    }};
    (@to [field $f:ident] mut $s:tt, $e:ident => $body:expr) => {{
        let $e = &mut $s.$f;
        $body
    }};
    (@to [match $t:ident $($v:ident)+] $_m:tt $s:tt, $e:ident => $body:expr) => {
        match $s {
            $( $t::$v($e) => $body, )+
        }
    };

    (@one $how:tt node) => {
        fn node(&self) -> $crate::NodeId {
            $crate::forward_endpoint!(@to $how ref self, e => $crate::Endpoint::node(e))
        }
    };
    (@one $how:tt node_count) => {
        fn node_count(&self) -> usize {
            $crate::forward_endpoint!(@to $how ref self, e => $crate::Endpoint::node_count(e))
        }
    };
    (@one $how:tt read) => {
        fn read(
            &mut self,
            addr: $crate::RemoteAddr,
            buf: &mut [u8],
        ) -> Result<(), $crate::FabricError> {
            $crate::forward_endpoint!(@to $how mut self, e => $crate::Endpoint::read(e, addr, buf))
        }
    };
    (@one $how:tt write) => {
        fn write(&mut self, addr: $crate::RemoteAddr, buf: &[u8]) -> Result<(), $crate::FabricError> {
            $crate::forward_endpoint!(@to $how mut self, e => $crate::Endpoint::write(e, addr, buf))
        }
    };
    (@one $how:tt compare_and_swap) => {
        fn compare_and_swap(
            &mut self,
            addr: $crate::RemoteAddr,
            expected: u64,
            desired: u64,
        ) -> Result<u64, $crate::FabricError> {
            $crate::forward_endpoint!(@to $how mut self, e =>
                $crate::Endpoint::compare_and_swap(e, addr, expected, desired))
        }
    };
    (@one $how:tt local_read) => {
        fn local_read(
            &mut self,
            region: $crate::RegionId,
            offset: u64,
            buf: &mut [u8],
        ) -> Result<(), $crate::FabricError> {
            $crate::forward_endpoint!(@to $how mut self, e =>
                $crate::Endpoint::local_read(e, region, offset, buf))
        }
    };
    (@one $how:tt local_write) => {
        fn local_write(
            &mut self,
            region: $crate::RegionId,
            offset: u64,
            buf: &[u8],
        ) -> Result<(), $crate::FabricError> {
            $crate::forward_endpoint!(@to $how mut self, e =>
                $crate::Endpoint::local_write(e, region, offset, buf))
        }
    };
    (@one $how:tt local_prefetch) => {
        fn local_prefetch(&self, region: $crate::RegionId, offset: u64, len: u64) {
            $crate::forward_endpoint!(@to $how ref self, e =>
                $crate::Endpoint::local_prefetch(e, region, offset, len))
        }
    };
    (@one $how:tt run_batch) => {
        fn run_batch(&mut self, batch: &mut $crate::batch::Batch<'_>) {
            $crate::forward_endpoint!(@to $how mut self, e => $crate::Endpoint::run_batch(e, batch))
        }
    };
    (@one $how:tt overlaps_batches) => {
        fn overlaps_batches(&self, region: $crate::RegionId) -> bool {
            $crate::forward_endpoint!(@to $how ref self, e =>
                $crate::Endpoint::overlaps_batches(e, region))
        }
    };
    (@one $how:tt now_ns) => {
        fn now_ns(&self) -> u64 {
            $crate::forward_endpoint!(@to $how ref self, e => $crate::Endpoint::now_ns(e))
        }
    };
    (@one $how:tt mono_ns) => {
        fn mono_ns(&self) -> u64 {
            $crate::forward_endpoint!(@to $how ref self, e => $crate::Endpoint::mono_ns(e))
        }
    };
    (@one $how:tt mono_coarse_ns) => {
        fn mono_coarse_ns(&self) -> u64 {
            $crate::forward_endpoint!(@to $how ref self, e => $crate::Endpoint::mono_coarse_ns(e))
        }
    };
    (@one $how:tt coarse_lag_ns) => {
        fn coarse_lag_ns(&self) -> u64 {
            $crate::forward_endpoint!(@to $how ref self, e => $crate::Endpoint::coarse_lag_ns(e))
        }
    };
    (@one $how:tt sleep_ns) => {
        fn sleep_ns(&mut self, ns: u64) {
            $crate::forward_endpoint!(@to $how mut self, e => $crate::Endpoint::sleep_ns(e, ns))
        }
    };
    (@one $how:tt virtual_time) => {
        fn virtual_time(&self) -> bool {
            $crate::forward_endpoint!(@to $how ref self, e => $crate::Endpoint::virtual_time(e))
        }
    };
    (@one $how:tt shares_thread) => {
        fn shares_thread(&self) -> bool {
            $crate::forward_endpoint!(@to $how ref self, e => $crate::Endpoint::shares_thread(e))
        }
    };
    (@one $how:tt reads_are_local_copies) => {
        fn reads_are_local_copies(&self) -> bool {
            $crate::forward_endpoint!(@to $how ref self, e =>
                $crate::Endpoint::reads_are_local_copies(e))
        }
    };
    (@one $how:tt idle_poll) => {
        fn idle_poll(&mut self, region: $crate::RegionId, watched: &[::std::ops::Range<u64>]) {
            $crate::forward_endpoint!(@to $how mut self, e =>
                $crate::Endpoint::idle_poll(e, region, watched))
        }
    };
    (@one $how:tt stats) => {
        fn stats(&self) -> &$crate::StatsCell {
            $crate::forward_endpoint!(@to $how ref self, e => $crate::Endpoint::stats(e))
        }
    };
}
