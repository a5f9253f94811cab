//! Reading a finished soak: which failed requests the faults excuse, which access-log lines are
//! missing, and how memory moved.

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use super::faults::Excuse;
use super::procfs::Row;
use super::traffic::{request_id, Outcome};

/// Failed requests split into those a fault excuses (per kind of excuse) and the rest.
pub struct Failures<'a> {
    pub replica_kills: usize,
    pub store_outages: usize,
    pub unexpected: Vec<&'a Outcome>,
}

pub fn failures<'a>(outcomes: &'a [Outcome], excuses: &[Excuse]) -> Failures<'a> {
    // A killed replica excuses at most the requests that were in flight on it.
    let mut budget: Vec<usize> = excuses
        .iter()
        .map(|e| match e {
            Excuse::ReplicaKill { cut, .. } => *cut,
            Excuse::StoreOutage { .. } => usize::MAX,
        })
        .collect();
    let mut out = Failures {
        replica_kills: 0,
        store_outages: 0,
        unexpected: Vec::new(),
    };
    for o in outcomes.iter().filter(|o| o.problem.is_some()) {
        let excused = excuses.iter().enumerate().position(|(i, e)| {
            budget[i] > 0
                && match *e {
                    Excuse::ReplicaKill { from, to, .. } => {
                        o.kind.proxied() && !(400..500).contains(&o.status) && overlaps(o, from, to)
                    }
                    Excuse::StoreOutage { from, to } => {
                        o.api_key && o.status == 401 && overlaps(o, from, to)
                    }
                }
        });
        match excused {
            Some(i) => {
                budget[i] = budget[i].saturating_sub(1);
                match excuses[i] {
                    Excuse::ReplicaKill { .. } => out.replica_kills += 1,
                    Excuse::StoreOutage { .. } => out.store_outages += 1,
                }
            }
            None => out.unexpected.push(o),
        }
    }
    out
}

fn overlaps(o: &Outcome, from: Duration, to: Duration) -> bool {
    o.start <= to && o.end >= from
}

/// Requests the client got an answer for whose access-log line is missing, and answers whose
/// line names another status: `(lost ids, mismatches, lines read)`.
pub fn access_log(dir: &Path, outcomes: &[Outcome]) -> (Vec<String>, Vec<String>, usize) {
    let text = std::fs::read_to_string(dir.join("access.log")).unwrap_or_default();
    let mut logged: HashMap<String, u64> = HashMap::new();
    for line in text.lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if let (Some(id), Some(status)) = (v["request_id"].as_str(), v["status"].as_u64()) {
            logged.insert(id.to_string(), status);
        }
    }
    let mut lost = Vec::new();
    let mut mismatched = Vec::new();
    for o in outcomes.iter().filter(|o| o.status != 0) {
        let id = request_id(o.id);
        match logged.get(&id) {
            None => lost.push(id),
            Some(&s) if o.problem.is_none() && s != u64::from(o.status) => {
                mismatched.push(format!("{id}: answered {}, logged {s}", o.status))
            }
            Some(_) => {}
        }
    }
    (lost, mismatched, logged.len())
}

/// The warm-up RSS growth is measured after: 5 minutes, or a third of a shorter run.
pub fn warm(total: Duration) -> Duration {
    Duration::from_secs(300).min(total / 3)
}

/// RSS of the serving process after the first 5 minutes (a third of a shorter run), just
/// before the upgrade due then, against the last sample: with an upgrade every 5 minutes both
/// processes are about 5 minutes old. `(at 5 min kB, at the end kB, growth %)`.
pub fn rss_growth(rows: &[Row], total: Duration) -> Option<(u64, u64, f64)> {
    let warm = warm(total);
    let base = rows
        .iter()
        .rfind(|r| r.t + Duration::from_secs(5) <= warm)?
        .stats
        .rss_kb;
    let end = rows.last()?.stats.rss_kb;
    let growth = (end as f64 - base as f64) * 100.0 / base as f64;
    Some((base, end, growth))
}

/// What upgrades hide: the most any one process's RSS grew from its first minute of serving to
/// its last sample, among processes that served at least 3 minutes. `(kB, %)`.
pub fn rss_growth_per_process(rows: &[Row]) -> Option<(i64, f64)> {
    let mut worst: Option<(i64, f64)> = None;
    let mut i = 0;
    while i < rows.len() {
        let pid = rows[i].pid;
        let life: Vec<&Row> = rows[i..].iter().take_while(|r| r.pid == pid).collect();
        i += life.len();
        let (first, last) = (life[0], life[life.len() - 1]);
        if last.t < first.t + Duration::from_secs(180) {
            continue;
        }
        let Some(settled) = life
            .iter()
            .find(|r| r.t >= first.t + Duration::from_secs(60))
        else {
            continue;
        };
        let kb = last.stats.rss_kb as i64 - settled.stats.rss_kb as i64;
        let pct = kb as f64 * 100.0 / settled.stats.rss_kb as f64;
        if worst.is_none_or(|(_, w)| pct > w) {
            worst = Some((kb, pct));
        }
    }
    worst
}
