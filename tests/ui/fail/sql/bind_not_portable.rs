// A `u64` has no portable column type (PostgreSQL has no unsigned integers): binding one is a
// compile error that lists the portable types and the fix.
use event_runtime::Tx;

async fn save(tx: &mut Tx, count: u64) -> Result<u64, event_runtime::StoreError> {
    tx.query("UPDATE counters SET n = $1").bind(count).execute().await
}

fn main() {
    let _ = save;
}
