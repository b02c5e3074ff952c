package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshca/meshca/internal/testca"
	"github.com/meshca/meshca/keymgr"
	"github.com/meshca/meshca/keymgr/dirstore"
)

// rootCmd runs `meshca root args...` and returns its output and exit code.
func rootCmd(t *testing.T, args ...string) (string, int) {
	t.Helper()
	cmd := newRootCommand()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(append([]string{"root"}, args...))
	err := cmd.ExecuteContext(context.Background())
	if err != nil {
		out.WriteString(err.Error())
		return out.String(), exitCode(err)
	}
	return out.String(), 0
}

// TestRootRotationCLI drives a rotation through the CLI on a state
// directory: every guard refuses with its reason and time (exit 1), a
// usage error is exit 2, and --force works only with --reason.
func TestRootRotationCLI(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	st := "--state-dir=" + dir
	steps := []struct {
		name string
		args []string
		code int
		want []string
	}{
		{"status before anything", []string{"status", st}, 2, []string{"no CA state"}},
		{"first prepare bootstraps", []string{"prepare", st, "--trust-domain", "example.org"}, 0, []string{"active"}},
		{"second prepare", []string{"prepare", st, "--key-type", "ec-p384"}, 0, []string{"prepared", "ECDSA P-384"}},
		{"status", []string{"status", st}, 0, []string{"active", "prepared", "O=example.org", "next step: activate"}},
		{"retire with nothing previous", []string{"retire", st}, 2, []string{"no previous authority"}},
		{"force without reason", []string{"activate", st, "--force"}, 2, []string{"--force needs --reason"}},
		{"unknown id", []string{"activate", st, "deadbeefdeadbeef"}, 2, []string{"deadbeef"}},
		{"no store", []string{"activate"}, 2, []string{"give the CA state with --state-dir or with --state-secret, one of them"}},
	}
	for _, s := range steps {
		out, code := rootCmd(t, s.args...)
		if code != s.code {
			t.Fatalf("%s: exit %d, want %d:\n%s", s.name, code, s.code, out)
		}
		for _, w := range s.want {
			if !strings.Contains(out, w) {
				t.Errorf("%s: output lacks %q:\n%s", s.name, w, out)
			}
		}
	}

	// A leaf of a day under the active authority: activation waits half
	// of it, plus the margin.
	recordLeaf(t, dir, 24*time.Hour)
	out, code := rootCmd(t, "activate", st)
	if code != 1 || !strings.Contains(out, "safe at") {
		t.Fatalf("activate too early: exit %d, want 1 saying when:\n%s", code, out)
	}
	out, code = rootCmd(t, "activate", st, "--force", "--reason", "test: compromise drill")
	if code != 0 || !strings.Contains(out, "active") || !strings.Contains(out, `"forced":true`) || !strings.Contains(out, "compromise drill") {
		t.Fatalf("forced activate: exit %d:\n%s", code, out)
	}
	out, code = rootCmd(t, "retire", st)
	if code != 1 || !strings.Contains(out, "safe at") {
		t.Fatalf("retire while leaves live: exit %d, want 1:\n%s", code, out)
	}

	out, code = rootCmd(t, "status", st, "-o", "json")
	var v statusView
	if code != 0 || json.Unmarshal([]byte(out), &v) != nil {
		t.Fatalf("status -o json: exit %d:\n%s", code, out)
	}
	phases := map[string]int{}
	for _, a := range v.Authorities {
		phases[a.State]++
	}
	if phases["active"] != 1 || phases["previous"] != 1 || v.Next.Step != "retire" || v.Sequence < 3 {
		t.Fatalf("status %+v", v)
	}
	out, code = rootCmd(t, "bundle", st)
	if code != 0 || strings.Count(out, "BEGIN CERTIFICATE") != 2 {
		t.Fatalf("bundle: exit %d, want both roots:\n%s", code, out)
	}
}

