package dirstore_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshca/meshca/csr"
	"github.com/meshca/meshca/internal/pemutil"
	"github.com/meshca/meshca/internal/testca"
	"github.com/meshca/meshca/keymgr"
	"github.com/meshca/meshca/keymgr/dirstore"
	"github.com/meshca/meshca/keymgr/storetest"
)

// TestStoreMigratesSingleRoot: a directory LoadOrCreate filled loads
// as one active authority at the zero Version, and the first Save writes
// state.json beside it without a new root.
func TestStoreMigratesSingleRoot(t *testing.T) {
	tests := []struct {
		name string
		opts dirstore.StateOptions
	}{
		{"current", dirstore.StateOptions{Organization: "cluster.local"}},
		// A store loads an expired CA too; its caller judges.
		{"expired", dirstore.StateOptions{Now: time.Now().Add(-48 * time.Hour), RootTTL: 24 * time.Hour}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "state")
			a, _, err := dirstore.LoadOrCreate(dir, tt.opts)
			if err != nil {
				t.Fatal(err)
			}
			before := readFiles(t, dir, keymgr.FileCACert, keymgr.FileCAKey, keymgr.FileRootCert, keymgr.FileCertChain)
			st := dirstore.Store{Dir: dir}
			s, v, err := st.Load(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			want := &keymgr.State{Sequence: 1, Authorities: []*keymgr.AuthorityRecord{{
				Phase: keymgr.PhaseActive, Root: a.Cert, Cert: a.Cert, Key: a.Key, Generated: true,
				History: []keymgr.Transition{{To: keymgr.PhaseActive, At: a.Cert.NotBefore, Reason: dirstore.MigratedReason}},
			}}}
			// What the layout may have issued:
			// TestMigrateSingleRoot.
			want.Authorities[0].LatestLeafNotAfter, want.Authorities[0].LongestLeafTTL = s.Authorities[0].LatestLeafNotAfter, dirstore.DefaultMigrationTTL
			if d := storetest.Diff(s, want); d != "" || v != "" {
				t.Fatalf("migrated state at version %q: %s", v, d)
			}
			if _, err := os.Stat(filepath.Join(dir, dirstore.FileState)); err == nil {
				t.Fatal("Load wrote state.json")
			}
			v, err = st.Save(context.Background(), s, "")
			if err != nil {
				t.Fatal(err)
			}
			s2, v2, err := st.Load(context.Background())
			if err != nil || v2 != v {
				t.Fatalf("after the first Save: version %q (saved %q), %v", v2, v, err)
			}
			if d := storetest.Diff(s2, want); d != "" {
				t.Fatalf("after the first Save: %s", d)
			}
			for name, data := range readFiles(t, dir, keymgr.FileCACert, keymgr.FileCAKey, keymgr.FileRootCert, keymgr.FileCertChain) {
				if !bytes.Equal(data, before[name]) {
					t.Errorf("the first Save changed %s", name)
				}
			}
		})
	}
}

