package ca_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"maps"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshca/meshca/ca"
	"github.com/meshca/meshca/ca/caclient"
	"github.com/meshca/meshca/ca/limit"
	"github.com/meshca/meshca/csr"
	"github.com/meshca/meshca/internal/testca"
	authpb "github.com/meshca/meshca/proto/istio/v1/auth"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

var backend = spiffeid.RequireFromSegments(td, "ns", "prod", "sa", "backend")

// spentMsg is the refusal of a request whose address has spent its
// authentication failures and whose review turn comes too late for its
// deadline.
const spentMsg = "too many failed authentications from this address: its tokens are reviewed in turn, and this request's turn comes too late for its deadline, retry in "

// rawCall sends one CreateCertificate for id with token over a real
// gRPC connection and returns the trailer and the error. A refusal with
// a retry hint must be trailers-only (gRPC clients never retry a call
// that received headers), with the request id in the trailer.
func (f *fixture) rawCall(t *testing.T, token string, id spiffeid.ID) (metadata.MD, error) {
	t.Helper()
	conn, err := grpc.NewClient(f.addr, grpc.WithTransportCredentials(credentials.NewTLS(
		&tls.Config{RootCAs: f.roots, ServerName: "istiod.istio-system.svc", MinVersion: tls.VersionTLS12})))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	p, err := csr.Build(key, id)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token, "clusterid", "Kubernetes")
	var header, trailer metadata.MD
	_, err = authpb.NewIstioCertificateServiceClient(conn).CreateCertificate(ctx,
		&authpb.IstioCertificateRequest{Csr: string(p)}, grpc.Header(&header), grpc.Trailer(&trailer))
	inHeader, inTrailer := len(header.Get(ca.RequestIDHeader)), len(trailer.Get(ca.RequestIDHeader))
	if limited := status.Code(err) == codes.ResourceExhausted; limited && (inHeader != 0 || inTrailer != 1) ||
		!limited && (inHeader != 1 || inTrailer != 0) {
		t.Errorf("%v: x-request-id in %d headers and %d trailers", status.Code(err), inHeader, inTrailer)
	}
	return trailer, err
}

// retryHints returns the RetryInfo delay of err and its
// grpc-retry-pushback-ms trailer.
func retryHints(t *testing.T, err error, trailer metadata.MD) (time.Duration, string) {
	t.Helper()
	var delay time.Duration
	for _, d := range status.Convert(err).Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			delay = ri.GetRetryDelay().AsDuration()
		}
	}
	pushback := strings.Join(trailer.Get("grpc-retry-pushback-ms"), ",")
	return delay, pushback
}

// TestOverLimitCallerIsToldWhenToRetry: a caller over its budget gets
// ResourceExhausted with both retry hints, while other callers and
// other peers are served.
func TestOverLimitCallerIsToldWhenToRetry(t *testing.T) {
	root := testca.NewRoot(t, "root", testca.Options{})
	now := time.Now() // frozen: no token refills during the test
	tests := []struct {
		name     string
		limits   limit.Limits
		burst    []string // tokens whose requests are admitted
		refused  string   // the token refused next
		reason   string
		code     codes.Code // of the burst's requests
		delay    time.Duration
		pushback string
		msg      string
		other    string // a token still served after the refusal
		// otherPeer: the refused token is still served from another
		// peer address.
		otherPeer bool
	}{
		{name: "caller rate", limits: limit.Limits{Caller: limit.Budget{Rate: 4, Burst: 2}},
			burst: []string{"frontend-token", "frontend-token"}, refused: "frontend-token", reason: "caller_rate",
			delay: 250 * time.Millisecond, pushback: "250", msg: "this identity is over its request rate (4 a second, bursts of 2), retry in 250ms",
			other: "backend-token"},
		// The address's review turns come 20 s apart, after the request's
		// 10 s deadline.
		{name: "authentication failures of a peer", limits: limit.Limits{PeerFailureRate: 0.05, PeerFailureBurst: 2},
			burst: []string{"bad-token", "bad-token"}, code: codes.Unauthenticated, refused: "frontend-token", reason: "peer_authn_failures",
			delay: 20 * time.Second, pushback: "20000", msg: spentMsg + "20s", otherPeer: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, root.Authority(), options{
				authn:  tokens{"backend-token": {ID: backend, Namespace: "prod", ServiceAccount: "backend", Method: "token"}},
				config: func(c *ca.Config) { c.Limits, c.Now = tt.limits, func() time.Time { return now } },
			})
			id := map[string]spiffeid.ID{"frontend-token": frontend, "backend-token": backend, "bad-token": frontend}
			for i, tok := range tt.burst {
				if _, err := f.rawCall(t, tok, id[tok]); status.Code(err) != tt.code {
					t.Fatalf("request %d of the burst: %v, want %v", i+1, err, tt.code)
				}
			}
			trailer, err := f.rawCall(t, tt.refused, id[tt.refused])
			st := status.Convert(err)
			if st.Code() != codes.ResourceExhausted || st.Message() != tt.msg {
				t.Fatalf("got %v %q, want ResourceExhausted %q", st.Code(), st.Message(), tt.msg)
			}
			delay, pushback := retryHints(t, err, trailer)
			if delay != tt.delay || pushback != tt.pushback {
				t.Fatalf("RetryInfo %v and grpc-retry-pushback-ms %q, want %v and %q", delay, pushback, tt.delay, tt.pushback)
			}
			wantSample(t, f.reg, "meshca_rate_limited_total", map[string]string{"reason": tt.reason}, 1)
			wantSample(t, f.reg, "meshca_requests_total", map[string]string{"code": "ResourceExhausted", "reason": tt.reason}, 1)
			if !strings.Contains(f.logs.String(), `"reason":"`+tt.reason+`"`) {
				t.Errorf("the audit log lacks reason %s", tt.reason)
			}
			if tt.other != "" {
				if _, err := f.rawCall(t, tt.other, id[tt.other]); err != nil {
					t.Fatalf("another caller: %v", err)
				}
			}
			if tt.otherPeer {
				in := &authpb.IstioCertificateRequest{Csr: frontendCSR(t)}
				if _, err := f.srv.CreateCertificate(inProcess(context.Background(), "198.51.100.9:4000", tt.refused), in); err != nil {
					t.Fatalf("from another peer address: %v", err)
				}
			}
		})
	}
}

