//! Per-process budget counters: the whole count without `[rate_limits] redis`, the fallback
//! while Redis fails, and seeded from the ledger so a restart never resets spent budget.
//! One short lock per budgeted request; nothing is awaited while it is held.

use std::collections::HashMap;
use std::sync::Mutex;

use super::window::{Kind, Windows};
use super::{Ask, Refused, Who};
use crate::store::{Budget, WindowStarts, WindowUsage};

/// One subject's counters, each for the window it was last counted in.
#[derive(Debug, Clone, Copy, Default)]
struct Counts {
    start: [i64; Budget::N],
    used: [u64; Budget::N],
}

impl Counts {
    /// The counter of `kind` in the window starting at `start` (a new window starts at 0).
    fn at(&mut self, kind: Kind, start: i64) -> &mut u64 {
        let i = kind.index();
        if self.start[i] != start {
            self.start[i] = start;
            self.used[i] = 0;
        }
        &mut self.used[i]
    }
}

#[derive(Default)]
struct Table {
    keys: HashMap<Box<str>, Counts>,
    owners: HashMap<Box<str>, Counts>,
    teams: HashMap<Box<str>, Counts>,
}

impl Table {
    fn counts(&mut self, who: Who<'_>) -> &mut Counts {
        let (map, id) = match who {
            Who::Key(id) => (&mut self.keys, id),
            Who::Owner(id) => (&mut self.owners, id),
            Who::Team(id) => (&mut self.teams, id),
        };
        // A lookup without allocating; the id is copied once, when first counted.
        if !map.contains_key(id) {
            map.insert(id.into(), Counts::default());
        }
        map.get_mut(id).expect("inserted above")
    }
}

#[derive(Default)]
pub(crate) struct Local {
    table: Mutex<Table>,
}

/// What the counters held after a request was admitted: per subject, the counter values.
pub(crate) type Used = [[u64; Budget::N]; 3];

impl Local {
    /// Checks every limited counter of every subject and, when all fit, adds the request to
    /// all of them at once. `checked`: false to count without deciding (Redis decided).
    pub(crate) fn reserve(
        &self,
        subjects: &[(Who<'_>, Budget)],
        ask: Ask,
        windows: &Windows,
        checked: bool,
    ) -> Result<Used, Refused> {
        let mut table = self.table.lock().unwrap_or_else(|e| e.into_inner());
        if checked {
            for (n, (who, budget)) in subjects.iter().enumerate() {
                let counts = table.counts(*who);
                for kind in Kind::ALL {
                    let Some(limit) = kind.limit(budget) else {
                        continue;
                    };
                    let used = *counts.at(kind, kind.start(&windows.starts));
                    let amount = kind.amount(ask);
                    if used >= limit || used.saturating_add(amount) > limit {
                        return Err(Refused {
                            subject: n,
                            kind,
                            used,
                            limit,
                            asked: amount,
                        });
                    }
                }
            }
        }
        let mut after = [[0; Budget::N]; 3];
        for (n, (who, _)) in subjects.iter().enumerate() {
            let counts = table.counts(*who);
            for kind in Kind::ALL {
                let counter = counts.at(kind, kind.start(&windows.starts));
                *counter = counter.saturating_add(kind.amount(ask));
                after[n][kind.index()] = *counter;
            }
        }
        Ok(after)
    }

    /// Replaces a reservation made in the windows of `starts` by what was used: adds
    /// `deltas` (tokens, requests, cost; negative: a refund) to each subject's counters still
    /// in those windows.
    pub(crate) fn adjust<'w>(
        &self,
        subjects: impl Iterator<Item = Who<'w>>,
        starts: &WindowStarts,
        deltas: (i64, i64, i64),
    ) {
        let mut table = self.table.lock().unwrap_or_else(|e| e.into_inner());
        for who in subjects {
            let counts = table.counts(who);
            for kind in Kind::ALL {
                let i = kind.index();
                if counts.start[i] != kind.start(starts) {
                    continue;
                }
                counts.used[i] = counts.used[i].saturating_add_signed(kind.delta(deltas));
            }
        }
    }

    /// Raises a subject's counters to at least what the ledger holds for the windows of
    /// `starts` (never lowers them: this process may have counted more than was flushed).
    pub(crate) fn seed(&self, who: Who<'_>, starts: &WindowStarts, ledger: &WindowUsage) {
        let mut table = self.table.lock().unwrap_or_else(|e| e.into_inner());
        let counts = table.counts(who);
        for kind in Kind::ALL {
            let counter = counts.at(kind, kind.start(starts));
            *counter = (*counter).max(kind.used(ledger));
        }
    }

    /// A subject's counter of `kind` in the windows of `starts`, for seeding the shared one.
    pub(crate) fn value(&self, who: Who<'_>, kind: Kind, starts: &WindowStarts) -> u64 {
        let mut table = self.table.lock().unwrap_or_else(|e| e.into_inner());
        *table.counts(who).at(kind, kind.start(starts))
    }
}
