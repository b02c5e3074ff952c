package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/meshca/meshca/ca/caclient"
	"github.com/meshca/meshca/integration/harness"
	"github.com/meshca/meshca/integration/harness/checked"
	"github.com/meshca/meshca/keymgr/certs"
	"github.com/meshca/meshca/keymgr/secretstore"
)

// TestTwoServersOneStateSecret: two meshca replicas started at once on one
// CA state Secret of the real apiserver agree on one root, and both serve
// a rotation step taken by `meshca root` within 5 s.
func TestTwoServersOneStateSecret(t *testing.T) {
	ns := cluster.Namespace(t, "state")
	secret := ns + "/meshca-ca"
	replicas := make([]*harness.Meshca, 2)
	errs := make(chan error)
	for i := range replicas {
		go func() {
			m, err := harness.StartMeshcaProcess(bin, "--state-secret", secret, "--kubeconfig", cluster.Kubeconfig)
			replicas[i] = m
			errs <- err
		}()
	}
	for range replicas {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	for _, m := range replicas {
		if m != nil {
			t.Cleanup(m.Stop)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	store := &secretstore.Store{Client: cluster.Client, Namespace: ns, Name: "meshca-ca"}
	st, _, err := store.Load(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if n := len(st.Authorities); n != 1 {
		t.Fatalf("%d authorities after two replicas bootstrapped at once, want 1", n)
	}
	w := cluster.NewWorkload(t, cluster.Namespace(t, "state-wl"), "web", "node-a")
	roots := certs.Pool(st.Bundle()...)
	clients := make([]*checked.Client, len(replicas))
	for i, m := range replicas {
		c, err := checked.NewClient(t, caclient.Config{Addr: m.Addr, ServerName: "istiod.istio-system.svc", Roots: roots,
			ClusterID: "Kubernetes", TokenFile: harness.WriteToken(t, w.Token)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		clients[i] = c
	}
	bundleSize := func(c *checked.Client) int {
		svid, err := c.Fetch(context.Background(), workloadID(w), caclient.Options{})
		if err != nil {
			t.Fatal(err)
		}
		return len(svid.Roots)
	}
	for i, c := range clients {
		if n := bundleSize(c); n != 1 {
			t.Fatalf("replica %d serves %d roots before the rotation", i, n)
		}
	}
	if out, code := rootStep(t, "prepare", "--state-secret", secret, "--kubeconfig", cluster.Kubeconfig); code != 0 {
		t.Fatalf("prepare: exit %d\n%s", code, out)
	}
	start := time.Now()
	for i, c := range clients {
		for bundleSize(c) != 2 {
			if time.Since(start) > 5*time.Second {
				t.Fatalf("replica %d did not serve the prepared root within 5s", i)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	harness.Report(t, "both replicas served the new bundle %v after the change", time.Since(start).Round(time.Millisecond))
}
