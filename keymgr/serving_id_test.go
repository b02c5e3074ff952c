package keymgr_test

import (
	"testing"
	"time"

	"github.com/meshca/meshca/internal/testca"
	"github.com/meshca/meshca/keymgr"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
)

// TestIssueServingSVID: with an ID, the serving certificate is an
// X509-SVID of that ID (the bundle endpoint's https_spiffe), verified by
// go-spiffe against the trust bundle, even without DNS names.
func TestIssueServingSVID(t *testing.T) {
	td := spiffeid.RequireTrustDomainFromString("cluster.local")
	id := spiffeid.RequireFromString("spiffe://cluster.local/ns/istio-system/sa/meshca")
	root := testca.NewRoot(t, "root", testca.Options{})
	inter := root.NewIntermediate(t, "intermediate", testca.Options{})
	c, err := keymgr.IssueServing(inter.Authority(), keymgr.ServingOptions{ID: id, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	got, _, err := x509svid.ParseAndVerify(c.Certificate, x509bundle.FromX509Authorities(td, root.Authority().Roots))
	if err != nil {
		t.Fatalf("not an X509-SVID: %v", err)
	}
	if got != id || len(c.Leaf.DNSNames) != 0 || c.Leaf.Subject.CommonName != "" {
		t.Fatalf("ID %s, DNS names %v, CN %q; want %s alone", got, c.Leaf.DNSNames, c.Leaf.Subject.CommonName, id)
	}
}
