//! The scheduler: when each profile's jobs are due, the queue (one job per repository at a
//! time), retries with backoff, catch-up of a run missed while the agent was not running, and
//! the overdue-backup alert.
//!
//! Deadlines are wall-clock times, and the loop sleeps at most [`RECHECK`] before it compares
//! them with the clock again, so a clock that jumps (a suspended laptop waking, an NTP step)
//! delays nothing by more than that; one long sleep would count the time on a clock that stood
//! still while the machine slept.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Local};

use crate::history::{Outcome, Run};
use crate::job::{self, Progress};
use crate::notify::{self, Event};
use crate::profiles::JobKind;
use crate::Agent;

/// The longest the loop sleeps before looking at the clock again.
pub const RECHECK: Duration = Duration::from_secs(30);

/// For tests: a file holding seconds to add to the wall clock (read at each look at it), so
/// a test can make the clock jump; the loop then rechecks every 200 ms.
pub const TEST_CLOCK: &str = "CAIRN_AGENT_TEST_CLOCK";

/// The wall clock, moved by [`TEST_CLOCK`]'s offset if set.
pub fn now() -> DateTime<Local> {
    let offset = std::env::var_os(TEST_CLOCK)
        .and_then(|f| std::fs::read_to_string(f).ok())
        .and_then(|t| t.trim().parse::<i64>().ok())
        .unwrap_or(0);
    Local::now() + chrono::Duration::seconds(offset)
}

fn recheck() -> Duration {
    if std::env::var_os(TEST_CLOCK).is_some() {
        Duration::from_millis(200)
    } else {
        RECHECK
    }
}

/// A job waiting for its turn.
#[derive(Debug, Clone)]
pub struct Queued {
    /// Index into the profiles.
    pub profile: usize,
    /// The job.
    pub job: JobKind,
    /// Why: `schedule`, `catch-up`, `run-now`, `retry N`.
    pub reason: String,
    /// Retries done so far.
    pub attempt: u32,
    /// Not before this time (a retry's backoff).
    pub not_before: DateTime<Local>,
}

/// A job running now.
#[derive(Debug, Clone)]
pub struct Live {
    /// Its run.
    pub run: Run,
    /// The `cairn` process (0 until it started).
    pub pid: u32,
    /// Its last status.
    pub progress: Progress,
}

/// A profile's scheduling state.
#[derive(Debug, Clone, Default)]
pub struct ProfileState {
    /// The next scheduled run of each job that has a schedule.
    pub next: Vec<(JobKind, DateTime<Local>)>,
    /// The job running now.
    pub running: Option<Live>,
    /// Whether the overdue alert was sent since the last successful backup.
    pub overdue_sent: bool,
    /// The repository's size after the last job, bytes (packs in the index).
    pub repo_size: Option<u64>,
}

/// The next time `schedule` fires after `now`, plus a random share of `delay`.
fn next_time(schedule: &cairn_schedule::Schedule, now: DateTime<Local>, delay: Duration) -> DateTime<Local> {
    let at = schedule.next_after(&now).unwrap_or(now + chrono::Duration::days(3650));
    at + chrono::Duration::from_std(random_share(delay)).unwrap_or_default()
}

fn random_share(d: Duration) -> Duration {
    if d.is_zero() {
        return d;
    }
    let mut b = [0u8; 8];
    let _ = ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut b);
    Duration::from_secs(u64::from_le_bytes(b) % d.as_secs().max(1))
}

impl Agent {
    /// The first deadlines: each job's next time, or now when its last scheduled time passed
    /// since its last run (a run missed while the agent was not running: catch-up).
    pub(crate) fn plan_first(&self) {
        let now = now();
        let mut st = self.state.lock().unwrap();
        for (i, jobs) in self.profiles.iter().enumerate() {
            let mut next = Vec::new();
            for (kind, schedule) in &jobs.schedules {
                let last = st.history.last(&jobs.profile, Some(*kind)).map(|r| r.started);
                let missed = match (schedule.previous_at_or_before(&now), last) {
                    (Some(prev), Some(last)) => prev.timestamp() > last,
                    _ => false,
                };
                if missed {
                    st.queue.push_back(Queued {
                        profile: i,
                        job: *kind,
                        reason: "catch-up".into(),
                        attempt: 0,
                        not_before: now,
                    });
                }
                next.push((*kind, next_time(schedule, now, jobs.random_delay)));
            }
            st.profiles[i].next = next;
        }
    }

