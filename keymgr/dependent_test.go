package keymgr_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"errors"
	"math/big"
	"strings"
	"testing"
	"time"

	"github.com/meshca/meshca/keymgr"
)

// istiodLeaf is a DNS serving certificate issued under rec, valid from
// lcT0 for a day, as meshca issues istiod's.
func istiodLeaf(t *testing.T, rec *keymgr.AuthorityRecord) *x509.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(9), NotBefore: lcT0, NotAfter: lcT0.Add(48 * time.Hour),
		DNSNames: []string{"istiod.istio-system.svc"}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, rec.Cert, key.Public(), rec.Key)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

const istiodName = "istiod's certificate (istio-system/istiod-tls)"

// TestDependentActivate: a prepared root may sign only once istiod trusts
// it; the refusal names the dependent and when its keeper renews it at
// the latest, or, past that, what to check.
func TestDependentActivate(t *testing.T) {
	s, a, b := lcRotating(t)
	at := lcT0.Add(14 * time.Hour) // the time guard allows it
	leaf := istiodLeaf(t, a)
	tests := []struct {
		name string
		dep  keymgr.Dependent
		want string
	}{
		{"trusts both roots", keymgr.Dependent{Name: istiodName, Chain: []*x509.Certificate{leaf}, Roots: []*x509.Certificate{a.Root, b.Root}}, ""},
		{"trusts only the active root", keymgr.Dependent{Name: istiodName, Chain: []*x509.Certificate{leaf}, Roots: []*x509.Certificate{a.Root},
			RenewAt: at.Add(2 * time.Hour)}, "does not trust root " + b.RootID()[:16] + " yet (its ca.crt lacks it)"},
		{"renewal overdue", keymgr.Dependent{Name: istiodName, Chain: []*x509.Certificate{leaf}, Roots: []*x509.Certificate{a.Root},
			RenewAt: at.Add(-time.Hour)}, "safe once its keeper has rewritten it: is meshca serve with --istiod-cert-secret running?"},
		{"no certificate yet", keymgr.Dependent{Name: istiodName}, istiodName + " holds no certificate yet"},
		{"unreadable", keymgr.Dependent{Name: istiodName, Err: errors.New("secrets is forbidden")}, "cannot be read (secrets is forbidden)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := keymgr.Guards{Margin: keymgr.DefaultGuardMargin, Dependents: []keymgr.Dependent{tt.dep}}
			err := s.Clone().Activate(b.ID(), at, g, false, "rotate")
			lcCheckErr(t, err, true, tt.want)
			var ge *keymgr.GuardError
			if errors.As(err, &ge) && tt.dep.RenewAt.After(at) && !ge.SafeAt.Equal(tt.dep.RenewAt) {
				t.Errorf("SafeAt %v, want the renewal %v", ge.SafeAt, tt.dep.RenewAt)
			}
			if step, due := s.View().Due(at, g, keymgr.AutoPolicy{}); due != (tt.want == "") {
				t.Errorf("Due = %+v, %v; automatic rotation must wait as the CLI does", step, due)
			}
			if step := s.View().NextStep(at, g); tt.want != "" && !strings.Contains(step.Why, istiodName) {
				t.Errorf("NextStep's why %q does not name what holds it", step.Why)
			}
			// --force overrides it, as every guard.
			if err := s.Clone().Activate(b.ID(), at, g, true, "istiod restarted by hand"); err != nil {
				t.Fatalf("forced: %v", err)
			}
		})
	}
}

// TestDependentRetire: a previous root may leave the bundle only once
// istiod's certificate chains to a root that stays.
func TestDependentRetire(t *testing.T) {
	s, a, b := lcRotated(t)
	at := lcT0.Add(25 * time.Hour) // every workload leaf under a has expired
	old, cur := istiodLeaf(t, a), istiodLeaf(t, b)
	both := []*x509.Certificate{a.Root, b.Root}
	tests := []struct {
		name string
		dep  keymgr.Dependent
		want string
	}{
		{"reissued under the active authority", keymgr.Dependent{Name: istiodName, Chain: []*x509.Certificate{cur}, Roots: both}, ""},
		{"still under the retiring root", keymgr.Dependent{Name: istiodName, Chain: []*x509.Certificate{old}, Roots: both, RenewAt: at.Add(time.Hour)},
			"chains only to root " + a.RootID()[:16] + ", which retiring drops from the bundle"},
		{"no certificate yet", keymgr.Dependent{Name: istiodName}, "holds no certificate yet"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := keymgr.Guards{Margin: keymgr.DefaultGuardMargin, Dependents: []keymgr.Dependent{tt.dep}}
			err := s.Clone().Retire(a.ID(), at, g, false, "retire")
			lcCheckErr(t, err, true, tt.want)
			var ge *keymgr.GuardError
			if errors.As(err, &ge) && tt.dep.RenewAt.After(at) && !strings.Contains(err.Error(), "at the latest when it renews it") {
				t.Errorf("err %q does not say when it becomes safe", err)
			}
		})
	}
}

