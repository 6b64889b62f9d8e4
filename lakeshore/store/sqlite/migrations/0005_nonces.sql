-- Signature nonces seen by any replica, kept until their timestamp leaves
-- the accepted clock skew (expires_at, unix milliseconds), so a signed
-- request replayed to another replica is refused.
CREATE TABLE nonces (
    key_id     TEXT NOT NULL,
    nonce      TEXT NOT NULL,
    expires_at BIGINT NOT NULL,
    PRIMARY KEY (key_id, nonce)
);
CREATE INDEX nonces_expires ON nonces (expires_at);
