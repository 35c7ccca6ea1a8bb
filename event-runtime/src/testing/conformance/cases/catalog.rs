//! The catalog table: recording replaces the row of the same (name, version) and keeps the
//! others; reading gives them back by name then version, with their sensitive fields and
//! schema.

use super::Case;
use crate::CatalogRecord;

pub async fn the_catalog_is_recorded_by_name_and_version_and_replaced(db: &Case) {
    let store = db.open().await;
    assert!(store.catalog().await.unwrap().is_empty());
    let schema = serde_json::json!({"type": "object", "properties": {"email": {"type": "string", "x-sensitive": true}}});
    store
        .record_catalog(&[
            CatalogRecord::new("b.one", 1, "app::B", vec![], None),
            CatalogRecord::new(
                "a.one",
                2,
                "app::A2",
                vec!["email".into()],
                Some(schema.clone()),
            ),
            CatalogRecord::new("a.one", 1, "app::A1", vec![], None),
        ])
        .await
        .unwrap();
    // Another service's record of the same type replaces it; the others stay.
    store
        .record_catalog(&[CatalogRecord::new(
            "b.one",
            1,
            "other::B",
            vec!["phone".into(), "name".into()],
            None,
        )])
        .await
        .unwrap();
    let read = store.catalog().await.unwrap();
    let keys: Vec<_> = read
        .iter()
        .map(|r| (r.name.as_str(), r.version, r.rust_type.as_str()))
        .collect();
    assert_eq!(
        keys,
        [
            ("a.one", 1, "app::A1"),
            ("a.one", 2, "app::A2"),
            ("b.one", 1, "other::B")
        ]
    );
    assert_eq!(read[1].sensitive, ["email"]);
    assert_eq!(read[1].schema.as_ref(), Some(&schema));
    assert_eq!(read[2].sensitive, ["phone", "name"]);
    assert!(read.iter().all(|r| r.recorded_at.is_some()));
    store.close().await;
}
