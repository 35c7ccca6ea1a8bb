-- Outbox schema v7 (sqlite): groups of inbox instances sharing the partitions of a stream.
-- Only adds: a release that does not know these tables keeps working beside them.

-- One row per instance of a group: its lease, renewed every quarter of the lease period.
-- An instance whose lease expired is not counted when partitions are assigned; its row is
-- deleted when it leaves, or by another instance once it has been expired for ten leases.
CREATE TABLE event_inbox_members (
    group_name   TEXT    NOT NULL,
    member       TEXT    NOT NULL,
    started_at   BIGINT  NOT NULL,
    renewed_at   BIGINT  NOT NULL,
    expires_at   BIGINT  NOT NULL,
    PRIMARY KEY (group_name, member)
);

-- One row per partition a group has consumed: which instance holds it (NULL: released) and
-- until when. An instance consumes a partition only while it holds it; another takes it
-- once it was released or its lease expired.
CREATE TABLE event_inbox_partitions (
    group_name    TEXT    NOT NULL,
    partition_no  BIGINT  NOT NULL,
    owner         TEXT,
    taken_at      BIGINT  NOT NULL,
    expires_at    BIGINT  NOT NULL,
    PRIMARY KEY (group_name, partition_no)
);
