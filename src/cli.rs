//! The command line (docs/reference.md): `serve`, `keys create|list|revoke|budget`,
//! `owners budget`, `usage` and `prices import|check`.

mod budgets;
mod prices;
mod printable;
mod usage;

use std::collections::HashMap;
use std::path::PathBuf;

use clap::{Parser, Subcommand};

use crate::auth::api_keys;
use crate::config::Config;
use crate::observe::access_log::{KeyEventFields, Record};
use crate::server::{self, ServeOptions};
use crate::store::{open_store, Budget, KeyRecord};
use crate::time::{parse_lifetime, rfc3339, unix_now};
use printable::printable;

#[derive(Parser)]
#[command(
    name = "portcullis",
    version,
    about = "Authenticated HTTP gateway for LLM APIs"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
    /// Run the gateway in the foreground.
    Serve {
        #[arg(long)]
        config: PathBuf,
        /// Run in the background, writing server.pid_file.
        #[arg(short, long)]
        daemon: bool,
        /// Take over the listening sockets of a running instance (graceful upgrade).
        #[arg(short, long)]
        upgrade: bool,
        /// Validate the config and exit: 0 if it is good, 1 with every problem otherwise.
        #[arg(short, long)]
        test: bool,
    },
    /// Manage API keys in the configured key store.
    Keys {
        #[command(subcommand)]
        command: KeysCommand,
    },
    /// Manage owners (JWT `sub`s) in the configured key store: their budgets and teams.
    Owners {
        #[command(subcommand)]
        command: budgets::OwnersCommand,
    },
    /// Manage teams in the configured key store: their budgets.
    Teams {
        #[command(subcommand)]
        command: budgets::TeamsCommand,
    },
    /// Print the usage ledger's totals from the key store, one row per line.
    Usage {
        #[arg(long)]
        config: PathBuf,
        /// First UTC day, YYYY-MM-DD (default: 29 days before --to).
        #[arg(long)]
        from: Option<String>,
        /// Last UTC day, YYYY-MM-DD, included (default: today).
        #[arg(long)]
        to: Option<String>,
        /// Parts to split totals by: any of day,key,service,model,team (default: the first
        /// four; rows are always split by owner).
        #[arg(long)]
        group_by: Option<String>,
        /// Only the usage of this team's owners.
        #[arg(long)]
        team: Option<String>,
        /// Print at most this many rows (in order), and say on stderr how many were left
        /// out; default: every row.
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
        limit: Option<u64>,
    },
    /// Price tables: convert LiteLLM's, check the configured one.
    Prices {
        #[command(subcommand)]
        command: prices::PricesCommand,
    },
}

#[derive(Subcommand)]
pub enum KeysCommand {
    /// Create a key; its full value is printed once, as the last line of stdout.
    Create {
        #[arg(long)]
        config: PathBuf,
        #[arg(long)]
        name: String,
        /// Comma-separated scopes, e.g. `infer,embed`.
        #[arg(long, value_delimiter = ',', required = true)]
        scopes: Vec<String>,
        /// Lifetime: a whole number with a unit, `30s`, `15m`, `12h` or `90d`.
        /// Checked by us, not clap, so a bad value gets the same one-line reason as any error.
        #[arg(long)]
        expires_in: Option<String>,
        /// Who the key is for: the console user's `sub`, so it shows in their key list.
        #[arg(long)]
        owner: Option<String>,
        #[command(flatten)]
        budget: budgets::BudgetFlags,
    },
    /// List keys: id, name, scopes, owner, created, expires, revoked, budget and what is left
    /// of it. Never a secret.
    List {
        #[arg(long)]
        config: PathBuf,
    },
    /// Revoke a key by the key id `keys list` shows.
    Revoke {
        #[arg(long)]
        config: PathBuf,
        key_id: String,
    },
    /// Set or clear a key's budget (the limits given are set, the others kept). Prints the
    /// budget, what is used and when each window resets.
    Budget {
        #[arg(long)]
        config: PathBuf,
        key_id: String,
        #[command(flatten)]
        flags: budgets::BudgetFlags,
        /// Remove the whole budget.
        #[arg(long)]
        clear: bool,
    },
}

