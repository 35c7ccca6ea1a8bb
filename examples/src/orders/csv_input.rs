//! Reads the Superstore orders CSV into typed rows, with errors that name the file, the line
//! and the column. Owns parsing only: it knows nothing of aggregates or events.
//!
//! The bundled file is UTF-8 with a byte order mark and CRLF line ends; fields are quoted
//! where needed (with `""` for an embedded quote); product names keep their non-breaking
//! spaces and curly quotes verbatim; dates are `dd/mm/yy`; amounts have up to four decimals
//! and are read as exact decimals, never as floats.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use chrono::NaiveDate;
use rust_decimal::Decimal;

/// The date format of the data set: day, month, two-digit year (2000–2068 for `00`–`68`).
pub const DATE_FORMAT: &str = "%d/%m/%y";

/// One line of the orders file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrderRow {
    /// Line in the file where the record starts (the header is line 1).
    pub line: u64,
    /// `Row ID`.
    pub row_id: u64,
    /// `Order ID`.
    pub order_id: String,
    /// `Order Date`.
    pub order_date: NaiveDate,
    /// `Ship Date`.
    pub ship_date: NaiveDate,
    /// `Ship Mode`.
    pub ship_mode: String,
    /// `Customer ID`.
    pub customer_id: String,
    /// `Segment`.
    pub segment: String,
    /// `Country/Region`.
    pub country: String,
    /// `Region`.
    pub region: String,
    /// `Product ID`.
    pub product_id: String,
    /// `Category`.
    pub category: String,
    /// `Product Name`.
    pub product_name: String,
    /// `Sales`.
    pub sales: Decimal,
    /// `Quantity`.
    pub quantity: u32,
    /// `Discount`.
    pub discount: Decimal,
    /// `Profit`.
    pub profit: Decimal,
}

/// The input could not be read: says where (file, line, column) and what.
///
/// Displays as `path:line: column "Sales": invalid decimal "1.2.3"`, leaving out what does
/// not apply (a missing file has no line).
#[derive(Debug)]
pub struct InputError {
    /// The file, as given.
    pub path: PathBuf,
    /// The line, 1-based (the header is line 1).
    pub line: Option<u64>,
    /// The column, by its header name.
    pub column: Option<String>,
    /// What is wrong.
    pub problem: Problem,
}

/// What is wrong with the input.
#[derive(Debug)]
#[non_exhaustive]
pub enum Problem {
    /// The file could not be read (missing, a directory, no permission).
    Open(io::Error),
    /// The file has no header line.
    Empty,
    /// A column the program needs is not in the header.
    MissingColumn(&'static str),
    /// A field is not valid UTF-8.
    NotUtf8 {
        /// Offset of the first invalid byte within the field.
        offset: usize,
    },
    /// A record has another number of fields than the header.
    FieldCount {
        /// Fields in the header.
        expected: u64,
        /// Fields in this record.
        found: u64,
    },
    /// A required field is empty.
    EmptyValue,
    /// Not a decimal number.
    InvalidDecimal(String),
    /// Not a non-negative integer.
    InvalidInteger(String),
    /// Not a `dd/mm/yy` date.
    InvalidDate(String),
    /// Reading failed part way, or another CSV error.
    Csv(csv::Error),
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Problem::Open(e) => write!(f, "cannot read the file: {e}"),
            Problem::Empty => f.write_str("the file is empty: expected a header line"),
            Problem::MissingColumn(name) => write!(f, "missing column {name:?}"),
            Problem::NotUtf8 { offset } => write!(
                f,
                "not valid UTF-8 (invalid byte at offset {offset} of the field); the file must be UTF-8"
            ),
            Problem::FieldCount { expected, found } => {
                write!(f, "expected {expected} fields as in the header, found {found}")
            }
            Problem::EmptyValue => f.write_str("empty value"),
            Problem::InvalidDecimal(v) => write!(f, "invalid decimal {v:?}"),
            Problem::InvalidInteger(v) => write!(f, "invalid integer {v:?}"),
            Problem::InvalidDate(v) => write!(f, "invalid date {v:?} (expected dd/mm/yy)"),
            Problem::Csv(e) if e.is_io_error() => write!(f, "cannot read: {e}"),
            Problem::Csv(e) => write!(f, "malformed CSV: {e}"),
        }
    }
}

