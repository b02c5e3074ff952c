package e2e

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshca/meshca/integration/harness"
	authpb "github.com/meshca/meshca/proto/istio/v1/auth"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// TestForgedFloodSparesGoodToken (issue 22, item 1): a client at an
// address that sent 500 forged JWTs gets a certificate with a fresh,
// valid token within its deadline. The forged tokens are well-formed
// bound service-account tokens for a real Pod, signed by a key the
// apiserver does not know, sent 50 at a time from 127.0.0.1 (each with 2 s
// to live) to a meshca with the default limits: the address spends its
// 100 failures, then its reviews take turns at 10 a second, and those
// whose turn comes after their deadline are refused at once. Then a token
// just minted for the same Pod, from the same address, is served within
// 5 s; and the flood cost the apiserver no more TokenReviews than the
// address's burst and rate allow.
func TestForgedFloodSparesGoodToken(t *testing.T) {
	const (
		forged, workers     = 500, 50
		burst, rate         = 100, 10.0 // --authn-failure-*-per-peer defaults
		forgedLife, goodTTL = 2 * time.Second, 5 * time.Second
	)
	m := newMesh(t)
	web := cluster.NewWorkload(t, m.apps, "web", "node-a")
	lc := newLimitClient(t, m)
	evil, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	tokens := make([]string, forged)
	for i := range tokens {
		now := time.Now()
		tokens[i] = signJWT(t, evil, "RS256", map[string]any{
			"iss": cluster.Issuer, "sub": "system:serviceaccount:" + m.apps + ":web", "aud": []string{"istio-ca"},
			"iat": now.Unix(), "nbf": now.Unix(), "exp": now.Add(time.Hour).Unix(), "jti": fmt.Sprint("forged-", i),
			"kubernetes.io": map[string]any{"namespace": m.apps, "serviceaccount": map[string]string{"name": "web"},
				"pod": map[string]string{"name": web.Pod}, "node": map[string]string{"name": web.Node}},
		})
	}
	csrPEM := newCSR(t, m.id("web"))

	before := tokenReviews(t)
	start := time.Now()
	var (
		mu  sync.Mutex
		got = map[codes.Code]int{}
		wg  sync.WaitGroup
	)
	next := make(chan string)
	for range workers {
		wg.Go(func() {
			for tok := range next {
				_, _, err := callWithin(lc.api, tok, csrPEM, forgedLife)
				mu.Lock()
				got[status.Code(err)]++
				mu.Unlock()
			}
		})
	}
	for _, tok := range tokens {
		next <- tok
	}
	close(next)
	wg.Wait()
	flood := time.Since(start)
	reviews := tokenReviews(t) - before

	fresh := cluster.Token(t, m.apps, "web", web.Pod, []string{"istio-ca"}, time.Hour)
	_, took, err := callWithin(lc.api, fresh, newCSR(t, m.id("web")), goodTTL)
	if err != nil {
		t.Fatalf("a fresh, valid token from the flooding address, %v to live: %v (after %v)", goodTTL, err, took)
	}

	if got[codes.OK] > 0 {
		t.Fatalf("%d forged tokens were served", got[codes.OK])
	}
	// A turn is granted only with 250 ms left for its review; on a busy
	// machine a review may still outlast it, rarely.
	if late := got[codes.DeadlineExceeded] + got[codes.Unavailable]; late > 5 ||
		late+got[codes.Unauthenticated]+got[codes.ResourceExhausted] != forged {
		t.Errorf("forged tokens answered %s; want Unauthenticated (reviewed) or ResourceExhausted (turn too late), at most 5 reviews cut by their deadline",
			codeCounts(got))
	}
	if got[codes.Unauthenticated] < burst {
		t.Errorf("%d forged tokens reviewed and refused, want at least the burst of %d", got[codes.Unauthenticated], burst)
	}
	// The failures in progress are uncounted while the bucket is full:
	// as many as the workers, at once, may start from it.
	if most := burst + int(rate*flood.Seconds()) + workers; reviews > most {
		t.Errorf("the flood cost %d TokenReviews in %v, want at most %d (%d, then %g a second)", reviews, flood, most, burst, rate)
	}
	e := scrapeMetrics(t, m.s.AdminAddr)
	if v := sampleValue(e, "meshca_rate_limited_total", "reason", "peer_authn_failures"); int(v) != got[codes.ResourceExhausted] {
		t.Errorf("meshca_rate_limited_total{reason=\"peer_authn_failures\"} = %v, want the %d refused", v, got[codes.ResourceExhausted])
	}
	harness.Report(t, "%d forged JWTs from 127.0.0.1 (%d at a time, %v each) in %v: %s; %d TokenReviews (the burst of %d, then %.1f/s); "+
		"then a fresh token from 127.0.0.1 served in %v (deadline %v)",
		forged, workers, forgedLife, flood.Round(time.Millisecond), codeCounts(got), reviews, burst, float64(reviews-burst)/flood.Seconds(),
		took.Round(time.Millisecond), goodTTL)
}

// callWithin asks for a certificate for csrPEM with token, the request
// given life to live; it returns the trailer, how long it took and the
// error.
func callWithin(api authpb.IstioCertificateServiceClient, token, csrPEM string, life time.Duration) (metadata.MD, time.Duration, error) {
	ctx, cancel := context.WithTimeout(context.Background(), life)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, authpb.HeaderAuthorization, authpb.BearerPrefix+token, authpb.HeaderClusterID, "Kubernetes")
	var trailer metadata.MD
	start := time.Now()
	_, err := api.CreateCertificate(ctx, &authpb.IstioCertificateRequest{Csr: csrPEM, ValidityDuration: 3600}, grpc.Trailer(&trailer))
	return trailer, time.Since(start), err
}

// codeCounts is "Unauthenticated 120, ResourceExhausted 380", most first.
func codeCounts(got map[codes.Code]int) string {
	keys := slices.SortedFunc(maps.Keys(got), func(a, b codes.Code) int { return got[b] - got[a] })
	parts := make([]string, 0, len(keys))
	for _, c := range keys {
		parts = append(parts, fmt.Sprintf("%v %d", c, got[c]))
	}
	return strings.Join(parts, ", ")
}
