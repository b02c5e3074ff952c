package main

import (
	"bytes"
	"compress/gzip"
	"math/big"
	"strings"
	"testing"
	"time"

	"github.com/meshca/meshca/keymgr"
)

// TestReadAuditLog: the reader keeps the issued certificates of meshca's
// events only, counts every line it cannot read and names the first of
// them, skips a line past its bound without holding it, reads gzip, and
// fails only when nothing at all is JSON.
func TestReadAuditLog(t *testing.T) {
	now := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	good := issuedLine("9c1e0a", strings.Repeat("ab", 32), "node-a", "node-a", "spiffe://cluster.local/ns/a/sa/b", now, now.Add(time.Hour))
	denied := strings.Replace(good, `"decision":"issued"`, `"decision":"denied"`, 1)
	rotation := `{"audit":true,"event":"rotation","decision":"taken","serial":"ff"}`
	opLog := `{"time":"2026-12-06T12:00:00Z","level":"INFO","msg":"CA state in service"}`
	noSerial := strings.Replace(good, `"serial":"9c1e0a"`, `"serial":"zz"`, 1)
	tests := []struct {
		name    string
		in      []byte
		found   int
		broken  int
		shown   []int
		nodes   int
		wantErr string
	}{
		{name: "events and other logs", in: lines(good, opLog, denied, rotation, "", good), found: 2, nodes: 1},
		{name: "broken lines", in: lines("garbage", good, "{not json", noSerial, `["an array"]`), found: 1, broken: 4, shown: []int{1, 3, 4, 5}, nodes: 1},
		{name: "a line past the bound", in: lines(good, `{"pad":"`+strings.Repeat("x", maxAuditLine)+`"}`, good), found: 2, broken: 1, shown: []int{2}, nodes: 1},
		{name: "many broken lines: the first ten named", in: lines(append(repeat("x", 15), good)...), found: 1, broken: 15, shown: []int{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, nodes: 1},
		{name: "gzip", in: gzipped(t, lines(good, "garbage", good)), found: 2, broken: 1, shown: []int{2}, nodes: 1},
		{name: "CRLF and no final newline", in: []byte(good + "\r\n" + good), found: 2, nodes: 1},
		{name: "empty", in: nil},
		{name: "nothing is JSON", in: lines("a", "b"), broken: 2, wantErr: "none of its 2 lines is a JSON object (broken: lines 1, 2)"},
		{name: "bad gzip", in: []byte{0x1f, 0x8b, 0, 0}, wantErr: "gzip"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var found []*issuance
			scan, err := readAuditLog(bytes.NewReader(tt.in), func(c *issuance) { found = append(found, c) })
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(found) != tt.found || scan.Broken != tt.broken || len(scan.Nodes) != tt.nodes || !equalInts(scan.BrokenAt, tt.shown) {
				t.Fatalf("found %d broken %d at %v nodes %v; want %d %d %v %d", len(found), scan.Broken, scan.BrokenAt, scan.Nodes, tt.found, tt.broken, tt.shown, tt.nodes)
			}
			for _, c := range found {
				if c.Serial.Cmp(big.NewInt(0x9c1e0a)) != 0 || c.ProxyNode != "node-a" || !c.NotAfter.Equal(now.Add(time.Hour)) || !c.throughNode("node-a") {
					t.Errorf("found %+v", c)
				}
			}
		})
	}
}

func lines(ls ...string) []byte { return []byte(strings.Join(ls, "\n") + "\n") }

func repeat(s string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = s
	}
	return out
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func gzipped(t *testing.T, b []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	z := gzip.NewWriter(&buf)
	if _, err := z.Write(b); err != nil {
		t.Fatal(err)
	}
	if err := z.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// FuzzReadAuditLog: whatever the input, the reader does not panic, and
// what it reports adds up: every issuance has a positive serial and a
// NotAfter, broken lines are at most the lines, and the numbers it
// names are of lines it read, in order.
func FuzzReadAuditLog(f *testing.F) {
	now := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	good := issuedLine("9c1e0a", strings.Repeat("ab", 32), "node-a", "node-a", "spiffe://cluster.local/ns/a/sa/b", now, now.Add(time.Hour))
	for _, seed := range [][]byte{lines(good), lines(good, "garbage", "{"), {0x1f, 0x8b, 8, 0}, nil, []byte("\n\n\r\n"),
		lines(`{"audit":true,"event":"certificate","decision":"issued","serial":"-1","not_after":"2026-12-06T12:00:00Z"}`)} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		scan, err := readAuditLog(bytes.NewReader(in), func(c *issuance) {
			if c.Serial == nil || c.Serial.Sign() <= 0 || c.NotAfter.IsZero() {
				t.Fatalf("issuance %+v", c)
			}
		})
		if scan == nil {
			if err == nil {
				t.Fatal("no scan and no error")
			}
			return
		}
		if scan.Broken > scan.Lines || len(scan.BrokenAt) > maxBrokenShown || scan.Events > scan.Lines {
			t.Fatalf("scan %+v", scan)
		}
		last := 0
		for _, n := range scan.BrokenAt {
			if n <= last || n > scan.Lines {
				t.Fatalf("broken lines %v of %d", scan.BrokenAt, scan.Lines)
			}
			last = n
		}
	})
}

// TestRevokeRacesRetire: the change is worked out again on the state it
// is saved on. A revocation whose issuer was retired between the plan
// and the save is skipped and reported (every leaf of a retired
// authority has expired); the others are saved.
func TestRevokeRacesRetire(t *testing.T) {
	s := newRevokeState(t)
	st := s.load(t)
	now := time.Now()
	res := &revokeResult{planned: []keymgr.Revocation{
		{Serial: big.NewInt(1), Issuer: s.preparedID, Reason: 1, RevokedAt: now, NotAfter: now.Add(time.Hour)},
		{Serial: big.NewInt(2), Issuer: s.activeID, Reason: 1, RevokedAt: now, NotAfter: now.Add(time.Hour)},
		{Serial: big.NewInt(3), Reason: 1, RevokedAt: now, NotAfter: now.Add(time.Hour)},
	}}
	f := &revokeFlags{now: func() time.Time { return now }}
	// The prepared authority retired meanwhile (as a rotation would,
	// much later): here, by hand.
	raced := st.Clone()
	for _, a := range raced.Authorities {
		if a.ID() == s.preparedID {
			a.Phase, a.Key = keymgr.PhaseRetired, nil
		}
	}
	if err := f.revoke(res)(raced); err != nil {
		t.Fatal(err)
	}
	if res.added != 2 || len(res.gone) != 1 || res.gone[0].Issuer != s.preparedID || len(raced.Revocations) != 2 {
		t.Fatalf("added %d, gone %v, state %d revocations; want 2, the prepared one's, 2", res.added, res.gone, len(raced.Revocations))
	}
	res.saved = true
	if got := res.summary(keymgr.VerbRevoke, ""); !strings.Contains(got, "revoked 2 certificate(s) (1 whose issuer was retired meanwhile, so expired)") {
		t.Errorf("summary %q", got)
	}
	// On the state as planned, all three.
	if err := f.revoke(res)(st.Clone()); err != nil || res.added != 3 || len(res.gone) != 0 {
		t.Fatalf("unraced: %v, added %d, gone %d", err, res.added, len(res.gone))
	}
}
