package sqlstore

import "testing"

// A statement's operation is its verb and first table, whatever its
// layout, arguments or subqueries: a label with as many values as the
// schema has tables.
func TestOpName(t *testing.T) {
	for q, want := range map[string]string{
		"SELECT id FROM workers WHERE id = ?":                           "select_workers",
		"\n\t\tselect a, b\n FROM commands c JOIN workers w ON 1=1":     "select_commands",
		"INSERT INTO nonces(key_id, nonce) VALUES (?, ?)":               "insert_nonces",
		"UPDATE workers SET last_seen_at = ?":                           "update_workers",
		"DELETE FROM commands WHERE worker_id = ?":                      "delete_commands",
		"WITH x AS (SELECT id FROM invocations) UPDATE invocations SET": "select_invocations",
		"SELECT COUNT(*) FROM (SELECT 1)":                               "select",
		"SELECT 1":                                                      "select",
		"BEGIN":                                                         "begin",
		"":                                                              "unknown",
		pipelineOp:                                                      "pipeline",
	} {
		if got := opName(q); got != want {
			t.Errorf("opName(%q) = %q, want %q", q, got, want)
		}
	}
}
