//! Opening the outbox a command works on: which URL (flag, environment, the application's
//! default), schema and connect timeout. Opens existing outboxes only: must not create or migrate.

use std::time::Duration;

use crate::store::{ConnectOptions, Store, StoreError};

use super::{CliError, StoreOpener, DATABASE_ENV};

/// The database a command names.
pub(super) struct Target<'a> {
    pub(super) database: Option<String>,
    pub(super) schema: Option<String>,
    pub(super) default: Option<&'a str>,
    pub(super) timeout: Duration,
    /// The application's own way to open its store, if it has one.
    pub(super) opener: Option<StoreOpener<'a>>,
}

impl Target<'_> {
    /// Opens the outbox: never creates a file, schema or table and applies no migration, so
    /// that a mistyped URL or schema is an error, not an empty outbox.
    pub(super) async fn connect(&self) -> Result<Store, CliError> {
        let url = match &self.database {
            Some(url) => url.clone(),
            None => match std::env::var(DATABASE_ENV) {
                Ok(url) if !url.is_empty() => url,
                _ => self.default.ok_or(CliError::NoDatabase)?.to_owned(),
            },
        };
        let shown = crate::store::redact(&url);
        let mut options = ConnectOptions::default()
            .create(false)
            .connect_timeout(self.timeout);
        options.schema = self.schema.clone();
        // The store gives up after the timeout itself; this one also bounds what follows the
        // connection (the check that the tables exist) on a server that stops answering.
        let open = match self.opener {
            Some(open) => open(&url, &options),
            None => Box::pin(Store::connect_with(&url, &options)),
        };
        match tokio::time::timeout(self.timeout, open).await {
            Ok(Ok(store)) => Ok(store),
            Ok(Err(source)) => Err(connect_error(shown, source)),
            Err(_) => Err(CliError::ConnectTimeout {
                url: shown,
                secs: self.timeout.as_secs(),
            }),
        }
    }
}

/// Errors that name the URL themselves are shown as they are; the others say which database
/// could not be opened.
fn connect_error(url: String, source: StoreError) -> CliError {
    match source {
        StoreError::UnsupportedUrl { .. }
        | StoreError::UnsupportedOption { .. }
        | StoreError::NoSuchDatabase { .. }
        | StoreError::Unreachable { .. }
        | StoreError::ConnectTimeout { .. }
        | StoreError::NotAnOutbox { .. } => CliError::Store(source),
        source => CliError::Connect { url, source },
    }
}
