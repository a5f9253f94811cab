//! Budgets on the command line: the limit flags of `keys create`, `keys budget`, `owners
//! budget` and `teams budget`, `owners team`, the table of a budget's windows those print, and
//! the BUDGET and LEFT columns of `keys list`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use clap::{Args, Subcommand};

use super::record_event;
use crate::auth::token::KeyId;
use crate::config::Config;
use crate::observe::access_log::KeyEventFields;
use crate::pricing::money;
use crate::store::{
    amount_text, open_store, Budget, KeyRecord, LedgerStore, Store, Subject, Unit, WindowStarts,
    WindowUsage,
};
use crate::time::{rfc3339, unix_now};

/// The six limits, each a whole number or an amount of the price table's currency (or `none`
/// to remove that limit).
#[derive(Args, Debug, Default)]
pub struct BudgetFlags {
    /// Tokens (prompt + completion) per UTC hour; `none` removes the limit.
    #[arg(long, value_name = "N")]
    tokens_per_hour: Option<String>,
    /// Tokens per UTC day; `none` removes the limit.
    #[arg(long, value_name = "N")]
    tokens_per_day: Option<String>,
    /// Tokens per calendar month (UTC); `none` removes the limit.
    #[arg(long, value_name = "N")]
    tokens_per_month: Option<String>,
    /// Requests per UTC day; `none` removes the limit.
    #[arg(long, value_name = "N")]
    requests_per_day: Option<String>,
    /// Cost per UTC day, in the price table's currency (at most 6 decimals); `none` removes
    /// the limit.
    #[arg(long, value_name = "AMOUNT")]
    cost_per_day: Option<String>,
    /// Cost per calendar month (UTC), in the price table's currency; `none` removes the limit.
    #[arg(long, value_name = "AMOUNT")]
    cost_per_month: Option<String>,
}

impl BudgetFlags {
    /// The flags as given, in `Budget::NAMES` order: not given, or the limit (`None`: `none`).
    /// Checked by us, not clap, so a bad value gets the one-line reason of any other error.
    fn given(&self) -> Result<[Option<Option<u64>>; Budget::N], String> {
        let values = [
            &self.tokens_per_hour,
            &self.tokens_per_day,
            &self.tokens_per_month,
            &self.requests_per_day,
            &self.cost_per_day,
            &self.cost_per_month,
        ];
        let mut out = [None; Budget::N];
        let named = Budget::NAMES.iter().zip(Budget::UNITS);
        for ((slot, value), (name, unit)) in out.iter_mut().zip(values).zip(named) {
            *slot = value.as_deref().map(|v| limit(name, unit, v)).transpose()?;
        }
        Ok(out)
    }

    /// `base` with the windows these flags name set (or removed), the others kept.
    pub fn apply(&self, base: Budget) -> Result<Budget, String> {
        let mut limits = base.limits();
        for (limit, given) in limits.iter_mut().zip(self.given()?) {
            if let Some(given) = given {
                *limit = given;
            }
        }
        Ok(Budget::from_limits(limits))
    }
}

/// A limit flag's value: a whole number from 0 to `i64::MAX` (what the store holds), an amount
/// of the currency for a cost, or `none`.
fn limit(name: &str, unit: Unit, value: &str) -> Result<Option<u64>, String> {
    let flag = format!("--{}", name.replace('_', "-"));
    if value == "none" {
        return Ok(None);
    }
    if unit == Unit::Cost {
        return match money::parse_units_text(value) {
            Ok(micros) => Ok(Some(micros)),
            Err(why) => Err(format!("{flag}: {value:?} {why} (or none)")),
        };
    }
    let digits = !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit());
    match value.parse::<u64>() {
        Ok(n) if digits && n <= i64::MAX as u64 => Ok(Some(n)),
        _ => Err(format!(
            "{flag}: {value:?} is not a whole number from 0 to {} (or none)",
            i64::MAX
        )),
    }
}

#[derive(Subcommand)]
pub enum OwnersCommand {
    /// Set or clear the budget of an owner (a JWT `sub`): all its keys and its own JWT calls
    /// together. Prints the budget, what is used and when each window resets.
    Budget {
        #[arg(long)]
        config: PathBuf,
        /// The owner, as its tokens' `sub` (and `keys list`'s OWNER) show it.
        owner: String,
        #[command(flatten)]
        flags: BudgetFlags,
        /// Remove the whole budget.
        #[arg(long)]
        clear: bool,
    },
    /// Put an owner in a team (an owner is in at most one): the team's budget then covers its
    /// keys and JWT calls too. `--clear` takes it out of its team.
    Team {
        #[arg(long)]
        config: PathBuf,
        owner: String,
        /// The team; omitted with --clear.
        team: Option<String>,
        #[arg(long)]
        clear: bool,
    },
}

