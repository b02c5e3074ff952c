package keymgr_test

import (
	"context"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/meshca/meshca/keymgr"
	"github.com/meshca/meshca/keymgr/dirstore"
)

// TestLoadOrBootstrapConcurrent: replicas starting at once on one empty
// state directory, as meshca serve does, end up serving one root: the
// directory's lock and compare-and-swap let exactly one bootstrap win.
func TestLoadOrBootstrapConcurrent(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	const replicas = 12
	ids := make([]string, replicas)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range replicas {
		wg.Go(func() {
			<-start
			store := &dirstore.Store{Dir: dir} // each its own handle, as separate processes have
			s, err := keymgr.LoadOrBootstrap(context.Background(), store, func() (*keymgr.AuthorityRecord, error) {
				a, err := keymgr.NewRoot(keymgr.RootOptions{Organization: "cluster.local"})
				if err != nil {
					return nil, err
				}
				return &keymgr.AuthorityRecord{Root: a.Cert, Cert: a.Cert, Key: a.Key, Generated: true}, nil
			}, time.Now())
			if err != nil {
				t.Error(err)
				return
			}
			ids[i] = s.Active().ID()
		})
	}
	close(start)
	wg.Wait()
	s, _, err := (&dirstore.Store{Dir: dir}).Load(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Authorities) != 1 {
		t.Fatalf("%d authorities stored, want 1", len(s.Authorities))
	}
	for i, id := range ids {
		if id != s.Active().ID() {
			t.Errorf("replica %d serves %.16s, the store holds %.16s", i, id, s.Active().ID())
		}
	}
}