    /// Runs until the agent stops: queues what is due, starts what may run, sleeps.
    pub(crate) async fn schedule_loop(self: Arc<Self>) {
        while !self.stopping.load(Ordering::Relaxed) {
            let now = now();
            self.queue_due(now);
            self.check_overdue(now).await;
            let sleep = self.start_ready(now);
            tokio::select! {
                _ = tokio::time::sleep(sleep) => {}
                _ = self.wake.notified() => {}
            }
        }
    }

    fn queue_due(&self, now: DateTime<Local>) {
        let mut guard = self.state.lock().unwrap();
        let st = &mut *guard;
        for (i, jobs) in self.profiles.iter().enumerate() {
            for k in 0..st.profiles[i].next.len() {
                let (kind, at) = st.profiles[i].next[k];
                if at > now {
                    continue;
                }
                let schedule = jobs.schedule(kind).expect("a scheduled job has a schedule");
                st.profiles[i].next[k].1 = next_time(schedule, now, jobs.random_delay);
                enqueue(&mut st.queue, &st.profiles[i], i, kind, "schedule", now);
            }
        }
    }

    async fn check_overdue(&self, now: DateTime<Local>) {
        let mut events = Vec::new();
        {
            let mut st = self.state.lock().unwrap();
            for (i, jobs) in self.profiles.iter().enumerate() {
                let Some(after) = jobs.alert_after else { continue };
                let since = st.history.last_ok(&jobs.profile, JobKind::Backup).map_or(self.started, |r| r.ended);
                if now.timestamp() - since > after.as_secs() as i64 && !st.profiles[i].overdue_sent {
                    st.profiles[i].overdue_sent = true;
                    let ago = cairn_schedule::format_duration(Duration::from_secs(
                        (now.timestamp() - since) as u64 / 60 * 60,
                    ));
                    events.push((
                        i,
                        self.event(
                            notify::Kind::Overdue,
                            &jobs.profile,
                            JobKind::Backup,
                            None,
                            format!(
                                "no successful backup of profile {} on {} for {ago} (alert-after {})",
                                jobs.profile,
                                self.host,
                                cairn_schedule::format_duration(after)
                            ),
                        ),
                    ));
                }
            }
        }
        for (i, e) in events {
            notify::send(&self.profiles[i], &e).await;
        }
    }

    /// Starts each queued job whose repository is free and whose time has come; returns how
    /// long to sleep.
    fn start_ready(self: &Arc<Self>, now: DateTime<Local>) -> Duration {
        let mut st = self.state.lock().unwrap();
        let recheck = recheck();
        if self.stopping.load(Ordering::Relaxed) {
            return recheck;
        }
        let mut i = 0;
        while i < st.queue.len() {
            let q = st.queue[i].clone();
            let repo = &self.profiles[q.profile].repo;
            let busy = self.profiles.iter().enumerate().any(|(j, p)| {
                st.profiles[j].running.is_some() && (j == q.profile || (!repo.is_empty() && p.repo == *repo))
            });
            if q.not_before > now || busy {
                i += 1;
                continue;
            }
            st.queue.remove(i);
            let run = match st.history.start(&self.profiles[q.profile].profile, q.job, &q.reason) {
                Ok(r) => r,
                Err(e) => {
                    eprintln!("cairn agent: {e:#}");
                    continue;
                }
            };
            st.profiles[q.profile].running = Some(Live { run: run.clone(), pid: 0, progress: Progress::default() });
            let agent = self.clone();
            tokio::spawn(async move { agent.run_job(q, run).await });
        }
        let mut wake = now + chrono::Duration::from_std(recheck).unwrap_or_default();
        for p in &st.profiles {
            for (_, at) in &p.next {
                wake = wake.min(*at);
            }
        }
        for q in &st.queue {
            wake = wake.min(q.not_before.max(now));
        }
        (wake - now).to_std().unwrap_or_default().min(recheck)
    }

