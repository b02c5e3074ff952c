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

// TestAutoRotatorFullCycle drives a generated root through a whole
// automatic rotation on a fake clock, with two rotators on one store (two
// replicas): each step is taken once, in order, only when due.
func TestAutoRotatorFullCycle(t *testing.T) {
	var mu sync.Mutex
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	const rootTTL = 30 * 24 * time.Hour
	gen := func(*keymgr.AuthorityRecord) (*keymgr.AuthorityRecord, error) {
		a, err := keymgr.NewRoot(keymgr.RootOptions{Organization: "example.org", TTL: rootTTL, Now: clock()})
		if err != nil {
			return nil, err
		}
		return &keymgr.AuthorityRecord{Root: a.Cert, Cert: a.Cert, Key: a.Key, Generated: true}, nil
	}
	store := &dirstore.Store{Dir: filepath.Join(t.TempDir(), "state")}
	ctx := context.Background()
	if _, err := keymgr.LoadOrBootstrap(ctx, store, func() (*keymgr.AuthorityRecord, error) { return gen(nil) }, clock()); err != nil {
		t.Fatal(err)
	}
	first := func() string { s, _, _ := store.Load(ctx); return s.Active().ID() }()
	var steps []string
	replicas := []*keymgr.AutoRotator{
		{Store: store, Generate: gen, Now: clock, Guards: keymgr.Guards{Margin: time.Minute}},
		{Store: store, Generate: gen, Now: clock, Guards: keymgr.Guards{Margin: time.Minute}},
	}
	tick := func() {
		t.Helper()
		for _, r := range replicas {
			step, took, err := r.Tick(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if took {
				steps = append(steps, step.Verb)
			}
		}
	}
	// Leaves of a day are issued under the first root until the end.
	record := func() {
		_, err := keymgr.Update(ctx, store, func(s *keymgr.State) error {
			s.RecordIssued(s.Active().ID(), clock().Add(24*time.Hour), 24*time.Hour)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	record()
	tick()
	if len(steps) != 0 {
		t.Fatalf("steps %v on a fresh root", steps)
	}
	advance(rootTTL * 2 / 3) // a third of the lifetime left: prepare
	record()
	tick()
	advance(11 * time.Hour) // not yet half a leaf's life
	tick()
	if want := []string{"prepare"}; len(steps) != 1 || steps[0] != "prepare" {
		t.Fatalf("steps %v, want %v", steps, want)
	}
	advance(2 * time.Hour) // 13h: half a day plus the margin has passed
	tick()
	if len(steps) != 2 || steps[1] != "activate" {
		t.Fatalf("steps %v, want prepare, activate", steps)
	}
	advance(10 * time.Hour) // 23h: the old root's last leaves still live
	tick()
	if len(steps) != 2 {
		t.Fatalf("steps %v: retired while leaves live", steps)
	}
	advance(2 * time.Hour) // 25h: they have expired
	tick()
	if len(steps) != 3 || steps[2] != "retire" {
		t.Fatalf("steps %v, want prepare, activate, retire", steps)
	}
	s, _, err := store.Load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if a := s.Active(); a.ID() == first || len(s.Bundle()) != 1 {
		t.Fatalf("after the cycle: active %s, %d roots", a.ID(), len(s.Bundle()))
	}
}
