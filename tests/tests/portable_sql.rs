//! The portable query API (`Tx::query`, `Store::query`, `Row::get`): the same statements on
//! every store, for every portable type — `NULL`s, extremes, non-ASCII text, sub-second
//! timestamps, decimals with 28 digits — and what one store writes, the other reads back
//! equal. SQLite always; PostgreSQL against `EVENTS_TEST_POSTGRES_URL` (skipped, and said so,
//! without it), each test in a schema of its own.

mod common;

use std::str::FromStr;

use chrono::{DateTime, Utc};
use event_runtime::{Row, Store, StoreError};
use rust_decimal::Decimal;
use uuid::Uuid;

/// One `#[tokio::test]` per backend running `$case(&store)`.
macro_rules! on_both {
    ($($case:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test]
                async fn $case() {
                    let (_, store) = crate::common::sqlite(stringify!($case)).await;
                    super::$case(&store).await;
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test]
                async fn $case() {
                    if let Some((_, _, store)) = crate::common::postgres(stringify!($case)).await {
                        super::$case(&store).await;
                    }
                }
            )*
        }
    };
}

on_both!(
    integers,
    floats,
    booleans,
    text,
    bytes,
    uuids,
    timestamps,
    decimals,
    placeholders,
    decode_errors,
    store_queries,
    legacy_execute_binds_the_same,
);

/// The table of one type: `id` plus a nullable `v` of `column_type`.
async fn table(store: &Store, ddl: &'static str) {
    let mut tx = store.begin().await.unwrap();
    tx.query(ddl).execute().await.unwrap();
    tx.commit().await.unwrap();
}

/// Every row of `SELECT id, v FROM t ORDER BY id`.
async fn values(store: &Store) -> Vec<Row> {
    let mut tx = store.begin().await.unwrap();
    let rows = tx
        .query("SELECT id, v FROM t ORDER BY id")
        .fetch_all()
        .await
        .unwrap();
    tx.commit().await.unwrap();
    rows
}

/// Writes `values` to `t(id, v)` with ids from 1, each in its own statement, in one
/// transaction.
macro_rules! insert_all {
    ($store:expr, $values:expr) => {{
        let mut tx = $store.begin().await.unwrap();
        for (i, v) in $values.iter().enumerate() {
            let n = tx
                .query("INSERT INTO t (id, v) VALUES ($1, $2)")
                .bind(i as i64 + 1)
                .bind(v)
                .execute()
                .await
                .unwrap_or_else(|e| panic!("{}: insert {v:?}: {e}", $store.backend_name()));
            assert_eq!(n, 1);
        }
        tx.commit().await.unwrap();
    }};
}

/// Reads `v` of every row as `T` and checks it equals what was written.
macro_rules! assert_read_back {
    ($store:expr, $ty:ty, $values:expr) => {{
        let read: Vec<$ty> = values($store)
            .await
            .iter()
            .map(|r| r.get::<$ty>("v").unwrap())
            .collect();
        assert_eq!(read, $values, "{}", $store.backend_name());
    }};
}

