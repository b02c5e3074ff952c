package e2e

import (
	"bytes"
	"context"
	"crypto/x509"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/meshca/meshca/ca/caclient"
	"github.com/meshca/meshca/ca/trust"
	"github.com/meshca/meshca/integration/harness"
	"github.com/meshca/meshca/integration/harness/crlverify"
	"github.com/meshca/meshca/keymgr"
)

// proofTTL is the leaves' lifetime, --max-ttl.
const proofTTL = 3 * time.Minute

// proofCert is a certificate the proof holds, and whether it must be
// refused now.
type proofCert struct {
	name    string
	svid    *caclient.SVID
	revoked bool
}

// proof is TestRevocationProof's mesh and what it has issued.
type proof struct {
	m     *mesh
	nss   []string
	audit string
	certs []*proofCert
}

// fetch gets id's SVID by token (through the node proxy when impersonate)
// and keeps it.
func (p *proof) fetch(t *testing.T, name, token, sa string, impersonate bool) *proofCert {
	t.Helper()
	svid, err := p.m.s.client(t, token).Fetch(context.Background(), p.m.id(sa), caclient.Options{Impersonate: impersonate, TTL: proofTTL})
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	if len(svid.Chain) != 2 {
		t.Fatalf("%s: a chain of %d, want a leaf and its intermediate", name, len(svid.Chain))
	}
	c := &proofCert{name: name, svid: svid}
	p.certs = append(p.certs, c)
	return c
}

// listed says whether ns's published ca-crl.pem lists cert on a CRL of
// its issuer.
func listed(t *testing.T, ns string, cert *x509.Certificate) bool {
	t.Helper()
	cm := crlConfigMap(t, ns, trust.CRLConfigMapName)
	if cm == nil {
		return false
	}
	crls, err := crlverify.Parse([]byte(cm.Data[trust.CRLDataKey]))
	if err != nil {
		t.Fatalf("%s: the published ca-crl.pem: %v", ns, err)
	}
	for _, c := range crls {
		if !bytes.Equal(c.RawIssuer, cert.RawIssuer) {
			continue
		}
		for _, e := range c.RevokedCertificateEntries {
			if e.SerialNumber.Cmp(cert.SerialNumber) == 0 {
				return true
			}
		}
	}
	return false
}

// revoke runs `meshca revoke args...` (the real binary), which must
// succeed, then waits until every namespace's istio-ca-crl lists each of
// certs, and reports how long that took from the command's start.
func (p *proof) revoke(t *testing.T, what string, certs []*x509.Certificate, args ...string) string {
	t.Helper()
	start := time.Now()
	out, code := revokeCmd(t, append([]string{"--state-dir=" + p.m.s.stateDir, "--audit-log-file", p.audit}, args...)...)
	t.Logf("$ meshca revoke %s\n%s", strings.Join(args, " "), out)
	if code != 0 {
		t.Fatalf("%s: exit %d\n%s", what, code, out)
	}
	ran := time.Since(start)
	waitUntil(t, what+" in every namespace's istio-ca-crl", 30*time.Second, func() bool {
		for _, ns := range p.nss {
			for _, c := range certs {
				if !listed(t, ns, c) {
					return false
				}
			}
		}
		return true
	})
	harness.Report(t, "%s: meshca revoke took %v; istio-ca-crl updated in all %d namespaces %v after it started",
		what, ran.Round(time.Millisecond), len(p.nss), time.Since(start).Round(time.Millisecond))
	return out
}

// judgeAll checks every certificate held in every namespace by crlverify
// Strict (and Ztunnel, which must agree) and openssl verify
// -crl_check_all: the revoked ones refused as revoked, every other passes.
func (p *proof) judgeAll(t *testing.T, step string) {
	t.Helper()
	var refused, passed int
	for _, ns := range p.nss {
		for _, c := range p.certs {
			r := judge(t, ns, c.svid.Roots, c.svid.Chain)
			switch {
			case c.revoked && r != crlverify.ReasonRevoked:
				t.Errorf("%s, %s: %s: %q, want revoked", step, ns, c.name, r)
			case !c.revoked && r != "":
				t.Errorf("%s, %s: %s not revoked, refused: %s", step, ns, c.name, r)
			case c.revoked:
				refused++
			default:
				passed++
			}
		}
	}
	harness.Report(t, "%s: %d chains refused as revoked, %d passed, by crlverify Strict and Ztunnel and openssl -crl_check_all, in %d namespaces",
		step, refused, passed, len(p.nss))
}

