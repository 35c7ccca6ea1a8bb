// A column cannot be read into a type that is not portable, such as `serde_json::Value`.
use event_runtime::Row;

fn read(row: &Row) -> Result<serde_json::Value, event_runtime::StoreError> {
    row.get::<serde_json::Value>("payload")
}

fn main() {
    let _ = read;
}
