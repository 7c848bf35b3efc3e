//! A cached thread pool: a job runs on an idle worker if there is one, else on a new thread.
//! Workers are kept for reuse, so a server that handles one connection at a time does not pay
//! for a thread per connection (which costs about a millisecond on small VMs and would swamp
//! connection-setup measurements). Jobs may block for as long as they like: a job never waits
//! behind another.
//!
//! The workspace's one thread pool: the test proxy and echo servers here, and the benchmark's
//! proxy and application server, run their connections on it.

use std::sync::{
    Arc, Mutex,
    atomic::{AtomicUsize, Ordering},
    mpsc::{Receiver, Sender, channel},
};

type Job = Box<dyn FnOnce() + Send + 'static>;

/// The pool. Its workers end once the pool is dropped and they finish their job.
pub struct Pool {
    tx: Sender<Job>,
    shared: Arc<Shared>,
}

struct Shared {
    rx: Mutex<Receiver<Job>>,
    /// Workers waiting for a job and not yet reserved by a dispatch.
    idle: AtomicUsize,
}

impl Default for Pool {
    fn default() -> Self {
        Self::new()
    }
}

impl Pool {
    /// A pool with no worker yet: the first job starts one.
    pub fn new() -> Self {
        let (tx, rx) = channel();
        Pool {
            tx,
            shared: Arc::new(Shared {
                rx: Mutex::new(rx),
                idle: AtomicUsize::new(0),
            }),
        }
    }

    /// Runs `job` on a worker that is free now (reserving it), or on a new one.
    pub fn execute(&self, job: impl FnOnce() + Send + 'static) {
        let idle = &self.shared.idle;
        if idle
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            .is_ok()
        {
            // The reserved worker is blocked in (or about to enter) recv: it takes this job.
            // Sending cannot fail: the workers' receiver lives as long as `shared`.
            let _ = self.tx.send(Box::new(job));
            return;
        }
        let shared = Arc::clone(&self.shared);
        std::thread::spawn(move || {
            job();
            work(&shared);
        });
    }

    #[cfg(test)]
    fn idle(&self) -> usize {
        self.shared.idle.load(Ordering::Acquire)
    }
}

fn work(shared: &Shared) {
    loop {
        shared.idle.fetch_add(1, Ordering::AcqRel);
        let job = {
            let rx = match shared.rx.lock() {
                Ok(g) => g,
                Err(p) => p.into_inner(),
            };
            rx.recv()
        };
        match job {
            Ok(job) => job(),
            // The pool is gone.
            Err(_) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::{sync::mpsc, time::Duration};

    #[test]
    fn blocking_jobs_never_wait_behind_each_other_and_workers_are_reused() {
        let pool = Pool::new();
        // Three jobs that block until released: all must be running at once.
        let (started_tx, started_rx) = mpsc::channel();
        let (release_tx, release_rx) = mpsc::channel::<()>();
        let release_rx = Arc::new(Mutex::new(release_rx));
        for i in 0..3 {
            let (started_tx, release_rx) = (started_tx.clone(), Arc::clone(&release_rx));
            pool.execute(move || {
                started_tx.send(i).expect("send");
                let _ = release_rx.lock().expect("lock").recv();
            });
        }
        let mut started: Vec<i32> = (0..3)
            .map(|_| {
                started_rx
                    .recv_timeout(Duration::from_secs(5))
                    .expect("all three jobs run concurrently")
            })
            .collect();
        started.sort();
        assert_eq!(started, vec![0, 1, 2]);
        for _ in 0..3 {
            release_tx.send(()).expect("release");
        }
        // Wait until the three workers are idle again, then run more jobs: no new threads.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while pool.idle() < 3 {
            assert!(
                std::time::Instant::now() < deadline,
                "workers return to idle"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        let (tx, rx) = mpsc::channel();
        for _ in 0..3 {
            let tx = tx.clone();
            pool.execute(move || tx.send(std::thread::current().id()).expect("send"));
        }
        let ids: std::collections::HashSet<_> = (0..3)
            .map(|_| rx.recv_timeout(Duration::from_secs(5)).expect("job ran"))
            .collect();
        assert!(
            !ids.is_empty() && ids.len() <= 3,
            "jobs ran on the existing workers: {ids:?}"
        );
        while pool.idle() < 3 {
            assert!(
                std::time::Instant::now() < deadline,
                "workers return to idle"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(pool.idle(), 3, "all workers idle again, none added");
    }
}
