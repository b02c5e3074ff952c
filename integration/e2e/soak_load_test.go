package e2e

import (
	"context"
	"crypto/x509"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshca/meshca/integration/harness"
	"github.com/meshca/meshca/integration/load"
	authpb "github.com/meshca/meshca/proto/istio/v1/auth"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// The soak's legitimate load, ztunnel-shaped: on each of soakNodes
// nodes a ztunnel (a token bound to its Pod, one connection it keeps)
// renews the SVIDs of soakPodsPerNode Pods of its node by
// ImpersonatedIdentity, soakZtunnelRate requests a second; and
// soakWorkloads workloads each renew their own with their own bound
// token once every soakWorkloadEvery, over a new connection each time,
// as a new Pod's istio-agent does. Each client has an address of its
// own (127.0.1.x), none an attacker's, and half of them talk to each
// replica. Requests are sent on a clock, not after the previous one
// ends, so a slow answer does not hide the ones it delays.
const (
	soakNodes          = 4
	soakPodsPerNode    = 8
	soakZtunnelRate    = 8
	soakWorkloads      = 4
	soakWorkloadEvery  = time.Second
	soakRequestTimeout = 10 * time.Second
)

// soakLoad is the legitimate clients and the latencies they measure.
type soakLoad struct {
	ztunnels  []*soakZtunnel
	workloads []*soakWorkload
	rec       atomic.Pointer[soakLatency]
	wg        sync.WaitGroup
}

type soakZtunnel struct {
	conn *load.Conn
	reqs []*authpb.IstioCertificateRequest
}

type soakWorkload struct {
	target load.Target
	from   net.IP
	token  string
	reqs   []*authpb.IstioCertificateRequest
}

// newSoakLoad creates the nodes' ztunnels and Pods and the workloads on
// the real apiserver, and builds every CSR before anything is measured.
func newSoakLoad(t *testing.T, system, apps string, replicas []*harness.Meshca, roots *x509.CertPool) *soakLoad {
	t.Helper()
	td := spiffeid.RequireTrustDomainFromString("cluster.local")
	cluster.ServiceAccount(t, system, "ztunnel")
	l := &soakLoad{}
	l.rec.Store(newSoakLatency())
	target := func(i int) load.Target { return load.Target{Addr: replicas[i%len(replicas)].Addr, Roots: roots} }
	for n := range soakNodes {
		node := fmt.Sprintf("soak-node-%d", n)
		var ids []spiffeid.ID
		for p := range soakPodsPerNode {
			sa := fmt.Sprintf("w-%d-%d", n, p)
			cluster.ServiceAccount(t, apps, sa)
			cluster.Pod(t, apps, sa+"-0", sa, node)
			ids = append(ids, spiffeid.RequireFromSegments(td, "ns", apps, "sa", sa))
		}
		pod := "ztunnel-" + node
		cluster.Pod(t, system, pod, "ztunnel", node)
		conn, err := target(n).DialFrom(net.IPv4(127, 0, 1, byte(1+n)), cluster.Token(t, system, "ztunnel", pod, []string{"istio-ca"}, time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		l.ztunnels = append(l.ztunnels, &soakZtunnel{conn: conn, reqs: soakRequests(t, ids, true)})
	}
	for i := range soakWorkloads {
		w := cluster.NewWorkload(t, apps, fmt.Sprintf("own-%d", i), fmt.Sprintf("soak-node-%d", i%soakNodes))
		id := spiffeid.RequireFromSegments(td, "ns", apps, "sa", w.ServiceAccount)
		l.workloads = append(l.workloads, &soakWorkload{target: target(i), from: net.IPv4(127, 0, 1, byte(101+i)), token: w.Token,
			reqs: soakRequests(t, []spiffeid.ID{id}, false)})
	}
	return l
}

func soakRequests(t *testing.T, ids []spiffeid.ID, impersonate bool) []*authpb.IstioCertificateRequest {
	t.Helper()
	reqs, _, err := load.Requests(ids, 2, impersonate)
	if err != nil {
		t.Fatal(err)
	}
	return reqs
}

// warm sends one request of every client, so that the first TLS
// handshakes and TokenReviews are behind the baseline.
func (l *soakLoad) warm(t *testing.T) {
	t.Helper()
	for _, z := range l.ztunnels {
		if err := z.conn.Call(z.reqs[0]); err != nil {
			t.Fatalf("a ztunnel's first request: %v", err)
		}
	}
	for _, w := range l.workloads {
		if err := w.call(w.reqs[0]); err != nil {
			t.Fatalf("a workload's first request: %v", err)
		}
	}
}

// run sends the load until ctx ends; the channel closes once every
// request sent has ended.
func (l *soakLoad) run(ctx context.Context) <-chan struct{} {
	for _, z := range l.ztunnels {
		l.every(ctx, time.Second/soakZtunnelRate, "node proxy", func(i int) error {
			return z.conn.Call(z.reqs[i%len(z.reqs)])
		})
	}
	for _, w := range l.workloads {
		l.every(ctx, soakWorkloadEvery, "new connection", func(i int) error { return w.call(w.reqs[i%len(w.reqs)]) })
	}
	done := make(chan struct{})
	go func() {
		<-ctx.Done()
		l.wg.Wait()
		close(done)
	}()
	return done
}

// every starts call(i) each period in a goroutine of its own, timed
// from when it was due, into the recorder of that moment.
func (l *soakLoad) every(ctx context.Context, period time.Duration, class string, call func(i int) error) {
	l.wg.Go(func() {
		t := time.NewTicker(period)
		defer t.Stop()
		for i := 0; ; i++ {
			select {
			case <-ctx.Done():
				return
			case due := <-t.C:
				rec := l.rec.Load()
				l.wg.Go(func() {
					err := call(i)
					rec.add(class, time.Since(due), err)
				})
			}
		}
	})
}

// begin starts a new phase's recorder and returns the last one's, to
// which the requests already sent still count.
func (l *soakLoad) begin() *soakLatency { return l.rec.Swap(newSoakLatency()) }

func (w *soakWorkload) call(req *authpb.IstioCertificateRequest) error {
	c, err := w.target.DialFrom(w.from, w.token)
	if err != nil {
		return err
	}
	defer c.Close()
	return c.Call(req)
}

// soakLatency is what the legitimate requests of one phase saw.
type soakLatency struct {
	mu     sync.Mutex
	lat    map[string][]time.Duration // by class, and "" for all
	failed int
	errs   map[string]int
}

func newSoakLatency() *soakLatency {
	return &soakLatency{lat: map[string][]time.Duration{}, errs: map[string]int{}}
}

func (r *soakLatency) add(class string, d time.Duration, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err != nil {
		r.failed++
		r.errs[class+": "+err.Error()]++
		return
	}
	r.lat[class] = append(r.lat[class], d)
	r.lat[""] = append(r.lat[""], d)
}

// pct is the latency under which fraction p of class's requests ended.
func (r *soakLatency) pct(class string, p float64) time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	l := slices.Sorted(slices.Values(r.lat[class]))
	if len(l) == 0 {
		return 0
	}
	return l[min(len(l)-1, int(float64(len(l))*p))]
}

func (r *soakLatency) served(class string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.lat[class])
}

func (r *soakLatency) failures() (int, string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var msgs []string
	for msg, n := range r.errs {
		msgs = append(msgs, fmt.Sprintf("%d× %s", n, msg))
	}
	slices.Sort(msgs)
	return r.failed, strings.Join(msgs[:min(len(msgs), 3)], "; ")
}

func (r *soakLatency) String() string {
	ms := func(d time.Duration) string { return fmt.Sprintf("%.1fms", float64(d.Microseconds())/1000) }
	failed, why := r.failures()
	s := fmt.Sprintf("%d served, %d failed; p50 %s p99 %s max %s (node proxies p99 %s, new connections p99 %s)",
		r.served(""), failed, ms(r.pct("", 0.5)), ms(r.pct("", 0.99)), ms(r.pct("", 1)), ms(r.pct("node proxy", 0.99)), ms(r.pct("new connection", 0.99)))
	if failed > 0 {
		s += ": " + why
	}
	return s
}
