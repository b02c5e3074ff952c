package dirstore

import (
	"context"
	"crypto/x509"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshca/meshca/keymgr"
)

// crashRecord is an authority in phase p, a fresh root of its own.
func crashRecord(t *testing.T, p keymgr.Phase, at time.Time) *keymgr.AuthorityRecord {
	t.Helper()
	a, err := keymgr.NewRoot(keymgr.RootOptions{Organization: "crash.example", Now: at})
	if err != nil {
		t.Fatal(err)
	}
	return &keymgr.AuthorityRecord{Phase: p, Root: a.Cert, Cert: a.Cert, Key: a.Key, Generated: true,
		History: []keymgr.Transition{{To: p, At: at, Reason: "crash test"}}}
}

func moved(r *keymgr.AuthorityRecord, p keymgr.Phase, at time.Time) *keymgr.AuthorityRecord {
	c := *r
	c.Phase = p
	c.History = append(append([]keymgr.Transition(nil), r.History...), keymgr.Transition{To: p, At: at})
	return &c
}

// TestStoreCrashAtEveryStep stops a Save after each of its writes, as
// a crash would, for every kind of change, and checks what a restarted
// process finds: Load returns the old state until state.json is written
// and the new one from then on, never a state missing a key; the cacerts
// layout either loads as the old or the new active authority or is
// refused, never a key that is not its certificate's; and the next Save
// repairs everything.
func TestStoreCrashAtEveryStep(t *testing.T) {
	at := time.Now().Add(-time.Hour)
	one, two := crashRecord(t, keymgr.PhaseActive, at), crashRecord(t, keymgr.PhasePrepared, at)
	s1 := &keymgr.State{Sequence: 1, Authorities: []*keymgr.AuthorityRecord{one}}
	s2 := &keymgr.State{Sequence: 2, Authorities: []*keymgr.AuthorityRecord{one, two}}
	s3 := &keymgr.State{Sequence: 2, Authorities: []*keymgr.AuthorityRecord{moved(one, keymgr.PhasePrevious, at), moved(two, keymgr.PhaseActive, at)}}
	s4 := &keymgr.State{Sequence: 3, Authorities: []*keymgr.AuthorityRecord{moved(s3.Authorities[0], keymgr.PhaseRetired, at), s3.Authorities[1]}}
	tests := []struct {
		name string
		old  *keymgr.State // nil: an empty directory; singleRoot: the single-root layout
		next func(t *testing.T, dir string) *keymgr.State
	}{
		{"first save", nil, func(*testing.T, string) *keymgr.State { return s1 }},
		{"migration", singleRoot, func(t *testing.T, dir string) *keymgr.State { return loadOK(t, dir) }},
		{"migration and prepare", singleRoot, func(t *testing.T, dir string) *keymgr.State {
			s := loadOK(t, dir)
			s.Authorities = append(s.Authorities, two)
			return s
		}},
		{"prepare", s1, func(*testing.T, string) *keymgr.State { return s2 }},
		{"activate", s2, func(*testing.T, string) *keymgr.State { return s3 }},
		{"retire", s3, func(*testing.T, string) *keymgr.State { return s4 }},
		{"retire back", s4, func(*testing.T, string) *keymgr.State { return s1 }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for k := 0; ; k++ {
				dir := filepath.Join(t.TempDir(), "state")
				d := Store{Dir: dir}
				oldV := setUp(t, d, tt.old)
				oldActive := activeCert(t, d)
				next := tt.next(t, dir)
				entries, err := keymgr.EncodeState(next)
				if err != nil {
					t.Fatal(err)
				}
				commit, cleanup, err := d.plan(next, entries, oldV)
				if err != nil {
					t.Fatal(err)
				}
				steps := append(commit, cleanup...)
				if k > len(steps) {
					break
				}
				for _, st := range steps[:k] {
					if err := st.run(); err != nil {
						t.Fatalf("%s: %v", st.name, err)
					}
				}
				leaveTempFiles(t, dir)
				after := "after " + stepName(steps, k)
				_, v, err := d.Load(context.Background())
				wantV := oldV
				if k >= len(commit) {
					wantV = docVersion(entries[FileState])
				}
				switch {
				case tt.old == nil && k < len(commit):
					if !errors.Is(err, keymgr.ErrNoState) {
						t.Fatalf("%s: Load: %v, want keymgr.ErrNoState", after, err)
					}
				case err != nil:
					t.Fatalf("%s: Load: %v", after, err)
				case v != wantV:
					t.Fatalf("%s: Load returned version %q, want %q", after, v, wantV)
				}
				if a, err := keymgr.LoadCACerts(dir, time.Now()); err == nil {
					if !a.Cert.Equal(oldActive) && !a.Cert.Equal(next.Authorities[activeIndex(next)].Cert) {
						t.Fatalf("%s: the cacerts layout loads an authority that is active neither before nor after", after)
					}
				}
				// The restarted writer saves what it wants on
				// what it finds.
				if _, err := d.Save(context.Background(), next, v); err != nil {
					t.Fatalf("%s: the next Save: %v", after, err)
				}
				checkRepaired(t, d, next)
			}
		})
	}
}

