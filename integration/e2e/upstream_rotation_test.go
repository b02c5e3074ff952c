package e2e

import (
	"crypto/x509"
	"fmt"
	"os/exec"
	"testing"
	"time"

	"github.com/meshca/meshca/ca/istiodcert"
	"github.com/meshca/meshca/csr"
	"github.com/meshca/meshca/integration/harness"
	"github.com/meshca/meshca/keymgr"
	"github.com/meshca/meshca/keymgr/dirstore"
)

// upstreamRotation is a full root rotation with an upstream of the
// signing intermediate, the same for every upstream: `meshca serve
// --upstream <name>` bootstraps an empty state directory with a root
// made in the upstream, then, under the rotation fleet (workloads
// handshaking with mutual TLS), `meshca root prepare --upstream <name>`
// makes the next root there with its first intermediate, and activate
// and retire move to it as the guards allow, istiod's certificate
// following each step.
type upstreamRotation struct {
	// name is the upstream's (Ref.Type); bin the meshca that serves and
	// prepares (the HSM build for pkcs11).
	name, bin string
	// flags select the upstream and give its settings, --upstream and
	// --intermediate-ttl included: serve and prepare take the same.
	flags []string
	// retire are retire's flags beside the guards' (--destroy-root-key
	// and the upstream's settings).
	retire []string
	// serve are serve's flags beside them (--crl --publish-crl).
	serve []string
	// crl: the fleet's workloads check each peer chain against the
	// published istio-ca-crl, and intermediates may be renewed meanwhile.
	crl bool
	// started, when set, is called with the bootstrapped authority
	// before the fleet starts.
	started func(t *testing.T, first *keymgr.AuthorityRecord)
}

// rotatedRoot is what an upstreamRotation left: the authority the
// server bootstrapped, the one active at the end, the final CA state and
// its directory.
type rotatedRoot struct {
	first, next *keymgr.AuthorityRecord
	final       *keymgr.State
	stateDir    string
}

// run takes the rotation and checks what every upstream must show: 0
// failed handshakes and requests (fleetRun), both roots kept by the
// upstream, the new one a different key, every authority of the old root
// retired with its key destroyed, and istiod's certificate on the new
// root and intermediate alone.
func (u upstreamRotation) run(t *testing.T, prefix string) rotatedRoot {
	t.Helper()
	ns := labelled(t, prefix)
	istiod := []string{"--istiod-cert-secret", ns + "/istiod-tls"}
	var r rotatedRoot
	r.final = fleetRun{
		renewals: u.crl,
		start: func(t *testing.T) fleetCA {
			s := harness.StartSelfSigned(t, u.bin, cluster.Kubeconfig, append([]string{istiod[0], istiod[1],
				"--istiod-cert-ttl", istiodTTL.String(), "--publish-root-cert-configmaps", "--trust-namespace-selector",
				"meshca-upstream-test=" + ns, "--trust-lease-namespace", ns, "--intermediate-renew-at", upstreamRenewAt,
				"--auto-rotate=false", "--backdate", fleetBackdate.String(), "--default-ttl", "1m", "--max-ttl", "1m"}, append(u.flags, u.serve...)...)...)
			r.stateDir = s.StateDir
			store := dirstore.Store{Dir: s.StateDir}
			r.first = loadState(t, store).Active()
			if u.started != nil {
				u.started(t, r.first)
			}
			ca := fleetCA{addrs: []string{s.Addr}, store: store, cli: []string{"--state-dir", s.StateDir}}
			if u.crl {
				ca.crlNS = ns
			}
			return ca
		},
		rotate: func(t *testing.T, ca fleetCA, f *fleet) {
			untilDoneWith(t, u.bin, "prepare --upstream "+u.name, 20*time.Second,
				append(append([]string{"prepare", "--reason", "e2e " + u.name + " rotation"}, ca.cli...), u.flags...)...)
			step := append(append([]string{"--margin", fleetMargin.String(), "--kubeconfig", cluster.Kubeconfig}, istiod...), ca.cli...)
			untilDoneWith(t, u.bin, "activate", 3*f.leafTTL+20*time.Second, append([]string{"activate"}, step...)...)
			if u.crl {
				retireEach(t, u.bin, ca.store, r.first.Root, 3*f.leafTTL+40*time.Second, append(step, u.retire...))
				return
			}
			untilDoneWith(t, u.bin, "retire", 3*f.leafTTL+20*time.Second, append(append([]string{"retire"}, step...), u.retire...)...)
		},
	}.run(t)
	r.next = r.final.Active()
	u.check(t, r)
	held, _ := (&istiodMesh{t: t, ns: ns}).waitFor("istiod's certificate after the rotation", func(h *istiodcert.Held, roots []*x509.Certificate) string {
		if len(h.Roots) != 1 || !h.Roots[0].Equal(r.next.Root) || len(roots) != 1 {
			return fmt.Sprintf("ca.crt has %d roots, istio-ca-root-cert %d", len(h.Roots), len(roots))
		}
		return ""
	})
	if len(held.Chain) < 2 || !signsUnder(r.final, held.Chain[1], r.next.Root) {
		t.Fatal("istiod's certificate does not come with an intermediate of the new root")
	}
	return r
}

