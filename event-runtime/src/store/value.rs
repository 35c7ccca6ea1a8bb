//! The values of the portable query API: [`ToSql`] (what a query binds), [`FromSql`] (what a
//! [`Row`](super::Row) column reads into) and [`Datum`], the form a value takes between them
//! and a backend. Owns the conversions between Rust types and data; how a database stores a
//! datum is its backend's business (see [`Tx::query`](super::Tx::query)).

use std::borrow::Cow;

use chrono::{DateTime, NaiveDateTime, SecondsFormat, Utc};
use uuid::Uuid;

#[cfg(feature = "decimal")]
use rust_decimal::Decimal;

/// One value on its way to or from a database: a bound parameter, or a column of a fetched
/// row. Applications bind Rust values ([`ToSql`]) and read them back ([`FromSql`]); this type
/// is public for [`BackendTransaction`](super::BackendTransaction) implementations, which
/// encode each variant the way their database stores it.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Datum {
    /// SQL `NULL`, bound as this type (PostgreSQL types every parameter).
    Null(SqlType),
    /// An integer: every integer type is bound as a 64-bit one.
    Int(i64),
    /// A floating-point number (an `f32` is widened exactly).
    Float(f64),
    /// A boolean (`BOOLEAN`; SQLite stores 0 or 1).
    Bool(bool),
    /// Text.
    Text(String),
    /// Bytes (`BYTEA`, `BLOB`).
    Bytes(Vec<u8>),
    /// A UUID (`UUID`; SQLite stores the hyphenated lower-case text).
    Uuid(Uuid),
    /// An instant (`TIMESTAMPTZ`; SQLite stores the text of [`timestamp_text`]).
    Timestamp(DateTime<Utc>),
    /// An exact decimal (`NUMERIC`; SQLite stores its text).
    #[cfg(feature = "decimal")]
    #[cfg_attr(docsrs, doc(cfg(feature = "decimal")))]
    Decimal(Decimal),
    /// A column whose database type has no portable reading: the database's type name.
    Unsupported(String),
}

/// The type of a bound [`Datum::Null`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SqlType {
    /// An integer.
    Int,
    /// A float.
    Float,
    /// A boolean.
    Bool,
    /// Text.
    Text,
    /// Bytes.
    Bytes,
    /// A UUID.
    Uuid,
    /// A timestamp.
    Timestamp,
    /// A decimal.
    #[cfg(feature = "decimal")]
    #[cfg_attr(docsrs, doc(cfg(feature = "decimal")))]
    Decimal,
}

impl Datum {
    /// What this is, for error messages: `integer 70000`, `text`, `NULL`.
    fn describe(&self) -> String {
        match self {
            Datum::Null(_) => "NULL".into(),
            Datum::Int(v) => format!("integer {v}"),
            Datum::Float(v) => format!("float {v}"),
            Datum::Bool(_) => "boolean".into(),
            Datum::Text(_) => "text".into(),
            Datum::Bytes(b) => format!("{} bytes", b.len()),
            Datum::Uuid(_) => "uuid".into(),
            Datum::Timestamp(_) => "timestamp".into(),
            #[cfg(feature = "decimal")]
            Datum::Decimal(d) => format!("decimal {d}"),
            Datum::Unsupported(t) => format!("a value of type {t}"),
        }
    }
}

/// The text of an instant where the database has no timestamp type (SQLite): RFC 3339 in UTC
/// with exactly six decimals, `2019-01-03T10:00:00.250000Z`, so that text order is time order
/// (years 0000 to 9999) and the precision is PostgreSQL's (microseconds; finer digits are
/// dropped).
pub fn timestamp_text(t: &DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Micros, true)
}

fn parse_timestamp(s: &str) -> Option<DateTime<Utc>> {
    if let Ok(t) = DateTime::parse_from_rfc3339(s) {
        return Some(t.with_timezone(&Utc));
    }
    // SQLite's own `CURRENT_TIMESTAMP` / `datetime('now')` text, which is UTC.
    ["%Y-%m-%d %H:%M:%S%.f", "%Y-%m-%d %H:%M:%S"]
        .iter()
        .find_map(|f| NaiveDateTime::parse_from_str(s, f).ok())
        .map(|t| t.and_utc())
}

mod sealed {
    pub trait Sealed {}
}

/// A Rust type that a portable query binds: [`Query::bind`](super::Query::bind).
///
/// Implemented for `i8`, `i16`, `i32`, `i64`, `u8`, `u16`, `u32`, `f32`, `f64`, `bool`,
/// `String`, `str`, `Vec<u8>`, `[u8]`, `uuid::Uuid`, `chrono::DateTime<Utc>`,
/// `rust_decimal::Decimal` (feature `decimal`), `Option` of each (`None` is `NULL`),
/// [`SqlValue`](super::SqlValue), and references to all of them. Sealed: each is stored the
/// same way by every backend of this crate, so that what one store writes the other reads
/// back equal. `u64` is not one (PostgreSQL has no unsigned integers): convert with
/// `i64::try_from`.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a portable SQL type: it cannot be bound to an event_runtime query",
    label = "not bindable on every store",
    note = "portable types: i8, i16, i32, i64, u8, u16, u32, f32, f64, bool, String, &str, Vec<u8>, &[u8], uuid::Uuid, chrono::DateTime<Utc>, rust_decimal::Decimal (feature `decimal`), and Option<T> of them",
    note = "convert the value first (a u64: `i64::try_from(n)?`), or write this query against the native connection: `tx.native::<sqlx::PgConnection>()`"
)]
pub trait ToSql: sealed::Sealed {
    /// This value as a datum.
    #[doc(hidden)]
    fn to_datum(&self) -> Datum;
}