impl fmt::Display for InputError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.path.display())?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
        }
        if let Some(column) = &self.column {
            write!(f, ": column {column:?}")?;
        }
        write!(f, ": {}", self.problem)
    }
}

impl std::error::Error for InputError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.problem {
            Problem::Open(e) => Some(e),
            Problem::Csv(e) => Some(e),
            _ => None,
        }
    }
}

/// The columns read, in the order of [`Columns`]' fields.
const REQUIRED: [&str; 16] = [
    "Row ID",
    "Order ID",
    "Order Date",
    "Ship Date",
    "Ship Mode",
    "Customer ID",
    "Segment",
    "Country/Region",
    "Region",
    "Product ID",
    "Category",
    "Product Name",
    "Sales",
    "Quantity",
    "Discount",
    "Profit",
];

/// Index of each required column in the header.
struct Columns([usize; REQUIRED.len()]);

/// Reads every row of `path`.
///
/// # Errors
/// [`InputError`] for a missing or unreadable file, a file that is not UTF-8, a missing
/// column, a record with a wrong number of fields, an empty required field, or a malformed
/// number or date. The first problem in file order is reported.
pub fn read_rows(path: &Path) -> Result<Vec<OrderRow>, InputError> {
    let at = |line: Option<u64>, column: Option<String>, problem: Problem| InputError {
        path: path.to_path_buf(),
        line,
        column,
        problem,
    };
    // The whole file is read at once (the bundled one is 2 MB) so that line numbers can be
    // computed from byte offsets; see `Lines`.
    let bytes = std::fs::read(path).map_err(|e| at(None, None, Problem::Open(e)))?;
    let lines = Lines::new(&bytes);
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(true)
        .from_reader(bytes.as_slice());

    let header = reader
        .byte_headers()
        .map_err(|e| csv_error(path, &lines, e))?
        .clone();
    let header_line = header.position().map_or(1, |p| lines.record_line(p));
    if header.is_empty() || (header.len() == 1 && header[0].is_empty()) {
        return Err(at(Some(header_line), None, Problem::Empty));
    }
    let mut names = Vec::with_capacity(header.len());
    for (i, raw) in header.iter().enumerate() {
        let name = std::str::from_utf8(raw).map_err(|e| {
            at(
                Some(header_line),
                Some(format!("#{}", i + 1)),
                Problem::NotUtf8 {
                    offset: e.valid_up_to(),
                },
            )
        })?;
        // csv strips a UTF-8 byte order mark itself; this keeps a stray one from hiding the
        // first column's name.
        names.push(name.trim_start_matches('\u{feff}'));
    }
    let mut index = [0usize; REQUIRED.len()];
    for (slot, wanted) in index.iter_mut().zip(REQUIRED) {
        *slot = names
            .iter()
            .position(|n| *n == wanted)
            .ok_or_else(|| at(Some(header_line), None, Problem::MissingColumn(wanted)))?;
    }
    let columns = Columns(index);
    let names: Vec<String> = names.into_iter().map(str::to_owned).collect();

    let mut rows = Vec::new();
    let mut record = csv::ByteRecord::new();
    loop {
        match reader.read_byte_record(&mut record) {
            Ok(true) => {}
            Ok(false) => break,
            Err(e) => return Err(csv_error(path, &lines, e)),
        }
        let line = record.position().map_or(0, |p| lines.record_line(p));
        let parser = RowParser {
            path,
            line,
            names: &names,
            record: &record,
        };
        parser.check_utf8()?;
        rows.push(parser.parse(&columns)?);
    }
    Ok(rows)
}