/// Runs a command. The error is the one-line reason for the last line of stderr; `serve`
/// prints every config problem above it first.
pub fn run(cli: Cli) -> Result<(), String> {
    match cli.command {
        Command::Serve {
            config,
            daemon,
            upgrade,
            test,
        } => {
            let config = Config::from_file(&config).map_err(|e| {
                if e.problems.len() > 1 {
                    eprintln!("{e}");
                }
                e.summary()
            })?;
            if test {
                println!("{}: configuration ok", config.path.display());
                return Ok(());
            }
            server::serve(config, ServeOptions { daemon, upgrade })
        }
        Command::Keys { command } => keys(command),
        Command::Owners { command } => budgets::owners(command),
        Command::Teams { command } => budgets::teams(command),
        Command::Usage {
            config,
            from,
            to,
            group_by,
            team,
            limit,
        } => usage::run(
            &config,
            (from.as_deref(), to.as_deref()),
            (group_by.as_deref(), team.as_deref()),
            limit,
        ),
        Command::Prices { command } => prices::run(command),
    }
}

fn keys(command: KeysCommand) -> Result<(), String> {
    let config_path = match &command {
        KeysCommand::Create { config, .. }
        | KeysCommand::List { config }
        | KeysCommand::Revoke { config, .. }
        | KeysCommand::Budget { config, .. } => config.clone(),
    };
    let settings = Config::key_store_from_file(&config_path).map_err(|e| e.summary())?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    runtime.block_on(async move {
        let store = open_store(&settings.database, false)
            .await
            .map_err(|e| format!("cannot open the key store: {e}"))?;
        match command {
            KeysCommand::Create {
                name,
                scopes,
                expires_in,
                owner,
                budget,
                ..
            } => {
                let scopes = validate_scopes(scopes)?;
                if name.trim().is_empty() || name.chars().any(char::is_control) {
                    return Err("--name must be non-empty printable text".to_string());
                }
                if owner
                    .as_ref()
                    .is_some_and(|o| o.is_empty() || o.chars().any(char::is_control))
                {
                    return Err("--owner must be non-empty printable text".to_string());
                }
                let expires_in = expires_in
                    .map(|s| parse_lifetime(&s, unix_now()))
                    .transpose()
                    .map_err(|e| format!("--expires-in: {e}"))?;
                let budget = budget.apply(Budget::default())?;
                let spec = api_keys::KeySpec {
                    name,
                    scopes,
                    expires_in,
                    owner,
                    budget,
                };
                let key = api_keys::create_owned_key(&*store, spec, None)
                    .await
                    .map_err(|e| format!("cannot create the key: {e}"))?
                    .ok_or("cannot create the key: refused by the store")?;
                println!("key id:  {}", key.record.key_id);
                println!("name:    {}", printable(&key.record.name));
                let owner = key.record.owner.as_deref().unwrap_or("-");
                println!("owner:   {}", printable(owner));
                println!("scopes:  {}", printable(&key.record.scopes.join(",")));
                println!("expires: {}", time_or(key.record.expires_at, "never"));
                println!("budget:  {}", budgets::one_word(&budget));
                record_event(
                    &config_path,
                    KeyEventFields {
                        budget: (!budget.is_empty()).then_some(Some(budget)),
                        ..KeyEventFields::key("created", &key.record.key_id)
                    },
                );
                println!("The key below is shown once; store it now.");
                println!("{}", key.token);
                Ok(())
            }
            KeysCommand::List { .. } => {
                let keys = store
                    .list()
                    .await
                    .map_err(|e| format!("cannot list keys: {e}"))?;
                let budgets = budgets::list_columns(&*store, &keys).await?;
                print_keys(&keys, &budgets);
                Ok(())
            }
            KeysCommand::Revoke { key_id, .. } => {
                if crate::auth::token::KeyId::parse(&key_id).is_none() {
                    return Err(format!(
                        "`{key_id}` is not a key id (16 hex characters, as `keys list` shows)"
                    ));
                }
                match store.revoke(&key_id, unix_now()).await {
                    Ok(true) => {
                        record_event(&config_path, KeyEventFields::key("revoked", &key_id));
                        println!("revoked {key_id}");
                        Ok(())
                    }
                    Ok(false) => Err(format!("no key with id {key_id}")),
                    Err(e) => Err(format!("cannot revoke: {e}")),
                }
            }
            KeysCommand::Budget {
                key_id,
                flags,
                clear,
                ..
            } => budgets::set_key(&*store, &config_path, &key_id, &flags, clear).await,
        }
    })
}

