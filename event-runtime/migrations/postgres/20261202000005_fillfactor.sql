-- Every delivery row is updated several times (claimed, leased again, completed): leave room on
-- each page so that updates which change no indexed column (a claim sets the lease token and
-- attempts) stay on the page as heap-only tuples, without an entry in each of the table's
-- indexes. Applies to pages written from now on; takes no lock that blocks reads or writes.
ALTER TABLE event_deliveries SET (fillfactor = 70);
