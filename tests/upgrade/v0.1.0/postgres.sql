-- A PostgreSQL outbox written by release 0.1.0 (pg_dump --inserts of its schema; `__SCHEMA__`
-- is replaced by the test's schema): completed, pending, leased (by a crashed batch) and
-- dead-lettered deliveries. Do not edit: it is what that release wrote.
CREATE SCHEMA __SCHEMA__;

CREATE TABLE __SCHEMA__._sqlx_migrations (
    version bigint NOT NULL,
    description text NOT NULL,
    installed_on timestamp with time zone DEFAULT now() NOT NULL,
    success boolean NOT NULL,
    checksum bytea NOT NULL,
    execution_time bigint NOT NULL
);

CREATE TABLE __SCHEMA__.event_audit_log (
    id bigint NOT NULL,
    action text NOT NULL,
    actor text NOT NULL,
    reason text NOT NULL,
    at bigint NOT NULL,
    dead_letter_ids text NOT NULL,
    count bigint NOT NULL
);

CREATE SEQUENCE __SCHEMA__.event_audit_log_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;

ALTER SEQUENCE __SCHEMA__.event_audit_log_id_seq OWNED BY __SCHEMA__.event_audit_log.id;

CREATE TABLE __SCHEMA__.event_dead_letters (
    id bigint NOT NULL,
    event_id text NOT NULL,
    handler text NOT NULL,
    name text NOT NULL,
    version bigint NOT NULL,
    envelope text NOT NULL,
    attempts bigint NOT NULL,
    first_failed_at bigint NOT NULL,
    last_failed_at bigint NOT NULL,
    reason text NOT NULL,
    error_chain text NOT NULL,
    dead_at bigint NOT NULL,
    resolved_at bigint,
    resolution text
);

CREATE SEQUENCE __SCHEMA__.event_dead_letters_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;

ALTER SEQUENCE __SCHEMA__.event_dead_letters_id_seq OWNED BY __SCHEMA__.event_dead_letters.id;

CREATE TABLE __SCHEMA__.event_deliveries (
    handler text NOT NULL,
    event_id text NOT NULL,
    aggregate_type text NOT NULL,
    aggregate_id text NOT NULL,
    sequence bigint NOT NULL,
    status text DEFAULT 'pending'::text NOT NULL,
    attempts bigint DEFAULT 0 NOT NULL,
    next_attempt_at bigint NOT NULL,
    lease_token text,
    lease_until bigint,
    created_at bigint NOT NULL,
    first_failed_at bigint,
    last_failed_at bigint,
    last_error text,
    completed_at bigint
)
WITH (autovacuum_analyze_scale_factor='0.02', autovacuum_analyze_threshold='500', autovacuum_vacuum_scale_factor='0.05');

CREATE TABLE __SCHEMA__.event_outbox (
    event_id text NOT NULL,
    name text NOT NULL,
    version bigint NOT NULL,
    aggregate_type text NOT NULL,
    aggregate_id text NOT NULL,
    sequence bigint NOT NULL,
    occurred_at bigint NOT NULL,
    recorded_at bigint NOT NULL,
    envelope text NOT NULL
);

CREATE TABLE __SCHEMA__.upgrade_ledger (
    event_id text NOT NULL,
    account text NOT NULL,
    seq bigint NOT NULL,
    amount bigint NOT NULL
);

ALTER TABLE ONLY __SCHEMA__.event_audit_log ALTER COLUMN id SET DEFAULT nextval('__SCHEMA__.event_audit_log_id_seq'::regclass);

ALTER TABLE ONLY __SCHEMA__.event_dead_letters ALTER COLUMN id SET DEFAULT nextval('__SCHEMA__.event_dead_letters_id_seq'::regclass);

INSERT INTO __SCHEMA__._sqlx_migrations VALUES (20261129000001, 'outbox', '2026-12-01 09:23:02.552437+00', true, '\x910d440b58d0c298d2021ec6d7ce76e1bbf7d2335035601b2b6857372bdf0f0ca6fca69f8531d028c5ac980f1ecd8f40', 9352056);
INSERT INTO __SCHEMA__._sqlx_migrations VALUES (20261129000002, 'autovacuum', '2026-12-01 09:23:02.562558+00', true, '\x6fb8a888ede599c5a973ad222392069c29096c34a99887bae43cf4e7565d4aa44cf90c0d50501cd8bfdaf9a39470ca77', 953830);

INSERT INTO __SCHEMA__.event_dead_letters VALUES (1, '00000000-0000-0001-0000-000000000004', 'upgrade.ledger', 'upgrade.deposited', 1, '{"specversion":"1.0","id":"00000000-0000-0001-0000-000000000004","source":"urn:event-core","type":"upgrade.deposited","subject":"b","time":"2026-11-30T12:00:04Z","datacontenttype":"application/json","schemaversion":1,"aggregatetype":"upgrade","sequence":"00000000000000000001","data":{"account":"b","amount":10,"refuse":true}}', 1, 1796116982578, 1796116982578, 'permanent', '["account frozen"]', 1796116982578, NULL, NULL);

INSERT INTO __SCHEMA__.event_deliveries VALUES ('upgrade.ledger', '00000000-0000-0001-0000-000000000005', 'upgrade', 'b', 2, 'pending', 0, 1796116982571, NULL, NULL, 1796116982571, NULL, NULL, NULL, NULL);
INSERT INTO __SCHEMA__.event_deliveries VALUES ('upgrade.ledger', '00000000-0000-0001-0000-000000000006', 'upgrade', 'b', 3, 'pending', 0, 1796116982571, NULL, NULL, 1796116982571, NULL, NULL, NULL, NULL);
INSERT INTO __SCHEMA__.event_deliveries VALUES ('upgrade.ledger', '00000000-0000-0001-0000-000000000004', 'upgrade', 'b', 1, 'dead', 1, 1796116982571, NULL, NULL, 1796116982571, 1796116982578, 1796116982578, 'account frozen', NULL);
INSERT INTO __SCHEMA__.event_deliveries VALUES ('upgrade.ledger', '00000000-0000-0001-0000-000000000001', 'upgrade', 'a', 1, 'completed', 1, 1796116982569, NULL, NULL, 1796116982569, NULL, NULL, NULL, 1796116982579);
INSERT INTO __SCHEMA__.event_deliveries VALUES ('upgrade.notify', '00000000-0000-0001-0000-000000000001', 'upgrade', 'a', 1, 'completed', 1, 1796116982569, NULL, NULL, 1796116982569, NULL, NULL, NULL, 1796116982579);
INSERT INTO __SCHEMA__.event_deliveries VALUES ('upgrade.ledger', '00000000-0000-0001-0000-000000000002', 'upgrade', 'a', 2, 'completed', 1, 1796116982569, NULL, NULL, 1796116982569, NULL, NULL, NULL, 1796116982582);
INSERT INTO __SCHEMA__.event_deliveries VALUES ('upgrade.notify', '00000000-0000-0001-0000-000000000002', 'upgrade', 'a', 2, 'completed', 1, 1796116982569, NULL, NULL, 1796116982569, NULL, NULL, NULL, 1796116982582);
INSERT INTO __SCHEMA__.event_deliveries VALUES ('upgrade.notify', '00000000-0000-0001-0000-000000000004', 'upgrade', 'b', 1, 'completed', 1, 1796116982571, NULL, NULL, 1796116982571, NULL, NULL, NULL, 1796116982582);
INSERT INTO __SCHEMA__.event_deliveries VALUES ('upgrade.ledger', '00000000-0000-0001-0000-000000000003', 'upgrade', 'a', 3, 'completed', 1, 1796116982569, NULL, NULL, 1796116982569, NULL, NULL, NULL, 1796116982589);
INSERT INTO __SCHEMA__.event_deliveries VALUES ('upgrade.notify', '00000000-0000-0001-0000-000000000003', 'upgrade', 'a', 3, 'completed', 1, 1796116982569, NULL, NULL, 1796116982569, NULL, NULL, NULL, 1796116982589);
INSERT INTO __SCHEMA__.event_deliveries VALUES ('upgrade.notify', '00000000-0000-0001-0000-000000000005', 'upgrade', 'b', 2, 'completed', 1, 1796116982571, NULL, NULL, 1796116982571, NULL, NULL, NULL, 1796116982589);
INSERT INTO __SCHEMA__.event_deliveries VALUES ('upgrade.notify', '00000000-0000-0001-0000-000000000006', 'upgrade', 'b', 3, 'completed', 1, 1796116982571, NULL, NULL, 1796116982571, NULL, NULL, NULL, 1796116982592);
INSERT INTO __SCHEMA__.event_deliveries VALUES ('upgrade.ledger', '00000000-0000-0001-0000-000000000008', 'upgrade', 'c', 2, 'pending', 0, 1796116982594, NULL, NULL, 1796116982594, NULL, NULL, NULL, NULL);
INSERT INTO __SCHEMA__.event_deliveries VALUES ('upgrade.notify', '00000000-0000-0001-0000-000000000008', 'upgrade', 'c', 2, 'pending', 0, 1796116982594, NULL, NULL, 1796116982594, NULL, NULL, NULL, NULL);
INSERT INTO __SCHEMA__.event_deliveries VALUES ('upgrade.ledger', '00000000-0000-0001-0000-000000000009', 'upgrade', 'c', 3, 'pending', 0, 1796116982594, NULL, NULL, 1796116982594, NULL, NULL, NULL, NULL);
INSERT INTO __SCHEMA__.event_deliveries VALUES ('upgrade.notify', '00000000-0000-0001-0000-000000000009', 'upgrade', 'c', 3, 'pending', 0, 1796116982594, NULL, NULL, 1796116982594, NULL, NULL, NULL, NULL);
INSERT INTO __SCHEMA__.event_deliveries VALUES ('upgrade.ledger', '00000000-0000-0001-0000-00000000000a', 'upgrade', 'c', 4, 'pending', 0, 1796116982594, NULL, NULL, 1796116982594, NULL, NULL, NULL, NULL);
INSERT INTO __SCHEMA__.event_deliveries VALUES ('upgrade.notify', '00000000-0000-0001-0000-00000000000a', 'upgrade', 'c', 4, 'pending', 0, 1796116982594, NULL, NULL, 1796116982594, NULL, NULL, NULL, NULL);
INSERT INTO __SCHEMA__.event_deliveries VALUES ('upgrade.notify', '00000000-0000-0001-0000-00000000000b', 'upgrade', 'd', 1, 'pending', 0, 1796116982596, NULL, NULL, 1796116982596, NULL, NULL, NULL, NULL);
INSERT INTO __SCHEMA__.event_deliveries VALUES ('upgrade.ledger', '00000000-0000-0001-0000-00000000000c', 'upgrade', 'd', 2, 'pending', 0, 1796116982596, NULL, NULL, 1796116982596, NULL, NULL, NULL, NULL);
INSERT INTO __SCHEMA__.event_deliveries VALUES ('upgrade.notify', '00000000-0000-0001-0000-00000000000c', 'upgrade', 'd', 2, 'pending', 0, 1796116982596, NULL, NULL, 1796116982596, NULL, NULL, NULL, NULL);
INSERT INTO __SCHEMA__.event_deliveries VALUES ('upgrade.ledger', '00000000-0000-0001-0000-00000000000d', 'upgrade', 'd', 3, 'pending', 0, 1796116982596, NULL, NULL, 1796116982596, NULL, NULL, NULL, NULL);
INSERT INTO __SCHEMA__.event_deliveries VALUES ('upgrade.notify', '00000000-0000-0001-0000-00000000000d', 'upgrade', 'd', 3, 'pending', 0, 1796116982596, NULL, NULL, 1796116982596, NULL, NULL, NULL, NULL);
INSERT INTO __SCHEMA__.event_deliveries VALUES ('upgrade.ledger', '00000000-0000-0001-0000-00000000000e', 'upgrade', 'd', 4, 'pending', 0, 1796116982596, NULL, NULL, 1796116982596, NULL, NULL, NULL, NULL);
INSERT INTO __SCHEMA__.event_deliveries VALUES ('upgrade.notify', '00000000-0000-0001-0000-00000000000e', 'upgrade', 'd', 4, 'pending', 0, 1796116982596, NULL, NULL, 1796116982596, NULL, NULL, NULL, NULL);
INSERT INTO __SCHEMA__.event_deliveries VALUES ('upgrade.ledger', '00000000-0000-0001-0000-000000000007', 'upgrade', 'c', 1, 'pending', 1, 1796116982594, '01a230ea-2b45-70f1-8872-725a547d3303', 1796117012597, 1796116982594, NULL, NULL, NULL, NULL);
INSERT INTO __SCHEMA__.event_deliveries VALUES ('upgrade.notify', '00000000-0000-0001-0000-000000000007', 'upgrade', 'c', 1, 'pending', 1, 1796116982594, '01a230ea-2b45-70f1-8872-725a547d3303', 1796117012597, 1796116982594, NULL, NULL, NULL, NULL);
INSERT INTO __SCHEMA__.event_deliveries VALUES ('upgrade.ledger', '00000000-0000-0001-0000-00000000000b', 'upgrade', 'd', 1, 'pending', 1, 1796116982596, '01a230ea-2b45-70f1-8872-725a547d3303', 1796117012597, 1796116982596, NULL, NULL, NULL, NULL);

INSERT INTO __SCHEMA__.event_outbox VALUES ('00000000-0000-0001-0000-000000000001', 'upgrade.deposited', 1, 'upgrade', 'a', 1, 1796040001000, 1796116982569, '{"specversion":"1.0","id":"00000000-0000-0001-0000-000000000001","source":"urn:event-core","type":"upgrade.deposited","subject":"a","time":"2026-11-30T12:00:01Z","datacontenttype":"application/json","schemaversion":1,"aggregatetype":"upgrade","sequence":"00000000000000000001","data":{"account":"a","amount":10,"refuse":false}}');
INSERT INTO __SCHEMA__.event_outbox VALUES ('00000000-0000-0001-0000-000000000002', 'upgrade.deposited', 1, 'upgrade', 'a', 2, 1796040002000, 1796116982569, '{"specversion":"1.0","id":"00000000-0000-0001-0000-000000000002","source":"urn:event-core","type":"upgrade.deposited","subject":"a","time":"2026-11-30T12:00:02Z","datacontenttype":"application/json","schemaversion":1,"aggregatetype":"upgrade","sequence":"00000000000000000002","data":{"account":"a","amount":20,"refuse":false}}');
INSERT INTO __SCHEMA__.event_outbox VALUES ('00000000-0000-0001-0000-000000000003', 'upgrade.deposited', 1, 'upgrade', 'a', 3, 1796040003000, 1796116982569, '{"specversion":"1.0","id":"00000000-0000-0001-0000-000000000003","source":"urn:event-core","type":"upgrade.deposited","subject":"a","time":"2026-11-30T12:00:03Z","datacontenttype":"application/json","schemaversion":1,"aggregatetype":"upgrade","sequence":"00000000000000000003","data":{"account":"a","amount":30,"refuse":false}}');
INSERT INTO __SCHEMA__.event_outbox VALUES ('00000000-0000-0001-0000-000000000004', 'upgrade.deposited', 1, 'upgrade', 'b', 1, 1796040004000, 1796116982571, '{"specversion":"1.0","id":"00000000-0000-0001-0000-000000000004","source":"urn:event-core","type":"upgrade.deposited","subject":"b","time":"2026-11-30T12:00:04Z","datacontenttype":"application/json","schemaversion":1,"aggregatetype":"upgrade","sequence":"00000000000000000001","data":{"account":"b","amount":10,"refuse":true}}');
INSERT INTO __SCHEMA__.event_outbox VALUES ('00000000-0000-0001-0000-000000000005', 'upgrade.deposited', 1, 'upgrade', 'b', 2, 1796040005000, 1796116982571, '{"specversion":"1.0","id":"00000000-0000-0001-0000-000000000005","source":"urn:event-core","type":"upgrade.deposited","subject":"b","time":"2026-11-30T12:00:05Z","datacontenttype":"application/json","schemaversion":1,"aggregatetype":"upgrade","sequence":"00000000000000000002","data":{"account":"b","amount":20,"refuse":false}}');
INSERT INTO __SCHEMA__.event_outbox VALUES ('00000000-0000-0001-0000-000000000006', 'upgrade.deposited', 1, 'upgrade', 'b', 3, 1796040006000, 1796116982571, '{"specversion":"1.0","id":"00000000-0000-0001-0000-000000000006","source":"urn:event-core","type":"upgrade.deposited","subject":"b","time":"2026-11-30T12:00:06Z","datacontenttype":"application/json","schemaversion":1,"aggregatetype":"upgrade","sequence":"00000000000000000003","data":{"account":"b","amount":30,"refuse":false}}');
INSERT INTO __SCHEMA__.event_outbox VALUES ('00000000-0000-0001-0000-000000000007', 'upgrade.deposited', 1, 'upgrade', 'c', 1, 1796040007000, 1796116982594, '{"specversion":"1.0","id":"00000000-0000-0001-0000-000000000007","source":"urn:event-core","type":"upgrade.deposited","subject":"c","time":"2026-11-30T12:00:07Z","datacontenttype":"application/json","schemaversion":1,"aggregatetype":"upgrade","sequence":"00000000000000000001","data":{"account":"c","amount":101,"refuse":false}}');
INSERT INTO __SCHEMA__.event_outbox VALUES ('00000000-0000-0001-0000-000000000008', 'upgrade.deposited', 1, 'upgrade', 'c', 2, 1796040008000, 1796116982594, '{"specversion":"1.0","id":"00000000-0000-0001-0000-000000000008","source":"urn:event-core","type":"upgrade.deposited","subject":"c","time":"2026-11-30T12:00:08Z","datacontenttype":"application/json","schemaversion":1,"aggregatetype":"upgrade","sequence":"00000000000000000002","data":{"account":"c","amount":102,"refuse":false}}');
INSERT INTO __SCHEMA__.event_outbox VALUES ('00000000-0000-0001-0000-000000000009', 'upgrade.deposited', 1, 'upgrade', 'c', 3, 1796040009000, 1796116982594, '{"specversion":"1.0","id":"00000000-0000-0001-0000-000000000009","source":"urn:event-core","type":"upgrade.deposited","subject":"c","time":"2026-11-30T12:00:09Z","datacontenttype":"application/json","schemaversion":1,"aggregatetype":"upgrade","sequence":"00000000000000000003","data":{"account":"c","amount":103,"refuse":false}}');
INSERT INTO __SCHEMA__.event_outbox VALUES ('00000000-0000-0001-0000-00000000000a', 'upgrade.deposited', 1, 'upgrade', 'c', 4, 1796040010000, 1796116982594, '{"specversion":"1.0","id":"00000000-0000-0001-0000-00000000000a","source":"urn:event-core","type":"upgrade.deposited","subject":"c","time":"2026-11-30T12:00:10Z","datacontenttype":"application/json","schemaversion":1,"aggregatetype":"upgrade","sequence":"00000000000000000004","data":{"account":"c","amount":104,"refuse":false}}');
INSERT INTO __SCHEMA__.event_outbox VALUES ('00000000-0000-0001-0000-00000000000b', 'upgrade.deposited', 1, 'upgrade', 'd', 1, 1796040011000, 1796116982596, '{"specversion":"1.0","id":"00000000-0000-0001-0000-00000000000b","source":"urn:event-core","type":"upgrade.deposited","subject":"d","time":"2026-11-30T12:00:11Z","datacontenttype":"application/json","schemaversion":1,"aggregatetype":"upgrade","sequence":"00000000000000000001","data":{"account":"d","amount":101,"refuse":false}}');
INSERT INTO __SCHEMA__.event_outbox VALUES ('00000000-0000-0001-0000-00000000000c', 'upgrade.deposited', 1, 'upgrade', 'd', 2, 1796040012000, 1796116982596, '{"specversion":"1.0","id":"00000000-0000-0001-0000-00000000000c","source":"urn:event-core","type":"upgrade.deposited","subject":"d","time":"2026-11-30T12:00:12Z","datacontenttype":"application/json","schemaversion":1,"aggregatetype":"upgrade","sequence":"00000000000000000002","data":{"account":"d","amount":102,"refuse":false}}');
INSERT INTO __SCHEMA__.event_outbox VALUES ('00000000-0000-0001-0000-00000000000d', 'upgrade.deposited', 1, 'upgrade', 'd', 3, 1796040013000, 1796116982596, '{"specversion":"1.0","id":"00000000-0000-0001-0000-00000000000d","source":"urn:event-core","type":"upgrade.deposited","subject":"d","time":"2026-11-30T12:00:13Z","datacontenttype":"application/json","schemaversion":1,"aggregatetype":"upgrade","sequence":"00000000000000000003","data":{"account":"d","amount":103,"refuse":false}}');
INSERT INTO __SCHEMA__.event_outbox VALUES ('00000000-0000-0001-0000-00000000000e', 'upgrade.deposited', 1, 'upgrade', 'd', 4, 1796040014000, 1796116982596, '{"specversion":"1.0","id":"00000000-0000-0001-0000-00000000000e","source":"urn:event-core","type":"upgrade.deposited","subject":"d","time":"2026-11-30T12:00:14Z","datacontenttype":"application/json","schemaversion":1,"aggregatetype":"upgrade","sequence":"00000000000000000004","data":{"account":"d","amount":104,"refuse":false}}');

INSERT INTO __SCHEMA__.upgrade_ledger VALUES ('00000000-0000-0001-0000-000000000001', 'a', 1, 10);
INSERT INTO __SCHEMA__.upgrade_ledger VALUES ('00000000-0000-0001-0000-000000000002', 'a', 2, 20);
INSERT INTO __SCHEMA__.upgrade_ledger VALUES ('00000000-0000-0001-0000-000000000003', 'a', 3, 30);

SELECT pg_catalog.setval('__SCHEMA__.event_audit_log_id_seq', 1, false);

SELECT pg_catalog.setval('__SCHEMA__.event_dead_letters_id_seq', 1, true);

ALTER TABLE ONLY __SCHEMA__._sqlx_migrations
    ADD CONSTRAINT _sqlx_migrations_pkey PRIMARY KEY (version);

ALTER TABLE ONLY __SCHEMA__.event_audit_log
    ADD CONSTRAINT event_audit_log_pkey PRIMARY KEY (id);

ALTER TABLE ONLY __SCHEMA__.event_dead_letters
    ADD CONSTRAINT event_dead_letters_pkey PRIMARY KEY (id);

ALTER TABLE ONLY __SCHEMA__.event_deliveries
    ADD CONSTRAINT event_deliveries_pkey PRIMARY KEY (handler, event_id);

ALTER TABLE ONLY __SCHEMA__.event_outbox
    ADD CONSTRAINT event_outbox_pkey PRIMARY KEY (event_id);

CREATE INDEX event_dead_letters_open ON __SCHEMA__.event_dead_letters USING btree (dead_at) WHERE (resolved_at IS NULL);

CREATE INDEX event_deliveries_aggregate ON __SCHEMA__.event_deliveries USING btree (handler, aggregate_type, aggregate_id, sequence) WHERE (status = ANY (ARRAY['pending'::text, 'dead'::text]));

CREATE INDEX event_deliveries_completed ON __SCHEMA__.event_deliveries USING btree (completed_at) WHERE (status = 'completed'::text);

CREATE INDEX event_deliveries_due ON __SCHEMA__.event_deliveries USING btree (next_attempt_at) WHERE (status = 'pending'::text);

CREATE INDEX event_deliveries_lease ON __SCHEMA__.event_deliveries USING btree (lease_token) WHERE (lease_token IS NOT NULL);

CREATE UNIQUE INDEX event_outbox_aggregate_sequence ON __SCHEMA__.event_outbox USING btree (aggregate_type, aggregate_id, sequence) WHERE (sequence > 0);

ALTER TABLE ONLY __SCHEMA__.event_deliveries
    ADD CONSTRAINT event_deliveries_event_id_fkey FOREIGN KEY (event_id) REFERENCES __SCHEMA__.event_outbox(event_id);
