//! `portcullis prices`: `import` makes a price table from LiteLLM's, so an operator starts
//! with real prices in one command; `check` validates the configured table before a reload.

use std::path::{Path, PathBuf};

use clap::Subcommand;

use crate::config::Config;
use crate::pricing::{litellm, Prices};
use crate::time::{date, parse_date, unix_now};

#[derive(Subcommand)]
pub enum PricesCommand {
    /// Print a price table converted from LiteLLM's model_prices_and_context_window.json:
    /// its models with input and output prices per token (and cache reads), per million
    /// tokens, sorted by model.
    Import {
        /// LiteLLM's model_prices_and_context_window.json.
        #[arg(long, value_name = "FILE")]
        litellm: PathBuf,
        /// The UTC day the prices apply from, YYYY-MM-DD (default: today).
        #[arg(long, value_name = "YYYY-MM-DD")]
        from: Option<String>,
    },
    /// Check the price table the config names, and print how many entries it holds and how
    /// many (service, model) pairs have a price today.
    Check {
        #[arg(long)]
        config: PathBuf,
    },
}

pub(crate) fn run(command: PricesCommand) -> Result<(), String> {
    match command {
        PricesCommand::Import { litellm, from } => import(&litellm, from.as_deref()),
        PricesCommand::Check { config } => check(&config),
    }
}

fn import(file: &Path, from: Option<&str>) -> Result<(), String> {
    let from = match from {
        Some(day) if parse_date(day).is_some() => day.to_string(),
        Some(day) => return Err(format!("--from: {day:?} is not a date, YYYY-MM-DD")),
        None => date(unix_now()),
    };
    let text = std::fs::read_to_string(file)
        .map_err(|e| format!("{}: cannot read: {e}", file.display()))?;
    let source = file.file_name().map_or_else(
        || file.display().to_string(),
        |name| name.to_string_lossy().into_owned(),
    );
    let imported = litellm::import(&text, &source, &from)?;
    print!("{}", imported.table);
    // On stderr, so the table can be redirected to a file as it is.
    for refused in &imported.refused {
        eprintln!("left out {refused}");
    }
    eprintln!(
        "{} models priced, dated {from}; {} without prices per token and {} unreadable left out",
        imported.entries,
        imported.skipped,
        imported.refused.len()
    );
    Ok(())
}

fn check(config: &Path) -> Result<(), String> {
    let settings = Config::pricing_from_file(config).map_err(|e| {
        if e.problems.len() > 1 {
            eprintln!("{e}");
        }
        e.summary()
    })?;
    // Checked above; read again for its counts.
    let prices = Prices::from_file(&settings.file).map_err(|p| p.join("; "))?;
    let now = unix_now();
    println!(
        "{}: {} entries; {} (service, model) pairs priced today ({} UTC), in {}",
        settings.file.display(),
        prices.len(),
        prices.applying_pairs(now),
        date(now),
        settings.currency
    );
    Ok(())
}
