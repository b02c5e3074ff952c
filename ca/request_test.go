package ca_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshca/meshca/ca"
	"github.com/meshca/meshca/ca/caclient"
	"github.com/meshca/meshca/csr"
	"github.com/meshca/meshca/internal/testca"
	"github.com/meshca/meshca/keymgr/certs"
	authpb "github.com/meshca/meshca/proto/istio/v1/auth"
	"github.com/meshca/meshca/signer"
	"github.com/meshca/meshca/signer/local"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// gate is an authenticator that holds every request carrying its token
// until released, and counts them: an attacker whose authentication
// hangs (a slow TokenReview).
type gate struct {
	token   string
	calls   atomic.Int64
	release chan struct{}
}

func newGate(token string) *gate { return &gate{token: token, release: make(chan struct{})} }

func (g *gate) Authenticate(ctx context.Context, c *ca.Credentials) (*ca.Caller, error) {
	if c.Token != g.token {
		return nil, ca.ErrNoCredentials
	}
	g.calls.Add(1)
	select {
	case <-g.release:
	case <-ctx.Done():
	}
	return nil, &ca.Error{Code: codes.Unauthenticated, Reason: "test_bad_token", Msg: "bad token"}
}

// inProcess returns a context that looks like a request from addr with
// the given bearer token.
func inProcess(ctx context.Context, addr, token string) context.Context {
	md := metadata.MD{}
	if token != "" {
		md = metadata.Pairs("authorization", "Bearer "+token)
	}
	ctx = metadata.NewIncomingContext(ctx, md)
	ap, _ := net.ResolveTCPAddr("tcp", addr)
	return peer.NewContext(ctx, &peer.Peer{Addr: ap})
}

func frontendCSR(t *testing.T) string {
	t.Helper()
	return csrFor(t, frontend)
}

// csrFor is a P-256 CSR for id.
func csrFor(t *testing.T, id spiffeid.ID) string {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	p, err := csr.Build(key, id)
	if err != nil {
		t.Fatal(err)
	}
	return string(p)
}

// TestAuthenticationDoesNotHoldIssuanceSlots: callers whose
// authentication hangs must not take the slots of callers who
// authenticate, and one address gets a bounded authentication budget.
func TestAuthenticationDoesNotHoldIssuanceSlots(t *testing.T) {
	root := testca.NewRoot(t, "root", testca.Options{})
	g := newGate("attacker")
	f := newFixture(t, root.Authority(), options{authn: g, config: func(c *ca.Config) {
		c.MaxInFlight = 2
		c.MaxAuthnPerPeer = 3
	}})
	in := &authpb.IstioCertificateRequest{Csr: frontendCSR(t)}
	var wg sync.WaitGroup
	defer wg.Wait()
	defer close(g.release)
	for i := range 3 { // more hung authentications than issuance slots
		wg.Go(func() {
			_, _ = f.srv.CreateCertificate(inProcess(context.Background(), fmt.Sprintf("192.0.2.7:%d", 1000+i), "attacker"), in)
		})
	}
	for wait := time.Now().Add(5 * time.Second); g.calls.Load() < 3 && time.Now().Before(wait); {
		time.Sleep(time.Millisecond)
	}
	t.Run("an authenticated caller is still served", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if _, err := f.srv.CreateCertificate(inProcess(ctx, "198.51.100.1:4000", "frontend-token"), in); err != nil {
			t.Fatalf("with every slot's worth of hung authentications: %v", err)
		}
	})
	t.Run("the same address waits for its budget, then is told to retry", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		_, err := f.srv.CreateCertificate(inProcess(ctx, "192.0.2.7:5000", "frontend-token"), in)
		if st := status.Convert(err); st.Code() != codes.ResourceExhausted || !strings.Contains(st.Message(), "retry later") {
			t.Fatalf("got %v %q, want ResourceExhausted", st.Code(), st.Message())
		}
		if !strings.Contains(f.logs.String(), `"reason":"too_many_authentications"`) {
			t.Error("log lacks reason too_many_authentications")
		}
	})
}

// deadlineSigner records the deadline a signing request carries.
type deadlineSigner struct {
	inner signer.Signer
	left  atomic.Int64 // time to the deadline when Sign was called
}

func (s *deadlineSigner) Sign(ctx context.Context, r *signer.Request) (*signer.Response, error) {
	d, _ := ctx.Deadline()
	s.left.Store(int64(time.Until(d)))
	return s.inner.Sign(ctx, r)
}

