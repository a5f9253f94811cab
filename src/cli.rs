//! The command line of interface.md: `serve` and `keys create|list|revoke`.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand};

use crate::auth::api_keys::{self, KeyRecord, KeyStore, SqliteStore};
use crate::auth::unix_now;
use crate::config::Config;
use crate::server::{self, ServeOptions};
use crate::timefmt::rfc3339;

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
        #[arg(long, value_parser = parse_duration)]
        expires_in: Option<Duration>,
    },
    /// List keys: id, name, scopes, created, expires, revoked. Never a secret.
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
}

pub fn run(cli: Cli) -> Result<(), String> {
    match cli.command {
        Command::Serve {
            config,
            daemon,
            upgrade,
            test,
        } => {
            let config = Config::from_file(&config).map_err(|e| e.to_string())?;
            if test {
                println!("{}: configuration ok", config.path.display());
                return Ok(());
            }
            server::serve(config, ServeOptions { daemon, upgrade })
        }
        Command::Keys { command } => keys(command),
    }
}

fn keys(command: KeysCommand) -> Result<(), String> {
    let config_path = match &command {
        KeysCommand::Create { config, .. }
        | KeysCommand::List { config }
        | KeysCommand::Revoke { config, .. } => config.clone(),
    };
    let settings = Config::key_store_from_file(&config_path).map_err(|e| e.to_string())?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    runtime.block_on(async move {
        let store = SqliteStore::open(&settings.database)
            .await
            .map_err(|e| format!("cannot open the key store: {e}"))?;
        match command {
            KeysCommand::Create {
                name,
                scopes,
                expires_in,
                ..
            } => {
                let scopes = validate_scopes(scopes)?;
                if name.trim().is_empty() || name.chars().any(char::is_control) {
                    return Err("--name must be non-empty printable text".to_string());
                }
                let key = api_keys::create_key(&store, &name, scopes, expires_in)
                    .await
                    .map_err(|e| format!("cannot create the key: {e}"))?;
                println!("key id:  {}", key.record.key_id);
                println!("name:    {}", key.record.name);
                println!("scopes:  {}", key.record.scopes.join(","));
                println!("expires: {}", time_or(key.record.expires_at, "never"));
                println!("The key below is shown once; store it now.");
                println!("{}", key.token);
                Ok(())
            }
            KeysCommand::List { .. } => {
                let keys = store
                    .list()
                    .await
                    .map_err(|e| format!("cannot list keys: {e}"))?;
                print_keys(&keys);
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
                        println!("revoked {key_id}");
                        Ok(())
                    }
                    Ok(false) => Err(format!("no key with id {key_id}")),
                    Err(e) => Err(format!("cannot revoke: {e}")),
                }
            }
        }
    })
}

fn validate_scopes(scopes: Vec<String>) -> Result<Vec<String>, String> {
    let scopes: Vec<String> = scopes.into_iter().map(|s| s.trim().to_string()).collect();
    for s in &scopes {
        let ok = !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b':'));
        if !ok {
            return Err(format!(
                "--scopes: `{s}` is not a scope (letters, digits, `_-.:`)"
            ));
        }
    }
    Ok(scopes)
}

fn print_keys(keys: &[KeyRecord]) {
    println!(
        "{:<16}  {:<20}  {:<24}  {:<20}  {:<20}  {:<20}",
        "KEY ID", "NAME", "SCOPES", "CREATED", "EXPIRES", "REVOKED"
    );
    for k in keys {
        println!(
            "{:<16}  {:<20}  {:<24}  {:<20}  {:<20}  {:<20}",
            k.key_id,
            k.name,
            k.scopes.join(","),
            time_or(Some(k.created_at), "-"),
            time_or(k.expires_at, "never"),
            time_or(k.revoked_at, "-"),
        );
    }
}

fn time_or(t: Option<i64>, none: &str) -> String {
    t.map(rfc3339).unwrap_or_else(|| none.to_string())
}

/// `30s`, `15m`, `12h`, `90d`: a whole positive number and one unit.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let bad = || format!("`{s}` is not a duration like 30s, 15m, 12h or 90d");
    let (digits, unit) = s.split_at(s.len().checked_sub(1).ok_or_else(bad)?);
    let n: u64 = digits.parse().map_err(|_| bad())?;
    let unit_secs = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return Err(bad()),
    };
    if n == 0 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    n.checked_mul(unit_secs)
        .map(Duration::from_secs)
        .ok_or_else(bad)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("15m"), Ok(Duration::from_secs(900)));
        assert_eq!(parse_duration("12h"), Ok(Duration::from_secs(43_200)));
        assert_eq!(parse_duration("90d"), Ok(Duration::from_secs(7_776_000)));
        for bad in [
            "",
            "s",
            "10",
            "0s",
            "-5m",
            "+5m",
            "1.5h",
            "10w",
            "99999999999999999999d",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }
}
