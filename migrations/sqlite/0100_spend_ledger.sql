-- The spend ledger (src/ledger/, docs/LEDGER.md): one row per settled or
-- voided reservation; the primary key makes a retried settlement one row.
CREATE TABLE spend_ledger (
    reservation_id     TEXT    NOT NULL PRIMARY KEY,
    at_micros          BIGINT  NOT NULL,
    day                BIGINT  NOT NULL,
    tenant             TEXT    NOT NULL,
    ancestor_1         TEXT,
    ancestor_2         TEXT,
    ancestor_3         TEXT,
    ancestor_4         TEXT,
    key_id             TEXT    NOT NULL,
    end_user           TEXT    NOT NULL,
    model              TEXT    NOT NULL,
    deployment         TEXT    NOT NULL,
    dialect            TEXT    NOT NULL,
    input_tokens       BIGINT  NOT NULL,
    cached_read_tokens BIGINT  NOT NULL,
    cache_write_tokens BIGINT  NOT NULL,
    output_tokens      BIGINT  NOT NULL,
    reasoning_tokens   BIGINT  NOT NULL,
    charged_tokens     BIGINT  NOT NULL,
    cost_micros        BIGINT  NOT NULL,
    outcome            TEXT    NOT NULL,
    price_version      TEXT    NOT NULL
);
CREATE INDEX spend_ledger_at ON spend_ledger (at_micros);
CREATE INDEX spend_ledger_day_tenant ON spend_ledger (day, tenant);