/// Appends a create, revoke or budget change to the access-log file the config names, like
/// the key API's lines (`service: "_cli"`, the key id or owner, never a secret), so every key
/// event is on record. One `write` of one line to a file opened for appending, so it never
/// splits a gateway's line.
fn record_event(config: &std::path::Path, event: KeyEventFields<'_>) {
    use std::io::Write;
    let Some(path) = Config::access_log_file_from(config) else {
        return;
    };
    let user = std::env::var("USER").ok();
    // Every line has an id, so tools that index the log by it take these too.
    let request_id = crate::proxy::RequestId::from_client_or_new(None);
    let line = Record {
        time: crate::observe::access_log::Time(std::time::SystemTime::now()),
        request_id: request_id.as_str(),
        service: "_cli",
        principal_kind: Some("cli"),
        principal_id: user.as_deref(),
        http: None,
        proxied: None,
        key_event: Some(event),
    }
    .to_line();
    let written = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(&path)
        .and_then(|mut f| f.write_all(&line));
    if let Err(e) = written {
        log::warn!("cannot record the key event in {}: {e}", path.display());
    }
}

fn validate_scopes(scopes: Vec<String>) -> Result<Vec<String>, String> {
    for s in &scopes {
        if let Err(e) = s.parse::<crate::scope::Scope>() {
            return Err(format!("--scopes: {s:?} {e}"));
        }
    }
    Ok(scopes)
}

/// One key a line; BUDGET and LEFT (each one word, `-` for none: see `budgets::one_word`)
/// come last, so the columns before them keep their places.
fn print_keys(keys: &[KeyRecord], budgets: &HashMap<String, (String, String)>) {
    let none = ("-".to_string(), "-".to_string());
    let width = keys
        .iter()
        .filter_map(|k| budgets.get(&k.key_id))
        .map(|(b, _)| b.len())
        .max()
        .unwrap_or(0)
        .max(6);
    let line = |cells: [&str; 9]| {
        let [id, name, scopes, owner, created, expires, revoked, budget, left] = cells;
        let row = format!(
            "{id:<16}  {name:<20}  {scopes:<24}  {owner:<20}  {created:<20}  {expires:<20}  \
             {revoked:<20}  {budget:<width$}  {left}"
        );
        println!("{}", row.trim_end());
    };
    line([
        "KEY ID", "NAME", "SCOPES", "OWNER", "CREATED", "EXPIRES", "REVOKED", "BUDGET", "LEFT",
    ]);
    for k in keys {
        let (budget, left) = budgets.get(&k.key_id).unwrap_or(&none);
        line([
            &k.key_id,
            &printable(&k.name),
            &printable(&k.scopes.join(",")),
            &printable(k.owner.as_deref().unwrap_or("-")),
            &time_or(Some(k.created_at), "-"),
            &time_or(k.expires_at, "never"),
            &time_or(k.revoked_at, "-"),
            budget,
            left,
        ]);
    }
}

fn time_or(t: Option<i64>, none: &str) -> String {
    t.map(rfc3339).unwrap_or_else(|| none.to_string())
}