// TestDependentRootKept: retiring an authority whose root another one
// keeps (a renewed intermediate) never strands istiod's certificate.
func TestDependentRootKept(t *testing.T) {
	s, a := lcBootstrapped(t)
	inter, interKey := lcCA(t, "renewed intermediate", x509.KeyUsageCertSign, a.Root, a.Key)
	next := &keymgr.AuthorityRecord{Root: a.Root, Cert: inter, Key: interKey}
	if err := s.Prepare(next, lcT0.Add(time.Minute), "renew"); err != nil {
		t.Fatal(err)
	}
	if err := s.Activate(next.ID(), lcT0.Add(2*time.Minute), keymgr.Guards{}, false, "renew"); err != nil {
		t.Fatal(err)
	}
	g := keymgr.Guards{Dependents: []keymgr.Dependent{{Name: istiodName, Chain: []*x509.Certificate{istiodLeaf(t, a)}, Roots: []*x509.Certificate{a.Root}}}}
	if err := s.Retire(a.ID(), lcT0.Add(time.Hour), g, false, "retire"); err != nil {
		t.Fatalf("Retire: %v", err)
	}
}

// TestDependentRetireExpired: a certificate left to expire under the
// retiring root holds retire back, and says it was not renewed.
func TestDependentRetireExpired(t *testing.T) {
	s, a, _ := lcRotated(t)
	at := lcT0.Add(49 * time.Hour) // istiodLeaf ends at lcT0+48h
	g := keymgr.Guards{Dependents: []keymgr.Dependent{{Name: istiodName, Chain: []*x509.Certificate{istiodLeaf(t, a)}, RenewAt: lcT0.Add(32 * time.Hour)}}}
	lcCheckErr(t, s.Retire(a.ID(), at, g, false, "retire"), true,
		"expired at 2030-01-03T00:00:00Z under root "+a.RootID()[:16]+" and was not renewed under a root that stays; "+
			"meshca serve --istiod-cert-secret rewrites it within seconds as it follows the CA state; safe once its keeper has rewritten it")
}

// TestDependentRestart: with a Restarter, activate waits until istiod's
// processes restarted with the new root, not only until its ca.crt has
// it: istiod reads its client roots only when it starts.
func TestDependentRestart(t *testing.T) {
	s, a, b := lcRotating(t)
	at := lcT0.Add(14 * time.Hour)
	leaf := istiodLeaf(t, a)
	both := []*x509.Certificate{a.Root, b.Root}
	dep := func(loaded []string, restarting bool) keymgr.Dependent {
		return keymgr.Dependent{Name: istiodName, Chain: []*x509.Certificate{leaf}, Roots: both, Restarter: "Deployment istio-system/istiod",
			Loaded: loaded, Restarting: restarting, RenewAt: at.Add(time.Hour)}
	}
	tests := []struct {
		name string
		dep  keymgr.Dependent
		want string
	}{
		{"restarted with both roots", dep([]string{a.RootID(), b.RootID()}, false), ""},
		{"started before the new root", dep([]string{a.RootID()}, false),
			"istiod (Deployment istio-system/istiod) has not restarted since its ca.crt gained root " + b.RootID()[:16]},
		{"restarting", dep([]string{a.RootID(), b.RootID()}, true), "istiod is restarting (Deployment istio-system/istiod) to load root"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := s.Clone().Activate(b.ID(), at, keymgr.Guards{Margin: keymgr.DefaultGuardMargin, Dependents: []keymgr.Dependent{tt.dep}}, false, "rotate")
			lcCheckErr(t, err, true, tt.want)
			if err != nil && !strings.Contains(err.Error(), "and restarts istiod (Deployment istio-system/istiod) when its roots grow") {
				t.Errorf("err %q does not say what restarts istiod", err)
			}
		})
	}
}