async fn integers(store: &Store) {
    table(
        store,
        "CREATE TABLE t (id BIGINT PRIMARY KEY, v BIGINT, small SMALLINT, int INTEGER)",
    )
    .await;
    let wide: Vec<Option<i64>> = vec![Some(i64::MIN), Some(-1), Some(0), Some(i64::MAX), None];
    insert_all!(store, wide);
    assert_read_back!(store, Option<i64>, wide);

    // Narrow types bind and read back as themselves, on columns of their width.
    let mut tx = store.begin().await.unwrap();
    tx.query("UPDATE t SET small = $1, int = $2 WHERE id = 1")
        .bind(i16::MIN)
        .bind(i32::MIN)
        .execute()
        .await
        .unwrap();
    tx.query("UPDATE t SET small = $1, int = $2 WHERE id = 2")
        .bind(i8::MAX)
        .bind(u16::MAX)
        .execute()
        .await
        .unwrap();
    let row = tx
        .query("SELECT small, int FROM t WHERE id = 1")
        .fetch_one()
        .await
        .unwrap();
    assert_eq!(row.get::<i16>("small").unwrap(), i16::MIN);
    assert_eq!(row.get::<i32>("int").unwrap(), i32::MIN);
    let row = tx
        .query("SELECT small, int, v FROM t WHERE id = 2")
        .fetch_one()
        .await
        .unwrap();
    assert_eq!(row.get::<i8>("small").unwrap(), i8::MAX);
    assert_eq!(row.get::<u16>("int").unwrap(), u16::MAX);
    assert_eq!(row.get::<i32>("v").unwrap(), -1);
    tx.query("UPDATE t SET v = $1 WHERE id = 3")
        .bind(u32::MAX)
        .execute()
        .await
        .unwrap();
    let row = tx
        .query("SELECT v FROM t WHERE id = 3")
        .fetch_one()
        .await
        .unwrap();
    assert_eq!(row.get::<u32>("v").unwrap(), u32::MAX);
    assert_eq!(
        row.get::<u8>("v").unwrap_err().to_string(),
        "column \"v\": cannot read integer 4294967295 (out of range) as u8"
    );
    // Aggregates: PostgreSQL's SUM of BIGINT is NUMERIC, SQLite's an integer.
    let row = tx
        .query("SELECT SUM(int) AS total, COUNT(*) AS n FROM t")
        .fetch_one()
        .await
        .unwrap();
    assert_eq!(
        row.get::<i64>("total").unwrap(),
        i64::from(i32::MIN) + 65_535
    );
    assert_eq!(row.get::<i64>("n").unwrap(), 5);
    tx.commit().await.unwrap();
}

async fn floats(store: &Store) {
    table(
        store,
        "CREATE TABLE t (id BIGINT PRIMARY KEY, v DOUBLE PRECISION, single REAL)",
    )
    .await;
    let all = vec![
        Some(f64::MIN),
        Some(f64::MAX),
        Some(f64::MIN_POSITIVE),
        Some(-f64::MIN_POSITIVE),
        Some(f64::EPSILON),
        Some(5e-324),
        Some(0.1),
        Some(-0.0),
        Some(f64::INFINITY),
        Some(f64::NEG_INFINITY),
        None,
    ];
    insert_all!(store, all);
    assert_read_back!(store, Option<f64>, all);

    let mut tx = store.begin().await.unwrap();
    for (id, v) in [(1i64, f32::MAX), (2, f32::MIN_POSITIVE), (3, 0.1f32)] {
        tx.query("UPDATE t SET single = $1 WHERE id = $2")
            .bind(v)
            .bind(id)
            .execute()
            .await
            .unwrap();
    }
    let singles: Vec<f32> = tx
        .query("SELECT single FROM t WHERE id <= 3 ORDER BY id")
        .fetch_all()
        .await
        .unwrap()
        .iter()
        .map(|r| r.get("single").unwrap())
        .collect();
    assert_eq!(singles, [f32::MAX, f32::MIN_POSITIVE, 0.1]);
    tx.commit().await.unwrap();
}

async fn booleans(store: &Store) {
    table(store, "CREATE TABLE t (id BIGINT PRIMARY KEY, v BOOLEAN)").await;
    let all = vec![Some(true), Some(false), None];
    insert_all!(store, all);
    assert_read_back!(store, Option<bool>, all);
    let mut tx = store.begin().await.unwrap();
    let n = tx
        .query("SELECT COUNT(*) AS n FROM t WHERE v = $1")
        .bind(true)
        .fetch_one()
        .await
        .unwrap();
    assert_eq!(n.get::<i64>("n").unwrap(), 1);
    tx.commit().await.unwrap();
}

