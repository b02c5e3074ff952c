package e2e

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/meshca/meshca/ca/leader"
	"github.com/meshca/meshca/ca/trust"
	"github.com/meshca/meshca/integration/harness"
)

// trustBundle is a trust bundle the tests change.
type trustBundle struct{ v atomic.Value }

func (b *trustBundle) set(s string) { b.v.Store(trust.Bundle{PEM: []byte(s)}) }
func (b *trustBundle) get() trust.Bundle {
	v, _ := b.v.Load().(trust.Bundle)
	return v
}

// trustClient is a client of its own, with room for bursts of writes.
func trustClient(t *testing.T) kubernetes.Interface {
	t.Helper()
	cfg := rest.CopyConfig(cluster.Config)
	cfg.QPS, cfg.Burst = 100, 200
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// trustNamespace creates a namespace with the given labels, deleted at
// cleanup (it then stays terminating: there is no namespace controller).
func trustNamespace(t *testing.T, prefix string, lbls map[string]string) string {
	t.Helper()
	ns, err := cluster.Client.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{
		ObjectMeta: metav1.ObjectMeta{GenerateName: prefix + "-", Labels: lbls},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cluster.Client.CoreV1().Namespaces().Delete(context.Background(), ns.Name, metav1.DeleteOptions{})
	})
	return ns.Name
}

// startPublisher runs a Publisher until the test ends.
func startPublisher(t *testing.T, c trust.Config) *trust.Publisher {
	t.Helper()
	if c.Client == nil {
		c.Client = trustClient(t)
	}
	p, err := trust.NewPublisher(c)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return p
}

// runLabel selects this test's namespaces only: the cluster is shared.
func runLabel(t *testing.T) (map[string]string, labels.Selector) {
	l := map[string]string{"meshca-trust-test": fmt.Sprintf("r%d", time.Now().UnixNano())}
	return l, labels.SelectorFromSet(l)
}