// singleRoot stands for a directory that LoadOrCreate filled.
var singleRoot = &keymgr.State{}

func setUp(t *testing.T, d Store, old *keymgr.State) keymgr.Version {
	t.Helper()
	switch old {
	case nil:
		if err := os.MkdirAll(d.Dir, 0o700); err != nil {
			t.Fatal(err)
		}
		return ""
	case singleRoot:
		if _, _, err := LoadOrCreate(d.Dir, StateOptions{}); err != nil {
			t.Fatal(err)
		}
		return ""
	}
	v, err := d.Save(context.Background(), old, "")
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func loadOK(t *testing.T, dir string) *keymgr.State {
	t.Helper()
	s, _, err := Store{Dir: dir}.Load(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// activeCert is the active authority's certificate in d, nil for none.
func activeCert(t *testing.T, d Store) *x509.Certificate {
	t.Helper()
	s, _, err := d.Load(context.Background())
	if err != nil {
		return nil
	}
	return s.Authorities[activeIndex(s)].Cert
}

func activeIndex(s *keymgr.State) int {
	for i, r := range s.Authorities {
		if r.Phase == keymgr.PhaseActive {
			return i
		}
	}
	return -1
}

// leaveTempFiles leaves what atomic writes cut short by a crash leave.
func leaveTempFiles(t *testing.T, dir string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{".state.json.tmp-1", ".key-0123456789abcdef.pem.tmp-2", ".ca-key.pem.tmp-3"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("cut short"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

func stepName(steps []saveStep, k int) string {
	if k == 0 {
		return "no step"
	}
	return strings.TrimSpace(steps[k-1].name)
}

// checkRepaired: after a whole Save, the directory holds next, its keys
// and nothing else, and the cacerts layout is next's active authority.
func checkRepaired(t *testing.T, d Store, next *keymgr.State) {
	t.Helper()
	want := map[string]bool{FileState: true, FileLock: true, keymgr.FileCAKey: true, keymgr.FileCACert: true, keymgr.FileCertChain: true, keymgr.FileRootCert: true}
	for _, r := range next.Authorities {
		if r.Key != nil && r.Phase != keymgr.PhaseRetired {
			want[keymgr.KeyEntry(r.Cert)] = true
		}
	}
	files, err := os.ReadDir(d.Dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if !want[f.Name()] {
			t.Errorf("after the repairing Save, %s is left", f.Name())
		}
	}
	a, err := keymgr.LoadCACerts(d.Dir, time.Now())
	if err != nil {
		t.Fatalf("after the repairing Save, the cacerts layout: %v", err)
	}
	if !a.Cert.Equal(next.Authorities[activeIndex(next)].Cert) {
		t.Fatal("after the repairing Save, ca-cert.pem is not the active authority's")
	}
}

// TestStoreTidy: a retire cut short after its commit leaves the
// retired key on disk and the cacerts layout behind; Tidy, with no change
// to the state, finishes the job, and on an empty directory does nothing.
func TestStoreTidy(t *testing.T) {
	ctx := context.Background()
	at := time.Now().Add(-time.Hour)
	d := Store{Dir: t.TempDir()}
	if err := d.Tidy(ctx); err != nil {
		t.Fatalf("Tidy of an empty directory: %v", err)
	}
	old, next := crashRecord(t, keymgr.PhaseActive, at), crashRecord(t, keymgr.PhasePrepared, at)
	v, err := d.Save(ctx, &keymgr.State{Sequence: 2, Authorities: []*keymgr.AuthorityRecord{old, next}}, "")
	if err != nil {
		t.Fatal(err)
	}
	oldKey, err := os.ReadFile(filepath.Join(d.Dir, keymgr.KeyEntry(old.Cert)))
	if err != nil {
		t.Fatal(err)
	}
	retired := moved(moved(old, keymgr.PhasePrevious, at), keymgr.PhaseRetired, at)
	retired.Key = nil
	final := &keymgr.State{Sequence: 3, Authorities: []*keymgr.AuthorityRecord{retired, moved(next, keymgr.PhaseActive, at)}}
	if _, err := d.Save(ctx, final, v); err != nil {
		t.Fatal(err)
	}
	// What a crash between the commit and the cleanup leaves.
	if err := os.WriteFile(filepath.Join(d.Dir, keymgr.KeyEntry(old.Cert)), oldKey, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(d.Dir, keymgr.FileCAKey), oldKey, 0o600); err != nil {
		t.Fatal(err)
	}
	leaveTempFiles(t, d.Dir)
	before, vBefore, _ := d.Load(ctx)
	if err := d.Tidy(ctx); err != nil {
		t.Fatal(err)
	}
	checkRepaired(t, d, final)
	after, vAfter, err := d.Load(ctx)
	if err != nil || vAfter != vBefore || after.Sequence != before.Sequence {
		t.Fatalf("Tidy changed the state: version %s → %s, err %v", vBefore, vAfter, err)
	}
}
