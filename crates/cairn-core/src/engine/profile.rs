//! Per-stage clocks: how long each stage's workers were busy, idle (waiting for input) and
//! blocked (waiting for the next stage), for `--profile`; and the watchdog that names the
//! stage a stalled pipeline is waiting in. Shared by the read path and the
//! restore's write stage.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Adds `took` to phase `name` (the batches' times of one phase are summed).
pub fn add_phase(phases: &mut Vec<(&'static str, Duration)>, name: &'static str, took: Duration) {
    match phases.iter_mut().find(|(n, _)| *n == name) {
        Some((_, d)) => *d += took,
        None => phases.push((name, took)),
    }
}

/// Measures consecutive phases: each [`PhaseClock::lap`] adds the time since the last to a phase.
pub struct PhaseClock(pub Instant);

impl PhaseClock {
    /// Adds the time since the last lap (or the start) to phase `name`.
    pub fn lap(&mut self, phases: &mut Vec<(&'static str, Duration)>, name: &'static str) {
        add_phase(phases, name, self.0.elapsed());
        self.0 = Instant::now();
    }
}

/// `phases` as (name, seconds), in order (a report's form).
pub fn in_seconds(phases: &[(&'static str, Duration)]) -> Vec<(String, f64)> {
    phases.iter().map(|(n, d)| (n.to_string(), d.as_secs_f64())).collect()
}

/// Time accounting of one stage (all workers summed).
#[derive(Default, Debug)]
pub struct StageClock {
    busy_ns: AtomicU64,
    idle_ns: AtomicU64,
    blocked_ns: AtomicU64,
    /// Workers inside a unit of work right now.
    pub working: AtomicU64,
}

/// One stage's totals.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StageTimes {
    /// Doing work.
    pub busy: Duration,
    /// Waiting for input.
    pub idle: Duration,
    /// Waiting for the next stage to take output.
    pub blocked: Duration,
}

impl StageTimes {
    /// Adds another run's times (a restore's batches).
    pub fn add(&mut self, other: StageTimes) {
        self.busy += other.busy;
        self.idle += other.idle;
        self.blocked += other.blocked;
    }
}

impl StageClock {
    fn add(counter: &AtomicU64, since: Instant) {
        counter.fetch_add(since.elapsed().as_nanos() as u64, Ordering::Relaxed);
    }

    /// Records time spent waiting for input.
    pub fn idle(&self, since: Instant) {
        Self::add(&self.idle_ns, since);
    }

    /// Records time spent working.
    pub fn busy(&self, since: Instant) {
        Self::add(&self.busy_ns, since);
    }

    /// Records time spent waiting to hand output on.
    pub fn blocked(&self, since: Instant) {
        Self::add(&self.blocked_ns, since);
    }

    /// The totals so far.
    pub fn times(&self) -> StageTimes {
        let d = |c: &AtomicU64| Duration::from_nanos(c.load(Ordering::Relaxed));
        StageTimes { busy: d(&self.busy_ns), idle: d(&self.idle_ns), blocked: d(&self.blocked_ns) }
    }
}

/// Runs `f` as one unit of work of a stage, counting it as busy and as "working" meanwhile.
pub fn work<T>(clock: &StageClock, f: impl FnOnce() -> T) -> T {
    clock.working.fetch_add(1, Ordering::Relaxed);
    let t = Instant::now();
    let out = f();
    clock.busy(t);
    clock.working.fetch_sub(1, Ordering::Relaxed);
    out
}

/// Names the stage a stalled pipeline is waiting in: the earliest stage with a worker stuck
/// inside a unit of work, else "fetch" (nothing is arriving).
pub fn stalled_stage(stages: &[(&'static str, &StageClock)]) -> &'static str {
    let working = stages.iter().find(|(_, c)| c.working.load(Ordering::Relaxed) > 0);
    working.or(stages.first()).map_or("fetch", |(name, _)| name)
}