async fn text(store: &Store) {
    table(store, "CREATE TABLE t (id BIGINT PRIMARY KEY, v TEXT)").await;
    let all: Vec<Option<String>> = [
        Some(""),
        Some("plain ASCII"),
        Some("Grüße aus Zürich — 東京 — Ελλάδα — 🎉👩‍👩‍👧"),
        Some("quotes ' \" and \\ back\nslash\ttab"),
        Some("12.50"),
        None,
    ]
    .into_iter()
    .map(|s| s.map(str::to_owned))
    .collect();
    insert_all!(store, all);
    assert_read_back!(store, Option<String>, all);

    // `&str`, `&String` and `Option<&str>` bind as text too.
    let mut tx = store.begin().await.unwrap();
    let owned = String::from("Grüße");
    let row = tx
        .query("SELECT COUNT(*) AS n FROM t WHERE v LIKE $1 || '%' AND $2 IS NOT NULL AND v <> $3")
        .bind(&owned)
        .bind(Some("x"))
        .bind("nothing")
        .fetch_one()
        .await
        .unwrap();
    assert_eq!(row.get::<i64>("n").unwrap(), 1);
    tx.commit().await.unwrap();
}

async fn bytes(store: &Store) {
    table(store, "CREATE TABLE t (id BIGINT PRIMARY KEY, v BYTEA)").await;
    let all: Vec<Option<Vec<u8>>> = vec![
        Some(Vec::new()),
        Some((0..=255).collect()),
        Some(vec![0, 0, 0]),
        None,
    ];
    insert_all!(store, all);
    assert_read_back!(store, Option<Vec<u8>>, all);
    let mut tx = store.begin().await.unwrap();
    let slice: &[u8] = &[0, 0, 0];
    let row = tx
        .query("SELECT id FROM t WHERE v = $1")
        .bind(slice)
        .fetch_one()
        .await
        .unwrap();
    assert_eq!(row.get::<i64>("id").unwrap(), 3);
    tx.commit().await.unwrap();
}

async fn uuids(store: &Store) {
    table(store, "CREATE TABLE t (id BIGINT PRIMARY KEY, v UUID)").await;
    let all = vec![
        Some(Uuid::max()),
        Some(Uuid::nil()),
        Some(Uuid::from_str("0190f6a4-7b1c-7cc3-9d3e-aa5b1c2d3e4f").unwrap()),
        Some(Uuid::now_v7()),
        None,
    ];
    insert_all!(store, all);
    assert_read_back!(store, Option<Uuid>, all);

    // Both stores order UUIDs the same way (bytes; SQLite's lower-case text sorts alike).
    let mut tx = store.begin().await.unwrap();
    let ordered: Vec<Uuid> = tx
        .query("SELECT v FROM t WHERE v IS NOT NULL ORDER BY v")
        .fetch_all()
        .await
        .unwrap()
        .iter()
        .map(|r| r.get("v").unwrap())
        .collect();
    let mut expected: Vec<Uuid> = all.iter().flatten().copied().collect();
    expected.sort();
    assert_eq!(ordered, expected);
    let row = tx
        .query("SELECT id FROM t WHERE v = $1")
        .bind(Uuid::nil())
        .fetch_one()
        .await
        .unwrap();
    assert_eq!(row.get::<i64>("id").unwrap(), 2);
    tx.commit().await.unwrap();
}

fn at(s: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
}

async fn timestamps(store: &Store) {
    table(
        store,
        "CREATE TABLE t (id BIGINT PRIMARY KEY, v TIMESTAMPTZ,
            created TIMESTAMPTZ NOT NULL DEFAULT CURRENT_TIMESTAMP)",
    )
    .await;
    let all = vec![
        Some(at("2019-01-03T10:00:00.123456Z")),
        Some(at("2019-01-03T10:00:00.000001Z")),
        Some(at("1970-01-01T00:00:00Z")),
        Some(at("1969-12-31T23:59:59.999999Z")),
        Some(at("0001-01-01T00:00:00Z")),
        Some(at("9999-12-31T23:59:59.999999Z")),
        // An offset is only how the instant was written.
        Some(at("2019-01-03T12:00:00.5+02:00")),
        None,
    ];
    insert_all!(store, all);
    assert_read_back!(store, Option<DateTime<Utc>>, all);

    let mut tx = store.begin().await.unwrap();
    // Ordered and compared as instants on both stores.
    let ordered: Vec<i64> = tx
        .query("SELECT id FROM t WHERE v IS NOT NULL ORDER BY v")
        .fetch_all()
        .await
        .unwrap()
        .iter()
        .map(|r| r.get("id").unwrap())
        .collect();
    assert_eq!(ordered, [5, 4, 3, 2, 1, 7, 6]);
    let later = tx
        .query("SELECT COUNT(*) AS n FROM t WHERE v > $1")
        .bind(at("2019-01-03T10:00:00.000001Z"))
        .fetch_one()
        .await
        .unwrap();
    assert_eq!(later.get::<i64>("n").unwrap(), 3);
    // The database's own clock reads as an instant too.
    let created: DateTime<Utc> = tx
        .query("SELECT created FROM t WHERE id = 1")
        .fetch_one()
        .await
        .unwrap()
        .get("created")
        .unwrap();
    assert!(
        (Utc::now() - created).num_seconds().abs() < 300,
        "{created}"
    );
    tx.commit().await.unwrap();
}

