package e2e

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshca/meshca/ca/caclient"
	"github.com/meshca/meshca/ca/leader"
	"github.com/meshca/meshca/ca/trust"
	"github.com/meshca/meshca/csr"
	"github.com/meshca/meshca/integration/harness"
	"github.com/meshca/meshca/integration/harness/checked"
	"github.com/meshca/meshca/keymgr/certs"
	"github.com/meshca/meshca/keymgr/secretstore"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

const haReplicas = 3

// The Leases replicas elect on, as the RBAC in deploy/ names them
// (ca/haTrustLease and RotatorLease).
const (
	haTrustLease   = "meshca-trust-publisher"
	haRotatorLease = "meshca-root-rotator"
)

// TestHAFailover: three replicas on one CA state Secret serve
// CreateCertificate at once; the controllers (trust publishing, automatic
// rotation) run on one elected replica each. SIGKILL of the trust
// publisher's leader: another replica takes its Lease within the lease
// duration and publishes to a namespace created after the kill, and the
// surviving replicas never stop serving.
func TestHAFailover(t *testing.T) {
	ns := cluster.Namespace(t, "ha")
	label := "meshca-ha-" + ns
	labelNamespace(t, ns, label)
	args := []string{"--state-secret", ns + "/meshca-ca", "--kubeconfig", cluster.Kubeconfig,
		"--publish-root-cert-configmaps", "--trust-lease-namespace", ns, "--trust-namespace-selector", label + "=true"}
	replicas := make([]*harness.Meshca, haReplicas)
	var wg sync.WaitGroup
	for i := range replicas {
		wg.Go(func() {
			m, err := harness.StartMeshcaProcess(bin, args...)
			if err != nil {
				t.Error(err)
				return
			}
			replicas[i] = m
		})
	}
	wg.Wait()
	for _, m := range replicas {
		if m != nil {
			t.Cleanup(func() {
				m.Stop()
				if t.Failed() {
					t.Logf("replica log:\n%s", m.Logs())
				}
			})
		}
	}
	if t.Failed() {
		t.FailNow()
	}

	ctx := context.Background()
	leaderOf := func(lease string) string {
		l, err := cluster.Client.CoordinationV1().Leases(ns).Get(ctx, lease, metav1.GetOptions{})
		if err != nil || l.Spec.HolderIdentity == nil {
			return ""
		}
		return *l.Spec.HolderIdentity
	}
	// owner is the replica whose log names identity.
	owner := func(identity string) int {
		for i, m := range replicas {
			if identity != "" && strings.Contains(m.Logs(), `"identity":"`+identity+`"`) {
				return i
			}
		}
		return -1
	}
	var first string
	waitUntil(t, "a trust publisher leader", 20*time.Second, func() bool { first = leaderOf(haTrustLease); return owner(first) >= 0 })
	killed := owner(first)
	waitUntil(t, "the ConfigMap in the labelled namespace", 10*time.Second, func() bool { return hasRootConfigMap(ns) })

	// Every replica serves; each gets a stream of requests of its own.
	st, _, err := (&secretstore.Store{Client: cluster.Client, Namespace: ns, Name: "meshca-ca"}).Load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	w := cluster.NewWorkload(t, cluster.Namespace(t, "ha-wl"), "web", "node-a")
	load := newHALoad(t, replicas, certs.Pool(st.Bundle()...), w)
	lctx, stop := context.WithCancel(ctx)
	loadDone := load.run(lctx)
	waitUntil(t, "requests served by every replica", 10*time.Second, func() bool { return load.allServed() })

	killedAt := time.Now()
	replicas[killed].Kill()
	var next string
	waitUntil(t, "another replica leading", leader.LeaseDuration+leader.RetryPeriod*22/10+5*time.Second, func() bool {
		next = leaderOf(haTrustLease)
		o := owner(next)
		return o >= 0 && o != killed
	})
	takeover := time.Since(killedAt)
	// A candidate sees the lease expire LeaseDuration after the last
	// renewal it observed (before the kill), and looks every RetryPeriod
	// stretched by client-go's jitter factor of 1.2: up to 2.2 RetryPeriods.
	if limit := leader.LeaseDuration + leader.RetryPeriod*22/10 + time.Second; takeover > limit {
		t.Errorf("takeover took %v, more than the lease duration and a jittered retry (%v)", takeover.Round(time.Millisecond), limit)
	}
	late := cluster.Namespace(t, "ha-late")
	labelNamespace(t, late, label)
	waitUntil(t, "the new leader publishing to a namespace created after the kill", 10*time.Second, func() bool { return hasRootConfigMap(late) })
	if r := leaderOf(haRotatorLease); owner(r) < 0 {
		t.Errorf("the rotator Lease is held by %q, no replica", r)
	}
	time.Sleep(time.Second) // a little more load on the survivors
	stop()
	<-loadDone

	for i := range replicas {
		ok, failed := load.ok[i].Load(), load.failed[i].Load()
		harness.Report(t, "replica %d: %d requests served, %d failed%s", i, ok, failed, map[bool]string{true: " (killed)"}[i == killed])
		if i != killed && failed > 0 {
			t.Errorf("replica %d, which was not killed, failed %d requests: %v", i, failed, load.lastErr[i].Load())
		}
	}
	harness.Report(t, "trust publisher %q killed; %q took over after %v", first, next, takeover.Round(time.Millisecond))
}

