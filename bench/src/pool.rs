//! A cached thread pool: a job runs on an idle worker if there is one, else on a new thread
//! that stays for later jobs. Creating a thread per connection would cost as much as the
//! connection itself on a small VM and swamp what the benchmark measures.

use std::sync::{
    Arc, Mutex,
    atomic::{AtomicUsize, Ordering},
    mpsc::{Receiver, Sender, channel},
};

type Job = Box<dyn FnOnce() + Send + 'static>;

/// The pool; workers live as long as the process.
pub struct Pool {
    tx: Mutex<Sender<Job>>,
    shared: Arc<Shared>,
}

struct Shared {
    rx: Mutex<Receiver<Job>>,
    idle: AtomicUsize,
}

impl Default for Pool {
    fn default() -> Self {
        Self::new()
    }
}

impl Pool {
    pub fn new() -> Self {
        let (tx, rx) = channel();
        Pool {
            tx: Mutex::new(tx),
            shared: Arc::new(Shared {
                rx: Mutex::new(rx),
                idle: AtomicUsize::new(0),
            }),
        }
    }

    /// Runs `job` on a free worker (reserving it) or on a new one.
    pub fn execute(&self, job: impl FnOnce() + Send + 'static) {
        let idle = &self.shared.idle;
        if idle
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            .is_ok()
        {
            // The reserved worker is in (or about to enter) recv and takes this job. A
            // poisoned lock only means another dispatcher panicked; the sender is still fine.
            let tx = self.tx.lock().unwrap_or_else(|p| p.into_inner());
            let _ = tx.send(Box::new(job));
            return;
        }
        let shared = Arc::clone(&self.shared);
        std::thread::spawn(move || {
            job();
            loop {
                shared.idle.fetch_add(1, Ordering::AcqRel);
                let next = {
                    let rx = shared.rx.lock().unwrap_or_else(|p| p.into_inner());
                    rx.recv()
                };
                match next {
                    Ok(job) => job(),
                    Err(_) => return,
                }
            }
        });
    }
}
