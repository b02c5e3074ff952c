package e2e

import (
	"crypto/x509"
	"fmt"
	"os/exec"
	"testing"
	"time"

	"github.com/meshca/meshca/ca/istiodcert"
	"github.com/meshca/meshca/integration/harness"
	"github.com/meshca/meshca/keymgr"
	"github.com/meshca/meshca/keymgr/dirstore"
)

// TestPKCS11RootRotation: meshca-hsm serve --upstream pkcs11 bootstraps
// an empty state with a root whose key it makes in the SoftHSM2 token,
// then a full root rotation under a fleet of workloads handshaking with
// mutual TLS: prepare --upstream pkcs11 makes the next root's key in the
// token, activate and retire (the default build: they do not touch the
// token) move to it, with 0 failed handshakes and istiod's certificate
// following. Both root keys stay in the token, sensitive and never
// extractable; the state never held either.
func TestPKCS11RootRotation(t *testing.T) {
	h := newHSM(t)
	ns := labelled(t, "pkcs11-rotation")
	istiod := []string{"--istiod-cert-secret", ns + "/istiod-tls", "--kubeconfig", cluster.Kubeconfig}
	up := h.flags(10 * time.Minute)
	var first *keymgr.AuthorityRecord
	final := fleetRun{
		start: func(t *testing.T) fleetCA {
			s := harness.StartSelfSigned(t, h.bin, cluster.Kubeconfig, append([]string{istiod[0], istiod[1],
				"--istiod-cert-ttl", istiodTTL.String(), "--publish-root-cert-configmaps", "--trust-namespace-selector",
				"meshca-upstream-test=" + ns, "--trust-lease-namespace", ns, "--intermediate-renew-at", upstreamRenewAt,
				"--auto-rotate=false", "--backdate", fleetBackdate.String(), "--default-ttl", "1m", "--max-ttl", "1m"}, up...)...)
			store := dirstore.Store{Dir: s.StateDir}
			first = loadState(t, store).Active()
			return fleetCA{addrs: []string{s.Addr}, store: store, cli: []string{"--state-dir", s.StateDir}}
		},
		rotate: func(t *testing.T, ca fleetCA, f *fleet) {
			args := append(append([]string{"root", "prepare", "--reason", "e2e pkcs11 rotation"}, ca.cli...), up...)
			if out, err := exec.Command(h.bin, args...).CombinedOutput(); err != nil {
				t.Fatalf("prepare --upstream pkcs11: %v\n%s", err, out)
			}
			step := append([]string{"--margin", fleetMargin.String()}, append(ca.cli, istiod...)...)
			untilDone(t, "activate", 3*f.leafTTL+20*time.Second, append([]string{"activate"}, step...)...)
			untilDone(t, "retire", 3*f.leafTTL+20*time.Second, append([]string{"retire"}, step...)...)
		},
	}.run(t)
	if first.Upstream.Type != "pkcs11" || first.RootKey != nil {
		t.Fatalf("the bootstrapped authority's root key is in %+v (a key in the state: %v), want the token alone", first.Upstream, first.RootKey != nil)
	}
	next := final.Active()
	switch {
	case !next.Renewed() || next.Upstream.Type != "pkcs11" || next.SignsWithRoot() || next.RootKey != nil:
		t.Fatal("the new active authority is not an intermediate under a root whose key is in the token alone")
	case next.Upstream.Key == first.Upstream.Key || next.Root.Equal(first.Root):
		t.Fatalf("the new root is the old one's key %s", next.Upstream.Key)
	}
	for _, a := range final.Authorities {
		if !a.Root.Equal(next.Root) && (a.Phase != keymgr.PhaseRetired || a.Key != nil) {
			t.Fatalf("authority %.16s of the old root is %s, its key kept %v", a.ID(), a.Phase, a.Key != nil)
		}
	}
	keyInToken(t, h, 2, next.Upstream.Key)
	held, _ := (&istiodMesh{t: t, ns: ns}).waitFor("istiod's certificate after the rotation", func(h *istiodcert.Held, r []*x509.Certificate) string {
		if len(h.Roots) != 1 || !h.Roots[0].Equal(next.Root) || len(r) != 1 {
			return fmt.Sprintf("ca.crt has %d roots, istio-ca-root-cert %d", len(h.Roots), len(r))
		}
		return ""
	})
	if len(held.Chain) < 2 || !held.Chain[1].Equal(next.Cert) {
		t.Fatal("istiod's certificate does not come with the new intermediate")
	}
}