#[derive(Subcommand)]
pub enum TeamsCommand {
    /// Set or clear the budget of a team: all its owners' keys and JWT calls together. Prints
    /// the budget, what is used and when each window resets.
    Budget {
        #[arg(long)]
        config: PathBuf,
        team: String,
        #[command(flatten)]
        flags: BudgetFlags,
        /// Remove the whole budget.
        #[arg(long)]
        clear: bool,
    },
}

/// The budget a `budget` command asks for, given the one set now.
fn wanted(flags: &BudgetFlags, clear: bool, now: Budget) -> Result<Budget, String> {
    let given = flags.given()?;
    match (clear, given.iter().any(Option::is_some)) {
        (true, true) => Err("--clear removes the whole budget: give it without limits".into()),
        (true, false) => Ok(Budget::default()),
        (false, true) => flags.apply(now),
        (false, false) => Err(
            "give the limits to set (--tokens-per-hour, --tokens-per-day, \
             --tokens-per-month, --requests-per-day N, --cost-per-day, --cost-per-month \
             AMOUNT) or --clear"
                .into(),
        ),
    }
}

/// `keys budget`: sets or clears a key's budget, records it, prints the result.
pub(crate) async fn set_key(
    store: &dyn Store,
    config: &Path,
    key_id: &str,
    flags: &BudgetFlags,
    clear: bool,
) -> Result<(), String> {
    if KeyId::parse(key_id).is_none() {
        return Err(format!(
            "`{key_id}` is not a key id (16 hex characters, as `keys list` shows)"
        ));
    }
    wanted(flags, clear, Budget::default())?;
    let record = store
        .find(key_id)
        .await
        .map_err(|e| format!("cannot read the key: {e}"))?
        .ok_or_else(|| format!("no key with id {key_id}"))?
        .record;
    if record.revoked_at.is_some() {
        return Err(format!(
            "key {key_id} is revoked: its budget no longer changes"
        ));
    }
    let budget = wanted(flags, clear, record.budget)?;
    let set = store.set_key_budget(key_id, &budget).await;
    match set {
        Ok(true) => {}
        Ok(false) => return Err(format!("no key with id {key_id}")),
        Err(e) => return Err(format!("cannot set the budget: {e}")),
    }
    record_event(
        config,
        KeyEventFields {
            budget: Some((!budget.is_empty()).then_some(budget)),
            ..KeyEventFields::key("budget", key_id)
        },
    );
    let starts = WindowStarts::at(unix_now());
    let used = store
        .window_usage(&Subject::Key(key_id.to_string()), starts)
        .await
        .map_err(|e| format!("the budget is set, but its usage cannot be read: {e}"))?;
    println!("key id:  {key_id}");
    let owner = record.owner.as_deref().unwrap_or("-");
    println!("owner:   {}", super::printable(owner));
    print!("{}", windows(&budget, &used, starts));
    Ok(())
}

/// `owners budget` and `owners team`.
pub(crate) fn owners(command: OwnersCommand) -> Result<(), String> {
    match command {
        OwnersCommand::Budget {
            config,
            owner,
            flags,
            clear,
        } => {
            printable_name("owner", &owner)?;
            set_subject(&config, Subject::Owner(owner), &flags, clear)
        }
        OwnersCommand::Team {
            config,
            owner,
            team,
            clear,
        } => {
            printable_name("owner", &owner)?;
            let team = match (team, clear) {
                (Some(team), false) => Some(team),
                (None, true) => None,
                _ => return Err("give the team to put the owner in, or --clear".into()),
            };
            if let Some(team) = &team {
                printable_name("team", team)?;
            }
            set_team(&config, &owner, team.as_deref())
        }
    }
}

/// `teams budget`.
pub(crate) fn teams(command: TeamsCommand) -> Result<(), String> {
    let TeamsCommand::Budget {
        config,
        team,
        flags,
        clear,
    } = command;
    printable_name("team", &team)?;
    set_subject(&config, Subject::Team(team), &flags, clear)
}

/// An owner or a team named on the command line: non-empty printable text.
fn printable_name(what: &str, name: &str) -> Result<(), String> {
    if name.is_empty() || name.chars().any(char::is_control) {
        return Err(format!("the {what} must be non-empty printable text"));
    }
    Ok(())
}

/// A runtime for one command's store calls.
fn runtime() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())
}