/// A Rust type that a column of a fetched [`Row`](super::Row) reads into:
/// [`Row::get`](super::Row::get).
///
/// Implemented for the same types as [`ToSql`] (owned: `String`, `Vec<u8>`). Reads are exact
/// or fail: an integer out of the type's range, a `NULL` read as anything but an `Option`, a
/// text that is no UUID, is a [`StoreError::Decode`](super::StoreError::Decode) naming the
/// column and the type asked for.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a portable SQL type: a row's column cannot be read into it",
    label = "not readable on every store",
    note = "portable types: i8, i16, i32, i64, u8, u16, u32, f32, f64, bool, String, Vec<u8>, uuid::Uuid, chrono::DateTime<Utc>, rust_decimal::Decimal (feature `decimal`), and Option<T> of them"
)]
pub trait FromSql: Sized + sealed::Sealed {
    /// The type's name in error messages.
    #[doc(hidden)]
    fn type_name() -> Cow<'static, str>;

    /// Reads `datum`; the error says what was found instead.
    #[doc(hidden)]
    fn from_datum(datum: &Datum) -> Result<Self, String>;
}

impl<T: sealed::Sealed + ?Sized> sealed::Sealed for &T {}
impl<T: ToSql + ?Sized> ToSql for &T {
    fn to_datum(&self) -> Datum {
        (**self).to_datum()
    }
}

impl<T: sealed::Sealed> sealed::Sealed for Option<T> {}
impl<T: ToSql + NullType> ToSql for Option<T> {
    fn to_datum(&self) -> Datum {
        match self {
            Some(v) => v.to_datum(),
            None => Datum::Null(T::NULL_TYPE),
        }
    }
}
impl<T: FromSql> FromSql for Option<T> {
    fn type_name() -> Cow<'static, str> {
        format!("Option<{}>", T::type_name()).into()
    }
    fn from_datum(datum: &Datum) -> Result<Self, String> {
        match datum {
            Datum::Null(_) => Ok(None),
            d => T::from_datum(d).map(Some),
        }
    }
}

/// The type a `None` of `Self` is bound as.
#[doc(hidden)]
pub trait NullType {
    const NULL_TYPE: SqlType;
}
impl<T: NullType + ?Sized> NullType for &T {
    const NULL_TYPE: SqlType = T::NULL_TYPE;
}

fn mismatch<T>(d: &Datum) -> Result<T, String> {
    Err(d.describe())
}

macro_rules! integers {
    ($($t:ty),*) => {$(
        impl sealed::Sealed for $t {}
        impl NullType for $t {
            const NULL_TYPE: SqlType = SqlType::Int;
        }
        impl ToSql for $t {
            fn to_datum(&self) -> Datum {
                Datum::Int(i64::from(*self))
            }
        }
        impl FromSql for $t {
            fn type_name() -> Cow<'static, str> {
                stringify!($t).into()
            }
            fn from_datum(datum: &Datum) -> Result<Self, String> {
                let out_of_range = || format!("{} (out of range)", datum.describe());
                match datum {
                    Datum::Int(v) => <$t>::try_from(*v).map_err(|_| out_of_range()),
                    // PostgreSQL's `SUM` and `NUMERIC` columns: exact integers only.
                    #[cfg(feature = "decimal")]
                    Datum::Decimal(d) if d.fract().is_zero() => {
                        use rust_decimal::prelude::ToPrimitive;
                        d.to_i64()
                            .and_then(|v| <$t>::try_from(v).ok())
                            .ok_or_else(out_of_range)
                    }
                    d => mismatch(d),
                }
            }
        }
    )*};
}
integers!(i8, i16, i32, i64, u8, u16, u32);

macro_rules! simple {
    ($t:ty, $null:ident, $name:literal, |$v:ident| $to:expr, |$d:ident| $from:expr) => {
        impl sealed::Sealed for $t {}
        impl NullType for $t {
            const NULL_TYPE: SqlType = SqlType::$null;
        }
        impl ToSql for $t {
            fn to_datum(&self) -> Datum {
                let $v = self;
                $to
            }
        }
        impl FromSql for $t {
            fn type_name() -> Cow<'static, str> {
                $name.into()
            }
            fn from_datum($d: &Datum) -> Result<Self, String> {
                $from
            }
        }
    };
}