// TestConcurrencyRefusalsHint: the refusals of the issuance slots and of
// a caller's in-flight budget come at once with a retry hint.
func TestConcurrencyRefusalsHint(t *testing.T) {
	root := testca.NewRoot(t, "root", testca.Options{})
	tests := []struct {
		name   string
		config func(*ca.Config)
		reason string
	}{
		{name: "issuance slots", config: func(c *ca.Config) { c.MaxInFlight = 1 }, reason: "too_many_requests"},
		{name: "a caller's requests in flight", config: func(c *ca.Config) { c.Limits.Caller.MaxInFlight = 1 }, reason: "caller_in_flight"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			bs := &blockingSigner{started: make(chan struct{}, 1), release: make(chan struct{})}
			f := newFixture(t, root.Authority(), options{signer: bs, config: tt.config})
			done := make(chan struct{})
			go func() {
				defer close(done)
				_, _ = f.client(t, "good", nil).Fetch(context.Background(), frontend, caclient.Options{})
			}()
			<-bs.started
			start := time.Now()
			trailer, err := f.rawCall(t, "frontend-token", frontend)
			took := time.Since(start)
			close(bs.release)
			<-done
			st := status.Convert(err)
			if st.Code() != codes.ResourceExhausted || !strings.Contains(st.Message(), "retry") {
				t.Fatalf("got %v %q, want ResourceExhausted", st.Code(), st.Message())
			}
			if delay, pushback := retryHints(t, err, trailer); delay != 250*time.Millisecond || pushback != "250" {
				t.Fatalf("RetryInfo %v, grpc-retry-pushback-ms %q; want 250ms, \"250\"", delay, pushback)
			}
			if took > 5*time.Second {
				t.Fatalf("the refusal took %v: it must not wait for the busy request", took)
			}
			wantSample(t, f.reg, "meshca_rate_limited_total", map[string]string{"reason": tt.reason}, 1)
		})
	}
}

// knownTokens is a token authenticator whose reviews of known are
// cached, as kube.CachedTokenReviewer's are.
type knownTokens struct {
	tokens
	known map[string]bool
}

func (k knownTokens) Known(token string) bool { return k.known[token] }

// countedReviews is a cluster's token reviewer as its cache serves it:
// a token it knows costs nothing, any other one a review, counted.
type countedReviews struct {
	knownTokens
	n atomic.Int64
}

func (r *countedReviews) Authenticate(ctx context.Context, c *ca.Credentials) (*ca.Caller, error) {
	if c.Token != "" && !r.known[c.Token] {
		r.n.Add(1)
	}
	return r.knownTokens.Authenticate(ctx, c)
}