    /// Runs one queued job and records it: history, retry, alerts, metrics.
    pub(crate) async fn run_job(self: Arc<Self>, q: Queued, mut run: Run) {
        let jobs = &self.profiles[q.profile];
        let log = self.state.lock().unwrap().history.log_path(run.id);
        let result = job::run(
            &self.launcher,
            &mut run,
            &log,
            |pid| {
                if let Some(l) = self.state.lock().unwrap().profiles[q.profile].running.as_mut() {
                    l.pid = pid;
                }
            },
            |p| {
                if let Some(l) = self.state.lock().unwrap().profiles[q.profile].running.as_mut() {
                    l.progress = p;
                }
            },
        )
        .await;
        if let Err(e) = result {
            run.outcome = Outcome::Failed;
            run.message = format!("{e:#}");
        }
        self.forget_repository(&jobs.profile);
        let size = self.repository_size(q.profile).await;
        let retry = job::transient(&run) && q.attempt < jobs.retries && !self.stopping.load(Ordering::Relaxed);
        let event = {
            let mut st = self.state.lock().unwrap();
            let before = st.history.last(&jobs.profile, Some(q.job)).map(|r| r.outcome);
            if let Some(size) = size {
                st.profiles[q.profile].repo_size = Some(size);
            }
            if run.outcome.ok() && q.job == JobKind::Backup {
                st.profiles[q.profile].overdue_sent = false;
            }
            let event = if retry {
                let backoff = jobs.retry_delay * 2u32.pow(q.attempt.min(16));
                run.message = format!("{} (retry in {})", run.message, cairn_schedule::format_duration(backoff));
                st.queue.push_back(Queued {
                    attempt: q.attempt + 1,
                    reason: format!("retry {}", q.attempt + 1),
                    not_before: now() + chrono::Duration::from_std(backoff).unwrap_or_default(),
                    ..q.clone()
                });
                None
            } else if run.outcome == Outcome::Failed {
                Some(self.event(
                    notify::Kind::Failure,
                    &jobs.profile,
                    q.job,
                    Some(run.id),
                    format!("{} of profile {} on {} failed: {}", q.job.name(), jobs.profile, self.host, run.message),
                ))
            } else if run.outcome.ok() && before == Some(Outcome::Failed) {
                Some(self.event(
                    notify::Kind::Recovery,
                    &jobs.profile,
                    q.job,
                    Some(run.id),
                    format!("{} of profile {} on {} succeeded again", q.job.name(), jobs.profile, self.host),
                ))
            } else {
                None
            };
            st.profiles[q.profile].running = None;
            if let Err(e) = st.history.finish(run) {
                eprintln!("cairn agent: {e:#}");
            }
            event
        };
        if let Some(e) = event {
            notify::send(jobs, &e).await;
        }
        self.write_metrics_file();
        self.wake.notify_one();
    }

    fn event(&self, kind: notify::Kind, profile: &str, job: JobKind, run: Option<u64>, message: String) -> Event {
        Event {
            event: kind,
            host: self.host.clone(),
            profile: profile.to_string(),
            job: job.name().to_string(),
            message,
            run,
            time: now().to_rfc3339(),
        }
    }

    /// Queues `job` of profile `i` now (from `run-now` or the page); false if it is already
    /// queued or running.
    pub(crate) fn run_now(&self, i: usize, job: JobKind) -> bool {
        let mut st = self.state.lock().unwrap();
        let st = &mut *st;
        let queued = enqueue(&mut st.queue, &st.profiles[i], i, job, "run-now", now());
        self.wake.notify_one();
        queued
    }
}

/// Adds a job to the queue unless the same job of the profile is waiting or running.
fn enqueue(
    queue: &mut VecDeque<Queued>,
    p: &ProfileState,
    i: usize,
    job: JobKind,
    reason: &str,
    now: DateTime<Local>,
) -> bool {
    let running = p.running.as_ref().is_some_and(|l| l.run.job == job);
    if running || queue.iter().any(|q| q.profile == i && q.job == job) {
        return false;
    }
    queue.push_back(Queued { profile: i, job, reason: reason.into(), attempt: 0, not_before: now });
    true
}