/// Sets or clears an owner's or a team's budget, records it, prints the result.
fn set_subject(
    config: &Path,
    subject: Subject,
    flags: &BudgetFlags,
    clear: bool,
) -> Result<(), String> {
    // Checked before the store is opened: a typo costs no connection.
    wanted(flags, clear, Budget::default())?;
    let settings = Config::key_store_from_file(config).map_err(|e| e.summary())?;
    runtime()?.block_on(async {
        let store = open_store(&settings.database, false)
            .await
            .map_err(|e| format!("cannot open the key store: {e}"))?;
        let (now, whose) = match &subject {
            Subject::Team(team) => (store.team_budget(team).await, "team"),
            Subject::Owner(owner) => (store.owner_budget(owner).await, "owner"),
            Subject::Key(_) => unreachable!("keys are set by set_key"),
        };
        let now = now.map_err(|e| format!("cannot read the {whose}'s budget: {e}"))?;
        let budget = wanted(flags, clear, now.unwrap_or_default())?;
        let (set, owner, team) = match &subject {
            Subject::Team(team) => (store.set_team_budget(team, &budget).await, None, Some(team)),
            Subject::Owner(owner) => (
                store.set_owner_budget(owner, &budget).await,
                Some(owner),
                None,
            ),
            Subject::Key(_) => unreachable!("keys are set by set_key"),
        };
        set.map_err(|e| format!("cannot set the budget: {e}"))?;
        record_event(
            config,
            KeyEventFields {
                key_event: "budget",
                key_id: None,
                budget_owner: owner.map(String::as_str),
                team: team.map(|t| Some(t.as_str())),
                member: None,
                budget: Some((!budget.is_empty()).then_some(budget)),
            },
        );
        let starts = WindowStarts::at(unix_now());
        let used = store
            .window_usage(&subject, starts)
            .await
            .map_err(|e| format!("the budget is set, but its usage cannot be read: {e}"))?;
        let name = owner.or(team).map_or("", String::as_str);
        println!(
            "{whose}:{:pad$}{}",
            "",
            super::printable(name),
            pad = 8 - whose.len()
        );
        print!("{}", windows(&budget, &used, starts));
        Ok(())
    })
}

/// `owners team`: puts an owner in a team (`None`: in none), records it, prints it.
fn set_team(config: &Path, owner: &str, team: Option<&str>) -> Result<(), String> {
    let settings = Config::key_store_from_file(config).map_err(|e| e.summary())?;
    runtime()?.block_on(async {
        let store = open_store(&settings.database, false)
            .await
            .map_err(|e| format!("cannot open the key store: {e}"))?;
        store
            .set_owner_team(owner, team)
            .await
            .map_err(|e| format!("cannot set the owner's team: {e}"))?;
        record_event(
            config,
            KeyEventFields {
                key_event: "team",
                key_id: None,
                budget_owner: None,
                team: Some(team),
                member: Some(owner),
                budget: None,
            },
        );
        println!("owner:   {}", super::printable(owner));
        println!("team:    {}", team.map_or("-".into(), super::printable));
        Ok(())
    })
}

/// One line per window, columns aligned: its name, limit, use, what is left of the limit and
/// when it resets (`-`: no limit in that window).
fn windows(budget: &Budget, used: &WindowUsage, starts: WindowStarts) -> String {
    let mut lines = vec![["WINDOW", "LIMIT", "USED", "LEFT", "RESETS"].map(String::from)];
    let rows = (Budget::NAMES.iter().zip(Budget::UNITS))
        .zip(budget.limits())
        .zip(used.in_order())
        .zip(starts.resets());
    for ((((name, unit), limit), used), resets) in rows {
        let shown = |n: u64| amount_text(unit, n);
        let or_dash = |n: Option<u64>| n.map_or("-".to_string(), shown);
        lines.push([
            name.to_string(),
            or_dash(limit),
            shown(used),
            or_dash(limit.map(|l| l.saturating_sub(used))),
            rfc3339(resets),
        ]);
    }
    super::usage::aligned(&lines)
}

/// A budget as one word: `tokens_per_day=100000,requests_per_day=500`, `-` for none.
pub(crate) fn one_word(budget: &Budget) -> String {
    let set: Vec<String> = (Budget::NAMES.iter().zip(Budget::UNITS))
        .zip(budget.limits())
        .filter_map(|((name, unit), limit)| {
            limit.map(|l| format!("{name}={}", amount_text(unit, l)))
        })
        .collect();
    if set.is_empty() {
        "-".into()
    } else {
        set.join(",")
    }
}

/// What is left of each limit of `budget` in the current windows, as `one_word` writes it.
fn left(budget: &Budget, used: &WindowUsage) -> String {
    let limits = budget.limits();
    let left = std::array::from_fn(|i| limits[i].map(|l| l.saturating_sub(used.in_order()[i])));
    one_word(&Budget::from_limits(left))
}