/// Line numbers from byte offsets.
///
/// csv's own `Position::line` is one short after CRLF line ends (it counts the `\n` of a
/// CRLF only when it reads the next record: BurntSushi/rust-csv#395) and after blank lines
/// (#208). Its byte offset is right up to that same `\n`, so the line is counted here: skip
/// the line ends at the offset (a record never starts with one), count the `\n`s before it.
struct Lines<'a> {
    bytes: &'a [u8],
    newlines: Vec<usize>,
}

impl<'a> Lines<'a> {
    fn new(bytes: &'a [u8]) -> Self {
        let newlines = bytes
            .iter()
            .enumerate()
            .filter(|(_, &b)| b == b'\n')
            .map(|(i, _)| i)
            .collect();
        Lines { bytes, newlines }
    }

    /// 1-based line of the record that csv says starts at `pos`.
    fn record_line(&self, pos: &csv::Position) -> u64 {
        let mut start = usize::try_from(pos.byte())
            .unwrap_or(usize::MAX)
            .min(self.bytes.len());
        while matches!(self.bytes.get(start), Some(b'\r' | b'\n')) {
            start += 1;
        }
        1 + self.newlines.partition_point(|&n| n < start) as u64
    }
}

fn csv_error(path: &Path, lines: &Lines<'_>, e: csv::Error) -> InputError {
    let line = e.position().map(|p| lines.record_line(p));
    let problem = match e.kind() {
        csv::ErrorKind::UnequalLengths {
            expected_len, len, ..
        } => Problem::FieldCount {
            expected: *expected_len,
            found: *len,
        },
        csv::ErrorKind::Utf8 { err, .. } => Problem::NotUtf8 {
            offset: err.valid_up_to(),
        },
        _ => Problem::Csv(e),
    };
    InputError {
        path: path.to_path_buf(),
        line,
        column: None,
        problem,
    }
}

struct RowParser<'a> {
    path: &'a Path,
    line: u64,
    names: &'a [String],
    record: &'a csv::ByteRecord,
}

