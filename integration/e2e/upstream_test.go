package e2e

import (
	"context"
	"crypto/x509"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/meshca/meshca/ca/caclient"
	"github.com/meshca/meshca/ca/trust"
	"github.com/meshca/meshca/integration/harness"
	"github.com/meshca/meshca/internal/pemutil"
	"github.com/meshca/meshca/keymgr"
	"github.com/meshca/meshca/keymgr/certs"
	"github.com/meshca/meshca/keymgr/secretstore"
)

// upstreamTTL and upstreamRenewAt make a server renew its intermediate
// from the self upstream every 20 s (a server looks every 10 s): the
// renewal is due with three quarters of 80 s left, which stays above
// the half of --default-ttl (1m) below which /readyz would fail.
const (
	upstreamTTL     = 80 * time.Second
	upstreamRenewAt = "0.75"
)

// upstreamFlags are a fleet's server's flags with --upstream self.
func upstreamFlags(ttl time.Duration) []string {
	return []string{"--upstream", "self", "--intermediate-ttl", ttl.String(), "--intermediate-renew-at", upstreamRenewAt,
		"--auto-rotate=false", "--backdate", fleetBackdate.String(), "--default-ttl", "1m", "--max-ttl", "1m"}
}

// labelled creates a namespace labelled meshca-upstream-test=<its name>,
// where a server publishing to that selector writes istio-ca-root-cert.
func labelled(t *testing.T, prefix string) string {
	t.Helper()
	ns := cluster.Namespace(t, prefix)
	n, err := cluster.Client.CoreV1().Namespaces().Get(context.Background(), ns, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n.Labels = map[string]string{"meshca-upstream-test": ns}
	if _, err := cluster.Client.CoreV1().Namespaces().Update(context.Background(), n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	return ns
}

// published is istio-ca-root-cert in ns: its roots and resourceVersion.
func published(ns string) ([]*x509.Certificate, string) {
	cm, err := cluster.Client.CoreV1().ConfigMaps(ns).Get(context.Background(), trust.ConfigMapName, metav1.GetOptions{})
	if err != nil {
		return nil, ""
	}
	roots, _ := pemutil.ParseCertificates([]byte(cm.Data[trust.DataKey]))
	return roots, cm.ResourceVersion
}

// renewalsAfter are the authorities of st renewed from an upstream in
// place of another (not the first one bootstrapped), oldest first.
func renewalsAfter(st *keymgr.State, first *keymgr.AuthorityRecord) []*keymgr.AuthorityRecord {
	var out []*keymgr.AuthorityRecord
	for _, a := range st.Authorities {
		if a.Renewed() && a.ID() != first.ID() && len(a.History) > 0 && strings.Contains(a.History[0].Reason, "renewed from upstream") {
			out = append(out, a)
		}
	}
	return out
}

// TestUpstreamRenewalUnderLoad: two replicas on one state Secret, with
// --upstream self, sign with one intermediate under one root and renew
// it every 20 s, one replica calling the upstream for each renewal,
// while a fleet handshakes with mutual TLS: no handshake and no request
// fails, the leaves carry the intermediate that signed them and verify
// to the published bundle, and neither the bundle nor its ConfigMap is
// touched by a renewal.
func TestUpstreamRenewalUnderLoad(t *testing.T) {
	began := time.Now()
	ns, apps := cluster.Namespace(t, "upstream-state"), labelled(t, "upstream-apps")
	store := &secretstore.Store{Client: cluster.Client, Namespace: ns, Name: "meshca-ca"}
	var servers []*harness.Meshca
	var addrs []string
	for range 2 {
		m := harness.StartMeshca(t, bin, append([]string{"--state-secret", ns + "/meshca-ca", "--kubeconfig", cluster.Kubeconfig,
			"--publish-root-cert-configmaps", "--trust-lease-namespace", ns, "--trust-namespace-selector", "meshca-upstream-test=" + apps},
			upstreamFlags(upstreamTTL)...)...)
		servers, addrs = append(servers, m), append(addrs, m.Addr)
	}
	st0 := loadState(t, store)
	first := st0.Active()
	if len(st0.Authorities) != 1 || !first.Renewed() || first.Upstream.Type != "self" || first.SignsWithRoot() || first.RootKey == nil {
		t.Fatalf("the replicas bootstrapped %d authorities, the active one from upstream %q: want one intermediate under a root of the self upstream",
			len(st0.Authorities), first.Upstream.Type)
	}
	root := first.Root
	var rv string
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		roots, v := published(apps)
		if len(roots) == 1 && roots[0].Equal(root) {
			rv = v
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s in %s does not hold the root within 30s", trust.ConfigMapName, apps)
		}
	}

	f := newFleet(t, addrs, root, fleetShape{size: 24})
	ctx, cancel := context.WithCancel(context.Background())
	stop := f.run(ctx)
	defer stop()
	defer cancel()
	if err := f.listen(); err != nil {
		t.Fatal(err)
	}
	f.waitFor(t, "handshakes", 30*time.Second, func() bool { return f.handshakes.Load() >= int64(25*f.checkers) })
	before := len(renewalsAfter(loadState(t, store), first))
	loaded := time.Now()
	f.waitFor(t, "two renewals under load", 70*time.Second, func() bool { return len(renewalsAfter(loadState(t, store), first)) >= before+2 })
	// One more renewal of every member's leaf after the last renewal.
	time.Sleep(fleetLeafTTL)
	cancel()
	stop()

	final := loadState(t, store)
	renewed := renewalsAfter(final, first)
	harness.Report(t, "intermediate renewed %d times in %v under load (%d before the fleet); handshakes %d, %d between leaves of different intermediates, failures %d",
		len(renewed)-before, time.Since(loaded).Round(time.Second), before, f.handshakes.Load(), f.mixed.Load(), f.failures.Load())
	harness.Report(t, "CSR requests %d, failed %d; longest stall %v; test took %v", f.requests.Load(), f.requestErrors.Load(), f.stall.longest(),
		time.Since(began).Round(time.Second))
	if n := f.failures.Load() + f.requestErrors.Load(); n != 0 {
		t.Errorf("%d handshakes and %d requests failed; the first:\n%s", f.failures.Load(), f.requestErrors.Load(), strings.Join(f.firstErrors(), "\n"))
	}
	if f.mixed.Load() == 0 {
		t.Error("no handshake between leaves of different intermediates: no renewal was exercised under load")
	}
	checkBundleUntouched(t, final, st0, apps, rv)
	checkRenewedOnce(t, servers, len(renewed))
	checkLeavesCarryIntermediate(t, f, apps)
	checkReplicasShare(t, servers, final.Active().Cert, root)
}

// checkBundleUntouched: the renewals changed neither the trust bundle,
// nor its sequence, nor the ConfigMap it is published in.
func checkBundleUntouched(t *testing.T, final, first *keymgr.State, apps, rv string) {
	t.Helper()
	roots, v := published(apps)
	switch {
	case len(final.Bundle()) != 1 || !final.Bundle()[0].Equal(first.Bundle()[0]):
		t.Errorf("the bundle holds %d roots after the renewals, want the one root", len(final.Bundle()))
	case final.Sequence != first.Sequence:
		t.Errorf("the bundle's sequence went from %d to %d: a renewal changes no bundle", first.Sequence, final.Sequence)
	case len(roots) != 1 || !roots[0].Equal(first.Bundle()[0]) || v != rv:
		t.Errorf("%s was rewritten (resourceVersion %s, then %s) or lost the root", trust.ConfigMapName, rv, v)
	}
}

// checkRenewedOnce: each renewal was made, logged and audited by one
// replica alone: one upstream call each.
func checkRenewedOnce(t *testing.T, servers []*harness.Meshca, renewals int) {
	t.Helper()
	logged, audited := 0, 0
	for _, m := range servers {
		logged += strings.Count(m.Logs(), `"msg":"intermediate renewed"`)
		audited += strings.Count(m.Logs(), `"event":"intermediate","decision":"issued"`)
	}
	if logged != renewals || audited != renewals {
		t.Errorf("the replicas logged %d renewals and audited %d, the state holds %d: each renewal is one replica's", logged, audited, renewals)
	}
}

// checkLeavesCarryIntermediate: every member's last leaf came with the
// intermediate that signed it, and verifies to the published bundle.
func checkLeavesCarryIntermediate(t *testing.T, f *fleet, apps string) {
	t.Helper()
	roots, _ := published(apps)
	bundle := x509bundle.FromX509Authorities(fleetTD, roots)
	for _, m := range f.members {
		svid := m.current().caSVID
		if len(svid.Chain) != 2 {
			t.Fatalf("%s holds a chain of %d, want its leaf and the intermediate", m.id, len(svid.Chain))
		}
		if _, _, err := x509svid.Verify(svid.Chain, bundle); err != nil {
			t.Fatalf("%s's leaf does not verify to the published bundle: %v", m.id, err)
		}
	}
}

// checkReplicasShare: both replicas sign with the intermediate of the
// state, within a follow interval.
func checkReplicasShare(t *testing.T, servers []*harness.Meshca, inter, root *x509.Certificate) {
	t.Helper()
	w := cluster.NewWorkload(t, cluster.Namespace(t, "upstream-probe"), "probe", "node-a")
	for i, m := range servers {
		s := &server{Meshca: m, roots: certs.Pool(root)}
		c := s.client(t, w.Token)
		for deadline := time.Now().Add(2*keymgr.DefaultFollowInterval + 5*time.Second); ; time.Sleep(250 * time.Millisecond) {
			svid, err := c.Fetch(context.Background(), workloadID(w), caclient.Options{TTL: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			if len(svid.Chain) == 2 && svid.Chain[1].Equal(inter) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("replica %d does not sign with the state's intermediate %q", i, inter.Subject)
			}
		}
	}
}

// TestUpstreamRootRotation: a root rotation with --upstream self
// (upstreamRotation): `meshca root prepare --upstream self` makes the
// next root and its first intermediate, activate and retire follow as
// the guards allow, istiod's certificate keeping up with each step,
// while a fleet handshakes with mutual TLS: none fails, and the old
// root's key is destroyed with its last authority.
func TestUpstreamRootRotation(t *testing.T) {
	r := upstreamRotation{name: "self", bin: bin, flags: []string{"--upstream", "self", "--intermediate-ttl", "10m"}}.run(t, "upstream-rotation")
	if r.next.RootKey == nil {
		t.Fatal("the new root's key is not in the state")
	}
	for _, a := range r.final.Authorities {
		if a.Root.Equal(r.next.Root) {
			continue
		}
		if _, err := os.Stat(filepath.Join(r.stateDir, keymgr.KeyEntry(a.Root))); !os.IsNotExist(err) {
			t.Fatalf("the old root's key file is still in the state directory: %v", err)
		}
	}
}