// TestNeighbourFailuresNeverLockOut (issue 22): an address many
// workloads share (a NAT, hostNetwork Pods) where one of them sends
// forged tokens as fast as its failures refill: a good token from the
// same address, never reviewed before, is authenticated after waiting
// one refill for its review turn, not refused; a token whose review is
// cached does not wait; refusals that cost nothing (no credentials)
// spend nothing; other addresses are not touched.
func TestNeighbourFailuresNeverLockOut(t *testing.T) {
	root := testca.NewRoot(t, "root", testca.Options{})
	const rate, burst, forged = 20, 5, 50
	clk := struct {
		sync.Mutex
		now time.Time
	}{now: time.Now()}
	now := func() time.Time { clk.Lock(); defer clk.Unlock(); return clk.now }
	reviews := &countedReviews{knownTokens: knownTokens{tokens: tokens{
		"backend-token":  {ID: backend, Namespace: "prod", ServiceAccount: "backend", Method: "token"},
		"frontend-token": {ID: frontend, Namespace: "prod", ServiceAccount: "frontend", Method: "token"},
	}, known: map[string]bool{"backend-token": true}}}
	f := newFixture(t, root.Authority(), options{authn: reviews, config: func(c *ca.Config) {
		c.Limits, c.Now = limit.Limits{PeerFailureRate: rate, PeerFailureBurst: burst}, now
	}})
	call := func(addr, token string, id spiffeid.ID) error {
		_, err := f.srv.CreateCertificate(inProcess(context.Background(), addr, token), &authpb.IstioCertificateRequest{Csr: csrFor(t, id)})
		return err
	}
	const shared = "198.51.100.7:4000"
	for i := range 3 {
		if err := call(shared, "", frontend); status.Code(err) != codes.Unauthenticated {
			t.Fatalf("no credentials %d: %v, want Unauthenticated", i+1, err)
		}
	}
	for i := range forged {
		if i >= burst {
			clk.Lock()
			clk.now = clk.now.Add(time.Second / rate) // one failure refilled
			clk.Unlock()
		}
		if err := call(shared, fmt.Sprintf("forged.token.%d", i), frontend); status.Code(err) != codes.Unauthenticated {
			t.Fatalf("forged token %d: %v, want Unauthenticated", i+1, err)
		}
	}
	if n := reviews.n.Load(); n != forged {
		t.Fatalf("%d reviews for %d forged tokens", n, forged)
	}
	// The forged tokens spent the address's failures as they refilled.
	start := time.Now()
	if err := call(shared, "frontend-token", frontend); err != nil {
		t.Fatalf("a good token from the address after its neighbour's %d forged ones: %v", forged, err)
	}
	if took := time.Since(start); took < time.Second/rate/2 {
		t.Errorf("the good token took %v: it did not wait its review turn (%v)", took, time.Second/rate)
	}
	if err := call(shared, "backend-token", backend); err != nil {
		t.Fatalf("a token whose review is cached, from the address: %v", err)
	}
	if err := call("198.51.100.8:4000", "frontend-token", frontend); err != nil {
		t.Fatalf("from another address: %v", err)
	}
	wantSample(t, f.reg, "meshca_rate_limited_total", map[string]string{"reason": "peer_authn_failures"}, 0)
}

// TestFailureFloodCostsBoundedReviews (issue 22): forged tokens sent from
// one address back to back, each waiting its review turn, cost at most
// the address's burst of reviews, then its failure rate (on the injected
// clock); a good token after them waits one refill at most.
func TestFailureFloodCostsBoundedReviews(t *testing.T) {
	root := testca.NewRoot(t, "root", testca.Options{})
	const rate, burst, forged = 10, 20, 300
	var mu sync.Mutex
	start := time.Now() // the issued certificates verify at the injected clock
	now := start
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	var waits []time.Duration
	reviews := &slowReviews{}
	f := newFixture(t, root.Authority(), options{authn: reviews, config: func(c *ca.Config) {
		c.Limits, c.Now = limit.Limits{PeerFailureRate: rate, PeerFailureBurst: burst}, clock
		c.Sleep = func(_ context.Context, d time.Duration) error {
			mu.Lock()
			defer mu.Unlock()
			now, waits = now.Add(d), append(waits, d)
			return nil
		}
	}})
	call := func(token string) error {
		_, err := f.srv.CreateCertificate(inProcess(context.Background(), "198.51.100.7:4000", token), &authpb.IstioCertificateRequest{Csr: frontendCSR(t)})
		return err
	}
	for i := range forged {
		if err := call(fmt.Sprintf("forged.token.%d", i)); status.Code(err) != codes.Unauthenticated {
			t.Fatalf("forged token %d: %v, want Unauthenticated", i+1, err)
		}
	}
	elapsed, n := clock().Sub(start), reviews.reviews.Load()
	if most := burst + int64(rate*elapsed.Seconds()); n > most {
		t.Fatalf("%d forged tokens cost %d reviews in %v, want at most %d (%d, then %d a second)", forged, n, elapsed, most, burst, rate)
	}
	t.Logf("%d forged tokens: %d reviews in %v on the injected clock, %d waits", forged, n, elapsed, len(waits))
	mu.Lock()
	waits = nil
	mu.Unlock()
	if err := call("frontend-token"); err != nil {
		t.Fatalf("a good token after the flood: %v", err)
	}
	if len(waits) != 1 || waits[0] > time.Second/rate {
		t.Fatalf("the good token waited %v, want one turn of at most %v", waits, time.Second/rate)
	}
}