// TestStoreMigratesPluggedInLayout: an intermediate under one root,
// with a second root trusted beside it (a rotation by hand): the
// intermediate becomes the active authority, imported, and the other root
// stays in the bundle as a previous, external authority.
func TestStoreMigratesPluggedInLayout(t *testing.T) {
	root := testca.NewRoot(t, "corp root", testca.Options{})
	other := testca.NewRoot(t, "corp other root", testca.Options{})
	inter := root.NewIntermediate(t, "mesh intermediate", testca.Options{})
	dir := t.TempDir()
	keyPEM, err := pemutil.EncodePrivateKey(inter.Key)
	if err != nil {
		t.Fatal(err)
	}
	writeFiles(t, dir, map[string][]byte{
		keymgr.FileCACert:    pemutil.EncodeCertificates(inter.Cert),
		keymgr.FileCAKey:     keyPEM,
		keymgr.FileCertChain: pemutil.EncodeCertificates(inter.Cert, root.Cert),
		keymgr.FileRootCert:  pemutil.EncodeCertificates(other.Cert, root.Cert),
	})
	st := dirstore.Store{Dir: dir}
	s, v, err := st.Load(context.Background())
	if err != nil || v != "" {
		t.Fatalf("Load: version %q, %v", v, err)
	}
	if len(s.Authorities) != 2 {
		t.Fatalf("%d authorities, want 2", len(s.Authorities))
	}
	prev, act := s.Authorities[0], s.Authorities[1]
	switch {
	case prev.Phase != keymgr.PhasePrevious || !prev.External || prev.Key != nil || !prev.Root.Equal(other.Cert):
		t.Fatalf("the other root: %+v", prev)
	case act.Phase != keymgr.PhaseActive || act.Generated || act.External || !act.Root.Equal(root.Cert) || !act.Cert.Equal(inter.Cert) || len(act.Chain) != 0:
		t.Fatalf("the active authority: %+v", act)
	case !csr.SamePublicKey(act.Key.Public(), inter.Key.Public()):
		t.Fatal("the active authority's key is not ca-key.pem")
	}
	if _, err := st.Save(context.Background(), s, ""); err != nil {
		t.Fatal(err)
	}
	a, err := keymgr.LoadCACerts(dir, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if len(a.Roots) != 2 || !a.Cert.Equal(inter.Cert) {
		t.Fatalf("after the first Save, the cacerts layout has %d roots and another signing certificate", len(a.Roots))
	}
}

func TestStoreNothingOrSome(t *testing.T) {
	a, err := keymgr.NewRoot(keymgr.RootOptions{})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		files   map[string][]byte
		missing bool
		want    string // "": ErrNoState
	}{
		{name: "no directory", missing: true},
		{name: "empty directory"},
		{name: "only the lock file", files: map[string][]byte{dirstore.FileLock: nil}},
		{name: "only ca-cert.pem", files: map[string][]byte{keymgr.FileCACert: pemutil.EncodeCertificates(a.Cert)}, want: "holds only [ca-cert.pem]"},
		{name: "no key", files: map[string][]byte{
			keymgr.FileCACert: pemutil.EncodeCertificates(a.Cert), keymgr.FileRootCert: pemutil.EncodeCertificates(a.Cert),
		}, want: "holds only [ca-cert.pem root-cert.pem]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			if tt.missing {
				dir = filepath.Join(dir, "missing")
			}
			writeFiles(t, dir, tt.files)
			st := dirstore.Store{Dir: dir}
			_, _, err := st.Load(context.Background())
			if tt.want == "" {
				if !errors.Is(err, keymgr.ErrNoState) {
					t.Fatalf("Load: %v, want ErrNoState", err)
				}
				return
			}
			if err == nil || errors.Is(err, keymgr.ErrNoState) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Load: %v, want %q", err, tt.want)
			}
			// Nor does Save overwrite the remains of a CA.
			s := &keymgr.State{Sequence: 1, Authorities: []*keymgr.AuthorityRecord{storetest.NewRecord(t, keymgr.PhaseActive, time.Now())}}
			if _, err := st.Save(context.Background(), s, ""); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Save: %v, want %q", err, tt.want)
			}
			if _, err := os.Stat(filepath.Join(dir, dirstore.FileState)); err == nil {
				t.Fatal("Save wrote state.json over the remains of a CA")
			}
		})
	}
}

// TestStoreFirstSaveKeepsSingleRoot: a writer that found the directory
// empty must not overwrite the root LoadOrCreate put there since.
func TestStoreFirstSaveKeepsSingleRoot(t *testing.T) {
	dir := t.TempDir()
	st := dirstore.Store{Dir: dir}
	if _, _, err := st.Load(context.Background()); !errors.Is(err, keymgr.ErrNoState) {
		t.Fatal(err)
	}
	a, _, err := dirstore.LoadOrCreate(dir, dirstore.StateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	mine := &keymgr.State{Sequence: 1, Authorities: []*keymgr.AuthorityRecord{storetest.NewRecord(t, keymgr.PhaseActive, time.Now())}}
	if _, err := st.Save(context.Background(), mine, ""); !errors.Is(err, keymgr.ErrConflict) {
		t.Fatalf("Save over a single-root directory without its root: %v, want ErrConflict", err)
	}
	s, _, err := st.Load(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Authorities) != 1 || !s.Authorities[0].Cert.Equal(a.Cert) {
		t.Fatal("the single-root layout changed")
	}
	// Moving the found root on is fine: it is kept, as previous.
	mine.Authorities = append([]*keymgr.AuthorityRecord{{
		Phase: keymgr.PhasePrevious, Root: a.Cert, Cert: a.Cert, Key: a.Key, Generated: true,
		History: []keymgr.Transition{{To: keymgr.PhasePrevious, At: time.Now()}},
	}}, mine.Authorities...)
	if _, err := st.Save(context.Background(), mine, ""); err != nil {
		t.Fatal(err)
	}
}

func readFiles(t *testing.T, dir string, names ...string) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	for _, n := range names {
		data, err := os.ReadFile(filepath.Join(dir, n))
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Fatal(err)
		}
		out[n] = data
	}
	return out
}