async fn decimals(store: &Store) {
    // The one type whose column is declared per store: SQLite keeps a decimal as text, and a
    // NUMERIC column there would turn it into a lossy REAL.
    let ddl = match store.backend_name() {
        "sqlite" => "CREATE TABLE t (id BIGINT PRIMARY KEY, v TEXT)",
        _ => "CREATE TABLE t (id BIGINT PRIMARY KEY, v NUMERIC)",
    };
    table(store, ddl).await;
    let d = |s: &str| Decimal::from_str(s).unwrap();
    let all = vec![
        Some(d("1234567890.123456789012345678")),
        Some(d("-0.0000000000000000000000000001")),
        Some(d("0.1000000000000000000000000000")),
        Some(Decimal::MAX),
        Some(Decimal::MIN),
        Some(d("16.4480")),
        Some(Decimal::ZERO),
        None,
    ];
    insert_all!(store, all);
    assert_read_back!(store, Option<Decimal>, all);
    // The scale is kept, not only the value.
    let texts: Vec<String> = values(store)
        .await
        .iter()
        .filter_map(|r| r.get::<Option<Decimal>>("v").unwrap())
        .map(|v| v.to_string())
        .collect();
    assert_eq!(
        texts,
        [
            "1234567890.123456789012345678",
            "-0.0000000000000000000000000001",
            "0.1000000000000000000000000000",
            "79228162514264337593543950335",
            "-79228162514264337593543950335",
            "16.4480",
            "0",
        ]
    );
}

async fn placeholders(store: &Store) {
    table(
        store,
        "CREATE TABLE t (id BIGINT PRIMARY KEY, a TEXT, b TEXT, v BIGINT)",
    )
    .await;
    let mut tx = store.begin().await.unwrap();
    // One value for two placeholders of the same number.
    tx.query("INSERT INTO t (id, a, b, v) VALUES ($1, $2, $2, $1)")
        .bind(7i64)
        .bind("twice")
        .execute()
        .await
        .unwrap();
    let row = tx
        .query("SELECT id, a, b, v FROM t WHERE a = $1 AND b = $1")
        .bind("twice")
        .fetch_one()
        .await
        .unwrap();
    assert_eq!(row.get::<i64>("v").unwrap(), 7);
    assert_eq!(row.get::<String>("b").unwrap(), "twice");
    // Two-digit numbers, out of order in the text.
    let row = tx
        .query(
            "SELECT $11 AS k, $10 AS j, $1 AS a, $2 AS b, $3 AS c, $4 AS d, $5 AS e, $6 AS f,
                $7 AS g, $8 AS h, $9 AS i, $10 + $11 AS jk",
        )
        .bind(1i64)
        .bind(2i64)
        .bind(3i64)
        .bind(4i64)
        .bind(5i64)
        .bind(6i64)
        .bind(7i64)
        .bind(8i64)
        .bind(9i64)
        .bind(10i64)
        .bind(11i64)
        .fetch_one()
        .await
        .unwrap();
    assert_eq!(row.get::<i64>("j").unwrap(), 10);
    assert_eq!(row.get::<i64>("k").unwrap(), 11);
    assert_eq!(row.get::<i64>("jk").unwrap(), 21);
    assert_eq!(row.get_at::<i64>(2).unwrap(), 1);
    assert_eq!(
        row.columns().collect::<Vec<_>>(),
        ["k", "j", "a", "b", "c", "d", "e", "f", "g", "h", "i", "jk"]
    );
    tx.commit().await.unwrap();
}

