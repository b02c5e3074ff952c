package keymgr_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshca/meshca/keymgr"
)

// memStore hands out one state under a version the test sets.
type memStore struct {
	mu      sync.Mutex
	state   *keymgr.State
	version int
}

func (m *memStore) put(s *keymgr.State) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.state, m.version = s, m.version+1
}

func (m *memStore) Load(context.Context) (*keymgr.State, keymgr.Version, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.state.Clone(), keymgr.Version(fmt.Sprint(m.version)), nil
}

func (m *memStore) Save(context.Context, *keymgr.State, keymgr.Version) (keymgr.Version, error) {
	return "", fmt.Errorf("read-only")
}

// usedTarget records the states a Follower puts in service.
type usedTarget struct{ used []*keymgr.State }

func (u *usedTarget) Use(s *keymgr.State, _ time.Time) error {
	u.used = append(u.used, s)
	return nil
}

// TestFollowerRefusesOlderState: an older state written back to the store
// (a backup restored, a deleted store bootstrapped anew) is not put in
// service over a newer one, whose roots live leaves chain to.
func TestFollowerRefusesOlderState(t *testing.T) {
	h := func(d time.Duration) time.Time { return lcT0.Add(d) }
	s, a, _ := lcRotated(t)
	beforeRetire := s.Clone()
	c := lcGenerated(t)
	for _, err := range []error{
		s.Prepare(c, h(15*time.Hour), "third"),
		s.Retire(a.ID(), h(24*time.Hour), keymgr.Guards{}, false, ""),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	cur := s.Clone()
	unretired := beforeRetire.Clone()
	unretired.Sequence = cur.Sequence
	newer := cur.Clone()
	if err := newer.Activate(c.ID(), h(28*time.Hour), keymgr.DefaultGuards(), false, ""); err != nil {
		t.Fatal(err)
	}
	recorded := cur.Clone()
	recorded.RecordIssued(recorded.Active().ID(), h(40*time.Hour), 24*time.Hour)
	fresh := lcGenerated(t)
	bootstrapped := &keymgr.State{}
	if err := bootstrapped.Bootstrap(fresh, h(30*time.Hour), "store deleted"); err != nil {
		t.Fatal(err)
	}

	further := bootstrapped.Clone()
	for further.Sequence <= cur.Sequence {
		if err := further.Prepare(lcGenerated(t), h(30*time.Hour), "ahead"); err != nil {
			t.Fatal(err)
		}
	}

	tests := []struct {
		name  string
		state *keymgr.State
		want  string // the refusal; "" when the state is used
	}{
		{name: "backup from before the retire", state: beforeRetire,
			want: fmt.Sprintf("bundle sequence %d is below %d", beforeRetire.Sequence, cur.Sequence)},
		{name: "deleted and bootstrapped anew", state: bootstrapped, want: "it is another CA state"},
		{name: "another lineage further along", state: further,
			want: "it is another CA state (lineage " + fmt.Sprintf("%.16s", further.View().Lineage())},
		{name: "retired authority back at the same sequence", state: unretired,
			want: fmt.Sprintf("holds authority %.16s as previous, which was retired at 2030-01-02T00:00:00Z", a.ID())},
		{name: "a leaf recorded", state: recorded},
		{name: "the next step", state: newer},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			store, target := &memStore{}, &usedTarget{}
			f := &keymgr.Follower{Store: store, Target: target, Now: func() time.Time { return h(30 * time.Hour) }}
			store.put(cur)
			if _, err := f.Sync(context.Background()); err != nil {
				t.Fatal(err)
			}
			store.put(tt.state)
			used, err := f.Sync(context.Background())
			switch {
			case tt.want == "" && (err != nil || !used):
				t.Fatalf("Sync = %v, %v; want the state used", used, err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Fatalf("Sync = %v, %v; want %q", used, err, tt.want)
			case tt.want != "" && (used || len(target.used) != 1):
				t.Fatalf("the refused state was put in service (%d states used)", len(target.used))
			}
		})
	}
}

// TestFollowerRefusesAnotherLineageAtOne: a server whose state never
// rotated (sequence 1, as most installs) refuses a state bootstrapped
// anew, also at sequence 1, unless it follows a plugged-in directory,
// whose owner swaps its authority at will.
func TestFollowerRefusesAnotherLineageAtOne(t *testing.T) {
	h := func(d time.Duration) time.Time { return lcT0.Add(d) }
	boot := func(reason string) *keymgr.State {
		s := &keymgr.State{}
		if err := s.Bootstrap(lcGenerated(t), h(time.Hour), reason); err != nil {
			t.Fatal(err)
		}
		return s
	}
	cur, anew := boot("first start"), boot("store lost")
	for _, tt := range []struct {
		name       string
		anyLineage bool
		want       string
	}{
		{name: "a built-in state", want: "it is another CA state"},
		{name: "a plugged-in directory", anyLineage: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			mem, target := &memStore{}, &usedTarget{}
			var store keymgr.StateStore = mem
			if tt.anyLineage {
				store = anyLineageStore{mem}
			}
			f := &keymgr.Follower{Store: store, Target: target, Now: func() time.Time { return h(2 * time.Hour) }}
			mem.put(cur)
			if _, err := f.Sync(context.Background()); err != nil {
				t.Fatal(err)
			}
			mem.put(anew)
			used, err := f.Sync(context.Background())
			switch {
			case tt.want == "" && (err != nil || !used):
				t.Fatalf("Sync = %v, %v; want the state used", used, err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want) || used):
				t.Fatalf("Sync = %v, %v; want refused with %q", used, err, tt.want)
			}
		})
	}
}

// anyLineageStore is a store whose states may change lineage, as a
// plugged-in directory's.
type anyLineageStore struct{ *memStore }

func (anyLineageStore) AnyLineage() bool { return true }
