package ca

import (
	"strings"
	"testing"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// FuzzParseTarget: the ImpersonatedIdentity a client sends never panics
// the authorizer, and an accepted value is exactly one workload ID of our
// trust domain.
func FuzzParseTarget(f *testing.F) {
	for _, s := range []string{"spiffe://cluster.local/ns/a/sa/b", "spiffe://evil/ns/a/sa/b", "spiffe://cluster.local/ns/a/sa/b,x", "", "spiffe://cluster.local/ns//sa/b"} {
		f.Add(s)
	}
	a := &NodeAuthorizer{TrustDomain: spiffeid.RequireTrustDomainFromString("cluster.local")}
	f.Fuzz(func(t *testing.T, s string) {
		id, err := a.parseTarget(s)
		if err != nil {
			return
		}
		ns, sa, ok := parseWorkloadID(id)
		if !ok || id.TrustDomain().Name() != "cluster.local" || id.String() != s || strings.ContainsAny(ns+sa, "/,") {
			t.Fatalf("accepted %q as %v (%q/%q)", s, id, ns, sa)
		}
	})
}