// slowReviews is a token authenticator that refuses every token after a
// TokenReview's round trip, and counts the reviews.
type slowReviews struct {
	reviews atomic.Int64
	delay   time.Duration
}

func (r *slowReviews) Authenticate(_ context.Context, c *ca.Credentials) (*ca.Caller, error) {
	if c.Token == "" {
		return nil, ca.ErrNoCredentials
	}
	r.reviews.Add(1)
	time.Sleep(r.delay)
	return nil, &ca.Error{Code: codes.Unauthenticated, Reason: "test_bad_token", Msg: "bad token"}
}

// withClientCert is ctx with leaf as the client certificate its TLS
// handshake verified; ctx must come from inProcess.
func withClientCert(ctx context.Context, leaf *x509.Certificate) context.Context {
	p, _ := peer.FromContext(ctx)
	verified := *p
	verified.AuthInfo = credentials.TLSInfo{State: tls.ConnectionState{PeerCertificates: []*x509.Certificate{leaf},
		VerifiedChains: [][]*x509.Certificate{{leaf}}}}
	return peer.NewContext(ctx, &verified)
}

// TestPeerFailuresBoundReviews: an address causes no more reviews than it
// has failures left, however many of its requests come at once, and
// whatever client certificate they carry (only a certificate the
// CertAuthenticator accepts spares a request the address's failures),
// but those whose review turn comes before their deadline.
func TestPeerFailuresBoundReviews(t *testing.T) {
	root := testca.NewRoot(t, "root", testca.Options{})
	const spent = spentMsg + "20s"
	tests := []struct {
		name     string
		maxAuthn int // MaxAuthnPerPeer; 0 is the default
		// spend: how many of its two failures the address spends first.
		spend    int
		cert     *x509.Certificate // sent, with a token to review, by each request
		requests int               // at once
		want     map[codes.Code]int
	}{
		{name: "tokens to review, one authentication at a time", maxAuthn: 1, requests: 40,
			want: map[codes.Code]int{codes.Unauthenticated: 2, codes.ResourceExhausted: 38}},
		// Once it has failed, its reviews in progress hold what it has left.
		{name: "one failure left, all authenticating at once", spend: 1, requests: 40,
			want: map[codes.Code]int{codes.Unauthenticated: 1, codes.ResourceExhausted: 39}},
		{name: "a client certificate the CertAuthenticator refuses", spend: 2, requests: 10,
			cert: root.Leaf(t, "spiffe://cluster.local/not-a-workload", nil), want: map[codes.Code]int{codes.ResourceExhausted: 10}},
		{name: "a client certificate it accepts", spend: 2, requests: 10,
			cert: root.Leaf(t, frontend.String(), nil), want: map[codes.Code]int{codes.OK: 10}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := &slowReviews{delay: 20 * time.Millisecond}
			now := time.Now() // frozen: no failures refill during the test
			f := newFixture(t, root.Authority(), options{authn: r, config: func(c *ca.Config) {
				c.Limits, c.Now = limit.Limits{PeerFailureRate: 0.05, PeerFailureBurst: 2}, func() time.Time { return now }
				c.MaxAuthnPerPeer = tt.maxAuthn
			}})
			in := &authpb.IstioCertificateRequest{Csr: frontendCSR(t)}
			// Each request has a token of its own and 10 s: a turn 20 s
			// away comes after its deadline.
			call := func(cert *x509.Certificate, token string) error {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				ctx = inProcess(ctx, "198.51.100.7:4000", token)
				if cert != nil {
					ctx = withClientCert(ctx, cert)
				}
				_, err := f.srv.CreateCertificate(ctx, in)
				return err
			}
			for i := range tt.spend {
				if err := call(nil, fmt.Sprintf("a.b.spent%d", i)); status.Code(err) != codes.Unauthenticated {
					t.Fatalf("failure %d: %v, want Unauthenticated", i+1, err)
				}
			}
			var mu sync.Mutex
			got := map[codes.Code]int{}
			var wg sync.WaitGroup
			for i := range tt.requests {
				wg.Go(func() {
					st := status.Convert(call(tt.cert, fmt.Sprintf("a.b.c%d", i)))
					if st.Code() == codes.ResourceExhausted && st.Message() != spent {
						t.Errorf("refused with %q, want %q", st.Message(), spent)
					}
					mu.Lock()
					defer mu.Unlock()
					got[st.Code()]++
				})
			}
			wg.Wait()
			if n := r.reviews.Load(); n != 2 {
				t.Errorf("the address caused %d reviews, want 2, its failure burst", n)
			}
			if !maps.Equal(got, tt.want) {
				t.Errorf("codes %v, want %v", got, tt.want)
			}
		})
	}
}
