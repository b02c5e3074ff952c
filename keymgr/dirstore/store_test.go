package dirstore_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshca/meshca/internal/pemutil"
	"github.com/meshca/meshca/keymgr"
	"github.com/meshca/meshca/keymgr/dirstore"
	"github.com/meshca/meshca/keymgr/storetest"
)

func TestStoreContract(t *testing.T) {
	storetest.Run(t, func(t *testing.T) keymgr.StateStore {
		return dirstore.Store{Dir: filepath.Join(t.TempDir(), "state")}
	})
}

// rotation is a run of states as root rotation makes them: one active
// root; a second prepared; the second active, the first previous; the
// first retired.
func rotation(t *testing.T) []*keymgr.State {
	t.Helper()
	at := time.Now().Add(-time.Hour)
	one := storetest.NewRecord(t, keymgr.PhaseActive, at)
	two := storetest.NewRecord(t, keymgr.PhasePrepared, at)
	step := func(r *keymgr.AuthorityRecord, p keymgr.Phase, min int) *keymgr.AuthorityRecord {
		c := *r
		c.Phase = p
		c.History = append(append([]keymgr.Transition(nil), r.History...), keymgr.Transition{To: p, At: at.Add(time.Duration(min) * time.Minute)})
		return &c
	}
	oneOld := step(one, keymgr.PhasePrevious, 2)
	return []*keymgr.State{
		{Sequence: 1, Authorities: []*keymgr.AuthorityRecord{one}},
		{Sequence: 2, Authorities: []*keymgr.AuthorityRecord{one, two}},
		{Sequence: 2, Authorities: []*keymgr.AuthorityRecord{oneOld, step(two, keymgr.PhaseActive, 2)}},
		{Sequence: 3, Authorities: []*keymgr.AuthorityRecord{step(oneOld, keymgr.PhaseRetired, 3), step(two, keymgr.PhaseActive, 2)}},
	}
}

