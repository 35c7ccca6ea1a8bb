//! The optional capabilities of a store's backend, reached from [`Store`]: each accessor
//! returns `None` when the backend does not offer it (see
//! [`store::backend`](super::backend)), and the operations built on it then fail with
//! [`StoreError::Unsupported`] naming the capability.

use super::backend::{
    DeadLetterOperations, DestinationOperations, Inspection, OperationLog, PartitionLeases,
};
use super::{Store, StoreError};

impl Store {
    /// Reading dead letters, the audit log and pending envelopes, if the backend offers it
    /// (SQLite and PostgreSQL do).
    pub fn inspection(&self) -> Option<&dyn Inspection> {
        self.backend.inspection()
    }

    /// Replaying and purging dead letters, if the backend offers it (SQLite and PostgreSQL do).
    pub fn dead_letter_operations(&self) -> Option<&dyn DeadLetterOperations> {
        self.backend.dead_letter_operations()
    }

    /// Audited pauses, purge, re-target and re-publish of a destination, if the backend
    /// offers them (SQLite and PostgreSQL do).
    pub fn destination_operations(&self) -> Option<&dyn DestinationOperations> {
        self.backend.destination_operations()
    }

    /// Audit rows of paged operations, if the backend offers them (SQLite and PostgreSQL do).
    pub fn operation_log(&self) -> Option<&dyn OperationLog> {
        self.backend.operation_log()
    }

    /// Partition leases of transport instance groups, if the backend offers them (SQLite and
    /// PostgreSQL do).
    pub fn partition_leases(&self) -> Option<&dyn PartitionLeases> {
        self.backend.partition_leases()
    }

    /// `found`, or [`StoreError::Unsupported`] naming `capability`.
    pub(crate) fn require<'a, T: ?Sized>(
        &self,
        found: Option<&'a T>,
        capability: &'static str,
    ) -> Result<&'a T, StoreError> {
        found.ok_or(StoreError::Unsupported {
            backend: self.backend.name(),
            capability,
        })
    }

    pub(crate) fn inspecting(&self) -> Result<&dyn Inspection, StoreError> {
        self.require(self.inspection(), "Inspection")
    }

    pub(crate) fn resolving(&self) -> Result<&dyn DeadLetterOperations, StoreError> {
        self.require(self.dead_letter_operations(), "DeadLetterOperations")
    }

    pub(crate) fn operating(&self) -> Result<&dyn DestinationOperations, StoreError> {
        self.require(self.destination_operations(), "DestinationOperations")
    }

    pub(crate) fn logging(&self) -> Result<&dyn OperationLog, StoreError> {
        self.require(self.operation_log(), "OperationLog")
    }

    pub(crate) fn leasing(&self) -> Result<&dyn PartitionLeases, StoreError> {
        self.require(self.partition_leases(), "PartitionLeases")
    }
}
