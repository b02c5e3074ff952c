package e2e

import (
	"bytes"
	"context"
	"crypto/x509"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshca/meshca/integration/harness"
	"github.com/meshca/meshca/internal/pemutil"
	"github.com/meshca/meshca/keymgr"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// The fleet's shape: leaves of a few seconds (plus meshca's --backdate of
// one second) make a whole rotation take seconds, not minutes.
const (
	fleetSize     = 50
	fleetLeafTTL  = 6 * time.Second
	fleetBackdate = time.Second
	fleetCheckers = 8
	// fleetMargin is the activation guard's margin: it must cover the time
	// the server takes to serve a state the CLI wrote, which it reloads at
	// least every keymgr.DefaultFollowInterval, plus a request's latency.
	fleetMargin = keymgr.DefaultFollowInterval + time.Second
)

// TestRotationFleetHandshakes: root rotation breaks no handshake. A fleet
// of workloads, each renewing its SVID at half its leaf's life and
// trusting only the bundle of its own last reply, checks every ordered
// pair with a real mutual-TLS handshake (go-spiffe tlsconfig) again and
// again, while the CLI drives prepare → activate → retire as fast as the
// guards allow.
func TestRotationFleetHandshakes(t *testing.T) {
	began := time.Now()
	s := startServer(t, "--backdate", fleetBackdate.String(), "--auto-rotate=false")
	td := spiffeid.RequireTrustDomainFromString("cluster.local")
	fleet := newFleet(t, s, td)
	oldRoot := fleet.oldRoot
	t.Logf("fleet of %d workloads ready after %v", len(fleet.members), time.Since(began).Round(time.Millisecond))

	ctx, cancel := context.WithCancel(context.Background())
	stop := fleet.run(ctx)
	defer stop()
	defer cancel()
	if err := fleet.listen(); err != nil {
		t.Fatal(err)
	}

	fleet.waitFor(t, "handshakes before the rotation", 10*time.Second, func() bool { return fleet.handshakes.Load() >= 500 })
	st := "--state-dir=" + s.stateDir
	rotationBegan := time.Now()
	untilDone(t, "prepare", 10*time.Second, "prepare", st, "--reason", "e2e fleet rotation")
	// No waiting for the fleet between the steps: the guards alone decide.
	untilDone(t, "activate", 3*fleetLeafTTL, "activate", st, "--margin", fleetMargin.String())
	activated := time.Since(rotationBegan)
	untilDone(t, "retire", 3*fleetLeafTTL, "retire", st)
	retired := time.Since(rotationBegan)
	fleet.waitFor(t, "every workload trusting only the new root", 3*fleetLeafTTL, func() bool {
		return fleet.all(func(m *member) bool {
			r := m.current().caSVID.Roots
			return len(r) == 1 && !r[0].Equal(oldRoot)
		})
	})
	rotated := time.Since(rotationBegan)
	// A little longer on the new root alone, then stop and count.
	time.Sleep(fleetLeafTTL / 2)
	cancel()
	stop()

	f := fleet
	t.Logf("rotation: activated after %v, retired after %v, old root gone from every bundle after %v",
		activated.Round(time.Millisecond), retired.Round(time.Millisecond), rotated.Round(time.Millisecond))
	t.Logf("handshakes %d (%d full sweeps of the %d ordered pairs, %d between leaves of different roots), failures %d",
		f.handshakes.Load(), f.handshakes.Load()/int64(f.pairs()), f.pairs(), f.mixed.Load(), f.failures.Load())
	t.Logf("CSR requests %d (leaves of the old root %d, of the new root %d), failed requests %d; test took %v",
		f.requests.Load(), f.oldLeaves.Load(), f.newLeaves.Load(), f.requestErrors.Load(), time.Since(began).Round(time.Millisecond))
	if n := f.failures.Load(); n != 0 {
		t.Errorf("%d handshakes failed; the first:\n%s", n, strings.Join(f.firstErrors(), "\n"))
	}
	if n := f.requestErrors.Load(); n != 0 {
		t.Errorf("%d CSR requests failed; the first:\n%s", n, strings.Join(f.firstErrors(), "\n"))
	}
	switch {
	case f.oldLeaves.Load() == 0 || f.newLeaves.Load() == 0:
		t.Errorf("leaves of the old root %d, of the new root %d: both roots should have signed", f.oldLeaves.Load(), f.newLeaves.Load())
	case f.mixed.Load() == 0:
		t.Error("no handshake between leaves of different roots: the rotation was never exercised under load")
	}
}

// untilDone runs `meshca root args...` until it succeeds: a refusal by a
// guard (exit 1) is retried until timeout, anything else fails the test.
func untilDone(t *testing.T, step string, timeout time.Duration, args ...string) {
	t.Helper()
	for deadline := time.Now().Add(timeout); ; time.Sleep(250 * time.Millisecond) {
		out, code := rootStep(t, args...)
		switch {
		case code == 0:
			return
		case code != 1:
			t.Fatalf("%s: exit %d\n%s", step, code, out)
		case time.Now().After(deadline):
			t.Fatalf("%s still refused after %v\n%s", step, timeout, out)
		}
	}
}

// fleet is the workloads and what they counted.
type fleet struct {
	members []*member
	// oldRoot is the root the fleet starts with.
	oldRoot                     *x509.Certificate
	handshakes, failures, mixed atomic.Int64
	requests, requestErrors     atomic.Int64
	oldLeaves, newLeaves        atomic.Int64
	next                        atomic.Int64 // the next pair to check
	stopping                    atomic.Bool
	listening                   chan struct{} // closed once every member listens
	wg                          sync.WaitGroup
	errMu                       sync.Mutex
	errs                        []string
}

// newFleet creates the workloads in two namespaces, each with its own
// service account, Pod and token, and fetches every first SVID.
func newFleet(t *testing.T, s *server, td spiffeid.TrustDomain) *fleet {
	t.Helper()
	roots, err := pemutil.ParseCertificates(s.rootsPEM)
	if err != nil || len(roots) != 1 {
		t.Fatalf("%d roots before the rotation: %v", len(roots), err)
	}
	f := &fleet{oldRoot: roots[0], listening: make(chan struct{})}
	namespaces := []string{cluster.Namespace(t, "fleet-a"), cluster.Namespace(t, "fleet-b")}
	for i := range fleetSize {
		w := cluster.NewWorkload(t, namespaces[i%2], fmt.Sprintf("wl-%02d", i), fmt.Sprintf("node-%d", i%5))
		m := &member{id: workloadID(w), td: td, tokenFile: harness.WriteToken(t, w.Token), caAddr: s.Addr}
		f.members = append(f.members, m)
	}
	var wg sync.WaitGroup
	errs := make([]error, len(f.members))
	for i, m := range f.members {
		wg.Go(func() { errs[i] = m.renew(context.Background(), f) })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatalf("first SVID: %v", err)
		}
	}
	t.Cleanup(func() {
		for _, m := range f.members {
			m.closeClient()
		}
	})
	return f
}