// TestStoreFiles follows a rotation through the directory: modes, the
// key files (the retired key and a stray one removed), and the cacerts
// layout that LoadCACerts and LoadOrCreate read, in step with the active
// authority and the bundle at every step.
func TestStoreFiles(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state[*]") // no globbing of the path
	leftover := filepath.Join(dir, "key-0123456789abcdef.pem")
	st := dirstore.Store{Dir: dir}
	steps := rotation(t)
	wantRoots := [][]int{{0}, {0, 1}, {0, 1}, {1}}
	wantActive := []int{0, 0, 1, 1}
	first := steps[0].Authorities[0]
	firstKey, err := pemutil.EncodePrivateKey(first.Key)
	if err != nil {
		t.Fatal(err)
	}
	var v keymgr.Version
	for i, s := range steps {
		if v, err = st.Save(context.Background(), s, v); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		if i == 0 {
			// A key file no state names, as a crash can leave one.
			if err := os.WriteFile(leftover, firstKey, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		a, err := keymgr.LoadCACerts(dir, time.Now())
		if err != nil {
			t.Fatalf("step %d: the cacerts layout does not load: %v", i, err)
		}
		last := s.Authorities[len(s.Authorities)-1]
		active := map[int]*keymgr.AuthorityRecord{0: s.Authorities[0], 1: last}[wantActive[i]]
		if !a.Cert.Equal(active.Cert) {
			t.Errorf("step %d: ca-cert.pem is not the active authority's", i)
		}
		if len(a.Roots) != len(wantRoots[i]) {
			t.Errorf("step %d: root-cert.pem holds %d roots, want %d", i, len(a.Roots), len(wantRoots[i]))
		}
		b, created, err := dirstore.LoadOrCreate(dir, dirstore.StateOptions{})
		if err != nil || created || !b.Cert.Equal(a.Cert) {
			t.Errorf("step %d: LoadOrCreate: created=%v err=%v", i, created, err)
		}
	}
	wantModes := map[string]os.FileMode{
		".": 0o700, dirstore.FileState: 0o644, keymgr.FileCAKey: 0o600, keymgr.FileCACert: 0o644,
		keymgr.FileRootCert: 0o644, keymgr.FileCertChain: 0o644, dirstore.FileLock: 0o600,
		keymgr.KeyEntry(steps[3].Authorities[1].Cert): 0o600,
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if _, ok := wantModes[e.Name()]; !ok {
			t.Errorf("unexpected file %s in the state directory", e.Name())
		}
		data, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(data, bytes.TrimSpace(firstKey)) {
			t.Errorf("%s still holds the key of the retired authority", e.Name())
		}
	}
	for name, mode := range wantModes {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			t.Error(err)
			continue
		}
		if fi.Mode().Perm() != mode {
			t.Errorf("%s: mode %v, want %v", name, fi.Mode().Perm(), mode)
		}
	}
}

// TestStoreTwoHandles: two dirstore.Stores on one directory, as the CLI and
// a running server are, saving on one version at once: the lock lets one
// win and the other sees ErrConflict.
func TestStoreTwoHandles(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	steps := rotation(t)
	base, err := dirstore.Store{Dir: dir}.Save(context.Background(), steps[0], "")
	if err != nil {
		t.Fatal(err)
	}
	for round := range 10 {
		stores := []dirstore.Store{{Dir: dir}, {Dir: dir}}
		next := []*keymgr.State{steps[1], {Sequence: 7, Authorities: steps[1].Authorities}}
		errs := make([]error, 2)
		versions := make([]keymgr.Version, 2)
		var wg sync.WaitGroup
		for i := range stores {
			wg.Go(func() { versions[i], errs[i] = stores[i].Save(context.Background(), next[i], base) })
		}
		wg.Wait()
		won := 0
		for i, err := range errs {
			switch {
			case err == nil:
				won++
				base = versions[i]
			case !errors.Is(err, keymgr.ErrConflict):
				t.Fatalf("round %d: %v", round, err)
			}
		}
		if won != 1 {
			t.Fatalf("round %d: %d writers won, want 1", round, won)
		}
		if base, err = (dirstore.Store{Dir: dir}).Save(context.Background(), steps[0], base); err != nil {
			t.Fatal(err)
		}
	}
}

func TestStoreLockTimeout(t *testing.T) {
	dir := t.TempDir()
	unlock, err := dirstore.LockDir(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	defer unlock()
	st := dirstore.Store{Dir: dir, LockTimeout: 100 * time.Millisecond}
	_, err = st.Save(context.Background(), rotation(t)[0], "")
	var le *dirstore.LockedError
	if !errors.As(err, &le) {
		t.Fatalf("Save while another holds the lock: %v, want a LockedError", err)
	}
	if _, err := os.Stat(filepath.Join(dir, dirstore.FileState)); err == nil {
		t.Fatal("Save wrote without the lock")
	}
	// Load takes no lock.
	if _, _, err := st.Load(context.Background()); !errors.Is(err, keymgr.ErrNoState) {
		t.Fatalf("Load: %v, want ErrNoState", err)
	}
}

// TestStoreLoadDuringSaves: Load takes no lock, so it must cope with
// a writer that replaces state.json and removes destroyed keys while it
// reads: every Load returns a whole state. The writer here is harsher
// than any rotation: it goes back and forth between two states, so that
// a key Load misses can reappear under the very state.json it read.
func TestStoreLoadDuringSaves(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	st := dirstore.Store{Dir: dir}
	steps := rotation(t)
	v, err := st.Save(context.Background(), steps[0], "")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	loads := 0
	wg.Go(func() {
		for ctx.Err() == nil {
			if _, _, err := st.Load(ctx); err != nil && ctx.Err() == nil {
				t.Errorf("Load during saves: %v", err)
				return
			}
			loads++
		}
	})
	// Back and forth between a state with the first key and one where it
	// is destroyed: every second save removes a key file.
	for i := range 200 {
		s := steps[3]
		if i%2 == 1 {
			s = steps[2]
		}
		if v, err = st.Save(context.Background(), s, v); err != nil {
			t.Fatal(err)
		}
	}
	cancel()
	wg.Wait()
	t.Logf("%d loads during 200 saves", loads)
}

func TestStoreBrokenFiles(t *testing.T) {
	s := rotation(t)[1]
	keyFile := keymgr.KeyEntry(s.Authorities[1].Cert)
	stranger, err := pemutil.EncodePrivateKey(storetest.NewRecord(t, keymgr.PhaseActive, time.Now()).Key)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		edit     func(dir string) error
		wantFile string
		want     string
	}{
		{"key file missing", func(dir string) error { return os.Remove(filepath.Join(dir, keyFile)) }, keyFile, "missing"},
		{"key file of another key", func(dir string) error { return os.WriteFile(filepath.Join(dir, keyFile), stranger, 0o600) }, keyFile, "does not match"},
		{"state.json truncated", func(dir string) error {
			p := filepath.Join(dir, dirstore.FileState)
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			return os.WriteFile(p, data[:len(data)/2], 0o644)
		}, dirstore.FileState, "not a CA state document"},
		{"state.json names a path", func(dir string) error {
			p := filepath.Join(dir, dirstore.FileState)
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			return os.WriteFile(p, bytes.Replace(data, []byte(keyFile), []byte("../../etc/passwd"), 1), 0o644)
		}, dirstore.FileState, "is not a key entry name"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			st := dirstore.Store{Dir: dir}
			if _, err := st.Save(context.Background(), s, ""); err != nil {
				t.Fatal(err)
			}
			if err := tt.edit(dir); err != nil {
				t.Fatal(err)
			}
			_, _, err := st.Load(context.Background())
			var fe *keymgr.FileError
			switch {
			case !errors.As(err, &fe):
				t.Fatalf("Load: %v, want a FileError", err)
			case fe.Path != filepath.Join(dir, tt.wantFile):
				t.Fatalf("Load: %v, names %s, want %s", err, fe.Path, tt.wantFile)
			case !strings.Contains(err.Error(), tt.want):
				t.Fatalf("Load: %v, want %q", err, tt.want)
			}
		})
	}
}
