package bundleendpoint_test

import (
	"crypto/x509"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshca/meshca/ca/trust/bundleendpoint"
	"github.com/meshca/meshca/internal/testca"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

var td = spiffeid.RequireTrustDomainFromString("cluster.local")

// roots is a settable x509bundle.Source.
type roots struct {
	mu    sync.Mutex
	certs []*x509.Certificate
	err   error
}

func (r *roots) set(certs ...*x509.Certificate) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.certs = certs
}

func (r *roots) GetX509BundleForTrustDomain(td spiffeid.TrustDomain) (*x509bundle.Bundle, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err != nil {
		return nil, r.err
	}
	return x509bundle.FromX509Authorities(td, r.certs), nil
}

// TestSourceSequence: the number follows Observe (the CA state's
// Sequence), only grows, changes whenever the roots do even before
// Observe hears of it, and counts from 1 without Observe.
func TestSourceSequence(t *testing.T) {
	a := testca.NewRoot(t, "a", testca.Options{}).Cert
	b := testca.NewRoot(t, "b", testca.Options{}).Cert
	c := testca.NewRoot(t, "c", testca.Options{}).Cert
	type step struct {
		roots   []*x509.Certificate // nil: unchanged
		observe uint64              // 0: no Observe
		want    uint64
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{name: "pinned bundle stays 1", steps: []step{{want: 1}, {want: 1}, {want: 1}}},
		{name: "without Observe a change counts one up", steps: []step{
			{want: 1}, {roots: []*x509.Certificate{a, b}, want: 2}, {want: 2}, {roots: []*x509.Certificate{b}, want: 3},
		}},
		{name: "the CA state's sequence", steps: []step{
			{observe: 5, want: 5}, {roots: []*x509.Certificate{a, b}, observe: 6, want: 6}, {observe: 7, want: 7},
		}},
		{name: "roots changed before Observe heard", steps: []step{
			{observe: 5, want: 5}, {roots: []*x509.Certificate{a, b}, want: 6}, {observe: 6, want: 6},
		}},
		{name: "several steps between two requests", steps: []step{
			{observe: 5, want: 5}, {roots: []*x509.Certificate{b, c}, observe: 8, want: 8}, {roots: []*x509.Certificate{c}, want: 9},
			{observe: 9, want: 9},
		}},
		{name: "a smaller number is ignored", steps: []step{{observe: 5, want: 5}, {observe: 3, want: 5}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := &roots{certs: []*x509.Certificate{a}}
			s := bundleendpoint.NewSource(td, r, 0)
			for i, st := range tt.steps {
				if st.roots != nil {
					r.set(st.roots...)
				}
				if st.observe != 0 {
					s.Observe(st.observe)
				}
				b, err := s.GetBundleForTrustDomain(td)
				if err != nil {
					t.Fatal(err)
				}
				seq, ok := b.SequenceNumber()
				if !ok || seq != st.want {
					t.Fatalf("step %d: spiffe_sequence %d (set %v), want %d", i, seq, ok, st.want)
				}
				if hint, _ := b.RefreshHint(); hint != bundleendpoint.DefaultRefreshHint {
					t.Fatalf("step %d: refresh hint %v, want the default %v", i, hint, bundleendpoint.DefaultRefreshHint)
				}
				if got := b.X509Authorities(); len(got) != len(r.certs) || !got[0].Equal(r.certs[0]) {
					t.Fatalf("step %d: %d authorities, not the served bundle's %d", i, len(got), len(r.certs))
				}
			}
		})
	}
}

// TestSourceRefusals: no bundle for another trust domain, an empty one, or
// one the bundle source cannot give.
func TestSourceRefusals(t *testing.T) {
	tests := []struct {
		name string
		td   spiffeid.TrustDomain
		src  *roots
		want string
	}{
		{name: "foreign trust domain", td: spiffeid.RequireTrustDomainFromString("example.org"),
			src: &roots{certs: []*x509.Certificate{testca.NewRoot(t, "a", testca.Options{}).Cert}}, want: `no bundle for trust domain "example.org"`},
		{name: "empty bundle", td: td, src: &roots{}, want: "the trust bundle is empty"},
		{name: "source fails", td: td, src: &roots{err: errors.New("no CA state loaded yet")}, want: "bundleendpoint: no CA state loaded yet"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := bundleendpoint.NewSource(td, tt.src, time.Minute).GetBundleForTrustDomain(tt.td)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want %q", err, tt.want)
			}
		})
	}
}
