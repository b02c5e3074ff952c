package e2e

import (
	"bytes"
	"cmp"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/meshca/meshca/integration/harness"
	"github.com/meshca/meshca/keymgr"
	"github.com/meshca/meshca/keymgr/dirstore"
	"github.com/meshca/meshca/keymgr/secretstore"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// The fleet's default shape. Leaves of ten seconds (plus meshca's
// --backdate of one second) make a whole rotation take seconds, not
// minutes, and still give a renewal, due at half the leaf's life, 5.5 s
// before the leaf expires: a test process that a busy machine stalls for
// a few seconds (stallWatch) must not pass for a broken rotation.
const (
	fleetSize     = 50
	fleetLeafTTL  = 10 * time.Second
	fleetBackdate = time.Second
	fleetCheckers = 8
	// fleetMargin is the guards' margin: it must cover the time the
	// server takes to serve a state the CLI wrote, which it reloads at
	// least every keymgr.DefaultFollowInterval, plus a request's latency.
	fleetMargin = keymgr.DefaultFollowInterval + time.Second
)

// fleetTD is the fleet's trust domain, meshca's default.
var fleetTD = spiffeid.RequireTrustDomainFromString("cluster.local")

// TestRotationFleetHandshakes: root rotation breaks no handshake. A fleet
// of workloads, each renewing its SVID by half its leaf's life and
// trusting only the bundle of its own last reply, checks every ordered
// pair with a real mutual-TLS handshake (go-spiffe tlsconfig) again and
// again, while the CLI drives prepare → activate → retire on the state
// directory as fast as the guards allow.
func TestRotationFleetHandshakes(t *testing.T) {
	fleetRun{
		start: func(t *testing.T) fleetCA {
			s := startServer(t, "--backdate", fleetBackdate.String(), "--auto-rotate=false")
			return fleetCA{addrs: []string{s.Addr}, store: dirstore.Store{Dir: s.stateDir}, cli: []string{"--state-dir", s.stateDir}}
		},
		rotate: cliRotation,
	}.run(t)
}

// TestRotationFleetSecretStore: the same, with the CA state in a Secret
// of the real apiserver, which the server follows and the CLI rotates.
func TestRotationFleetSecretStore(t *testing.T) {
	fleetRun{
		start: func(t *testing.T) fleetCA {
			ns := cluster.Namespace(t, "fleet-state")
			m := harness.StartMeshca(t, bin, "--state-secret", ns+"/meshca-ca", "--kubeconfig", cluster.Kubeconfig,
				"--backdate", fleetBackdate.String(), "--auto-rotate=false")
			return fleetCA{addrs: []string{m.Addr}, store: &secretstore.Store{Client: cluster.Client, Namespace: ns, Name: "meshca-ca"},
				cli: []string{"--state-secret", ns + "/meshca-ca", "--kubeconfig", cluster.Kubeconfig}}
		},
		rotate: cliRotation,
	}.run(t)
}

// cliRotation drives prepare → activate → retire with `meshca root` as
// fast as the guards allow, without waiting for the fleet between steps.
func cliRotation(t *testing.T, ca fleetCA, f *fleet) {
	untilDone(t, "prepare", 10*time.Second, append([]string{"prepare", "--reason", "e2e fleet rotation"}, ca.cli...)...)
	untilDone(t, "activate", 3*f.leafTTL, append([]string{"activate", "--margin", fleetMargin.String()}, ca.cli...)...)
	untilDone(t, "retire", 3*f.leafTTL, append([]string{"retire", "--margin", fleetMargin.String()}, ca.cli...)...)
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

// fleetShape is a fleet's size and pace; the zero value of a field
// means the package's default.
type fleetShape struct {
	// size is how many workloads; checkers how many handshakes are in
	// flight; leafTTL the lifetime of the leaves the workloads ask for.
	size, checkers int
	leafTTL        time.Duration
}

func (s fleetShape) orDefaults() fleetShape {
	return fleetShape{size: cmp.Or(s.size, fleetSize), checkers: cmp.Or(s.checkers, fleetCheckers), leafTTL: cmp.Or(s.leafTTL, fleetLeafTTL)}
}

// fleet is the workloads and what they counted.
type fleet struct {
	fleetShape
	members []*member
	// oldRoot is the root the fleet starts with.
	oldRoot                     *x509.Certificate
	handshakes, failures, mixed atomic.Int64
	retried                     atomic.Int64 // undecided checks tried again
	stall                       stallWatch
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
// service account, Pod and token, spread over the CA servers at addrs,
// and fetches every first SVID.
func newFleet(t *testing.T, addrs []string, oldRoot *x509.Certificate, shape fleetShape) *fleet {
	t.Helper()
	f := &fleet{fleetShape: shape.orDefaults(), oldRoot: oldRoot, listening: make(chan struct{})}
	namespaces := []string{cluster.Namespace(t, "fleet-a"), cluster.Namespace(t, "fleet-b")}
	for i := range f.size {
		w := cluster.NewWorkload(t, namespaces[i%2], fmt.Sprintf("wl-%02d", i), fmt.Sprintf("node-%d", i%5))
		// Both namespaces on every server.
		addr := addrs[i/2%len(addrs)]
		f.members = append(f.members, &member{id: workloadID(w), td: fleetTD, tokenFile: harness.WriteToken(t, w.Token), caAddr: addr})
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
	f.wg.Go(func() { f.stall.run(ctx) })
	halfLife := (f.leafTTL + fleetBackdate) / 2
	for i, m := range f.members {
		f.wg.Go(func() { m.renewLoop(ctx, f, halfLife*time.Duration(i)/time.Duration(len(f.members))) })
	}
	f.wg.Go(func() {
		select {
		case <-ctx.Done():
			return
		case <-f.listening:
		}
		for range f.checkers {
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
// TLS 1.3, after the client's handshake is done) counts too. Every
// fourth check takes a pair whose leaves are of different roots instead,
// while there is one: the fleet holds both for only a few seconds, which
// a sweep of every pair on a slow machine may all but miss. A check that
// ends undecided (see undecided) is tried once more.
func (f *fleet) check(ctx context.Context) {
	n := int(f.next.Add(1)-1) % f.pairs()
	ci, si := n/(len(f.members)-1), n%(len(f.members)-1)
	if si >= ci {
		si++
	}
	client, srv := f.members[ci], f.members[si]
	if n%4 == 3 {
		if c, s, ok := f.mixedPair(); ok {
			client, srv = c, s
		}
	}
	if !sameIssuer(client, srv) {
		f.mixed.Add(1)
	}
	err := client.dial(ctx, srv.lis.Addr().String())
	if undecided(err) && ctx.Err() == nil && !f.stopping.Load() {
		f.retried.Add(1)
		err = client.dial(ctx, srv.lis.Addr().String())
	}
	if ctx.Err() != nil || f.stopping.Load() {
		return
	}
	f.handshakes.Add(1)
	if err != nil {
		f.failures.Add(1)
		f.record(fmt.Sprintf("%s → %s: %v", client.id, srv.id, err))
	}
}

// undecided reports whether a check ended without a trust decision: a
// refused certificate is a verification error on the client's side or an
// alert from the server, at once; a timeout, or a server hanging up
// without an alert (its own deadline passed), is a process a busy
// machine stalled for seconds.
func undecided(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout() || errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET)
}

// mixedPair is a random client and a server whose leaf is of another
// root than the client's, if the fleet has one.
func (f *fleet) mixedPair() (client, srv *member, ok bool) {
	client = f.members[rand.N(len(f.members))]
	off := rand.N(len(f.members))
	for i := range f.members {
		if s := f.members[(off+i)%len(f.members)]; !sameIssuer(client, s) {
			return client, s, true
		}
	}
	return nil, nil, false
}

// sameIssuer reports whether a's and b's leaves were issued by one
// authority.
func sameIssuer(a, b *member) bool {
	return bytes.Equal(a.current().caSVID.Chain[0].AuthorityKeyId, b.current().caSVID.Chain[0].AuthorityKeyId)
}

// waitFor polls cond until it holds, failing the test after timeout.
func (f *fleet) waitFor(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(timeout); !cond(); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("still waiting for %s after %v (handshakes %d, failures %d, failed requests %d); the first errors:\n%s", what, timeout,
				f.handshakes.Load(), f.failures.Load(), f.requestErrors.Load(), strings.Join(f.firstErrors(), "\n"))
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

// stallWatch measures how much later than asked the test process wakes
// up: a machine busy enough to stall it delays renewals and handshakes.
type stallWatch struct{ worst atomic.Int64 }

func (w *stallWatch) run(ctx context.Context) {
	const every = 100 * time.Millisecond
	for last := time.Now(); ; {
		select {
		case <-ctx.Done():
			return
		case <-time.After(every):
			now := time.Now()
			if late := now.Sub(last) - every; late > time.Duration(w.worst.Load()) {
				w.worst.Store(int64(late))
			}
			last = now
		}
	}
}

func (w *stallWatch) longest() time.Duration {
	return time.Duration(w.worst.Load()).Round(time.Millisecond)
}
