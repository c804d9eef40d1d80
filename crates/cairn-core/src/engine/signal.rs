//! A one-way signal between threads: raised once, waited for with or without a timeout. A
//! progress display waits on one for its work to end (so it stops at once, not at its next
//! tick); a restore raises one when it reads nothing more from the repository, and its lock is
//! let go then.

use std::sync::{Condvar, Mutex};
use std::time::Duration;

/// Raised once; waiters wake at once.
#[derive(Debug, Default)]
pub struct Signal {
    raised: Mutex<bool>,
    changed: Condvar,
}

impl Signal {
    /// Raises the signal (again: nothing more).
    pub fn raise(&self) {
        *self.raised.lock().expect("signal lock") = true;
        self.changed.notify_all();
    }

    /// Waits until the signal is raised.
    pub fn wait(&self) {
        let raised = self.raised.lock().expect("signal lock");
        drop(self.changed.wait_while(raised, |raised| !*raised).expect("signal lock"));
    }

    /// Waits up to `timeout` for the signal; returns whether it is raised.
    pub fn wait_timeout(&self, timeout: Duration) -> bool {
        let raised = self.raised.lock().expect("signal lock");
        let (raised, _) = self.changed.wait_timeout_while(raised, timeout, |raised| !*raised).expect("signal lock");
        *raised
    }
}

/// Raises a [`Signal`] when dropped, also when the work it watches unwinds, so a failure can
/// never leave a waiter waiting.
pub struct RaiseOnDrop<'a>(pub &'a Signal);

impl Drop for RaiseOnDrop<'_> {
    fn drop(&mut self) {
        self.0.raise();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_raise_wakes_a_waiter_and_stays_raised() {
        let signal = Signal::default();
        assert!(!signal.wait_timeout(Duration::from_millis(10)));
        std::thread::scope(|s| {
            let waiter = s.spawn(|| signal.wait());
            drop(RaiseOnDrop(&signal));
            waiter.join().unwrap();
        });
        assert!(signal.wait_timeout(Duration::ZERO));
        signal.wait();
    }
}
