//! Returning freed heap to the operating system.
//!
//! glibc's allocator keeps freed memory in its arenas (one per thread that allocated, up to
//! eight per core) rather than giving it back: after a list of thousands of pods, or after
//! pods leave the node, the agent's RSS would stay at its high-water mark. `malloc_trim(0)`
//! releases every arena's free pages. It walks the arenas (a few milliseconds for tens of
//! MiB), so it runs only after something freed a lot: a completed (re)list of the pod cache,
//! or [`TRIM_AFTER_PODS`] pods gone since the last trim, or at the agent's periodic check when
//! any pod went since.

use std::sync::atomic::{AtomicUsize, Ordering};

/// Pods leaving the cache (or the node) after which the heap is trimmed at once.
pub const TRIM_AFTER_PODS: usize = 256;

static PENDING: AtomicUsize = AtomicUsize::new(0);

/// Records that `n` pods' memory was freed; trims once [`TRIM_AFTER_PODS`] have gone.
pub fn pods_gone(n: usize) {
    if PENDING.fetch_add(n, Ordering::Relaxed) + n >= TRIM_AFTER_PODS {
        trim();
    }
}

/// Trims when any pod went since the last trim (for a periodic check).
pub fn trim_if_pending() -> bool {
    if PENDING.load(Ordering::Relaxed) > 0 {
        trim();
        return true;
    }
    false
}

/// Returns every arena's free pages to the operating system now.
pub fn trim() {
    PENDING.store(0, Ordering::Relaxed);
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `malloc_trim` only releases free memory of the allocator's own arenas.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Where heap allocations are attributed when the agent is built with its `heap-profile`
/// feature (a counting allocator reads [`current_site`]); tagging costs one thread-local write
/// per watch event otherwise.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Site {
    /// Everything not tagged: the agent's registry, runtime, HTTP, eBPF handles, buffers.
    Other = 0,
    /// The pod watch: the response bodies being decoded into full `Pod`s (transient).
    PodWatch = 1,
    /// The compact pod cache itself.
    PodCache = 2,
    /// The namespace watch and its metadata-only cache.
    Namespaces = 3,
}

/// Names of the [`Site`]s, by their number.
pub const SITE_NAMES: [&str; 4] = ["other", "pod-watch", "pod-cache", "namespaces"];

thread_local! {
    static SITE: std::cell::Cell<u8> = const { std::cell::Cell::new(0) };
}

/// The site the current thread's allocations are attributed to.
pub fn current_site() -> u8 {
    SITE.try_with(std::cell::Cell::get).unwrap_or(0)
}

/// Runs `f` with this thread's allocations attributed to `site`.
pub fn in_site<T>(site: Site, f: impl FnOnce() -> T) -> T {
    let previous = SITE.replace(site as u8);
    let out = f();
    SITE.set(previous);
    out
}

/// A stream whose polls (and so the decoding done in them) are attributed to a [`Site`].
pub(crate) struct Tagged<S> {
    pub(crate) inner: S,
    pub(crate) site: Site,
}

impl<S: futures_util::Stream + Unpin> futures_util::Stream for Tagged<S> {
    type Item = S::Item;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        let site = self.site;
        in_site(site, || self.inner.poll_next_unpin(cx))
    }
}

use futures_util::StreamExt as _;
