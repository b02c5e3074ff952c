package keymgr_test

import (
	"context"
	"crypto/x509"
	"math/big"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshca/meshca/keymgr"
	"github.com/meshca/meshca/keymgr/dirstore"
)

// countingStore counts the loads and saves of a dirstore.Store, and can hold
// every Load until released.
type countingStore struct {
	keymgr.StateStore
	loads, saves atomic.Int32
	gate         chan struct{}
}

func (c *countingStore) Load(ctx context.Context) (*keymgr.State, keymgr.Version, error) {
	c.loads.Add(1)
	if c.gate != nil {
		<-c.gate
	}
	return c.StateStore.Load(ctx)
}

func (c *countingStore) Save(ctx context.Context, s *keymgr.State, base keymgr.Version) (keymgr.Version, error) {
	c.saves.Add(1)
	return c.StateStore.Save(ctx, s, base)
}

// issuanceStore is a state directory holding one bootstrapped authority.
func issuanceStore(t *testing.T) (*countingStore, *keymgr.AuthorityRecord) {
	t.Helper()
	s, a := lcBootstrapped(t)
	store := &dirstore.Store{Dir: t.TempDir()}
	if _, err := store.Save(context.Background(), s, ""); err != nil {
		t.Fatal(err)
	}
	return &countingStore{StateStore: store}, a
}

func leafOf(notBefore time.Time, ttl time.Duration) *x509.Certificate {
	return &x509.Certificate{SerialNumber: big.NewInt(1), NotBefore: notBefore, NotAfter: notBefore.Add(ttl)}
}

func TestIssuanceLogRecord(t *testing.T) {
	ctx := context.Background()
	store, a := issuanceStore(t)
	l := &keymgr.IssuanceLog{Store: store}
	tests := []struct {
		name      string
		leaf      *x509.Certificate
		saves     int32
		latest    time.Time
		longest   time.Duration
		wantError string
	}{
		{name: "first leaf: recorded an hour ahead", leaf: leafOf(lcT0, 24*time.Hour), saves: 1,
			latest: lcT0.Add(25 * time.Hour), longest: 24 * time.Hour},
		{name: "covered: no write", leaf: leafOf(lcT0.Add(30*time.Minute), 24*time.Hour), saves: 0,
			latest: lcT0.Add(25 * time.Hour), longest: 24 * time.Hour},
		{name: "past the horizon", leaf: leafOf(lcT0.Add(2*time.Hour), 24*time.Hour), saves: 1,
			latest: lcT0.Add(27 * time.Hour), longest: 24 * time.Hour},
		{name: "longer lifetime within the horizon", leaf: leafOf(lcT0.Add(-time.Hour), 25*time.Hour), saves: 1,
			latest: lcT0.Add(27 * time.Hour), longest: 25 * time.Hour},
		{name: "short leaf: half its life ahead", leaf: leafOf(lcT0.Add(27*time.Hour), 20*time.Minute), saves: 1,
			latest: lcT0.Add(27*time.Hour + 30*time.Minute), longest: 25 * time.Hour},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := store.saves.Load()
			if err := l.Record(ctx, a.Cert, tt.leaf); err != nil {
				t.Fatal(err)
			}
			if got := store.saves.Load() - before; got != tt.saves {
				t.Errorf("%d saves, want %d", got, tt.saves)
			}
			s, _, err := store.Load(ctx)
			if err != nil {
				t.Fatal(err)
			}
			rec := s.Authorities[0]
			if !rec.LatestLeafNotAfter.Equal(tt.latest) || rec.LongestLeafTTL != tt.longest {
				t.Errorf("recorded %v, %v; want %v, %v", rec.LatestLeafNotAfter, rec.LongestLeafTTL, tt.latest, tt.longest)
			}
		})
	}
}

func TestIssuanceLogRefusesUnknownIssuer(t *testing.T) {
	store, _ := issuanceStore(t)
	other := lcGenerated(t)
	err := (&keymgr.IssuanceLog{Store: store}).Record(context.Background(), other.Cert, leafOf(lcT0, time.Hour))
	if err == nil || !strings.Contains(err.Error(), "no authority of the CA state signs with") {
		t.Fatalf("Record under an unknown issuer: %v", err)
	}
}

// TestIssuanceLogSharesWrites: a burst of leaves past the horizon, all at
// once, costs one write, not a load and compare-and-swap each.
func TestIssuanceLogSharesWrites(t *testing.T) {
	store, a := issuanceStore(t)
	store.gate = make(chan struct{})
	l := &keymgr.IssuanceLog{Store: store}
	const n = 64
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Go(func() {
			errs <- l.Record(context.Background(), a.Cert, leafOf(lcT0.Add(time.Duration(i)*time.Millisecond), 24*time.Hour))
		})
	}
	time.Sleep(50 * time.Millisecond) // let the burst reach the gate
	close(store.gate)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if loads, saves := store.loads.Load(), store.saves.Load(); saves != 1 || loads > 2 {
		t.Errorf("%d loads and %d saves for a burst of %d, want 1 save (and its load)", loads, saves, n)
	}
}

// TestIssuanceLogWaitHonoursContext: a record waiting for another's write
// gives up when its context ends.
func TestIssuanceLogWaitHonoursContext(t *testing.T) {
	store, a := issuanceStore(t)
	store.gate = make(chan struct{})
	l := &keymgr.IssuanceLog{Store: store}
	first := make(chan error, 1)
	go func() { first <- l.Record(context.Background(), a.Cert, leafOf(lcT0, time.Hour)) }()
	for store.loads.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	err := l.Record(ctx, a.Cert, leafOf(lcT0, time.Hour))
	if err == nil || !strings.Contains(err.Error(), "waiting to record the issuance") {
		t.Errorf("second Record: %v, want it to stop waiting at its deadline", err)
	}
	close(store.gate)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
}

// A server that has not followed the state yet still signs with an
// authority another replica or the CLI has retired: the leaf is not
// recorded, so it is not handed out under a root workloads no longer trust.
func TestIssuanceLogRefusesRetired(t *testing.T) {
	ctx := context.Background()
	s := lcAllPhases(t)
	retired := s.Authorities[0]
	store := &dirstore.Store{Dir: t.TempDir()}
	if _, err := store.Save(ctx, s, ""); err != nil {
		t.Fatal(err)
	}
	l := &keymgr.IssuanceLog{Store: store}
	err := l.Record(ctx, retired.Cert, leafOf(lcT0.Add(30*time.Hour), time.Hour))
	if err == nil || !strings.Contains(err.Error(), "was retired at 2030-01-02T00:00:00Z; this server has not followed the CA state yet") {
		t.Fatalf("Record under a retired authority: %v", err)
	}
	got, _, err := store.Load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if rec, _ := got.View().Lookup(retired.ID()); !rec.LatestLeafNotAfter.Equal(retired.LatestLeafNotAfter) {
		t.Fatalf("the retired authority's record changed: %v", rec.LatestLeafNotAfter)
	}
}