// recordLeaf records a leaf of ttl issued now under the active authority,
// as the server does before handing it out.
func recordLeaf(t *testing.T, dir string, ttl time.Duration) {
	t.Helper()
	store := &dirstore.Store{Dir: dir}
	_, err := keymgr.Update(context.Background(), store, func(s *keymgr.State) error {
		s.RecordIssued(s.Active().ID(), time.Now().Add(ttl), ttl)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestRootStatusCADir: status reads a plugged-in directory as a server
// would, so an operator can check new files before swapping them in.
func TestRootStatusCADir(t *testing.T) {
	root := testca.NewRoot(t, "plugged root", testca.Options{})
	issuing := root.NewIntermediate(t, "plugged issuing", testca.Options{})
	other := root.NewIntermediate(t, "another issuing", testca.Options{})
	good, bad := t.TempDir(), t.TempDir()
	issuing.WriteCACerts(t, good)
	// The certificate of one intermediate with the key of another.
	(&testca.CA{Cert: issuing.Cert, Key: other.Key}).WriteCACerts(t, bad, root.Cert)
	tests := []struct {
		name string
		args []string
		code int
		want []string
	}{
		{"a good directory", []string{"status", "--ca-dir", good}, 0, []string{"active", "signs with intermediate CN=plugged issuing", "under root " + keymgr.Fingerprint(root.Cert)[:16]}},
		{"as JSON", []string{"status", "--ca-dir", good, "-o", "json"}, 0, []string{`"rootSha256": "` + keymgr.Fingerprint(root.Cert) + `"`}},
		{"a key of another certificate", []string{"status", "--ca-dir", bad}, 2, []string{"does not match the public key"}},
		{"and a state too", []string{"status", "--ca-dir", good, "--state-dir", t.TempDir()}, 2, []string{"not both"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, code := rootCmd(t, tt.args...)
			if code != tt.code {
				t.Fatalf("exit %d, want %d:\n%s", code, tt.code, out)
			}
			for _, w := range tt.want {
				if !strings.Contains(out, w) {
					t.Errorf("output lacks %q:\n%s", w, out)
				}
			}
		})
	}
}

// TestRootStepsMigrateSingleRoot: a state directory of the single-root
// layout keeps no record of its leaves; the first step saved on it
// migrates it, assuming leaves of up to --max-ttl under its root, and
// says so; the guards then count from that.
func TestRootStepsMigrateSingleRoot(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	if _, _, err := dirstore.LoadOrCreate(dir, dirstore.StateOptions{Organization: "cluster.local"}); err != nil {
		t.Fatal(err)
	}
	st := "--state-dir=" + dir
	tests := []struct {
		args []string
		code int
		want string
	}{
		{[]string{"status", st, "--max-ttl", "2h"}, 0, "active"},
		{[]string{"activate", st, "--max-ttl", "2h"}, 2, "no prepared authority"},
		{[]string{"prepare", st, "--max-ttl", "2h"}, 0, "migrated " + dir + " from the single-root layout: the guards assume leaves of up to 2h0m0s (--max-ttl)"},
		{[]string{"activate", st}, 1, "half the longest leaf lifetime (2h0m0s) plus a margin (5m0s); safe at"},
		{[]string{"activate", st, "--force", "--reason", "test"}, 0, "active"},
		{[]string{"retire", st}, 1, "safe at"},
	}
	for _, tt := range tests {
		out, code := rootCmd(t, tt.args...)
		if code != tt.code || !strings.Contains(out, tt.want) {
			t.Fatalf("%v: exit %d, want %d with %q:\n%s", tt.args, code, tt.code, tt.want, out)
		}
		if code != 0 && strings.Contains(out, "migrated") {
			t.Fatalf("%v: refused, yet says it migrated:\n%s", tt.args, out)
		}
	}
}

// staticStore hands out one state, whatever it holds.
type staticStore struct{ s *keymgr.State }

func (s staticStore) Load(context.Context) (*keymgr.State, keymgr.Version, error) {
	return s.s, "1", nil
}

func (s staticStore) Save(context.Context, *keymgr.State, keymgr.Version) (keymgr.Version, error) {
	return "", errors.New("read-only")
}

// TestTryStepValidatesFirst: with an external signer, a step on a stored
// state that does not validate changes nothing in the backend.
func TestTryStepValidatesFirst(t *testing.T) {
	var bad keymgr.State
	for _, name := range []string{"one", "two"} {
		root := testca.NewRoot(t, name, testca.Options{})
		bad.Authorities = append(bad.Authorities, &keymgr.AuthorityRecord{Phase: keymgr.PhaseActive, Root: root.Cert, Cert: root.Cert, External: true,
			History: []keymgr.Transition{{To: keymgr.PhaseActive, At: time.Now()}}})
	}
	bad.Sequence = 1
	called := false
	_, err := tryStep(context.Background(), staticStore{&bad}, nil, keymgr.PhaseActive,
		func(*keymgr.State, string, time.Time, *stepFlags) error { return nil }, &stepFlags{},
		func(*keymgr.State, *keymgr.AuthorityRecord) error { called = true; return nil })
	if err == nil || !strings.Contains(err.Error(), "the stored CA state is invalid, nothing changed") || called {
		t.Fatalf("tryStep = %v, backend called %v; want a refusal before the backend", err, called)
	}
}

// TestRootPrepareImportedFirst: a CA imported as the first authority may
// have signed before meshca knew it; the guards assume leaves of up to
// --issued-ttl under it, unless it is 0.
func TestRootPrepareImportedFirst(t *testing.T) {
	root := testca.NewRoot(t, "imported root", testca.Options{})
	caDir := t.TempDir()
	root.WriteCACerts(t, caDir)
	tests := []struct {
		name     string
		prepare  []string
		said     string
		activate int
		want     string
	}{
		{name: "default: meshca's longest leaf", prepare: []string{"--ca-dir", caDir},
			said: "the guards assume leaves of up to 2160h0m0s (--issued-ttl) were issued under it before", activate: 1,
			want: "half the longest leaf lifetime (2160h0m0s)"},
		{name: "istiod's day", prepare: []string{"--ca-dir", caDir, "--issued-ttl", "24h"},
			said: "(--issued-ttl)", activate: 1, want: "half the longest leaf lifetime (24h0m0s)"},
		{name: "never signed", prepare: []string{"--ca-dir", caDir, "--issued-ttl", "0"},
			said: "active", activate: 0, want: "active"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := "--state-dir=" + filepath.Join(t.TempDir(), "state")
			out, code := rootCmd(t, append([]string{"prepare", st}, tt.prepare...)...)
			if code != 0 || !strings.Contains(out, tt.said) {
				t.Fatalf("prepare: exit %d, want 0 saying %q:\n%s", code, tt.said, out)
			}
			if out, code := rootCmd(t, "prepare", st); code != 0 {
				t.Fatalf("second prepare: exit %d:\n%s", code, out)
			}
			out, code = rootCmd(t, "activate", st, "--margin", "0s")
			if code != tt.activate || !strings.Contains(out, tt.want) {
				t.Fatalf("activate: exit %d, want %d saying %q:\n%s", code, tt.activate, tt.want, out)
			}
		})
	}
}