// TestRevocationProof is issue 30's proof against the real apiserver:
// meshca serve --crl --publish-crl --upstream self (a root signing
// intermediates that sign leaves), workloads with certificates of their
// own and through node proxies (ztunnel's impersonation); then the real
// `meshca revoke` of a leaf by serial, of a node, and of an intermediate.
// After each, every namespace's istio-ca-crl lists it within one
// publisher round, and crlverify (Strict and Ztunnel) and openssl verify
// -crl_check_all refuse exactly the revoked certificates and pass every
// other; the revoked node's proxy gets no certificate until --undo.
func TestRevocationProof(t *testing.T) {
	lbls, sel := runLabel(t)
	lease := cluster.Namespace(t, "proof-lease")
	p := &proof{audit: t.TempDir() + "/audit.log"}
	for _, prefix := range []string{"proof-a", "proof-b", "proof-c"} {
		p.nss = append(p.nss, trustNamespace(t, prefix, lbls))
	}
	// The intermediate is renewed once a minute (with three quarters of
	// its 4 minutes left), leaves live 3 minutes: the test outlives no
	// leaf of the first intermediate before it is revoked.
	p.m = newMesh(t, "--crl", "--publish-crl", "--trust-lease-namespace", lease, "--trust-namespace-selector", sel.String(),
		"--audit-log-file", p.audit, "--upstream", "self", "--intermediate-ttl", "4m", "--intermediate-renew-at", "0.75",
		"--default-ttl", "3m", "--max-ttl", "3m", "--crl-propagation", crlPropagation.String())
	m := p.m
	webOwn := cluster.NewWorkload(t, m.apps, "web", "node-a")
	cluster.NewWorkload(t, m.apps, "db", "node-b")
	api := cluster.NewWorkload(t, m.apps, "api", "node-b")

	webViaA := p.fetch(t, "web through node-a's ztunnel", m.ztunnelA.Token, "web", true)
	stolen := p.fetch(t, "db through node-b's ztunnel (its key leaks)", m.ztunnelB.Token, "db", true)
	dbKept := p.fetch(t, "db through node-b's ztunnel", m.ztunnelB.Token, "db", true)
	webSelf := p.fetch(t, "web on node-a by its own token", webOwn.Token, "web", false)
	apiSelf := p.fetch(t, "api on node-b by its own token", api.Token, "api", false)
	first := stolen.svid.Chain[1]
	for _, c := range p.certs {
		if !c.svid.Chain[1].Equal(first) {
			// The first renewal is a minute away and the five fetches
			// take milliseconds: a renewal between them is a fault (a
			// clock, a renewal point) to report, never a pass.
			t.Fatalf("the intermediate was renewed while the first five leaves were issued, a minute before it is due")
		}
	}
	root := stolen.svid.Roots[0]
	if err := first.CheckSignatureFrom(root); err != nil || len(stolen.svid.Roots) != 1 {
		t.Fatalf("the intermediate is not signed by the one root: %v", err)
	}
	waitUntil(t, "the CRLs of the root and the intermediate in every namespace", 30*time.Second, func() bool {
		for _, ns := range p.nss {
			cm := crlConfigMap(t, ns, trust.CRLConfigMapName)
			if cm == nil {
				return false
			}
			crls, _ := crlverify.Parse([]byte(cm.Data[trust.CRLDataKey]))
			if len(crls) < 2 {
				return false
			}
		}
		return true
	})
	p.judgeAll(t, "before any revocation")

	// A workload key found in a log: one serial.
	readAudit(t, p.audit, 6) // the configuration and the five issued
	serial := stolen.svid.Chain[0].SerialNumber.Text(16)
	p.revoke(t, "revoke --serial", []*x509.Certificate{stolen.svid.Chain[0]},
		"--serial", serial, "--reason", "keyCompromise", "--audit-log", p.audit)
	stolen.revoked = true
	p.judgeAll(t, "after revoke --serial")

	// A stolen node: everything issued on node-a, and its proxy blocked.
	p.revoke(t, "revoke --node", []*x509.Certificate{webViaA.svid.Chain[0], webSelf.svid.Chain[0]},
		"--node", "node-a", "--since", "1h", "--reason", "keyCompromise", "--audit-log", p.audit)
	webViaA.revoked, webSelf.revoked = true, true
	p.judgeAll(t, "after revoke --node")
	viaA := func() error {
		_, err := m.s.client(t, m.ztunnelA.Token).Fetch(context.Background(), m.id("web"), caclient.Options{Impersonate: true, TTL: proofTTL})
		return err
	}
	err := awaitErr(t, viaA, func(err error) bool { return status.Code(err) == codes.PermissionDenied })
	t.Logf("node-a's ztunnel, blocked: %v", err)
	if !strings.Contains(err.Error(), "node node-a is blocked") {
		t.Fatalf("node-a's ztunnel while blocked: %v", err)
	}
	if _, err := m.s.client(t, m.ztunnelB.Token).Fetch(context.Background(), m.id("db"), caclient.Options{Impersonate: true, TTL: proofTTL}); err != nil {
		t.Fatalf("node-b's ztunnel while node-a is blocked: %v", err)
	}
	out, code := revokeCmd(t, "--state-dir="+m.s.stateDir, "--audit-log-file", p.audit, "--node", "node-a", "--undo")
	t.Logf("$ meshca revoke --node node-a --undo\n%s", out)
	if code != 0 {
		t.Fatalf("undo: exit %d\n%s", code, out)
	}
	if err := awaitErr(t, viaA, func(err error) bool { return err == nil }); err != nil {
		t.Fatalf("node-a's ztunnel after --undo: %v", err)
	}
	p.judgeAll(t, "after revoke --node --undo") // what was revoked stays revoked

	// A leaked intermediate: once a renewal signs, the first one.
	// One client, asking once a second: a client per attempt would run
	// into the connection limits.
	viaB := m.s.client(t, m.ztunnelB.Token)
	var renewed *proofCert
	for deadline := time.Now().Add(90 * time.Second); renewed == nil; time.Sleep(time.Second) {
		svid, err := viaB.Fetch(context.Background(), m.id("db"), caclient.Options{Impersonate: true, TTL: proofTTL})
		switch {
		case err != nil:
			t.Fatalf("node-b's ztunnel: %v", err)
		case !svid.Chain[1].Equal(first):
			renewed = &proofCert{name: "db through node-b's ztunnel, renewed intermediate", svid: svid}
		case time.Now().After(deadline):
			t.Fatal("no leaf of a renewed intermediate within 90s")
		}
	}
	p.certs = append(p.certs, renewed)
	p.fetch(t, "api by its own token, renewed intermediate", api.Token, "api", false)
	p.judgeAll(t, "after the intermediate's renewal")
	p.revoke(t, "revoke --intermediate", []*x509.Certificate{first},
		"--intermediate", keymgr.Fingerprint(first)[:16], "--reason", "caCompromise")
	dbKept.revoked, apiSelf.revoked = true, true
	p.judgeAll(t, "after revoke --intermediate")
}
