//! Statements of the fleet-wide dependency breakers (`core::dependency`): one row per
//! dependency in one store partition per deployment (`dependency_breakers`), written by
//! the ledger's leader when a breaker changes, read every second by workers and API
//! processes (a handful of rows: the dependencies the job types declare).

use super::{prepare_statement, q, Store, StoreError};
use crate::core::dependency::State;
use crate::model::Millis;
use scylla::client::session::Session;
use scylla::statement::prepared::PreparedStatement;
use std::sync::Arc;

/// One dependency's breaker as stored.
#[derive(Clone, Debug, PartialEq)]
pub struct DependencyRow {
    pub dependency: String,
    pub state: State,
    /// Dependency failures and attempts counted when it last opened or re-opened.
    pub failed: i64,
    pub attempts: i64,
    /// Tenants told of the opening (their alerts resolve when it closes).
    pub affected: Vec<String>,
    pub changed_at: Millis,
}

#[derive(Clone)]
pub struct DependencyStatements {
    session: Arc<Session>,
    scope: String,
    put: PreparedStatement,
    all: PreparedStatement,
}

impl Store {
    /// Prepares the dependency breakers' statements.
    pub async fn dependency_statements(&self) -> Result<DependencyStatements, StoreError> {
        let ks = &self.keyspace;
        let s = &self.session;
        let prep = |cql: String, what: &'static str| prepare_statement(s, cql, what, false);
        Ok(DependencyStatements {
            session: s.clone(),
            scope: self.scope.clone(),
            put: prep(
                format!(
                    "INSERT INTO {ks}.dependency_breakers (scope, dependency, state, opened_at, until, since, \
                     failed, attempts, affected, changed_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
                ),
                "prepare put dependency breaker",
            )
            .await?,
            all: prep(
                format!(
                    "SELECT dependency, state, opened_at, until, since, failed, attempts, affected, changed_at \
                     FROM {ks}.dependency_breakers WHERE scope = ?"
                ),
                "prepare read dependency breakers",
            )
            .await?,
        })
    }
}

impl DependencyStatements {
    pub async fn put(&self, r: &DependencyRow) -> Result<(), StoreError> {
        let (opened_at, until, since) = match r.state {
            State::Closed { since } => (None, None, since),
            State::Open { opened_at, until } => (Some(opened_at), Some(until), until),
            State::Trial { opened_at, since } => (Some(opened_at), None, since),
        };
        let v = (
            &self.scope,
            &r.dependency,
            r.state.as_str(),
            opened_at,
            until,
            since,
            r.failed,
            r.attempts,
            &r.affected,
            r.changed_at,
        );
        self.session.execute_unpaged(&self.put, v).await.map_err(q("write dependency breaker"))?;
        Ok(())
    }

    /// Every dependency's row (rows of an unknown state are skipped with a warning).
    pub async fn all(&self) -> Result<Vec<DependencyRow>, StoreError> {
        type Row = (
            String,
            String,
            Option<i64>,
            Option<i64>,
            Option<i64>,
            Option<i64>,
            Option<i64>,
            Option<Vec<String>>,
            Option<i64>,
        );
        let res =
            self.session.execute_unpaged(&self.all, (&self.scope,)).await.map_err(q("read dependency breakers"))?;
        let rows = res.into_rows_result().map_err(q("read dependency breakers"))?;
        let mut out = Vec::new();
        for r in rows.rows::<Row>().map_err(q("read dependency breakers"))? {
            let (dependency, state, opened_at, until, since, failed, attempts, affected, changed_at) =
                r.map_err(q("read dependency breakers"))?;
            let (opened_at, since) = (opened_at.unwrap_or(0), since.unwrap_or(0));
            let state = match (state.as_str(), until) {
                ("closed", _) => State::Closed { since },
                ("open", Some(until)) => State::Open { opened_at, until },
                ("trial", _) => State::Trial { opened_at, since },
                _ => {
                    tracing::warn!(dependency, state, "dependency breaker row of an unknown state; skipped");
                    continue;
                }
            };
            out.push(DependencyRow {
                dependency,
                state,
                failed: failed.unwrap_or(0),
                attempts: attempts.unwrap_or(0),
                affected: affected.unwrap_or_default(),
                changed_at: changed_at.unwrap_or(0),
            });
        }
        Ok(out)
    }
}
