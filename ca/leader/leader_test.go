package leader_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/meshca/meshca/ca/leader"
)

func TestRunRefuses(t *testing.T) {
	client := fake.NewClientset()
	run := func(context.Context) error { return nil }
	for _, tc := range []struct {
		name, ns, lease, id string
		run                 func(context.Context) error
	}{
		{"no namespace", "", "l", "me", run},
		{"no lease", "ns", "", "me", run},
		{"no identity", "ns", "l", "", run},
		{"no run", "ns", "l", "me", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := leader.Run(context.Background(), client, tc.ns, tc.lease, tc.id, tc.run, nil); err == nil {
				t.Fatal("want an error")
			}
		})
	}
}

func TestRunReturns(t *testing.T) {
	boom := errors.New("boom")
	for _, tc := range []struct {
		name   string
		run    func(ctx context.Context, cancel func()) error
		want   error
		wantOK bool // want nil
	}{
		{name: "run fails", run: func(context.Context, func()) error { return boom }, want: boom},
		{name: "run finishes", run: func(context.Context, func()) error { return nil }, wantOK: true},
		{name: "ctx ends", run: func(ctx context.Context, cancel func()) error {
			cancel()
			<-ctx.Done()
			return ctx.Err()
		}, wantOK: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client := fake.NewClientset()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			err := leader.Run(ctx, client, "ns", "lease", "me",
				func(lctx context.Context) error { return tc.run(lctx, cancel) }, nil)
			switch {
			case tc.wantOK && err != nil:
				t.Fatalf("err = %v, want nil", err)
			case !tc.wantOK && !errors.Is(err, tc.want):
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
			lease, err := client.CoordinationV1().Leases("ns").Get(context.Background(), "lease", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if h := lease.Spec.HolderIdentity; h != nil && *h != "" {
				t.Errorf("lease still held by %q after return", *h)
			}
		})
	}
}

// TestRunHoldsWhileWindingDown: when ctx ends, run's
// context ends at once, but the Lease stays this candidate's until run
// has returned: the work it finishes (a certificate being delivered) has
// no successor beside it. Then the Lease is released.
func TestRunHoldsWhileWindingDown(t *testing.T) {
	client := fake.NewClientset()
	holder := func() string {
		lease, err := client.CoordinationV1().Leases("ns").Get(context.Background(), "lease", metav1.GetOptions{})
		if err != nil || lease.Spec.HolderIdentity == nil {
			return ""
		}
		return *lease.Spec.HolderIdentity
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	windingDown := make(chan string, 1)
	err := leader.Run(ctx, client, "ns", "lease", "me", func(rctx context.Context) error {
		cancel()
		<-rctx.Done()
		time.Sleep(100 * time.Millisecond) // finishing the work in flight
		windingDown <- holder()
		return rctx.Err()
	}, nil)
	if err != nil {
		t.Fatalf("err = %v, want nil", err)
	}
	if h := <-windingDown; h != "me" {
		t.Errorf("while run wound down the Lease was held by %q, want me", h)
	}
	if h := holder(); h != "" {
		t.Errorf("lease still held by %q after return", h)
	}
}

// leadership records what a Run observer hears.
type leadership struct {
	mu    sync.Mutex
	heard []bool
}

func (l *leadership) observe(leading bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.heard = append(l.heard, leading)
}

func (l *leadership) last() (bool, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.heard) == 0 {
		return false, false
	}
	return l.heard[len(l.heard)-1], true
}

// TestRunObserves: the observer says true while run runs
// (the candidate leads) and false once it stopped; a candidate that
// never gets the Lease, held by another, never hears true.
func TestRunObserves(t *testing.T) {
	for _, tc := range []struct {
		name     string
		heldBy   string
		wantLead bool
	}{
		{name: "leads", wantLead: true},
		{name: "held by another", heldBy: "other"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client := fake.NewClientset()
			if tc.heldBy != "" {
				now, secs := metav1.NewMicroTime(time.Now()), int32(60)
				_, err := client.CoordinationV1().Leases("ns").Create(context.Background(), &coordinationv1.Lease{
					ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "lease"},
					Spec: coordinationv1.LeaseSpec{HolderIdentity: &tc.heldBy, LeaseDurationSeconds: &secs,
						AcquireTime: &now, RenewTime: &now},
				}, metav1.CreateOptions{})
				if err != nil {
					t.Fatal(err)
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			defer cancel()
			l := &leadership{}
			var during []bool
			err := leader.Run(ctx, client, "ns", "lease", "me", func(lctx context.Context) error {
				last, _ := l.last()
				during = append(during, last)
				cancel()
				<-lctx.Done()
				return nil
			}, nil, l.observe)
			if err != nil {
				t.Fatal(err)
			}
			if led := len(during) > 0; led != tc.wantLead || slices.Contains(during, false) {
				t.Fatalf("run ran %d times hearing %v, want leading=%v", len(during), during, tc.wantLead)
			}
			if last, ok := l.last(); !ok || last {
				t.Errorf("observer heard %v at the end, want false", l.heard)
			}
			if !tc.wantLead && slices.Contains(l.heard, true) {
				t.Errorf("observer heard %v without leading", l.heard)
			}
		})
	}
}