async fn decode_errors(store: &Store) {
    table(
        store,
        "CREATE TABLE t (id BIGINT PRIMARY KEY, name TEXT, v BIGINT, u UUID)",
    )
    .await;
    let mut tx = store.begin().await.unwrap();
    tx.query("INSERT INTO t (id, name, v, u) VALUES ($1, $2, $3, $4)")
        .bind(1i64)
        .bind("Ada")
        .bind(None::<i64>)
        .bind(None::<Uuid>)
        .execute()
        .await
        .unwrap();
    let row = tx
        .query("SELECT id, name, v, u FROM t")
        .fetch_one()
        .await
        .unwrap();
    let message = |e: StoreError| e.to_string();
    assert_eq!(
        message(row.get::<i64>("name").unwrap_err()),
        "column \"name\": cannot read text as i64"
    );
    assert_eq!(
        message(row.get::<String>("v").unwrap_err()),
        "column \"v\": cannot read NULL as String"
    );
    assert_eq!(
        message(row.get::<Uuid>("name").unwrap_err()),
        "column \"name\": cannot read text that is not a UUID as Uuid"
    );
    assert_eq!(
        message(row.get::<DateTime<Utc>>("id").unwrap_err()),
        "column \"id\": cannot read integer 1 as DateTime<Utc>"
    );
    assert_eq!(
        message(row.get::<i8>("missing").unwrap_err()),
        "no column \"missing\" in the row; its columns: id, name, v, u"
    );
    assert!(matches!(
        row.get::<Option<Decimal>>("name").unwrap_err(),
        StoreError::Decode { ref column, ref expected, .. }
            if column == "name" && expected == "Option<Decimal>"
    ));
    assert_eq!(row.get::<Option<i64>>("v").unwrap(), None);
    // Upper-case names find PostgreSQL's folded ones.
    assert_eq!(row.get::<String>("NAME").unwrap(), "Ada");
    let none = tx
        .query("SELECT id FROM t WHERE id = $1")
        .bind(2i64)
        .fetch_one()
        .await
        .unwrap_err();
    assert!(matches!(none, StoreError::NoRow), "{none}");
    tx.commit().await.unwrap();
}

async fn store_queries(store: &Store) {
    store
        .query("CREATE TABLE t (id BIGINT PRIMARY KEY, v TEXT)")
        .execute()
        .await
        .unwrap();
    let n = store
        .query("INSERT INTO t (id, v) VALUES ($1, $2), ($3, $4)")
        .bind(1i64)
        .bind("one")
        .bind(2i64)
        .bind("two")
        .execute()
        .await
        .unwrap();
    assert_eq!(n, 2);
    // A transaction's writes are seen by the store once committed, and not before.
    let mut tx = store.begin().await.unwrap();
    tx.query("INSERT INTO t (id, v) VALUES ($1, $2)")
        .bind(3i64)
        .bind("three")
        .execute()
        .await
        .unwrap();
    assert!(tx
        .query("SELECT v FROM t WHERE id = $1")
        .bind(3i64)
        .fetch_optional()
        .await
        .unwrap()
        .is_some());
    tx.rollback().await.unwrap();
    let missing = store
        .query("SELECT v FROM t WHERE id = $1")
        .bind(3i64)
        .fetch_optional()
        .await
        .unwrap();
    assert_eq!(missing, None);
    let all: Vec<String> = store
        .query("SELECT v FROM t ORDER BY id")
        .fetch_all()
        .await
        .unwrap()
        .iter()
        .map(|r| r.get("v").unwrap())
        .collect();
    assert_eq!(all, ["one", "two"]);
}

