package e2e

import (
	"cmp"
	"context"
	"crypto/x509"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/meshca/meshca/ca/trust"
	"github.com/meshca/meshca/integration/harness"
	"github.com/meshca/meshca/keymgr"
)

// fleetRun is one root rotation under the fleet's load: how the CA
// servers start, how the rotation is driven, and how long the fleet
// waits for it.
type fleetRun struct {
	fleetShape
	// start starts the CA servers the fleet talks to.
	start func(t *testing.T) fleetCA
	// rotate drives the rotation once the fleet handshakes, and returns
	// once the old root is retired; nil when the servers rotate by
	// themselves.
	rotate func(t *testing.T, ca fleetCA, f *fleet)
	// settle bounds the wait, once rotate returns, for the old root to
	// leave every member's bundle; three leaf lifetimes when zero.
	settle time.Duration
	// auto: every step after the first root's bootstrap must have been
	// taken by automatic rotation.
	auto bool
	// renewals: intermediates are renewed from an upstream meanwhile,
	// each an authority of its own, prepared when it is made.
	renewals bool
}

// fleetCA is the CA a fleet talks to.
type fleetCA struct {
	// addrs are the servers' gRPC addresses; the members are spread
	// over them.
	addrs []string
	// store is the CA state the servers share; cli names it for
	// `meshca root`.
	store keymgr.StateStore
	cli   []string
	// crlNS, when set, is the namespace whose istio-ca-crl every member
	// loads and checks each peer chain against (fleet_crl_test.go).
	crlNS string
}

// run takes the fleet through one rotation and fails the test on any
// failed handshake or CSR request, or on a history that shows a step
// taken twice. It returns the final CA state.
func (r fleetRun) run(t *testing.T) *keymgr.State {
	t.Helper()
	began := time.Now()
	ca := r.start(t)
	first := loadState(t, ca.store)
	roots := first.Bundle()
	if len(roots) != 1 {
		t.Fatalf("%d roots before the rotation, want 1", len(roots))
	}
	// The authority rotated away from: its root's, or an intermediate's
	// under it (--upstream).
	oldID := first.Active().ID()
	f := newFleet(t, ca.addrs, roots[0], r.fleetShape)
	t.Logf("fleet of %d workloads on %d server(s) ready after %v", len(f.members), len(ca.addrs), time.Since(began).Round(time.Millisecond))

	ctx, cancel := context.WithCancel(context.Background())
	var crl *crlFile
	if ca.crlNS != "" {
		crl = watchCRL(t, ctx, ca.crlNS)
		for _, m := range f.members {
			m.crl = crl
		}
	}
	stop := f.run(ctx)
	defer stop()
	defer cancel()
	if err := f.listen(); err != nil {
		t.Fatal(err)
	}
	// The fleet handshakes before the rotation: as many handshakes as
	// the checkers make in a second or two (on two busy cores, under
	// -race).
	f.waitFor(t, "handshakes before the rotation", 30*time.Second, func() bool { return f.handshakes.Load() >= int64(25*f.checkers) })
	rotationBegan := time.Now()
	if r.rotate != nil {
		// No waiting for the fleet between the steps: the guards alone
		// decide.
		r.rotate(t, ca, f)
	}
	f.waitFor(t, "the old root to leave every bundle", cmp.Or(r.settle, 3*f.leafTTL), func() bool {
		return f.all(func(m *member) bool { return !trusts(m.current().caSVID.Roots, f.oldRoot) })
	})
	rotated := time.Since(rotationBegan)
	// A little longer without the old root, then stop and count.
	time.Sleep(3 * time.Second)
	cancel()
	stop()

	final := loadState(t, ca.store)
	prepared, activated, retired := stepTimes(final, oldID)
	since := func(at time.Time) time.Duration { return at.Sub(rotationBegan).Round(time.Millisecond) }
	t.Logf("rotation (from the fleet's first handshakes): prepared after %v, activated after %v, retired after %v, old root gone from every bundle after %v",
		since(prepared), since(activated), since(retired), rotated.Round(time.Millisecond))
	harness.Report(t, "handshakes %d (%d full sweeps of the %d ordered pairs, %d between leaves of different roots, %d undecided and tried again), failures %d",
		f.handshakes.Load(), f.handshakes.Load()/int64(f.pairs()), f.pairs(), f.mixed.Load(), f.retried.Load(), f.failures.Load())
	harness.Report(t, "CSR requests %d (leaves of the old root %d, of later roots %d), failed requests %d; test took %v",
		f.requests.Load(), f.oldLeaves.Load(), f.newLeaves.Load(), f.requestErrors.Load(), time.Since(began).Round(time.Millisecond))
	if crl != nil {
		harness.Report(t, "peer chains checked against %s by crlverify Strict %d; the CRL file loaded %d times", trust.CRLConfigMapName, crl.checks.Load(), crl.loads.Load())
	}
	// Leaves of seconds leave seconds of slack: on a machine so busy that
	// it stalls the test process that long, look here first.
	t.Logf("longest stall of the test process: %v", f.stall.longest())
	if n := f.failures.Load(); n != 0 {
		t.Errorf("%d handshakes failed; the first:\n%s", n, strings.Join(f.firstErrors(), "\n"))
	}
	if n := f.requestErrors.Load(); n != 0 {
		t.Errorf("%d CSR requests failed; the first:\n%s", n, strings.Join(f.firstErrors(), "\n"))
	}
	switch {
	case f.oldLeaves.Load() == 0 || f.newLeaves.Load() == 0:
		t.Errorf("leaves of the old root %d, of later roots %d: both should have signed", f.oldLeaves.Load(), f.newLeaves.Load())
	case f.mixed.Load() == 0:
		t.Error("no handshake between leaves of different roots: the rotation was never exercised under load")
	}
	checkHistory(t, final, oldID, r.auto, r.renewals)
	return final
}