func rootConfigMap(t *testing.T, ns string) *corev1.ConfigMap {
	t.Helper()
	cm, err := cluster.Client.CoreV1().ConfigMaps(ns).Get(context.Background(), trust.ConfigMapName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return cm
}

func holdsBundle(cm *corev1.ConfigMap, pem string) bool {
	return cm != nil && cm.Data[trust.DataKey] == pem && cm.Labels[trust.LabelKey] == trust.LabelValue
}

// waitPublished waits up to 5 s until every namespace holds pem.
func waitPublished(t *testing.T, what, pem string, nss ...string) time.Duration {
	t.Helper()
	start := time.Now()
	for _, ns := range nss {
		for !holdsBundle(rootConfigMap(t, ns), pem) {
			if time.Since(start) > 5*time.Second {
				t.Fatalf("%s: %s does not hold the bundle within 5s: %+v", what, ns, rootConfigMap(t, ns))
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return time.Since(start)
}

func TestTrustPublishUpdateRepair(t *testing.T) {
	lbls, sel := runLabel(t)
	nss := []string{trustNamespace(t, "trust-a", lbls), trustNamespace(t, "trust-b", lbls)}
	var b trustBundle
	b.set("root-1\n")
	p := startPublisher(t, trust.Config{Bundle: b.get, Selector: sel})
	waitPublished(t, "existing namespaces", "root-1\n", nss...)

	nss = append(nss, trustNamespace(t, "trust-c", lbls))
	waitPublished(t, "a new namespace", "root-1\n", nss[2])

	b.set("root-1\nroot-2\n")
	p.BundleChanged()
	took := waitPublished(t, "bundle change", "root-1\nroot-2\n", nss...)
	harness.Report(t, "bundle change published to %d namespaces in %v", len(nss), took)

	ctx := context.Background()
	cms := cluster.Client.CoreV1().ConfigMaps(nss[0])
	cm := rootConfigMap(t, nss[0])
	cm.Data[trust.DataKey] = "tampered"
	if _, err := cms.Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPublished(t, "edited data", "root-1\nroot-2\n", nss[0])

	cm = rootConfigMap(t, nss[1])
	cm.Labels[trust.LabelKey] = "false"
	if _, err := cluster.Client.CoreV1().ConfigMaps(nss[1]).Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPublished(t, "edited label", "root-1\nroot-2\n", nss[1])

	if err := cluster.Client.CoreV1().ConfigMaps(nss[2]).Delete(ctx, trust.ConfigMapName, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPublished(t, "deleted", "root-1\nroot-2\n", nss[2])
}

func TestTrustSkipsSystemAndConfiguredNamespaces(t *testing.T) {
	for _, ns := range []string{"kube-public", "kube-node-lease"} {
		if rootConfigMap(t, ns) != nil {
			t.Fatalf("%s already holds %s; this test cannot tell", ns, trust.ConfigMapName)
		}
	}
	// kube-system is published to, as by Istio's namespace controller:
	// ztunnel may run there. An earlier test's publisher may have left its
	// ConfigMap: start without it, and leave none.
	dropKubeSystem := func() {
		err := cluster.Client.CoreV1().ConfigMaps("kube-system").Delete(context.Background(), trust.ConfigMapName, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
	}
	dropKubeSystem()
	t.Cleanup(dropKubeSystem)
	live := trustNamespace(t, "trust-live", nil)
	skipped := trustNamespace(t, "trust-skipped", nil)
	// The selector matches the system namespaces too, so only the skip
	// rules keep the publisher out of them.
	sel, err := labels.Parse("kubernetes.io/metadata.name in (kube-system,kube-public,kube-node-lease," + live + "," + skipped + ")")
	if err != nil {
		t.Fatal(err)
	}
	startPublisher(t, trust.Config{Bundle: func() trust.Bundle { return trust.Bundle{PEM: []byte("root\n")} }, Selector: sel, Skip: []string{skipped}})
	waitPublished(t, "selected namespace", "root\n", live, "kube-system")
	time.Sleep(500 * time.Millisecond) // the queue is drained by now; look for stray writes
	for _, ns := range []string{"kube-public", "kube-node-lease", skipped} {
		if rootConfigMap(t, ns) != nil {
			t.Errorf("%s: ConfigMap published into a skipped namespace", ns)
		}
	}
}

func TestTrustSkipsUnselectedAndTerminatingNamespaces(t *testing.T) {
	lbls, sel := runLabel(t)
	live := trustNamespace(t, "trust-live", lbls)
	dying := trustNamespace(t, "trust-dying", lbls)
	unselected := trustNamespace(t, "trust-unselected", nil)
	var b trustBundle
	b.set("old\n")
	p := startPublisher(t, trust.Config{Bundle: b.get, Selector: sel})
	waitPublished(t, "before termination", "old\n", live, dying)

	ctx := context.Background()
	if err := cluster.Client.CoreV1().Namespaces().Delete(ctx, dying, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	ns, err := cluster.Client.CoreV1().Namespaces().Get(ctx, dying, metav1.GetOptions{})
	if err != nil || ns.Status.Phase != corev1.NamespaceTerminating {
		t.Fatalf("namespace %s after delete: %v, %v; want it terminating (no namespace controller runs)", dying, ns.Status.Phase, err)
	}
	time.Sleep(300 * time.Millisecond) // let the informer see the phase

	b.set("new\n")
	p.BundleChanged()
	waitPublished(t, "live namespace", "new\n", live)
	time.Sleep(500 * time.Millisecond)
	if cm := rootConfigMap(t, dying); cm == nil || cm.Data[trust.DataKey] != "old\n" {
		t.Errorf("terminating namespace was written to: %+v", cm)
	}
	if rootConfigMap(t, unselected) != nil {
		t.Error("published into a namespace the selector does not match")
	}
}

// TestLeaderElectionTakeover runs two candidates on one Lease: exactly
// one leads; when its context ends it releases the Lease and the other
// leads within a few seconds.
func TestLeaderElectionTakeover(t *testing.T) {
	ns := cluster.Namespace(t, "lease")
	client := trustClient(t)
	var mu sync.Mutex
	leading := map[string]bool{}
	leaders := func() []string {
		mu.Lock()
		defer mu.Unlock()
		var out []string
		for id, on := range leading {
			if on {
				out = append(out, id)
			}
		}
		return out
	}
	type candidate struct {
		cancel context.CancelFunc
		done   chan error
	}
	cands := map[string]*candidate{}
	for _, id := range []string{"replica-0", "replica-1"} {
		ctx, cancel := context.WithCancel(context.Background())
		c := &candidate{cancel: cancel, done: make(chan error, 1)}
		cands[id] = c
		go func() {
			c.done <- leader.Run(ctx, client, ns, "meshca-trust", id, func(lctx context.Context) error {
				mu.Lock()
				leading[id] = true
				mu.Unlock()
				<-lctx.Done()
				mu.Lock()
				leading[id] = false
				mu.Unlock()
				return nil
			}, nil)
		}()
		t.Cleanup(func() { cancel(); <-c.done })
	}

	deadline := time.Now().Add(5 * time.Second)
	for len(leaders()) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no leader within 5s")
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Watch for a while: never two leaders.
	for range 20 {
		if l := leaders(); len(l) != 1 {
			t.Fatalf("leaders = %v, want exactly one", l)
		}
		time.Sleep(50 * time.Millisecond)
	}
	first := leaders()[0]
	second := "replica-0"
	if first == second {
		second = "replica-1"
	}
	lease, err := client.CoordinationV1().Leases(ns).Get(context.Background(), "meshca-trust", metav1.GetOptions{})
	if err != nil || lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity != first {
		t.Fatalf("lease holder = %v (err %v), want %s", lease.Spec.HolderIdentity, err, first)
	}

	stopped := time.Now()
	cands[first].cancel()
	if err := <-cands[first].done; err != nil {
		t.Fatalf("%s: leader.Run = %v, want nil after cancel", first, err)
	}
	cands[first].done <- nil // for the cleanup
	for {
		l := leaders()
		if len(l) == 1 && l[0] == second {
			break
		}
		if len(l) > 1 {
			t.Fatalf("leaders = %v, want at most one", l)
		}
		if time.Since(stopped) > 6*time.Second {
			t.Fatalf("%s did not take over within 6s of the release", second)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("%s took over %v after %s released the lease", second, time.Since(stopped), first)
}
