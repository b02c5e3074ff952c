package main

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshca/meshca/keymgr"
)

// stateFiles is every file of a CA state directory, by path.
func stateFiles(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	files := map[string][]byte{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		files[p] = b
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// TestRevokeBadInputChangesNothing: what meshca revoke refuses leaves
// the CA state directory byte for byte as it was, and says why: a serial
// meshca never issued, an unknown node, a log of broken lines alone, and
// revocations under a retired authority.
func TestRevokeBadInputChangesNothing(t *testing.T) {
	s := newRevokeState(t)
	now := time.Now()
	day := now.Add(24 * time.Hour)
	dir := t.TempDir()
	write := func(name string, lines ...string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := write("audit.log", issuedLine("9c1e0a", s.activeID, "node-a", "node-a", "spiffe://cluster.local/ns/shop/sa/cart", now.Add(-time.Hour), day))
	broken := write("broken.log", "garbage", "{not json")
	st := "--state-dir=" + s.dir
	// The active authority retired (forced, as after a leak): a serial it
	// signed, and its intermediate, are then refused.
	if out, code := rootCmd(t, "activate", s.preparedID[:16], st, "--force", "--reason", "test"); code != 0 {
		t.Fatalf("activate: exit %d\n%s", code, out)
	}
	if out, code := rootCmd(t, "retire", s.activeID[:16], st, "--force", "--reason", "test"); code != 0 {
		t.Fatalf("retire: exit %d\n%s", code, out)
	}
	for _, tc := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"serial never issued", []string{"--serial", "0x77", "--reason", "keyCompromise", "--audit-log", good}, 3, "meshca has no record of issuing serial 77"},
		{"unknown node", []string{"--node", "node-z", "--since", "24h", "--reason", "keyCompromise", "--audit-log", good}, 3, `meshca has no record of node "node-z"`},
		{"broken lines alone", []string{"--serial", "9c1e0a", "--reason", "keyCompromise", "--audit-log", broken}, 2, "none of its 2 lines is a JSON object"},
		// Its root still trusted and its leaves maybe valid: on the root's
		// CRL, which this state cannot sign (its root key is not held).
		{"intermediate of a retired authority", []string{"--intermediate", s.activeID[:16], "--reason", "caCompromise"}, 1, `meshca cannot publish a CRL of "CN=revoke root`},
		{"serial under a retired authority", []string{"--serial", "9c1e0a", "--reason", "keyCompromise", "--audit-log", good}, 1, "which is retired: its key is destroyed and no CRL of it can list the serial; if its leaves may still be valid, revoke its intermediate instead"},
		{"--issuer a retired authority", []string{"--serial", "abc", "--reason", "keyCompromise", "--issuer", s.activeID[:16], "--not-after", day.Format(time.RFC3339)}, 1, "no CA of the CA state that is not retired"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := stateFiles(t, s.dir)
			out, code := revokeCmd(t, "", append([]string{st}, tc.args...)...)
			t.Logf("exit %d: %s", code, out)
			if code != tc.code || !strings.Contains(out, tc.want) {
				t.Errorf("exit %d, want %d with %q:\n%s", code, tc.code, tc.want, out)
			}
			after := stateFiles(t, s.dir)
			if len(after) != len(before) {
				t.Fatalf("%d files in the state directory, then %d", len(before), len(after))
			}
			for p, b := range before {
				if !bytes.Equal(after[p], b) {
					t.Errorf("%s changed", p)
				}
			}
		})
	}
}

// TestRevokeRetiredIntermediate: an intermediate retired by force (after
// a leak) whose root is still trusted, and one of whose leaves may still
// be valid, is revoked on its root's CRL; once its leaves have expired,
// or its root left the bundle, it is refused.
func TestRevokeRetiredIntermediate(t *testing.T) {
	s := newRevokeState(t)
	st := "--state-dir=" + s.dir
	if out, code := rootCmd(t, "activate", s.preparedID[:16], st, "--force", "--reason", "test"); code != 0 {
		t.Fatalf("activate: exit %d\n%s", code, out)
	}
	if out, code := rootCmd(t, "retire", s.activeID[:16], st, "--force", "--reason", "leaked"); code != 0 {
		t.Fatalf("retire: exit %d\n%s", code, out)
	}
	state := s.load(t)
	rec, err := state.View().Lookup(s.activeID)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	rec.LatestLeafNotAfter = now.Add(time.Hour)
	r, err := planIntermediate(state, s.activeID[:16], false, now)
	if err != nil || r.Issuer != keymgr.Fingerprint(s.root.Cert) || r.Serial.Cmp(s.active.Cert.SerialNumber) != 0 {
		t.Fatalf("a retired intermediate whose leaves live: %+v, %v; want it on the root's CRL", r, err)
	}
	var ee *exitError
	if _, err := planIntermediate(state, s.activeID[:16], false, now.Add(2*time.Hour)); !errors.As(err, &ee) || ee.code != exitRefused ||
		!strings.Contains(err.Error(), "every leaf it signed has expired") {
		t.Fatalf("once its leaves expired: %v, want refused", err)
	}
}