impl RowParser<'_> {
    fn error(&self, field: usize, problem: Problem) -> InputError {
        InputError {
            path: self.path.to_path_buf(),
            line: Some(self.line),
            column: Some(
                self.names
                    .get(field)
                    .cloned()
                    .unwrap_or_else(|| format!("#{}", field + 1)),
            ),
            problem,
        }
    }

    /// Every field, read or not, must be UTF-8: the file is rejected as a whole otherwise.
    fn check_utf8(&self) -> Result<(), InputError> {
        for (i, field) in self.record.iter().enumerate() {
            if let Err(e) = std::str::from_utf8(field) {
                return Err(self.error(
                    i,
                    Problem::NotUtf8 {
                        offset: e.valid_up_to(),
                    },
                ));
            }
        }
        Ok(())
    }

    /// The field as text; [`Self::check_utf8`] ran first.
    fn text(&self, field: usize) -> Result<&str, InputError> {
        let bytes = self.record.get(field).unwrap_or_default();
        std::str::from_utf8(bytes).map_err(|e| {
            self.error(
                field,
                Problem::NotUtf8 {
                    offset: e.valid_up_to(),
                },
            )
        })
    }

    fn required(&self, field: usize) -> Result<String, InputError> {
        let text = self.text(field)?;
        if text.trim().is_empty() {
            return Err(self.error(field, Problem::EmptyValue));
        }
        Ok(text.to_owned())
    }

    fn decimal(&self, field: usize) -> Result<Decimal, InputError> {
        let text = self.text(field)?;
        let trimmed = text.trim();
        if trimmed.is_empty() {
            return Err(self.error(field, Problem::EmptyValue));
        }
        // `from_str_exact` refuses what would lose digits instead of rounding it; underscores
        // and exponents, which `FromStr` tolerates, are not numbers in this file.
        if !trimmed
            .bytes()
            .all(|b| b.is_ascii_digit() || matches!(b, b'.' | b'-' | b'+'))
        {
            return Err(self.error(field, Problem::InvalidDecimal(text.to_owned())));
        }
        Decimal::from_str_exact(trimmed)
            .map_err(|_| self.error(field, Problem::InvalidDecimal(text.to_owned())))
    }

    fn integer<T: FromStr>(&self, field: usize) -> Result<T, InputError> {
        let text = self.text(field)?;
        let trimmed = text.trim();
        if trimmed.is_empty() {
            return Err(self.error(field, Problem::EmptyValue));
        }
        trimmed
            .parse()
            .map_err(|_| self.error(field, Problem::InvalidInteger(text.to_owned())))
    }

    fn date(&self, field: usize) -> Result<NaiveDate, InputError> {
        let text = self.text(field)?;
        let trimmed = text.trim();
        if trimmed.is_empty() {
            return Err(self.error(field, Problem::EmptyValue));
        }
        NaiveDate::parse_from_str(trimmed, DATE_FORMAT)
            .map_err(|_| self.error(field, Problem::InvalidDate(text.to_owned())))
    }

    fn parse(&self, c: &Columns) -> Result<OrderRow, InputError> {
        let [row_id, order_id, order_date, ship_date, ship_mode, customer_id, segment, country, region, product_id, category, product_name, sales, quantity, discount, profit] =
            c.0;
        Ok(OrderRow {
            line: self.line,
            row_id: self.integer(row_id)?,
            order_id: self.required(order_id)?,
            order_date: self.date(order_date)?,
            ship_date: self.date(ship_date)?,
            ship_mode: self.required(ship_mode)?,
            customer_id: self.required(customer_id)?,
            segment: self.required(segment)?,
            country: self.required(country)?,
            region: self.required(region)?,
            product_id: self.required(product_id)?,
            category: self.required(category)?,
            product_name: self.required(product_name)?,
            sales: self.decimal(sales)?,
            quantity: self.integer(quantity)?,
            discount: self.decimal(discount)?,
            profit: self.decimal(profit)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    const HEADER: &str = "Row ID,Order ID,Order Date,Ship Date,Ship Mode,Customer ID,Segment,Country/Region,City,State/Province,Postal Code,Region,Product ID,Category,Sub-Category,Product Name,Sales,Quantity,Discount,Profit";
    const ROW: &str = "1,US-2019-103800,03/01/19,07/01/19,Standard Class,DP-13000,Consumer,United States,Houston,Texas,77095,Central,OFF-PA-10000174,Office Supplies,Paper,\"Message Book, Wirebound, Four 5 1/2\"\" X 4\"\" Forms/Pg., 200 Dupl. Sets/Book\",16.448,2,0.2,5.5512";

    fn file(name: &str, bytes: &[u8]) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("orders-csv-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(name);
        std::fs::File::create(&path)
            .unwrap()
            .write_all(bytes)
            .unwrap();
        path
    }

    #[test]
    fn reads_bom_crlf_and_quoted_fields() {
        let text = format!("\u{feff}{HEADER}\r\n{ROW}\r\n");
        let rows = read_rows(&file("ok.csv", text.as_bytes())).unwrap();
        assert_eq!(rows.len(), 1);
        let r = &rows[0];
        assert_eq!(r.line, 2);
        assert_eq!(r.row_id, 1);
        assert_eq!(
            r.product_name,
            "Message Book, Wirebound, Four 5 1/2\" X 4\" Forms/Pg., 200 Dupl. Sets/Book"
        );
        assert_eq!(r.sales, Decimal::from_str("16.448").unwrap());
        assert_eq!(r.order_date, NaiveDate::from_ymd_opt(2019, 1, 3).unwrap());
    }

    #[test]
    fn names_line_and_column_of_a_bad_decimal() {
        let bad = ROW.replace("16.448", "1.2.3");
        let text = format!("{HEADER}\r\n{ROW}\r\n{bad}\r\n");
        let path = file("bad-decimal.csv", text.as_bytes());
        let err = read_rows(&path).unwrap_err().to_string();
        assert_eq!(
            err,
            format!(
                "{}:3: column \"Sales\": invalid decimal \"1.2.3\"",
                path.display()
            )
        );
    }

    #[test]
    fn refuses_exponents_and_digit_separators() {
        for bad in ["1e3", "1_000", "NaN", "12,5"] {
            let row = ROW.replace("16.448", &format!("\"{bad}\""));
            let text = format!("{HEADER}\n{row}\n");
            let err = read_rows(&file("exp.csv", text.as_bytes())).unwrap_err();
            assert!(
                matches!(err.problem, Problem::InvalidDecimal(_)),
                "{bad}: {err}"
            );
        }
    }

    #[test]
    fn line_numbers_survive_crlf_blank_lines_and_multiline_fields() {
        let multiline = ROW.replace("Message Book, Wirebound", "Message Book,\r\nWirebound");
        let bad = ROW.replace("0.2", "0.2x");
        // line 1 header, 2 row, 3-4 multiline row, 5 blank, 6 row, 7 bad row
        let text = format!("{HEADER}\r\n{ROW}\r\n{multiline}\r\n\r\n{ROW}\r\n{bad}\r\n");
        let err = read_rows(&file("lines.csv", text.as_bytes()))
            .unwrap_err()
            .to_string();
        assert!(
            err.ends_with(":7: column \"Discount\": invalid decimal \"0.2x\""),
            "{err}"
        );
        let text = format!("{HEADER}\r\n{ROW}\r\n{multiline}\r\n\r\n{ROW}\r\n");
        let rows = read_rows(&file("lines-ok.csv", text.as_bytes())).unwrap();
        let lines: Vec<u64> = rows.iter().map(|r| r.line).collect();
        assert_eq!(lines, [2, 3, 6]);
    }

    #[test]
    fn missing_column_is_named() {
        let header = HEADER.replace(",Profit", "");
        let row = ROW.replace(",5.5512", "");
        let text = format!("{header}\n{row}\n");
        let err = read_rows(&file("missing.csv", text.as_bytes()))
            .unwrap_err()
            .to_string();
        assert!(err.ends_with(":1: missing column \"Profit\""), "{err}");
    }

    #[test]
    fn invalid_utf8_names_line_and_column() {
        let mut bytes = format!("{HEADER}\n").into_bytes();
        let row = ROW.replace("Message Book", "Message B\u{1}ok");
        let mut row = row.into_bytes();
        let pos = row.iter().position(|&b| b == 1).unwrap();
        row[pos] = 0xff;
        bytes.extend_from_slice(&row);
        bytes.push(b'\n');
        let err = read_rows(&file("latin1.csv", &bytes))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(":2: column \"Product Name\": not valid UTF-8"),
            "{err}"
        );
    }

    #[test]
    fn short_record_and_bad_date() {
        let text = format!("{HEADER}\n{ROW}\n1,2,3\n");
        let err = read_rows(&file("short.csv", text.as_bytes()))
            .unwrap_err()
            .to_string();
        assert!(
            err.ends_with(":3: expected 20 fields as in the header, found 3"),
            "{err}"
        );

        let text = format!("{HEADER}\n{}\n", ROW.replace("07/01/19", "31/02/19"));
        let err = read_rows(&file("date.csv", text.as_bytes()))
            .unwrap_err()
            .to_string();
        assert!(
            err.ends_with(
                ":2: column \"Ship Date\": invalid date \"31/02/19\" (expected dd/mm/yy)"
            ),
            "{err}"
        );
    }

    #[test]
    fn missing_file_and_empty_file() {
        let err = read_rows(Path::new("/nonexistent/orders.csv"))
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("/nonexistent/orders.csv: cannot read the file: "),
            "{err}"
        );
        let err = read_rows(&file("empty.csv", b"")).unwrap_err().to_string();
        assert!(err.contains("empty"), "{err}");
    }
}
