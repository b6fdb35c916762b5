-- The control plane (issue 29): runtime tenants and keys, admin tokens, the
-- audit trail, and the version counter every gateway polls. Versions
-- 0001-0099 belong to the control plane, 0100 and up to the spend ledger.
-- Times are UTC microseconds; structured values are JSON text in the
-- config file's own field names.

CREATE TABLE control_version (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    version BIGINT NOT NULL
);
INSERT INTO control_version (id, version) VALUES (1, 0);

CREATE TABLE tenants (
    name TEXT PRIMARY KEY,
    spec TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL
);

CREATE TABLE api_keys (
    tenant TEXT NOT NULL,
    id TEXT NOT NULL,
    alias TEXT,
    owner TEXT NOT NULL,
    limits TEXT NOT NULL,
    allowed_models TEXT NOT NULL,
    expires_at BIGINT,
    revoked_at BIGINT,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL,
    PRIMARY KEY (tenant, id)
);

CREATE TABLE key_secrets (
    sha256 TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    key_id TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    retires_at BIGINT
);
CREATE INDEX key_secrets_by_key ON key_secrets (tenant, key_id);

CREATE TABLE admin_tokens (
    id TEXT PRIMARY KEY,
    sha256 TEXT NOT NULL UNIQUE,
    role TEXT NOT NULL,
    tenant TEXT,
    created_at BIGINT NOT NULL,
    revoked_at BIGINT
);

CREATE TABLE audit (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    at BIGINT NOT NULL,
    actor TEXT NOT NULL,
    action TEXT NOT NULL,
    subject TEXT NOT NULL,
    before_value TEXT,
    after_value TEXT
);