async fn legacy_execute_binds_the_same(store: &Store) {
    use event_runtime::SqlValue;
    table(store, "CREATE TABLE t (id BIGINT PRIMARY KEY, v TEXT)").await;
    let mut tx = store.begin().await.unwrap();
    tx.execute(
        "INSERT INTO t (id, v) VALUES ($1, $2)",
        &[SqlValue::Int(1), SqlValue::Text("é")],
    )
    .await
    .unwrap();
    let row = tx
        .query("SELECT v FROM t WHERE id = $1")
        .bind(SqlValue::Int(1))
        .fetch_one()
        .await
        .unwrap();
    assert_eq!(row.get::<String>("v").unwrap(), "é");
    assert_eq!(
        tx.fetch_i64("SELECT id FROM t", &[]).await.unwrap(),
        Some(1)
    );
    tx.commit().await.unwrap();
}

/// What SQLite stores, PostgreSQL reads back equal, and the other way round: every type
/// through both, row by row.
#[tokio::test]
async fn values_cross_between_stores() {
    let Some((_, _, pg)) = common::postgres("values_cross_between_stores").await else {
        return;
    };
    let (_, lite) = common::sqlite("values_cross_between_stores").await;
    for (store, numeric) in [(&lite, "TEXT"), (&pg, "NUMERIC")] {
        let ddl: &'static str = if numeric == "TEXT" {
            "CREATE TABLE x (i BIGINT, f DOUBLE PRECISION, b BOOLEAN, s TEXT, y BYTEA, u UUID,
                t TIMESTAMPTZ, d TEXT)"
        } else {
            "CREATE TABLE x (i BIGINT, f DOUBLE PRECISION, b BOOLEAN, s TEXT, y BYTEA, u UUID,
                t TIMESTAMPTZ, d NUMERIC)"
        };
        store.query(ddl).execute().await.unwrap();
    }
    type Values = (
        Option<i64>,
        Option<f64>,
        Option<bool>,
        Option<String>,
        Option<Vec<u8>>,
        Option<Uuid>,
        Option<DateTime<Utc>>,
        Option<Decimal>,
    );
    let written: Vec<Values> = vec![
        (
            Some(i64::MIN),
            Some(f64::MAX),
            Some(true),
            Some("naïve café ☕".into()),
            Some(vec![0, 255]),
            Some(Uuid::now_v7()),
            Some(at("2024-02-29T23:59:59.999999Z")),
            Some(Decimal::from_str("-1234567890.123456789012345678").unwrap()),
        ),
        (None, None, None, None, None, None, None, None),
    ];
    const INSERT: &str =
        "INSERT INTO x (i, f, b, s, y, u, t, d) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)";
    const SELECT: &str = "SELECT i, f, b, s, y, u, t, d FROM x ORDER BY i NULLS LAST";
    async fn read(store: &Store) -> Vec<Values> {
        store
            .query(SELECT)
            .fetch_all()
            .await
            .unwrap()
            .iter()
            .map(|r| {
                (
                    r.get("i").unwrap(),
                    r.get("f").unwrap(),
                    r.get("b").unwrap(),
                    r.get("s").unwrap(),
                    r.get("y").unwrap(),
                    r.get("u").unwrap(),
                    r.get("t").unwrap(),
                    r.get("d").unwrap(),
                )
            })
            .collect()
    }
    async fn write(store: &Store, rows: &[Values]) {
        for v in rows {
            store
                .query(INSERT)
                .bind(v.0)
                .bind(v.1)
                .bind(v.2)
                .bind(&v.3)
                .bind(&v.4)
                .bind(v.5)
                .bind(v.6)
                .bind(v.7)
                .execute()
                .await
                .unwrap();
        }
    }
    write(&lite, &written).await;
    let from_sqlite = read(&lite).await;
    assert_eq!(from_sqlite, written);
    write(&pg, &from_sqlite).await;
    let from_postgres = read(&pg).await;
    assert_eq!(from_postgres, written);
    lite.query("DELETE FROM x").execute().await.unwrap();
    write(&lite, &from_postgres).await;
    assert_eq!(read(&lite).await, written);
}
