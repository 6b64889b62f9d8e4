package cli_test

import (
	"encoding/json"
	"strings"
	"testing"

	"nymph/lakeshore/cli"
	"nymph/lakeshore/operatorapi"
)

// token create / list / revoke against a real control plane.
func TestTokenCreateListRevoke(t *testing.T) {
	cp := newRealCP(t)
	if r := cp.run(runOpts{}, "token", "list"); r.code != 0 || !strings.Contains(r.stdout, "no tokens minted") {
		t.Fatalf("empty list: %+v", r)
	}
	r := cp.run(runOpts{}, "token", "create", "--label", "rig-7", "--json")
	var minted operatorapi.TokenResponse
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &minted) != nil || minted.ID == "" || minted.Token == "" {
		t.Fatalf("create: %+v", r)
	}

	r = cp.run(runOpts{}, "token", "list")
	if r.code != 0 || !strings.Contains(r.stdout, minted.ID) || !strings.Contains(r.stdout, "active") ||
		!strings.Contains(r.stdout, "rig-7") || strings.Contains(r.stdout, minted.Token) {
		t.Fatalf("list: %+v", r)
	}

	r = cp.run(runOpts{}, "token", "revoke", minted.ID)
	if r.code != 0 || r.stdout != "revoked daemon token "+minted.ID+" (rig-7)\n" {
		t.Fatalf("revoke: %+v", r)
	}
	r = cp.run(runOpts{}, "token", "list", "--json")
	var list operatorapi.TokenList
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &list) != nil || len(list.Tokens) != 1 ||
		list.Tokens[0].State != operatorapi.TokenRevoked || list.Tokens[0].RevokedAt == nil {
		t.Fatalf("list --json after revoke: %+v", r)
	}

	if r := cp.run(runOpts{}, "token", "revoke", "01NOSUCHTOKEN"); r.code != cli.ExitError || !strings.Contains(r.stderr, "no such token") {
		t.Fatalf("revoke unknown: %+v", r)
	}
	if r := cp.run(runOpts{}, "token", "revoke"); r.code == 0 || !strings.Contains(r.stderr, "one token id") {
		t.Fatalf("revoke without an id: %+v", r)
	}
}
