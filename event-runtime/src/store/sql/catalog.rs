//! The catalog table (`event_catalog`): the event types the services on this database know,
//! with their sensitive fields, as statements any SQL dialect runs.

use sqlx::Pool;

use super::exec::{Arg, SqlExec};
use super::{db, execute, rows, Dialect};
use crate::store::types::CatalogRecord;
use crate::store::{from_ms, StoreError};

pub(crate) async fn record<D: Dialect>(
    pool: &Pool<D::DB>,
    entries: &[CatalogRecord],
    now: i64,
) -> Result<(), StoreError> {
    let mut tx = D::begin(pool).await.map_err(db)?;
    for e in entries {
        let sensitive = serde_json::to_string(&e.sensitive).unwrap_or_else(|_| "[]".into());
        let schema = e.schema.as_ref().map(|s| s.to_string());
        execute::<D>(
            &mut tx,
            "INSERT INTO event_catalog (name, version, rust_type, sensitive, schema, recorded_at) \
             VALUES ($1, $2, $3, $4, $5, $6) \
             ON CONFLICT (name, version) DO UPDATE SET rust_type = excluded.rust_type, \
             sensitive = excluded.sensitive, schema = excluded.schema, \
             recorded_at = excluded.recorded_at",
            &[
                Arg::Str(&e.name),
                Arg::I64(i64::from(e.version)),
                Arg::Str(&e.rust_type),
                Arg::Str(&sensitive),
                Arg::OptStr(schema.as_deref()),
                Arg::I64(now),
            ],
        )
        .await?;
    }
    tx.commit().await.map_err(db)
}

pub(crate) async fn read<D: Dialect>(pool: &Pool<D::DB>) -> Result<Vec<CatalogRecord>, StoreError> {
    let mut conn = pool.acquire().await.map_err(db)?;
    let corrupt = |what: &str, e: &dyn std::fmt::Display| {
        StoreError::Corrupt(format!("event_catalog {what}: {e}"))
    };
    rows::<D>(
        &mut conn,
        "SELECT name, version, rust_type, sensitive, schema, recorded_at FROM event_catalog \
         ORDER BY name, version",
        &[],
    )
    .await?
    .iter()
    .map(|r| {
        let version = D::DB::get_i64(r, "version").map_err(db)?;
        let sensitive = D::DB::get_string(r, "sensitive").map_err(db)?;
        let schema = D::DB::get_opt_string(r, "schema").map_err(db)?;
        Ok(CatalogRecord {
            name: D::DB::get_string(r, "name").map_err(db)?,
            version: u32::try_from(version).map_err(|e| corrupt("version", &e))?,
            rust_type: D::DB::get_string(r, "rust_type").map_err(db)?,
            sensitive: serde_json::from_str(&sensitive).map_err(|e| corrupt("sensitive", &e))?,
            schema: schema
                .map(|s| serde_json::from_str(&s))
                .transpose()
                .map_err(|e| corrupt("schema", &e))?,
            recorded_at: Some(from_ms(D::DB::get_i64(r, "recorded_at").map_err(db)?)),
        })
    })
    .collect()
}