func labelNamespace(t *testing.T, ns, label string) {
	t.Helper()
	patch := fmt.Appendf(nil, `{"metadata":{"labels":{%q:"true"}}}`, label)
	if _, err := cluster.Client.CoreV1().Namespaces().Patch(context.Background(), ns, "application/merge-patch+json", patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}

func hasRootConfigMap(ns string) bool {
	_, err := cluster.Client.CoreV1().ConfigMaps(ns).Get(context.Background(), trust.ConfigMapName, metav1.GetOptions{})
	return err == nil
}

func waitUntil(t *testing.T, what string, within time.Duration, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("no %s within %v", what, within)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// haLoad sends one stream of CreateCertificate requests to each replica.
type haLoad struct {
	clients []*checked.Client
	id      spiffeid.ID
	csr     string
	ok      []atomic.Int64
	failed  []atomic.Int64
	lastErr []atomic.Value
}

func newHALoad(t *testing.T, replicas []*harness.Meshca, roots *x509.CertPool, w *harness.Workload) *haLoad {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	id := spiffeid.RequireFromSegments(spiffeid.RequireTrustDomainFromString("cluster.local"), "ns", w.Namespace, "sa", w.ServiceAccount)
	p, err := csr.Build(key, id)
	if err != nil {
		t.Fatal(err)
	}
	l := &haLoad{id: id, csr: string(p), ok: make([]atomic.Int64, len(replicas)), failed: make([]atomic.Int64, len(replicas)),
		lastErr: make([]atomic.Value, len(replicas))}
	token := harness.WriteToken(t, w.Token)
	for _, m := range replicas {
		c, err := checked.NewClient(t, caclient.Config{Addr: m.Addr, ServerName: "istiod.istio-system.svc", Roots: roots,
			ClusterID: "Kubernetes", TokenFile: token})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		l.clients = append(l.clients, c)
	}
	return l
}

// run sends requests until ctx ends; the channel closes when every stream
// has stopped.
func (l *haLoad) run(ctx context.Context) <-chan struct{} {
	done := make(chan struct{})
	var wg sync.WaitGroup
	for i, c := range l.clients {
		wg.Go(func() {
			for ctx.Err() == nil {
				rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				_, err := c.Call(rctx, l.csr, l.id, caclient.Options{TTL: time.Hour})
				cancel()
				switch {
				case ctx.Err() != nil:
					return
				case err != nil:
					l.failed[i].Add(1)
					l.lastErr[i].Store(err.Error())
				default:
					l.ok[i].Add(1)
				}
				time.Sleep(20 * time.Millisecond)
			}
		})
	}
	go func() { wg.Wait(); close(done) }()
	return done
}

func (l *haLoad) allServed() bool {
	for i := range l.clients {
		if l.ok[i].Load() == 0 {
			return false
		}
	}
	return true
}
