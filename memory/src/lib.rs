//! The process's memory: how the allocator is tuned, returning freed heap to the operating
//! system, and attributing allocations to sites for the agent's heap profile.
//!
//! glibc's allocator keeps freed memory in its arenas (one per thread that allocated, up to
//! eight per core) rather than giving it back: after a list of thousands of pods, or after
//! pods leave the node, the agent's RSS would stay at its high-water mark. `malloc_trim(0)`
//! releases every arena's free pages. It walks the arenas (a few milliseconds for tens of
//! MiB), so it runs only after something freed a lot: a completed (re)list of the pod cache,
//! or [`TRIM_AFTER_PODS`] pods gone since the last trim, or at the agent's periodic check (after
//! each reconcile pass and reaping) when any pod went since or more than
//! [`TRIM_ABOVE_FREE_BYTES`] lie free in the arenas.

use std::{
    sync::{
        OnceLock,
        atomic::{AtomicU64, AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

/// Pods leaving the cache (or the node) after which the heap is trimmed at once.
pub const TRIM_AFTER_PODS: usize = 256;

static PENDING: AtomicUsize = AtomicUsize::new(0);

/// Records that `n` pods' memory was freed; trims once [`TRIM_AFTER_PODS`] have gone.
pub fn pods_gone(n: usize) {
    if PENDING.fetch_add(n, Ordering::Relaxed) + n >= TRIM_AFTER_PODS {
        trim();
    }
}

/// Free heap (bytes held by the allocator but unused) above which a periodic check trims.
pub const TRIM_ABOVE_FREE_BYTES: usize = 1 << 20;

/// For a periodic check: trims when any pod went since the last trim, or when the allocator
/// holds more than [`TRIM_ABOVE_FREE_BYTES`] free (passes over every pod, status requests and
/// lists leave their transient allocations there). `mallinfo2` only sums the arenas' free
/// lists: far cheaper than a trim.
pub fn trim_if_worthwhile() -> bool {
    let due = since_start()
        .saturating_sub(Duration::from_millis(LAST_TRIM_MS.load(Ordering::Relaxed)))
        >= MIN_TRIM_INTERVAL;
    if PENDING.load(Ordering::Relaxed) > 0 || (due && free_heap_bytes() > TRIM_ABOVE_FREE_BYTES) {
        trim();
        return true;
    }
    false
}

/// Shortest pause between two trims for free heap alone (the free lists keep counting pages a
/// trim already returned, so without it a fragmented heap would be trimmed at every check).
pub const MIN_TRIM_INTERVAL: Duration = Duration::from_secs(10);

/// When the last trim ran, in milliseconds from [`since_start`]'s origin.
static LAST_TRIM_MS: AtomicU64 = AtomicU64::new(0);

fn since_start() -> Duration {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed()
}

/// Bytes the allocator holds free in its arenas.
fn free_heap_bytes() -> usize {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `mallinfo2` only reads the allocator's statistics.
    unsafe {
        libc::mallinfo2().fordblks
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    0
}

/// Returns every arena's free pages to the operating system now.
pub fn trim() {
    PENDING.store(0, Ordering::Relaxed);
    let now = u64::try_from(since_start().as_millis()).unwrap_or(u64::MAX);
    LAST_TRIM_MS.store(now, Ordering::Relaxed);
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
    /// Everything not tagged: the agent's runtime, HTTP, eBPF handles, buffers.
    Other = 0,
    /// The pod watch: the response bodies being decoded into full `Pod`s (transient).
    PodWatch = 1,
    /// The compact pod cache itself.
    PodCache = 2,
    /// The namespace watch and its metadata-only cache.
    Namespaces = 3,
    /// The agent's in-memory registry records.
    Registry = 4,
}

/// Names of the [`Site`]s, by their number.
pub const SITE_NAMES: [&str; 5] = ["other", "pod-watch", "pod-cache", "namespaces", "registry"];

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

/// Tunes glibc's allocator for a long-running process whose memory is mostly many small
/// long-lived blocks (a record per pod) between short-lived ones; call before any thread
/// exists:
/// - one arena: glibc gives each thread that allocates an arena of its own (up to eight per
///   core), and the agent's blocking threads (netns work, bpf syscalls) left megabytes of
///   fragmented second arenas behind (10 of 26 MiB at 10,000 pods); the agent's threads
///   rarely allocate at the same time, so one arena costs no measurable contention;
/// - a fixed mmap threshold: by default it rises to the size of the largest block freed, so
///   after one large buffer (a page of a pod list, a response) every later one of that size
///   comes from the heap and leaves a hole there; fixed, large buffers are mapped and
///   unmapped whole.
pub fn tune_allocator() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only tunes the allocator; the caller runs it before any thread exists.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
        libc::mallopt(libc::M_MMAP_THRESHOLD, 128 * 1024);
    }
}

#[cfg(feature = "heap-profile")]
pub mod heap_profile;

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[test]
    fn freed_small_blocks_are_trimmed_when_worthwhile() {
        // Freed blocks between live ones (a heap after a pass over every pod): they stay in
        // the arena, counted as free, until trimmed.
        let fragment = || {
            let (freed, kept): (Vec<_>, Vec<_>) = (0..1_000)
                .map(|i| (vec![i as u8; 8 << 10], vec![i as u8; 16]))
                .unzip();
            drop(freed);
            kept
        };
        let _kept = fragment();
        assert!(free_heap_bytes() > TRIM_ABOVE_FREE_BYTES);
        // Ten seconds after the start (or the last trim), that much free heap is trimmed.
        LAST_TRIM_MS.store(0, Ordering::Relaxed);
        std::thread::sleep(MIN_TRIM_INTERVAL.saturating_sub(since_start()));
        assert!(trim_if_worthwhile());
        // Right after a trim, free heap alone does not trim again; a pod gone does.
        let _kept_too = fragment();
        assert!(!trim_if_worthwhile());
        PENDING.store(1, Ordering::Relaxed);
        assert!(trim_if_worthwhile());
        assert_eq!(PENDING.load(Ordering::Relaxed), 0);
    }
}