func writeFiles(t *testing.T, dir string, files map[string][]byte) {
	t.Helper()
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// TestMigrateSingleRoot: a directory of the single-root layout loads,
// and is saved as a state, with the record that leaves of up to the
// server's longest lifetime may live under each root it trusts (none
// beyond that root's expiry), so the guards do not pass at once.
func TestMigrateSingleRoot(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "state")
	if _, _, err := dirstore.LoadOrCreate(dir, dirstore.StateOptions{Organization: "cluster.local"}); err != nil {
		t.Fatal(err)
	}
	// An older root, still trusted beside the one that signs, expiring
	// before any leaf of the longest lifetime would.
	now := time.Now()
	older := testca.NewRoot(t, "older root", testca.Options{NotBefore: now.Add(-time.Hour), NotAfter: now.Add(2 * time.Hour)})
	f, err := os.OpenFile(filepath.Join(dir, keymgr.FileRootCert), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(pemutil.EncodeCertificates(older.Cert)); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		ttl  time.Duration
		want time.Duration
	}{
		{name: "the server's --max-ttl", ttl: 24 * time.Hour, want: 24 * time.Hour},
		{name: "unset: meshca's default", want: dirstore.DefaultMigrationTTL},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := &dirstore.Store{Dir: dir, MigrationTTL: tt.ttl}
			before := time.Now()
			s, v, err := st.Load(ctx)
			if err != nil || v != "" {
				t.Fatalf("Load = version %q, %v; want the single-root layout", v, err)
			}
			if len(s.Authorities) != 2 {
				t.Fatalf("%d authorities, want the signing root and the older one", len(s.Authorities))
			}
			for _, a := range s.Authorities {
				low, high := before.Add(tt.want), time.Now().Add(tt.want)
				if a.Cert.Equal(older.Cert) {
					low, high = older.Cert.NotAfter, older.Cert.NotAfter
				}
				if got := a.LatestLeafNotAfter; got.Before(low) || got.After(high) || a.LongestLeafTTL != tt.want {
					t.Errorf("%s %s: leaves recorded until %s, longest %s; want %s, %s", a.Phase, a.Cert.Subject, got, a.LongestLeafTTL, low, tt.want)
				}
			}
		})
	}
	st := &dirstore.Store{Dir: dir, MigrationTTL: 24 * time.Hour}
	if old, err := dirstore.Unmigrated(ctx, st); !old || err != nil {
		t.Fatalf("Unmigrated before = %v, %v", old, err)
	}
	if ok, err := dirstore.MigrateSingleRoot(ctx, st); !ok || err != nil {
		t.Fatalf("MigrateSingleRoot = %v, %v", ok, err)
	}
	s, v, err := st.Load(ctx)
	if err != nil || v == "" || s.Active().LongestLeafTTL != 24*time.Hour {
		t.Fatalf("after the migration: version %q, %v, %+v", v, err, s.Active())
	}
	if old, err := dirstore.Unmigrated(ctx, st); old || err != nil {
		t.Fatalf("Unmigrated after = %v, %v", old, err)
	}
	if ok, err := dirstore.MigrateSingleRoot(ctx, st); ok || err != nil {
		t.Fatalf("MigrateSingleRoot of a state = %v, %v; want nothing done", ok, err)
	}
	if old, err := dirstore.Unmigrated(ctx, &dirstore.Store{Dir: t.TempDir()}); old || err != nil {
		t.Fatalf("Unmigrated of an empty directory = %v, %v", old, err)
	}
}
