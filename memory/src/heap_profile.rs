//! A counting allocator for the `heap-profile` feature: live heap bytes and blocks by site
//! ([`crate::Site`], a thread-local tag set around the pod and namespace
//! watches), written once a second, with the pod cache's size and the process's RSS, to the
//! file named by `LINKERD_CNI_HEAP_PROFILE`.
//!
//! Each block carries a 16-byte header (more for over-aligned layouts) holding its site, so a
//! block freed elsewhere is subtracted from the site that allocated it. Not for production:
//! it adds that header to every allocation.

use std::{
    alloc::{GlobalAlloc, Layout, System},
    sync::atomic::{AtomicIsize, Ordering},
};

use crate::{SITE_NAMES, current_site};

const SITES: usize = SITE_NAMES.len();

static BYTES: [AtomicIsize; SITES] = [const { AtomicIsize::new(0) }; SITES];
static BLOCKS: [AtomicIsize; SITES] = [const { AtomicIsize::new(0) }; SITES];

/// The counting allocator (over the system's).
pub struct Counting;

fn header(layout: Layout) -> usize {
    layout.align().max(16)
}

// SAFETY: every block is the system allocator's, offset by a header that keeps the caller's
// alignment (the header is a multiple of it); the site byte lies inside the header.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let h = header(layout);
        let Ok(outer) = Layout::from_size_align(layout.size() + h, h) else {
            return std::ptr::null_mut();
        };
        // SAFETY: `outer` has a non-zero size.
        let base = unsafe { System.alloc(outer) };
        if base.is_null() {
            return base;
        }
        let site = usize::from(current_site()).min(SITES - 1);
        // SAFETY: `base` holds `h` header bytes before the caller's block.
        unsafe {
            let user = base.add(h);
            *user.sub(1) = site as u8;
            BYTES[site].fetch_add(layout.size() as isize, Ordering::Relaxed);
            BLOCKS[site].fetch_add(1, Ordering::Relaxed);
            user
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        let h = header(layout);
        // SAFETY: `ptr` came from `alloc` with this layout: its header precedes it.
        unsafe {
            let site = usize::from(*ptr.sub(1)).min(SITES - 1);
            BYTES[site].fetch_sub(layout.size() as isize, Ordering::Relaxed);
            BLOCKS[site].fetch_sub(1, Ordering::Relaxed);
            System.dealloc(
                ptr.sub(h),
                Layout::from_size_align_unchecked(layout.size() + h, h),
            );
        }
    }
}

/// One line: live bytes and blocks by site.
pub fn snapshot() -> String {
    let mut out = String::new();
    let mut total = 0;
    for (i, name) in SITE_NAMES.iter().enumerate() {
        let bytes = BYTES[i].load(Ordering::Relaxed);
        total += bytes;
        out.push_str(&format!(
            " {name}={bytes}B/{}",
            BLOCKS[i].load(Ordering::Relaxed)
        ));
    }
    format!("live={total}B{out}")
}

/// The process's resident set, in KiB.
fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

/// Appends a line to the file named by `LINKERD_CNI_HEAP_PROFILE` each second the numbers
/// change (`cached` reports the pod cache's size).
pub fn spawn_reporter(cached: impl Fn() -> usize + Send + 'static) {
    let Some(path) = std::env::var_os("LINKERD_CNI_HEAP_PROFILE") else {
        return;
    };
    tokio::spawn(async move {
        use std::io::Write;
        let mut last = String::new();
        loop {
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            let line = format!("pods={} {}", cached(), snapshot());
            if line == last {
                continue;
            }
            if let Ok(mut f) = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)
            {
                let _ = writeln!(f, "rss={}KiB {line}", rss_kib());
            }
            last = line;
        }
    });
}