// loadState reads the CA state in store.
func loadState(t *testing.T, store keymgr.StateStore) *keymgr.State {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, _, err := store.Load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// trusts reports whether roots holds root.
func trusts(roots []*x509.Certificate, root *x509.Certificate) bool {
	for _, r := range roots {
		if r.Equal(root) {
			return true
		}
	}
	return false
}

// lifecycle is the order of an authority's phases; each is entered once.
var lifecycle = []keymgr.Phase{keymgr.PhasePrepared, keymgr.PhaseActive, keymgr.PhasePrevious, keymgr.PhaseRetired}

// enteredAt is when a entered phase; zero if it never did.
func enteredAt(a *keymgr.AuthorityRecord, phase keymgr.Phase) time.Time {
	for _, tr := range a.History {
		if tr.To == phase {
			return tr.At
		}
	}
	return time.Time{}
}

// successor is the authority that superseded the one of oldID: active
// from the moment that one became previous.
func successor(st *keymgr.State, oldID string) (old, next *keymgr.AuthorityRecord) {
	for _, a := range st.Authorities {
		if a.ID() == oldID {
			old = a
		}
	}
	if old == nil {
		return nil, nil
	}
	for _, a := range st.Authorities {
		if a != old && !enteredAt(a, keymgr.PhaseActive).IsZero() && enteredAt(a, keymgr.PhaseActive).Equal(enteredAt(old, keymgr.PhasePrevious)) {
			next = a
		}
	}
	return old, next
}

// stepTimes are the moments of the rotation away from the authority of
// oldID, from the state's history: its successor prepared and activated,
// and it retired.
func stepTimes(st *keymgr.State, oldID string) (prepared, activated, retired time.Time) {
	old, next := successor(st, oldID)
	if old == nil || next == nil {
		return
	}
	return enteredAt(next, keymgr.PhasePrepared), enteredAt(next, keymgr.PhaseActive), enteredAt(old, keymgr.PhaseRetired)
}

// checkHistory checks that the state's history shows the rotation away
// from oldID done once: every authority entered each phase it reached
// exactly once and in order, the old one is retired, and only one
// authority (its successor) was prepared before that, but intermediates
// renewed from an upstream when renewals; with auto, every step but the
// first root's bootstrap was automatic.
func checkHistory(t *testing.T, st *keymgr.State, oldID string, auto, renewals bool) {
	t.Helper()
	for _, a := range st.Authorities {
		var phases []string
		ok := len(a.History) > 0 && a.History[len(a.History)-1].To == a.Phase
		for i, tr := range a.History {
			phases = append(phases, fmt.Sprintf("%s at %s (%s)", tr.To, tr.At.Format(time.StampMilli), tr.Reason))
			ok = ok && i < len(lifecycle) && tr.To == lifecycle[i]
			if auto && a.ID() != oldID && !strings.Contains(tr.Reason, "automatic rotation") {
				t.Errorf("authority %.16s entered %s by no automatic step: %q", a.ID(), tr.To, tr.Reason)
			}
		}
		if !ok {
			t.Errorf("authority %.16s (%s): each phase must be entered once, in order; history:\n%s", a.ID(), a.Phase, strings.Join(phases, "\n"))
		}
	}
	old, next := successor(st, oldID)
	switch {
	case old == nil:
		t.Fatalf("the first authority %.16s is gone from the state", oldID)
	case old.Phase != keymgr.PhaseRetired:
		t.Fatalf("the first authority is %s, not retired", old.Phase)
	case next == nil:
		t.Fatal("no authority became active when the first one became previous")
	}
	retired := enteredAt(old, keymgr.PhaseRetired)
	for _, a := range st.Authorities {
		renewal := renewals && a.Renewed() && len(a.History) > 0 && strings.Contains(a.History[0].Reason, "renewed from upstream")
		if a != old && a != next && !renewal && enteredAt(a, keymgr.PhasePrepared).Before(retired) {
			t.Errorf("authority %.16s was prepared at %s, before the first one retired (%s): a step taken twice",
				a.ID(), enteredAt(a, keymgr.PhasePrepared).Format(time.StampMilli), retired.Format(time.StampMilli))
		}
	}
	if auto && len(old.History) > 2 {
		for _, tr := range old.History[2:] {
			if !strings.Contains(tr.Reason, "automatic rotation") {
				t.Errorf("the first authority became %s by no automatic step: %q", tr.To, tr.Reason)
			}
		}
	}
}