simple!(f64, Float, "f64", |v| Datum::Float(*v), |d| match d {
    Datum::Float(v) => Ok(*v),
    // SQLite keeps a whole REAL in an INTEGER column (and `SUM` of integers is one).
    Datum::Int(v) if v.unsigned_abs() <= 1 << 53 => Ok(*v as f64),
    d => mismatch(d),
});
simple!(
    f32,
    Float,
    "f32",
    |v| Datum::Float(f64::from(*v)),
    |d| match d {
        Datum::Float(v) if !v.is_finite() || v.abs() <= f64::from(f32::MAX) => Ok(*v as f32),
        Datum::Float(v) => Err(format!("float {v} (out of range)")),
        Datum::Int(v) if v.unsigned_abs() <= 1 << 24 => Ok(*v as f32),
        d => mismatch(d),
    }
);
simple!(bool, Bool, "bool", |v| Datum::Bool(*v), |d| match d {
    Datum::Bool(v) => Ok(*v),
    // SQLite stores booleans as 0 and 1.
    Datum::Int(0) => Ok(false),
    Datum::Int(1) => Ok(true),
    d => mismatch(d),
});
simple!(
    String,
    Text,
    "String",
    |v| Datum::Text(v.clone()),
    |d| match d {
        Datum::Text(v) => Ok(v.clone()),
        d => mismatch(d),
    }
);
simple!(
    Vec<u8>,
    Bytes,
    "Vec<u8>",
    |v| Datum::Bytes(v.clone()),
    |d| match d {
        Datum::Bytes(v) => Ok(v.clone()),
        d => mismatch(d),
    }
);
simple!(Uuid, Uuid, "Uuid", |v| Datum::Uuid(*v), |d| match d {
    Datum::Uuid(v) => Ok(*v),
    Datum::Text(s) => Uuid::parse_str(s).map_err(|_| "text that is not a UUID".to_owned()),
    // sqlx's own SQLite encoding of a UUID.
    Datum::Bytes(b) if b.len() == 16 => Uuid::from_slice(b).map_err(|e| e.to_string()),
    d => mismatch(d),
});
simple!(
    DateTime<Utc>,
    Timestamp,
    "DateTime<Utc>",
    |v| Datum::Timestamp(*v),
    |d| match d {
        Datum::Timestamp(v) => Ok(*v),
        Datum::Text(s) => {
            parse_timestamp(s).ok_or_else(|| "text that is not an RFC 3339 timestamp".to_owned())
        }
        d => mismatch(d),
    }
);
#[cfg(feature = "decimal")]
simple!(
    Decimal,
    Decimal,
    "Decimal",
    |v| Datum::Decimal(*v),
    |d| match d {
        Datum::Decimal(v) => Ok(*v),
        Datum::Int(v) => Ok(Decimal::from(*v)),
        Datum::Text(s) => s
            .parse::<Decimal>()
            .map_err(|_| "text that is not a decimal".to_owned()),
        Datum::Float(v) => Err(format!(
        "float {v} (a decimal kept as REAL lost its exact value: declare the column TEXT on SQLite)"
    )),
        d => mismatch(d),
    }
);

impl sealed::Sealed for str {}
impl NullType for str {
    const NULL_TYPE: SqlType = SqlType::Text;
}
impl ToSql for str {
    fn to_datum(&self) -> Datum {
        Datum::Text(self.to_owned())
    }
}

impl sealed::Sealed for [u8] {}
impl NullType for [u8] {
    const NULL_TYPE: SqlType = SqlType::Bytes;
}
impl ToSql for [u8] {
    fn to_datum(&self) -> Datum {
        Datum::Bytes(self.to_vec())
    }
}

impl sealed::Sealed for super::SqlValue<'_> {}
impl ToSql for super::SqlValue<'_> {
    fn to_datum(&self) -> Datum {
        self.datum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_read_exactly_or_fail() {
        assert_eq!(i32::from_datum(&Datum::Int(7)), Ok(7));
        assert_eq!(
            i8::from_datum(&Datum::Int(300)),
            Err("integer 300 (out of range)".into())
        );
        assert!(u32::from_datum(&Datum::Int(-1)).is_err());
        assert_eq!(
            i64::from_datum(&Datum::Null(SqlType::Int)),
            Err("NULL".into())
        );
        assert_eq!(
            Option::<i64>::from_datum(&Datum::Null(SqlType::Int)),
            Ok(None)
        );
        assert!(f64::from_datum(&Datum::Int(i64::MAX)).is_err());
    }

    #[test]
    fn timestamps_have_a_sortable_text() {
        let t = DateTime::parse_from_rfc3339("2019-01-03T10:00:00.25Z")
            .unwrap()
            .with_timezone(&Utc);
        assert_eq!(timestamp_text(&t), "2019-01-03T10:00:00.250000Z");
        assert_eq!(parse_timestamp("2019-01-03 10:00:00.25"), Some(t));
        assert_eq!(
            parse_timestamp("2019-01-03 10:00:00"),
            Some(t - chrono::Duration::milliseconds(250))
        );
    }
}