/// `keys list`'s BUDGET and LEFT of every key, the ledger read in a few statements for all the
/// keys that have a budget.
pub(crate) async fn list_columns(
    store: &dyn LedgerStore,
    keys: &[KeyRecord],
) -> Result<HashMap<String, (String, String)>, String> {
    let budgeted: Vec<String> = keys
        .iter()
        .filter(|k| !k.budget.is_empty())
        .map(|k| k.key_id.clone())
        .collect();
    let used = store
        .keys_window_usage(&budgeted, WindowStarts::at(unix_now()))
        .await
        .map_err(|e| format!("cannot read the keys' usage: {e}"))?;
    Ok(keys
        .iter()
        .map(|k| {
            let used = used.get(&k.key_id).copied().unwrap_or_default();
            let left = if k.budget.is_empty() {
                "-".into()
            } else {
                left(&k.budget, &used)
            };
            (k.key_id.clone(), (one_word(&k.budget), left))
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags(values: [Option<&str>; 4]) -> BudgetFlags {
        let [h, d, m, r] = values.map(|v| v.map(String::from));
        BudgetFlags {
            tokens_per_hour: h,
            tokens_per_day: d,
            tokens_per_month: m,
            requests_per_day: r,
            ..BudgetFlags::default()
        }
    }

    #[test]
    fn flags_set_their_windows_and_keep_the_others() {
        let base = Budget::from_limits([Some(1), Some(2), Some(3), Some(4), None, None]);
        let f = flags([None, Some("100"), Some("none"), None]);
        assert_eq!(
            f.apply(base).unwrap(),
            Budget::from_limits([Some(1), Some(100), None, Some(4), None, None])
        );
        let max = i64::MAX.to_string();
        let f = flags([Some("0"), None, None, Some(&max)]);
        assert_eq!(
            f.apply(Budget::default()).unwrap().limits(),
            [Some(0), None, None, Some(i64::MAX as u64), None, None]
        );
        let over = (i64::MAX as u64 + 1).to_string();
        for bad in [
            "-1",
            "+5",
            "1.5",
            "",
            " 5",
            "1e3",
            "ten",
            over.as_str(),
            "None",
        ] {
            let err = flags([None, None, Some(bad), None])
                .apply(base)
                .unwrap_err();
            assert!(
                err.starts_with("--tokens-per-month: ") && err.contains("is not a whole number"),
                "{bad:?}: {err}"
            );
        }
    }

    #[test]
    fn a_budget_command_needs_limits_or_clear_but_not_both() {
        let base = Budget::from_limits([Some(1), None, None, None, None, None]);
        let some = flags([None, Some("5"), None, None]);
        assert_eq!(
            wanted(&some, false, base).unwrap(),
            Budget::from_limits([Some(1), Some(5), None, None, None, None])
        );
        assert!(wanted(&flags([None; 4]), true, base).unwrap().is_empty());
        assert!(wanted(&some, true, base).unwrap_err().contains("--clear"));
        assert!(wanted(&flags([None; 4]), false, base)
            .unwrap_err()
            .contains("or --clear"));
    }

    #[test]
    fn the_window_table_and_the_list_columns() {
        let budget = Budget::from_limits([Some(100), None, Some(1000), Some(5), None, None]);
        let used = WindowUsage {
            hour_tokens: 150,
            day_tokens: 300,
            month_tokens: 400,
            day_requests: 2,
            ..WindowUsage::default()
        };
        let starts = WindowStarts::at(crate::time::parse_date("2026-11-25").unwrap() + 3700);
        let table = windows(&budget, &used, starts);
        let lines: Vec<Vec<&str>> = table
            .lines()
            .map(|l| l.split_whitespace().collect())
            .collect();
        assert_eq!(lines[0], ["WINDOW", "LIMIT", "USED", "LEFT", "RESETS"]);
        assert_eq!(
            lines[1],
            ["tokens_per_hour", "100", "150", "0", "2026-11-25T02:00:00Z"]
        );
        assert_eq!(
            lines[2],
            ["tokens_per_day", "-", "300", "-", "2026-11-26T00:00:00Z"]
        );
        assert_eq!(
            lines[3],
            [
                "tokens_per_month",
                "1000",
                "400",
                "600",
                "2026-12-01T00:00:00Z"
            ]
        );
        assert_eq!(
            lines[4],
            ["requests_per_day", "5", "2", "3", "2026-11-26T00:00:00Z"]
        );
        assert_eq!(
            one_word(&budget),
            "tokens_per_hour=100,tokens_per_month=1000,requests_per_day=5"
        );
        assert_eq!(
            left(&budget, &used),
            "tokens_per_hour=0,tokens_per_month=600,requests_per_day=3"
        );
        assert_eq!(one_word(&Budget::default()), "-");
    }
}