// TestClientDeadlineIsCapped: a client's own deadline never outlasts
// --request-timeout.
func TestClientDeadlineIsCapped(t *testing.T) {
	root := testca.NewRoot(t, "root", testca.Options{})
	tests := []struct {
		name   string
		client time.Duration // 0: no client deadline
		want   time.Duration
	}{
		{name: "an hour is capped", client: time.Hour, want: 2 * time.Second},
		{name: "none gets the timeout", want: 2 * time.Second},
		{name: "a shorter one is kept", client: time.Second, want: time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := &deadlineSigner{}
			f := newFixture(t, root.Authority(), options{signer: rec, config: func(c *ca.Config) { c.RequestTimeout = 2 * time.Second }})
			rec.inner = local.New(local.Config{Authorities: f.manager})
			ctx := context.Background()
			if tt.client > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tt.client)
				defer cancel()
			}
			if _, err := f.client(t, "good", nil).Fetch(ctx, frontend, caclient.Options{}); err != nil {
				t.Fatal(err)
			}
			got := time.Duration(rec.left.Load())
			if got <= 0 || got > tt.want {
				t.Fatalf("signer saw a deadline %v away, want at most %v", got, tt.want)
			}
		})
	}
}

// TestTokenTooLarge: a token past the limit is refused before any
// authenticator sees it.
func TestTokenTooLarge(t *testing.T) {
	root := testca.NewRoot(t, "root", testca.Options{})
	huge := strings.Repeat("a", ca.DefaultMaxTokenBytes+1)
	g := newGate(huge)
	close(g.release)
	f := newFixture(t, root.Authority(), options{authn: g})
	if err := os.WriteFile(filepath.Join(f.tokDir, "huge"), []byte(huge), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := f.client(t, "huge", nil).Fetch(context.Background(), frontend, caclient.Options{})
	st := status.Convert(err)
	if st.Code() != codes.Unauthenticated || !strings.Contains(st.Message(), "longer than the 8192") {
		t.Fatalf("got %v %q, want Unauthenticated naming the limit", st.Code(), st.Message())
	}
	if n := g.calls.Load(); n != 0 {
		t.Fatalf("the oversized token reached an authenticator %d times", n)
	}
	if !strings.Contains(f.logs.String(), `"reason":"token_too_large"`) {
		t.Error("log lacks reason token_too_large")
	}
}

// TestCertificateRenewalTTL: a renewal by client certificate gets at most
// the renewal TTL and at most the validity of the certificate it presents,
// however long it asks for, so that a short-lived certificate cannot
// stretch itself (issue 22): a 1 h SVID renews into 1 h ones, never into
// the default's 24 h. The validity, NotAfter less NotBefore, is counted
// backdate included, as the presented one's: renewing again and again
// never adds a backdate.
func TestCertificateRenewalTTL(t *testing.T) {
	root := testca.NewRoot(t, "root", testca.Options{})
	tests := []struct {
		name    string
		renewal time.Duration // CertRenewalTTL; 0 is the default TTL
		first   time.Duration // the TTL of the certificate presented
		ask     time.Duration
		want    time.Duration // NotAfter less NotBefore of the renewal
	}{
		{name: "a 1h certificate asking for 80 days gets 1h", first: time.Hour, ask: 80 * 24 * time.Hour, want: time.Hour + certs.Backdate},
		{name: "a 1h certificate asking for nothing gets 1h, not the default", first: time.Hour, want: time.Hour + certs.Backdate},
		{name: "a 1h certificate asking for 24h gets 1h", first: time.Hour, ask: 24 * time.Hour, want: time.Hour + certs.Backdate},
		{name: "a 24h certificate asking for 80 days gets the default", first: 24 * time.Hour, ask: 80 * 24 * time.Hour, want: ca.DefaultTTL},
		{name: "a shorter renewal TTL", renewal: 6 * time.Hour, first: 24 * time.Hour, ask: 80 * 24 * time.Hour, want: 6 * time.Hour},
		{name: "asks for less, gets it", first: 24 * time.Hour, ask: 2 * time.Hour, want: 2 * time.Hour},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, root.Authority(), options{config: func(c *ca.Config) { c.CertRenewalTTL = tt.renewal }})
			first, err := f.client(t, "good", nil).Fetch(context.Background(), frontend, caclient.Options{TTL: tt.first})
			if err != nil {
				t.Fatal(err)
			}
			presented := first.Chain[0].NotAfter.Sub(first.Chain[0].NotBefore)
			svid := first
			for i := range 3 {
				if svid, err = f.client(t, "", svid.TLSCertificate()).Fetch(context.Background(), frontend, caclient.Options{TTL: tt.ask}); err != nil {
					t.Fatal(err)
				}
				leaf := svid.Chain[0]
				got := leaf.NotAfter.Sub(leaf.NotBefore)
				if got != tt.want {
					t.Fatalf("renewal %d lives %v (NotAfter less NotBefore), want %v", i+1, got, tt.want)
				}
				if got > presented {
					t.Fatalf("renewal %d lives %v, longer than the %v certificate it renewed", i+1, got, presented)
				}
				presented = got
			}
		})
	}
}
