//! The lock around the agent's maps: ADDs and DELs first, background passes after.
//!
//! `std::sync::Mutex` is not fair: a thread that releases it and takes it again at once
//! usually wins over a thread already waiting (which must first be woken and scheduled). The
//! reconciler and the adopter take the lock once per pod in passes of hundreds of pods, so an
//! ADD arriving during a pass waited for most of it (12 ms at 10,000 pods, the ADD p99). Here
//! background work takes the lock only when no foreground operation is waiting for it.

use std::{
    sync::{
        Mutex, MutexGuard,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

/// How long background work waits for the waiting operations to get in before it queues like
/// them (a stream of ADDs must not stop the reconciler for ever).
const BACKGROUND_PATIENCE: Duration = Duration::from_millis(100);
const BACKGROUND_POLL: Duration = Duration::from_micros(100);

/// A mutex whose [`lock`](Self::lock) goes before [`lock_background`](Self::lock_background).
#[derive(Debug)]
pub struct MapsLock<T> {
    inner: Mutex<T>,
    /// Foreground operations waiting for `inner`.
    waiting: AtomicUsize,
}

impl<T> MapsLock<T> {
    pub fn new(value: T) -> Self {
        Self {
            inner: Mutex::new(value),
            waiting: AtomicUsize::new(0),
        }
    }

    /// For ADD, DEL and the like. A panic while the lock was held cannot leave the maps
    /// inconsistent beyond what the next operation repairs (writes are idempotent), so a
    /// poisoned lock is still usable.
    pub fn lock(&self) -> MutexGuard<'_, T> {
        self.waiting.fetch_add(1, Ordering::SeqCst);
        let guard = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        self.waiting.fetch_sub(1, Ordering::SeqCst);
        guard
    }

    /// For background passes: first lets every waiting [`lock`](Self::lock) in (for up to
    /// [`BACKGROUND_PATIENCE`]).
    pub fn lock_background(&self) -> MutexGuard<'_, T> {
        let polls = BACKGROUND_PATIENCE.as_micros() / BACKGROUND_POLL.as_micros();
        for _ in 0..polls {
            if self.waiting.load(Ordering::SeqCst) == 0 {
                break;
            }
            std::thread::sleep(BACKGROUND_POLL);
        }
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Foreground operations waiting right now.
    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use std::{
        sync::{Arc, Mutex as StdMutex},
        time::Instant,
    };

    use super::*;

    /// A background pass that releases the lock and takes it again lets the waiting ADD in
    /// first, every time it gets in within the background's patience: the guarantee is
    /// bounded by [`BACKGROUND_PATIENCE`], so on a machine too busy to run the woken ADD
    /// within it, the pass may go first, and only then.
    #[test]
    fn a_waiting_operation_goes_before_the_next_background_step() {
        for _ in 0..20 {
            let lock = Arc::new(MapsLock::new(()));
            let order = Arc::new(StdMutex::new(Vec::new()));
            let held = lock.lock_background();
            let foreground = {
                let (lock, order) = (lock.clone(), order.clone());
                std::thread::spawn(move || {
                    let _g = lock.lock();
                    order.lock().unwrap().push("add");
                    std::thread::sleep(Duration::from_millis(2));
                })
            };
            // (Only a guard against a thread that never runs: no machine is that busy.)
            let start = Instant::now();
            while lock.waiting() == 0 {
                assert!(start.elapsed() < Duration::from_secs(60), "never waited");
                std::thread::yield_now();
            }
            // The pass moves to its next pod: release, take again.
            drop(held);
            let asked = Instant::now();
            let _g = lock.lock_background();
            let patience_ran_out = asked.elapsed() >= BACKGROUND_PATIENCE;
            order.lock().unwrap().push("pass");
            drop(_g);
            foreground.join().unwrap();
            let order = order.lock().unwrap().clone();
            assert!(
                order == ["add", "pass"] || patience_ran_out,
                "the pass went first without waiting out its patience: {order:?}"
            );
        }
    }

    /// Background work is not starved for ever by a steady stream of operations.
    #[test]
    fn background_gets_the_lock_after_its_patience() {
        let lock = Arc::new(MapsLock::new(()));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let hammer: Vec<_> = (0..2)
            .map(|_| {
                let (lock, stop) = (lock.clone(), stop.clone());
                std::thread::spawn(move || {
                    while !stop.load(Ordering::SeqCst) {
                        let _g = lock.lock();
                        std::thread::sleep(Duration::from_micros(200));
                    }
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(10));
        // Getting the lock while the stream goes on is the point; the minute only turns
        // starvation into a failure instead of a hang, far beyond any busy machine's delay.
        let (got, got_it) = std::sync::mpsc::channel();
        let background = {
            let lock = lock.clone();
            std::thread::spawn(move || {
                drop(lock.lock_background());
                let _ = got.send(());
            })
        };
        let result = got_it.recv_timeout(Duration::from_secs(60));
        stop.store(true, Ordering::SeqCst);
        for h in hammer {
            h.join().unwrap();
        }
        background.join().unwrap();
        assert!(
            result.is_ok(),
            "background starved while operations went on"
        );
    }
}