// check: both roots are the upstream's, the new one of another key, the
// bundle holds it alone, and every authority of the old root is retired
// with its key destroyed.
func (u upstreamRotation) check(t *testing.T, r rotatedRoot) {
	t.Helper()
	first, next := r.first, r.next
	switch {
	case first.Upstream.Type != u.name || !first.Renewed() || first.SignsWithRoot():
		t.Fatalf("the bootstrapped authority's root key is in %+v, want an intermediate under a root of upstream %s", first.Upstream, u.name)
	case !next.Renewed() || next.Upstream.Type != u.name || next.SignsWithRoot():
		t.Fatalf("the new active authority is not an intermediate under a root of upstream %s: %+v", u.name, next.Upstream)
	case next.Root.Equal(first.Root) || csr.SamePublicKey(next.Root.PublicKey, first.Root.PublicKey):
		t.Fatal("the new root is the old one, or of the old one's key")
	case u.name != "self" && (next.Upstream.Key == first.Upstream.Key || next.RootKey != nil || first.RootKey != nil):
		t.Fatalf("root keys %q then %q, in the state: %v, %v; want two keys, both in the upstream alone",
			first.Upstream.Key, next.Upstream.Key, first.RootKey != nil, next.RootKey != nil)
	}
	if b := r.final.Bundle(); len(b) != 1 || !b[0].Equal(next.Root) {
		t.Fatalf("the bundle holds %d roots after the rotation, want the new root alone", len(b))
	}
	for _, a := range r.final.Authorities {
		if !a.Root.Equal(next.Root) && (a.Phase != keymgr.PhaseRetired || a.Key != nil || a.RootKey != nil) {
			t.Fatalf("authority %.16s of the old root is %s, keys kept %v, %v", a.ID(), a.Phase, a.Key != nil, a.RootKey != nil)
		}
	}
}

// untilDoneWith runs `<bin> root <args>` until it succeeds, as untilDone
// does with the default build.
func untilDoneWith(t *testing.T, bin, step string, timeout time.Duration, args ...string) {
	t.Helper()
	for deadline := time.Now().Add(timeout); ; time.Sleep(250 * time.Millisecond) {
		out, err := exec.Command(bin, append([]string{"root"}, args...)...).CombinedOutput()
		ee, exited := err.(*exec.ExitError)
		switch {
		case err == nil:
			return
		case !exited || ee.ExitCode() != 1:
			t.Fatalf("%s: %v\n%s", step, err, out)
		case time.Now().After(deadline):
			t.Fatalf("%s still refused after %v\n%s", step, timeout, out)
		}
	}
}

// retireEach retires, one by one by id, every authority under root
// (intermediates renewed meanwhile are authorities of their own), until
// none is left or timeout.
func retireEach(t *testing.T, bin string, store keymgr.StateStore, root *x509.Certificate, timeout time.Duration, step []string) {
	t.Helper()
	for deadline := time.Now().Add(timeout); ; time.Sleep(250 * time.Millisecond) {
		left := 0
		for _, a := range loadState(t, store).Authorities {
			if !a.Root.Equal(root) || a.Phase == keymgr.PhaseRetired {
				continue
			}
			left++
			if a.Phase != keymgr.PhasePrevious {
				continue
			}
			out, err := exec.Command(bin, append([]string{"root", "retire", a.ID()[:16]}, step...)...).CombinedOutput()
			if ee, ok := err.(*exec.ExitError); err != nil && (!ok || ee.ExitCode() != 1) {
				t.Fatalf("retire %.16s: %v\n%s", a.ID(), err, out)
			}
		}
		if left == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d authorities of the old root still not retired after %v", left, timeout)
		}
	}
}

// signsUnder reports whether c is the signing certificate of an
// authority of s under root that may sign: the active one, or, while a
// renewal is held for its CRL (--crl-propagation), the one it replaced.
func signsUnder(s *keymgr.State, c, root *x509.Certificate) bool {
	for _, a := range s.Authorities {
		if a.Cert.Equal(c) && a.Root.Equal(root) && (a.Phase == keymgr.PhaseActive || a.Phase == keymgr.PhasePrevious) {
			return true
		}
	}
	return false
}
