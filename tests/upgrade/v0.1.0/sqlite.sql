-- An SQLite outbox written by release 0.1.0 (sqlite3 .dump): completed, pending, leased (by a
-- crashed batch) and dead-lettered deliveries. Do not edit: it is what that release wrote.
PRAGMA foreign_keys=OFF;
BEGIN TRANSACTION;
CREATE TABLE _sqlx_migrations (
    version BIGINT PRIMARY KEY,
    description TEXT NOT NULL,
    installed_on TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP,
    success BOOLEAN NOT NULL,
    checksum BLOB NOT NULL,
    execution_time BIGINT NOT NULL
);
INSERT INTO _sqlx_migrations VALUES(20261129000001,'outbox','2026-12-01 09:23:02',1,X'95931b16c89da5c0cf39fd2bcdaf3a10784980b86e98216639fc6dc643e046f46b1a76e9507b72757de5f307f1d5f5bb',770455);
CREATE TABLE event_outbox (
    event_id        TEXT    PRIMARY KEY NOT NULL,
    name            TEXT    NOT NULL,
    version         INTEGER NOT NULL,
    aggregate_type  TEXT    NOT NULL,
    aggregate_id    TEXT    NOT NULL,
    sequence        INTEGER NOT NULL,
    occurred_at     INTEGER NOT NULL,
    recorded_at     INTEGER NOT NULL,
    envelope        TEXT    NOT NULL
);
INSERT INTO event_outbox VALUES('00000000-0000-0001-0000-000000000001','upgrade.deposited',1,'upgrade','a',1,1796040001000,1796116982531,'{"specversion":"1.0","id":"00000000-0000-0001-0000-000000000001","source":"urn:event-core","type":"upgrade.deposited","subject":"a","time":"2026-11-30T12:00:01Z","datacontenttype":"application/json","schemaversion":1,"aggregatetype":"upgrade","sequence":"00000000000000000001","data":{"account":"a","amount":10,"refuse":false}}');
INSERT INTO event_outbox VALUES('00000000-0000-0001-0000-000000000002','upgrade.deposited',1,'upgrade','a',2,1796040002000,1796116982531,'{"specversion":"1.0","id":"00000000-0000-0001-0000-000000000002","source":"urn:event-core","type":"upgrade.deposited","subject":"a","time":"2026-11-30T12:00:02Z","datacontenttype":"application/json","schemaversion":1,"aggregatetype":"upgrade","sequence":"00000000000000000002","data":{"account":"a","amount":20,"refuse":false}}');
INSERT INTO event_outbox VALUES('00000000-0000-0001-0000-000000000003','upgrade.deposited',1,'upgrade','a',3,1796040003000,1796116982531,'{"specversion":"1.0","id":"00000000-0000-0001-0000-000000000003","source":"urn:event-core","type":"upgrade.deposited","subject":"a","time":"2026-11-30T12:00:03Z","datacontenttype":"application/json","schemaversion":1,"aggregatetype":"upgrade","sequence":"00000000000000000003","data":{"account":"a","amount":30,"refuse":false}}');
INSERT INTO event_outbox VALUES('00000000-0000-0001-0000-000000000004','upgrade.deposited',1,'upgrade','b',1,1796040004000,1796116982532,'{"specversion":"1.0","id":"00000000-0000-0001-0000-000000000004","source":"urn:event-core","type":"upgrade.deposited","subject":"b","time":"2026-11-30T12:00:04Z","datacontenttype":"application/json","schemaversion":1,"aggregatetype":"upgrade","sequence":"00000000000000000001","data":{"account":"b","amount":10,"refuse":true}}');
INSERT INTO event_outbox VALUES('00000000-0000-0001-0000-000000000005','upgrade.deposited',1,'upgrade','b',2,1796040005000,1796116982532,'{"specversion":"1.0","id":"00000000-0000-0001-0000-000000000005","source":"urn:event-core","type":"upgrade.deposited","subject":"b","time":"2026-11-30T12:00:05Z","datacontenttype":"application/json","schemaversion":1,"aggregatetype":"upgrade","sequence":"00000000000000000002","data":{"account":"b","amount":20,"refuse":false}}');
INSERT INTO event_outbox VALUES('00000000-0000-0001-0000-000000000006','upgrade.deposited',1,'upgrade','b',3,1796040006000,1796116982532,'{"specversion":"1.0","id":"00000000-0000-0001-0000-000000000006","source":"urn:event-core","type":"upgrade.deposited","subject":"b","time":"2026-11-30T12:00:06Z","datacontenttype":"application/json","schemaversion":1,"aggregatetype":"upgrade","sequence":"00000000000000000003","data":{"account":"b","amount":30,"refuse":false}}');
INSERT INTO event_outbox VALUES('00000000-0000-0001-0000-000000000007','upgrade.deposited',1,'upgrade','c',1,1796040007000,1796116982537,'{"specversion":"1.0","id":"00000000-0000-0001-0000-000000000007","source":"urn:event-core","type":"upgrade.deposited","subject":"c","time":"2026-11-30T12:00:07Z","datacontenttype":"application/json","schemaversion":1,"aggregatetype":"upgrade","sequence":"00000000000000000001","data":{"account":"c","amount":101,"refuse":false}}');
INSERT INTO event_outbox VALUES('00000000-0000-0001-0000-000000000008','upgrade.deposited',1,'upgrade','c',2,1796040008000,1796116982537,'{"specversion":"1.0","id":"00000000-0000-0001-0000-000000000008","source":"urn:event-core","type":"upgrade.deposited","subject":"c","time":"2026-11-30T12:00:08Z","datacontenttype":"application/json","schemaversion":1,"aggregatetype":"upgrade","sequence":"00000000000000000002","data":{"account":"c","amount":102,"refuse":false}}');
INSERT INTO event_outbox VALUES('00000000-0000-0001-0000-000000000009','upgrade.deposited',1,'upgrade','c',3,1796040009000,1796116982537,'{"specversion":"1.0","id":"00000000-0000-0001-0000-000000000009","source":"urn:event-core","type":"upgrade.deposited","subject":"c","time":"2026-11-30T12:00:09Z","datacontenttype":"application/json","schemaversion":1,"aggregatetype":"upgrade","sequence":"00000000000000000003","data":{"account":"c","amount":103,"refuse":false}}');
INSERT INTO event_outbox VALUES('00000000-0000-0001-0000-00000000000a','upgrade.deposited',1,'upgrade','c',4,1796040010000,1796116982537,'{"specversion":"1.0","id":"00000000-0000-0001-0000-00000000000a","source":"urn:event-core","type":"upgrade.deposited","subject":"c","time":"2026-11-30T12:00:10Z","datacontenttype":"application/json","schemaversion":1,"aggregatetype":"upgrade","sequence":"00000000000000000004","data":{"account":"c","amount":104,"refuse":false}}');
INSERT INTO event_outbox VALUES('00000000-0000-0001-0000-00000000000b','upgrade.deposited',1,'upgrade','d',1,1796040011000,1796116982538,'{"specversion":"1.0","id":"00000000-0000-0001-0000-00000000000b","source":"urn:event-core","type":"upgrade.deposited","subject":"d","time":"2026-11-30T12:00:11Z","datacontenttype":"application/json","schemaversion":1,"aggregatetype":"upgrade","sequence":"00000000000000000001","data":{"account":"d","amount":101,"refuse":false}}');
INSERT INTO event_outbox VALUES('00000000-0000-0001-0000-00000000000c','upgrade.deposited',1,'upgrade','d',2,1796040012000,1796116982538,'{"specversion":"1.0","id":"00000000-0000-0001-0000-00000000000c","source":"urn:event-core","type":"upgrade.deposited","subject":"d","time":"2026-11-30T12:00:12Z","datacontenttype":"application/json","schemaversion":1,"aggregatetype":"upgrade","sequence":"00000000000000000002","data":{"account":"d","amount":102,"refuse":false}}');
INSERT INTO event_outbox VALUES('00000000-0000-0001-0000-00000000000d','upgrade.deposited',1,'upgrade','d',3,1796040013000,1796116982538,'{"specversion":"1.0","id":"00000000-0000-0001-0000-00000000000d","source":"urn:event-core","type":"upgrade.deposited","subject":"d","time":"2026-11-30T12:00:13Z","datacontenttype":"application/json","schemaversion":1,"aggregatetype":"upgrade","sequence":"00000000000000000003","data":{"account":"d","amount":103,"refuse":false}}');
INSERT INTO event_outbox VALUES('00000000-0000-0001-0000-00000000000e','upgrade.deposited',1,'upgrade','d',4,1796040014000,1796116982538,'{"specversion":"1.0","id":"00000000-0000-0001-0000-00000000000e","source":"urn:event-core","type":"upgrade.deposited","subject":"d","time":"2026-11-30T12:00:14Z","datacontenttype":"application/json","schemaversion":1,"aggregatetype":"upgrade","sequence":"00000000000000000004","data":{"account":"d","amount":104,"refuse":false}}');
CREATE TABLE event_deliveries (
    handler          TEXT    NOT NULL,
    event_id         TEXT    NOT NULL REFERENCES event_outbox (event_id),
    aggregate_type   TEXT    NOT NULL,
    aggregate_id     TEXT    NOT NULL,
    sequence         INTEGER NOT NULL,
    status           TEXT    NOT NULL DEFAULT 'pending',
    attempts         INTEGER NOT NULL DEFAULT 0,
    next_attempt_at  INTEGER NOT NULL,
    lease_token      TEXT,
    lease_until      INTEGER,
    created_at       INTEGER NOT NULL,
    first_failed_at  INTEGER,
    last_failed_at   INTEGER,
    last_error       TEXT,
    completed_at     INTEGER,
    PRIMARY KEY (handler, event_id)
);
INSERT INTO event_deliveries VALUES('upgrade.ledger','00000000-0000-0001-0000-000000000001','upgrade','a',1,'completed',1,1796116982531,NULL,NULL,1796116982531,NULL,NULL,NULL,1796116982534);
INSERT INTO event_deliveries VALUES('upgrade.notify','00000000-0000-0001-0000-000000000001','upgrade','a',1,'completed',1,1796116982531,NULL,NULL,1796116982531,NULL,NULL,NULL,1796116982534);
INSERT INTO event_deliveries VALUES('upgrade.ledger','00000000-0000-0001-0000-000000000002','upgrade','a',2,'completed',1,1796116982531,NULL,NULL,1796116982531,NULL,NULL,NULL,1796116982535);
INSERT INTO event_deliveries VALUES('upgrade.notify','00000000-0000-0001-0000-000000000002','upgrade','a',2,'completed',1,1796116982531,NULL,NULL,1796116982531,NULL,NULL,NULL,1796116982535);
INSERT INTO event_deliveries VALUES('upgrade.ledger','00000000-0000-0001-0000-000000000003','upgrade','a',3,'completed',1,1796116982531,NULL,NULL,1796116982531,NULL,NULL,NULL,1796116982536);
INSERT INTO event_deliveries VALUES('upgrade.notify','00000000-0000-0001-0000-000000000003','upgrade','a',3,'completed',1,1796116982531,NULL,NULL,1796116982531,NULL,NULL,NULL,1796116982536);
INSERT INTO event_deliveries VALUES('upgrade.ledger','00000000-0000-0001-0000-000000000004','upgrade','b',1,'dead',1,1796116982532,NULL,NULL,1796116982532,1796116982534,1796116982534,'account frozen',NULL);
INSERT INTO event_deliveries VALUES('upgrade.notify','00000000-0000-0001-0000-000000000004','upgrade','b',1,'completed',1,1796116982532,NULL,NULL,1796116982532,NULL,NULL,NULL,1796116982535);
INSERT INTO event_deliveries VALUES('upgrade.ledger','00000000-0000-0001-0000-000000000005','upgrade','b',2,'pending',0,1796116982532,NULL,NULL,1796116982532,NULL,NULL,NULL,NULL);
INSERT INTO event_deliveries VALUES('upgrade.notify','00000000-0000-0001-0000-000000000005','upgrade','b',2,'completed',1,1796116982532,NULL,NULL,1796116982532,NULL,NULL,NULL,1796116982536);
INSERT INTO event_deliveries VALUES('upgrade.ledger','00000000-0000-0001-0000-000000000006','upgrade','b',3,'pending',0,1796116982532,NULL,NULL,1796116982532,NULL,NULL,NULL,NULL);
INSERT INTO event_deliveries VALUES('upgrade.notify','00000000-0000-0001-0000-000000000006','upgrade','b',3,'completed',1,1796116982532,NULL,NULL,1796116982532,NULL,NULL,NULL,1796116982537);
INSERT INTO event_deliveries VALUES('upgrade.ledger','00000000-0000-0001-0000-000000000007','upgrade','c',1,'pending',1,1796116982537,'01a230ea-2b0a-74dc-bf43-a79d76e250cd',1796117012538,1796116982537,NULL,NULL,NULL,NULL);
INSERT INTO event_deliveries VALUES('upgrade.notify','00000000-0000-0001-0000-000000000007','upgrade','c',1,'pending',1,1796116982537,'01a230ea-2b0a-74dc-bf43-a79d76e250cd',1796117012538,1796116982537,NULL,NULL,NULL,NULL);
INSERT INTO event_deliveries VALUES('upgrade.ledger','00000000-0000-0001-0000-000000000008','upgrade','c',2,'pending',0,1796116982537,NULL,NULL,1796116982537,NULL,NULL,NULL,NULL);
INSERT INTO event_deliveries VALUES('upgrade.notify','00000000-0000-0001-0000-000000000008','upgrade','c',2,'pending',0,1796116982537,NULL,NULL,1796116982537,NULL,NULL,NULL,NULL);
INSERT INTO event_deliveries VALUES('upgrade.ledger','00000000-0000-0001-0000-000000000009','upgrade','c',3,'pending',0,1796116982537,NULL,NULL,1796116982537,NULL,NULL,NULL,NULL);
INSERT INTO event_deliveries VALUES('upgrade.notify','00000000-0000-0001-0000-000000000009','upgrade','c',3,'pending',0,1796116982537,NULL,NULL,1796116982537,NULL,NULL,NULL,NULL);
INSERT INTO event_deliveries VALUES('upgrade.ledger','00000000-0000-0001-0000-00000000000a','upgrade','c',4,'pending',0,1796116982537,NULL,NULL,1796116982537,NULL,NULL,NULL,NULL);
INSERT INTO event_deliveries VALUES('upgrade.notify','00000000-0000-0001-0000-00000000000a','upgrade','c',4,'pending',0,1796116982537,NULL,NULL,1796116982537,NULL,NULL,NULL,NULL);
INSERT INTO event_deliveries VALUES('upgrade.ledger','00000000-0000-0001-0000-00000000000b','upgrade','d',1,'pending',1,1796116982538,'01a230ea-2b0a-74dc-bf43-a79d76e250cd',1796117012538,1796116982538,NULL,NULL,NULL,NULL);
INSERT INTO event_deliveries VALUES('upgrade.notify','00000000-0000-0001-0000-00000000000b','upgrade','d',1,'pending',0,1796116982538,NULL,NULL,1796116982538,NULL,NULL,NULL,NULL);
INSERT INTO event_deliveries VALUES('upgrade.ledger','00000000-0000-0001-0000-00000000000c','upgrade','d',2,'pending',0,1796116982538,NULL,NULL,1796116982538,NULL,NULL,NULL,NULL);
INSERT INTO event_deliveries VALUES('upgrade.notify','00000000-0000-0001-0000-00000000000c','upgrade','d',2,'pending',0,1796116982538,NULL,NULL,1796116982538,NULL,NULL,NULL,NULL);
INSERT INTO event_deliveries VALUES('upgrade.ledger','00000000-0000-0001-0000-00000000000d','upgrade','d',3,'pending',0,1796116982538,NULL,NULL,1796116982538,NULL,NULL,NULL,NULL);
INSERT INTO event_deliveries VALUES('upgrade.notify','00000000-0000-0001-0000-00000000000d','upgrade','d',3,'pending',0,1796116982538,NULL,NULL,1796116982538,NULL,NULL,NULL,NULL);
INSERT INTO event_deliveries VALUES('upgrade.ledger','00000000-0000-0001-0000-00000000000e','upgrade','d',4,'pending',0,1796116982538,NULL,NULL,1796116982538,NULL,NULL,NULL,NULL);
INSERT INTO event_deliveries VALUES('upgrade.notify','00000000-0000-0001-0000-00000000000e','upgrade','d',4,'pending',0,1796116982538,NULL,NULL,1796116982538,NULL,NULL,NULL,NULL);
CREATE TABLE event_dead_letters (
    id               INTEGER PRIMARY KEY AUTOINCREMENT,
    event_id         TEXT    NOT NULL,
    handler          TEXT    NOT NULL,
    name             TEXT    NOT NULL,
    version          INTEGER NOT NULL,
    envelope         TEXT    NOT NULL,
    attempts         INTEGER NOT NULL,
    first_failed_at  INTEGER NOT NULL,
    last_failed_at   INTEGER NOT NULL,
    reason           TEXT    NOT NULL,
    error_chain      TEXT    NOT NULL,
    dead_at          INTEGER NOT NULL,
    resolved_at      INTEGER,
    resolution       TEXT
);
INSERT INTO event_dead_letters VALUES(1,'00000000-0000-0001-0000-000000000004','upgrade.ledger','upgrade.deposited',1,'{"specversion":"1.0","id":"00000000-0000-0001-0000-000000000004","source":"urn:event-core","type":"upgrade.deposited","subject":"b","time":"2026-11-30T12:00:04Z","datacontenttype":"application/json","schemaversion":1,"aggregatetype":"upgrade","sequence":"00000000000000000001","data":{"account":"b","amount":10,"refuse":true}}',1,1796116982534,1796116982534,'permanent','["account frozen"]',1796116982534,NULL,NULL);
CREATE TABLE event_audit_log (
    id               INTEGER PRIMARY KEY AUTOINCREMENT,
    action           TEXT    NOT NULL,
    actor            TEXT    NOT NULL,
    reason           TEXT    NOT NULL,
    at               INTEGER NOT NULL,
    dead_letter_ids  TEXT    NOT NULL,
    count            INTEGER NOT NULL
);
CREATE TABLE upgrade_ledger (event_id TEXT NOT NULL, account TEXT NOT NULL, seq BIGINT NOT NULL, amount BIGINT NOT NULL);
INSERT INTO upgrade_ledger VALUES('00000000-0000-0001-0000-000000000001','a',1,10);
INSERT INTO upgrade_ledger VALUES('00000000-0000-0001-0000-000000000002','a',2,20);
INSERT INTO upgrade_ledger VALUES('00000000-0000-0001-0000-000000000003','a',3,30);
DELETE FROM sqlite_sequence;
INSERT INTO sqlite_sequence VALUES('event_dead_letters',1);
CREATE UNIQUE INDEX event_outbox_aggregate_sequence
    ON event_outbox (aggregate_type, aggregate_id, sequence) WHERE sequence > 0;
CREATE INDEX event_deliveries_due ON event_deliveries (next_attempt_at) WHERE status = 'pending';
CREATE INDEX event_deliveries_aggregate
    ON event_deliveries (handler, aggregate_type, aggregate_id, sequence)
    WHERE status IN ('pending', 'dead');
CREATE INDEX event_deliveries_lease ON event_deliveries (lease_token) WHERE lease_token IS NOT NULL;
CREATE INDEX event_deliveries_completed ON event_deliveries (completed_at) WHERE status = 'completed';
CREATE INDEX event_dead_letters_open ON event_dead_letters (dead_at) WHERE resolved_at IS NULL;
COMMIT;
