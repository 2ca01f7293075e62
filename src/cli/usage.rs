//! `fairway usage`: the usage ledger's reports (`crate::ledger`; docs/usage.md): one
//! tenant's usage per hour or day, or every tenant's of a month for a billing system.

use anyhow::{bail, Context};
use fairway::config::Config;
use fairway::core::ledger::{self as rules, Granularity, ReportLine};
use fairway::ledger::{self, ReportQuery};
use fairway::store::Store;
use std::io::Write;
use std::process::ExitCode;

#[derive(clap::Args, Debug)]
pub struct UsageArgs {
    /// The tenant to report (omit with --month to export every tenant).
    #[arg(long)]
    pub tenant: Option<String>,
    /// Start of the period: a date (2026-11-01, UTC), RFC 3339, or epoch milliseconds.
    #[arg(long)]
    pub from: Option<String>,
    /// End of the period (exclusive), same forms as --from.
    #[arg(long)]
    pub to: Option<String>,
    /// A whole calendar month (YYYY-MM, UTC) instead of --from/--to.
    #[arg(long)]
    pub month: Option<String>,
    /// hour or day periods.
    #[arg(long, default_value = "day")]
    pub granularity: String,
    /// CSV lines (with a header) instead of NDJSON.
    #[arg(long)]
    pub csv: bool,
}

pub async fn run(cfg: &Config, a: UsageArgs) -> anyhow::Result<ExitCode> {
    let g = Granularity::parse(&a.granularity).map_err(anyhow::Error::msg)?;
    let period = match (&a.month, &a.from, &a.to) {
        (Some(m), None, None) => rules::month(m).map_err(anyhow::Error::msg)?,
        (None, Some(f), Some(t)) => rules::report_period(
            rules::parse_instant(f).map_err(anyhow::Error::msg).context("--from")?,
            rules::parse_instant(t).map_err(anyhow::Error::msg).context("--to")?,
        )?,
        _ => bail!("give the period as --month YYYY-MM, or as --from and --to"),
    };
    let store = Store::open(cfg).await?;
    let stmts = store.ledger_statements().await?;
    let mut out = std::io::stdout().lock();
    if a.csv {
        out.write_all(rules::CSV_HEADER.as_bytes())?;
    }
    match a.tenant {
        Some(tenant) => {
            // The operator's own command: no row budget (its process is its own).
            let all = &mut rules::RowBudget::new(u64::MAX);
            let lines = ledger::report(&stmts, &ReportQuery { tenant, period, granularity: g }, all).await?;
            print(&mut out, &lines, a.csv)?;
        }
        None if a.month.is_some() => {
            for day in rules::days(&period) {
                let mut chunks = std::pin::pin!(ledger::export_day(stmts.clone(), day, g, u64::MAX));
                while let Some(lines) = futures::StreamExt::next(&mut chunks).await {
                    print(&mut out, &lines?, a.csv)?;
                }
            }
        }
        None => bail!("name a --tenant, or export every tenant's usage of a --month"),
    }
    Ok(ExitCode::SUCCESS)
}

fn print(out: &mut impl Write, lines: &[ReportLine], csv: bool) -> anyhow::Result<()> {
    for l in lines {
        if csv {
            out.write_all(rules::csv_line(l).as_bytes())?;
        } else {
            writeln!(out, "{}", serde_json::to_string(l)?)?;
        }
    }
    Ok(())
}