// run starts every member's renewal loop, and the checkers once every
// member listens; the returned stop closes the listeners and waits for
// every goroutine (cancel ctx first).
func (f *fleet) run(ctx context.Context) (stop func()) {
	halfLife := (fleetLeafTTL + fleetBackdate) / 2
	for i, m := range f.members {
		f.wg.Go(func() { m.renewLoop(ctx, f, halfLife*time.Duration(i)/time.Duration(len(f.members))) })
	}
	f.wg.Go(func() {
		select {
		case <-ctx.Done():
			return
		case <-f.listening:
		}
		for range fleetCheckers {
			f.wg.Go(func() {
				for ctx.Err() == nil {
					f.check(ctx)
				}
			})
		}
	})
	var once sync.Once
	return func() {
		once.Do(func() {
			f.stopping.Store(true)
			for _, m := range f.members {
				if m.lis != nil {
					m.lis.Close()
				}
			}
			f.wg.Wait()
		})
	}
}

// listen opens every member's listener, then lets the checkers start.
func (f *fleet) listen() error {
	for _, m := range f.members {
		if err := m.listen(&f.wg); err != nil {
			return err
		}
	}
	close(f.listening)
	return nil
}

// pairs is how many ordered pairs the fleet has.
func (f *fleet) pairs() int { return len(f.members) * (len(f.members) - 1) }

// check takes the next ordered pair (client, server), handshakes and
// reads one byte, so that a server refusing the client's certificate (in
// TLS 1.3, after the client's handshake is done) counts too.
func (f *fleet) check(ctx context.Context) {
	n := int(f.next.Add(1)-1) % f.pairs()
	ci, si := n/(len(f.members)-1), n%(len(f.members)-1)
	if si >= ci {
		si++
	}
	client, srv := f.members[ci], f.members[si]
	if !bytes.Equal(client.current().caSVID.Chain[0].AuthorityKeyId, srv.current().caSVID.Chain[0].AuthorityKeyId) {
		f.mixed.Add(1)
	}
	err := client.dial(ctx, srv.lis.Addr().String())
	if ctx.Err() != nil || f.stopping.Load() {
		return
	}
	f.handshakes.Add(1)
	if err != nil {
		f.failures.Add(1)
		f.record(fmt.Sprintf("%s → %s: %v", client.id, srv.id, err))
	}
}

// waitFor polls cond until it holds, failing the test after timeout.
func (f *fleet) waitFor(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(timeout); !cond(); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no %s within %v (handshakes %d, failures %d)", what, timeout, f.handshakes.Load(), f.failures.Load())
		}
	}
}

// all reports whether every member satisfies cond.
func (f *fleet) all(cond func(*member) bool) bool {
	for _, m := range f.members {
		if !cond(m) {
			return false
		}
	}
	return true
}

// record keeps the first few error messages.
func (f *fleet) record(msg string) {
	f.errMu.Lock()
	defer f.errMu.Unlock()
	if len(f.errs) < 5 {
		f.errs = append(f.errs, msg)
	}
}

func (f *fleet) firstErrors() []string {
	f.errMu.Lock()
	defer f.errMu.Unlock()
	return append([]string(nil), f.errs...)
}
